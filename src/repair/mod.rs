//! Repair: damaged files get their original bytes back from good copies.
//!
//! A check finds the damaged files; each one's tag says which bytes it should hold. Sources
//! ([`source`]: archives, backup trees, parity stores, PAR2 sets) are searched by digest, not
//! by name, so a file moved or renamed since the copy was made is still found. A copy is only
//! a lead: its bytes are hashed on their way into a temp file beside the damaged one, and
//! only bytes that hash to the tag replace anything ([`replace`]). The damaged original is
//! kept, marked, unless the user says otherwise.
//!
//! Each verified copy is one step of a plan, carried out at once or, in a dry run, only
//! said: the dry run goes through the same search and the same verification.
//!
//! Every write happens in the damaged file's own directory, opened beneath the root given
//! on the command line without following symlinks: no name found in a source ever decides
//! where bytes go.

mod replace;
mod source;
pub use source::backup::{restic_without_password, sources};
pub use source::command::FromCommand;
pub use source::{BadSource, Template, Words};

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::core::classify::Status;
use crate::core::digest::Digest;
use crate::engine::{Action, FileError, FileReport};
use crate::fs::anchor::Anchor;
use crate::fs::walk::{Inode, SkipReason};
use crate::sink::{Failure, Out, Sink};

use replace::{Pending, Refused, Restored, Staged};
use source::{Attempts, Fill, Search};

/// What to do with the damaged original once it is replaced.
#[derive(Clone, Debug)]
pub enum Keep {
    /// Keep it beside the repaired file, as `<name>.damaged`.
    Beside,
    /// Keep it in this directory, at its path relative to the root it was found under.
    In(PathBuf),
    /// Discard it.
    Discard,
}

/// How to repair.
#[derive(Clone, Debug)]
pub struct Options {
    /// Find and verify good copies, and say what would be done; change nothing.
    pub dry_run: bool,
    /// What becomes of damaged originals.
    pub keep: Keep,
    /// Also bring back the files the state database knows were under the trees and are gone
    /// (`--missing`): to their last known path, never over another file.
    pub missing: bool,
    /// How long a backup tool or source command may say nothing before it is stopped.
    pub source_timeout: std::time::Duration,
}

/// Collects the damaged files a check finds, then repairs them from the sources.
pub struct Repairer {
    sources: Vec<Box<dyn Search>>,
    work: Work,
    /// Reports in walk order, let out once the repairs are done: damaged files (an index
    /// into the targets) and other names of damaged files.
    held: Vec<Held>,
    cancel: &'static AtomicBool,
}

enum Held {
    Target(usize),
    OtherName(Box<FileReport>),
}

/// The damaged files and how to put bytes in their place.
struct Work {
    roots: Vec<PathBuf>,
    anchors: Vec<Anchor>,
    opts: Options,
    targets: Vec<Target>,
    /// The targets by the digest they want: files with the same contents share a copy.
    by_digest: HashMap<Digest, Vec<usize>>,
    /// How many targets are not done.
    remaining: usize,
    /// Verified copies waiting to be put in place together (target, source, copy).
    pending: Vec<(usize, String, Box<Pending>)>,
    /// How many may wait.
    batch_files: usize,
}

/// Verified copies are put in place together once this many wait (fewer where the process
/// may hold few files open: each waiting copy holds three) ...
fn batch_files() -> usize {
    let open = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
    open.map_or(1024, |n| (n / 8).clamp(1, 1024) as usize)
}
/// ... or this many bytes of them (the page cache holds them until they are made durable).
const BATCH_BYTES: u64 = 256 << 20;

/// A damaged file waiting for good bytes.
struct Target {
    report: FileReport,
    want: Want,
    /// What was tried and why it did not do, for the report.
    tried: Vec<String>,
    done: bool,
    /// Gone from its path: brought back as a new file (`--missing`).
    missing: bool,
}

/// What a source is asked for: the content a damaged file should hold, and where it is.
pub(crate) struct Want {
    /// The digest its tag holds.
    pub digest: Digest,
    /// The size its tag records.
    pub size: Option<u64>,
    /// The mtime its tag records: the restored file's.
    pub mtime: Option<crate::core::tag::Timestamp>,
    /// Where the damaged file is.
    pub path: PathBuf,
    /// Its path relative to its root.
    pub rel: PathBuf,
    /// A file gone: its owner, group and mode, where the database knew them.
    pub owner: Option<crate::engine::Owner>,
}

impl Repairer {
    /// A repairer for files found under `roots`, searching the sources at `from` in order,
    /// then the commands `commands` (see `--from-command`); or why a source named cannot be
    /// one (said before anything runs).
    pub fn new(
        roots: &[PathBuf],
        from: &[PathBuf],
        commands: Vec<FromCommand>,
        opts: Options,
        cancel: &'static AtomicBool,
    ) -> Result<Repairer, BadSource> {
        let commands = commands.into_iter().map(|c| Box::new(c) as Box<dyn Search>);
        let named = from
            .iter()
            .map(|p| source::at(p, opts.source_timeout))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Repairer {
            sources: named.into_iter().chain(commands).collect(),
            work: Work {
                roots: roots.to_vec(),
                anchors: roots.iter().map(|r| Anchor::new(r)).collect(),
                opts,
                targets: Vec::new(),
                by_digest: HashMap::new(),
                remaining: 0,
                pending: Vec::new(),
                batch_files: batch_files(),
            },
            held: Vec::new(),
            cancel,
        })
    }

    /// Searches the sources in order and restores each damaged file from the first copy
    /// that verifies.
    fn run(&mut self) {
        for source in &self.sources {
            if self.work.all_done() || self.cancel.load(Ordering::Relaxed) {
                break;
            }
            if let Err(why) = source.search(&mut self.work, self.cancel) {
                let what = format!("{} unusable ({why})", source.name());
                for t in self.work.targets.iter_mut().filter(|t| !t.done) {
                    t.tried.push(what.clone());
                }
            }
        }
        self.work.flush();
    }
}

impl Repairer {
    /// Holds `report` as a file to repair (or, `missing`, to bring back) with `want`.
    fn target(&mut self, report: FileReport, want: Want, missing: bool) {
        let i = self.work.targets.len();
        self.held.push(Held::Target(i));
        self.work.by_digest.entry(want.digest).or_default().push(i);
        self.work.remaining += 1;
        self.work.targets.push(Target {
            report,
            want,
            tried: Vec::new(),
            done: false,
            missing,
        });
    }
}

impl Sink for Repairer {
    fn take(&mut self, report: FileReport, out: &mut dyn Out) -> Result<(), Failure> {
        if !report.status.is_damage() {
            out.send(report);
        } else if report.skip == Some(SkipReason::HardLink) {
            self.held.push(Held::OtherName(Box::new(report)));
        } else if let Some(tag) = &report.tag {
            let want = Want {
                digest: tag.digest,
                size: tag.size,
                mtime: tag.mtime,
                path: report.path.clone(),
                rel: report.relative(&self.work.roots).to_path_buf(),
                // A damaged file keeps the original's, taken from it as it is replaced.
                owner: None,
            };
            self.target(report, want, false);
        } else {
            out.send(report);
        }
        Ok(())
    }

    fn wants_missing(&self) -> bool {
        self.work.opts.missing
    }

    fn missing(&mut self, files: Vec<crate::state::Missing>) -> Vec<crate::state::Missing> {
        for m in files {
            // Back under the root it was under, as that root was given.
            let at = self.work.roots.iter().enumerate().find_map(|(k, root)| {
                let rel = m.path.strip_prefix(crate::state::absolute(root)).ok()?;
                (!rel.as_os_str().is_empty()).then(|| (k, root.join(rel), rel.to_path_buf()))
            });
            let Some((root, path, rel)) = at else {
                continue;
            };
            let mut report = FileReport::new(path.clone(), Status::Missing);
            report.root = root;
            report.size = Some(m.size);
            report.inode = Some((0, m.ino));
            report.tag = Some(crate::core::tag::Tag {
                format: crate::core::tag::Format::Intact,
                digest: m.digest,
                size: Some(m.size),
                mtime: None,
                mtime_slack_ns: 0,
                tagged: None,
            });
            report.detail = Some(format!(
                "gone since it was last seen (last verified {})",
                m.verified.map_or("never".into(), crate::text::time_ms)
            ));
            let want = Want {
                digest: m.digest,
                size: Some(m.size),
                mtime: None,
                path,
                rel,
                owner: m.owner,
            };
            self.target(report, want, true);
        }
        Vec::new()
    }

    fn finish(&mut self, interrupted: bool, out: &mut dyn Out) -> Result<(), Failure> {
        if !interrupted {
            self.run();
        }
        let repaired: Vec<(Inode, PathBuf)> = self
            .work
            .targets
            .iter()
            .filter(|t| t.report.action == Some(Action::Repaired))
            .filter_map(|t| Some((t.report.linked?, t.report.path.clone())))
            .collect();
        for held in std::mem::take(&mut self.held) {
            let report = match held {
                Held::OtherName(report) => other_name(*report, &repaired),
                Held::Target(i) => {
                    let t = &mut self.work.targets[i];
                    if !t.done && t.report.error.is_none() {
                        t.report.detail = Some(if t.tried.is_empty() {
                            "no good copy found in the sources".into()
                        } else {
                            format!("no good copy found: {}", said(&t.tried))
                        });
                    }
                    std::mem::replace(&mut t.report, FileReport::new(PathBuf::new(), Status::Ok))
                }
            };
            out.send(report);
        }
        Ok(())
    }
}

impl Attempts for Work {
    fn count(&self) -> usize {
        self.targets.len()
    }

    fn want(&self, i: usize) -> Option<&Want> {
        let t = &self.targets[i];
        (!t.done).then_some(&t.want)
    }

    fn remaining(&self) -> usize {
        self.remaining
    }

    fn roots(&self) -> &[PathBuf] {
        &self.roots
    }

    fn tried(&mut self, i: usize, what: String) {
        self.targets[i].tried.push(what);
    }

    fn dated(&mut self, i: usize, from: &str, since: &str) {
        let refused = damaged_copy(from);
        if let Some(t) = self.targets[i].tried.iter_mut().find(|t| **t == refused) {
            t.push_str(&format!(
                ", nor the same copy in every older version back to {since}: the damage \
                 entered the backups by then"
            ));
        }
    }

    /// One step: the copy is verified for target `i` and, unless this is a dry run, put in
    /// its place; then every other damaged file with the same content gets the same bytes.
    fn offer(&mut self, i: usize, from: &str, fill: &mut Fill<'_>) -> bool {
        let outcome = self.restore(i, fill);
        if !self.stage(i, outcome, from) {
            return false;
        }
        let good = self.targets[i].report.path.clone();
        let digest = self.targets[i].want.digest;
        let same: Vec<usize> = self.by_digest[&digest]
            .iter()
            .copied()
            .filter(|&j| !self.targets[j].done)
            .collect();
        if same.is_empty() {
            return true;
        }
        // The other damaged files with these contents copy the repaired one: in place first.
        self.flush();
        for j in same {
            if self.targets[j].done {
                continue;
            }
            // A dry run repaired nothing to copy from; the copy is verified.
            let outcome = if self.opts.dry_run {
                Ok(Staged::Planned)
            } else {
                self.restore(j, &mut |sink| source::read_file(&good, sink))
            };
            self.stage(j, outcome, from);
        }
        true
    }
}

impl Work {
    fn all_done(&self) -> bool {
        self.remaining == 0
    }

    /// Target `i` needs no more offers.
    fn done(&mut self, i: usize) {
        if !self.targets[i].done {
            self.targets[i].done = true;
            self.remaining -= 1;
        }
    }

    fn restore(&self, i: usize, fill: &mut Fill<'_>) -> Result<Staged, Refused> {
        let t = &self.targets[i];
        let anchor = &self.anchors[t.report.root];
        if t.missing {
            return replace::restore_missing(anchor, &t.want, &self.opts, fill);
        }
        replace::restore(anchor, &t.report, &t.want, &self.opts, fill)
    }

    /// Records an attempt's outcome, or queues a verified copy to be put in place with
    /// others; true if the file is repaired (or would be, or will be).
    fn stage(&mut self, i: usize, outcome: Result<Staged, Refused>, from: &str) -> bool {
        match outcome {
            Ok(Staged::Pending(copy)) => {
                self.done(i);
                self.pending.push((i, from.to_string(), copy));
                let bytes: u64 = self.pending.iter().map(|(_, _, p)| p.size).sum();
                if self.pending.len() >= self.batch_files || bytes >= BATCH_BYTES {
                    self.flush();
                }
                true
            }
            Ok(Staged::Planned) => {
                self.done(i);
                let t = &mut self.targets[i];
                let mut detail = format!("would be repaired from {from}");
                if !t.tried.is_empty() {
                    detail.push_str(&format!("; passed over: {}", said(&t.tried)));
                }
                t.report.detail = Some(detail);
                true
            }
            Ok(Staged::Done(restored)) => self.settle(i, Ok(restored), from),
            Err(refused) => self.settle(i, Err(refused), from),
        }
    }

    /// Puts the verified copies waiting in place, and records how each went.
    fn flush(&mut self) {
        let (waiting, copies): (Vec<_>, Vec<_>) = std::mem::take(&mut self.pending)
            .into_iter()
            .map(|(i, from, copy)| ((i, from), copy))
            .unzip();
        let copies = copies.into_iter().map(|c| *c).collect();
        for ((i, from), outcome) in waiting.into_iter().zip(replace::commit(copies)) {
            self.settle(i, outcome, &from);
        }
    }

    /// Records an attempt's outcome; true if the file is now repaired (or would be).
    fn settle(&mut self, i: usize, outcome: Result<Restored, Refused>, from: &str) -> bool {
        if matches!(
            outcome,
            Ok(_) | Err(Refused::Target(_) | Refused::Partial(_))
        ) {
            self.done(i);
        }
        let t = &mut self.targets[i];
        match outcome {
            Ok(Restored { kept, warning }) => {
                let was = t.report.status.name();
                t.report.status = Status::Ok;
                t.report.action = Some(Action::Repaired);
                let mut detail = match kept {
                    Some(k) => format!(
                        "was {was}; restored from {from}; damaged copy kept as {}",
                        crate::text::escape(&k)
                    ),
                    None => format!("was {was}; restored from {from}"),
                };
                // Copies passed over on the way (a backup that copied the rot) are said.
                if !t.tried.is_empty() {
                    detail.push_str(&format!("; passed over: {}", said(&t.tried)));
                }
                if let Some(w) = warning {
                    detail.push_str(&format!("; but {w}"));
                }
                t.report.detail = Some(detail);
                true
            }
            Err(Refused::CopyDamaged) => {
                t.tried.push(damaged_copy(from));
                false
            }
            Err(Refused::Unreadable(e)) => {
                t.tried.push(format!("{from} unreadable ({e})"));
                false
            }
            Err(Refused::Target(e)) => {
                // The file could not be written: trying other copies would fail the same way.
                t.report.error = Some(FileError::Repair(e));
                false
            }
            Err(Refused::Partial(e)) => {
                t.report.error = Some(FileError::RepairPartial(e));
                false
            }
        }
    }
}

/// Another name of a damaged file, said as the repair of its inode went.
fn other_name(mut report: FileReport, repaired: &[(Inode, PathBuf)]) -> FileReport {
    if let Some((_, first)) = repaired.iter().find(|(i, _)| Some(*i) == report.linked) {
        // Every name of the inode was repaired with it, and is said to be.
        report.status = Status::Ok;
        report.action = Some(Action::Repaired);
        report.detail = Some(format!(
            "another name of {}, repaired",
            crate::text::escape(first)
        ));
    }
    report
}

/// The kept copy of a damaged file `name`: beside it as `NAME.damaged` (a name too long for
/// that is shortened), or under `dir` at its path relative to its root.
fn keep_at(keep: &Keep, name: &std::ffi::OsStr, rel: &Path) -> Option<replace::KeepAt> {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    match keep {
        Keep::Discard => None,
        Keep::Beside => {
            const SUFFIX: &[u8] = b".damaged";
            // Room for the suffix and a `.N` to tell copies apart, within NAME_MAX.
            let mut k = name.as_bytes()[..name.len().min(255 - SUFFIX.len() - 4)].to_vec();
            k.extend_from_slice(SUFFIX);
            Some(replace::KeepAt::Beside(std::ffi::OsString::from_vec(k)))
        }
        Keep::In(dir) => Some(replace::KeepAt::Elsewhere(if rel.as_os_str().is_empty() {
            dir.join(name)
        } else {
            dir.join(rel)
        })),
    }
}

/// Marks what a kept copy is, so no later run takes it for a good file.
fn kept_note(name: &std::ffi::OsStr) -> String {
    format!(
        "damaged copy of {}, kept by intact repair at {}",
        crate::text::escape(Path::new(name)),
        crate::core::tag::Timestamp::now().sec
    )
}

/// A copy from `from` that did not match its tag, as a file's report says it.
fn damaged_copy(from: &str) -> String {
    format!("{from} does not match its tag")
}

/// What was tried for a file, for its report: the first few leads and the last (a source's
/// summary), the rest counted (a year of backups can offer hundreds of copies).
fn said(tried: &[String]) -> String {
    const SHOWN: usize = 4;
    if tried.len() <= SHOWN + 1 {
        return tried.join("; ");
    }
    format!(
        "{}; and {} more; {}",
        tried[..SHOWN].join("; "),
        tried.len() - SHOWN - 1,
        tried[tried.len() - 1]
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_long_list_of_leads_is_cut_but_keeps_its_last() {
        let leads: Vec<String> = (1..=9).map(|n| format!("copy {n}")).collect();
        assert_eq!(
            super::said(&leads),
            "copy 1; copy 2; copy 3; copy 4; and 4 more; copy 9"
        );
        assert_eq!(super::said(&leads[..5]), leads[..5].join("; "));
    }
}
