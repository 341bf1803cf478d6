//! Folders intact writes in and deletes from: only ever ones that no one else can change.
//!
//! A parity store sits in the tree it protects, which other people may write (a family NAS
//! scrubbed by root every night). Whoever can put a name in a folder intact writes in can make
//! it follow a symlink out of the tree, or block on a FIFO: a store at a symlink, or with a
//! symlink in it, made root's `protect` delete files elsewhere. So such a folder is held only
//! when it is a real folder (never a symlink at its name), owned by the user running intact
//! and writable by no one else: then every name in it is that user's, and intact's own.
//! Once checked it is reached through its open handle (`/proc/self/fd/N` on Linux), so that
//! the folder renamed away and a symlink put at its name after the check leads nowhere else.
//! (OpenSSH's StrictModes and systemd-tmpfiles refuse the same.)

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{FileType, Mode, OFlags};

/// A folder only the user running intact can change, held open.
#[derive(Debug)]
pub struct Owned {
    /// Keeps the folder the path below leads to.
    fd: OwnedFd,
    /// Where it is reached: through the handle where the system allows it, else the path.
    at: PathBuf,
    /// The path it was opened by, for messages.
    shown: PathBuf,
}

impl Owned {
    /// Holds the folder `path`, refusing it (an error that says why and what to do) unless it
    /// is safe as the module says. With `create`, a folder that is not there is made with
    /// that mode, whatever the umask (its parents as the umask says).
    pub fn open(path: &Path, create: Option<u32>) -> io::Result<Owned> {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = match rustix::fs::open(path, flags, Mode::empty()) {
            Err(rustix::io::Errno::NOENT) if create.is_some() => {
                if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                    std::fs::create_dir_all(parent)?;
                }
                let mode = create.unwrap_or(0o700);
                match rustix::fs::mkdir(path, Mode::from_raw_mode(mode as rustix::fs::RawMode)) {
                    Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                    Err(e) => return Err(e.into()),
                }
                let fd =
                    rustix::fs::open(path, flags, Mode::empty()).map_err(|e| refused(path, e))?;
                let st = rustix::fs::fstat(&fd)?;
                // Ours if it was made just now: the umask does not choose its mode.
                if st.st_uid == rustix::process::geteuid().as_raw() {
                    rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode as rustix::fs::RawMode))?;
                }
                fd
            }
            opened => opened.map_err(|e| refused(path, e))?,
        };
        let st = rustix::fs::fstat(&fd)?;
        let me = rustix::process::geteuid().as_raw();
        if st.st_uid != me {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "refused: it belongs to user {}, not to the user running intact ({me}), \
                     and its owner could make intact write or delete elsewhere",
                    st.st_uid
                ),
            ));
        }
        let mode = st.st_mode & 0o7777;
        if mode & 0o022 != 0 {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "refused: others can write in it (mode {mode:04o}) and could make intact \
                     write or delete elsewhere; check what is in it, then `chmod go-w` it"
                ),
            ));
        }
        let proc_path = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
        let at = if cfg!(target_os = "linux") && proc_path.is_dir() {
            proc_path
        } else {
            path.to_path_buf()
        };
        Ok(Owned {
            fd,
            at,
            shown: path.to_path_buf(),
        })
    }

    /// The folder's handle, for calls relative to it (`*at`).
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.fd.as_fd()
    }

    /// Where names in the folder are reached.
    pub fn at(&self) -> &Path {
        &self.at
    }

    /// The folder's path as given, for messages.
    pub fn shown(&self) -> &Path {
        &self.shown
    }

    /// `p`, reached through the handle, as a person knows it.
    pub fn show(&self, p: &Path) -> PathBuf {
        p.strip_prefix(&self.at)
            .map_or_else(|_| p.to_path_buf(), |rel| self.shown.join(rel))
    }
}

/// Why `path` could not be opened as a folder: a symlink, or something else, at its name is
/// said as such.
fn refused(path: &Path, e: rustix::io::Errno) -> io::Error {
    let what = match rustix::fs::lstat(path).map(|st| FileType::from_raw_mode(st.st_mode)) {
        Ok(FileType::Symlink) => {
            "refused: a symlink (intact follows none to the folders it writes in)"
        }
        Ok(FileType::Directory) | Err(_) => return e.into(),
        Ok(_) => "refused: not a folder",
    };
    io::Error::new(io::ErrorKind::PermissionDenied, what)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_real_folder_of_ones_own_that_no_one_else_writes_is_held() {
        let dir = tempfile::tempdir().unwrap();
        let made = dir.path().join("a/b/store");
        let held = Owned::open(&made, Some(0o755)).unwrap();
        let st = std::fs::metadata(&made).unwrap();
        assert!(st.is_dir());
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&st.permissions()) & 0o777,
            0o755
        );
        // Reached through the handle: the folder renamed away is still the one reached.
        std::fs::write(held.at().join("f"), b"x").unwrap();
        std::fs::rename(&made, dir.path().join("moved")).unwrap();
        std::fs::create_dir(&made).unwrap();
        if held.at() != made {
            assert!(held.at().join("f").exists());
            assert!(!made.join("f").exists());
        }
        assert_eq!(held.show(&held.at().join("f")), made.join("f"));

        std::os::unix::fs::symlink(dir.path().join("moved"), dir.path().join("link")).unwrap();
        let e = Owned::open(&dir.path().join("link"), Some(0o755)).unwrap_err();
        assert!(e.to_string().contains("refused: a symlink"), "{e}");
        std::fs::write(dir.path().join("file"), b"").unwrap();
        let e = Owned::open(&dir.path().join("file"), None).unwrap_err();
        assert!(e.to_string().contains("not a folder"), "{e}");
        let open = dir.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::os::unix::fs::PermissionsExt::from_mode(0o777))
            .unwrap();
        let e = Owned::open(&open, None).unwrap_err();
        assert!(e.to_string().contains("(mode 0777)"), "{e}");
        let missing = Owned::open(&dir.path().join("none"), None).unwrap_err();
        assert_eq!(missing.kind(), io::ErrorKind::NotFound);
        // Another user's folder (as root, one can be made).
        if rustix::process::geteuid().is_root() {
            let theirs = dir.path().join("theirs");
            std::fs::create_dir(&theirs).unwrap();
            std::os::unix::fs::chown(&theirs, Some(65534), None).unwrap();
            let e = Owned::open(&theirs, None).unwrap_err();
            assert!(e.to_string().contains("belongs to user 65534"), "{e}");
        }
    }
}
