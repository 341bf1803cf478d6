//! Everything under a root is opened relative to it and never through a symlink.
//!
//! A root is held open for the whole run, and each directory or file under it is opened with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` (component by component with `O_NOFOLLOW`
//! where that call does not exist): a directory swapped for a symlink mid-run, anywhere on the
//! path, can redirect no listing, no read and no write out of the tree.

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{Mode, OFlags};

/// A root held open.
#[derive(Debug)]
pub struct Anchor {
    root: PathBuf,
    dir: Option<OwnedFd>,
}

impl Anchor {
    /// Holds `root` open (a root that is a file is opened by path when its turn comes).
    pub fn new(root: &Path) -> Self {
        Anchor {
            root: root.to_path_buf(),
            dir: crate::fs::sys::open_anchor(root),
        }
    }

    /// The root as given.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `path` relative to the root, if it is below it (not the root itself).
    fn beneath<'p>(&self, path: &'p Path) -> Option<(&OwnedFd, &'p Path)> {
        let dir = self.dir.as_ref()?;
        // The walk's paths are the root's own bytes, a slash and the rest: told apart without
        // comparing component by component (a few percent of a check of small files).
        let (bytes, root) = (
            path.as_os_str().as_bytes(),
            self.root.as_os_str().as_bytes(),
        );
        let rest = match bytes.strip_prefix(root) {
            Some(rest) if root.ends_with(b"/") => Some(rest),
            Some([b'/', rest @ ..]) => Some(rest),
            _ => None,
        };
        let rel = match rest {
            Some(rest) => {
                let from = rest.iter().position(|&b| b != b'/').unwrap_or(rest.len());
                Path::new(OsStr::from_bytes(&rest[from..]))
            }
            None => path.strip_prefix(&self.root).ok()?,
        };
        (!rel.as_os_str().is_empty()).then_some((dir, rel))
    }

    /// Opens a file read-only, without following any symlink below the root and without
    /// updating its access time where allowed. O_NONBLOCK keeps a FIFO swapped in after the
    /// walk from blocking the open. `direct` reads around the page cache (O_DIRECT) where the
    /// file system allows it.
    pub fn open(&self, path: &Path, direct: bool) -> io::Result<File> {
        let flags =
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK;
        let (noatime, o_direct) = (crate::fs::sys::noatime(), crate::fs::sys::direct());
        let mut extra = noatime | if direct { o_direct } else { OFlags::empty() };
        loop {
            let err = match self.open_with(path, flags | extra) {
                Ok(fd) => return Ok(File::from(fd)),
                Err(e) => e,
            };
            match err.raw_os_error() {
                // O_NOATIME is only for the file's owner (or root).
                Some(libc::EPERM) if !noatime.is_empty() && extra.contains(noatime) => {
                    extra.remove(noatime)
                }
                // Some file systems (tmpfs before 6.6, some FUSE) refuse O_DIRECT.
                Some(libc::EINVAL) if !o_direct.is_empty() && extra.contains(o_direct) => {
                    extra.remove(o_direct)
                }
                _ => return Err(err),
            }
        }
    }

    /// Opens a directory under the root for listing and `*at` calls, by the same rules as
    /// files. The root itself, or a directory outside it (the parent of a root that is a
    /// file: where the user pointed), is opened by path.
    pub fn open_dir(&self, dir: &Path) -> io::Result<OwnedFd> {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        if self.beneath(dir).is_some() {
            return self.open_with(dir, flags);
        }
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        Ok(rustix::fs::open(dir, flags, Mode::empty())?)
    }

    fn open_with(&self, path: &Path, flags: OFlags) -> io::Result<OwnedFd> {
        let Some((root, rel)) = self.beneath(path) else {
            return Ok(rustix::fs::open(path, flags, Mode::empty())?);
        };
        match crate::fs::sys::open_beneath(root, rel, flags) {
            // Deeper than one call takes (PATH_MAX, 4,096 bytes: any user of a tree can nest
            // folders past it, and what is below was left unverified): one step at a time.
            Some(Err(e)) if e.raw_os_error() == Some(libc::ENAMETOOLONG) => {}
            Some(opened) => return opened,
            None => {}
        }
        // No openat2 (Linux before 5.6, other systems), or a path too long for one call:
        // one component at a time, none followed.
        let dir_flags =
            crate::fs::sys::passage() | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let mut parts = rel.components().peekable();
        let mut at = rustix::fs::openat(root, ".", dir_flags, Mode::empty())?;
        while let Some(part) = parts.next() {
            let Component::Normal(part) = part else {
                return Err(io::Error::other("unexpected path component"));
            };
            let last = parts.peek().is_none();
            at = rustix::fs::openat(
                &at,
                part,
                if last { flags } else { dir_flags },
                Mode::empty(),
            )?;
        }
        Ok(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_open_only_beneath_their_root_without_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("real")).unwrap();
        std::fs::write(root.join("real/f"), b"inside").unwrap();
        std::fs::write(dir.path().join("outside"), b"outside").unwrap();
        // As if, after the walk, a directory had been replaced by a symlink to elsewhere.
        std::os::unix::fs::symlink(dir.path(), root.join("swapped")).unwrap();
        std::os::unix::fs::symlink("real", root.join("alias")).unwrap();
        let anchor = Anchor::new(&root);
        assert!(anchor.open(&root.join("real/f"), false).is_ok());
        assert!(anchor.open(&root.join("real/f"), true).is_ok());
        assert!(anchor.open_dir(&root.join("real")).is_ok());
        for sneaky in ["swapped/outside", "alias/f"] {
            let err = anchor.open(&root.join(sneaky), false).unwrap_err();
            assert_eq!(err.raw_os_error(), Some(libc::ELOOP), "{sneaky}");
            // A plain open would have followed it.
            assert!(std::fs::File::open(root.join(sneaky)).is_ok());
        }
        for sneaky in ["swapped", "alias"] {
            // O_DIRECTORY | O_NOFOLLOW on a symlink: "not a directory".
            let err = anchor.open_dir(&root.join(sneaky)).unwrap_err();
            let code = err.raw_os_error();
            assert!(
                code == Some(libc::ELOOP) || code == Some(libc::ENOTDIR),
                "{sneaky}"
            );
        }
        // A root that is a file is opened as itself.
        let file_root = root.join("real/f");
        assert!(Anchor::new(&file_root).open(&file_root, false).is_ok());
        // The root given with a slash, or paths with doubled ones: still beneath it.
        let slashed = Anchor::new(Path::new(&format!("{}/", root.display())));
        assert!(slashed.beneath(&root.join("real/f")).is_some());
        assert!(slashed.open(&root.join("real/f"), false).is_ok());
        let doubled = Path::new(&format!("{}//real/f", root.display())).to_path_buf();
        assert_eq!(anchor.beneath(&doubled).unwrap().1, Path::new("real/f"));
        // A sibling whose name begins with the root's is not beneath it.
        std::fs::create_dir(dir.path().join("rootx")).unwrap();
        assert!(anchor.beneath(&dir.path().join("rootx/f")).is_none());
        assert!(anchor.beneath(&root).is_none());
        let swapped = slashed.open(&root.join("swapped/outside"), false);
        assert_eq!(swapped.unwrap_err().raw_os_error(), Some(libc::ELOOP));
    }
}
