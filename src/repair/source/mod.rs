//! Where good copies are found: archives made by `archive create` (members carry their
//! tags), trees of tagged files (a backup, a mirror), parity stores made by `protect`, and
//! PAR2 sets made by any PAR2 program. Each looks for the wanted contents by digest and
//! offers what it finds; the repairer verifies every offer, so a source is only ever a lead.
//! Backups made by other tools (restic, borg) are in [`backup`], any command that prints a
//! file in [`command`].

pub(super) mod backup;
pub(super) mod command;

use std::collections::HashMap;
use std::io::{self, Read};
use std::ops::ControlFlow;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use super::Want;
use crate::archive::{self, Chunk};
use crate::core::digest::Digest;
use crate::parity::{self, Store};
use crate::process;
use crate::text::escape;

/// Streams a copy's bytes into the sink it is given.
pub(crate) type Fill<'f> =
    dyn FnMut(&mut dyn FnMut(Chunk<'_>) -> io::Result<()>) -> io::Result<()> + 'f;

/// What a source works for: the damaged files, and what to do with a copy. An archive's
/// frames are read on several threads, which take turns with it.
pub(crate) trait Attempts: Send {
    /// How many damaged files there are.
    fn count(&self) -> usize;
    /// What damaged file `i` wants, while it is not repaired yet.
    fn want(&self, i: usize) -> Option<&Want>;
    /// How many damaged files still want a copy.
    fn remaining(&self) -> usize;
    /// The trees being repaired.
    fn roots(&self) -> &[PathBuf];
    /// Verifies a copy for file `i` (and puts it in place): whether `i` is done now.
    fn offer(&mut self, i: usize, from: &str, fill: &mut Fill<'_>) -> bool;
    /// Notes a lead that came to nothing, for file `i`'s report.
    fn tried(&mut self, i: usize, what: String);
    /// Says of the copy offered `from` that did not match its tag that older versions back
    /// to `since` hold the same damaged copy: when the damage entered the backups.
    fn dated(&mut self, i: usize, from: &str, since: &str);
}

/// A place good copies may be found in.
pub(crate) trait Search {
    /// How it is named in reports.
    fn name(&self) -> String;
    /// Offers every copy found of what is wanted; `Err` if the source cannot be used at all.
    fn search(&self, work: &mut dyn Attempts, cancel: &AtomicBool) -> Result<(), Unusable>;
}

/// Why a source cannot be used at all: each damaged file's report says so, and the other
/// sources are still tried.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Unusable {
    /// It could not be read.
    #[error("unreadable: {0}")]
    Unreadable(#[from] io::Error),
    /// The archive could not be read to its end.
    #[error("unreadable: {0}")]
    Archive(#[from] archive::ReadError),
    /// The tool that reads it is not installed, could not be run, failed or was stopped.
    #[error("{program}{hint}", program = .0, hint = timeout_hint(.0))]
    Program(#[from] process::Error),
    /// The repository needs a password and the environment gives none (restic cannot ask:
    /// it runs without a terminal).
    #[error(
        "{tool} needs the repository's password and none is set here ({vars}; for the units, \
         in /etc/default/intact)"
    )]
    NoPassword {
        tool: &'static str,
        /// The variables that give it.
        vars: &'static str,
    },
    /// The tool printed what could not be read as what it should print.
    #[error("{what}: {source}")]
    Output {
        /// The command (`restic snapshots`).
        what: &'static str,
        /// Why.
        source: serde_json::Error,
    },
}

/// Why a source named cannot be one: said before anything runs (a usage error).
#[derive(Debug, thiserror::Error)]
pub enum BadSource {
    /// A `--from` that is not there.
    #[error("--from {from}: no such file or directory")]
    NotThere {
        /// The value, escaped.
        from: String,
    },
    /// A `restic:` or `borg:` value whose words cannot be a source.
    #[error("--from {from}: {why}")]
    Backup {
        /// The value, escaped.
        from: String,
        /// What is wrong with it.
        why: Words,
    },
    /// Configured sources (`INTACT_REPAIR_FROM`, its line in the settings file) whose words
    /// cannot be sources.
    #[error("{text:?}: {why}")]
    Configured {
        /// The setting's text.
        text: String,
        /// What is wrong with it.
        why: Words,
    },
    /// A `--from-command` template that could not run a path safely.
    #[error("--from-command {template:?}{why}")]
    Command {
        /// The template.
        template: String,
        /// What is wrong with it.
        why: Template,
    },
}

/// What is wrong with the shell words of a source.
#[derive(Debug, thiserror::Error)]
pub enum Words {
    /// A quote opened and not closed.
    #[error("a quote is not closed")]
    UnclosedQuote,
    /// A repository that would reach its tool as an option.
    #[error("a repository may not begin with '-'")]
    DashRepository,
    /// A selector that takes a value, without one.
    #[error("{tool} selector {selector} wants a value")]
    WantsValue {
        /// restic or borg.
        tool: &'static str,
        /// The selector.
        selector: String,
    },
    /// A word that is none of the tool's selectors.
    #[error(
        "{word} is not one of the {tool} selectors intact passes on ({known}); a repository \
         with spaces in its name is quoted: '{tool}:/My Backups'"
    )]
    NotASelector {
        /// restic or borg.
        tool: &'static str,
        /// The word.
        word: String,
        /// The selectors there are.
        known: String,
    },
    /// An option among configured sources, after no backup source.
    #[error("{word} is neither a source nor a selector of the restic: or borg: source before it")]
    Stray {
        /// The word.
        word: String,
    },
}

/// What is wrong with a `--from-command` template.
#[derive(Debug, thiserror::Error)]
pub enum Template {
    /// A placeholder inside the template's own quotes.
    #[error(
        ": {placeholder} is inside quotes; intact quotes the path itself, so write it without \
         quotes around it"
    )]
    QuotedPlaceholder {
        /// `{}` or `{ssh}`.
        placeholder: &'static str,
    },
    /// `{}` in a command that runs ssh.
    #[error(
        ": ssh hands the path to a shell on the other host, which parses it again; use {{ssh}} \
         there (quoted for both shells)"
    )]
    SshPath,
    /// No placeholder at all.
    #[error(" has no {{}} (or {{ssh}}) for the file's path")]
    NoPath,
}

/// Streams what `cmd` prints into `sink`, under `watch`; stops it as soon as the sink wants
/// no more (its error is given back as it was: a copy refused is not a source unusable).
pub(super) fn stream(
    cmd: &mut std::process::Command,
    watch: process::Watch<'_>,
    sink: &mut dyn FnMut(Chunk<'_>) -> io::Result<()>,
) -> io::Result<()> {
    let mut refused = None;
    let mut buf = vec![0u8; 1 << 20];
    let ran = process::run(cmd, watch, &[], &[0], &mut |out| loop {
        match out.read(&mut buf)? {
            0 => return Ok(()),
            n => sink(Chunk::Data(&buf[..n])).map_err(|e| {
                let kept = io::Error::new(e.kind(), e.to_string());
                refused = Some(e);
                kept
            })?,
        }
    });
    match (refused, ran) {
        (Some(e), _) => Err(e),
        (None, Ok(())) => Ok(()),
        (None, Err(e)) => Err(io::Error::other(e)),
    }
}

/// What sets how long a backup tool may stay silent, said where it stayed silent too long.
fn timeout_hint(e: &process::Error) -> &'static str {
    match e {
        process::Error::Stopped {
            why: process::Stop::Silent(_),
            ..
        } => " (--source-timeout)",
        _ => "",
    }
}

/// The source at `path`: a restic or borg repository (`restic:REPO`, `borg:REPO`, each
/// perhaps with its tool's selectors, unless a file of that name exists), a parity store, a
/// tree, a PAR2 set, or (any other file) an archive; or why it cannot be one (it does not
/// exist, a selector the tool does not have). A backup tool is stopped once it says nothing
/// for `silence`.
pub(crate) fn at(path: &Path, silence: std::time::Duration) -> Result<Box<dyn Search>, BadSource> {
    if std::fs::symlink_metadata(path).is_err() {
        return backup::parse(path, silence)
            .unwrap_or_else(|| Err(BadSource::NotThere { from: escape(path) }));
    }
    let path = path.to_path_buf();
    Ok(if Store::is_store(&path) {
        Box::new(ParityStore(path))
    } else if path.is_dir() {
        Box::new(Tree(path))
    } else if path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("par2"))
    {
        Box::new(Par2Set(path))
    } else {
        Box::new(Archive(path))
    })
}

/// The damaged files still waiting, by the digest they want.
fn wanted(work: &dyn Attempts) -> HashMap<Digest, Vec<usize>> {
    let mut map: HashMap<Digest, Vec<usize>> = HashMap::new();
    for i in 0..work.count() {
        if let Some(w) = work.want(i) {
            map.entry(w.digest).or_default().push(i);
        }
    }
    map
}

fn all_done(work: &dyn Attempts) -> bool {
    work.remaining() == 0
}

/// An archive made by `intact archive create`: members are found by the tags they carry.
struct Archive(PathBuf);

impl Search for Archive {
    fn name(&self) -> String {
        escape(&self.0)
    }

    fn search(&self, work: &mut dyn Attempts, cancel: &AtomicBool) -> Result<(), Unusable> {
        let wanted = wanted(work);
        let shown = self.name();
        // Frames are read on every core; a member that is wanted takes the work for the
        // time its copy is verified and staged.
        let work = Mutex::new(work);
        let threads = crate::fs::sys::cores();
        let offer = |visit: &mut archive::Visit<'_, '_>| {
            let m = visit.member;
            if m.kind != archive::Kind::File || cancel.load(Ordering::Relaxed) {
                return;
            }
            let stored = m.stored();
            let Some(indices) = stored.tags.iter().find_map(|t| wanted.get(&t.digest)) else {
                return;
            };
            let mut work = work.lock().unwrap_or_else(|e| e.into_inner());
            // One offer per content: the repairer gives its bytes to every file that wants
            // them.
            let first = indices.iter().copied().find(|&i| {
                work.want(i)
                    .is_some_and(|w| w.size.is_none_or(|s| s == m.size))
            });
            if let Some(i) = first {
                let from = format!("{shown} ({})", escape(&m.path()));
                work.offer(i, &from, &mut |sink| visit.data(sink));
            }
        };
        archive::read(&self.0, threads, offer, |()| {
            let work = work.lock().unwrap_or_else(|e| e.into_inner());
            if cancel.load(Ordering::Relaxed) || all_done(&**work) {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })
        .map_err(Unusable::from)
    }
}

/// A tree of tagged files: a backup, a mirror, another disk.
struct Tree(PathBuf);

impl Search for Tree {
    fn name(&self) -> String {
        escape(&self.0)
    }

    fn search(&self, work: &mut dyn Attempts, cancel: &AtomicBool) -> Result<(), Unusable> {
        let wanted = wanted(work);
        let mut candidates: HashMap<Digest, Vec<PathBuf>> = HashMap::new();
        crate::fs::walk::tagged(std::slice::from_ref(&self.0), cancel, |path, tags| {
            if let Some(t) = tags.iter().find(|t| wanted.contains_key(&t.digest)) {
                candidates.entry(t.digest).or_default().push(path);
            }
        });
        let shown = self.name();
        for (digest, indices) in wanted {
            let Some(found) = candidates.get(&digest) else {
                continue;
            };
            for i in indices {
                let Some(want) = work.want(i) else {
                    continue;
                };
                let (target, size) = (want.path.clone(), want.size);
                let mut found = found.clone();
                // The copy at the same relative path first, then the closest names.
                found.sort_by_key(|p| std::cmp::Reverse(common_suffix(&want.rel, p)));
                for path in found {
                    if work.want(i).is_none() || cancel.load(Ordering::Relaxed) {
                        break;
                    }
                    let len = crate::fs::sys::lstat(&path).map(|m| m.len()).ok();
                    if same_file(&path, &target) || size.is_some_and(|s| Some(s) != len) {
                        continue;
                    }
                    let from = format!("{shown} ({})", escape(&path));
                    work.offer(i, &from, &mut |sink| read_file(&path, sink));
                }
            }
        }
        Ok(())
    }
}

/// A PAR2 set made by any PAR2 program: its files are found by name, relative to the set's
/// directory (as par2cmdline does), and rebuilt for the damaged files they are.
struct Par2Set(PathBuf);

impl Search for Par2Set {
    fn name(&self) -> String {
        format!("PAR2 set {}", escape(&self.0))
    }

    fn search(&self, work: &mut dyn Attempts, cancel: &AtomicBool) -> Result<(), Unusable> {
        let set = parity::load(&self.0)?;
        let base = crate::fs::atomic::parent(&self.0);
        let paths: Vec<Option<PathBuf>> = set
            .files
            .iter()
            .map(|f| parity::resolve(base, &f.name))
            .collect();
        let from = self.name();
        // Every damaged file of the set, rebuilt from one reading of its files.
        let mut targets = Vec::new();
        for i in 0..work.count() {
            if cancel.load(Ordering::Relaxed) {
                return Ok(());
            }
            let Some(want) = work.want(i) else {
                continue;
            };
            let at = paths
                .iter()
                .position(|p| p.as_ref().is_some_and(|p| same_file(p, &want.path)));
            if let Some(at) = at {
                targets.push((i, at));
            }
        }
        if !targets.is_empty() {
            rebuild(work, &targets, &set, &paths, &from);
        }
        Ok(())
    }
}

/// A parity store made by `intact protect`: sets are found by the damaged file's digest.
struct ParityStore(PathBuf);

impl Search for ParityStore {
    fn name(&self) -> String {
        format!("parity in {}", escape(&self.0))
    }

    fn search(&self, work: &mut dyn Attempts, cancel: &AtomicBool) -> Result<(), Unusable> {
        let store = Store::read(&self.0)?;
        let from = self.name();
        let mut by_digest = None;
        // Damaged files by the set that protects them, in the order first wanted: a pack's
        // set is loaded, its files read and its equations solved once for all its damaged
        // members (once each, they made a mass repair from packs 165 files/s).
        let mut sets: Vec<Vec<usize>> = Vec::new();
        let mut by_index: HashMap<PathBuf, usize> = HashMap::new();
        for i in 0..work.count() {
            let Some(index) = work.want(i).and_then(|w| store.index_of(&w.digest)) else {
                continue;
            };
            let at = *by_index.entry(index).or_insert_with(|| {
                sets.push(Vec::new());
                sets.len() - 1
            });
            sets[at].push(i);
        }
        for files in sets {
            if cancel.load(Ordering::Relaxed) {
                break;
            }
            let Some(digest) = work.want(files[0]).map(|w| w.digest) else {
                continue;
            };
            let found = match store.find(&digest) {
                None => continue,
                Some(Ok(found)) => found,
                Some(Err(e)) => {
                    for i in files {
                        work.tried(i, format!("{from} unusable ({e})"));
                    }
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
                    let named = parity::resolve(&store.root, &f.name)
                        .filter(|p| crate::fs::sys::lstat(p).is_ok_and(|m| m.len() == f.len));
                    named.or_else(|| {
                        digest.and_then(|d| locate(work.roots(), &d, &mut by_digest, cancel))
                    })
                })
                .collect();
            // Each damaged file's place in the set; two with the same content (one place)
            // are rebuilt in turns, each read where it is.
            let mut rounds: Vec<Vec<(usize, usize)>> = Vec::new();
            for i in files {
                let Some(want) = work.want(i) else { continue };
                let Some(at) = found.members.iter().position(|d| *d == Some(want.digest)) else {
                    work.tried(
                        i,
                        format!("{from} unusable (the pack does not describe the file)"),
                    );
                    continue;
                };
                match rounds.iter_mut().find(|r| r.iter().all(|&(_, a)| a != at)) {
                    Some(round) => round.push((i, at)),
                    None => rounds.push(vec![(i, at)]),
                }
            }
            for round in rounds {
                rebuild(work, &round, &found.set, &paths, &from);
            }
        }
        Ok(())
    }
}

/// Rebuilds the damaged files `targets` (each wanted file's index, and its place in `set`),
/// whose set's other files are at `paths`, and offers each result.
fn rebuild(
    work: &mut dyn Attempts,
    targets: &[(usize, usize)],
    set: &par2::Set,
    paths: &[Option<PathBuf>],
    from: &str,
) {
    let targets: Vec<(usize, usize, PathBuf)> = targets
        .iter()
        .filter_map(|&(i, at)| work.want(i).map(|w| (i, at, w.path.clone())))
        .collect();
    let threads = crate::fs::sys::cores();
    // Damaged files are read where they are now; the set's other files where it says.
    let mut open = |j: usize| -> io::Result<Option<Box<dyn Read>>> {
        let path = match targets.iter().find(|(_, at, _)| *at == j) {
            Some((_, _, target)) => Some(target),
            None => paths[j].as_ref(),
        };
        match path.map(|p| crate::fs::sys::open_regular(p)) {
            None => Ok(None),
            Some(Ok(f)) => Ok(Some(Box::new(f))),
            Some(Err(e)) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Some(Err(e)) => Err(e),
        }
    };
    let recovered = match set.recover(&mut open, threads) {
        Ok(r) => r,
        Err(e) => {
            let why = match e {
                par2::Error::TooMuchDamage { damaged, available } => format!(
                    "{from}: {damaged} slices damaged, only {available} recovery slices \
                     (more damage than the redundancy covers)"
                ),
                e => format!("{from} unusable ({e})"),
            };
            for (i, _, _) in targets {
                work.tried(i, why.clone());
            }
            return;
        }
    };
    for (i, at, target) in targets {
        work.offer(i, from, &mut |sink| {
            // A file gone (`--missing`) is rebuilt whole.
            let mut current = match crate::fs::sys::open_regular(&target) {
                Ok(f) => Some(f),
                Err(e) if e.kind() == io::ErrorKind::NotFound => None,
                Err(e) => return Err(e),
            };
            let current = current.as_mut().map(|f| f as &mut dyn Read);
            set.restore(at, &recovered, current, &mut |bytes| {
                sink(Chunk::Data(bytes))
            })
            .map_err(|e| match e {
                par2::Error::Io(e) => e,
                other => io::Error::other(other.to_string()),
            })
        });
    }
}

/// Where a file with `digest` is now, from the tags in the trees being repaired (read once,
/// on first need; the walk stops on `cancel`, as the run does).
fn locate(
    roots: &[PathBuf],
    digest: &Digest,
    by_digest: &mut Option<HashMap<Digest, PathBuf>>,
    cancel: &AtomicBool,
) -> Option<PathBuf> {
    let map = by_digest.get_or_insert_with(|| {
        let mut map = HashMap::new();
        crate::fs::walk::tagged(roots, cancel, |path, tags| {
            for t in tags {
                map.entry(t.digest).or_insert_with(|| path.clone());
            }
        });
        map
    });
    map.get(digest).cloned()
}

/// Streams a file's bytes.
pub(super) fn read_file(
    path: &Path,
    sink: &mut dyn FnMut(Chunk<'_>) -> io::Result<()>,
) -> io::Result<()> {
    let mut file = crate::fs::sys::open_regular(path)?;
    crate::fs::sys::advise_sequential(&file);
    let size = file.metadata()?.len();
    pour(&mut file, size, sink)
}

/// Streams what `bytes` holds (about `size` bytes, if known) into `sink`, in pieces of at
/// most 1 MiB and no larger than it: zeroing 1 MiB for each small file would cost more than
/// its read.
pub(super) fn pour(
    bytes: &mut dyn Read,
    size: u64,
    sink: &mut dyn FnMut(Chunk<'_>) -> io::Result<()>,
) -> io::Result<()> {
    let mut buf = vec![0u8; size.clamp(4096, 1 << 20) as usize];
    loop {
        match bytes.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => sink(Chunk::Data(&buf[..n]))?,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
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
    match (crate::fs::sys::lstat(a), crate::fs::sys::lstat(b)) {
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
