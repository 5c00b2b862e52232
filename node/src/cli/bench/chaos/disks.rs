//! A file system of its own per node, so one node's disk can fill up while
//! the others' do not: a small tmpfs per slot holding the node's data dir
//! and its jobs dir, as one machine's disk would. Filling it is a ballast
//! file that takes every free block, so the node's next write (a Raft log
//! append, a chunk, a rank's checkpoint) fails with ENOSPC; healing removes
//! the ballast. Mounting needs root (CAP_SYS_ADMIN), which is why the
//! `disk-full` kind is drawn only when asked for.

use std::ffi::CString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Each node's file system: room for its ledger, chunks and job dirs in a
/// short run, and little memory when filled (tmpfs pages are RAM).
const DISK_BYTES: u64 = 192 << 20;
const BALLAST: &str = ".ballast";

/// The mounted file systems of a run, by slot; unmounted on drop.
pub struct Disks {
    mounts: Vec<PathBuf>,
}

impl Disks {
    /// Mounts one tmpfs per slot under `root` (`disk0`, `disk1`, ...).
    pub fn mount(root: &Path, slots: usize) -> Result<Disks, String> {
        let mut disks = Disks { mounts: Vec::new() };
        for slot in 0..slots {
            let dir = root.join(format!("disk{slot}"));
            std::fs::create_dir_all(&dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            mount_tmpfs(&dir)?;
            disks.mounts.push(dir);
        }
        Ok(disks)
    }

    /// Where slot `slot`'s node keeps its data dir and jobs dir.
    pub fn of(&self, slot: usize) -> Option<&Path> {
        self.mounts.get(slot).map(PathBuf::as_path)
    }

    /// Takes every free byte of slot `slot`'s file system.
    pub fn fill(&self, slot: usize) -> Result<u64, String> {
        let dir = self.of(slot).ok_or("no such disk")?;
        let free = free_bytes(dir)?;
        let path = dir.join(BALLAST);
        let mut file = std::fs::File::create(&path)
            .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        // Written rather than fallocated: every tmpfs counts written pages,
        // and a write that stops at ENOSPC leaves exactly nothing free.
        let block = vec![0u8; 1 << 20];
        let mut taken = 0u64;
        while taken < free + (1 << 20) {
            match file.write(&block) {
                Ok(0) => break,
                Ok(n) => taken += n as u64,
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => return Err(format!("cannot fill {}: {e}", path.display())),
            }
        }
        Ok(taken)
    }

    /// Gives slot `slot`'s file system its room back.
    pub fn free(&self, slot: usize) {
        if let Some(dir) = self.of(slot) {
            let _ = std::fs::remove_file(dir.join(BALLAST));
        }
    }
}

impl Drop for Disks {
    fn drop(&mut self) {
        for dir in &self.mounts {
            if let Ok(c) = CString::new(dir.as_os_str().as_bytes()) {
                // SAFETY: a plain syscall on a path this run mounted.
                unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
            }
        }
    }
}

fn mount_tmpfs(dir: &Path) -> Result<(), String> {
    let target = CString::new(dir.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
    let source = CString::new("shoal-chaos").map_err(|e| e.to_string())?;
    let fstype = CString::new("tmpfs").map_err(|e| e.to_string())?;
    let data = CString::new(format!("size={DISK_BYTES},mode=0755")).map_err(|e| e.to_string())?;
    // SAFETY: every pointer is a NUL-terminated string that outlives the call.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            data.as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(format!(
            "cannot mount a tmpfs on {} (disk-full faults need root): {}",
            dir.display(),
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

fn free_bytes(dir: &Path) -> Result<u64, String> {
    let c = CString::new(dir.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: statvfs fills the struct it is given.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid C string and `st` a struct statvfs fills.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(format!(
            "cannot statvfs {}: {}",
            dir.display(),
            std::io::Error::last_os_error()
        ));
    }
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
}
