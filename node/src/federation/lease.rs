//! Region leases: the fence that keeps a job from running in two regions
//! at once.
//!
//! A job whose checkpoints are copied to region R may be taken over by R
//! when R loses this region. R commits the takeover (with a linearizable
//! read behind every summary it serves) and places the job no earlier than
//! `region_lease_ms` plus a margin after that commit. Here, a rank of such
//! a job runs only while this node holds R's lease: a summary from R that
//! does not name the job as taken over, asked for less than
//! `region_lease_ms` ago. A summary asked for after the takeover committed
//! names it; one asked for before expires before R starts the job. So a
//! region cut off from R kills those ranks by itself, and a region that
//! comes back after R took the job over never starts them again.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What one peer region last said, and when it was asked.
#[derive(Clone, Debug)]
struct Renewal {
    asked: Instant,
    /// This region's jobs that the peer has taken over.
    taken: BTreeSet<u64>,
}

/// The leases of the peer regions, as this node last renewed them.
#[derive(Clone, Default)]
pub struct RegionLeases {
    renewals: Arc<Mutex<BTreeMap<String, Renewal>>>,
}

impl RegionLeases {
    /// `region` answered a summary request sent at `asked`, naming the
    /// jobs of this region it has taken over. Answers may arrive out of
    /// order: an older request's answer never shortens the lease, but the
    /// jobs it names stay taken.
    pub fn renew(&self, region: &str, asked: Instant, taken: BTreeSet<u64>) {
        let mut map = self.renewals.lock().unwrap_or_else(|p| p.into_inner());
        match map.get_mut(region) {
            Some(r) => {
                r.asked = r.asked.max(asked);
                r.taken.extend(taken);
            }
            None => {
                map.insert(region.to_string(), Renewal { asked, taken });
            }
        }
    }

    /// Jobs of this region that `region` says it has taken over.
    pub fn taken_by(&self, region: &str) -> BTreeSet<u64> {
        let map = self.renewals.lock().unwrap_or_else(|p| p.into_inner());
        map.get(region).map(|r| r.taken.clone()).unwrap_or_default()
    }

    /// Whether a rank of `job`, whose checkpoints `regions` hold copies
    /// of, may run at `now`; the error says why not.
    pub fn may_run<'a>(
        &self,
        job: u64,
        regions: impl IntoIterator<Item = &'a str>,
        now: Instant,
        window: Duration,
    ) -> Result<(), String> {
        let map = self.renewals.lock().unwrap_or_else(|p| p.into_inner());
        for region in regions {
            match map.get(region) {
                None => {
                    return Err(format!(
                        "region {region} holds a copy of job {job} and has not been heard from yet"
                    ))
                }
                Some(r) if r.taken.contains(&job) => {
                    return Err(format!("region {region} has taken job {job} over"))
                }
                Some(r) if now.saturating_duration_since(r.asked) >= window => {
                    return Err(format!(
                        "region {region} holds a copy of job {job} and has not answered for {} ms",
                        now.saturating_duration_since(r.asked).as_millis()
                    ))
                }
                Some(_) => {}
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Duration = Duration::from_secs(10);

    #[test]
    fn a_job_runs_only_while_every_copy_region_renews_and_has_not_taken_it() {
        let leases = RegionLeases::default();
        let t0 = Instant::now();
        // Jobs without copies elsewhere need nobody.
        assert!(leases.may_run(1, [], t0, WINDOW).is_ok());
        assert!(
            leases.may_run(1, ["eu-1"], t0, WINDOW).is_err(),
            "never heard"
        );
        leases.renew("eu-1", t0, BTreeSet::new());
        assert!(leases.may_run(1, ["eu-1"], t0 + WINDOW / 2, WINDOW).is_ok());
        assert!(
            leases.may_run(1, ["eu-1"], t0 + WINDOW, WINDOW).is_err(),
            "the lease lapsed"
        );
        // An answer to an older request does not shorten the lease.
        leases.renew("eu-1", t0 + WINDOW / 2, BTreeSet::new());
        leases.renew("eu-1", t0, BTreeSet::new());
        assert!(leases.may_run(1, ["eu-1"], t0 + WINDOW, WINDOW).is_ok());
        // Taken over: never again, whatever later answers say.
        leases.renew("eu-1", t0 + WINDOW, BTreeSet::from([1]));
        leases.renew("eu-1", t0 + WINDOW * 2, BTreeSet::new());
        let err = leases
            .may_run(1, ["eu-1"], t0 + WINDOW * 2, WINDOW)
            .expect_err("taken");
        assert!(err.contains("taken job 1 over"), "{err}");
        assert!(leases.may_run(2, ["eu-1"], t0 + WINDOW * 2, WINDOW).is_ok());
    }
}
