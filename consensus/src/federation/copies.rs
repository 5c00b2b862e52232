//! Checkpoint copies in another region, and taking a job over from a lost
//! region (docs/federation.md, "Cross-region checkpoint copies").
//!
//! The job's own region (the *origin*) records which region holds a copy
//! of which step (`copies_out`), starting before the first byte is sent,
//! so that its nodes know from then on that the job may be taken over and
//! run its ranks only under that region's lease. The region holding a copy
//! records the job's spec and the copied step with its parts on its own
//! nodes (`foreign`). When the origin is lost, the holder *adopts* the job:
//! it becomes a local job, restored from that step, placed no earlier than
//! the origin's ranks are fenced. The origin, once it hears of the
//! adoption, ends its own copy of the job (`JobMoved`).

use crate::workload::{Checkpoint, JobId, JobSpec};
use serde::{Deserialize, Serialize};

/// The protocol from which a copy is recorded only for a tenant this
/// region shares across regions (a copy becomes the tenant's job here when
/// the region takes it over): a refusal decided at commit.
pub const SHARED_ONLY_SINCE_PROTOCOL: u16 = 6;

/// Most jobs of one peer region whose copies this region keeps.
pub const MAX_FOREIGN_JOBS: usize = 4096;

/// A job of a peer region whose checkpoint this region holds a copy of.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ForeignJob {
    pub spec: JobSpec,
    /// The newest copied step; its parts' holders are this region's nodes.
    pub checkpoint: Checkpoint,
    /// The origin's ledger index when the step was sent: a summary of the
    /// origin newer than this that no longer lists the job as live means
    /// it ended there, and the copy is dropped.
    pub origin_index: u64,
    pub received_at_ms: u64,
    /// The local job it became when this region took it over.
    pub adopted_as: Option<JobId>,
}

/// A job this region took over from a peer region, as its summary says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Adoption {
    pub origin_job: JobId,
    pub job: JobId,
}
