//! A tenant's global GPU cap held in escrow across regions.
//!
//! Each region admits the tenant's work only within its own share, so the
//! tenant's total stays within the global cap without any region asking
//! another before it admits a job. Shares move by *grants*: a region hands
//! part of its share to another and publishes the running total it has
//! handed it; the other counts a grant only once it has read it in that
//! publication. Both totals only grow, so a late, lost or reordered
//! summary delays a grant and never counts one twice:
//!
//! ```text
//! share(r) = base(r) + Σ_o received_r[o] − Σ_o given_r[o]
//! base(home) = cap, base(other) = 0,  received_r[o] ≤ given_o[r]
//! ⇒ Σ_r share(r) ≤ cap, whatever the network does.
//! ```
//!
//! (A first version let a region raise its share up to what the others
//! published as their own shares; two regions acting on each other's stale
//! summaries could then both take the same GPUs. Grants cannot.)
//!
//! Which way grants flow is [`super::shares::rebalance`]'s split, computed
//! by each region from the latest summaries: a region holding more than its
//! target (and more than it uses) grants the surplus to the regions whose
//! share, counting grants still in flight to them, is below theirs.

use super::shares::{rebalance, RegionUse};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A tenant's global cap in one region's ledger.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
pub struct GlobalCap {
    /// The region that defines the tenant; it holds the whole cap until
    /// it grants parts of it.
    pub home: String,
    /// GPUs the tenant may hold in all regions together.
    pub gpus: u32,
    /// GPUs this region has granted each other region, in total ever.
    pub given: BTreeMap<String, u64>,
    /// GPUs each other region has granted this one, in total ever, as that
    /// region last published.
    pub received: BTreeMap<String, u64>,
}

/// What a tenant with a global cap may hold in this region, for admission.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionalShare {
    /// This region's share of the cap.
    pub share: u32,
    /// The cap, all regions together.
    pub global: u32,
}

/// Per tenant with a global cap.
pub type RegionalShares = BTreeMap<String, RegionalShare>;

/// A peer region's word about one tenant, from its latest summary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerShare {
    pub region: String,
    /// GPUs the tenant holds there, and GPUs its pending jobs there ask for.
    pub in_use: u32,
    pub demand: u32,
    /// Its share as it computed it.
    pub share: u32,
    /// What it has granted this region, in total ever (its `given[us]`).
    pub given_to_us: u64,
    /// What it has counted from this region (its `received[us]`).
    pub received_from_us: u64,
}

impl GlobalCap {
    /// This region's share, signed: negative only in the home region after
    /// the cap was lowered below what it had granted away.
    pub fn signed_share(&self, me: &str) -> i64 {
        let base = if self.home == me {
            i64::from(self.gpus)
        } else {
            0
        };
        let received: u64 = self.received.values().sum();
        let given: u64 = self.given.values().sum();
        base.saturating_add(clamp_i64(received))
            .saturating_sub(clamp_i64(given))
    }

    /// GPUs this region may let the tenant hold.
    pub fn share(&self, me: &str) -> u32 {
        u32::try_from(self.signed_share(me).max(0)).unwrap_or(u32::MAX)
    }

    /// One round in region `me`: counts the peers' grants to it, then
    /// grants away what it holds beyond both its target and what the tenant
    /// uses here (`mine`). Returns the new state; `given` and `received`
    /// only grow. `peers` are the regions this region federates with; a
    /// region missing from it takes no part in the split.
    pub fn round(&self, me: &str, mine: &RegionUse, peers: &[PeerShare]) -> GlobalCap {
        let mut next = self.clone();
        for p in peers {
            let seen = next.received.entry(p.region.clone()).or_default();
            *seen = (*seen).max(p.given_to_us);
        }
        let mut uses = vec![RegionUse {
            region: me.to_string(),
            in_use: mine.in_use,
            demand: mine.demand,
        }];
        uses.extend(peers.iter().map(|p| RegionUse {
            region: p.region.clone(),
            in_use: p.in_use,
            demand: p.demand,
        }));
        let targets = rebalance(self.gpus, &uses);
        let keep = i64::from(targets.get(me).copied().unwrap_or(0).max(mine.in_use));
        let surplus = u64::try_from(next.signed_share(me) - keep).unwrap_or(0);
        if surplus == 0 {
            return next;
        }
        // What each peer lacks of its target, counting what is on its way.
        let wants: Vec<(String, u64)> = peers
            .iter()
            .filter(|p| p.region != me)
            .map(|p| {
                let in_flight = next
                    .given
                    .get(&p.region)
                    .copied()
                    .unwrap_or(0)
                    .saturating_sub(p.received_from_us);
                let has = u64::from(p.share).saturating_add(in_flight);
                let target = u64::from(targets.get(&p.region).copied().unwrap_or(0));
                (p.region.clone(), target.saturating_sub(has))
            })
            .filter(|(_, want)| *want > 0)
            .collect();
        let mut left = surplus;
        for (region, want) in wants {
            let grant = want.min(left);
            if grant == 0 {
                break;
            }
            *next.given.entry(region).or_default() += grant;
            left -= grant;
        }
        next
    }

    /// Forgets a region that left the federation: what it was granted and
    /// what it granted are no longer counted, so its share leaves with it.
    pub fn forget(&mut self, region: &str) {
        self.given.remove(region);
        self.received.remove(region);
    }
}

fn clamp_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn published(cap: &GlobalCap, region: &str, to: &str, in_use: u32, demand: u32) -> PeerShare {
        PeerShare {
            region: region.to_string(),
            in_use,
            demand,
            share: cap.share(region),
            given_to_us: cap.given.get(to).copied().unwrap_or(0),
            received_from_us: cap.received.get(to).copied().unwrap_or(0),
        }
    }

    fn use_(region: &str, in_use: u32, demand: u32) -> RegionUse {
        RegionUse {
            region: region.into(),
            in_use,
            demand,
        }
    }

    #[test]
    fn the_home_holds_the_cap_until_it_grants() {
        let cap = GlobalCap {
            home: "eu".into(),
            gpus: 16,
            ..Default::default()
        };
        assert_eq!(cap.share("eu"), 16);
        assert_eq!(cap.share("us"), 0);
        // us asks for 12: it gets them and half the 4 nobody asks for as
        // headroom; the home keeps the other 2.
        let us = GlobalCap {
            home: "eu".into(),
            gpus: 16,
            ..Default::default()
        };
        let eu = cap.round(
            "eu",
            &use_("eu", 0, 0),
            &[published(&us, "us", "eu", 0, 12)],
        );
        assert_eq!(eu.given["us"], 14);
        assert_eq!(eu.share("eu"), 2);
        // Until us reads the grant, it has nothing; then it has 14.
        assert_eq!(us.share("us"), 0);
        let us = us.round(
            "us",
            &use_("us", 0, 12),
            &[published(&eu, "eu", "us", 0, 0)],
        );
        assert_eq!(us.share("us"), 14);
        // A second round with the same summaries grants nothing more.
        let eu2 = eu.round(
            "eu",
            &use_("eu", 0, 0),
            &[published(&us, "us", "eu", 0, 12)],
        );
        assert_eq!(eu2, eu);
    }

    #[test]
    fn a_region_never_grants_what_its_tenant_uses() {
        let cap = GlobalCap {
            home: "eu".into(),
            gpus: 16,
            ..Default::default()
        };
        let us = GlobalCap {
            home: "eu".into(),
            gpus: 16,
            ..Default::default()
        };
        // eu uses all 16 and us asks for 8: nothing to give.
        let eu = cap.round(
            "eu",
            &use_("eu", 16, 0),
            &[published(&us, "us", "eu", 0, 8)],
        );
        assert_eq!(eu.share("eu"), 16);
        assert!(eu.given.is_empty());
    }

    #[test]
    fn a_region_that_leaves_takes_its_grants_with_it() {
        let mut cap = GlobalCap {
            home: "eu".into(),
            gpus: 16,
            given: [("us".to_string(), 6)].into(),
            received: BTreeMap::new(),
        };
        assert_eq!(cap.share("eu"), 10);
        cap.forget("us");
        assert_eq!(cap.share("eu"), 16);
    }

    /// What each region publishes, as a peer last read it.
    #[derive(Clone, Debug)]
    struct Summary {
        cap: GlobalCap,
        in_use: u32,
        demand: u32,
    }

    #[derive(Clone, Debug)]
    enum Step {
        /// Region `r` runs a round on what it last read of the others.
        Round(usize),
        /// Region `to` reads region `from`'s current summary.
        Deliver { from: usize, to: usize },
        /// Region `r`'s tenant changes what it asks for; it starts jobs
        /// only within its share, and may end some.
        Work { r: usize, demand: u32, ends: u32 },
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (0usize..4).prop_map(Step::Round),
            (0usize..4, 0usize..4).prop_map(|(from, to)| Step::Deliver { from, to }),
            (0usize..4, 0u32..24, 0u32..8).prop_map(|(r, demand, ends)| Step::Work {
                r,
                demand,
                ends
            }),
        ]
    }

    fn name(i: usize) -> String {
        format!("r{i}")
    }

    struct World {
        caps: Vec<GlobalCap>,
        in_use: Vec<u32>,
        demand: Vec<u32>,
        /// seen[to][from]: the summary of `from` that `to` last read.
        seen: Vec<Vec<Option<Summary>>>,
    }

    impl World {
        fn new(regions: usize, gpus: u32) -> World {
            let cap = GlobalCap {
                home: name(0),
                gpus,
                ..Default::default()
            };
            World {
                caps: vec![cap; regions],
                in_use: vec![0; regions],
                demand: vec![0; regions],
                seen: vec![vec![None; regions]; regions],
            }
        }

        fn peers_of(&self, r: usize) -> Vec<PeerShare> {
            let me = name(r);
            self.seen[r]
                .iter()
                .enumerate()
                .filter(|(o, _)| *o != r)
                .filter_map(|(o, s)| {
                    s.as_ref()
                        .map(|s| published(&s.cap, &name(o), &me, s.in_use, s.demand))
                })
                .collect()
        }

        fn apply(&mut self, step: &Step) {
            let n = self.caps.len();
            match *step {
                Step::Round(r) if r < n => {
                    let peers = self.peers_of(r);
                    let mine = use_(&name(r), self.in_use[r], self.demand[r]);
                    self.caps[r] = self.caps[r].round(&name(r), &mine, &peers);
                }
                Step::Deliver { from, to } if from < n && to < n && from != to => {
                    self.seen[to][from] = Some(Summary {
                        cap: self.caps[from].clone(),
                        in_use: self.in_use[from],
                        demand: self.demand[from],
                    });
                }
                Step::Work { r, demand, ends } if r < n => {
                    self.in_use[r] = self.in_use[r].saturating_sub(ends);
                    // Admission: start what is asked, within the share.
                    let share = self.caps[r].share(&name(r));
                    let start = demand.min(share.saturating_sub(self.in_use[r]));
                    self.in_use[r] += start;
                    self.demand[r] = demand - start;
                }
                _ => {}
            }
        }

        fn shares(&self) -> Vec<u32> {
            (0..self.caps.len())
                .map(|r| self.caps[r].share(&name(r)))
                .collect()
        }
    }

    proptest! {
        /// Whatever order rounds, deliveries and work come in (summaries
        /// late, lost, reordered, read twice), the shares in force never
        /// sum past the cap, so neither do the GPUs held; no region's
        /// share falls below what its tenant holds there.
        #[test]
        fn shares_in_force_never_exceed_the_global_cap(
            regions in 2usize..5,
            gpus in 0u32..40,
            steps in prop::collection::vec(step(), 0..200),
        ) {
            let mut world = World::new(regions, gpus);
            for s in &steps {
                world.apply(s);
                let shares = world.shares();
                let total: u64 = shares.iter().map(|&s| u64::from(s)).sum();
                prop_assert!(total <= u64::from(gpus), "shares {shares:?} > {gpus} after {s:?}");
                let held: u64 = world.in_use.iter().map(|&u| u64::from(u)).sum();
                prop_assert!(held <= u64::from(gpus));
                for r in 0..regions {
                    prop_assert!(shares[r] >= world.in_use[r], "region {r}: {shares:?} {:?}", world.in_use);
                }
            }
        }

        /// Once demand holds still and summaries flow, the shares reach
        /// the split `rebalance` asks for: every GPU of the cap is in force
        /// somewhere, and a region that waits gets what it asks for when
        /// the cap has room.
        #[test]
        fn shares_settle_on_the_split_once_summaries_flow(
            regions in 2usize..5,
            gpus in 1u32..40,
            demands in prop::collection::vec(0u32..24, 4),
            noise in prop::collection::vec(step(), 0..60),
        ) {
            let mut world = World::new(regions, gpus);
            for s in &noise {
                world.apply(s);
            }
            // Demand is now fixed: every region asks for its figure.
            world.demand[..regions].copy_from_slice(&demands[..regions]);
            for _ in 0..(4 * regions + 8) {
                for to in 0..regions {
                    for from in 0..regions {
                        world.apply(&Step::Deliver { from, to });
                    }
                }
                for r in 0..regions {
                    world.apply(&Step::Round(r));
                }
            }
            let shares = world.shares();
            let total: u64 = shares.iter().map(|&s| u64::from(s)).sum();
            prop_assert_eq!(total, u64::from(gpus), "shares {:?}", shares);
            let uses: Vec<RegionUse> = (0..regions)
                .map(|r| use_(&name(r), world.in_use[r], world.demand[r]))
                .collect();
            let want = rebalance(gpus, &uses);
            for r in 0..regions {
                prop_assert_eq!(shares[r], want[&name(r)], "shares {:?} want {:?}", shares, want);
            }
        }
    }
}
