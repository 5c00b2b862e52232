//! The pure half of Shoal's chaos runs (`shoal bench chaos`): everything
//! that decides or judges, and nothing that does I/O, so that a schedule
//! replays from its seed alone and a checker can be tested on histories
//! written by hand, including ones with planted bugs.
//!
//! - [`schedule`]: a seeded generator of fault schedules;
//! - [`history`]: the operations clients invoked and what came back;
//! - [`linearizable`]: a per-key register linearizability checker
//!   (Wing & Gong search with Lowe's memoisation, as in Knossos/Porcupine);
//! - [`invariants`]: properties of the ledger at every applied index, of the
//!   ranks' own start/stop records, and of the final state.
//!
//! The I/O half (clusters, clients, fault injection) is `shoal_node::chaos`.

pub mod history;
pub mod invariants;
pub mod linearizable;
pub mod schedule;

/// One thing a checker found wrong, with enough context to debug it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Violation {
    /// Which property: `linearizable`, `gpu-held-twice`, `epochs-overlap`, ...
    pub property: String,
    /// What was seen, for a human.
    pub detail: String,
}

impl Violation {
    pub fn new(property: &str, detail: impl Into<String>) -> Violation {
        Violation {
            property: property.into(),
            detail: detail.into(),
        }
    }
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.property, self.detail)
    }
}
