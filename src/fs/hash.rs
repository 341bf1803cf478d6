//! Reading a file to hash it: the read loop that feeds the digests.
//!
//! Reading is where the time goes, so the loop reads into one page-aligned buffer per worker
//! (an unaligned destination makes the kernel's page-cache copy several times slower) and
//! never allocates per file. Large files are read by a second thread while the first hashes,
//! or, where every core hashes (BLAKE3 of one file, SHA-256 of several at once), through
//! memory maps ([`crate::fs::mapped`]); large BLAKE3 files in parts, each core mapping and
//! hashing parts of its own ([`digest::blake3_in_parts`]).

#![allow(unsafe_code)]

use std::alloc::Layout;
use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use crate::core::digest::{self, Algo, Digest, Digests, Hasher};
use crate::fs::device::{Cold, Gate, Pass};
use crate::fs::mapped::{self, Map};
use crate::fs::sys;

/// Size of the read buffer: the measured sweet spot for sequential reads is 512 KiB–2 MiB.
pub const BUF_SIZE: usize = 1 << 20;

/// A page-aligned, reusable read buffer. Its pages are the kernel's zero pages until written:
/// a buffer that only ever holds small files costs the memory of what it held (a zeroing
/// allocator would make all of it resident up front).
pub struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the buffer is a plain owned mapping, only reachable through &mut self.
unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    /// Maps `len` zeroed bytes, aligned to the page.
    pub fn new(len: usize) -> Self {
        let len = len.max(1);
        // SAFETY: a new private anonymous mapping; no existing memory is touched.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            let layout = Layout::from_size_align(len, 4096).expect("valid layout");
            std::alloc::handle_alloc_error(layout);
        }
        AlignedBuf {
            ptr: ptr.cast(),
            len,
        }
    }

    /// The whole buffer.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: ptr points to len bytes mapped readable and writable (zeroed by the kernel),
        // owned by self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: mapped in new() with this length, and no slice of it outlives &mut self.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// How to read while hashing.
#[derive(Clone, Copy, Default)]
pub struct ReadOptions<'a> {
    /// Drop the file's pages from the page cache after reading them, so that a background
    /// scrub does not evict the user's working set.
    pub drop_cache: bool,
    /// Hash large files through memory maps (no copy). Off for background scrubs, which must
    /// not bring files into the page cache.
    pub map: bool,
    /// The file is on a spinning disk: read what is cached freely, but take this gate
    /// before the first read that would have to wait for the disk.
    pub gate: Option<&'a Gate>,
    /// Watch for data that is not cached: reads go to the page cache alone (`RWF_NOWAIT`,
    /// the reads that were to be made anyway) until one would have had to wait for the
    /// device, which meets this. Not the first read only: the kernel's read-ahead (8 MiB on
    /// a virtio disk) may have brought in the start of a file whose rest is cold.
    pub cold: Option<&'a Cold>,
    /// The number of large files being hashed at once, this one among them. While there are
    /// others, every core hashes, and copying out of the page cache takes time from hashing
    /// where a map's page tables cost little (five 800 MiB files on two cores: 1.84 s read,
    /// 1.60 s mapped). Alone, the copy runs on a core that would otherwise idle, and a map
    /// only adds its page-table fill (4% on one file in 4 KiB pages, nothing where the page
    /// cache holds 2 MiB folios).
    pub crowd: Option<&'a AtomicUsize>,
    /// Called once a large file hashed on one core (SHA-256) is seen coming from the page
    /// cache (its first 8 MiB): its worker hands its slot on, so that other large files share
    /// the cores with it (see `engine::Slots`). Not for cold data, which comes at the disk's
    /// pace, not the cores' (five cold 800 MiB files on this VM's disk: 4.1 s with it, 3.3 s
    /// without).
    pub lend: Option<&'a (dyn Fn() + Sync)>,
}

/// Why hashing stopped early.
#[derive(Debug)]
pub enum HashError {
    /// A read failed.
    Io(io::Error),
    /// The run was interrupted (Ctrl-C).
    Interrupted,
}

/// Files at least this large are read by a second thread while the first hashes, so the
/// copy out of the page cache does not cost hashing time.
pub const OVERLAP_MIN: u64 = 8 * BUF_SIZE as u64;

/// Reads `file` from its current offset to the end and returns one digest per algorithm in
/// `algos` (one pass feeds them all) plus the number of bytes read.
///
/// `size` (from `fstat`) chooses between a plain loop and overlapped reading into both
/// `bufs`, and saves the read that would only confirm the end of the file: the caller's
/// second `fstat` catches a file that grew meanwhile. `bytes_done` is bumped as data goes by, for progress display.
pub fn hash_file(
    file: &File,
    algos: &[Algo],
    bufs: &mut [AlignedBuf; 2],
    size: u64,
    opts: ReadOptions<'_>,
    cancel: &AtomicBool,
    bytes_done: &AtomicU64,
) -> Result<(Digests, u64), HashError> {
    // One hasher per algorithm, however often it is asked for; on the stack.
    let mut hashers: [Option<Hasher>; Algo::COUNT] = Default::default();
    for &a in algos {
        hashers[a.index()].get_or_insert_with(|| Hasher::new(a));
    }
    if opts.drop_cache {
        sys::advise_sequential(file);
    }
    let mut reader = ChunkReader {
        file,
        opts,
        cancel,
        size,
        total: 0,
        dropped: 0,
        pass: None,
    };
    let mut feed = |chunk: &[u8]| {
        // As many files spread at once as there are cores: each keeps one busy, and handing
        // half of each window to the pool would only wake threads to take work from a core
        // that has its own (five 800 MiB files with BLAKE3 on two cores, 41 runs in turns:
        // 5,100 context switches and x0.98 b3sum handed over, 1,600 and x1.00 here).
        let here = SPREAD.load(Ordering::Relaxed) >= crate::fs::sys::cores();
        for h in hashers.iter_mut().flatten() {
            match here {
                true => h.update_here(chunk),
                false => h.update(chunk),
            }
        }
        bytes_done.fetch_add(chunk.len() as u64, Ordering::Relaxed);
    };
    if size < OVERLAP_MIN {
        let buf = bufs[0].as_mut_slice();
        while let n @ 1.. = reader.next(buf)? {
            feed(&buf[..n]);
        }
    } else {
        // Read until maps pay (from the start for BLAKE3, once crowded for SHA-256), then
        // map; where a map cannot be made, read the rest.
        let mut may_map = opts.map;
        // Once the first OVERLAP_MIN came warm: a file's first chunks may be cached by the
        // kernel's read-ahead (started by a look at whether it is cached) while the rest is
        // cold, and cold data comes at the disk's pace, which sharing does not help.
        // Crowded, it lends at once: it goes on through maps, past the chunks counted here.
        let lend = opts
            .lend
            .filter(|_| size >= 2 * OVERLAP_MIN && !all_cores(algos, opts));
        let (chunks, lent) = (std::cell::Cell::new(0), std::cell::Cell::new(false));
        let share = |crowded: bool| {
            chunks.set(chunks.get() + 1);
            let due = crowded || chunks.get() >= OVERLAP_MIN / BUF_SIZE as u64;
            if let Some(lend) = lend.filter(|_| due && warm(opts) && !lent.replace(true)) {
                lend();
            }
        };
        loop {
            if may_map && maps(algos, opts) {
                share(true);
                if let Some(digest) = in_parts(&mut reader, algos, bytes_done)? {
                    reader.finish();
                    return Ok(([digest].into_iter().collect(), reader.total));
                }
                if mapped(&mut reader, &mut feed, all_cores(algos, opts))? {
                    break;
                }
                may_map = false;
            }
            // After each chunk: lend the slot once read warm for long enough; once crowded, map.
            if overlapped(&mut reader, bufs, &mut feed, || {
                let crowded = may_map && maps(algos, opts);
                share(crowded);
                crowded
            })? {
                break;
            }
        }
    }
    reader.finish();
    let total = reader.total;
    Ok((
        hashers
            .into_iter()
            .flatten()
            .map(Hasher::finalize)
            .collect(),
        total,
    ))
}

/// Whether a large file is hashed through maps: BLAKE3's, which spreads a window over every
/// core, where copying out of the page cache would cost as much as the hashing; SHA-256's
/// only when crowded. Alone, SHA-256 hashes on one core while the reader thread copies on
/// another, so the copy is free and a map's page-table fill and unmapping are not (measured
/// on one 2 GiB file: 0.95x `openssl speed` one core through 4 MiB maps, 1.00x with reads,
/// and 10 MiB RSS).
fn maps(algos: &[Algo], opts: ReadOptions<'_>) -> bool {
    // Cold data streams faster through reads, with the kernel's read-ahead.
    let crowded = warm(opts) && opts.crowd.is_some_and(|n| n.load(Ordering::Relaxed) > 1);
    opts.map && (all_cores(algos, opts) || crowded)
}

/// The maps of a file hashed on one core, which needs no window to spread: mapped pages
/// count in RSS, and several such files are hashed at once (five 800 MiB files on two
/// cores: 1.75 s and 29 MiB in 2 MiB windows, 1.69 s and 50 MiB in 4 MiB, 1.70 s and 91 MiB
/// in 8 MiB).
const ONE_CORE_WINDOW: usize = 4 << 20;

/// Whether hashing a large file spreads over every core.
fn all_cores(algos: &[Algo], opts: ReadOptions<'_>) -> bool {
    opts.map && algos.contains(&Algo::Blake3)
}

/// Whether no data the run has read so far had to come from a device.
fn warm(opts: ReadOptions<'_>) -> bool {
    opts.cold.is_some_and(|c| !c.met())
}

/// Files being hashed over every core at once: they share the cores, and the memory their
/// windows hold.
static SPREAD: AtomicUsize = AtomicUsize::new(0);

/// One file counted in [`SPREAD`] while this lives.
struct Spreading;

impl Spreading {
    fn new() -> Spreading {
        SPREAD.fetch_add(1, Ordering::Relaxed);
        Spreading
    }
}

impl Drop for Spreading {
    fn drop(&mut self) {
        SPREAD.fetch_sub(1, Ordering::Relaxed);
    }
}

/// BLAKE3 of a large file through maps of its parts, hashed by whichever core of the pool
/// reaches each ([`digest::blake3_in_parts`]): each core maps a part, hashes it whole and
/// unmaps it, with no hand-over between cores or to a thread that maps ahead, and several
/// files at once share the pool's cores part by part (five 800 MiB files on two cores: x0.97
/// b3sum's time, x0.98 with each file's windows on a core of its own). RSS holds a part a
/// thread of the pool: twice [`mapped::WINDOW`], however many files. `None` where it does not
/// apply (another algorithm too, already reading, a file of one part) or where a part could
/// not be hashed from the page cache or a filled map (not mapped, behind a disk's gate and
/// not cached, pages lost): nothing was fed, and the file is read again from its start the
/// way that says why.
fn in_parts(
    reader: &mut ChunkReader<'_, '_>,
    algos: &[Algo],
    bytes_done: &AtomicU64,
) -> Result<Option<Digest>, HashError> {
    let threads = rayon_core::current_num_threads().max(1);
    let most = (2 * mapped::WINDOW / threads).max(1 << 20);
    let most = 1u64 << most.ilog2();
    let fresh = reader.total == 0 && reader.pass.is_none();
    if algos != [Algo::Blake3] || !all_cores(algos, reader.opts) || !fresh || reader.size <= most {
        return Ok(None);
    }
    let _spreading = Spreading::new();
    let (file, cold, cancel) = (reader.file, reader.opts.cold, reader.cancel);
    let gated = reader.opts.gate.is_some();
    let (stop, hashed) = (AtomicBool::new(false), AtomicU64::new(0));
    let part = |offset: u64, len: usize| {
        if cancel.load(Ordering::Relaxed) || stop.load(Ordering::Relaxed) {
            return Err(());
        }
        // Watching for cold data, a part found not cached meets it and is read in at once,
        // as `mapped` does; behind a gate only what is cached is read here.
        let watching = cold.is_some_and(|c| !c.met());
        let prepared = match prepare(file, offset, len, watching || gated) {
            Prepared::Uncached if !gated => {
                cold.inspect(|c| c.meet());
                prepare(file, offset, len, false)
            }
            prepared => prepared,
        };
        let cv = match prepared {
            Prepared::Ready(map) => {
                // SAFETY: only hashed (BLAKE3, data-oblivious); a file changed meanwhile has
                // its digest discarded by the engine's check after the hash.
                let cv = digest::subtree(offset, unsafe { map.bytes() });
                (!map.faulted()).then_some(cv)
            }
            _ => None,
        };
        let Some(cv) = cv else {
            stop.store(true, Ordering::Relaxed);
            return Err(());
        };
        bytes_done.fetch_add(len as u64, Ordering::Relaxed);
        hashed.fetch_add(len as u64, Ordering::Relaxed);
        Ok(cv)
    };
    match digest::blake3_in_parts(reader.size, most, &part) {
        Ok(digest) => {
            reader.total = reader.size;
            Ok(Some(digest))
        }
        Err(()) if cancel.load(Ordering::Relaxed) => Err(HashError::Interrupted),
        Err(()) => {
            bytes_done.fetch_sub(hashed.into_inner(), Ordering::Relaxed);
            Ok(None)
        }
    }
}

/// Hashes through memory maps, without copying out of the page cache: for hashing `spread`
/// over every core, a window of at most [`mapped::WINDOW`] bytes at a time (shared among the
/// files spread at once: the cores are theirs together, and each worker holds two windows),
/// else of [`ONE_CORE_WINDOW`]. Returns false where a map cannot be made or filled, or
/// (hashed on one core) its data is not cached, to go on reading from where it stopped. A
/// window that lost pages to a truncation ends the read short, which the caller reports as a
/// change.
fn mapped(
    reader: &mut ChunkReader<'_, '_>,
    feed: &mut impl FnMut(&[u8]),
    spread: bool,
) -> Result<bool, HashError> {
    let _spreading = spread.then(Spreading::new);
    let most = || match spread {
        // A multiple of ONE_CORE_WINDOW, which is of the page size.
        true => {
            let share = mapped::WINDOW / SPREAD.load(Ordering::Relaxed).max(1);
            share.max(ONE_CORE_WINDOW) / ONE_CORE_WINDOW * ONE_CORE_WINDOW
        }
        false => ONE_CORE_WINDOW,
    };
    let (file, size, gated) = (reader.file, reader.size, reader.opts.gate.is_some());
    let watch = reader.opts.cold.is_some();
    let window = |offset: u64| (size - offset).min(most() as u64) as usize;
    // A helper thread unmaps the window hashed before and maps (and reads in, if it is not
    // cached) the next while this one is hashed: both are one thread's work, which would
    // otherwise leave the hashing cores idle between windows (unmapping 32 MiB took a few
    // hundred microseconds of a window's four milliseconds). One helper for the file, asked
    // one window at a time.
    std::thread::scope(|s| {
        let (ask, asked) = crossbeam_channel::bounded::<(u64, usize, bool, Option<Map>)>(1);
        let (tell, told) = crossbeam_channel::bounded::<Prepared>(1);
        s.spawn(move || {
            for (offset, len, check_cached, done) in asked {
                drop(done);
                if tell.send(prepare(file, offset, len, check_cached)).is_err() {
                    break;
                }
            }
        });
        // The window's length is decided once, here: the share of a spread file changes.
        let ahead = |offset: u64, check_cached: bool, done: Option<Map>| {
            let len = window(offset);
            ask.send((offset, len, check_cached, done))
                .expect("the mapping thread waits for work");
            len
        };
        let first = (gated || watch) && reader.pass.is_none();
        let mut next = (reader.total < size).then(|| ahead(reader.total, first, None));
        let mut done = None;
        while let Some(len) = next.take() {
            let prepared = match told.recv().expect("mapping thread panicked") {
                Prepared::Uncached => {
                    reader.uncached();
                    // Hashed on one core, cold data is read (see `maps`).
                    if !spread {
                        return Ok(false);
                    }
                    prepare(file, reader.total, len, false)
                }
                prepared => prepared,
            };
            // No map, or one whose pages could not all be read in: pread goes on from here
            // and tells an I/O error from a truncation.
            let Prepared::Ready(map) = prepared else {
                return Ok(false);
            };
            if reader.cancel.load(Ordering::Relaxed) {
                return Err(HashError::Interrupted);
            }
            let after = reader.total + len as u64;
            if after < size {
                next = Some(ahead(after, gated && reader.pass.is_none(), done.take()));
            }
            // SAFETY: `feed` only hashes (every digest is data-oblivious); a file changed
            // meanwhile has its digest discarded by the engine's check after the hash.
            feed(unsafe { map.bytes() });
            if map.faulted() {
                drop(map);
                return match first_read_error(file, reader.total, len) {
                    // The device could not deliver a page: that is an I/O error, not a change.
                    Some(e) => Err(HashError::Io(e)),
                    // The pages went with a truncation: the short count reports the change.
                    None => Ok(true),
                };
            }
            reader.total = after;
            done = Some(map);
        }
        Ok(true)
    })
}

/// A window made ready for hashing, or the news that its data is not cached and the disk's
/// gate must be taken before reading it in.
enum Prepared {
    Ready(Map),
    Uncached,
    /// Not mapped, or not all of it could be read in.
    Unmapped,
}

/// Maps one window, and reads it in unless it is cached; with `check_cached` (behind a gate
/// not yet held, or watching for cold data), only if its data is cached (populating would
/// otherwise read from the disk outside the gate). Cached pages are left to the hashing's
/// page faults, which map a large folio at a time: populating walks the pages one by one
/// (BLAKE3 of one 4 GiB file: 1.32 CPU-s with it, 1.16 without, as much as b3sum's).
fn prepare(file: &File, offset: u64, len: usize, check_cached: bool) -> Prepared {
    let Some(map) = Map::new(file, offset, len) else {
        return Prepared::Unmapped;
    };
    let cached = map.resident();
    if check_cached && !cached {
        Prepared::Uncached
    } else if cached || map.populate() {
        Prepared::Ready(map)
    } else {
        Prepared::Unmapped
    }
}

/// Reads a window that faulted through its map again with `pread`, to tell a device error
/// (which the map also signals with SIGBUS) from a truncation.
fn first_read_error(file: &File, offset: u64, len: usize) -> Option<io::Error> {
    let mut buf = vec![0u8; 64 << 10];
    let mut at = offset;
    while at < offset + len as u64 {
        match rustix::io::pread(file, &mut buf[..], at) {
            Ok(0) => return None,
            Ok(n) => at += n as u64,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Some(e.into()),
        }
    }
    None
}

/// Double buffering: a scoped reader thread fills one buffer while the caller hashes the
/// other; the buffers travel between the two over channels. Returns whether the file was
/// read to its end: false if `stop` said so first (after what was read is hashed).
fn overlapped(
    reader: &mut ChunkReader<'_, '_>,
    bufs: &mut [AlignedBuf; 2],
    feed: &mut impl FnMut(&[u8]),
    stop: impl Fn() -> bool,
) -> Result<bool, HashError> {
    let (free_tx, free_rx) = crossbeam_channel::bounded::<&mut AlignedBuf>(2);
    let (full_tx, full_rx) =
        crossbeam_channel::bounded::<Result<(&mut AlignedBuf, usize), HashError>>(2);
    for buf in bufs.iter_mut() {
        free_tx.send(buf).expect("room for both");
    }
    std::thread::scope(|s| {
        s.spawn(move || {
            for buf in free_rx {
                let result = reader.next(buf.as_mut_slice());
                let stop = !matches!(result, Ok(1..));
                if full_tx.send(result.map(|n| (buf, n))).is_err() || stop {
                    break;
                }
            }
        });
        let mut free_tx = Some(free_tx);
        for chunk in &full_rx {
            let (buf, n) = chunk?;
            if n == 0 {
                return Ok(true);
            }
            feed(&buf.as_mut_slice()[..n]);
            // Stopped, the reader ends after the read in its hands, which is hashed next.
            if stop() {
                free_tx = None;
            }
            // The reader may already have stopped on an error it sent; that error is next.
            if let Some(free) = &free_tx {
                let _ = free.send(buf);
            }
        }
        Ok(free_tx.is_some())
    })
}

/// The read side: retries interrupted reads, honours Ctrl-C, drops read pages when asked,
/// and waits at the device's gate only for data that is not cached.
struct ChunkReader<'a, 'g> {
    file: &'a File,
    opts: ReadOptions<'g>,
    cancel: &'a AtomicBool,
    size: u64,
    total: u64,
    dropped: u64,
    pass: Option<Pass<'g>>,
}

impl ChunkReader<'_, '_> {
    /// Fills `buf` with the next bytes; 0 at the end of the file.
    fn next(&mut self, buf: &mut [u8]) -> Result<usize, HashError> {
        if self.total == self.size {
            return Ok(0);
        }
        loop {
            if self.cancel.load(Ordering::Relaxed) {
                return Err(HashError::Interrupted);
            }
            let watching = self.opts.cold.is_some();
            if self.pass.is_none() && (self.opts.gate.is_some() || watching) {
                // Once the run has met cold data, a refusal is believed: checking each cold
                // file's pages cost a cold (d) 17%.
                let confirm = self.opts.cold.is_some_and(|c| !c.met());
                match sys::read_cached(self.file, buf, self.total, confirm) {
                    Some(Ok(n)) if n > 0 || self.total >= self.size => return Ok(self.advance(n)),
                    Some(Err(e)) => return Err(HashError::Io(e)),
                    _ => self.uncached(),
                }
            }
            match rustix::io::pread(self.file, &mut *buf, self.total) {
                Ok(n) => return Ok(self.advance(n)),
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(HashError::Io(e.into())),
            }
        }
    }

    /// The next read has to wait for the device: say so, and from now on this file holds
    /// the disk's gate if it has one.
    fn uncached(&mut self) {
        if let Some(cold) = self.opts.cold.take() {
            cold.meet();
        }
        if let Some(gate) = self.opts.gate {
            self.pass = Some(gate.enter());
            gate.probe_file(self.file, self.size);
        }
    }

    fn advance(&mut self, n: usize) -> usize {
        self.total += n as u64;
        // Dropping in large steps keeps the syscall count low.
        if self.total - self.dropped >= 16 * BUF_SIZE as u64 {
            self.drop_read_pages();
        }
        n
    }

    /// Lets the next reader at the disk and drops what remains to drop from the cache.
    fn finish(&mut self) {
        self.pass = None;
        self.drop_read_pages();
    }

    fn drop_read_pages(&mut self) {
        if self.opts.drop_cache {
            sys::drop_pages(self.file, self.dropped, self.total - self.dropped);
            self.dropped = self.total;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::digest::digest_bytes;

    #[test]
    fn interrupted_overlapped_read_stops() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![1u8; 10 * BUF_SIZE]).unwrap();
        let mut bufs = [AlignedBuf::new(BUF_SIZE), AlignedBuf::new(BUF_SIZE)];
        let r = hash_file(
            &File::open(&path).unwrap(),
            &[Algo::Sha256],
            &mut bufs,
            10 * BUF_SIZE as u64,
            ReadOptions::default(),
            &AtomicBool::new(true),
            &AtomicU64::new(0),
        );
        assert!(matches!(r, Err(HashError::Interrupted)));
    }

    #[test]
    fn a_large_blake3_file_is_hashed_in_parts_by_every_core() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        // Parts are at most twice a window, shared among the pool's threads: this is three
        // parts or more on any machine.
        let len = 2 * mapped::WINDOW + 3 * BUF_SIZE + 5;
        let data: Vec<u8> = (0..len).map(|i| (i ^ (i >> 11)) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let file = File::open(&path).unwrap();
        let (cancel, bytes_done) = (AtomicBool::new(false), AtomicU64::new(0));
        let opts = ReadOptions {
            map: true,
            ..ReadOptions::default()
        };
        let reader = |cancel| ChunkReader {
            file: &file,
            opts,
            cancel,
            size: len as u64,
            total: 0,
            dropped: 0,
            pass: None,
        };
        let digest = in_parts(&mut reader(&cancel), &[Algo::Blake3], &bytes_done).unwrap();
        assert_eq!(digest, Some(digest_bytes(Algo::Blake3, &data)));
        assert_eq!(bytes_done.load(Ordering::Relaxed), len as u64);
        // Not for SHA-256, nor two algorithms at once, nor without maps.
        for algos in [&[Algo::Sha256][..], &[Algo::Blake3, Algo::Sha256]] {
            assert_eq!(
                in_parts(&mut reader(&cancel), algos, &bytes_done).unwrap(),
                None
            );
        }
        let mut unmapped = reader(&cancel);
        unmapped.opts.map = false;
        assert_eq!(
            in_parts(&mut unmapped, &[Algo::Blake3], &bytes_done).unwrap(),
            None
        );
        // Interrupted, it says so.
        let stopped = AtomicBool::new(true);
        let r = in_parts(&mut reader(&stopped), &[Algo::Blake3], &bytes_done);
        assert!(matches!(r, Err(HashError::Interrupted)));
        // Through the whole read, with its size check.
        let mut bufs = [AlignedBuf::new(BUF_SIZE), AlignedBuf::new(BUF_SIZE)];
        let (digests, total) = hash_file(
            &file,
            &[Algo::Blake3],
            &mut bufs,
            len as u64,
            opts,
            &cancel,
            &bytes_done,
        )
        .unwrap();
        assert_eq!(
            (digests.of(Algo::Blake3), total),
            (digest_bytes(Algo::Blake3, &data), len as u64)
        );
    }

    #[test]
    fn reading_then_mapping_the_rest_hashes_the_whole_file_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let data: Vec<u8> = (0..20 * BUF_SIZE).map(|i| (i ^ (i >> 13)) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let file = File::open(&path).unwrap();
        let mut bufs = [AlignedBuf::new(BUF_SIZE), AlignedBuf::new(BUF_SIZE)];
        let cancel = AtomicBool::new(false);
        let mut reader = ChunkReader {
            file: &file,
            opts: ReadOptions::default(),
            cancel: &cancel,
            size: data.len() as u64,
            total: 0,
            dropped: 0,
            pass: None,
        };
        let mut hasher = Hasher::new(Algo::Sha256);
        let mut feed = |chunk: &[u8]| hasher.update(chunk);
        // Told to stop at the first chunk: the read in the reader's hands is hashed too.
        assert!(!overlapped(&mut reader, &mut bufs, &mut feed, || true).unwrap());
        let switched_at = reader.total;
        assert!(switched_at > 0 && switched_at < data.len() as u64);
        assert_eq!(switched_at % BUF_SIZE as u64, 0);
        assert!(mapped(&mut reader, &mut feed, false).unwrap());
        assert_eq!(reader.total, data.len() as u64);
        assert_eq!(hasher.finalize(), digest_bytes(Algo::Sha256, &data));
    }

    /// Drops the (written back) pages of `file`, so that the next read has to wait for the
    /// device; false where the file system keeps them (tmpfs: nothing to test there). CI's
    /// disk drops them: a skip there would land untested code. A few tries: readahead that
    /// the hash just started may still bring pages in after a drop (seen once in a loaded
    /// CI run).
    fn dropped(file: &File, len: usize) -> bool {
        for _ in 0..50 {
            sys::drop_pages(file, 0, len as u64);
            if sys::read_cached(file, &mut [0u8], 0, false).is_none() {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        crate::skip!("pages not dropped here: cold reads not tested", false);
    }

    #[test]
    fn a_large_file_lends_its_slot_once_read_warm_and_never_for_cold_data() {
        let dir = tempfile::tempdir().unwrap();
        let len = 2 * OVERLAP_MIN as usize + BUF_SIZE;
        let path = dir.path().join("f");
        std::fs::write(&path, vec![9u8; len]).unwrap();
        let file = File::open(&path).unwrap();
        file.sync_all().unwrap();
        let mut bufs = [AlignedBuf::new(BUF_SIZE), AlignedBuf::new(BUF_SIZE)];
        let mut lends = |algo: Algo, cold: &Cold| {
            let lent = AtomicUsize::new(0);
            let lend = || {
                lent.fetch_add(1, Ordering::Relaxed);
            };
            let opts = ReadOptions {
                map: true,
                cold: Some(cold),
                lend: Some(&lend),
                ..ReadOptions::default()
            };
            let (never, done) = (AtomicBool::new(false), AtomicU64::new(0));
            let (d, n) = hash_file(&file, &[algo], &mut bufs, len as u64, opts, &never, &done)
                .map_err(|e| format!("{e:?}"))
                .unwrap();
            assert_eq!(
                (d.of(algo), n),
                (digest_bytes(algo, &vec![9u8; len]), len as u64)
            );
            lent.into_inner()
        };
        let (warm, _woken) = Cold::new();
        assert_eq!(lends(Algo::Sha256, &warm), 1, "SHA-256, warm");
        assert_eq!(
            lends(Algo::Blake3, &warm),
            0,
            "BLAKE3 spreads over every core itself"
        );
        if !dropped(&file, len) {
            return;
        }
        let (cold, _woken) = Cold::new();
        assert_eq!(
            lends(Algo::Sha256, &cold),
            0,
            "cold data comes at the disk's pace"
        );
    }

    #[test]
    fn cached_data_never_waits_at_the_gate() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![3u8; 2 * BUF_SIZE]).unwrap();
        let file = File::open(&path).unwrap();
        // Just written: the data is in the page cache.
        let gate = Gate::new();
        let _held = gate.enter();
        let mut bufs = [AlignedBuf::new(BUF_SIZE), AlignedBuf::new(BUF_SIZE)];
        // Were the gate needed, this would wait forever for the pass held above.
        let (d, n) = hash_file(
            &file,
            &[Algo::Sha256],
            &mut bufs,
            2 * BUF_SIZE as u64,
            ReadOptions {
                drop_cache: false,
                map: true,
                gate: Some(&gate),
                ..ReadOptions::default()
            },
            &AtomicBool::new(false),
            &AtomicU64::new(0),
        )
        .map_err(|e| format!("{e:?}"))
        .unwrap();
        assert_eq!(n, 2 * BUF_SIZE as u64);
        assert_eq!(
            d.of(Algo::Sha256),
            digest_bytes(Algo::Sha256, &vec![3u8; 2 * BUF_SIZE])
        );
    }

    #[test]
    fn only_a_read_that_waits_for_the_device_meets_cold_data() {
        let dir = tempfile::tempdir().unwrap();
        let mut bufs = [AlignedBuf::new(BUF_SIZE), AlignedBuf::new(BUF_SIZE)];
        // Small files read into the buffer; large ones are read ahead (SHA-256 alone) or go
        // through maps (BLAKE3, SHA-256 crowded).
        let crowd = AtomicUsize::new(2);
        let cases = [
            (Algo::Sha256, None),
            (Algo::Sha256, Some(&crowd)),
            (Algo::Blake3, None),
        ]
        .map(|(a, c)| [(a, c, 3 * BUF_SIZE), (a, c, 9 * BUF_SIZE)]);
        for (algo, crowd, len) in cases.into_iter().flatten() {
            let path = dir
                .path()
                .join(format!("f{len}{algo:?}{}", crowd.is_some()));
            std::fs::write(&path, vec![5u8; len]).unwrap();
            let file = File::open(&path).unwrap();
            file.sync_all().unwrap();
            let mut hash = |file: &File, cold: &Cold| {
                hash_file(
                    file,
                    &[algo],
                    &mut bufs,
                    len as u64,
                    ReadOptions {
                        map: true,
                        cold: Some(cold),
                        crowd,
                        ..ReadOptions::default()
                    },
                    &AtomicBool::new(false),
                    &AtomicU64::new(0),
                )
                .map_err(|e| format!("{e:?}"))
                .unwrap()
            };
            let (warm, woken) = Cold::new();
            hash(&file, &warm);
            assert!(
                !warm.met(),
                "cached data met as cold ({len} bytes, {algo:?})"
            );
            assert!(woken.try_recv().is_err(), "woken for nothing");
            if !dropped(&file, len) {
                return;
            }
            let (cold, woken) = Cold::new();
            let (d, n) = hash(&file, &cold);
            assert!(
                cold.met(),
                "a read from the device not noticed ({len} bytes, {algo:?})"
            );
            assert!(
                woken.try_recv().is_err_and(|e| e.is_disconnected()),
                "not woken"
            );
            assert_eq!(
                (d.of(algo), n),
                (digest_bytes(algo, &vec![5u8; len]), len as u64)
            );
        }
    }

    #[test]
    fn buffer_is_page_aligned() {
        let mut b = AlignedBuf::new(BUF_SIZE);
        assert_eq!(b.as_mut_slice().as_ptr() as usize % 4096, 0);
        assert_eq!(b.as_mut_slice().len(), BUF_SIZE);
    }

    #[test]
    fn one_pass_feeds_every_algorithm() {
        let dir = tempfile::tempdir().unwrap();
        let mut bufs = [AlignedBuf::new(BUF_SIZE), AlignedBuf::new(BUF_SIZE)];
        // Below and above OVERLAP_MIN: the plain loop and the overlapped reader.
        for len in [3 * BUF_SIZE + 17, 9 * BUF_SIZE + 17] {
            let path = dir.path().join(format!("f{len}"));
            let data: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
            std::fs::write(&path, &data).unwrap();
            let len = len as u64;
            // A stated size that is off (the file changed after fstat) reads up to the end
            // or stops at that size; the caller's second fstat notices either way.
            for (size, drop_cache) in [
                (len, false),
                (len, true),
                (len + 1, false),
                (len - 1, false),
            ] {
                let file = File::open(&path).unwrap();
                let done = AtomicU64::new(0);
                let (digests, n) = hash_file(
                    &file,
                    &[Algo::Sha256, Algo::Blake3],
                    &mut bufs,
                    size,
                    ReadOptions {
                        drop_cache,
                        map: !drop_cache,
                        ..ReadOptions::default()
                    },
                    &AtomicBool::new(false),
                    &done,
                )
                .map_err(|e| format!("{e:?}"))
                .unwrap();
                assert!(n >= size.min(len), "read {n} of {len} stated as {size}");
                if n > len {
                    // Mapped past the true end: the tail of the last page reads as zeros.
                    // Only the caller's second fstat can tell, and it does (size changed).
                    assert_eq!(n, size);
                    continue;
                }
                let expect = &data[..n as usize];
                assert_eq!(done.load(Ordering::Relaxed), n);
                assert_eq!(digests.of(Algo::Sha256), digest_bytes(Algo::Sha256, expect));
                assert_eq!(digests.of(Algo::Blake3), digest_bytes(Algo::Blake3, expect));
            }
        }
    }
}
