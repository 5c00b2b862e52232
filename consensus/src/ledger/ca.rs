//! The CA rotation's transitions ([`crate::ca`] holds its records and rules).

use super::{Command, Ledger, LedgerResponse};
use crate::ca::*;
use crate::events::{EventSpec, Severity};
use crate::ids::NodeId;
use shoal_sdk::MemberState;

impl Ledger {
    /// The CA certificates (PEM) the cluster trusts: the signing CA, and
    /// during a rotation both CAs (old first).
    pub fn trusted_ca_pems(&self) -> Vec<String> {
        match (&self.ca.rotation, &self.cluster) {
            (Some(r), _) => vec![r.old_cert_pem.clone(), r.new_cert_pem.clone()],
            (None, Some(c)) => vec![c.ca_cert_pem.clone()],
            (None, None) => vec![],
        }
    }

    /// What a node puts in its credentials' CA bundle: the trusted CAs and,
    /// during a rotation, the cross-signed certificate (which a node's
    /// chain carries; as a trust root it is the new CA again).
    pub fn ca_bundle_pem(&self) -> String {
        let mut pems = self.trusted_ca_pems();
        if let Some(r) = &self.ca.rotation {
            pems.push(r.cross_cert_pem.clone());
        }
        join_pems(&pems)
    }
}

fn event(kind: &str, message: String) -> EventSpec {
    EventSpec {
        severity: Severity::Info,
        kind: kind.into(),
        node: None,
        gpu: None,
        job: None,
        resource: None,
        message,
    }
}

impl Ledger {
    /// `StartCaRotation`: the leader made the new CA (its key is in the
    /// leader's custody); both are trusted from this entry on.
    pub(crate) fn start_ca_rotation(&mut self, cmd: &Command, now: u64) -> LedgerResponse {
        let Command::StartCaRotation {
            old_cert_pem,
            old_fingerprint,
            new_cert_pem,
            new_fingerprint,
            cross_cert_pem,
        } = cmd
        else {
            return LedgerResponse::Rejected("not a CA rotation".into());
        };
        let Some(cluster) = &self.cluster else {
            return LedgerResponse::Rejected("the cluster is not bootstrapped yet".into());
        };
        if let Some(r) = &self.ca.rotation {
            return LedgerResponse::Rejected(in_progress(r));
        }
        if *old_cert_pem != cluster.ca_cert_pem {
            return LedgerResponse::Rejected(
                "the cluster CA changed while the rotation was prepared; try again".into(),
            );
        }
        let sizes_ok = [old_cert_pem, new_cert_pem, cross_cert_pem]
            .iter()
            .all(|p| !p.is_empty() && p.len() <= MAX_CA_PEM)
            && [old_fingerprint, new_fingerprint]
                .iter()
                .all(|f| !f.is_empty() && f.len() <= MAX_FINGERPRINT);
        if !sizes_ok {
            return LedgerResponse::Rejected(
                "a CA rotation needs both certificates, the cross-signed one and both fingerprints, within bounds".into(),
            );
        }
        if new_fingerprint == old_fingerprint || new_cert_pem == old_cert_pem {
            return LedgerResponse::Rejected("the new CA is the current one".into());
        }
        self.ca.generation = self.ca.generation.saturating_add(1);
        self.ca.rotation = Some(CaRotation {
            phase: CaPhase::Trusting,
            old_cert_pem: old_cert_pem.clone(),
            old_fingerprint: old_fingerprint.clone(),
            new_cert_pem: new_cert_pem.clone(),
            new_fingerprint: new_fingerprint.clone(),
            cross_cert_pem: cross_cert_pem.clone(),
            started_at_ms: now,
            phase_since_ms: now,
        });
        self.events.record(
            &event(
                EVENT_TRUSTING,
                format!(
                    "CA rotation started: every node now trusts the old CA {} and the new CA {}; the old one still signs",
                    short(old_fingerprint),
                    short(new_fingerprint)
                ),
            ),
            now,
        );
        LedgerResponse::Ok
    }

    /// `AdvanceCaRotation { from }`: the next phase, if every counted
    /// member is ready for it (checked here, at commit, so a stale leader
    /// cannot skip a node).
    pub(crate) fn advance_ca_rotation(&mut self, from: CaPhase, now: u64) -> LedgerResponse {
        let Some(r) = self.ca.rotation.as_ref() else {
            return LedgerResponse::Rejected("no CA rotation is in progress".into());
        };
        if r.phase != from {
            return LedgerResponse::Rejected(format!(
                "the CA rotation is in phase {}, not {}",
                r.phase.as_str(),
                from.as_str()
            ));
        }
        let waiting = waiting_for(&self.ca, &self.members).unwrap_or_default();
        if let Some((_, why)) = waiting.first() {
            let more = match waiting.len() {
                1 => String::new(),
                n => format!(" (and {} more)", n - 1),
            };
            return LedgerResponse::Rejected(format!(
                "the CA rotation cannot leave phase {} yet: {why}{more}",
                from.as_str()
            ));
        }
        let Some(cluster) = self.cluster.as_mut() else {
            return LedgerResponse::Rejected("the cluster is not bootstrapped yet".into());
        };
        let Some(mut r) = self.ca.rotation.take() else {
            return LedgerResponse::Rejected("no CA rotation is in progress".into());
        };
        match from {
            CaPhase::Trusting => {
                cluster.ca_cert_pem = r.new_cert_pem.clone();
                r.phase = CaPhase::Reissuing;
                r.phase_since_ms = now;
                let message = format!(
                    "CA rotation: the new CA {} signs certificates from now on; every node renews its certificate",
                    short(&r.new_fingerprint)
                );
                self.ca.rotation = Some(r);
                self.events.record(&event(EVENT_REISSUING, message), now);
            }
            CaPhase::Reissuing => {
                let message = format!(
                    "CA rotation done: the old CA {} is retired; the cluster trusts only the CA {}",
                    short(&r.old_fingerprint),
                    short(&r.new_fingerprint)
                );
                self.ca.retired.push(r.old_cert_pem);
                let excess = self.ca.retired.len().saturating_sub(MAX_RETIRED);
                self.ca.retired.drain(..excess);
                self.events.record(&event(EVENT_DONE, message), now);
            }
        }
        LedgerResponse::Ok
    }

    /// `ReportCredentials`: what member `node` trusts and which CA signed
    /// its certificate.
    pub(crate) fn report_credentials(
        &mut self,
        node: NodeId,
        trusted: &[String],
        cert_ca: &str,
        now: u64,
    ) -> LedgerResponse {
        match self.members.get(&node) {
            None => return LedgerResponse::Rejected(format!("no member with id {node}")),
            Some(m) if m.state == MemberState::Left => {
                return LedgerResponse::Rejected(format!("node {node} has left the cluster"))
            }
            Some(_) => {}
        }
        if trusted.len() > MAX_TRUSTED
            || cert_ca.len() > MAX_FINGERPRINT
            || trusted.iter().any(|f| f.len() > MAX_FINGERPRINT)
        {
            return LedgerResponse::Rejected(format!(
                "a credentials report names at most {MAX_TRUSTED} CAs by fingerprints of at most {MAX_FINGERPRINT} characters"
            ));
        }
        let mut trusted = trusted.to_vec();
        trusted.sort();
        trusted.dedup();
        self.ca.reports.insert(
            node,
            TlsReport {
                trusted,
                cert_ca: cert_ca.to_string(),
                at_ms: now,
            },
        );
        LedgerResponse::Ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::{LedgerRequest, MemberSpec};
    use proptest::prelude::*;

    const OLD: &str = "OLD-CERT";
    const NEW: &str = "NEW-CERT";
    const OLD_FP: &str = "00aa";
    const NEW_FP: &str = "11bb";

    struct Replica {
        ledger: Ledger,
        index: u64,
    }

    impl Replica {
        /// Members 1, 2 and 3 under the CA `OLD`, an admin token `admin`
        /// and a tenant `lab`.
        fn three_nodes() -> Self {
            let mut r = Replica {
                ledger: Ledger::new(),
                index: 0,
            };
            let spec = |name: &str| MemberSpec {
                name: name.into(),
                rpc_addr: "127.0.0.1:1".into(),
                api_addr: "127.0.0.1:2".into(),
                ..MemberSpec::default()
            };
            r.apply(Command::Bootstrap {
                cluster_id: "c".into(),
                region: "r".into(),
                ca_cert_pem: OLD.into(),
                admin_token_hash: "admin".into(),
                first_member: 1,
                spec: spec("n1"),
            });
            r.apply(Command::CreateJoinToken {
                hash: "t".into(),
                expires_at_ms: u64::MAX,
                uses: 5,
            });
            for name in ["n2", "n3"] {
                r.apply(Command::AddMember {
                    spec: spec(name),
                    token_hash: "t".into(),
                });
            }
            r.apply(Command::CreateTenant {
                name: "lab".into(),
                limits: Default::default(),
            });
            r
        }

        fn apply(&mut self, cmd: Command) -> LedgerResponse {
            self.index += 1;
            self.ledger.apply(
                self.index,
                &LedgerRequest {
                    now_ms: self.index * 1000,
                    cmd,
                },
            )
        }

        fn as_node(&mut self, node: NodeId, cmd: Command) -> LedgerResponse {
            self.apply(Command::AsNode {
                node,
                cmd: Box::new(cmd),
            })
        }

        fn report(&mut self, node: NodeId, trusted: &[&str], cert_ca: &str) -> LedgerResponse {
            self.as_node(
                node,
                Command::ReportCredentials {
                    node,
                    trusted: trusted.iter().map(|s| s.to_string()).collect(),
                    cert_ca: cert_ca.into(),
                },
            )
        }

        fn phase(&self) -> Option<CaPhase> {
            self.ledger.ca.rotation.as_ref().map(|r| r.phase)
        }

        fn events_of(&self, kind: &str) -> usize {
            self.ledger
                .events
                .after(0)
                .filter(|e| e.spec.kind == kind)
                .count()
        }
    }

    fn start() -> Command {
        Command::StartCaRotation {
            old_cert_pem: OLD.into(),
            old_fingerprint: OLD_FP.into(),
            new_cert_pem: NEW.into(),
            new_fingerprint: NEW_FP.into(),
            cross_cert_pem: "CROSS".into(),
        }
    }

    fn rejected(r: &LedgerResponse) -> bool {
        matches!(r, LedgerResponse::Rejected(_))
    }

    fn denied(r: &LedgerResponse) -> bool {
        matches!(r, LedgerResponse::Denied(_))
    }

    #[test]
    fn a_rotation_trusts_both_then_signs_with_the_new_ca_then_retires_the_old() {
        let mut r = Replica::three_nodes();
        assert_eq!(r.ledger.trusted_ca_pems(), vec![OLD.to_string()]);
        assert_eq!(r.apply(start()), LedgerResponse::Ok);
        assert_eq!(r.phase(), Some(CaPhase::Trusting));
        assert_eq!(
            r.ledger.trusted_ca_pems(),
            vec![OLD.to_string(), NEW.to_string()]
        );
        assert!(r.ledger.ca_bundle_pem().contains("CROSS"));
        // The old CA still signs while nodes learn to trust the new one.
        assert_eq!(r.ledger.cluster.as_ref().expect("cluster").ca_cert_pem, OLD);
        assert_eq!(r.events_of(EVENT_TRUSTING), 1);

        // Not before every member trusts both.
        for node in [1, 2] {
            assert_eq!(
                r.report(node, &[OLD_FP, NEW_FP], OLD_FP),
                LedgerResponse::Ok
            );
        }
        assert_eq!(r.report(3, &[OLD_FP], OLD_FP), LedgerResponse::Ok);
        let early = r.apply(Command::AdvanceCaRotation {
            from: CaPhase::Trusting,
        });
        assert!(
            matches!(&early, LedgerResponse::Rejected(m) if m.contains("node 3")),
            "{early:?}"
        );
        assert_eq!(r.phase(), Some(CaPhase::Trusting));
        assert_eq!(r.report(3, &[NEW_FP, OLD_FP], OLD_FP), LedgerResponse::Ok);
        let advance = Command::AdvanceCaRotation {
            from: CaPhase::Trusting,
        };
        assert_eq!(r.apply(advance.clone()), LedgerResponse::Ok);
        assert_eq!(r.phase(), Some(CaPhase::Reissuing));
        assert_eq!(r.ledger.cluster.as_ref().expect("cluster").ca_cert_pem, NEW);
        assert_eq!(
            r.ledger.trusted_ca_pems(),
            vec![OLD.to_string(), NEW.to_string()]
        );
        // A repeated advance (a leader retrying) changes nothing.
        assert!(rejected(&r.apply(advance)));
        assert_eq!(r.phase(), Some(CaPhase::Reissuing));

        // Not retired while a member still has a certificate of the old CA.
        for node in [1, 2] {
            assert_eq!(
                r.report(node, &[OLD_FP, NEW_FP], NEW_FP),
                LedgerResponse::Ok
            );
        }
        let retire = Command::AdvanceCaRotation {
            from: CaPhase::Reissuing,
        };
        assert!(rejected(&r.apply(retire.clone())));
        assert_eq!(r.report(3, &[OLD_FP, NEW_FP], NEW_FP), LedgerResponse::Ok);
        assert_eq!(r.apply(retire), LedgerResponse::Ok);
        assert_eq!(r.phase(), None);
        assert_eq!(r.ledger.trusted_ca_pems(), vec![NEW.to_string()]);
        assert_eq!(r.ledger.ca_bundle_pem(), format!("{NEW}\n"));
        assert_eq!(r.ledger.ca.retired, vec![OLD.to_string()]);
        assert_eq!(r.ledger.ca.generation, 1);
        assert_eq!(r.events_of(EVENT_REISSUING), 1);
        assert_eq!(r.events_of(EVENT_DONE), 1);
    }

    #[test]
    fn a_second_rotation_is_refused_while_one_is_in_progress() {
        let mut r = Replica::three_nodes();
        assert_eq!(r.apply(start()), LedgerResponse::Ok);
        let again = r.apply(Command::StartCaRotation {
            old_cert_pem: OLD.into(),
            old_fingerprint: OLD_FP.into(),
            new_cert_pem: "THIRD".into(),
            new_fingerprint: "22cc".into(),
            cross_cert_pem: "CROSS2".into(),
        });
        assert!(
            matches!(&again, LedgerResponse::Rejected(m) if m.contains("already in progress")),
            "{again:?}"
        );
        let rotation = r.ledger.ca.rotation.as_ref().expect("rotation");
        assert_eq!(rotation.new_fingerprint, NEW_FP);
        assert_eq!(r.ledger.ca.generation, 1);
    }

    #[test]
    fn a_rotation_prepared_against_another_ca_or_without_its_parts_is_refused() {
        let mut r = Replica::three_nodes();
        let stale = r.apply(Command::StartCaRotation {
            old_cert_pem: "SOME-OTHER-CA".into(),
            old_fingerprint: OLD_FP.into(),
            new_cert_pem: NEW.into(),
            new_fingerprint: NEW_FP.into(),
            cross_cert_pem: "CROSS".into(),
        });
        assert!(rejected(&stale), "{stale:?}");
        let empty_cross = r.apply(Command::StartCaRotation {
            old_cert_pem: OLD.into(),
            old_fingerprint: OLD_FP.into(),
            new_cert_pem: NEW.into(),
            new_fingerprint: NEW_FP.into(),
            cross_cert_pem: String::new(),
        });
        assert!(rejected(&empty_cross), "{empty_cross:?}");
        let same = r.apply(Command::StartCaRotation {
            old_cert_pem: OLD.into(),
            old_fingerprint: OLD_FP.into(),
            new_cert_pem: OLD.into(),
            new_fingerprint: OLD_FP.into(),
            cross_cert_pem: "CROSS".into(),
        });
        assert!(rejected(&same), "{same:?}");
        assert!(r.ledger.ca.rotation.is_none());
        assert!(rejected(&r.apply(Command::AdvanceCaRotation {
            from: CaPhase::Trusting
        })));
    }

    #[test]
    fn only_an_admin_starts_or_advances_a_rotation() {
        let mut r = Replica::three_nodes();
        // A tenant token's write, and a member on its own authority.
        let as_tenant = r.apply(Command::AsTenant {
            tenant: "lab".into(),
            cmd: Box::new(start()),
        });
        assert!(denied(&as_tenant), "{as_tenant:?}");
        assert!(denied(&r.as_node(2, start())));
        assert!(r.ledger.ca.rotation.is_none());
        assert_eq!(r.apply(start()), LedgerResponse::Ok);
        for node in 1..=3 {
            r.report(node, &[OLD_FP, NEW_FP], OLD_FP);
        }
        let advance = Command::AdvanceCaRotation {
            from: CaPhase::Trusting,
        };
        assert!(denied(&r.as_node(2, advance.clone())));
        assert!(denied(&r.apply(Command::AsTenant {
            tenant: "lab".into(),
            cmd: Box::new(advance),
        })));
        assert_eq!(r.phase(), Some(CaPhase::Trusting));
    }

    #[test]
    fn a_node_reports_only_its_own_credentials() {
        let mut r = Replica::three_nodes();
        r.apply(start());
        let forged = r.as_node(
            2,
            Command::ReportCredentials {
                node: 3,
                trusted: vec![OLD_FP.into(), NEW_FP.into()],
                cert_ca: NEW_FP.into(),
            },
        );
        assert!(denied(&forged), "{forged:?}");
        assert!(!r.ledger.ca.reports.contains_key(&3));
        let audit: Vec<String> = r
            .ledger
            .events
            .after(0)
            .filter(|e| e.spec.kind == crate::events::AUDIT)
            .map(|e| e.spec.message.clone())
            .collect();
        assert!(
            audit
                .iter()
                .any(|m| m.contains("node 2") && m.contains("node 3")),
            "{audit:?}"
        );
        assert_eq!(r.report(3, &[OLD_FP], OLD_FP), LedgerResponse::Ok);
        assert_eq!(r.ledger.ca.reports[&3].trusted, vec![OLD_FP.to_string()]);
        // Bounded, and only for members.
        let many: Vec<String> = (0..MAX_TRUSTED + 1).map(|i| format!("{i:02}")).collect();
        let refs: Vec<&str> = many.iter().map(String::as_str).collect();
        assert!(rejected(&r.report(3, &refs, OLD_FP)));
        assert!(denied(&r.report(9, &[OLD_FP], OLD_FP)));
    }

    #[test]
    fn a_down_member_holds_the_rotation_until_it_is_back_or_removed() {
        let mut r = Replica::three_nodes();
        r.apply(start());
        for node in [1, 2] {
            r.report(node, &[OLD_FP, NEW_FP], OLD_FP);
        }
        r.apply(Command::SetMemberState {
            id: 3,
            state: MemberState::Down,
        });
        let waiting = waiting_for(&r.ledger.ca, &r.ledger.members).expect("a rotation");
        assert_eq!(waiting.len(), 1);
        assert!(waiting[0].1.contains("shoal node remove"), "{waiting:?}");
        let advance = Command::AdvanceCaRotation {
            from: CaPhase::Trusting,
        };
        assert!(rejected(&r.apply(advance.clone())));
        r.apply(Command::SetMemberState {
            id: 3,
            state: MemberState::Left,
        });
        assert_eq!(r.apply(advance), LedgerResponse::Ok);
        // A report of a member that left is refused.
        assert!(denied(&r.report(3, &[NEW_FP], NEW_FP)));
        for node in [1, 2] {
            r.report(node, &[NEW_FP, OLD_FP], NEW_FP);
        }
        assert_eq!(
            r.apply(Command::AdvanceCaRotation {
                from: CaPhase::Reissuing
            }),
            LedgerResponse::Ok
        );
    }

    #[test]
    fn retired_cas_are_bounded_and_a_later_rotation_starts_from_the_new_ca() {
        let mut r = Replica::three_nodes();
        let mut current = (OLD.to_string(), OLD_FP.to_string());
        for round in 0..(MAX_RETIRED + 2) {
            let next = (format!("CA-{round}"), format!("fp-{round}"));
            let started = r.apply(Command::StartCaRotation {
                old_cert_pem: current.0.clone(),
                old_fingerprint: current.1.clone(),
                new_cert_pem: next.0.clone(),
                new_fingerprint: next.1.clone(),
                cross_cert_pem: format!("cross-{round}"),
            });
            assert_eq!(started, LedgerResponse::Ok, "round {round}");
            for node in 1..=3 {
                r.report(node, &[&current.1, &next.1], &current.1);
            }
            r.apply(Command::AdvanceCaRotation {
                from: CaPhase::Trusting,
            });
            for node in 1..=3 {
                r.report(node, &[&next.1], &next.1);
            }
            assert_eq!(
                r.apply(Command::AdvanceCaRotation {
                    from: CaPhase::Reissuing
                }),
                LedgerResponse::Ok
            );
            current = next;
        }
        assert_eq!(r.ledger.ca.retired.len(), MAX_RETIRED);
        assert_eq!(r.ledger.trusted_ca_pems(), vec![current.0.clone()]);
        assert_eq!(r.ledger.ca.generation as usize, MAX_RETIRED + 2);
    }

    fn arb_cmd() -> impl Strategy<Value = Command> {
        let fp = prop::sample::select(vec![OLD_FP, NEW_FP, "x"]);
        prop_oneof![
            Just(start()),
            prop::sample::select(vec![CaPhase::Trusting, CaPhase::Reissuing])
                .prop_map(|from| Command::AdvanceCaRotation { from }),
            (
                1u64..4,
                1u64..4,
                prop::collection::vec(fp.clone(), 0..3),
                fp
            )
                .prop_map(|(sender, node, trusted, cert_ca)| Command::AsNode {
                    node: sender,
                    cmd: Box::new(Command::ReportCredentials {
                        node,
                        trusted: trusted.into_iter().map(String::from).collect(),
                        cert_ca: cert_ca.into(),
                    }),
                }),
            (
                1u64..4,
                prop::sample::select(vec![MemberState::Alive, MemberState::Down])
            )
                .prop_map(|(id, state)| Command::SetMemberState { id, state }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// Whatever members report and whenever the leader tries to
        /// advance: the signing CA is always trusted, the old CA is never
        /// retired while a member that has not left lacks a certificate of
        /// the new one, and the new CA never signs before every such member
        /// trusts it.
        #[test]
        fn the_signing_ca_is_always_trusted_and_no_member_is_stranded(
            cmds in prop::collection::vec(arb_cmd(), 0..40)
        ) {
            let mut r = Replica::three_nodes();
            for cmd in cmds {
                let before = r.phase();
                let reports = r.ledger.ca.reports.clone();
                let answer = r.apply(cmd);
                let after = r.phase();
                let signing = r.ledger.cluster.as_ref().expect("cluster").ca_cert_pem.clone();
                prop_assert!(r.ledger.trusted_ca_pems().contains(&signing));
                if before != after && answer == LedgerResponse::Ok {
                    let counted: Vec<NodeId> = counted(&r.ledger.members).map(|m| m.id).collect();
                    for id in counted {
                        let report = reports.get(&id);
                        let trusts = |fp: &str| report.is_some_and(|t| t.trusted.iter().any(|f| f == fp));
                        match (before, after) {
                            (Some(CaPhase::Trusting), Some(CaPhase::Reissuing)) => {
                                prop_assert!(trusts(OLD_FP) && trusts(NEW_FP), "node {} switched early", id);
                            }
                            (Some(CaPhase::Reissuing), None) => {
                                prop_assert!(report.is_some_and(|t| t.cert_ca == NEW_FP), "node {} stranded", id);
                            }
                            _ => {}
                        }
                    }
                }
            }
        }
    }
}
