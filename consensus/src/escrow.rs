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
//! Which way grants flow is [`shares::rebalance`]'s split, computed
//! by each region from the latest summaries: a region holding more than its
//! target (and more than it uses) grants the surplus to the regions whose
//! share, counting grants still in flight to them, is below theirs.

pub mod shares;

use self::shares::{rebalance, RegionUse};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One amount held in escrow across regions: a tenant's GPUs, or the
/// GPU-seconds of its budget.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
pub struct Account {
    /// The cap, all regions together.
    pub cap: u64,
    /// What this region has granted each other region, in total ever.
    pub given: BTreeMap<String, u64>,
    /// What each other region has granted this one, in total ever, as that
    /// region last published.
    pub received: BTreeMap<String, u64>,
}

/// A tenant's caps across regions, in one region's ledger.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
pub struct GlobalCap {
    /// The region that defines the tenant; it holds each whole cap until it
    /// grants parts of it.
    pub home: String,
    /// GPUs the tenant may hold at once.
    pub gpus: Option<Account>,
    /// GPU-seconds the tenant may commit (its budget).
    pub gpu_seconds: Option<Account>,
}

/// What a tenant with a cap across regions may hold in this region, for
/// admission.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RegionalShare {
    /// This region's share of the GPU cap, and the cap.
    pub gpus: Option<(u32, u32)>,
    /// This region's share of the budget, and the budget (GPU-seconds).
    pub gpu_seconds: Option<(u64, u64)>,
}

/// Per tenant with a cap across regions.
pub type RegionalShares = BTreeMap<String, RegionalShare>;

/// A peer region's word about one tenant's account, from its latest summary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerShare {
    pub region: String,
    /// What the tenant holds there, and what its pending jobs ask for.
    pub in_use: u64,
    pub demand: u64,
    /// Its share as it computed it.
    pub share: u64,
    /// What it has granted this region, in total ever (its `given[us]`).
    pub given_to_us: u64,
    /// What it has counted from this region (its `received[us]`).
    pub received_from_us: u64,
}

impl Account {
    pub fn new(cap: u64) -> Account {
        Account {
            cap,
            ..Default::default()
        }
    }

    /// This region's share, signed: negative only in the home region after
    /// the cap was lowered below what it had granted away.
    pub fn signed_share(&self, home: bool) -> i128 {
        let base = if home { i128::from(self.cap) } else { 0 };
        let received: i128 = self.received.values().map(|&v| i128::from(v)).sum();
        let given: i128 = self.given.values().map(|&v| i128::from(v)).sum();
        base + received - given
    }

    /// What this region may let the tenant hold.
    pub fn share(&self, home: bool) -> u64 {
        u64::try_from(self.signed_share(home).max(0)).unwrap_or(u64::MAX)
    }

    /// One round in region `me` (`home`: the tenant's home): counts the
    /// peers' grants to it, then grants away what it holds beyond both its
    /// target and what the tenant uses here (`mine`). Returns the new
    /// state; `given` and `received` only grow. `peers` are the regions
    /// this region federates with; a region missing from it takes no part
    /// in the split.
    pub fn round(&self, me: &str, home: bool, mine: &RegionUse, peers: &[PeerShare]) -> Account {
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
        let targets = rebalance(self.cap, &uses);
        let keep = i128::from(targets.get(me).copied().unwrap_or(0).max(mine.in_use));
        let surplus = u64::try_from(next.signed_share(home) - keep).unwrap_or(0);
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
                let has = p.share.saturating_add(in_flight);
                let target = targets.get(&p.region).copied().unwrap_or(0);
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
            let out = next.given.entry(region).or_default();
            *out = out.saturating_add(grant);
            left -= grant;
        }
        next
    }

    /// Takes in a round's totals: each only grows.
    pub fn merge(&mut self, received: &BTreeMap<String, u64>, given: &BTreeMap<String, u64>) {
        for (region, total) in received {
            let seen = self.received.entry(region.clone()).or_default();
            *seen = (*seen).max(*total);
        }
        for (region, total) in given {
            let out = self.given.entry(region.clone()).or_default();
            *out = (*out).max(*total);
        }
    }

    /// Forgets a region that left the federation: what it was granted and
    /// what it granted are no longer counted, so its share leaves with it.
    pub fn forget(&mut self, region: &str) {
        self.given.remove(region);
        self.received.remove(region);
    }
}

impl GlobalCap {
    /// The GPU cap's share in region `me`, if the tenant has one.
    pub fn gpu_share(&self, me: &str) -> Option<u32> {
        let a = self.gpus.as_ref()?;
        Some(u32::try_from(a.share(self.home == me)).unwrap_or(u32::MAX))
    }

    /// The budget's share in region `me` (GPU-seconds), if it has one.
    pub fn seconds_share(&self, me: &str) -> Option<u64> {
        Some(self.gpu_seconds.as_ref()?.share(self.home == me))
    }

    pub fn forget(&mut self, region: &str) {
        for account in [&mut self.gpus, &mut self.gpu_seconds]
            .into_iter()
            .flatten()
        {
            account.forget(region);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// `account` as region `region` publishes it to region `to`.
    fn published(
        account: &Account,
        region: &str,
        home: bool,
        to: &str,
        in_use: u64,
        demand: u64,
    ) -> PeerShare {
        PeerShare {
            region: region.to_string(),
            in_use,
            demand,
            share: account.share(home),
            given_to_us: account.given.get(to).copied().unwrap_or(0),
            received_from_us: account.received.get(to).copied().unwrap_or(0),
        }
    }

    fn use_(region: &str, in_use: u64, demand: u64) -> RegionUse {
        RegionUse {
            region: region.into(),
            in_use,
            demand,
        }
    }

    #[test]
    fn the_home_holds_the_cap_until_it_grants() {
        let eu = Account::new(16);
        let us = Account::new(16);
        assert_eq!(eu.share(true), 16);
        assert_eq!(us.share(false), 0);
        // us asks for 12: it gets them and half the 4 nobody asks for as
        // headroom; the home keeps the other 2.
        let eu = eu.round(
            "eu",
            true,
            &use_("eu", 0, 0),
            &[published(&us, "us", false, "eu", 0, 12)],
        );
        assert_eq!(eu.given["us"], 14);
        assert_eq!(eu.share(true), 2);
        // Until us reads the grant, it has nothing; then it has 14.
        assert_eq!(us.share(false), 0);
        let us = us.round(
            "us",
            false,
            &use_("us", 0, 12),
            &[published(&eu, "eu", true, "us", 0, 0)],
        );
        assert_eq!(us.share(false), 14);
        // A second round with the same summaries grants nothing more.
        let eu2 = eu.round(
            "eu",
            true,
            &use_("eu", 0, 0),
            &[published(&us, "us", false, "eu", 0, 12)],
        );
        assert_eq!(eu2, eu);
    }

    #[test]
    fn a_region_never_grants_what_its_tenant_uses() {
        let eu = Account::new(16);
        let us = Account::new(16);
        // eu uses all 16 and us asks for 8: nothing to give.
        let eu = eu.round(
            "eu",
            true,
            &use_("eu", 16, 0),
            &[published(&us, "us", false, "eu", 0, 8)],
        );
        assert_eq!(eu.share(true), 16);
        assert!(eu.given.is_empty());
    }

    #[test]
    fn a_region_that_leaves_takes_its_grants_with_it() {
        let mut cap = GlobalCap {
            home: "eu".into(),
            gpus: Some(Account {
                cap: 16,
                given: [("us".to_string(), 6)].into(),
                received: BTreeMap::new(),
            }),
            gpu_seconds: Some(Account {
                cap: 3600,
                given: [("us".to_string(), 600)].into(),
                received: BTreeMap::new(),
            }),
        };
        assert_eq!(cap.gpu_share("eu"), Some(10));
        assert_eq!(cap.seconds_share("eu"), Some(3000));
        cap.forget("us");
        assert_eq!(cap.gpu_share("eu"), Some(16));
        assert_eq!(cap.seconds_share("eu"), Some(3600));
    }

    #[test]
    fn merged_totals_only_grow() {
        let mut a = Account::new(8);
        a.merge(&BTreeMap::new(), &[("us".to_string(), 5)].into());
        a.merge(&BTreeMap::new(), &[("us".to_string(), 2)].into());
        assert_eq!(a.share(true), 3);
    }

    /// What each region publishes, as a peer last read it.
    #[derive(Clone, Debug)]
    struct Summary {
        account: Account,
        in_use: u64,
        demand: u64,
    }

    #[derive(Clone, Debug)]
    enum Step {
        /// Region `r` runs a round on what it last read of the others.
        Round(usize),
        /// Region `to` reads region `from`'s current summary.
        Deliver { from: usize, to: usize },
        /// Region `r`'s tenant changes what it asks for; it starts jobs
        /// only within its share, and may end some.
        Work { r: usize, demand: u64, ends: u64 },
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (0usize..4).prop_map(Step::Round),
            (0usize..4, 0usize..4).prop_map(|(from, to)| Step::Deliver { from, to }),
            (0usize..4, 0u64..24, 0u64..8).prop_map(|(r, demand, ends)| Step::Work {
                r,
                demand,
                ends
            }),
        ]
    }

    fn name(i: usize) -> String {
        format!("r{i}")
    }

    /// Regions r0 (the home) .. rN of one tenant's account.
    struct World {
        accounts: Vec<Account>,
        in_use: Vec<u64>,
        demand: Vec<u64>,
        /// seen[to][from]: the summary of `from` that `to` last read.
        seen: Vec<Vec<Option<Summary>>>,
    }

    impl World {
        fn new(regions: usize, cap: u64) -> World {
            World {
                accounts: vec![Account::new(cap); regions],
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
                        .map(|s| published(&s.account, &name(o), o == 0, &me, s.in_use, s.demand))
                })
                .collect()
        }

        fn apply(&mut self, step: &Step) {
            let n = self.accounts.len();
            match *step {
                Step::Round(r) if r < n => {
                    let peers = self.peers_of(r);
                    let mine = use_(&name(r), self.in_use[r], self.demand[r]);
                    self.accounts[r] = self.accounts[r].round(&name(r), r == 0, &mine, &peers);
                }
                Step::Deliver { from, to } if from < n && to < n && from != to => {
                    self.seen[to][from] = Some(Summary {
                        account: self.accounts[from].clone(),
                        in_use: self.in_use[from],
                        demand: self.demand[from],
                    });
                }
                Step::Work { r, demand, ends } if r < n => {
                    self.in_use[r] = self.in_use[r].saturating_sub(ends);
                    // Admission: start what is asked, within the share.
                    let share = self.accounts[r].share(r == 0);
                    let start = demand.min(share.saturating_sub(self.in_use[r]));
                    self.in_use[r] += start;
                    self.demand[r] = demand - start;
                }
                _ => {}
            }
        }

        fn shares(&self) -> Vec<u64> {
            (0..self.accounts.len())
                .map(|r| self.accounts[r].share(r == 0))
                .collect()
        }
    }

    proptest! {
        /// Whatever order rounds, deliveries and work come in (summaries
        /// late, lost, reordered, read twice), the shares in force never
        /// sum past the cap, so neither does what the tenant holds; no
        /// region's share falls below what its tenant holds there.
        #[test]
        fn shares_in_force_never_exceed_the_global_cap(
            regions in 2usize..5,
            cap in 0u64..40,
            steps in prop::collection::vec(step(), 0..200),
        ) {
            let mut world = World::new(regions, cap);
            for s in &steps {
                world.apply(s);
                let shares = world.shares();
                let total: u64 = shares.iter().sum();
                prop_assert!(total <= cap, "shares {shares:?} > {cap} after {s:?}");
                let held: u64 = world.in_use.iter().sum();
                prop_assert!(held <= cap);
                for r in 0..regions {
                    prop_assert!(shares[r] >= world.in_use[r], "region {r}: {shares:?} {:?}", world.in_use);
                }
            }
        }

        /// Once demand holds still and summaries flow, the shares reach
        /// the split `rebalance` asks for: every unit of the cap is in
        /// force somewhere, and a region that waits gets what it asks for
        /// when the cap has room.
        #[test]
        fn shares_settle_on_the_split_once_summaries_flow(
            regions in 2usize..5,
            cap in 1u64..40,
            demands in prop::collection::vec(0u64..24, 4),
            noise in prop::collection::vec(step(), 0..60),
        ) {
            let mut world = World::new(regions, cap);
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
            let total: u64 = shares.iter().sum();
            prop_assert_eq!(total, cap, "shares {:?}", shares);
            let uses: Vec<RegionUse> = (0..regions)
                .map(|r| use_(&name(r), world.in_use[r], world.demand[r]))
                .collect();
            let want = rebalance(cap, &uses);
            for r in 0..regions {
                prop_assert_eq!(shares[r], want[&name(r)], "shares {:?} want {:?}", shares, want);
            }
        }
    }
}
