//! The ledger backup file that `shoal snapshot save` writes and `shoal
//! snapshot restore` reads:
//!
//! ```text
//! shoal-ledger-snapshot\n          magic line
//! {"format":1,"cluster_id":...}\n   header: one line of JSON (below)
//! <body>                            the store's snapshot encoding
//! ```
//!
//! The body is exactly what the Raft store keeps as its snapshot
//! (`shoal_consensus::store::encode_snapshot`: a version byte, then the
//! zstd-compressed ledger), so a backup restores with the code that loads
//! every snapshot. The header names the cluster, the log index and term
//! the ledger is as of, when and where it was taken, the body's length and
//! its BLAKE3 checksum; a reader checks all of them, and that the body
//! agrees with the header, before it trusts a byte.

use serde::{Deserialize, Serialize};
use shoal_consensus::store::{self, StateMachineData};
use std::path::Path;

/// The first line of every backup file.
pub const MAGIC: &[u8] = b"shoal-ledger-snapshot\n";
/// The header's format; a reader refuses a newer one.
pub const FORMAT: u32 = 1;
/// Longest header line accepted.
const MAX_HEADER: usize = 64 * 1024;
/// Largest body accepted (the store's own decoding bound).
pub const MAX_BODY: u64 = store::MAX_DECODE;

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub format: u32,
    pub cluster_id: String,
    pub region: String,
    /// The log index (and its term) the ledger is as of: every entry up
    /// to it is in the body, none after it.
    pub index: u64,
    pub term: u64,
    pub created_at_ms: u64,
    /// `created_at_ms` in RFC 3339, for people.
    pub created_at: String,
    /// The node that served it.
    pub node: String,
    /// The store's snapshot format version (the body's first byte).
    pub encoding: u8,
    pub body_bytes: u64,
    /// BLAKE3 of the body, hex.
    pub body_blake3: String,
}

/// A backup file's bytes for `data`, taken on `node` at `now_ms`.
pub fn encode(
    data: &StateMachineData,
    node: &str,
    now_ms: u64,
) -> Result<(Header, Vec<u8>), String> {
    let at = data
        .last_applied
        .ok_or("the ledger is empty: there is nothing to save")?;
    let cluster = data
        .ledger
        .cluster
        .as_ref()
        .ok_or("the ledger has no cluster record yet: there is nothing to save")?;
    let body = store::encode_snapshot(data).map_err(|e| e.to_string())?;
    let header = Header {
        format: FORMAT,
        cluster_id: cluster.cluster_id.clone(),
        region: cluster.region.clone(),
        index: at.index,
        term: at.leader_id.term,
        created_at_ms: now_ms,
        created_at: crate::clock::rfc3339(now_ms),
        node: node.to_string(),
        encoding: body.first().copied().unwrap_or_default(),
        body_bytes: body.len() as u64,
        body_blake3: blake3::hash(&body).to_hex().to_string(),
    };
    let line = serde_json::to_string(&header).map_err(|e| e.to_string())?;
    let mut out = Vec::with_capacity(MAGIC.len() + line.len() + 1 + body.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(line.as_bytes());
    out.push(b'\n');
    out.extend_from_slice(&body);
    Ok((header, out))
}

/// Checks a backup's bytes (`what` names them in errors: the file) and
/// decodes the ledger in them.
pub fn decode(bytes: &[u8], what: &str) -> Result<(Header, StateMachineData), String> {
    let rest = bytes.strip_prefix(MAGIC).ok_or_else(|| {
        format!("{what} is not a Shoal ledger snapshot (it does not start with 'shoal-ledger-snapshot')")
    })?;
    let end = rest
        .iter()
        .take(MAX_HEADER)
        .position(|b| *b == b'\n')
        .ok_or_else(|| format!("{what} is truncated or damaged: its header line does not end"))?;
    let (line, body) = (&rest[..end], &rest[end + 1..]);
    // The format first, on its own, so that a newer header with fields
    // this release does not know is named as newer, not as damaged.
    #[derive(Deserialize)]
    struct Format {
        format: u32,
    }
    let format: Format =
        serde_json::from_slice(line).map_err(|e| format!("{what} has a damaged header: {e}"))?;
    if format.format > FORMAT {
        return Err(format!(
            "{what} is snapshot format {}, newer than this shoal reads ({FORMAT}): restore it with a newer shoal",
            format.format
        ));
    }
    let header: Header =
        serde_json::from_slice(line).map_err(|e| format!("{what} has a damaged header: {e}"))?;
    if header.body_bytes > MAX_BODY {
        return Err(format!(
            "{what} claims a ledger of {} bytes, more than the {MAX_BODY} this shoal accepts",
            header.body_bytes
        ));
    }
    let have = body.len() as u64;
    if have < header.body_bytes {
        return Err(format!(
            "{what} is truncated: its header promises {} bytes of ledger, it holds {have}",
            header.body_bytes
        ));
    }
    if have > header.body_bytes {
        return Err(format!(
            "{what} is damaged: {} bytes follow the {} bytes of ledger its header promises",
            have - header.body_bytes,
            header.body_bytes
        ));
    }
    let sum = blake3::hash(body).to_hex().to_string();
    if !sum.eq_ignore_ascii_case(&header.body_blake3) {
        return Err(format!(
            "{what} is corrupt: its ledger's BLAKE3 checksum is {sum}, the header says {}",
            header.body_blake3
        ));
    }
    let data = store::decode_snapshot(body).map_err(|e| format!("{what}: {e}"))?;
    let at = data.last_applied;
    let cluster_id = data.ledger.cluster.as_ref().map(|c| c.cluster_id.as_str());
    if at.map(|l| (l.index, l.leader_id.term)) != Some((header.index, header.term))
        || cluster_id != Some(header.cluster_id.as_str())
    {
        return Err(format!(
            "{what} is damaged: its header (cluster {}, index {}) does not match the ledger in it",
            header.cluster_id, header.index
        ));
    }
    Ok((header, data))
}

/// Reads and checks the backup file at `path`.
pub fn read_file(path: &Path) -> Result<(Header, StateMachineData), String> {
    let what = path.display().to_string();
    let len = std::fs::metadata(path)
        .map_err(|e| format!("cannot read {what}: {e}"))?
        .len();
    let bound = MAX_BODY + (MAGIC.len() + MAX_HEADER + 1) as u64;
    if len > bound {
        return Err(format!(
            "{what} is {len} bytes, larger than any ledger snapshot this shoal accepts"
        ));
    }
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {what}: {e}"))?;
    decode(&bytes, &what)
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_consensus::ledger::{ClusterInfo, Ledger};
    use shoal_consensus::types::LogId;

    fn data() -> StateMachineData {
        let mut ledger = Ledger::new();
        ledger.cluster = Some(ClusterInfo {
            cluster_id: "c0ffee".into(),
            region: "eu".into(),
            ca_cert_pem: "ca".into(),
            created_at_ms: 1,
        });
        ledger.attrs.insert("k".into(), "v".into());
        StateMachineData {
            last_applied: Some(LogId::new(openraft::CommittedLeaderId::new(7, 1), 42)),
            membership: Default::default(),
            ledger,
        }
    }

    #[test]
    fn a_backup_roundtrips_with_its_header() {
        let (header, bytes) = encode(&data(), "n1", 1_700_000_000_000).expect("encode");
        assert_eq!(header.index, 42);
        assert_eq!(header.term, 7);
        assert_eq!(header.cluster_id, "c0ffee");
        assert_eq!(header.encoding, store::SNAPSHOT_VERSION);
        assert!(header.created_at.starts_with("2023-11-14T"), "{header:?}");
        let (h, d) = decode(&bytes, "f").expect("decode");
        assert_eq!(h, header);
        assert_eq!(d.ledger, data().ledger);
        assert_eq!(d.last_applied, data().last_applied);
    }

    #[test]
    fn damage_anywhere_is_refused_with_a_reason() {
        let (header, bytes) = encode(&data(), "n1", 5).expect("encode");
        let body_at = bytes.len() - header.body_bytes as usize;
        let refused = |b: &[u8], why: &str| {
            let e = decode(b, "f").expect_err(why);
            assert!(e.contains(why), "{why}: {e}");
        };
        refused(&bytes[..bytes.len() - 1], "truncated");
        refused(&bytes[..body_at - 3], "truncated or damaged");
        refused(b"hello\n", "not a Shoal ledger snapshot");
        let mut flipped = bytes.clone();
        flipped[body_at + 5] ^= 1;
        refused(&flipped, "corrupt");
        let mut longer = bytes.clone();
        longer.push(0);
        refused(&longer, "follow");
        // A header that lies about the index it covers.
        let text =
            String::from_utf8_lossy(&bytes[..body_at]).replace("\"index\":42", "\"index\":43");
        let mut lying = text.into_bytes();
        lying.extend_from_slice(&bytes[body_at..]);
        refused(&lying, "does not match");
        // A newer file format, and a newer store encoding inside.
        let text =
            String::from_utf8_lossy(&bytes[..body_at]).replace("\"format\":1", "\"format\":2");
        let mut newer = text.into_bytes();
        newer.extend_from_slice(&bytes[body_at..]);
        refused(&newer, "newer than this shoal reads");
        let mut body = bytes[body_at..].to_vec();
        body[0] = store::SNAPSHOT_VERSION + 1;
        let sum = blake3::hash(&body).to_hex().to_string();
        let text = String::from_utf8_lossy(&bytes[..body_at]).replace(&header.body_blake3, &sum);
        let mut inner = text.into_bytes();
        inner.extend_from_slice(&body);
        refused(&inner, "newer than this binary understands");
    }
}
