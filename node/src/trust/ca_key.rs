//! The cluster CA's private keys on this node's disk (`ca.key`, 0600, one
//! PEM block per CA: two while a CA rotation is in progress). Only voters
//! keep them: the leader, always a voter, signs joiners' and renewed
//! certificates with the signing CA's key, and a voter that lacks a trusted
//! CA's key fetches it from another voter over mTLS
//! (`workers::ca_custody`). A node that stops being a voter deletes the
//! file once another voter is known to hold every key; a retired CA's key
//! is deleted by every node.

use crate::identity;
use crate::proto::{ErrorCode, WireError};
use shoal_mesh::CaBundle;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

pub const CA_KEY_FILE: &str = "ca.key";

/// Serializes the read-modify-write of key files (the custody loop and a
/// rotation's start may both write one).
static WRITING: Mutex<()> = Mutex::new(());

fn path(data_dir: &Path) -> PathBuf {
    data_dir.join(CA_KEY_FILE)
}

/// The key file as it is, if this node holds any CA key.
pub fn load(data_dir: &Path) -> Option<String> {
    std::fs::read_to_string(path(data_dir))
        .ok()
        .filter(|k| !k.trim().is_empty())
}

/// Each private key (PEM) this node holds.
pub fn keys(data_dir: &Path) -> Vec<String> {
    load(data_dir).map(|f| split_keys(&f)).unwrap_or_default()
}

pub fn split_keys(file: &str) -> Vec<String> {
    const END: &str = "-----END PRIVATE KEY-----";
    let mut out = Vec::new();
    let mut rest = file;
    while let Some(start) = rest.find("-----BEGIN PRIVATE KEY-----") {
        let Some(stop) = rest[start..].find(END) else {
            break;
        };
        let end = start + stop + END.len();
        out.push(format!("{}\n", &rest[start..end]));
        rest = &rest[end..];
    }
    out
}

/// The key of the CA whose certificate is `cert_pem`, if this node holds it.
pub fn key_for(data_dir: &Path, cert_pem: &str) -> Option<String> {
    keys(data_dir).into_iter().find(|key_pem| {
        CaBundle {
            cert_pem: cert_pem.to_string(),
            key_pem: key_pem.clone(),
        }
        .key_matches()
    })
}

fn write(data_dir: &Path, keys: &[String]) -> std::io::Result<()> {
    if keys.is_empty() {
        return match std::fs::remove_file(path(data_dir)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        };
    }
    identity::write_private(&path(data_dir), keys.concat().as_bytes(), 0o600)
}

/// Replaces whatever the file held with `key_pem` (a new cluster).
pub fn store(data_dir: &Path, key_pem: &str) -> std::io::Result<()> {
    let _guard = WRITING.lock().unwrap_or_else(|e| e.into_inner());
    write(data_dir, &split_keys(key_pem))
}

/// Adds `key_pem` to the keys this node holds (a rotation's new CA).
pub fn add(data_dir: &Path, key_pem: &str) -> std::io::Result<()> {
    let _guard = WRITING.lock().unwrap_or_else(|e| e.into_inner());
    let mut held = keys(data_dir);
    for key in split_keys(key_pem) {
        if !held.contains(&key) {
            held.push(key);
        }
    }
    write(data_dir, &held)
}

/// Keeps only the keys `keep` accepts; returns how many were deleted.
pub fn retain(data_dir: &Path, keep: impl Fn(&str) -> bool) -> std::io::Result<usize> {
    let _guard = WRITING.lock().unwrap_or_else(|e| e.into_inner());
    let held = keys(data_dir);
    let kept: Vec<String> = held.iter().filter(|k| keep(k)).cloned().collect();
    if kept.len() == held.len() {
        return Ok(0);
    }
    write(data_dir, &kept)?;
    Ok(held.len() - kept.len())
}

pub fn remove(data_dir: &Path) -> std::io::Result<()> {
    let _guard = WRITING.lock().unwrap_or_else(|e| e.into_inner());
    write(data_dir, &[])
}

/// The cluster CA as this node can sign with it: the certificate from the
/// ledger, the key from its own disk.
pub fn signing_ca(data_dir: &Path, ca_cert_pem: &str) -> Result<CaBundle, WireError> {
    let key_pem = key_for(data_dir, ca_cert_pem).ok_or_else(|| {
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
        let ca = CaBundle::generate("c").expect("ca");
        assert!(load(dir.path()).is_none());
        assert!(signing_ca(dir.path(), &ca.cert_pem).is_err());
        store(dir.path(), &ca.key_pem).expect("store");
        assert!(load(dir.path()).is_some_and(|k| k.contains("PRIVATE KEY")));
        assert!(signing_ca(dir.path(), &ca.cert_pem).is_ok());
        let mode = std::fs::metadata(path(dir.path()))
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        remove(dir.path()).expect("remove");
        remove(dir.path()).expect("removing twice is fine");
        assert!(load(dir.path()).is_none());
    }

    #[test]
    fn keys_of_two_cas_are_held_side_by_side_and_one_is_dropped() {
        let dir = tempfile::tempdir().expect("dir");
        let old = CaBundle::generate("c").expect("ca");
        let new = CaBundle::generate_next("c", 1).expect("ca");
        store(dir.path(), &old.key_pem).expect("store");
        add(dir.path(), &new.key_pem).expect("add");
        add(dir.path(), &new.key_pem).expect("adding twice keeps one copy");
        assert_eq!(keys(dir.path()).len(), 2);
        assert!(key_for(dir.path(), &old.cert_pem).is_some());
        assert!(key_for(dir.path(), &new.cert_pem).is_some());
        assert_ne!(
            key_for(dir.path(), &old.cert_pem),
            key_for(dir.path(), &new.cert_pem)
        );
        let retired = |k: &str| {
            CaBundle {
                cert_pem: old.cert_pem.clone(),
                key_pem: k.to_string(),
            }
            .key_matches()
        };
        assert_eq!(retain(dir.path(), |k| !retired(k)).expect("retain"), 1);
        assert_eq!(key_for(dir.path(), &old.cert_pem), None);
        assert!(signing_ca(dir.path(), &new.cert_pem).is_ok());
        assert_eq!(retain(dir.path(), |_| false).expect("retain"), 1);
        assert!(load(dir.path()).is_none(), "no key left, no file");
    }
}
