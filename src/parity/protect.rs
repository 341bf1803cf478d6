//! `protect`: verified files get PAR2 parity, computed by worker threads, several sets at a
//! time, while the engine verifies the files that come next.
//!
//! A file is reported `protected` only once its set is durable under its name. Sets are made
//! durable in batches, so reports wait in a queue, in walk order, until the batch holding
//! their set is committed (or fails, which makes the file an error). When the queue reaches
//! [`HOLD`] reports (many small files not yet filling a pack), what is pending is computed and
//! committed at once, so memory stays bounded whatever the tree.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};

use super::{Added, DEFAULT_DIR, Job, Live, Outcome, Protectee, Store};
use crate::core::classify::Status;
use crate::core::digest::Digest;
use crate::engine::{Action, FileError, FileReport, SinkReads};
use crate::fs::hash::{AlignedBuf, BUF_SIZE, HashError, ReadOptions, hash_file};
use crate::fs::walk::Stat;
use crate::sink::{Failure, Out, Sink};
use crate::text::escape;

/// Where a tree's parity store is by default: in the tree (beside a file given as PATH) when
/// the tree's folder is the running user's and no one else can write it, or the user made a
/// store there before; otherwise (root's nightly scrub of a family share, a folder a group
/// writes) in a folder of stores of the user's own, one a tree ([`OUTSIDE`], named after the
/// tree's path as systemd names a path), where no user of the tree can reach it.
pub fn store_dir(path: &Path) -> PathBuf {
    let tree = if path.is_dir() {
        path
    } else {
        crate::fs::atomic::parent(path)
    };
    let me = rustix::process::geteuid().as_raw();
    let mine = rustix::fs::stat(tree).is_ok_and(|st| st.st_uid == me && st.st_mode & 0o022 == 0);
    let inside = tree.join(DEFAULT_DIR);
    // One the user made there before stays theirs to use (it is checked again when opened).
    let made = || {
        rustix::fs::lstat(&inside).is_ok_and(|st| {
            st.st_uid == me
                && rustix::fs::FileType::from_raw_mode(st.st_mode)
                    == rustix::fs::FileType::Directory
        })
    };
    match outside() {
        Some(stores) if !mine && !made() => stores.join(store_name(&crate::state::absolute(tree))),
        _ => inside,
    }
}

/// The parity store that covers `path`: its own, or the nearest one of a folder above it (a
/// repair or status of a subfolder uses its tree's store), if there is one.
pub fn store_over(path: &Path) -> Option<PathBuf> {
    let path = crate::state::absolute(path);
    path.ancestors()
        .map(store_dir)
        .find(|dir| crate::parity::Store::is_store(dir))
}

/// The setting that names the folder of stores kept outside their trees.
pub const OUTSIDE: &str = "INTACT_STORES";

/// The folder of stores kept outside their trees: `INTACT_STORES`, else `parity` beside the
/// default state database (`/var/lib/intact/parity` for root).
fn outside() -> Option<PathBuf> {
    match std::env::var_os(OUTSIDE).filter(|d| !d.is_empty()) {
        Some(dir) => Some(PathBuf::from(dir)),
        None => Some(crate::state::default_path()?.parent()?.join("parity")),
    }
}

/// A tree's store's name in the folder of stores: its absolute path as `systemd-escape
/// --path` writes it (`/srv/nas photos` is `srv-nas\x20photos`), or, past what a name can
/// hold, its start and a digest of the whole.
fn store_name(tree: &Path) -> std::ffi::OsString {
    use std::os::unix::ffi::OsStrExt;
    let bytes = tree.as_os_str().as_bytes();
    let trimmed: Vec<&[u8]> = bytes
        .split(|&b| b == b'/')
        .filter(|p| !p.is_empty())
        .collect();
    let mut name = String::new();
    for (i, part) in trimmed.iter().enumerate() {
        if i > 0 {
            name.push('-');
        }
        for (j, &b) in part.iter().enumerate() {
            let plain = b.is_ascii_alphanumeric()
                || b == b':'
                || b == b'_'
                || (b == b'.' && (i, j) != (0, 0));
            if plain {
                name.push(b as char);
            } else {
                name.push_str(&format!("\\x{b:02x}"));
            }
        }
    }
    if name.is_empty() {
        name.push('-');
    }
    if name.len() > 200 {
        let digest = crate::core::digest::digest_bytes(crate::core::digest::Algo::Sha256, bytes);
        let hex: String = digest.bytes[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        // ASCII (all else is escaped): cut anywhere.
        name.truncate(150);
        name = format!("{name}-{hex}");
    }
    name.into()
}

/// Gives verified files parity, in one store per root.
pub struct Protector {
    roots: Vec<PathBuf>,
    stores: Arc<Vec<Store>>,
    jobs: Option<Sender<(usize, Job)>>,
    /// One message per job handed out, when it is finished (or dropped on interruption).
    done: Receiver<()>,
    /// Jobs handed out and not yet finished.
    running: usize,
    workers: Vec<JoinHandle<()>>,
    /// Reports in walk order, each with the content it waits for (store, digest), if any.
    held: VecDeque<Held>,
    /// mtimes closer than this count as equal, judging a file the engine left unread.
    window: u64,
    /// Files with several names found damaged, and the first name.
    damaged: crate::engine::Damaged,
    /// Per store, the contents found in its tree: the parity that stays.
    live: Vec<Live>,
    /// Something under a tree could not be looked at: what it holds is not known, so no
    /// parity is moved aside.
    unsure: bool,
    /// How long a stale set is kept once moved aside; `None`: nothing is moved aside (a run
    /// that sees only part of the tree).
    keep_stale: Option<std::time::Duration>,
    /// Per root, the files the walk found, and (told by the state database) the files it
    /// knew there that are gone: none told, nothing is known to be deleted.
    walked: Vec<u64>,
    gone: Option<Vec<u64>>,
    cancel: &'static AtomicBool,
    /// Sets renamed after their files moved, and why others could not be.
    renamed: u64,
    not_renamed: Vec<String>,
}

/// Reports held before pending parity is forced out.
const HOLD: usize = 8192;

struct Held {
    report: FileReport,
    wait: Option<(usize, Digest)>,
    /// Its content had parity before (under this or another name).
    already: bool,
}

impl Protector {
    /// Opens (creating them if need be) the store given, or each root's own, and starts
    /// `threads` workers; they stop early once `cancel` is set. With `keep_stale`, sets no
    /// file of the tree needs any more are moved aside at the end, and removed that much
    /// later. Returns the temp files that killed runs had left in the stores, removed.
    pub fn open(
        roots: &[PathBuf],
        given: Option<&Path>,
        redundancy: f64,
        threads: usize,
        window: u64,
        keep_stale: Option<std::time::Duration>,
        cancel: &'static AtomicBool,
    ) -> Result<(Protector, Vec<PathBuf>), super::OpenError> {
        let mut stores = Vec::new();
        let mut removed = Vec::new();
        for root in roots {
            let dir = given.map_or_else(|| store_dir(root), Path::to_path_buf);
            // Names are relative to the root, or for a file to its directory.
            let base = if root.is_dir() {
                root.as_path()
            } else {
                crate::fs::atomic::parent(root)
            };
            let mut store = Store::open(&dir, base, redundancy, threads)?;
            removed.append(&mut store.removed);
            stores.push(store);
        }
        let stores = Arc::new(stores);
        let (jobs, job_rx) = crossbeam_channel::bounded::<(usize, Job)>(threads * 2);
        let (done_tx, done) = crossbeam_channel::unbounded();
        let workers = (0..threads)
            .map(|_| {
                let (stores, job_rx, done_tx) = (stores.clone(), job_rx.clone(), done_tx.clone());
                std::thread::spawn(move || {
                    for (i, job) in job_rx {
                        // Interrupted: the rest stay without parity (and are said to).
                        if !cancel.load(Ordering::Relaxed) {
                            stores[i].run(job);
                        }
                        let _ = done_tx.send(());
                    }
                })
            })
            .collect();
        let protector = Protector {
            roots: roots.to_vec(),
            stores,
            jobs: Some(jobs),
            done,
            running: 0,
            workers,
            held: VecDeque::new(),
            window,
            damaged: HashMap::new(),
            live: roots.iter().map(|_| Live::default()).collect(),
            unsure: false,
            renamed: 0,
            not_renamed: Vec::new(),
            keep_stale,
            walked: vec![0; roots.len()],
            gone: None,
            cancel,
        };
        Ok((protector, removed))
    }

    /// What the engine is to leave unread: files whose content has no parity yet, which
    /// their set's first pass reads (and verifies) anyway.
    pub fn reads(&self) -> SinkReads {
        let stores = self.stores.clone();
        SinkReads {
            reads: Arc::new(move |root, digest| !stores[root].has(digest)),
            takes_open: false,
        }
    }

    /// Hands a verified file to its root's store; damaged, unreadable and skipped files get
    /// none. Returns what the report must wait for, and whether its content had parity.
    fn give(
        &mut self,
        report: &mut FileReport,
    ) -> Result<(Option<(usize, Digest)>, bool), Failure> {
        let digest = report.unread().map(|t| t.digest).or(report.digest);
        let (Some(digest), Some(size)) = (digest, report.size) else {
            return Ok((None, false));
        };
        if report.status.is_damage() || matches!(report.status, Status::Error | Status::Changed) {
            return Ok((None, false));
        }
        let i = report.root;
        let name = report.relative(&self.roots).as_os_str().as_bytes().to_vec();
        let added = self.stores[i].add(Protectee {
            path: report.path.clone(),
            name: name.clone(),
            size,
            digest,
        });
        let had = matches!(added, Added::Already);
        let already = match added {
            Added::Run(job) => {
                self.send(i, job)?;
                false
            }
            Added::Waiting => false,
            // Left unread for a set that another file of the same content took first: verified
            // here.
            Added::Already if report.unread().is_some() => {
                self.verify(report);
                if report.status != Status::Ok {
                    return Ok((None, false));
                }
                matches!(self.stores[i].outcome(&digest), Outcome::Durable)
            }
            Added::Already => matches!(self.stores[i].outcome(&digest), Outcome::Durable),
        };
        if had && size >= super::PACK_LIMIT {
            self.follow(i, &digest, &name);
        }
        Ok((Some((i, digest)), already))
    }

    /// A protect of the whole tree renames a file's own set after it when the file moved:
    /// par2cmdline looks for a set's file by the name the set records. Not while a file of
    /// that content is still at the recorded name (a copy).
    fn follow(&mut self, i: usize, digest: &Digest, name: &[u8]) {
        let store = &self.stores[i];
        if self.keep_stale.is_none() {
            return;
        }
        let Some(recorded) = store.set_name(digest).filter(|n| n != name) else {
            return;
        };
        let anchor = crate::fs::anchor::Anchor::new(&store.root);
        let copy_there = super::resolve(&store.root, &recorded)
            .and_then(|path| anchor.open(&path, false).ok())
            .and_then(|file| crate::fs::xattr::read(&file).ok())
            .is_some_and(|stored| stored.tags.iter().any(|t| t.digest == *digest));
        if copy_there {
            return;
        }
        match store.rename_set(digest, name) {
            Ok(true) => self.renamed += 1,
            Ok(false) => {}
            Err(e) => self.not_renamed.push(format!(
                "protect: the parity set of {} names it by its old name {} and could not be \
                 renamed ({e}): par2cmdline looks for it there (intact's repair finds it by \
                 its tag)",
                escape(&store.root.join(std::ffi::OsStr::from_bytes(name))),
                escape(std::path::Path::new(std::ffi::OsStr::from_bytes(&recorded)))
            )),
        }
    }

    fn send(&mut self, i: usize, job: Job) -> Result<(), Failure> {
        let jobs = self.jobs.as_ref().expect("open until finished");
        jobs.send((i, job)).map_err(|_| {
            Failure::new("computing parity", io::Error::other("the workers stopped"))
        })?;
        self.running += 1;
        Ok(())
    }

    /// Hands out every store's pending files, waits for all jobs to finish and commits: every
    /// held report is then settled.
    fn flush(&mut self) -> Result<(), Failure> {
        let mut failure = None;
        for i in 0..self.stores.len() {
            if let Some(job) = self.stores[i].take_pending()
                && let Err(e) = self.send(i, job)
            {
                failure.get_or_insert(e);
            }
        }
        while self.running > 0 && self.done.recv().is_ok() {
            self.running -= 1;
        }
        for store in self.stores.iter() {
            if let Err(e) = store.commit() {
                failure.get_or_insert(Failure::new(
                    format!("writing parity in {}", crate::text::escape(store.shown())),
                    e,
                ));
            }
        }
        failure.map_or(Ok(()), Err)
    }

    /// Lets out the reports at the head of the queue whose parity is settled; at the end
    /// (`last`), all of them.
    fn release(&mut self, out: &mut dyn Out, last: bool) {
        self.running -= self.done.try_iter().count();
        while let Some(head) = self.held.front() {
            let outcome = head.wait.map(|(i, d)| self.stores[i].outcome(&d));
            if matches!(outcome, Some(Outcome::Pending)) && !last {
                break;
            }
            let Held {
                mut report,
                already,
                ..
            } = self.held.pop_front().expect("a head");
            // Read for the first time by its set: what that read found is the verdict. A set
            // that found other bytes than the tag claims says only that: the file is read
            // again for a verdict of its own (the damaged bytes' digest is what the state
            // database remembers damage by; without it, damage was forgotten by the next run).
            if report.unread().is_some() {
                match outcome {
                    Some(Outcome::Durable) => verified(&mut report),
                    Some(Outcome::Changed) => self.verify(&mut report),
                    _ => {}
                }
            }
            match outcome {
                None | Some(Outcome::Pending) => {}
                Some(Outcome::Changed) if report.status.is_damage() => {}
                Some(Outcome::Durable) => {
                    report.copy = Some(Action::Protected);
                    if already {
                        report.detail = Some("its content already had parity".into());
                    }
                }
                Some(Outcome::Changed) => {
                    report.status = Status::Changed;
                    report.action = None;
                    report.detail = Some("changed while its parity was computed: no parity".into());
                }
                Some(unreadable @ Outcome::Unreadable(..)) => {
                    let e = unreadable.error().expect("an unreadable outcome");
                    report.fail(FileError::Read(e));
                }
                Some(failed @ Outcome::Failed(..)) => {
                    let e = failed.error().expect("a failed outcome");
                    report.fail(FileError::Protect(e));
                }
            }
            // Damage found by a set's first pass is said under the file's other names too.
            if let Some(inode) = report.linked {
                crate::engine::name_damage(&mut report, inode, &mut self.damaged);
            }
            out.send(report);
        }
    }
}

impl Protector {
    /// Reads and hashes a file the engine left unread, and judges it against its tag. Before
    /// it is called damaged it is read a second time around the page cache, as the engine
    /// reads a file it finds damaged: a second read that matches the tag is `unstable`.
    fn verify(&self, report: &mut FileReport) {
        let Some(tag) = report.unread().cloned() else {
            return;
        };
        let anchor = crate::fs::anchor::Anchor::new(&self.roots[report.root]);
        let file = match anchor.open(&report.path, false) {
            Ok(file) => file,
            Err(e) => return report.fail(FileError::Read(e)),
        };
        let read = |opts: ReadOptions| -> io::Result<(Stat, Digest, u64, Stat)> {
            let (before, _) = Stat::of(&file)?;
            let mut bufs = [BUF_SIZE, BUF_SIZE].map(AlignedBuf::new);
            let (digests, n) = hash_file(
                &file,
                &[tag.digest.algo],
                &mut bufs,
                before.size,
                opts,
                self.cancel,
                &AtomicU64::new(0),
            )
            .map_err(|e| match e {
                HashError::Io(e) => e,
                HashError::Interrupted => io::Error::from(io::ErrorKind::Interrupted),
            })?;
            let (after, _) = Stat::of(&file)?;
            Ok((before, digests.of(tag.digest.algo), n, after))
        };
        match read(ReadOptions::default()) {
            // Stopped by Ctrl-C: left as it was, unverified.
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => report.fail(FileError::Read(e)),
            Ok((before, _, n, after)) if after.changes_since(&before, n).is_some() => {
                report.status = Status::Changed;
                report.detail = Some("changed while it was read".into());
            }
            Ok((before, digest, _, _)) => {
                report.judge(&tag, before.size, before.mtime, digest, self.window);
                let known = report.known_damage.is_some_and(|k| k.digest == digest);
                if !report.status.is_damage() || known {
                    return;
                }
                crate::fs::sys::drop_pages(&file, 0, before.size);
                let around = ReadOptions {
                    drop_cache: true,
                    ..ReadOptions::default()
                };
                if let Ok((_, second, n, after)) = read(around)
                    && after.changes_since(&before, n).is_none()
                    && second == tag.digest
                {
                    report.status = Status::Unstable;
                    report.detail = Some(crate::engine::UNSTABLE.into());
                }
            }
        }
    }
}

impl Protector {
    /// Notes what `report`'s file holds (or should hold) as content whose parity stays.
    fn note_live(&mut self, report: &FileReport) {
        // A pack member met under another name than its pack records (moved since).
        let content = report.unread().map(|t| t.digest).or(report.digest);
        let placed = content
            .filter(|_| !report.status.is_damage())
            .and_then(|d| {
                let name = report.relative(&self.roots);
                let at = self.stores[report.root].packed_at(&d, name.as_os_str().as_bytes())?;
                Some((d, at))
            });
        let live = &mut self.live[report.root];
        if let Some((d, at)) = placed {
            live.met(&d, at);
        }
        let tag = report.tag.as_ref().map(|t| t.digest);
        if report.status.is_damage() {
            if let Some(d) = tag {
                live.damaged(&d);
            }
            return;
        }
        // What it holds, as read (or as its tag says where it was left unread, or could not
        // be read: its parity may be all that can repair it). An edit's old content is not
        // kept: that parity would put the old bytes back.
        let now = report.unread().map(|t| t.digest).or(report.digest);
        if let (Some(old), Some(new)) = (tag, now)
            && old != new
        {
            live.edited(&old);
        }
        match now.or(tag) {
            Some(d) => live.add(&d),
            // A folder that could not be read, a file that could not be: its content is
            // not known.
            None if matches!(report.status, Status::Error) => self.unsure = true,
            None => {}
        }
    }

    /// Moves aside the sets no file of the trees needs, removes those past their grace
    /// period, and packs again the members of packs moved aside or taken apart; says what it
    /// did. A pack a scrub took apart is settled only once its members have parity again.
    fn prune(&mut self, out: &mut dyn Out) -> Result<(), Failure> {
        let whole_tree = self.keep_stale.is_some();
        let unknown = match (&self.gone, self.unsure) {
            _ if !whole_tree => None,
            (_, true) => Some("something under the tree could not be read, so what it holds"),
            (None, _) => Some(
                "without a state database, files deleted cannot be told from a disk or a \
                 folder that is missing, so what the tree should hold",
            ),
            _ => None,
        };
        if let Some(what) = unknown {
            out.note(format!(
                "protect: no stale parity was moved aside: {what} is not known"
            ));
            return Ok(());
        }
        let failed = |store: &Store, e| {
            let what = format!("moving stale parity aside in {}", escape(store.shown()));
            Failure::new(what, e)
        };
        let mut total = super::Pruned::default();
        let mut repacked: Vec<(usize, Digest)> = Vec::new();
        let mut retired = Vec::new();
        let stores = self.stores.clone();
        for (i, store) in stores.iter().enumerate() {
            // Many files gone at once (a disk that did not mount, a folder deleted by mistake)
            // is an alarm until the owner says it was meant: their parity may be all that can
            // bring them back.
            if let Some(removal) = self.removal(i) {
                out.removal(&removal);
                out.note(format!(
                    "protect: the parity of {} was kept whole: its files gone at once are not \
                     taken for deleted",
                    escape(&removal.root)
                ));
                retired.push(Vec::new());
                continue;
            }
            let mut pruned = match self.keep_stale {
                Some(keep) => store.prune(&self.live[i], keep),
                None => store.retire(&self.live[i]),
            }
            .map_err(|e| failed(store, e))?;
            total.add(&pruned);
            let members = self.members(store, std::mem::take(&mut pruned.repack));
            for (path, name, size, digest) in members {
                // Its set's first pass hashes it again: a file that is not that content now
                // gets no parity from it (the next run gives it its own).
                let added = store.add(Protectee {
                    path,
                    name,
                    size,
                    digest,
                });
                if let Added::Run(job) = added {
                    self.send(i, job)?;
                }
                repacked.push((i, digest));
            }
            retired.push(std::mem::take(&mut pruned.retired));
        }
        if !repacked.is_empty() {
            self.flush()?;
        }
        for (i, packs) in retired.into_iter().enumerate() {
            let store = &stores[i];
            let again = repacked
                .iter()
                .filter(|(s, d)| *s == i && matches!(store.outcome(d), Outcome::Durable))
                .map(|(_, d)| *d)
                .collect();
            let settled = store
                .settle_retired(packs, &self.live[i], &again)
                .map_err(|e| failed(store, e))?;
            total.add(&settled);
        }
        if let Some(note) = pruned_note(&total, repacked.len(), self.keep_stale) {
            out.note(note);
        }
        Ok(())
    }

    /// The alarm the files gone from root `i` make, if they make one.
    fn removal(&self, i: usize) -> Option<crate::scrub::Removal> {
        let gone = *self.gone.as_ref()?.get(i)?;
        let files = self.walked[i];
        let percent = crate::scrub::MASS_REMOVAL_PERCENT;
        crate::scrub::Removal::of(&self.roots[i], gone, files + gone, files, percent, None)
    }

    /// The members of packs taken apart that are still in the tree, to be packed again:
    /// where the pack says (their tag says so: no data is read), or, for a run that sees the
    /// whole tree, moved since and found by their tags (a scrub's member gets parity when it
    /// is next visited).
    fn members(
        &self,
        store: &Store,
        repack: Vec<(Vec<u8>, Digest)>,
    ) -> Vec<(PathBuf, Vec<u8>, u64, Digest)> {
        let mut moved: HashMap<Digest, Vec<u8>> = HashMap::new();
        let mut members = Vec::new();
        let anchor = crate::fs::anchor::Anchor::new(&store.root);
        for (name, digest) in repack {
            let there = super::resolve(&store.root, &name).and_then(|path| {
                let file = anchor.open(&path, false).ok()?;
                let stored = crate::fs::xattr::read(&file).ok()?;
                let size = file.metadata().ok()?.len();
                stored
                    .tags
                    .iter()
                    .any(|t| t.digest == digest)
                    .then_some((path, size))
            });
            match there {
                Some((path, size)) => members.push((path, name, size, digest)),
                None => {
                    moved.insert(digest, name);
                }
            }
        }
        if self.keep_stale.is_some() && !moved.is_empty() {
            crate::fs::walk::tagged(
                std::slice::from_ref(&store.root),
                self.cancel,
                |path, tags| {
                    if let Some(tag) = tags.iter().find(|t| moved.contains_key(&t.digest))
                        && let Ok(meta) = crate::fs::sys::lstat(&path)
                        && let Ok(rel) = path.strip_prefix(&store.root)
                    {
                        moved.remove(&tag.digest);
                        let name = rel.as_os_str().as_bytes().to_vec();
                        members.push((path, name, meta.len(), tag.digest));
                    }
                },
            );
        }
        members
    }
}

/// What a prune did, in words, if it did anything.
fn pruned_note(
    p: &super::Pruned,
    repacked: usize,
    keep: Option<std::time::Duration>,
) -> Option<String> {
    let mut said = Vec::new();
    if p.moved > 0 {
        said.push(format!(
            "{} stale set(s) moved aside to {}/ (renamed *.par2.stale: par2 does not take them \
             for a set)",
            p.moved,
            super::STALE_DIR
        ));
    }
    if p.dropped > 0 {
        said.push(format!("{} set(s) of edited content removed", p.dropped));
    }
    if p.spent > 0 {
        said.push(format!(
            "{} pack(s) removed: more of their members are gone than their parity rebuilds",
            p.spent
        ));
    }
    if p.merged > 0 {
        said.push(format!("{} small pack(s) merged", p.merged));
    }
    if p.renamed > 0 {
        said.push(format!(
            "{} pack(s) written again: members moved (par2cmdline finds them by the names \
             their pack records)",
            p.renamed
        ));
    }
    if repacked > 0 {
        said.push(format!("{repacked} file(s) packed again"));
    }
    if p.removed > 0 {
        said.push(format!(
            "{} stale file(s) ({}) removed, older than {}",
            p.removed,
            crate::text::bytes(p.removed_bytes),
            humantime::format_duration(keep.unwrap_or_default())
                .to_string()
                .replace("days", " days")
        ));
    }
    if p.kept_for_damage > 0 {
        said.push(format!(
            "{} stale file(s) kept past that: they can repair a damaged file",
            p.kept_for_damage
        ));
    }
    (!said.is_empty()).then(|| format!("protect: {}", said.join("; ")))
}

/// A file left unread whose set's first pass found the content its tag claims.
fn verified(report: &mut FileReport) {
    report.status = Status::Ok;
    report.digest = report.tag.as_ref().map(|t| t.digest);
    report.bytes_read = report.size.unwrap_or(0);
}

impl Sink for Protector {
    fn take(&mut self, mut report: FileReport, out: &mut dyn Out) -> Result<(), Failure> {
        if report.status != Status::Skipped {
            self.walked[report.root] += 1;
        }
        let given = self.give(&mut report);
        self.note_live(&report);
        let (wait, already) = given.as_ref().map_or((None, false), |g| *g);
        self.held.push_back(Held {
            report,
            wait,
            already,
        });
        let flushed = if self.held.len() >= HOLD {
            self.flush()
        } else {
            Ok(())
        };
        self.release(out, false);
        given.map(drop).and(flushed)
    }

    /// A protect of the whole tree is told the files gone from it, to hold its parity when
    /// many went at once.
    fn wants_missing(&self) -> bool {
        self.keep_stale.is_some()
    }

    /// The files gone since a run last recorded what was gone: under a root that lost many
    /// at once they are an alarm (and its parity is kept); elsewhere they are deletions,
    /// recorded as a scrub records them (counted from one run to the next, not piled up
    /// until they look like a mass deletion).
    fn missing(&mut self, files: Vec<crate::state::Missing>) -> Vec<crate::state::Missing> {
        let roots: Vec<PathBuf> = self
            .roots
            .iter()
            .map(|r| crate::state::absolute(r))
            .collect();
        let mut gone: Vec<Vec<crate::state::Missing>> = roots.iter().map(|_| Vec::new()).collect();
        // Those a scrub recorded gone were routine deletions, or many the owner confirmed.
        for m in files.into_iter().filter(|m| !m.recorded) {
            if let Some(i) = roots.iter().position(|r| m.path.starts_with(r)) {
                gone[i].push(m);
            }
        }
        self.gone = Some(gone.iter().map(|g| g.len() as u64).collect());
        (0..roots.len())
            .filter(|&i| self.removal(i).is_none())
            .flat_map(|i| std::mem::take(&mut gone[i]))
            .collect()
    }

    fn finish(&mut self, interrupted: bool, out: &mut dyn Out) -> Result<(), Failure> {
        let mut result = if interrupted { Ok(()) } else { self.flush() };
        if result.is_ok() && !interrupted {
            result = self.prune(out);
        }
        drop(self.jobs.take());
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
        for store in self.stores.iter() {
            store.tidy();
        }
        self.release(out, true);
        let (sets, bytes) = self
            .stores
            .iter()
            .map(Store::written)
            .fold((0, 0), |(s, b), (s2, b2)| (s + s2, b + b2));
        out.note(format!(
            "protect: wrote {sets} PAR2 sets, {}",
            crate::text::bytes(bytes)
        ));
        if self.renamed > 0 {
            out.note(format!(
                "protect: {} parity set(s) renamed after their files, which moved (par2cmdline \
                 finds a file by the name its set records)",
                self.renamed
            ));
        }
        for why in self.not_renamed.drain(..) {
            out.note(why);
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store outside its tree is named as `systemd-escape --path` names the tree (what
    /// that tool printed for each), and a name too long to be one is cut and told apart by
    /// a digest of the whole path.
    #[test]
    fn a_store_outside_is_named_as_systemd_names_its_tree() {
        for (tree, name) in [
            ("/srv/nas photos", r"srv-nas\x20photos"),
            ("/a-b/.c", r"a\x2db-.c"),
            ("/", "-"),
            ("/.hidden/x", r"\x2ehidden-x"),
            ("/tmp/ü", r"tmp-\xc3\xbc"),
        ] {
            assert_eq!(store_name(Path::new(tree)), std::ffi::OsString::from(name));
        }
        let deep = |last: &str| store_name(&Path::new("/srv").join("d".repeat(300)).join(last));
        let (a, b) = (deep("a"), deep("b"));
        assert!(a.len() <= 255 && a != b, "{a:?} {b:?}");
    }
}
