//! A tenant's global GPU cap split into per-region shares.
//!
//! Each region admits a tenant's work only within its own share, so the
//! tenant's total across regions stays within the global cap even when the
//! regions cannot talk: no region ever needs another's answer to admit a
//! job. Shares move with demand: from the regions' summaries (what the
//! tenant uses and waits for in each) every region computes the same
//! [`rebalance`] and takes its new share under the rule in
//! docs/federation.md (a share grows only by what the others have
//! published as given up, so a lowered share is never counted twice).
//!
//! The split: every region first keeps what it uses now (scaled down
//! proportionally when the uses alone exceed the cap, after the cap was
//! lowered); what is left goes to the regions' pending demand, max-min
//! fair; what nobody asks for is spread evenly as headroom, so a region
//! can admit a new job before the next round. The sum never exceeds the
//! cap.

use std::collections::BTreeMap;

/// What a tenant does in one region, in the amount being split (GPUs, or
/// GPU-seconds of a budget).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionUse {
    pub region: String,
    /// What its running jobs hold (or have committed) there.
    pub in_use: u64,
    /// What its pending jobs there ask for.
    pub demand: u64,
}

/// Spreads `amount` over `weights` proportionally (largest remainder, ties
/// to the earlier entry): the parts sum to `amount` exactly when any weight
/// is non-zero, and no part exceeds its weight when `amount` ≤ Σ weights.
fn proportional(amount: u64, weights: &[u64]) -> Vec<u64> {
    let total: u64 = weights.iter().sum();
    if total == 0 {
        return vec![0; weights.len()];
    }
    // In u128: amounts of GPU-seconds times weights of GPU-seconds.
    let scaled = |w: u64| u128::from(amount) * u128::from(w);
    let total128 = u128::from(total);
    let mut parts: Vec<u64> = weights
        .iter()
        .map(|&w| u64::try_from(scaled(w) / total128).unwrap_or(u64::MAX))
        .collect();
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(scaled(weights[i]) % total128));
    let mut left = amount - parts.iter().sum::<u64>();
    for i in order {
        if left == 0 {
            break;
        }
        parts[i] += 1;
        left -= 1;
    }
    parts
}

/// Max-min fair split of `amount` over `demands`: nobody gets more than
/// they ask; what one cannot use goes to the others.
fn water_fill(mut amount: u64, demands: &[u64]) -> Vec<u64> {
    let mut given = vec![0u64; demands.len()];
    loop {
        let hungry: Vec<usize> = (0..demands.len())
            .filter(|&i| given[i] < demands[i])
            .collect();
        if hungry.is_empty() || amount == 0 {
            return given;
        }
        let each = (amount / hungry.len() as u64).max(1);
        for i in hungry {
            if amount == 0 {
                break;
            }
            let take = each.min(demands[i] - given[i]).min(amount);
            given[i] += take;
            amount -= take;
        }
    }
}

/// The per-region shares of a global cap of `cap`, by region name.
/// Deterministic and independent of the order of `regions` (regions are
/// taken by name; a name given twice counts once, its last entry).
pub fn rebalance(cap: u64, regions: &[RegionUse]) -> BTreeMap<String, u64> {
    let by_name: BTreeMap<&str, &RegionUse> =
        regions.iter().map(|r| (r.region.as_str(), r)).collect();
    let names: Vec<&str> = by_name.keys().copied().collect();
    let uses: Vec<u64> = by_name.values().map(|r| r.in_use).collect();
    let used: u64 = uses.iter().sum();
    let mut shares = if used > cap {
        proportional(cap, &uses)
    } else {
        uses.clone()
    };
    let mut left = cap - shares.iter().sum::<u64>();
    let demands: Vec<u64> = by_name.values().map(|r| r.demand).collect();
    for (s, d) in shares.iter_mut().zip(water_fill(left, &demands)) {
        *s += d;
        left -= d;
    }
    if !names.is_empty() {
        let even = proportional(left, &vec![1; names.len()]);
        for (s, e) in shares.iter_mut().zip(even) {
            *s += e;
        }
    }
    names
        .into_iter()
        .zip(shares)
        .map(|(n, s)| (n.to_string(), s))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn r(region: &str, in_use: u32, demand: u32) -> RegionUse {
        RegionUse {
            region: region.into(),
            in_use: u64::from(in_use),
            demand: u64::from(demand),
        }
    }

    #[test]
    fn demand_moves_the_share() {
        let s = rebalance(16, &[r("eu", 4, 12), r("us", 4, 0)]);
        assert_eq!(s["eu"], 12);
        assert_eq!(s["us"], 4);
    }

    #[test]
    fn idle_cap_is_headroom_for_everyone() {
        let s = rebalance(16, &[r("eu", 0, 0), r("us", 0, 0)]);
        assert_eq!(s["eu"] + s["us"], 16);
        assert_eq!(s["eu"], 8);
    }

    #[test]
    fn a_lowered_cap_scales_uses_down() {
        let s = rebalance(8, &[r("eu", 8, 0), r("us", 8, 4)]);
        assert_eq!(s["eu"] + s["us"], 8);
        assert_eq!(s["eu"], 4);
    }

    proptest! {
        /// The tenant's shares never sum past its global cap; a region
        /// keeps at least what it uses when the uses fit the cap; every
        /// GPU of the cap is handed out; the order of the input is
        /// irrelevant.
        #[test]
        fn shares_never_exceed_the_global_cap(
            cap in 0u64..200,
            uses in prop::collection::vec((0u32..64, 0u32..64), 0..6),
            rotate in 0usize..6,
        ) {
            let regions: Vec<RegionUse> = uses
                .iter()
                .enumerate()
                .map(|(i, (u, d))| r(&format!("r{i}"), *u, *d))
                .collect();
            let shares = rebalance(cap, &regions);
            let sum: u64 = shares.values().sum();
            prop_assert!(sum <= cap, "{sum} > {cap}");
            if !regions.is_empty() {
                prop_assert_eq!(sum, cap);
            }
            let used: u64 = regions.iter().map(|r| r.in_use).sum();
            if used <= cap {
                for reg in &regions {
                    prop_assert!(shares[&reg.region] >= reg.in_use);
                }
            }
            let mut rotated = regions.clone();
            if !rotated.is_empty() {
                let len = rotated.len();
                rotated.rotate_left(rotate % len);
            }
            prop_assert_eq!(rebalance(cap, &rotated), shares);
        }

        /// Budgets in GPU-seconds are large numbers: the split neither
        /// overflows nor loses a second.
        #[test]
        fn budgets_in_gpu_seconds_split_exactly(
            cap in 0u64..(1u64 << 50),
            uses in prop::collection::vec((0u64..(1u64 << 48), 0u64..(1u64 << 48)), 1..5),
        ) {
            let regions: Vec<RegionUse> = uses
                .iter()
                .enumerate()
                .map(|(i, (u, d))| RegionUse { region: format!("r{i}"), in_use: *u, demand: *d })
                .collect();
            let shares = rebalance(cap, &regions);
            prop_assert_eq!(shares.values().sum::<u64>(), cap);
        }

        /// Two regions, a cap of 16 (the case): whatever each uses
        /// and asks for, the two shares together stay within 16.
        #[test]
        fn two_regions_never_hold_more_than_16(
            a in (0u32..=16, 0u32..32),
            b in (0u32..=16, 0u32..32),
        ) {
            let shares = rebalance(16, &[r("a", a.0, a.1), r("b", b.0, b.1)]);
            prop_assert!(shares["a"] + shares["b"] <= 16);
        }
    }
}
