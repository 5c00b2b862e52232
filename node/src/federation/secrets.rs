//! The secrets this region presents to its peer regions, kept out of the
//! ledger: each node holds them in
//! `<data-dir>/federation/<region>-<hash prefix>.secret` (0600 in a 0700
//! directory), and the ledger only their hashes
//! (`PeerRegion::outbound_secret_hash`). A node that lacks one fetches it
//! from another member over member TLS (`Request::FetchPeerSecret`) and
//! keeps it only if it matches the ledger's hash; a record an older
//! release wrote holds the secret itself, which is used as it is and kept
//! on disk until the leader seals it.

use shoal_consensus::federation::{is_clear_secret, PeerRegion};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The folder of the secrets, under a node's data directory.
pub fn dir(data_dir: &Path) -> PathBuf {
    data_dir.join("federation")
}

/// Hex digits of a secret's hash in its file's name.
const HASH_IN_NAME: usize = 16;

/// How long a file the ledger does not (yet) name is kept: the node that
/// makes a join writes the secret before the record commits.
const UNNAMED_GRACE: Duration = Duration::from_secs(600);

/// Where the secret for peer `region` whose hash is `hash` is kept: named
/// by both, so that a repeated join writes a file of its own and never
/// overwrites the one the ledger names until its record commits. Region
/// names are DNS labels (`validate_region_name`), so they are safe file
/// names; the hash is hex.
pub fn path(data_dir: &Path, region: &str, hash: &str) -> PathBuf {
    let short: String = hash.chars().take(HASH_IN_NAME).collect();
    dir(data_dir).join(format!("{region}-{short}.secret"))
}

/// The secret this node presents to `peer`, if it holds the one the
/// ledger names: the record's own for a record an older release wrote,
/// else the file, when its hash matches.
pub fn load(data_dir: &Path, peer: &PeerRegion) -> Option<String> {
    if is_clear_secret(&peer.outbound_secret_hash) {
        return Some(peer.outbound_secret_hash.clone());
    }
    let secret =
        std::fs::read_to_string(path(data_dir, &peer.name, &peer.outbound_secret_hash)).ok()?;
    let secret = secret.trim().to_string();
    matches(&secret, peer).then_some(secret)
}

/// Whether `secret` is the one the ledger's record of `peer` names.
pub fn matches(secret: &str, peer: &PeerRegion) -> bool {
    !secret.is_empty()
        && (shoal_consensus::tokens::hash_secret(secret) == peer.outbound_secret_hash
            || secret == peer.outbound_secret_hash && is_clear_secret(secret))
}

/// Keeps `secret` for `region` (0600, written atomically), under the
/// name its hash gives it.
pub fn store(data_dir: &Path, region: &str, secret: &str) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let dir = dir(data_dir);
    std::fs::create_dir_all(&dir)?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
    let hash = shoal_consensus::tokens::hash_secret(secret);
    crate::identity::write_private(&path(data_dir, region, &hash), secret.as_bytes(), 0o600)
}

/// Forgets the secrets the ledger no longer names (a former peer's, or
/// one a repeated join replaced), once they are older than a join takes
/// to commit.
pub fn prune(data_dir: &Path, peers: &[PeerRegion]) {
    let Ok(entries) = std::fs::read_dir(dir(data_dir)) else {
        return;
    };
    let named: Vec<PathBuf> = peers
        .iter()
        .map(|p| path(data_dir, &p.name, &p.outbound_secret_hash))
        .collect();
    for entry in entries.flatten() {
        let file = entry.path();
        if named.contains(&file) {
            continue;
        }
        let young = entry
            .metadata()
            .and_then(|m| m.modified())
            .is_ok_and(|at| at.elapsed().is_ok_and(|age| age < UNNAMED_GRACE));
        if young {
            continue;
        }
        if let Err(e) = std::fs::remove_file(&file) {
            tracing::warn!(file = %file.display(), error = %e, "cannot remove a secret the ledger no longer names");
        }
    }
}

/// Deletes every secret kept here: a node removed from its cluster keeps
/// no credential that acts as the region.
pub fn forget_all(data_dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(dir(data_dir)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
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
        let file = path(data.path(), "eu-1", &sealed.outbound_secret_hash);
        let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode(&file), 0o600);
        assert_eq!(mode(&dir(data.path())), 0o700);
        // A repeated join writes its own file: the one the ledger names
        // stays until the new record commits.
        store(data.path(), "eu-1", "sa1.ffff").expect("store");
        assert_eq!(load(data.path(), &sealed).as_deref(), Some(secret));
        let other = peer(&shoal_consensus::tokens::hash_secret("sa1.ffff"));
        assert_eq!(load(data.path(), &other).as_deref(), Some("sa1.ffff"));
        // A file whose content the ledger does not name is not used.
        std::fs::write(&file, "sa1.0000").expect("overwrite");
        assert_eq!(load(data.path(), &sealed), None);
        // A record of an older release carries the secret itself.
        assert_eq!(load(data.path(), &peer(secret)).as_deref(), Some(secret));
        assert!(matches(secret, &peer(secret)));
        assert!(!matches("", &peer("")));
        // Files the ledger does not name go once they are old; young ones
        // (a join not committed yet) stay.
        prune(data.path(), std::slice::from_ref(&other));
        assert!(file.exists(), "young");
        let old = std::time::SystemTime::now() - 2 * UNNAMED_GRACE;
        std::fs::File::options()
            .write(true)
            .open(&file)
            .and_then(|f| f.set_modified(old))
            .expect("age the file");
        prune(data.path(), std::slice::from_ref(&other));
        assert!(!file.exists(), "old and not named");
        assert!(path(data.path(), "eu-1", &other.outbound_secret_hash).exists());
        forget_all(data.path()).expect("forget");
        assert!(!dir(data.path()).exists());
        forget_all(data.path()).expect("nothing left to forget");
    }
}
