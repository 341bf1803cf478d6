//! Making a recovery set: one pass reads every file through, hashing it (MD5 of every slice
//! and of the file, CRC32s), and multiplies its slices into the recovery slices; where those
//! exceed the memory given, that pass only hashes, on a thread of its own, while passes over
//! strips of each slice compute the recovery data beside it.

use std::io;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::md5x::{self, Md5};
use crate::mul::{accumulate, shared};
use crate::packet::{self, Id, kind};
use crate::{CREATOR, Error, FileEntry, Files, Input, Through, Volume, gf, lock, read_full};

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
    /// slices (strips), each reading only its range of each slice (checked against a CRC32
    /// the read through took), and the volume is the same. The pass that reads the files
    /// through holds two batches of whole slices whatever this says (beside the strips):
    /// up to [`FIRST_BATCH`] each, or one slice where slices are larger.
    pub memory: u64,
}

/// Makes a recovery set over `inputs`, reading the files from `files` (each opened once for
/// its first 16 KiB and once to be read through; read again in ranges if the recovery data
/// exceeds the plan's memory), and writes its volume (recovery slices, then the
/// descriptions, as par2cmdline does, so the volume alone will do) to `volume`. A file that
/// is shorter than its input says, or changes between passes, is [`Error::Changed`].
pub fn create(
    inputs: &[Input],
    files: &dyn Files,
    plan: &Plan,
    volume: &mut dyn Volume,
) -> Result<Created, Error> {
    let (slice_size, recovery_count) = (plan.slice_size, plan.recovery_count);
    let total_slices = plan.check(inputs)?;
    let ids = order(inputs, files)?;
    let main = main_body(inputs, &ids, slice_size);
    // The set ID is the main packet's MD5: known before any recovery data.
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
    let making = Making::new(inputs, &ids, plan, total_slices);
    let mut entries: Vec<(FileEntry, std::ops::Range<usize>)> = Vec::with_capacity(ids.len());
    // Each slice's MD5 and CRC32, by global index, taken as the files are read through; and
    // with several strips, the CRC32 of each slice's range in each, as read through and as
    // read for the recovery data.
    let mut checksums: Vec<(Id, u32)> = vec![([0; 16], 0); total_slices as usize];
    let strips = making.strips.len();
    let ranges = if strips > 1 {
        checksums.len() * strips
    } else {
        0
    };
    let (mut pieces, mut seen) = (vec![0u32; ranges], vec![0u32; ranges]);
    // A strip's recovery data into the packets' MD5s (strip by strip, in order) and the volume.
    let mut write = |strip: usize, mut recovery: Vec<gf::Buffer>| -> io::Result<_> {
        let range = &making.strips[strip];
        for data in recovery.iter_mut() {
            gf::from_native(data);
        }
        let strips: Vec<&[u8]> = recovery.iter().map(|d| &d[..range.len()]).collect();
        md5x::update_many(&mut hashes, &strips);
        for (e, data) in strips.iter().enumerate() {
            volume.seek(io::SeekFrom::Start(
                e as u64 * packet_len + 68 + range.start as u64,
            ))?;
            volume.write_all(data)?;
        }
        Ok(recovery)
    };
    let stop = AtomicBool::new(false);
    if strips == 1 {
        let described = Some((&mut entries, &mut checksums));
        let recovery = making.pass(files, Some(0), described, &mut pieces, Vec::new(), &stop)?;
        write(0, recovery.expect("nothing stops a lone pass"))?;
    } else {
        // The files are read through and hashed (MD5, and SHA-256 where asked: one serial
        // chain a file) while the recovery data is computed strip by strip, each strip's
        // range of every slice read again: one 800 MiB file's set had a core idle while its
        // hash ran beside only the first strip's products (a twenty-fifth of them). What
        // each range held then is checked against what the read through found, at the end.
        let mut hash = || {
            let described = Some((&mut entries, &mut checksums));
            DESCRIBING.fetch_add(1, Ordering::Relaxed);
            let done = making.pass(files, None, described, &mut pieces, Vec::new(), &stop);
            DESCRIBING.fetch_sub(1, Ordering::Relaxed);
            lock(&making.spare_whole).clear();
            if !matches!(done, Ok(Some(_))) {
                stop.store(true, Ordering::Relaxed);
            }
            done.map(|d| d.is_some())
        };
        let mut compute = || {
            let mut rows = Vec::new();
            for strip in 0..strips {
                // Each pass takes the buffers of the one before: fresh ones would be fresh
                // pages to the kernel (a set of 12 passes faulted in 0.7 GB).
                match making.pass(files, Some(strip), None, &mut seen, rows, &stop) {
                    Ok(Some(recovery)) => rows = write(strip, recovery)?,
                    Ok(None) => return Ok(false),
                    Err(e) => {
                        stop.store(true, Ordering::Relaxed);
                        return Err(e);
                    }
                }
            }
            Ok(true)
        };
        // One thread asked for: one after the other.
        let (hashed, computed) = match making.threads {
            1 => (hash(), compute()),
            _ => std::thread::scope(|s| {
                let hashing = s.spawn(hash);
                let computed = compute();
                (hashing.join().expect("no panic"), computed)
            }),
        };
        // The first failure is the one told: neither stops unless the other failed.
        let (true, true) = (hashed?, computed?) else {
            unreachable!("a pass stopped though none failed")
        };
        if let Some(slice) = (0..pieces.len()).find(|&k| pieces[k] != seen[k]) {
            let slice = slice / strips;
            let file = entries.iter().position(|(_, r)| r.contains(&slice));
            return Err(Error::Changed(
                ids[file.expect("every slice has its file")].2,
            ));
        }
    }
    // The headers, now that each packet's MD5 is known.
    for (e, h) in hashes.into_iter().enumerate() {
        let header = recovery_header(&set, e as u32, packet_len, h.finalize());
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
    let critical = critical(&set, &main, &entries);
    volume.seek(io::SeekFrom::Start(recovery_count as u64 * packet_len))?;
    volume.write_all(&critical)?;
    Ok(Created {
        id: set,
        index: critical,
        recovery_count,
        files: entries,
    })
}

impl Plan {
    /// Whether a set can be made over `inputs` this way; how many input slices it has.
    fn check(&self, inputs: &[Input]) -> Result<u64, Error> {
        let slice_size = self.slice_size;
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
        if self.recovery_count > 65535 {
            return Err(Error::Malformed("at most 65535 recovery slices".into()));
        }
        Ok(total_slices)
    }
}

/// The files in set order: by file ID (which needs each file's first 16 KiB) read as a
/// little-endian 128-bit number, as the specification's integers are (and par2cmdline
/// compares them).
fn order(inputs: &[Input], files: &dyn Files) -> Result<Vec<Ordered>, Error> {
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
    ids.sort_by_key(|(id, _, _)| u128::from_le_bytes(*id));
    ids.dedup_by(|a, b| a.0 == b.0);
    Ok(ids)
}

/// The main packet's body. Empty files have no slices: they are described but listed apart
/// from the recovery set (the specification's non-recovery files; par2cmdline 0.8.1
/// mis-counts them as damaged when they are in the recovery set).
fn main_body(inputs: &[Input], ids: &[Ordered], slice_size: u64) -> Vec<u8> {
    let (full, empty): (Vec<&Ordered>, Vec<&Ordered>) =
        ids.iter().partition(|(_, _, i)| inputs[*i].len > 0);
    let mut main = packet::main_body(slice_size, &full.iter().map(|e| e.0).collect::<Vec<_>>());
    for e in &empty {
        main.extend_from_slice(&e.0);
    }
    main
}

/// The header of recovery packet `e` of `set`, `len` bytes long with the MD5 `md5`.
fn recovery_header(set: &Id, e: u32, len: u64, md5: Id) -> Vec<u8> {
    let mut header = Vec::with_capacity(68);
    header.extend_from_slice(packet::MAGIC);
    header.extend_from_slice(&len.to_le_bytes());
    header.extend_from_slice(&md5);
    header.extend_from_slice(set);
    header.extend_from_slice(kind::RECOVERY);
    header.extend_from_slice(&e.to_le_bytes());
    header
}

/// The packets that describe the set (main, each file's description and slice checksums,
/// creator), which every volume carries after its recovery slices.
fn critical(set: &Id, main: &[u8], entries: &[FileEntry]) -> Vec<u8> {
    let mut critical = packet::encode(set, kind::MAIN, &[main]);
    for e in entries {
        critical.extend(packet::encode(
            set,
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
        critical.extend(packet::encode(set, kind::IFSC, &[&ifsc]));
    }
    critical.extend(packet::encode(set, kind::CREATOR, &[CREATOR.as_bytes()]));
    critical
}

/// Bytes of whole slices in a batch of the first pass, beyond which it has fewer than 16
/// (whose MD5s are computed at once, one a SIMD lane): with 2,000 slices, a file of 4 GiB
/// or more. Fewer lanes cost little: the batch's MD5s run beside the file's own, which is
/// slower still. Slices larger than this (a file of more than 2,000 x 16 MiB) are not held
/// whole: their MD5s and CRC32s are taken on a thread of their own as they stream by, so
/// memory stays bounded for any size (a 32 GiB file: 28 MiB in 97.7 s, against 49 MiB in
/// 89.4 s holding whole slices, which grows with the file).
pub const FIRST_BATCH: usize = 16 << 20;

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
    /// Slices too large to hold whole ([`FIRST_BATCH`]): the first pass keeps only its strip
    /// of each and checksums the rest as it reads.
    streamed: bool,
    /// Passes, each over one range of every slice (a strip).
    strips: Vec<std::ops::Range<usize>>,
    /// Buffers of slices and of their native copies go back here once a batch is done: a
    /// fresh buffer per slice cost page faults and clearing in the kernel.
    spare: Mutex<Vec<gf::Buffer>>,
    spare_native: Mutex<Vec<gf::Buffer>>,
    /// Whole slices, of a first pass that only describes the files.
    spare_whole: Mutex<Vec<gf::Buffer>>,
}

/// A batch's recovery slices back from the arithmetic, the index of its first slice, and
/// (first pass) its slices' checksums and the CRC32 of each one's strips.
type Done = (Vec<gf::Buffer>, usize, Vec<(Id, u32)>, Vec<u32>);

impl<'a> Making<'a> {
    /// How a set over `inputs` in the order `ids` is made in the plan's memory: a batch being
    /// read and two handed to the worker (one multiplied, with its native copy) take an
    /// eighth of it, the recovery strip the rest. The first pass reads whole slices: 16 a
    /// batch (their MD5s are computed 16 at once), or as many as [`FIRST_BATCH`] holds (at
    /// least one) where slices are larger; its strip is reckoned beside two such batches,
    /// though a third may wait for the worker (4.4 MB more RSS on five 800 MiB files; the
    /// test `parity::a_file_of_32_gib_is_protected_within_64_mib` holds a run to its bound).
    fn new(inputs: &'a [Input], ids: &'a [Ordered], plan: &Plan, total_slices: u64) -> Self {
        let (slice_size, recovery_count) = (plan.slice_size, plan.recovery_count);
        // A batch's strips are read once for every eight recovery slices: kept small enough
        // to stay in a core's L2 beside them (2 MiB on the Xeon) while another thread runs
        // there too. Batches of 1.5 MiB in a set's 12 MiB cost five large sets 8.5% more
        // CPU than batches of 512 KiB.
        let batch_bytes = (plan.memory / 24).max(1) as usize;
        let first_batch = (16 * slice_size as usize)
            .min(FIRST_BATCH.max(slice_size as usize))
            .max(batch_bytes);
        // The first pass holds whole slices, later ones only their strips: their strips are
        // wider (a set of 2,000 slices of 400 KiB at 10% in 12 passes instead of 27: each
        // pass costs a read call per slice and the constants of every product again).
        let width = |held: usize| {
            let budget = plan.memory.saturating_sub(held as u64).max(plan.memory / 4);
            match budget / (recovery_count.max(1) as u64) {
                w if w >= slice_size => slice_size,
                w => (w / 128 * 128).max(128).min(slice_size),
            }
        };
        let streamed = slice_size as usize > FIRST_BATCH;
        let size = slice_size as usize;
        // One pass if the recovery data fits beside what the first pass holds; else strips
        // computed beside a pass that reads the files through (and holds its slices).
        let whole = match streamed {
            true => width(3 * batch_bytes),
            false => width((2 * first_batch).max(3 * batch_bytes)),
        } as usize;
        let strip = match whole == size {
            true => size,
            false => width(3 * batch_bytes) as usize,
        };
        let strips = (0..size)
            .step_by(strip)
            .map(|s| s..(s + strip).min(size))
            .collect();
        Making {
            inputs,
            ids,
            constants: gf::input_constants(total_slices as usize),
            size,
            recovery_count,
            threads: plan.threads,
            batch_bytes,
            first_batch,
            streamed,
            strips,
            spare: Mutex::new(Vec::new()),
            spare_native: Mutex::new(Vec::new()),
            spare_whole: Mutex::new(Vec::new()),
        }
    }

    /// One pass: every slice's bytes in the strip (if any) multiplied into the recovery
    /// slices, returned in the native layout. A pass that describes the files (`describe`)
    /// reads them through, and takes their entries, each slice's checksums and each strip's
    /// CRC32 (into `pieces`); the others read their strip of each slice, and its CRC32 into
    /// `pieces`. While one batch is multiplied on `threads` threads, the next is read.
    /// `None` if `stop` was set meanwhile.
    fn pass(
        &self,
        files: &dyn Files,
        strip: Option<usize>,
        mut describe: Option<Description<'_>>,
        pieces: &mut [u32],
        mut recovery: Vec<gf::Buffer>,
        stop: &AtomicBool,
    ) -> Result<Option<Vec<gf::Buffer>>, Error> {
        let first = describe.is_some();
        let (size, strips) = (self.size, self.strips.len());
        let range = strip.map_or(0..0, |s| self.strips[s].clone());
        let rows = strip.map_or(0, |_| self.recovery_count as usize);
        recovery.resize_with(rows, Default::default);
        // Strips and slices are multiplied padded with zeros to whole blocks.
        let padded = range.len().next_multiple_of(gf::BLOCK);
        for r in &mut recovery {
            r.resize(padded);
            r.fill(0);
        }
        // The pass that reads the files through holds whole slices (for their checksums)
        // unless they are too large, the others their strip.
        let whole_slices = first && !self.streamed;
        let held = if whole_slices { size } else { padded };
        let batch = if whole_slices {
            self.first_batch
        } else {
            self.batch_bytes
        };
        // Nothing held (a streamed pass that only describes): a slice a batch.
        let batch_slices = match held {
            0 => 1,
            held => batch.div_ceil(held).max(1),
        };
        let mut batch: Vec<(gf::Buffer, u16)> = Vec::with_capacity(batch_slices);
        let mut slice_index = 0;
        // A pass that only describes holds whole slices while others hold strips: apart.
        let spare = match strip {
            Some(_) => &self.spare,
            None => &self.spare_whole,
        };
        let spare_native = &self.spare_native;
        let work = Batching {
            cut: range.clone(),
            first: whole_slices,
            strips: &self.strips,
            threads: self.threads,
            spare,
            spare_native,
        };
        let done = std::thread::scope(|s| -> Result<bool, Error> {
            // The batches are multiplied on a worker (started with the first batch that is
            // not the last: a set of one batch needs none) while the next are read.
            let mut worker: Option<Worker<'_>> = None;
            let work = &work;
            let mut batch_first = 0;
            for &(id, md5_16k, i) in self.ids {
                let f = &self.inputs[i];
                let changed = || Error::Changed(i);
                let first_slice = slice_index;
                let mut whole = Md5::new();
                let mut reading = match first {
                    true => Reading::Through(files.open(i)?),
                    false => Reading::At(files),
                };
                let mut offset = 0u64;
                while offset < f.len {
                    if stop.load(Ordering::Relaxed) {
                        return Ok(false);
                    }
                    let mut buf = take_spare(spare);
                    buf.resize(held);
                    match &mut reading {
                        Reading::Through(reader) if self.streamed => {
                            let want = (f.len - offset).min(size as u64) as usize;
                            let Some((checksum, crcs)) = stream_slice(
                                &mut **reader,
                                &mut whole,
                                &mut buf[..range.len()],
                                want,
                                &self.strips,
                            )?
                            else {
                                return Err(changed());
                            };
                            buf[range.len()..].fill(0);
                            if let Some((_, checksums)) = describe.as_mut() {
                                checksums[slice_index] = checksum;
                            }
                            // Empty when there is one strip (and `pieces` too).
                            if strips > 1 {
                                pieces[slice_index * strips..][..strips].copy_from_slice(&crcs);
                            }
                        }
                        Reading::Through(reader) => {
                            let want = (f.len - offset).min(size as u64) as usize;
                            if read_full(&mut **reader, &mut buf[..want])? < want {
                                return Err(changed());
                            }
                            // The last slice of a file is padded with zeros.
                            buf[want..].fill(0);
                            hash_through(&mut whole, &mut **reader, &buf[..want]);
                        }
                        Reading::At(files) => {
                            let at = offset + range.start as u64;
                            let want = f.len.saturating_sub(at).min(range.len() as u64) as usize;
                            if read_full_at(*files, i, at, &mut buf[..want])? < want {
                                return Err(changed());
                            }
                            buf[want..].fill(0);
                            pieces[slice_index * strips + strip.unwrap_or(0)] =
                                crc32fast::hash(&buf[..range.len()]);
                        }
                    }
                    batch.push((buf, self.constants[slice_index]));
                    slice_index += 1;
                    offset += size as u64;
                    if batch.len() == batch_slices {
                        let worker = worker.get_or_insert_with(|| {
                            Worker::start(s, work, std::mem::take(&mut recovery))
                        });
                        if let Some(sums) = worker.hand(std::mem::take(&mut batch), batch_first) {
                            described(&mut describe, pieces, strips, sums);
                        }
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
            let last = std::mem::take(&mut batch);
            recovery = match worker.take() {
                None => {
                    let (rec, at, sums, crcs) =
                        work.run(last, std::mem::take(&mut recovery), batch_first);
                    described(&mut describe, pieces, strips, (at, sums, crcs));
                    rec
                }
                Some(mut worker) => {
                    if let Some(sums) = worker.hand(last, batch_first) {
                        described(&mut describe, pieces, strips, sums);
                    }
                    let (rec, rest) = worker.finish();
                    for sums in rest {
                        described(&mut describe, pieces, strips, sums);
                    }
                    rec
                }
            };
            Ok(true)
        })?;
        Ok(done.then_some(recovery))
    }
}

/// Passes that only describe files, running in this process (in any set): each takes a
/// core, which the products of every set leave to it.
static DESCRIBING: AtomicUsize = AtomicUsize::new(0);

/// A batch's checksums (first pass): its first slice's number, each slice's MD5 and CRC32,
/// and each strip's CRC32.
type Sums = (usize, Vec<(Id, u32)>, Vec<u32>);

/// Takes a batch's checksums into the set's description, if the pass makes it.
fn described(
    describe: &mut Option<Description<'_>>,
    pieces: &mut [u32],
    strips: usize,
    (at, sums, crcs): Sums,
) {
    if let Some((_, checksums)) = describe {
        checksums[at..at + sums.len()].copy_from_slice(&sums);
        // Empty when there is one strip (and `pieces` too).
        if !crcs.is_empty() {
            pieces[at * strips..][..crcs.len()].copy_from_slice(&crcs);
        }
    }
}

/// The thread that multiplies a pass's batches into the recovery data, which it holds till
/// the pass ends. It is handed up to two batches (one worked on, one waiting), so that it
/// goes on to the next without waiting for the reading thread: a thread started for each
/// batch (1,600 a set of 2,000 slices of 400 KiB) cost its start, its stack's mapping and
/// the wake-ups between, a core often idle meanwhile.
struct Worker<'s> {
    batches: std::sync::mpsc::SyncSender<(Vec<(gf::Buffer, u16)>, usize)>,
    sums: std::sync::mpsc::Receiver<Sums>,
    thread: std::thread::ScopedJoinHandle<'s, Vec<gf::Buffer>>,
    /// Batches handed over whose checksums have not come back.
    out: usize,
}

impl<'s> Worker<'s> {
    fn start<'e: 's>(
        s: &'s std::thread::Scope<'s, 'e>,
        work: &'s Batching<'_>,
        mut rec: Vec<gf::Buffer>,
    ) -> Self {
        let (batches, to_do) = std::sync::mpsc::sync_channel::<(Vec<(gf::Buffer, u16)>, usize)>(1);
        let (done, sums) = std::sync::mpsc::channel();
        let thread = s.spawn(move || {
            for (batch, at) in to_do {
                let (back, at, sums, crcs) = work.run(batch, rec, at);
                rec = back;
                if done.send((at, sums, crcs)).is_err() {
                    break;
                }
            }
            rec
        });
        Worker {
            batches,
            sums,
            thread,
            out: 0,
        }
    }

    /// Hands over `batch` (whose first slice is number `at`), once at most one other is
    /// out; the checksums of the one waited for, if it was.
    fn hand(&mut self, batch: Vec<(gf::Buffer, u16)>, at: usize) -> Option<Sums> {
        let back = (self.out == 2).then(|| {
            self.out -= 1;
            self.sums.recv().expect("no panic")
        });
        self.batches
            .send((batch, at))
            .expect("the worker waits for batches");
        self.out += 1;
        back
    }

    /// Waits for the batches out; the recovery data, and their checksums in order.
    fn finish(self) -> (Vec<gf::Buffer>, Vec<Sums>) {
        drop(self.batches);
        let rest = self.sums.iter().collect();
        (self.thread.join().expect("no panic"), rest)
    }
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
        let native: Vec<(gf::Buffer, u16)> = if self.cut.is_empty() {
            Vec::new()
        } else if self.first {
            batch
                .iter()
                .map(|(b, c)| {
                    let mut n = take_spare(self.spare_native);
                    n.copy_from(&b[self.cut.clone()]);
                    n.resize(self.cut.len().next_multiple_of(gf::BLOCK));
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
        // A core is taken by the read through while it runs.
        let threads = (self.threads)
            .saturating_sub(DESCRIBING.load(Ordering::Relaxed))
            .max(1);
        let (sums, crcs) = if shared(&rec, &native, threads) > 1 {
            std::thread::scope(|t| {
                let sums = t.spawn(checksums);
                accumulate(&mut rec, &native, threads);
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

/// Bytes a streamed first pass reads at a time beyond each slice's strip, and how many such
/// pieces are on their way to the slice's checksums at most.
const STREAM_READ: usize = 1 << 20;
const STREAM_PIECES: usize = 3;

/// Reads the next slice of a file read through (`want` bytes of it; padded with zeros to the
/// strips' end) for a streamed first pass: its first strip into `buf`, the rest in pieces
/// that are hashed and let go. The slice's checksums are taken on a thread of their own as
/// the pieces go by: a second MD5 chain beside the file's own slowed the reader by half.
/// `None` if the file ends early.
fn stream_slice(
    reader: &mut dyn Through,
    whole: &mut Md5,
    buf: &mut [u8],
    want: usize,
    strips: &[std::ops::Range<usize>],
) -> io::Result<Option<Checksums>> {
    let size = strips.last().map_or(0, |s| s.end);
    let head = want.min(buf.len());
    if read_full(reader, &mut buf[..head])? < head {
        return Ok(None);
    }
    buf[head..].fill(0);
    hash_through(whole, reader, &buf[..head]);
    std::thread::scope(|t| {
        let (full, to_sum) = std::sync::mpsc::sync_channel::<Vec<u8>>(STREAM_PIECES);
        let (empty, to_fill) = std::sync::mpsc::channel::<Vec<u8>>();
        let summing = t.spawn(move || {
            let mut sums = SliceSums::new(strips);
            for piece in to_sum {
                sums.update(&piece);
                let _ = empty.send(piece);
            }
            // The last slice of a file is padded with zeros.
            let zeros = vec![0u8; (size - want).min(STREAM_READ)];
            let mut left = size - want;
            while left > 0 {
                let n = left.min(STREAM_READ);
                sums.update(&zeros[..n]);
                left -= n;
            }
            sums.finalize()
        });
        let mut made = 0;
        let mut piece = || match to_fill.try_recv() {
            Ok(b) => b,
            Err(_) if made < STREAM_PIECES + 1 => {
                made += 1;
                vec![0u8; STREAM_READ]
            }
            Err(_) => to_fill
                .recv()
                .expect("the summing thread gives every piece back"),
        };
        for chunk in buf[..head].chunks(STREAM_READ) {
            let mut p = piece();
            p.clear();
            p.extend_from_slice(chunk);
            let _ = full.send(p);
        }
        let mut done = head;
        while done < want {
            let mut p = piece();
            p.resize((want - done).min(STREAM_READ), 0);
            if read_full(reader, &mut p)? < p.len() {
                return Ok(None);
            }
            hash_through(whole, reader, &p);
            done += p.len();
            let _ = full.send(p);
        }
        drop(full);
        Ok(Some(summing.join().expect("no panic")))
    })
}

/// A slice's checksums (MD5, CRC32) and the CRC32 of each of its strips.
type Checksums = ((Id, u32), Vec<u32>);

/// Hashes a piece of a file read through into its MD5, and into the file's own hash.
fn hash_through(whole: &mut Md5, reader: &mut dyn Through, piece: &[u8]) {
    match reader.sha256() {
        Some(sha) => whole.update_with_sha256(piece, sha),
        None => whole.update_along(piece, &mut |p| reader.along(p)),
    }
}

/// A slice's MD5 and CRC32s (its own, and one for each strip) taken as its bytes stream by.
struct SliceSums<'a> {
    md5: Md5,
    strips: &'a [std::ops::Range<usize>],
    crcs: Vec<crc32fast::Hasher>,
    /// Bytes of the slice seen, and the strip they end in.
    at: usize,
    strip: usize,
}

impl<'a> SliceSums<'a> {
    fn new(strips: &'a [std::ops::Range<usize>]) -> Self {
        SliceSums {
            md5: Md5::new(),
            strips,
            crcs: vec![crc32fast::Hasher::new(); strips.len()],
            at: 0,
            strip: 0,
        }
    }

    /// The slice's next bytes.
    fn update(&mut self, mut data: &[u8]) {
        self.md5.update(data);
        while !data.is_empty() {
            let strip = &self.strips[self.strip];
            let n = data.len().min(strip.end - self.at);
            self.crcs[self.strip].update(&data[..n]);
            self.at += n;
            data = &data[n..];
            if self.at == strip.end {
                self.strip += 1;
            }
        }
    }

    /// The slice's checksums.
    fn finalize(self) -> Checksums {
        let mut whole = crc32fast::Hasher::new();
        let crcs = self
            .crcs
            .into_iter()
            .map(|h| {
                whole.combine(&h);
                h.finalize()
            })
            .collect();
        ((self.md5.finalize(), whole.finalize()), crcs)
    }
}

/// A buffer given back by a finished batch, or a new one.
fn take_spare(spare: &Mutex<Vec<gf::Buffer>>) -> gf::Buffer {
    lock(spare).pop().unwrap_or_default()
}

/// How a pass reads a file: the first through, hashing it; later ones a strip of each slice.
enum Reading<'f> {
    Through(Box<dyn Through + 'f>),
    At(&'f dyn Files),
}

/// Reads file `i` from `offset` until `buf` is full or the file ends; how many bytes.
fn read_full_at(files: &dyn Files, i: usize, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
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
