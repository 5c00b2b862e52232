//! The ports a chaos cluster's slots listen on. A slot keeps its ports
//! across a crash and restart, and while it is down nothing of its own
//! holds them: another chaos run on the same machine that probes for a
//! free port may take one, and the restarted slot cannot bind (seed 2303,
//! run four at a time: a restart found its API port taken). So each
//! cluster leases blocks of ports under an advisory file lock that other
//! runs honour, and hands out ports only from its own blocks. The lease
//! ends with the cluster.
//!
//! The blocks lie below the kernel's ephemeral range (32768–60999 by
//! default): a port the kernel handed out for a bind to 0 is free only
//! until the next outgoing connection or QUIC client endpoint on the
//! machine takes it (seeds 360, 517 and 531).

use std::fs::File;
use std::path::PathBuf;
use std::sync::Mutex;

const FIRST_PORT: u16 = 20_000;
const BLOCK: u16 = 100;
const BLOCKS: u16 = 120;

/// Blocks of ports leased by one cluster, and the next unused port.
#[derive(Default)]
pub struct PortLease {
    inner: Mutex<Leased>,
}

#[derive(Default)]
struct Leased {
    /// One held lock per block; dropping a file releases its lock.
    locks: Vec<File>,
    next: u16,
    end: u16,
}

fn lock_dir() -> PathBuf {
    std::env::temp_dir().join("shoal-chaos-ports")
}

impl PortLease {
    /// A port on 127.0.0.1 free now for both TCP and UDP, from this
    /// lease's blocks (a new block is leased when they are used up).
    pub fn port(&self) -> Result<u16, String> {
        let mut leased = self
            .inner
            .lock()
            .map_err(|_| "port lease lock poisoned".to_string())?;
        loop {
            if leased.next >= leased.end {
                lease_block(&mut leased)?;
            }
            let port = leased.next;
            leased.next += 1;
            let tcp = std::net::TcpListener::bind(("127.0.0.1", port));
            let udp = std::net::UdpSocket::bind(("127.0.0.1", port));
            if tcp.is_ok() && udp.is_ok() {
                return Ok(port);
            }
        }
    }
}

/// Takes the first block, from a random start, that no other lease holds
/// (a lock taken through another open of the same file conflicts even in
/// this process, so the blocks this lease holds are skipped too).
fn lease_block(leased: &mut Leased) -> Result<(), String> {
    let dir = lock_dir();
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let start = rand::random_range(0..BLOCKS);
    for k in 0..BLOCKS {
        let block = (start + k) % BLOCKS;
        let first = FIRST_PORT + block * BLOCK;
        let path = dir.join(format!("{first}.lock"));
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        match file.try_lock() {
            Ok(()) => {
                leased.locks.push(file);
                leased.next = first;
                leased.end = first + BLOCK;
                return Ok(());
            }
            Err(std::fs::TryLockError::WouldBlock) => continue,
            Err(std::fs::TryLockError::Error(e)) => return Err(format!("{}: {e}", path.display())),
        }
    }
    Err(format!(
        "every block of ports in {FIRST_PORT}..{} is leased by other runs",
        FIRST_PORT + BLOCKS * BLOCK
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn two_leases_never_hand_out_the_same_port() {
        let a = PortLease::default();
        let b = PortLease::default();
        let mut seen = BTreeSet::new();
        // More than a block each, so both lease a second block.
        for _ in 0..(BLOCK as usize + 10) {
            for lease in [&a, &b] {
                let port = lease.port().expect("a port");
                assert!((FIRST_PORT..FIRST_PORT + BLOCKS * BLOCK).contains(&port));
                assert!(seen.insert(port), "port {port} handed out twice");
            }
        }
        assert_eq!(a.inner.lock().expect("lock").locks.len(), 2);
    }
}
