//! The engine: walks the trees, processes files on all cores, hands back one report per file
//! in walk order.
//!
//! One walker thread feeds a bounded queue; workers open, hash and tag; the calling thread
//! reorders their reports and passes them to a sink. A window of tokens bounds how far the
//! walker may run ahead of the oldest unreported file, so memory stays flat even when one
//! huge file holds up the output of thousands of small ones.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender, bounded, never, select};

use crate::core::classify::Status;
use crate::core::digest::{Algo, Digest};
use crate::core::manifest::Expected;
use crate::core::tag::{Compat, Damage};
use crate::fs::anchor::Anchor;
use crate::fs::device::{Cold, Gates};
use crate::fs::hash::AlignedBuf;
use crate::fs::walk::{self, Entry, Inode, SkipReason, WalkOptions};
use crate::fs::xattr::Attrs;

mod outcome;
mod schedule;
mod worker;

pub(crate) use outcome::cause;
pub use outcome::{Action, Declined, FileError, FileReport, Owner};
pub use schedule::Carried;
pub(crate) use schedule::{Held, OpenFiles, Slot, Slots};
use worker::{Opened, Worker};

/// A file opened ahead of its worker, or why not (`None`: the worker opens it).
type Ahead = Option<std::io::Result<Opened>>;
/// A batch of the walk's entries, numbered in walk order ...
type Batch = (u64, Vec<Entry>);
/// ... and as the readers pass it on.
type OpenedBatch = (u64, Vec<(Entry, Ahead)>);

/// What the engine does to each file. Verbs that do more (archive, protect, repair) run one
/// of these and act on the reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Work {
    /// Hash and tag files without a valid tag.
    Tag,
    /// Re-hash tagged files and classify them; never writes.
    Check,
    /// Check, then make tags match legitimately changed data.
    Update,
    /// Remove intact's tag.
    Strip,
    /// Stored tags and what a check would expect, without reading data.
    Show,
    /// As show, for the tags of one algorithm (`Config::algo`): a manifest's lines.
    Export,
    /// Tag files whose data matches a manifest.
    Import,
}

impl Work {
    /// Whether file data is read (the others only look at tags and metadata).
    pub fn reads_data(self) -> bool {
        matches!(self, Work::Tag | Work::Check | Work::Update | Work::Import)
    }
}

/// Everything the engine needs to know, decided once from the command line.
#[derive(Clone, Debug)]
pub struct Config {
    /// What to do.
    pub work: Work,
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
    pub compat: Vec<Compat>,
    /// Digests from a manifest, instead of xattrs (`check --manifest`, `import`).
    pub manifest: Option<Arc<Expected>>,
    /// Whether tags may be written. Without, a writing verb still reads and judges every
    /// file as it would, and reports what it would have written as not done.
    pub write: bool,
    /// Whether temp files left by killed runs are removed where the walk meets them (the
    /// verbs that change files do; check, show and dry runs only report them).
    pub remove_leftovers: bool,
    /// `update` leaves unread a file whose one tag, intact's, already describes its size and
    /// mtime (there is nothing to write), reporting it `already-tagged` with that tag, where
    /// the sink says it reads that content anyway (`archive create` every file, `protect`
    /// what has no parity yet) and verifies it as it does: each file is read and hashed once.
    pub sink_verifies: Option<SinkReads>,
    /// No file is started after this (a scrub's time budget); files already started finish,
    /// the others get no report.
    pub deadline: Option<Instant>,
    /// Damage the state database remembers, so that a file whose damaged bytes are read again
    /// under a moved mtime is still damaged, not edited (files a writing verb found damaged
    /// carry a mark that says so themselves).
    pub known_damage: Option<Arc<KnownDamage>>,
    /// Writes `intact watch` saw, by file system and inode, with when (Unix milliseconds):
    /// data that changed under the tag's mtime after such a write, later than its tag was
    /// written, is an edit (the writer put the old mtime back), not damage.
    pub written: Option<Arc<Written>>,
    /// `update` reads only files whose tag no longer describes their size and mtime, untagged
    /// ones and those written since tagged (`intact watch`: proving the others is the scrub's
    /// work); the rest are reported `already-tagged`, unread.
    pub changed_only: bool,
}

/// Damage found earlier, by inode number and the digest its tag holds, with the file system
/// it is on (its `statvfs` id, as the state database keys files).
pub type KnownDamage = HashMap<(u64, Digest), Vec<(i64, Damage)>>;

/// Writes seen, by (file system id, inode), with the time of the latest (Unix milliseconds).
pub type Written = HashMap<(i64, u64), i64>;

impl Config {
    /// A configuration with defaults for `work`.
    pub fn new(work: Work) -> Self {
        Config {
            work,
            algo: None,
            force: false,
            accept_corrupt: false,
            mtime_window_ns: 0,
            threads: crate::fs::sys::cores(),
            drop_cache: false,
            gate_spinning: true,
            walk: WalkOptions::default(),
            compat: Vec::new(),
            manifest: None,
            write: true,
            remove_leftovers: false,
            sink_verifies: None,
            deadline: None,
            known_damage: None,
            written: None,
            changed_only: false,
        }
    }

    /// Whether this work reads the data of a file that does (`tagged`) or does not carry a
    /// tag: what a progress bar counts.
    pub fn reads(&self, tagged: bool) -> bool {
        match self.work {
            Work::Tag => self.force || !tagged,
            Work::Check => tagged || self.manifest.is_some(),
            Work::Update | Work::Import => true,
            Work::Strip | Work::Show | Work::Export => false,
        }
    }

    fn new_algo(&self) -> Algo {
        self.algo.unwrap_or(Algo::Sha256)
    }

    /// Whether the deadline has passed: no more files are started.
    pub(crate) fn past_deadline(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d)
    }
}

/// What a sink reads, and so can verify.
#[derive(Clone)]
pub struct SinkReads {
    /// Whether it reads a file of the root it was found under (its index) whose tag says it
    /// holds this content.
    pub reads: Arc<ReadsFn>,
    /// Whether it takes such a file as the worker opened it, with its stat and all its xattrs
    /// (`FileReport::open`): the archive writer, which copies them, does; a parity set's
    /// first pass opens its files when it comes to them.
    pub takes_open: bool,
}

/// See [`SinkReads`].
pub type ReadsFn = dyn Fn(usize, &crate::core::digest::Digest) -> bool + Send + Sync;

impl std::fmt::Debug for SinkReads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SinkReads")
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

/// Why a file whose first read did not match its tag, and whose second read around the page
/// cache did, is `unstable` rather than `corrupt`.
pub(crate) const UNSTABLE: &str = "the first read did not match the tag, a second read around \
    the page cache did: the disk holds good bytes, and memory, a cable or a controller changed \
    them on the way (test the memory, check the cables and the disk's SMART log)";

/// Work travels in batches, so that small files cost a few channel operations per batch
/// rather than per file: a batch closes at this many entries ...
const BATCH_FILES: usize = 64;
/// ... or at this many bytes of data, so one large file does not hold up the next.
const BATCH_BYTES: u64 = 1 << 20;
/// How many batches the walker may run ahead of the oldest one not yet reported.
const WINDOW: usize = 64;

/// The first batches are smaller (8, 16, 32 entries): every worker then has files to read
/// sooner, while the walker is still listing the first directories.
fn batch_files(sent: u64) -> usize {
    BATCH_FILES.min(8 << sent.min(3))
}

/// Batches queued for the workers, per worker. The walker shares the cores with them, the
/// main thread and the state's writer, and the scheduler takes it off its core for
/// milliseconds at a time: the queue must feed the workers meanwhile. Two a worker (64 small
/// files each, about half a millisecond of their work on two cores) left them waiting for
/// the walk 90 times in a check of 20,000 4 KiB files, eight a worker 5-7 times (in turns,
/// 31-41 rounds, Xeon: ×1.20 -> ×1.16-1.18 the same-work floor's time).
const QUEUED: usize = 8;
/// Threads that open files and read them ahead of the workers: reads in flight, enough to
/// fill the queue of an SSD, NVMe or virtio disk (measured on virtio: 16 parallel readers
/// reach its speed on 256 KiB files, 4 do not).
const READERS: usize = 16;
/// A reader's stack: it opens, stats and reads into a buffer of its own, and sixteen of the
/// default 2 MiB counted 32 MiB against a data limit (`ulimit -d`), which the spare workers
/// (see [`Slots`]) then broke at 64 MiB.
const READER_STACK: usize = 256 << 10;

/// A file the engine left unread and open for its sink (see [`Config::sink_verifies`]): the
/// very file it looked at, which the sink reads without opening it again (on 20,000 files of
/// 4 KiB, the second open was a fifth of the archive writer's time).
#[derive(Debug)]
pub struct OpenFile {
    file: std::fs::File,
    /// What `fstat` said of it before anything was read.
    stat: walk::Stat,
    /// Its own extended attributes (`xattr::read_all`), which the sink copies.
    attrs: Attrs,
    /// A small file's whole data and its digest by its tag's algorithm, read by the worker
    /// (unchanged while read, by `fstat`): the sink's one thread then only copies them.
    read: Option<(Carried, Digest)>,
    held: Held,
}

impl OpenFile {
    pub(crate) fn new(
        file: std::fs::File,
        stat: walk::Stat,
        attrs: Attrs,
        read: Option<(Carried, Digest)>,
        held: Held,
    ) -> Self {
        OpenFile {
            file,
            stat,
            attrs,
            read,
            held,
        }
    }

    /// The file, its state before any read, its attributes and what was read of it; no
    /// longer counted among the files held open.
    pub fn into_parts(self) -> (std::fs::File, walk::Stat, Attrs, Option<(Carried, Digest)>) {
        let OpenFile {
            file,
            stat,
            attrs,
            read,
            held,
        } = self;
        drop(held);
        (file, stat, attrs, read)
    }
}

/// Where the files come from.
pub enum Source<'a> {
    /// The walk of the roots.
    Walk,
    /// A list of files under the roots, in the order given (a scrub's plan).
    List(Box<dyn Iterator<Item = Entry> + Send + 'a>),
}

/// Runs `config.work` over `roots`, calling `sink` with each file's report in walk order.
/// Stops early, without a report for unfinished files, once `cancel` is set.
pub fn run(
    config: &Config,
    roots: &[PathBuf],
    cancel: &AtomicBool,
    progress: &Progress,
    sink: impl FnMut(FileReport),
) -> Result<(), ignore::Error> {
    run_from(config, roots, Source::Walk, cancel, progress, sink)
}

/// As [`run`], over the files `source` gives, in its order: the walk in batches, readers that
/// open files ahead once data is found cold, the workers, and this thread putting the reports
/// back in walk order.
pub fn run_from(
    config: &Config,
    roots: &[PathBuf],
    source: Source<'_>,
    cancel: &AtomicBool,
    progress: &Progress,
    mut sink: impl FnMut(FileReport),
) -> Result<(), ignore::Error> {
    let threads = config.threads.max(1);
    let (job_tx, job_rx) = bounded::<Batch>((threads * QUEUED).min(WINDOW));
    let (ahead_tx, ahead_rx) = bounded::<OpenedBatch>(READERS);
    let (done_tx, done_rx) = bounded::<(u64, Vec<Option<FileReport>>)>(WINDOW);
    let (token_tx, token_rx) = bounded::<()>(WINDOW);
    let (cold, woken) = Cold::new();
    let run = &Run {
        config,
        cancel,
        progress,
        anchors: roots.iter().map(|r| Anchor::new(r)).collect(),
        gates: Gates::default(),
        cold,
        open_files: Arc::new(OpenFiles::new()),
        slots: Slots::new(threads),
    };
    // Dropped when the walk ends (or its thread fails): readers still asleep then go home.
    let (walked_tx, walked_rx) = bounded::<()>(0);

    std::thread::scope(|s| {
        let walker = s.spawn(move || {
            let _walking = walked_tx;
            walk_in_batches(config, roots, source, cancel, job_tx, token_tx)
        });
        // The readers start once a read meets cold data: a warm run spares itself their
        // sixteen threads (a fifth of a check's start).
        let jobs = job_rx.clone();
        s.spawn(move || {
            select! {
                recv(woken) -> _ => {},
                recv(walked_rx) -> _ => {},
            }
            if run.cold.met() && !config.drop_cache {
                for _ in 0..READERS {
                    run.spawn_reader(s, jobs.clone(), ahead_tx.clone());
                }
            }
        });
        for _ in 0..threads + run.slots.spare {
            let inbox = Inbox {
                ahead: Some(ahead_rx.clone()),
                jobs: Some(job_rx.clone()),
            };
            run.spawn_worker(s, inbox, done_tx.clone());
        }
        drop((ahead_rx, job_rx, done_tx));
        let listed = run.in_walk_order(done_rx, token_rx, &mut sink);
        let walked = walker.join().expect("walker thread panicked");
        if let Some(m) = &config.manifest
            && !cancel.load(Ordering::Relaxed)
        {
            for (key, path) in m.listed() {
                if !listed.contains(key) {
                    sink(FileReport::new(path, Status::Missing));
                }
            }
        }
        walked
    })
}

/// What the threads of one run share.
struct Run<'a> {
    config: &'a Config,
    cancel: &'a AtomicBool,
    progress: &'a Progress,
    anchors: Vec<Anchor>,
    gates: Gates,
    cold: Cold,
    open_files: Arc<OpenFiles>,
    slots: Slots,
}

impl<'a> Run<'a> {
    /// A reader: opens files, and starts reading them, ahead of the workers, so that the
    /// number of reads in flight does not depend on the number of hashing threads. Started
    /// once a worker meets data that is not in the page cache: on a warm cache, handing every
    /// file from one thread to another costs more than reading ahead saves (measured on
    /// 20,000 files of 4 KiB: a warm check took 0.19 s with them, 0.12 s without). A
    /// background scrub reads one request at a time: it starts none.
    fn spawn_reader<'s>(
        &'s self,
        s: &'s std::thread::Scope<'s, '_>,
        jobs: Receiver<Batch>,
        ahead: Sender<OpenedBatch>,
    ) {
        let reader = std::thread::Builder::new().stack_size(READER_STACK);
        let spawned = reader.spawn_scoped(s, move || {
            let mut scratch = None;
            for (seq, batch) in jobs {
                let scratch = scratch.get_or_insert_with(|| AlignedBuf::new(worker::AHEAD));
                let batch = batch
                    .into_iter()
                    .map(|entry| {
                        if self.cancel.load(Ordering::Relaxed) {
                            return (entry, None);
                        }
                        let opened = Opened::ahead(
                            self.config,
                            &entry,
                            &self.anchors,
                            &self.gates,
                            scratch,
                            &self.open_files,
                        );
                        (entry, opened)
                    })
                    .collect();
                if ahead.send((seq, batch)).is_err() {
                    break;
                }
            }
        });
        spawned.expect("spawning a reader");
    }

    /// A worker: takes batches (opened ahead or not) and sends their reports back.
    fn spawn_worker<'s>(
        &'s self,
        s: &'s std::thread::Scope<'s, '_>,
        mut inbox: Inbox,
        done: Sender<(u64, Vec<Option<FileReport>>)>,
    ) {
        s.spawn(move || {
            let mut worker = Worker::new(
                self.config,
                self.cancel,
                self.progress,
                &self.gates,
                &self.cold,
                self.open_files.clone(),
            );
            loop {
                // The slot first: a worker holding a batch it cannot start would keep the
                // output, and with it the walk, waiting. It keeps its slot from one batch to
                // the next until it lends it: passing it on at every batch woke a waiting
                // spare each time (2,000 files of 256 KiB: 4% slower).
                worker.hold(&self.slots);
                let Some((seq, batch)) = inbox.next() else {
                    break;
                };
                let reports = worker.batch(batch, &self.anchors);
                if done.send((seq, reports)).is_err() {
                    break;
                }
            }
        });
    }

    /// Puts the workers' reports back in walk order and gives each to `sink`, letting the
    /// walk go on one batch for each batch given; returns the manifest keys of the files
    /// reported (what a manifest lists and the tree lacks is reported after).
    fn in_walk_order(
        &self,
        done: Receiver<(u64, Vec<Option<FileReport>>)>,
        tokens: Receiver<()>,
        sink: &mut impl FnMut(FileReport),
    ) -> HashSet<PathBuf> {
        let mut pending = BTreeMap::new();
        let mut next = 0u64;
        let mut listed = HashSet::new();
        // Files with several names found damaged: their other names carry the damage too.
        let mut damaged = Damaged::new();
        for (seq, reports) in done {
            pending.insert(seq, reports);
            while let Some(reports) = pending.remove(&next) {
                let _ = tokens.recv();
                next += 1;
                for mut report in reports.into_iter().flatten() {
                    if let Some(m) = &self.config.manifest {
                        listed.insert(m.key(&report.path));
                    }
                    if let Some(inode) = report.linked {
                        name_damage(&mut report, inode, &mut damaged);
                    }
                    // Files the work reads but its workers did not (a sink reads them, or
                    // they failed) count whole, so the progress bar ends at its total.
                    if report.skip.is_none() && self.config.reads(report.tag.is_some()) {
                        let unread = report.size.unwrap_or(0).saturating_sub(report.bytes_read);
                        self.progress.bytes.fetch_add(unread, Ordering::Relaxed);
                    }
                    self.progress.files.fetch_add(1, Ordering::Relaxed);
                    sink(report);
                }
            }
        }
        listed
    }
}

/// What a worker takes batches from: what the readers opened first, and the walk's batches
/// themselves while the readers sleep or lag.
struct Inbox {
    ahead: Option<Receiver<OpenedBatch>>,
    jobs: Option<Receiver<Batch>>,
}

impl Inbox {
    /// The next batch; `None` once both the readers and the walk are done.
    fn next(&mut self) -> Option<OpenedBatch> {
        if let Some(Ok(batch)) = self.ahead.as_ref().map(Receiver::try_recv) {
            return Some(batch);
        }
        loop {
            // A source whose senders are all gone waits on nothing any more.
            let ahead = self.ahead.clone().unwrap_or_else(never);
            let jobs = self.jobs.clone().unwrap_or_else(never);
            if self.ahead.is_none() && self.jobs.is_none() {
                return None;
            }
            select! {
                recv(ahead) -> batch => match batch {
                    Ok(batch) => return Some(batch),
                    Err(_) => self.ahead = None,
                },
                recv(jobs) -> batch => match batch {
                    Ok((seq, batch)) => {
                        return Some((seq, batch.into_iter().map(|e| (e, None)).collect()));
                    }
                    Err(_) => self.jobs = None,
                },
            }
        }
    }
}

/// The walker: entries in batches, each batch taking a token from the window first, so the
/// walk never runs further ahead of the oldest unreported file than the window allows.
fn walk_in_batches(
    config: &Config,
    roots: &[PathBuf],
    source: Source<'_>,
    cancel: &AtomicBool,
    job_tx: Sender<Batch>,
    token_tx: Sender<()>,
) -> Result<(), ignore::Error> {
    let mut seq = 0u64;
    let mut batch = Vec::with_capacity(BATCH_FILES);
    let mut bytes = 0;
    let mut sent = 0;
    let mut send = |batch: &mut Vec<Entry>| {
        if cancel.load(Ordering::Relaxed) || config.past_deadline() || token_tx.send(()).is_err() {
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
        if batch.len() < batch_files(sent) && bytes < BATCH_BYTES {
            return ControlFlow::Continue(());
        }
        bytes = 0;
        sent += 1;
        send(&mut batch)
    };
    // import visits what its manifest lists, beneath its one root; the others walk.
    let walked = match (&config.manifest, config.work, source) {
        (_, _, Source::List(entries)) => {
            for entry in entries {
                if visit(entry).is_break() {
                    break;
                }
            }
            Ok(())
        }
        (Some(m), Work::Import, _) => {
            let _ = m.listed().try_for_each(|(_, path)| {
                visit(Entry::File {
                    path,
                    size: 0,
                    root: 0,
                    inode: None,
                    stat: None,
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
}

/// The damage of each file with several names, as its first name was judged.
pub(crate) type Damaged = HashMap<Inode, (Status, Option<Action>, PathBuf)>;

/// The damage found in a file with several names, said under each of them: the first name
/// met was read (once), and the others are reported as carrying the same bytes. (A sink that
/// verifies files itself says it again, for the damage it finds.)
pub(crate) fn name_damage(report: &mut FileReport, inode: Inode, damaged: &mut Damaged) {
    if report.skip != Some(SkipReason::HardLink) {
        if report.status.is_damage() {
            damaged.insert(inode, (report.status, report.action, report.path.clone()));
        }
        return;
    }
    if let Some((status, action, first)) = damaged.get(&inode) {
        // Counted under each name, as its status is: "2 corrupt, 2 kept", one unit.
        report.status = *status;
        report.action = *action;
        report.detail = Some(format!(
            "another name of {}, which is {}",
            crate::text::escape(first),
            status.name()
        ));
    }
}
