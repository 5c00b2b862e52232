//! `shoal federation join|leave`, `shoal regions`, and the region side of
//! the job commands (`--region R`, `REGION:ID`, `queue --all-regions`).

use crate::cli::api;
use clap::Subcommand;
use shoal_sdk::{Client, FederationJoinRequest, JobInfo, RegionInfo, RegionJobId};

#[derive(Subcommand, Debug)]
pub enum FederationCmd {
    /// Federate this region with the one whose API is at URL (admin on both
    /// sides: this region's token as usual, the other region's in
    /// SHOAL_PEER_TOKEN or --token-file)
    Join {
        /// Any node's API of the other region, e.g. https://10.1.0.5:7070
        url: String,
        /// Accept only a CA with this fingerprint for the other region
        #[arg(long)]
        ca_fingerprint: Option<String>,
    },
    /// Stop federating with REGION (both sides forget each other)
    Leave { region: String },
    /// REGION is lost for good: resume here, now, its jobs this region
    /// holds checkpoint copies of (`--ckpt-replicas L+R`) instead of
    /// waiting for federation.region_failover_after_ms. Each still starts
    /// only once REGION's lease on it has run out
    Failover { region: String },
}

/// `shoal federation ...`. `peer_token` is the other region's admin token
/// (the command's `--token-file`, else `SHOAL_PEER_TOKEN`); `client` carries
/// this region's credentials.
pub async fn run(
    client: &Client,
    cmd: &FederationCmd,
    peer_token: Option<&str>,
    json: bool,
) -> anyhow::Result<()> {
    match cmd {
        FederationCmd::Join {
            url,
            ca_fingerprint,
        } => {
            let token = peer_token.ok_or_else(|| {
                anyhow::anyhow!(
                    "federation join needs the other region's admin token: SHOAL_PEER_TOKEN (or --token-file FILE)"
                )
            })?;
            let ca_pem = crate::cli::login::peer_ca(url, ca_fingerprint.as_deref()).await?;
            let r = client
                .federation_join(&FederationJoinRequest {
                    url: url.clone(),
                    token: token.to_string(),
                    ca_pem,
                })
                .await
                .map_err(api)?;
            crate::cli::emit(json, &r, || {
                format!(
                    "federated with region {} (cluster {})\n",
                    r.region, r.cluster_id
                )
            })
        }
        FederationCmd::Leave { region } => {
            let r = client.federation_leave(region).await.map_err(api)?;
            crate::cli::emit(json, &r, || {
                let told = if r.peer_told {
                    "it forgot this region too"
                } else {
                    "it did not answer and still lists this region until its admin runs `shoal federation leave` there"
                };
                format!("left region {}; {told}\n", r.region)
            })
        }
        FederationCmd::Failover { region } => {
            let r = client.federation_failover(region).await.map_err(api)?;
            crate::cli::emit(json, &r, || {
                let mut out = String::new();
                for a in &r.adopted {
                    out.push_str(&format!(
                        "job {}:{} resumes here as job {} in {} s at the latest step copied here\n",
                        a.origin,
                        a.origin_job,
                        a.job,
                        r.starts_after_ms.div_ceil(1000)
                    ));
                }
                for why in &r.refused {
                    out.push_str(&format!("not taken over: {why}\n"));
                }
                if out.is_empty() {
                    out = format!(
                        "this region holds no copy of a job of region {} to take over\n",
                        r.region
                    );
                }
                out
            })
        }
    }
}

/// `shoal regions [--json]`.
pub async fn regions(client: &Client, json: bool) -> anyhow::Result<()> {
    let rows = client.regions().await.map_err(api)?;
    crate::cli::emit(json, &rows, || format_regions(&rows))
}

pub fn format_regions(rows: &[RegionInfo]) -> String {
    let mut out = format!(
        "{:<14}{:<12}{:>9}{:>11}{:>9}{:>9}  {:<22}{}\n",
        "REGION", "STATE", "RTT", "GPUS", "PENDING", "RUNNING", "GPUS BY MODEL", "LAST SUMMARY"
    );
    for r in rows {
        let state = match (r.local, r.reachable) {
            (true, _) => "local",
            (false, true) => "reachable",
            (false, false) => "unreachable",
        };
        let models: Vec<String> = r
            .gpus
            .iter()
            .map(|g| format!("{} {}/{}", g.model, g.free, g.total))
            .collect();
        let last = match (r.local, r.last_summary_age_ms) {
            (true, _) => "now".to_string(),
            (false, Some(ms)) => format!("{:.1}s ago", ms as f64 / 1000.0),
            (false, None) => "never".to_string(),
        };
        let last = match &r.error {
            Some(e) if !r.reachable => format!("{last} ({e})"),
            _ => last,
        };
        out.push_str(&format!(
            "{:<14}{:<12}{:>9}{:>11}{:>9}{:>9}  {:<22}{}\n",
            r.name,
            state,
            r.rtt_ms
                .map(|ms| format!("{ms:.1}ms"))
                .unwrap_or_else(|| "-".into()),
            format!("{}/{}", r.gpus_free, r.gpus_total),
            r.pending,
            r.running,
            if models.is_empty() {
                "-".into()
            } else {
                models.join(", ")
            },
            last
        ));
    }
    out
}

/// The client and plain id for job `job` (`N` or `REGION:N`) under
/// `--region`: an id's own region wins over the flag.
pub fn job_client(client: &Client, job: &RegionJobId, region: Option<&str>) -> (Client, u64) {
    let region = job.region.as_deref().or(region);
    (client.in_region(region), job.id)
}

/// Marks jobs listed from `region` so their ids print as `REGION:ID`.
pub fn label(jobs: &mut [JobInfo], region: Option<&str>) {
    for j in jobs {
        j.region = region.map(str::to_string);
    }
}
