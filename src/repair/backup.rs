//! Good copies in the backups people already have: restic and borg repositories, and any
//! command that prints a file. Their own command lines are called (their JSON listings, their
//! `dump` and `extract --stdout`), never their repository formats: what their users trust,
//! and what stays compatible. Nothing is ever written into a repository (`--no-lock`,
//! `--bypass-lock`).
//!
//! A backup tool offers bytes only; the tag on the damaged file says which bytes are good.
//! For each damaged file a few candidates are tried, newest first: the same path in each
//! version (snapshot, archive), then files of its size elsewhere (moved since the backup);
//! each is streamed through the same verified replace as every other source, so a copy the
//! backup took of the rot itself is passed over for an older good one.

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::{self, Read};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};

use super::source::{Attempts, Search, Unusable};
use crate::archive::Chunk;
use crate::text::escape;

/// Versions of a repository listed per run, newest first (each listing reads the version's
/// whole tree of file names).
pub const VERSIONS: usize = 10;
/// Copies tried for one damaged file at most.
pub const CANDIDATES: usize = 5;

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
    fn versions(&self) -> Result<Vec<Version>, Unusable>;
    /// The files of a version: each path as the tool lists it, and its size.
    fn list(&self, v: &Version, each: &mut dyn FnMut(String, u64)) -> Result<(), Unusable>;
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

    fn versions(&self) -> Result<Vec<Version>, Unusable> {
        let out = output(self.restic().args(["snapshots", "--json"]), "restic")?;
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

    fn list(&self, v: &Version, each: &mut dyn FnMut(String, u64)) -> Result<(), Unusable> {
        lines(
            self.restic().args(["ls", "--json", &v.id]),
            "restic",
            |line| {
                if line["struct_type"] == "node"
                    && line["type"] == "file"
                    && let (Some(path), Some(size)) = (line["path"].as_str(), line["size"].as_u64())
                {
                    each(path.to_string(), size);
                }
            },
        )
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

    fn versions(&self) -> Result<Vec<Version>, Unusable> {
        let mut c = self.borg();
        c.args(["list", "--json"]);
        if let Some(repo) = &self.repo {
            c.arg(repo);
        }
        let out = output(&mut c, "borg")?;
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

    fn list(&self, v: &Version, each: &mut dyn FnMut(String, u64)) -> Result<(), Unusable> {
        let mut c = self.borg();
        c.args(["list", "--json-lines"])
            .arg(self.location(Some(&v.id)));
        lines(&mut c, "borg", |line| {
            if line["type"] == "-"
                && let (Some(path), Some(size)) = (line["path"].as_str(), line["size"].as_u64())
            {
                each(path.to_string(), size);
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

/// `restic:REPO` or `borg:REPO[::ARCHIVE]`, if `from` names one.
pub(super) fn parse(from: &Path) -> Option<Box<dyn Search>> {
    let raw = from.as_os_str().as_bytes();
    let repo = |rest: &[u8]| (!rest.is_empty()).then(|| OsString::from_vec(rest.to_vec()));
    if let Some(rest) = raw.strip_prefix(b"restic:") {
        return Some(Box::new(Backup(Restic(repo(rest)))));
    }
    let rest = raw.strip_prefix(b"borg:")?;
    let (repo_part, archive) = match rest.windows(2).rposition(|w| w == b"::") {
        Some(at) => (
            &rest[..at],
            Some(String::from_utf8_lossy(&rest[at + 2..]).into_owned()),
        ),
        None => (rest, None),
    };
    Some(Box::new(Backup(Borg {
        repo: repo(repo_part),
        archive,
    })))
}

/// The repository's name for reports, or the environment variable it comes from.
fn shown(repo: &Option<OsString>) -> String {
    repo.as_deref()
        .map_or_else(|| "(from the environment)".into(), |r| escape(Path::new(r)))
}

/// A repository as a source of copies.
struct Backup<R>(R);

/// A copy to try: which version, the path there (as the tool takes it), and why it is one.
struct Candidate {
    version: usize,
    path: Vec<u8>,
    /// At the file's own path (else: of its size, elsewhere).
    same_path: bool,
}

impl<R: Repository + Send> Search for Backup<R> {
    fn name(&self) -> String {
        self.0.name()
    }

    fn search(&self, work: &mut dyn Attempts, cancel: &AtomicBool) -> Result<(), Unusable> {
        let mut versions = self.0.versions()?;
        // Newest first (tools list oldest first: of two made in the same second, the one
        // listed later is the newer).
        versions.reverse();
        versions.sort_by(|a, b| b.time.cmp(&a.time));
        versions.truncate(VERSIONS);
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
        let mut candidates: Vec<Vec<Candidate>> = wants.iter().map(|_| Vec::new()).collect();
        for (v, version) in versions.iter().enumerate() {
            if cancel.load(Ordering::Relaxed) {
                return Ok(());
            }
            self.0.list(version, &mut |listed, size| {
                for &k in by_size.get(&size).into_iter().flatten() {
                    let same = same_path(&wants[k].1, &listed);
                    let found = &mut candidates[k];
                    let same_path = same.is_some();
                    // A couple of files of its size elsewhere: one moved since the backup.
                    if same_path || found.iter().filter(|c| !c.same_path).count() < 2 {
                        found.push(Candidate {
                            version: v,
                            path: same.unwrap_or_else(|| listed.clone().into_bytes()),
                            same_path,
                        });
                    }
                }
            })?;
        }
        let name = self.0.name();
        for (k, (i, _, _)) in wants.iter().enumerate() {
            // The file's own path in each version, newest first; then files of its size.
            let mut found = std::mem::take(&mut candidates[k]);
            found.sort_by_key(|c| (!c.same_path, c.version));
            if found.is_empty() {
                work.tried(
                    *i,
                    format!(
                        "{name}: no copy of its path or size in the latest {} versions",
                        versions.len()
                    ),
                );
            }
            for c in found.into_iter().take(CANDIDATES) {
                if work.want(*i).is_none() || cancel.load(Ordering::Relaxed) {
                    break;
                }
                let version = &versions[c.version];
                let from = format!(
                    "{name} {} ({})",
                    version.label,
                    escape(Path::new(std::ffi::OsStr::from_bytes(&c.path)))
                );
                work.offer(*i, &from, &mut |sink| {
                    stream(&mut self.0.dump(version, &c.path), sink)
                });
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
fn output(cmd: &mut Command, tool: &str) -> Result<Vec<u8>, Unusable> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| missing(tool, e))?;
    if out.status.success() {
        Ok(out.stdout)
    } else {
        Err(said(tool, &out.stderr, out.status))
    }
}

/// Runs `cmd`, calling `each` with every line of its JSON Lines output it can read (lines it
/// cannot, such as names borg escapes as lone surrogates, are passed over).
fn lines(
    cmd: &mut Command,
    tool: &str,
    mut each: impl FnMut(&serde_json::Value),
) -> Result<(), Unusable> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| missing(tool, e))?;
    let stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    let errors = std::thread::spawn(move || {
        let mut said = Vec::new();
        let _ = stderr.read_to_end(&mut said);
        said
    });
    use std::io::BufRead;
    for line in io::BufReader::new(stdout)
        .split(b'\n')
        .map_while(Result::ok)
    {
        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&line) {
            each(&v);
        }
    }
    let status = child.wait().map_err(|e| missing(tool, e))?;
    let said_text = errors.join().unwrap_or_default();
    if status.success() {
        Ok(())
    } else {
        Err(said(tool, &said_text, status))
    }
}

/// Streams what `cmd` prints into `sink`; stops it as soon as the sink wants no more.
pub(super) fn stream(
    cmd: &mut Command,
    sink: &mut dyn FnMut(Chunk<'_>) -> io::Result<()>,
) -> io::Result<()> {
    let tool = cmd.get_program().to_string_lossy().into_owned();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| io::Error::other(missing(&tool, e)))?;
    let mut stdout = child.stdout.take().expect("piped");
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
                if let Err(e) = sink(Chunk::Data(&buf[..n])) {
                    break Err(e);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => break Err(e),
        }
    };
    if fed.is_err() {
        let _ = child.kill();
    }
    drop(stdout);
    let status = child.wait()?;
    let said_text = errors.join().unwrap_or_default();
    fed?;
    if status.success() {
        Ok(())
    } else {
        Err(io::Error::other(said(&tool, &said_text, status)))
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

/// A command that prints a good copy of a file (`--from-command 'ssh nas cat /srv/{}'`):
/// `{}` becomes the file's path relative to the PATH it is under, quoted for the shell. The
/// command chooses nothing: it only offers bytes, which replace nothing unless they hash to
/// the damaged file's tag.
pub(super) struct FromCommand(pub String);

impl Search for FromCommand {
    fn name(&self) -> String {
        format!("the command `{}`", self.0)
    }

    fn search(&self, work: &mut dyn Attempts, cancel: &AtomicBool) -> Result<(), Unusable> {
        for i in 0..work.count() {
            if cancel.load(Ordering::Relaxed) {
                break;
            }
            let Some(want) = work.want(i) else { continue };
            // Bytes, not text: a name that is not UTF-8 reaches the command as it is.
            let quoted = quoted(want.rel.as_os_str().as_bytes());
            let line = self.0.as_bytes().split(|&b| b == b'{').enumerate().fold(
                Vec::new(),
                |mut line, (n, part)| {
                    match (n, part.strip_prefix(b"}")) {
                        (0, _) => line.extend_from_slice(part),
                        (_, Some(rest)) => {
                            line.extend_from_slice(&quoted);
                            line.extend_from_slice(rest);
                        }
                        (_, None) => {
                            line.push(b'{');
                            line.extend_from_slice(part);
                        }
                    }
                    line
                },
            );
            let line = OsString::from_vec(line);
            let from = format!("`{}`", escape(Path::new(&line)));
            work.offer(i, &from, &mut |sink| {
                stream(Command::new("sh").arg("-c").arg(&line), sink)
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
            assert_eq!(parse(Path::new(from)).unwrap().name(), name);
        }
        assert!(parse(Path::new("/backup/photos")).is_none());
    }

    #[test]
    fn paths_are_quoted_for_the_shell() {
        assert_eq!(quoted(b"it's here"), b"'it'\\''s here'");
        assert_eq!(quoted(b"$(rm -rf /)"), b"'$(rm -rf /)'");
        assert_eq!(quoted(b"caf\xe9"), b"'caf\xe9'");
    }
}
