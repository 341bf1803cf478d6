//! How to read each device: spinning disks want one reader at a time (parallel reads of
//! different files turn each sequential stream into seeks); everything else wants many reads
//! in flight (an SSD, NVMe or virtio queue is only full with a deep queue).
//!
//! The kernel's `rotational` flag is not trusted alone: many virtual, USB and SAN devices
//! claim to spin whatever their media. A device that claims it gets a [`Gate`]: a worker
//! first reads with `RWF_NOWAIT`, which succeeds only from the page cache; when that would
//! block, it takes the gate and keeps it until the file is read. Meanwhile the gate times
//! the first byte of each uncached file. The rule: after [`PROBES`] such reads, if their
//! median is under [`SEEK`], the device cannot be seeking (a disk at 7,200 rpm needs 4 ms
//! on average for half a turn alone) and the gate stands open for the rest of the run.
use std::collections::HashMap;
use std::fs::File;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, bounded};

use crate::fs::sys;

/// A one-at-a-time pass for a device's uncached reads. Unlike a `MutexGuard`, a [`Pass`] may
/// be taken on one thread and returned on another (the overlapped reader's).
#[derive(Debug)]
pub struct Gate {
    give: Sender<()>,
    take: Receiver<()>,
    /// First-byte latencies of uncached files, until the device is judged.
    probes: Mutex<Vec<Duration>>,
    /// The judgement, once made: [`PROBING`], [`NO_SEEK`] (no reader waits here any more)
    /// or [`SEEKS`].
    verdict: AtomicU8,
}

/// How many first reads judge a device that claims to spin.
pub const PROBES: usize = 16;
/// A median first-byte latency below this cannot come from a disk that seeks.
pub const SEEK: Duration = Duration::from_millis(1);
// A gate's verdict.
const PROBING: u8 = 0;
const NO_SEEK: u8 = 1;
const SEEKS: u8 = 2;

/// A file gives one probe per this much of its size (up to [`PROBES`], spread over it): a
/// tree of a few large files is judged by its first one.
const PROBE_SPAN: u64 = 16 << 20;

impl Gate {
    /// A gate with its pass free.
    pub fn new() -> Self {
        let (give, take) = bounded(1);
        give.send(()).expect("room for the pass");
        Gate {
            give,
            take,
            probes: Mutex::new(Vec::with_capacity(PROBES)),
            verdict: AtomicU8::new(PROBING),
        }
    }

    /// Whether the device has shown that it does not seek.
    pub fn is_open(&self) -> bool {
        self.verdict.load(Ordering::Relaxed) == NO_SEEK
    }

    /// Whether the device was judged, and found to seek: it is read one file at a time, in
    /// the order the files lie on it.
    pub fn seeking(&self) -> bool {
        self.verdict.load(Ordering::Relaxed) == SEEKS
    }

    /// Whether the device is still being judged: the caller holding the pass should time the
    /// first byte of the file it is about to read and [`Gate::probe`] it.
    pub fn probing(&self) -> bool {
        self.verdict.load(Ordering::Relaxed) == PROBING
    }

    /// Records the first-byte latency of one uncached file (read alone, behind the gate);
    /// the [`PROBES`]th decides.
    pub fn probe(&self, latency: Duration) {
        let Ok(mut probes) = self.probes.lock() else {
            return;
        };
        if probes.len() >= PROBES {
            return;
        }
        probes.push(latency);
        if probes.len() == PROBES {
            probes.sort_unstable();
            let verdict = if probes[PROBES / 2] < SEEK {
                NO_SEEK
            } else {
                SEEKS
            };
            self.verdict.store(verdict, Ordering::Relaxed);
        }
    }

    /// Times first reads of `file`, which is not in the page cache, while the device is being
    /// judged: 4 KiB at one offset per [`PROBE_SPAN`] of its `size`, spread over it. The
    /// caller holds the pass: each read is made alone.
    pub fn probe_file(&self, file: &File, size: u64) {
        // Aligned, for a file opened with O_DIRECT.
        #[repr(C, align(4096))]
        struct Page([u8; 4096]);
        let mut page = Page([0; 4096]);
        let probes = (size / PROBE_SPAN).clamp(1, PROBES as u64);
        for i in 0..probes {
            if !self.probing() {
                return;
            }
            let at = (size / probes * i) & !4095;
            let start = Instant::now();
            if rustix::io::pread(file, &mut page.0, at).is_ok_and(|n| n > 0) {
                self.probe(start.elapsed());
            }
        }
    }

    /// Waits for the pass.
    pub fn enter(&self) -> Pass<'_> {
        self.take.recv().expect("the gate holds its own sender");
        Pass(self)
    }
}

impl Default for Gate {
    fn default() -> Self {
        Gate::new()
    }
}

/// Holding this means reading from the device; dropping it lets the next reader in.
#[derive(Debug)]
pub struct Pass<'a>(&'a Gate);

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        let _ = self.0.give.send(());
    }
}

/// The order to read files in from a disk that seeks: by where their data starts on it
/// (`blocks`, from [`crate::fs::sys::first_block`]), those whose place is not known last;
/// ties and unknowns keep their order. A sweep across the disk instead of a seek back and
/// forth between files that sort by name but lie apart.
pub fn physical_order(blocks: &[Option<u64>]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..blocks.len()).collect();
    order.sort_by_key(|&i| (blocks[i].is_none(), blocks[i]));
    order
}

/// Whether any read has met data that is not in the page cache: until one has, reading ahead
/// is not worth its cost. Meeting some wakes whoever waits on [`Cold::new`]'s receiver.
#[derive(Debug)]
pub struct Cold {
    met: AtomicBool,
    /// Dropped to wake the waiters.
    wake: Mutex<Option<Sender<()>>>,
}

impl Cold {
    /// Nothing met yet, and what to wait on until something is.
    pub fn new() -> (Cold, Receiver<()>) {
        let (tx, rx) = bounded(0);
        let cold = Cold {
            met: AtomicBool::new(false),
            wake: Mutex::new(Some(tx)),
        };
        (cold, rx)
    }

    /// Whether a read has met cold data.
    pub fn met(&self) -> bool {
        self.met.load(Ordering::Relaxed)
    }

    /// A read had to wait for a device.
    pub fn meet(&self) {
        if !self.met.swap(true, Ordering::Relaxed) {
            drop(self.wake.lock().unwrap_or_else(|e| e.into_inner()).take());
        }
    }
}

/// One gate per device that claims to rotate, found lazily as files on it are met.
#[derive(Debug, Default)]
pub struct Gates {
    by_dev: Mutex<HashMap<u64, Option<Arc<Gate>>>>,
}

impl Gates {
    /// The gate for device `dev` while it is closed, or `None` if the device does not claim
    /// to rotate or has shown that it does not seek.
    pub fn for_dev(&self, dev: u64) -> Option<Arc<Gate>> {
        let mut map = self.by_dev.lock().unwrap_or_else(|e| e.into_inner());
        map.entry(dev)
            .or_insert_with(|| {
                (sys::is_rotational(dev) == Some(true)).then(|| Arc::new(Gate::new()))
            })
            .clone()
            .filter(|g| !g.is_open())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_pass_at_a_time_and_passes_travel() {
        let gate = Gate::new();
        let pass = gate.enter();
        assert!(gate.take.try_recv().is_err(), "a second reader got in");
        std::thread::scope(|s| {
            s.spawn(move || drop(pass));
        });
        drop(gate.enter());
    }

    #[test]
    fn files_are_read_in_the_order_they_lie_on_the_disk() {
        // Walk order: names. Where the data lies: elsewhere. Unknown places go last.
        let blocks = [
            Some(9 << 20),
            None,
            Some(1 << 20),
            Some(5 << 20),
            None,
            Some(1 << 20),
            Some(0),
        ];
        assert_eq!(physical_order(&blocks), [6, 2, 5, 3, 0, 1, 4]);
        assert!(physical_order(&[]).is_empty());
        assert_eq!(physical_order(&[None, None]), [0, 1]);
    }

    #[test]
    fn a_device_that_answers_fast_opens_its_gate_and_a_slow_one_does_not() {
        let fast = Gate::new();
        for i in 0..PROBES {
            assert!(fast.probing());
            // A few slow answers among fast ones do not decide: the median does.
            let ms = if i % 4 == 0 { 9 } else { 0 };
            fast.probe(Duration::from_millis(ms) + Duration::from_micros(80));
        }
        assert!(fast.is_open() && !fast.probing() && !fast.seeking());

        let slow = Gate::new();
        assert!(!slow.seeking(), "judged before any probe");
        for i in 0..PROBES {
            let ms = if i % 4 == 0 { 0 } else { 6 };
            slow.probe(Duration::from_millis(ms) + Duration::from_micros(200));
        }
        assert!(!slow.is_open() && !slow.probing() && slow.seeking());
        // Later answers change nothing: the decision is made once, on reads made alone.
        for _ in 0..PROBES {
            slow.probe(Duration::ZERO);
        }
        assert!(!slow.is_open());
    }
}
