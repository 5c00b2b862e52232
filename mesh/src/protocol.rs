//! Shoal's protocol version: one number for everything nodes exchange (RPC
//! message formats, ledger command formats). A build speaks a contiguous
//! range of versions, [`MIN_PROTOCOL`]`..=`[`PROTOCOL`]; two nodes can talk
//! when their ranges overlap, and then use the highest version both speak.
//!
//! RPC connections negotiate it with TLS ALPN: a client offers `shoal/<v>`
//! for every version it speaks (highest first), the server accepts those it
//! speaks (highest first, server preference), so the handshake settles on the
//! highest common version and [`negotiated`] reads it off the connection.
//! Both sides also list [`PROBE_ALPN`] last: when the ranges do not overlap
//! the handshake settles on it instead, the server answers with its range
//! ([`encode_range`]) and the client fails with [`Mismatch`], which names
//! both ranges. That exchange is fixed forever: 4 bytes each way, the
//! sender's `min` and `max`, big-endian.
//!
//! The range a process speaks is [`local`]: the build's range, or, for
//! tests only, the one `SHOAL_TEST_PROTOCOL=min..max` names (read once, at
//! first use), so one machine can run a cluster mid-upgrade.

use std::fmt;
use std::sync::OnceLock;

/// The newest protocol version this build speaks. Version 2: routed writes
/// carry a write id (`Request::Once`, `Command::Once`), proposed only once
/// every member speaks 2. Version 3: tenants capped across regions
/// (`Command::SetGlobalGpus`, `AdoptGlobalTenant`, `ShareRound`), likewise.
/// Version 4: join tokens for voters (`Command::CreateVoterJoinToken`).
/// Version 5: an exclusive job's placement holds its nodes' every GPU
/// (`workload::WHOLE_NODES_SINCE_PROTOCOL`): a change to what `apply` does
/// with an old command, so it takes effect only once every member speaks 5
/// and every replica applies the placement alike; and holders answer
/// whether a tenant uploaded a chunk to them (`ChunkRequest::Uploaded`).
/// Version 6: a peer region's tenant is adopted over a local tenant of
/// its name only by an admin's `Command::AdoptLocalTenant`
/// (`global_tenants::CONSENT_SINCE_PROTOCOL`), and a checkpoint copy from
/// a peer region is recorded only for a tenant shared across regions
/// (`federation::copies::SHARED_ONLY_SINCE_PROTOCOL`): refusals decided in
/// `apply`, so they take effect once every member speaks 6.
/// Version 7: members renew a lease on the leader (`Request::Renew`) in
/// place of a status query, and the leader judges liveness from those
/// renewals instead of every member hearing every other's gossiped
/// heartbeat; used towards a leader once every member speaks 7.
/// Version 8: a member outside the Raft replicas follows the committed log
/// from a replica (`Request::FollowLog`); the leader bounds its learners
/// (`replicas::SINCE_PROTOCOL`) once every member speaks 8.
pub const PROTOCOL: u16 = 8;
/// The oldest protocol version this build still speaks.
pub const MIN_PROTOCOL: u16 = 1;
/// Test only: overrides the range a process speaks (`min..max`).
pub const TEST_ENV: &str = "SHOAL_TEST_PROTOCOL";
/// ALPN id both sides list last: chosen only when no version is common.
pub const PROBE_ALPN: &[u8] = b"shoal/versions";

/// A contiguous range of protocol versions, both ends included.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Range {
    pub min: u16,
    pub max: u16,
}

impl Range {
    /// What this build speaks, without any override.
    pub const BUILD: Range = Range {
        min: MIN_PROTOCOL,
        max: PROTOCOL,
    };

    pub fn new(min: u16, max: u16) -> Result<Range, String> {
        if min == 0 || min > max {
            return Err(format!(
                "invalid protocol range {min}..{max}: need 1 <= min <= max"
            ));
        }
        Ok(Range { min, max })
    }

    pub fn contains(&self, v: u16) -> bool {
        (self.min..=self.max).contains(&v)
    }

    /// The highest version both ranges contain, if any.
    pub fn common(&self, other: &Range) -> Option<u16> {
        let hi = self.max.min(other.max);
        let lo = self.min.max(other.min);
        (lo <= hi).then_some(hi)
    }

    /// The ALPN ids to offer or accept: every version, highest first, then
    /// [`PROBE_ALPN`].
    pub fn alpn(&self) -> Vec<Vec<u8>> {
        let mut v: Vec<Vec<u8>> = (self.min..=self.max)
            .rev()
            .map(|p| alpn_id(p).into_bytes())
            .collect();
        v.push(PROBE_ALPN.to_vec());
        v
    }
}

impl fmt::Display for Range {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}..{}", self.min, self.max)
    }
}

/// Parses `min..max` (or a single version `v`, meaning `v..v`).
pub fn parse_range(s: &str) -> Result<Range, String> {
    let num = |t: &str| {
        t.trim()
            .parse::<u16>()
            .map_err(|_| format!("invalid protocol range '{s}': expected min..max, e.g. 1..2"))
    };
    match s.split_once("..") {
        Some((a, b)) => Range::new(num(a)?, num(b)?),
        None => {
            let v = num(s)?;
            Range::new(v, v)
        }
    }
}

/// The range the test override names, if it is set: `Err` when it does not
/// parse (a node refuses to start then, see the node's configuration).
pub fn test_override() -> Option<Result<Range, String>> {
    std::env::var(TEST_ENV)
        .ok()
        .filter(|s| !s.trim().is_empty())
        .map(|s| parse_range(&s).map_err(|e| format!("{TEST_ENV}: {e}")))
}

/// The range this process speaks (read once).
pub fn local() -> Range {
    static LOCAL: OnceLock<Range> = OnceLock::new();
    *LOCAL.get_or_init(|| match test_override() {
        Some(Ok(r)) => r,
        Some(Err(e)) => {
            tracing::warn!("{e}; speaking {} instead", Range::BUILD);
            Range::BUILD
        }
        None => Range::BUILD,
    })
}

/// The ALPN id of version `v`.
pub fn alpn_id(v: u16) -> String {
    format!("shoal/{v}")
}

/// The version an ALPN id names; `None` for the probe or anything else.
pub fn version_of_alpn(id: &[u8]) -> Option<u16> {
    std::str::from_utf8(id)
        .ok()?
        .strip_prefix("shoal/")?
        .parse()
        .ok()
}

/// What the handshake settled on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Negotiated {
    Version(u16),
    /// No common version: the connection only carries the range exchange.
    Probe,
}

/// Reads the outcome of the ALPN negotiation off a quinn connection.
pub fn negotiated(conn: &quinn::Connection) -> Option<Negotiated> {
    let data = conn
        .handshake_data()?
        .downcast::<quinn::crypto::rustls::HandshakeData>()
        .ok()?;
    let id = data.protocol.as_deref()?;
    if id == PROBE_ALPN {
        return Some(Negotiated::Probe);
    }
    version_of_alpn(id).map(Negotiated::Version)
}

/// The 4 bytes of the range exchange.
pub fn encode_range(r: Range) -> [u8; 4] {
    let [a, b] = r.min.to_be_bytes();
    let [c, d] = r.max.to_be_bytes();
    [a, b, c, d]
}

pub fn decode_range(bytes: &[u8]) -> Option<Range> {
    match bytes {
        [a, b, c, d] => Range::new(u16::from_be_bytes([*a, *b]), u16::from_be_bytes([*c, *d])).ok(),
        _ => None,
    }
}

/// Two nodes whose ranges do not overlap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    /// The peer's range; `None` when it did not say (a build older than the
    /// range exchange).
    pub peer: Option<Range>,
    pub local: Range,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let peer = match self.peer {
            Some(p) => format!("speaks protocol {p}"),
            None => "speaks no protocol version in this node's range".to_string(),
        };
        let advice = match self.peer {
            Some(p) if p.max < self.local.min => {
                "; it runs an older release: upgrade it, or run a release of this node that still speaks its version"
            }
            Some(p) if p.min > self.local.max => {
                "; it runs a newer release: upgrade this node, or run a release of the peer that still speaks this node's version"
            }
            _ => "; run releases whose protocol ranges overlap",
        };
        write!(
            f,
            "{peer}, this node {} (no common protocol version){advice} (docs/operations.md, Upgrade)",
            self.local
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_parse_and_meet_at_their_highest_common_version() {
        assert_eq!(parse_range("1..2"), Ok(Range { min: 1, max: 2 }));
        assert_eq!(parse_range(" 3 "), Ok(Range { min: 3, max: 3 }));
        assert!(parse_range("2..1").is_err());
        assert!(parse_range("0..1").is_err());
        assert!(parse_range("a..b").is_err());
        let a = Range { min: 1, max: 2 };
        assert_eq!(a.common(&Range { min: 2, max: 3 }), Some(2));
        assert_eq!(a.common(&Range { min: 1, max: 1 }), Some(1));
        assert_eq!(a.common(&Range { min: 3, max: 3 }), None);
        assert_eq!(
            a.alpn(),
            vec![
                b"shoal/2".to_vec(),
                b"shoal/1".to_vec(),
                PROBE_ALPN.to_vec()
            ]
        );
        // Releases before the range exchange offered exactly `shoal/1`.
        assert_eq!(alpn_id(1), "shoal/1");
        assert_eq!(version_of_alpn(b"shoal/1"), Some(1));
        assert_eq!(version_of_alpn(PROBE_ALPN), None);
        assert_eq!(decode_range(&encode_range(a)), Some(a));
        assert_eq!(decode_range(&[0, 2, 0, 1]), None);
        assert_eq!(decode_range(&[1, 2, 3]), None);
    }
}
