//! Seeded fault schedules. A schedule is a pure function of its
//! [`ScheduleConfig`]: the same seed gives the same faults at the same
//! times, which is what makes a violation replayable from its seed.
//!
//! Faults are drawn one after another along the run: each starts after a
//! quiet gap, lasts a while, and is healed; up to
//! [`ScheduleConfig::max_concurrent`] overlap. At most one fault that takes
//! a node away (a crash, a pause, a disk filling up, a voter removed) is
//! active at a time, so that a 3-node cluster keeps a majority of intact
//! data dirs: losing two of three would lose acknowledged writes
//! legitimately, and the checker would then report the fault model, not
//! the product. Network faults overlap freely with each other and with a
//! node fault, so quorum is lost now and then — safety must hold anyway.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// A node of the run, by position (0-based). A position keeps its index
/// when its node is replaced (restarted without data, or removed and
/// joined again under a new node id).
pub type Slot = usize;

/// The kinds of fault a schedule may draw.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    Partition,
    Bridge,
    OneWay,
    Drop,
    Delay,
    Crash,
    CrashWipe,
    Pause,
    ClockJump,
    DiskFull,
    RemoveVoter,
}

impl FaultKind {
    pub const ALL: [FaultKind; 11] = [
        FaultKind::Partition,
        FaultKind::Bridge,
        FaultKind::OneWay,
        FaultKind::Drop,
        FaultKind::Delay,
        FaultKind::Crash,
        FaultKind::CrashWipe,
        FaultKind::Pause,
        FaultKind::ClockJump,
        FaultKind::DiskFull,
        FaultKind::RemoveVoter,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FaultKind::Partition => "partition",
            FaultKind::Bridge => "bridge",
            FaultKind::OneWay => "one-way",
            FaultKind::Drop => "drop",
            FaultKind::Delay => "delay",
            FaultKind::Crash => "crash",
            FaultKind::CrashWipe => "crash-wipe",
            FaultKind::Pause => "pause",
            FaultKind::ClockJump => "clock-jump",
            FaultKind::DiskFull => "disk-full",
            FaultKind::RemoveVoter => "remove-voter",
        }
    }

    pub fn parse(s: &str) -> Option<FaultKind> {
        FaultKind::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// Takes a node away while it lasts (see the module docs).
    pub fn takes_a_node(self) -> bool {
        matches!(
            self,
            FaultKind::Crash
                | FaultKind::CrashWipe
                | FaultKind::Pause
                | FaultKind::DiskFull
                | FaultKind::RemoveVoter
        )
    }
}

/// One fault, as installed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum Fault {
    /// Cuts `minority` off from the other nodes, both ways.
    Partition { minority: Vec<Slot> },
    /// Cuts `left` from `right`; `bridge` still talks to both sides.
    Bridge {
        left: Vec<Slot>,
        bridge: Slot,
        right: Vec<Slot>,
    },
    /// Cuts what `from` starts towards `to`; the reverse still flows.
    OneWay { from: Slot, to: Slot },
    /// Loses this share of every message, everywhere.
    Drop { percent: u8 },
    /// Holds every message to and from `node` this long.
    Delay { node: Slot, ms: u64 },
    /// Stops the node abruptly; healing starts it again from its data dir,
    /// or (`wipe`) as a new node joining with an empty one.
    Crash { node: Slot, wipe: bool },
    /// Freezes the node's agent (timers, I/O, Raft) while its ranks keep
    /// running, like SIGSTOP of the agent's process.
    Pause { node: Slot },
    /// Moves the node's wall clock by `offset_ms`; healing moves it back.
    ClockJump { node: Slot, offset_ms: i64 },
    /// Fills the file system of the node's data dir.
    DiskFull { node: Slot },
    /// Removes the node from the cluster (an operator's `node remove`);
    /// healing joins it again with an empty data dir.
    RemoveVoter { node: Slot },
}

impl Fault {
    pub fn kind(&self) -> FaultKind {
        match self {
            Fault::Partition { .. } => FaultKind::Partition,
            Fault::Bridge { .. } => FaultKind::Bridge,
            Fault::OneWay { .. } => FaultKind::OneWay,
            Fault::Drop { .. } => FaultKind::Drop,
            Fault::Delay { .. } => FaultKind::Delay,
            Fault::Crash { wipe: false, .. } => FaultKind::Crash,
            Fault::Crash { wipe: true, .. } => FaultKind::CrashWipe,
            Fault::Pause { .. } => FaultKind::Pause,
            Fault::ClockJump { .. } => FaultKind::ClockJump,
            Fault::DiskFull { .. } => FaultKind::DiskFull,
            Fault::RemoveVoter { .. } => FaultKind::RemoveVoter,
        }
    }

    /// The node a node fault takes away.
    pub fn node(&self) -> Option<Slot> {
        match self {
            Fault::Crash { node, .. }
            | Fault::Pause { node }
            | Fault::DiskFull { node }
            | Fault::RemoveVoter { node } => Some(*node),
            _ => None,
        }
    }
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fault::Partition { minority } => write!(f, "partition {minority:?} | rest"),
            Fault::Bridge {
                left,
                bridge,
                right,
            } => write!(f, "bridge {left:?} <{bridge}> {right:?}"),
            Fault::OneWay { from, to } => write!(f, "one-way {from} -> {to}"),
            Fault::Drop { percent } => write!(f, "drop {percent}%"),
            Fault::Delay { node, ms } => write!(f, "delay {node} {ms} ms"),
            Fault::Crash { node, wipe: false } => write!(f, "crash {node}"),
            Fault::Crash { node, wipe: true } => write!(f, "crash {node} (data lost)"),
            Fault::Pause { node } => write!(f, "pause {node}"),
            Fault::ClockJump { node, offset_ms } => write!(f, "clock {node} {offset_ms:+} ms"),
            Fault::DiskFull { node } => write!(f, "disk full {node}"),
            Fault::RemoveVoter { node } => write!(f, "remove {node}"),
        }
    }
}

/// What happens at one point of the run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "action")]
pub enum Action {
    Start { id: u32, fault: Fault },
    Heal { id: u32 },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    /// Milliseconds after the workload started.
    pub at_ms: u64,
    pub action: Action,
}

/// What a schedule is drawn from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduleConfig {
    pub seed: u64,
    pub nodes: usize,
    pub duration_ms: u64,
    pub kinds: BTreeSet<FaultKind>,
    pub max_concurrent: usize,
    /// A pause lasts at least this long (longer than an election timeout,
    /// or it is no fault at all).
    pub min_pause_ms: u64,
}

impl ScheduleConfig {
    pub fn new(seed: u64, nodes: usize, duration_ms: u64) -> ScheduleConfig {
        ScheduleConfig {
            seed,
            nodes,
            duration_ms,
            kinds: FaultKind::ALL.into_iter().collect(),
            max_concurrent: 2,
            min_pause_ms: 2_000,
        }
    }
}

/// The faults of one run, in time order; every fault started is healed by
/// `duration_ms`.
pub fn generate(cfg: &ScheduleConfig) -> Vec<Step> {
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let kinds: Vec<FaultKind> = cfg
        .kinds
        .iter()
        .copied()
        .filter(|k| applicable(*k, cfg.nodes))
        .collect();
    let mut steps = Vec::new();
    if kinds.is_empty() || cfg.nodes == 0 {
        return steps;
    }
    // (heal time, id, takes a node) of the faults active at `now`.
    let mut active: Vec<(u64, u32, bool)> = Vec::new();
    let mut now = 0u64;
    let mut next_id = 0u32;
    loop {
        now += rng.random_range(300..2_500);
        if now >= cfg.duration_ms {
            break;
        }
        for (heal_at, id, _) in active.iter().filter(|(at, _, _)| *at <= now) {
            steps.push(Step {
                at_ms: *heal_at,
                action: Action::Heal { id: *id },
            });
        }
        active.retain(|(at, _, _)| *at > now);
        if active.len() >= cfg.max_concurrent {
            continue;
        }
        let node_busy = active.iter().any(|(_, _, node)| *node);
        let choices: Vec<FaultKind> = kinds
            .iter()
            .copied()
            .filter(|k| !(node_busy && k.takes_a_node()))
            .collect();
        if choices.is_empty() {
            continue;
        }
        let kind = choices[rng.random_range(0..choices.len())];
        let fault = draw(kind, cfg.nodes, &mut rng);
        // A pause runs past the election timeout, and often past failure
        // detection and the fencing wait too: the case where the cluster
        // moves a paused node's work while its ranks still run.
        let lasts = if kind == FaultKind::Pause {
            rng.random_range(cfg.min_pause_ms..cfg.min_pause_ms.max(12_000) + 1)
        } else {
            rng.random_range(800..6_000)
        };
        let heal_at = (now + lasts).min(cfg.duration_ms);
        steps.push(Step {
            at_ms: now,
            action: Action::Start { id: next_id, fault },
        });
        active.push((heal_at, next_id, kind.takes_a_node()));
        next_id += 1;
    }
    for (heal_at, id, _) in active {
        steps.push(Step {
            at_ms: heal_at,
            action: Action::Heal { id },
        });
    }
    // Stable: a heal and a start at the same millisecond keep their order.
    steps.sort_by_key(|s| s.at_ms);
    steps
}

/// Whether `kind` means anything on `nodes` nodes.
fn applicable(kind: FaultKind, nodes: usize) -> bool {
    match kind {
        FaultKind::Bridge => nodes >= 3,
        FaultKind::Partition | FaultKind::OneWay => nodes >= 2,
        // Taking one node of fewer than three away loses the majority for
        // good (a wipe) or makes every run a quorum loss.
        k if k.takes_a_node() => nodes >= 3,
        _ => true,
    }
}

fn draw(kind: FaultKind, nodes: usize, rng: &mut ChaCha8Rng) -> Fault {
    let mut order: Vec<Slot> = (0..nodes).collect();
    shuffle(&mut order, rng);
    let one = order[0];
    match kind {
        FaultKind::Partition => {
            // A minority of one up to less than half; the rest keep quorum
            // unless another fault takes it.
            let size = rng.random_range(1..=nodes.div_ceil(2).max(1));
            let mut minority = order[..size.min(nodes - 1)].to_vec();
            minority.sort_unstable();
            Fault::Partition { minority }
        }
        FaultKind::Bridge => {
            let bridge = order[0];
            let rest = &order[1..];
            let split = rng.random_range(1..rest.len());
            let mut left = rest[..split].to_vec();
            let mut right = rest[split..].to_vec();
            left.sort_unstable();
            right.sort_unstable();
            Fault::Bridge {
                left,
                bridge,
                right,
            }
        }
        FaultKind::OneWay => Fault::OneWay {
            from: order[0],
            to: order[1],
        },
        FaultKind::Drop => Fault::Drop {
            percent: rng.random_range(5..=35),
        },
        FaultKind::Delay => Fault::Delay {
            node: one,
            ms: rng.random_range(20..=400),
        },
        FaultKind::Crash => Fault::Crash {
            node: one,
            wipe: false,
        },
        FaultKind::CrashWipe => Fault::Crash {
            node: one,
            wipe: true,
        },
        FaultKind::Pause => Fault::Pause { node: one },
        FaultKind::ClockJump => {
            let magnitude = rng.random_range(5_000..=120_000i64);
            let offset_ms = if rng.random_bool(0.5) {
                magnitude
            } else {
                -magnitude
            };
            Fault::ClockJump {
                node: one,
                offset_ms,
            }
        }
        FaultKind::DiskFull => Fault::DiskFull { node: one },
        FaultKind::RemoveVoter => Fault::RemoveVoter { node: one },
    }
}

fn shuffle(items: &mut [Slot], rng: &mut ChaCha8Rng) {
    for i in (1..items.len()).rev() {
        let j = rng.random_range(0..=i);
        items.swap(i, j);
    }
}

/// Faults started, by kind, for reports.
pub fn count_by_kind(steps: &[Step]) -> std::collections::BTreeMap<FaultKind, u32> {
    let mut counts = std::collections::BTreeMap::new();
    for step in steps {
        if let Action::Start { fault, .. } = &step.action {
            *counts.entry(fault.kind()).or_insert(0) += 1;
        }
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[test]
    fn the_same_seed_gives_the_same_schedule() {
        let cfg = ScheduleConfig::new(42, 5, 60_000);
        assert_eq!(generate(&cfg), generate(&cfg));
        let other = ScheduleConfig::new(43, 5, 60_000);
        assert_ne!(generate(&cfg), generate(&other));
    }

    #[test]
    fn a_long_run_draws_every_kind() {
        let mut seen = BTreeSet::new();
        for seed in 0..20 {
            seen.extend(
                count_by_kind(&generate(&ScheduleConfig::new(seed, 5, 60_000))).into_keys(),
            );
        }
        assert_eq!(seen, FaultKind::ALL.into_iter().collect());
    }

    #[test]
    fn node_faults_are_not_drawn_for_two_nodes() {
        for seed in 0..50 {
            let steps = generate(&ScheduleConfig::new(seed, 2, 30_000));
            assert!(count_by_kind(&steps).keys().all(|k| !k.takes_a_node()));
        }
    }

    proptest! {
        #[test]
        fn every_schedule_is_well_formed(seed in any::<u64>(), nodes in 1usize..8, secs in 1u64..120) {
            let cfg = ScheduleConfig::new(seed, nodes, secs * 1000);
            let steps = generate(&cfg);
            let mut started: BTreeMap<u32, Fault> = BTreeMap::new();
            let mut active: BTreeMap<u32, Fault> = BTreeMap::new();
            let mut last = 0;
            for step in &steps {
                prop_assert!(step.at_ms >= last, "time order");
                prop_assert!(step.at_ms <= cfg.duration_ms);
                last = step.at_ms;
                match &step.action {
                    Action::Start { id, fault } => {
                        prop_assert!(started.insert(*id, fault.clone()).is_none());
                        active.insert(*id, fault.clone());
                        prop_assert!(active.len() <= cfg.max_concurrent);
                        let node_faults = active.values().filter(|f| f.kind().takes_a_node()).count();
                        prop_assert!(node_faults <= 1, "one node fault at a time");
                        check_slots(fault, nodes)?;
                    }
                    Action::Heal { id } => {
                        prop_assert!(active.remove(id).is_some(), "heal of an active fault");
                    }
                }
            }
            prop_assert!(active.is_empty(), "every fault healed");
        }
    }

    fn check_slots(fault: &Fault, nodes: usize) -> Result<(), TestCaseError> {
        let slots: Vec<Slot> = match fault {
            Fault::Partition { minority } => {
                prop_assert!(!minority.is_empty() && minority.len() < nodes);
                minority.clone()
            }
            Fault::Bridge {
                left,
                bridge,
                right,
            } => {
                prop_assert!(!left.is_empty() && !right.is_empty());
                let all: BTreeSet<Slot> =
                    left.iter().chain(right).chain([bridge]).copied().collect();
                prop_assert_eq!(all.len(), nodes);
                all.into_iter().collect()
            }
            Fault::OneWay { from, to } => {
                prop_assert_ne!(from, to);
                vec![*from, *to]
            }
            Fault::Drop { percent } => {
                prop_assert!(*percent <= 100);
                vec![]
            }
            Fault::Delay { node, .. } | Fault::ClockJump { node, .. } => vec![*node],
            other => other.node().into_iter().collect(),
        };
        prop_assert!(slots.iter().all(|s| *s < nodes));
        Ok(())
    }
}
