//! What `create` holds for a file whose slices are larger than a first batch (a file of more
//! than 32 GiB in 2,000 slices), counted by the allocator: strips of its slices and pieces of
//! what streams by, never a whole slice, however large the slices are. Machine-independent:
//! the count is of bytes allocated, not of pages a kernel happened to keep.

#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::sync::atomic::{AtomicUsize, Ordering};

use intact_par2::{FIRST_BATCH, Files, Input, Plan, Through, create};

/// The system's allocator, counting the bytes allocated now and at most.
struct Counting;

static NOW: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is passed on to the system allocator as it came; the counts are
// atomics, touched after the allocation and before the deallocation.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is the system allocator's.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = NOW.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        NOW.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: `p` came from `alloc` with this layout.
        unsafe { System.dealloc(p, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Byte `at` of the made-up file: not zeros, not periodic within a slice.
fn byte(at: u64) -> u8 {
    (at.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as u8
}

/// One made-up file of `len` bytes, read from its start or at an offset.
struct Made {
    len: u64,
}

struct Reader {
    at: u64,
    len: u64,
}

impl Read for Reader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = buf.len().min((self.len - self.at) as usize);
        for (i, b) in buf[..n].iter_mut().enumerate() {
            *b = byte(self.at + i as u64);
        }
        self.at += n as u64;
        Ok(n)
    }
}

impl Through for Reader {}

impl Files for Made {
    fn open(&self, _: usize) -> io::Result<Box<dyn Through + '_>> {
        Ok(Box::new(Reader {
            at: 0,
            len: self.len,
        }))
    }

    fn read_at(&self, _: usize, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        Reader {
            at: offset.min(self.len),
            len: self.len,
        }
        .read(buf)
    }
}

/// A volume that keeps nothing: only where it is.
struct Nowhere(u64);

impl Write for Nowhere {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0 += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Seek for Nowhere {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        if let SeekFrom::Start(at) = to {
            self.0 = at;
        }
        Ok(self.0)
    }
}

#[test]
fn slices_larger_than_a_first_batch_are_never_held_whole() {
    // Three slices of 64 MiB and a bit: holding two at a time, as the first pass does with
    // slices up to 16 MiB, would take 128 MiB and more.
    let slice = 4 * FIRST_BATCH as u64;
    let len = 3 * slice - 1000;
    let plan = Plan {
        slice_size: slice,
        recovery_count: 2,
        threads: 2,
        memory: 8 << 20,
    };
    let input = Input {
        name: b"huge".to_vec(),
        len,
    };
    let before = NOW.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let created = create(&[input], &Made { len }, &plan, &mut Nowhere(0)).unwrap();
    let held = PEAK.load(Ordering::Relaxed) - before;
    assert_eq!(created.files.len(), 1);
    assert_eq!(created.files[0].slices.len(), 3);
    assert!(
        held < 32 << 20,
        "{} MiB held for slices of {} MiB",
        held >> 20,
        slice >> 20
    );
}
