//! Tenants capped across regions, in the ledger: the home region's caps
//! (GPUs held at once, GPU-seconds of budget), the tenant's definition
//! adopted by the other regions, and the share rounds that move parts of
//! each cap between them ([`crate::escrow`]).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The protocol version that brought global caps: the commands are
/// proposed only once every member speaks it.
pub const SINCE_PROTOCOL: u16 = 3;
/// The protocol from which the leader adopts no local tenant of the name a
/// home region shares (an admin's `Command::AdoptLocalTenant` does): a
/// refusal decided at commit, so every replica must make it.
pub const CONSENT_SINCE_PROTOCOL: u16 = 6;

/// Most tenants one region caps globally (each is in every summary).
pub const MAX_GLOBAL_TENANTS: usize = 256;

/// Which of a tenant's caps an account is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Gpus,
    GpuSeconds,
}

/// A round's totals for one account ([`Command::ShareRound`]).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
pub struct RoundTotals {
    pub received: BTreeMap<String, u64>,
    pub given: BTreeMap<String, u64>,
}

/// How regions name a tenant to each other: its home region (the one
/// that set its caps across regions) and its name there. Two regions hold
/// the same tenant only when both hold it under the same id; a tenant
/// without caps across regions is local to its region, whatever its name,
/// and a same-named local tenant of another region is another tenant.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct GlobalTenantId {
    pub home: String,
    pub name: String,
}

impl std::fmt::Display for GlobalTenantId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}", self.name, self.home)
    }
}
