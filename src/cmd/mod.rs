//! The verbs, one module per family, and the one loop they all run in: the engine's reports
//! go through the verb's sink to the reporter, with the progress bar, Ctrl-C (and SIGTERM,
//! SIGHUP), broken pipes and the exit code handled here, once.

pub mod archive;
pub mod export;
pub mod generate;
pub mod notify;
pub mod protect;
pub mod repair;
pub mod scan;
pub mod scrub;
pub mod status;
pub mod watch;

use std::io::{self, IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Once;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::cli::settings::Settings;
use intact::engine::{self, FileReport, Progress, Work};
use intact::fs::walk::{self, Entry};
use intact::metrics::Metrics;
use intact::report::{Exit, Reporter, Summary};
use intact::sink::{Out, Sink};
use intact::state::State;
use intact::text::{escape, group};

/// Set to wind a run down: by a signal, or by a failure of the work itself.
pub static STOP: AtomicBool = AtomicBool::new(false);
/// Set by a signal only: the run is reported as interrupted.
static SIGNALLED: AtomicBool = AtomicBool::new(false);

/// The reporter of a run: reports to stdout (or stderr), the summary to stderr.
type Speaker = Reporter<Box<dyn Write>, io::Stderr>;

/// Runs the engine over `s.roots` (a scrub: over its plan) with `sink` between it and the
/// reporter, recording in the state database and writing metrics if asked; the exit code is
/// the one the summary states.
pub fn drive(s: Settings, sink: &mut dyn Sink) -> anyhow::Result<Exit> {
    drive_for_findings(s, sink).map(|(exit, _)| exit)
}

/// As [`drive`], also giving what the run found wrong (`watch` tells the owner of its runs
/// together).
pub fn drive_for_findings(
    mut s: Settings,
    sink: &mut dyn Sink,
) -> anyhow::Result<(Exit, intact::notify::Findings)> {
    if s.background {
        for e in intact::fs::sys::lower_priority(intact::fs::sys::Gentle::Idle) {
            eprintln!("intact: warning: could not lower priority: {e}");
        }
    }
    on_signals(s.exit_at_once)?;
    let mut reporter = speaker(&s);
    let mut config = s.config.clone();
    // A wait for the state database's lock is part of the run's time.
    let start = Instant::now();
    let state = begin(&mut s, &mut config, &mut reporter);
    let mut ran = run(&s, &mut config, sink, &mut reporter, state);
    reporter.summary.elapsed = start.elapsed();
    reporter.summary.interrupted = SIGNALLED.load(Ordering::SeqCst);
    let output = conclude(&s, &mut ran, &mut reporter);
    // A closed pipe (`intact check | head`) met during the run ends it quietly, before the
    // end: it says so as a signal's interruption does (never 0, which would claim every file
    // verified).
    let closed = output
        .as_ref()
        .is_some_and(|e| e.kind() == io::ErrorKind::BrokenPipe);
    reporter.summary.interrupted |= closed;
    close(&s, &mut ran.state, &mut reporter);
    if let Some(output) = output.as_ref().filter(|_| !closed) {
        reporter.summary.fail(format!("writing output: {output}"));
    }
    tell_the_owner(&s, &mut ran, &mut reporter);
    record(&s, &mut ran, &mut reporter);
    let exit = match closed {
        true => reporter.summary.exit(s.verb),
        false => finish(&mut reporter, s.verb),
    };
    Ok((exit, std::mem::take(&mut reporter.summary.findings)))
}

/// What an error writing the output makes of a run that would exit `exit`: a closed pipe
/// (`intact ... | head`) ends it quietly with that code (see [`drive`]); anything else is an
/// error.
pub fn output_failed(e: io::Error, exit: Exit) -> anyhow::Result<Exit> {
    if e.kind() == io::ErrorKind::BrokenPipe {
        Ok(exit)
    } else {
        Err(anyhow::Error::new(e).context("writing output"))
    }
}

/// The reporter for `s`, told the failures known before the run.
fn speaker(s: &Settings) -> Speaker {
    let out: Box<dyn Write> = if s.reports_to_stderr {
        Box::new(io::stderr())
    } else {
        let stdout = io::stdout().lock();
        // Lines for a person appear as they are found; for a pipe, in blocks.
        if stdout.is_terminal() {
            Box::new(io::LineWriter::new(stdout))
        } else {
            Box::new(io::BufWriter::new(stdout))
        }
    };
    let mut reporter = Reporter::new(s.verb, s.json, s.verbosity, out, io::stderr());
    for failure in &s.failures {
        reporter.summary.fail(failure.clone());
    }
    reporter
}

/// Opens the state database (if any) and begins the run's record in it. Without one
/// (`--no-state`), the damage it and its journal remember is known all the same.
fn begin(s: &mut Settings, config: &mut engine::Config, reporter: &mut Speaker) -> Option<State> {
    // A journal that cannot be read hides the damage it recorded: said by every run.
    let db = s.state.as_deref().or(s.damage_from.as_deref());
    if let Some(problem) =
        db.and_then(|db| intact::state::journal::problem(&intact::state::journal::path_of(db)))
    {
        reporter.summary.fail(problem);
    }
    if let Some(db) = s
        .damage_from
        .as_deref()
        .filter(|_| config.work.reads_data())
    {
        let known = match intact::state::known_damage_at(db) {
            Some(known) => known,
            None => {
                reporter.note(format!(
                    "no state database at {}: damage found earlier cannot be known (but for \
                     what the machine's damage index holds), so a damaged file whose mtime \
                     moved since would pass for an edit",
                    escape(db)
                ));
                let mut known = engine::KnownDamage::new();
                intact::state::index::read_into(&mut known);
                known
            }
        };
        config.known_damage = Some(std::sync::Arc::new(known));
    }
    let mut state = s
        .state
        .as_deref()
        .and_then(|db| open_state(db, &mut reporter.summary))?;
    same_roots(&mut state, s, &mut reporter.summary);
    state.begin_run(s.verb.name(), &s.roots);
    // Every verb that judges data knows the damage found before: those that write
    // (update's rules: archive, protect) would otherwise re-tag a touched damaged file.
    if config.work.reads_data() {
        config.known_damage = Some(std::sync::Arc::new(state.known_damage()));
        config.written = Some(std::sync::Arc::new(state.written()));
    }
    Some(state)
}

/// Leaves out of the run, loudly, each PATH that leads to another folder than the tree the
/// database knows there: verified against the tree's history, its files would read as the
/// tree's deleted and new ones, or a swapped folder's as the tree's.
fn same_roots(state: &mut State, s: &mut Settings, summary: &mut Summary) {
    let accept = s.accept_moved_root;
    s.roots.retain(|root| match state.same_root(root, accept) {
        Ok(()) => true,
        Err(why) => {
            summary.fail(why.to_string());
            false
        }
    });
}

/// What a run left to conclude.
struct Ran {
    /// How the walk ended.
    walked: Result<(), ignore::Error>,
    /// The work itself could not be done.
    failure: Option<intact::sink::Failure>,
    /// Writing the reports failed (a closed pipe, a full disk).
    output: Option<io::Error>,
    state: Option<State>,
    /// A scrub's plan.
    plan: Option<intact::scrub::Plan>,
    /// Files and tagged files seen under each root.
    per_root: Vec<(u64, u64)>,
}

/// The engine's reports through `sink` to the reporter, with the progress bar.
fn run(
    s: &Settings,
    config: &mut engine::Config,
    sink: &mut dyn Sink,
    reporter: &mut Speaker,
    state: Option<State>,
) -> Ran {
    let progress = Progress::default();
    let show_bar = s.progress && s.config.work.reads_data() && io::stderr().is_terminal();
    let mut plan = None;
    let mut planned = None;
    let mut per_root = vec![(0u64, 0u64); s.roots.len()];
    let counted = AtomicU64::new(0);
    let (walked, failure, output, state) =
        std::thread::scope(|scope| {
            let mut front = Ledger {
                reporter,
                bar: None,
                error: None,
                state,
                per_root: &mut per_root,
                lines_on_terminal: s.reports_to_stderr || io::stdout().is_terminal(),
            };
            let source =
                match &s.scrub {
                    Some(scrub) => match scrub::prepare(s, scrub, config, &mut front) {
                        Ok((p, queue)) => {
                            plan = Some(p);
                            planned = Some(queue.planned.1);
                            engine::Source::List(Box::new(queue))
                        }
                        Err(e) => {
                            front
                                .reporter
                                .summary
                                .fail(format!("planning the scrub: {e:#}"));
                            engine::Source::List(Box::new(std::iter::empty()))
                        }
                    },
                    None => match front
                        .state
                        .as_mut()
                        .filter(|_| s.known_damage_only)
                        .and_then(|state| state.known_damage_under(&s.roots))
                    {
                        Some(damaged) => {
                            front.reporter.note(format!(
                        "only the {} damaged file(s) the state database knows were read: it \
                         has a verdict for every file under {} (--full reads them all)",
                        damaged.len(),
                        s.roots.iter().map(|r| escape(r)).collect::<Vec<_>>().join(", ")
                    ));
                            let entries = damaged.into_iter().map(|(root, path)| Entry::File {
                                path,
                                size: 0,
                                root,
                                inode: None,
                                stat: None,
                            });
                            engine::Source::List(Box::new(entries))
                        }
                        None => engine::Source::Walk,
                    },
                };
            let config = &*config;
            let bar = show_bar
                .then(|| progress_bar(scope, &s.roots, config, planned, &progress, &counted));
            front.bar = bar.as_ref();
            let mut failure = None;
            let walked = engine::run_from(config, &s.roots, source, &STOP, &progress, |report| {
                if failure.is_none()
                    && front.error.is_none()
                    && let Err(f) = sink.take(report, &mut front)
                {
                    // The work itself cannot be done (a full disk?): stop, leave nothing.
                    STOP.store(true, Ordering::SeqCst);
                    failure = Some(f);
                }
            });
            if let Some(bar) = &bar {
                bar.finish_and_clear();
            }
            // The last rows are written while the sink finishes (an archive's compression and
            // fsync), rather than after.
            if let Some(state) = &mut front.state {
                state.send();
            }
            if sink.wants_missing()
                && !STOP.load(Ordering::SeqCst)
                && let Some(state) = &mut front.state
            {
                let deleted = sink.missing(state.missing(&s.roots));
                state.record_gone(&deleted);
            }
            if let Err(f) = sink.finish(STOP.load(Ordering::SeqCst), &mut front) {
                failure.get_or_insert(f);
            }
            (walked, failure, front.error, front.state)
        });
    Ran {
        walked,
        failure,
        output,
        state,
        plan,
        per_root,
    }
}

/// Says how the run ended beyond its files: the work's failure, what the state database
/// knows that the run did not see, a scrub's cycle, a PATH under which nothing was verified.
/// Returns the error writing the output met, if any.
fn conclude(s: &Settings, ran: &mut Ran, reporter: &mut Speaker) -> Option<io::Error> {
    let mut output = ran.output.take();
    match ran.failure.take() {
        // The manifest's own stdout closed: as for the reports' (`intact export | head`).
        Some(f) if f.stdout && f.error.kind() == io::ErrorKind::BrokenPipe => {
            output = Some(f.error)
        }
        Some(f) => reporter.summary.fail(f.to_string()),
        None => {}
    }
    if let Err(e) = &ran.walked {
        reporter.summary.fail(format!("walking: {e}"));
    }
    let interrupted = STOP.load(Ordering::SeqCst);
    let (plan, state) = (ran.plan.as_ref(), &mut ran.state);
    if output.is_none() {
        let said =
            tell_what_is_known(s, plan, state.as_mut(), reporter).and_then(|()| match plan {
                Some(plan) => scrub::conclude(plan, state.as_mut(), reporter, interrupted),
                None => Ok(()),
            });
        if let Err(e) = said {
            output = Some(e);
        }
    }
    // A vanished tree was said as such: "holds no files" would say it twice.
    if s.verifies_only() && !interrupted && reporter.summary.vanished == 0 {
        let counts = plan.map_or(&ran.per_root, |p| &p.per_root);
        for (root, &(files, tagged)) in s.roots.iter().zip(counts) {
            if let Some(why) = nothing_verified(root, files, tagged) {
                reporter.summary.fail(why);
            }
        }
    } else if matches!(s.config.work, Work::Tag | Work::Update) && !interrupted {
        // Tagging where no tag can be written: one line that says why and what serves
        // instead, after the files' own errors.
        let counts = plan.map_or(&ran.per_root, |p| &p.per_root);
        for (root, &(files, tagged)) in s.roots.iter().zip(counts) {
            if files > 0 && tagged == 0 && lacks_xattrs(root) {
                reporter.summary.fail(format!(
                    "{}: its file system does not support extended attributes, so none of its \
                     {} file(s) can carry a tag: keep them on one that does (ext4, XFS, btrfs, \
                     APFS), or verify this copy against a manifest exported where they are \
                     tagged (`intact export`, then `intact check --manifest FILE`)",
                    escape(root),
                    group(files)
                ));
            }
        }
    }
    output
}

/// Whether the file system `root` is on keeps no extended attributes (ramfs, some FUSE and
/// network file systems list none and refuse to get one).
fn lacks_xattrs(root: &std::path::Path) -> bool {
    matches!(
        rustix::fs::lgetxattr(root, intact::core::tag::names::INTACT, &mut [0u8; 0][..]),
        Err(rustix::io::Errno::NOTSUP)
    )
}

/// Commits what the run recorded; a database found damaged is moved aside and rebuilt.
fn close(s: &Settings, state: &mut Option<State>, reporter: &mut Speaker) {
    if let Some(state) = state {
        state.commit();
        if let Some(failed) = state.failed.take() {
            reporter.summary.fail(failed);
        }
    }
    if state.as_ref().is_some_and(|st| st.broken)
        && let Some(st) = state.take()
    {
        reporter.summary.fail(match st.quarantine() {
            Ok(rebuilt) => history_lost(s.state.as_deref(), &rebuilt),
            Err(e) => format!(
                "the state database {} is damaged and could not be moved aside ({e}): \
                 remove it",
                s.state.as_deref().map_or("?".into(), escape)
            ),
        });
    }
}

/// Tells the owner what the run found (after its verdicts are committed), if anyone is to
/// be told; a delivery that failed is a failure of the run.
fn tell_the_owner(s: &Settings, ran: &mut Ran, reporter: &mut Speaker) {
    let Some(setup) = &s.notify else { return };
    let summary = &reporter.summary;
    let run = notify::Run {
        verb: s.verb.name(),
        roots: &s.roots,
        findings: &summary.findings,
        interrupted: summary.interrupted,
        exit: summary.exit(s.verb),
        partial: false,
    };
    let failed = notify::tell(setup, &run, ran.state.as_mut());
    reporter.summary.notify_failed = Some(!failed.is_empty());
    for f in failed {
        reporter.summary.fail(f);
    }
}

/// The run's record, then its metrics (the summary comes last): each says the exit code the
/// process returns (a failure of one is a failure the next ones state).
fn record(s: &Settings, ran: &mut Ran, reporter: &mut Speaker) {
    if let Some(st) = &mut ran.state {
        let summary = &reporter.summary;
        st.end_run(
            summary.files(),
            summary.bytes,
            summary.elapsed.as_secs_f64(),
            summary.exit(s.verb) as i32,
        );
        if let Some(failed) = st.failed.take() {
            reporter.summary.fail(failed);
        }
    }
    let Some(path) = &s.metrics else {
        return;
    };
    let summary = &reporter.summary;
    let mut m = Metrics::of(&s.roots);
    m.run(
        s.verb.name(),
        summary,
        summary.exit(s.verb) as i32,
        intact::state::now(),
    );
    let removed = ran
        .plan
        .as_ref()
        .map_or(summary.removed, |p| p.removed_kept);
    m.removed(s.verb.name(), removed);
    // A scrub's plan knows the files of the trees it verifies (untagged ones too with
    // --update, which tags them); a walk's record knows the files it recorded. The new files
    // the run left untagged are never verified besides.
    let ages = match &ran.plan {
        Some(plan) => plan.ages().ok(),
        None => ran.state.as_mut().and_then(|st| st.seen_summary(&s.roots)),
    };
    if let Some((never, oldest)) = ages {
        let never = never + summary.left_untagged;
        verification_ages(&mut m, s.verb.name(), never, oldest);
    }
    if let Err(e) = m.write(path) {
        reporter
            .summary
            .fail(format!("writing the metrics {}: {}", escape(path), e));
    }
}
/// Without a state database (`--no-state`), a file system meant to be mounted beneath the
/// tree but not mounted now cannot be seen, so it would pass silently: the damage the
/// default database knows on it is said (read only), and what /etc/fstab mounts there but
/// is not mounted is an error.
fn tell_unmounted_without_state<W: Write, E: Write>(
    s: &Settings,
    reporter: &mut Reporter<W, E>,
) -> io::Result<()> {
    if let Some(db) = &s.damage_from {
        for damaged in intact::state::unmounted_damage_at(db, &s.roots) {
            reporter.outstanding(&damaged)?;
        }
    }
    #[cfg(target_os = "linux")]
    for point in intact::fs::mounts::not_mounted_under(&s.roots) {
        reporter.summary.fail(format!(
            "{}: /etc/fstab mounts a file system here, which is not mounted: its files \
             were not verified",
            escape(&point)
        ));
    }
    Ok(())
}

/// Tells what the state database knows that this run did not see: damage earlier runs found
/// that is still there (every run that judges says it, until it is dealt with), files gone
/// from a scrubbed tree, and a history lost with a damaged database.
fn tell_what_is_known<W: Write, E: Write>(
    s: &Settings,
    plan: Option<&intact::scrub::Plan>,
    state: Option<&mut State>,
    reporter: &mut Reporter<W, E>,
) -> io::Result<()> {
    if !s.verb.judges() {
        return Ok(());
    }
    let Some(state) = state else {
        return tell_unmounted_without_state(s, reporter);
    };
    // A file this run found damaged under another key (its tag stripped since) is said once.
    let said: std::collections::HashSet<String> = reporter
        .summary
        .findings
        .problems
        .iter()
        .filter_map(|p| match p {
            intact::notify::Problem::Damaged { what, .. } => Some(what.clone()),
            _ => None,
        })
        .collect();
    let mut known = state.outstanding(&s.roots);
    // A scrub's plan knows damage by the file's inode and tag wherever the walk met it: a
    // damaged file moved since, which is not where the damage was found, is still damaged.
    if let Some(plan) = plan {
        let where_found: std::collections::HashSet<PathBuf> =
            known.iter().map(|k| k.path.clone()).collect();
        let moved: Vec<intact::state::Damaged> = plan
            .damage()
            .unwrap_or_default()
            .into_iter()
            .map(|d| intact::state::Damaged {
                path: intact::state::absolute(&d.path),
                ..d
            })
            .filter(|d| !where_found.contains(&d.path))
            .collect();
        let paths: Vec<PathBuf> = moved.iter().map(|d| d.path.clone()).collect();
        let judged = state.judged_now(&paths);
        known.extend(
            moved
                .into_iter()
                .zip(judged)
                .filter(|(_, j)| !j)
                .map(|(d, _)| d),
        );
    }
    for damaged in known {
        if !said.contains(&escape(&damaged.path)) {
            reporter.outstanding(&damaged)?;
        }
    }
    let Some(plan) = plan else {
        return Ok(());
    };
    for g in &plan.gone_now {
        reporter.removed(g)?;
    }
    if let Some(lost) = state.history_lost()
        && let Ok(n) = plan.unchecked_since(lost.at)
        && n > 0
    {
        reporter.summary.fail(lost_note(&lost, n));
    }
    Ok(())
}

/// Why a run that only verifies did not do its job under `root`, if it did not: it found no
/// files there, or none with a tag (a file system without xattrs, a copy that lost them).
pub(super) fn nothing_verified(root: &std::path::Path, files: u64, tagged: u64) -> Option<String> {
    if tagged > 0 {
        return None;
    }
    let shown = escape(root);
    let meta = std::fs::symlink_metadata(root).ok()?;
    if meta.file_type().is_symlink() {
        return Some(format!(
            "{shown} is a symbolic link to nothing that exists: nothing was verified"
        ));
    }
    if !meta.is_dir() && !meta.is_file() {
        return Some(format!(
            "{shown} is not a regular file or a directory: nothing was verified"
        ));
    }
    if files == 0 {
        return Some(format!(
            "{shown} holds no files: nothing was verified (is its file system mounted?)"
        ));
    }
    Some(if lacks_xattrs(root) {
        format!(
            "{shown}: its file system does not support extended attributes, so none of its \
             {} file(s) can carry a tag: nothing was verified (`intact export` and \
             `check --manifest` serve such media)",
            group(files)
        )
    } else {
        format!(
            "none of the {} file(s) under {shown} is tagged: nothing was verified \
             (`intact tag` tags them; copies made without xattrs, such as `cp -r`, lose them)",
            group(files)
        )
    })
}

/// What a database found damaged and replaced means for the owner.
fn history_lost(db: Option<&std::path::Path>, rebuilt: &intact::state::Rebuilt) -> String {
    format!(
        "the state database {} was damaged ({}): moved it to {} and started a new one; what it \
         knew of damage found earlier and of when files were verified is lost, and runs say so \
         until every file has been checked again (`intact check PATH` does it at once)",
        db.map_or("?".into(), escape),
        rebuilt.why,
        escape(&rebuilt.aside)
    )
}

/// What `status` and scrubs say while files have not been checked since the database was
/// rebuilt.
pub(crate) fn lost_note(lost: &intact::state::Lost, unchecked: u64) -> String {
    format!(
        "the state database was rebuilt at {} (the damaged one is {}): damage found before \
         then is no longer known, and {} tagged file(s) under the trees have not been checked \
         since; `intact check PATH` checks them all",
        intact::text::time_ms(lost.at),
        lost.aside.as_deref().map_or("gone".into(), escape),
        group(unchecked)
    )
}

/// Prints the summary; the exit code it states.
fn finish(reporter: &mut Speaker, verb: intact::verb::Verb) -> Exit {
    let done = reporter.finish();
    let exit = reporter.summary.exit(verb);
    // A reader gone only after the last line (the lines waited in a buffer): every file was
    // verified all the same.
    done.or_else(|e| output_failed(e, exit))
        .unwrap_or_else(|_| exit.merge(Exit::Trouble))
}

/// The state database at `path`, or none if it cannot be opened: the run verifies all the
/// same, but what it could not do is a failure of the run (exit 3), and so is a database
/// found damaged and rebuilt.
fn open_state(path: &std::path::Path, summary: &mut Summary) -> Option<State> {
    intact::state::on_lock_waits(&STOP, |wait| {
        eprintln!(
            "intact: waiting for the state database: another process holds its lock (up to {} s; \
             Ctrl-C stops)",
            wait.as_secs()
        );
    });
    match State::open(path) {
        Ok((state, rebuilt)) => {
            if let Some(rebuilt) = rebuilt {
                summary.fail(history_lost(Some(path), &rebuilt));
            }
            Some(state)
        }
        Err(e) => {
            summary.fail(format!(
                "cannot use the state database {}: {e}; what it remembers (damage found \
                 before, when files were verified) is out of reach, and nothing of this run is \
                 recorded (`--state FILE` puts it elsewhere, `--no-state` does without it)",
                escape(path)
            ));
            None
        }
    }
}

/// Runs `f` on the state database (its path; `None` without one). The database is only a
/// cache: if SQLite finds it damaged, it is moved aside, a new one opened in its place, and
/// `f` run once more.
fn on_state<T>(
    state: &mut Option<State>,
    summary: &mut Summary,
    mut f: impl FnMut(Option<&std::path::Path>) -> rusqlite::Result<T>,
) -> rusqlite::Result<T> {
    let path = |state: &Option<State>| state.as_ref().and_then(|st| st.path().map(PathBuf::from));
    let db = path(state);
    match f(db.as_deref()) {
        Err(e) if intact::state::is_damage(&e) && db.is_some() => {
            if let Some(st) = state.take() {
                match st.quarantine() {
                    Ok(rebuilt) => summary.fail(history_lost(db.as_deref(), &rebuilt)),
                    Err(e) => summary.fail(format!("the state database is damaged: {e}")),
                }
            }
            *state = db.as_deref().and_then(|db| open_state(db, summary));
            f(path(state).as_deref())
        }
        other => other,
    }
}

/// The metrics of verification age: files never verified, and the oldest verification.
fn verification_ages(m: &mut Metrics, verb: &str, never: u64, oldest: Option<i64>) {
    let v = &[("verb", verb)];
    m.gauge(
        "files_never_verified",
        "Files under the roots never verified since they were tagged (or never tagged).",
        v,
        never as f64,
    );
    if let Some(oldest) = oldest {
        m.gauge(
            "oldest_verification_age_seconds",
            "How long ago the least recently verified file that is not damaged was verified.",
            v,
            (intact::state::now() - oldest).max(0) as f64 / 1e3,
        );
    }
}

/// Where the reports of a run end, as sinks see it: each is counted under its root, recorded
/// in the state database, and printed (stepping around the progress bar); an output error
/// (a closed pipe) stops the run.
struct Ledger<'a> {
    reporter: &'a mut Reporter<Box<dyn Write>, io::Stderr>,
    bar: Option<&'a ProgressBar>,
    error: Option<io::Error>,
    /// Where verdicts and copies are recorded.
    state: Option<State>,
    /// Per root: regular files reported, and tagged ones among them.
    per_root: &'a mut Vec<(u64, u64)>,
    /// Whether per-file lines go to the terminal the bar is drawn on (else the bar need not
    /// step aside for them: `intact check > report.txt`).
    lines_on_terminal: bool,
}

impl Ledger<'_> {
    fn print(&mut self, prints: bool, f: impl FnOnce(&mut Self) -> io::Result<()>) {
        if self.error.is_some() {
            return;
        }
        let result = match self.bar.cloned() {
            Some(bar) if prints => bar.suspend(|| f(self)),
            _ => f(self),
        };
        if let Err(e) = result {
            STOP.store(true, Ordering::SeqCst);
            self.error = Some(e);
        }
    }
}

impl Ledger<'_> {
    /// Counts the report under its root.
    fn count(&mut self, report: &FileReport) {
        if report.status != intact::core::classify::Status::Skipped
            && let Some(count) = self.per_root.get_mut(report.root)
        {
            count.0 += 1;
            count.1 += u64::from(report.tag.is_some());
        }
    }
}

impl Out for Ledger<'_> {
    fn send(&mut self, report: FileReport) {
        self.count(&report);
        let prints = self.reporter.prints(&report)
            && (self.lines_on_terminal || !report.malformed.is_empty());
        self.print(prints, |f| f.reporter.file(&report));
        if let Some(state) = &mut self.state {
            state.record(report);
        }
    }

    fn hold(&mut self, report: FileReport) {
        self.count(&report);
        let prints = !report.malformed.is_empty();
        self.print(prints, |f| f.reporter.hold(&report));
        // The state database records the copy now; it counts once `settle` says durable.
        if let Some(state) = &mut self.state {
            state.record(report);
        }
    }

    fn settle(&mut self, durable: bool) {
        if let Some(state) = &mut self.state {
            state.settle(durable);
        }
        self.print(true, |f| f.reporter.settle(durable));
    }

    fn note(&mut self, line: String) {
        self.reporter.note(line);
    }

    fn warn(&mut self, line: String) {
        self.print(true, |_| writeln!(io::stderr(), "intact: warning: {line}"));
    }

    fn removal(&mut self, removal: &intact::scrub::Removal) {
        self.reporter
            .summary
            .vanished(removal.describe(), removal.removed);
    }
}

/// Ctrl-C, SIGTERM (systemd, `timeout`) and SIGHUP wind the run down, which then still
/// removes its temp files and prints its summary. A second signal ends a run at once when
/// `exit_at_once` (nothing half-written can be left: tags are one atomic setxattr).
pub(crate) fn on_signals(exit_at_once: bool) -> anyhow::Result<()> {
    static INSTALL: Once = Once::new();
    let mut result = Ok(());
    INSTALL.call_once(|| {
        result = ctrlc::set_handler(move || {
            SIGNALLED.store(true, Ordering::SeqCst);
            if STOP.swap(true, Ordering::SeqCst) && exit_at_once {
                std::process::exit(Exit::Interrupted as i32);
            }
        });
    });
    Ok(result?)
}

/// A bar on stderr with throughput, ETA, the files done and the current file. Its total is
/// the data the run will read: a scrub's plan, or else what a metadata-only walk running
/// alongside counts into `counted` (the bar starts at once and the ETA firms up), listing the
/// tags where they decide whether a file is read (`check` reads tagged files only, `tag`
/// untagged ones). The total never falls below what is done.
fn progress_bar<'s>(
    s: &'s std::thread::Scope<'s, '_>,
    roots: &'s [PathBuf],
    config: &'s engine::Config,
    planned: Option<u64>,
    progress: &'s Progress,
    counted: &'s AtomicU64,
) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr_with_hz(10));
    // A narrow terminal gets the numbers that matter, on one line.
    let narrow = rustix::termios::tcgetwinsize(io::stderr()).is_ok_and(|w| w.ws_col < 60);
    let template = if narrow {
        "{bytes}/{total_bytes} ETA {eta} {wide_msg}"
    } else {
        "{bytes:>10}/{total_bytes:10} {bytes_per_sec:>12} ETA {eta:>4}  {wide_msg}"
    };
    bar.set_style(ProgressStyle::with_template(template).expect("valid template"));
    let walking = bar.clone();
    s.spawn(move || {
        if let Some(planned) = planned {
            counted.store(planned, Ordering::Relaxed);
            return;
        }
        let by_tags = config.reads(true) != config.reads(false);
        let _ = walk::walk(roots, &config.walk, |entry| {
            if let Entry::File { path, size, .. } = entry
                && config.reads(by_tags && has_tag(&path))
            {
                counted.fetch_add(size, Ordering::Relaxed);
            }
            if walking.is_finished() {
                std::ops::ControlFlow::Break(())
            } else {
                std::ops::ControlFlow::Continue(())
            }
        });
    });
    let ticker = bar.clone();
    s.spawn(move || {
        while !ticker.is_finished() {
            let done = progress.bytes.load(Ordering::Relaxed);
            ticker.set_length(counted.load(Ordering::Relaxed).max(done));
            ticker.set_position(done);
            if let Ok(current) = progress.current.lock() {
                let files = progress.files.load(Ordering::Relaxed);
                ticker.set_message(format!(
                    "{} {}  {}",
                    group(files),
                    if files == 1 { "file" } else { "files" },
                    escape(&current)
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    bar
}

/// Whether the file at `path` carries a tag a check would read (by its attributes' names).
fn has_tag(path: &std::path::Path) -> bool {
    use intact::core::tag::names;
    let mut list = [0u8; 1024];
    match rustix::fs::llistxattr(path, &mut list[..]) {
        Ok(n) => list[..n]
            .split(|&b| b == 0)
            .any(|name| names::DIGESTS.iter().any(|t| t.as_bytes() == name)),
        // More attributes than fit: tags among them, most likely.
        Err(rustix::io::Errno::RANGE) => true,
        Err(_) => false,
    }
}

/// Says that a temp file a killed run left was removed.
fn removed(path: &std::path::Path) {
    eprintln!(
        "intact: removed {}: left by an interrupted run of intact",
        escape(path)
    );
}
