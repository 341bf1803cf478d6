//! The words that name a repository: `restic:REPO` or `borg:REPO[::ARCHIVE]`, then the
//! tool's own selectors from an allow-list, passed on as `--flag=VALUE` so that no word of
//! the owner's can become an option of the tool's (`borg:--rsh=CMD` would run CMD).

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;
use std::time::Duration;

use super::borg::Borg;
use super::restic::Restic;
use super::{Backup, Search};
use crate::text::escape;

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
pub(in crate::repair::source) fn parse(
    from: &Path,
    silence: Duration,
) -> Option<Result<Box<dyn Search>, String>> {
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

/// A repository's name for reports (`prefix` its tool's), or the environment variable it
/// comes from, with its selectors.
pub(super) fn named(prefix: &str, repo: &Option<OsString>, select: &[String]) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
