//! Good copies in the backups people already have: restic and borg repositories, and any
//! command that prints a file. Their own command lines are called (their JSON listings, their
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

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::io::{self, Read};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::{Attempts, Search, Unusable};
use crate::archive::Chunk;
use crate::process::{Watch, Watched};
use crate::text::escape;

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

/// A restic repository: `restic:REPO`, or `restic:` for `$RESTIC_REPOSITORY`, then, if
/// wanted, restic's own snapshot selectors (`--host`, `--tag`, `--path`, `--latest`, ids).
/// The password comes as restic users give it: `RESTIC_PASSWORD`, `RESTIC_PASSWORD_FILE`,
/// `RESTIC_PASSWORD_COMMAND`.
pub(super) struct Restic {
    repo: Option<OsString>,
    select: Vec<String>,
}

impl Restic {
    fn restic(&self) -> Command {
        let mut c = Command::new("restic");
        c.arg("--no-lock");
        // By its variable, not in argv: a repository URL may hold a password (`ps` shows
        // argv to every user).
        if let Some(repo) = &self.repo {
            c.env("RESTIC_REPOSITORY", repo);
        }
        c
    }
}

impl Repository for Restic {
    fn name(&self) -> String {
        named("restic:", &self.repo, &self.select)
    }

    fn versions(&self, watch: Watch<'_>) -> Result<Vec<Version>, Unusable> {
        let mut c = self.restic();
        c.args(["snapshots", "--json"]).args(&self.select);
        let out = output(&mut c, "restic", watch)?;
        let snapshots: Vec<serde_json::Value> =
            serde_json::from_slice(&out).map_err(|source| Unusable::Output {
                what: "restic snapshots",
                source,
            })?;
        Ok(snapshots
            .iter()
            .filter_map(|s| {
                let id = s["id"].as_str()?.to_string();
                let time = s["time"].as_str()?.to_string();
                let short = s["short_id"].as_str().unwrap_or(&id[..id.len().min(8)]);
                Some(Version {
                    label: format!("snapshot {short} of {}", &time[..time.len().min(19)]),
                    group: format!("{} {}", s["hostname"], s["paths"]),
                    id,
                    time,
                })
            })
            .collect())
    }

    fn list(
        &self,
        v: &Version,
        within: &[Vec<u8>],
        watch: Watch<'_>,
        each: &mut dyn FnMut(&str, u64, String),
    ) -> Result<(), Unusable> {
        let mut c = self.restic();
        c.args(["ls", "--json", &v.id]);
        for dir in within {
            c.arg(OsStr::from_bytes(&self.shown(dir)));
        }
        lines(&mut c, "restic", watch, |line| {
            if line["struct_type"] == "node"
                && line["type"] == "file"
                && let (Some(path), Some(size)) = (line["path"].as_str(), line["size"].as_u64())
            {
                each(path.trim_start_matches('/'), size, stamp(line));
            }
        })
    }

    fn dump(&self, v: &Version, path: &[u8]) -> Command {
        let mut c = self.restic();
        c.args(["dump", &v.id])
            .arg(OsStr::from_bytes(&self.shown(path)));
        c
    }

    /// `restic restore --include` into a temp folder (restic's dump prints one file, or a
    /// folder whole), each file then read from there.
    fn fetch(
        &self,
        v: &Version,
        paths: &[Vec<u8>],
        watch: Watch<'_>,
        got: &mut dyn FnMut(&[u8], &mut dyn Read),
    ) -> Result<(), Unusable> {
        let into = tempfile::Builder::new()
            .prefix("intact-restore-")
            .tempdir()
            .map_err(Unusable::Unreadable)?;
        let mut c = self.restic();
        c.args(["restore", &v.id, "--target"]).arg(into.path());
        for p in paths {
            c.arg("--include")
                .arg(OsStr::from_bytes(&glob_escaped(&self.shown(p))));
        }
        output(&mut c, "restic", watch)?;
        for p in paths {
            let restored = into.path().join(OsStr::from_bytes(p));
            if let Ok(mut file) = crate::fs::sys::open_regular(&restored) {
                got(p, &mut file);
            }
        }
        Ok(())
    }

    fn shown(&self, path: &[u8]) -> Vec<u8> {
        [b"/", path].concat()
    }
}

/// A borg repository: `borg:REPO`, `borg:REPO::ARCHIVE` (that archive only), or `borg:` for
/// `$BORG_REPO`, then, if wanted, borg's own archive selectors (`--glob-archives`, `--first`,
/// `--last`). The passphrase comes as borg users give it: `BORG_PASSPHRASE`,
/// `BORG_PASSCOMMAND`, `BORG_PASSPHRASE_FD`.
pub(super) struct Borg {
    repo: Option<OsString>,
    archive: Option<String>,
    select: Vec<String>,
}

impl Borg {
    fn borg(&self) -> Command {
        let mut c = Command::new("borg");
        c.arg("--bypass-lock");
        // By its variable, not in argv (see `Restic::restic`); archives are then `::NAME`.
        if let Some(repo) = &self.repo {
            c.env("BORG_REPO", repo);
        }
        c
    }

    fn location(&self, archive: &str) -> OsString {
        OsString::from(format!("::{archive}"))
    }
}

impl Repository for Borg {
    fn name(&self) -> String {
        let mut repo = self.repo.clone();
        if let (Some(r), Some(a)) = (&mut repo, &self.archive) {
            r.push(format!("::{a}"));
        }
        named("borg:", &repo, &self.select)
    }

    fn versions(&self, watch: Watch<'_>) -> Result<Vec<Version>, Unusable> {
        let mut c = self.borg();
        c.args(["list", "--json"]).args(&self.select);
        let out = output(&mut c, "borg", watch)?;
        let listed: serde_json::Value =
            serde_json::from_slice(&out).map_err(|source| Unusable::Output {
                what: "borg list",
                source,
            })?;
        let archives = listed["archives"].as_array().cloned().unwrap_or_default();
        Ok(archives
            .iter()
            .filter_map(|a| {
                let name = a["name"].as_str()?.to_string();
                let time = a["time"].as_str().or(a["start"].as_str())?.to_string();
                Some(Version {
                    label: format!("archive {name} of {}", &time[..time.len().min(19)]),
                    // borg's listing of archives does not say what each holds.
                    group: name.clone(),
                    id: name,
                    time,
                })
            })
            .filter(|v| self.archive.as_deref().is_none_or(|a| a == v.id))
            .collect())
    }

    fn list(
        &self,
        v: &Version,
        within: &[Vec<u8>],
        watch: Watch<'_>,
        each: &mut dyn FnMut(&str, u64, String),
    ) -> Result<(), Unusable> {
        let mut c = self.borg();
        // With --json-lines, the keys --format names are the ones listed.
        c.args([
            "list",
            "--json-lines",
            "--format",
            "{type}{path}{size}{mtime}{ctime}",
        ])
        .arg(self.location(&v.id))
        // Names after `--`: a file named `-x` is no option.
        .arg("--");
        for dir in within {
            c.arg(OsStr::from_bytes(dir));
        }
        lines(&mut c, "borg", watch, |line| {
            if line["type"] == "-"
                && let (Some(path), Some(size)) = (line["path"].as_str(), line["size"].as_u64())
            {
                each(path.trim_start_matches('/'), size, stamp(line));
            }
        })
    }

    fn dump(&self, v: &Version, path: &[u8]) -> Command {
        let mut c = self.borg();
        c.args(["extract", "--stdout"])
            .arg(self.location(&v.id))
            .arg("--")
            .arg(OsStr::from_bytes(path));
        c
    }

    /// `borg export-tar` of the files alone, read as it streams by.
    fn fetch(
        &self,
        v: &Version,
        paths: &[Vec<u8>],
        watch: Watch<'_>,
        got: &mut dyn FnMut(&[u8], &mut dyn Read),
    ) -> Result<(), Unusable> {
        let mut c = self.borg();
        c.arg("export-tar")
            .arg(self.location(&v.id))
            .args(["-", "--"]);
        for p in paths {
            c.arg(OsStr::from_bytes(p));
        }
        // borg ends with 1, a warning, when a path is not in the archive.
        read_from(&mut c, "borg", watch, &[0, 1], &mut |out| {
            for entry in tar::Archive::new(&mut *out).entries()? {
                let mut entry = entry?;
                if entry.header().entry_type().is_file() {
                    let path = entry.path_bytes().into_owned();
                    got(&path, &mut entry);
                }
            }
            // The archive's end: the tool ends as it would have.
            io::copy(out, &mut io::sink())?;
            Ok(())
        })
    }

    fn shown(&self, path: &[u8]) -> Vec<u8> {
        path.to_vec()
    }
}

/// The selectors of each tool that choose versions, and whether each takes a value: the
/// tool's own, passed to its listing of versions as they are. Others are refused (one such
/// as `--repo` or `--json` would change what intact reads).
const RESTIC_SELECTORS: &[(&str, bool)] = &[
    ("--host", true),
    ("-H", true),
    ("--tag", true),
    ("--path", true),
    ("--latest", true),
];
const BORG_SELECTORS: &[(&str, bool)] = &[
    ("--glob-archives", true),
    ("-a", true),
    ("--first", true),
    ("--last", true),
];

/// `restic:REPO` or `borg:REPO[::ARCHIVE]`, each perhaps followed by its tool's selectors
/// (from the first word that begins with `-`), if `from` names one; its tool is given up on
/// once it says nothing for `silence`. Selectors the tool does not have are an error.
pub(super) fn parse(from: &Path, silence: Duration) -> Option<Result<Box<dyn Search>, String>> {
    let raw = from.as_os_str().as_bytes();
    let (tool, rest) = if let Some(rest) = raw.strip_prefix(b"restic:") {
        ("restic", rest)
    } else {
        ("borg", raw.strip_prefix(b"borg:")?)
    };
    // The repository ends where its selectors begin.
    let cut = rest
        .windows(2)
        .position(|w| w[0].is_ascii_whitespace() && w[1] == b'-')
        .unwrap_or(rest.len());
    let (location, words) = rest.split_at(cut);
    // A repository that begins with `-` would reach the tool as an option (`borg:--rsh=CMD`
    // runs CMD).
    if location.starts_with(b"-") {
        return Some(Err(format!(
            "--from {}: a repository may not begin with '-'",
            escape(from)
        )));
    }
    let select = match std::str::from_utf8(words)
        .map_err(|_| format!("--from {}: selectors must be UTF-8", escape(from)))
        .and_then(|w| selectors(tool, w))
    {
        Ok(s) => s,
        Err(e) => return Some(Err(e)),
    };
    let repo = |r: &[u8]| (!r.is_empty()).then(|| OsString::from_vec(r.to_vec()));
    let backup = |repo| -> Box<dyn Search> { Box::new(Backup { repo, silence }) };
    Some(Ok(if tool == "restic" {
        backup(Restic {
            repo: repo(location),
            select,
        })
    } else {
        let (repo_part, archive) = match location.windows(2).rposition(|w| w == b"::") {
            Some(at) => (
                &location[..at],
                Some(String::from_utf8_lossy(&location[at + 2..]).into_owned()),
            ),
            None => (location, None),
        };
        Box::new(Backup {
            repo: Borg {
                repo: repo(repo_part),
                archive,
                select,
            },
            silence,
        })
    }))
}

/// The words after a repository, checked against its tool's selectors: `--flag value`,
/// `--flag=value`, and, for restic, snapshot ids.
fn selectors(tool: &str, words: &str) -> Result<Vec<String>, String> {
    let known = if tool == "restic" {
        RESTIC_SELECTORS
    } else {
        BORG_SELECTORS
    };
    let names = || {
        let mut n: Vec<&str> = known.iter().map(|(f, _)| *f).collect();
        if tool == "restic" {
            n.push("snapshot ids");
        }
        n.join(", ")
    };
    let mut out = Vec::new();
    let mut words = words.split_whitespace();
    while let Some(w) = words.next() {
        let (flag, value) = match w.split_once('=') {
            Some((flag, value)) => (flag, Some(value)),
            None => (w, None),
        };
        match known.iter().find(|(f, _)| *f == flag) {
            // Passed on as `--flag=VALUE` (the long name): a value can never become an
            // option of its own.
            Some((_, true)) => {
                let value = match value {
                    Some(v) => v,
                    None => words
                        .next()
                        .ok_or_else(|| format!("{tool} selector {w} wants a value"))?,
                };
                let long = match flag {
                    "-H" => "--host",
                    "-a" => "--glob-archives",
                    long => long,
                };
                out.push(format!("{long}={value}"));
            }
            Some(_) => out.push(w.to_string()),
            None if tool == "restic" && !w.starts_with('-') => out.push(w.to_string()),
            None => {
                return Err(format!(
                    "{w} is not one of the {tool} selectors intact passes on ({})",
                    names()
                ));
            }
        }
    }
    Ok(out)
}

/// What a listing says of a file that the tool's change detection looks at: two versions of
/// a path with the same size (compared apart), mtime and ctime hold the same stored content.
fn stamp(line: &serde_json::Value) -> String {
    format!("{} {}", line["mtime"], line["ctime"])
}

/// A repository's name for reports (`prefix` its tool's), or the environment variable it
/// comes from, with its selectors.
fn named(prefix: &str, repo: &Option<OsString>, select: &[String]) -> String {
    // Said in reports and messages: never a password in the repository's URL.
    let mut name = format!(
        "{prefix}{}",
        repo.as_deref().map_or_else(
            || "(from the environment)".into(),
            |r| crate::text::redact(&escape(Path::new(r)))
        )
    );
    for s in select {
        name.push(' ');
        name.push_str(s);
    }
    name
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

/// `path` as a restic pattern that matches it alone: its glob characters escaped (restic
/// matches each name with Go's `filepath.Match`, where a backslash escapes).
fn glob_escaped(path: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(path.len());
    for &b in path {
        if matches!(b, b'*' | b'?' | b'[' | b'\\') {
            out.push(b'\\');
        }
        out.push(b);
    }
    out
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
        let watch = Watch {
            cancel,
            silence: self.silence,
        };
        let (sought, trees) = sought(work);
        if sought.is_empty() {
            return Ok(());
        }
        let mut versions = self.repo.versions(watch)?;
        // Newest first (tools list oldest first: of two made in the same second, the one
        // listed later is the newer).
        versions.reverse();
        versions.sort_by(|a, b| b.time.cmp(&a.time));
        let mut hunt = Hunt::new(self, watch, sought, trees, versions);
        hunt.newest_unlisted(work);
        let mut v = 0;
        while v < hunt.versions.len() {
            if cancel.load(Ordering::Relaxed) || work.remaining() == 0 {
                return Ok(());
            }
            let open: Vec<usize> = hunt.open(work);
            if open.is_empty() {
                break;
            }
            // Not where they are now: this version again, whole, to find where.
            if !hunt.at_paths(v, &open, work)? {
                v += 1;
            }
        }
        hunt.elsewhere_listed(work)?;
        hunt.last_tries(work);
        Ok(())
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

/// One search of a repository for the damaged files of a repair: what it has learnt so far.
struct Hunt<'a, R> {
    backup: &'a Backup<R>,
    watch: Watch<'a>,
    sought: Vec<Sought>,
    /// Newest first.
    versions: Vec<Version>,
    /// Where each tree was backed up from.
    maps: Vec<Map>,
    /// A tree is placed once one of its files is found at its path (as mapped).
    placed: Vec<bool>,
    /// The trees whose files were not found where they are now: looked for in whole
    /// listings.
    lost: Vec<bool>,
    /// The damaged files of each size.
    by_size: HashMap<u64, Vec<usize>>,
    /// What each file's path held in a newer version (size and stamp): an older one holding
    /// the same is the same stored content, not tried again.
    seen: Vec<Vec<(u64, String)>>,
    /// Copies of each file's size found elsewhere in whole listings.
    elsewhere: Vec<Vec<Copy>>,
    /// Which versions were listed whole.
    listed_whole: Vec<bool>,
    /// The groups one of whose versions was listed whole.
    groups: Vec<String>,
}

impl<'a, R: Repository + Send> Hunt<'a, R> {
    fn new(
        backup: &'a Backup<R>,
        watch: Watch<'a>,
        sought: Vec<Sought>,
        trees: usize,
        versions: Vec<Version>,
    ) -> Self {
        let mut by_size: HashMap<u64, Vec<usize>> = HashMap::new();
        for (k, s) in sought.iter().enumerate() {
            if let Some(size) = s.size {
                by_size.entry(size).or_default().push(k);
            }
        }
        Hunt {
            backup,
            watch,
            seen: sought.iter().map(|_| Vec::new()).collect(),
            elsewhere: sought.iter().map(|_| Vec::new()).collect(),
            sought,
            listed_whole: vec![false; versions.len()],
            versions,
            maps: vec![Map::default(); trees],
            placed: vec![false; trees],
            lost: vec![false; trees],
            by_size,
            groups: Vec::new(),
        }
    }

    /// The damaged files still wanting a copy.
    fn open(&self, work: &dyn Attempts) -> Vec<usize> {
        (0..self.sought.len())
            .filter(|&k| work.want(self.sought[k].i).is_some())
            .collect()
    }

    /// The newest version first, fetched without a listing: most damage is repaired from
    /// the newest backup, by one run of the tool.
    fn newest_unlisted(&self, work: &mut dyn Attempts) {
        if self.versions.is_empty() {
            return;
        }
        let blind: Vec<(usize, Copy)> = (0..self.sought.len())
            .map(|k| {
                let copy = Copy {
                    version: 0,
                    path: self.sought[k].own.clone(),
                    stamp: String::new(),
                };
                (k, copy)
            })
            .collect();
        self.offer(work, blind, true);
    }

    fn offer(&self, work: &mut dyn Attempts, copies: Vec<(usize, Copy)>, blind: bool) {
        let (sought, versions, maps) = (&self.sought, &self.versions, &self.maps);
        self.backup
            .offer(work, sought, copies, versions, maps, self.watch, blind);
    }

    /// Whether another version may be listed whole (a tree not found where it is now is
    /// looked for in the newest version of each group).
    fn may_list_whole(&self, group: &str) -> bool {
        self.listed_whole.iter().filter(|&&w| w).count() < LISTED_WHOLE
            && !self.groups.iter().any(|g| g == group)
    }

    /// Lists version `v` (in the `open` files' folders, or whole while a tree of theirs is
    /// lost) and offers each new copy at a file's path; a tree not placed yet takes the map
    /// most of its files agree on. Whether `v` is to be listed again, whole.
    fn at_paths(
        &mut self,
        v: usize,
        open: &[usize],
        work: &mut dyn Attempts,
    ) -> Result<bool, Unusable> {
        let group = self.versions[v].group.clone();
        let whole = self.may_list_whole(&group)
            && open.iter().any(|&k| {
                let tree = self.sought[k].tree;
                !self.placed[tree] && self.lost[tree]
            });
        self.listed_whole[v] = whole;
        if whole {
            self.groups.push(group.clone());
        }
        let mut by_path: HashMap<String, Vec<usize>> = HashMap::new();
        for &k in open {
            let s = &self.sought[k];
            by_path
                .entry(loose(&self.maps[s.tree].apply(&s.own)))
                .or_default()
                .push(k);
        }
        let mut folders: Vec<Vec<u8>> = by_path
            .values()
            .map(|ks| {
                let s = &self.sought[ks[0]];
                let there = self.maps[s.tree].apply(&s.own);
                match there.iter().rposition(|&b| b == b'/') {
                    Some(at) => there[..at].to_vec(),
                    None => Vec::new(),
                }
            })
            .collect();
        folders.sort();
        folders.dedup();
        // A file at the root of the repository's tree: list it whole.
        let within: &[Vec<u8>] = if whole || folders.iter().any(Vec::is_empty) {
            &[]
        } else {
            &folders
        };
        let mut hits: Vec<Hit> = Vec::new();
        let mut votes: HashMap<(usize, Map), Vec<Hit>> = HashMap::new();
        let (sought, maps, placed, by_size) =
            (&self.sought, &self.maps, &self.placed, &self.by_size);
        let elsewhere = &mut self.elsewhere;
        let version = &self.versions[v];
        self.backup
            .repo
            .list(version, within, self.watch, &mut |listed, size, stamp| {
                let fits = |k: usize| sought[k].size.is_none_or(|s| s == size);
                let mut at_path = Vec::new();
                for &k in by_path.get(&loose(listed.as_bytes())).into_iter().flatten() {
                    if fits(k) {
                        let s = &sought[k];
                        at_path.push(k);
                        let path = maps[s.tree].apply(&s.own);
                        let copy = Copy {
                            version: v,
                            path,
                            stamp: stamp.clone(),
                        };
                        hits.push(Hit { k, copy, size });
                    }
                }
                if !whole {
                    return;
                }
                for &k in by_size.get(&size).into_iter().flatten() {
                    let s = &sought[k];
                    if at_path.contains(&k) || work.want(s.i).is_none() {
                        continue;
                    }
                    let copy = || Copy {
                        version: v,
                        path: listed.as_bytes().to_vec(),
                        stamp: stamp.clone(),
                    };
                    // Where an unplaced tree may have been backed up from.
                    if !placed[s.tree]
                        && let Some(map) = Map::between(&s.own, listed)
                    {
                        let same = map.apply(&s.own);
                        let c = Copy {
                            path: same,
                            ..copy()
                        };
                        votes
                            .entry((s.tree, map))
                            .or_default()
                            .push(Hit { k, copy: c, size });
                    }
                    let known = elsewhere[k]
                        .iter()
                        .any(|c| c.path == listed.as_bytes() && c.stamp == stamp);
                    if !known && elsewhere[k].len() < ELSEWHERE {
                        elsewhere[k].push(copy());
                    }
                }
            })?;
        for k in hits.iter().map(|h| h.k) {
            self.placed[self.sought[k].tree] = true;
        }
        let mut again = false;
        if !whole {
            for &k in open {
                let tree = self.sought[k].tree;
                if !self.placed[tree] && !self.lost[tree] {
                    self.lost[tree] = true;
                    again |= self.may_list_whole(&group);
                }
            }
        }
        self.place(votes, &mut hits);
        let mut copies = Vec::new();
        for Hit { k, copy, size } in hits {
            let seen = &mut self.seen[k];
            if work.want(self.sought[k].i).is_none()
                || seen.iter().any(|(z, t)| *z == size && *t == copy.stamp)
            {
                continue;
            }
            seen.push((size, copy.stamp.clone()));
            // The newest version's copy at the file's own path was tried before the listing.
            if v == 0 && self.maps[self.sought[k].tree] == Map::default() {
                continue;
            }
            copies.push((k, copy));
        }
        self.offer(work, copies, false);
        Ok(again)
    }

    /// Each unplaced tree takes the map most of its files agree on (the longest shared tail
    /// breaks a tie), and the copies that map finds join `hits`.
    fn place(&mut self, mut votes: HashMap<(usize, Map), Vec<Hit>>, hits: &mut Vec<Hit>) {
        for tree in 0..self.maps.len() {
            if self.placed[tree] {
                continue;
            }
            let best = votes
                .iter()
                .filter(|((t, _), _)| *t == tree)
                .map(|((_, map), found)| {
                    let mut files: Vec<usize> = found.iter().map(|f| f.k).collect();
                    files.sort_unstable();
                    files.dedup();
                    (files.len(), std::cmp::Reverse(map.own.len()), map.clone())
                })
                .max_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
            if let Some((_, _, map)) = best {
                hits.extend(votes.remove(&(tree, map.clone())).unwrap_or_default());
                self.maps[tree] = map;
                self.placed[tree] = true;
            }
        }
    }

    /// Files still wanting: files of their size elsewhere in the newest versions (one moved
    /// since the backup), from versions not listed whole yet.
    fn elsewhere_listed(&mut self, work: &dyn Attempts) -> Result<(), Unusable> {
        for v in 0..self.versions.len().min(LISTED_WHOLE) {
            let open = self.open(work);
            if open.is_empty() || self.watch.cancel.load(Ordering::Relaxed) {
                break;
            }
            if self.listed_whole[v] {
                continue;
            }
            let (sought, maps, by_size) = (&self.sought, &self.maps, &self.by_size);
            let elsewhere = &mut self.elsewhere;
            self.backup.repo.list(
                &self.versions[v],
                &[],
                self.watch,
                &mut |listed, size, stamp| {
                    for &k in by_size.get(&size).into_iter().flatten() {
                        let s = &sought[k];
                        let at_path =
                            loose(listed.as_bytes()) == loose(&maps[s.tree].apply(&s.own));
                        let known = elsewhere[k]
                            .iter()
                            .any(|c| c.path == listed.as_bytes() && c.stamp == stamp);
                        if !at_path && !known && elsewhere[k].len() < ELSEWHERE && open.contains(&k)
                        {
                            elsewhere[k].push(Copy {
                                version: v,
                                path: listed.as_bytes().to_vec(),
                                stamp: stamp.clone(),
                            });
                        }
                    }
                },
            )?;
        }
        Ok(())
    }

    /// The copies of each file's size found elsewhere, then, for a file still wanting, what
    /// was tried.
    fn last_tries(&mut self, work: &mut dyn Attempts) {
        let cancel = self.watch.cancel;
        let name = self.backup.repo.name();
        for (k, s) in self.sought.iter().enumerate() {
            // A tree placed after its listing held it: the copy at its path was tried.
            let at_path = loose(&self.maps[s.tree].apply(&s.own));
            let mut others = std::mem::take(&mut self.elsewhere[k]);
            others.retain(|c| loose(&c.path) != at_path);
            let moved = others.len();
            for copy in others {
                if work.want(s.i).is_none() || cancel.load(Ordering::Relaxed) {
                    break;
                }
                let from = self.backup.label(&copy, &self.versions, &Map::default());
                let version = &self.versions[copy.version];
                let repo = &self.backup.repo;
                work.offer(s.i, &from, &mut |sink| {
                    stream(&mut repo.dump(version, &copy.path), self.watch, sink)
                });
            }
            if work.want(s.i).is_some() && !cancel.load(Ordering::Relaxed) {
                let (tried, n) = (self.seen[k].len(), self.versions.len());
                let whole = LISTED_WHOLE.min(n);
                work.tried(
                    s.i,
                    if tried + moved == 0 {
                        format!(
                            "{name}: no copy of its path in its {n} versions, nor of its size \
                             elsewhere in the newest {whole}"
                        )
                    } else {
                        format!(
                            "{name}: every distinct copy tried ({tried} of its path in {n} \
                             versions, {moved} of its size elsewhere in the newest {whole}); \
                             none holds the bytes of its tag"
                        )
                    },
                );
            }
        }
    }
}

/// Runs `cmd` and gives what it prints; an error says what it said when it failed (or that
/// the tool is not there).
fn output(cmd: &mut Command, tool: &str, watch: Watch<'_>) -> Result<Vec<u8>, Unusable> {
    let mut all = Vec::new();
    run(cmd, tool, watch, &mut |chunk| {
        all.extend_from_slice(chunk);
        Ok(())
    })?;
    Ok(all)
}

/// Runs `cmd`, calling `each` with every line of its JSON Lines output it can read (lines it
/// cannot, such as names borg escapes as lone surrogates, are passed over).
fn lines(
    cmd: &mut Command,
    tool: &str,
    watch: Watch<'_>,
    mut each: impl FnMut(&serde_json::Value),
) -> Result<(), Unusable> {
    let mut line = Vec::new();
    let mut take = |line: &[u8]| {
        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(line) {
            each(&v);
        }
    };
    run(cmd, tool, watch, &mut |mut chunk| {
        while let Some(end) = chunk.iter().position(|&b| b == b'\n') {
            line.extend_from_slice(&chunk[..end]);
            take(&line);
            line.clear();
            chunk = &chunk[end + 1..];
        }
        line.extend_from_slice(chunk);
        Ok(())
    })?;
    take(&line);
    Ok(())
}

/// Streams what `cmd` prints into `sink`; stops it as soon as the sink wants no more.
pub(super) fn stream(
    cmd: &mut Command,
    watch: Watch<'_>,
    sink: &mut dyn FnMut(Chunk<'_>) -> io::Result<()>,
) -> io::Result<()> {
    let tool = cmd.get_program().to_string_lossy().into_owned();
    let mut refused = None;
    let ran = run(cmd, &tool, watch, &mut |chunk| {
        sink(Chunk::Data(chunk)).inspect_err(|e| {
            refused = Some(io::Error::new(e.kind(), e.to_string()));
        })
    });
    match (refused, ran) {
        (Some(e), _) => Err(e),
        (None, Ok(())) => Ok(()),
        (None, Err(e)) => Err(io::Error::other(e)),
    }
}

/// Runs `cmd`, feeding what it prints to `feed`, which may refuse more (the child is then
/// stopped): see [`read_from`].
fn run(
    cmd: &mut Command,
    tool: &str,
    watch: Watch<'_>,
    feed: &mut dyn FnMut(&[u8]) -> io::Result<()>,
) -> Result<(), Unusable> {
    read_from(cmd, tool, watch, &[0], &mut |out| {
        let mut buf = vec![0u8; 1 << 20];
        loop {
            match out.read(&mut buf)? {
                0 => return Ok(()),
                n => feed(&buf[..n])?,
            }
        }
    })
}

/// Runs `cmd` in a session of its own (no terminal to prompt on, nothing to read), `consume`
/// reading what it prints (an error stops the child); it succeeds if it ends with one of
/// `ok` (its exit codes). The child and every process it started are stopped when the run
/// is interrupted or the child says nothing for as long as `watch` allows: a hung ssh, a
/// repository on a failing disk, a tool waiting for a passphrase never hang the repair.
fn read_from(
    cmd: &mut Command,
    tool: &str,
    watch: Watch<'_>,
    ok: &[i32],
    consume: &mut dyn FnMut(&mut dyn Read) -> io::Result<()>,
) -> Result<(), Unusable> {
    let mut child = crate::process::own_session(cmd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| missing(tool, e))?;
    let mut stdout = Watched {
        pipe: child.stdout.take().expect("piped"),
        watch,
        program: tool.into(),
    };
    let mut stderr = child.stderr.take().expect("piped");
    let errors = std::thread::spawn(move || {
        let mut said = Vec::new();
        let _ = stderr.read_to_end(&mut said);
        said
    });
    let fed = consume(&mut stdout).map_err(|e| match e.kind() {
        io::ErrorKind::TimedOut | io::ErrorKind::Interrupted => Unusable::Stopped(e),
        _ => Unusable::Unreadable(e),
    });
    if fed.is_err() {
        crate::process::stop(&mut child);
    }
    drop(stdout);
    let status = child.wait().map_err(|e| missing(tool, e))?;
    // What it left running goes with it (and lets go of its stderr).
    crate::process::kill_group(&child);
    let said_text = errors.join().unwrap_or_default();
    fed?;
    if status.code().is_some_and(|c| ok.contains(&c)) {
        Ok(())
    } else {
        Err(said(tool, &said_text, status))
    }
}

/// What a tool that could not be started means.
fn missing(tool: &str, source: io::Error) -> Unusable {
    if source.kind() == io::ErrorKind::NotFound {
        Unusable::NoTool(tool.into())
    } else {
        Unusable::CannotRun {
            tool: tool.into(),
            source,
        }
    }
}

/// What a tool said when it failed, on one line (its complaint may span several).
fn said(tool: &str, stderr: &[u8], status: std::process::ExitStatus) -> Unusable {
    Unusable::Failed {
        tool: tool.into(),
        said: words(stderr, status),
    }
}

/// A failed tool's complaint on one line, or its exit status if it said nothing.
fn words(stderr: &[u8], status: std::process::ExitStatus) -> String {
    let text = String::from_utf8_lossy(stderr);
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    if lines.is_empty() {
        return format!("failed ({status})");
    }
    let mut line = lines.join(" ");
    if line.len() > 300 {
        let cut = (0..=300)
            .rev()
            .find(|&i| line.is_char_boundary(i))
            .unwrap_or(0);
        line.truncate(cut);
        line.push_str(" ...");
    }
    line
}

/// A command that prints a good copy of a file (`--from-command`), run with `sh -c`: `{}`
/// becomes the file's path relative to the PATH it is under, quoted for that shell; `{ssh}`
/// the same quoted twice, for a command that hands its arguments to a second shell (ssh
/// joins them and the remote shell parses them again: a name such as `$(touch x)` would run
/// there). The command chooses nothing: it only offers bytes, which replace nothing unless
/// they hash to the damaged file's tag.
pub struct FromCommand {
    template: String,
    silence: Duration,
}

/// A template cut at its placeholders.
#[derive(Debug, PartialEq)]
enum Part<'t> {
    Text(&'t str),
    /// `{}`: quoted once.
    Path,
    /// `{ssh}`: quoted twice.
    Twice,
}

impl FromCommand {
    /// The command `template`, given up on once silent for `silence`. A placeholder inside
    /// the template's own quotes is refused (intact's quoting would end them, and the name
    /// would be parsed as shell code), and so is `{}` in an ssh command (`{ssh}` is the safe
    /// one there).
    pub fn new(template: &str, silence: Duration) -> Result<FromCommand, String> {
        let parts = parts(template)?;
        // ssh wherever it is the program run: first, or after `env`, `nice`, `timeout`, a
        // pipe or `&&` (`timeout 60 ssh nas cat {}` ran hostile names on the remote).
        let runs_ssh = template
            .split(|c: char| c.is_whitespace() || ";|&()`".contains(c))
            .map(|w| w.trim_matches(['\'', '"']))
            .any(|w| w == "ssh" || w.ends_with("/ssh"));
        if runs_ssh && parts.contains(&Part::Path) {
            return Err(format!(
                "--from-command {template:?}: ssh hands the path to a shell on the other host, \
                 which parses it again; use {{ssh}} there (quoted for both shells)"
            ));
        }
        if !parts.iter().any(|p| matches!(p, Part::Path | Part::Twice)) {
            return Err(format!(
                "--from-command {template:?} has no {{}} (or {{ssh}}) for the file's path"
            ));
        }
        Ok(FromCommand {
            template: template.into(),
            silence,
        })
    }

    /// The command line for the file at `rel`, as bytes (a name that is not UTF-8 reaches
    /// the command as it is).
    fn line(&self, rel: &[u8]) -> OsString {
        let once = quoted(rel);
        let mut line = Vec::new();
        for part in parts(&self.template).unwrap_or_default() {
            match part {
                Part::Text(t) => line.extend_from_slice(t.as_bytes()),
                Part::Path => line.extend_from_slice(&once),
                Part::Twice => line.extend_from_slice(&quoted(&once)),
            }
        }
        OsString::from_vec(line)
    }
}

/// `template` cut at its placeholders, or why it is refused: a placeholder inside single or
/// double quotes of its own.
fn parts(template: &str) -> Result<Vec<Part<'_>>, String> {
    #[derive(PartialEq)]
    enum In {
        Plain,
        Single,
        Double,
    }
    let mut parts = Vec::new();
    let (mut quote, mut escaped, mut from, mut i) = (In::Plain, false, 0, 0);
    let b = template.as_bytes();
    while i < b.len() {
        let placeholder = [("{}", Part::Path), ("{ssh}", Part::Twice)]
            .into_iter()
            .find(|(p, _)| template[i..].starts_with(p));
        match (placeholder, b[i]) {
            (Some((p, part)), _) if !escaped => {
                if quote != In::Plain {
                    return Err(format!(
                        "--from-command {template:?}: {p} is inside quotes; intact quotes the \
                         path itself, so write it without quotes around it"
                    ));
                }
                parts.push(Part::Text(&template[from..i]));
                parts.push(part);
                i += p.len();
                from = i;
                continue;
            }
            _ if escaped => escaped = false,
            (_, b'\\') if quote != In::Single => escaped = true,
            (_, b'\'') if quote != In::Double => {
                quote = if quote == In::Single {
                    In::Plain
                } else {
                    In::Single
                }
            }
            (_, b'"') if quote != In::Single => {
                quote = if quote == In::Double {
                    In::Plain
                } else {
                    In::Double
                }
            }
            _ => {}
        }
        i += 1;
    }
    parts.push(Part::Text(&template[from..]));
    parts.retain(|p| *p != Part::Text(""));
    Ok(parts)
}

impl Search for FromCommand {
    fn name(&self) -> String {
        format!("the command `{}`", self.template)
    }

    fn search(&self, work: &mut dyn Attempts, cancel: &AtomicBool) -> Result<(), Unusable> {
        let watch = Watch {
            cancel,
            silence: self.silence,
        };
        for i in 0..work.count() {
            if cancel.load(Ordering::Relaxed) {
                break;
            }
            let Some(want) = work.want(i) else { continue };
            let line = self.line(want.rel.as_os_str().as_bytes());
            let from = format!("`{}`", escape(Path::new(&line)));
            work.offer(i, &from, &mut |sink| {
                stream(Command::new("sh").arg("-c").arg(&line), watch, sink)
            });
        }
        Ok(())
    }
}

/// `bytes` quoted for `sh`: in single quotes, each single quote closed, escaped, reopened.
fn quoted(bytes: &[u8]) -> Vec<u8> {
    let mut q = vec![b'\''];
    for &b in bytes {
        if b == b'\'' {
            q.extend_from_slice(b"'\\''");
        } else {
            q.push(b);
        }
    }
    q.push(b'\'');
    q
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

    #[test]
    fn selectors_are_the_tools_own_and_no_others() {
        let ok = |tool, w: &str| selectors(tool, w).unwrap();
        assert_eq!(
            ok("restic", " --host nas --tag=daily 1a2b3c4d -H -x"),
            ["--host=nas", "--tag=daily", "1a2b3c4d", "--host=-x"]
        );
        assert_eq!(
            ok("borg", " -a 'nas-*' --last 30"),
            ["--glob-archives='nas-*'", "--last=30"]
        );
        for (tool, bad) in [
            ("restic", " --repo /elsewhere"),
            ("restic", " --host"),
            ("borg", " some-archive"),
            ("borg", " --json"),
        ] {
            assert!(selectors(tool, bad).is_err(), "{tool}{bad}");
        }
    }

    #[test]
    fn repositories_are_named_as_their_tools_name_them() {
        for (from, name) in [
            ("restic:/backup/repo", "restic:/backup/repo"),
            ("restic:", "restic:(from the environment)"),
            (
                "borg:/backup/borg::photos-2026",
                "borg:/backup/borg::photos-2026",
            ),
            ("borg:ssh://nas/./b", "borg:ssh://nas/./b"),
            (
                "restic:/My Backups -H nas --path /srv",
                "restic:/My Backups --host=nas --path=/srv",
            ),
            ("borg:/b::a1 --last 3", "borg:/b::a1 --last=3"),
        ] {
            assert_eq!(
                parse(Path::new(from), Duration::from_secs(1))
                    .unwrap()
                    .unwrap()
                    .name(),
                name
            );
        }
        assert!(parse(Path::new("/backup/photos"), Duration::from_secs(1)).is_none());
        // A repository that would be an option is refused, not passed on.
        for from in [
            "borg:--rsh=./evil.sh",
            "borg:-e",
            "restic:--password-command=x",
        ] {
            let parsed = parse(Path::new(from), Duration::from_secs(1)).unwrap();
            assert!(
                parsed.is_err_and(|e| e.contains("may not begin with '-'")),
                "{from}"
            );
        }
    }

    #[test]
    fn placeholders_are_quoted_once_or_twice_and_never_inside_quotes() {
        let s = Duration::from_secs(1);
        let line = |t: &str, rel: &[u8]| FromCommand::new(t, s).unwrap().line(rel);
        assert_eq!(
            line("rclone cat remote:p/{}", b"a b"),
            OsString::from("rclone cat remote:p/'a b'")
        );
        // What a second shell makes of `{ssh}`: the name itself, whatever it holds.
        let hostile = b"$(echo pwned)'\"x\\ y";
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(line("sh -c printf\\ %s\\ {ssh}", hostile))
            .output()
            .unwrap();
        assert_eq!(out.stdout, hostile);
        // A brace that is no placeholder, and an escaped quote, are text.
        assert_eq!(
            line(r"echo \' {x} {}", b"f"),
            OsString::from(r"echo \' {x} 'f'")
        );
        for bad in [
            "cat \"/srv/{}\"",
            "cat '/srv/{}'",
            "ssh nas cat /srv/{}",
            "/usr/bin/ssh nas cat {}",
            "timeout 60 ssh nas cat {}",
            "env LC_ALL=C ssh nas cat {}",
            "nice -n 19 ssh nas cat {}",
            "cd /srv && ssh nas cat {}",
            "cat /srv/file",
        ] {
            assert!(FromCommand::new(bad, s).is_err(), "{bad}");
        }
    }

    #[test]
    fn paths_are_quoted_for_the_shell() {
        assert_eq!(quoted(b"it's here"), b"'it'\\''s here'");
        assert_eq!(quoted(b"$(rm -rf /)"), b"'$(rm -rf /)'");
        assert_eq!(quoted(b"caf\xe9"), b"'caf\xe9'");
    }
}
