//! Reading a file for a verdict: hashing it (through the device's gate, in the run's slot),
//! reading it again where a mismatch needs a second look, judging what it read against its
//! tag and the damage known, and writing a tag.

use std::fs::File;
use std::sync::{Arc, Mutex};

use super::verbs::mark_contradicts;
use super::{INTERRUPTED_REPAIR, Subject, Worker, fail, unmark};
use crate::core::classify::{self, SinceDamage, Status};
use crate::core::digest::{Algo, Digests};
use crate::core::tag::{self, Damage, Tag, Timestamp};
use crate::engine::Slot;
use crate::engine::outcome::{Action, FileError, FileReport};
use crate::fs::device::Gate;
use crate::fs::hash::{self, HashError, ReadOptions};
use crate::fs::walk::Stat as Meta;
use crate::fs::xattr;

// Both sides of an Outcome carry a report: boxing the error side would only add an allocation.
#[allow(clippy::result_large_err)]
impl<'a> Worker<'a> {
    /// Reads the file once for `algos` and whatever the compat tags need; on failure, the
    /// report to give instead.
    pub(super) fn read(
        &mut self,
        mut report: FileReport,
        s: &Subject,
        algos: impl IntoIterator<Item = Algo>,
    ) -> Result<(FileReport, Digests), Option<FileReport>> {
        let compat = (!self.config.compat.is_empty()).then_some(Algo::Sha256);
        // Each asked for once, on the stack.
        let mut asked = [Algo::Sha256; Algo::COUNT];
        let mut n = 0;
        for a in algos.into_iter().chain(compat) {
            if !asked[..n].contains(&a) {
                asked[n] = a;
                n += 1;
            }
        }
        match self.hash(&mut report, s.file, &s.meta, &asked[..n]) {
            Ok(d) => Ok((report, d)),
            Err(e) => Err(e.report(report)),
        }
    }

    /// Before a file is called damaged, its data is read a second time around the page cache
    /// (its pages dropped, then read as a background scrub reads): bit rot is on the disk and
    /// reads the same again; bytes changed between the disk and the CPU (memory, a cable, a
    /// controller) do not. A second read that matches the tag makes the verdict `unstable`;
    /// one that matches neither read is `corrupt`, as it was. Damage known from before (the
    /// same damaged bytes) needs no second read. And damage known from before ends only when
    /// two reads, the second around the page cache, match the tag: a file once `unstable`
    /// is not cleared by one lucky read.
    pub(super) fn read_again(&mut self, report: &mut FileReport, tag: &Tag, s: &Subject) {
        let first = report.digest;
        let damaged = matches!(report.status, Status::Corrupt | Status::Mismatch);
        let whole_again =
            matches!(report.status, Status::Ok | Status::Touched) && report.known_damage.is_some();
        if !(damaged || whole_again) || report.known_damage.is_some_and(|k| Some(k.digest) == first)
        {
            return;
        }
        crate::fs::sys::drop_pages(s.file, 0, s.meta.size);
        let opts = ReadOptions {
            drop_cache: true,
            map: false,
            gate: None,
            cold: None,
            crowd: None,
            lend: None,
        };
        // The file's bytes are counted once, in the report and in the progress.
        let hashed = hash::hash_file(
            s.file,
            &[tag.digest.algo],
            &mut self.bufs,
            s.meta.size,
            opts,
            self.cancel,
            &std::sync::atomic::AtomicU64::new(0),
        );
        let Ok((second, n)) = hashed else { return };
        let unchanged =
            Meta::of(s.file).is_ok_and(|(now, _)| now.changes_since(&s.meta, n).is_none());
        if !unchanged {
            return;
        }
        if whole_again {
            if let Some(second) = second.get(tag.digest.algo).filter(|d| *d != tag.digest) {
                // The damage it is remembered by is the read that did not match.
                report.digest = Some(second);
                report.status = Status::Unstable;
                report.detail = Some(
                    "it was found damaged before, and of two reads now only the first matched \
                     the tag: the bytes change between the disk and the CPU (test the memory, \
                     check the cables and the disk's SMART log)"
                        .into(),
                );
            }
            return;
        }
        if second.get(tag.digest.algo) == Some(tag.digest) {
            report.status = Status::Unstable;
            report.detail = Some(crate::engine::UNSTABLE.into());
        }
    }

    /// Classifies the file against `tag` with the digest just computed, and against the
    /// damage found in it before, if any.
    pub(super) fn judge(&self, report: &mut FileReport, tag: &Tag, s: &Subject, d: &Digests) {
        let fresh = d.of(tag.digest.algo);
        report.digest = Some(fresh);
        report.status = classify::classify(
            tag,
            s.meta.size,
            s.meta.mtime,
            &fresh,
            self.config.mtime_window_ns,
        );
        if s.stored.repairing {
            report.status = classify::after_interrupted_repair(report.status);
            if report.status.is_damage() {
                report.detail = Some(INTERRUPTED_REPAIR.into());
            }
        }
        if let Some(why) = s.stored.damage.and_then(|m| mark_contradicts(&m, tag)) {
            report.malformed.push((
                crate::core::tag::names::CORRUPT,
                crate::core::tag::Malformed(why.into()),
            ));
        }
        let Some(damage) = self.known_damage(tag, s) else {
            self.written_over(report, tag, s);
            return;
        };
        let (status, since) = classify::since_damage(tag, report.status, &fresh, &damage);
        let found = crate::text::time(damage.found);
        let detail = match since {
            SinceDamage::Same if status != report.status => Some(format!(
                "still the damaged bytes found at {found}: its mtime moved since, which makes \
                 it no edit"
            )),
            SinceDamage::Same | SinceDamage::Worse => {
                Some(format!("found damaged at {found}, not yet repaired"))
            }
            SinceDamage::Edited => Some(format!(
                "edited since it was found damaged at {found}: that damage is over"
            )),
            SinceDamage::Whole => None,
        };
        report.status = status;
        report.known_damage = Some(damage);
        if report.detail.is_none() {
            report.detail = detail;
        }
        // The damaged bytes written again are still damage; other bytes written are an edit.
        if since != SinceDamage::Same {
            self.written_over(report, tag, s);
        }
    }

    /// Data that changed under its tag's mtime is an edit, not damage, where `intact watch`
    /// saw a write to the file after its tag was written: the writer put the old mtime back
    /// (`exiftool -P`, `touch -r`, `rsync -t`). Likewise data under an mtime set back within
    /// the tag's own second (`exiftool -P` keeps only whole seconds) is an edit, not an older
    /// copy restored: `older` stays for mtimes set back further.
    fn written_over(&self, report: &mut FileReport, tag: &Tag, s: &Subject) {
        let rounded =
            report.status == Status::Older && tag.mtime.is_some_and(|m| m.sec == s.meta.mtime.sec);
        if !(matches!(report.status, Status::Corrupt | Status::Mismatch) || rounded) {
            return;
        }
        // Tags say when to the second: a write in the tag's own second proves nothing.
        if let Some(at) = self
            .written_at(s)
            .filter(|at| tag.tagged.is_none_or(|t| at.div_euclid(1000) > t))
        {
            report.status = Status::Modified;
            let at = crate::text::time_ms(at);
            report.detail = Some(if rounded {
                format!(
                    "mtime set back: written at {at} (intact watch saw the write), an edit whose \
                     writer kept only its mtime's whole second"
                )
            } else {
                format!(
                    "written at {at} (intact watch saw the write): an edit, though its mtime \
                     was put back"
                )
            });
        }
    }

    /// When `intact watch` last saw a write to the file (Unix milliseconds), if it has not
    /// forgotten it (it does once it tagged the file).
    pub(super) fn written_at(&self, s: &Subject) -> Option<i64> {
        let written = self.config.written.as_ref().filter(|w| !w.is_empty())?;
        let fs = rustix::fs::fstatvfs(s.file).map_or(s.meta.dev as i64, |v| v.f_fsid as i64);
        written.get(&(fs, s.meta.ino)).copied()
    }

    /// The damage found in the file before, with its tag's algorithm: the file's own mark,
    /// else what the state database remembers of its inode and tag.
    pub(super) fn known_damage(&self, tag: &Tag, s: &Subject) -> Option<Damage> {
        s.stored
            .damage
            .filter(|m| mark_contradicts(m, tag).is_none())
            .or_else(|| {
                let known = self.config.known_damage.as_ref()?;
                let found = known.get(&(s.meta.ino, tag.digest))?;
                let fs =
                    rustix::fs::fstatvfs(s.file).map_or(s.meta.dev as i64, |v| v.f_fsid as i64);
                found.iter().find(|(f, _)| *f == fs).map(|(_, d)| *d)
            })
            .filter(|d| d.digest.algo == tag.digest.algo)
    }

    /// Reads the whole file once, feeding each of `algos`, and makes sure it did not change
    /// meanwhile: a digest of a file in flux matches no version of it.
    pub(super) fn hash(
        &mut self,
        report: &mut FileReport,
        file: &File,
        before: &Meta,
        algos: &[Algo],
    ) -> Result<Digests, NoDigest> {
        self.find_gate(before.dev);
        let gate = closed_gate(&self.gate, self.holding, before.dev);
        // A background scrub has no readers to wake.
        let cold = (!self.cold.met() && !self.config.drop_cache).then_some(self.cold);
        let mut opts = ReadOptions {
            // With O_DIRECT nothing enters the cache, and dropping would evict what the user
            // had cached.
            drop_cache: self.config.drop_cache && !crate::fs::sys::is_direct(file),
            map: !self.config.drop_cache,
            gate: gate.map(|g| &**g),
            cold,
            crowd: None,
            lend: None,
        };
        // A write in the same clock tick as a file's last change would not move its ctime.
        // So a file changed moments ago is left until that tick has passed, then looked at
        // again: from there on, any write shows in the ctime.
        let racy = racy_window(before.ctime);
        let ctime_ago = Timestamp::now().nanos() - before.ctime.nanos();
        if ctime_ago < racy {
            let wait = (racy - ctime_ago.max(0)) as u64;
            std::thread::sleep(std::time::Duration::from_nanos(wait));
            let (now, _) = Meta::of(file).map_err(|e| NoDigest::Failed(FileError::Read(e)))?;
            if let Some(change) = now.changes_since(before, before.size) {
                return Err(NoDigest::Changed(change));
            }
        }
        // A large file (the last of its batch: a batch closes at BATCH_BYTES) hashed on one
        // core lends its slot, and takes none back, so never waits for one: not even
        // holding a disk's gate.
        let crowd = self.slot.as_ref().and_then(Slot::crowd);
        // The slot, and once lent the count of the file lent for, while it is hashed.
        // (Called on the hashing thread, held by the reader's too: hence the lock.)
        let held = Mutex::new((self.slot.take(), None));
        let lend = || {
            let mut held = held.lock().unwrap_or_else(|e| e.into_inner());
            let (slot, lent) = &mut *held;
            if lent.is_none() {
                *lent = slot.as_mut().and_then(Slot::lend);
            }
        };
        opts.crowd = crowd;
        opts.lend = Some(&lend);
        let hashed = hash::hash_file(
            file,
            algos,
            &mut self.bufs,
            before.size,
            opts,
            self.cancel,
            &self.progress.bytes,
        );
        let (slot, lent) = held.into_inner().unwrap_or_else(|e| e.into_inner());
        self.slot = slot;
        drop(lent);
        let (digests, n) = hashed.map_err(|e| match e {
            HashError::Interrupted => NoDigest::Interrupted,
            HashError::Io(e) => NoDigest::Failed(FileError::Read(e)),
        })?;
        report.bytes_read = n;
        let (after, _) = Meta::of(file).map_err(|e| NoDigest::Failed(FileError::Read(e)))?;
        match after.changes_since(before, n) {
            Some(change) => Err(NoDigest::Changed(change)),
            None => Ok(digests),
        }
    }

    /// Looks up the gate of device `dev` (see [`Gates::for_dev`]), unless it is the last one.
    pub(super) fn find_gate(&mut self, dev: u64) {
        if self.config.gate_spinning && self.gate.as_ref().is_none_or(|(d, _)| *d != dev) {
            self.gate = Some((dev, self.gates.for_dev(dev)));
        }
    }

    /// Writes intact's tag for the `algo` digest and the metadata read before hashing, then
    /// the requested compat tags.
    pub(super) fn write(
        &self,
        mut report: FileReport,
        s: &Subject,
        d: &Digests,
        algo: Algo,
        action: Action,
    ) -> FileReport {
        if !self.config.write {
            return report;
        }
        let value = tag::encode(&d.of(algo), s.meta.size, s.meta.mtime, Timestamp::now().sec);
        if let Err(e) = xattr::write_intact(s.file, &value) {
            return fail(report, FileError::WriteTag(e));
        }
        // The tag now describes the data, whatever a stopped repair or damage did to it.
        if let Err(e) = unmark(s) {
            return fail(report, FileError::WriteTag(e));
        }
        report.action = Some(action);
        // The digest reported is the one now stored (a re-tag may change the algorithm).
        report.digest = Some(d.of(algo));
        self.retag_compat(report, s, d)
    }
}

/// Why reading a file gave no digest.
pub(super) enum NoDigest {
    Failed(FileError),
    Changed(String),
    Interrupted,
}

impl NoDigest {
    /// The report to give instead; `None` if the run was interrupted.
    fn report(self, mut report: FileReport) -> Option<FileReport> {
        match self {
            NoDigest::Failed(e) => Some(fail(report, e)),
            NoDigest::Changed(what) => {
                report.status = Status::Changed;
                report.detail = Some(what);
                Some(report)
            }
            NoDigest::Interrupted => None,
        }
    }
}

/// The gate found for device `dev`, while it is closed and not `held` by this worker.
pub(super) fn closed_gate(
    found: &Option<(u64, Option<Arc<Gate>>)>,
    held: Option<u64>,
    dev: u64,
) -> Option<&Arc<Gate>> {
    match found {
        Some((d, Some(gate))) if *d == dev && held != Some(dev) && !gate.is_open() => Some(gate),
        _ => None,
    }
}

/// How long after its last change a file must be left alone before its digest can be
/// trusted to tell a later write apart. The ctime, which no program can set, tells the
/// file system's granularity: a whole second (one chance in a billion otherwise) means a
/// coarse one.
pub(super) fn racy_window(ctime: Timestamp) -> i128 {
    if ctime.nsec == 0 { COARSE_NS } else { RACY_NS }
}

/// How coarse file timestamps can be: kernels before 6.13 stamp files from a clock that
/// moves in ticks of up to 10 ms ("racy" files, as git calls them, changed less than this
/// before being read, are waited for).
pub(super) const RACY_NS: i128 = 20_000_000;

/// How coarse timestamps are on file systems that keep whole seconds (ext4 with 128-byte
/// inodes, ext3) or even two (FAT): a write within that of the last one may not move the
/// mtime at all, so a tag taken then could later call an edit corruption.
pub(super) const COARSE_NS: i128 = 2_000_000_000;
