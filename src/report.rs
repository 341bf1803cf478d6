//! The reporter: what a run says, as one closed set of [`Message`]s that one [`Printer`]
//! renders for people or as JSON Lines; the [`Summary`] counts them and decides the exit code.
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
    /// Lines for people, said before the summary (not in JSON, not with `-q`).
    pub notes: Vec<String>,
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
        self.findings.damaged(what.clone(), None, None);
        self.damage.push(what);
    }

    /// Counts one report.
    pub fn add(&mut self, r: &FileReport) {
        self.counts[r.status as usize] += 1;
        for a in [r.action, r.copy].into_iter().flatten() {
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
                self.findings
                    .damaged(escape(&path), Some(found), r.inode.or(r.linked));
            }
            Status::Error | Status::Changed | Status::Conflict | Status::Missing => {
                let why = r.error.as_ref().map_or_else(
                    || r.status.name().to_string(),
                    |e| format!("{}: {e}", r.status.name()),
                );
                let what = format!("{} ({why})", escape(&crate::state::absolute(&r.path)));
                if r.status == Status::Missing {
                    self.findings.missing(what);
                } else {
                    self.findings.unverified(what);
                }
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
        let unverified = if verb.verifies_tags() {
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

/// What a run says, one closed set: each file's report, damage known from earlier runs,
/// files gone, and the summary it ends with. The [`Printer`] alone renders them, for people
/// or as JSON Lines whose `type` is the variant's name; the [`Summary`] alone counts them.
/// (The owner's message, `notify`, is made of the summary's findings.)
#[derive(Clone, Copy)]
pub enum Message<'a> {
    /// One file's report, with or without the copy it says was made (a held report whose
    /// work did not become durable goes without).
    File {
        /// The report.
        report: &'a FileReport,
        /// Whether its copy is said.
        copied: bool,
    },
    /// Damage an earlier run found that is still there and was not read by this run.
    Damage(&'a crate::state::Damaged),
    /// A file gone from its tree since it was last seen.
    Removed(&'a crate::scrub::Gone),
    /// The run's totals and its exit code: the last thing said.
    Summary {
        /// The totals.
        summary: &'a Summary,
        /// The verb that ran.
        verb: Verb,
        /// Its exit code.
        exit: Exit,
    },
}

impl<'a> Message<'a> {
    /// One file's report as it is.
    pub fn file(report: &'a FileReport) -> Self {
        Message::File {
            report,
            copied: true,
        }
    }
}

impl Serialize for Message<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        /// The JSON line of each message: `type` first, then its fields.
        #[derive(Serialize)]
        #[serde(tag = "type", rename_all = "lowercase")]
        enum Line<'a> {
            File(JsonFile<'a>),
            Damage(JsonDamage<'a>),
            Removed(JsonRemoved),
            Summary(JsonSummary),
        }
        let time = |t: Option<i64>| t.map(crate::text::time_ms);
        match *self {
            Message::File { report, copied } => Line::File(JsonFile::new(report, copied)),
            Message::Damage(d) => Line::Damage(JsonDamage {
                path: escape(&d.path),
                status: d.status.as_deref(),
                found: time(d.found),
            }),
            Message::Removed(g) => Line::Removed(JsonRemoved {
                path: escape(&g.path),
                verified: time(g.verified),
                damaged: time(g.damaged),
                gone: time(g.gone),
            }),
            Message::Summary {
                summary,
                verb,
                exit,
            } => Line::Summary(JsonSummary::new(verb, summary, exit)),
        }
        .serialize(s)
    }
}

/// Renders messages: for people (file lines on standard output, warnings and the summary on
/// standard error), or as one JSON line each on standard output.
#[derive(Clone, Copy, Debug)]
pub struct Printer {
    verb: Verb,
    json: bool,
    verbosity: Verbosity,
}

impl Printer {
    /// Renders `m`: lines to `out`, what people read apart to `err`.
    pub fn print(
        &self,
        m: Message<'_>,
        out: &mut impl Write,
        err: &mut impl Write,
    ) -> io::Result<()> {
        if self.json {
            serde_json::to_writer(&mut *out, &m)?;
            writeln!(out)?;
            // What a person must hear reaches stderr under JSON too (a script's log).
            if let Message::Summary { summary, .. } = m {
                self.alarms(summary, err)?;
            }
            return Ok(());
        }
        match m {
            Message::File { report, .. } => {
                self.warn(report, err)?;
                self.render(report, out)
            }
            Message::Damage(d) => writeln!(
                out,
                "{:<8} {}: found damaged at {}, not yet repaired (not read by this run)",
                d.status.as_deref().unwrap_or("corrupt"),
                escape(&d.path),
                d.found.map_or("?".into(), crate::text::time_ms)
            ),
            // A deletion is no damage: not said with -q.
            Message::Removed(_) if self.verbosity == Verbosity::Quiet => Ok(()),
            Message::Removed(g) => {
                let last = g.verified.map_or("never verified".into(), |v| {
                    format!("last verified {}", crate::text::time_ms(v))
                });
                let damaged = if g.damaged.is_some() {
                    "; it was damaged"
                } else {
                    ""
                };
                writeln!(
                    out,
                    "removed  {}: gone since it was last seen ({last}{damaged})",
                    escape(&g.path)
                )
            }
            Message::Summary { summary, .. } => self.summary(summary, err),
        }
    }

    /// Whether rendering `r` writes anything (so a progress bar must step aside).
    pub fn prints(&self, r: &FileReport) -> bool {
        self.json || !r.malformed.is_empty() || self.shows(r)
    }

    /// The summary for people, with what to do about what it counts.
    fn summary(&self, s: &Summary, err: &mut impl Write) -> io::Result<()> {
        let verb = self.verb;
        if self.verbosity > Verbosity::Quiet {
            for note in &s.notes {
                writeln!(err, "{note}")?;
            }
            writeln!(err, "{}", human_summary(verb, s))?;
            let kept = s.action(Action::Kept);
            if kept > 0 {
                writeln!(
                    err,
                    "intact: {kept} damaged file(s) kept their old tag as evidence: restore them from a \
                     backup, or run `intact update --accept-corrupt` on them if the change was intended"
                )?;
            }
            let earlier = s.outstanding;
            if earlier > 0 {
                writeln!(
                    err,
                    "intact: {earlier} file(s) found damaged by earlier runs are still damaged \
                     (listed above): `intact repair PATH --from BACKUP` restores them, \
                     `intact update --accept-corrupt FILE` accepts them as they are"
                )?;
            }
        }
        for damage in &s.damage {
            writeln!(err, "intact: damaged: {damage}")?;
        }
        self.alarms(s, err)
    }

    /// What the run could not do and whether it was cut short: said on stderr whatever the
    /// output (even under -q and --json, where damage's exit code 1 would hide it).
    fn alarms(&self, s: &Summary, err: &mut impl Write) -> io::Result<()> {
        for failure in &s.failures {
            writeln!(err, "intact: error: {failure}")?;
        }
        if s.interrupted {
            writeln!(
                err,
                "intact: interrupted: the {} stopped before it finished; what it did not \
                 reach was not verified",
                self.verb.name()
            )?;
        }
        Ok(())
    }

    /// Warnings about a report (malformed tags), to stderr for people; in JSON they are
    /// part of the file's object.
    fn warn(&self, r: &FileReport, err: &mut impl Write) -> io::Result<()> {
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

/// Counts what a run says in its summary and prints it: the run's one way out.
pub struct Reporter<W: Write, E: Write> {
    printer: Printer,
    out: W,
    err: E,
    /// The running totals.
    pub summary: Summary,
    /// Reports held until their work is settled: rendered, and counted both ways.
    held: Spool,
    /// Files whose file system keeps no extended attributes: the first is said, the others
    /// counted (a FAT stick of 10,000 files is one cause, not 10,000 lines).
    unsupported: u64,
}

impl<W: Write, E: Write> Reporter<W, E> {
    /// A reporter writing per-file lines to `out` and warnings and the summary to `err`.
    pub fn new(verb: Verb, json: bool, verbosity: Verbosity, out: W, err: E) -> Self {
        Reporter {
            printer: Printer {
                verb,
                json,
                verbosity,
            },
            out,
            err,
            summary: Summary::default(),
            held: Spool::default(),
            unsupported: 0,
        }
    }

    /// Counts and renders one file.
    pub fn file(&mut self, r: &FileReport) -> io::Result<()> {
        self.summary.add(r);
        // `--json` lists each.
        if !self.printer.json
            && r.error
                .as_ref()
                .is_some_and(|e| e.kind() == "no-xattr-support")
        {
            self.unsupported += 1;
            if self.unsupported > 1 {
                return Ok(());
            }
        }
        self.printer
            .print(Message::file(r), &mut self.out, &mut self.err)
    }

    /// Counts and renders a file whose copy stands only once its work is durable, and goes
    /// without it otherwise. Let out, in order, by [`Reporter::settle`].
    pub fn hold(&mut self, r: &FileReport) -> io::Result<()> {
        let mut lines = [Vec::new(), Vec::new()];
        self.printer
            .print(Message::file(r), &mut lines[0], &mut self.err)?;
        let without_copy = Message::File {
            report: r,
            copied: false,
        };
        // Its warnings were said once, above.
        self.printer
            .print(without_copy, &mut lines[1], &mut io::sink())?;
        self.held.counts[0].add(r);
        let mut without = Summary::default();
        without.add(r);
        if let Some(a) = r.copy {
            without.actions[a as usize] -= 1;
        }
        self.held.counts[1].merge(&without);
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

    /// Damage an earlier run found that is still there and was not read by this one: said,
    /// and it counts as damage.
    pub fn outstanding(&mut self, d: &crate::state::Damaged) -> io::Result<()> {
        self.summary.outstanding += 1;
        let path = crate::state::absolute(&d.path);
        let inode = crate::state::inode_of(&path);
        self.summary.findings.damaged(escape(&path), d.found, inode);
        self.printer
            .print(Message::Damage(d), &mut self.out, &mut self.err)
    }

    /// A file that is gone from its tree since it was last seen.
    pub fn removed(&mut self, g: &crate::scrub::Gone) -> io::Result<()> {
        self.summary.removed += 1;
        self.printer
            .print(Message::Removed(g), &mut self.out, &mut self.err)
    }

    /// A line for people, printed before the summary (not with `--json` or `-q`).
    pub fn note(&mut self, line: String) {
        self.summary.notes.push(line);
    }

    /// Whether rendering `r` writes anything (so a progress bar must step aside).
    pub fn prints(&self, r: &FileReport) -> bool {
        self.printer.prints(r)
    }

    /// Says the summary (on `err` for people, on `out` as the last JSON line) and returns
    /// the exit code, which the summary states.
    pub fn finish(&mut self) -> io::Result<Exit> {
        // Held reports whose work was never settled did not become durable.
        if !self.held.is_empty() {
            self.settle(false)?;
        }
        let exit = self.summary.exit(self.printer.verb);
        if self.unsupported > 1 {
            writeln!(
                self.out,
                "error    ... and {} more files on file systems without extended attributes, \
                 not listed one by one (--json lists each)",
                crate::text::group(self.unsupported - 1)
            )?;
        }
        // The lines come before the summary where both reach one terminal.
        self.out.flush()?;
        let summary = Message::Summary {
            summary: &self.summary,
            verb: self.printer.verb,
            exit,
        };
        self.printer.print(summary, &mut self.out, &mut self.err)?;
        self.out.flush()?;
        Ok(exit)
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
    path: String,
    status: Status,
    #[serde(skip_serializing_if = "Option::is_none")]
    action: Option<Action>,
    #[serde(skip_serializing_if = "Option::is_none")]
    copy: Option<Action>,
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

impl<'a> JsonFile<'a> {
    fn new(r: &'a FileReport, copied: bool) -> Self {
        JsonFile {
            path: escape(&r.path),
            status: r.status,
            action: r.action,
            copy: r.copy.filter(|_| copied),
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
    let said = Message::Summary {
        summary: &summary,
        verb,
        exit,
    };
    serde_json::to_string(&said).expect("a summary serializes")
}

/// Damage known from an earlier run (times in RFC 3339).
#[derive(Serialize)]
struct JsonDamage<'a> {
    path: String,
    status: Option<&'a str>,
    found: Option<String>,
}

/// A file gone (times in RFC 3339).
#[derive(Serialize)]
struct JsonRemoved {
    path: String,
    verified: Option<String>,
    damaged: Option<String>,
    gone: Option<String>,
}

#[derive(Serialize)]
struct JsonSummary {
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
    fn what_a_person_must_hear_reaches_stderr_under_json_too() {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let mut r = Reporter::new(Verb::Scrub, true, Verbosity::Quiet, &mut out, &mut err);
        r.summary.fail("the owner could not be told".into());
        r.summary.interrupted = true;
        r.finish().unwrap();
        drop(r);
        let (out, err) = (
            String::from_utf8(out).unwrap(),
            String::from_utf8(err).unwrap(),
        );
        assert!(out.lines().all(|l| l.starts_with("{\"type\":")), "{out}");
        assert!(out.contains("the owner could not be told"), "{out}");
        let said: Vec<&str> = err.lines().collect();
        assert_eq!(
            said[0], "intact: error: the owner could not be told",
            "{err}"
        );
        assert!(
            said[1].starts_with("intact: interrupted: the scrub stopped"),
            "{err}"
        );
    }

    #[test]
    fn failures_beyond_files_are_trouble() {
        let mut s = Summary::default();
        s.failures.push("the archive could not be written".into());
        assert_eq!(s.exit(Verb::Archive), Exit::Trouble);
    }

    #[test]
    fn every_message_is_a_json_line_of_its_type_or_lines_for_people() {
        let damaged = crate::state::Damaged {
            path: "d/x".into(),
            status: Some("mismatch".into()),
            found: Some(1_500),
        };
        let gone = crate::scrub::Gone {
            path: "g/y".into(),
            verified: Some(3_000),
            damaged: None,
            gone: Some(4_000),
        };
        let run = |json: bool, verbosity: Verbosity| {
            let (mut out, mut err) = (Vec::new(), Vec::new());
            let mut r = Reporter::new(Verb::Scrub, json, verbosity, &mut out, &mut err);
            r.file(&FileReport::new("f".into(), Status::Corrupt))
                .unwrap();
            r.outstanding(&damaged).unwrap();
            r.removed(&gone).unwrap();
            r.note("a note".into());
            assert_eq!(r.finish().unwrap(), Exit::Damage);
            drop(r);
            let text = |b: Vec<u8>| String::from_utf8(b).unwrap();
            (text(out), text(err))
        };

        let (out, err) = run(true, Verbosity::Normal);
        assert_eq!(err, "");
        let lines: Vec<serde_json::Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let types: Vec<&str> = lines.iter().map(|v| v["type"].as_str().unwrap()).collect();
        assert_eq!(types, ["file", "damage", "removed", "summary"], "{out}");
        assert_eq!(lines[0]["status"], "corrupt");
        assert_eq!(lines[1]["path"], "d/x");
        assert_eq!(lines[1]["status"], "mismatch");
        assert_eq!(lines[1]["found"], "1970-01-01T00:00:01Z");
        assert_eq!(lines[2]["path"], "g/y");
        assert_eq!(lines[2]["verified"], "1970-01-01T00:00:03Z");
        assert_eq!(lines[2]["damaged"], serde_json::Value::Null);
        assert_eq!(lines[2]["gone"], "1970-01-01T00:00:04Z");
        assert_eq!(lines[3]["verb"], "scrub");
        assert_eq!(lines[3]["damaged_outstanding"], 1);
        assert_eq!(lines[3]["removed"], 1);
        assert_eq!(lines[3]["exit_code"], 1);
        assert!(out.lines().all(|l| l.starts_with("{\"type\":")), "{out}");

        let (out, err) = run(false, Verbosity::Normal);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 3, "{out}");
        assert_eq!(lines[0], "corrupt  f");
        assert!(lines[1].starts_with("mismatch d/x: found damaged at 1970-01-01T00:00:01Z"));
        assert!(lines[2].starts_with("removed  g/y: gone since it was last seen (last verified"));
        let said: Vec<&str> = err.lines().collect();
        assert_eq!(said[0], "a note");
        assert!(said[1].starts_with("scrub: 1 file,"), "{err}");
        assert!(
            err.contains("1 file(s) found damaged by earlier runs"),
            "{err}"
        );

        // Quiet: the damage, not the deletion, and no summary.
        let (out, err) = run(false, Verbosity::Quiet);
        assert_eq!(out.lines().count(), 2, "{out}");
        assert!(!out.contains("removed"));
        assert_eq!(err, "");
    }

    #[test]
    fn held_reports_are_let_out_in_order_with_or_without_their_action() {
        for durable in [true, false] {
            let mut out = Vec::new();
            let mut r = Reporter::new(Verb::Archive, true, Verbosity::Normal, &mut out, io::sink());
            let mut first = FileReport::new("a".into(), Status::Ok);
            first.action = Some(Action::Tagged);
            first.copy = Some(Action::Archived);
            r.hold(&first).unwrap();
            // Past the memory bound, so the spool goes through its file.
            let mut big = FileReport::new("b".into(), Status::Ok);
            big.detail = Some("x".repeat(Spool::MEMORY));
            big.copy = Some(Action::Archived);
            r.hold(&big).unwrap();
            r.settle(durable).unwrap();
            r.file(&FileReport::new("c".into(), Status::New)).unwrap();
            r.finish().unwrap();
            assert_eq!(
                r.summary.action(Action::Archived),
                if durable { 2 } else { 0 }
            );
            assert_eq!(r.summary.action(Action::Tagged), 1);
            drop(r);
            let text = String::from_utf8(out).unwrap();
            let lines: Vec<&str> = text.lines().collect();
            assert_eq!(lines.len(), 4, "{text:.300}");
            assert!(lines[0].contains("\"path\":\"a\""));
            assert!(lines[1].contains("\"path\":\"b\""));
            assert!(lines[2].contains("\"path\":\"c\""));
            assert_eq!(lines[0].contains("\"copy\":\"archived\""), durable);
            assert!(lines[0].contains("\"action\":\"tagged\""));
        }
    }
}
