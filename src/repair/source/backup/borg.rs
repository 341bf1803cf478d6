//! borg as a source of copies: its archives, `list --json-lines`, `extract --stdout` and
//! `export-tar`, the repository in `BORG_REPO`, never in argv.

use std::ffi::{OsStr, OsString};
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::process::Command;

use super::{Repository, Version, json, lines, named, stamp, tool};
use crate::process::{self, Watch};
use crate::repair::source::Unusable;

/// A borg repository: `borg:REPO`, `borg:REPO::ARCHIVE` (that archive only), or `borg:` for
/// `$BORG_REPO`, then, if wanted, borg's own archive selectors (`--glob-archives`, `--first`,
/// `--last`). The passphrase comes as borg users give it: `BORG_PASSPHRASE`,
/// `BORG_PASSCOMMAND`, `BORG_PASSPHRASE_FD`.
pub(super) struct Borg {
    pub(super) repo: Option<OsString>,
    pub(super) archive: Option<String>,
    pub(super) select: Vec<String>,
}

impl Borg {
    /// Archives are then named `::NAME`.
    fn borg(&self) -> Command {
        tool("borg", "--bypass-lock", "BORG_REPO", self.repo.as_deref())
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
        let listed: serde_json::Value = json(&mut c, watch, "borg list")?;
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
        lines(&mut c, watch, |line| {
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
        Ok(process::run(&mut c, watch, &[], &[0, 1], &mut |out| {
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
        })?)
    }

    fn shown(&self, path: &[u8]) -> Vec<u8> {
        path.to_vec()
    }
}
