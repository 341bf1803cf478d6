//! restic as a source of copies: its snapshots, `ls --json`, `dump` and `restore --include`,
//! the repository in `RESTIC_REPOSITORY`, never in argv.

use std::ffi::{OsStr, OsString};
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::process::Command;

use super::{Repository, Version, json, lines, named, stamp, tool};
use crate::process::{self, Watch};
use crate::repair::source::Unusable;

/// A restic repository: `restic:REPO`, or `restic:` for `$RESTIC_REPOSITORY`, then, if
/// wanted, restic's own snapshot selectors (`--host`, `--tag`, `--path`, `--latest`, ids).
/// The password comes as restic users give it: `RESTIC_PASSWORD`, `RESTIC_PASSWORD_FILE`,
/// `RESTIC_PASSWORD_COMMAND`.
pub(super) struct Restic {
    pub(super) repo: Option<OsString>,
    pub(super) select: Vec<String>,
}

/// The ways restic is given a repository's password.
const PASSWORD_VARS: [&str; 3] = [
    "RESTIC_PASSWORD_FILE",
    "RESTIC_PASSWORD",
    "RESTIC_PASSWORD_COMMAND",
];

/// Whether the environment gives restic a password (every restic repository has one).
pub(super) fn password_given() -> bool {
    PASSWORD_VARS
        .iter()
        .any(|v| std::env::var_os(v).is_some_and(|x| !x.is_empty()))
}

impl Restic {
    fn restic(&self) -> Command {
        tool(
            "restic",
            "--no-lock",
            "RESTIC_REPOSITORY",
            self.repo.as_deref(),
        )
    }
}

impl Repository for Restic {
    fn name(&self) -> String {
        named("restic:", &self.repo, &self.select)
    }

    fn versions(&self, watch: Watch<'_>) -> Result<Vec<Version>, Unusable> {
        // Said as what it is, not as restic's complaint that it cannot read a terminal.
        if !password_given() {
            return Err(Unusable::NoPassword {
                tool: "restic",
                vars: "RESTIC_PASSWORD_FILE, RESTIC_PASSWORD or RESTIC_PASSWORD_COMMAND",
            });
        }
        let mut c = self.restic();
        c.args(["snapshots", "--json"]).args(&self.select);
        let snapshots: Vec<serde_json::Value> = json(&mut c, watch, "restic snapshots")?;
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
        lines(&mut c, watch, |line| {
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
        process::output(&mut c, watch)?;
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
