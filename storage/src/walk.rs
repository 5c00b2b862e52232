//! Opening the entries of a tree through their parent directory's
//! descriptor, never by path, and never following a symlink. The agent
//! captures checkpoints from directories a job writes to while it may still
//! run: a job that swaps an entry (or a directory above it) for a symlink
//! between the walk's check and its read must not make the agent read
//! anything outside the tree. Every entry is examined with `fstatat` and
//! opened with `openat(O_NOFOLLOW)`, and the opened file must be the very
//! inode that was examined.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// What an entry is, as `fstatat` saw it without following links.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
    Symlink,
    Special,
}

/// A directory of the tree, held open.
pub struct Dir {
    fd: File,
}

impl Dir {
    /// The tree's root. The path up to it is the caller's choice; the root
    /// itself is not followed if it is a link (a job may replace its step
    /// directory by one), so a caller taking a user's path resolves it
    /// first (`fs::canonicalize`).
    pub fn open_root(path: &Path) -> io::Result<Dir> {
        let c = cstring(path.as_os_str().as_bytes())?;
        // SAFETY: a valid NUL-terminated path; the returned fd is owned below.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        owned(fd).map(|fd| Dir { fd })
    }

    /// The names in this directory (not `.` or `..`), listed through its
    /// descriptor, so a rename of the directory itself changes nothing.
    pub fn names(&self) -> io::Result<Vec<std::ffi::OsString>> {
        let listing = PathBuf::from(format!("/proc/self/fd/{}", self.fd.as_raw_fd()));
        std::fs::read_dir(listing)?
            .map(|e| e.map(|e| e.file_name()))
            .collect()
    }

    /// What `name` is, without following it if it is a link.
    pub fn kind(&self, name: &std::ffi::OsStr) -> io::Result<(Kind, libc::stat)> {
        let c = cstring(name.as_bytes())?;
        // SAFETY: zeroed is a valid `stat`; fstatat fills it on success.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: valid fd, NUL-terminated name, and a writable stat.
        let rc = unsafe {
            libc::fstatat(
                self.fd.as_raw_fd(),
                c.as_ptr(),
                &mut st,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        let kind = match st.st_mode & libc::S_IFMT {
            libc::S_IFDIR => Kind::Dir,
            libc::S_IFREG => Kind::File,
            libc::S_IFLNK => Kind::Symlink,
            _ => Kind::Special,
        };
        Ok((kind, st))
    }

    /// Opens the subdirectory `name`, which must still be the directory
    /// `seen` describes.
    pub fn open_dir(&self, name: &std::ffi::OsStr, seen: &libc::stat) -> io::Result<Dir> {
        let fd = self.open_at(name, libc::O_DIRECTORY)?;
        same_inode(&fd, seen)?;
        Ok(Dir { fd })
    }

    /// Opens the regular file `name` for reading, which must still be the
    /// file `seen` describes.
    pub fn open_file(&self, name: &std::ffi::OsStr, seen: &libc::stat) -> io::Result<File> {
        // O_NONBLOCK: a FIFO swapped in cannot block the walk; it then
        // fails the inode check.
        let file = self.open_at(name, libc::O_NONBLOCK)?;
        same_inode(&file, seen)?;
        Ok(file)
    }

    fn open_at(&self, name: &std::ffi::OsStr, extra: libc::c_int) -> io::Result<File> {
        let c = cstring(name.as_bytes())?;
        // SAFETY: valid fd and NUL-terminated name; the fd is owned below.
        let fd = unsafe {
            libc::openat(
                self.fd.as_raw_fd(),
                c.as_ptr(),
                libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC | extra,
            )
        };
        owned(fd)
    }
}

fn cstring(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in a path"))
}

fn owned(fd: libc::c_int) -> io::Result<File> {
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    Ok(unsafe { File::from_raw_fd(fd) })
}

// `st_dev` and `st_ino` are not u64 on every target.
#[allow(clippy::unnecessary_cast)]
fn same_inode(opened: &File, seen: &libc::stat) -> io::Result<()> {
    let now = opened.metadata()?;
    if now.dev() != seen.st_dev as u64 || now.ino() != seen.st_ino as u64 {
        return Err(io::Error::other(
            "the entry was replaced while the tree was read",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_seen_without_following_links() {
        let dir = tempfile::tempdir().expect("dir");
        std::fs::create_dir(dir.path().join("sub")).expect("sub");
        std::fs::write(dir.path().join("sub/f"), b"x").expect("f");
        std::os::unix::fs::symlink("/etc", dir.path().join("link")).expect("link");
        let root = Dir::open_root(dir.path()).expect("root");
        let mut names = root.names().expect("names");
        names.sort();
        assert_eq!(names, vec!["link", "sub"]);
        assert_eq!(root.kind("link".as_ref()).expect("kind").0, Kind::Symlink);
        let (kind, st) = root.kind("sub".as_ref()).expect("kind");
        assert_eq!(kind, Kind::Dir);
        let sub = root.open_dir("sub".as_ref(), &st).expect("sub");
        let (kind, st) = sub.kind("f".as_ref()).expect("kind");
        assert_eq!(kind, Kind::File);
        sub.open_file("f".as_ref(), &st).expect("open");
    }

    #[test]
    fn a_root_that_is_a_link_is_not_followed() {
        let dir = tempfile::tempdir().expect("dir");
        std::os::unix::fs::symlink("/etc", dir.path().join("999")).expect("link");
        assert!(Dir::open_root(&dir.path().join("999")).is_err());
        assert!(Dir::open_root(dir.path()).is_ok());
    }

    #[test]
    fn an_entry_swapped_for_a_link_after_the_check_is_not_followed() {
        let dir = tempfile::tempdir().expect("dir");
        let outside = tempfile::tempdir().expect("outside");
        std::fs::write(outside.path().join("secret"), b"secret").expect("secret");
        std::fs::create_dir(dir.path().join("ckpt")).expect("ckpt");
        std::fs::write(dir.path().join("ckpt/secret"), b"weights").expect("w");
        let root = Dir::open_root(dir.path()).expect("root");
        let (_, dir_seen) = root.kind("ckpt".as_ref()).expect("kind");
        let ckpt = root.open_dir("ckpt".as_ref(), &dir_seen).expect("ckpt");
        let (_, file_seen) = ckpt.kind("secret".as_ref()).expect("kind");
        // The job swaps the checked file for a link, and the checked
        // directory for a link to a tree of its choosing.
        std::fs::remove_file(dir.path().join("ckpt/secret")).expect("rm");
        std::os::unix::fs::symlink(
            outside.path().join("secret"),
            dir.path().join("ckpt/secret"),
        )
        .expect("link");
        assert!(ckpt.open_file("secret".as_ref(), &file_seen).is_err());
        std::fs::rename(dir.path().join("ckpt"), dir.path().join("old")).expect("mv");
        std::os::unix::fs::symlink(outside.path(), dir.path().join("ckpt")).expect("link");
        assert!(root.open_dir("ckpt".as_ref(), &dir_seen).is_err());
        // The directory already open is the real one: what it lists is the
        // job's tree, not the link's target.
        let names = ckpt.names().expect("names");
        assert_eq!(names, vec!["secret"]);
        assert_eq!(ckpt.kind("secret".as_ref()).expect("kind").0, Kind::Symlink);
    }
}
