//! Watching trees for writes (`intact watch`): which files may hold new content, and which
//! were written, told by the kernel as it happens, gathered by directory until each has been
//! quiet for a while, then handed over as the part of the trees to look at.
//!
//! Two sources of events, one kind of value ([`Seen`]): fanotify marks whole file systems
//! (root only, no watch per directory, nothing to set up as directories come and go); inotify
//! needs a watch on every directory (the kernel's `max_user_watches` caps them) and is what
//! a user has. Either may lose events (its queue overflows): that is [`Seen::Lost`], and the
//! whole trees are looked at again, never nothing.
//!
//! What waits is kept by directory ([`Pending`]): names while they are few, "its files" past
//! [`NAMES_KEPT`], so a copy of 100,000 files costs a map of its directories, not an entry per
//! event. Writes through a shared `mmap` raise no event at all (the kernel's limit, for both
//! sources): the nightly scrub is what finds those.

mod claim;
#[cfg(target_os = "linux")]
mod fanotify;
#[cfg(target_os = "linux")]
mod inotify;

pub use claim::{Claim, Watched, claim, watched};

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{OsStr, OsString};
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::fs::walk::{Only, Scope};

/// What a source of events saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seen {
    /// Data was written to `name` in `dir` (a modification event: a write, not an open for
    /// writing).
    Written {
        /// The directory, by the path the walk reaches it by.
        dir: PathBuf,
        /// The file's name in it.
        name: OsString,
    },
    /// `name` in `dir` may hold new content: closed after writing, created, moved in.
    Changed {
        /// The directory.
        dir: PathBuf,
        /// The name.
        name: OsString,
    },
    /// A directory appeared (created, moved in): everything beneath it is new to the watch.
    Tree(PathBuf),
    /// Events were lost (a queue overflowed): anything under the trees may have changed.
    Lost,
}

/// A source of events for a set of trees (read between runs on the loop's thread, and at a
/// run's end on the run's).
pub trait Events: Send {
    /// Waits at most `timeout` for events, appending what was seen to `seen`.
    fn wait(&mut self, timeout: Duration, seen: &mut Vec<Seen>) -> io::Result<()>;

    /// What it is, for the log: "fanotify (whole file systems)", "inotify (N directories)".
    fn describe(&self) -> String;

    /// Problems met since last asked (directories it could not watch), to be said aloud.
    fn problems(&mut self) -> Vec<String> {
        Vec::new()
    }
}

/// The source of events for `roots` (absolute, canonical): fanotify where it can mark their
/// file systems (as root), else inotify. The reason fanotify could not be used, if it was
/// tried, comes back with it.
pub fn open(roots: &[PathBuf]) -> io::Result<(Box<dyn Events>, Option<String>)> {
    #[cfg(target_os = "linux")]
    {
        if rustix::process::geteuid().is_root() {
            match fanotify::Fanotify::new(roots) {
                Ok(f) => return Ok((Box::new(f), None)),
                Err(e) => {
                    let why =
                        format!("fanotify could not mark the file systems ({e}): inotify instead");
                    return Ok((Box::new(inotify::Inotify::new(roots)?), Some(why)));
                }
            }
        }
        Ok((Box::new(inotify::Inotify::new(roots)?), None))
    }
    // FSEvents is designed for (docs/scrubs.md), not built.
    #[cfg(not(target_os = "linux"))]
    {
        let _ = roots;
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "intact watch needs Linux (fanotify or inotify)",
        ))
    }
}

/// Waits at most `timeout` for `fd` (a queue of events) to be readable: whether it is (a
/// signal ends the wait early, as nothing). Linux's: both sources of events are.
#[cfg(target_os = "linux")]
pub(crate) fn readable(fd: &impl std::os::fd::AsFd, timeout: Duration) -> io::Result<bool> {
    let mut poll = [rustix::event::PollFd::new(fd, rustix::event::PollFlags::IN)];
    let timeout = rustix::event::Timespec::try_from(timeout).ok();
    match rustix::event::poll(&mut poll, timeout.as_ref()) {
        Ok(0) | Err(rustix::io::Errno::INTR) => Ok(false),
        Ok(_) => Ok(true),
        Err(e) => Err(e.into()),
    }
}

/// Names kept per directory; past this, all its files are looked at (each only read if its
/// tag no longer describes it, or a write to it was seen).
pub const NAMES_KEPT: usize = 256;

/// How long a directory may keep being written before what waits in it is looked at anyway
/// (a log appended to every second would otherwise hold a new photo beside it for ever).
pub const LONGEST_WAIT: Duration = Duration::from_secs(600);

/// What waits to be looked at, by directory, with when it was first and last written.
#[derive(Debug, Default)]
pub struct Pending {
    dirs: BTreeMap<PathBuf, Waiting>,
}

#[derive(Debug)]
struct Waiting {
    scope: Scope,
    first: Instant,
    last: Instant,
}

impl Pending {
    /// Takes in what was seen at `now`.
    pub fn add(&mut self, seen: &Seen, roots: &[PathBuf], now: Instant) {
        match seen {
            Seen::Written { dir, name } | Seen::Changed { dir, name } => {
                self.wait(dir, now, |scope| match scope {
                    Scope::Names(names) if names.len() < NAMES_KEPT => {
                        names.insert(name.clone());
                    }
                    Scope::Names(_) => *scope = Scope::Files,
                    Scope::Files | Scope::Tree => {}
                });
            }
            Seen::Tree(dir) => self.wait(dir, now, |scope| *scope = Scope::Tree),
            Seen::Lost => {
                for root in roots {
                    self.wait(root, now, |scope| *scope = Scope::Tree);
                }
            }
        }
    }

    /// Everything under `roots`, at once (the look at start, after events were lost).
    pub fn everything(&mut self, roots: &[PathBuf], now: Instant) {
        for root in roots {
            self.wait(root, now, |scope| *scope = Scope::Tree);
            if let Some(w) = self.dirs.get_mut(root) {
                // Due at once: there was no event to wait for the end of.
                w.first = now.checked_sub(LONGEST_WAIT).unwrap_or(now);
            }
        }
    }

    fn wait(&mut self, dir: &Path, now: Instant, change: impl FnOnce(&mut Scope)) {
        let w = self.dirs.entry(dir.to_path_buf()).or_insert(Waiting {
            scope: Scope::Names(BTreeSet::new()),
            first: now,
            last: now,
        });
        w.last = now;
        change(&mut w.scope);
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.dirs.is_empty()
    }

    /// When the next directory is due, if any waits.
    pub fn next_due(&self, quiet: Duration) -> Option<Instant> {
        self.dirs
            .values()
            .map(|w| (w.last + quiet).min(w.first + LONGEST_WAIT))
            .min()
    }

    /// Takes the directories quiet for `quiet` (or waiting for [`LONGEST_WAIT`]) at `now`:
    /// the parts of the trees to look at, if any.
    pub fn take_due(&mut self, quiet: Duration, now: Instant) -> Option<Only> {
        let due: Vec<PathBuf> = self
            .dirs
            .iter()
            .filter(|(_, w)| now >= (w.last + quiet).min(w.first + LONGEST_WAIT))
            .map(|(d, _)| d.clone())
            .collect();
        if due.is_empty() {
            return None;
        }
        let mut only = Only::default();
        for dir in due {
            if let Some(w) = self.dirs.remove(&dir) {
                only.0.insert(dir, w.scope);
            }
        }
        Some(only)
    }
}

/// Whether `name` in `dir` is a file of intact's own that writes of its own would keep
/// stirring: the state database and its companions, temp files of a running intact.
pub fn is_own(dir: &Path, name: &OsStr, db: Option<&Path>) -> bool {
    if crate::fs::atomic::temp_pid(name).is_some() {
        return true;
    }
    let Some(db) = db else { return false };
    let (Some(db_dir), Some(db_name)) = (db.parent(), db.file_name()) else {
        return false;
    };
    use std::os::unix::ffi::OsStrExt;
    dir == db_dir && name.as_bytes().starts_with(db_name.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen_in(dir: &str, name: &str) -> Seen {
        Seen::Changed {
            dir: PathBuf::from(dir),
            name: name.into(),
        }
    }

    /// A directory is due once quiet, not before; names past the limit become its files; a
    /// directory written without pause is due after the longest wait all the same.
    #[test]
    fn directories_are_due_once_quiet() {
        let roots = [PathBuf::from("/t")];
        let quiet = Duration::from_secs(5);
        let t0 = Instant::now();
        let mut p = Pending::default();
        p.add(&seen_in("/t/a", "x"), &roots, t0);
        p.add(&seen_in("/t/b", "y"), &roots, t0 + Duration::from_secs(3));
        assert!(p.take_due(quiet, t0 + Duration::from_secs(4)).is_none());
        let only = p.take_due(quiet, t0 + Duration::from_secs(5)).unwrap();
        assert_eq!(only.0.len(), 1);
        assert_eq!(
            only.0[Path::new("/t/a")],
            Scope::Names(["x".into()].into_iter().collect())
        );
        assert_eq!(p.next_due(quiet), Some(t0 + Duration::from_secs(8)));
        for i in 0..=NAMES_KEPT {
            p.add(
                &seen_in("/t/b", &format!("f{i}")),
                &roots,
                t0 + Duration::from_secs(3),
            );
        }
        let only = p.take_due(quiet, t0 + Duration::from_secs(8)).unwrap();
        assert_eq!(only.0[Path::new("/t/b")], Scope::Files);
        assert!(p.is_empty());
        // Written every second for longer than the longest wait.
        let mut t = t0;
        p.add(&seen_in("/t/log", "l"), &roots, t);
        let mut taken = None;
        while taken.is_none() {
            t += Duration::from_secs(1);
            p.add(&seen_in("/t/log", "l"), &roots, t);
            taken = p.take_due(quiet, t);
        }
        assert_eq!(t - t0, LONGEST_WAIT);
    }

    /// Lost events make every root due whole; a directory that appeared is taken whole.
    #[test]
    fn lost_events_look_at_everything() {
        let roots = [PathBuf::from("/t"), PathBuf::from("/u")];
        let t0 = Instant::now();
        let mut p = Pending::default();
        p.add(&seen_in("/t/a", "x"), &roots, t0);
        p.add(&Seen::Tree("/t/new".into()), &roots, t0);
        p.add(&Seen::Lost, &roots, t0);
        let only = p.take_due(Duration::ZERO, t0).unwrap();
        assert_eq!(only.0[Path::new("/t")], Scope::Tree);
        assert_eq!(only.0[Path::new("/u")], Scope::Tree);
        assert_eq!(only.0[Path::new("/t/new")], Scope::Tree);
        p.everything(&roots, t0);
        assert!(p.take_due(Duration::from_secs(5), t0).is_some());
    }

    #[test]
    fn own_files_are_known() {
        let db = Path::new("/t/state/state.db");
        assert!(is_own(
            Path::new("/t/state"),
            "state.db-wal".as_ref(),
            Some(db)
        ));
        assert!(!is_own(Path::new("/t"), "state.db".as_ref(), Some(db)));
        assert!(!is_own(Path::new("/t"), "photo.jpg".as_ref(), None));
    }
}
