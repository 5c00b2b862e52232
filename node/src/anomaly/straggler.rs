//! Straggler ranks: a gang runs at the speed of its slowest member, so a rank
//! whose GPUs work far less than its siblings' (a throttled or failing GPU, a
//! noisy neighbour, a slow link) is worth an operator's attention before it
//! costs hours. Sans-IO: the caller passes each gang's per-rank utilization
//! and the time.

use shoal_consensus::workload::JobId;
use shoal_consensus::NodeId;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug)]
pub struct StragglerConfig {
    /// How long the condition must hold before it is reported.
    pub window: Duration,
    /// A rank is behind when its utilization is below this fraction of the
    /// median of its siblings'.
    pub below: f64,
    /// Siblings at a lower median utilization are not computing hard
    /// enough for the comparison to mean anything.
    pub min_sibling_util: f64,
}

/// The utilization of one rank's GPUs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RankUtil {
    pub rank: u32,
    pub node: NodeId,
    /// Mean over the rank's GPUs, percent.
    pub util: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Straggler {
    pub job: JobId,
    pub rank: u32,
    pub node: NodeId,
    pub util: f64,
    pub sibling_median: f64,
    pub siblings: usize,
    pub lasted: Duration,
}

/// Remembers since when each rank has been behind, and which episodes were
/// reported, so a persistent straggler is reported once.
#[derive(Default)]
pub struct StragglerWatch {
    behind_since: BTreeMap<(JobId, u32), Instant>,
    reported: BTreeSet<(JobId, u32)>,
}

impl StragglerWatch {
    /// Feeds one observation of a gang; returns the ranks that just crossed
    /// the window.
    pub fn observe(
        &mut self,
        cfg: &StragglerConfig,
        now: Instant,
        job: JobId,
        ranks: &[RankUtil],
    ) -> Vec<Straggler> {
        let mut out = Vec::new();
        for r in ranks {
            let mut others: Vec<f64> = ranks
                .iter()
                .filter(|o| o.rank != r.rank)
                .map(|o| o.util)
                .collect();
            let key = (job, r.rank);
            let Some(median) = median(&mut others) else {
                self.forget(key);
                continue;
            };
            let behind = median >= cfg.min_sibling_util && r.util < cfg.below * median;
            if !behind {
                self.forget(key);
                continue;
            }
            let since = *self.behind_since.entry(key).or_insert(now);
            let lasted = now.saturating_duration_since(since);
            if lasted >= cfg.window && self.reported.insert(key) {
                out.push(Straggler {
                    job,
                    rank: r.rank,
                    node: r.node,
                    util: r.util,
                    sibling_median: median,
                    siblings: others.len(),
                    lasted,
                });
            }
        }
        out
    }

    /// Drops the state of jobs no longer running.
    pub fn retain_jobs(&mut self, running: &BTreeSet<JobId>) {
        self.behind_since
            .retain(|(job, _), _| running.contains(job));
        self.reported.retain(|(job, _)| running.contains(job));
    }

    fn forget(&mut self, key: (JobId, u32)) {
        self.behind_since.remove(&key);
        self.reported.remove(&key);
    }
}

fn median(values: &mut [f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    Some(if values.len().is_multiple_of(2) {
        (values[mid - 1] + values[mid]) / 2.0
    } else {
        values[mid]
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const CFG: StragglerConfig = StragglerConfig {
        window: Duration::from_secs(5),
        below: 0.5,
        min_sibling_util: 50.0,
    };

    fn gang(utils: &[f64]) -> Vec<RankUtil> {
        utils
            .iter()
            .enumerate()
            .map(|(i, &util)| RankUtil {
                rank: i as u32,
                node: 100 + i as u64,
                util,
            })
            .collect()
    }

    #[test]
    fn a_rank_behind_for_the_window_is_reported_once_by_rank_and_node() {
        let mut w = StragglerWatch::default();
        let t0 = Instant::now();
        let ranks = gang(&[91.0, 15.0, 93.0, 90.0]);
        assert!(w.observe(&CFG, t0, 7, &ranks).is_empty());
        assert!(w
            .observe(&CFG, t0 + Duration::from_secs(4), 7, &ranks)
            .is_empty());
        let found = w.observe(&CFG, t0 + Duration::from_secs(5), 7, &ranks);
        assert_eq!(found.len(), 1);
        assert_eq!((found[0].job, found[0].rank, found[0].node), (7, 1, 101));
        assert_eq!(found[0].sibling_median, 91.0);
        assert_eq!(found[0].siblings, 3);
        assert!(w
            .observe(&CFG, t0 + Duration::from_secs(30), 7, &ranks)
            .is_empty());
    }

    #[test]
    fn recovery_restarts_the_window_and_a_new_episode_is_reported_again() {
        let mut w = StragglerWatch::default();
        let t0 = Instant::now();
        let slow = gang(&[90.0, 10.0]);
        let fine = gang(&[90.0, 85.0]);
        w.observe(&CFG, t0, 1, &slow);
        assert_eq!(
            w.observe(&CFG, t0 + Duration::from_secs(5), 1, &slow).len(),
            1
        );
        w.observe(&CFG, t0 + Duration::from_secs(6), 1, &fine);
        assert!(w
            .observe(&CFG, t0 + Duration::from_secs(7), 1, &slow)
            .is_empty());
        assert_eq!(
            w.observe(&CFG, t0 + Duration::from_secs(12), 1, &slow)
                .len(),
            1
        );
    }

    #[test]
    fn idle_gangs_and_lone_ranks_have_no_stragglers() {
        let mut w = StragglerWatch::default();
        let t0 = Instant::now();
        let later = t0 + Duration::from_secs(60);
        for utils in [&[30.0, 2.0][..], &[5.0][..], &[0.0, 0.0, 0.0][..]] {
            w.observe(&CFG, t0, 3, &gang(utils));
            assert!(w.observe(&CFG, later, 3, &gang(utils)).is_empty());
        }
    }

    #[test]
    fn state_of_finished_jobs_is_dropped() {
        let mut w = StragglerWatch::default();
        let t0 = Instant::now();
        w.observe(&CFG, t0, 1, &gang(&[90.0, 10.0]));
        w.observe(&CFG, t0, 2, &gang(&[90.0, 10.0]));
        w.retain_jobs(&BTreeSet::from([2]));
        assert_eq!(w.behind_since.len(), 1);
        assert!(w.behind_since.contains_key(&(2, 1)));
    }

    proptest! {
        /// Only a rank clearly below its siblings is ever named, and a gang
        /// whose ranks are all within a factor of two has none.
        #[test]
        fn only_ranks_below_the_threshold_are_named(
            utils in proptest::collection::vec(0.0f64..100.0, 1..12),
        ) {
            let mut w = StragglerWatch::default();
            let t0 = Instant::now();
            let ranks = gang(&utils);
            w.observe(&CFG, t0, 9, &ranks);
            let found = w.observe(&CFG, t0 + CFG.window, 9, &ranks);
            for s in &found {
                prop_assert!(s.util < CFG.below * s.sibling_median);
                prop_assert!(s.sibling_median >= CFG.min_sibling_util);
                prop_assert_eq!(s.util, utils[s.rank as usize]);
            }
            let max = utils.iter().copied().fold(0.0, f64::max);
            if utils.iter().all(|&u| u >= CFG.below * max) {
                prop_assert!(found.is_empty());
            }
        }
    }
}
