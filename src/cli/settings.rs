//! The command line turned, once, into settings: the engine's configuration, what to walk,
//! and how to report. Verb modules start from [`Settings::new`] and adjust what is theirs.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;

use super::{AlgoArg, Common, CompatArg, Metrics, NotifyArgs, Output, Speed, StateArgs};
use intact::core::digest::Algo;
use intact::core::manifest::{self, Expected};
use intact::core::tag::Compat;
use intact::engine::{Config, Work};
use intact::fs::walk::{self, WalkOptions};
use intact::parity;
use intact::report::Verbosity;
use intact::verb::Verb;

/// Everything a run needs to know.
#[derive(Clone)]
pub struct Settings {
    /// What the reports are about.
    pub verb: Verb,
    /// What the engine does.
    pub config: Config,
    /// What to walk.
    pub roots: Vec<PathBuf>,
    /// How to report.
    pub json: bool,
    /// How much to say.
    pub verbosity: Verbosity,
    /// A progress bar, if stderr is a terminal.
    pub progress: bool,
    /// Lowest CPU and I/O priority.
    pub background: bool,
    /// Per-file lines go to stderr (stdout carries a manifest).
    pub reports_to_stderr: bool,
    /// A second Ctrl-C ends the run at once (verbs that write no temp files).
    pub exit_at_once: bool,
    /// Known before the run: PATHs that are not there, manifest lines that could not be used.
    pub failures: Vec<String>,
    /// The state database to record verdicts and copies in, if any.
    pub state: Option<PathBuf>,
    /// Without one (`--no-state`): the database whose damage is known all the same, read
    /// only.
    pub damage_from: Option<PathBuf>,
    /// Take a PATH that now leads to another folder as the tree the database knows there.
    pub accept_moved_root: bool,
    /// Where to write Prometheus metrics of the run.
    pub metrics: Option<PathBuf>,
    /// A scrub's plan: what to verify, in which order.
    pub scrub: Option<Scrub>,
    /// Only the damaged files the state database knows, where it knows every file under
    /// the roots (a repair without `--full`); else the walk.
    pub known_damage_only: bool,
    /// Who is told what the run found, and how.
    pub notify: Option<intact::notify::Setup>,
}

/// What a scrub verifies.
#[derive(Clone, Copy, Debug, Default)]
pub struct Scrub {
    /// Bytes and share.
    pub budget: intact::scrub::Budget,
    /// Tag untagged files too (`--update`).
    pub untagged_too: bool,
    /// Start no file after this long.
    pub max_time: Option<std::time::Duration>,
    /// The share of a tree's files (percent) that, gone at once, is an alarm rather than
    /// deletions; `None`: record every deletion (`--accept-removed`).
    pub removal_alarm: Option<f64>,
}

impl Settings {
    /// Settings for `verb`, doing `work` on `roots`, from the options every walking verb has.
    pub fn new(verb: Verb, roots: Vec<PathBuf>, common: &Common) -> anyhow::Result<Settings> {
        // Parity stores are intact's own data, checked by their own checksums: walks pass
        // them by (a store named as PATH is still walked).
        let mut excludes = common.exclude.clone();
        excludes.push(format!("{}/", parity::DEFAULT_DIR));
        walk::check_globs(&excludes).map_err(|e| usage(format!("bad --exclude pattern: {e}")))?;
        let config = Config {
            mtime_window_ns: common.mtime_window.unwrap_or(0),
            threads: threads(common),
            drop_cache: common.speed == Speed::Background,
            gate_spinning: common.speed != Speed::Fast,
            walk: WalkOptions {
                one_file_system: common.one_file_system,
                excludes,
                own: Default::default(),
                only: None,
            },
            remove_leftovers: verb.changes_files(),
            ..Config::new(verb.work())
        };
        // A PATH that is not there is a mistyped name, not a file that vanished: said once,
        // counted as no file, and the exit code is 3.
        let (roots, absent): (Vec<_>, Vec<_>) = roots.into_iter().partition(|r| {
            !matches!(std::fs::symlink_metadata(r),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound)
        });
        let mut failures: Vec<String> = absent
            .iter()
            .map(|r| format!("{}: no such file or directory", intact::text::escape(r)))
            .collect();
        // As root, a PATH that another user could point elsewhere is not followed.
        let roots = if rustix::process::geteuid().is_root() {
            let swappable = |r: &PathBuf| match intact::fs::chase::unsafe_step(r) {
                Ok(Some(why)) => Some(format!(
                    "{}: not followed as root: {why}",
                    intact::text::escape(r)
                )),
                _ => None,
            };
            let (refused, roots): (Vec<_>, Vec<_>) = roots
                .into_iter()
                .map(|r| (swappable(&r), r))
                .partition(|(why, _)| why.is_some());
            failures.extend(refused.into_iter().filter_map(|(why, _)| why));
            roots.into_iter().map(|(_, r)| r).collect()
        } else {
            roots
        };
        Ok(Settings {
            verb,
            config,
            roots: roots.into_iter().map(followed).collect(),
            json: common.output.json,
            verbosity: verbosity(&common.output),
            progress: !common.output.quiet && !common.output.no_progress,
            background: common.speed == Speed::Background,
            reports_to_stderr: false,
            exit_at_once: !verb.writes_temps(),
            failures,
            state: None,
            damage_from: None,
            accept_moved_root: false,
            metrics: None,
            scrub: None,
            known_damage_only: false,
            notify: None,
        })
    }

    /// Whether the run may change files at all (`archive --untagged`, `repair --dry-run` and
    /// a scrub without `--update` may not): tags, and the temp files killed runs left.
    pub fn changes_files(&mut self, yes: bool) {
        self.config.write = yes;
        self.config.remove_leftovers = yes && self.verb.changes_files();
    }

    /// Records in the state database `a` names (or the default one) unless told not to;
    /// told not to, still knows the damage it remembers (read only).
    pub fn record(&mut self, a: &StateArgs) {
        let db = a.state.clone().or_else(intact::state::default_path);
        (self.state, self.damage_from) = if a.no_state { (None, db) } else { (db, None) };
        self.accept_moved_root = a.accept_moved_root;
        // A database kept inside a tree is never a file of it.
        if let Some(db) = &self.state {
            self.config.walk.own.database(db);
        }
    }

    /// Writes Prometheus metrics where `m` says (only ever over a regular file); the file is
    /// never one of the tree's, even inside it.
    pub fn metrics(&mut self, m: &Metrics) -> anyhow::Result<()> {
        self.metrics = m.file()?;
        if let Some(path) = &self.metrics {
            self.config.walk.own.output(path);
        }
        Ok(())
    }

    /// Tells the owner as `a` says, if it names any channel or a heartbeat.
    pub fn notify(&mut self, a: &NotifyArgs) -> anyhow::Result<()> {
        self.notify = setup(a)?;
        Ok(())
    }

    /// Whether the run only verifies (check, a scrub without `--update`): one that verifies
    /// nothing under a root, for want of files or of tags, has not done its job.
    pub fn verifies_only(&self) -> bool {
        matches!(
            (self.verb, self.config.work),
            (Verb::Check | Verb::Scrub, Work::Check)
        )
    }

    /// Reads the manifest `file` for `root` into the configuration: lines it cannot use are
    /// warned about now and make the exit code 3.
    pub fn manifest(&mut self, file: &Path, root: &Path, algo: Algo) -> anyhow::Result<()> {
        let reading = || format!("reading {}", intact::text::escape(file));
        let input = std::fs::File::open(file).with_context(reading)?;
        let parsed = manifest::read(std::io::BufReader::with_capacity(1 << 20, input), algo)
            .with_context(reading)?;
        let (expected, outside) = Expected::new(root, &parsed);
        let shown = intact::text::escape(file);
        for bad in parsed.bad.iter().chain(&outside) {
            eprintln!("intact: warning: {shown}: {bad}");
        }
        let bad = parsed.bad.len() + outside.len();
        if bad > 0 {
            self.failures
                .push(format!("{shown}: {bad} line(s) could not be used"));
        }
        self.config.manifest = Some(Arc::new(expected));
        Ok(())
    }
}

/// A PATH given on the command line that is a symbolic link is followed, as `find -H` does:
/// `/srv/photos -> /mnt/disk1/photos` names the tree the user means (a walk that skipped it
/// would verify nothing and say all is well). Links inside the trees are never followed.
fn followed(root: PathBuf) -> PathBuf {
    match std::fs::symlink_metadata(&root) {
        Ok(m) if m.file_type().is_symlink() => std::fs::canonicalize(&root).unwrap_or(root),
        _ => root,
    }
}

/// A file the run is to write, `what` it holds: refused up front (a usage error, before any
/// work) where something other than a regular file is in the way.
pub fn output(path: &Path, what: &str) -> anyhow::Result<PathBuf> {
    intact::fs::atomic::replaceable(path).map_err(|e| {
        usage(format!(
            "cannot write {what} to {}: {e}",
            intact::text::escape(path)
        ))
    })?;
    Ok(path.to_path_buf())
}

/// A usage error: exit code 2, as clap gives for the errors it finds.
#[derive(Debug)]
pub struct Usage(String);

impl fmt::Display for Usage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

/// A usage error, for `?`.
pub fn usage(what: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(Usage(what.into()))
}

/// The algorithm an `--algo` names.
pub fn algo(a: AlgoArg) -> Algo {
    match a {
        AlgoArg::Sha256 => Algo::Sha256,
        AlgoArg::Blake3 => Algo::Blake3,
    }
}

/// The tags a `--compat` names, each once, in a fixed order.
pub fn formats(c: &[CompatArg]) -> Vec<Compat> {
    let mut formats: Vec<Compat> = c
        .iter()
        .map(|c| match c {
            CompatArg::Shatag => Compat::Shatag,
            CompatArg::Dintch => Compat::Dintch,
        })
        .collect();
    formats.sort();
    formats.dedup();
    formats
}

/// How much to say.
pub fn verbosity(output: &Output) -> Verbosity {
    if output.quiet {
        Verbosity::Quiet
    } else if output.verbose {
        Verbosity::Verbose
    } else {
        Verbosity::Normal
    }
}

/// Worker threads for the chosen speed. Spinning disks need no fewer: the engine lets one
/// worker at a time read from each of them, and the rest hash what is cached.
fn threads(common: &Common) -> usize {
    match (common.threads, common.speed) {
        (Some(n), _) => n as usize,
        (None, Speed::Background) => 1,
        (None, _) => intact::fs::sys::cores(),
    }
}

/// The notification settings `a` names, if it names a channel or a heartbeat.
pub fn setup(a: &NotifyArgs) -> anyhow::Result<Option<intact::notify::Setup>> {
    let config = a
        .notify_config
        .as_deref()
        .filter(|c| !c.as_os_str().is_empty());
    if let Some(c) = config
        && !c.is_file()
    {
        return Err(usage(format!(
            "the Apprise configuration file {} does not exist",
            intact::text::escape(c)
        )));
    }
    let channels = intact::notify::parse_channels(&a.notify, config)
        .map_err(|e| usage(format!("--notify: {e}")))?;
    let heartbeat = a.heartbeat.clone().filter(|h| !h.trim().is_empty());
    if channels.is_empty() && heartbeat.is_none() {
        return Ok(None);
    }
    let mut repair_from = Vec::new();
    for text in &a.repair_from {
        repair_from.extend(
            intact::repair::sources(text).map_err(|e| usage(format!("INTACT_REPAIR_FROM {e}")))?,
        );
    }
    Ok(Some(intact::notify::Setup {
        channels,
        remind_every: a.remind_every.unwrap_or_default(),
        heartbeat,
        repair_from,
        timeout: a.notify_timeout,
    }))
}
