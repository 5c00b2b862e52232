//! `submit --region auto`: the region where a gang fits soonest, from the
//! regions' summaries. Pure: the caller passes the summaries it holds and
//! whether each region answered lately.
//!
//! Order: a region where the whole gang fits now beats one where it must
//! wait, which beats one where it never fits (too few GPUs of the model in
//! total). Among regions where it fits now, the region holding the job's
//! data (`--near`) wins, then the submitter's own region, then the nearest
//! (WAN RTT). Among regions where it must wait, the one with the least
//! backlog per GPU wins (pending demand plus this gang, less what is free,
//! over the region's GPUs), ties again going to the data's region, the
//! submitter's, then the nearest. An unreachable peer is never chosen: a
//! job sent there could not be acknowledged.

use shoal_sdk::RegionSummary;
use std::cmp::Ordering;

/// What a gang asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GangDemand {
    pub nodes: u32,
    pub gpus_per_node: u32,
    /// `--gres gpu:TYPE:G`: only this model (as the scheduler matches it,
    /// case-insensitive substring); `None`: any one model.
    pub model: Option<String>,
}

/// A region the job could go to.
#[derive(Clone, Debug)]
pub struct Candidate<'a> {
    pub summary: &'a RegionSummary,
    /// The region of the node deciding (the submitter's).
    pub local: bool,
    /// Whether its last summary is fresh (always true for the local one).
    pub reachable: bool,
    pub rtt_ms: Option<f64>,
    /// It holds the job's data (`--near mesh://REGION/path`).
    pub holds_data: bool,
}

/// How soon a gang fits in a region.
#[derive(Clone, Debug, PartialEq)]
pub enum Fit {
    /// Enough nodes have enough free GPUs of one model now.
    Now,
    /// It fits the region's capacity once `backlog` (GPUs still ahead of
    /// it per GPU of the region) drains.
    Later { backlog: f64 },
    /// The region has too few GPUs of the model for the gang at all.
    Never,
}

impl Fit {
    fn class(&self) -> u8 {
        match self {
            Fit::Now => 0,
            Fit::Later { .. } => 1,
            Fit::Never => 2,
        }
    }
}

fn model_matches(want: &Option<String>, model: &str) -> bool {
    match want {
        None => true,
        Some(w) => model.to_ascii_lowercase().contains(&w.to_ascii_lowercase()),
    }
}

/// How soon `gang` fits in the region `summary` describes.
pub fn fit(gang: &GangDemand, summary: &RegionSummary) -> Fit {
    let models: Vec<_> = summary
        .gpus
        .iter()
        .filter(|g| model_matches(&gang.model, &g.model))
        .collect();
    if gang.gpus_per_node == 0 {
        return Fit::Now;
    }
    let fits_now = models.iter().any(|g| {
        g.free_per_node
            .iter()
            .filter(|&&free| free >= gang.gpus_per_node)
            .count() as u64
            >= u64::from(gang.nodes)
    });
    if fits_now {
        return Fit::Now;
    }
    let want = u64::from(gang.nodes) * u64::from(gang.gpus_per_node);
    let total: u64 = models.iter().map(|g| u64::from(g.total)).sum();
    if total == 0 || models.iter().all(|g| u64::from(g.total) < want) {
        return Fit::Never;
    }
    let free: u64 = models.iter().map(|g| u64::from(g.free)).sum();
    let ahead = (summary.pending_gpus + want).saturating_sub(free);
    Fit::Later {
        backlog: ahead as f64 / total as f64,
    }
}

fn compare(a: &(Fit, &Candidate), b: &(Fit, &Candidate)) -> Ordering {
    let by_class = a.0.class().cmp(&b.0.class());
    let by_backlog = match (&a.0, &b.0) {
        (Fit::Later { backlog: x }, Fit::Later { backlog: y }) => x.total_cmp(y),
        _ => Ordering::Equal,
    };
    let rtt = |c: &Candidate| {
        if c.local {
            0.0
        } else {
            c.rtt_ms.unwrap_or(f64::MAX)
        }
    };
    by_class
        .then(by_backlog)
        .then(b.1.holds_data.cmp(&a.1.holds_data))
        .then(b.1.local.cmp(&a.1.local))
        .then(rtt(a.1).total_cmp(&rtt(b.1)))
        .then(a.1.summary.region.cmp(&b.1.summary.region))
}

/// The candidates that may take the job, best first, with how soon it
/// fits in each (unreachable peers left out).
pub fn rank<'a>(
    gang: &GangDemand,
    candidates: &'a [Candidate<'a>],
) -> Vec<(Fit, &'a Candidate<'a>)> {
    let mut ranked: Vec<_> = candidates
        .iter()
        .filter(|c| c.local || c.reachable)
        .map(|c| (fit(gang, c.summary), c))
        .collect();
    ranked.sort_by(compare);
    ranked
}

/// The region for `gang`, or why none can take it.
pub fn choose_region(gang: &GangDemand, candidates: &[Candidate]) -> Result<String, String> {
    match rank(gang, candidates).first() {
        Some((Fit::Never, _)) | None => Err(format!(
            "no reachable region has {} node(s) with {} {}GPU(s) each",
            gang.nodes,
            gang.gpus_per_node,
            gang.model
                .as_deref()
                .map(|m| format!("{m} "))
                .unwrap_or_default()
        )),
        Some((_, c)) => Ok(c.summary.region.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use shoal_sdk::GpuModelCapacity;

    fn summary(
        region: &str,
        free_per_node: Vec<u32>,
        per_node: u32,
        pending: u64,
    ) -> RegionSummary {
        let free = free_per_node.iter().sum();
        RegionSummary {
            region: region.into(),
            cluster_id: format!("{region}-c"),
            version: "0".into(),
            generated_at_ms: 0,
            ledger_index: 0,
            gpus: vec![GpuModelCapacity {
                model: "H100-80GB".into(),
                total: per_node * free_per_node.len() as u32,
                free,
                free_per_node: {
                    let mut f: Vec<u32> = free_per_node.into_iter().filter(|&f| f > 0).collect();
                    f.sort_unstable_by(|a, b| b.cmp(a));
                    f
                },
            }],
            pending_jobs: u32::from(pending > 0),
            pending_gpus: pending,
            running_jobs: 0,
            centroid: None,
            api_urls: vec![],
            adopted: vec![],
            copied_live: vec![],
            trusted_ca_pem: String::new(),
            global_tenants: vec![],
        }
    }

    fn gang(nodes: u32, gpus: u32) -> GangDemand {
        GangDemand {
            nodes,
            gpus_per_node: gpus,
            model: None,
        }
    }

    #[test]
    fn the_region_with_room_wins_over_the_full_local_one() {
        let local = summary("us", vec![0, 0], 4, 0);
        let eu = summary("eu", vec![4, 4], 4, 0);
        let cands = [
            Candidate {
                summary: &local,
                local: true,
                reachable: true,
                rtt_ms: None,
                holds_data: false,
            },
            Candidate {
                summary: &eu,
                local: false,
                reachable: true,
                rtt_ms: Some(50.0),
                holds_data: false,
            },
        ];
        assert_eq!(choose_region(&gang(2, 4), &cands), Ok("eu".into()));
    }

    #[test]
    fn local_wins_a_tie() {
        let local = summary("us", vec![4, 4], 4, 0);
        let eu = summary("eu", vec![4, 4], 4, 0);
        let cands = [
            Candidate {
                summary: &eu,
                local: false,
                reachable: true,
                rtt_ms: Some(0.1),
                holds_data: false,
            },
            Candidate {
                summary: &local,
                local: true,
                reachable: true,
                rtt_ms: None,
                holds_data: false,
            },
        ];
        assert_eq!(choose_region(&gang(1, 4), &cands), Ok("us".into()));
    }

    #[test]
    fn the_data_region_wins_among_equal_fits_but_never_waits_for_it() {
        let local = summary("us", vec![4, 4], 4, 0);
        let eu = summary("eu", vec![4, 4], 4, 0);
        fn cands<'a>(local: &'a RegionSummary, eu: &'a RegionSummary) -> Vec<Candidate<'a>> {
            vec![
                Candidate {
                    summary: local,
                    local: true,
                    reachable: true,
                    rtt_ms: None,
                    holds_data: false,
                },
                Candidate {
                    summary: eu,
                    local: false,
                    reachable: true,
                    rtt_ms: Some(80.0),
                    holds_data: true,
                },
            ]
        }
        // Both fit now: the data's region beats the submitter's.
        assert_eq!(
            choose_region(&gang(1, 4), &cands(&local, &eu)),
            Ok("eu".into())
        );
        // The data's region is full: the job starts here now rather than
        // wait there.
        let eu_full = summary("eu", vec![0, 0], 4, 8);
        assert_eq!(
            choose_region(&gang(1, 4), &cands(&local, &eu_full)),
            Ok("us".into())
        );
    }

    #[test]
    fn an_unreachable_region_is_never_chosen() {
        let local = summary("us", vec![0], 4, 0);
        let eu = summary("eu", vec![4, 4], 4, 0);
        let cands = [
            Candidate {
                summary: &local,
                local: true,
                reachable: true,
                rtt_ms: None,
                holds_data: false,
            },
            Candidate {
                summary: &eu,
                local: false,
                reachable: false,
                rtt_ms: Some(1.0),
                holds_data: false,
            },
        ];
        // It fits the local region later: there it waits.
        assert_eq!(choose_region(&gang(1, 4), &cands), Ok("us".into()));
        let too_big = gang(3, 4);
        assert!(choose_region(&too_big, &cands).is_err());
    }

    #[test]
    fn the_shorter_backlog_wins_when_nothing_fits_now() {
        let local = summary("us", vec![0, 0], 4, 16);
        let eu = summary("eu", vec![0, 0], 4, 2);
        let cands = [
            Candidate {
                summary: &local,
                local: true,
                reachable: true,
                rtt_ms: None,
                holds_data: false,
            },
            Candidate {
                summary: &eu,
                local: false,
                reachable: true,
                rtt_ms: Some(80.0),
                holds_data: false,
            },
        ];
        assert_eq!(choose_region(&gang(1, 4), &cands), Ok("eu".into()));
    }

    #[test]
    fn a_model_filter_is_honoured() {
        let local = summary("us", vec![4], 4, 0);
        let cands = [Candidate {
            summary: &local,
            local: true,
            reachable: true,
            rtt_ms: None,
            holds_data: false,
        }];
        let a100 = GangDemand {
            nodes: 1,
            gpus_per_node: 4,
            model: Some("a100".into()),
        };
        assert!(choose_region(&a100, &cands).is_err());
        let h100 = GangDemand {
            nodes: 1,
            gpus_per_node: 4,
            model: Some("h100".into()),
        };
        assert_eq!(choose_region(&h100, &cands), Ok("us".into()));
    }

    fn arb_region(i: usize) -> impl Strategy<Value = (RegionSummary, bool, Option<f64>)> {
        (
            prop::collection::vec(0u32..=8, 0..5),
            0u64..40,
            any::<bool>(),
            prop::option::of(0.0f64..300.0),
        )
            .prop_map(move |(free, pending, reachable, rtt)| {
                (summary(&format!("r{i}"), free, 8, pending), reachable, rtt)
            })
    }

    proptest! {
        /// The choice is the best class any reachable region offers, never
        /// an unreachable peer, the local region whenever it fits now, and
        /// the same whatever order the candidates come in.
        #[test]
        fn choice_is_the_soonest_reachable_fit(
            regions in (0usize..5).prop_flat_map(|n| {
                (0..=n).map(arb_region).collect::<Vec<_>>()
            }),
            nodes in 1u32..4,
            gpus in 1u32..9,
            rotate in 0usize..6,
        ) {
            let g = gang(nodes, gpus);
            let cands: Vec<Candidate> = regions
                .iter()
                .enumerate()
                .map(|(i, (s, reachable, rtt))| Candidate {
                    summary: s,
                    local: i == 0,
                    reachable: *reachable,
                    rtt_ms: *rtt,
                    holds_data: false,
                })
                .collect();
            let chosen = choose_region(&g, &cands);
            let best_class = cands
                .iter()
                .filter(|c| c.local || c.reachable)
                .map(|c| fit(&g, c.summary).class())
                .min();
            match &chosen {
                Ok(name) => {
                    let c = cands.iter().find(|c| &c.summary.region == name).expect("a candidate");
                    prop_assert!(c.local || c.reachable);
                    prop_assert_eq!(Some(fit(&g, c.summary).class()), best_class);
                    if fit(&g, cands[0].summary) == Fit::Now {
                        prop_assert!(c.local, "the local region fits now and must win");
                    }
                }
                Err(_) => prop_assert!(best_class.is_none() || best_class == Some(2)),
            }
            let mut shuffled = cands.clone();
            let len = shuffled.len();
            shuffled.rotate_left(rotate % len);
            prop_assert_eq!(choose_region(&g, &shuffled), chosen);
        }
    }
}
