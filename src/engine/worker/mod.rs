//! A worker: opens one file beneath its root, reads its tags, and does the engine's work on
//! it (hash, classify, tag), making sure the data did not change while it was read.

mod compat;
mod open;
mod read;
mod verbs;

pub(super) use open::{AHEAD, Opened};
use read::closed_gate;

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use super::outcome::{Action, FileError, FileReport};
use super::{Carried, Config, Held, OpenFile, OpenFiles, Progress, Slot, Slots, Work};
use crate::core::classify::Status;
use crate::core::digest::{Digest, digest_bytes};
use crate::core::tag::Tag;
use crate::fs::anchor::Anchor;
use crate::fs::atomic;
use crate::fs::device::{Cold, Gate, Gates};
use crate::fs::hash::{self, AlignedBuf};
use crate::fs::walk::{Entry, SkipReason, Stat as Meta};
use crate::fs::xattr::{self, Stored};

pub(super) struct Worker<'a> {
    config: &'a Config,
    cancel: &'a AtomicBool,
    progress: &'a Progress,
    gates: &'a Gates,
    /// The last device met and its gate: files come mostly from one device, and the
    /// lookup in `gates` takes a lock all threads share.
    gate: Option<(u64, Option<Arc<Gate>>)>,
    /// The device whose gate this worker holds for its whole batch.
    holding: Option<u64>,
    cold: &'a Cold,
    bufs: [AlignedBuf; 2],
    /// Counts the files left open for the sink.
    open_files: Arc<OpenFiles>,
    /// The right to hash, kept from batch to batch; lent on for a large file.
    slot: Option<Slot<'a>>,
}

/// One open regular file and what was known of it before its data was read.
struct Subject<'f> {
    /// The index of the root it was found under.
    root: usize,
    file: &'f File,
    meta: Meta,
    stored: Stored,
}

/// A verb's result for a file: its report, or, having stopped early, the report to give
/// instead (`None` when the run was interrupted).
type Outcome = Result<FileReport, Option<FileReport>>;

impl<'a> Worker<'a> {
    /// A worker with its own read buffers.
    pub(super) fn new(
        config: &'a Config,
        cancel: &'a AtomicBool,
        progress: &'a Progress,
        gates: &'a Gates,
        cold: &'a Cold,
        open_files: Arc<OpenFiles>,
    ) -> Self {
        Worker {
            config,
            cancel,
            progress,
            gates,
            gate: None,
            holding: None,
            cold,
            bufs: [
                AlignedBuf::new(hash::BUF_SIZE),
                AlignedBuf::new(hash::BUF_SIZE),
            ],
            open_files,
            slot: None,
        }
    }
}

// Both sides of an Outcome carry a report: boxing the error side would only add an allocation.
#[allow(clippy::result_large_err)]
impl<'a> Worker<'a> {
    /// Waits for a slot of `slots`, unless it holds one (see [`Slots`]).
    pub(super) fn hold(&mut self, slots: &'a Slots) {
        if !self.slot.as_ref().is_some_and(Slot::held) {
            self.slot = Some(slots.take());
        }
    }

    /// The reports for a batch of what the walk found, in its order. Files opened ahead on a
    /// disk that seeks are read in the order they lie on it, by this worker alone (it holds
    /// the disk's gate for the batch): a sweep instead of seeks between files.
    pub(super) fn batch(
        &mut self,
        batch: Vec<(Entry, Option<io::Result<Opened>>)>,
        anchors: &[Anchor],
    ) -> Vec<Option<FileReport>> {
        let dev = |opened: &Option<io::Result<Opened>>| match opened {
            Some(Ok(Opened {
                meta: Ok((meta, true)),
                ..
            })) if meta.size > 0 => Some(meta.dev),
            _ => None,
        };
        let seeking = batch
            .iter()
            .find_map(|(_, opened)| dev(opened))
            .and_then(|d| {
                self.find_gate(d);
                let gate = closed_gate(&self.gate, None, d).filter(|g| g.seeking())?;
                Some((d, gate.clone()))
            });
        // The file being read, for a progress display: the batch's largest, which takes
        // most of its time, is enough to follow.
        let largest = batch
            .iter()
            .filter_map(|(entry, _)| match entry {
                Entry::File { path, size, .. } => Some((size, path)),
                _ => None,
            })
            .max_by_key(|&(size, _)| size);
        if let Some((_, path)) = largest
            && let Ok(mut current) = self.progress.current.try_lock()
        {
            current.clone_from(path);
        }
        let Some((on, gate)) = seeking.filter(|_| batch.len() > 1) else {
            return batch
                .into_iter()
                .map(|(entry, opened)| self.entry(entry, opened, anchors))
                .collect();
        };
        let blocks: Vec<Option<u64>> = batch
            .iter()
            .map(|(_, opened)| match opened {
                Some(Ok(o)) if dev(opened) == Some(on) => crate::fs::sys::first_block(&o.file),
                _ => None,
            })
            .collect();
        let _pass = gate.enter();
        self.holding = Some(on);
        let mut slots: Vec<_> = batch.into_iter().map(Some).collect();
        let mut reports: Vec<Option<FileReport>> = (0..slots.len()).map(|_| None).collect();
        for i in crate::fs::device::physical_order(&blocks) {
            let (entry, opened) = slots[i].take().expect("each once");
            reports[i] = self.entry(entry, opened, anchors);
        }
        self.holding = None;
        reports
    }

    /// The report for one thing the walk found, opened ahead or not; `None` if the run was
    /// interrupted.
    fn entry(
        &mut self,
        entry: Entry,
        opened: Option<io::Result<Opened>>,
        anchors: &[Anchor],
    ) -> Option<FileReport> {
        match entry {
            Entry::File { .. } if self.config.past_deadline() => None,
            Entry::File {
                path,
                root,
                inode,
                stat,
                ..
            } => {
                let report = self.examine(path, stat, opened, anchors, root)?;
                Some(FileReport {
                    root,
                    linked: inode,
                    ..report
                })
            }
            Entry::Skip {
                path,
                root,
                reason,
                inode,
            } => Some(FileReport {
                root,
                linked: inode,
                ..FileReport::skipped(path, reason)
            }),
            Entry::Error { path, root, error } => Some(FileReport {
                root,
                ..FileReport::error(path, FileError::Walk(error))
            }),
        }
    }

    fn examine(
        &mut self,
        path: PathBuf,
        walked: Option<Meta>,
        opened: Option<io::Result<Opened>>,
        anchors: &[Anchor],
        root: usize,
    ) -> Option<FileReport> {
        let anchor = &anchors[root];
        if let Some(pid) = path.file_name().and_then(atomic::temp_pid) {
            return Some(self.temp_file(path, pid, anchor));
        }
        let opened = opened.unwrap_or_else(|| Opened::open(self.config, anchor, &path, walked));
        let (file, meta, held) = match opened {
            Ok(Opened {
                file,
                meta: Ok((meta, true)),
                held,
            }) => (file, meta, held),
            Ok(Opened {
                meta: Ok((_, false)),
                ..
            }) => return Some(FileReport::skipped(path, SkipReason::Special)),
            Ok(Opened { meta: Err(e), .. }) => {
                return Some(FileReport::error(path, FileError::Open(e)));
            }
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) && is_symlink(&path) => {
                return Some(FileReport::skipped(path, SkipReason::Symlink));
            }
            Err(e) => return Some(FileReport::error(path, FileError::Open(e))),
        };
        // With a manifest, it alone says what the data should be. For a sink that takes the
        // files open (the archive writer copies their attributes), all are read once, here.
        let read = match &self.config.manifest {
            Some(m) => Ok((
                Stored {
                    tags: m.tag(&path).into_iter().collect(),
                    ..Stored::default()
                },
                None,
            )),
            None if self
                .config
                .sink_verifies
                .as_ref()
                .is_some_and(|r| r.takes_open) =>
            {
                xattr::read_all(&file).map(|all| (Stored::from_list(&all), Some(all)))
            }
            None => xattr::read(&file).map(|s| (s, None)),
        };
        let (stored, attrs) = match read {
            Ok(read) => read,
            Err(e) => return Some(FileReport::error(path, FileError::ReadTags(e))),
        };
        if stored.kept_damaged {
            return Some(FileReport {
                size: Some(meta.size),
                ..FileReport::skipped(path, SkipReason::KeptDamaged)
            });
        }
        let report = FileReport {
            inode: Some((meta.dev, meta.ino)),
            size: Some(meta.size),
            mtime: Some(meta.mtime),
            owner: Some(crate::engine::Owner {
                uid: meta.uid,
                gid: meta.gid,
                mode: meta.mode & 0o7777,
            }),
            tag: stored.best().cloned(),
            malformed: stored.malformed.clone(),
            ..FileReport::new(path, Status::New)
        };
        let s = &Subject {
            root,
            file: &file,
            meta,
            stored,
        };
        let outcome = match self.config.work {
            Work::Show => Ok(self.show(report, s, None)),
            // The richest tag of the manifest's algorithm, untouched since it was written.
            Work::Export => Ok(self.show(report, s, Some(self.config.new_algo()))),
            Work::Strip => Ok(self.strip(report, s)),
            Work::Check => self.check(report, s),
            Work::Tag => self.tag(report, s),
            Work::Update => self.update(report, s),
            Work::Import => self.import(report, s),
        };
        let mut report = outcome.map_or_else(|stopped| stopped, Some)?;
        // The sink reads what was left unread from the same open file (not one opened with
        // O_DIRECT, which wants aligned reads), while descriptors last.
        if let Some(tag) = report.unread()
            && !self.config.drop_cache
            && let Some(attrs) = attrs
            && let Some(held) = held.or_else(|| Held::take(&self.open_files))
        {
            let read = read_ahead(&file, &meta, tag, &held);
            report.open = Some(Box::new(OpenFile::new(file, meta, attrs, read, held)));
        }
        Some(report)
    }

    /// A file named as intact names its temp files: never read or tagged. Left by a run that
    /// was killed, a writing verb removes it.
    fn temp_file(&self, path: PathBuf, pid: u32, anchor: &Anchor) -> FileReport {
        let name = path.file_name().unwrap_or_default().to_os_string();
        if !atomic::is_stale(&name) {
            return FileReport::skipped(path, SkipReason::Temporary);
        }
        let mut report = FileReport::skipped(path, SkipReason::Leftover);
        if !self.config.remove_leftovers {
            report.detail = Some(format!(
                "left by an interrupted run of intact (pid {pid}); tag, update or repair removes it"
            ));
            return report;
        }
        let removed = anchor
            .open_dir(atomic::parent(&report.path))
            .and_then(|dir| {
                Ok(rustix::fs::unlinkat(
                    dir,
                    &name,
                    rustix::fs::AtFlags::empty(),
                )?)
            });
        match removed {
            Ok(()) => {
                report.action = Some(Action::Removed);
                report.detail = Some(format!(
                    "left by an interrupted run of intact (pid {pid}): removed"
                ));
                report
            }
            Err(e) => fail(report, FileError::RemoveTemp(e)),
        }
    }
}

/// Removes the marks of a stopped repair and of damage from a file whose data now matches
/// its tag.
fn unmark(s: &Subject) -> io::Result<()> {
    if s.stored.repairing {
        xattr::unmark_repairing(s.file)?;
    }
    if s.stored.damage.is_some() {
        xattr::unmark_damaged(s.file)?;
    }
    Ok(())
}

/// `report` with `error` attached (see [`FileReport::fail`]).
fn fail(mut report: FileReport, error: FileError) -> FileReport {
    report.fail(error);
    report
}

/// What a check says of a file that a repair stopped rewriting.
const INTERRUPTED_REPAIR: &str = "a repair stopped while rewriting it in place: its bytes may be \
     partly rewritten (its mtime moved with them); `intact repair` restores it";

fn is_symlink(path: &Path) -> bool {
    crate::fs::sys::lstat(path).is_ok_and(|m| m.file_type().is_symlink())
}

/// Files at most this large are read and hashed by the worker for a sink that reads them
/// anyway (`archive create`), which then only copies the bytes: on 20,000 files of 4 KiB its
/// one thread hashed them all (a third of the CPU of the archive's own thread).
const READ_AHEAD_MOST: u64 = 64 << 10;

/// The whole data of a small file left unread for the sink, and their digest by `tag`'s
/// algorithm; `None` where it is larger, the bytes carried at once are at their most, the
/// page cache does not hold it all (cold data is read by the sink, in the walk's order and
/// behind a spinning disk's gate, as before: a refusal is confirmed against the page cache,
/// as pages another program's reads left marked for read-ahead are refused too), or it
/// changed meanwhile.
fn read_ahead(file: &File, meta: &Meta, tag: &Tag, held: &Held) -> Option<(Carried, Digest)> {
    let size = usize::try_from(meta.size)
        .ok()
        .filter(|_| meta.size <= READ_AHEAD_MOST)?;
    let mut data = held.carry(size)?;
    match crate::fs::sys::read_cached(file, &mut data, 0, true) {
        Some(Ok(n)) if n == size => {}
        _ => return None,
    }
    let digest = digest_bytes(tag.digest.algo, &data);
    let (now, _) = Meta::of(file).ok()?;
    now.changes_since(meta, meta.size)
        .is_none()
        .then_some((data, digest))
}

#[cfg(test)]
mod tests {
    //! The worker's verdicts and writes, verb by verb, on real files with real xattrs: the
    //! classification table of the product brief, through the engine on one thread.

    use std::fs;
    use std::path::Path;
    use std::sync::atomic::AtomicBool;
    use std::time::{Duration, SystemTime};

    use crate::core::classify::Status;
    use crate::core::tag::{Compat, names};
    use crate::engine::{Action, Config, FileReport, Progress, Work, run};

    /// The reports of `work` over `dir`, configured by `set`, in walk order.
    fn over(dir: &Path, work: Work, set: impl FnOnce(&mut Config)) -> Vec<FileReport> {
        let mut config = Config::new(work);
        config.threads = 1;
        set(&mut config);
        let mut reports = Vec::new();
        run(
            &config,
            &[dir.to_path_buf()],
            &AtomicBool::new(false),
            &Progress::default(),
            |r| reports.push(r),
        )
        .unwrap();
        reports
    }

    /// The report of the file named `name`.
    fn of<'r>(reports: &'r [FileReport], name: &str) -> &'r FileReport {
        reports
            .iter()
            .find(|r| r.path.file_name().is_some_and(|n| n == name))
            .unwrap_or_else(|| panic!("no report for {name}"))
    }

    fn tag_value(path: &Path, name: &str) -> Option<Vec<u8>> {
        let mut buf = [0u8; 256];
        match rustix::fs::getxattr(path, name, &mut buf[..]) {
            Ok(n) => Some(buf[..n].to_vec()),
            Err(rustix::io::Errno::NODATA) => None,
            Err(e) => panic!("{}: {e}", path.display()),
        }
    }

    /// Writes `bytes` into `path` and puts its mtime back: rot, as a disk makes it.
    fn rot(path: &Path, bytes: &[u8]) {
        let mtime = fs::metadata(path).unwrap().modified().unwrap();
        fs::write(path, bytes).unwrap();
        fs::File::options()
            .write(true)
            .open(path)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
    }

    /// Writes `bytes` into `path` a second later than its mtime: an edit.
    fn edit(path: &Path, bytes: &[u8]) {
        let mtime = fs::metadata(path).unwrap().modified().unwrap();
        fs::write(path, bytes).unwrap();
        let later = mtime + Duration::from_secs(1);
        let f = fs::File::options().write(true).open(path).unwrap();
        f.set_modified(later.max(SystemTime::now())).unwrap();
    }

    /// Three tagged files: one to rot, one to edit, one to touch.
    fn tagged() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for name in ["rots", "edited", "touched", "same"] {
            fs::write(dir.path().join(name), format!("the bytes of {name}")).unwrap();
        }
        let reports = over(dir.path(), Work::Tag, |_| {});
        assert!(
            reports.iter().all(|r| r.action == Some(Action::Tagged)),
            "{reports:?}"
        );
        dir
    }

    #[test]
    fn check_tells_rot_from_an_edit_and_writes_nothing() {
        let dir = tagged();
        let p = |n: &str| dir.path().join(n);
        let before = tag_value(&p("rots"), names::INTACT);
        rot(&p("rots"), b"the bytes of rotz");
        edit(&p("edited"), b"new bytes");
        let later = SystemTime::now() + Duration::from_secs(5);
        fs::File::options()
            .write(true)
            .open(p("touched"))
            .unwrap()
            .set_modified(later)
            .unwrap();
        let reports = over(dir.path(), Work::Check, |_| {});
        assert_eq!(of(&reports, "rots").status, Status::Corrupt);
        assert_eq!(of(&reports, "edited").status, Status::Modified);
        assert_eq!(of(&reports, "touched").status, Status::Touched);
        assert_eq!(of(&reports, "same").status, Status::Ok);
        assert!(reports.iter().all(|r| r.action.is_none()), "{reports:?}");
        assert_eq!(tag_value(&p("rots"), names::INTACT), before);
    }

    #[test]
    fn update_retags_edits_and_keeps_the_tag_of_damage_unless_accepted() {
        let dir = tagged();
        let p = |n: &str| dir.path().join(n);
        let rotten = tag_value(&p("rots"), names::INTACT);
        let edited = tag_value(&p("edited"), names::INTACT);
        rot(&p("rots"), b"the bytes of rotz");
        edit(&p("edited"), b"new bytes");
        let reports = over(dir.path(), Work::Update, |_| {});
        assert_eq!(of(&reports, "rots").status, Status::Corrupt);
        assert_eq!(of(&reports, "rots").action, Some(Action::Kept));
        assert_eq!(
            tag_value(&p("rots"), names::INTACT),
            rotten,
            "the evidence kept"
        );
        assert_eq!(of(&reports, "edited").action, Some(Action::Tagged));
        assert_ne!(tag_value(&p("edited"), names::INTACT), edited);
        // Again: the edit is tagged now; the damage is still damage.
        let reports = over(dir.path(), Work::Update, |_| {});
        assert_eq!(of(&reports, "edited").status, Status::Ok);
        assert_eq!(of(&reports, "rots").status, Status::Corrupt);
        let reports = over(dir.path(), Work::Update, |c| c.accept_corrupt = true);
        assert_eq!(of(&reports, "rots").action, Some(Action::Accepted));
        let reports = over(dir.path(), Work::Check, |_| {});
        assert!(
            reports.iter().all(|r| r.status == Status::Ok),
            "{reports:?}"
        );
    }

    /// A write `intact watch` saw after the tag makes data changed under the tag's mtime an
    /// edit; one from before the tag proves nothing. With `changed_only`, a file whose tag
    /// still describes it is left unread unless a write to it was seen.
    #[test]
    fn a_write_seen_after_the_tag_is_an_edit() {
        use std::os::unix::fs::MetadataExt;
        let dir = tagged();
        let p = |n: &str| dir.path().join(n);
        rot(&p("rots"), b"the bytes of rotz");
        let ino = fs::metadata(p("rots")).unwrap().ino();
        let fs_id = rustix::fs::statvfs(p("rots")).unwrap().f_fsid as i64;
        let seen = |at: i64| {
            move |c: &mut Config| {
                let written: crate::engine::Written = [((fs_id, ino), at)].into();
                c.written = Some(std::sync::Arc::new(written));
            }
        };
        let later = crate::state::now() + 5_000;
        let reports = over(dir.path(), Work::Check, seen(later));
        let rots = of(&reports, "rots");
        assert_eq!(rots.status, Status::Modified);
        assert!(
            rots.detail
                .as_deref()
                .unwrap()
                .contains("intact watch saw the write")
        );
        let reports = over(dir.path(), Work::Check, seen(1_000));
        assert_eq!(of(&reports, "rots").status, Status::Corrupt);
        edit(&p("edited"), b"new bytes");
        // Past the racy window of the last change (a file changed moments ago is read).
        std::thread::sleep(Duration::from_millis(50));
        let reports = over(dir.path(), Work::Update, |c| c.changed_only = true);
        assert_eq!(of(&reports, "rots").status, Status::AlreadyTagged);
        assert_eq!(of(&reports, "same").status, Status::AlreadyTagged);
        assert_eq!(of(&reports, "edited").action, Some(Action::Tagged));
        let reports = over(dir.path(), Work::Update, |c| {
            seen(later)(c);
            c.changed_only = true;
        });
        assert_eq!(of(&reports, "rots").status, Status::Modified);
        assert_eq!(of(&reports, "rots").action, Some(Action::Tagged));
        assert_eq!(of(&reports, "same").status, Status::AlreadyTagged);
    }

    #[test]
    fn a_dry_update_judges_and_writes_nothing() {
        let dir = tagged();
        let p = |n: &str| dir.path().join(n);
        let edited = tag_value(&p("edited"), names::INTACT);
        edit(&p("edited"), b"new bytes");
        fs::write(p("new"), b"a new file").unwrap();
        let reports = over(dir.path(), Work::Update, |c| c.write = false);
        assert_eq!(of(&reports, "edited").status, Status::Modified);
        assert_eq!(of(&reports, "new").status, Status::New);
        assert_eq!(tag_value(&p("edited"), names::INTACT), edited);
        assert_eq!(tag_value(&p("new"), names::INTACT), None);
    }

    #[test]
    fn other_tools_tags_are_written_and_kept_in_step_on_a_retag() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("f");
        fs::write(&f, b"one").unwrap();
        over(dir.path(), Work::Tag, |c| c.compat = vec![Compat::Shatag]);
        let first = tag_value(&f, names::SHATAG_SHA256).expect("a shatag tag");
        assert_eq!(first.len(), 64, "hex SHA-256");
        // Edited and updated without --compat: the shatag tag follows, or every later check
        // would be a conflict between the two tools' tags.
        edit(&f, b"two");
        let reports = over(dir.path(), Work::Update, |_| {});
        assert_eq!(of(&reports, "f").action, Some(Action::Tagged));
        assert_ne!(tag_value(&f, names::SHATAG_SHA256).unwrap(), first);
        let reports = over(dir.path(), Work::Check, |_| {});
        assert_eq!(of(&reports, "f").status, Status::Ok, "{reports:?}");
        // strip removes intact's tag; with --compat, the other tool's too.
        over(dir.path(), Work::Strip, |_| {});
        assert_eq!(tag_value(&f, names::INTACT), None);
        assert!(tag_value(&f, names::SHATAG_SHA256).is_some());
        over(dir.path(), Work::Strip, |c| c.compat = vec![Compat::Shatag]);
        assert_eq!(tag_value(&f, names::SHATAG_SHA256), None);
        assert_eq!(tag_value(&f, names::SHATAG_TS), None);
    }
}
