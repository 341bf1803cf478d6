//! Hashing large files through memory maps, without dying when one shrinks or a disk fails.
//!
//! `read()` copies every byte out of the page cache; for BLAKE3 on all cores that copy costs
//! about as much as the hashing. A map avoids it, but touching a mapped page beyond the end
//! of a file that was truncated meanwhile, or one the device cannot read, raises SIGBUS,
//! which kills b3sum. intact installs a SIGBUS handler that, for an address inside one of its
//! own maps, puts a page of zeros in place of the vanished one and notes the fault. The hash
//! then runs to the end; the caller reads the window again with `pread` to tell an I/O error
//! from a truncation (which the size check after every hash reports as `changed-while-read`).
//! A SIGBUS anywhere else gets the default action, as if intact had no handler.
//!
//! Maps are filled with `madvise(MADV_POPULATE_READ)`, never `MAP_POPULATE`: on a read error
//! `MAP_POPULATE` retries the failing read forever (seen on Linux 6.18, under FUSE and under
//! ext4 on a failing block device), while the madvise returns an error at once.

#![allow(unsafe_code)]

use std::fs::File;
use std::os::fd::AsRawFd;
use std::ptr;
use std::sync::Once;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::fs::sys;

/// How much of a file is mapped at a time, shared among the files spread over every core at
/// once. A worker holds two windows in its RSS (one hashed, the one before until the helper
/// unmaps it) and maps a third ahead. Spread over every core, each window costs a hand-over
/// to the pool: on one 4 GiB file (AMD EPYC with AVX-512, medians of 15) x0.95 b3sum at
/// 16 MiB and 42 MiB RSS, x0.86 at 8 MiB; 32 MiB gained 2% more for 75 MiB. Five 800 MiB
/// files, two at a time: 42 MiB shared, 58-73 MiB not, as fast. Large BLAKE3 files are
/// mapped in parts instead, one a thread of the pool, twice this in all (`fs::hash::in_parts`).
pub const WINDOW: usize = 16 << 20;

/// Maps being hashed, by address range; a slot is free while `start` is 0.
struct Slot {
    start: AtomicUsize,
    len: AtomicUsize,
    faulted: AtomicBool,
}

const SLOTS: usize = 256;
static REGISTRY: [Slot; SLOTS] = [const {
    Slot {
        start: AtomicUsize::new(0),
        len: AtomicUsize::new(0),
        faulted: AtomicBool::new(false),
    }
}; SLOTS];
static PAGE: AtomicUsize = AtomicUsize::new(4096);
static INSTALL: Once = Once::new();
static INSTALLED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigbus(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // Only async-signal-safe work here: atomics and raw syscalls.
    // SAFETY: the kernel passes a valid siginfo_t to an SA_SIGINFO handler.
    let addr = unsafe { (*info).si_addr() } as usize;
    let page = PAGE.load(Ordering::Relaxed);
    for slot in &REGISTRY {
        let start = slot.start.load(Ordering::Acquire);
        if start != 0 && addr >= start && addr - start < slot.len.load(Ordering::Acquire) {
            let at = addr & !(page - 1);
            // SAFETY: replaces one page of a map this module owns with anonymous zeros.
            let p = unsafe {
                libc::mmap(
                    at as *mut libc::c_void,
                    page,
                    libc::PROT_READ,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            if p != libc::MAP_FAILED {
                slot.faulted.store(true, Ordering::Release);
                return;
            }
        }
    }
    // Not ours: restore the default action; the faulting access repeats and ends the process
    // as it would have without this handler.
    // SAFETY: resetting a signal disposition is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGBUS, libc::SIG_DFL);
    }
}

fn install() -> bool {
    INSTALL.call_once(|| {
        // SAFETY: sysconf and sigaction with a handler that only does async-signal-safe work.
        unsafe {
            let page = libc::sysconf(libc::_SC_PAGESIZE);
            if page > 0 {
                PAGE.store(page as usize, Ordering::Relaxed);
            }
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_sigbus as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO;
            libc::sigemptyset(&mut sa.sa_mask);
            INSTALLED.store(
                libc::sigaction(libc::SIGBUS, &sa, ptr::null_mut()) == 0,
                Ordering::Release,
            );
        }
    });
    INSTALLED.load(Ordering::Acquire)
}

/// A read-only map of part of a file, registered with the SIGBUS handler while it lives.
pub struct Map {
    addr: *mut libc::c_void,
    len: usize,
    slot: &'static Slot,
}

impl Map {
    /// Maps `len` bytes of `file` from `offset` (a multiple of the page size), without
    /// reading anything yet. `None` when mapping is not possible here (no handler, no free
    /// slot, or the file system refuses): the caller reads instead.
    pub fn new(file: &File, offset: u64, len: usize) -> Option<Map> {
        if len == 0 || !install() {
            return None;
        }
        let slot = REGISTRY.iter().find(|s| {
            s.start
                .compare_exchange(0, usize::MAX, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        })?;
        // SAFETY: a fresh shared read-only map of an open file; unmapped in Drop.
        let addr = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                offset as libc::off_t,
            )
        };
        if addr == libc::MAP_FAILED {
            slot.start.store(0, Ordering::Release);
            return None;
        }
        slot.faulted.store(false, Ordering::Relaxed);
        slot.len.store(len, Ordering::Release);
        slot.start.store(addr as usize, Ordering::Release);
        Some(Map { addr, len, slot })
    }

    /// Reads the whole map in and fills its page tables: for data not cached, read ahead of
    /// the hashing on another thread. `false` if some page could not be read in (a device
    /// error, or the file shrank): the caller reads the window with `pread` instead, which
    /// says which. Where the kernel cannot populate (before Linux 5.14), pages are faulted in
    /// as they are hashed.
    pub fn populate(&self) -> bool {
        // SAFETY: the map is live for the life of self.
        match unsafe { crate::fs::sys::populate_read(self.addr, self.len) } {
            Ok(()) => true,
            Err(e) => e.raw_os_error() == Some(libc::EINVAL),
        }
    }

    /// The mapped bytes. Pages past a concurrent truncation read as zeros; check
    /// [`Map::faulted`] after use.
    ///
    /// # Safety
    ///
    /// The slice does not hold what a `&[u8]` promises: the file's owner (root reads other
    /// users' files) may write it through `write(2)` or a shared map of their own at any
    /// moment, even between two reads of one byte. The caller may only hand the bytes to a
    /// computation whose branches and memory accesses do not depend on the data (a digest:
    /// SHA-2, BLAKE3, MD5 and SHA-1 are built so, to be constant-time), whose result is then
    /// at worst a digest of no version of the file, and must throw that result away when the
    /// file changed while it was read (the engine compares size, mtime and ctime after each
    /// hash: `changed-while-read`).
    pub unsafe fn bytes(&self) -> &[u8] {
        // SAFETY: addr..addr+len is mapped readable, by this value alone, until Drop: the
        // owner's writes change the pages' bytes but cannot move, unmap or shorten the map (a
        // truncation faults, and the handler puts zeros in place), so every address stays
        // readable. What the bytes may be is the caller's contract above.
        unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.len) }
    }

    /// Whether part of the map vanished (the file shrank) while it was read.
    pub fn faulted(&self) -> bool {
        self.slot.faulted.load(Ordering::Acquire)
    }

    /// Whether the map's data is in the page cache, so reading it will not wait for the disk.
    /// One page per MiB is sampled: asking about every page costs more kernel time than a
    /// quarter of the hashing, and a large file is rarely cached in patches finer than that.
    pub fn resident(&self) -> bool {
        const STRIDE: usize = 1 << 20;
        // SAFETY: page-aligned offsets inside the live map.
        (0..self.len)
            .step_by(STRIDE)
            .all(|off| unsafe { sys::page_resident(self.addr.byte_add(off)) })
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        self.slot.start.store(usize::MAX, Ordering::Release);
        // SAFETY: unmapping what new() mapped; zero pages put in by the handler go with it.
        unsafe {
            libc::munmap(self.addr, self.len);
        }
        self.slot.len.store(0, Ordering::Release);
        self.slot.start.store(0, Ordering::Release);
    }
}

// SAFETY: the map is read-only memory owned by this value.
unsafe impl Send for Map {}
// SAFETY: only shared reads through &self.
unsafe impl Sync for Map {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_truncated_map_reads_zeros_instead_of_killing_the_process() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let mut f = File::create(&path).unwrap();
        f.write_all(&vec![7u8; 1 << 20]).unwrap();
        let file = File::open(&path).unwrap();
        let map = Map::new(&file, 0, 1 << 20).unwrap();
        assert!(map.populate());
        // SAFETY (here and below): only this test writes the file, before or after reading.
        assert_eq!(unsafe { map.bytes() }[(1 << 20) - 1], 7);
        assert!(!map.faulted());
        f.set_len(4096).unwrap();
        // Without the handler this read would be fatal.
        let sum: u64 = unsafe { map.bytes() }.iter().map(|&b| b as u64).sum();
        assert_eq!(sum, 7 * 4096);
        assert!(map.faulted());
        drop(map);
        // The slot is free and clean for the next map.
        let again = Map::new(&file, 0, 4096).unwrap();
        assert!(!again.faulted());
        assert!(again.resident());
    }
}
