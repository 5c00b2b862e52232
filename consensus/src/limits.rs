//! How much of the ledger a tenant token may use. Every node holds the
//! whole ledger in memory and every joining node receives it, so a tenant's
//! metadata is a cost every member pays: a job spec, an object's manifest
//! and their counts are bounded per tenant. Checked in `apply`, for commands
//! a tenant token sent (`AsTenant`); admins are trusted with the cluster.
//! Pure: decided from the ledger and the command.

use crate::ledger::{Command, Ledger};
use crate::workload::JobSpec;

/// The bounds; [`Limits::DEFAULT`] is what `apply` enforces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Jobs waiting (pending or requeued) per tenant.
    pub waiting_jobs: usize,
    /// A job spec's variable parts in bytes: name, command, env, workdir, labels.
    pub job_spec_bytes: usize,
    /// Entries in a job's `env` and in its `required_labels`, each.
    pub job_map_entries: usize,
    /// `mesh:/` objects per tenant.
    pub objects: usize,
    /// One object's manifest.
    pub manifest_bytes: usize,
    /// All of a tenant's manifests together.
    pub tenant_manifest_bytes: usize,
}

impl Limits {
    pub const DEFAULT: Limits = Limits {
        waiting_jobs: 1_000,
        job_spec_bytes: 64 << 10,
        job_map_entries: 128,
        objects: 10_000,
        manifest_bytes: 4 << 20,
        tenant_manifest_bytes: 64 << 20,
    };
}

/// The bytes of a spec's variable parts.
pub fn spec_bytes(spec: &JobSpec) -> usize {
    let map = |m: &std::collections::BTreeMap<String, String>| -> usize {
        m.iter().map(|(k, v)| k.len() + v.len()).sum()
    };
    spec.name.len()
        + spec.tenant.len()
        + spec.command.iter().map(String::len).sum::<usize>()
        + map(&spec.env)
        + spec.workdir.as_ref().map_or(0, String::len)
        + spec.gpu_model.as_ref().map_or(0, String::len)
        + map(&spec.required_labels)
}

/// `Ok` when applying `cmd` keeps the tenant it is for (the job's or the
/// object's, which `access::authorize` has checked the token covers) within
/// its limits; otherwise one line naming the limit and the current use.
pub fn check(ledger: &Ledger, cmd: &Command) -> Result<(), String> {
    check_with(ledger, cmd, &Limits::DEFAULT)
}

/// [`check`] against `limits`.
pub fn check_with(ledger: &Ledger, cmd: &Command, limits: &Limits) -> Result<(), String> {
    match cmd {
        Command::SubmitJob { spec } => {
            let bytes = spec_bytes(spec);
            let most = limits.job_spec_bytes;
            if bytes > most {
                return Err(format!(
                    "limit: the job spec is {bytes} bytes (name, command, env, workdir and labels together at most {most})"
                ));
            }
            let most = limits.job_map_entries;
            for (what, n) in [
                ("env", spec.env.len()),
                ("required_labels", spec.required_labels.len()),
            ] {
                if n > most {
                    return Err(format!(
                        "limit: the job has {n} {what} entries (at most {most})"
                    ));
                }
            }
            let waiting = ledger
                .workload
                .jobs
                .values()
                .filter(|j| j.spec.tenant == spec.tenant && j.state.is_waiting())
                .count();
            let most = limits.waiting_jobs;
            if waiting >= most {
                return Err(format!(
                    "limit: tenant '{}' has {waiting} jobs waiting (at most {most}); cancel some or wait for them to start",
                    spec.tenant
                ));
            }
            Ok(())
        }
        Command::PutObject { object, .. } => {
            let size = object.manifest.len();
            let most = limits.manifest_bytes;
            if size > most {
                return Err(format!(
                    "limit: the manifest of mesh:{} is {size} bytes (at most {most})",
                    object.path
                ));
            }
            // A replaced object gives its own room back.
            let path = crate::namespace::normalize(&object.path)?;
            let (count, bytes) = ledger
                .namespace
                .objects
                .values()
                .filter(|o| o.tenant == object.tenant && o.path != path)
                .fold((0usize, 0usize), |(n, b), o| (n + 1, b + o.manifest.len()));
            let most = limits.objects;
            if count >= most {
                return Err(format!(
                    "limit: tenant '{}' has {count} objects (at most {most})",
                    object.tenant
                ));
            }
            let most = limits.tenant_manifest_bytes;
            if bytes + size > most {
                return Err(format!(
                    "limit: tenant '{}' manifests would take {} bytes (at most {most})",
                    object.tenant,
                    bytes + size
                ));
            }
            Ok(())
        }
        _ => Ok(()),
    }
}
