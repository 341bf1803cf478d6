//! The reporter: renders file reports for people or as JSON Lines, keeps the summary, and
//! decides the exit code.

use std::io::{self, Write};
use std::path::Path;
use std::time::Duration;

use serde::Serialize;

use crate::core::classify::Status;
use crate::engine::{Action, FileReport, Verb};
use crate::fs::walk::SkipReason;

/// Exit codes, from the most to the least important.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Exit {
    /// Everything processed, nothing damaged.
    Clean = 0,
    /// Some file's data changed without a legitimate write (corrupt or mismatch).
    Damage = 1,
    /// Bad command line (as clap reports it).
    Usage = 2,
    /// Some files could not be processed or verified.
    Trouble = 3,
    /// Interrupted by a signal before the end.
    Interrupted = 130,
}

impl Exit {
    /// Combines two outcomes: damage wins over everything else, then interruption, then
    /// trouble.
    pub fn merge(self, other: Exit) -> Exit {
        let rank = |e: Exit| match e {
            Exit::Damage => 4,
            Exit::Interrupted => 3,
            Exit::Trouble => 2,
            Exit::Usage => 1,
            Exit::Clean => 0,
        };
        if rank(other) > rank(self) {
            other
        } else {
            self
        }
    }
}

/// Totals over a run.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    /// Files reported, per status.
    pub counts: [u64; Status::ALL.len()],
    /// Files written, refreshed, kept or stripped.
    pub actions: [u64; Action::ALL.len()],
    /// Bytes of file data read.
    pub bytes: u64,
    /// Tags that were present but unusable.
    pub malformed: u64,
    /// Wall time.
    pub elapsed: Duration,
    /// Whether the run was cut short.
    pub interrupted: bool,
}

impl Summary {
    /// Counts one report.
    pub fn add(&mut self, r: &FileReport) {
        self.counts[r.status as usize] += 1;
        if let Some(a) = r.action {
            self.actions[a as usize] += 1;
        }
        self.bytes += r.bytes_read;
        self.malformed += r.malformed.len() as u64;
    }

    /// Files reported with `status`.
    pub fn count(&self, status: Status) -> u64 {
        self.counts[status as usize]
    }

    /// Files to which `action` was done.
    pub fn action(&self, action: Action) -> u64 {
        self.actions[action as usize]
    }

    /// Files reported in all.
    pub fn files(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The exit code for this run of `verb`.
    pub fn exit(&self, verb: Verb) -> Exit {
        let mut exit = Exit::Clean;
        if self.count(Status::Corrupt) + self.count(Status::Mismatch) > 0 {
            exit = exit.merge(Exit::Damage);
        }
        if self.interrupted {
            exit = exit.merge(Exit::Interrupted);
        }
        // A malformed tag leaves a file unverifiable: trouble for check, repaired by the others.
        let unverified = if matches!(verb, Verb::Check | Verb::Repair | Verb::Verify) {
            self.malformed
        } else {
            0
        };
        let trouble = [
            Status::Error,
            Status::Changed,
            Status::Conflict,
            Status::Missing,
        ];
        if trouble.iter().map(|&s| self.count(s)).sum::<u64>() + unverified > 0 {
            exit = exit.merge(Exit::Trouble);
        }
        exit
    }
}

/// How much to say.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verbosity {
    /// Only damage and errors; no summary.
    Quiet,
    /// Everything that needs attention, and a summary.
    Normal,
    /// Every file.
    Verbose,
}

/// Renders reports as lines of text or JSON, and keeps the summary.
pub struct Reporter<W: Write, E: Write> {
    verb: Verb,
    json: bool,
    verbosity: Verbosity,
    out: W,
    err: E,
    /// The running totals.
    pub summary: Summary,
}

impl<W: Write, E: Write> Reporter<W, E> {
    /// A reporter writing per-file lines to `out` and warnings and the summary to `err`.
    pub fn new(verb: Verb, json: bool, verbosity: Verbosity, out: W, err: E) -> Self {
        Reporter {
            verb,
            json,
            verbosity,
            out,
            err,
            summary: Summary::default(),
        }
    }

    /// Counts and renders one file.
    pub fn file(&mut self, r: &FileReport) -> io::Result<()> {
        self.summary.add(r);
        if self.json {
            serde_json::to_writer(&mut self.out, &JsonFile::from(r))?;
            return writeln!(self.out);
        }
        for (attr, why) in &r.malformed {
            writeln!(
                self.err,
                "intact: warning: {}: ignoring malformed {attr} ({why})",
                escape(&r.path)
            )?;
        }
        if !self.shows(r) {
            return Ok(());
        }
        let path = escape(&r.path);
        let status = match r.action {
            Some(Action::Repaired) => "repaired",
            _ => r.status.name(),
        };
        if self.verb == Verb::Show {
            let digest = r.tag.as_ref().map_or("-".into(), |t| t.digest.to_string());
            let format = r.tag.as_ref().map_or("-", |t| t.format.name());
            return writeln!(self.out, "{status:<8} {format:<6} {digest} {path}");
        }
        if let Some(e) = &r.error {
            writeln!(self.out, "{status:<8} {path}: {e}")
        } else if let Some(why) = &r.detail {
            writeln!(self.out, "{status:<8} {path}: {why}")
        } else if let Some(why) = r.skip {
            writeln!(self.out, "{status:<8} {path}: {why}")
        } else if self.verb == Verb::Strip {
            let done = if r.action.is_some() {
                "removed"
            } else {
                "no-tag"
            };
            writeln!(self.out, "{done:<8} {path}")
        } else {
            writeln!(self.out, "{status:<8} {path}")
        }
    }

    /// Whether rendering `r` writes anything (so a progress bar must step aside).
    pub fn prints(&self, r: &FileReport) -> bool {
        self.json || !r.malformed.is_empty() || self.shows(r)
    }

    /// Whether a report gets a line: problems always, the expected outcome of the verb
    /// only when verbose, so a clean run prints nothing but its summary.
    fn shows(&self, r: &FileReport) -> bool {
        let s = r.status;
        match self.verbosity {
            Verbosity::Verbose => true,
            // What a killed run left behind is worth a line, the more so when it goes.
            Verbosity::Normal if r.skip == Some(SkipReason::Leftover) => true,
            Verbosity::Quiet => {
                s.is_damage()
                    || matches!(
                        s,
                        Status::Error | Status::Changed | Status::Conflict | Status::Missing
                    )
            }
            Verbosity::Normal => match self.verb {
                Verb::Show => true,
                Verb::Strip => s == Status::Error,
                Verb::Export => !matches!(s, Status::Ok | Status::Skipped),
                Verb::Import => !matches!(s, Status::Ok | Status::Skipped),
                Verb::Tag => {
                    r.detail.is_some()
                        || !matches!(
                            s,
                            Status::Ok
                                | Status::New
                                | Status::Tagged
                                | Status::Skipped
                                | Status::Touched
                        )
                }
                Verb::Check | Verb::Update | Verb::Archive | Verb::Verify | Verb::Protect => {
                    !matches!(s, Status::Ok | Status::Skipped | Status::Touched)
                }
                Verb::Repair => {
                    r.action == Some(Action::Repaired)
                        || !matches!(s, Status::Ok | Status::Skipped | Status::Touched)
                }
            },
        }
    }

    /// Writes the summary (to `err` for people, to `out` as the last JSON line) and returns
    /// the exit code.
    pub fn finish(&mut self) -> io::Result<Exit> {
        let exit = self.summary.exit(self.verb);
        if self.json {
            serde_json::to_writer(
                &mut self.out,
                &JsonSummary::new(self.verb, &self.summary, exit),
            )?;
            writeln!(self.out)?;
        } else if self.verbosity > Verbosity::Quiet {
            writeln!(self.err, "{}", human_summary(self.verb, &self.summary))?;
            let kept = self.summary.action(Action::Kept);
            if kept > 0 {
                writeln!(
                    self.err,
                    "intact: {kept} damaged file(s) kept their old tag as evidence: restore them from a \
                     backup, or run `intact update --accept-corrupt` on them if the change was intended"
                )?;
            }
        }
        self.out.flush()?;
        Ok(exit)
    }
}

/// `check: 1,204 files, 5.20 GB in 3.1 s (1.68 GB/s, 388 files/s): 1,200 ok, 3 new, 1 corrupt`
pub fn human_summary(verb: Verb, s: &Summary) -> String {
    let secs = s.elapsed.as_secs_f64().max(1e-9);
    let mut parts: Vec<String> = Status::ALL
        .iter()
        .filter(|&&st| s.count(st) > 0)
        .map(|&st| format!("{} {}", group(s.count(st)), st.name()))
        .collect();
    parts.extend(
        Action::ALL
            .iter()
            .filter(|&&a| s.action(a) > 0)
            .map(|&a| format!("{} {}", group(s.action(a)), a.name())),
    );
    if s.interrupted {
        parts.push("INTERRUPTED".into());
    }
    format!(
        "{}: {} files, {} in {} ({}/s, {} files/s){}{}",
        verb.name(),
        group(s.files()),
        bytes(s.bytes),
        if secs < 1.0 {
            format!("{:.0} ms", secs * 1e3)
        } else {
            format!("{secs:.1} s")
        },
        bytes((s.bytes as f64 / secs) as u64),
        group((s.files() as f64 / secs) as u64),
        if parts.is_empty() { "" } else { ": " },
        parts.join(", ")
    )
}

/// 1234567 → "1,234,567".
fn group(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A byte count in decimal units, as disk makers and `dd` use them.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["kB", "MB", "GB", "TB", "PB"];
    if n < 1000 {
        return format!("{n} B");
    }
    let mut v = n as f64;
    let mut unit = "B";
    for u in UNITS {
        if v < 1000.0 {
            break;
        }
        v /= 1000.0;
        unit = u;
    }
    format!("{v:.2} {unit}")
}

/// A path made safe to print on one line: backslash, control characters and bytes that are
/// not UTF-8 are written as `\\`, `\n`, `\t`, `\r` and `\xNN`; everything else as is.
pub fn escape(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut out = String::new();
    for chunk in path.as_os_str().as_bytes().utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\t' => out.push_str("\\t"),
                '\r' => out.push_str("\\r"),
                c if c.is_control() => {
                    let mut b = [0u8; 4];
                    for byte in c.encode_utf8(&mut b).bytes() {
                        out.push_str(&format!("\\x{byte:02x}"));
                    }
                }
                c => out.push(c),
            }
        }
        for byte in chunk.invalid() {
            out.push_str(&format!("\\x{byte:02x}"));
        }
    }
    out
}

#[derive(Serialize)]
struct JsonFile<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    path: String,
    status: Status,
    #[serde(skip_serializing_if = "Option::is_none")]
    action: Option<Action>,
    #[serde(skip_serializing_if = "Option::is_none")]
    size: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    format: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    algo: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    expected: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    actual: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tag_mtime: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tagged: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    skip: Option<crate::fs::walk::SkipReason>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error_kind: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    detail: Option<&'a str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    warnings: Vec<String>,
}

impl<'a> From<&'a FileReport> for JsonFile<'a> {
    fn from(r: &'a FileReport) -> Self {
        JsonFile {
            kind: "file",
            path: escape(&r.path),
            status: r.status,
            action: r.action,
            size: r.size,
            format: r.tag.as_ref().map(|t| t.format.name()),
            algo: r
                .tag
                .as_ref()
                .map(|t| t.digest.algo.name())
                .or(r.digest.map(|d| d.algo.name())),
            expected: r.tag.as_ref().map(|t| t.digest.hex()),
            actual: r.digest.map(|d| d.hex()),
            tag_mtime: r.tag.as_ref().and_then(|t| t.mtime).map(|m| m.to_string()),
            tagged: r.tag.as_ref().and_then(|t| t.tagged),
            skip: r.skip,
            error: r.error.as_ref().map(|e| e.to_string()),
            error_kind: r.error.as_ref().map(|e| e.kind()),
            detail: r.detail.as_deref(),
            warnings: r
                .malformed
                .iter()
                .map(|(attr, why)| format!("ignoring malformed {attr} ({why})"))
                .collect(),
        }
    }
}

#[derive(Serialize)]
struct JsonSummary {
    #[serde(rename = "type")]
    kind: &'static str,
    verb: Verb,
    files: u64,
    bytes: u64,
    elapsed_s: f64,
    counts: std::collections::BTreeMap<&'static str, u64>,
    actions: std::collections::BTreeMap<&'static str, u64>,
    malformed_tags: u64,
    interrupted: bool,
    exit_code: i32,
}

impl JsonSummary {
    fn new(verb: Verb, s: &Summary, exit: Exit) -> Self {
        JsonSummary {
            kind: "summary",
            verb,
            files: s.files(),
            bytes: s.bytes,
            elapsed_s: s.elapsed.as_secs_f64(),
            counts: Status::ALL
                .iter()
                .map(|&st| (st.name(), s.count(st)))
                .collect(),
            actions: Action::ALL
                .iter()
                .map(|&a| (a.name(), s.action(a)))
                .collect(),
            malformed_tags: s.malformed,
            interrupted: s.interrupted,
            exit_code: exit as i32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;

    #[test]
    fn escapes_what_would_break_a_line() {
        let p = Path::new(OsStr::from_bytes(b"a b\\c\nd\te\xff\x01\xc3\xa9"));
        assert_eq!(escape(p), "a b\\\\c\\nd\\te\\xff\\x01é");
    }

    #[test]
    fn damage_wins_over_everything() {
        let mut s = Summary::default();
        assert_eq!(s.exit(Verb::Check), Exit::Clean);
        s.counts[Status::Error as usize] = 1;
        assert_eq!(s.exit(Verb::Check), Exit::Trouble);
        s.interrupted = true;
        assert_eq!(s.exit(Verb::Check), Exit::Interrupted);
        s.counts[Status::Corrupt as usize] = 1;
        assert_eq!(s.exit(Verb::Check), Exit::Damage);
    }

    #[test]
    fn malformed_tags_trouble_check_only() {
        let s = Summary {
            malformed: 1,
            ..Default::default()
        };
        assert_eq!(s.exit(Verb::Check), Exit::Trouble);
        assert_eq!(s.exit(Verb::Update), Exit::Clean);
    }

    #[test]
    fn numbers_for_people() {
        assert_eq!(group(1234567), "1,234,567");
        assert_eq!(group(12), "12");
        assert_eq!(bytes(999), "999 B");
        assert_eq!(bytes(1_500_000), "1.50 MB");
        assert_eq!(bytes(2_000_000_000), "2.00 GB");
    }
}
