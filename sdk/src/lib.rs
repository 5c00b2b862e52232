//! The public contract of Shoal: the JSON types of the HTTP API (what
//! INTERFACE.md promises to scripts) and, behind the default `client`
//! feature, a small HTTP client. Internal crates take the types only.

pub mod federation;
pub mod stats;
pub mod types;
pub mod units;

#[cfg(feature = "client")]
pub mod client;
#[cfg(feature = "client")]
pub use client::{Client, ClientError};

pub use federation::*;
pub use types::*;

/// Response header of `GET /v1/jobs/{id}/logs`: the offset of the first
/// byte returned (0 after a rotation, whatever was asked).
pub const LOG_START_HEADER: &str = "x-shoal-log-start";
/// Response header of `GET /v1/jobs/{id}/logs`: how often the log was
/// rotated so far.
pub const LOG_ROTATIONS_HEADER: &str = "x-shoal-log-rotations";
