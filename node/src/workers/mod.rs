//! The node's background loops. Each is a [`crate::worker::Worker`]: state of
//! its own and a `tick`, driven by [`crate::worker::spawn`] on one shared
//! skeleton (a fixed period, missed ticks delayed rather than bunched, stop
//! on the node's shutdown).

pub mod ca_custody;
pub mod ca_rotation;
pub mod cert_renewal;
pub mod durability;
pub mod federation;
pub mod global_caps;
pub mod gossip;
pub mod gpu_health;
pub mod job_files;
pub mod log_follow;
pub mod member_record;
pub mod own_removal;
pub mod peer_secrets;
pub mod reconcile;
pub mod regions;
pub mod scheduler;
