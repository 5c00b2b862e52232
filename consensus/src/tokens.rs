//! Join and API tokens in the ledger: public ids, lifetimes, uses and
//! revocation. The ledger never holds a secret, only its BLAKE3 hash; a
//! token's public id is the first [`ID_LEN`] hex digits of that hash, which
//! tells nothing about the secret.
//!
//! Pure like the rest of `apply`: expiry is judged against the ledger clock
//! (the leader's stamp of the entry), so every replica decides alike. The
//! node judges the same rules with its wall clock to refuse early, in the
//! same words (`Ledger::join_token_valid`, `Ledger::api_token_valid`);
//! `apply` has the last word, so two joins racing for a token's last use
//! cannot both win.
//!
//! Growth is bounded: tokens are only added by `Create*`, which first drops
//! every token that expired more than [`RETAIN_AFTER_EXPIRY_MS`] ago, and
//! refuses beyond [`MAX_TOKENS`] of a kind.

use serde::{Deserialize, Serialize};

use crate::ids::NodeId;

/// Hex digits of a token's hash that make its public id.
pub const ID_LEN: usize = 12;
/// Most joins one join token may admit.
pub const MAX_JOIN_USES: u32 = 1000;
/// Tokens of one kind (join, API) the ledger holds at most.
pub const MAX_TOKENS: usize = 10_000;
/// How long a token that expired stays in the ledger, so that a late join
/// or request is told "expired" rather than "unknown"; then it is dropped.
pub const RETAIN_AFTER_EXPIRY_MS: u64 = 24 * 3600 * 1000;

/// The hash the ledger keeps of a secret: BLAKE3, in hex.
pub fn hash_secret(secret: &str) -> String {
    blake3::hash(secret.as_bytes()).to_hex().to_string()
}

/// The public id of the token whose secret hashes to `hash`.
pub fn token_id(hash: &str) -> String {
    hash.chars().take(ID_LEN).collect()
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct JoinToken {
    pub id: String,
    pub created_at_ms: u64,
    pub expires_at_ms: u64,
    pub max_uses: u32,
    pub uses_left: u32,
    pub revoked: bool,
    /// The members it admitted: a join whose answer was lost is answered
    /// again even after the token's last use.
    pub admitted: Vec<NodeId>,
}

/// Where a token stands, as `shoal token ls` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenState {
    Active,
    Spent,
    Expired,
    Revoked,
}

impl TokenState {
    pub fn as_str(self) -> &'static str {
        match self {
            TokenState::Active => "active",
            TokenState::Spent => "spent",
            TokenState::Expired => "expired",
            TokenState::Revoked => "revoked",
        }
    }
}

impl JoinToken {
    /// Revoked before spent before expired: the most telling reason wins.
    pub fn state(&self, now_ms: u64) -> TokenState {
        if self.revoked {
            TokenState::Revoked
        } else if self.uses_left == 0 {
            TokenState::Spent
        } else if self.expires_at_ms <= now_ms {
            TokenState::Expired
        } else {
            TokenState::Active
        }
    }

    /// Why a join with this token is refused at `now_ms`, if it is.
    pub fn refusal(&self, now_ms: u64) -> Option<String> {
        let id = &self.id;
        match self.state(now_ms) {
            TokenState::Active => None,
            TokenState::Revoked => Some(format!("the join token {id} was revoked")),
            TokenState::Spent => Some(format!(
                "the join token {id} has been used up ({} of {} uses)",
                self.max_uses, self.max_uses
            )),
            TokenState::Expired => Some(format!("the join token {id} has expired")),
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ApiToken {
    pub id: String,
    pub name: String,
    pub created_at_ms: u64,
    /// `None`: an admin token. `Some(t)`: acts only for tenant `t` and the
    /// tenants below it (see the ledger's `access` guard).
    pub tenant: Option<String>,
    /// `None`: until revoked.
    pub expires_at_ms: Option<u64>,
    /// When a member last reported the token used. Members report at most
    /// once a minute per token (`Command::TouchApiToken`), so this lags the
    /// truth by up to a minute; no request writes to the ledger for it.
    pub last_used_ms: Option<u64>,
}

impl ApiToken {
    pub fn new(
        hash: &str,
        name: String,
        tenant: Option<String>,
        expires_at_ms: Option<u64>,
        now_ms: u64,
    ) -> Self {
        ApiToken {
            id: token_id(hash),
            name,
            created_at_ms: now_ms,
            tenant,
            expires_at_ms,
            last_used_ms: None,
        }
    }

    pub fn expired(&self, now_ms: u64) -> bool {
        self.expires_at_ms.is_some_and(|e| e <= now_ms)
    }

    pub fn state(&self, now_ms: u64) -> TokenState {
        if self.expired(now_ms) {
            TokenState::Expired
        } else {
            TokenState::Active
        }
    }
}
