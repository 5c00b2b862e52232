//! The joining side of admission: asks a member to admit this node and
//! checks the answer against the join token's CA pin.

use super::AgentError;
use crate::identity::{self, Identity};
use crate::proto::{self, ErrorCode, JoinRequest, Request, Response};
use shoal_consensus::MemberSpec;
use shoal_mesh::NodeCredentials;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// How long a joining node keeps asking while the cluster has no leader.
const JOIN_RETRY_FOR: Duration = Duration::from_secs(60);

pub async fn join_cluster(
    addr: SocketAddr,
    token: &str,
    spec: &MemberSpec,
) -> Result<Identity, AgentError> {
    let parsed = identity::parse_join_token(token).map_err(AgentError::Join)?;
    let (key_pem, csr_pem) = shoal_mesh::tls::new_key_and_csr(&spec.name)
        .map_err(|e| AgentError::Join(e.to_string()))?;
    let req = Request::Join(JoinRequest {
        secret: parsed.secret.clone(),
        ca_pin: parsed.ca_pin.clone(),
        spec: spec.clone(),
        csr_pem,
    });
    // A leader change while the cluster admits us is transient: the node we
    // asked forwards to the leader and retries for a while, and so do we.
    // Admission is idempotent for the same name and gossip key.
    let deadline = Instant::now() + JOIN_RETRY_FOR;
    // From the address this node will serve on, when it names one of the
    // asked member's family.
    let from = spec
        .rpc_addr
        .parse::<SocketAddr>()
        .ok()
        .map(|a| a.ip())
        .filter(|ip| !ip.is_unspecified() && ip.is_ipv4() == addr.is_ipv4());
    let reply = loop {
        let body = proto::encode(&req);
        let timeout = Duration::from_secs(30);
        let called =
            shoal_mesh::rpc::call_as_joiner_from(from, addr, &parsed.ca_pin, &body, timeout).await;
        let (reply, _ca) =
            called.map_err(|e| AgentError::Join(format!("cannot join via {addr}: {e}")))?;
        match proto::decode::<Response>(&reply) {
            Ok(Response::Error(e))
                if matches!(e.code, ErrorCode::NotLeader | ErrorCode::Unavailable)
                    && Instant::now() < deadline =>
            {
                tracing::info!(error = %e.message, "the cluster could not admit us yet; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            _ => break reply,
        }
    };
    match proto::decode::<Response>(&reply).map_err(|e| AgentError::Join(e.to_string()))? {
        Response::Join(j) => {
            let got_pin = shoal_mesh::tls::pem_to_der(&j.ca_pem)
                .map(|d| shoal_mesh::tls::fingerprint_der(&d))
                .map_err(|e| AgentError::Join(e.to_string()))?;
            if got_pin != parsed.ca_pin {
                return Err(AgentError::Join(format!(
                    "{addr} answered with a CA that does not match the join token's pin"
                )));
            }
            tracing::info!(node = j.node_id, cluster = %j.cluster_id, "joined the cluster");
            Ok(Identity {
                node_id: j.node_id,
                name: spec.name.clone(),
                cluster_id: j.cluster_id,
                credentials: NodeCredentials {
                    key_pem,
                    cert_pem: j.cert_pem,
                    ca_pem: j.ca_pem,
                },
            })
        }
        Response::Error(e) => Err(AgentError::Join(format!(
            "{addr} refused the join: {}",
            e.message
        ))),
        _ => Err(AgentError::Join(format!(
            "{addr} answered the join with something unexpected"
        ))),
    }
}
