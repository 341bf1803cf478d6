//! Opening a file for its worker: beneath its root, never through a symlink, with what
//! `fstat` said of it; ahead of the worker where the device wants many reads in flight.

use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::Arc;

use crate::engine::{Config, Held, OpenFiles, Work};
use crate::fs::anchor::Anchor;
use crate::fs::atomic;
use crate::fs::device::Gates;
use crate::fs::hash::{self, AlignedBuf};
use crate::fs::walk::{Entry, Stat as Meta};

/// A file opened (beneath its root, never through a symlink) with what `fstat` said of it:
/// its state before any read, and whether it is a regular file; and, opened ahead of its
/// worker, its place among the files held open.
pub(in crate::engine) struct Opened {
    pub(super) file: File,
    pub(super) meta: io::Result<(Meta, bool)>,
    pub(super) held: Option<Held>,
}

/// Read-ahead reads this much of a file at most: the kernel's own read-ahead (on the same open
/// file) and the mapped windows' filling keep a larger file streaming once it is hashed.
pub(in crate::engine) const AHEAD: usize = 256 << 10;

impl Opened {
    /// Opens `path`; what the walk's `stat` said of it (`walked`) stands for an `fstat` where
    /// the data is read and nothing is written: the `fstat` after reading then tells whether
    /// the file is still the one walked, unchanged.
    pub(super) fn open(
        config: &Config,
        anchor: &Anchor,
        path: &Path,
        walked: Option<Meta>,
    ) -> io::Result<Opened> {
        let direct = config.work.reads_data() && config.drop_cache;
        let file = anchor.open(path, direct)?;
        let meta = match walked.filter(|_| config.work == Work::Check) {
            Some(meta) => Ok((meta, true)),
            None => Meta::of(&file),
        };
        Ok(Opened {
            file,
            meta,
            held: None,
        })
    }

    /// Opens the file of `entry` ahead of its worker and, on a device that wants many reads
    /// in flight, reads the start of it into the page cache (into `scratch`, up to [`AHEAD`]
    /// bytes) unless it is there already: many such readers keep the device's queue full
    /// while the workers hash. (`posix_fadvise(WILLNEED)` would be the hint made for this,
    /// but measured on a virtio disk it blocks about as long as the read it asks for, one
    /// file at a time.) `None` where the worker is to open the file itself: names intact's
    /// temp files have, a run past its deadline, a process out of descriptors.
    pub(in crate::engine) fn ahead(
        config: &Config,
        entry: &Entry,
        anchors: &[Anchor],
        gates: &Gates,
        scratch: &mut AlignedBuf,
        open_files: &Arc<OpenFiles>,
    ) -> Option<io::Result<Opened>> {
        let Entry::File {
            path, root, stat, ..
        } = entry
        else {
            return None;
        };
        if config.past_deadline() || path.file_name().and_then(atomic::temp_pid).is_some() {
            return None;
        }
        let held = Held::take(open_files)?;
        let opened = match Opened::open(config, &anchors[*root], path, *stat) {
            Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                return None;
            }
            other => other.map(|o| Opened {
                held: Some(held),
                ..o
            }),
        };
        if let Ok(Opened {
            file,
            meta: Ok((meta, true)),
            ..
        }) = &opened
            && config.work.reads_data()
            // A background scrub reads one request at a time.
            && !config.drop_cache
            && meta.size > 0
        {
            let gate = config
                .gate_spinning
                .then(|| gates.for_dev(meta.dev))
                .flatten();
            let buf = scratch.as_mut_slice();
            let cached = || {
                let mut byte = [0u8];
                matches!(
                    crate::fs::sys::read_cached(file, &mut byte, 0, false),
                    Some(Ok(1))
                )
            };
            match gate {
                // A device that claims to spin is judged by how it answers first reads made
                // alone; until then, and on a disk that spins, workers read one file at a time.
                Some(gate) if gate.probing() && !cached() => {
                    let _pass = gate.enter();
                    gate.probe_file(file, meta.size);
                }
                Some(_) => {}
                None if meta.size < hash::OVERLAP_MIN && !cached() => {
                    let len = buf.len().min(meta.size as usize);
                    // An error here is the worker's to meet and report.
                    let _ = rustix::io::pread(file, &mut buf[..len], 0);
                }
                None => {}
            }
        }
        Some(opened)
    }
}
