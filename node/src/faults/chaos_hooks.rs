//! What a chaos run hooks into the nodes it starts in its own process.

use shoal_consensus::store::ApplyObserver;
use std::collections::BTreeSet;

/// Bugs a chaos run can plant, to show that its checker catches them: a
/// checker that never fails proves nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PlantedBug {
    /// The ledger applies a committed plan's placements without checking
    /// them against the state they land on (free GPUs, a waiting job).
    SkipPlanValidation,
    /// `POST /v1/attrs` answers before the write has committed.
    AckBeforeCommit,
}

impl PlantedBug {
    pub const ALL: [PlantedBug; 2] = [PlantedBug::SkipPlanValidation, PlantedBug::AckBeforeCommit];

    pub fn as_str(self) -> &'static str {
        match self {
            PlantedBug::SkipPlanValidation => "skip-plan-validation",
            PlantedBug::AckBeforeCommit => "ack-before-commit",
        }
    }

    pub fn parse(s: &str) -> Option<PlantedBug> {
        PlantedBug::ALL.into_iter().find(|b| b.as_str() == s)
    }
}

/// A node's chaos hooks (the config's `test_chaos`).
#[derive(Clone, Default)]
pub struct ChaosHooks {
    /// Called after every entry the node applies.
    pub observer: Option<ApplyObserver>,
    pub planted: BTreeSet<PlantedBug>,
}

impl ChaosHooks {
    pub fn planted(&self, bug: PlantedBug) -> bool {
        self.planted.contains(&bug)
    }
}

impl std::fmt::Debug for ChaosHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChaosHooks")
            .field("observer", &self.observer.is_some())
            .field("planted", &self.planted)
            .finish()
    }
}

/// Hooks carry a closure, which has no equality: two configs are equal
/// here when both have hooks or neither has (a config's equality is for
/// what a file can set, and a file cannot set these).
impl PartialEq for ChaosHooks {
    fn eq(&self, other: &ChaosHooks) -> bool {
        self.planted == other.planted && self.observer.is_some() == other.observer.is_some()
    }
}
