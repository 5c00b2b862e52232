//! Token transitions: creating, using and revoking join and API tokens
//! ([`crate::tokens`] holds the records and their rules).

use super::Ledger;
use crate::ids::{NodeId, MAX_NAME};
use crate::tokens::*;

impl Ledger {
    /// Whether a join with the token whose secret hashes to `hash` may be
    /// admitted at `now_ms`; otherwise why not, in one line for the joiner.
    pub fn join_token_valid(&self, hash: &str, now_ms: u64) -> Result<(), String> {
        match self.join_tokens.get(hash) {
            None => Err("unknown join token".into()),
            Some(t) => t.refusal(now_ms).map_or(Ok(()), Err),
        }
    }

    /// Whether member `node` was admitted with this join token, which has
    /// not been revoked since: a retried join is answered again on that.
    pub fn join_token_admitted(&self, hash: &str, node: NodeId) -> bool {
        self.join_tokens
            .get(hash)
            .is_some_and(|t| !t.revoked && t.admitted.contains(&node))
    }

    /// The API token whose hash is `hash`, if it may be used at `now_ms`;
    /// otherwise why not. A revoked token is gone: it is unknown.
    pub fn api_token_valid(&self, hash: &str, now_ms: u64) -> Result<&ApiToken, String> {
        match self.api_tokens.get(hash) {
            None => Err("unknown API token".into()),
            Some(t) if t.expired(now_ms) => Err(format!("the API token '{}' has expired", t.name)),
            Some(t) => Ok(t),
        }
    }

    /// The API token with public id or name `key`, and its hash.
    pub fn api_token_by_id_or_name(&self, key: &str) -> Option<(&String, &ApiToken)> {
        self.api_tokens
            .iter()
            .find(|(_, t)| t.id == key)
            .or_else(|| self.api_tokens.iter().find(|(_, t)| t.name == key))
    }

    /// Drops tokens that expired more than [`RETAIN_AFTER_EXPIRY_MS`] ago.
    fn prune_tokens(&mut self, now: u64) {
        let keep = |expires: u64| expires.saturating_add(RETAIN_AFTER_EXPIRY_MS) > now;
        self.join_tokens.retain(|_, t| keep(t.expires_at_ms));
        let tokens = &self.join_tokens;
        self.voter_eligibility
            .voter_tokens
            .retain(|hash| tokens.contains_key(hash));
        self.api_tokens
            .retain(|_, t| t.expires_at_ms.is_none_or(keep));
    }

    fn token_id_taken(&self, id: &str) -> bool {
        self.join_tokens.values().any(|t| t.id == id)
            || self.api_tokens.values().any(|t| t.id == id)
    }

    pub(crate) fn create_join_token(
        &mut self,
        hash: &str,
        expires_at_ms: u64,
        uses: u32,
        now: u64,
    ) -> Result<(), String> {
        if uses == 0 || uses > MAX_JOIN_USES {
            return Err(format!(
                "a join token admits 1-{MAX_JOIN_USES} nodes, not {uses}"
            ));
        }
        if expires_at_ms <= now {
            return Err("the join token would expire before it is created".into());
        }
        self.prune_tokens(now);
        if self.join_tokens.len() >= MAX_TOKENS {
            return Err(format!(
                "the cluster holds {MAX_TOKENS} join tokens already: revoke unused ones or let them expire"
            ));
        }
        let id = token_id(hash);
        if hash.is_empty() || self.join_tokens.contains_key(hash) || self.token_id_taken(&id) {
            return Err(format!("a token with id {id} exists already"));
        }
        self.join_tokens.insert(
            hash.to_string(),
            JoinToken {
                id,
                created_at_ms: now,
                expires_at_ms,
                max_uses: uses,
                uses_left: uses,
                revoked: false,
                admitted: Vec::new(),
            },
        );
        Ok(())
    }

    /// Spends one use of the token on member `node` (already checked valid).
    pub(crate) fn consume_join_token(&mut self, hash: &str, node: NodeId) {
        if let Some(t) = self.join_tokens.get_mut(hash) {
            t.uses_left = t.uses_left.saturating_sub(1);
            t.admitted.push(node);
        }
    }

    pub(crate) fn revoke_join_token(&mut self, id: &str) -> Result<(), String> {
        match self.join_tokens.values_mut().find(|t| t.id == id) {
            Some(t) => {
                t.revoked = true;
                Ok(())
            }
            None => Err(format!("no join token with id '{id}'")),
        }
    }

    pub(crate) fn create_api_token(
        &mut self,
        hash: &str,
        name: &str,
        tenant: &Option<String>,
        expires_at_ms: Option<u64>,
        now: u64,
    ) -> Result<(), String> {
        if name.is_empty() || name.len() > MAX_NAME {
            return Err(format!("token names are 1-{MAX_NAME} characters"));
        }
        if let Some(t) = tenant {
            if !self.workload.tenants.contains_key(t) {
                return Err(format!("no tenant named '{t}'"));
            }
        }
        if expires_at_ms.is_some_and(|e| e <= now) {
            return Err("the API token would expire before it is created".into());
        }
        self.prune_tokens(now);
        if self.api_tokens.len() >= MAX_TOKENS {
            return Err(format!(
                "the cluster holds {MAX_TOKENS} API tokens already: revoke unused ones"
            ));
        }
        if self.api_tokens.values().any(|t| t.name == name) {
            return Err(format!("an API token named '{name}' already exists"));
        }
        let id = token_id(hash);
        if hash.is_empty() || self.api_tokens.contains_key(hash) || self.token_id_taken(&id) {
            return Err(format!("a token with id {id} exists already"));
        }
        self.api_tokens.insert(
            hash.to_string(),
            ApiToken::new(hash, name.to_string(), tenant.clone(), expires_at_ms, now),
        );
        Ok(())
    }

    /// Removes the API token `key` (id or name). The last admin token that
    /// has not expired stays: without one nobody could administer the
    /// cluster again.
    pub(crate) fn revoke_api_token(&mut self, key: &str, now: u64) -> Result<(), String> {
        let (hash, token) = match self.api_token_by_id_or_name(key) {
            Some((h, t)) => (h.clone(), t.clone()),
            None => return Err(format!("no API token with id or name '{key}'")),
        };
        let other_admin = self
            .api_tokens
            .iter()
            .any(|(h, t)| *h != hash && t.tenant.is_none() && !t.expired(now));
        if token.tenant.is_none() && !token.expired(now) && !other_admin {
            return Err(format!(
                "'{}' is the last admin token: create another (shoal token api) before revoking it, or rotate it (shoal token api rotate-admin)",
                token.name
            ));
        }
        self.api_tokens.remove(&hash);
        Ok(())
    }

    /// Gives the API token `name` the secret whose hash is `hash`: the old
    /// secret stops working in the same entry. Name, tenant and expiry stay.
    pub(crate) fn rotate_api_token(
        &mut self,
        name: &str,
        hash: &str,
        now: u64,
    ) -> Result<(), String> {
        let old = match self.api_tokens.iter().find(|(_, t)| t.name == name) {
            Some((h, t)) if !t.expired(now) => h.clone(),
            Some(_) => return Err(format!("the API token '{name}' has expired")),
            None => return Err(format!("no API token named '{name}'")),
        };
        let id = token_id(hash);
        if hash.is_empty() || self.api_tokens.contains_key(hash) || self.token_id_taken(&id) {
            return Err(format!("a token with id {id} exists already"));
        }
        let Some(mut token) = self.api_tokens.remove(&old) else {
            return Err(format!("no API token named '{name}'"));
        };
        token.id = id;
        token.created_at_ms = now;
        token.last_used_ms = None;
        self.api_tokens.insert(hash.to_string(), token);
        Ok(())
    }

    /// A member saw the token `id` used now.
    pub(crate) fn touch_api_token(&mut self, id: &str, now: u64) -> Result<(), String> {
        match self.api_tokens.values_mut().find(|t| t.id == id) {
            Some(t) => {
                t.last_used_ms = Some(t.last_used_ms.unwrap_or(0).max(now));
                Ok(())
            }
            None => Err(format!("no API token with id '{id}'")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::AUDIT;
    use crate::ledger::{Command, LedgerRequest, LedgerResponse, MemberSpec};
    use std::collections::BTreeMap;

    fn spec(name: &str) -> MemberSpec {
        MemberSpec {
            name: name.into(),
            rpc_addr: "127.0.0.1:7071".into(),
            api_addr: "127.0.0.1:7070".into(),
            labels: BTreeMap::new(),
            ..MemberSpec::default()
        }
    }

    /// A bootstrapped ledger driven like a replica, with its own clock.
    struct R {
        l: Ledger,
        now: u64,
    }

    impl R {
        fn new() -> Self {
            let mut r = R {
                l: Ledger::new(),
                now: 1_000,
            };
            let boot = r.at(
                1_000,
                Command::Bootstrap {
                    cluster_id: "c".into(),
                    region: "r".into(),
                    ca_cert_pem: String::new(),
                    admin_token_hash: "adminhash0000000".into(),
                    first_member: 1,
                    spec: spec("n1"),
                },
            );
            assert_eq!(boot, LedgerResponse::NodeId(1));
            r
        }

        fn at(&mut self, now: u64, cmd: Command) -> LedgerResponse {
            self.now = now;
            self.l.apply(1, &LedgerRequest { now_ms: now, cmd })
        }

        fn join(&mut self, now: u64, name: &str, hash: &str) -> LedgerResponse {
            self.at(
                now,
                Command::AddMember {
                    spec: spec(name),
                    token_hash: hash.into(),
                },
            )
        }

        fn join_token(&mut self, now: u64, hash: &str, expires: u64, uses: u32) -> LedgerResponse {
            self.at(
                now,
                Command::CreateJoinToken {
                    hash: hash.into(),
                    expires_at_ms: expires,
                    uses,
                },
            )
        }

        fn api_token(
            &mut self,
            now: u64,
            hash: &str,
            name: &str,
            expires: Option<u64>,
        ) -> LedgerResponse {
            self.at(
                now,
                Command::CreateApiToken {
                    hash: hash.into(),
                    name: name.into(),
                    tenant: None,
                    expires_at_ms: expires,
                },
            )
        }
    }

    fn rejected(r: &LedgerResponse) -> String {
        match r {
            LedgerResponse::Rejected(m) => m.clone(),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    /// Audit finding 1: a rank that found a join token joined as a voter
    /// and was handed the CA key. Only a token the operator created for
    /// voters admits nodes that may vote.
    #[test]
    fn only_a_voter_token_admits_nodes_that_may_vote() {
        let mut r = R::new();
        assert!(r.l.voter_eligibility.eligible(1), "the first member votes");
        assert_eq!(
            r.join_token(2_000, "ordinaryXXXXXXXX", 100_000, 8),
            LedgerResponse::Ok
        );
        let voter = Command::CreateVoterJoinToken {
            hash: "voterXXXXXXXXXXX".into(),
            expires_at_ms: 100_000,
            uses: 1,
        };
        assert_eq!(r.at(2_000, voter), LedgerResponse::Ok);
        assert_eq!(
            r.join(2_100, "n2", "ordinaryXXXXXXXX"),
            LedgerResponse::NodeId(2)
        );
        assert_eq!(
            r.join(2_200, "n3", "voterXXXXXXXXXXX"),
            LedgerResponse::NodeId(3)
        );
        assert!(!r.l.voter_eligibility.eligible(2));
        assert!(r.l.voter_eligibility.eligible(3));
        // The member's own update cannot change it.
        let update = Command::UpdateMember {
            id: 2,
            spec: spec("n2"),
        };
        assert_eq!(r.at(2_300, update), LedgerResponse::Ok);
        assert!(!r.l.voter_eligibility.eligible(2));
        // The record outlives the tokens.
        r.join_token(
            100_000 + RETAIN_AFTER_EXPIRY_MS + 1,
            "laterXXXXXXXXXXX",
            u64::MAX,
            1,
        );
        assert!(r.l.voter_eligibility.voter_tokens.is_empty());
        assert!(!r.l.voter_eligibility.eligible(2));
        assert!(r.l.voter_eligibility.eligible(3));
    }

    #[test]
    fn a_join_token_admits_as_many_nodes_as_it_has_uses() {
        let mut r = R::new();
        assert_eq!(
            r.join_token(2_000, "aaaaaaaaaaaaXXXX", 100_000, 2),
            LedgerResponse::Ok
        );
        let id = token_id("aaaaaaaaaaaaXXXX");
        assert_eq!(id, "aaaaaaaaaaaa");
        assert_eq!(
            r.join(2_100, "n2", "aaaaaaaaaaaaXXXX"),
            LedgerResponse::NodeId(2)
        );
        // A refused join (a taken name) spends nothing.
        rejected(&r.join(2_150, "n2", "aaaaaaaaaaaaXXXX"));
        assert_eq!(r.l.join_tokens["aaaaaaaaaaaaXXXX"].uses_left, 1);
        assert_eq!(
            r.join(2_200, "n3", "aaaaaaaaaaaaXXXX"),
            LedgerResponse::NodeId(3)
        );
        let t = &r.l.join_tokens["aaaaaaaaaaaaXXXX"];
        assert_eq!((t.uses_left, t.max_uses), (0, 2));
        assert_eq!(t.admitted, vec![2, 3]);
        assert_eq!(t.state(2_300), TokenState::Spent);
        assert_eq!(
            rejected(&r.join(2_300, "n4", "aaaaaaaaaaaaXXXX")),
            "the join token aaaaaaaaaaaa has been used up (2 of 2 uses)"
        );
        assert_eq!(
            r.l.join_token_valid("aaaaaaaaaaaaXXXX", 2_300),
            Err("the join token aaaaaaaaaaaa has been used up (2 of 2 uses)".into())
        );
        assert!(r.l.join_token_admitted("aaaaaaaaaaaaXXXX", 3));
        assert!(!r.l.join_token_admitted("aaaaaaaaaaaaXXXX", 4));
    }

    #[test]
    fn a_single_use_token_lets_one_of_two_racing_joins_in() {
        let mut r = R::new();
        r.join_token(2_000, "bbbbbbbbbbbbXXXX", 100_000, 1);
        // Both joins passed the leader's early check; apply decides.
        let first = r.join(2_100, "n2", "bbbbbbbbbbbbXXXX");
        let second = r.join(2_100, "n3", "bbbbbbbbbbbbXXXX");
        assert_eq!(first, LedgerResponse::NodeId(2));
        assert!(rejected(&second).contains("used up (1 of 1 uses)"));
        assert_eq!(r.l.active_members().count(), 2);
    }

    #[test]
    fn expired_revoked_and_unknown_join_tokens_are_refused_in_words() {
        let mut r = R::new();
        r.join_token(2_000, "ccccccccccccXXXX", 5_000, 3);
        r.join_token(2_000, "ddddddddddddXXXX", 50_000, 3);
        assert_eq!(
            rejected(&r.join(5_000, "n2", "ccccccccccccXXXX")),
            "the join token cccccccccccc has expired"
        );
        assert_eq!(rejected(&r.join(5_000, "n2", "nope")), "unknown join token");
        assert_eq!(
            r.at(
                5_100,
                Command::RevokeJoinToken {
                    id: "dddddddddddd".into()
                }
            ),
            LedgerResponse::Ok
        );
        assert_eq!(
            rejected(&r.join(5_200, "n2", "ddddddddddddXXXX")),
            "the join token dddddddddddd was revoked"
        );
        assert_eq!(
            r.l.join_tokens["ddddddddddddXXXX"].state(5_200),
            TokenState::Revoked
        );
        assert_eq!(
            rejected(&r.at(5_300, Command::RevokeJoinToken { id: "zzz".into() })),
            "no join token with id 'zzz'"
        );
        assert_eq!(r.l.active_members().count(), 1);
        // No audit record from apply: the leader records refused joins.
        assert!(r.l.events.after(0).all(|e| e.spec.kind != AUDIT));
    }

    #[test]
    fn join_tokens_are_bounded_in_uses_and_lifetime() {
        let mut r = R::new();
        assert!(rejected(&r.join_token(2_000, "eeeeeeeeeeee0", 9_000, 0)).contains("1-1000"));
        assert!(
            rejected(&r.join_token(2_000, "eeeeeeeeeeee0", 9_000, MAX_JOIN_USES + 1))
                .contains("1-1000")
        );
        assert!(rejected(&r.join_token(2_000, "eeeeeeeeeeee0", 2_000, 1)).contains("expire"));
        assert_eq!(
            r.join_token(2_000, "eeeeeeeeeeee0", 9_000, 1),
            LedgerResponse::Ok
        );
        // The same id twice is refused, whatever the rest of the hash.
        assert!(rejected(&r.join_token(2_000, "eeeeeeeeeeee1", 9_000, 1)).contains("exists"));
    }

    #[test]
    fn expired_tokens_are_pruned_a_day_after_they_expire() {
        let mut r = R::new();
        r.join_token(2_000, "ffffffffffffXXXX", 10_000, 1);
        r.api_token(2_000, "999999999999XXXX", "ci", Some(10_000));
        r.api_token(2_000, "888888888888XXXX", "forever", None);
        // Within the retention: still there, refused as expired.
        r.join_token(
            10_000 + RETAIN_AFTER_EXPIRY_MS - 1,
            "111111111111XXXX",
            u64::MAX,
            1,
        );
        assert!(r.l.join_tokens.contains_key("ffffffffffffXXXX"));
        assert!(r.l.api_tokens.contains_key("999999999999XXXX"));
        // After it: gone, and a new token's creation did the pruning.
        r.join_token(
            10_000 + RETAIN_AFTER_EXPIRY_MS,
            "222222222222XXXX",
            u64::MAX,
            1,
        );
        assert!(!r.l.join_tokens.contains_key("ffffffffffffXXXX"));
        assert!(!r.l.api_tokens.contains_key("999999999999XXXX"));
        assert!(r.l.api_tokens.contains_key("888888888888XXXX"));
        assert!(r.l.api_tokens.contains_key("adminhash0000000"));
        assert_eq!(r.l.join_tokens.len(), 2);
    }

    #[test]
    fn api_tokens_expire_and_are_revoked_by_id_or_name() {
        let mut r = R::new();
        assert_eq!(
            r.api_token(2_000, "777777777777XXXX", "ci", Some(5_000)),
            LedgerResponse::Ok
        );
        assert_eq!(
            r.api_token(2_000, "666666666666XXXX", "ops", None),
            LedgerResponse::Ok
        );
        let t =
            r.l.api_token_valid("777777777777XXXX", 4_999)
                .expect("valid");
        assert_eq!((t.name.as_str(), t.id.as_str()), ("ci", "777777777777"));
        assert_eq!(
            r.l.api_token_valid("777777777777XXXX", 5_000).err(),
            Some("the API token 'ci' has expired".into())
        );
        assert_eq!(
            r.l.api_token_valid("nope", 5_000).err(),
            Some("unknown API token".into())
        );
        assert!(
            rejected(&r.api_token(3_000, "555555555555XXXX", "late", Some(3_000)))
                .contains("expire")
        );
        assert_eq!(
            r.at(
                3_000,
                Command::RevokeApiToken {
                    id: "666666666666".into()
                }
            ),
            LedgerResponse::Ok
        );
        assert_eq!(
            r.at(3_000, Command::RevokeApiToken { id: "ci".into() }),
            LedgerResponse::Ok
        );
        assert!(r.l.api_token_valid("666666666666XXXX", 3_000).is_err());
        assert!(r.l.api_token_valid("777777777777XXXX", 3_000).is_err());
        assert_eq!(
            rejected(&r.at(3_000, Command::RevokeApiToken { id: "ci".into() })),
            "no API token with id or name 'ci'"
        );
    }

    #[test]
    fn the_last_admin_token_cannot_be_revoked_but_can_be_rotated() {
        let mut r = R::new();
        assert!(
            rejected(&r.at(2_000, Command::RevokeApiToken { id: "admin".into() }))
                .contains("last admin token")
        );
        // An admin token that expired does not count as another one.
        r.api_token(2_000, "444444444444XXXX", "temp-admin", Some(3_000));
        assert!(
            rejected(&r.at(3_000, Command::RevokeApiToken { id: "admin".into() }))
                .contains("last admin token")
        );
        assert_eq!(
            r.at(
                3_100,
                Command::RotateApiToken {
                    name: "admin".into(),
                    hash: "333333333333XXXX".into()
                }
            ),
            LedgerResponse::Ok
        );
        assert!(r.l.api_token_valid("adminhash0000000", 3_100).is_err());
        let t =
            r.l.api_token_valid("333333333333XXXX", 3_100)
                .expect("rotated");
        assert_eq!(
            (t.name.as_str(), t.tenant.clone(), t.created_at_ms),
            ("admin", None, 3_100)
        );
        assert!(rejected(&r.at(
            3_200,
            Command::RotateApiToken {
                name: "nobody".into(),
                hash: "121212121212XXXX".into()
            }
        ))
        .contains("no API token named 'nobody'"));
        // With a second admin token the first may go.
        r.api_token(3_300, "131313131313XXXX", "ops", None);
        assert_eq!(
            r.at(3_400, Command::RevokeApiToken { id: "admin".into() }),
            LedgerResponse::Ok
        );
    }

    #[test]
    fn last_use_only_moves_forward_and_needs_a_known_token() {
        let mut r = R::new();
        r.api_token(2_000, "141414141414XXXX", "ci", None);
        assert_eq!(
            r.at(
                5_000,
                Command::TouchApiToken {
                    id: "141414141414".into()
                }
            ),
            LedgerResponse::Ok
        );
        // A late report from a lagging member does not move it back (the
        // ledger clock never runs backwards either).
        r.at(
            4_000,
            Command::TouchApiToken {
                id: "141414141414".into(),
            },
        );
        assert_eq!(r.l.api_tokens["141414141414XXXX"].last_used_ms, Some(5_000));
        rejected(&r.at(6_000, Command::TouchApiToken { id: "nope".into() }));
    }

    #[test]
    fn members_may_report_token_use_but_not_manage_tokens() {
        let mut r = R::new();
        r.api_token(2_000, "151515151515XXXX", "ci", None);
        let as_node = |cmd: Command| Command::AsNode {
            node: 1,
            cmd: Box::new(cmd),
        };
        assert_eq!(
            r.at(
                3_000,
                as_node(Command::TouchApiToken {
                    id: "151515151515".into()
                })
            ),
            LedgerResponse::Ok
        );
        for cmd in [
            Command::RevokeApiToken { id: "ci".into() },
            Command::RevokeJoinToken { id: "x".into() },
            Command::RotateApiToken {
                name: "admin".into(),
                hash: "161616161616XXXX".into(),
            },
        ] {
            let answer = r.at(3_000, as_node(cmd.clone()));
            assert!(
                matches!(answer, LedgerResponse::Denied(_)),
                "{cmd:?} -> {answer:?}"
            );
        }
        assert!(r.l.api_token_valid("151515151515XXXX", 3_000).is_ok());
        assert!(r.l.api_token_valid("adminhash0000000", 3_000).is_ok());
    }
}
