//! Repair: damaged files get their original bytes back from good copies.
//!
//! A check finds the damaged files; each one's tag says which bytes it should hold. Sources
//! are searched by digest, not by name, so a file moved or renamed since the copy was made
//! is still found: archive members by the tags they carry, files in a backup tree by theirs.
//! A candidate is only a lead: its bytes are hashed on their way into a temp file beside the
//! damaged one, and only bytes that hash to the tag replace anything. The replacement is
//! made durable and given the original's mode, owner, xattrs and mtime, then renamed over
//! it; the damaged original is kept unless the user says otherwise.
//!
//! Every write happens in the damaged file's own directory, opened beneath the root given
//! on the command line without following symlinks: no name found in a source ever decides
//! where bytes go. A file with several hard links is rewritten in place (after the verified
//! copy is durable beside it), so that every name sees the repaired data.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read, Seek, Write};
use std::ops::ControlFlow;
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::fs::{Mode, OFlags};

use crate::archive::{self, Chunk};
use crate::core::classify::Status;
use crate::core::digest::{Digest, Hasher};
use crate::core::tag::names;
use crate::engine::{Action, FileReport};
use crate::fs::anchor::Anchor;
use crate::fs::atomic::Temp;
use crate::fs::walk::{self, Entry, WalkOptions};
use crate::fs::xattr;

/// Where good copies may be found.
#[derive(Clone, Debug)]
pub enum Source {
    /// An archive made by `intact archive create`.
    Archive(PathBuf),
    /// A tree of tagged files: a backup, a mirror, another disk.
    Tree(PathBuf),
    /// A parity store made by `intact protect`.
    Parity(PathBuf),
    /// A PAR2 set made by any PAR2 program; its names are relative to its directory.
    Par2(PathBuf),
}

impl Source {
    /// A source for `path`: a parity store, a tree, or (a file) an archive.
    pub fn new(path: PathBuf) -> Source {
        if crate::parity::Store::is_store(&path) {
            Source::Parity(path)
        } else if path.is_dir() {
            Source::Tree(path)
        } else if path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("par2"))
        {
            Source::Par2(path)
        } else {
            Source::Archive(path)
        }
    }
}

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
    /// Find and verify good copies, but change nothing.
    pub dry_run: bool,
    /// What becomes of damaged originals.
    pub keep: Keep,
}

/// A damaged file waiting for good bytes.
struct Target {
    report: FileReport,
    root: usize,
    /// The digest its tag holds, and the size it records.
    want: (Digest, Option<u64>),
    /// What was tried and why it did not do, for the report.
    bad_copies: Vec<String>,
    done: bool,
}

/// Collects damaged files from a check, then repairs them from the sources.
pub struct Repairer {
    roots: Vec<PathBuf>,
    anchors: Vec<Anchor>,
    opts: Options,
    targets: Vec<Target>,
}

impl Repairer {
    /// A repairer for files found under `roots`.
    pub fn new(roots: &[PathBuf], opts: Options) -> Repairer {
        Repairer {
            roots: roots.to_vec(),
            anchors: roots.iter().map(|r| Anchor::new(r)).collect(),
            opts,
            targets: Vec::new(),
        }
    }

    /// Takes `report` if it is about a damaged file this can repair; otherwise gives it back.
    pub fn want(&mut self, report: FileReport) -> Option<FileReport> {
        let root = self.roots.iter().position(|r| report.path.starts_with(r));
        let (true, Some(tag), Some(root)) = (report.status.is_damage(), &report.tag, root) else {
            return Some(report);
        };
        let want = (tag.digest, tag.size);
        self.targets.push(Target {
            report,
            root,
            want,
            bad_copies: Vec::new(),
            done: false,
        });
        None
    }

    /// Whether any damaged file was found.
    pub fn is_empty(&self) -> bool {
        self.targets.is_empty()
    }

    /// Searches `sources` in order for the damaged files' bytes and restores each file from
    /// the first copy that verifies; then hands each file's report to `sink`.
    pub fn run(
        mut self,
        sources: &[Source],
        cancel: &AtomicBool,
        mut sink: impl FnMut(FileReport),
    ) {
        for source in sources {
            if self.targets.iter().all(|t| t.done) || cancel.load(Ordering::Relaxed) {
                break;
            }
            match source {
                Source::Archive(path) => self.search_archive(path, cancel),
                Source::Tree(path) => self.search_tree(path, cancel),
                Source::Parity(path) => self.search_parity(path, cancel),
                Source::Par2(path) => self.search_par2(path, cancel),
            }
        }
        for mut t in self.targets {
            if !t.done && t.report.error.is_none() {
                t.report.detail = Some(if t.bad_copies.is_empty() {
                    "no good copy found in the sources".into()
                } else {
                    format!("no good copy found: {}", t.bad_copies.join("; "))
                });
            }
            sink(t.report);
        }
    }

    fn wanted(&self) -> HashMap<Digest, Vec<usize>> {
        let mut map: HashMap<Digest, Vec<usize>> = HashMap::new();
        for (i, t) in self.targets.iter().enumerate() {
            if !t.done {
                map.entry(t.want.0).or_default().push(i);
            }
        }
        map
    }

    fn search_archive(&mut self, path: &Path, cancel: &AtomicBool) {
        let wanted = self.wanted();
        let shown = crate::report::escape(path);
        let result = archive::read(path, |mut visit| {
            if cancel.load(Ordering::Relaxed) {
                return ControlFlow::Break(());
            }
            let m = visit.member;
            if m.kind != archive::Kind::File {
                return ControlFlow::Continue(());
            }
            let stored = m.stored();
            let Some(indices) = stored.tags.iter().find_map(|t| wanted.get(&t.digest)) else {
                return ControlFlow::Continue(());
            };
            let Some(&first) = indices.iter().find(|&&i| {
                !self.targets[i].done && self.targets[i].want.1.is_none_or(|s| s == m.size)
            }) else {
                return ControlFlow::Continue(());
            };
            let from = format!("{shown} ({})", crate::report::escape(&m.path()));
            let outcome = self.restore(first, |sink| visit.data(sink));
            if self.settle(first, outcome, &from) {
                // The same bytes for every other file that wants them, from the one repaired.
                let good = self.targets[first].report.path.clone();
                for &i in indices {
                    if !self.targets[i].done {
                        // A dry run repaired nothing to copy from; the copy is verified.
                        let outcome = if self.opts.dry_run {
                            Ok(Restored::default())
                        } else {
                            self.restore(i, |sink| read_file(&good, sink))
                        };
                        self.settle(i, outcome, &from);
                    }
                }
            }
            if self.targets.iter().all(|t| t.done) {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        });
        if let Err(e) = result {
            for t in self.targets.iter_mut().filter(|t| !t.done) {
                t.bad_copies.push(format!("{shown} unreadable ({e})"));
            }
        }
    }

    fn search_tree(&mut self, tree: &Path, cancel: &AtomicBool) {
        let wanted = self.wanted();
        let mut candidates: HashMap<Digest, Vec<PathBuf>> = HashMap::new();
        walk_tags(&[tree.to_path_buf()], cancel, |path, tags| {
            if let Some(t) = tags.iter().find(|t| wanted.contains_key(&t.digest)) {
                candidates.entry(t.digest).or_default().push(path);
            }
        });
        let shown = crate::report::escape(tree);
        for (digest, indices) in wanted {
            let Some(found) = candidates.get(&digest) else {
                continue;
            };
            for i in indices {
                let rel = self.relative(i);
                let mut found = found.clone();
                // The copy at the same relative path first, then the closest names.
                found.sort_by_key(|p| std::cmp::Reverse(common_suffix(&rel, p)));
                for path in found {
                    if self.targets[i].done || cancel.load(Ordering::Relaxed) {
                        break;
                    }
                    let want_size = self.targets[i].want.1;
                    let size = std::fs::symlink_metadata(&path).map(|m| m.len()).ok();
                    if same_file(&path, &self.targets[i].report.path)
                        || want_size.is_some_and(|w| Some(w) != size)
                    {
                        continue;
                    }
                    let from = format!("{shown} ({})", crate::report::escape(&path));
                    let outcome = self.restore(i, |sink| read_file(&path, sink));
                    self.settle(i, outcome, &from);
                }
            }
        }
    }

    /// A PAR2 set from elsewhere: its files are found by name, relative to the set's
    /// directory (as par2cmdline does), and used for the damaged files they are.
    fn search_par2(&mut self, path: &Path, cancel: &AtomicBool) {
        let from = format!("PAR2 set {}", crate::report::escape(path));
        let set = match crate::parity::load(path) {
            Ok(set) => set,
            Err(e) => {
                for t in self.targets.iter_mut().filter(|t| !t.done) {
                    t.bad_copies.push(format!("{from} unusable ({e})"));
                }
                return;
            }
        };
        let base = path.parent().unwrap_or(Path::new("."));
        let base = if base.as_os_str().is_empty() {
            Path::new(".")
        } else {
            base
        };
        let paths: Vec<Option<PathBuf>> = set
            .files
            .iter()
            .map(|f| crate::parity::resolve(base, &f.name))
            .collect();
        for i in 0..self.targets.len() {
            if cancel.load(Ordering::Relaxed) {
                break;
            }
            let target = self.targets[i].report.path.clone();
            let at = paths
                .iter()
                .position(|p| p.as_ref().is_some_and(|p| same_file(p, &target)));
            if let (false, Some(at)) = (self.targets[i].done, at) {
                self.rebuild_from(i, &set, at, &paths, &from);
            }
        }
    }

    /// Rebuilds target `i`, file `at` of `set`, whose other files are at `paths`.
    fn rebuild_from(
        &mut self,
        i: usize,
        set: &par2::Set,
        at: usize,
        paths: &[Option<PathBuf>],
        from: &str,
    ) {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        // The damaged file is read where it is now; the set's other files where it says.
        let target = self.targets[i].report.path.clone();
        let mut open = |j: usize| -> io::Result<Option<Box<dyn Read>>> {
            let path = if j == at {
                Some(&target)
            } else {
                paths[j].as_ref()
            };
            match path.map(|p| crate::fs::sys::open_nofollow(p)) {
                None => Ok(None),
                Some(Ok(f)) => Ok(Some(Box::new(f))),
                Some(Err(e)) if e.kind() == io::ErrorKind::NotFound => Ok(None),
                Some(Err(e)) => Err(e),
            }
        };
        let recovered = match set.recover(&mut open, threads) {
            Ok(r) => r,
            Err(par2::Error::TooMuchDamage { damaged, available }) => {
                self.targets[i].bad_copies.push(format!(
                    "{from}: {damaged} slices damaged, only {available} recovery slices \
                     (more damage than the redundancy covers)"
                ));
                return;
            }
            Err(e) => {
                self.targets[i]
                    .bad_copies
                    .push(format!("{from} unusable ({e})"));
                return;
            }
        };
        let outcome = self.restore(i, |sink| {
            let mut current = crate::fs::sys::open_nofollow(&target)?;
            set.restore(at, &recovered, Some(&mut current), &mut |bytes| {
                sink(Chunk::Data(bytes))
            })
            .map_err(|e| match e {
                par2::Error::Io(e) => e,
                other => io::Error::other(other.to_string()),
            })
        });
        self.settle(i, outcome, from);
    }

    fn search_parity(&mut self, dir: &Path, cancel: &AtomicBool) {
        let from = format!("parity in {}", crate::report::escape(dir));
        let store = match crate::parity::Store::read(dir) {
            Ok(s) => s,
            Err(e) => {
                for t in self.targets.iter_mut().filter(|t| !t.done) {
                    t.bad_copies.push(format!("{from} unreadable ({e})"));
                }
                return;
            }
        };
        let mut by_digest = None;
        for i in 0..self.targets.len() {
            if cancel.load(Ordering::Relaxed) {
                break;
            }
            if self.targets[i].done {
                continue;
            }
            let found = match store.find(&self.targets[i].want.0) {
                None => continue,
                Some(Ok(found)) => found,
                Some(Err(e)) => {
                    self.targets[i]
                        .bad_copies
                        .push(format!("{from} unusable ({e})"));
                    continue;
                }
            };
            // The other members of a pack are where the set says, under the store's root;
            // one that is not (moved, renamed) is looked for by its digest in the trees.
            let paths: Vec<Option<PathBuf>> = found
                .set
                .files
                .iter()
                .zip(&found.members)
                .map(|(f, digest)| {
                    let named = crate::parity::resolve(&store.root, &f.name)
                        .filter(|p| std::fs::symlink_metadata(p).is_ok_and(|m| m.len() == f.len));
                    named.or_else(|| digest.and_then(|d| self.locate(&d, &mut by_digest)))
                })
                .collect();
            self.rebuild_from(i, &found.set, found.at, &paths, &from);
        }
    }

    /// Where a file with `digest` is now, from the tags in the trees being repaired (read
    /// once, on first need).
    fn locate(
        &self,
        digest: &Digest,
        by_digest: &mut Option<HashMap<Digest, PathBuf>>,
    ) -> Option<PathBuf> {
        let map = by_digest.get_or_insert_with(|| {
            let mut map = HashMap::new();
            walk_tags(&self.roots, &AtomicBool::new(false), |path, tags| {
                for t in tags {
                    map.entry(t.digest).or_insert_with(|| path.clone());
                }
            });
            map
        });
        map.get(digest).cloned()
    }

    fn relative(&self, i: usize) -> PathBuf {
        let t = &self.targets[i];
        t.report
            .path
            .strip_prefix(&self.roots[t.root])
            .unwrap_or(&t.report.path)
            .to_path_buf()
    }

    /// Records an attempt's outcome; true if the file is now repaired.
    fn settle(&mut self, i: usize, outcome: Result<Restored, Failure>, from: &str) -> bool {
        let t = &mut self.targets[i];
        match outcome {
            Ok(Restored { kept, warning }) => {
                t.done = true;
                let was = t.report.status.name();
                if self.opts.dry_run {
                    t.report.detail = Some(format!("would be repaired from {from}"));
                } else {
                    t.report.status = Status::Ok;
                    t.report.action = Some(Action::Repaired);
                    let mut detail = match kept {
                        Some(k) => format!(
                            "was {was}; restored from {from}; damaged copy kept as {}",
                            crate::report::escape(&k)
                        ),
                        None => format!("was {was}; restored from {from}"),
                    };
                    if let Some(w) = warning {
                        detail.push_str(&format!("; but {w}"));
                    }
                    t.report.detail = Some(detail);
                }
                true
            }
            Err(Failure::CopyDamaged) => {
                t.bad_copies.push(format!("{from} is damaged too"));
                false
            }
            Err(Failure::Source(e)) => {
                t.bad_copies.push(format!("{from} unreadable ({e})"));
                false
            }
            Err(Failure::Target(e)) => {
                // The file could not be written: trying other copies would fail the same way.
                t.done = true;
                t.report.error = Some(crate::engine::FileError::Repair(e));
                false
            }
        }
    }

    /// Restores target `i` from the bytes `fill` streams: into a temp file beside it, hashed
    /// on the way; only if they match the tag does the temp file replace the original.
    fn restore(
        &self,
        i: usize,
        fill: impl FnOnce(&mut dyn FnMut(Chunk<'_>) -> io::Result<()>) -> io::Result<()>,
    ) -> Result<Restored, Failure> {
        let t = &self.targets[i];
        let path = &t.report.path;
        let (dir_path, name) = match (path.parent(), path.file_name()) {
            (Some(d), Some(n)) => (d, n),
            _ => return Err(Failure::Target(io::Error::other("no file name"))),
        };
        let dir = self.anchors[t.root]
            .open_dir(dir_path)
            .map_err(Failure::Target)?;
        let original = File::from(open_at(&dir, name, OFlags::RDONLY).map_err(Failure::Target)?);
        let meta = original.metadata().map_err(Failure::Target)?;
        self.unchanged(t, &original, &meta)?;
        let (digest, size) = t.want;
        let mut temp = if self.opts.dry_run {
            None
        } else {
            Some(Temp::new_in(&dir).map_err(Failure::Target)?)
        };
        let mut hasher = Hasher::new(digest.algo);
        let mut len = 0u64;
        // Why the stream was stopped from this side: the target could not be written, or
        // the copy is longer than the file it should restore.
        let mut write_err = None;
        let mut too_long = false;
        let filled = fill(&mut |chunk| {
            let n = match chunk {
                Chunk::Data(d) => d.len() as u64,
                Chunk::Hole(n) => n,
            };
            len = len.saturating_add(n);
            if size.is_some_and(|s| len > s) {
                too_long = true;
                return Err(io::Error::other("longer than the file it should restore"));
            }
            let written = match chunk {
                Chunk::Data(d) => {
                    hasher.update(d);
                    temp.as_ref().map_or(Ok(()), |t| t.file().write_all(d))
                }
                Chunk::Hole(n) => {
                    hasher.update_zeros(n);
                    temp.as_ref().map_or(Ok(()), |t| {
                        let n = i64::try_from(n).map_err(io::Error::other)?;
                        t.file().seek(io::SeekFrom::Current(n)).map(drop)
                    })
                }
            };
            written.map_err(|e| {
                let stop = io::Error::new(e.kind(), "write failed");
                write_err = Some(e);
                stop
            })
        });
        if let Some(e) = write_err {
            return Err(Failure::Target(e));
        }
        if too_long {
            return Err(Failure::CopyDamaged);
        }
        filled.map_err(Failure::Source)?;
        if hasher.finalize() != digest || size.is_some_and(|s| s != len) {
            return Err(Failure::CopyDamaged);
        }
        let Some(temp) = temp.take() else {
            return Ok(Restored::default());
        };
        let keep = self.keep_path(i, name);
        let mut restored =
            replace(temp, name, &original, &meta, len, keep).map_err(Failure::Target)?;
        // A name kept beside is shown with the directory it is in.
        restored.kept = restored.kept.map(|k| {
            if k.parent() == Some(Path::new("")) {
                dir_path.join(k)
            } else {
                k
            }
        });
        Ok(restored)
    }

    /// Makes sure the damaged file is still the one the check judged: same size, same mtime,
    /// same tag (an edit since the check must not be overwritten).
    fn unchanged(&self, t: &Target, file: &File, meta: &std::fs::Metadata) -> Result<(), Failure> {
        let now = crate::core::tag::Timestamp {
            sec: meta.mtime(),
            nsec: meta.mtime_nsec() as u32,
        };
        let same = meta.is_file()
            && Some(meta.len()) == t.report.size
            && Some(now) == t.report.mtime
            && xattr::read(file)
                .map_err(Failure::Target)?
                .tags
                .iter()
                .any(|tag| tag.digest == t.want.0);
        if same {
            Ok(())
        } else {
            Err(Failure::Target(io::Error::other(
                "the file changed since it was checked; run repair again",
            )))
        }
    }

    /// Where the damaged original of target `i` goes, if kept.
    fn keep_path(&self, i: usize, name: &OsStr) -> Option<KeepAt> {
        match &self.opts.keep {
            Keep::Discard => None,
            Keep::Beside => Some(KeepAt::Beside({
                let mut k = name.to_os_string();
                k.push(".damaged");
                // A name at the length limit keeps its damaged copy under a short one.
                if k.len() > 255 {
                    k = format!(".intact-damaged-{}", unique()).into();
                }
                k
            })),
            Keep::In(dir) => Some(KeepAt::Elsewhere(match self.relative(i) {
                rel if rel.as_os_str().is_empty() => dir.join(name),
                rel => dir.join(rel),
            })),
        }
    }
}

/// A successful restore.
#[derive(Default)]
struct Restored {
    /// Where the damaged original was kept.
    kept: Option<PathBuf>,
    /// Something that went wrong after the repaired file was in place.
    warning: Option<String>,
}

/// Why a restore did not happen.
enum Failure {
    /// The copy's bytes do not hash to the tag.
    CopyDamaged,
    /// The copy could not be read.
    Source(io::Error),
    /// The damaged file or its directory could not be written: nothing was changed.
    Target(io::Error),
}

enum KeepAt {
    /// A name in the same directory.
    Beside(OsString),
    /// A path elsewhere.
    Elsewhere(PathBuf),
}

/// Puts the verified bytes in `temp` in place of the damaged file `name` (open as
/// `original`, with metadata `meta`), in the directory `temp` is in: given the original's
/// user xattrs, owner, mode and times, made durable, and renamed over it, after the damaged
/// bytes are kept if asked. Until the rename, a failure leaves the original as it was and
/// nothing else behind; after it, problems are warnings.
fn replace(
    temp: Temp,
    name: &OsStr,
    original: &File,
    meta: &std::fs::Metadata,
    len: u64,
    keep: Option<KeepAt>,
) -> io::Result<Restored> {
    temp.file().set_len(len)?;
    if meta.nlink() > 1 {
        return rewrite_in_place(temp, name, original, meta, len, keep);
    }
    let attrs = xattr::read_all(original)?;
    xattr::write_all(
        temp.file(),
        attrs.iter().filter(|(n, _)| n != names::REPAIRING),
    )?;
    let (uid, gid) = (meta.uid(), meta.gid());
    if let Err(e) = rustix::fs::fchown(
        temp.file(),
        Some(rustix::fs::Uid::from_raw(uid)),
        Some(rustix::fs::Gid::from_raw(gid)),
    ) && (uid, gid)
        != (
            rustix::process::getuid().as_raw(),
            rustix::process::getgid().as_raw(),
        )
    {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("cannot give the repaired file its owner {uid}:{gid} ({e})"),
        ));
    }
    rustix::fs::fchmod(
        temp.file(),
        Mode::from_raw_mode((meta.mode() & 0o7777) as _),
    )?;
    set_times(temp.file(), meta)?;
    let dir = temp.dir().try_clone()?;
    let kept = match keep {
        None => None,
        Some(KeepAt::Beside(k)) => Some(link_beside(&dir, name, &k)?),
        Some(KeepAt::Elsewhere(p)) => Some(copy_to(original, &p)?),
    };
    if let Err(e) = temp.commit(name) {
        if let Some(k) = &kept {
            unkeep(&dir, k);
        }
        return Err(e);
    }
    let mut restored = Restored {
        kept,
        warning: None,
    };
    if restored.kept.is_some() {
        // The damaged inode now lives on only under the kept name: without its tag, later
        // checks do not report the same damage again (the good file carries the tag).
        if let Err(e) = xattr::remove_intact(original) {
            restored.warning = Some(format!("finishing up failed: {e}"));
        }
    }
    Ok(restored)
}

/// For an inode with several names: every name must see the repair, so the verified bytes
/// are written into it. That is the one step that is not atomic, so the file is marked
/// first (an xattr, made durable before any byte changes): a run killed midway leaves mixed
/// bytes under a moved mtime, and the mark makes every later check report them as damage
/// (never as an edit) until a repair completes and removes it.
fn rewrite_in_place(
    temp: Temp,
    name: &OsStr,
    original: &File,
    meta: &std::fs::Metadata,
    len: u64,
    keep: Option<KeepAt>,
) -> io::Result<Restored> {
    let dir = temp.dir();
    // The damaged bytes are copied out first: a second link would see the repair too.
    let kept = match keep {
        None => None,
        Some(KeepAt::Beside(k)) => Some(copy_beside(dir, &k, original)?),
        Some(KeepAt::Elsewhere(p)) => Some(copy_to(original, &p)?),
    };
    let target = match open_at(dir, name, OFlags::WRONLY).map(File::from) {
        Ok(f)
            if f.metadata()
                .is_ok_and(|m| m.dev() == meta.dev() && m.ino() == meta.ino()) =>
        {
            f
        }
        Ok(_) | Err(_) => {
            if let Some(k) = &kept {
                unkeep(dir, k);
            }
            return Err(io::Error::other(
                "the file was replaced since it was checked; run repair again",
            ));
        }
    };
    let marked = xattr::mark_repairing(&target).and_then(|()| target.sync_all());
    if let Err(e) = marked {
        if let Some(k) = &kept {
            unkeep(dir, k);
        }
        return Err(e);
    }
    let written = (|| {
        let mut from = temp.file();
        from.seek(io::SeekFrom::Start(0))?;
        io::copy(&mut from.take(len), &mut &target)?;
        target.set_len(len)?;
        set_times(&target, meta)?;
        target.sync_all()
    })();
    if let Err(e) = written {
        return Err(io::Error::new(
            e.kind(),
            format!(
                "{e}: the file may be partly rewritten; it is marked, so checks report it as \
                 damaged until a repair completes"
            ),
        ));
    }
    let mut restored = Restored {
        kept,
        warning: None,
    };
    // Left behind, the mark would only keep a good file under suspicion (a check finds the
    // data matching and says ok): a warning, not a failure.
    if let Err(e) = xattr::unmark_repairing(&target) {
        restored.warning = Some(format!("could not remove the repair mark: {e}"));
    }
    Ok(restored)
}

/// Opens `name` in `dir`, never through a symlink.
fn open_at(dir: &OwnedFd, name: &OsStr, flags: OFlags) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(
        dir,
        name,
        flags | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
        Mode::empty(),
    )?)
}

/// The original's access and modification times, to the nanosecond.
fn set_times(file: &File, meta: &std::fs::Metadata) -> io::Result<()> {
    let ts = |sec: i64, nsec: i64| rustix::fs::Timespec {
        tv_sec: sec,
        tv_nsec: nsec as _,
    };
    rustix::fs::futimens(
        file,
        &rustix::fs::Timestamps {
            last_access: ts(meta.atime(), meta.atime_nsec()),
            last_modification: ts(meta.mtime(), meta.mtime_nsec()),
        },
    )?;
    Ok(())
}

/// A short name no other run of intact can be using.
fn unique() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Creates a name for the damaged inode beside it (a hard link), under a free variant of
/// `keep`.
fn link_beside(dir: &OwnedFd, name: &OsStr, keep: &OsStr) -> io::Result<PathBuf> {
    free_name(keep, |k| {
        rustix::fs::linkat(dir, name, dir, k, rustix::fs::AtFlags::empty()).map_err(io::Error::from)
    })
}

/// Copies the damaged bytes to a new file beside the original, under a free variant of
/// `keep`; nothing is under that name unless the whole copy is.
fn copy_beside(dir: &OwnedFd, keep: &OsStr, original: &File) -> io::Result<PathBuf> {
    let mut temp = Temp::new_in(dir)?;
    io::copy(&mut { original }, &mut temp.file())?;
    free_name(keep, |k| temp.commit_new(k))
}

/// Tries `make` on `keep`, then `keep.1`, `keep.2` ... until a name is free.
fn free_name(keep: &OsStr, mut make: impl FnMut(&OsStr) -> io::Result<()>) -> io::Result<PathBuf> {
    for n in 0..1000 {
        let mut k = keep.to_os_string();
        if n > 0 {
            k.push(format!(".{n}"));
        }
        match make(&k) {
            Ok(()) => return Ok(PathBuf::from(k)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::other(
        "no free name to keep the damaged copy under",
    ))
}

/// Removes a kept copy made for a repair that did not happen. Names beside the original are
/// relative to `dir`; others are paths.
fn unkeep(dir: &OwnedFd, kept: &Path) {
    if kept.parent() == Some(Path::new("")) {
        let _ = rustix::fs::unlinkat(dir, kept, rustix::fs::AtFlags::empty());
    } else {
        let _ = std::fs::remove_file(kept);
    }
}

/// Copies the damaged bytes to `path`, which must not exist yet; nothing is under that name
/// unless the whole copy is.
fn copy_to(original: &File, path: &Path) -> io::Result<PathBuf> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let mut temp = Temp::beside(path)?;
    io::copy(&mut { original }, &mut temp.file())?;
    temp.commit_new(path.file_name().unwrap_or(path.as_os_str()))?;
    Ok(path.to_path_buf())
}

/// Streams a file's bytes.
fn read_file(path: &Path, sink: &mut dyn FnMut(Chunk<'_>) -> io::Result<()>) -> io::Result<()> {
    let mut file = crate::fs::sys::open_nofollow(path)?;
    crate::fs::sys::advise_sequential(&file);
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match file.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => sink(Chunk::Data(&buf[..n]))?,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Every file under `roots` with the tags it carries (read without reading data; files are
/// opened beneath their root, never through a symlink).
fn walk_tags(
    roots: &[PathBuf],
    cancel: &AtomicBool,
    mut each: impl FnMut(PathBuf, Vec<crate::core::tag::Tag>),
) {
    let anchors: Vec<Anchor> = roots.iter().map(|r| Anchor::new(r)).collect();
    let _ = walk::walk(roots, &WalkOptions::default(), |entry| {
        if cancel.load(Ordering::Relaxed) {
            return ControlFlow::Break(());
        }
        if let Entry::File { path, root, .. } = entry
            && let Ok(file) = anchors[root].open(&path, false)
            && let Ok(stored) = xattr::read(&file)
            && !stored.tags.is_empty()
        {
            each(path, stored.tags);
        }
        ControlFlow::Continue(())
    });
}

/// How many trailing path components two paths share.
fn common_suffix(a: &Path, b: &Path) -> usize {
    a.components()
        .rev()
        .zip(b.components().rev())
        .take_while(|(x, y)| x == y)
        .count()
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::symlink_metadata(a), std::fs::symlink_metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closest_names_share_the_longest_suffix() {
        let p = Path::new;
        assert_eq!(
            common_suffix(p("photos/2024/a.jpg"), p("/backup/photos/2024/a.jpg")),
            3
        );
        assert_eq!(
            common_suffix(p("photos/2024/a.jpg"), p("/backup/old/a.jpg")),
            1
        );
        assert_eq!(common_suffix(p("a.jpg"), p("/backup/b.jpg")), 0);
    }
}
