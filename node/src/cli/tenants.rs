//! `shoal tenant`, `shoal quota` and `shoal user` (INTERFACE.md "Tenants
//! and quotas").

use super::print_json;
use crate::cli::api;
use clap::{Args, Subcommand};
use shoal_sdk::{Client, QuotaInfo, TenantInfo, TenantRequest};

#[derive(Subcommand, Debug)]
pub enum TenantCmd {
    /// Create a tenant (team, project) with optional limits
    Create(TenantArgs),
    /// Change a tenant's limits (`none` removes a limit, or restores the
    /// cluster default of a ledger limit)
    Set(TenantArgs),
    /// List tenants, their limits and their use of the ledger
    Ls,
    /// One tenant's limits and use of the ledger
    Show { name: String },
    /// Tenants capped across federated regions: the cap, its home region,
    /// and each region's share, GPUs in use and GPUs waited for
    Global,
    /// Make this region's own tenant NAME the one region REGION (its home)
    /// shares across regions: its limits and caps then come from REGION.
    /// A region adopts a shared tenant on its own only when it has no
    /// tenant of that name
    Adopt {
        name: String,
        /// The tenant's home region
        #[arg(long, value_name = "REGION")]
        from: String,
    },
}

#[derive(Args, Debug, Clone, Default)]
pub struct TenantArgs {
    pub name: String,
    #[arg(long)]
    pub parent: Option<String>,
    /// Most GPUs the tenant's subtree may hold at once, or `none`
    #[arg(long)]
    pub max_gpus: Option<String>,
    /// GPU-hour budget of the subtree, or `none`
    #[arg(long)]
    pub gpu_hours: Option<String>,
    /// Fair-share weight among siblings
    #[arg(long)]
    pub weight: Option<u32>,
    /// Jobs of this tenant a tenant token may keep waiting (pending or
    /// requeued), or `none` for the cluster default (1000)
    #[arg(long, value_name = "N")]
    pub max_pending_jobs: Option<String>,
    /// `mesh:/` objects a tenant token may give this tenant, or `none` for
    /// the cluster default (10000)
    #[arg(long, value_name = "N")]
    pub max_objects: Option<String>,
    /// Bytes of `mesh:/` manifests (ledger metadata, not the data) the
    /// tenant's objects may take together, e.g. 16MiB, or `none` for the
    /// cluster default (64MiB)
    #[arg(long, value_name = "SIZE")]
    pub max_manifest_bytes: Option<String>,
    /// Highest --priority a tenant token may give this tenant's jobs, or
    /// `none` for the cluster default (1000); admin tokens are not capped
    #[arg(long, value_name = "P", allow_hyphen_values = true)]
    pub max_priority: Option<String>,
    /// GPUs the tenant may hold in all federated regions together, or
    /// `none`; set in the tenant's home region (the other regions adopt
    /// the tenant from it and share the cap out by demand)
    #[arg(long, value_name = "N")]
    pub global_gpus: Option<String>,
    /// GPU-hours the tenant may commit in all federated regions together,
    /// or `none`; set in its home region, shared out by demand likewise
    #[arg(long, value_name = "H")]
    pub global_gpu_hours: Option<String>,
}

/// `none` as a limit to unset (`Ok(None)` after pushing `field` onto
/// `unset`), else the value parsed by `parse`.
pub(crate) fn limit_arg<T>(
    value: Option<&str>,
    field: &str,
    unset: &mut Vec<String>,
    parse: impl FnOnce(&str) -> Result<T, String>,
) -> Result<Option<T>, String> {
    match value {
        None => Ok(None),
        Some("none") => {
            unset.push(field.into());
            Ok(None)
        }
        Some(v) => parse(v).map(Some),
    }
}

impl TenantArgs {
    pub fn request(&self) -> Result<TenantRequest, String> {
        let mut req = TenantRequest {
            name: self.name.clone(),
            weight: self.weight,
            ..Default::default()
        };
        match self.parent.as_deref() {
            Some("none") => req.unset.push("parent".into()),
            other => req.parent = other.map(str::to_string),
        }
        match self.max_gpus.as_deref() {
            Some("none") => req.unset.push("max_gpus".into()),
            Some(n) => {
                req.max_gpus = Some(
                    n.parse()
                        .map_err(|_| format!("--max-gpus must be a count or none, not '{n}'"))?,
                )
            }
            None => {}
        }
        match self.gpu_hours.as_deref() {
            Some("none") => req.unset.push("gpu_hours".into()),
            Some(h) => {
                req.gpu_hours = Some(
                    h.parse()
                        .map_err(|_| format!("--gpu-hours must be a number or none, not '{h}'"))?,
                )
            }
            None => {}
        }
        let count = |flag: &'static str| {
            move |v: &str| {
                v.parse::<u32>()
                    .map_err(|_| format!("--{flag} must be a count or none, not '{v}'"))
            }
        };
        req.max_pending_jobs = limit_arg(
            self.max_pending_jobs.as_deref(),
            "max_pending_jobs",
            &mut req.unset,
            count("max-pending-jobs"),
        )?;
        req.global_gpus = limit_arg(
            self.global_gpus.as_deref(),
            "global_gpus",
            &mut req.unset,
            count("global-gpus"),
        )?;
        req.global_gpu_hours = limit_arg(
            self.global_gpu_hours.as_deref(),
            "global_gpu_hours",
            &mut req.unset,
            |v| {
                v.parse::<f64>()
                    .map_err(|_| format!("--global-gpu-hours must be a number or none, not '{v}'"))
            },
        )?;
        req.max_objects = limit_arg(
            self.max_objects.as_deref(),
            "max_objects",
            &mut req.unset,
            count("max-objects"),
        )?;
        req.max_manifest_bytes = limit_arg(
            self.max_manifest_bytes.as_deref(),
            "max_manifest_bytes",
            &mut req.unset,
            |v| {
                shoal_sdk::units::parse_bytes(v).map_err(|e| {
                    format!("--max-manifest-bytes must be a size (e.g. 16MiB) or none: {e}")
                })
            },
        )?;
        req.max_priority = limit_arg(
            self.max_priority.as_deref(),
            "max_priority",
            &mut req.unset,
            |v| {
                v.parse::<i32>()
                    .map_err(|_| format!("--max-priority must be an integer or none, not '{v}'"))
            },
        )?;
        Ok(req)
    }
}

#[derive(Subcommand, Debug)]
pub enum UserCmd {
    /// User names and their tenants
    Ls,
    /// Map a user name to a tenant (admin)
    Add {
        name: String,
        #[arg(long, short = 'A')]
        tenant: String,
    },
    /// Remove a user name (admin)
    Rm { name: String },
}

/// `shoal user ls|add|rm`, `sacctmgr list|add|delete user`.
pub async fn user(client: &Client, cmd: &UserCmd, json: bool) -> anyhow::Result<()> {
    match cmd {
        UserCmd::Ls => {
            let users = client.users().await.map_err(api)?;
            if json {
                return print_json(&users);
            }
            println!("{:<20} TENANT", "USER");
            for u in users {
                println!("{:<20} {}", u.name, u.tenant.unwrap_or_default());
            }
        }
        UserCmd::Add { name, tenant } => {
            let w = client.set_user(name, Some(tenant)).await.map_err(api)?;
            if json {
                return print_json(&w);
            }
            println!("user {name} is tenant {tenant}");
        }
        UserCmd::Rm { name } => {
            let w = client.set_user(name, None).await.map_err(api)?;
            if json {
                return print_json(&w);
            }
            println!("user {name} removed");
        }
    }
    Ok(())
}

/// Tenants that `names` (Slurm user names, `-u`) stand for: a mapped
/// user's tenant, else the name itself (a tenant).
pub fn tenants_of_users(names: &[String], users: &[shoal_sdk::UserInfo]) -> Vec<String> {
    names
        .iter()
        .map(|n| {
            users
                .iter()
                .find(|u| &u.name == n)
                .and_then(|u| u.tenant.clone())
                .unwrap_or_else(|| n.clone())
        })
        .collect()
}

pub async fn tenant(client: &Client, cmd: &TenantCmd, json: bool) -> anyhow::Result<()> {
    match cmd {
        TenantCmd::Create(args) => {
            let req = args.request().map_err(anyhow::Error::msg)?;
            let r = client.create_tenant(&req).await.map_err(api)?;
            if json {
                print_json(&r)
            } else {
                println!("tenant {} created", args.name);
                Ok(())
            }
        }
        TenantCmd::Set(args) => {
            let req = args.request().map_err(anyhow::Error::msg)?;
            let r = client.set_tenant(&req).await.map_err(api)?;
            if json {
                print_json(&r)
            } else {
                println!("tenant {} updated", args.name);
                Ok(())
            }
        }
        TenantCmd::Ls => {
            let tenants = client.tenants().await.map_err(api)?;
            if json {
                print_json(&tenants)
            } else {
                print!("{}", format_tenants(&tenants));
                Ok(())
            }
        }
        TenantCmd::Global => {
            let tenants = client.global_tenants().await.map_err(api)?;
            if json {
                print_json(&tenants)
            } else {
                print!("{}", format_global_tenants(&tenants));
                Ok(())
            }
        }
        TenantCmd::Adopt { name, from } => {
            let r = client.adopt_tenant(name, from).await.map_err(api)?;
            if json {
                print_json(&r)
            } else {
                println!("tenant {name} is now {name}@{from}: its limits and caps come from region {from}");
                Ok(())
            }
        }
        TenantCmd::Show { name } => {
            let tenants = client.tenants().await.map_err(api)?;
            let Some(tenant) = tenants.into_iter().find(|t| &t.name == name) else {
                anyhow::bail!("no tenant named '{name}'");
            };
            if json {
                print_json(&tenant)
            } else {
                print!("{}", format_tenant(&tenant));
                Ok(())
            }
        }
    }
}

pub(crate) fn format_global_tenants(tenants: &[shoal_sdk::GlobalTenantInfo]) -> String {
    let mut out = format!(
        "{:<16} {:<12} {:>6} {:>9}  {:<14} {:>6} {:>7} {:>7} {:>9} {:>9}\n",
        "TENANT",
        "HOME",
        "GPUS",
        "GPU_HOURS",
        "REGION",
        "SHARE",
        "IN_USE",
        "WAITING",
        "HRS_SHARE",
        "HRS_USED"
    );
    let or_dash = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    for t in tenants {
        for (i, r) in t.regions.iter().enumerate() {
            let (name, home, gpus, hours) = if i == 0 {
                (
                    t.tenant.clone(),
                    t.home.clone(),
                    or_dash(t.gpus.map(|g| g.to_string())),
                    or_dash(t.gpu_hours.map(|h| format!("{h:.1}"))),
                )
            } else {
                Default::default()
            };
            let region = match (r.local, r.reachable) {
                (true, _) => format!("{} (here)", r.region),
                (false, true) => r.region.clone(),
                (false, false) => format!("{} (!)", r.region),
            };
            out.push_str(&format!(
                "{name:<16} {home:<12} {gpus:>6} {hours:>9}  {region:<14} {:>6} {:>7} {:>7} {:>9} {:>9.1}\n",
                or_dash(r.share.map(|s| s.to_string())),
                r.in_use,
                r.demand,
                or_dash(r.gpu_hours_share.map(|h| format!("{h:.1}"))),
                r.gpu_hours_committed,
            ));
        }
    }
    out
}

/// `1.5MiB`, `64MiB`, `512B`.
pub(crate) fn human_bytes(n: u64) -> String {
    const UNITS: [(&str, u64); 3] = [("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (unit, size) in UNITS {
        if n >= size {
            let value = n as f64 / size as f64;
            return if n.is_multiple_of(size) {
                format!("{}{unit}", n / size)
            } else {
                format!("{value:.1}{unit}")
            };
        }
    }
    format!("{n}B")
}

/// Use/limit of the tenant's pending jobs, objects and manifest bytes, and
/// its priority cap; a limit set for the tenant (not the cluster default)
/// is marked `*`.
pub(crate) fn ledger_columns(limits: Option<&shoal_sdk::LedgerLimitsInfo>) -> [String; 4] {
    let Some(l) = limits else {
        return ["-".into(), "-".into(), "-".into(), "-".into()];
    };
    let mark = |field: &str| {
        if l.overridden.iter().any(|o| o == field) {
            "*"
        } else {
            ""
        }
    };
    [
        format!(
            "{}/{}{}",
            l.pending_jobs,
            l.max_pending_jobs,
            mark("max_pending_jobs")
        ),
        format!("{}/{}{}", l.objects, l.max_objects, mark("max_objects")),
        format!(
            "{}/{}{}",
            human_bytes(l.manifest_bytes),
            human_bytes(l.max_manifest_bytes),
            mark("max_manifest_bytes")
        ),
        format!("{}{}", l.max_priority, mark("max_priority")),
    ]
}

pub(crate) const LEDGER_NOTE: &str =
    "WAITING, OBJECTS, MANIFESTS: the tenant's own use/limit; * set for the tenant, else the cluster default\n";

pub(crate) fn format_tenants(tenants: &[TenantInfo]) -> String {
    let mut out = format!(
        "{:<16}{:<16}{:>9}{:>12}{:>8}{:>12}{:>13}{:>18}{:>9}\n",
        "TENANT",
        "PARENT",
        "MAX_GPUS",
        "GPU_HOURS",
        "WEIGHT",
        "WAITING",
        "OBJECTS",
        "MANIFESTS",
        "MAX_PRIO"
    );
    for t in tenants {
        let [waiting, objects, manifests, priority] = ledger_columns(t.ledger_limits.as_ref());
        out.push_str(&format!(
            "{:<16}{:<16}{:>9}{:>12}{:>8}{waiting:>12}{objects:>13}{manifests:>18}{priority:>9}\n",
            t.name,
            t.parent.clone().unwrap_or_else(|| "-".into()),
            t.max_gpus
                .map(|m| m.to_string())
                .unwrap_or_else(|| "-".into()),
            t.gpu_hours_limit
                .map(|h| format!("{h:.1}"))
                .unwrap_or_else(|| "-".into()),
            t.weight
        ));
    }
    out.push_str(LEDGER_NOTE);
    out
}

pub(crate) fn format_tenant(t: &TenantInfo) -> String {
    let none = || "-".to_string();
    let mut out = format!(
        "tenant:       {}\nparent:       {}\nmax GPUs:     {}\nGPU-hours:    {}\nweight:       {}\ncreated:      {}\n",
        t.name,
        t.parent.clone().unwrap_or_else(none),
        t.max_gpus.map(|m| m.to_string()).unwrap_or_else(none),
        t.gpu_hours_limit
            .map(|h| format!("{h:.1}"))
            .unwrap_or_else(none),
        t.weight,
        t.created_at,
    );
    if let Some(l) = &t.ledger_limits {
        let source = |field: &str| {
            if l.overridden.iter().any(|o| o == field) {
                "set for this tenant"
            } else {
                "cluster default"
            }
        };
        out.push_str(&format!(
            "waiting jobs: {} of {} ({})\nobjects:      {} of {} ({})\nmanifests:    {} of {} ({})\nmax priority: {} ({})\n",
            l.pending_jobs,
            l.max_pending_jobs,
            source("max_pending_jobs"),
            l.objects,
            l.max_objects,
            source("max_objects"),
            human_bytes(l.manifest_bytes),
            human_bytes(l.max_manifest_bytes),
            source("max_manifest_bytes"),
            l.max_priority,
            source("max_priority"),
        ));
    }
    out
}

pub async fn quota(client: &Client, tenant: Option<&str>, json: bool) -> anyhow::Result<()> {
    let mut rows = client.quota().await.map_err(api)?;
    if let Some(t) = tenant {
        rows.retain(|r| r.tenant == t);
        if rows.is_empty() {
            anyhow::bail!("no tenant named '{t}'");
        }
    }
    if json {
        return print_json(&rows);
    }
    print!("{}", format_quota(&rows));
    Ok(())
}

pub(crate) fn format_quota(rows: &[QuotaInfo]) -> String {
    let mut out = format!(
        "{:<16}{:>10}{:>18}{:>10}{:>8}{:>9}{:>9}{:>9}{:>12}{:>13}{:>18}{:>9}\n",
        "TENANT",
        "GPUS",
        "GPU_HOURS",
        "REFUNDED",
        "SHARE",
        "WEIGHT",
        "RUNNING",
        "PENDING",
        "WAITING",
        "OBJECTS",
        "MANIFESTS",
        "MAX_PRIO"
    );
    for r in rows {
        let gpus = match r.max_gpus {
            Some(m) => format!("{}/{m}", r.gpus_in_use),
            None => r.gpus_in_use.to_string(),
        };
        let hours = match r.gpu_hours_limit {
            Some(l) => format!("{:.2}/{l:.0}", r.gpu_hours_used),
            None => format!("{:.2}", r.gpu_hours_used),
        };
        let [waiting, objects, manifests, priority] = ledger_columns(r.ledger_limits.as_ref());
        out.push_str(&format!(
            "{:<16}{:>10}{:>18}{:>10.2}{:>7.0}%{:>9}{:>9}{:>9}{waiting:>12}{objects:>13}{manifests:>18}{priority:>9}\n",
            r.tenant,
            gpus,
            hours,
            r.gpu_hours_refunded,
            r.share * 100.0,
            r.weight,
            r.running_jobs,
            r.pending_jobs
        ));
    }
    out.push_str("RUNNING, PENDING: the subtree's jobs; ");
    out.push_str(LEDGER_NOTE);
    out
}
