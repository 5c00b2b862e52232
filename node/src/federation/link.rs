//! Requests to a peer region's API: over HTTPS trusting that region's CA
//! alone, with the secret it gave this region, each bounded by a deadline
//! that covers every address tried, so a lost region costs a bounded wait
//! and an error that names it, never a hang.

use super::view::{RegionTracker, SharedRegions};
use shoal_mesh::api_tls::{api_client_config, ApiServerVerifier, ApiTrust};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Largest body read back from a peer region (a log chunk, a job list).
pub const MAX_PEER_BODY: usize = 32 << 20;

#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("region {region} did not answer within {timeout_ms} ms ({detail})")]
    Unreachable {
        region: String,
        timeout_ms: u128,
        detail: String,
    },
    #[error("cannot talk to region {region}: {detail}")]
    Setup { region: String, detail: String },
}

/// Where and how to reach one peer region.
#[derive(Clone, Debug)]
pub struct PeerTarget {
    pub region: String,
    pub urls: Vec<String>,
    pub ca_pem: String,
    pub secret: String,
    /// Test only: extra round trip before each request.
    pub wan_delay: Duration,
}

/// One request to a peer region.
pub struct PeerRequest<'a> {
    pub method: reqwest::Method,
    /// Path and query, e.g. `/v1/jobs/4?x=1`.
    pub path: &'a str,
    /// A JSON body (or raw bytes, with `binary`).
    pub body: Option<Vec<u8>>,
    /// The body is raw bytes (`application/octet-stream`), not JSON.
    pub binary: bool,
    /// The tenant the forwarding region narrows this request to.
    pub tenant: Option<&'a str>,
}

/// A peer region's answer, whatever its status.
#[derive(Debug)]
pub struct PeerResponse {
    pub status: u16,
    /// The headers worth passing on: content type and Shoal's own.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub url: String,
    pub rtt: Duration,
}

/// The node's federation state: the peer regions' tracker and one HTTP
/// client per peer (its CA as the only root).
pub struct Federation {
    regions: SharedRegions,
    leases: super::lease::RegionLeases,
    clients: Mutex<HashMap<String, (String, reqwest::Client)>>,
}

/// Whether a secret may go to `url`: over https anywhere, over plain http
/// only to loopback (a one-machine test federation).
fn may_carry_secret(url: &str) -> bool {
    let Ok(parsed) = reqwest::Url::parse(url) else {
        return false;
    };
    let host = parsed
        .host_str()
        .unwrap_or_default()
        .trim_start_matches('[')
        .trim_end_matches(']');
    match parsed.scheme() {
        "https" => true,
        "http" => {
            host.eq_ignore_ascii_case("localhost")
                || host
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        }
        _ => false,
    }
}

impl Federation {
    pub fn new(unreachable_after_ms: u64) -> Self {
        Federation {
            regions: Arc::new(Mutex::new(RegionTracker::new(unreachable_after_ms))),
            leases: Default::default(),
            clients: Mutex::new(HashMap::new()),
        }
    }

    pub fn regions(&self) -> &SharedRegions {
        &self.regions
    }

    /// The peer regions' leases on this region's copied jobs.
    pub fn leases(&self) -> &super::lease::RegionLeases {
        &self.leases
    }

    /// A copy of the tracker (a poisoned lock still holds a usable one).
    pub fn tracker(&self) -> RegionTracker {
        self.regions
            .lock()
            .map(|t| t.clone())
            .unwrap_or_else(|e| e.into_inner().clone())
    }

    /// Runs `f` on the tracker.
    pub fn update<T>(&self, f: impl FnOnce(&mut RegionTracker) -> T) -> T {
        let mut guard = self.regions.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut guard)
    }

    fn http(&self, target: &PeerTarget) -> Result<reqwest::Client, LinkError> {
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((pem, client)) = clients.get(&target.region) {
            if *pem == target.ca_pem {
                return Ok(client.clone());
            }
        }
        let setup = |detail: String| LinkError::Setup {
            region: target.region.clone(),
            detail,
        };
        let verifier = ApiServerVerifier::new(ApiTrust::Cas(target.ca_pem.clone()));
        let tls = api_client_config(verifier).map_err(|e| setup(e.to_string()))?;
        let client = reqwest::Client::builder()
            .use_preconfigured_tls(tls)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| setup(e.to_string()))?;
        clients.insert(
            target.region.clone(),
            (target.ca_pem.clone(), client.clone()),
        );
        Ok(client)
    }

    /// Sends `req` to the region's addresses in turn until one answers,
    /// within `timeout` in all.
    pub async fn send(
        &self,
        target: &PeerTarget,
        req: &PeerRequest<'_>,
        timeout: Duration,
    ) -> Result<PeerResponse, LinkError> {
        if target.secret.is_empty() {
            return Err(LinkError::Setup {
                region: target.region.clone(),
                detail: "this node does not hold this region's secret for it yet (it fetches it \
                         from another member of this region)"
                    .into(),
            });
        }
        let http = self.http(target)?;
        let started = Instant::now();
        let deadline = started + timeout;
        let mut detail = String::from("no address known");
        for url in &target.urls {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                detail = format!("{url}: out of time");
                break;
            }
            if !may_carry_secret(url) {
                detail = format!("{url}: refusing to send a secret over plain http off loopback");
                continue;
            }
            let full = format!("{}{}", url.trim_end_matches('/'), req.path);
            let attempt = Instant::now();
            let once = async {
                if !target.wan_delay.is_zero() {
                    tokio::time::sleep(target.wan_delay).await;
                }
                let mut builder = http
                    .request(req.method.clone(), &full)
                    .bearer_auth(&target.secret);
                if let Some(t) = req.tenant {
                    builder = builder.header(shoal_sdk::TENANT_HEADER, t);
                }
                if let Some(body) = &req.body {
                    let kind = if req.binary {
                        "application/octet-stream"
                    } else {
                        "application/json"
                    };
                    builder = builder
                        .header(reqwest::header::CONTENT_TYPE, kind)
                        .body(body.clone());
                }
                let resp = builder.send().await.map_err(|e| causes(&e))?;
                read(resp).await
            };
            match tokio::time::timeout(remaining, once).await {
                Ok(Ok((status, headers, body))) => {
                    return Ok(PeerResponse {
                        status,
                        headers,
                        body,
                        url: url.clone(),
                        rtt: attempt.elapsed(),
                    })
                }
                Ok(Err(e)) => detail = format!("{url}: {e}"),
                Err(_) => detail = format!("{url}: no answer in time"),
            }
        }
        Err(LinkError::Unreachable {
            region: target.region.clone(),
            timeout_ms: timeout.as_millis(),
            detail,
        })
    }
}

type Answer = (u16, Vec<(String, String)>, Vec<u8>);

async fn read(mut resp: reqwest::Response) -> Result<Answer, String> {
    let status = resp.status().as_u16();
    let headers = resp
        .headers()
        .iter()
        .filter(|(k, _)| k.as_str() == "content-type" || k.as_str().starts_with("x-shoal-"))
        .filter_map(|(k, v)| Some((k.as_str().to_string(), v.to_str().ok()?.to_string())))
        .collect();
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| causes(&e))? {
        if body.len() + chunk.len() > MAX_PEER_BODY {
            return Err(format!("answer larger than {MAX_PEER_BODY} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    Ok((status, headers, body))
}

/// An error and its causes on one line (reqwest hides why a connection
/// failed).
fn causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        let text = cause.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        next = cause.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_go_over_https_or_to_loopback_only() {
        assert!(may_carry_secret("https://10.0.0.1:7070"));
        assert!(may_carry_secret("http://127.0.0.1:7070"));
        assert!(may_carry_secret("http://[::1]:7070"));
        assert!(!may_carry_secret("http://10.0.0.1:7070"));
        assert!(!may_carry_secret("ftp://127.0.0.1"));
    }

    #[tokio::test]
    async fn a_region_with_no_listener_fails_naming_it() {
        let fed = Federation::new(1_000);
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr").port()
        };
        let target = PeerTarget {
            region: "eu-1".into(),
            urls: vec![format!("http://127.0.0.1:{port}")],
            ca_pem: String::new(),
            secret: "s".into(),
            wan_delay: Duration::ZERO,
        };
        let req = PeerRequest {
            method: reqwest::Method::GET,
            path: "/v1/federation/summary",
            body: None,
            tenant: None,
            binary: false,
        };
        let err = fed
            .send(&target, &req, Duration::from_secs(2))
            .await
            .expect_err("nothing listens");
        assert!(
            err.to_string().starts_with("region eu-1 did not answer"),
            "{err}"
        );
    }
}
