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

mod create;
pub mod gf;
pub mod md5x;
mod mul;
pub mod packet;
mod recover;
mod rename;
pub mod sha256;

pub use create::{Created, FIRST_BATCH, Plan, create};
pub use recover::Recovered;
pub use rename::Rename;

/// Deterministic pseudo-random bytes for the unit tests.
#[cfg(test)]
fn test_data(len: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0; len];
    fastrand::Rng::with_seed(seed).fill(&mut v);
    v
}

use std::collections::BTreeMap;
use std::io::{self, Read};
use std::sync::Mutex;

use packet::Id;

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

/// Somewhere to write a volume: recovery data is written in passes, each slice's packet
/// filled in piece by piece.
pub trait Volume: io::Write + io::Seek {}
impl<T: io::Write + io::Seek> Volume for T {}

/// Where [`create`] reads a set's files from: from two threads at once where the recovery
/// data is computed in several passes (one reads each file through, hashing it, while the
/// others read ranges).
pub trait Files: Sync {
    /// File `i` (an index into the inputs), to be read from its start.
    fn open(&self, i: usize) -> io::Result<Box<dyn Through + '_>>;
    /// Reads file `i` from `offset` into `buf`; how many bytes (0 at its end). The passes
    /// that compute the recovery data of a large set read only a range of each slice.
    fn read_at(&self, i: usize, offset: u64, buf: &mut [u8]) -> io::Result<usize>;
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
    fn open(&self, i: usize) -> io::Result<Box<dyn Through + '_>> {
        Ok(Box::new(&self[i][..]))
    }

    fn read_at(&self, i: usize, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        let f = &self[i][(offset as usize).min(self[i].len())..];
        let n = buf.len().min(f.len());
        buf[..n].copy_from_slice(&f[..n]);
        Ok(n)
    }
}

/// A lock whose holder never panics mid-update.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The file name par2cmdline gives a volume of `count` recovery slices starting at `first`.
pub fn volume_name(base: &str, first: u32, count: u32) -> String {
    let width = (first + count).to_string().len().max(2);
    format!("{base}.vol{first:0width$}+{count:0width$}.par2")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::md5x::Md5;
    use crate::packet::kind;

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
        let created = create(&inputs, &files.to_vec(), &plan, &mut volume).unwrap();
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

    #[test]
    fn slices_not_in_whole_blocks_are_made_and_repaired_in_passes() {
        // 4,100-byte slices: a tail of 4 bytes beyond the multiplication's 128-byte blocks
        // in one pass; in 1 KiB of memory, strips of 128 bytes and a last one of 4.
        let files = vec![data(50_000, 11), data(9_998, 12)];
        let (one, whole) = make(&files, 4100, 4);
        let (many, passes) = make_in(&files, 4100, 4, 1024);
        assert_eq!(one.index, many.index);
        assert_eq!(whole, passes);
        let set = Set::load(&[&many.index, &passes]).unwrap();
        let f0 = set.files.iter().position(|f| f.name == b"f0").unwrap();
        let f1 = set.files.iter().position(|f| f.name == b"f1").unwrap();
        // The last bytes of a slice, the first of the next, and the end of the other file.
        let mut damaged = files.clone();
        damaged[0][4099] ^= 1;
        damaged[0][4100] ^= 0x80;
        damaged[1][9_997] ^= 0xff;
        let open = |i: usize| if i == f0 { &damaged[0] } else { &damaged[1] };
        let rec = set
            .recover(&mut |i| Ok(Some(Box::new(&open(i)[..]))), 2)
            .unwrap();
        assert_eq!(rec.slices.len(), 3);
        for (k, f) in [(0, f0), (1, f1)] {
            let (mut out, mut cur) = (Vec::new(), &damaged[k][..]);
            set.restore(f, &rec, Some(&mut cur), &mut |b| {
                out.extend_from_slice(b);
                Ok(())
            })
            .unwrap();
            assert_eq!(out, files[k], "file {k}");
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
            fn open(&self, i: usize) -> io::Result<Box<dyn Through + '_>> {
                self.0.open(i)
            }
            fn read_at(&self, i: usize, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
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
        let flipping = Flipping(files);
        // One pass reads the files through once: what it read is what the set describes.
        assert!(create(&inputs, &flipping, &plan(1 << 20), &mut volume).is_ok());
        // In passes of 128 bytes, the byte read differently in a later pass is caught.
        match create(&inputs, &flipping, &plan(1024), &mut volume) {
            Err(Error::Changed(1)) => {}
            other => panic!("{:?}", other.map(|c| c.recovery_count)),
        }
    }

    #[test]
    fn a_pass_that_fails_stops_the_other_and_is_told() {
        /// Reads file 1 through 100 bytes short, or fails every read of a range of file 0.
        struct Failing(Vec<Vec<u8>>, bool);
        impl Files for Failing {
            fn open(&self, i: usize) -> io::Result<Box<dyn Through + '_>> {
                let end = self.0[i].len() - if self.1 && i == 1 { 100 } else { 0 };
                Ok(Box::new(&self.0[i][..end]))
            }
            fn read_at(&self, i: usize, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
                match (self.1, i) {
                    (false, 0) => Err(io::Error::other("a bad sector")),
                    _ => self.0.read_at(i, offset, buf),
                }
            }
        }
        let inputs: Vec<Input> = (0..2)
            .map(|i| Input {
                name: format!("f{i}").into_bytes(),
                len: 300_000,
            })
            .collect();
        for threads in [1, 2] {
            // Strips of 128 bytes: the files are read through beside them.
            let plan = Plan {
                slice_size: 4096,
                recovery_count: 4,
                threads,
                memory: 1024,
            };
            let files = vec![data(300_000, 5), data(300_000, 6)];
            let mut volume = std::io::Cursor::new(Vec::new());
            let short = Failing(files.clone(), true);
            match create(&inputs, &short, &plan, &mut volume) {
                Err(Error::Changed(1)) => {}
                other => panic!("{:?}", other.map(|c| c.recovery_count)),
            }
            match create(&inputs, &Failing(files, false), &plan, &mut volume) {
                Err(Error::Io(e)) => assert_eq!(e.to_string(), "a bad sector"),
                other => panic!("{:?}", other.map(|c| c.recovery_count)),
            }
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
