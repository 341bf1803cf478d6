//! Good copies in the backups people already have: restic and borg repositories. Their own command lines are called (their JSON listings, their
//! `dump` and `extract --stdout`), never their repository formats: what their users trust,
//! and what stays compatible. Nothing is ever written into a repository (`--no-lock`,
//! `--bypass-lock`).
//!
//! A backup tool offers bytes only; the tag on the damaged file says which bytes are good.
//! For each damaged file every distinct version of its path is tried, newest first (a
//! version is distinct when the tool's own change detection would have read the file again:
//! another size, mtime or ctime), then files of its size elsewhere (moved since the backup);
//! each is streamed through the same verified replace as every other source, so the copies
//! the backups took of the rot itself are passed over for the older good one, however many
//! there are. The newest versions are listed whole (a moved file is found there); older ones
//! only in the damaged files' folders, so that a year of nightly snapshots costs a listing
//! of a few folders each.

mod borg;
mod grammar;
mod hunt;
mod restic;

use std::ffi::OsStr;
use std::io::{self, BufRead, Read};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use super::{Attempts, Search, Unusable, stream};
use crate::process::{self, Watch};
use crate::text::escape;
use hunt::Hunt;

use grammar::named;
pub(super) use grammar::parse;
pub use grammar::sources;

/// Versions of a repository listed whole at most, newest first: to learn where a tree that
/// is mounted elsewhere now was backed up from, and to find files of a damaged file's size
/// elsewhere (moved since the backup). Every other listing reads only the damaged files'
/// folders.
pub const LISTED_WHOLE: usize = 10;
/// Copies of its size found elsewhere tried for a damaged file at most.
pub const ELSEWHERE: usize = 2;

/// One version of a backup: a restic snapshot, a borg archive.
struct Version {
    /// What the tool names it by.
    id: String,
    /// For people: its short id or name and its time.
    label: String,
    /// When it was made (RFC 3339, which sorts as time does).
    time: String,
    /// Versions of one group hold the same folders (restic: of one host and paths).
    group: String,
}

/// A backup tool's repository. Paths go in and come out as the tools list them, without a
/// leading slash (borg's way; restic's has one, which its methods add and take away).
trait Repository {
    /// How it is named in reports (`restic:REPO --host nas`).
    fn name(&self) -> String;
    /// Its versions (those its selectors choose).
    fn versions(&self, watch: Watch<'_>) -> Result<Vec<Version>, Unusable>;
    /// The files of a version (only under the folders `within`, unless it is empty): each
    /// path, its size, and what the tool's change detection knows of it (mtime and ctime).
    fn list(
        &self,
        v: &Version,
        within: &[Vec<u8>],
        watch: Watch<'_>,
        each: &mut dyn FnMut(&str, u64, String),
    ) -> Result<(), Unusable>;
    /// The command that prints the file at `path` of a version.
    fn dump(&self, v: &Version, path: &[u8]) -> Command;
    /// The files at `paths` of a version, fetched by one run of the tool (one `dump` each
    /// would start the tool, and read its index, as many times): `got` is given each path
    /// the tool delivers and its bytes.
    fn fetch(
        &self,
        v: &Version,
        paths: &[Vec<u8>],
        watch: Watch<'_>,
        got: &mut dyn FnMut(&[u8], &mut dyn Read),
    ) -> Result<(), Unusable>;
    /// `path` as the tool shows it.
    fn shown(&self, path: &[u8]) -> Vec<u8>;
}

/// What a listing says of a file that the tool's change detection looks at: two versions of
/// a path with the same size (compared apart), mtime and ctime hold the same stored content.
fn stamp(line: &serde_json::Value) -> String {
    format!("{} {}", line["mtime"], line["ctime"])
}

/// A repository as a source of copies, its tool given up on once silent for `silence`.
struct Backup<R> {
    repo: R,
    silence: Duration,
}

/// A damaged file, as a repository is searched for it.
struct Sought {
    /// Its index in the work.
    i: usize,
    /// Its absolute path without the leading slash.
    own: Vec<u8>,
    /// Which of the trees it is under (an index into the maps).
    tree: usize,
    size: Option<u64>,
}

/// Where a tree was backed up from: its folder `own` (absolute, without the leading slash)
/// is `there` in the repository. Both empty: the tree is where it was backed up.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
struct Map {
    own: Vec<u8>,
    there: Vec<u8>,
}

impl Map {
    /// Where `own` (a path under the tree) is in the repository.
    fn apply(&self, own: &[u8]) -> Vec<u8> {
        let rest = if self.own.is_empty() {
            own
        } else {
            own.strip_prefix(self.own.as_slice())
                .and_then(|r| r.strip_prefix(b"/"))
                .unwrap_or(own)
        };
        if self.there.is_empty() {
            rest.to_vec()
        } else {
            [&self.there[..], b"/", rest].concat()
        }
    }

    /// The map under which `own` is `listed`, by their longest common tail of whole names
    /// (at least the file's own name).
    fn between(own: &[u8], listed: &str) -> Option<Map> {
        let own_parts: Vec<&[u8]> = own.split(|&b| b == b'/').collect();
        let listed_parts: Vec<&str> = listed.split('/').collect();
        let common = own_parts
            .iter()
            .rev()
            .zip(listed_parts.iter().rev())
            .take_while(|(o, l)| loose(o) == loose(l.as_bytes()))
            .count();
        (common > 0).then(|| Map {
            own: own_parts[..own_parts.len() - common].join(&b'/'),
            there: listed_parts[..listed_parts.len() - common]
                .join("/")
                .into_bytes(),
        })
    }
}

/// A path compared as the tools print it: a name that is not UTF-8 is printed lossily (the
/// bytes given back to the tool are the file's own).
fn loose(path: &[u8]) -> String {
    String::from_utf8_lossy(path).replace('\u{fffd}', "?")
}

/// A same-path copy a listing showed, or one of a damaged file's size elsewhere.
struct Copy {
    version: usize,
    path: Vec<u8>,
    stamp: String,
}

/// A copy at damaged file `k`'s path (as mapped), of `size`.
struct Hit {
    k: usize,
    copy: Copy,
    size: u64,
}

impl<R: Repository + Send> Backup<R> {
    /// Offers `copy` (of version `versions[copy.version]`) to damaged file `s`, labelled
    /// with where its tree was backed up from if that is not where it is now.
    fn label(&self, copy: &Copy, versions: &[Version], map: &Map) -> String {
        let shown = |p: &[u8]| escape(Path::new(OsStr::from_bytes(&self.repo.shown(p))));
        let mut from = format!(
            "{} {} ({}",
            self.repo.name(),
            versions[copy.version].label,
            shown(&copy.path)
        );
        if *map != Map::default() {
            from.push_str(&format!(
                ", this tree's {} backed up as {}",
                escape(Path::new(OsStr::from_bytes(&[b"/", &map.own[..]].concat()))),
                shown(&map.there)
            ));
        }
        from.push(')');
        from
    }

    /// Offers each copy of `copies` (of one version) to its damaged file: all in one run of
    /// the tool where there are several, each on its own (`dump`) where there is one or the
    /// tool did not deliver it.
    /// `blind`: the paths were not listed (the newest version, tried before any listing):
    /// one the tool does not deliver is not there.
    #[allow(clippy::too_many_arguments)]
    fn offer(
        &self,
        work: &mut dyn Attempts,
        sought: &[Sought],
        copies: Vec<(usize, Copy)>,
        versions: &[Version],
        maps: &[Map],
        watch: Watch<'_>,
        blind: bool,
    ) {
        let label = |k: usize, copy: &Copy| self.label(copy, versions, &maps[sought[k].tree]);
        let mut delivered = vec![false; copies.len()];
        if copies.len() > 1 || blind {
            let version = &versions[copies[0].1.version];
            let mut paths: Vec<Vec<u8>> = copies.iter().map(|(_, c)| c.path.clone()).collect();
            paths.sort();
            paths.dedup();
            // What the tool could not deliver is dumped on its own below.
            let fetched = self.repo.fetch(version, &paths, watch, &mut |path, bytes| {
                for (n, (k, copy)) in copies.iter().enumerate() {
                    if delivered[n] || copy.path != path {
                        continue;
                    }
                    delivered[n] = true;
                    if work.want(sought[*k].i).is_some() {
                        work.offer(sought[*k].i, &label(*k, copy), &mut |sink| {
                            super::pour(bytes, u64::MAX, sink)
                        });
                        break;
                    }
                }
            });
            if blind && fetched.is_ok() {
                return;
            }
        }
        for ((k, copy), delivered) in copies.iter().zip(delivered) {
            if delivered || work.want(sought[*k].i).is_none() {
                continue;
            }
            let version = &versions[copy.version];
            work.offer(sought[*k].i, &label(*k, copy), &mut |sink| {
                stream(&mut self.repo.dump(version, &copy.path), watch, sink)
            });
        }
    }
}

impl<R: Repository + Send> Search for Backup<R> {
    fn name(&self) -> String {
        self.repo.name()
    }

    /// Versions newest first, each listed in the damaged files' folders only, every
    /// distinct version of a file's path tried as soon as it is listed: a file whose good
    /// copy is in the newest backup costs one listing of a few folders. The newest versions
    /// are listed whole while a tree's place in the repository is not known (a tree
    /// mounted elsewhere now: found by the longest tail of names and sizes that the damaged
    /// files share with the listing) and, for files still wanting, to find files of their
    /// size elsewhere.
    fn search(&self, work: &mut dyn Attempts, cancel: &AtomicBool) -> Result<(), Unusable> {
        let watch = Watch::quiet_for(cancel, self.silence);
        let (sought, trees) = sought(work);
        if sought.is_empty() {
            return Ok(());
        }
        let mut versions = self.repo.versions(watch)?;
        // Newest first (tools list oldest first: of two made in the same second, the one
        // listed later is the newer).
        versions.reverse();
        versions.sort_by(|a, b| b.time.cmp(&a.time));
        Hunt::new(self, watch, sought, trees, versions).run(work)
    }
}

/// The damaged files the work still wants, each with the tree it is under (its path less its
/// part under the root it was found under), and the number of trees.
fn sought(work: &dyn Attempts) -> (Vec<Sought>, usize) {
    let mut trees: Vec<Vec<u8>> = Vec::new();
    let sought = (0..work.count())
        .filter_map(|i| {
            let w = work.want(i)?;
            let abs = crate::state::absolute(&w.path).into_os_string().into_vec();
            let own = abs.strip_prefix(b"/").unwrap_or(&abs).to_vec();
            let depth = w.rel.components().count();
            let parts: Vec<&[u8]> = own.split(|&b| b == b'/').collect();
            let tree_path = parts[..parts.len().saturating_sub(depth)].join(&b'/');
            let tree = trees
                .iter()
                .position(|t| *t == tree_path)
                .unwrap_or_else(|| {
                    trees.push(tree_path);
                    trees.len() - 1
                });
            Some(Sought {
                i,
                own,
                tree,
                size: w.size,
            })
        })
        .collect();
    (sought, trees.len())
}

/// Whether `sources` (`--from` values) name a restic repository while the environment holds
/// none of the ways restic is given its password (every restic repository has one): the
/// nightly unit's repair would fail, so `notify --test` and the message say so. (A borg
/// repository may have no passphrase: not said.)
pub fn restic_without_password(sources: &[String]) -> bool {
    let restic = sources.iter().any(|s| {
        shlex::split(s)
            .and_then(|w| w.into_iter().next())
            .is_some_and(|w| w.starts_with("restic:"))
    });
    restic && !restic::password_given()
}

/// The backup tool `program` with `flag` (what keeps it from writing to the repository: a
/// lock), its repository, where one is named, in the tool's variable `var`, never in argv: a
/// repository URL may hold a password, and `ps` shows argv to every user.
fn tool(program: &str, flag: &str, var: &str, repo: Option<&std::ffi::OsStr>) -> Command {
    let mut c = Command::new(program);
    c.arg(flag);
    if let Some(repo) = repo {
        c.env(var, repo);
    }
    c
}

/// What `cmd` prints, read as one JSON document (`what` names it in errors).
fn json<T: serde::de::DeserializeOwned>(
    cmd: &mut Command,
    watch: Watch<'_>,
    what: &'static str,
) -> Result<T, Unusable> {
    let out = process::output(cmd, watch)?;
    serde_json::from_slice(&out).map_err(|source| Unusable::Output { what, source })
}

/// Runs `cmd`, calling `each` with every line of its JSON Lines output it can read (lines it
/// cannot, such as names borg escapes as lone surrogates, are passed over).
fn lines(
    cmd: &mut Command,
    watch: Watch<'_>,
    mut each: impl FnMut(&serde_json::Value),
) -> Result<(), Unusable> {
    let mut take = |line: &[u8]| {
        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(line) {
            each(&v);
        }
    };
    process::run(cmd, watch, &[], &[0], &mut |out| {
        for line in io::BufReader::with_capacity(1 << 20, out).split(b'\n') {
            take(&line?);
        }
        Ok(())
    })
    .map_err(Unusable::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_is_found_where_it_was_backed_up_from_by_the_tail_it_shares() {
        // Where it was: no map, and the file's own bytes (not the tool's lossy print).
        let own = b"srv/photos/2024/caf\xe9.jpg";
        let same = Map::between(own, "srv/photos/2024/caf\u{fffd}.jpg").unwrap();
        assert_eq!(same, Map::default());
        assert_eq!(same.apply(own), own.to_vec());
        // Mounted elsewhere now: its folder maps to where it was.
        let moved = Map::between(b"mnt/copy/t/f1", "tmp/x/t/f1").unwrap();
        assert_eq!(
            (&moved.own[..], &moved.there[..]),
            (&b"mnt/copy"[..], &b"tmp/x"[..])
        );
        assert_eq!(moved.apply(b"mnt/copy/t/sub/g"), b"tmp/x/t/sub/g".to_vec());
        // A borg archive of a relative path.
        let relative = Map::between(b"tmp/rx/t/f1", "t/f1").unwrap();
        assert_eq!(relative.apply(b"tmp/rx/t/sub/g"), b"t/sub/g".to_vec());
        // Nothing in common, not even the name.
        assert_eq!(Map::between(b"a/b", "c/d"), None);
        assert_eq!(Map::between(b"a/xb", "a/b"), None);
    }
}
