//! The secrets this region presents to its peer regions, kept out of the
//! ledger: each node holds them in `<data-dir>/federation/<region>.secret`
//! (0600 in a 0700 directory), and the ledger only their hashes
//! (`PeerRegion::outbound_secret_hash`). A node that lacks one fetches it
//! from another member over member TLS (`Request::FetchPeerSecret`) and
//! keeps it only if it matches the ledger's hash; a record an older
//! release wrote holds the secret itself, which is used as it is and kept
//! on disk until the leader seals it.

use shoal_consensus::federation::{is_clear_secret, PeerRegion};
use std::path::{Path, PathBuf};

/// The folder of the secrets, under a node's data directory.
pub fn dir(data_dir: &Path) -> PathBuf {
    data_dir.join("federation")
}

/// Where the secret for peer `region` is kept. Region names are DNS
/// labels (`validate_region_name`), so they are safe file names.
pub fn path(data_dir: &Path, region: &str) -> PathBuf {
    dir(data_dir).join(format!("{region}.secret"))
}

/// The secret this node presents to `peer`, if it holds the one the
/// ledger names: the record's own for a record an older release wrote,
/// else the file, when its hash matches.
pub fn load(data_dir: &Path, peer: &PeerRegion) -> Option<String> {
    if is_clear_secret(&peer.outbound_secret_hash) {
        return Some(peer.outbound_secret_hash.clone());
    }
    let secret = std::fs::read_to_string(path(data_dir, &peer.name)).ok()?;
    let secret = secret.trim().to_string();
    matches(&secret, peer).then_some(secret)
}

/// Whether `secret` is the one the ledger's record of `peer` names.
pub fn matches(secret: &str, peer: &PeerRegion) -> bool {
    !secret.is_empty()
        && (shoal_consensus::tokens::hash_secret(secret) == peer.outbound_secret_hash
            || secret == peer.outbound_secret_hash && is_clear_secret(secret))
}

/// Keeps `secret` for `region` (0600, written atomically).
pub fn store(data_dir: &Path, region: &str, secret: &str) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let dir = dir(data_dir);
    std::fs::create_dir_all(&dir)?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
    crate::node::identity::write_private(&path(data_dir, region), secret.as_bytes(), 0o600)
}

/// Forgets the secrets of regions that are no longer peers.
pub fn prune(data_dir: &Path, peers: &[PeerRegion]) {
    let Ok(entries) = std::fs::read_dir(dir(data_dir)) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(region) = name.strip_suffix(".secret") else {
            continue;
        };
        if !peers.iter().any(|p| p.name == region) {
            if let Err(e) = std::fs::remove_file(entry.path()) {
                tracing::warn!(%region, error = %e, "cannot remove a former peer's secret");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn peer(hash: &str) -> PeerRegion {
        PeerRegion {
            name: "eu-1".into(),
            cluster_id: "c".into(),
            ca_cert_pem: "pem".into(),
            api_urls: vec!["https://10.0.0.1:7070".into()],
            outbound_secret_hash: hash.into(),
            inbound_token_hash: "h".into(),
            joined_at_ms: 0,
        }
    }

    #[test]
    fn a_secret_is_kept_private_and_used_only_if_the_ledger_names_it() {
        let data = tempfile::tempdir().expect("tempdir");
        let secret = "sa1.0123456789abcdef";
        let sealed = peer(&shoal_consensus::tokens::hash_secret(secret));
        assert_eq!(load(data.path(), &sealed), None, "nothing kept yet");
        store(data.path(), "eu-1", secret).expect("store");
        assert_eq!(load(data.path(), &sealed).as_deref(), Some(secret));
        let mode = |p: PathBuf| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode(path(data.path(), "eu-1")), 0o600);
        assert_eq!(mode(dir(data.path())), 0o700);
        // Another secret on disk than the ledger names: not used.
        store(data.path(), "eu-1", "sa1.ffff").expect("store");
        assert_eq!(load(data.path(), &sealed), None);
        // A record of an older release carries the secret itself.
        assert_eq!(load(data.path(), &peer(secret)).as_deref(), Some(secret));
        assert!(matches(secret, &peer(secret)));
        assert!(!matches("", &peer("")));
        // A former peer's secret goes.
        prune(data.path(), &[]);
        assert!(!path(data.path(), "eu-1").exists());
    }
}
