//! The cluster CA's private key on this node's disk (`ca.key`, 0600). Only
//! voters keep it: the leader, always a voter, signs joiners' and renewed
//! certificates with it, and a voter that lacks it fetches it from another
//! voter over mTLS (`workers::ca_custody`). A node that stops being a voter
//! deletes it once another voter is known to hold it.

use super::identity;
use crate::rpc::proto::{ErrorCode, WireError};
use shoal_mesh::CaBundle;
use std::path::{Path, PathBuf};

pub const CA_KEY_FILE: &str = "ca.key";

fn path(data_dir: &Path) -> PathBuf {
    data_dir.join(CA_KEY_FILE)
}

/// The CA key this node holds, if it holds one.
pub fn load(data_dir: &Path) -> Option<String> {
    std::fs::read_to_string(path(data_dir))
        .ok()
        .filter(|k| !k.trim().is_empty())
}

pub fn store(data_dir: &Path, key_pem: &str) -> std::io::Result<()> {
    identity::write_private(&path(data_dir), key_pem.as_bytes(), 0o600)
}

pub fn remove(data_dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path(data_dir)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// The cluster CA as this node can sign with it: the certificate from the
/// ledger, the key from its own disk.
pub fn signing_ca(data_dir: &Path, ca_cert_pem: &str) -> Result<CaBundle, WireError> {
    let key_pem = load(data_dir).ok_or_else(|| {
        WireError::new(
            ErrorCode::Unavailable,
            "this node does not hold the cluster CA key yet (it is handed to new voters within seconds); retry",
        )
    })?;
    Ok(CaBundle {
        cert_pem: ca_cert_pem.to_string(),
        key_pem,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_key_is_private_and_removable() {
        let dir = tempfile::tempdir().expect("dir");
        assert!(load(dir.path()).is_none());
        assert!(signing_ca(dir.path(), "cert").is_err());
        store(dir.path(), "KEY").expect("store");
        assert_eq!(load(dir.path()).as_deref(), Some("KEY"));
        let mode = std::fs::metadata(path(dir.path()))
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        remove(dir.path()).expect("remove");
        remove(dir.path()).expect("removing twice is fine");
        assert!(load(dir.path()).is_none());
    }
}
