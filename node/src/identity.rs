//! What a node keeps in its data dir to restart as itself, and the token
//! formats.
//!
//! - Join token: `sj1.<secret>.<ca-pin>`. The ledger stores BLAKE3(secret);
//!   the pin is the BLAKE3 fingerprint of the cluster CA certificate, so a
//!   joiner can verify whom it talks to before it reveals the secret
//!   (kubeadm's `--discovery-token-ca-cert-hash`, folded into the token).
//! - API token: `sa1.<secret>`; the ledger stores BLAKE3 of the whole token.

use rand::RngCore;
use serde::{Deserialize, Serialize};
use shoal_mesh::NodeCredentials;
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub node_id: u64,
    pub name: String,
    pub cluster_id: String,
    pub credentials: NodeCredentials,
}

pub const IDENTITY_FILE: &str = "identity.json";
pub const ADMIN_TOKEN_FILE: &str = "admin.token";
/// The join token `shoal install --join` leaves for the first start; the
/// agent deletes it once the node has joined.
pub const JOIN_TOKEN_FILE: &str = "join.token";

/// Overwrites and deletes a spent join token. `Ok(false)` when there was
/// none.
pub fn scrub_file(path: &Path) -> std::io::Result<bool> {
    let len = match std::fs::metadata(path) {
        Ok(m) => m.len(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    // Best effort against a copy left in the file system's blocks; the
    // deletion is what matters.
    if let Ok(mut f) = std::fs::OpenOptions::new().write(true).open(path) {
        let _ = f.write_all(&vec![0u8; len.min(1 << 16) as usize]);
        let _ = f.sync_all();
    }
    std::fs::remove_file(path)?;
    Ok(true)
}
pub const RUNTIME_FILE: &str = "agent.json";
pub const RAFT_DB_FILE: &str = "raft.redb";

/// Facts about a running agent, written at start-up so that scripts and tests
/// can find its actual ports.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct RuntimeInfo {
    pub node_id: u64,
    pub name: String,
    pub api_url: String,
    pub rpc_addr: String,
    pub pid: u32,
    /// The cgroup holding this agent's rank cgroups, when it has one.
    #[serde(default)]
    pub rank_cgroups: Option<String>,
}

fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    // ThreadRng is a CSPRNG seeded from the operating system.
    rand::rng().fill_bytes(&mut buf);
    hex::encode(buf)
}

pub fn new_cluster_id() -> String {
    random_hex(8)
}

/// A join token pinned to `ca_pin`, and the hash the ledger keeps.
pub fn new_join_token(ca_pin: &str) -> (String, String) {
    let secret = random_hex(16);
    let hash = hash_secret(&secret);
    (format!("sj1.{secret}.{ca_pin}"), hash)
}

pub struct ParsedJoinToken {
    pub secret_hash: String,
    pub ca_pin: String,
    pub secret: String,
}

pub fn parse_join_token(token: &str) -> Result<ParsedJoinToken, String> {
    let parts: Vec<&str> = token.trim().split('.').collect();
    match parts.as_slice() {
        ["sj1", secret, pin]
            if secret.len() == 32
                && pin.len() == 64
                && secret.chars().all(|c| c.is_ascii_hexdigit())
                && pin.chars().all(|c| c.is_ascii_hexdigit()) =>
        {
            Ok(ParsedJoinToken {
                secret_hash: hash_secret(secret),
                ca_pin: pin.to_ascii_lowercase(),
                secret: secret.to_string(),
            })
        }
        _ => Err("malformed join token: expected sj1.<32 hex>.<64 hex> as printed by `shoal token create`".into()),
    }
}

pub fn hash_secret(secret: &str) -> String {
    shoal_consensus::tokens::hash_secret(secret)
}

pub fn new_api_token() -> (String, String) {
    let token = format!("sa1.{}", random_hex(24));
    let hash = hash_secret(&token);
    (token, hash)
}

/// Writes `bytes` to `path` atomically (temp file, fsync, rename) with the
/// given mode, so a crash never leaves a half-written identity behind.
pub fn write_private(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    // A name of its own, created here and never through a symlink: a
    // directory others can write to cannot plant the file the secret goes
    // into, and two writers cannot interleave.
    let tmp = path.with_extension(format!("tmp-{}-{}", std::process::id(), random_hex(4)));
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW)
            .mode(mode)
            .open(&tmp)?;
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        let written = f.write_all(bytes).and_then(|_| f.sync_all());
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    }
    if let Err(e) = std::fs::rename(&tmp, path) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    if let Some(dir) = path.parent() {
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

/// The data dir holds the node's keys, tokens and ledger: private to the
/// agent whoever created it (jobs live elsewhere: `executor.jobs_dir`).
pub fn ensure_data_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

pub const GOSSIP_KEY_FILE: &str = "gossip.key";

/// The node's libp2p identity (ed25519), created on first start. Peers accept
/// gossip only from the peer id derived from it, as recorded in the ledger.
pub fn load_or_create_gossip_key(dir: &Path) -> Result<shoal_mesh::gossip::Keypair, String> {
    let path = dir.join(GOSSIP_KEY_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => shoal_mesh::gossip::Keypair::from_protobuf_encoding(&bytes)
            .map_err(|e| format!("{} is corrupt: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let key = shoal_mesh::gossip::Keypair::generate_ed25519();
            let bytes = key
                .to_protobuf_encoding()
                .map_err(|e| format!("cannot encode the gossip key: {e}"))?;
            write_private(&path, &bytes, 0o600)
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            Ok(key)
        }
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}

pub fn identity_path(dir: &Path) -> PathBuf {
    dir.join(IDENTITY_FILE)
}

pub fn load_identity(dir: &Path) -> Result<Option<Identity>, String> {
    let p = identity_path(dir);
    match std::fs::read(&p) {
        Ok(b) => serde_json::from_slice(&b)
            .map(Some)
            .map_err(|e| format!("{} is corrupt: {e}", p.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("cannot read {}: {e}", p.display())),
    }
}

/// The member a node joined through: where it first asks for the log
/// while its own ledger names no replica yet (`workers::log_follow`).
pub const JOIN_SEED_FILE: &str = "join-seed";

pub fn save_join_seed(dir: &Path, seed: std::net::SocketAddr) -> Result<(), String> {
    let p = dir.join(JOIN_SEED_FILE);
    std::fs::write(&p, seed.to_string()).map_err(|e| format!("cannot write {}: {e}", p.display()))
}

/// The saved join seed; `None` for a node that bootstrapped its cluster
/// or whose file is missing or unreadable (it then waits for its replicas).
pub fn load_join_seed(dir: &Path) -> Option<std::net::SocketAddr> {
    std::fs::read_to_string(dir.join(JOIN_SEED_FILE))
        .ok()?
        .trim()
        .parse()
        .ok()
}

pub fn save_identity(dir: &Path, id: &Identity) -> Result<(), String> {
    let bytes = serde_json::to_vec_pretty(id).map_err(|e| e.to_string())?;
    write_private(&identity_path(dir), &bytes, 0o600)
        .map_err(|e| format!("cannot write {}: {e}", identity_path(dir).display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_tokens_roundtrip_and_reject_garbage() {
        let pin = "ab".repeat(32);
        let (token, hash) = new_join_token(&pin);
        let p = parse_join_token(&token).expect("parses");
        assert_eq!(p.secret_hash, hash);
        assert_eq!(p.ca_pin, pin);
        for bad in [
            "",
            "sj1.x.y",
            "sj2.00000000000000000000000000000000.00",
            &token.replace("sj1", "xx1"),
        ] {
            assert!(parse_join_token(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_spent_join_token_is_deleted_and_a_missing_one_is_no_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join(JOIN_TOKEN_FILE);
        std::fs::write(&file, "sj1.secret.pin").expect("write");
        assert!(scrub_file(&file).expect("scrub"));
        assert!(!file.exists());
        assert!(!scrub_file(&file).expect("nothing to scrub"));
    }

    #[test]
    fn identity_file_is_private_and_roundtrips() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tmp");
        let ca = shoal_mesh::CaBundle::generate("c").expect("ca");
        let id = Identity {
            node_id: 3,
            name: "n3".into(),
            cluster_id: "c".into(),
            credentials: ca.issue("n3", 3).expect("issue"),
        };
        save_identity(dir.path(), &id).expect("save");
        let mode = std::fs::metadata(identity_path(dir.path()))
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(load_identity(dir.path()).expect("load"), Some(id));
    }
}
