//! Who may do what: a joining node's admission (join token, CA pin,
//! certificate request), join and API token issue, and the lookup of the
//! caller behind an API token.

use super::client::LedgerClient;
use super::clock::wall_ms;
use super::identity;
use crate::rpc::proto::{ErrorCode, JoinRequest, JoinResponse, UserToken, WireError};
use shoal_consensus::{Command, LedgerResponse, NodeId};
use shoal_mesh::CaBundle;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// How long a follower waits for an unknown API token to appear in its
/// ledger before refusing it (see [`caller_eventually`]).
const TOKEN_CATCH_UP: Duration = Duration::from_secs(2);

/// Who sent a request: the API token's name and, for a tenant-scoped token,
/// its tenant. The token itself goes along with the caller's writes, so the
/// leader checks it again rather than trusting the node that relays it.
#[derive(Clone, Debug)]
pub struct Caller {
    pub name: String,
    pub tenant: Option<String>,
    pub token: UserToken,
}

impl Caller {
    /// `cmd` as this caller may send it: a tenant token's writes are checked
    /// by the ledger at commit.
    pub fn scoped(&self, cmd: Command) -> Command {
        match &self.tenant {
            None => cmd,
            Some(tenant) => Command::AsTenant {
                tenant: tenant.clone(),
                cmd: Box::new(cmd),
            },
        }
    }
}

/// Who holds `token`: `None` when the ledger does not know its hash.
pub fn caller(ledger: &LedgerClient, token: &str) -> Option<Caller> {
    let hash = identity::hash_secret(token);
    let d = ledger.read().ok()?;
    d.ledger.api_tokens.get(&hash).map(|t| Caller {
        name: t.name.clone(),
        tenant: t.tenant.clone(),
        token: UserToken(token.to_string()),
    })
}

/// [`caller`], allowing for this node's ledger to lag: a token created a
/// moment ago through another node may not be applied here yet, so a
/// follower looks an unknown token up again as it catches up, for up to
/// `TOKEN_CATCH_UP`. The leader's ledger is current.
pub async fn caller_eventually(ledger: &LedgerClient, token: &str) -> Option<Caller> {
    let deadline = Instant::now() + TOKEN_CATCH_UP;
    loop {
        if let Some(caller) = caller(ledger, token) {
            return Some(caller);
        }
        let leader = ledger.current_leader() == Some(ledger.me());
        if leader || Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A new API token, admin or scoped to `tenant`; only its hash is kept.
pub async fn create_api_token(
    ledger: &LedgerClient,
    by: &Caller,
    name: String,
    tenant: Option<String>,
) -> Result<(String, LedgerResponse), WireError> {
    let (token, hash) = identity::new_api_token();
    let (resp, _) = ledger
        .write_as(&by.token, Command::CreateApiToken { hash, name, tenant })
        .await?;
    Ok((token, resp))
}

/// A new join token valid for `ttl`, pinned to the cluster's CA; returns
/// the token and when it expires (ms since the epoch).
pub async fn create_join_token(
    ledger: &LedgerClient,
    by: &Caller,
    ttl: Duration,
) -> Result<(String, u64), WireError> {
    let pin = {
        let d = ledger.read()?;
        let cluster = d.ledger.cluster.as_ref().ok_or_else(|| {
            WireError::new(
                ErrorCode::Unavailable,
                "the cluster is not bootstrapped yet",
            )
        })?;
        CaBundle {
            cert_pem: cluster.ca_cert_pem.clone(),
            key_pem: String::new(),
        }
        .fingerprint()
        .map_err(|e| WireError::new(ErrorCode::Internal, e.to_string()))?
    };
    let (token, hash) = identity::new_join_token(&pin);
    let expires_at_ms = wall_ms() + ttl.as_millis() as u64;
    let (resp, _) = ledger
        .write_as(
            &by.token,
            Command::CreateJoinToken {
                hash,
                expires_at_ms,
            },
        )
        .await?;
    match resp {
        LedgerResponse::Denied(m) => Err(WireError::new(ErrorCode::Forbidden, m)),
        LedgerResponse::Rejected(m) => Err(WireError::new(ErrorCode::Rejected, m)),
        _ => Ok((token, expires_at_ms)),
    }
}

/// Admits a joining node: checks its token and CA pin, records it in the
/// ledger (which assigns its id) and signs its certificate. The leader's
/// housekeeping loop then adds it to Raft as a learner and decides
/// whether it votes: one place changes Raft membership, so joins never
/// race with voter changes.
pub async fn admit(
    ledger: &LedgerClient,
    j: JoinRequest,
    signing: &Signing,
) -> Result<JoinResponse, WireError> {
    let (cluster, token_check) = {
        let d = ledger.read()?;
        (
            d.ledger.cluster.clone(),
            d.ledger
                .join_token_valid(&identity::hash_secret(&j.secret), wall_ms()),
        )
    };
    let cluster = cluster.ok_or_else(|| {
        WireError::new(
            ErrorCode::Unavailable,
            "the cluster is not bootstrapped yet",
        )
    })?;
    let pin = CaBundle {
        cert_pem: cluster.ca_cert_pem.clone(),
        key_pem: String::new(),
    }
    .fingerprint()
    .map_err(|e| WireError::new(ErrorCode::Internal, e.to_string()))?;
    if pin != j.ca_pin {
        return Err(WireError::new(
            ErrorCode::Forbidden,
            "the join token was issued by another cluster (CA pin mismatch)",
        ));
    }
    token_check.map_err(|m| WireError::new(ErrorCode::Forbidden, m))?;
    let ca = super::ca_key::signing_ca(&signing.data_dir, &cluster.ca_cert_pem)?;
    let cert_lifetime = signing.lifetime;
    shoal_consensus::ledger::validate_name(&j.spec.name)
        .map_err(|m| WireError::new(ErrorCode::Invalid, m))?;
    j.spec.rpc_addr.parse::<SocketAddr>().map_err(|_| {
        WireError::new(
            ErrorCode::Invalid,
            format!("invalid RPC address '{}'", j.spec.rpc_addr),
        )
    })?;
    // Check the CSR before anything is committed, so a bad request leaves
    // no member behind.
    ca.sign_csr(&j.csr_pem, &j.spec.name, 0).map_err(|e| {
        WireError::new(
            ErrorCode::Invalid,
            format!("invalid certificate request: {e}"),
        )
    })?;
    // A join whose answer was lost (a leader change, a timeout) is retried
    // by the joiner or by the forwarding node; the gossip peer id comes
    // from the joiner's own fresh key, so the same name with the same peer
    // id is the same join, not a second node.
    let same_join = |d: &shoal_consensus::store::StateMachineData| -> Option<NodeId> {
        d.ledger
            .active_members()
            .find(|m| {
                m.spec.name == j.spec.name
                    && !j.spec.gossip_peer_id.is_empty()
                    && m.spec.gossip_peer_id == j.spec.gossip_peer_id
            })
            .map(|m| m.id)
    };
    let retried = same_join(&*ledger.read()?);
    if let Some(id) = retried {
        let cert_pem = ca
            .sign_csr_for(&j.csr_pem, &j.spec.name, id, cert_lifetime)
            .map_err(|e| WireError::new(ErrorCode::Internal, e.to_string()))?;
        return Ok(JoinResponse {
            node_id: id,
            cluster_id: cluster.cluster_id,
            region: cluster.region,
            cert_pem,
            ca_pem: cluster.ca_cert_pem,
        });
    }
    let cmd = Command::AddMember {
        spec: j.spec.clone(),
        token_hash: identity::hash_secret(&j.secret),
    };
    let id = match ledger.write_local(cmd).await?.0 {
        LedgerResponse::NodeId(id) => id,
        // An earlier attempt of this very join may have committed first.
        LedgerResponse::Rejected(m) => match same_join(&*ledger.read()?) {
            Some(id) => id,
            None => return Err(WireError::new(ErrorCode::Rejected, m)),
        },
        _ => {
            return Err(WireError::new(
                ErrorCode::Internal,
                "the ledger assigned no node id",
            ))
        }
    };
    let cert_pem = ca
        .sign_csr_for(&j.csr_pem, &j.spec.name, id, cert_lifetime)
        .map_err(|e| WireError::new(ErrorCode::Internal, e.to_string()))?;
    tracing::info!(node = id, name = %j.spec.name, addr = %j.spec.rpc_addr, "admitted a new member");
    Ok(JoinResponse {
        node_id: id,
        cluster_id: cluster.cluster_id,
        region: cluster.region,
        cert_pem,
        ca_pem: cluster.ca_cert_pem,
    })
}

/// What the leader signs node certificates with: the CA key in its data dir
/// and the configured lifetime.
#[derive(Clone, Debug)]
pub struct Signing {
    pub data_dir: std::path::PathBuf,
    pub lifetime: Duration,
}

/// Signs a fresh certificate for `member`'s new key (renewal). Only for a
/// current member, under the name the ledger knows it by.
pub fn renew(
    ledger: &LedgerClient,
    member: NodeId,
    csr_pem: &str,
    signing: &Signing,
) -> Result<String, WireError> {
    let d = ledger.read()?;
    let cluster = d.ledger.cluster.as_ref().ok_or_else(|| {
        WireError::new(
            ErrorCode::Unavailable,
            "the cluster is not bootstrapped yet",
        )
    })?;
    let name = match d.ledger.members.get(&member) {
        Some(m) if m.state != shoal_sdk::MemberState::Left => m.spec.name.clone(),
        _ => {
            return Err(WireError::new(
                ErrorCode::Forbidden,
                format!("node {member} is not a member; its certificate is not renewed"),
            ))
        }
    };
    let ca = super::ca_key::signing_ca(&signing.data_dir, &cluster.ca_cert_pem)?;
    ca.sign_csr_for(csr_pem, &name, member, signing.lifetime)
        .map_err(|e| {
            WireError::new(
                ErrorCode::Invalid,
                format!("invalid certificate request: {e}"),
            )
        })
}
