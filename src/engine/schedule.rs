//! The engine's shares of the machine: slots to hash (a core each, lent while a large file
//! is hashed so that several large files share the cores) and files held open beyond the
//! thread that opened them. Plain counters and channels, tested here without clocks: who
//! may go on is decided by counts, never by how long anything took.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crossbeam_channel::{Receiver, Sender, bounded};

/// Files held open beyond the thread that opened them at once (read ahead for the workers,
/// or left open for the sink): half of what the process may open (the workers, the walk,
/// the state database and the sinks need the rest). Past it, workers open files themselves
/// and sinks open them again; without it, readers far ahead could leave a worker without a
/// descriptor.
#[derive(Debug)]
pub(crate) struct OpenFiles {
    held: AtomicUsize,
    most: usize,
    /// The bytes of small files read ahead for the sink with them (see [`Held::carry`]).
    carried: AtomicUsize,
    /// Their buffers, given back by the sink.
    spare: (Sender<Vec<u8>>, Receiver<Vec<u8>>),
}

/// The most buffers kept for files read ahead (of up to 64 KiB each).
const SPARE_BUFFERS: usize = 64;

/// The most bytes of the files held open that are carried read at once: the window of files
/// not yet taken by the sink would otherwise hold up to 64 batches of a mebibyte.
const CARRIED_MOST: usize = 8 << 20;

impl OpenFiles {
    pub(crate) fn new() -> Self {
        let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
        OpenFiles {
            held: AtomicUsize::new(0),
            most: limit.map_or(usize::MAX, |n| (n / 2) as usize),
            carried: AtomicUsize::new(0),
            spare: bounded(SPARE_BUFFERS),
        }
    }

    /// Whether one more file may be held open.
    fn take(&self) -> bool {
        if self.held.fetch_add(1, Ordering::Relaxed) < self.most {
            return true;
        }
        self.give();
        false
    }

    fn give(&self) {
        self.held.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One of the files counted by [`OpenFiles`], given back when dropped.
#[derive(Debug)]
pub(crate) struct Held(Arc<OpenFiles>);

impl Held {
    /// A place among the files held open, if there is one.
    pub(crate) fn take(open: &Arc<OpenFiles>) -> Option<Held> {
        open.take().then(|| Held(open.clone()))
    }

    /// Room for `n` bytes of the file read ahead, within [`CARRIED_MOST`]: a buffer from
    /// those the sink gave back, if any.
    pub(crate) fn carry(&self, n: usize) -> Option<Carried> {
        let open = &self.0;
        if open.carried.fetch_add(n, Ordering::Relaxed) + n > CARRIED_MOST {
            open.carried.fetch_sub(n, Ordering::Relaxed);
            return None;
        }
        let mut data = open.spare.1.try_recv().unwrap_or_default();
        data.clear();
        data.resize(n, 0);
        Some(Carried {
            data,
            open: open.clone(),
        })
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.0.give();
    }
}

/// Bytes of a file read ahead for the sink, counted against [`CARRIED_MOST`] until dropped.
/// The buffer then goes back for another file: freed by the sink's thread, each one took a
/// lock of the allocator's arena of the worker that allocated it (the archive writer slept
/// on those locks about 75 times in an archive of 20,000 small files).
#[derive(Debug)]
pub struct Carried {
    data: Vec<u8>,
    open: Arc<OpenFiles>,
}

// Its bytes, never its length: what is counted against the most is what is given back.
impl std::ops::Deref for Carried {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.data
    }
}

impl std::ops::DerefMut for Carried {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.data
    }
}

impl Drop for Carried {
    fn drop(&mut self) {
        let data = std::mem::take(&mut self.data);
        self.open.carried.fetch_sub(data.len(), Ordering::Relaxed);
        let _ = self.open.spare.0.try_send(data);
    }
}

/// The right to hash: `threads` workers at a time, while spare workers wait. SHA-256 of one
/// file runs on one core, so a few large files on as many cores end with one of them hashed
/// alone (five of 800 MiB on two cores: three files' time for two and a half files' work);
/// a worker about to hash a large file hands its slot on to a spare one, and the large files
/// share the cores until they are done. Only where the workers are as many as the cores: a
/// run asked for fewer threads (`--threads`, background) uses no more cores than that.
pub(crate) struct Slots {
    free: Receiver<()>,
    back: Sender<()>,
    /// Workers beyond `threads`.
    pub(crate) spare: usize,
    /// Large files being hashed by workers that lent their slot.
    lent: AtomicUsize,
}

impl Slots {
    pub(crate) fn new(threads: usize) -> Slots {
        // Up to three large files per core at once: five of 800 MiB on two cores all run.
        let spare = if threads >= crate::fs::sys::cores() {
            2 * threads
        } else {
            0
        };
        Slots::with(threads, spare)
    }

    /// `threads` slots, and `spare` workers beyond them.
    fn with(threads: usize, spare: usize) -> Slots {
        let (back, free) = bounded(threads);
        for _ in 0..threads {
            back.send(()).expect("room for every slot");
        }
        Slots {
            free,
            back,
            spare,
            lent: AtomicUsize::new(0),
        }
    }

    /// Waits for a slot.
    pub(crate) fn take(&self) -> Slot<'_> {
        let _ = self.free.recv();
        Slot(Some(self))
    }
}

/// A slot of [`Slots`], given back when dropped or lent.
pub(crate) struct Slot<'s>(Option<&'s Slots>);

impl<'s> Slot<'s> {
    /// Whether it is still this worker's (not lent).
    pub(crate) fn held(&self) -> bool {
        self.0.is_some()
    }

    /// The number of large files hashed by workers that lent their slot (see
    /// `ReadOptions::crowd`); `None` without spare workers, where no slot is lent.
    pub(crate) fn crowd(&self) -> Option<&'s AtomicUsize> {
        self.0
            .filter(|slots| slots.spare > 0)
            .map(|slots| &slots.lent)
    }

    /// Hands the slot on to a spare worker, if there are any, for the rest of the batch,
    /// to hash a large file meanwhile.
    pub(crate) fn lend(&mut self) -> Option<Lent<'s>> {
        let slots = self.0.take_if(|slots| slots.spare > 0)?;
        give_back(slots);
        slots.lent.fetch_add(1, Ordering::Relaxed);
        Some(Lent(slots))
    }
}

/// A large file hashed by a worker that lent its slot, counted while it lives.
pub(crate) struct Lent<'s>(&'s Slots);

impl Drop for Lent<'_> {
    fn drop(&mut self) {
        self.0.lent.fetch_sub(1, Ordering::Relaxed);
    }
}

fn give_back(slots: &Slots) {
    let _ = slots.back.try_send(());
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.take().map(give_back);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A slot lent for a large file goes to a spare worker at once, is counted among the
    /// crowd while the file is hashed, and a held slot comes back when its worker drops it.
    #[test]
    fn a_lent_slot_lets_a_spare_worker_hash_meanwhile() {
        let slots = Slots::with(1, 1);
        let mut first = slots.take();
        assert!(first.held());
        assert!(slots.free.is_empty(), "one slot, taken");
        let crowd = first.crowd().expect("spare workers: the crowd is counted");
        let lent = first.lend().expect("a spare worker to lend it to");
        assert!(!first.held());
        assert_eq!(crowd.load(Ordering::Relaxed), 1);
        // The spare worker takes it without waiting: it is free again.
        let second = slots.take();
        assert!(second.held());
        drop(lent);
        assert_eq!(crowd.load(Ordering::Relaxed), 0);
        drop(first);
        assert!(slots.free.is_empty(), "a lent slot is not given back twice");
        drop(second);
        assert_eq!(slots.free.len(), 1);
    }

    /// Without spare workers (fewer threads than cores asked for), nothing is lent: a run
    /// uses no more cores than it was given.
    #[test]
    fn without_spare_workers_nothing_is_lent() {
        let slots = Slots::with(2, 0);
        let mut slot = slots.take();
        assert!(slot.crowd().is_none());
        assert!(slot.lend().is_none());
        assert!(slot.held());
    }

    /// Files are held open up to the limit, and a place comes back when one is let go.
    #[test]
    fn files_held_open_stay_within_the_limit() {
        let open = Arc::new(OpenFiles {
            held: AtomicUsize::new(0),
            most: 2,
            carried: AtomicUsize::new(0),
            spare: bounded(1),
        });
        let a = Held::take(&open).expect("room");
        let _b = Held::take(&open).expect("room");
        assert!(Held::take(&open).is_none(), "past the limit");
        assert_eq!(
            open.held.load(Ordering::Relaxed),
            2,
            "a refusal takes nothing"
        );
        drop(a);
        assert!(Held::take(&open).is_some());
    }

    /// The bytes carried read stay within their most, and come back (with their buffer) when
    /// dropped.
    #[test]
    fn bytes_carried_read_stay_within_the_limit() {
        let open = Arc::new(OpenFiles::new());
        let (a, b) = (
            Held::take(&open).expect("room"),
            Held::take(&open).expect("room"),
        );
        let x = a.carry(CARRIED_MOST - 10).expect("room");
        assert_eq!(x.len(), CARRIED_MOST - 10);
        assert!(b.carry(11).is_none(), "past the most");
        let y = b.carry(10).expect("room");
        assert_eq!(open.carried.load(Ordering::Relaxed), CARRIED_MOST);
        drop(x);
        assert_eq!(open.carried.load(Ordering::Relaxed), 10, "given back");
        let z = b.carry(100).expect("room");
        assert!(
            z.data.capacity() >= CARRIED_MOST - 10,
            "the buffer given back, again"
        );
        assert!(z.iter().all(|&b| b == 0));
        drop((y, z));
        assert_eq!(open.carried.load(Ordering::Relaxed), 0);
    }
}
