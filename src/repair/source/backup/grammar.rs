//! The words that name a repository: `restic:REPO` or `borg:REPO[::ARCHIVE]`, then the
//! tool's own selectors from an allow-list, passed on as `--flag=VALUE` so that no word of
//! the owner's can become an option of the tool's (`borg:--rsh=CMD` would run CMD). One
//! grammar for `--from` and for the sources the owner configured (`INTACT_REPAIR_FROM`):
//! shell words, as `sh` splits them.

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;
use std::time::Duration;

use super::borg::Borg;
use super::restic::Restic;
use super::{Backup, Search};
use crate::repair::source::{BadSource, Words};
use crate::text::{escape, shell_word};

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

/// `restic:REPO` or `borg:REPO[::ARCHIVE]`, each perhaps followed by its tool's selectors, if
/// `from` names one: shell words, as `sh` splits them (`'restic:/My Backups' --host nas`); its
/// tool is given up on once it says nothing for `silence`. Selectors the tool does not have
/// are an error.
pub(in crate::repair::source) fn parse(
    from: &Path,
    silence: Duration,
) -> Option<Result<Box<dyn Search>, BadSource>> {
    let raw = from.as_os_str().as_bytes();
    let said = |why: Words| {
        Some(Err(BadSource::Backup {
            from: escape(from),
            why,
        }))
    };
    // A name that is not UTF-8 is a location alone, as it is.
    let (first, rest) = match std::str::from_utf8(raw).map(shlex::split) {
        Ok(Some(mut words)) if !words.is_empty() => {
            let rest = words.split_off(1);
            (words.remove(0).into_bytes(), rest)
        }
        _ => (raw.to_vec(), Vec::new()),
    };
    let tool = ["restic", "borg"].into_iter().find(|t| {
        first
            .strip_prefix(t.as_bytes())
            .is_some_and(|r| r.starts_with(b":"))
    })?;
    if std::str::from_utf8(raw).is_ok_and(|t| shlex::split(t).is_none()) {
        return said(Words::UnclosedQuote);
    }
    let location = first[tool.len() + 1..].to_vec();
    let select = match selectors(tool, &rest) {
        Ok(select) => select,
        Err(e) => return said(e),
    };
    // A repository that begins with `-` would reach the tool as an option (`borg:--rsh=CMD`
    // runs CMD).
    if location.starts_with(b"-") {
        return said(Words::DashRepository);
    }
    let repo = |r: &[u8]| (!r.is_empty()).then(|| OsString::from_vec(r.to_vec()));
    let backup = |repo| -> Box<dyn Search> { Box::new(Backup { repo, silence }) };
    Some(Ok(if tool == "restic" {
        backup(Restic {
            repo: repo(&location),
            select,
        })
    } else {
        let (repo_part, archive) = match location.windows(2).rposition(|w| w == b"::") {
            Some(at) => (
                &location[..at],
                Some(String::from_utf8_lossy(&location[at + 2..]).into_owned()),
            ),
            None => (&location[..], None),
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

/// The sources `text` names (`INTACT_REPAIR_FROM`, its line in the settings file), each as
/// one `--from` value (a path as it is, a backup as the shell words [`parse`] reads): shell words, as `sh` splits them, where the words after a `restic:` or
/// `borg:` word that are its tool's selectors (and their values) belong to it:
/// `restic:/srv/restic --host nas /mnt/mirror` is two sources.
pub fn sources(text: &str) -> Result<Vec<String>, BadSource> {
    let bad = |why| BadSource::Configured {
        text: text.to_string(),
        why,
    };
    let words = shlex::split(text).ok_or_else(|| bad(Words::UnclosedQuote))?;
    let mut out = Vec::new();
    let mut i = 0;
    while i < words.len() {
        let tool = ["restic", "borg"]
            .into_iter()
            .find(|t| words[i].starts_with(&format!("{t}:")));
        let n = tool.map_or(0, |t| selected(t, &words[i + 1..]));
        if words[i].starts_with('-') {
            return Err(bad(Words::Stray {
                word: words[i].clone(),
            }));
        }
        // A backup's value is split into shell words again by `parse`; a path is a path.
        out.push(match tool {
            Some(_) => {
                let source: Vec<String> = words[i..=i + n].iter().map(|w| shell_word(w)).collect();
                source.join(" ")
            }
            None => words[i].clone(),
        });
        i += n + 1;
    }
    Ok(out)
}

/// The selectors `tool` has, and whether each takes a value.
fn known(tool: &str) -> &'static [(&'static str, bool)] {
    if tool == "restic" {
        RESTIC_SELECTORS
    } else {
        BORG_SELECTORS
    }
}

/// Whether `word` is a restic snapshot id (its hex id, whole or short) or `latest`.
fn snapshot_id(word: &str) -> bool {
    word == "latest"
        || (8..=64).contains(&word.len()) && word.bytes().all(|b| b.is_ascii_hexdigit())
}

/// How many of `words` are `tool`'s selectors, from the first.
fn selected(tool: &str, words: &[String]) -> usize {
    let mut k = 0;
    while let Some(w) = words.get(k) {
        let flag = w.split_once('=').map_or(w.as_str(), |(f, _)| f);
        match known(tool).iter().find(|(f, _)| *f == flag) {
            Some((_, true)) if !w.contains('=') => k += 2,
            Some(_) => k += 1,
            None if tool == "restic" && snapshot_id(w) => k += 1,
            None => break,
        }
    }
    k.min(words.len())
}

/// The words after a repository, checked against its tool's selectors: `--flag value`,
/// `--flag=value`, and, for restic, snapshot ids.
fn selectors(tool: &'static str, words: &[String]) -> Result<Vec<String>, Words> {
    let names = || {
        let mut n: Vec<&str> = known(tool).iter().map(|(f, _)| *f).collect();
        if tool == "restic" {
            n.push("snapshot ids");
        }
        n.join(", ")
    };
    let mut out = Vec::new();
    let mut words = words.iter();
    while let Some(w) = words.next() {
        let (flag, value) = match w.split_once('=') {
            Some((flag, value)) => (flag, Some(value)),
            None => (w.as_str(), None),
        };
        match known(tool).iter().find(|(f, _)| *f == flag) {
            // Passed on as `--flag=VALUE` (the long name): a value can never become an
            // option of its own.
            Some((_, true)) => {
                let value = match value {
                    Some(v) => v,
                    None => words.next().ok_or_else(|| Words::WantsValue {
                        tool,
                        selector: w.clone(),
                    })?,
                };
                let long = match flag {
                    "-H" => "--host",
                    "-a" => "--glob-archives",
                    long => long,
                };
                out.push(format!("{long}={value}"));
            }
            Some(_) => out.push(w.to_string()),
            None if tool == "restic" && snapshot_id(w) => out.push(w.to_string()),
            None => {
                return Err(Words::NotASelector {
                    tool,
                    word: w.clone(),
                    known: names(),
                });
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
        let words = |w: &str| shlex::split(w).unwrap();
        let ok = |tool, w: &str| selectors(tool, &words(w)).unwrap();
        assert_eq!(
            ok("restic", " --host nas --tag=daily 1a2b3c4d latest -H -x"),
            [
                "--host=nas",
                "--tag=daily",
                "1a2b3c4d",
                "latest",
                "--host=-x"
            ]
        );
        assert_eq!(
            ok("borg", " -a 'nas-*' --last 30"),
            ["--glob-archives=nas-*", "--last=30"]
        );
        for (tool, bad) in [
            ("restic", " --repo /elsewhere"),
            ("restic", " --host"),
            ("restic", " Backups"),
            ("borg", " some-archive"),
            ("borg", " --json"),
        ] {
            assert!(selectors(tool, &words(bad)).is_err(), "{tool}{bad}");
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
                "'restic:/My Backups' -H nas --path '/srv/my photos'",
                "restic:/My Backups --host=nas --path=/srv/my photos",
            ),
            (
                "restic: --host nas",
                "restic:(from the environment) --host=nas",
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
                parsed.is_err_and(|e| matches!(
                    e,
                    BadSource::Backup {
                        why: Words::DashRepository,
                        ..
                    }
                )),
                "{from}"
            );
        }
        // Unquoted spaces end the repository: said, with how to quote it.
        let parsed = parse(
            Path::new("restic:/My Backups -H nas"),
            Duration::from_secs(1),
        );
        assert!(
            parsed
                .unwrap()
                .is_err_and(|e| e.to_string().contains("quoted: 'restic:/My Backups'")),
            "a word that is no selector was taken"
        );
    }

    #[test]
    fn configured_sources_are_shell_words_with_their_selectors() {
        assert_eq!(
            sources("restic:/srv/restic --host nas /mnt/mirror").unwrap(),
            ["restic:/srv/restic --host nas", "/mnt/mirror"]
        );
        assert_eq!(
            sources("'/mnt/my backup' borg:/b --last=3 -a 'nas-*' restic:/r 1a2b3c4d x").unwrap(),
            [
                "/mnt/my backup",
                "borg:/b --last=3 -a 'nas-*'",
                "restic:/r 1a2b3c4d",
                "x"
            ]
        );
        // Each source is one `--from` value that means what the owner wrote.
        let both = sources("'restic:/My Backups' -H nas 'restic:/a b'").unwrap();
        let names: Vec<String> = both
            .iter()
            .map(|s| {
                parse(Path::new(s), Duration::from_secs(1))
                    .unwrap()
                    .unwrap()
                    .name()
            })
            .collect();
        assert_eq!(names, ["restic:/My Backups --host=nas", "restic:/a b"]);
        for bad in ["/mnt/b --host nas", "restic:/r --json", "'/mnt/b"] {
            assert!(sources(bad).is_err(), "{bad}");
        }
    }
}
