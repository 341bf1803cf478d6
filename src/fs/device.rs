//! Spinning disks want one reader at a time: parallel reads of different files turn each
//! sequential stream into seeks. But data already in the page cache costs no seek, and
//! hashing it is CPU work that should use every core.
//!
//! So intact runs all its workers everywhere and puts a [`Gate`] in front of each rotational
//! device: a worker first reads with `RWF_NOWAIT`, which succeeds only from the page cache;
//! when that would block, it takes the device's gate and keeps it until the file is read.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crossbeam_channel::{Receiver, Sender, bounded};

use crate::fs::sys;

/// A one-at-a-time pass for a device's uncached reads. Unlike a `MutexGuard`, a [`Pass`] may
/// be taken on one thread and returned on another (the overlapped reader's).
#[derive(Debug)]
pub struct Gate {
    give: Sender<()>,
    take: Receiver<()>,
}

impl Gate {
    /// A gate with its pass free.
    pub fn new() -> Self {
        let (give, take) = bounded(1);
        give.send(()).expect("room for the pass");
        Gate { give, take }
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

/// One gate per rotational device, found lazily as files on it are met.
#[derive(Debug, Default)]
pub struct Gates {
    by_dev: Mutex<HashMap<u64, Option<Arc<Gate>>>>,
}

impl Gates {
    /// The gate for device `dev`, or `None` if it does not rotate.
    pub fn for_dev(&self, dev: u64) -> Option<Arc<Gate>> {
        let mut map = self.by_dev.lock().unwrap_or_else(|e| e.into_inner());
        map.entry(dev)
            .or_insert_with(|| {
                (sys::is_rotational(dev) == Some(true)).then(|| Arc::new(Gate::new()))
            })
            .clone()
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
}
