//! Everything that touches the network: the quinn RPC endpoint with mutual
//! TLS against the cluster CA (`rpc`) and the certificate machinery behind it
//! (`tls`), plus the sans-IO pieces the gossip layer is built from: Vivaldi
//! network coordinates (`vivaldi`) and the heartbeat failure detector
//! (`failure_detector`).

pub mod failure_detector;
pub mod rpc;
pub mod tls;
pub mod vivaldi;

pub use rpc::{PeerInfo, RpcEndpoint, RpcError, RpcHandler};
pub use tls::{CaBundle, NodeCredentials, TlsError};
