//! A PAR2 2.0 codec ("Parity Volume Set Specification 2.0"): recovery sets that par2cmdline,
//! par2cmdline-turbo, MultiPar and others read, and repair from sets they made.
//!
//! Files are cut into slices of one size (a multiple of 4; the last slice of a file is padded
//! with zeros). Input slice `i` gets the constant `c_i = 2^n_i` (see [`gf::input_constants`]);
//! recovery slice `e` is `sum_i c_i^e * slice_i` over GF(2^16) with generator 0x1100B, word by
//! word. Any `m` damaged slices can be rebuilt from any `m` recovery slices by solving that
//! linear system. MD5 and CRC32 of every slice tell which slices are damaged.
//!
//! Everything here works on bytes and readers: no paths, so a name found in a PAR2 file can
//! never decide where anything is written.

pub mod gf;
pub mod md5x;
pub mod packet;
pub mod sha256;

/// Deterministic pseudo-random bytes for the unit tests.
#[cfg(test)]
fn test_data(len: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0; len];
    fastrand::Rng::with_seed(seed).fill(&mut v);
    v
}

use std::collections::{BTreeMap, HashMap};
use std::io::{self, Read};
use std::sync::Mutex;

use crate::md5x::Md5;
use packet::{Id, Packet, kind};

/// The largest slice a set may have here: rebuilding holds a few slices per damaged one in
/// memory.
pub const MAX_SLICE: u64 = 1 << 30;
/// The most memory a repair may hold for rebuilt slices.
const MAX_REPAIR_MEMORY: u64 = 8 << 30;

/// The PAR2 creator string intact writes.
pub const CREATOR: &str = concat!("intact ", env!("CARGO_PKG_VERSION"));

/// A file to put in a set.
#[derive(Clone, Debug)]
pub struct Input {
    /// The name stored in the set (par2cmdline looks for the file under it).
    pub name: Vec<u8>,
    /// Its length.
    pub len: u64,
}

/// A file as a set describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileEntry {
    /// Its file ID.
    pub id: Id,
    /// MD5 of the whole file.
    pub md5: Id,
    /// MD5 of its first 16 KiB.
    pub md5_16k: Id,
    /// Length.
    pub len: u64,
    /// Name as stored (data, not a path).
    pub name: Vec<u8>,
    /// MD5 and CRC32 of each slice (zero-padded).
    pub slices: Vec<(Id, u32)>,
}

/// A recovery set: its files in set order and the recovery slices at hand.
#[derive(Debug)]
pub struct Set {
    /// The recovery set ID.
    pub id: Id,
    /// Bytes per slice.
    pub slice_size: u64,
    /// The files covered by recovery data, in set order.
    pub files: Vec<FileEntry>,
    /// Recovery slices by exponent.
    pub recovery: BTreeMap<u32, Recovery>,
    /// The PAR2 files a set opened with [`Set::open`] reads its recovery slices from.
    sources: Vec<std::fs::File>,
}

/// Where a recovery slice's data is.
#[derive(Clone, Debug)]
pub enum Recovery {
    /// In memory.
    Bytes(Vec<u8>),
    /// In one of the set's files, at an offset: read when needed, so that a set's memory
    /// does not grow with its recovery data.
    At(usize, u64),
}

/// What went wrong.
#[derive(Debug)]
pub enum Error {
    /// Reading or writing failed.
    Io(io::Error),
    /// The PAR2 data is incomplete or inconsistent.
    Malformed(String),
    /// Input `.0` (an index into the inputs given to [`create`]) was shorter than said, or
    /// changed while its set was made.
    Changed(usize),
    /// More slices are damaged than there are recovery slices.
    TooMuchDamage {
        /// Damaged or missing input slices.
        damaged: usize,
        /// Recovery slices available.
        available: usize,
    },
}

impl std::error::Error for Error {}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Io(e) => write!(f, "{e}"),
            Error::Malformed(why) => write!(f, "unusable PAR2 data: {why}"),
            Error::Changed(_) => write!(f, "a file changed while its parity was made"),
            Error::TooMuchDamage { damaged, available } => write!(
                f,
                "{damaged} slices damaged, only {available} recovery slices: beyond repair"
            ),
        }
    }
}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        Error::Io(e)
    }
}

/// Slice size for `total` bytes in about `target` slices: a multiple of 4, at least 4, and
/// few enough slices for the constants (at most 32768).
pub fn slice_size_for(total: u64, target: u64) -> u64 {
    let target = target.clamp(1, gf::MAX_INPUT_SLICES as u64);
    let size = total.div_ceil(target).max(4);
    // Whole 128-byte blocks for the SIMD kernels, where that costs little padding.
    let size = if size >= 4096 {
        size.next_multiple_of(128)
    } else {
        size.next_multiple_of(4)
    };
    // Rounding can leave one slice too many at the cap.
    if total.div_ceil(size) > gf::MAX_INPUT_SLICES as u64 {
        size + 4
    } else {
        size
    }
}

/// Reads up to `buf.len()` bytes, fewer only at the end of the input.
fn read_full(r: &mut dyn Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// A set made by [`create`]: its index, and what it wrote to the volume.
pub struct Created {
    /// The set's ID.
    pub id: Id,
    /// `NAME.par2`: the description packets, no recovery data.
    pub index: Vec<u8>,
    /// How many recovery slices the volume holds.
    pub recovery_count: u32,
    /// The files, in set order.
    pub files: Vec<FileEntry>,
}

/// Somewhere to write a volume: recovery data is written in passes, each slice's packet
/// filled in piece by piece.
pub trait Volume: io::Write + io::Seek {}
impl<T: io::Write + io::Seek> Volume for T {}

/// Where [`create`] reads a set's files from.
pub trait Files {
    /// File `i` (an index into the inputs), to be read from its start.
    fn open(&mut self, i: usize) -> io::Result<Box<dyn Through + '_>>;
    /// Reads file `i` from `offset` into `buf`; how many bytes (0 at its end). Passes after
    /// the first read only a range of each slice.
    fn read_at(&mut self, i: usize, offset: u64, buf: &mut [u8]) -> io::Result<usize>;
}

/// A file being read from its start. A caller that hashes what it hands over (to prove it
/// is what it verified) does it with the first pass's MD5, on the same core: SHA-256 in one
/// pass with it ([`Through::sha256`]), another hash block by block ([`Through::along`]).
pub trait Through: Read {
    /// The SHA-256 to compute with the file's MD5, if one is wanted.
    fn sha256(&mut self) -> Option<&mut sha256::Sha256> {
        None
    }

    /// Takes the file's bytes as the first pass hashes them with MD5 (when it computes no
    /// SHA-256 for it): each once, in order, in pieces of at most a block.
    fn along(&mut self, piece: &[u8]) {
        let _ = piece;
    }
}

impl Through for &[u8] {}
impl Through for std::fs::File {}

/// Files held in memory, by index.
impl Files for Vec<Vec<u8>> {
    fn open(&mut self, i: usize) -> io::Result<Box<dyn Through + '_>> {
        Ok(Box::new(&self[i][..]))
    }

    fn read_at(&mut self, i: usize, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        let f = &self[i][(offset as usize).min(self[i].len())..];
        let n = buf.len().min(f.len());
        buf[..n].copy_from_slice(&f[..n]);
        Ok(n)
    }
}

/// How a set is to be made.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    /// Bytes per slice: a positive multiple of 4.
    pub slice_size: u64,
    /// Recovery slices to make.
    pub recovery_count: u32,
    /// Threads that share the arithmetic.
    pub threads: usize,
    /// About how much memory the recovery data being computed and the slices being read may
    /// hold. Where the recovery data is larger, it is computed in passes over ranges of the
    /// slices (strips): the first reads the files through, hashing them; each later one
    /// reads only its range of each slice, checked against a CRC32 the first pass took, and
    /// the volume is the same. The first pass holds two batches of whole slices whatever
    /// this says: up to [`FIRST_BATCH`] each, or one slice where slices are larger.
    pub memory: u64,
}

/// Makes a recovery set over `inputs`, reading the files from `files` (each opened once for
/// its first 16 KiB and once to be read through; read again in ranges if the recovery data
/// exceeds the plan's memory), and writes its volume (recovery slices, then the
/// descriptions, as par2cmdline does, so the volume alone will do) to `volume`. A file that
/// is shorter than its input says, or changes between passes, is [`Error::Changed`].
pub fn create(
    inputs: &[Input],
    files: &mut dyn Files,
    plan: &Plan,
    volume: &mut dyn Volume,
) -> Result<Created, Error> {
    let (slice_size, recovery_count) = (plan.slice_size, plan.recovery_count);
    if slice_size == 0 || !slice_size.is_multiple_of(4) {
        return Err(Error::Malformed(
            "slice size must be a positive multiple of 4".into(),
        ));
    }
    let total_slices: u64 = inputs.iter().map(|f| f.len.div_ceil(slice_size)).sum();
    if total_slices > gf::MAX_INPUT_SLICES as u64 {
        return Err(Error::Malformed(format!(
            "{total_slices} slices: at most 32768"
        )));
    }
    if recovery_count > 65535 {
        return Err(Error::Malformed("at most 65535 recovery slices".into()));
    }
    // File IDs need each file's first 16 KiB; the set's order is by file ID.
    let mut ids = Vec::with_capacity(inputs.len());
    let mut head = vec![0u8; 16 << 10];
    for (i, f) in inputs.iter().enumerate() {
        let n = read_full(
            &mut *files.open(i)?,
            &mut head[..f.len.min(16 << 10) as usize],
        )?;
        let md5_16k: Id = Md5::digest(&head[..n]);
        ids.push((packet::file_id(&md5_16k, f.len, &f.name), md5_16k, i));
    }
    // The set's order is by file ID read as a little-endian 128-bit number, as the
    // specification's integers are (and par2cmdline compares them).
    ids.sort_by_key(|(id, _, _)| u128::from_le_bytes(*id));
    ids.dedup_by(|a, b| a.0 == b.0);
    // The set ID is the main packet's MD5: known before any recovery data. Empty files have
    // no slices: they are described but listed apart from the recovery set (the
    // specification's non-recovery files; par2cmdline 0.8.1 mis-counts them as damaged when
    // they are in the recovery set).
    let (full, empty): (Vec<&Ordered>, Vec<&Ordered>) =
        ids.iter().partition(|(_, _, i)| inputs[*i].len > 0);
    let mut main = packet::main_body(slice_size, &full.iter().map(|e| e.0).collect::<Vec<_>>());
    for e in &empty {
        main.extend_from_slice(&e.0);
    }
    let set: Id = Md5::digest(&main);

    // Each recovery slice's packet: placed in the volume up front, its MD5 fed piece by piece.
    let packet_len = 64 + 4 + slice_size;
    let mut hashes: Vec<Md5> = (0..recovery_count)
        .map(|e| {
            let mut h = Md5::new();
            h.update(set);
            h.update(kind::RECOVERY);
            h.update(e.to_le_bytes());
            h
        })
        .collect();
    // A batch being read, one being multiplied and its native copy take three eighths of
    // the memory, the recovery strip the rest. The first pass reads whole slices, two
    // batches at a time: 16 a batch (their MD5s are computed 16 at once), or as many as
    // [`FIRST_BATCH`] holds (at least one) where slices are larger.
    let batch_bytes = (plan.memory / 8).max(1) as usize;
    let first_batch = (16 * slice_size as usize)
        .min(FIRST_BATCH.max(slice_size as usize))
        .max(batch_bytes);
    // The first pass holds whole slices, later ones only their strips: their strips are
    // wider (a set of 2,000 slices of 400 KiB at 10% in 12 passes instead of 27: each pass
    // costs a read call per slice and the constants of every product again).
    let width = |held: usize| {
        let budget = plan.memory.saturating_sub(held as u64).max(plan.memory / 4);
        match budget / (recovery_count.max(1) as u64) {
            w if w >= slice_size => slice_size,
            w => (w / 128 * 128).max(128).min(slice_size),
        }
    };
    let first_width = width((2 * first_batch).max(3 * batch_bytes)) as usize;
    let later_width = width(3 * batch_bytes) as usize;
    let size = slice_size as usize;
    let strips = std::iter::successors(Some(0..first_width), |s| {
        (s.end < size).then(|| s.end..(s.end + later_width).min(size))
    })
    .collect();
    let making = Making {
        inputs,
        ids: &ids,
        constants: gf::input_constants(total_slices as usize),
        size: slice_size as usize,
        recovery_count,
        threads: plan.threads,
        batch_bytes,
        first_batch,
        strips,
        spare: Mutex::new(Vec::new()),
        spare_native: Mutex::new(Vec::new()),
    };
    let mut entries: Vec<(FileEntry, std::ops::Range<usize>)> = Vec::with_capacity(ids.len());
    // Each slice's MD5 and CRC32, by global index: computed in the first pass, beside the
    // multiplication; and with several strips, the CRC32 of each slice's range in each.
    let mut checksums: Vec<(Id, u32)> = vec![([0; 16], 0); total_slices as usize];
    let mut pieces: Vec<u32> = vec![
        0;
        if making.strips.len() > 1 {
            checksums.len() * making.strips.len()
        } else {
            0
        }
    ];
    let mut rows = Vec::new();
    for (strip, range) in making.strips.iter().enumerate() {
        let mut recovery = making.pass(
            files,
            strip,
            (strip == 0).then_some((&mut entries, &mut checksums)),
            &mut pieces,
            std::mem::take(&mut rows),
        )?;
        for (e, data) in recovery.iter_mut().enumerate() {
            gf::from_native(data);
            hashes[e].update(&**data);
            volume.seek(io::SeekFrom::Start(
                e as u64 * packet_len + 68 + range.start as u64,
            ))?;
            volume.write_all(data)?;
        }
        // Later passes use the same buffers: freed and taken again, each pass's would be
        // fresh pages to the kernel (a set of 12 passes faulted in 0.7 GB). Not the first
        // pass's: whole slices, and its strip is narrower.
        if strip > 0 {
            rows = recovery;
        } else {
            lock(&making.spare).clear();
            lock(&making.spare_native).clear();
        }
    }
    // The headers, now that each packet's MD5 is known.
    for (e, h) in hashes.into_iter().enumerate() {
        let mut header = Vec::with_capacity(68);
        header.extend_from_slice(packet::MAGIC);
        header.extend_from_slice(&packet_len.to_le_bytes());
        header.extend_from_slice(&h.finalize());
        header.extend_from_slice(&set);
        header.extend_from_slice(kind::RECOVERY);
        header.extend_from_slice(&(e as u32).to_le_bytes());
        volume.seek(io::SeekFrom::Start(e as u64 * packet_len))?;
        volume.write_all(&header)?;
    }
    let entries: Vec<FileEntry> = entries
        .into_iter()
        .map(|(mut e, range)| {
            e.slices = checksums[range].to_vec();
            e
        })
        .collect();
    let mut critical = packet::encode(&set, kind::MAIN, &[&main]);
    for e in &entries {
        critical.extend(packet::encode(
            &set,
            kind::FILE_DESC,
            &[&e.id, &e.md5, &e.md5_16k, &e.len.to_le_bytes(), &e.name],
        ));
        if e.len == 0 {
            continue;
        }
        let mut ifsc = Vec::with_capacity(16 + 20 * e.slices.len());
        ifsc.extend_from_slice(&e.id);
        for (md5, crc) in &e.slices {
            ifsc.extend_from_slice(md5);
            ifsc.extend_from_slice(&crc.to_le_bytes());
        }
        critical.extend(packet::encode(&set, kind::IFSC, &[&ifsc]));
    }
    critical.extend(packet::encode(&set, kind::CREATOR, &[CREATOR.as_bytes()]));
    volume.seek(io::SeekFrom::Start(recovery_count as u64 * packet_len))?;
    volume.write_all(&critical)?;
    Ok(Created {
        id: set,
        index: critical,
        recovery_count,
        files: entries,
    })
}

/// Bytes of whole slices in a batch of the first pass, beyond which it has fewer than 16
/// (whose MD5s are computed at once, one a SIMD lane): with 2,000 slices, a file of 4 GiB
/// or more. Fewer lanes cost little: the batch's MD5s run beside the file's own, which is
/// slower still; and memory stays bounded up to files of 2,000 x 16 MiB.
pub const FIRST_BATCH: usize = 16 << 20;

/// Bytes of slices a repair's scan holds to compute their MD5s at once.
const SCAN_BATCH: usize = 8 << 20;

/// A file in set order: its ID, the MD5 of its first 16 KiB, its index among the inputs.
type Ordered = (Id, Id, usize);

/// What the first pass learns of the files: their entries with the range of their slices,
/// and every slice's MD5 and CRC32.
type Description<'a> = (
    &'a mut Vec<(FileEntry, std::ops::Range<usize>)>,
    &'a mut Vec<(Id, u32)>,
);

/// A set being made: what every pass needs.
struct Making<'a> {
    inputs: &'a [Input],
    ids: &'a [Ordered],
    constants: Vec<u16>,
    size: usize,
    recovery_count: u32,
    threads: usize,
    /// Bytes of slices' ranges read before they are handed to the arithmetic; of whole
    /// slices in the first pass.
    batch_bytes: usize,
    first_batch: usize,
    /// Passes, each over one range of every slice (a strip).
    strips: Vec<std::ops::Range<usize>>,
    /// Buffers of slices and of their native copies go back here once a batch is done: a
    /// fresh buffer per slice cost page faults and clearing in the kernel.
    spare: Mutex<Vec<gf::Buffer>>,
    spare_native: Mutex<Vec<gf::Buffer>>,
}

/// A batch's recovery slices back from the arithmetic, the index of its first slice, and
/// (first pass) its slices' checksums and the CRC32 of each one's strips.
type Done = (Vec<gf::Buffer>, usize, Vec<(Id, u32)>, Vec<u32>);

impl Making<'_> {
    /// One pass: every slice's bytes in the strip multiplied into the recovery slices,
    /// returned in the native layout. The first pass (`describe`) reads the files through,
    /// describes them (their entries and each slice's checksums) and takes each strip's
    /// CRC32 into `pieces`; later ones read their strip of each slice and check it against
    /// that. While one batch is multiplied on `threads` threads, the next is read.
    fn pass(
        &self,
        files: &mut dyn Files,
        strip: usize,
        mut describe: Option<Description<'_>>,
        pieces: &mut [u32],
        mut recovery: Vec<gf::Buffer>,
    ) -> Result<Vec<gf::Buffer>, Error> {
        let first = describe.is_some();
        let (size, strips, range) = (self.size, self.strips.len(), &self.strips[strip]);
        recovery.resize_with(self.recovery_count as usize, Default::default);
        for r in &mut recovery {
            r.resize(range.len());
            r.fill(0);
        }
        // The first pass holds whole slices (for their checksums), later ones their strip.
        let held = if first { size } else { range.len() };
        let batch = if first {
            self.first_batch
        } else {
            self.batch_bytes
        };
        let batch_slices = batch.div_ceil(held).max(1);
        let mut batch: Vec<(gf::Buffer, u16)> = Vec::with_capacity(batch_slices);
        let mut slice_index = 0;
        let (spare, spare_native) = (&self.spare, &self.spare_native);
        let work = Batching {
            cut: range.clone(),
            first,
            strips: &self.strips,
            threads: self.threads,
            spare,
            spare_native,
        };
        std::thread::scope(|s| -> Result<(), Error> {
            let mut running: Option<Running<'_>> = None;
            let finish = |running: &mut Option<Running<'_>>,
                          describe: &mut Option<Description<'_>>,
                          pieces: &mut [u32]| {
                running.take().map(|r| {
                    let (rec, at, sums, crcs) = match r {
                        Running::Thread(h) => h.join().expect("no panic"),
                        Running::Done(done) => done,
                    };
                    if let Some((_, checksums)) = describe {
                        checksums[at..at + sums.len()].copy_from_slice(&sums);
                        // Empty when there is one strip (and `pieces` too).
                        if !crcs.is_empty() {
                            pieces[at * strips..][..crcs.len()].copy_from_slice(&crcs);
                        }
                    }
                    rec
                })
            };
            let work = &work;
            // While a batch is worked on by another thread, the next is read; the last one
            // has nothing to overlap with, and is worked on here.
            let mut hand_over = |batch: Vec<(gf::Buffer, u16)>,
                                 at: usize,
                                 last: bool,
                                 running: &mut Option<_>,
                                 describe: &mut Option<_>,
                                 pieces: &mut [u32]| {
                let rec = finish(running, describe, pieces)
                    .unwrap_or_else(|| std::mem::take(&mut recovery));
                *running = Some(match last {
                    true => Running::Done(work.run(batch, rec, at)),
                    false => Running::Thread(s.spawn(move || work.run(batch, rec, at))),
                });
            };
            let mut batch_first = 0;
            for &(id, md5_16k, i) in self.ids {
                let f = &self.inputs[i];
                let changed = || Error::Changed(i);
                let first_slice = slice_index;
                let mut whole = Md5::new();
                let mut reading = match first {
                    true => Reading::Through(files.open(i)?),
                    false => Reading::At(&mut *files),
                };
                let mut offset = 0u64;
                while offset < f.len {
                    let mut buf = take_spare(spare);
                    buf.resize(held);
                    match &mut reading {
                        Reading::Through(reader) => {
                            let want = (f.len - offset).min(size as u64) as usize;
                            if read_full(&mut **reader, &mut buf[..want])? < want {
                                return Err(changed());
                            }
                            // The last slice of a file is padded with zeros.
                            buf[want..].fill(0);
                            match reader.sha256() {
                                Some(sha) => whole.update_with_sha256(&buf[..want], sha),
                                None => whole
                                    .update_along(&buf[..want], &mut |piece| reader.along(piece)),
                            }
                        }
                        Reading::At(files) => {
                            let at = offset + range.start as u64;
                            let want = f.len.saturating_sub(at).min(held as u64) as usize;
                            if read_full_at(&mut **files, i, at, &mut buf[..want])? < want {
                                return Err(changed());
                            }
                            buf[want..].fill(0);
                            if crc32fast::hash(&buf) != pieces[slice_index * strips + strip] {
                                return Err(changed());
                            }
                        }
                    }
                    batch.push((buf, self.constants[slice_index]));
                    slice_index += 1;
                    offset += size as u64;
                    if batch.len() == batch_slices {
                        hand_over(
                            std::mem::take(&mut batch),
                            batch_first,
                            false,
                            &mut running,
                            &mut describe,
                            pieces,
                        );
                        batch_first = slice_index;
                    }
                }
                if let Some((entries, _)) = describe.as_mut() {
                    entries.push((
                        FileEntry {
                            id,
                            md5: whole.finalize(),
                            md5_16k,
                            len: f.len,
                            name: f.name.clone(),
                            slices: Vec::new(),
                        },
                        first_slice..slice_index,
                    ));
                }
            }
            hand_over(
                std::mem::take(&mut batch),
                batch_first,
                true,
                &mut running,
                &mut describe,
                pieces,
            );
            recovery = finish(&mut running, &mut describe, pieces).unwrap_or_default();
            Ok(())
        })?;
        Ok(recovery)
    }
}

/// A batch being worked on: on a thread of its own, or (the last) done already.
enum Running<'s> {
    Thread(std::thread::ScopedJoinHandle<'s, Done>),
    Done(Done),
}

/// What a pass does to each batch of slices it has read.
struct Batching<'a> {
    /// The range of each whole slice that the first pass multiplies (later ones read only it).
    cut: std::ops::Range<usize>,
    /// The first pass: the slices are whole, and their checksums are taken too.
    first: bool,
    /// The range of every slice each pass computes.
    strips: &'a [std::ops::Range<usize>],
    threads: usize,
    /// Where the buffers go back to, for the next batches.
    spare: &'a Mutex<Vec<gf::Buffer>>,
    spare_native: &'a Mutex<Vec<gf::Buffer>>,
}

impl Batching<'_> {
    /// Multiplies the batch (whose first slice is number `at`) into the recovery strips
    /// `rec`; in the first pass, takes its slices' MD5s and CRC32s (and each strip's CRC32)
    /// beside, where the work is large enough to share.
    fn run(&self, mut batch: Vec<(gf::Buffer, u16)>, mut rec: Vec<gf::Buffer>, at: usize) -> Done {
        // The first pass's checksums need the plain bytes and the multiplication a native
        // copy of the strip: both at once. Later passes read just their strip, put in the
        // native layout where it is (a copy of every strip was 2% of the CPU).
        let native: Vec<(gf::Buffer, u16)> = if self.first {
            batch
                .iter()
                .map(|(b, c)| {
                    let mut n = take_spare(self.spare_native);
                    n.copy_from(&b[self.cut.clone()]);
                    gf::to_native(&mut n);
                    (n, *c)
                })
                .collect()
        } else {
            for (b, _) in &mut batch {
                gf::to_native(b);
            }
            std::mem::take(&mut batch)
        };
        let checksums = || {
            if !self.first {
                return (Vec::new(), Vec::new());
            }
            let slices: Vec<&[u8]> = batch.iter().map(|(b, _)| &b[..]).collect();
            let mut crcs = Vec::new();
            let sums = md5x::digest_many(&slices)
                .into_iter()
                .zip(&slices)
                .map(|(md5, b)| {
                    if self.strips.len() == 1 {
                        return (md5, crc32fast::hash(b));
                    }
                    let mut whole = crc32fast::Hasher::new();
                    for strip in self.strips {
                        let mut h = crc32fast::Hasher::new();
                        h.update(&b[strip.clone()]);
                        crcs.push(h.clone().finalize());
                        whole.combine(&h);
                    }
                    (md5, whole.finalize())
                })
                .collect::<Vec<(Id, u32)>>();
            (sums, crcs)
        };
        let (sums, crcs) = if shared(&rec, &native, self.threads) > 1 {
            std::thread::scope(|t| {
                let sums = t.spawn(checksums);
                accumulate(&mut rec, &native, self.threads);
                sums.join().expect("no panic")
            })
        } else {
            accumulate(&mut rec, &native, 1);
            checksums()
        };
        let natives = if self.first {
            self.spare_native
        } else {
            self.spare
        };
        lock(natives).extend(native.into_iter().map(|(n, _)| n));
        lock(self.spare).extend(batch.into_iter().map(|(b, _)| b));
        (rec, at, sums, crcs)
    }
}

/// Products (bytes of slice times recovery slices) below which a multiplication stays on
/// one thread: starting one costs about what 2 MB of products do (30 us), and sets of small
/// files are thousands of tiny multiplications.
const SHARED_WORK: usize = 64 << 20;

/// How many of `threads` a multiplication of `batch` into `out` is worth sharing among.
fn shared(out: &[gf::Buffer], batch: &[(gf::Buffer, u16)], threads: usize) -> usize {
    let work = out.len() * batch.iter().map(|(b, _)| b.len()).sum::<usize>();
    threads.min(work.div_ceil(SHARED_WORK)).max(1)
}

/// A buffer given back by a finished batch, or a new one.
fn take_spare(spare: &Mutex<Vec<gf::Buffer>>) -> gf::Buffer {
    lock(spare).pop().unwrap_or_default()
}

/// A lock whose holder never panics mid-update.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// How a pass reads a file: the first through, hashing it; later ones a strip of each slice.
enum Reading<'f> {
    Through(Box<dyn Through + 'f>),
    At(&'f mut dyn Files),
}

/// Reads file `i` from `offset` until `buf` is full or the file ends; how many bytes.
fn read_full_at(files: &mut dyn Files, i: usize, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match files.read_at(i, offset + n as u64, &mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Adds each slice of `batch` (with its constant) into every recovery slice, the recovery
/// slices shared out among `threads`.
fn accumulate(recovery: &mut [gf::Buffer], batch: &[(gf::Buffer, u16)], threads: usize) {
    let exponents: Vec<u64> = (0..recovery.len() as u64).collect();
    multiply_into(recovery, &exponents, batch, threads);
}

/// Bytes of each slice worked on at a time: a recovery slice's piece stays in the L1 cache
/// while every input slice of the batch is added into it, four at a time, and the batch's
/// pieces stay in L2 (a batch of 100 slices of 8 KiB pieces nearly fills 1 MiB). Measured
/// on Zen 4 with buffers on cache lines (`examples/gfspeed.rs`, a slow day): 16 KiB 58 GB/s,
/// 8 KiB 63, 4 KiB 68.
const CHUNK: usize = 4 << 10;

/// Rows of `out` a thread takes at a time: small enough that threads finish together though
/// one of them shares its core with the reader of the next batch (halves given out up front
/// left a core idle a fifth of the time), large enough that the batch's pieces read into L2
/// serve many rows.
const ROWS_AT_A_TIME: usize = 8;

/// `out[r] ^= sum over the batch of c^exponents[r] * slice`, the rows of `out` taken
/// [`ROWS_AT_A_TIME`] at a time by `threads` threads, cache-blocked by [`CHUNK`]. Rows and
/// slices are in the native layout ([`gf::to_native`]).
fn multiply_into(
    out: &mut [gf::Buffer],
    exponents: &[u64],
    batch: &[(gf::Buffer, u16)],
    threads: usize,
) {
    if batch.is_empty() || out.is_empty() {
        return;
    }
    let multiply = |rows: &mut [gf::Buffer], exps: &[u64]| {
        let coefs: Vec<Vec<gf::Multiplier>> = exps
            .iter()
            .map(|&e| {
                batch
                    .iter()
                    .map(|(_, c)| gf::Multiplier::new(gf::pow(*c, e)))
                    .collect()
            })
            .collect();
        let len = rows[0].len();
        let mut srcs: Vec<&[u8]> = Vec::with_capacity(batch.len());
        for start in (0..len).step_by(CHUNK) {
            let end = (start + CHUNK).min(len);
            srcs.clear();
            srcs.extend(batch.iter().map(|(slice, _)| &slice[start..end]));
            for (row, coefs) in rows.iter_mut().zip(&coefs) {
                gf::mul_add_native_many(&mut row[start..end], &srcs, coefs);
            }
        }
    };
    let threads = shared(out, batch, threads);
    let groups = Mutex::new(
        out.chunks_mut(ROWS_AT_A_TIME)
            .zip(exponents.chunks(ROWS_AT_A_TIME)),
    );
    let work = || {
        loop {
            // Taken in a statement of its own: the lock is let go before the work.
            let next = lock(&groups).next();
            let Some((rows, exps)) = next else { break };
            multiply(rows, exps);
        }
    };
    std::thread::scope(|s| {
        for _ in 1..threads {
            s.spawn(work);
        }
        work();
    });
}

impl Set {
    /// Assembles the set from the packets of one or more PAR2 files (their bytes). The set
    /// is the one whose main packet comes first; packets of other sets are ignored.
    pub fn load(files: &[&[u8]]) -> Result<Set, Error> {
        let found: Vec<(packet::Found, Option<Recovery>)> = files
            .iter()
            .flat_map(|b| {
                packet::parse(b).into_iter().map(|f| {
                    let data = match &f.packet {
                        Packet::Recovery { data, .. } => {
                            Some(Recovery::Bytes(b[data.clone()].to_vec()))
                        }
                        _ => None,
                    };
                    (f, data)
                })
            })
            .collect();
        Set::assemble(found, Vec::new())
    }

    /// Assembles the set from PAR2 files on disk, reading each once from end to end to check
    /// its packets; recovery slices stay in the files until a repair needs them.
    pub fn open(files: Vec<std::fs::File>) -> Result<Set, Error> {
        let mut found = Vec::new();
        for (i, file) in files.iter().enumerate() {
            scan(file, &mut |f, at| {
                found.push((f, at.map(|offset| Recovery::At(i, offset))));
            })?;
        }
        Set::assemble(found, files)
    }

    /// A recovery slice's data.
    fn recovery_data(&self, exponent: u32) -> io::Result<Vec<u8>> {
        match &self.recovery[&exponent] {
            Recovery::Bytes(b) => Ok(b.clone()),
            Recovery::At(file, offset) => {
                use std::os::unix::fs::FileExt;
                let mut buf = vec![0u8; self.slice_size as usize];
                self.sources[*file].read_exact_at(&mut buf, *offset)?;
                Ok(buf)
            }
        }
    }

    fn assemble(
        found: Vec<(packet::Found, Option<Recovery>)>,
        sources: Vec<std::fs::File>,
    ) -> Result<Set, Error> {
        let mut main = None;
        let mut descs: HashMap<Id, (Id, Id, u64, Vec<u8>)> = HashMap::new();
        let mut ifscs: HashMap<Id, Vec<(Id, u32)>> = HashMap::new();
        let mut recovery = BTreeMap::new();
        let id = found
            .iter()
            .find(|(f, _)| matches!(f.packet, Packet::Main { .. }))
            .map(|(f, _)| f.set)
            .ok_or_else(|| Error::Malformed("no main packet".into()))?;
        for (f, data) in found.into_iter().filter(|(f, _)| f.set == id) {
            match f.packet {
                Packet::Main {
                    slice_size, files, ..
                } => main = Some((slice_size, files)),
                Packet::FileDesc {
                    id,
                    md5,
                    md5_16k,
                    len,
                    name,
                } => {
                    descs.insert(id, (md5, md5_16k, len, name));
                }
                Packet::Ifsc { id, slices } => {
                    ifscs.insert(id, slices);
                }
                Packet::Recovery {
                    exponent,
                    data: range,
                } => {
                    if let Some(data) = data {
                        recovery
                            .entry(exponent)
                            .or_insert((data, range.len() as u64));
                    }
                }
                _ => {}
            }
        }
        let (slice_size, ids) = main.expect("a main packet was found");
        if ids.len() > gf::MAX_INPUT_SLICES {
            return Err(Error::Malformed("too many files".into()));
        }
        if slice_size > MAX_SLICE {
            return Err(Error::Malformed(format!("slices of {slice_size} bytes")));
        }
        let mut entries = Vec::with_capacity(ids.len());
        let mut total = 0u64;
        for fid in ids {
            let (md5, md5_16k, len, name) = descs
                .remove(&fid)
                .ok_or_else(|| Error::Malformed("a file description is missing".into()))?;
            let slices = ifscs
                .remove(&fid)
                .ok_or_else(|| Error::Malformed("a file's slice checksums are missing".into()))?;
            if packet::file_id(&md5_16k, len, &name) != fid {
                return Err(Error::Malformed(
                    "a file ID does not match its description".into(),
                ));
            }
            if slices.len() as u64 != len.div_ceil(slice_size) {
                return Err(Error::Malformed(
                    "slice checksums do not fit the file length".into(),
                ));
            }
            total += slices.len() as u64;
            if total > gf::MAX_INPUT_SLICES as u64 {
                return Err(Error::Malformed("more than 32768 input slices".into()));
            }
            entries.push(FileEntry {
                id: fid,
                md5,
                md5_16k,
                len,
                name,
                slices,
            });
        }
        // A slice far larger than every file is not one any program made (a tiny file may
        // have been given a generous slice size, up to a MiB).
        let largest = entries.iter().map(|e| e.len).max().unwrap_or(0);
        if slice_size > largest.next_multiple_of(4).max(1 << 20) {
            return Err(Error::Malformed("the slice size exceeds every file".into()));
        }
        let recovery = recovery
            .into_iter()
            .filter(|&(e, (_, len))| e < 65535 && len == slice_size)
            .map(|(e, (data, _))| (e, data))
            .collect();
        Ok(Set {
            id,
            slice_size,
            files: entries,
            recovery,
            sources,
        })
    }

    /// The global index of file `f`'s first slice.
    fn first_slice(&self, f: usize) -> usize {
        self.files[..f].iter().map(|e| e.slices.len()).sum()
    }

    /// Finds the damaged slices of every file (read through `open`; `None` for a file that
    /// is missing) and rebuilds them from the recovery slices. The result holds the original
    /// bytes of each rebuilt slice (zero-padded to the slice size), by global slice index.
    pub fn recover<'r>(
        &self,
        open: &mut dyn FnMut(usize) -> io::Result<Option<Box<dyn Read + 'r>>>,
        threads: usize,
    ) -> Result<Recovered, Error> {
        let size = self.slice_size as usize;
        let total: usize = self.files.iter().map(|f| f.slices.len()).sum();
        let constants = gf::input_constants(total);
        // First pass: which slices are damaged.
        let mut damaged = Vec::new();
        for (f, entry) in self.files.iter().enumerate() {
            let base = self.first_slice(f);
            match open(f)? {
                None => damaged.extend(base..base + entry.slices.len()),
                Some(mut r) => {
                    // Slices are read a few at a time, their MD5s computed at once (in SIMD
                    // lanes): up to 16, in at most SCAN_BATCH bytes.
                    let per = (SCAN_BATCH / size).clamp(1, 16);
                    let mut bufs = vec![vec![0u8; size]; per.min(entry.slices.len())];
                    for (at, expects) in entry.slices.chunks(per).enumerate() {
                        let first = at * per;
                        // Read whole, with the CRC32 that was expected.
                        let mut whole = Vec::with_capacity(expects.len());
                        for (j, expect) in expects.iter().enumerate() {
                            let k = (first + j) as u64;
                            // Only the slice's own bytes: a file longer than described is
                            // damaged past its end only, which costs no recovery slice.
                            let want = (entry.len - k * self.slice_size).min(self.slice_size);
                            let buf = &mut bufs[j];
                            let n = read_full(&mut *r, &mut buf[..want as usize])?;
                            buf[n..].fill(0);
                            whole.push(n as u64 >= want && crc32fast::hash(buf) == expect.1);
                        }
                        let checked: Vec<&[u8]> = (0..expects.len())
                            .filter(|&j| whole[j])
                            .map(|j| &bufs[j][..])
                            .collect();
                        let mut sums = md5x::digest_many(&checked).into_iter();
                        for (j, expect) in expects.iter().enumerate() {
                            if !(whole[j] && sums.next() == Some(expect.0)) {
                                damaged.push(base + first + j);
                            }
                        }
                    }
                }
            }
        }
        if damaged.is_empty() {
            return Ok(Recovered {
                slices: HashMap::new(),
            });
        }
        if damaged.len() > self.recovery.len() {
            return Err(Error::TooMuchDamage {
                damaged: damaged.len(),
                available: self.recovery.len(),
            });
        }
        // Memory for the solve: one buffer per damaged slice, twice.
        if (damaged.len() as u64).saturating_mul(2 * self.slice_size) > MAX_REPAIR_MEMORY {
            return Err(Error::Malformed(format!(
                "{} damaged slices of {} bytes: too much to rebuild in memory",
                damaged.len(),
                self.slice_size
            )));
        }
        // The first exponents at hand; PAR2's matrix is almost always invertible, and where
        // not, a later window of exponents is tried.
        let all: Vec<u32> = self.recovery.keys().copied().collect();
        let (exps, inverse) = (0..=all.len() - damaged.len())
            .find_map(|start| {
                let exps = all[start..start + damaged.len()].to_vec();
                let matrix: Vec<Vec<u16>> = exps
                    .iter()
                    .map(|&e| {
                        damaged
                            .iter()
                            .map(|&j| gf::pow(constants[j], e as u64))
                            .collect()
                    })
                    .collect();
                gf::invert(matrix).map(|inv| (exps, inv))
            })
            .ok_or_else(|| Error::Malformed("recovery slices are not independent".into()))?;
        // Second pass: each used recovery slice minus the contributions of the good slices.
        let mut rhs: Vec<gf::Buffer> = exps
            .iter()
            .map(|&e| {
                let mut b = gf::Buffer::default();
                b.copy_from(&self.recovery_data(e)?);
                Ok(b)
            })
            .collect::<io::Result<_>>()?;
        for r in &mut rhs {
            gf::to_native(r);
        }
        let is_damaged: std::collections::HashSet<usize> = damaged.iter().copied().collect();
        let batch_slices = (32usize << 20).div_ceil(size).max(1);
        let mut batch: Vec<(gf::Buffer, u16)> = Vec::new();
        for (f, entry) in self.files.iter().enumerate() {
            let base = self.first_slice(f);
            let Some(mut r) = open(f)? else { continue };
            for k in 0..entry.slices.len() {
                let mut buf = gf::Buffer::zeroed(size);
                let want = (entry.len - k as u64 * self.slice_size).min(self.slice_size);
                let n = read_full(&mut *r, &mut buf[..want as usize])?;
                buf[n..].fill(0);
                if !is_damaged.contains(&(base + k)) {
                    gf::to_native(&mut buf);
                    batch.push((buf, constants[base + k]));
                    if batch.len() == batch_slices {
                        subtract(&mut rhs, &exps, &batch, threads);
                        batch.clear();
                    }
                }
            }
        }
        subtract(&mut rhs, &exps, &batch, threads);
        // Solve: rhs[r] = sum_j c_{damaged j}^{exp r} * x_j.
        let mut slices = HashMap::new();
        for (j, &slice) in damaged.iter().enumerate() {
            let mut out = vec![0u8; size];
            for (r, data) in rhs.iter().enumerate() {
                gf::Multiplier::new(inverse[j][r]).mul_add_native(&mut out, data);
            }
            gf::from_native(&mut out);
            slices.insert(slice, out);
        }
        Ok(Recovered { slices })
    }

    /// Streams file `f` as it should be: its good slices read from `current` (if there is
    /// one), rebuilt ones from `recovered`, cut to the file's length.
    pub fn restore(
        &self,
        f: usize,
        recovered: &Recovered,
        mut current: Option<&mut dyn Read>,
        out: &mut dyn FnMut(&[u8]) -> io::Result<()>,
    ) -> Result<(), Error> {
        let entry = &self.files[f];
        let base = self.first_slice(f);
        let mut buf = vec![0u8; self.slice_size as usize];
        for k in 0..entry.slices.len() {
            let n = match current.as_mut() {
                Some(r) => read_full(&mut **r, &mut buf)?,
                None => 0,
            };
            let want = (entry.len - k as u64 * self.slice_size).min(self.slice_size) as usize;
            match recovered.slices.get(&(base + k)) {
                Some(slice) => out(&slice[..want])?,
                None if n >= want => out(&buf[..want])?,
                None => {
                    return Err(Error::Malformed(
                        "a slice changed between checking and restoring".into(),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Packets bigger than this are never held in memory: recovery packets are checked as they
/// stream by, and no description packet is this large.
const MAX_HELD_PACKET: u64 = 64 << 20;

/// Reads `file` from end to end and hands each intact packet to `each`, a recovery packet
/// with the offset of its data instead of the data.
fn scan(file: &std::fs::File, each: &mut dyn FnMut(packet::Found, Option<u64>)) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    let len = file.metadata()?.len();
    let mut buf = vec![0u8; 1 << 20];
    let mut pos = 0u64;
    while pos + 64 <= len {
        let n = (len - pos).min(buf.len() as u64) as usize;
        file.read_exact_at(&mut buf[..n], pos)?;
        let Some(i) = buf[..n].windows(8).position(|w| w == packet::MAGIC) else {
            // Keep the last bytes: a magic may straddle the chunks.
            pos += (n as u64).saturating_sub(7).max(1);
            continue;
        };
        let at = pos + i as u64;
        pos = at + 1;
        let mut header = [0u8; 64];
        if at + 64 > len || file.read_exact_at(&mut header, at).is_err() {
            continue;
        }
        let plen = u64::from_le_bytes(header[8..16].try_into().expect("8 bytes"));
        if plen < 64 || !plen.is_multiple_of(4) || plen > len - at {
            continue;
        }
        if &header[48..64] == kind::RECOVERY && plen >= 68 {
            // Checked by streaming its MD5, never held.
            let mut h = Md5::new();
            h.update(&header[32..]);
            let mut done = 64;
            while done < plen {
                let k = (plen - done).min(buf.len() as u64) as usize;
                file.read_exact_at(&mut buf[..k], at + done)?;
                h.update(&buf[..k]);
                done += k as u64;
            }
            if h.finalize()[..] != header[16..32] {
                continue;
            }
            let mut exponent = [0u8; 4];
            file.read_exact_at(&mut exponent, at + 64)?;
            let found = packet::Found {
                set: header[32..48].try_into().expect("16 bytes"),
                packet: Packet::Recovery {
                    exponent: u32::from_le_bytes(exponent),
                    data: 0..(plen - 68) as usize,
                },
            };
            each(found, Some(at + 68));
            pos = at + plen;
        } else if plen <= MAX_HELD_PACKET {
            let mut packet = vec![0u8; plen as usize];
            file.read_exact_at(&mut packet, at)?;
            if let [found] = &packet::parse(&packet)[..] {
                each(found.clone(), None);
                pos = at + plen;
            }
        }
    }
    Ok(())
}

/// Rebuilt slices, by global slice index.
#[derive(Debug)]
pub struct Recovered {
    /// The original bytes of each rebuilt slice, zero-padded.
    pub slices: HashMap<usize, Vec<u8>>,
}

/// Takes the good slices' share out of each recovery slice in use.
fn subtract(rhs: &mut [gf::Buffer], exps: &[u32], batch: &[(gf::Buffer, u16)], threads: usize) {
    let exponents: Vec<u64> = exps.iter().map(|&e| e as u64).collect();
    multiply_into(rhs, &exponents, batch, threads);
}

/// The file name par2cmdline gives a volume of `count` recovery slices starting at `first`.
pub fn volume_name(base: &str, first: u32, count: u32) -> String {
    let width = (first + count).to_string().len().max(2);
    format!("{base}.vol{first:0width$}+{count:0width$}.par2")
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::test_data as data;

    /// A set over `files`, and its volume, made in about `memory`.
    fn make_in(files: &[Vec<u8>], slice: u64, rec: u32, memory: u64) -> (Created, Vec<u8>) {
        let inputs: Vec<Input> = files
            .iter()
            .enumerate()
            .map(|(i, f)| Input {
                name: format!("f{i}").into_bytes(),
                len: f.len() as u64,
            })
            .collect();
        let mut volume = std::io::Cursor::new(Vec::new());
        let plan = Plan {
            slice_size: slice,
            recovery_count: rec,
            threads: 2,
            memory,
        };
        let created = create(&inputs, &mut files.to_vec(), &plan, &mut volume).unwrap();
        (created, volume.into_inner())
    }

    fn make(files: &[Vec<u8>], slice: u64, rec: u32) -> (Created, Vec<u8>) {
        make_in(files, slice, rec, 256 << 20)
    }

    #[test]
    fn passes_over_slice_ranges_make_the_same_volume() {
        let files = vec![data(100_000, 7), data(33_333, 8)];
        let (one, whole) = make(&files, 4096, 9);
        // 9 recovery slices in 1 KiB of memory: passes of 128 bytes over 4 KiB slices.
        let (many, passes) = make_in(&files, 4096, 9, 1024);
        assert_eq!(one.index, many.index);
        assert_eq!(whole, passes);
        assert_eq!(Set::load(&[&passes]).unwrap().recovery.len(), 9);
        // 261 slices of 512 bytes: many batches in one pass (64 KiB), and in each of four
        // passes of 128 bytes (8 KiB).
        let (_, whole) = make(&files, 512, 9);
        for memory in [64 << 10, 8 << 10] {
            assert_eq!(make_in(&files, 512, 9, memory).1, whole, "{memory}");
        }
    }

    /// Slices so large that 16 would exceed [`FIRST_BATCH`] are read fewer at a time (their
    /// MD5s in fewer lanes): the set is the one read 16 at a time.
    #[test]
    fn large_slices_read_fewer_at_a_time_make_the_same_set() {
        let slice = (FIRST_BATCH / 8) as u64;
        let files = vec![
            data(9 * slice as usize + 1234, 9),
            data(8 * slice as usize, 10),
        ];
        // Enough memory for batches of 18 slices, and little: 8 slices a batch, in strips.
        let (all, whole) = make_in(&files, slice, 3, 1 << 30);
        let (few, batches) = make_in(&files, slice, 3, 4 << 20);
        assert_eq!(all.index, few.index);
        assert_eq!(whole, batches);
        assert_eq!(Set::load(&[&batches]).unwrap().recovery.len(), 3);
    }

    #[test]
    fn a_file_that_changes_between_passes_is_refused() {
        /// Reads file 1 with one byte flipped after its first pass.
        struct Flipping(Vec<Vec<u8>>);
        impl Files for Flipping {
            fn open(&mut self, i: usize) -> io::Result<Box<dyn Through + '_>> {
                self.0.open(i)
            }
            fn read_at(&mut self, i: usize, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
                let n = self.0.read_at(i, offset, buf)?;
                if i == 1 && offset <= 5000 && 5000 < offset + n as u64 {
                    buf[(5000 - offset) as usize] ^= 4;
                }
                Ok(n)
            }
        }
        let files = vec![data(10_000, 3), data(10_000, 4)];
        let inputs: Vec<Input> = (0..2)
            .map(|i| Input {
                name: format!("f{i}").into_bytes(),
                len: 10_000,
            })
            .collect();
        let plan = |memory| Plan {
            slice_size: 4096,
            recovery_count: 4,
            threads: 2,
            memory,
        };
        let mut volume = std::io::Cursor::new(Vec::new());
        let mut flipping = Flipping(files);
        // One pass reads the files through once: what it read is what the set describes.
        assert!(create(&inputs, &mut flipping, &plan(1 << 20), &mut volume).is_ok());
        // In passes of 128 bytes, the byte read differently in a later pass is caught.
        match create(&inputs, &mut flipping, &plan(1024), &mut volume) {
            Err(Error::Changed(1)) => {}
            other => panic!("{:?}", other.map(|c| c.recovery_count)),
        }
    }

    #[test]
    fn damage_within_capacity_is_repaired_beyond_it_refused() {
        let files = vec![data(10_000, 1), data(3_001, 2), Vec::new()];
        let (created, volume) = make(&files, 512, 5);
        let set = Set::load(&[&created.index, &volume]).unwrap();
        assert_eq!(set.recovery.len(), 5);
        // Find which set position each input file took (the set is ordered by file ID).
        let pos = |name: &[u8]| set.files.iter().position(|f| f.name == name).unwrap();
        // Two slices of file 0 flipped; file 1 cut inside its fourth slice of six: five slices.
        let mut damaged = files.clone();
        damaged[0][100] ^= 1;
        damaged[0][5000] ^= 0xff;
        damaged[1].truncate(2000);
        let by_name = |i: usize| -> usize {
            (0..files.len())
                .find(|&k| pos(format!("f{k}").as_bytes()) == i)
                .unwrap()
        };
        let rec = set
            .recover(&mut |i| Ok(Some(Box::new(&damaged[by_name(i)][..]))), 2)
            .unwrap();
        assert_eq!(rec.slices.len(), 5);
        for k in 0..2 {
            let mut out = Vec::new();
            let f = pos(format!("f{k}").as_bytes());
            let mut cur: &[u8] = &damaged[k];
            set.restore(f, &rec, Some(&mut cur), &mut |b| {
                out.extend_from_slice(b);
                Ok(())
            })
            .unwrap();
            assert_eq!(out, files[k], "file {k}");
        }
        damaged[0][9000] ^= 1;
        let err = set
            .recover(&mut |i| Ok(Some(Box::new(&damaged[by_name(i)][..]))), 1)
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::TooMuchDamage {
                    damaged: 6,
                    available: 5
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn sets_opened_from_files_keep_recovery_on_disk_and_skip_damage() {
        let files = vec![data(50_000, 5)];
        let (created, mut volume) = make(&files, 1024, 6);
        // Damage the second recovery packet's data: it fails its MD5 and is left out.
        volume[(68 + 1024) + 68 + 10] ^= 1;
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("s.par2"), &created.index).unwrap();
        std::fs::write(dir.path().join("s.vol"), &volume).unwrap();
        let open = |n: &str| std::fs::File::open(dir.path().join(n)).unwrap();
        let set = Set::open(vec![open("s.par2"), open("s.vol")]).unwrap();
        assert_eq!(
            set.recovery.keys().copied().collect::<Vec<_>>(),
            vec![0, 2, 3, 4, 5]
        );
        assert!(
            set.recovery
                .values()
                .all(|r| matches!(r, Recovery::At(1, _)))
        );
        let mut damaged = files[0].clone();
        for at in [0, 20_000, 40_000] {
            damaged[at] ^= 0xff;
        }
        let rec = set
            .recover(&mut |_| Ok(Some(Box::new(&damaged[..]))), 1)
            .unwrap();
        let mut out = Vec::new();
        let mut cur: &[u8] = &damaged;
        set.restore(0, &rec, Some(&mut cur), &mut |b| {
            out.extend_from_slice(b);
            Ok(())
        })
        .unwrap();
        assert_eq!(out, files[0]);
    }

    #[test]
    fn a_missing_file_is_rebuilt_whole() {
        let files = vec![data(2048, 3)];
        let (_, volume) = make(&files, 256, 8);
        let set = Set::load(&[&volume]).unwrap();
        let rec = set.recover(&mut |_| Ok(None), 1).unwrap();
        let mut out = Vec::new();
        set.restore(0, &rec, None, &mut |b| {
            out.extend_from_slice(b);
            Ok(())
        })
        .unwrap();
        assert_eq!(out, files[0]);
    }

    #[test]
    fn a_hostile_slice_size_is_refused_before_any_allocation() {
        // One byte of file in a slice of 2^62 bytes: consistent, and a 4 EiB allocation.
        let md5_16k: Id = Md5::digest(b"x");
        let id = packet::file_id(&md5_16k, 1, b"f");
        let main = packet::main_body(1 << 62, &[id]);
        let main_id: Id = Md5::digest(&main);
        let mut bytes = packet::encode(&main_id, kind::MAIN, &[&main]);
        bytes.extend(packet::encode(
            &main_id,
            kind::FILE_DESC,
            &[&id, &md5_16k, &md5_16k, &1u64.to_le_bytes(), b"f"],
        ));
        bytes.extend(packet::encode(&main_id, kind::IFSC, &[&id, &[0u8; 20]]));
        let err = Set::load(&[&bytes]).unwrap_err();
        assert!(matches!(err, Error::Malformed(_)), "{err}");
    }

    #[test]
    fn slice_sizes_are_multiples_of_4_within_the_slice_limit() {
        for (total, target) in [
            (0u64, 100u64),
            (1, 1),
            (10_000, 3),
            (u32::MAX as u64, 40_000),
        ] {
            let s = slice_size_for(total, target);
            assert!(s >= 4 && s.is_multiple_of(4), "{total} {target}: {s}");
            assert!(total.div_ceil(s) <= 32768, "{total} {target}: {s}");
        }
        assert_eq!(volume_name("x", 0, 5), "x.vol00+05.par2");
        assert_eq!(volume_name("x", 0, 150), "x.vol000+150.par2");
    }
}
