//! Everything that touches the network: the quinn RPC endpoint with mutual
//! TLS against the cluster CA (`rpc`) and the certificate machinery behind it
//! (`tls`), the protocol versions nodes negotiate (`protocol`), the libp2p gossip layer (`gossip`: capacity adverts, heartbeats,
//! RTT samples, admission by ledger-recorded peer ids), and the sans-IO pieces
//! built on what it carries: Vivaldi network coordinates (`vivaldi`) and the
//! heartbeat failure detector (`failure_detector`).

pub mod admission;
pub mod api_tls;
pub mod failure_detector;
pub mod gossip;
pub mod protocol;
pub mod rpc;
mod rpc_traffic;
mod rpc_transport;
pub mod tls;
pub mod vivaldi;

pub use rpc::{PeerInfo, RpcEndpoint, RpcError, RpcHandler};
pub use tls::{CaBundle, NodeCredentials, TlsError};
