//! `status`: how well verified and protected the trees are, from tags and the state
//! database alone: what needs attention first (damage, files gone, a history lost with a
//! damaged database), then coverage; with `-v`, when each file was last proven good.

use std::fmt::Write as _;
use std::io::{IsTerminal, Write};
use std::time::Duration;

use anyhow::Context;

use crate::cli::StatusArgs;
use crate::cli::settings::Settings;
use intact::metrics::Metrics;
use intact::report::{Exit, Summary, Verbosity};
use intact::scrub::{FileState, Gone, Overview};
use intact::state::{self, Pace, State};
use intact::text::{bytes, escape, group, percent, time_ms};
use intact::verb::Verb;

pub fn run(a: StatusArgs) -> anyhow::Result<Exit> {
    let mut s = Settings::new(Verb::Status, a.paths.paths, &a.common)?;
    s.record(&a.state);
    s.metrics(&a.metrics)?;
    s.notify(&a.notify)?;
    let (plan, found) = find(&mut s)?;
    let mut out = std::io::stdout().lock();
    if s.json {
        if s.verbosity == Verbosity::Verbose {
            plan.files(|f| {
                let line = serde_json::to_string(&FileLine::of(&f)).expect("plain values");
                let _ = writeln!(out, "{line}");
            })?;
        }
        serde_json::to_writer(&mut out, &Document::new(&plan, &found))?;
        writeln!(out)?;
    } else {
        // A PATH that is not there has no overview: its error alone (a page of zeros
        // before it said nothing and buried the error).
        let o = &found.overview;
        let nothing = o.tagged.files + o.untagged.files == 0
            && o.damage.is_empty()
            && found.gone.is_empty()
            && found.vanished == 0;
        // What is wrong first: a vanished tree, a database that cannot be used.
        for e in &found.errors {
            eprintln!("intact: error: {e}");
        }
        if !nothing || found.errors.is_empty() {
            out.write_all(text(&s, a.damage_lines, &plan, &found).as_bytes())?;
        }
        if s.verbosity == Verbosity::Verbose {
            plan.files(|f| {
                let _ = writeln!(out, "{}", file_line(&f));
            })?;
        }
    }
    out.flush()?;
    let mut exit = found.exit;
    let mut notify_failed = None;
    if let Some(setup) = &s.notify {
        let mut state = s
            .state
            .as_deref()
            .and_then(|db| State::open(db).ok())
            .map(|(st, _)| st);
        let run = super::notify::Run {
            verb: "status",
            roots: &s.roots,
            findings: &found.findings,
            interrupted: false,
            exit,
            partial: false,
        };
        let failed = super::notify::tell(setup, &run, state.as_mut());
        notify_failed = Some(!failed.is_empty());
        for f in failed {
            eprintln!("intact: error: {f}");
            exit = exit.merge(Exit::Trouble);
        }
    }
    if let Some(path) = &s.metrics {
        let mut m = metrics(&s, &found, exit);
        if let Some(failed) = notify_failed {
            m.gauge(
                "notify_failed",
                "1 if telling the owner (Apprise, sendmail, the heartbeat) failed in the last run.",
                &[("verb", "status")],
                f64::from(u8::from(failed)),
            );
        }
        m.write(path)
            .with_context(|| format!("writing the metrics {}", escape(path)))?;
    }
    Ok(exit)
}

/// Files not proven good for this long are overdue when the cycle is not known (the rule
/// `IntactVerificationStale`); else 1.5 cycles, and never less than a day.
const STALE_MS: i64 = 45 * DAY_MS;
const DAY_MS: i64 = 86_400_000;

/// What status finds in the tags and the state database.
struct Found {
    /// What is wrong, for the owner's message.
    findings: intact::notify::Findings,
    /// Trees that vanished or lost many files at once.
    vanished: u64,
    overview: Overview,
    gone: Vec<Gone>,
    /// When the history was lost with a damaged database, and the files not checked since.
    lost: Option<(i64, u64)>,
    /// Why damage is not known, if it is not.
    unknown: Option<String>,
    cycle: Option<Cycle>,
    /// Files not proven good since then are overdue (Unix milliseconds).
    deadline: i64,
    /// When every file will have been proven good again.
    proven_by: ProvenBy,
    /// The last scrub over these trees, as the database recorded it.
    last_scrub: Option<state::LastRun>,
    /// Damaged copies repair kept in the trees.
    kept: Kept,
    /// The state database read.
    db: Option<std::path::PathBuf>,
    /// Live `intact watch` services over these trees.
    watched: Vec<intact::watch::Watched>,
    errors: Vec<String>,
    exit: Exit,
}

/// Plans the trees (tags and metadata only) against the state database, and finds what
/// needs attention and how well the trees are covered.
fn find(s: &mut Settings) -> anyhow::Result<(intact::scrub::Plan, Found)> {
    let mut failures = Summary::default();
    for failure in std::mem::take(&mut s.failures) {
        failures.fail(failure);
    }
    if let Some(problem) = s
        .state
        .as_deref()
        .and_then(|db| intact::state::journal::problem(&intact::state::journal::path_of(db)))
    {
        failures.fail(problem);
    }
    let mut state = s
        .state
        .as_deref()
        .and_then(|db| super::open_state(db, &mut failures));
    // The tree's records are not shown as another folder's.
    if let Some(st) = state.as_mut() {
        super::same_roots(st, s, &mut failures);
    }
    let db = state
        .as_ref()
        .and_then(|st| st.path().map(|p| p.to_path_buf()));
    let mut kept = Kept::default();
    let mut plan = intact::scrub::plan(
        &s.config,
        &s.roots,
        true,
        &super::STOP,
        db.as_deref(),
        |r| {
            if r.skip == Some(intact::fs::walk::SkipReason::KeptDamaged) {
                kept.add(&r.path, r.size.unwrap_or(0));
            }
            if r.status == intact::core::classify::Status::Error {
                failures.fail(format!(
                    "{}: {}",
                    escape(&r.path),
                    r.error.as_ref().map_or(String::new(), |e| e.to_string())
                ));
            }
        },
    )
    .context("reading the trees")?;
    super::on_state(&mut state, &mut failures, |db| plan.attach(db))
        .map_err(|e| anyhow::anyhow!("reading the state database: {}", state::why(&e)))?;
    let db = state
        .as_ref()
        .and_then(|st| st.path().map(|p| p.to_path_buf()));
    let now = state::now();
    let pace = state.as_ref().and_then(|st| st.pace(&s.roots));
    let cycle = Cycle::estimate(plan.tagged.1, pace);
    // A cycle in days of the calendar (runs, one every so often), not of running time.
    let calendar = cycle
        .as_ref()
        .and_then(|c| Some(c.runs.unwrap_or(1) as f64 * c.pace.every?));
    let deadline = now - calendar.map_or(STALE_MS, |secs| ((secs * 1500.0) as i64).max(DAY_MS));
    // First: a file moved is known with its history from here on.
    let (gone, alarms) = plan.gone(
        &s.roots,
        now,
        false,
        Some(intact::scrub::MASS_REMOVAL_PERCENT),
    )?;
    let mut overview = plan.overview(now, deadline)?;
    // Damage the walk could not meet: on a file system not mounted now, or excluded.
    if let Some(st) = &mut state {
        let walked: std::collections::HashSet<std::path::PathBuf> = overview
            .damage
            .iter()
            .map(|d| state::absolute(&d.path))
            .collect();
        let unseen: Vec<_> = st
            .outstanding(&s.roots)
            .into_iter()
            .filter(|d| !walked.contains(&d.path))
            .collect();
        overview.damage.extend(unseen);
    }
    // Where the trees have stores, what they hold now, not what was once written.
    overview.parity = plan.parity(&s.roots)?;
    if let Some(p) = &overview.parity {
        overview.protected = p.current;
    }
    for alarm in &alarms {
        failures.vanished(alarm.describe(), alarm.removed);
    }
    // A tree with nothing to verify is not a tree in good health (an unmounted disk, a copy
    // that lost its tags).
    if alarms.is_empty() && plan.complete {
        for (root, &(files, tagged)) in s.roots.iter().zip(&plan.per_root) {
            if let Some(why) = super::nothing_verified(root, files, tagged) {
                failures.fail(why);
            }
        }
    }
    let mut lost = None;
    let mut unknown = None;
    if s.state.is_some() && state.is_none() {
        unknown = Some("unknown: the state database that remembers it cannot be read".into());
    }
    if let Some(l) = state.as_ref().and_then(|st| st.history_lost()) {
        let unchecked = plan.unchecked_since(l.at)?;
        if unchecked > 0 {
            failures.fail(super::lost_note(&l, unchecked));
            lost = Some((l.at, unchecked));
            unknown = Some(format!(
                "unknown for {} {}: the state database was rebuilt at {} and they have not \
                 been checked since (`intact check PATH`)",
                group(unchecked),
                if unchecked == 1 { "file" } else { "files" },
                time_ms(l.at)
            ));
        }
    }
    let last_scrub = state.as_ref().and_then(|st| st.last_run("scrub", &s.roots));
    let proven_by = ProvenBy::estimate(
        overview
            .tagged
            .bytes
            .saturating_sub(overview.cycle_verified.bytes),
        pace.as_ref(),
        // The pace is of scrubs where there are any, else of checks.
        match pace {
            Some(p) if p.scrubs => last_scrub.map(|r| r.started),
            _ => state
                .as_ref()
                .and_then(|st| st.last_run("check", &s.roots))
                .map(|r| r.started),
        },
        now,
    );
    let mut exit = failures.exit(Verb::Status);
    if !overview.damage.is_empty() {
        exit = exit.merge(Exit::Damage);
    }
    let mut findings = std::mem::take(&mut failures.findings);
    for d in &overview.damage {
        // Absolute, as every run says it: a run on a relative PATH tells the same items.
        let path = state::absolute(&d.path);
        findings.damaged(escape(&path), d.found, state::inode_of(&path));
    }
    let vanished = failures.vanished;
    let errors = failures.failures;
    // A watch over a tree that holds these (a killed one holds no lock: not watching).
    let watched = s.state.as_deref().map_or(Vec::new(), |db| {
        let roots: Vec<_> = s
            .roots
            .iter()
            .map(|r| std::fs::canonicalize(r).unwrap_or(state::absolute(r)))
            .collect();
        intact::watch::watched(db)
            .into_iter()
            .filter(|w| {
                roots
                    .iter()
                    .all(|r| w.roots.iter().any(|wr| r.starts_with(wr)))
            })
            .collect()
    });
    let found = Found {
        findings,
        vanished,
        overview,
        gone,
        lost,
        unknown,
        cycle,
        deadline,
        proven_by,
        last_scrub,
        kept,
        db,
        watched,
        errors,
        exit,
    };
    Ok((plan, found))
}

/// Status for machines: one JSON object.
#[derive(serde::Serialize)]
struct Document<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    overview: &'a Overview,
    removed: &'a [Gone],
    cycle: CycleJson,
    /// The last scrub over these trees (no `ended` for one that did not finish).
    last_scrub: Option<LastScrubJson>,
    /// Damaged copies repair kept in the trees (the first paths of them).
    damaged_copies: &'a Kept,
    history_lost: Option<LostJson>,
    never_verified: u64,
    oldest_verification: Option<String>,
    /// The state database, escaped as every path is.
    state: Option<String>,
    /// Since when an `intact watch` tags what is written under the trees, if one does.
    watched_since: Option<String>,
    errors: &'a [String],
    exit_code: i32,
}

#[derive(serde::Serialize)]
struct CycleJson {
    started: Option<String>,
    files_checked: u64,
    bytes_checked: u64,
    seconds_for_a_cycle: Option<f64>,
    runs_for_a_cycle: Option<u64>,
    /// When every tagged file will have been proven good again (this cycle done: its start).
    proven_good_again_by: Option<String>,
    /// Files not proven good since then count as overdue.
    overdue_before: String,
}

#[derive(serde::Serialize)]
struct LastScrubJson {
    started: String,
    ended: Option<String>,
    files: Option<u64>,
    bytes: Option<u64>,
    seconds: Option<f64>,
    exit_code: Option<i32>,
}

#[derive(serde::Serialize)]
struct LostJson {
    at: String,
    files_not_checked_since: u64,
}

impl<'a> Document<'a> {
    fn new(plan: &intact::scrub::Plan, f: &'a Found) -> Self {
        let o = &f.overview;
        Document {
            kind: "status",
            overview: o,
            removed: &f.gone,
            cycle: CycleJson {
                started: (plan.cycle_started > 0).then(|| time_ms(plan.cycle_started)),
                files_checked: o.cycle_verified.files,
                bytes_checked: o.cycle_verified.bytes,
                seconds_for_a_cycle: f.cycle.as_ref().and_then(|c| c.seconds),
                runs_for_a_cycle: f.cycle.as_ref().and_then(|c| c.runs),
                proven_good_again_by: match f.proven_by {
                    ProvenBy::Done => Some(time_ms(plan.cycle_started)),
                    ProvenBy::At { at, .. } => Some(time_ms(at)),
                    ProvenBy::Unknown => None,
                },
                overdue_before: time_ms(f.deadline),
            },
            damaged_copies: &f.kept,
            last_scrub: f.last_scrub.map(|r| LastScrubJson {
                started: time_ms(r.started),
                ended: r.ended.map(time_ms),
                files: r.files,
                bytes: r.bytes,
                seconds: r.seconds,
                exit_code: r.exit_code,
            }),
            history_lost: f.lost.map(|(at, unchecked)| LostJson {
                at: time_ms(at),
                files_not_checked_since: unchecked,
            }),
            never_verified: o.ages[0].files,
            oldest_verification: o.oldest.map(time_ms),
            state: f.db.as_deref().map(escape),
            watched_since: f.watched.first().map(|w| time_ms(w.since)),
            errors: &f.errors,
            exit_code: f.exit as i32,
        }
    }
}

/// Status for people, in the order of the owner's questions: is anything wrong, when did
/// the last scrub run and how did it end, when will every file have been proven good again,
/// what is protected; then how the trees are covered. `-q`: only what needs action.
fn text(s: &Settings, damage_lines: usize, plan: &intact::scrub::Plan, f: &Found) -> String {
    let o = &f.overview;
    let wrong = attention(
        o,
        &f.findings,
        f.unknown.as_deref(),
        f.deadline,
        damage_lines,
    ) + &f.kept.text(damage_lines);
    if s.verbosity == Verbosity::Quiet {
        // Files gone are routine (a mass deletion is an alarm of its own, said as an error).
        return wrong;
    }
    let mut text = String::new();
    if o.damage.is_empty() && f.unknown.is_none() {
        text.push_str("damage      none found that is not repaired\n");
    }
    text += &wrong;
    text += &removed(&f.gone, damage_lines);
    if f.db.is_some() {
        let _ = writeln!(text, "last scrub  {}", last_scrub(f.last_scrub.as_ref()));
    }
    if plan.cycle_started > 0 {
        let _ = writeln!(
            text,
            "cycle       since {}: {} of {} tagged files checked ({})",
            time_ms(plan.cycle_started),
            group(o.cycle_verified.files),
            group(o.tagged.files),
            bytes(o.cycle_verified.bytes)
        );
    }
    if f.db.is_some() {
        let damaged = !o.damage.is_empty();
        let _ = writeln!(text, "proven by   {}", proven_by(f.proven_by, damaged));
    }
    match &f.cycle {
        Some(c) => {
            let _ = writeln!(text, "full cycle  {}", c.line());
        }
        None => text.push_str("full cycle  unknown: no scrub or check recorded yet\n"),
    }
    text += &protection(o);
    text += &coverage(o, terminal_width());
    match f.watched.first() {
        Some(w) => {
            let _ = writeln!(
                text,
                "watched     since {}: new and edited files are tagged as they are written \
                 (intact watch, pid {}, {})",
                time_ms(w.since),
                w.pid,
                w.how
            );
        }
        None if f.db.is_some() => text.push_str(
            "watched     no: new files wait for the next `scrub --update` to be tagged\n",
        ),
        None => {}
    }
    if f.db.is_none() {
        text.push_str("(no state database: every file counts as never verified)\n");
    }
    text
}

/// When every tagged file will have been proven good again; with damage outstanding, checked
/// again (a damaged file is proven good only once repaired).
fn proven_by(by: ProvenBy, damaged: bool) -> String {
    let (done, again) = if damaged {
        (
            "checked in this cycle (the damaged ones are proven good once repaired)",
            "checked",
        )
    } else {
        ("proven good in this cycle", "proven good")
    };
    match by {
        ProvenBy::Done => format!("every tagged file was {done}"),
        ProvenBy::At { at, runs } => format!(
            "{}: every tagged file {again} again, {} more {} at the pace of the last ones",
            time_ms(at),
            group(runs),
            if runs == 1 { "scrub" } else { "scrubs" }
        ),
        ProvenBy::Unknown => {
            "unknown: the pace needs two scrubs or checks of these trees recorded".into()
        }
    }
}

/// When every tagged file will have been proven good again: the cycle's progress at the
/// pace of the last runs (bytes a run, one run every so often).
#[derive(Clone, Copy, Debug, PartialEq)]
enum ProvenBy {
    /// Every tagged file was verified since the cycle began.
    Done,
    /// After `runs` more runs, at `at` (Unix milliseconds).
    At { at: i64, runs: u64 },
    /// Fewer than two runs recorded: no pace.
    Unknown,
}

impl ProvenBy {
    /// `left`: tagged bytes not verified since the cycle began; `last`: when the last run
    /// began.
    fn estimate(left: u64, pace: Option<&Pace>, last: Option<i64>, now: i64) -> ProvenBy {
        if left == 0 {
            return ProvenBy::Done;
        }
        let Some((pace, every)) = pace.and_then(|p| Some((p, p.every?))) else {
            return ProvenBy::Unknown;
        };
        if pace.bytes_per_run <= 0.0 {
            return ProvenBy::Unknown;
        }
        let runs = (left as f64 / pace.bytes_per_run).ceil().max(1.0) as u64;
        let every = (every * 1000.0) as i64;
        // The next run comes one interval after the last; one that is late comes now.
        let next = last.map_or(now, |l| (l + every).max(now));
        ProvenBy::At {
            at: next + (runs as i64 - 1) * every,
            runs,
        }
    }
}

/// Damaged copies that repair kept in the trees (`NAME.damaged`, marked `user.intact.damaged`):
/// evidence the owner deletes once the repair is trusted, taking room meanwhile.
#[derive(Default, serde::Serialize)]
struct Kept {
    files: u64,
    bytes: u64,
    /// The first of them (`--json`: the first 1,000).
    #[serde(serialize_with = "paths_escaped")]
    paths: Vec<std::path::PathBuf>,
}

fn paths_escaped<S: serde::Serializer>(
    paths: &[std::path::PathBuf],
    s: S,
) -> Result<S::Ok, S::Error> {
    s.collect_seq(paths.iter().map(|p| escape(p)))
}

impl Kept {
    fn add(&mut self, path: &std::path::Path, size: u64) {
        self.files += 1;
        self.bytes += size;
        if self.paths.len() < intact::notify::NAMES_KEPT {
            self.paths.push(path.to_path_buf());
        }
    }

    /// What status says of them: nothing when there are none.
    fn text(&self, lines: usize) -> String {
        let mut t = String::new();
        if self.files == 0 {
            return t;
        }
        let _ = writeln!(
            t,
            "kept        {} damaged {} kept by repair ({}): delete {} once the repair is \
             trusted",
            group(self.files),
            if self.files == 1 { "copy" } else { "copies" },
            bytes(self.bytes),
            if self.files == 1 { "it" } else { "them" }
        );
        for p in self.paths.iter().take(lines) {
            let _ = writeln!(t, "  {}", escape(p));
        }
        if self.files as usize > lines {
            let _ = writeln!(
                t,
                "  ... and {} more (--json lists more)",
                group(self.files - lines as u64)
            );
        }
        t
    }
}

/// The last scrub in a line: when, how long, what it read, how it ended.
fn last_scrub(run: Option<&state::LastRun>) -> String {
    let Some(run) = run else {
        return "none recorded (`intact scrub PATH`, or the nightly unit, verifies the trees)"
            .into();
    };
    let Some(ended) = run.ended else {
        return format!(
            "{}: not finished (still running, or killed or stopped with the machine: then not \
             everything it was to verify was)",
            time_ms(run.started)
        );
    };
    let took = match (ended - run.started).max(0) / 1000 {
        0 => "under a second".to_string(),
        secs => humantime::format_duration(Duration::from_secs(secs as u64)).to_string(),
    };
    let result = match run.exit_code {
        Some(0) => "clean".to_string(),
        Some(1) => "damage found (exit 1)".to_string(),
        Some(3) => "errors (exit 3)".to_string(),
        Some(130) => "interrupted (exit 130)".to_string(),
        Some(c) => format!("exit {c}"),
        None => "result unknown".to_string(),
    };
    format!(
        "{}, {took}: {} files, {} read, {result}",
        time_ms(run.started),
        group(run.files.unwrap_or(0)),
        bytes(run.bytes.unwrap_or(0)),
    )
}

/// How long a full cycle takes: at the pace of recent scrubs (runs of their budget, one
/// every so often), or at the speed of recent checks.
#[derive(Debug)]
struct Cycle {
    /// Runs it takes, if scrubs make it.
    runs: Option<u64>,
    /// Seconds it takes, if that is known.
    seconds: Option<f64>,
    pace: Pace,
}

impl Cycle {
    fn estimate(tagged: u64, pace: Option<Pace>) -> Option<Cycle> {
        let pace = pace?;
        if !pace.scrubs || pace.bytes_per_run >= tagged as f64 {
            return Some(Cycle {
                runs: pace.scrubs.then_some(1),
                seconds: Some(tagged as f64 / pace.bytes_per_second),
                pace,
            });
        }
        let runs = (tagged as f64 / pace.bytes_per_run).ceil() as u64;
        Some(Cycle {
            runs: Some(runs),
            seconds: pace.every.map(|every| runs as f64 * every),
            pace,
        })
    }

    /// What status says of it.
    fn line(&self) -> String {
        let duration = |secs: f64| {
            humantime::format_duration(Duration::from_secs(secs.ceil() as u64)).to_string()
        };
        let speed = bytes(self.pace.bytes_per_second as u64);
        match (self.runs, self.seconds) {
            (Some(1) | None, Some(secs)) => format!(
                "about {} at {speed}/s ({})",
                duration(secs),
                if self.pace.scrubs {
                    "recent scrubs"
                } else {
                    "recent checks"
                }
            ),
            (Some(runs), Some(secs)) => format!(
                "about {runs} runs, {} at the pace of recent scrubs ({} a run, one every {})",
                duration(secs),
                bytes(self.pace.bytes_per_run as u64),
                duration(self.pace.every.unwrap_or(0.0))
            ),
            (Some(runs), None) => format!(
                "about {runs} runs like the last scrub ({} a run)",
                bytes(self.pace.bytes_per_run as u64)
            ),
            (None, None) => "unknown".into(),
        }
    }
}

/// The metrics of a status: what the trees hold, what needs attention, and the run itself.
fn metrics(s: &Settings, found: &Found, exit: Exit) -> Metrics {
    let (overview, gone, cycle) = (&found.overview, &found.gone, found.cycle.as_ref());
    let mut m = Metrics::of(&s.roots);
    let v = [("verb", "status")];
    let pairs = [
        (
            "files_tagged",
            "Tagged files under the roots.",
            overview.tagged.files,
        ),
        (
            "bytes_tagged",
            "Bytes in tagged files under the roots.",
            overview.tagged.bytes,
        ),
        (
            "files_untagged",
            "Untagged regular files under the roots.",
            overview.untagged.files,
        ),
        (
            "files_removed",
            "Files found gone from the tree since they were last seen (in the last 30 days).",
            gone.len() as u64,
        ),
        (
            "files_protected",
            "Tagged files with a parity set.",
            overview.protected.files,
        ),
        (
            "files_archived",
            "Tagged files with an archived copy.",
            overview.archived.files,
        ),
    ];
    for (name, help, value) in pairs {
        m.gauge(name, help, &v, value as f64);
    }
    // Damage that cannot be known is never said to be none: the count is left out, and an
    // alert fires on the unknown as on damage.
    if found.unknown.is_some() {
        m.gauge(
            "damage_unknown",
            "1 if the damage found earlier cannot be known (the state database cannot be read).",
            &v,
            1.0,
        );
    } else {
        m.gauge(
            "files_damaged",
            "Files found damaged (by this run or earlier ones) and not yet repaired or accepted.",
            &v,
            overview.damage.len() as f64,
        );
    }
    m.gauge(
        "tree_missing",
        "Trees that vanished (none of their recorded files there) or lost many files at once.",
        &v,
        found.vanished as f64,
    );
    let never = overview.ages[0].files + overview.untagged.files;
    super::verification_ages(&mut m, "status", never, overview.oldest);
    if let Some(secs) = cycle.and_then(|c| c.seconds) {
        m.gauge(
            "cycle_estimate_seconds",
            "How long verifying every tagged file takes at the pace of recent scrubs.",
            &v,
            secs,
        );
    }
    m.end("status", exit as i32, state::now());
    m
}

/// One line of `status -v`: when the file was last proven good, its last verdict, its
/// copies (`p` parity, `a` archived), its size and path.
fn file_line(f: &FileState) -> String {
    let verified = f.verified.map_or_else(|| "never".to_string(), time_ms);
    let status = match f.damaged {
        Some(_) => f.status.as_deref().unwrap_or("corrupt"),
        None => f.status.as_deref().unwrap_or("-"),
    };
    let copies = format!(
        "{}{}",
        if f.protected { 'p' } else { '-' },
        if f.archived { 'a' } else { '-' }
    );
    format!(
        "{verified:<20} {status:<8} {copies} {:>9} {}",
        bytes(f.size),
        escape(&f.path)
    )
}

/// One object of `status -v --json`: when a file was last proven good (times local, as
/// the overview's).
#[derive(serde::Serialize)]
struct FileLine<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    path: String,
    size: u64,
    verified: Option<String>,
    checked: Option<String>,
    status: Option<&'a str>,
    damaged: Option<String>,
    protected: bool,
    archived: bool,
}

impl<'a> FileLine<'a> {
    fn of(f: &'a FileState) -> Self {
        FileLine {
            kind: "file",
            path: escape(&f.path),
            size: f.size,
            verified: f.verified.map(time_ms),
            checked: f.checked.map(time_ms),
            status: f.status.as_deref(),
            damaged: f.damaged.map(time_ms),
            protected: f.protected,
            archived: f.archived,
        }
    }
}

/// The width to draw the chart for: the terminal's, `$COLUMNS`, or 80.
fn terminal_width() -> usize {
    let stdout = std::io::stdout();
    if stdout.is_terminal()
        && let Ok(size) = rustix::termios::tcgetwinsize(&stdout)
        && size.ws_col > 0
    {
        return size.ws_col as usize;
    }
    std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(80)
}

/// What needs action (all of `-q`): damage not dealt with, damage that cannot be known
/// (`unknown`: a state database unreadable, or rebuilt and the files not all checked since),
/// files not proven good since `deadline`. Nothing when there is none.
fn attention(
    o: &Overview,
    findings: &intact::notify::Findings,
    unknown: Option<&str>,
    deadline: i64,
    lines: usize,
) -> String {
    let mut t = String::new();
    if let Some(unknown) = unknown {
        let _ = writeln!(t, "damage      {unknown}");
    }
    if !o.damage.is_empty() {
        // Names of one file (hard links) count once, said apart, as the messages say them.
        let damaged = findings.damaged_count("file", "files");
        let _ = writeln!(
            t,
            "damage      {damaged} found damaged, not yet repaired or accepted:"
        );
        for d in o.damage.iter().take(lines) {
            let _ = writeln!(
                t,
                "  {:<8} {}  (found {})",
                d.status.as_deref().unwrap_or("damaged"),
                escape(&d.path),
                d.found.map_or("?".into(), time_ms)
            );
        }
        if o.damage.len() > lines {
            let _ = writeln!(
                t,
                "  ... and {} more (--json lists all)",
                o.damage.len() - lines
            );
        }
    }
    if o.overdue.files > 0 {
        let _ = writeln!(
            t,
            "overdue     {} {} ({}) not proven good since {}: the scrubs do not keep up \
             (a larger --max-time or --max-percent, or see why they fail)",
            group(o.overdue.files),
            if o.overdue.files == 1 {
                "file"
            } else {
                "files"
            },
            bytes(o.overdue.bytes),
            time_ms(deadline)
        );
    }
    t
}

/// Files gone since they were last seen: routine, shown but not in `-q`.
fn removed(gone: &[Gone], lines: usize) -> String {
    let mut t = String::new();
    if gone.is_empty() {
        return t;
    }
    let _ = writeln!(
        t,
        "removed     {} {} gone since last seen (remembered {} days):",
        group(gone.len() as u64),
        if gone.len() == 1 { "file" } else { "files" },
        intact::scrub::GONE_KEPT.as_secs() / 86_400
    );
    for g in gone.iter().take(lines) {
        let _ = writeln!(
            t,
            "  {}  (last verified {})",
            escape(&g.path),
            g.verified.map_or("never".into(), time_ms)
        );
    }
    if gone.len() > lines {
        let _ = writeln!(
            t,
            "  ... and {} more (--json lists all)",
            gone.len() - lines
        );
    }
    t
}

/// What is protected: parity and archived copies.
fn protection(o: &Overview) -> String {
    let mut t = format!(
        "copies      {} with parity ({}), {} archived ({})\n",
        group(o.protected.files),
        percent(o.protected.files, o.tagged.files),
        group(o.archived.files),
        percent(o.archived.files, o.tagged.files)
    );
    if let Some(p) = &o.parity {
        t += &format!(
            "parity      {} current, {} none",
            group(p.current.files),
            group(p.none.files)
        );
        if p.stale.files > 0 {
            t += &format!(", {} only moved aside (stale)", group(p.stale.files));
        }
        t += &format!(
            "; the store holds {} for {} protected ({})",
            bytes(p.store_bytes),
            bytes(p.current.bytes),
            percent(p.store_bytes, p.current.bytes)
        );
        if p.stale_bytes > 0 {
            t += &format!(", and {} moved aside", bytes(p.stale_bytes));
        }
        t.push('\n');
        if p.misnamed.files > 0 {
            t += &format!(
                "            {} in packs that name them by an old path (moved since): par2cmdline \
                 would see them missing until `intact protect` of the whole tree writes those \
                 packs again (intact repair finds them by tag)\n",
                plural_files(p.misnamed.files)
            );
        }
    }
    t
}

fn plural_files(n: u64) -> String {
    format!("{} {}", group(n), if n == 1 { "file" } else { "files" })
}

/// How the trees are covered: counts, and the age chart with bars scaled to `width`.
fn coverage(o: &Overview, width: usize) -> String {
    let mut t = format!(
        "files       {} tagged ({}), {} untagged ({})\n\
         verified    files by time since their last verification:\n",
        group(o.tagged.files),
        bytes(o.tagged.bytes),
        group(o.untagged.files),
        bytes(o.untagged.bytes)
    );
    let most = o.ages.iter().map(|a| a.files).max().unwrap_or(0).max(1);
    let bar_width = width.saturating_sub(36).clamp(10, 60);
    for a in &o.ages {
        let len = (a.files as f64 / most as f64 * bar_width as f64).round() as usize;
        let len = if a.files > 0 { len.max(1) } else { 0 };
        let _ = writeln!(
            t,
            "  {:<10} {:<w$} {:>9} {:>9}",
            a.label,
            "#".repeat(len),
            group(a.files),
            bytes(a.bytes),
            w = bar_width
        );
    }
    t
}

#[cfg(test)]
mod tests {
    use intact::scrub::{Age, Count, Overview};
    use intact::state::Pace;

    fn overview() -> Overview {
        let ages = [("never", 5), ("< 1 day", 20), ("< 1 week", 0), ("older", 1)]
            .into_iter()
            .map(|(label, files)| Age {
                label,
                files,
                bytes: files * 100,
            })
            .collect();
        Overview {
            tagged: Count {
                files: 26,
                bytes: 2600,
            },
            untagged: Count::default(),
            ages,
            damage: Vec::new(),
            protected: Count::default(),
            parity: None,
            archived: Count::default(),
            cycle_verified: Count::default(),
            overdue: Count::default(),
            oldest: None,
        }
    }

    /// The longest run of `#` in each line of the chart.
    fn bars(text: &str) -> Vec<usize> {
        text.lines()
            .filter(|l| l.starts_with("  "))
            .map(|l| l.matches('#').count())
            .collect()
    }

    #[test]
    fn the_age_chart_scales_to_the_terminal() {
        let narrow = bars(&super::coverage(&overview(), 60));
        let wide = bars(&super::coverage(&overview(), 120));
        // The largest bucket spans the room there is; the others keep their proportion; an
        // empty bucket has no bar, a small one at least a mark.
        assert_eq!(narrow, vec![6, 24, 0, 1]);
        assert_eq!(wide, vec![15, 60, 0, 3]);
    }

    /// A budgeted nightly scrub makes a cycle of many nights, not of its running time.
    #[test]
    fn a_cycle_of_budgeted_scrubs_takes_their_nights() {
        let nightly = Pace {
            scrubs: true,
            bytes_per_run: 50.0,
            bytes_per_second: 1000.0,
            every: Some(86_400.0),
        };
        let c = super::Cycle::estimate(1000, Some(nightly)).unwrap();
        assert_eq!(c.runs, Some(20));
        assert_eq!(c.seconds, Some(20.0 * 86_400.0));
        assert!(c.line().contains("20 runs, 20days"), "{}", c.line());
        let whole = super::Cycle::estimate(
            1000,
            Some(Pace {
                bytes_per_run: 1000.0,
                ..nightly
            }),
        )
        .unwrap();
        assert_eq!(whole.seconds, Some(1.0));
        assert!(whole.line().contains("(recent scrubs)"), "{}", whole.line());
        let checks = super::Cycle::estimate(
            1000,
            Some(Pace {
                scrubs: false,
                ..nightly
            }),
        )
        .unwrap();
        assert!(
            checks.line().contains("(recent checks)"),
            "{}",
            checks.line()
        );
    }

    /// Every file proven good again: after the runs the bytes left take at the recent pace,
    /// one interval after the last run (or now, when that is late); unknown without a pace.
    #[test]
    fn every_file_is_proven_good_again_at_the_pace_of_the_last_runs() {
        use super::ProvenBy;
        let day = 86_400_000;
        let pace = Pace {
            scrubs: true,
            bytes_per_run: 100.0,
            bytes_per_second: 1e6,
            every: Some(86_400.0),
        };
        let now = 10 * day;
        let last = now - day / 2;
        assert_eq!(
            ProvenBy::estimate(250, Some(&pace), Some(last), now),
            ProvenBy::At {
                at: last + 3 * day,
                runs: 3
            }
        );
        // Scrubs stopped a week ago: the next is not in the past.
        assert_eq!(
            ProvenBy::estimate(100, Some(&pace), Some(now - 7 * day), now),
            ProvenBy::At { at: now, runs: 1 }
        );
        assert_eq!(
            ProvenBy::estimate(0, Some(&pace), Some(last), now),
            ProvenBy::Done
        );
        let once = Pace {
            every: None,
            ..pace
        };
        assert_eq!(
            ProvenBy::estimate(250, Some(&once), Some(last), now),
            ProvenBy::Unknown
        );
        assert_eq!(
            ProvenBy::estimate(250, None, Some(last), now),
            ProvenBy::Unknown
        );
    }

    /// Files not proven good since the deadline need action: `-q` says them.
    #[test]
    fn overdue_files_need_action() {
        let mut o = overview();
        assert_eq!(super::attention(&o, &Default::default(), None, 0, 20), "");
        o.overdue = intact::scrub::Count {
            files: 2,
            bytes: 2000,
        };
        let t = super::attention(&o, &Default::default(), None, 0, 20);
        assert!(
            t.starts_with("overdue     2 files (2.00 kB) not proven good since 1970-01-01"),
            "{t}"
        );
    }
}
