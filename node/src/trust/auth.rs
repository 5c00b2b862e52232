//! Who may do what: a joining node's admission (join token, CA pin,
//! certificate request), join and API token issue and rotation, the lookup
//! of the caller behind an API token, and when each token was last used.

use crate::clock::wall_ms;
use crate::identity;
use crate::ledger_client::client::LedgerClient;
use crate::proto::{ErrorCode, JoinRequest, JoinResponse, UserToken, WireError};
use shoal_consensus::events::{EventSpec, Severity, AUDIT};
use shoal_consensus::{Command, LedgerResponse, NodeId};
use shoal_mesh::CaBundle;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long after its admission a join may be retried (its answer lost)
/// and answered again with the same id.
const JOIN_RETRY_WINDOW_MS: u64 = 120_000;

/// How long a follower waits for an unknown API token to appear in its
/// ledger before refusing it (see [`caller_eventually`]).
const TOKEN_CATCH_UP: Duration = Duration::from_secs(2);

/// Who sent a request: the API token's public id and name and, for a
/// tenant-scoped token, its tenant. The token itself goes along with the
/// caller's writes, so the leader checks it again rather than trusting the
/// node that relays it.
#[derive(Clone, Debug)]
pub struct Caller {
    pub id: String,
    pub name: String,
    pub tenant: Option<String>,
    pub token: UserToken,
    /// The peer region whose credential this is: the request was forwarded
    /// from there (docs/federation.md) on behalf of one of its tenant
    /// tokens, for `tenant`, a tenant both regions share
    /// (the API's `federation::peer_scope` decides); `tenant` is `None` only on
    /// the region-to-region routes (summary, leave, checkpoint copies).
    pub peer_region: Option<String>,
}

impl Caller {
    /// `cmd` as this node relays it to the leader. The leader resolves the
    /// token again and scopes a tenant token's command itself; a peer
    /// region's credential is not tenant-scoped in the ledger, so a request
    /// it forwarded for a tenant is scoped here, and the ledger checks it at
    /// commit.
    pub fn relayed(&self, cmd: Command) -> Command {
        match (&self.peer_region, &self.tenant) {
            (Some(_), Some(_)) => self.scoped(cmd),
            _ => cmd,
        }
    }

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

/// The peer region whose inbound secret `caller`'s token is, if any.
pub fn peer_region(ledger: &shoal_consensus::Ledger, caller: &Caller) -> Option<String> {
    ledger
        .federation
        .peers
        .values()
        .find(|p| shoal_consensus::tokens::token_id(&p.inbound_token_hash) == caller.id)
        .map(|p| p.name.clone())
}

/// What the leader proposes for a peer region's credential (`region`):
/// a command the API narrowed to a tenant this region shares across
/// regions (`shared`; `Command::AsTenant`, which the ledger checks as that
/// tenant's), a checkpoint copy of one of the peer's jobs of such a tenant,
/// and the region's own leave. Never anything else, whatever an API node
/// sends: the ledger would take the credential's other commands as an
/// admin's. Pure.
pub fn peer_may_propose(
    region: &str,
    cmd: &Command,
    shared: impl Fn(&str) -> bool + Copy,
) -> Result<(), String> {
    match cmd {
        Command::AsTenant { tenant, .. } if shared(tenant) => Ok(()),
        Command::RecordForeignCheckpoint { origin, spec, .. }
            if origin == region && shared(&spec.tenant) =>
        {
            Ok(())
        }
        Command::RemovePeerRegion { name } if name == region => Ok(()),
        Command::Once { cmd, .. } => peer_may_propose(region, cmd, shared),
        _ => Err(format!(
            "permission denied: region {region}'s credential proposes only commands narrowed to a \
             tenant both regions share, copies of its own jobs' checkpoints and its own leave"
        )),
    }
}

/// Why an API token was not accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenError {
    /// The ledger does not know it: never issued, revoked, or not applied
    /// on this node yet.
    Unknown,
    /// Known but no longer good (expired); the message says so.
    Refused(String),
}

/// Who holds `token`, judged against this node's ledger and wall clock.
pub fn resolve(ledger: &LedgerClient, token: &str) -> Result<Caller, TokenError> {
    let hash = identity::hash_secret(token);
    let d = ledger.read().map_err(|e| TokenError::Refused(e.message))?;
    if !d.ledger.api_tokens.contains_key(&hash) {
        return Err(TokenError::Unknown);
    }
    d.ledger
        .api_token_valid(&hash, wall_ms())
        .map(|t| Caller {
            id: t.id.clone(),
            name: t.name.clone(),
            tenant: t.tenant.clone(),
            token: UserToken(token.to_string()),
            peer_region: None,
        })
        .map_err(TokenError::Refused)
}

/// Who holds `token`: `None` when the ledger does not know its hash or
/// the token has expired.
pub fn caller(ledger: &LedgerClient, token: &str) -> Option<Caller> {
    resolve(ledger, token).ok()
}

/// [`resolve`], allowing for this node's ledger to lag: a token created a
/// moment ago through another node may not be applied here yet, so a
/// follower looks an unknown token up again as it catches up, for up to
/// `TOKEN_CATCH_UP`. The leader's ledger is current. (A token revoked a
/// moment ago through another node is, by the same lag, still accepted
/// here for reads until this node applies the revocation; the leader
/// refuses its writes at once.)
pub async fn caller_eventually(ledger: &LedgerClient, token: &str) -> Result<Caller, TokenError> {
    let deadline = Instant::now() + TOKEN_CATCH_UP;
    loop {
        match resolve(ledger, token) {
            Err(TokenError::Unknown) => {}
            other => return other,
        }
        let leader = ledger.current_leader() == Some(ledger.me());
        if leader || Instant::now() >= deadline {
            return Err(TokenError::Unknown);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How often, at most, this node tells the ledger that it saw an API token
/// used (`Command::TouchApiToken`): `shoal token api ls` is right to within
/// this, and requests never wait for, or turn into, a write per request.
pub const TOKEN_USE_REPORT_MS: u64 = 60_000;

/// When this node last saw each API token used (by id), and when it last
/// reported that to the ledger. In memory only; lost on restart.
#[derive(Default)]
pub struct TokenUse {
    seen: Mutex<HashMap<String, (u64, u64)>>,
}

impl TokenUse {
    /// Notes a use of token `id` at `now_ms`; true when this use should be
    /// reported to the ledger (the first one, then one a minute at most).
    pub fn note(&self, id: &str, now_ms: u64) -> bool {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        // Only tokens the ledger knows get here, so this is a backstop.
        if seen.len() > 2 * shoal_consensus::tokens::MAX_TOKENS {
            seen.clear();
        }
        let entry = seen.entry(id.to_string()).or_insert((now_ms, 0));
        entry.0 = entry.0.max(now_ms);
        let report = entry.1 == 0 || now_ms.saturating_sub(entry.1) >= TOKEN_USE_REPORT_MS;
        if report {
            entry.1 = now_ms.max(1);
        }
        report
    }

    /// When this node last saw token `id` used.
    pub fn last_seen(&self, id: &str) -> Option<u64> {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.get(id).map(|(last, _)| *last)
    }
}

/// A new API token, admin or scoped to `tenant`, that expires after `ttl`
/// when given; only its hash is kept. Returns the token, its public id,
/// when it expires and the ledger's answer.
pub async fn create_api_token(
    ledger: &LedgerClient,
    by: &Caller,
    name: String,
    tenant: Option<String>,
    ttl: Option<Duration>,
) -> Result<(String, String, Option<u64>, LedgerResponse), WireError> {
    let (token, hash) = identity::new_api_token();
    let id = shoal_consensus::tokens::token_id(&hash);
    let expires_at_ms = ttl.map(|t| wall_ms().saturating_add(t.as_millis() as u64));
    let (resp, _) = ledger
        .write_as(
            &by.token,
            Command::CreateApiToken {
                hash,
                name,
                tenant,
                expires_at_ms,
            },
        )
        .await?;
    Ok((token, id, expires_at_ms, resp))
}

/// Gives the API token `name` a new secret; the old one stops working when
/// this commits. Returns the new token, its public id and the ledger's answer.
pub async fn rotate_api_token(
    ledger: &LedgerClient,
    by: &Caller,
    name: &str,
) -> Result<(String, String, LedgerResponse), WireError> {
    let (token, hash) = identity::new_api_token();
    let id = shoal_consensus::tokens::token_id(&hash);
    let (resp, _) = ledger
        .write_as(
            &by.token,
            Command::RotateApiToken {
                name: name.to_string(),
                hash,
            },
        )
        .await?;
    Ok((token, id, resp))
}

/// A join token as issued: the secret (shown once), its public id and when
/// it expires (ms since the epoch).
pub struct IssuedJoinToken {
    pub token: String,
    pub id: String,
    pub expires_at_ms: u64,
}

/// A new join token for `uses` joins within `ttl`, pinned to the cluster's
/// CA; with `voter`, the nodes it admits may become voters.
pub async fn create_join_token(
    ledger: &LedgerClient,
    by: &Caller,
    ttl: Duration,
    uses: u32,
    voter: bool,
) -> Result<IssuedJoinToken, WireError> {
    let pin = {
        let d = ledger.read()?;
        let spoken = d.ledger.effective_protocol();
        let since = shoal_consensus::voters::SINCE_PROTOCOL;
        if voter && spoken.is_some_and(|p| p < since) {
            return Err(WireError::new(
                ErrorCode::Rejected,
                format!(
                    "voter join tokens need every member at protocol {since} or newer (this \
                     cluster speaks {}): upgrade every node first",
                    spoken.unwrap_or_default()
                ),
            ));
        }
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
    let id = shoal_consensus::tokens::token_id(&hash);
    let expires_at_ms = wall_ms().saturating_add(ttl.as_millis() as u64);
    let cmd = if voter {
        Command::CreateVoterJoinToken {
            hash,
            expires_at_ms,
            uses,
        }
    } else {
        Command::CreateJoinToken {
            hash,
            expires_at_ms,
            uses,
        }
    };
    let (resp, _) = ledger.write_as(&by.token, cmd).await?;
    match resp {
        LedgerResponse::Denied(m) => Err(WireError::new(ErrorCode::Forbidden, m)),
        LedgerResponse::Rejected(m) => Err(WireError::new(ErrorCode::Rejected, m)),
        _ => Ok(IssuedJoinToken {
            token,
            id,
            expires_at_ms,
        }),
    }
}

/// Refused joins are audit records, but anyone who reaches the RPC port can
/// ask to join: at most this many are recorded a minute (per process), so
/// garbage cannot become a stream of Raft writes. The rest are only logged.
const REFUSED_JOIN_AUDITS_PER_MINUTE: u32 = 30;

static REFUSED_JOIN_AUDITS: Mutex<(Option<Instant>, u32)> = Mutex::new((None, 0));

/// Records a refused join as an audit event (on the leader, which admits),
/// naming the joiner and the token's public id, never its secret; returns
/// the joiner's error.
fn refuse_join(ledger: &LedgerClient, j: &JoinRequest, reason: String) -> WireError {
    let name: String = j
        .spec
        .name
        .chars()
        .take(shoal_consensus::ledger::MAX_NAME)
        .collect();
    let message = format!("refused the join of node {name:?}: {reason}");
    tracing::warn!("{message}");
    let record = {
        let mut window = REFUSED_JOIN_AUDITS
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if window
            .0
            .is_none_or(|start| now.duration_since(start) >= Duration::from_secs(60))
        {
            *window = (Some(now), 0);
        }
        window.1 += 1;
        window.1 <= REFUSED_JOIN_AUDITS_PER_MINUTE
    };
    if record {
        let spec = EventSpec {
            severity: Severity::Warning,
            kind: AUDIT.into(),
            node: Some(ledger.me()),
            gpu: None,
            job: None,
            resource: None,
            message,
        };
        let ledger = ledger.clone();
        tokio::spawn(async move {
            if let Err(e) = ledger.write(Command::RecordEvent(spec)).await {
                tracing::warn!(error = %e.message, "could not record a refused join");
            }
        });
    }
    WireError::new(ErrorCode::Forbidden, reason)
}

/// Admits a joining node: checks its token and CA pin, records it in the
/// ledger (which assigns its id) and signs its certificate. The leader's
/// housekeeping loop then adds it to Raft as a learner and decides
/// whether it votes: one place changes Raft membership, so joins never
/// race with voter changes.
///
/// A join token is spent in `apply`, where two joins racing for its last
/// use are ordered: the loser's `AddMember` is refused and so is its join.
/// A join retried after its answer was lost is answered again with the
/// same id, even once that join spent the token's last use.
pub async fn admit(
    ledger: &LedgerClient,
    j: JoinRequest,
    signing: &Signing,
) -> Result<JoinResponse, WireError> {
    let token_hash = identity::hash_secret(&j.secret);
    let cluster = ledger.read()?.ledger.cluster.clone();
    let cluster = cluster.ok_or_else(|| {
        WireError::new(
            ErrorCode::Unavailable,
            "the cluster is not bootstrapped yet",
        )
    })?;
    // A token pins the CA that signed when it was made: during a CA
    // rotation either trusted CA; the answer names the pinned one first,
    // which is what the joiner checks, and the others after it.
    let trusted = ledger.read()?.ledger.trusted_ca_pems();
    let Some(pinned) = trusted.iter().position(|c| {
        shoal_mesh::tls::fingerprint_pem(c).is_some_and(|f| f.eq_ignore_ascii_case(&j.ca_pin))
    }) else {
        return Err(refuse_join(
            ledger,
            &j,
            "the join token was issued by another cluster (CA pin mismatch)".into(),
        ));
    };
    let ca_pem = {
        let d = ledger.read()?;
        let mut pems = vec![trusted[pinned].clone()];
        pems.extend(split_bundle(&d.ledger.ca_bundle_pem(), &trusted[pinned]));
        shoal_consensus::ca::join_pems(&pems)
    };
    // A join whose answer was lost (a leader change, a timeout) is retried
    // by the joiner or by the forwarding node; the gossip peer id comes
    // from the joiner's own fresh key, so the same name with the same peer
    // id is the same join, not a second node, when it presents the token
    // that admitted it.
    let same_join = |d: &shoal_consensus::store::StateMachineData| -> Option<NodeId> {
        d.ledger
            .active_members()
            .find(|m| {
                m.spec.name == j.spec.name
                    && !j.spec.gossip_peer_id.is_empty()
                    && m.spec.gossip_peer_id == j.spec.gossip_peer_id
                    // A retry comes soon after the join it repeats; later, a
                    // spent token and public facts must not buy a certificate.
                    && m.joined_at_ms.saturating_add(JOIN_RETRY_WINDOW_MS) >= wall_ms()
            })
            .map(|m| m.id)
            .filter(|id| d.ledger.join_token_admitted(&token_hash, *id))
    };
    let (retried, token_check) = {
        let d = ledger.read()?;
        (
            same_join(&d),
            d.ledger.join_token_valid(&token_hash, wall_ms()),
        )
    };
    if retried.is_none() {
        if let Err(reason) = token_check {
            return Err(refuse_join(ledger, &j, reason));
        }
    }
    let ca = crate::trust::ca_key::signing_ca(&signing.data_dir, &cluster.ca_cert_pem)?;
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
    if let Some(id) = retried {
        let cert_pem = ca
            .sign_csr_for(&j.csr_pem, &j.spec.name, id, cert_lifetime)
            .map_err(|e| WireError::new(ErrorCode::Internal, e.to_string()))?;
        return Ok(JoinResponse {
            node_id: id,
            cluster_id: cluster.cluster_id,
            region: cluster.region,
            cert_pem,
            ca_pem,
        });
    }
    let cmd = Command::AddMember {
        spec: j.spec.clone(),
        token_hash: token_hash.clone(),
    };
    let id = match ledger.write_local(cmd).await?.0 {
        LedgerResponse::NodeId(id) => id,
        // An earlier attempt of this very join may have committed first;
        // else another join took the token's last use (or it was revoked
        // meanwhile), or the ledger refused the node itself.
        LedgerResponse::Rejected(m) => {
            let (retried, token_check) = {
                let d = ledger.read()?;
                (
                    same_join(&d),
                    d.ledger.join_token_valid(&token_hash, wall_ms()),
                )
            };
            match (retried, token_check) {
                (Some(id), _) => id,
                (None, Err(_)) => return Err(refuse_join(ledger, &j, m)),
                (None, Ok(())) => return Err(WireError::new(ErrorCode::Rejected, m)),
            }
        }
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
        ca_pem,
    })
}

/// The certificates of a PEM bundle other than `but`.
fn split_bundle(bundle: &str, but: &str) -> Vec<String> {
    shoal_mesh::tls::split_certs(bundle)
        .into_iter()
        .filter(|c| c.trim() != but.trim())
        .collect()
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
    let ca = crate::trust::ca_key::signing_ca(&signing.data_dir, &cluster.ca_cert_pem)?;
    ca.sign_csr_for(csr_pem, &name, member, signing.lifetime)
        .map_err(|e| {
            WireError::new(
                ErrorCode::Invalid,
                format!("invalid certificate request: {e}"),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::peer_may_propose;
    use shoal_consensus::Command;

    #[test]
    fn a_peer_regions_credential_proposes_only_narrowed_commands_its_copies_and_its_leave() {
        let narrowed = Command::AsTenant {
            tenant: "lab".into(),
            cmd: Box::new(Command::CancelJob { job: 1 }),
        };
        let shared = |tenant: &str| tenant == "lab";
        assert!(peer_may_propose("eu-1", &narrowed, shared).is_ok());
        let once = Command::Once {
            id: shoal_consensus::once::WriteId {
                origin: 1,
                nonce: 2,
            },
            cmd: Box::new(narrowed),
        };
        assert!(peer_may_propose("eu-1", &once, shared).is_ok());
        let own_leave = Command::RemovePeerRegion {
            name: "eu-1".into(),
        };
        assert!(peer_may_propose("eu-1", &own_leave, shared).is_ok());
        for cmd in [
            // Un-narrowed: the ledger would take them as an admin's.
            Command::CancelJob { job: 1 },
            Command::RemovePeerRegion {
                name: "ap-1".into(),
            },
            Command::CreateTenant {
                name: "x".into(),
                limits: Default::default(),
            },
            Command::Once {
                id: shoal_consensus::once::WriteId {
                    origin: 1,
                    nonce: 3,
                },
                cmd: Box::new(Command::CancelJob { job: 1 }),
            },
            // Narrowed, but to a tenant local to this region.
            Command::AsTenant {
                tenant: "vision".into(),
                cmd: Box::new(Command::CancelJob { job: 1 }),
            },
        ] {
            let refused = peer_may_propose("eu-1", &cmd, shared);
            assert!(
                refused
                    .as_ref()
                    .is_err_and(|e| e.contains("proposes only commands narrowed")),
                "{cmd:?}: {refused:?}"
            );
        }
    }
}
