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
use std::ffi::OsString;
use std::io::{self, Read};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::source::{Attempts, Search, Unusable};
use crate::archive::Chunk;
use crate::process::{Watch, Watched};
use crate::text::escape;

/// Versions of a repository listed whole, newest first (each such listing reads the
/// version's whole tree of file names); older ones are listed only in the damaged files'
/// folders.
pub const LISTED_WHOLE: usize = 10;
/// Copies of its size found elsewhere (a file moved since the backup) tried for a damaged
/// file at most.
pub const ELSEWHERE: usize = 2;

/// One version of a backup: a restic snapshot, a borg archive.
struct Version {
    /// What the tool names it by.
    id: String,
    /// For people: its short id or name and its time.
    label: String,
    /// When it was made (RFC 3339, which sorts as time does).
    time: String,
}

/// A backup tool's repository.
trait Repository {
    /// How it is named in reports (`restic:REPO`).
    fn name(&self) -> String;
    /// Its versions.
    fn versions(&self, watch: Watch<'_>) -> Result<Vec<Version>, Unusable>;
    /// The files of a version (only under `within`, absolute folders, unless it is empty):
    /// each path as the tool lists it, its size, and what the tool's change detection knows
    /// of it (its mtime and ctime).
    fn list(
        &self,
        v: &Version,
        within: &[Vec<u8>],
        watch: Watch<'_>,
        each: &mut dyn FnMut(String, u64, String),
    ) -> Result<(), Unusable>;
    /// The command that prints the file at `path` (as the version holds it) of a version.
    fn dump(&self, v: &Version, path: &[u8]) -> Command;
}

/// A restic repository: `restic:REPO`, or `restic:` for `$RESTIC_REPOSITORY`. The password
/// comes as restic users give it: `RESTIC_PASSWORD`, `RESTIC_PASSWORD_FILE`,
/// `RESTIC_PASSWORD_COMMAND`.
pub(super) struct Restic(Option<OsString>);

impl Restic {
    fn restic(&self) -> Command {
        let mut c = Command::new("restic");
        c.arg("--no-lock");
        if let Some(repo) = &self.0 {
            c.arg("--repo").arg(repo);
        }
        c
    }
}

impl Repository for Restic {
    fn name(&self) -> String {
        format!("restic:{}", shown(&self.0))
    }

    fn versions(&self, watch: Watch<'_>) -> Result<Vec<Version>, Unusable> {
        let out = output(self.restic().args(["snapshots", "--json"]), "restic", watch)?;
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
        each: &mut dyn FnMut(String, u64, String),
    ) -> Result<(), Unusable> {
        let mut c = self.restic();
        c.args(["ls", "--json", &v.id]);
        for dir in within {
            c.arg(std::ffi::OsStr::from_bytes(dir));
        }
        lines(&mut c, "restic", watch, |line| {
            if line["struct_type"] == "node"
                && line["type"] == "file"
                && let (Some(path), Some(size)) = (line["path"].as_str(), line["size"].as_u64())
            {
                each(path.to_string(), size, stamp(line));
            }
        })
    }

    fn dump(&self, v: &Version, path: &[u8]) -> Command {
        let mut c = self.restic();
        c.args(["dump", &v.id])
            .arg(std::ffi::OsStr::from_bytes(path));
        c
    }
}

/// A borg repository: `borg:REPO`, `borg:REPO::ARCHIVE` (that archive only), or `borg:` for
/// `$BORG_REPO`. The passphrase comes as borg users give it: `BORG_PASSPHRASE`,
/// `BORG_PASSCOMMAND`, `BORG_PASSPHRASE_FD`.
pub(super) struct Borg {
    repo: Option<OsString>,
    archive: Option<String>,
}

impl Borg {
    fn borg(&self) -> Command {
        let mut c = Command::new("borg");
        c.arg("--bypass-lock");
        c
    }

    fn location(&self, archive: Option<&str>) -> OsString {
        let mut loc = self.repo.clone().unwrap_or_default();
        if let Some(a) = archive {
            loc.push("::");
            loc.push(a);
        }
        loc
    }
}

impl Repository for Borg {
    fn name(&self) -> String {
        match &self.archive {
            Some(a) => format!("borg:{}::{a}", shown(&self.repo)),
            None => format!("borg:{}", shown(&self.repo)),
        }
    }

    fn versions(&self, watch: Watch<'_>) -> Result<Vec<Version>, Unusable> {
        let mut c = self.borg();
        c.args(["list", "--json"]);
        if let Some(repo) = &self.repo {
            c.arg(repo);
        }
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
        each: &mut dyn FnMut(String, u64, String),
    ) -> Result<(), Unusable> {
        let mut c = self.borg();
        // With --json-lines, the keys --format names are the ones listed.
        c.args([
            "list",
            "--json-lines",
            "--format",
            "{type}{path}{size}{mtime}{ctime}",
        ])
        .arg(self.location(Some(&v.id)));
        // borg keeps absolute paths without their leading slash.
        for dir in within {
            c.arg(std::ffi::OsStr::from_bytes(
                dir.strip_prefix(b"/").unwrap_or(dir),
            ));
        }
        lines(&mut c, "borg", watch, |line| {
            if line["type"] == "-"
                && let (Some(path), Some(size)) = (line["path"].as_str(), line["size"].as_u64())
            {
                each(path.to_string(), size, stamp(line));
            }
        })
    }

    fn dump(&self, v: &Version, path: &[u8]) -> Command {
        let mut c = self.borg();
        c.args(["extract", "--stdout"])
            .arg(self.location(Some(&v.id)))
            .arg(std::ffi::OsStr::from_bytes(path));
        c
    }
}

/// Whether `from` names a repository (`restic:…`, `borg:…`) rather than a file.
pub fn names_repository(from: &Path) -> bool {
    let raw = from.as_os_str().as_bytes();
    raw.starts_with(b"restic:") || raw.starts_with(b"borg:")
}

/// `restic:REPO` or `borg:REPO[::ARCHIVE]`, if `from` names one; its tool is given up on
/// once it says nothing for `silence`.
pub(super) fn parse(from: &Path, silence: Duration) -> Option<Box<dyn Search>> {
    let raw = from.as_os_str().as_bytes();
    let repo = |rest: &[u8]| (!rest.is_empty()).then(|| OsString::from_vec(rest.to_vec()));
    if let Some(rest) = raw.strip_prefix(b"restic:") {
        return Some(Box::new(Backup {
            repo: Restic(repo(rest)),
            silence,
        }));
    }
    let rest = raw.strip_prefix(b"borg:")?;
    let (repo_part, archive) = match rest.windows(2).rposition(|w| w == b"::") {
        Some(at) => (
            &rest[..at],
            Some(String::from_utf8_lossy(&rest[at + 2..]).into_owned()),
        ),
        None => (rest, None),
    };
    Some(Box::new(Backup {
        repo: Borg {
            repo: repo(repo_part),
            archive,
        },
        silence,
    }))
}

/// What a listing says of a file that the tool's change detection looks at: two versions of
/// a path with the same size (compared apart), mtime and ctime hold the same stored content.
fn stamp(line: &serde_json::Value) -> String {
    format!("{} {}", line["mtime"], line["ctime"])
}

/// The repository's name for reports, or the environment variable it comes from.
fn shown(repo: &Option<OsString>) -> String {
    repo.as_deref()
        .map_or_else(|| "(from the environment)".into(), |r| escape(Path::new(r)))
}

/// A repository as a source of copies, its tool given up on once silent for `silence`.
struct Backup<R> {
    repo: R,
    silence: Duration,
}

/// A copy to try: which version, the path there (as the tool takes it), and why it is one.
struct Candidate {
    version: usize,
    path: Vec<u8>,
    /// At the file's own path (else: of its size, elsewhere).
    same_path: bool,
}

impl<R: Repository + Send> Search for Backup<R> {
    fn name(&self) -> String {
        self.repo.name()
    }

    fn search(&self, work: &mut dyn Attempts, cancel: &AtomicBool) -> Result<(), Unusable> {
        let watch = Watch {
            cancel,
            silence: self.silence,
        };
        let mut versions = self.repo.versions(watch)?;
        // Newest first (tools list oldest first: of two made in the same second, the one
        // listed later is the newer).
        versions.reverse();
        versions.sort_by(|a, b| b.time.cmp(&a.time));
        let wants: Vec<(usize, Vec<u8>, Option<u64>)> = (0..work.count())
            .filter_map(|i| {
                let w = work.want(i)?;
                let abs = crate::state::absolute(&w.path).into_os_string().into_vec();
                Some((i, abs, w.size))
            })
            .collect();
        if wants.is_empty() {
            return Ok(());
        }
        let by_size: HashMap<u64, Vec<usize>> =
            wants
                .iter()
                .enumerate()
                .fold(HashMap::new(), |mut m, (k, w)| {
                    if let Some(size) = w.2 {
                        m.entry(size).or_default().push(k);
                    }
                    m
                });
        // The damaged files' folders, for the versions not listed whole.
        let mut folders: Vec<Vec<u8>> = wants
            .iter()
            .filter_map(|w| Path::new(std::ffi::OsStr::from_bytes(&w.1)).parent())
            .map(|p| p.as_os_str().as_bytes().to_vec())
            .collect();
        folders.sort();
        folders.dedup();
        let mut candidates: Vec<Vec<Candidate>> = wants.iter().map(|_| Vec::new()).collect();
        // What each file's path held in a newer version: an older one holding the same is
        // the same stored content, not tried again.
        let mut seen: Vec<Vec<(u64, String)>> = wants.iter().map(|_| Vec::new()).collect();
        for (v, version) in versions.iter().enumerate() {
            if cancel.load(Ordering::Relaxed) {
                return Ok(());
            }
            let within: &[Vec<u8>] = if v < LISTED_WHOLE { &[] } else { &folders };
            self.repo
                .list(version, within, watch, &mut |listed, size, stamp| {
                    for &k in by_size.get(&size).into_iter().flatten() {
                        let same = same_path(&wants[k].1, &listed);
                        if same.is_some() {
                            if seen[k].iter().any(|(s, t)| *s == size && *t == stamp) {
                                continue;
                            }
                            seen[k].push((size, stamp.clone()));
                        }
                        let found = &mut candidates[k];
                        let same_path = same.is_some();
                        // A couple of files of its size elsewhere: one moved since the backup.
                        if same_path || found.iter().filter(|c| !c.same_path).count() < ELSEWHERE {
                            found.push(Candidate {
                                version: v,
                                path: same.unwrap_or_else(|| listed.clone().into_bytes()),
                                same_path,
                            });
                        }
                    }
                })?;
        }
        let name = self.repo.name();
        for (k, (i, _, _)) in wants.iter().enumerate() {
            // Every distinct version of the file's own path, newest first; then files of its
            // size elsewhere.
            let mut found = std::mem::take(&mut candidates[k]);
            found.sort_by_key(|c| (!c.same_path, c.version));
            if found.is_empty() {
                work.tried(
                    *i,
                    format!(
                        "{name}: no copy of its path or size in its {} versions",
                        versions.len()
                    ),
                );
                continue;
            }
            let (mut tried, total) = (0, found.len());
            for c in found {
                if work.want(*i).is_none() || cancel.load(Ordering::Relaxed) {
                    break;
                }
                let version = &versions[c.version];
                let from = format!(
                    "{name} {} ({})",
                    version.label,
                    escape(Path::new(std::ffi::OsStr::from_bytes(&c.path)))
                );
                tried += 1;
                work.offer(*i, &from, &mut |sink| {
                    stream(&mut self.repo.dump(version, &c.path), watch, sink)
                });
            }
            if work.want(*i).is_some() {
                work.tried(
                    *i,
                    format!(
                        "{name}: {tried} of {total} distinct copies tried (its path in {} \
                         versions, and files of its size elsewhere in the newest {}); none \
                         holds the bytes of its tag",
                        versions.len(),
                        LISTED_WHOLE.min(versions.len())
                    ),
                );
            }
        }
        Ok(())
    }
}

/// The path a version holds `abs` (an absolute path, as bytes) at, if `listed` is it: the
/// same absolute path (borg keeps it without its leading slash), or the path under a backed
/// up directory (restic lists `/DIR/...` from the directory's name; a borg archive made of a
/// relative path lists that). Tools print names that are not UTF-8 lossily: the bytes the
/// tool is given are the file's own.
fn same_path(abs: &[u8], listed: &str) -> Option<Vec<u8>> {
    let tail = listed.trim_start_matches('/');
    let loose = |b: &[u8]| -> String {
        String::from_utf8_lossy(b)
            .chars()
            .map(|c| if c == '\u{fffd}' { '?' } else { c })
            .collect()
    };
    let listed_loose: String = tail
        .chars()
        .map(|c| if c == '\u{fffd}' { '?' } else { c })
        .collect();
    let own = loose(abs);
    if !own.ends_with(&listed_loose) || listed_loose.is_empty() {
        return None;
    }
    let start = own.len() - listed_loose.len();
    if start > 0 && own.as_bytes()[start - 1] != b'/' {
        return None;
    }
    // The same tail of the file's own bytes: as many components as the listed path has.
    let components = tail.split('/').count();
    let raw: Vec<&[u8]> = abs.split(|&b| b == b'/').collect();
    if raw.len() < components {
        return None;
    }
    let mut path = raw[raw.len() - components..].join(&b'/');
    if listed.starts_with('/') {
        path.insert(0, b'/');
    }
    Some(path)
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

/// Runs `cmd` in a session of its own (no terminal to prompt on, nothing to read), feeding
/// what it prints to `feed`, which may refuse more (the child is then stopped). The child and
/// every process it started are stopped when the run is interrupted or the child says
/// nothing for as long as `watch` allows: a hung ssh, a repository on a failing disk, a tool
/// waiting for a passphrase never hang the repair.
fn run(
    cmd: &mut Command,
    tool: &str,
    watch: Watch<'_>,
    feed: &mut dyn FnMut(&[u8]) -> io::Result<()>,
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
    let mut buf = vec![0u8; 1 << 20];
    let fed = loop {
        match stdout.read(&mut buf) {
            Ok(0) => break Ok(()),
            Ok(n) => {
                if let Err(e) = feed(&buf[..n]) {
                    break Err(Unusable::Unreadable(e));
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
                ) =>
            {
                break Err(Unusable::Stopped(e));
            }
            Err(e) => break Err(Unusable::Unreadable(e)),
        }
    };
    if fed.is_err() {
        crate::process::stop(&mut child);
    }
    drop(stdout);
    let status = child.wait().map_err(|e| missing(tool, e))?;
    // What it left running goes with it (and lets go of its stderr).
    crate::process::kill_group(&child);
    let said_text = errors.join().unwrap_or_default();
    fed?;
    if status.success() {
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
        let first = template.split_whitespace().next().unwrap_or("");
        if (first == "ssh" || first.ends_with("/ssh")) && parts.contains(&Part::Path) {
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
    fn a_versions_path_is_the_files_own_however_the_tool_lists_it() {
        let abs = b"/srv/photos/2024/caf\xe9.jpg";
        // borg, archived by absolute path.
        assert_eq!(
            same_path(abs, "srv/photos/2024/caf?.jpg"),
            Some(b"srv/photos/2024/caf\xe9.jpg".to_vec())
        );
        // restic lists from the backed-up directory's name.
        assert_eq!(
            same_path(abs, "/photos/2024/caf\u{fffd}.jpg"),
            Some(b"/photos/2024/caf\xe9.jpg".to_vec())
        );
        assert_eq!(
            same_path(abs, "/otos/2024/caf?.jpg"),
            None,
            "not at a component"
        );
        assert_eq!(same_path(abs, "/photos/2025/caf?.jpg"), None);
        assert_eq!(same_path(b"/a/b", "/b"), Some(b"/b".to_vec()));
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
        ] {
            assert_eq!(
                parse(Path::new(from), Duration::from_secs(1))
                    .unwrap()
                    .name(),
                name
            );
        }
        assert!(parse(Path::new("/backup/photos"), Duration::from_secs(1)).is_none());
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
