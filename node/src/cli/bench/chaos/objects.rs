//! `mesh:/` puts and removes in a chaos run, and their check after healing.
//!
//! The object client uploads objects (`shoal cp --replica 3`, the CLI's own
//! code) whose bytes depend on their path alone, and removes some of them,
//! through random nodes. After healing, every object whose put was
//! acknowledged and that no remove may have touched is listed and
//! downloads byte for byte (while at most one of its holders is lost), and
//! every acknowledged remove stuck. An operation that failed on the way
//! may or may not have taken effect, so it only constrains what a later
//! download returns: if the object is there, its bytes are right.

use super::workload::{Target, OP_TIMEOUT};
use crate::cli::cp::{self, CpArgs, CpSummary};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use shoal_chaos::Violation;
use shoal_sdk::{Client, ClientError};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// What the client knows of one path.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PathLog {
    put: Known,
    remove: Option<Known>,
}

/// An operation's outcome as far as the client can tell.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
enum Known {
    Acked,
    #[default]
    Maybe,
}

/// The object operations of a run.
#[derive(Clone, Default)]
pub struct ObjectLog {
    inner: Arc<Mutex<BTreeMap<String, PathLog>>>,
}

/// Counts for the report.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct ObjectCounts {
    pub puts_acked: u32,
    pub puts_unknown: u32,
    pub removes_acked: u32,
    pub removes_unknown: u32,
    /// Objects downloaded and compared after healing.
    pub verified: u32,
    /// Objects with two holders or more lost: not covered.
    pub beyond_the_fault_model: u32,
}

impl ObjectLog {
    fn with<R>(&self, f: impl FnOnce(&mut BTreeMap<String, PathLog>) -> R) -> R {
        f(&mut self.inner.lock().unwrap_or_else(PoisonError::into_inner))
    }

    pub fn counts(&self) -> ObjectCounts {
        self.with(|paths| {
            let mut c = ObjectCounts::default();
            for p in paths.values() {
                match p.put {
                    Known::Acked => c.puts_acked += 1,
                    Known::Maybe => c.puts_unknown += 1,
                }
                match p.remove {
                    Some(Known::Acked) => c.removes_acked += 1,
                    Some(Known::Maybe) => c.removes_unknown += 1,
                    None => {}
                }
            }
            c
        })
    }
}

/// The bytes of the object at `path`: a function of the path alone, a few
/// KiB to a few hundred, so objects span one chunk or several.
pub fn object_bytes(path: &str, seed: u64) -> Vec<u8> {
    let path_hash = path
        .bytes()
        .fold(seed, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
    let mut rng = ChaCha8Rng::seed_from_u64(path_hash);
    let len = rng.random_range(1_000..300_000);
    let line = format!("{path}\n");
    line.bytes().cycle().take(len).collect()
}

fn cp_args(paths: Vec<String>) -> CpArgs {
    CpArgs {
        replica: 3,
        recursive: false,
        force: false,
        allow_degraded: false,
        paths,
    }
}

/// Puts new objects and removes some acknowledged ones until the run stops.
pub async fn object_client(target: Target, log: ObjectLog, scratch: PathBuf, seed: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut n = 0u32;
    while !target.stopped() {
        let slot = rng.random_range(0..target.urls.len());
        let api = Client::new(target.urls[slot].clone(), Some(target.token.clone()));
        let removable: Vec<String> = log.with(|paths| {
            paths
                .iter()
                .filter(|(_, p)| p.put == Known::Acked && p.remove.is_none())
                .map(|(k, _)| k.clone())
                .collect()
        });
        if !removable.is_empty() && rng.random_bool(0.25) {
            let path = removable[rng.random_range(0..removable.len())].clone();
            let outcome = tokio::time::timeout(OP_TIMEOUT, api.remove_object(&path)).await;
            let known = match outcome {
                Ok(Ok(_)) => Some(Known::Acked),
                Ok(Err(ClientError::Api { status, .. }))
                    if (400..500).contains(&status) && status != 408 =>
                {
                    None
                }
                _ => Some(Known::Maybe),
            };
            if let Some(k) = known {
                log.with(|paths| {
                    if let Some(p) = paths.get_mut(&path) {
                        p.remove = Some(k);
                    }
                });
            }
        } else {
            n += 1;
            let path = format!("/chaos/o{n}");
            let file = scratch.join(format!("o{n}"));
            if std::fs::write(&file, object_bytes(&path, seed)).is_err() {
                break;
            }
            let args = cp_args(vec![file.display().to_string(), format!("mesh:{path}")]);
            let mut summary = CpSummary::default();
            let put = tokio::time::timeout(
                OP_TIMEOUT * 3,
                cp::upload(&api, &args, &file, &path, &mut summary, true),
            )
            .await;
            let known = match put {
                Ok(Ok(())) => Known::Acked,
                _ => Known::Maybe,
            };
            log.with(|paths| {
                paths.insert(
                    path,
                    PathLog {
                        put: known,
                        remove: None,
                    },
                )
            });
            let _ = std::fs::remove_file(&file);
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(200..800))).await;
    }
}

/// After healing: acknowledged puts are there byte for byte, acknowledged
/// removes stuck, and whatever is there has the right bytes.
/// `worst_lost(path)`: the most of the object's holders lost at once over
/// the run (since it last had two live holders listed): repair prunes lost
/// holders from the list, so the final list alone cannot show two losses.
pub async fn check(
    client: &Client,
    log: &ObjectLog,
    members: &BTreeSet<u64>,
    worst_lost: impl Fn(&str) -> usize,
    scratch: &Path,
    seed: u64,
) -> (ObjectCounts, Vec<Violation>) {
    let mut counts = log.counts();
    let mut violations = Vec::new();
    let listed = match client.objects("/chaos").await {
        Ok(objects) => objects,
        Err(e) => {
            violations.push(Violation::new(
                "object-lost",
                format!("cannot list mesh:/chaos after healing: {e}"),
            ));
            return (counts, violations);
        }
    };
    let listed: BTreeMap<String, shoal_sdk::ObjectInfo> =
        listed.into_iter().map(|o| (o.path.clone(), o)).collect();
    let paths = log.with(|p| p.clone());
    for (path, p) in &paths {
        let object = listed.get(path);
        let must_exist = p.put == Known::Acked && p.remove.is_none();
        let must_not = p.remove == Some(Known::Acked);
        match object {
            None if must_exist => violations.push(Violation::new(
                "object-lost",
                format!("mesh:{path} was put (acknowledged) and never removed, and is gone"),
            )),
            Some(_) if must_not => violations.push(Violation::new(
                "object-resurrected",
                format!("mesh:{path} was removed (acknowledged) and is listed again"),
            )),
            Some(o) => {
                let lost_now = o.replicas.iter().filter(|h| !members.contains(h)).count();
                if lost_now.max(worst_lost(path)) >= 2 {
                    counts.beyond_the_fault_model += 1;
                    continue;
                }
                let to = scratch.join(format!("check-{}", path.replace('/', "_")));
                let args = cp_args(vec![format!("mesh:{path}"), to.display().to_string()]);
                let mut summary = CpSummary::default();
                match cp::download(client, &args, path, &to, &mut summary, true).await {
                    Ok(()) => match std::fs::read(&to) {
                        Ok(got) if got == object_bytes(path, seed) => counts.verified += 1,
                        Ok(got) => violations.push(Violation::new(
                            "object-corrupt",
                            format!(
                                "mesh:{path} downloads {} bytes that differ from the {} put",
                                got.len(),
                                object_bytes(path, seed).len()
                            ),
                        )),
                        Err(e) => violations.push(Violation::new(
                            "object-lost",
                            format!("mesh:{path}: the download left no file: {e}"),
                        )),
                    },
                    Err(e) => violations.push(Violation::new(
                        "object-lost",
                        format!(
                            "mesh:{path} (holders {:?}, members {members:?}) does not download: {e:#}",
                            o.replicas
                        ),
                    )),
                }
                let _ = std::fs::remove_file(&to);
            }
            None => {}
        }
    }
    (counts, violations)
}
