//! inotify: a watch on every directory of the trees, added as directories appear. What a user
//! can have; the kernel caps the watches (`fs.inotify.max_user_watches`), and a directory it
//! could not watch is said aloud, never passed over in silence.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};

use super::{Events, Seen};

/// Events read per [`Events::wait`].
const EVENTS_PER_WAIT: usize = 16_384;

/// Recursive inotify watches over a set of trees.
pub struct Inotify {
    fd: OwnedFd,
    /// Watched directories by watch descriptor.
    dirs: HashMap<i32, PathBuf>,
    problems: Vec<String>,
    buf: Vec<MaybeUninit<u8>>,
}

/// Why a directory is not watched.
#[derive(Debug, thiserror::Error)]
enum Unwatched {
    /// The kernel's limit of watches is reached.
    #[error(
        "{dir} is not watched: the kernel's limit of inotify watches is reached \
         (fs.inotify.max_user_watches = {max}, {used} used here): raise it with sysctl, or run \
         `intact watch` as root (fanotify watches whole file systems)"
    )]
    Limit {
        dir: String,
        max: String,
        used: usize,
    },
    /// Another reason.
    #[error("{dir} is not watched: {why}")]
    Other { dir: String, why: io::Error },
}

impl Inotify {
    /// Watches every directory under `roots`.
    pub fn new(roots: &[PathBuf]) -> io::Result<Inotify> {
        let fd = inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK)?;
        let mut me = Inotify {
            fd,
            dirs: HashMap::new(),
            problems: Vec::new(),
            buf: vec![MaybeUninit::uninit(); 64 << 10],
        };
        for root in roots {
            me.watch_tree(root);
        }
        // A tree that could not be watched whole at start is not watched: say so and stop,
        // rather than run with holes.
        if let Some(first) = me.problems.first() {
            return Err(io::Error::other(first.clone()));
        }
        Ok(me)
    }

    /// Adds watches on `dir` and every directory beneath it (never through a symlink).
    fn watch_tree(&mut self, dir: &Path) {
        let mut stack = vec![dir.to_path_buf()];
        while let Some(dir) = stack.pop() {
            if let Err(e) = self.watch(&dir) {
                self.problems.push(e.to_string());
                continue;
            }
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(e.path());
                }
            }
        }
    }

    fn watch(&mut self, dir: &Path) -> Result<(), Unwatched> {
        let mask = WatchFlags::MODIFY
            | WatchFlags::CLOSE_WRITE
            | WatchFlags::CREATE
            | WatchFlags::MOVED_TO
            | WatchFlags::ONLYDIR
            | WatchFlags::DONT_FOLLOW
            | WatchFlags::EXCL_UNLINK;
        match inotify::add_watch(&self.fd, dir, mask) {
            Ok(wd) => {
                self.dirs.insert(wd, dir.to_path_buf());
                Ok(())
            }
            // Gone already, or a symlink put in its place: nothing to watch.
            Err(rustix::io::Errno::NOENT | rustix::io::Errno::NOTDIR) => Ok(()),
            Err(rustix::io::Errno::NOSPC) => Err(Unwatched::Limit {
                dir: crate::text::escape(dir),
                max: std::fs::read_to_string("/proc/sys/fs/inotify/max_user_watches")
                    .map_or("?".into(), |s| s.trim().to_string()),
                used: self.dirs.len(),
            }),
            Err(e) => Err(Unwatched::Other {
                dir: crate::text::escape(dir),
                why: io::Error::from(e),
            }),
        }
    }
}

impl Events for Inotify {
    fn wait(&mut self, timeout: Duration, seen: &mut Vec<Seen>) -> io::Result<()> {
        if !super::readable(&self.fd, timeout)? {
            return Ok(());
        }
        let mut trees = Vec::new();
        let mut reader = inotify::Reader::new(self.fd.as_fd(), &mut self.buf);
        // Bounded: events may come as fast as they are read, and the caller must get its turn.
        for _ in 0..EVENTS_PER_WAIT {
            let event = match reader.next() {
                Ok(e) => e,
                Err(rustix::io::Errno::WOULDBLOCK | rustix::io::Errno::INTR) => break,
                Err(e) => return Err(e.into()),
            };
            let flags = event.events();
            if flags.contains(ReadFlags::QUEUE_OVERFLOW) {
                seen.push(Seen::Lost);
                continue;
            }
            if flags.contains(ReadFlags::IGNORED) {
                self.dirs.remove(&event.wd());
                continue;
            }
            let (Some(dir), Some(name)) = (self.dirs.get(&event.wd()), event.file_name()) else {
                continue;
            };
            let name = OsStr::from_bytes(name.to_bytes()).to_os_string();
            if flags.contains(ReadFlags::ISDIR) {
                if flags.intersects(ReadFlags::CREATE | ReadFlags::MOVED_TO) {
                    trees.push(dir.join(&name));
                }
            } else if flags.contains(ReadFlags::MODIFY) {
                seen.push(Seen::Written {
                    dir: dir.clone(),
                    name,
                });
            } else {
                seen.push(Seen::Changed {
                    dir: dir.clone(),
                    name,
                });
            }
        }
        // A directory that appeared is watched now, and looked at whole: what was put in it
        // before its watch was added raised no event.
        for tree in trees {
            self.watch_tree(&tree);
            seen.push(Seen::Tree(tree));
        }
        Ok(())
    }

    fn describe(&self) -> String {
        format!("inotify, {} folder(s) watched", self.dirs.len())
    }

    fn problems(&mut self) -> Vec<String> {
        std::mem::take(&mut self.problems)
    }
}
