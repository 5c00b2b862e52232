//! Cluster CA rotation, as the ledger records it (`shoal ca rotate`).
//!
//! A rotation replaces the cluster CA without stopping anything, in phases
//! the leader drives and `apply` checks:
//!
//! 1. **trusting** (`Command::StartCaRotation`, admin only): the leader
//!    made a new CA and holds its key; the cluster trusts both CAs and still
//!    signs with the old one. Every node installs the pair as its trust
//!    roots and reports so (`Command::ReportCredentials`, about itself).
//! 2. **reissuing** (`Command::AdvanceCaRotation`, once every member that
//!    has not left trusts both): the cluster signs with the new CA; every
//!    node whose certificate the old CA signed renews at once.
//! 3. **done** (the same command, once every such member's certificate is
//!    the new CA's): the cluster trusts the new CA alone; the old one is
//!    retired and the voters delete its key.
//!
//! Members that are down count: a node that comes back after the switch
//! must still trust the CA its peers present, and after the retirement its
//! old certificate would be refused. A member that is gone for good holds a
//! rotation up until the operator removes it (`shoal node remove`).
//!
//! Fingerprints (BLAKE3 of a certificate's DER, as in join tokens) are
//! computed by the leader and carried in the commands: this crate does not
//! parse certificates.

use crate::ids::NodeId;
use crate::members::Member;
use serde::{Deserialize, Serialize};
use shoal_sdk::MemberState;
use std::collections::BTreeMap;

/// Longest CA certificate (PEM) a rotation records.
pub const MAX_CA_PEM: usize = 8 * 1024;
/// Most fingerprints a node reports trusting.
pub const MAX_TRUSTED: usize = 8;
/// Longest fingerprint (hex BLAKE3 is 64).
pub const MAX_FINGERPRINT: usize = 128;
/// Retired CA certificates kept, newest last (so that voters that were
/// away know which keys to delete).
pub const MAX_RETIRED: usize = 4;

/// Event kinds, one per phase (distinct kinds: the event log folds repeats
/// of one kind within a minute into one event).
pub const EVENT_TRUSTING: &str = "ca_rotation_trusting";
pub const EVENT_REISSUING: &str = "ca_rotation_reissuing";
pub const EVENT_DONE: &str = "ca_rotation_done";

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CaPhase {
    /// Both CAs trusted; the old one signs.
    Trusting,
    /// Both CAs trusted; the new one signs; nodes renew.
    Reissuing,
}

impl CaPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            CaPhase::Trusting => "trusting",
            CaPhase::Reissuing => "reissuing",
        }
    }
}

/// A rotation in progress.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct CaRotation {
    pub phase: CaPhase,
    pub old_cert_pem: String,
    pub old_fingerprint: String,
    pub new_cert_pem: String,
    pub new_fingerprint: String,
    /// The new CA's certificate signed by the old CA: nodes present it in
    /// their chains during the rotation, so that a joiner whose token pins
    /// the old CA can verify a node that already has a new certificate.
    /// Useless once the old CA is retired (nobody trusts its signature).
    pub cross_cert_pem: String,
    pub started_at_ms: u64,
    pub phase_since_ms: u64,
}

/// What a node last said about its TLS credentials.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsReport {
    /// Fingerprints of the CA certificates it accepts peers from.
    pub trusted: Vec<String>,
    /// Fingerprint of the CA that signed its own certificate.
    pub cert_ca: String,
    pub at_ms: u64,
}

/// The cluster CA's history and the members' reports. The CA that signs
/// now is `ClusterInfo::ca_cert_pem`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct CaState {
    pub rotation: Option<CaRotation>,
    pub reports: BTreeMap<NodeId, TlsReport>,
    /// Retired CA certificates, newest last, at most [`MAX_RETIRED`].
    pub retired: Vec<String>,
    /// Rotations started so far (names the next CA).
    pub generation: u32,
}

/// PEM blocks one after the other, each ending in a newline.
pub fn join_pems(pems: &[String]) -> String {
    let mut out = String::new();
    for p in pems {
        out.push_str(p.trim_end());
        out.push('\n');
    }
    out
}

/// Members a rotation waits for: every one that has not left.
pub fn counted(members: &BTreeMap<NodeId, Member>) -> impl Iterator<Item = &Member> {
    members.values().filter(|m| m.state != MemberState::Left)
}

fn state_word(state: MemberState) -> &'static str {
    match state {
        MemberState::Alive => "alive",
        MemberState::Suspect => "suspect",
        MemberState::Down => "down",
        MemberState::Left => "left",
    }
}

/// Members not ready for the rotation's next phase, each with why; empty
/// when the leader may advance. `None` without a rotation.
pub fn waiting_for(
    ca: &CaState,
    members: &BTreeMap<NodeId, Member>,
) -> Option<Vec<(NodeId, String)>> {
    let r = ca.rotation.as_ref()?;
    let mut out = Vec::new();
    for m in counted(members) {
        let report = ca.reports.get(&m.id);
        let trusts = |fp: &str| report.is_some_and(|t| t.trusted.iter().any(|f| f == fp));
        let why = match r.phase {
            CaPhase::Trusting if !(trusts(&r.old_fingerprint) && trusts(&r.new_fingerprint)) => {
                Some("does not trust both CAs yet")
            }
            CaPhase::Reissuing if !trusts(&r.new_fingerprint) => {
                Some("does not trust the new CA yet")
            }
            CaPhase::Reissuing if report.is_none_or(|t| t.cert_ca != r.new_fingerprint) => {
                Some("has no certificate from the new CA yet")
            }
            _ => None,
        };
        if let Some(why) = why {
            let hint = match m.state {
                MemberState::Down => {
                    " (it is down: bring it back, or `shoal node remove` it if it is gone for good)"
                }
                _ => "",
            };
            out.push((
                m.id,
                format!(
                    "node {} ({}, {}) {why}{hint}",
                    m.id,
                    m.spec.name,
                    state_word(m.state)
                ),
            ));
        }
    }
    Some(out)
}

/// Why a second rotation is refused.
pub fn in_progress(r: &CaRotation) -> String {
    format!(
        "a CA rotation is already in progress (phase {}, new CA {}): wait for it to finish; `shoal ca status` shows what it waits for",
        r.phase.as_str(),
        short(&r.new_fingerprint)
    )
}

/// The first 16 hex digits, as messages show a fingerprint.
pub fn short(fp: &str) -> &str {
    fp.get(..16).unwrap_or(fp)
}
