//! Peer-region transitions: joining, replacing and removing a peer region
//! ([`crate::federation`] holds the records and their rules).

use super::Ledger;
use crate::federation::*;

impl Ledger {
    /// `Command::AddPeerRegion`: records (or replaces, on a repeated join)
    /// the peer and its inbound secret.
    pub(crate) fn add_peer_region(&mut self, peer: &PeerRegion, now: u64) -> Result<(), String> {
        validate_peer(peer)?;
        let sealed = self
            .effective_protocol()
            .is_some_and(|p| p >= SEALED_SECRETS_SINCE_PROTOCOL);
        if sealed && is_clear_secret(&peer.outbound_secret_hash) {
            return Err(
                "a peer region's secret stays out of the ledger: record its hash, and keep the \
                 secret in the nodes' data directories"
                    .into(),
            );
        }
        let own = self.cluster.as_ref().map(|c| c.region.as_str());
        if own == Some(peer.name.as_str()) {
            return Err(format!(
                "the peer region is named '{}' like this one: regions need distinct names (`shoal agent --bootstrap --region NAME`)",
                peer.name
            ));
        }
        let known = self.federation.peers.contains_key(&peer.name);
        if !known && self.federation.peers.len() >= MAX_PEERS {
            return Err(format!(
                "this region federates with {MAX_PEERS} regions already"
            ));
        }
        let previous = self.federation.peers.get(&peer.name).cloned();
        if let Some(old) = &previous {
            self.api_tokens.remove(&old.inbound_token_hash);
        }
        if let Err(e) = self.create_api_token(
            &peer.inbound_token_hash,
            &peer.token_name(),
            &None,
            None,
            now,
        ) {
            // Leave the ledger as it was: the old record keeps working.
            if let Some(old) = previous {
                self.api_tokens.insert(
                    old.inbound_token_hash.clone(),
                    crate::tokens::ApiToken::new(
                        &old.inbound_token_hash,
                        old.token_name(),
                        None,
                        None,
                        old.joined_at_ms,
                    ),
                );
            }
            return Err(e);
        }
        let mut peer = peer.clone();
        peer.joined_at_ms = now;
        self.federation.peers.insert(peer.name.clone(), peer);
        Ok(())
    }

    /// `Command::SetPeerCa`: the CA certificates a peer's API chains to
    /// from now on. The leader proposes it from a summary the peer served
    /// over TLS that chained to the CAs recorded so far (during the peer's
    /// rotation its nodes carry a certificate of the new CA signed by the
    /// old one), so trust passes from the old CA to the new one.
    pub(crate) fn set_peer_ca(&mut self, region: &str, ca_cert_pem: &str) -> Result<(), String> {
        if ca_cert_pem.len() > MAX_CA_PEM {
            return Err(format!(
                "region {region}'s CA certificates are longer than {MAX_CA_PEM} bytes"
            ));
        }
        if !ca_cert_pem.contains("-----BEGIN CERTIFICATE-----") {
            return Err(format!("region {region} named no CA certificate"));
        }
        let Some(peer) = self.federation.peers.get_mut(region) else {
            return Err(format!("no peer region named '{region}'"));
        };
        peer.ca_cert_pem = ca_cert_pem.to_string();
        Ok(())
    }

    /// `Command::RemovePeerRegion`: forgets the peer; its secret stops
    /// working here in the same entry.
    /// `Command::SealPeerSecret`: the secret an older release kept for
    /// `region` in clear is replaced by its hash. Once every member speaks
    /// [`SEALED_SECRETS_SINCE_PROTOCOL`] (they keep the secret on disk from
    /// then on); a sealed record is left as it is.
    pub(crate) fn seal_peer_secret(&mut self, region: &str) -> Result<(), String> {
        if self
            .effective_protocol()
            .is_none_or(|p| p < SEALED_SECRETS_SINCE_PROTOCOL)
        {
            return Err(format!(
                "sealing a peer's secret needs every member at protocol {SEALED_SECRETS_SINCE_PROTOCOL}"
            ));
        }
        let Some(peer) = self.federation.peers.get_mut(region) else {
            return Err(format!("no peer region named '{region}'"));
        };
        if is_clear_secret(&peer.outbound_secret_hash) {
            peer.outbound_secret_hash = crate::tokens::hash_secret(&peer.outbound_secret_hash);
        }
        Ok(())
    }

    pub(crate) fn remove_peer_region(&mut self, name: &str) -> Result<(), String> {
        match self.federation.peers.remove(name) {
            Some(peer) => {
                self.api_tokens.remove(&peer.inbound_token_hash);
                // Neither side may take the other's jobs over any more.
                self.federation.foreign.remove(name);
                for copies in self.federation.copies_out.values_mut() {
                    copies.remove(name);
                }
                self.federation.copies_out.retain(|_, c| !c.is_empty());
                self.forget_region_grants(name);
                Ok(())
            }
            None => Err(format!("no peer region named '{name}'")),
        }
    }
}

fn validate_peer(peer: &PeerRegion) -> Result<(), String> {
    validate_region_name(&peer.name)?;
    if peer.api_urls.is_empty() || peer.api_urls.len() > MAX_PEER_URLS {
        return Err(format!(
            "a peer region needs 1-{MAX_PEER_URLS} API URLs, got {}",
            peer.api_urls.len()
        ));
    }
    if let Some(url) = peer
        .api_urls
        .iter()
        .find(|u| u.len() > MAX_URL || !(u.starts_with("https://") || u.starts_with("http://")))
    {
        return Err(format!(
            "'{url}' is not an http(s) URL of at most {MAX_URL} bytes"
        ));
    }
    if peer.ca_cert_pem.is_empty() || peer.ca_cert_pem.len() > MAX_CA_PEM {
        return Err(format!(
            "a peer region's CA must be 1-{MAX_CA_PEM} bytes of PEM"
        ));
    }
    if peer.outbound_secret_hash.is_empty() || peer.inbound_token_hash.is_empty() {
        return Err("a peer region needs both secrets".into());
    }
    if peer.cluster_id.is_empty() || peer.cluster_id.len() > MAX_URL {
        return Err("a peer region needs its cluster id".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::{Command, LedgerRequest, LedgerResponse, MemberSpec};

    fn ledger(region: &str) -> Ledger {
        let mut l = Ledger::new();
        let r = l.apply(
            1,
            &LedgerRequest {
                now_ms: 1,
                cmd: Command::Bootstrap {
                    cluster_id: "c1".into(),
                    region: region.into(),
                    ca_cert_pem: "ca".into(),
                    admin_token_hash: "admin-hash".into(),
                    first_member: 1,
                    spec: MemberSpec::default(),
                },
            },
        );
        assert_eq!(r, LedgerResponse::NodeId(1));
        l
    }

    fn peer(name: &str, hash: &str) -> PeerRegion {
        PeerRegion {
            name: name.into(),
            cluster_id: format!("{name}-cluster"),
            ca_cert_pem: "-----BEGIN CERTIFICATE-----".into(),
            api_urls: vec!["https://10.1.0.1:7070".into()],
            outbound_secret_hash: "out".into(),
            inbound_token_hash: hash.into(),
            joined_at_ms: 0,
        }
    }

    fn apply(l: &mut Ledger, cmd: Command) -> LedgerResponse {
        l.apply(2, &LedgerRequest { now_ms: 10, cmd })
    }

    #[test]
    fn a_peer_secret_stays_out_of_the_ledger_once_every_member_speaks_it() {
        let clear = "sa1.0123456789abcdef";
        let with_secret = |value: &str| PeerRegion {
            outbound_secret_hash: value.into(),
            ..peer("eu-1", "h1")
        };
        // An older release's record, in clear: taken while a member speaks
        // an older protocol, and sealing waits for all.
        let mut l = ledger("us-1");
        let add = Command::AddPeerRegion {
            peer: with_secret(clear),
        };
        assert_eq!(apply(&mut l, add.clone()), LedgerResponse::Ok);
        let seal = Command::SealPeerSecret {
            region: "eu-1".into(),
        };
        assert!(matches!(
            apply(&mut l, seal.clone()),
            LedgerResponse::Rejected(_)
        ));
        // Every member at the protocol: sealed to the hash, once.
        if let Some(m) = l.members.get_mut(&1) {
            m.spec.protocol_max = SEALED_SECRETS_SINCE_PROTOCOL;
        }
        assert_eq!(apply(&mut l, seal.clone()), LedgerResponse::Ok);
        let hash = crate::tokens::hash_secret(clear);
        assert_eq!(l.federation.peers["eu-1"].outbound_secret_hash, hash);
        assert_eq!(apply(&mut l, seal), LedgerResponse::Ok);
        assert_eq!(l.federation.peers["eu-1"].outbound_secret_hash, hash);
        assert!(!format!("{l:?}").contains(clear));
        // And a join may no longer put a secret in the ledger.
        let refused = apply(&mut l, add);
        assert!(
            matches!(&refused, LedgerResponse::Rejected(why) if why.contains("stays out of the ledger")),
            "{refused:?}"
        );
        assert_eq!(l.federation.peers["eu-1"].outbound_secret_hash, hash);
        let sealed = Command::AddPeerRegion {
            peer: with_secret(&crate::tokens::hash_secret("sa1.new")),
        };
        assert_eq!(apply(&mut l, sealed), LedgerResponse::Ok);
        // A tenant may not seal.
        let as_tenant = apply(
            &mut l,
            Command::AsTenant {
                tenant: "default".into(),
                cmd: Box::new(Command::SealPeerSecret {
                    region: "eu-1".into(),
                }),
            },
        );
        assert!(
            matches!(as_tenant, LedgerResponse::Denied(_)),
            "{as_tenant:?}"
        );
    }

    #[test]
    fn adding_a_peer_records_it_and_its_token() {
        let mut l = ledger("us-1");
        let r = apply(
            &mut l,
            Command::AddPeerRegion {
                peer: peer("eu-1", "h1"),
            },
        );
        assert_eq!(r, LedgerResponse::Ok);
        assert_eq!(l.federation.peers["eu-1"].joined_at_ms, 10);
        assert_eq!(l.api_tokens["h1"].name, "region-eu-1");
        assert_eq!(
            l.federation
                .peer_by_token_hash("h1")
                .map(|p| p.name.as_str()),
            Some("eu-1")
        );
    }

    #[test]
    fn a_peers_ca_is_replaced_only_for_a_known_peer_and_a_certificate() {
        let mut l = ledger("us-1");
        apply(
            &mut l,
            Command::AddPeerRegion {
                peer: peer("eu-1", "h1"),
            },
        );
        let set = |region: &str, pem: &str| Command::SetPeerCa {
            region: region.into(),
            ca_cert_pem: pem.into(),
        };
        let both = "-----BEGIN CERTIFICATE-----\nold\n-----BEGIN CERTIFICATE-----\nnew\n";
        assert_eq!(apply(&mut l, set("eu-1", both)), LedgerResponse::Ok);
        assert_eq!(l.federation.peers["eu-1"].ca_cert_pem, both);
        for (region, pem) in [
            ("mars-1", both),
            ("eu-1", ""),
            ("eu-1", "not a certificate"),
            ("eu-1", &"-----BEGIN CERTIFICATE-----".repeat(1000)),
        ] {
            let r = apply(&mut l, set(region, pem));
            assert!(matches!(r, LedgerResponse::Rejected(_)), "{region}: {r:?}");
        }
        assert_eq!(l.federation.peers["eu-1"].ca_cert_pem, both);
    }

    #[test]
    fn a_repeated_join_replaces_the_secret() {
        let mut l = ledger("us-1");
        apply(
            &mut l,
            Command::AddPeerRegion {
                peer: peer("eu-1", "h1"),
            },
        );
        let r = apply(
            &mut l,
            Command::AddPeerRegion {
                peer: peer("eu-1", "h2"),
            },
        );
        assert_eq!(r, LedgerResponse::Ok);
        assert!(
            !l.api_tokens.contains_key("h1"),
            "the old secret must stop working"
        );
        assert!(l.api_tokens.contains_key("h2"));
        assert_eq!(l.federation.peers.len(), 1);
    }

    #[test]
    fn a_peer_with_this_regions_name_is_refused() {
        let mut l = ledger("default");
        let r = apply(
            &mut l,
            Command::AddPeerRegion {
                peer: peer("default", "h1"),
            },
        );
        assert!(matches!(r, LedgerResponse::Rejected(m) if m.contains("distinct names")));
        assert!(l.federation.peers.is_empty());
        assert!(!l.api_tokens.contains_key("h1"));
    }

    #[test]
    fn removing_a_peer_revokes_its_secret() {
        let mut l = ledger("us-1");
        apply(
            &mut l,
            Command::AddPeerRegion {
                peer: peer("eu-1", "h1"),
            },
        );
        let r = apply(
            &mut l,
            Command::RemovePeerRegion {
                name: "eu-1".into(),
            },
        );
        assert_eq!(r, LedgerResponse::Ok);
        assert!(l.federation.peers.is_empty());
        assert!(!l.api_tokens.contains_key("h1"));
        let again = apply(
            &mut l,
            Command::RemovePeerRegion {
                name: "eu-1".into(),
            },
        );
        assert!(matches!(again, LedgerResponse::Rejected(_)));
    }

    #[test]
    fn a_tenant_may_not_federate() {
        let mut l = ledger("us-1");
        let r = apply(
            &mut l,
            Command::AsTenant {
                tenant: "t".into(),
                cmd: Box::new(Command::AddPeerRegion {
                    peer: peer("eu-1", "h1"),
                }),
            },
        );
        assert!(
            matches!(r, LedgerResponse::Denied(_) | LedgerResponse::Rejected(_)),
            "{r:?}"
        );
        assert!(l.federation.peers.is_empty());
    }

    #[test]
    fn region_names_are_dns_labels_and_never_auto() {
        assert!(validate_region_name("eu-1").is_ok());
        assert!(validate_region_name("default").is_ok());
        for bad in ["", "auto", "EU", "eu:1", "-eu", "eu_1", &"x".repeat(64)] {
            assert!(validate_region_name(bad).is_err(), "{bad}");
        }
    }
}
