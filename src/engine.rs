//! The engine: walks the trees, processes files on all cores, hands back one report per file
//! in walk order.
//!
//! One walker thread feeds a bounded queue; workers open, hash and tag; the calling thread
//! reorders their reports and passes them to a sink. A window of tokens bounds how far the
//! walker may run ahead of the oldest unreported file, so memory stays flat even when one
//! huge file holds up the output of thousands of small ones.

use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::io;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam_channel::bounded;

use crate::core::classify::{self, Status};
use crate::core::digest::{Algo, Digest};
use crate::core::manifest::Expected;
use crate::core::tag::{self, Format, Tag, Timestamp};
use crate::fs::anchor::Anchor;
use crate::fs::atomic;
use crate::fs::device::Gates;
use crate::fs::read::{self, AlignedBuf, HashError, ReadOptions};
use crate::fs::walk::{self, Entry, SkipReason, WalkOptions};
use crate::fs::xattr::{self, Stored};

/// The operation to perform on each file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verb {
    /// Hash and tag files without a valid tag.
    Tag,
    /// Re-hash tagged files and classify them; never writes.
    Check,
    /// Check, then make tags match legitimately changed data.
    Update,
    /// Remove intact's tag.
    Strip,
    /// Print stored tags and what a check would expect, without reading data.
    Show,
    /// List tags as a manifest, without reading data.
    Export,
    /// Tag files whose data matches a manifest.
    Import,
    /// Update, then copy what is intact into an archive (the copying is the caller's).
    Archive,
    /// Check, then restore damaged files from good copies (the restoring is the caller's).
    Repair,
    /// Verify an archive's members (the reading is the archive module's, not the engine's).
    Verify,
    /// Update, then compute parity for what is intact (the parity is the caller's).
    Protect,
}

impl Verb {
    /// Whether the verb reads file data (the others only look at tags and metadata).
    pub fn reads_data(self) -> bool {
        matches!(
            self,
            Verb::Tag
                | Verb::Check
                | Verb::Update
                | Verb::Import
                | Verb::Archive
                | Verb::Repair
                | Verb::Verify
                | Verb::Protect
        )
    }

    /// Whether the verb changes files (tags, data, or intact's own temp files left over).
    pub fn writes(self) -> bool {
        matches!(
            self,
            Verb::Tag
                | Verb::Update
                | Verb::Strip
                | Verb::Import
                | Verb::Archive
                | Verb::Repair
                | Verb::Protect
        )
    }

    /// The verb's name.
    pub fn name(self) -> &'static str {
        match self {
            Verb::Tag => "tag",
            Verb::Check => "check",
            Verb::Update => "update",
            Verb::Strip => "strip",
            Verb::Show => "show",
            Verb::Export => "export",
            Verb::Import => "import",
            Verb::Archive => "archive",
            Verb::Repair => "repair",
            Verb::Verify => "verify",
            Verb::Protect => "protect",
        }
    }
}

/// Everything the engine needs to know, decided once from the command line.
#[derive(Clone, Debug)]
pub struct Config {
    /// What to do.
    pub verb: Verb,
    /// The algorithm for new tags; re-tags keep the existing tag's algorithm unless set.
    pub algo: Option<Algo>,
    /// `tag`: re-hash and re-tag files that already have a tag.
    pub force: bool,
    /// `update`: re-tag corrupt files too (the user says the change was intended).
    pub accept_corrupt: bool,
    /// mtimes closer than this count as equal.
    pub mtime_window_ns: u64,
    /// Worker threads.
    pub threads: usize,
    /// Leave the page cache as it was (background scrubs): read with O_DIRECT, which also
    /// verifies what is on the medium rather than a cached copy; where the file system
    /// refuses that, drop what was read.
    pub drop_cache: bool,
    /// One uncached reader at a time per spinning disk (cached data is read by all workers).
    pub gate_spinning: bool,
    /// What to walk and what to leave out.
    pub walk: WalkOptions,
    /// Other tools' tags to write beside intact's (`tag`, `update`, `import`) or to remove
    /// (`strip`).
    pub compat: Vec<Format>,
    /// Digests from a manifest, instead of xattrs (`check --manifest`, `import`).
    pub manifest: Option<Arc<Expected>>,
    /// Whether tags may be written. Without, a writing verb still reads and judges every
    /// file as it would, and reports what it would have written as not done.
    pub write: bool,
}

impl Config {
    /// A configuration with defaults for `verb`.
    pub fn new(verb: Verb) -> Self {
        Config {
            verb,
            algo: None,
            force: false,
            accept_corrupt: false,
            mtime_window_ns: 0,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            drop_cache: false,
            gate_spinning: true,
            walk: WalkOptions::default(),
            compat: Vec::new(),
            manifest: None,
            write: true,
        }
    }

    fn new_algo(&self) -> Algo {
        self.algo.unwrap_or(Algo::Sha256)
    }
}

/// What was done to a file's tags.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    /// A tag was written with a freshly computed digest.
    Tagged,
    /// The digest was unchanged; the tag was rewritten with the file's current mtime.
    Refreshed,
    /// The file looks corrupt: its old tag was kept as evidence.
    Kept,
    /// intact's tag was removed.
    Removed,
    /// The file was copied into an archive.
    Archived,
    /// Recovery data was written for the file.
    Protected,
    /// The file's data was restored from a verified copy.
    Repaired,
}

impl Action {
    /// Every action, in declaration order (summaries count by `action as usize`).
    pub const ALL: [Action; 7] = [
        Action::Tagged,
        Action::Refreshed,
        Action::Kept,
        Action::Removed,
        Action::Archived,
        Action::Protected,
        Action::Repaired,
    ];

    /// The word used in output.
    pub fn name(self) -> &'static str {
        match self {
            Action::Tagged => "tagged",
            Action::Refreshed => "refreshed",
            Action::Kept => "kept",
            Action::Removed => "removed",
            Action::Archived => "archived",
            Action::Protected => "protected",
            Action::Repaired => "repaired",
        }
    }
}

/// Why a file could not be processed.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// Opening failed.
    #[error("cannot open: {}", cause(.0))]
    Open(io::Error),
    /// Reading the data failed.
    #[error("cannot read: {}", cause(.0))]
    Read(io::Error),
    /// Reading the extended attributes failed.
    #[error("cannot read tags: {}", cause(.0))]
    ReadTags(io::Error),
    /// Writing the tag failed.
    #[error("cannot write tag: {}", cause(.0))]
    WriteTag(io::Error),
    /// Removing the tag failed.
    #[error("cannot remove tag: {}", cause(.0))]
    RemoveTag(io::Error),
    /// The walk could not look at this path.
    #[error("{}", cause(.0))]
    Walk(io::Error),
    /// A temp file left by a killed run could not be removed.
    #[error("cannot remove this temp file of a killed run: {}", cause(.0))]
    RemoveTemp(io::Error),
    /// Restoring the file's data failed; the file was left as it was.
    #[error("cannot repair: {}; the file was left as it was", cause(.0))]
    Repair(io::Error),
    /// `export` was asked for one algorithm; the file is tagged with the other.
    #[error("tagged with {0} only: `export --algo {0}` lists it")]
    OtherAlgorithm(Algo),
}

impl FileError {
    /// A stable, machine-readable name for the cause.
    pub fn kind(&self) -> &'static str {
        let e = match self {
            FileError::Open(e)
            | FileError::Read(e)
            | FileError::ReadTags(e)
            | FileError::WriteTag(e)
            | FileError::RemoveTag(e)
            | FileError::RemoveTemp(e)
            | FileError::Repair(e)
            | FileError::Walk(e) => e,
            FileError::OtherAlgorithm(_) => return "other-algorithm",
        };
        match e.raw_os_error() {
            Some(libc::ENOTSUP) => "no-xattr-support",
            Some(libc::EACCES | libc::EPERM) => "permission-denied",
            Some(libc::ENOENT) => "vanished",
            Some(libc::ENOSPC | libc::E2BIG | libc::EDQUOT) => "no-space",
            Some(libc::EROFS) => "read-only-file-system",
            Some(libc::EIO) => "io-error",
            _ => "other",
        }
    }
}

/// The cause in words a user can act on.
fn cause(e: &io::Error) -> String {
    let hint = match e.raw_os_error() {
        Some(libc::ENOTSUP) => "the file system does not support user extended attributes",
        Some(libc::ENOENT) => "the file vanished",
        Some(libc::ENOSPC) => {
            "no space left (on the device or in the file's extended attribute block)"
        }
        Some(libc::E2BIG) => "the extended attribute is too large for this file system",
        Some(libc::EDQUOT) => "disk quota exceeded",
        Some(libc::EROFS) => "read-only file system",
        Some(libc::EIO) => "input/output error (the device could not read it: a failing disk?)",
        Some(libc::ELOOP) => "a directory on its path is now a symbolic link (not followed)",
        _ => return e.to_string(),
    };
    format!("{hint} ({e})")
}

/// The outcome for one path: a value, rendered by the reporter.
#[derive(Debug)]
pub struct FileReport {
    /// The path as walked.
    pub path: PathBuf,
    /// What was found.
    pub status: Status,
    /// What was done about it.
    pub action: Option<Action>,
    /// The file's size now.
    pub size: Option<u64>,
    /// The file's mtime when it was looked at.
    pub mtime: Option<Timestamp>,
    /// The tag the verdict is based on.
    pub tag: Option<Tag>,
    /// The digest just computed, if the data was read.
    pub digest: Option<Digest>,
    /// Why the file was skipped.
    pub skip: Option<SkipReason>,
    /// Why the file could not be processed.
    pub error: Option<FileError>,
    /// More about the status: what changed while reading, which tags disagree.
    pub detail: Option<String>,
    /// Malformed tags found on the file (attribute, reason).
    pub malformed: Vec<(&'static str, tag::Malformed)>,
    /// Bytes of data read.
    pub bytes_read: u64,
}

impl FileReport {
    /// A report with `status` and nothing else known yet.
    pub fn new(path: PathBuf, status: Status) -> Self {
        FileReport {
            path,
            status,
            action: None,
            size: None,
            mtime: None,
            tag: None,
            digest: None,
            skip: None,
            error: None,
            detail: None,
            malformed: Vec::new(),
            bytes_read: 0,
        }
    }

    fn error(path: PathBuf, error: FileError) -> Self {
        FileReport {
            error: Some(error),
            ..FileReport::new(path, Status::Error)
        }
    }

    /// Attaches an error. A damage verdict already reached stays the status: the error (say,
    /// a re-tag that could not be written) must not hide the corruption.
    pub(crate) fn fail(&mut self, error: FileError) {
        if !self.status.is_damage() {
            self.status = Status::Error;
        }
        self.action = None;
        self.error = Some(error);
    }

    fn skipped(path: PathBuf, reason: SkipReason) -> Self {
        FileReport {
            skip: Some(reason),
            ..FileReport::new(path, Status::Skipped)
        }
    }
}

/// Live counters for a progress display.
#[derive(Debug, Default)]
pub struct Progress {
    /// Bytes hashed so far.
    pub bytes: AtomicU64,
    /// Files reported so far.
    pub files: AtomicU64,
    /// The file most recently started.
    pub current: Mutex<PathBuf>,
}

/// Work travels in batches, so that small files cost a few channel operations per batch
/// rather than per file: a batch closes at this many entries ...
const BATCH_FILES: usize = 64;
/// ... or at this many bytes of data, so one large file does not hold up the next.
const BATCH_BYTES: u64 = 1 << 20;
/// How many batches the walker may run ahead of the oldest one not yet reported.
const WINDOW: usize = 64;

/// Runs `config.verb` over `roots`, calling `sink` with each file's report in walk order.
/// Stops early, without a report for unfinished files, once `cancel` is set.
pub fn run(
    config: &Config,
    roots: &[PathBuf],
    cancel: &AtomicBool,
    progress: &Progress,
    mut sink: impl FnMut(FileReport),
) -> Result<(), ignore::Error> {
    let threads = config.threads.max(1);
    let (job_tx, job_rx) = bounded::<(u64, Vec<Entry>)>(threads * 2);
    let (done_tx, done_rx) = bounded::<(u64, Vec<Option<FileReport>>)>(WINDOW);
    let (token_tx, token_rx) = bounded::<()>(WINDOW);
    let gates = &Gates::default();
    let anchors = &roots.iter().map(|r| Anchor::new(r)).collect::<Vec<_>>();

    std::thread::scope(|s| {
        let walker = s.spawn(move || {
            let mut seq = 0u64;
            let mut batch = Vec::with_capacity(BATCH_FILES);
            let mut bytes = 0;
            let mut send = |batch: &mut Vec<Entry>| {
                if cancel.load(Ordering::Relaxed) || token_tx.send(()).is_err() {
                    return ControlFlow::Break(());
                }
                let full = std::mem::replace(batch, Vec::with_capacity(BATCH_FILES));
                if job_tx.send((seq, full)).is_err() {
                    return ControlFlow::Break(());
                }
                seq += 1;
                ControlFlow::Continue(())
            };
            let mut visit = |entry: Entry| {
                if let Entry::File { size, .. } = &entry {
                    bytes += size;
                }
                batch.push(entry);
                if batch.len() < BATCH_FILES && bytes < BATCH_BYTES {
                    return ControlFlow::Continue(());
                }
                bytes = 0;
                send(&mut batch)
            };
            // import visits what its manifest lists, beneath its one root; the others walk.
            let walked = match (&config.manifest, config.verb) {
                (Some(m), Verb::Import) => {
                    let _ = m.listed().try_for_each(|(_, path)| {
                        visit(Entry::File {
                            path,
                            size: 0,
                            root: 0,
                        })
                    });
                    Ok(())
                }
                _ => walk::walk(roots, &config.walk, visit),
            };
            if !batch.is_empty() {
                let _ = send(&mut batch);
            }
            walked
        });
        for _ in 0..threads {
            let (job_rx, done_tx) = (job_rx.clone(), done_tx.clone());
            s.spawn(move || {
                let mut worker = Worker {
                    config,
                    cancel,
                    progress,
                    gates,
                    bufs: [
                        AlignedBuf::new(read::BUF_SIZE),
                        AlignedBuf::new(read::BUF_SIZE),
                    ],
                };
                for (seq, batch) in job_rx {
                    let reports = batch
                        .into_iter()
                        .map(|entry| match entry {
                            Entry::File { path, root, .. } => worker.process(path, &anchors[root]),
                            Entry::Skip(path, reason) => Some(FileReport::skipped(path, reason)),
                            Entry::Error(path, e) => {
                                Some(FileReport::error(path, FileError::Walk(e)))
                            }
                        })
                        .collect();
                    if done_tx.send((seq, reports)).is_err() {
                        break;
                    }
                }
            });
        }
        drop((job_rx, done_tx));

        let mut pending = BTreeMap::new();
        let mut next = 0u64;
        // With a manifest, what it lists but the tree lacks is reported at the end.
        let mut seen = HashSet::new();
        for (seq, reports) in done_rx {
            pending.insert(seq, reports);
            while let Some(reports) = pending.remove(&next) {
                let _ = token_rx.recv();
                next += 1;
                for report in reports.into_iter().flatten() {
                    if let Some(m) = &config.manifest {
                        seen.insert(m.key(&report.path));
                    }
                    progress.files.fetch_add(1, Ordering::Relaxed);
                    sink(report);
                }
            }
        }
        drop(token_rx);
        let walked = walker.join().expect("walker thread panicked");
        if let Some(m) = &config.manifest
            && !cancel.load(Ordering::Relaxed)
        {
            for (key, path) in m.listed() {
                if !seen.contains(key) {
                    sink(FileReport::new(path, Status::Missing));
                }
            }
        }
        walked
    })
}

/// The file's identity and state, from `fstat`.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Meta {
    dev: u64,
    size: u64,
    mtime: Timestamp,
    ctime: Timestamp,
}

impl Meta {
    fn of(file: &File) -> io::Result<(Meta, bool)> {
        let st = rustix::fs::fstat(file)?;
        let regular =
            rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::RegularFile;
        let meta = Meta {
            dev: st.st_dev as u64,
            size: st.st_size as u64,
            mtime: Timestamp {
                sec: st.st_mtime,
                nsec: st.st_mtime_nsec as u32,
            },
            ctime: Timestamp {
                sec: st.st_ctime,
                nsec: st.st_ctime_nsec as u32,
            },
        };
        Ok((meta, regular))
    }

    /// Describes how `self` (after reading) differs from `before`, if it does.
    fn changes_since(&self, before: &Meta, bytes_read: u64) -> Option<String> {
        if self.size != before.size || bytes_read != before.size {
            Some(format!(
                "size changed while being read ({} bytes before, {} read, {} after)",
                before.size, bytes_read, self.size
            ))
        } else if self.mtime != before.mtime {
            Some("modified while being read".into())
        } else if self.ctime != before.ctime {
            Some("metadata changed while being read".into())
        } else {
            None
        }
    }
}

struct Worker<'a> {
    config: &'a Config,
    cancel: &'a AtomicBool,
    progress: &'a Progress,
    gates: &'a Gates,
    bufs: [AlignedBuf; 2],
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
    file: &'f File,
    meta: Meta,
    stored: Stored,
}

/// The digests one read produced.
struct Digests(Vec<Digest>);

impl Digests {
    /// The digest for `algo` (every caller asked for it).
    fn of(&self, algo: Algo) -> Digest {
        *self
            .0
            .iter()
            .find(|d| d.algo == algo)
            .expect("the algorithm was hashed")
    }
}

/// A verb's result for a file: its report, or, having stopped early, the report to give
/// instead (`None` when the run was interrupted).
type Outcome = Result<FileReport, Option<FileReport>>;

// Both sides of an Outcome carry a report: boxing the error side would only add an allocation.
#[allow(clippy::result_large_err)]
impl Worker<'_> {
    /// Processes one regular file found under `anchor`'s root; `None` if the run was
    /// interrupted meanwhile.
    fn process(&mut self, path: PathBuf, anchor: &Anchor) -> Option<FileReport> {
        if let Ok(mut current) = self.progress.current.lock() {
            current.clone_from(&path);
        }
        if let Some(pid) = path.file_name().and_then(atomic::temp_pid) {
            return Some(self.temp_file(path, pid, anchor));
        }
        let direct = self.config.verb.reads_data() && self.config.drop_cache;
        let file = match anchor.open(&path, direct) {
            Ok(f) => f,
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) && is_symlink(&path) => {
                return Some(FileReport::skipped(path, SkipReason::Symlink));
            }
            Err(e) => return Some(FileReport::error(path, FileError::Open(e))),
        };
        let meta = match Meta::of(&file) {
            Ok((_, false)) => return Some(FileReport::skipped(path, SkipReason::Special)),
            Ok((m, true)) => m,
            Err(e) => return Some(FileReport::error(path, FileError::Open(e))),
        };
        // With a manifest, it alone says what the data should be.
        let stored = match &self.config.manifest {
            Some(m) => Stored {
                tags: m.tag(&path).into_iter().collect(),
                ..Stored::default()
            },
            None => match xattr::read(&file) {
                Ok(s) => s,
                Err(e) => return Some(FileReport::error(path, FileError::ReadTags(e))),
            },
        };
        let report = FileReport {
            size: Some(meta.size),
            mtime: Some(meta.mtime),
            tag: stored.best().cloned(),
            malformed: stored.malformed.clone(),
            ..FileReport::new(path, Status::New)
        };
        let s = Subject {
            file: &file,
            meta,
            stored,
        };
        let outcome = match self.config.verb {
            Verb::Show => Ok(self.show(report, &s, None)),
            // The richest tag of the manifest's algorithm, untouched since it was written.
            Verb::Export => Ok(self.show(report, &s, Some(self.config.new_algo()))),
            Verb::Strip => Ok(self.strip(report, &s)),
            Verb::Check | Verb::Repair | Verb::Verify => self.check(report, &s),
            Verb::Tag => self.tag(report, &s),
            Verb::Update | Verb::Archive | Verb::Protect => self.update(report, &s),
            Verb::Import => self.import(report, &s),
        };
        outcome.map_or_else(|stopped| stopped, Some)
    }

    /// A file named as intact names its temp files: never read or tagged. Left by a run that
    /// was killed, a writing verb removes it.
    fn temp_file(&self, path: PathBuf, pid: u32, anchor: &Anchor) -> FileReport {
        let name = path.file_name().unwrap_or_default().to_os_string();
        if !atomic::is_stale(&name) {
            return FileReport::skipped(path, SkipReason::Temporary);
        }
        let mut report = FileReport::skipped(path, SkipReason::Leftover);
        let cleans_up = self.config.verb.writes() && self.config.write;
        if !cleans_up {
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
            report.status = Status::Tagged;
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
                .chain(s.stored.best().map(|t| t.digest.algo)),
        )?;
        if let Some(t) = s.stored.best() {
            self.judge(&mut report, t, s, &d);
        }
        report.digest = Some(d.of(algo));
        Ok(self.write(report, s, &d, algo, Action::Tagged))
    }

    fn update(&mut self, report: FileReport, s: &Subject) -> Outcome {
        let Some(tag) = s.stored.best() else {
            let algo = self.config.new_algo();
            let (mut report, d) = self.read(report, s, [algo])?;
            report.digest = Some(d.of(algo));
            return Ok(self.write(report, s, &d, algo, Action::Tagged));
        };
        // A re-tag keeps the tag's algorithm unless one was asked for; one pass computes all.
        let algo = self.config.algo.unwrap_or(tag.digest.algo);
        let all = s.stored.tags.iter().map(|t| t.digest.algo);
        let (mut report, d) =
            self.read(report, s, [tag.digest.algo, algo].into_iter().chain(all))?;
        self.judge(&mut report, tag, s, &d);
        let upgrade = s.stored.intact().is_none() || algo != tag.digest.algo;
        let mut report = match report.status {
            Status::Ok if upgrade => self.write(report, s, &d, algo, Action::Tagged),
            // The data is whole again: a repair's mark left behind is only noise.
            Status::Ok if s.stored.repairing => match xattr::unmark_repairing(s.file) {
                Ok(_) => {
                    report.action = Some(Action::Refreshed);
                    self.compat(report, s, &d)
                }
                Err(e) => fail(report, FileError::WriteTag(e)),
            },
            Status::Ok => self.compat(report, s, &d),
            Status::Corrupt | Status::Mismatch if !self.config.accept_corrupt => {
                report.action = Some(Action::Kept);
                return Ok(report);
            }
            Status::Corrupt | Status::Mismatch | Status::Modified | Status::Older => {
                self.write(report, s, &d, algo, Action::Tagged)
            }
            Status::Touched => self.write(report, s, &d, algo, Action::Refreshed),
            _ => report,
        };
        // intact's tag now describes the data; another tool's that was not rewritten and
        // describes other data is a conflict the user should settle.
        if report.status != Status::Error && !report.status.is_damage() {
            let stale: Vec<&str> = s
                .stored
                .tags
                .iter()
                .filter(|t| t.format != Format::Intact && !self.config.compat.contains(&t.format))
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

    /// Tags files whose data matches the manifest.
    fn import(&mut self, report: FileReport, s: &Subject) -> Outcome {
        let Some(expected) = s.stored.best() else {
            return Ok(report);
        };
        // The file's own tags: compat tags already right need no write, and an intact tag that
        // finds the data damaged must survive a manifest made after the damage.
        let own = Subject {
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

    /// Classifies the file against `tag` with the digest just computed.
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
        let gate = self
            .config
            .gate_spinning
            .then(|| self.gates.for_dev(before.dev))
            .flatten();
        let opts = ReadOptions {
            // With O_DIRECT nothing enters the cache, and dropping would evict what the user
            // had cached.
            drop_cache: self.config.drop_cache && !crate::fs::sys::is_direct(file),
            map: !self.config.drop_cache,
            gate: gate.as_deref(),
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
        let (digests, n) = read::hash_file(
            file,
            algos,
            &mut self.bufs,
            before.size,
            opts,
            self.cancel,
            &self.progress.bytes,
        )
        .map_err(|e| match e {
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
        // The tag now describes the data, whatever a stopped repair did to it.
        if s.stored.repairing
            && let Err(e) = xattr::unmark_repairing(s.file)
        {
            return fail(report, FileError::WriteTag(e));
        }
        report.action = Some(action);
        // The digest reported is the one now stored (a re-tag may change the algorithm).
        report.digest = Some(d.of(algo));
        self.compat(report, s, d)
    }

    /// Writes the requested compat tags from the SHA-256 just computed.
    fn compat(&self, report: FileReport, s: &Subject, d: &Digests) -> FileReport {
        if self.config.compat.is_empty() {
            return report;
        }
        self.write_compat(report, s, &d.of(Algo::Sha256))
    }

    /// Writes each requested compat tag that does not already say the same.
    fn write_compat(&self, mut report: FileReport, s: &Subject, sha256: &Digest) -> FileReport {
        if !self.config.write {
            return report;
        }
        for &format in &self.config.compat {
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
