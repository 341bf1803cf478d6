//! The reporter: renders file reports for people or as JSON Lines, keeps the summary, and
//! decides the exit code.
//!
//! One definition of what a summary counts, for every verb: **files** are the regular files
//! looked at (skipped entries, such as symlinks, are counted apart, not as files), and
//! **bytes** are the file data read and hashed (holes of sparse files included, unread
//! files not). A report whose action only stands once the work is durable (a file written
//! into an archive that is not finished yet) is *held*: rendered into a spool and counted
//! apart, then let out as it is, or without that action, when the work is settled.

use std::fs::File;
use std::io::{self, Read, Seek, Write};
use std::time::Duration;

use serde::Serialize;

use crate::core::classify::Status;
use crate::engine::{Action, FileReport};
use crate::fs::walk::SkipReason;
use crate::text::{bytes, escape, group};
use crate::verb::Verb;

/// Exit codes, from the most to the least important.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Exit {
    /// Everything processed, nothing damaged.
    Clean = 0,
    /// Some file's data changed without a legitimate write (corrupt or mismatch).
    Damage = 1,
    /// Bad command line (as clap reports it).
    Usage = 2,
    /// Some files could not be processed or verified, or the work could not be done.
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

/// How far a scrub's current cycle has come (the JSON summary's `cycle`).
#[derive(Clone, Debug, serde::Serialize)]
pub struct Cycle {
    /// When it began (local time).
    pub started: String,
    /// Tagged files checked since.
    pub files_checked: u64,
    /// Their bytes.
    pub bytes_checked: u64,
    /// Tagged files under the trees.
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Whether every tagged file has been checked in it.
    pub complete: bool,
}

/// Totals over a run.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    /// Reports, per status.
    pub counts: [u64; Status::ALL.len()],
    /// Files written, refreshed, kept or stripped.
    pub actions: [u64; Action::ALL.len()],
    /// Bytes of file data read.
    pub bytes: u64,
    /// Tags that were present but unusable.
    pub malformed: u64,
    /// Wall time.
    pub elapsed: Duration,
    /// Whether the run was cut short by a signal.
    pub interrupted: bool,
    /// What could not be done beyond single files (an archive or parity store that could
    /// not be written, manifest lines that could not be used): each makes the exit code 3.
    pub failures: Vec<String>,
    /// Damage beyond single files (an archive whose own stream is damaged): each makes the
    /// exit code 1.
    pub damage: Vec<String>,
    /// Damage found by earlier runs, still there, that this run did not read: it counts as
    /// damage all the same (exit 1), run after run, until it is dealt with.
    pub outstanding: u64,
    /// Files found gone from their tree since they were last seen.
    pub removed: u64,
    /// New files the run left untagged (a check's; an update tags them).
    pub left_untagged: u64,
    /// A scrub's cycle: how far the current one has come.
    pub cycle: Option<Cycle>,
    /// What is wrong, in the words a message to the owner uses.
    pub findings: crate::notify::Findings,
    /// Trees that vanished (none of their recorded files there), or lost so many files at
    /// once that nothing was marked deleted: each is a failure too (exit 3).
    pub vanished: u64,
    /// Files whose deletion was held back as an alarm (a mass deletion, a vanished tree).
    pub removed_alarm: u64,
    /// Whether telling the owner failed (`None`: nobody is to be told).
    pub notify_failed: Option<bool>,
}

impl Summary {
    /// A failure beyond single files: said with the summary, and the exit code is 3.
    pub fn fail(&mut self, what: String) {
        self.findings
            .push(crate::notify::Problem::Failure { what: what.clone() });
        self.failures.push(what);
    }

    /// A tree that vanished, or lost `files` at once (kept as an alarm, not marked deleted):
    /// a failure (exit 3) of its own kind.
    pub fn vanished(&mut self, what: String, files: u64) {
        self.vanished += 1;
        self.removed_alarm += files;
        self.findings
            .push(crate::notify::Problem::Vanished { what: what.clone() });
        self.failures.push(what);
    }

    /// Damage beyond single files: said with the summary, and the exit code is 1.
    pub fn damage(&mut self, what: String) {
        self.findings.damaged(what.clone(), None);
        self.damage.push(what);
    }

    /// Counts one report.
    pub fn add(&mut self, r: &FileReport) {
        self.counts[r.status as usize] += 1;
        if let Some(a) = r.action {
            self.actions[a as usize] += 1;
        }
        self.bytes += r.bytes_read;
        self.malformed += r.malformed.len() as u64;
        if r.status == Status::New && r.action != Some(Action::Tagged) {
            self.left_untagged += 1;
        }
        match r.status {
            Status::Corrupt | Status::Mismatch | Status::Unstable
                if r.action != Some(Action::Accepted) =>
            {
                // Found before, these same bytes: since then.
                let found = r
                    .known_damage
                    .filter(|k| Some(k.digest) == r.digest)
                    .map_or_else(crate::state::now, |k| k.found.saturating_mul(1000));
                let path = crate::state::absolute(&r.path);
                self.findings.damaged(escape(&path), Some(found));
            }
            Status::Error | Status::Changed | Status::Conflict | Status::Missing => {
                let why = r.error.as_ref().map_or_else(
                    || r.status.name().to_string(),
                    |e| format!("{}: {e}", r.status.name()),
                );
                let path = crate::state::absolute(&r.path);
                self.findings
                    .unverified(format!("{} ({why})", escape(&path)));
            }
            _ => {}
        }
    }

    /// Adds another summary's counts to these.
    fn merge(&mut self, other: &Summary) {
        for (a, b) in self.counts.iter_mut().zip(other.counts) {
            *a += b;
        }
        for (a, b) in self.actions.iter_mut().zip(other.actions) {
            *a += b;
        }
        self.bytes += other.bytes;
        self.malformed += other.malformed;
        self.left_untagged += other.left_untagged;
        self.findings.merge(&other.findings);
    }

    /// Reports with `status`.
    pub fn count(&self, status: Status) -> u64 {
        self.counts[status as usize]
    }

    /// Files to which `action` was done.
    pub fn action(&self, action: Action) -> u64 {
        self.actions[action as usize]
    }

    /// Damaged files not dealt with: found damaged by this run and neither repaired nor
    /// accepted (a repaired file is `ok`), and the damage earlier runs found that is still
    /// there.
    pub fn damaged(&self) -> u64 {
        (self.count(Status::Corrupt) + self.count(Status::Mismatch) + self.count(Status::Unstable))
            .saturating_sub(self.action(Action::Accepted))
            + self.outstanding
            + self.damage.len() as u64
    }

    /// Regular files looked at: every report but the skipped entries.
    pub fn files(&self) -> u64 {
        self.counts.iter().sum::<u64>() - self.count(Status::Skipped)
    }

    /// The exit code for this run of `verb`.
    pub fn exit(&self, verb: Verb) -> Exit {
        let mut exit = Exit::Clean;
        if self.damaged() > 0 {
            exit = exit.merge(Exit::Damage);
        }
        if self.interrupted {
            exit = exit.merge(Exit::Interrupted);
        }
        // A malformed tag leaves a file unverifiable: trouble for check, repaired by the others.
        let unverified = if matches!(
            verb,
            Verb::Check | Verb::Scrub | Verb::Repair | Verb::Verify
        ) {
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
        let troubled = trouble.iter().map(|&s| self.count(s)).sum::<u64>() + unverified;
        if troubled > 0 || !self.failures.is_empty() {
            exit = exit.merge(Exit::Trouble);
        }
        exit
    }
}

/// How much to say.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verbosity {
    /// Only damage, errors and repairs; no summary.
    Quiet,
    /// Everything that needs attention, and a summary.
    Normal,
    /// Every file.
    Verbose,
}

/// How reports are rendered.
#[derive(Clone, Copy, Debug)]
struct Style {
    verb: Verb,
    json: bool,
    verbosity: Verbosity,
}

/// Renders reports as lines of text or JSON, and keeps the summary.
pub struct Reporter<W: Write, E: Write> {
    style: Style,
    out: W,
    err: E,
    /// The running totals.
    pub summary: Summary,
    /// Reports held until their work is settled: rendered, and counted both ways.
    held: Spool,
    /// Lines for people, printed with the summary.
    notes: Vec<String>,
}

impl<W: Write, E: Write> Reporter<W, E> {
    /// A reporter writing per-file lines to `out` and warnings and the summary to `err`.
    pub fn new(verb: Verb, json: bool, verbosity: Verbosity, out: W, err: E) -> Self {
        Reporter {
            style: Style {
                verb,
                json,
                verbosity,
            },
            out,
            err,
            summary: Summary::default(),
            held: Spool::default(),
            notes: Vec::new(),
        }
    }

    /// Counts and renders one file.
    pub fn file(&mut self, r: &FileReport) -> io::Result<()> {
        self.summary.add(r);
        self.style.warn(r, &mut self.err)?;
        self.style.render(r, &mut self.out)
    }

    /// Counts and renders a file whose action stands only once its work is durable; with
    /// `fallback` as its action otherwise. Let out, in order, by [`Reporter::settle`].
    pub fn hold(&mut self, r: &FileReport, fallback: Option<Action>) -> io::Result<()> {
        self.style.warn(r, &mut self.err)?;
        let mut lines = [Vec::new(), Vec::new()];
        self.style.render(r, &mut lines[0])?;
        self.held.counts[0].add(r);
        let mut without = Summary::default();
        without.add(r);
        if let Some(a) = r.action {
            without.actions[a as usize] -= 1;
        }
        if let Some(a) = fallback {
            without.actions[a as usize] += 1;
        }
        self.held.counts[1].merge(&without);
        if self.style.json && r.action != fallback {
            let mut json = JsonFile::from(r);
            json.action = fallback;
            serde_json::to_writer(&mut lines[1], &json)?;
            lines[1].push(b'\n');
        } else {
            lines[1] = lines[0].clone();
        }
        self.held.push(&lines)
    }

    /// Lets out the held reports: as they are if their work is `durable`, else with their
    /// fallback action.
    pub fn settle(&mut self, durable: bool) -> io::Result<()> {
        let which = usize::from(!durable);
        let counts = std::mem::take(&mut self.held.counts[which]);
        self.summary.merge(&counts);
        self.held.counts = Default::default();
        self.held.replay(which, &mut self.out)
    }

    /// Damage an earlier run found that is still there and was not read by this one: a line
    /// (a `"type":"damage"` object in JSON), and it counts as damage.
    pub fn outstanding(&mut self, d: &crate::state::Damaged) -> io::Result<()> {
        self.summary.outstanding += 1;
        self.summary.findings.damaged(escape(&d.path), d.found);
        if self.style.json {
            return self.json_line("damage", d, &[("found", d.found)]);
        }
        let status = d.status.as_deref().unwrap_or("corrupt");
        writeln!(
            self.out,
            "{status:<8} {}: found damaged at {}, not yet repaired (not read by this run)",
            escape(&d.path),
            d.found.map_or("?".into(), crate::text::time_ms)
        )
    }

    /// A file that is gone from its tree since it was last seen: a line (not with `-q`: a
    /// deletion is no damage), a `"type":"removed"` object in JSON.
    pub fn removed(&mut self, g: &crate::scrub::Gone) -> io::Result<()> {
        self.summary.removed += 1;
        if self.style.json {
            let times = [
                ("verified", g.verified),
                ("damaged", g.damaged),
                ("gone", g.gone),
            ];
            return self.json_line("removed", g, &times);
        }
        if self.style.verbosity == Verbosity::Quiet {
            return Ok(());
        }
        let last = g.verified.map_or("never verified".into(), |v| {
            format!("last verified {}", crate::text::time_ms(v))
        });
        let damaged = if g.damaged.is_some() {
            "; it was damaged"
        } else {
            ""
        };
        writeln!(
            self.out,
            "removed  {}: gone since it was last seen ({last}{damaged})",
            escape(&g.path)
        )
    }

    /// `value` as a JSON line of `kind`, its `times` (Unix milliseconds) as RFC 3339.
    fn json_line(
        &mut self,
        kind: &str,
        value: &impl Serialize,
        times: &[(&str, Option<i64>)],
    ) -> io::Result<()> {
        let mut v = serde_json::to_value(value).map_err(io::Error::other)?;
        v["type"] = kind.into();
        for (key, t) in times {
            v[*key] = t.map(crate::text::time_ms).into();
        }
        serde_json::to_writer(&mut self.out, &v)?;
        writeln!(self.out)
    }

    /// A line for people, printed before the summary (not with `--json` or `-q`).
    pub fn note(&mut self, line: String) {
        self.notes.push(line);
    }

    /// Whether rendering `r` writes anything (so a progress bar must step aside).
    pub fn prints(&self, r: &FileReport) -> bool {
        self.style.json || !r.malformed.is_empty() || self.style.shows(r)
    }

    /// Writes the summary (to `err` for people, to `out` as the last JSON line) and returns
    /// the exit code, which the summary states.
    pub fn finish(&mut self) -> io::Result<Exit> {
        // Held reports whose work was never settled did not become durable.
        if !self.held.is_empty() {
            self.settle(false)?;
        }
        let verb = self.style.verb;
        let exit = self.summary.exit(verb);
        // The lines come before the summary where both reach one terminal.
        self.out.flush()?;
        if self.style.json {
            serde_json::to_writer(&mut self.out, &JsonSummary::new(verb, &self.summary, exit))?;
            writeln!(self.out)?;
        } else if self.style.verbosity > Verbosity::Quiet {
            for note in &self.notes {
                writeln!(self.err, "{note}")?;
            }
            writeln!(self.err, "{}", human_summary(verb, &self.summary))?;
            let kept = self.summary.action(Action::Kept);
            if kept > 0 {
                writeln!(
                    self.err,
                    "intact: {kept} damaged file(s) kept their old tag as evidence: restore them from a \
                     backup, or run `intact update --accept-corrupt` on them if the change was intended"
                )?;
            }
            let earlier = self.summary.outstanding;
            if earlier > 0 {
                writeln!(
                    self.err,
                    "intact: {earlier} file(s) found damaged by earlier runs are still damaged \
                     (listed above): `intact repair PATH --from BACKUP` restores them, \
                     `intact update --accept-corrupt FILE` accepts them as they are"
                )?;
            }
        }
        if !self.style.json {
            for damage in &self.summary.damage {
                writeln!(self.err, "intact: damaged: {damage}")?;
            }
            for failure in &self.summary.failures {
                writeln!(self.err, "intact: error: {failure}")?;
            }
            // Said even under -q, where damage's exit code 1 would hide it.
            if self.summary.interrupted {
                writeln!(
                    self.err,
                    "intact: interrupted: the {} stopped before it finished; what it did not \
                     reach was not verified",
                    verb.name()
                )?;
            }
        }
        self.out.flush()?;
        Ok(exit)
    }
}

impl Style {
    /// Warnings about a report (malformed tags), to stderr for people; in JSON they are
    /// part of the file's object.
    fn warn(&self, r: &FileReport, err: &mut impl Write) -> io::Result<()> {
        if self.json {
            return Ok(());
        }
        for (attr, why) in &r.malformed {
            writeln!(
                err,
                "intact: warning: {}: ignoring malformed {attr} ({why})",
                escape(&r.path)
            )?;
        }
        Ok(())
    }

    /// The report's line, if it gets one.
    fn render(&self, r: &FileReport, out: &mut impl Write) -> io::Result<()> {
        if self.json {
            serde_json::to_writer(&mut *out, &JsonFile::from(r))?;
            return writeln!(out);
        }
        if !self.shows(r) {
            return Ok(());
        }
        let path = escape(&r.path);
        let status = match r.action {
            Some(Action::Repaired) => "repaired",
            Some(Action::Accepted) => "accepted",
            _ => r.status.name(),
        };
        if self.verb == Verb::Show {
            let digest = r.tag.as_ref().map_or("-".into(), |t| t.digest.to_string());
            let format = r.tag.as_ref().map_or("-", |t| t.format.name());
            return writeln!(out, "{status:<8} {format:<6} {digest} {path}");
        }
        if let Some(e) = &r.error {
            writeln!(out, "{status:<8} {path}: {e}")
        } else if let Some(why) = &r.detail {
            writeln!(out, "{status:<8} {path}: {why}")
        } else if let Some(why) = r.skip {
            writeln!(out, "{status:<8} {path}: {why}")
        } else if self.verb == Verb::Strip {
            let done = if r.action.is_some() {
                "removed"
            } else {
                "no-tag"
            };
            writeln!(out, "{done:<8} {path}")
        } else {
            writeln!(out, "{status:<8} {path}")
        }
    }

    /// Whether a report gets a line: problems always, the expected outcome of the verb
    /// only when verbose, so a clean run prints nothing but its summary.
    fn shows(&self, r: &FileReport) -> bool {
        let s = r.status;
        match self.verbosity {
            Verbosity::Verbose => true,
            // A replaced or accepted file is worth a line, even in quiet mode: it is the
            // record of what was changed.
            _ if matches!(r.action, Some(Action::Repaired | Action::Accepted)) => true,
            Verbosity::Quiet => {
                s.is_damage()
                    || matches!(
                        s,
                        Status::Error | Status::Changed | Status::Conflict | Status::Missing
                    )
            }
            // What a killed run left behind is worth a line, the more so when it goes.
            Verbosity::Normal if r.skip == Some(SkipReason::Leftover) => true,
            Verbosity::Normal => match self.verb {
                Verb::Show | Verb::Status => true,
                Verb::Strip => s == Status::Error,
                Verb::Export | Verb::Import => !matches!(s, Status::Ok | Status::Skipped),
                Verb::Tag => {
                    r.detail.is_some()
                        || !matches!(
                            s,
                            Status::Ok
                                | Status::New
                                | Status::AlreadyTagged
                                | Status::Skipped
                                | Status::Touched
                        )
                }
                Verb::Check
                | Verb::Scrub
                | Verb::Update
                | Verb::Archive
                | Verb::Verify
                | Verb::Protect
                | Verb::Repair => !matches!(s, Status::Ok | Status::Skipped | Status::Touched),
                // A service's log: what it tagged and what is wrong, not what it left unread.
                Verb::Watch => !matches!(
                    s,
                    Status::Ok | Status::Skipped | Status::Touched | Status::AlreadyTagged
                ),
            },
        }
    }
}

/// Rendered lines waiting to be let out, in order: in memory up to a bound, then in an
/// unnamed temp file, so that holding a million reports costs no memory.
#[derive(Default)]
struct Spool {
    mem: Vec<u8>,
    file: Option<File>,
    /// What the held reports add to the summary if their work is durable, and if not.
    counts: [Summary; 2],
}

impl Spool {
    const MEMORY: usize = 4 << 20;

    fn is_empty(&self) -> bool {
        self.mem.is_empty() && self.file.is_none()
    }

    /// Appends one report's two renderings (durable, and not).
    fn push(&mut self, lines: &[Vec<u8>; 2]) -> io::Result<()> {
        for line in lines {
            self.mem
                .extend_from_slice(&(line.len() as u32).to_le_bytes());
            self.mem.extend_from_slice(line);
        }
        if self.mem.len() >= Self::MEMORY {
            let file = match &mut self.file {
                Some(f) => f,
                None => self.file.insert(tempfile::tempfile()?),
            };
            file.write_all(&self.mem)?;
            self.mem.clear();
        }
        Ok(())
    }

    /// Writes rendering `which` of every held report to `out`, and empties the spool.
    fn replay(&mut self, which: usize, out: &mut impl Write) -> io::Result<()> {
        let mem = io::Cursor::new(std::mem::take(&mut self.mem));
        let mut input: Box<dyn Read> = match self.file.take() {
            Some(mut file) => {
                file.rewind()?;
                Box::new(io::BufReader::new(file).chain(mem))
            }
            None => Box::new(mem),
        };
        let (mut len, mut line) = ([0u8; 4], Vec::new());
        for n in 0.. {
            match input.read_exact(&mut len) {
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break,
                read => read?,
            }
            line.resize(u32::from_le_bytes(len) as usize, 0);
            input.read_exact(&mut line)?;
            if n % 2 == which {
                out.write_all(&line)?;
            }
        }
        Ok(())
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
        "{}: {} {}, {} in {} ({}/s, {} files/s){}{}",
        verb.name(),
        group(s.files()),
        if s.files() == 1 { "file" } else { "files" },
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

/// The JSON summary of a run of `verb` that ended before it began (a usage error, a database
/// that could not be opened): the same object every run ends with, its counts zero, `why`
/// among its errors.
pub fn failed_start(verb: Verb, why: String, exit: Exit) -> String {
    let summary = Summary {
        failures: vec![why],
        ..Summary::default()
    };
    serde_json::to_string(&JsonSummary::new(verb, &summary, exit)).expect("a summary serializes")
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
    damaged_outstanding: u64,
    removed: u64,
    /// Trees that vanished or lost many files at once (nothing was marked deleted).
    vanished: u64,
    /// Whether telling the owner failed; absent when nobody is to be told.
    #[serde(skip_serializing_if = "Option::is_none")]
    notify_failed: Option<bool>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    errors: Vec<String>,
    /// Damage beyond single files (an archive's own stream).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    damage: Vec<String>,
    exit_code: i32,
    #[serde(skip_serializing_if = "Option::is_none")]
    cycle: Option<Cycle>,
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
            damaged_outstanding: s.outstanding,
            removed: s.removed,
            vanished: s.vanished,
            notify_failed: s.notify_failed,
            errors: s.failures.clone(),
            damage: s.damage.clone(),
            exit_code: exit as i32,
            cycle: s.cycle.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn failures_beyond_files_are_trouble() {
        let mut s = Summary::default();
        s.failures.push("the archive could not be written".into());
        assert_eq!(s.exit(Verb::Archive), Exit::Trouble);
    }

    #[test]
    fn held_reports_are_let_out_in_order_with_or_without_their_action() {
        for durable in [true, false] {
            let mut out = Vec::new();
            let mut r = Reporter::new(Verb::Archive, true, Verbosity::Normal, &mut out, io::sink());
            let mut first = FileReport::new("a".into(), Status::Ok);
            first.action = Some(Action::Archived);
            r.hold(&first, Some(Action::Tagged)).unwrap();
            // Past the memory bound, so the spool goes through its file.
            let mut big = FileReport::new("b".into(), Status::Ok);
            big.detail = Some("x".repeat(Spool::MEMORY));
            big.action = Some(Action::Archived);
            r.hold(&big, None).unwrap();
            r.settle(durable).unwrap();
            r.file(&FileReport::new("c".into(), Status::New)).unwrap();
            r.finish().unwrap();
            assert_eq!(
                r.summary.action(Action::Archived),
                if durable { 2 } else { 0 }
            );
            assert_eq!(r.summary.action(Action::Tagged), u64::from(!durable));
            drop(r);
            let text = String::from_utf8(out).unwrap();
            let lines: Vec<&str> = text.lines().collect();
            assert_eq!(lines.len(), 4, "{text:.300}");
            assert!(lines[0].contains("\"path\":\"a\""));
            assert!(lines[1].contains("\"path\":\"b\""));
            assert!(lines[2].contains("\"path\":\"c\""));
            assert_eq!(lines[0].contains("archived"), durable);
            assert_eq!(lines[0].contains("\"action\":\"tagged\""), !durable);
        }
    }
}
