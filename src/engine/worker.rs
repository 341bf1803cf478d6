//! A worker: opens one file beneath its root, reads its tags, and does the engine's work on
//! it (hash, classify, tag), making sure the data did not change while it was read.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use super::outcome::{Action, FileError, FileReport};
use super::{Config, Held, OpenFile, OpenFiles, Progress, Slot, Slots, Work};
use crate::core::classify::{self, SinceDamage, Status};
use crate::core::digest::{Algo, Digest};
use crate::core::tag::{self, Compat, Damage, Format, Tag, Timestamp};
use crate::fs::anchor::Anchor;
use crate::fs::atomic;
use crate::fs::device::{Cold, Gate, Gates};
use crate::fs::hash::{self, AlignedBuf, HashError, ReadOptions};
use crate::fs::walk::{Entry, SkipReason, Stat as Meta};
use crate::fs::xattr::{self, Stored};

/// A file opened (beneath its root, never through a symlink) with what `fstat` said of it:
/// its state before any read, and whether it is a regular file; and, opened ahead of its
/// worker, its place among the files held open.
pub(super) struct Opened {
    file: File,
    meta: io::Result<(Meta, bool)>,
    held: Option<Held>,
}

/// Read-ahead reads this much of a file at most: the kernel's own read-ahead (on the same open
/// file) and the mapped windows' filling keep a larger file streaming once it is hashed.
pub(super) const AHEAD: usize = 256 << 10;

impl Opened {
    /// Opens `path`; what the walk's `stat` said of it (`walked`) stands for an `fstat` where
    /// the data is read and nothing is written: the `fstat` after reading then tells whether
    /// the file is still the one walked, unchanged.
    fn open(
        config: &Config,
        anchor: &Anchor,
        path: &Path,
        walked: Option<Meta>,
    ) -> io::Result<Opened> {
        let direct = config.work.reads_data() && config.drop_cache;
        let file = anchor.open(path, direct)?;
        let meta = match walked.filter(|_| config.work == Work::Check) {
            Some(meta) => Ok((meta, true)),
            None => Meta::of(&file),
        };
        Ok(Opened {
            file,
            meta,
            held: None,
        })
    }

    /// Opens the file of `entry` ahead of its worker and, on a device that wants many reads
    /// in flight, reads the start of it into the page cache (into `scratch`, up to [`AHEAD`]
    /// bytes) unless it is there already: many such readers keep the device's queue full
    /// while the workers hash. (`posix_fadvise(WILLNEED)` would be the hint made for this,
    /// but measured on a virtio disk it blocks about as long as the read it asks for, one
    /// file at a time.) `None` where the worker is to open the file itself: names intact's
    /// temp files have, a run past its deadline, a process out of descriptors.
    pub(super) fn ahead(
        config: &Config,
        entry: &Entry,
        anchors: &[Anchor],
        gates: &Gates,
        scratch: &mut AlignedBuf,
        open_files: &Arc<OpenFiles>,
    ) -> Option<io::Result<Opened>> {
        let Entry::File {
            path, root, stat, ..
        } = entry
        else {
            return None;
        };
        if config.past_deadline() || path.file_name().and_then(atomic::temp_pid).is_some() {
            return None;
        }
        let held = Held::take(open_files)?;
        let opened = match Opened::open(config, &anchors[*root], path, *stat) {
            Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                return None;
            }
            other => other.map(|o| Opened {
                held: Some(held),
                ..o
            }),
        };
        if let Ok(Opened {
            file,
            meta: Ok((meta, true)),
            ..
        }) = &opened
            && config.work.reads_data()
            // A background scrub reads one request at a time.
            && !config.drop_cache
            && meta.size > 0
        {
            let gate = config
                .gate_spinning
                .then(|| gates.for_dev(meta.dev))
                .flatten();
            let buf = scratch.as_mut_slice();
            let cached = || {
                let mut byte = [0u8];
                matches!(crate::fs::sys::read_cached(file, &mut byte, 0), Some(Ok(1)))
            };
            match gate {
                // A device that claims to spin is judged by how it answers first reads made
                // alone; until then, and on a disk that spins, workers read one file at a time.
                Some(gate) if gate.probing() && !cached() => {
                    let _pass = gate.enter();
                    gate.probe_file(file, meta.size);
                }
                Some(_) => {}
                None if meta.size < hash::OVERLAP_MIN && !cached() => {
                    let len = buf.len().min(meta.size as usize);
                    // An error here is the worker's to meet and report.
                    let _ = rustix::io::pread(file, &mut buf[..len], 0);
                }
                None => {}
            }
        }
        Some(opened)
    }
}

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

/// Why reading a file gave no digest.
enum NoDigest {
    Failed(FileError),
    Changed(String),
    Interrupted,
}

impl NoDigest {
    /// The report to give instead; `None` if the run was interrupted.
    fn report(self, mut report: FileReport) -> Option<FileReport> {
        match self {
            NoDigest::Failed(e) => Some(fail(report, e)),
            NoDigest::Changed(what) => {
                report.status = Status::Changed;
                report.detail = Some(what);
                Some(report)
            }
            NoDigest::Interrupted => None,
        }
    }
}

/// One open regular file and what was known of it before its data was read.
struct Subject<'f> {
    /// The index of the root it was found under.
    root: usize,
    file: &'f File,
    meta: Meta,
    stored: Stored,
}

/// The digests one read produced.
struct Digests(Vec<Digest>);

impl Digests {
    /// The digest for `algo` (every caller asked for it).
    fn of(&self, algo: Algo) -> Digest {
        self.get(algo).expect("the algorithm was hashed")
    }

    /// The digest for `algo`, if the read computed it.
    fn get(&self, algo: Algo) -> Option<Digest> {
        self.0.iter().find(|d| d.algo == algo).copied()
    }
}

/// Why a damage mark is evidence of nothing against `tag`, if it is: one of another algorithm
/// cannot be compared, and one naming the tag's own digest calls the tag's own bytes damage
/// (a forged or garbled mark: intact never writes one).
fn mark_contradicts(mark: &Damage, tag: &Tag) -> Option<&'static str> {
    if mark.digest.algo != tag.digest.algo {
        Some("a damage mark of another algorithm than the tag's")
    } else if mark.digest == tag.digest {
        Some("a damage mark naming the tag's own digest, which no damage has")
    } else {
        None
    }
}

/// The report of an untagged file whose data is still the bytes found damaged before: damage,
/// not a new file.
fn untagged_damage(mut report: FileReport, damage: Damage) -> FileReport {
    report.status = Status::Corrupt;
    report.digest = Some(damage.digest);
    report.known_damage = Some(damage);
    report.detail = Some(format!(
        "its tag is gone, but its data is still the bytes found damaged at {}: not tagged \
         (`update --accept-corrupt` accepts it as it is)",
        crate::text::time(damage.found)
    ));
    report
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
        if report.unread().is_some()
            && !self.config.drop_cache
            && let Some(attrs) = attrs
            && let Some(held) = held.or_else(|| Held::take(&self.open_files))
        {
            report.open = Some(OpenFile::new(file, meta, attrs, held));
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

    /// What a check would expect from metadata alone, for the richest tag (of `algo`).
    fn show(&self, mut report: FileReport, s: &Subject, algo: Option<Algo>) -> FileReport {
        if let Some(algo) = algo {
            report.tag = s
                .stored
                .tags
                .iter()
                .find(|t| t.digest.algo == algo)
                .cloned();
            // A manifest that silently left tagged files out would pass for complete.
            if let (None, Some(other)) = (&report.tag, s.stored.best()) {
                return fail(report, FileError::OtherAlgorithm(other.digest.algo));
            }
        }
        if let Some(t) = &report.tag {
            report.status =
                classify::expect(t, s.meta.size, s.meta.mtime, self.config.mtime_window_ns);
            if s.stored.repairing {
                report.status = classify::after_interrupted_repair(report.status);
                report.detail = Some(INTERRUPTED_REPAIR.into());
            } else if let Some(damage) = s.stored.damage {
                // Found damaged and not dealt with since: a check will most likely agree.
                report.status = if t.mtime.is_some() {
                    Status::Corrupt
                } else {
                    Status::Mismatch
                };
                report.known_damage = Some(damage);
                report.detail = Some(format!(
                    "found damaged at {}, not yet repaired",
                    crate::text::time(damage.found)
                ));
            }
        }
        report
    }

    fn strip(&self, mut report: FileReport, s: &Subject) -> FileReport {
        report.status = Status::Ok;
        let mut removed = match xattr::remove_intact(s.file) {
            Ok(r) => r,
            Err(e) => return fail(report, FileError::RemoveTag(e)),
        };
        for &format in &self.config.compat {
            match xattr::remove_compat(s.file, format) {
                Ok(r) => removed |= r,
                Err(e) => return fail(report, FileError::RemoveTag(e)),
            }
        }
        if removed {
            report.action = Some(Action::Removed);
        }
        report
    }

    fn check(&mut self, report: FileReport, s: &Subject) -> Outcome {
        let Some(best) = s.stored.best() else {
            return Ok(report);
        };
        // Every tag present is verified, in one pass even if they use different algorithms.
        let (mut report, d) = self.read(report, s, s.stored.tags.iter().map(|t| t.digest.algo))?;
        self.judge(&mut report, best, s, &d);
        self.read_again(&mut report, best, s);
        let matches = |t: &Tag| t.digest == d.of(t.digest.algo);
        if s.stored.tags.iter().any(|t| matches(t) != matches(best)) {
            let names = |m: bool| {
                let n: Vec<&str> = s
                    .stored
                    .tags
                    .iter()
                    .filter(|&t| matches(t) == m)
                    .map(|t| t.format.name())
                    .collect();
                n.join(" and ")
            };
            report.detail = Some(format!(
                "tags disagree: the data matches the {} tag, not the {} tag",
                names(true),
                names(false)
            ));
            if !report.status.is_damage() {
                report.status = Status::Conflict;
            }
        }
        Ok(report)
    }

    fn tag(&mut self, mut report: FileReport, s: &Subject) -> Outcome {
        if s.stored.best().is_some() && !self.config.force {
            report.status = Status::AlreadyTagged;
            // Compat tags can be added without reading: from intact's SHA-256, while the file
            // is as it was when tagged.
            let window = self.config.mtime_window_ns;
            return Ok(
                match s.stored.intact().filter(|t| {
                    t.digest.algo == Algo::Sha256
                        && classify::expect(t, s.meta.size, s.meta.mtime, window) == Status::Ok
                }) {
                    Some(t) => self.write_compat(report, s, &t.digest),
                    None if !self.config.compat.is_empty() => {
                        report.detail = Some(
                            "no compat tags added: no SHA-256 to copy from an unchanged intact \
                             tag; `update --compat` reads the file"
                                .into(),
                        );
                        report
                    }
                    None => report,
                },
            );
        }
        let algo = self.config.new_algo();
        let (mut report, d) = self.read(
            report,
            s,
            [algo]
                .into_iter()
                .chain(s.stored.best().map(|t| t.digest.algo))
                .chain(s.stored.damage.map(|m| m.digest.algo)),
        )?;
        if let Some(t) = s.stored.best() {
            self.judge(&mut report, t, s, &d);
            // `--force` re-tags what it reads, but never blesses damage.
            if report.status.is_damage() {
                report.detail = Some(format!(
                    "{}; not re-tagged (`update --accept-corrupt` accepts it as it is)",
                    report.detail.as_deref().unwrap_or("its data is damaged")
                ));
                return Ok(report);
            }
        } else if let Some(damage) = self.still_damaged(s, &d) {
            return Ok(untagged_damage(report, damage));
        }
        report.digest = Some(d.of(algo));
        Ok(self.write(report, s, &d, algo, Action::Tagged))
    }

    /// For a file without a tag (stripped, lost in a copy), the damage found in it before, if
    /// its data is still those damaged bytes: by its own mark, else by what the state database
    /// remembers of its inode. Such a file is not tagged: a tag taken off does not make
    /// damaged bytes good.
    fn still_damaged(&self, s: &Subject, d: &Digests) -> Option<Damage> {
        if self.config.accept_corrupt {
            return None;
        }
        let same = |damage: &Damage| d.get(damage.digest.algo) == Some(damage.digest);
        let damage = s.stored.damage.filter(same).or_else(|| {
            let known = self.config.known_damage.as_ref()?;
            let fs = rustix::fs::fstatvfs(s.file).map_or(s.meta.dev as i64, |v| v.f_fsid as i64);
            known
                .iter()
                .filter(|((ino, _), _)| *ino == s.meta.ino)
                .flat_map(|(_, found)| found)
                .find(|(f, damage)| *f == fs && same(damage))
                .map(|(_, damage)| *damage)
        })?;
        Some(damage)
    }

    fn update(&mut self, mut report: FileReport, s: &Subject) -> Outcome {
        let Some(tag) = s.stored.best() else {
            let algo = self.config.new_algo();
            let algos = [algo]
                .into_iter()
                .chain(s.stored.damage.map(|m| m.digest.algo));
            let (mut report, d) = self.read(report, s, algos)?;
            if let Some(damage) = self.still_damaged(s, &d) {
                return Ok(untagged_damage(report, damage));
            }
            report.digest = Some(d.of(algo));
            return Ok(self.write(report, s, &d, algo, Action::Tagged));
        };
        // A re-tag keeps the tag's algorithm unless one was asked for; one pass computes all.
        let algo = self.config.algo.unwrap_or(tag.digest.algo);
        if algo == tag.digest.algo
            && self.unchanged(tag, s)
            && let Some(reads) = &self.config.sink_verifies
            && (reads.reads)(s.root, &tag.digest)
        {
            report.status = Status::AlreadyTagged;
            return Ok(report);
        }
        let all = s.stored.tags.iter().map(|t| t.digest.algo);
        let (mut report, d) =
            self.read(report, s, [tag.digest.algo, algo].into_iter().chain(all))?;
        self.judge(&mut report, tag, s, &d);
        self.read_again(&mut report, tag, s);
        let upgrade = s.stored.intact().is_none() || algo != tag.digest.algo;
        let mut report = match report.status {
            Status::Ok if upgrade => self.write(report, s, &d, algo, Action::Tagged),
            // The data is whole again: a repair's or a damage's mark left behind is only noise.
            Status::Ok if s.stored.repairing || s.stored.damage.is_some() => match unmark(s) {
                Ok(()) => {
                    report.action = Some(Action::Refreshed);
                    self.compat(report, s, &d)
                }
                Err(e) => fail(report, FileError::WriteTag(e)),
            },
            Status::Ok => self.compat(report, s, &d),
            // The disk holds the tag's bytes: nothing to accept or re-tag.
            Status::Unstable => report,
            Status::Corrupt | Status::Mismatch if !self.config.accept_corrupt => {
                // Nothing is written to a damaged file: a mark would move its ctime, and backup
                // tools would then store the damaged bytes over the good ones they hold. The
                // state database and its damage journal remember the damage instead.
                report.action = Some(Action::Kept);
                return Ok(report);
            }
            Status::Corrupt | Status::Mismatch => self.write(report, s, &d, algo, Action::Accepted),
            Status::Modified | Status::Older => self.write(report, s, &d, algo, Action::Tagged),
            Status::Touched => self.write(report, s, &d, algo, Action::Refreshed),
            _ => report,
        };
        // intact's tag now describes the data (and, on a re-tag, the other tools' tags the
        // file carries); another tool's that was not rewritten and describes other data is a
        // conflict the user should settle.
        let retagged = self.config.write
            && matches!(
                report.action,
                Some(Action::Tagged | Action::Refreshed | Action::Accepted)
            );
        if !retagged && report.status != Status::Error && !report.status.is_damage() {
            let stale: Vec<&str> = s
                .stored
                .tags
                .iter()
                .filter(|t| Compat::of(t.format).is_some_and(|c| !self.config.compat.contains(&c)))
                .filter(|t| t.digest != d.of(t.digest.algo))
                .map(|t| t.format.name())
                .collect();
            if !stale.is_empty() {
                report.status = Status::Conflict;
                report.detail = Some(format!(
                    "the {0} tag does not match the data: `--compat {0}` rewrites it, `strip --compat {0}` removes it",
                    stale.join(",")
                ));
            }
        }
        Ok(report)
    }

    /// Whether `tag`, the file's only one, describes it as it is, so that if its data still
    /// matches, an update has nothing to write; and it last changed long enough ago that a
    /// write after this would show in its ctime.
    fn unchanged(&self, tag: &Tag, s: &Subject) -> bool {
        let window = self.config.mtime_window_ns;
        s.stored.tags.len() == 1
            && tag.format == Format::Intact
            && !s.stored.repairing
            && s.stored.damage.is_none()
            && self.config.compat.is_empty()
            && self.config.manifest.is_none()
            && classify::expect(tag, s.meta.size, s.meta.mtime, window) == Status::Ok
            && Timestamp::now().nanos() - s.meta.ctime.nanos() >= racy_window(s.meta.ctime)
    }

    /// Tags files whose data matches the manifest.
    fn import(&mut self, report: FileReport, s: &Subject) -> Outcome {
        let Some(expected) = s.stored.best() else {
            return Ok(report);
        };
        // The file's own tags: compat tags already right need no write, and an intact tag that
        // finds the data damaged must survive a manifest made after the damage.
        let own = Subject {
            root: s.root,
            file: s.file,
            meta: s.meta,
            stored: xattr::read(s.file).unwrap_or_default(),
        };
        let mine = own.stored.intact();
        let algo = self
            .config
            .algo
            .or(mine.map(|t| t.digest.algo))
            .unwrap_or(expected.digest.algo);
        let (mut report, d) = self.read(
            report,
            s,
            [expected.digest.algo, algo]
                .into_iter()
                .chain(mine.map(|t| t.digest.algo)),
        )?;
        self.judge(&mut report, expected, s, &d);
        if report.status != Status::Ok {
            return Ok(report);
        }
        if let Some(mine) = mine {
            let verdict = classify::classify(
                mine,
                s.meta.size,
                s.meta.mtime,
                &d.of(mine.digest.algo),
                self.config.mtime_window_ns,
            );
            if verdict.is_damage() {
                report.status = verdict;
                report.digest = Some(d.of(mine.digest.algo));
                report.tag = Some(mine.clone());
                report.action = Some(Action::Kept);
                report.detail = Some(
                    "matches the manifest but not its own tag, under the same mtime: the manifest \
                     was made after the damage? Its tag is kept"
                        .into(),
                );
                return Ok(report);
            }
            if verdict == Status::Ok && mine.digest.algo == algo {
                return Ok(self.compat(report, &own, &d));
            }
        }
        Ok(self.write(report, &own, &d, algo, Action::Tagged))
    }

    /// Reads the file once for `algos` and whatever the compat tags need; on failure, the
    /// report to give instead.
    fn read(
        &mut self,
        mut report: FileReport,
        s: &Subject,
        algos: impl IntoIterator<Item = Algo>,
    ) -> Result<(FileReport, Digests), Option<FileReport>> {
        let compat = (!self.config.compat.is_empty()).then_some(Algo::Sha256);
        let algos = unique(algos.into_iter().chain(compat));
        match self.hash(&mut report, s.file, &s.meta, &algos) {
            Ok(d) => Ok((report, Digests(d))),
            Err(e) => Err(e.report(report)),
        }
    }

    /// Before a file is called damaged, its data is read a second time around the page cache
    /// (its pages dropped, then read as a background scrub reads): bit rot is on the disk and
    /// reads the same again; bytes changed between the disk and the CPU (memory, a cable, a
    /// controller) do not. A second read that matches the tag makes the verdict `unstable`;
    /// one that matches neither read is `corrupt`, as it was. Damage known from before (the
    /// same damaged bytes) needs no second read. And damage known from before ends only when
    /// two reads, the second around the page cache, match the tag: a file once `unstable`
    /// is not cleared by one lucky read.
    fn read_again(&mut self, report: &mut FileReport, tag: &Tag, s: &Subject) {
        let first = report.digest;
        let damaged = matches!(report.status, Status::Corrupt | Status::Mismatch);
        let whole_again =
            matches!(report.status, Status::Ok | Status::Touched) && report.known_damage.is_some();
        if !(damaged || whole_again) || report.known_damage.is_some_and(|k| Some(k.digest) == first)
        {
            return;
        }
        crate::fs::sys::drop_pages(s.file, 0, s.meta.size);
        let opts = ReadOptions {
            drop_cache: true,
            map: false,
            gate: None,
            cold: None,
            crowd: None,
            lend: None,
        };
        // The file's bytes are counted once, in the report and in the progress.
        let hashed = hash::hash_file(
            s.file,
            &[tag.digest.algo],
            &mut self.bufs,
            s.meta.size,
            opts,
            self.cancel,
            &std::sync::atomic::AtomicU64::new(0),
        );
        let Ok((second, n)) = hashed else { return };
        let unchanged =
            Meta::of(s.file).is_ok_and(|(now, _)| now.changes_since(&s.meta, n).is_none());
        if !unchanged {
            return;
        }
        if whole_again {
            if let Some(&second) = second.first().filter(|d| **d != tag.digest) {
                // The damage it is remembered by is the read that did not match.
                report.digest = Some(second);
                report.status = Status::Unstable;
                report.detail = Some(
                    "it was found damaged before, and of two reads now only the first matched \
                     the tag: the bytes change between the disk and the CPU (test the memory, \
                     check the cables and the disk's SMART log)"
                        .into(),
                );
            }
            return;
        }
        if second.first() == Some(&tag.digest) {
            report.status = Status::Unstable;
            report.detail = Some(
                "the first read did not match the tag, a second read around the page cache did: \
                 the disk holds good bytes, and memory, a cable or a controller changed them on \
                 the way (test the memory, check the cables and the disk's SMART log)"
                    .into(),
            );
        }
    }

    /// Classifies the file against `tag` with the digest just computed, and against the
    /// damage found in it before, if any.
    fn judge(&self, report: &mut FileReport, tag: &Tag, s: &Subject, d: &Digests) {
        let fresh = d.of(tag.digest.algo);
        report.digest = Some(fresh);
        report.status = classify::classify(
            tag,
            s.meta.size,
            s.meta.mtime,
            &fresh,
            self.config.mtime_window_ns,
        );
        if s.stored.repairing {
            report.status = classify::after_interrupted_repair(report.status);
            if report.status.is_damage() {
                report.detail = Some(INTERRUPTED_REPAIR.into());
            }
        }
        if let Some(why) = s.stored.damage.and_then(|m| mark_contradicts(&m, tag)) {
            report.malformed.push((
                crate::core::tag::names::CORRUPT,
                crate::core::tag::Malformed(why.into()),
            ));
        }
        let Some(damage) = self.known_damage(tag, s) else {
            return;
        };
        let (status, since) = classify::since_damage(tag, report.status, &fresh, &damage);
        let found = crate::text::time(damage.found);
        let detail = match since {
            SinceDamage::Same if status != report.status => Some(format!(
                "still the damaged bytes found at {found}: its mtime moved since, which makes \
                 it no edit"
            )),
            SinceDamage::Same | SinceDamage::Worse => {
                Some(format!("found damaged at {found}, not yet repaired"))
            }
            SinceDamage::Edited => Some(format!(
                "edited since it was found damaged at {found}: that damage is over"
            )),
            SinceDamage::Whole => None,
        };
        report.status = status;
        report.known_damage = Some(damage);
        if report.detail.is_none() {
            report.detail = detail;
        }
    }

    /// The damage found in the file before, with its tag's algorithm: the file's own mark,
    /// else what the state database remembers of its inode and tag.
    fn known_damage(&self, tag: &Tag, s: &Subject) -> Option<Damage> {
        s.stored
            .damage
            .filter(|m| mark_contradicts(m, tag).is_none())
            .or_else(|| {
                let known = self.config.known_damage.as_ref()?;
                let found = known.get(&(s.meta.ino, tag.digest))?;
                let fs =
                    rustix::fs::fstatvfs(s.file).map_or(s.meta.dev as i64, |v| v.f_fsid as i64);
                found.iter().find(|(f, _)| *f == fs).map(|(_, d)| *d)
            })
            .filter(|d| d.digest.algo == tag.digest.algo)
    }

    /// Reads the whole file once, feeding each of `algos`, and makes sure it did not change
    /// meanwhile: a digest of a file in flux matches no version of it.
    fn hash(
        &mut self,
        report: &mut FileReport,
        file: &File,
        before: &Meta,
        algos: &[Algo],
    ) -> Result<Vec<Digest>, NoDigest> {
        self.find_gate(before.dev);
        let gate = closed_gate(&self.gate, self.holding, before.dev);
        // A background scrub has no readers to wake.
        let cold = (!self.cold.met() && !self.config.drop_cache).then_some(self.cold);
        let mut opts = ReadOptions {
            // With O_DIRECT nothing enters the cache, and dropping would evict what the user
            // had cached.
            drop_cache: self.config.drop_cache && !crate::fs::sys::is_direct(file),
            map: !self.config.drop_cache,
            gate: gate.map(|g| &**g),
            cold,
            crowd: None,
            lend: None,
        };
        // A write in the same clock tick as a file's last change would not move its ctime.
        // So a file changed moments ago is left until that tick has passed, then looked at
        // again: from there on, any write shows in the ctime.
        let racy = racy_window(before.ctime);
        let ctime_ago = Timestamp::now().nanos() - before.ctime.nanos();
        if ctime_ago < racy {
            let wait = (racy - ctime_ago.max(0)) as u64;
            std::thread::sleep(std::time::Duration::from_nanos(wait));
            let (now, _) = Meta::of(file).map_err(|e| NoDigest::Failed(FileError::Read(e)))?;
            if let Some(change) = now.changes_since(before, before.size) {
                return Err(NoDigest::Changed(change));
            }
        }
        // A large file (the last of its batch: a batch closes at BATCH_BYTES) hashed on one
        // core lends its slot, and takes none back, so never waits for one: not even
        // holding a disk's gate.
        let crowd = self.slot.as_ref().and_then(Slot::crowd);
        // The slot, and once lent the count of the file lent for, while it is hashed.
        // (Called on the hashing thread, held by the reader's too: hence the lock.)
        let held = Mutex::new((self.slot.take(), None));
        let lend = || {
            let mut held = held.lock().unwrap_or_else(|e| e.into_inner());
            let (slot, lent) = &mut *held;
            if lent.is_none() {
                *lent = slot.as_mut().and_then(Slot::lend);
            }
        };
        opts.crowd = crowd;
        opts.lend = Some(&lend);
        let hashed = hash::hash_file(
            file,
            algos,
            &mut self.bufs,
            before.size,
            opts,
            self.cancel,
            &self.progress.bytes,
        );
        let (slot, lent) = held.into_inner().unwrap_or_else(|e| e.into_inner());
        self.slot = slot;
        drop(lent);
        let (digests, n) = hashed.map_err(|e| match e {
            HashError::Interrupted => NoDigest::Interrupted,
            HashError::Io(e) => NoDigest::Failed(FileError::Read(e)),
        })?;
        report.bytes_read = n;
        let (after, _) = Meta::of(file).map_err(|e| NoDigest::Failed(FileError::Read(e)))?;
        match after.changes_since(before, n) {
            Some(change) => Err(NoDigest::Changed(change)),
            None => Ok(digests),
        }
    }

    /// Looks up the gate of device `dev` (see [`Gates::for_dev`]), unless it is the last one.
    fn find_gate(&mut self, dev: u64) {
        if self.config.gate_spinning && self.gate.as_ref().is_none_or(|(d, _)| *d != dev) {
            self.gate = Some((dev, self.gates.for_dev(dev)));
        }
    }

    /// Writes intact's tag for the `algo` digest and the metadata read before hashing, then
    /// the requested compat tags.
    fn write(
        &self,
        mut report: FileReport,
        s: &Subject,
        d: &Digests,
        algo: Algo,
        action: Action,
    ) -> FileReport {
        if !self.config.write {
            return report;
        }
        let value = tag::encode(&d.of(algo), s.meta.size, s.meta.mtime, Timestamp::now().sec);
        if let Err(e) = xattr::write_intact(s.file, &value) {
            return fail(report, FileError::WriteTag(e));
        }
        // The tag now describes the data, whatever a stopped repair or damage did to it.
        if let Err(e) = unmark(s) {
            return fail(report, FileError::WriteTag(e));
        }
        report.action = Some(action);
        // The digest reported is the one now stored (a re-tag may change the algorithm).
        report.digest = Some(d.of(algo));
        self.retag_compat(report, s, d)
    }

    /// Writes the requested compat tags from the SHA-256 just computed.
    fn compat(&self, report: FileReport, s: &Subject, d: &Digests) -> FileReport {
        if self.config.compat.is_empty() {
            return report;
        }
        self.write_compat(report, s, &d.of(Algo::Sha256))
    }

    /// As [`Worker::compat`], for a file intact just re-tagged: with the tags of other tools
    /// it already carries. They were there, so its owner uses both tools (moving from
    /// cshatag, or working beside it): left describing the old data, they would make every
    /// later check a conflict.
    fn retag_compat(&self, report: FileReport, s: &Subject, d: &Digests) -> FileReport {
        let Some(sha256) = d.get(Algo::Sha256) else {
            return report;
        };
        let mut formats = self.config.compat.clone();
        formats.extend(s.stored.tags.iter().filter_map(|t| Compat::of(t.format)));
        formats.sort();
        formats.dedup();
        self.write_formats(report, s, &sha256, &formats)
    }

    /// Writes each requested compat tag that does not already say the same.
    fn write_compat(&self, report: FileReport, s: &Subject, sha256: &Digest) -> FileReport {
        self.write_formats(report, s, sha256, &self.config.compat)
    }

    /// Writes each tag of `formats` that does not already say the same.
    fn write_formats(
        &self,
        mut report: FileReport,
        s: &Subject,
        sha256: &Digest,
        formats: &[Compat],
    ) -> FileReport {
        if !self.config.write {
            return report;
        }
        for &format in formats {
            if s.stored.compat_current(format, sha256, s.meta.mtime) {
                continue;
            }
            if let Err(e) = xattr::write_compat(s.file, format, sha256, s.meta.mtime) {
                return fail(report, FileError::WriteTag(e));
            }
            report.action.get_or_insert(Action::Tagged);
        }
        report
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

/// The algorithms in first-seen order, each once.
fn unique(algos: impl IntoIterator<Item = Algo>) -> Vec<Algo> {
    let mut out = Vec::with_capacity(2);
    for a in algos {
        if !out.contains(&a) {
            out.push(a);
        }
    }
    out
}

/// The gate found for device `dev`, while it is closed and not `held` by this worker.
fn closed_gate(
    found: &Option<(u64, Option<Arc<Gate>>)>,
    held: Option<u64>,
    dev: u64,
) -> Option<&Arc<Gate>> {
    match found {
        Some((d, Some(gate))) if *d == dev && held != Some(dev) && !gate.is_open() => Some(gate),
        _ => None,
    }
}

/// `report` with `error` attached (see [`FileReport::fail`]).
fn fail(mut report: FileReport, error: FileError) -> FileReport {
    report.fail(error);
    report
}

/// What a check says of a file that a repair stopped rewriting.
const INTERRUPTED_REPAIR: &str = "a repair stopped while rewriting it in place: its bytes may be \
     partly rewritten (its mtime moved with them); `intact repair` restores it";

/// How coarse file timestamps can be: kernels before 6.13 stamp files from a clock that
/// moves in ticks of up to 10 ms ("racy" files, as git calls them, changed less than this
/// before being read, are waited for).
const RACY_NS: i128 = 20_000_000;

/// How coarse timestamps are on file systems that keep whole seconds (ext4 with 128-byte
/// inodes, ext3) or even two (FAT): a write within that of the last one may not move the
/// mtime at all, so a tag taken then could later call an edit corruption.
const COARSE_NS: i128 = 2_000_000_000;

/// How long after its last change a file must be left alone before its digest can be
/// trusted to tell a later write apart. The ctime, which no program can set, tells the
/// file system's granularity: a whole second (one chance in a billion otherwise) means a
/// coarse one.
fn racy_window(ctime: Timestamp) -> i128 {
    if ctime.nsec == 0 { COARSE_NS } else { RACY_NS }
}

fn is_symlink(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink())
}
