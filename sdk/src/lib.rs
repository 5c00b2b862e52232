//! The public contract of Shoal: the JSON types of the HTTP API (what
//! INTERFACE.md promises to scripts) and, behind the default `client`
//! feature, a small HTTP client. Internal crates take the types only.

pub mod types;

#[cfg(feature = "client")]
pub mod client;
#[cfg(feature = "client")]
pub use client::{Client, ClientError};

pub use types::*;
