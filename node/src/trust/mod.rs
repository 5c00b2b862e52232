//! Who may do what: API tokens and member certificates ([`auth`]), the
//! audit log of refusals ([`audit`]), the cluster CA's key in the voters'
//! custody ([`ca_key`]) and its rotation ([`ca_rotation`]).

pub mod audit;
pub mod auth;
pub mod ca_key;
pub mod ca_rotation;
