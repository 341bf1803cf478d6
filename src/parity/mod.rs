//! The parity store: PAR2 recovery data for a tree, found again by digest.
//!
//! Layout of a store (by default `.intact-parity` at the root of the protected tree):
//!
//! ```text
//! INTACT-PARITY                          marker: format version and the protected root
//! sha256-3f/3fa4…e1.par2                 one set per large file, named by its digest
//! sha256-3f/3fa4…e1.vol00+12.par2
//! packs/5c07…9a.par2                     small files, many to a set
//! packs/5c07…9a.vol00+26.par2
//! ```
//!
//! Every set is standard PAR2, with file names relative to the protected root, so
//! `par2 verify -B ROOT SET.par2` and `par2 repair -B ROOT SET.par2` work on it. A file that
//! moved or was renamed is still found: large files by the digest in the set's name, small
//! ones by an extra packet in their pack (type `intact\0\0digests\0`, ignored by other PAR2
//! programs) listing each member's digest. A large file's set exists once per content, so
//! protecting again only adds sets for what changed. Small files are packed so that each costs
//! about one slice, not a slice of the size the largest file needs (par2cmdline's overhead on
//! many small files).

mod protect;
mod prune;

pub use protect::{Protector, store_dir, store_over};
use prune::STALE_EXT;
pub use prune::{Live, Pruned, STALE_DIR};

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use crate::core::digest::{Algo, Digest, Hasher};
use crate::fs::anchor::Anchor;
use crate::fs::atomic::{Batch, Temp};
use crate::fs::owned::Owned;

/// The marker file that makes a directory a parity store.
pub const MARKER: &str = "INTACT-PARITY";
/// Where a tree's store is unless told otherwise.
pub const DEFAULT_DIR: &str = ".intact-parity";
/// Files smaller than this share packs; larger ones get a set each.
pub const PACK_LIMIT: u64 = 256 << 10;

/// The first bytes of a one-file set's index, which hold its main packet and its file's
/// description (a name of up to 4 KiB).
const SET_HEAD: u64 = 8 << 10;
/// A pack closes at this many files or bytes. The work of computing parity grows with the
/// square of a set's size (every recovery slice takes in every input slice), so packs stay
/// small: 256 files at 10% cost 26 times their bytes.
const PACK_BYTES: u64 = 4 << 20;
const PACK_FILES: usize = 256;
/// The packet type listing a pack's digests.
const DIGESTS: &[u8; 16] = b"intact\0\0digests\0";
/// A large file is cut into slices of at least this size, and into at most
/// [`MAX_SLICES`] (par2cmdline's default block count): enough to confine scattered damage,
/// few enough for small checksums and bounded work.
const MIN_SLICE: u64 = 4 << 10;
const MAX_SLICES: u64 = 2000;

/// A file to protect: where it is, what it holds.
#[derive(Clone, Debug)]
pub struct Protectee {
    /// Its path.
    pub path: PathBuf,
    /// Its path relative to the protected root (the name stored in the set).
    pub name: Vec<u8>,
    /// Its size.
    pub size: u64,
    /// Its digest, as its tag holds it.
    pub digest: Digest,
}

/// An open parity store. Sets are computed by [`Store::run`], which several threads may call
/// at once; [`Store::add`] decides what goes in which set.
pub struct Store {
    /// Where its names are reached: through its held folder (see [`Owned`]).
    dir: PathBuf,
    held: Owned,
    /// The tree the names in its sets are relative to.
    pub root: PathBuf,
    /// Digests of files in packs, and the pack each is in: an entry per small file of the
    /// tree, so the pack is named by its ID (a path each cost 200,000 files 30 MiB).
    packed: Mutex<HashMap<Digest, PackId>>,
    /// Each pack member under the name its pack records ([`prune::name_key`]): a member met
    /// under another is a file moved since it was packed.
    recorded: std::collections::HashSet<u64>,
    /// The same for the packs moved aside to `stale/`, with the day folder each is in: still
    /// a source for intact's repair (which verifies by digest), never a set par2cmdline
    /// takes by accident.
    stale_packed: HashMap<Digest, (PackId, Option<u32>)>,
    /// Contents whose own set was moved aside, and the day folder it is in (`None`: straight
    /// in `stale/`, as an earlier build moved sets aside).
    stale_own: HashMap<Digest, Option<u32>>,
    /// Each pack's member count and bytes when the store was opened: what a prune needs to
    /// know of a pack whose members are all in the tree, without reading it again.
    pack_sizes: Mutex<HashMap<PackId, (usize, u64)>>,
    /// What became of the contents given to this run; a digest not here had parity before
    /// it (or never came).
    outcomes: Mutex<HashMap<Digest, Outcome>>,
    redundancy: f64,
    threads: usize,
    /// Small files waiting for their pack to fill, and their bytes.
    pending: Mutex<(Vec<Protectee>, u64)>,
    /// Set files written, waiting to be made durable and put in place.
    staged: Mutex<Staged>,
    /// Sets made durable by this run, and their bytes.
    written: Mutex<(u64, u64)>,
    /// Temp files that killed runs had left in the store, removed when it was opened.
    pub removed: Vec<PathBuf>,
}

/// What became of a content given to a run of protect.
#[derive(Clone, Debug)]
pub enum Outcome {
    /// Its set is on its way: queued, computing, or written but not yet durable.
    Pending,
    /// Its set is durable under its name.
    Durable,
    /// It changed between its check and its parity: it has none.
    Changed,
    /// Reading it for its parity failed: it has none.
    Unreadable(Arc<io::Error>),
    /// Its set could not be written (one error for every content of the set).
    Failed(Arc<io::Error>),
}

impl Outcome {
    fn failed(e: &io::Error) -> Outcome {
        Outcome::Failed(Arc::new(copied(e)))
    }

    /// The error of a failed outcome, for the report of one file with that content.
    pub fn error(&self) -> Option<io::Error> {
        match self {
            Outcome::Failed(e) | Outcome::Unreadable(e) => Some(copied(e)),
            _ => None,
        }
    }
}

/// An error like `e` (the same OS code, or kind and words), for a second owner: an
/// `io::Error` cannot be cloned.
fn copied(e: &io::Error) -> io::Error {
    match e.raw_os_error() {
        Some(code) => io::Error::from_raw_os_error(code),
        None => io::Error::new(e.kind(), e.to_string()),
    }
}

/// What became of a file given to [`Store::add`].
#[derive(Debug)]
pub enum Added {
    /// Its content has recovery data already (or on its way).
    Already,
    /// It waits in a pack that is not full yet.
    Waiting,
    /// A set to compute now, with it in.
    Run(Job),
}

/// A set to compute: one large file's, or a pack of small ones.
#[derive(Debug)]
pub enum Job {
    /// A file with a set of its own.
    File(Protectee),
    /// Small files sharing a set.
    Pack(Vec<Protectee>),
}

/// Set files written and not yet durable, the contents they protect, and their count and
/// bytes.
#[derive(Default)]
struct Staged {
    batch: Batch,
    digests: Vec<Digest>,
    sets: u64,
    bytes: u64,
}

/// Files left without parity because they changed after they were verified (or could not be
/// read).
type Changed = Vec<Left>;

/// A file left out of its set.
#[derive(Debug)]
struct Left {
    /// The digest it was verified with (or its tag claims).
    digest: Digest,
    path: PathBuf,
    /// Why, if reading it failed (else its data did not hash to the digest).
    unreadable: Option<io::Error>,
}

/// Why a parity store could not be opened for protecting.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// It protects another tree: a usage error, as each tree has a store of its own.
    #[error(
        "the parity store {} protects {}: give each tree its own store",
        crate::text::escape(dir),
        crate::text::escape(root)
    )]
    OtherTree {
        /// The store.
        dir: PathBuf,
        /// The tree it protects.
        root: PathBuf,
    },
    /// It could not be read or made.
    #[error("opening the parity store {}: {source}", crate::text::escape(dir))]
    Io {
        /// The store.
        dir: PathBuf,
        /// Why.
        source: io::Error,
    },
}

impl Store {
    /// Opens (creating it if need be) the store at `dir` for files under `root`.
    pub fn open(
        dir: &Path,
        root: &Path,
        redundancy: f64,
        threads: usize,
    ) -> Result<Store, OpenError> {
        let io = |source| OpenError::Io {
            dir: dir.to_path_buf(),
            source,
        };
        let root = root.canonicalize().map_err(io)?;
        let held = Owned::open(dir, Some(0o755)).map_err(io)?;
        let mut store = Store::create(held, &root).map_err(io)?;
        if store.root.canonicalize().ok().as_ref() != Some(&root) {
            return Err(OpenError::OtherTree {
                dir: dir.to_path_buf(),
                root: store.root,
            });
        }
        store.root = root;
        store.redundancy = redundancy;
        store.threads = threads;
        // Set files a killed run was writing.
        let at = store.dir.clone();
        let mut removed = crate::fs::atomic::remove_stale(&at);
        for e in std::fs::read_dir(&at).map_err(io)?.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                removed.extend(crate::fs::atomic::remove_stale(&e.path()));
            }
        }
        store.removed = removed.iter().map(|p| store.held.show(p)).collect();
        Ok(store)
    }

    /// The store in `held`, made for `root` first if there is none.
    fn create(held: Owned, root: &Path) -> io::Result<Store> {
        let at = held.at();
        std::fs::create_dir_all(at.join("packs"))?;
        let marker = at.join(MARKER);
        if std::fs::symlink_metadata(&marker).is_err() {
            let mut text = b"intact parity store v1\nroot=".to_vec();
            text.extend_from_slice(root.as_os_str().as_encoded_bytes());
            text.push(b'\n');
            let temp = Temp::beside(&marker)?;
            temp.file().write_all(&text)?;
            temp.commit(OsStr::new(MARKER))?;
        }
        Store::read_held(held)
    }

    /// Where the store is, as given.
    pub fn shown(&self) -> &Path {
        self.held.shown()
    }

    /// Whether `dir` is a parity store.
    pub fn is_store(dir: &Path) -> bool {
        dir.join(MARKER).is_file()
    }

    /// Opens an existing store for reading.
    pub fn read(dir: &Path) -> io::Result<Store> {
        Store::read_held(Owned::open(dir, None)?)
    }

    fn read_held(held: Owned) -> io::Result<Store> {
        let (dir, shown) = (held.at().to_path_buf(), held.shown());
        let marker = crate::fs::sys::read_regular(&dir.join(MARKER))?;
        // A tree's own store goes where the tree goes: its root is its parent, wherever the
        // tree has moved. A store elsewhere names its root in the marker.
        let recorded = marker
            .split(|&b| b == b'\n')
            .find_map(|l| l.strip_prefix(b"root="))
            .map(|r| PathBuf::from(std::ffi::OsStr::from_bytes(r)));
        let parent = shown.parent().filter(|p| !p.as_os_str().is_empty());
        let root = match (shown.file_name(), parent, recorded) {
            (Some(n), Some(p), _) if n == DEFAULT_DIR => p.to_path_buf(),
            (Some(n), None, _) if n == DEFAULT_DIR => PathBuf::from("."),
            (_, _, Some(r)) => r,
            (_, p, None) => p.unwrap_or(Path::new(".")).to_path_buf(),
        };
        // An unreadable pack index loses that pack's files, not the store.
        let packs_in = |folder: PathBuf| {
            let (mut packed, mut sizes) = (HashMap::new(), HashMap::new());
            let mut recorded = std::collections::HashSet::new();
            for e in std::fs::read_dir(folder).into_iter().flatten().flatten() {
                let p = e.path();
                if is_index(&p)
                    && let Some(id) = pack_id(&p)
                    && let Ok(bytes) = crate::fs::sys::read_regular(&p)
                {
                    let (digests, described, names) = pack_summary(&bytes);
                    sizes.insert(id, (digests.len(), described));
                    for (file, digest) in digests {
                        if let Some(name) = names.get(&file) {
                            recorded.insert(prune::name_key(&digest, name));
                        }
                        packed.insert(digest, id);
                    }
                }
            }
            (packed, sizes, recorded)
        };
        let (packed, pack_sizes, recorded) = packs_in(dir.join("packs"));
        // What was moved aside: by day (and straight in `stale/`, by an earlier build).
        let (mut stale_packed, mut stale_own) = (HashMap::new(), HashMap::new());
        let stale = dir.join(STALE_DIR);
        let days = std::fs::read_dir(&stale)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok());
        for day in days.map(Some).chain([None]) {
            let folder = prune::stale_folder(&dir, day);
            for (d, id) in packs_in(folder.join("packs")).0 {
                stale_packed.insert(d, (id, day));
            }
            for e in std::fs::read_dir(&folder).into_iter().flatten().flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let Some(algo) = name.split('-').next().and_then(|a| a.parse::<Algo>().ok()) else {
                    continue;
                };
                for f in std::fs::read_dir(e.path()).into_iter().flatten().flatten() {
                    let f = f.path();
                    let digest = f
                        .file_name()
                        .and_then(|n| n.to_str()?.split('.').next())
                        .and_then(|hex| hex::decode(hex).ok()?.try_into().ok())
                        .map(|bytes| Digest { algo, bytes });
                    if let (true, Some(digest)) = (is_index(&f), digest) {
                        stale_own.insert(digest, day);
                    }
                }
            }
        }
        Ok(Store {
            dir,
            held,
            root,
            packed: Mutex::new(packed),
            recorded,
            pack_sizes: Mutex::new(pack_sizes),
            stale_packed,
            stale_own,
            outcomes: Mutex::new(HashMap::new()),
            redundancy: 0.0,
            threads: 1,
            pending: Mutex::new((Vec::new(), 0)),
            staged: Mutex::new(Staged::default()),
            written: Mutex::new((0, 0)),
            removed: Vec::new(),
        })
    }

    fn set_base(&self, digest: &Digest) -> PathBuf {
        let hex = digest.hex();
        self.dir
            .join(format!("{}-{}", digest.algo, &hex[..2]))
            .join(hex)
    }

    /// Whether the content `digest`, in a pack here, is recorded there under `name` (relative
    /// to the root); `None` if it is in no pack.
    pub fn packed_at(&self, digest: &Digest, name: &[u8]) -> Option<bool> {
        lock(&self.packed)
            .contains_key(digest)
            .then(|| self.recorded.contains(&prune::name_key(digest, name)))
    }

    /// The name the own set of the content `digest` records for its file, if it has one
    /// (read from the first bytes of its index: the main packet and the description come
    /// first).
    pub fn set_name(&self, digest: &Digest) -> Option<Vec<u8>> {
        par2::Rename::recorded(&self.set_head(digest).ok()?)
    }

    /// The first bytes of the own set's index of the content `digest`.
    fn set_head(&self, digest: &Digest) -> io::Result<Vec<u8>> {
        let index = with_ext(&self.set_base(digest), "par2");
        let mut head = Vec::new();
        crate::fs::sys::open_regular(&index)?
            .take(SET_HEAD)
            .read_to_end(&mut head)?;
        Ok(head)
    }

    /// Renames the own set of the content `digest` after its file, now at `name` (relative
    /// to the root): par2cmdline looks for a set's file under the name the set records. Every
    /// packet is written again, no recovery data computed again ([`par2::Rename`]); each file
    /// of the set is written beside itself, made durable and put in place, volumes first and
    /// the index last, so a run killed between leaves a set the next run renames again (and
    /// that intact's repair still reads: it verifies what it rebuilds by digest). Whether it
    /// was renamed.
    pub fn rename_set(&self, digest: &Digest, name: &[u8]) -> io::Result<bool> {
        let Some(rename) = par2::Rename::new(&self.set_head(digest)?, name) else {
            return Ok(false);
        };
        let index = with_ext(&self.set_base(digest), "par2");
        let mut files = volumes(&index)?;
        files.push(index);
        for file in files {
            let from = crate::fs::sys::open_regular(&file)?;
            let temp = Temp::beside(&file)?;
            let mut to = io::BufWriter::with_capacity(1 << 20, temp.file());
            rename.copy(&mut io::BufReader::with_capacity(1 << 20, from), &mut to)?;
            to.flush()?;
            drop(to);
            temp.commit(file.file_name().expect("a set file"))?;
        }
        Ok(true)
    }

    /// Whether the content `digest` already has recovery data here (or on its way).
    pub fn has(&self, digest: &Digest) -> bool {
        let index = with_ext(&self.set_base(digest), "par2");
        lock(&self.packed).contains_key(digest)
            || lock(&self.outcomes).contains_key(digest)
            || index.exists()
    }

    /// Takes a file in: a large one makes a job at once; a small one waits for its pack to
    /// fill, and the file that fills it makes the pack's job.
    pub fn add(&self, file: Protectee) -> Added {
        if self.has(&file.digest) {
            return Added::Already;
        }
        lock(&self.outcomes).insert(file.digest, Outcome::Pending);
        if file.size >= PACK_LIMIT {
            return Added::Run(Job::File(file));
        }
        let mut pending = lock(&self.pending);
        pending.1 += file.size;
        pending.0.push(file);
        if pending.0.len() >= PACK_FILES || pending.1 >= PACK_BYTES {
            pending.1 = 0;
            return Added::Run(Job::Pack(std::mem::take(&mut pending.0)));
        }
        Added::Waiting
    }

    /// The pack of the small files still waiting, if any.
    pub fn take_pending(&self) -> Option<Job> {
        let mut pending = lock(&self.pending);
        pending.1 = 0;
        let files = std::mem::take(&mut pending.0);
        (!files.is_empty()).then_some(Job::Pack(files))
    }

    /// Computes and stages a job's set (made durable and put in place by [`Store::commit`]).
    /// A file that changed since it was verified gets no parity (a pack is made of the
    /// others). What becomes of each file is in [`Store::outcome`].
    pub fn run(&self, job: Job) {
        let digests: Vec<Digest> = match &job {
            Job::File(f) => vec![f.digest],
            Job::Pack(files) => files.iter().map(|f| f.digest).collect(),
        };
        let result = self.compute(job);
        let mut outcomes = lock(&self.outcomes);
        match result {
            Ok(changed) => {
                for left in changed {
                    let outcome = match left.unreadable {
                        Some(e) => Outcome::Unreadable(Arc::new(e)),
                        None => Outcome::Changed,
                    };
                    outcomes.insert(left.digest, outcome);
                }
            }
            Err(e) => {
                for d in digests {
                    outcomes.insert(d, Outcome::failed(&e));
                }
            }
        }
    }

    /// What became of the content `digest` given to this run: its parity is durable (or was
    /// there before), still on its way, or could not be written.
    pub fn outcome(&self, digest: &Digest) -> Outcome {
        lock(&self.outcomes)
            .get(digest)
            .cloned()
            .unwrap_or(Outcome::Durable)
    }

    /// Sets made durable by this run so far, and their bytes.
    pub fn written(&self) -> (u64, u64) {
        *lock(&self.written)
    }

    fn compute(&self, job: Job) -> io::Result<Changed> {
        match job {
            Job::File(file) => {
                let base = self.set_base(&file.digest);
                let slices = (file.size / MIN_SLICE).clamp(1, MAX_SLICES);
                let slice = par2::slice_size_for(file.size, slices);
                match self.write_set(std::slice::from_ref(&file), slice, &base, false) {
                    Ok(()) => Ok(Vec::new()),
                    Err(ProtectError::Changed(changed)) => Ok(changed),
                    Err(ProtectError::Io(e)) => Err(e),
                }
            }
            Job::Pack(mut files) => {
                let mut changed = Vec::new();
                while !files.is_empty() {
                    match self.write_pack(&files) {
                        Ok(id) => {
                            let mut packed = lock(&self.packed);
                            for f in files {
                                packed.insert(f.digest, id);
                            }
                            return Ok(changed);
                        }
                        Err(ProtectError::Changed(paths)) => {
                            files.retain(|f| !paths.iter().any(|l| l.path == f.path));
                            changed.extend(paths);
                        }
                        Err(ProtectError::Io(e)) => return Err(e),
                    }
                }
                Ok(changed)
            }
        }
    }

    /// Makes every set staged so far durable and puts it in place.
    pub fn commit(&self) -> io::Result<()> {
        let mut staged = lock(&self.staged);
        self.commit_staged(&mut staged)
    }

    /// Removes set directories left empty by sets that could not be written. Only once no
    /// set is being written (a directory emptied meanwhile could be the one a set is about
    /// to go in).
    pub fn tidy(&self) {
        for e in std::fs::read_dir(&self.dir).into_iter().flatten().flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                // Fails, harmlessly, unless the directory is empty.
                let _ = std::fs::remove_dir(e.path());
            }
        }
    }

    /// Commits a batch, and records what it made durable (or failed to).
    fn commit_staged(&self, staged: &mut Staged) -> io::Result<()> {
        let committed = staged.batch.commit();
        if committed.is_ok() {
            let mut written = lock(&self.written);
            written.0 += staged.sets;
            written.1 += staged.bytes;
        }
        (staged.sets, staged.bytes) = (0, 0);
        let mut outcomes = lock(&self.outcomes);
        for d in staged.digests.drain(..) {
            match &committed {
                // Durable is what an absent digest means: the map holds only the unsettled.
                Ok(()) => outcomes.remove(&d),
                Err(e) => outcomes.insert(d, Outcome::failed(e)),
            };
        }
        committed
    }

    /// Stages a written set, volume before index (an index means a complete set), for the
    /// contents `digests`; a full batch is committed.
    fn stage(&self, files: [(Temp, PathBuf); 2], digests: &[Digest], bytes: u64) -> io::Result<()> {
        let mut staged = lock(&self.staged);
        for (temp, dest) in files {
            staged.batch.add(temp, dest);
        }
        staged.digests.extend_from_slice(digests);
        staged.sets += 1;
        staged.bytes += bytes;
        if staged.batch.len() >= BATCH {
            self.commit_staged(&mut staged)?;
        }
        Ok(())
    }

    /// Writes one pack; returns its ID.
    fn write_pack(&self, files: &[Protectee]) -> Result<PackId, ProtectError> {
        // About one slice per file: small files waste little padding.
        let total: u64 = files.iter().map(|f| f.size).sum();
        let slice = (total.div_ceil(files.len() as u64))
            .max(64)
            .next_multiple_of(4);
        let mut id = Hasher::new(Algo::Sha256);
        for f in files {
            id.update(&f.digest.bytes);
        }
        let id: PackId = id.finalize().bytes[..16].try_into().expect("16 bytes");
        let index = self.pack_index(&id);
        self.write_set(files, slice, &index.with_extension(""), true)?;
        lock(&self.pack_sizes).insert(id, (files.len(), total));
        Ok(id)
    }

    /// The index file of pack `id`.
    fn pack_index(&self, id: &PackId) -> PathBuf {
        self.dir
            .join("packs")
            .join(format!("{}.par2", hex::encode(id)))
    }

    /// Computes a set over `files` (each hashed again as it is read: a file that changed
    /// since it was verified gets no parity) and writes it: volume first, index last, so an
    /// index means a complete set.
    fn write_set(
        &self,
        files: &[Protectee],
        slice: u64,
        base: &Path,
        pack: bool,
    ) -> Result<(), ProtectError> {
        let inputs: Vec<par2::Input> = files
            .iter()
            .map(|f| par2::Input {
                name: f.name.clone(),
                len: f.size,
            })
            .collect();
        let slices: u64 = files.iter().map(|f| f.size.div_ceil(slice)).sum();
        let recovery = ((slices as f64 * self.redundancy).ceil() as u32).clamp(1, 65535);
        // Opened beneath the root, never through a symlink: for a file the engine left unread,
        // this read is its verification.
        let anchor = Anchor::new(&self.root);
        let set_files = SetFiles {
            files,
            anchor: &anchor,
            seen: Mutex::new(vec![None; files.len()]),
            unreadable: Mutex::new((0..files.len()).map(|_| None).collect()),
            at: (0..files.len()).map(|_| OnceLock::new()).collect(),
        };
        if let Some(dir) = base.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let name = base.file_name().expect("a set name").to_string_lossy();
        let volume = base.with_file_name(par2::volume_name(&name, 0, recovery));
        // The volume is written in place as it is computed (in passes for a large file), to
        // a temp name; it is staged with the index once both are whole.
        let temp = Temp::beside(&volume)?;
        let plan = par2::Plan {
            slice_size: slice,
            recovery_count: recovery,
            threads: self.threads,
            // Each worker computes a set at a time.
            memory: PARITY_MEMORY / self.threads.max(1) as u64,
        };
        let mut out = Flushing {
            file: temp.file(),
            since: 0,
        };
        let created = par2::create(&inputs, &set_files, &plan, &mut out).map_err(|e| match e {
            par2::Error::Io(e) => ProtectError::Io(e),
            par2::Error::Changed(i) => ProtectError::Changed(vec![set_files.left(i)]),
            other => ProtectError::Io(io::Error::other(other.to_string())),
        })?;
        let volume_len = temp.file().metadata()?.len();
        let seen = lock(&set_files.seen);
        let changed: Vec<usize> = (0..files.len())
            .filter(|&i| seen[i].as_ref() != Some(&files[i].digest))
            .collect();
        if !changed.is_empty() {
            return Err(ProtectError::Changed(
                changed.into_iter().map(|i| set_files.left(i)).collect(),
            ));
        }
        let mut index = created.index.clone();
        if pack {
            // Each member's digest by its file ID, so that a moved member is still found.
            let by_name: HashMap<&[u8], &Protectee> =
                files.iter().map(|f| (&f.name[..], f)).collect();
            let mut body = Vec::with_capacity(files.len() * DIGEST_ENTRY);
            for entry in &created.files {
                let f = by_name[&entry.name[..]];
                body.extend_from_slice(&entry.id);
                body.push(match f.digest.algo {
                    Algo::Sha256 => 0,
                    Algo::Blake3 => 1,
                });
                body.extend_from_slice(&f.digest.bytes);
            }
            index.extend(par2::packet::encode(&created.id, DIGESTS, &[&body]));
        }
        // The volume repeats the descriptions, as par2cmdline's do: one flipped bit in an
        // index must not cost a whole pack its parity.
        let index_path = with_ext(base, "par2");
        let index_temp = Temp::beside(&index_path)?;
        index_temp.file().write_all(&index)?;
        let digests: Vec<Digest> = files.iter().map(|f| f.digest).collect();
        let bytes = volume_len + index.len() as u64;
        self.stage([(temp, volume), (index_temp, index_path)], &digests, bytes)?;
        Ok(())
    }

    /// The index file of the set that protects `digest` (its own set, or its pack), if any:
    /// files with the same index are repaired from one load of their set. A set moved aside
    /// as stale is one too, when no current set protects the content (a file deleted, or
    /// edited, since: `repair --missing`, or a damaged file whose tag names old content).
    pub fn index_of(&self, digest: &Digest) -> Option<PathBuf> {
        if let Some(id) = lock(&self.packed).get(digest) {
            return Some(self.pack_index(id));
        }
        let own = with_ext(&self.set_base(digest), "par2");
        if own.exists() {
            return Some(own);
        }
        let stale = |day: &Option<u32>| prune::stale_folder(&self.dir, *day);
        if let Some((id, day)) = self.stale_packed.get(digest) {
            return Some(
                stale(day)
                    .join("packs")
                    .join(format!("{}.par2.{STALE_EXT}", hex::encode(id))),
            );
        }
        let day = self.stale_own.get(digest)?;
        let base = self.set_base(digest);
        let folder = base.parent()?.file_name()?;
        let name = base.file_name()?;
        Some(
            stale(day)
                .join(folder)
                .join(format!("{}.par2.{STALE_EXT}", name.to_string_lossy())),
        )
    }

    /// Whether the content `digest` has a set here: `Some(true)` a current one, `Some(false)`
    /// only one moved aside as stale, `None` none.
    pub fn current(&self, digest: &Digest) -> Option<bool> {
        let index = self.index_of(digest)?;
        Some(!index.starts_with(self.dir.join(STALE_DIR)))
    }

    /// Bytes of the current sets, and of those moved aside.
    pub fn sizes(&self) -> (u64, u64) {
        fn under(dir: &Path) -> u64 {
            std::fs::read_dir(dir)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| match e.file_type() {
                    Ok(t) if t.is_dir() => under(&e.path()),
                    _ => e.metadata().map_or(0, |m| m.len()),
                })
                .sum()
        }
        let stale = under(&self.dir.join(STALE_DIR));
        (under(&self.dir).saturating_sub(stale), stale)
    }

    /// The set that protects `digest`, loaded, and the position in it of the file with that
    /// content: its own set, or its pack.
    pub fn find(&self, digest: &Digest) -> Option<io::Result<Found>> {
        let index = self.index_of(digest)?;
        Some((|| {
            let bytes = crate::fs::sys::read_regular(&index)?;
            let set = load_set(&index)?;
            let digests = pack_digests(&bytes);
            if digests.is_empty() {
                return match set.files.len() {
                    1 => Ok(Found {
                        set,
                        at: 0,
                        members: vec![Some(*digest)],
                    }),
                    _ => Err(io::Error::other("a file's set describes other files")),
                };
            }
            let of = |id: &par2::packet::Id| digests.iter().find(|(i, _)| i == id).map(|(_, d)| *d);
            let members: Vec<Option<Digest>> = set.files.iter().map(|f| of(&f.id)).collect();
            let at = members.iter().position(|d| d.as_ref() == Some(digest));
            at.map(|at| Found { set, at, members })
                .ok_or_else(|| io::Error::other("the pack does not describe the file"))
        })())
    }
}

/// A set found for a digest.
pub struct Found {
    /// The set.
    pub set: par2::Set,
    /// The position in it of the file with that digest.
    pub at: usize,
    /// Each of its files' digest, where the store knows it (a pack's members).
    pub members: Vec<Option<Digest>>,
}

/// A volume being written, its pages sent on their way to the disk every [`WRITEBACK`]
/// bytes: the `syncfs` that makes a batch of sets durable then waits for little more than
/// the last of them (a run's end waited ~150 ms for the last 84 MB volume of five 800 MiB
/// files).
struct Flushing<'a> {
    file: &'a File,
    since: u64,
}

const WRITEBACK: u64 = 8 << 20;

impl Write for Flushing<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.file.write(buf)?;
        self.since += n as u64;
        if self.since >= WRITEBACK {
            crate::fs::sys::start_writeback(self.file);
            self.since = 0;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

impl io::Seek for Flushing<'_> {
    fn seek(&mut self, pos: io::SeekFrom) -> io::Result<u64> {
        self.file.seek(pos)
    }
}

/// Set files are made durable and put in place at least this many at a time: after one
/// `syncfs`, never before (an index under its name means a complete set), and a thousand
/// small sets do not cost two thousand fsyncs.
const BATCH: usize = 256;

/// What the sets being computed at once may hold of recovery data and of slices being read,
/// shared out among the workers. A large file's recovery data beyond its share is computed
/// in more passes over ranges of its slices: the file is read through once, then once more
/// in ranges, whatever the number of passes.
const PARITY_MEMORY: u64 = 24 << 20;

/// A lock whose holder never panics mid-update (panics abort this program).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Why a set was not written.
#[derive(Debug, thiserror::Error)]
enum ProtectError {
    /// Reading the files or writing the set failed.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// These files changed between verifying and computing parity.
    #[error("changed while its parity was computed")]
    Changed(Vec<Left>),
}

/// A set's files, as [`par2::create`] reads them: through once while hashing them, then
/// (a set larger than its memory) in ranges.
struct SetFiles<'a> {
    files: &'a [Protectee],
    anchor: &'a Anchor,
    /// Each file's digest as the read through found it; `None` if it could not be read.
    seen: Mutex<Vec<Option<Digest>>>,
    /// Why a file could not be opened or read, if that was it.
    unreadable: Mutex<Vec<Option<io::Error>>>,
    /// Files opened for reading in ranges (by the passes that compute the recovery data,
    /// while another thread reads each file through).
    at: Vec<OnceLock<File>>,
}

impl SetFiles<'_> {
    /// File `i`, left out of the set.
    fn left(&self, i: usize) -> Left {
        Left {
            digest: self.files[i].digest,
            path: self.files[i].path.clone(),
            unreadable: lock(&self.unreadable)[i].take(),
        }
    }
}

impl par2::Files for SetFiles<'_> {
    fn open(&self, i: usize) -> io::Result<Box<dyn par2::Through + '_>> {
        let file = (self.anchor.open(&self.files[i].path, false))
            .map_err(|e| lock(&self.unreadable)[i] = Some(e))
            .ok();
        Ok(Box::new(Hashing {
            file,
            left: self.files[i].size,
            hasher: Some(match self.files[i].digest.algo {
                Algo::Sha256 => Taking::Sha256(par2::sha256::Sha256::new()),
                algo => Taking::Along(Hasher::new(algo)),
            }),
            pending: Vec::new(),
            seen: &self.seen,
            unreadable: &self.unreadable,
            index: i,
        }))
    }

    fn read_at(&self, i: usize, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        use std::os::unix::fs::FileExt;
        let file = match self.at[i].get() {
            Some(file) => file,
            None => {
                let opened = self.anchor.open(&self.files[i].path, false)?;
                self.at[i].get_or_init(|| opened)
            }
        };
        file.read_at(buf, offset)
    }
}

/// Reads a file, and hashes what the first pass reads (with its MD5). A file that vanished, shrank or cannot be read reads as zeros to its expected size
/// and leaves no digest: it is then reported as changed and left out, rather than costing
/// the other files of its pack their parity. The digest is left when it is dropped: the
/// last reader of a file counts (the first only reads the 16 KiB of its file ID).
struct Hashing<'s> {
    file: Option<File>,
    left: u64,
    hasher: Option<Taking>,
    /// BLAKE3 is fed in larger pieces: a block at a time it would not use its SIMD lanes.
    pending: Vec<u8>,
    seen: &'s Mutex<Vec<Option<Digest>>>,
    unreadable: &'s Mutex<Vec<Option<io::Error>>>,
    index: usize,
}

/// The hash a file's digest is taken with as it is read.
enum Taking {
    /// In one pass with the file's MD5.
    Sha256(par2::sha256::Sha256),
    /// Handed the blocks along (BLAKE3).
    Along(Hasher),
}

/// How much BLAKE3 input [`Hashing`] gathers before hashing it.
const GATHER: usize = 64 << 10;

impl par2::Through for Hashing<'_> {
    fn sha256(&mut self) -> Option<&mut par2::sha256::Sha256> {
        match self.hasher.as_mut() {
            Some(Taking::Sha256(sha)) => Some(sha),
            _ => None,
        }
    }

    fn along(&mut self, piece: &[u8]) {
        if let Some(Taking::Along(h)) = self.hasher.as_mut() {
            self.pending.extend_from_slice(piece);
            if self.pending.len() >= GATHER {
                h.update(&self.pending);
                self.pending.clear();
            }
        }
    }
}

impl Read for Hashing<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let want = buf.len().min(self.left.min(usize::MAX as u64) as usize);
        if want == 0 {
            return Ok(0);
        }
        let n = match self.file.as_mut().map(|f| f.read(&mut buf[..want])) {
            Some(Ok(n)) if n > 0 => n,
            Some(Err(e)) if e.kind() == io::ErrorKind::Interrupted => return Err(e),
            other => {
                if let Some(Err(e)) = other {
                    lock(self.unreadable)[self.index] = Some(e);
                }
                self.file = None;
                self.hasher = None;
                buf[..want].fill(0);
                want
            }
        };
        self.left -= n as u64;
        Ok(n)
    }
}

impl Drop for Hashing<'_> {
    fn drop(&mut self) {
        let digest = match self.hasher.take() {
            Some(Taking::Sha256(sha)) => Digest {
                algo: Algo::Sha256,
                bytes: sha.finalize(),
            },
            Some(Taking::Along(mut h)) => {
                h.update(&self.pending);
                h.finalize()
            }
            None => return,
        };
        lock(self.seen)[self.index] = Some(digest);
    }
}

/// A PAR2 set given by one of its files (any `NAME.par2` or `NAME.volXX+YY.par2`), loaded
/// with all the files of its name beside it.
pub fn load(path: &Path) -> io::Result<par2::Set> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let stem = match name.find(".vol") {
        Some(i) => &name[..i],
        None => name.trim_end_matches(".par2"),
    };
    load_set(&path.with_file_name(format!("{stem}.par2")))
}

/// A set's index file and all its volumes, checked together; recovery data stays on disk
/// until a repair reads the slices it needs.
fn load_set(index: &Path) -> io::Result<par2::Set> {
    // An unreadable index or volume costs its packets, not the set.
    let mut files: Vec<File> = crate::fs::sys::open_regular(index).into_iter().collect();
    files.extend(
        volumes(index)?
            .iter()
            .filter_map(|v| crate::fs::sys::open_regular(v).ok()),
    );
    par2::Set::open(files).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))
}

/// The volumes beside the set's index `index` (`NAME.volXX+YY.par2`, or `.par2.stale` for a
/// set moved aside), sorted: regular files only (a symlink or anything else of the name is
/// never taken for one).
fn volumes(index: &Path) -> io::Result<Vec<PathBuf>> {
    let dir = index.parent().unwrap_or(Path::new("."));
    let name = index
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    // A set moved aside: every file of it renamed `*.par2.stale`.
    let ext = if name.ends_with(&format!(".par2.{STALE_EXT}")) {
        format!(".par2.{STALE_EXT}")
    } else {
        ".par2".to_string()
    };
    let stem = name.strip_suffix(ext.as_str()).unwrap_or(&name);
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)?
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.starts_with(&format!("{stem}.vol")) && n.ends_with(&ext)
        })
        .map(|e| e.path())
        .collect();
    found.sort();
    Ok(found)
}

/// Bytes per entry of a pack's digest packet: file ID, algorithm, digest.
const DIGEST_ENTRY: usize = 16 + 1 + 32;

/// The (file ID, digest) entries of a pack's digest packet.
fn pack_digests(bytes: &[u8]) -> Vec<(par2::packet::Id, Digest)> {
    pack_summary(bytes).0
}

/// A pack's (file ID, digest) entries, the bytes of the files it describes (each
/// description once), and the name each file ID is described by, from one parse of its index.
#[allow(clippy::type_complexity)]
fn pack_summary(
    bytes: &[u8],
) -> (
    Vec<(par2::packet::Id, Digest)>,
    u64,
    HashMap<par2::packet::Id, Vec<u8>>,
) {
    let (mut out, mut names, mut total) = (Vec::new(), HashMap::new(), 0);
    for found in par2::packet::parse(bytes) {
        match found.packet {
            par2::packet::Packet::Other { kind, body } if &kind == DIGESTS => {
                for rec in bytes[body].chunks_exact(DIGEST_ENTRY) {
                    let algo = match rec[16] {
                        0 => Algo::Sha256,
                        1 => Algo::Blake3,
                        _ => continue,
                    };
                    let digest = Digest {
                        algo,
                        bytes: rec[17..49].try_into().expect("32 bytes"),
                    };
                    out.push((rec[..16].try_into().expect("16 bytes"), digest));
                }
            }
            par2::packet::Packet::FileDesc { id, len, name, .. } => {
                if let std::collections::hash_map::Entry::Vacant(e) = names.entry(id) {
                    e.insert(name);
                    total += len;
                }
            }
            _ => {}
        }
    }
    (out, total, names)
}

/// A pack's ID: the first 16 bytes of the SHA-256 of its members' digests, its name in hex.
type PackId = [u8; 16];

/// The ID of the pack whose index is `p`, from its name.
fn pack_id(p: &Path) -> Option<PackId> {
    let stem = p.file_name()?.to_str()?.split('.').next()?;
    hex::decode(stem).ok()?.try_into().ok()
}

/// Whether `p` is a set's index (`NAME.par2`, or `NAME.par2.stale` moved aside), not a
/// volume.
fn is_index(p: &Path) -> bool {
    p.file_name().is_some_and(|n| {
        let n = n.to_string_lossy();
        (n.ends_with(".par2") || n.ends_with(&format!(".par2.{STALE_EXT}"))) && !n.contains(".vol")
    })
}

fn with_ext(base: &Path, ext: &str) -> PathBuf {
    let mut s = base.as_os_str().to_os_string();
    s.push(".");
    s.push(ext);
    PathBuf::from(s)
}

/// A name stored in a set, as a path under `root`: only plain components, so no name can
/// lead outside it.
pub fn resolve(root: &Path, name: &[u8]) -> Option<PathBuf> {
    let rel = Path::new(std::ffi::OsStr::from_bytes(name));
    if rel.as_os_str().is_empty() || !rel.components().all(|c| matches!(c, Component::Normal(_))) {
        return None;
    }
    Some(root.join(rel))
}

use std::os::unix::ffi::OsStrExt;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_names_never_lead_outside_the_root() {
        let root = Path::new("/r");
        assert_eq!(resolve(root, b"a/b"), Some(PathBuf::from("/r/a/b")));
        for bad in [&b"../x"[..], b"/etc/passwd", b"a/../../x", b"", b"./a"] {
            assert_eq!(resolve(root, bad), None, "{}", String::from_utf8_lossy(bad));
        }
    }

    /// The parity is computed over what is read as it is computed, which must be what was
    /// verified: the digest taken along the way (beside PAR2's MD5) decides. A file whose
    /// bytes are not those of its digest gets none; its pack is made of the others.
    #[test]
    fn parity_is_only_made_of_the_verified_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("tree");
        std::fs::create_dir(&root).unwrap();
        for algo in [Algo::Sha256, Algo::Blake3] {
            // Sizes around BLAKE3's gathering, a pack's limit, and a set of its own.
            for (size, pack) in [(100, true), (200 << 10, true), (600 << 10, false)] {
                let store = Store::open(&dir.path().join("store"), &root, 0.1, 2).unwrap();
                let files: Vec<Protectee> = (0..3)
                    .map(|i| {
                        let path = root.join(format!("{algo:?}-{size}-{i}"));
                        let mut rng = crate::testutil::Rng::new((size + i) as u64);
                        let data: Vec<u8> = (0..size).map(|_| rng.below(256) as u8).collect();
                        std::fs::write(&path, &data).unwrap();
                        let mut digest = crate::core::digest::digest_bytes(algo, &data);
                        if i == 1 {
                            // Verified with other bytes than the file now holds.
                            digest.bytes[0] ^= 1;
                        }
                        Protectee {
                            name: path.file_name().unwrap().as_encoded_bytes().to_vec(),
                            path,
                            size: size as u64,
                            digest,
                        }
                    })
                    .collect();
                let digests: Vec<Digest> = files.iter().map(|f| f.digest).collect();
                let jobs = if pack {
                    vec![Job::Pack(files)]
                } else {
                    files.into_iter().map(Job::File).collect()
                };
                for job in jobs {
                    store.run(job);
                }
                store.commit().unwrap();
                let got: Vec<Outcome> = digests.iter().map(|d| store.outcome(d)).collect();
                assert!(
                    matches!(
                        got[..],
                        [Outcome::Durable, Outcome::Changed, Outcome::Durable]
                    ),
                    "{algo:?}, {size} bytes: {got:?}"
                );
            }
        }
    }
}
