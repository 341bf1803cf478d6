//! The `intact` command: parses the command line into a [`Config`], runs the engine, shows
//! progress on a terminal, and maps the outcome to an exit code.

mod cli;

use std::io::{IsTerminal, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{CommandFactory, Parser};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use cli::{AlgoArg, ArchiveCommand, Cli, Command, Common, CompatArg, Generated, Output, Speed};
use intact::archive;
use intact::core::classify::Status;
use intact::core::digest::Algo;
use intact::core::manifest::{self, Expected};
use intact::core::tag::Format;
use intact::engine::{self, Config, FileReport, Progress, Verb};
use intact::fs::walk::{self, Entry, WalkOptions};
use intact::parity;
use intact::repair::{self, Keep, Repairer, Source};
use intact::report::{Exit, Reporter, Verbosity};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(exit) => ExitCode::from(exit as u8),
        Err(e) => {
            eprintln!("intact: error: {e:#}");
            ExitCode::from(Exit::Usage as u8)
        }
    }
}

/// The command line turned into work: the engine's configuration, what to walk, and where
/// an export goes.
struct Job {
    config: Config,
    roots: Vec<PathBuf>,
    common: Common,
    task: Task,
    bad_manifest_lines: bool,
}

/// What happens with the engine's reports besides reporting them.
enum Task {
    Report,
    /// A manifest of PATH, to stdout or a file.
    Export(PathBuf, Option<PathBuf>),
    /// Verified files go into an archive.
    Archive(PathBuf, archive::Options),
    /// Damaged files are restored from sources.
    Repair(Vec<Source>, repair::Options),
    /// Verified files get parity, in a store per root (or the one given).
    Protect(Option<PathBuf>, f64),
}

fn job(cli: Cli) -> anyhow::Result<Result<Job, Exit>> {
    let algo = |a: AlgoArg| match a {
        AlgoArg::Sha256 => Algo::Sha256,
        AlgoArg::Blake3 => Algo::Blake3,
    };
    let formats = |c: &[CompatArg]| {
        let mut formats: Vec<Format> = c
            .iter()
            .map(|c| match c {
                CompatArg::Shatag => Format::Shatag,
                CompatArg::Dintch => Format::Dintch,
            })
            .collect();
        formats.sort();
        formats.dedup();
        formats
    };
    let compat = |c: cli::Compat| formats(&c.compat);
    let mut bad = false;
    let (config, roots, common, task) = match cli.command {
        Command::Tag {
            paths,
            common,
            algo: a,
            force,
            compat: c,
        } => {
            let config = Config {
                algo: Some(algo(a)),
                force,
                compat: compat(c),
                ..Config::new(Verb::Tag)
            };
            (config, paths.paths, common, Task::Report)
        }
        Command::Check {
            paths,
            common,
            manifest,
            algo: a,
        } => {
            let mut config = Config::new(Verb::Check);
            if let Some(file) = manifest {
                let [root] = paths.paths.as_slice() else {
                    anyhow::bail!(
                        "--manifest checks exactly one PATH (the manifest's paths are relative to it)"
                    );
                };
                let (expected, had_bad) = load_manifest(&file, root, algo(a))?;
                config.manifest = Some(expected);
                bad = had_bad;
            }
            (config, paths.paths, common, Task::Report)
        }
        Command::Update {
            paths,
            common,
            algo: a,
            accept_corrupt,
            compat: c,
        } => {
            let config = Config {
                algo: a.map(algo),
                accept_corrupt,
                compat: compat(c),
                ..Config::new(Verb::Update)
            };
            (config, paths.paths, common, Task::Report)
        }
        Command::Strip {
            paths,
            common,
            compat: c,
        } => {
            let config = Config {
                compat: formats(&c),
                ..Config::new(Verb::Strip)
            };
            (config, paths.paths, common, Task::Report)
        }
        Command::Show { paths, common } => {
            (Config::new(Verb::Show), paths.paths, common, Task::Report)
        }
        Command::Export {
            path,
            common,
            algo: a,
            output,
        } => {
            let config = Config {
                algo: Some(algo(a)),
                ..Config::new(Verb::Export)
            };
            (
                config,
                vec![path.clone()],
                common,
                Task::Export(path, output),
            )
        }
        Command::Import {
            manifest,
            dir,
            common,
            algo: a,
            compat: c,
        } => {
            let dir = dir.unwrap_or_else(|| match manifest.parent() {
                Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                _ => PathBuf::from("."),
            });
            let (expected, had_bad) = load_manifest(&manifest, &dir, algo(a))?;
            bad = had_bad;
            // The files it lists are opened beneath DIR, never through a symlink.
            let roots = vec![dir];
            let config = Config {
                compat: compat(c),
                manifest: Some(expected),
                ..Config::new(Verb::Import)
            };
            (config, roots, common, Task::Report)
        }
        Command::Archive(ArchiveCommand::Create {
            dest,
            paths,
            common,
            level,
            compress_threads,
            include_damaged,
            untagged,
            algo: a,
        }) => {
            let config = Config {
                algo: a.map(algo),
                write: !untagged,
                ..Config::new(Verb::Archive)
            };
            let opts = archive::Options {
                level,
                threads: compress_threads.unwrap_or(config.threads as u32),
                include_damaged,
            };
            (config, paths.paths, common, Task::Archive(dest, opts))
        }
        Command::Archive(ArchiveCommand::Verify { archive, output }) => {
            return verify(&archive, &output).map(Err);
        }
        Command::Archive(ArchiveCommand::List { archive }) => return list(&archive).map(Err),
        Command::Protect {
            paths,
            common,
            redundancy,
            store,
        } => {
            if store.is_some() && paths.paths.len() > 1 {
                anyhow::bail!("--store takes one PATH (names in a store are relative to it)");
            }
            let config = Config::new(Verb::Protect);
            (
                config,
                paths.paths,
                common,
                Task::Protect(store, redundancy),
            )
        }
        Command::Repair {
            paths,
            common,
            mut from,
            dry_run,
            keep_damaged_in,
            discard_damaged,
        } => {
            let keep = match (keep_damaged_in, discard_damaged) {
                (Some(dir), _) => Keep::In(dir),
                (None, true) => Keep::Discard,
                (None, false) => Keep::Beside,
            };
            // Each PATH's own parity store, if it has one, is searched after the sources named.
            for p in &paths.paths {
                let store = store_dir(p);
                if parity::Store::is_store(&store) && !from.contains(&store) {
                    from.push(store);
                }
            }
            if from.is_empty() {
                anyhow::bail!(
                    "no sources: give --from ARCHIVE|DIR|STORE (no {} found in PATH)",
                    parity::DEFAULT_DIR
                );
            }
            let sources = from.into_iter().map(Source::new).collect();
            let opts = repair::Options { dry_run, keep };
            let config = Config {
                write: !dry_run,
                ..Config::new(Verb::Repair)
            };
            (config, paths.paths, common, Task::Repair(sources, opts))
        }
        Command::Generate { what } => return generate(what).map(Err),
    };
    // Parity stores are intact's own data, checked by their own checksums: walks pass them
    // by (a store named as PATH is still walked).
    let mut excludes = common.exclude.clone();
    excludes.push(format!("{}/", parity::DEFAULT_DIR));
    let config = Config {
        mtime_window_ns: common.mtime_window.unwrap_or(0),
        threads: threads(&common),
        drop_cache: common.speed == Speed::Background,
        gate_spinning: common.speed != Speed::Fast,
        walk: WalkOptions {
            one_file_system: common.one_file_system,
            excludes,
        },
        ..config
    };
    walk::check_globs(&config.walk.excludes).context("bad --exclude pattern")?;
    Ok(Ok(Job {
        config,
        roots,
        common,
        task,
        bad_manifest_lines: bad,
    }))
}

/// Reads and parses a manifest; lines it cannot read, or that name files outside `root`, are
/// warned about (and make the exit code 3), the rest is used.
fn load_manifest(file: &Path, root: &Path, algo: Algo) -> anyhow::Result<(Arc<Expected>, bool)> {
    let reading = || format!("reading {}", file.display());
    let input = std::fs::File::open(file).with_context(reading)?;
    let parsed = manifest::read(std::io::BufReader::with_capacity(1 << 20, input), algo)
        .with_context(reading)?;
    let (expected, outside) = Expected::new(root, &parsed);
    for bad in parsed.bad.iter().chain(&outside) {
        eprintln!("intact: warning: {}: {bad}", intact::report::escape(file));
    }
    let bad = !parsed.bad.is_empty() || !outside.is_empty();
    Ok((Arc::new(expected), bad))
}

fn run(cli: Cli) -> anyhow::Result<Exit> {
    let job = match job(cli)? {
        Ok(job) => job,
        Err(exit) => return Ok(exit),
    };
    let Job {
        config,
        roots,
        common,
        task,
        bad_manifest_lines,
    } = job;
    let output = &common.output;
    let verb = config.verb;
    if common.speed == Speed::Background {
        for e in intact::fs::sys::lowest_priority() {
            eprintln!("intact: warning: could not lower priority: {e}");
        }
    }
    // Archives and repairs clean up their temp files as they wind down (promptly: every
    // loop watches the flag), which an exit from the handler would skip.
    let exit_at_once = !matches!(verb, Verb::Archive | Verb::Repair);
    ctrlc::set_handler(move || {
        // A second Ctrl-C means now: nothing half-written can be left (tags are one
        // atomic setxattr, an export goes to a temp file), so exiting at once is safe.
        if INTERRUPTED.swap(true, Ordering::SeqCst) && exit_at_once {
            std::process::exit(Exit::Interrupted as i32);
        }
    })
    .context("installing the Ctrl-C handler")?;

    // An export's manifest owns stdout (or a temp file renamed at the end); its per-file
    // lines then go to stderr.
    let mut listing = match &task {
        Task::Export(_, Some(file)) => Some(Listing::file(file)?),
        Task::Export(_, None) => Some(Listing::Stdout(std::io::BufWriter::new(
            std::io::stdout().lock(),
        ))),
        _ => None,
    };
    let out: Box<dyn Write> = match &task {
        Task::Export(..) => Box::new(std::io::stderr()),
        _ => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
    };
    let mut archiver = match &task {
        Task::Archive(dest, opts) => Some(
            archive::Writer::create(dest, &roots, opts.clone())
                .with_context(|| format!("creating {}", dest.display()))?,
        ),
        _ => None,
    };
    let stores = match &task {
        Task::Protect(store, redundancy) => Some(open_stores(
            &roots,
            store.as_deref(),
            *redundancy,
            config.threads,
        )?),
        _ => None,
    };
    let removed = archiver
        .iter()
        .flat_map(|w| &w.removed)
        .chain(stores.iter().flatten().flat_map(|(_, s)| &s.removed));
    for path in removed {
        eprintln!(
            "intact: removed {}: left by an interrupted run of intact",
            intact::report::escape(path)
        );
    }
    let mut protect_stats = parity::Stats::default();
    let mut repairer = match &task {
        Task::Repair(_, opts) => Some(Repairer::new(&roots, opts.clone())),
        _ => None,
    };
    let mut reporter = Reporter::new(verb, output.json, verbosity(output), out, std::io::stderr());
    let progress = Progress::default();
    let show_bar = verb.reads_data()
        && !output.quiet
        && !output.no_progress
        && std::io::stderr().is_terminal();
    let mut archive_error = None;
    let start = Instant::now();
    let mut io_error = None;

    // Parity is computed by workers, several sets at a time, while the engine verifies the
    // files that come next.
    let (job_tx, job_rx) = crossbeam_channel::bounded::<(usize, parity::Job)>(config.threads * 2);
    let (done_tx, done_rx) = crossbeam_channel::unbounded();
    std::thread::scope(|s| -> anyhow::Result<()> {
        if let Some(stores) = &stores {
            for _ in 0..config.threads {
                let (job_rx, done_tx) = (job_rx.clone(), done_tx.clone());
                s.spawn(move || {
                    for (i, job) in job_rx {
                        if INTERRUPTED.load(Ordering::Relaxed) {
                            continue;
                        }
                        let (dir, store): &(PathBuf, parity::Store) = &stores[i];
                        let _ = done_tx.send(store.run(job).map_err(|e| (dir.clone(), e)));
                    }
                });
            }
        }
        drop((job_rx, done_tx));
        let job_tx = job_tx;
        let bar = show_bar.then(|| progress_bar(s, &roots, &config.walk, &progress));
        let result = engine::run(&config, &roots, &INTERRUPTED, &progress, |mut report| {
            if io_error.is_some() || archive_error.is_some() {
                return;
            }
            if let Some(w) = &mut archiver
                && let Err(e) = w.add(&mut report)
            {
                // The archive itself cannot be written (disk full?): stop, leave nothing.
                INTERRUPTED.store(true, Ordering::SeqCst);
                archive_error = Some(e);
                return;
            }
            if let Some(stores) = &stores
                && let Some(job) = protect(stores, &roots, &mut report)
            {
                let _ = job_tx.send(job);
            }
            let report = match &mut repairer {
                Some(r) => match r.want(report) {
                    Some(report) => report,
                    None => return,
                },
                None => report,
            };
            let mut result = match &bar {
                Some(bar) if reporter.prints(&report) => bar.suspend(|| reporter.file(&report)),
                _ => reporter.file(&report),
            };
            if let (Some(listing), Task::Export(root, _)) = (&mut listing, &task) {
                result = result.and_then(|()| listing.add(root, &report));
            }
            if let Err(e) = result {
                // A closed pipe (`intact check | head`) ends the run like Ctrl-C.
                INTERRUPTED.store(true, Ordering::SeqCst);
                io_error = Some(e);
            }
        });
        if let Some(bar) = bar {
            bar.finish_and_clear();
        }
        if let Some(stores) = &stores
            && !INTERRUPTED.load(Ordering::SeqCst)
        {
            for (i, (_, store)) in stores.iter().enumerate() {
                if let Some(job) = store.take_pending() {
                    let _ = job_tx.send((i, job));
                }
            }
        }
        drop(job_tx);
        result.context("walking")?;
        Ok(())
    })?;
    if let (Some(r), Task::Repair(sources, _)) = (repairer, &task)
        && !INTERRUPTED.load(Ordering::SeqCst)
    {
        r.run(sources, &INTERRUPTED, |report| {
            if io_error.is_none()
                && let Err(e) = reporter.file(&report)
            {
                io_error = Some(e);
            }
        });
    }

    reporter.summary.elapsed = start.elapsed();
    reporter.summary.interrupted = INTERRUPTED.load(Ordering::SeqCst);
    // From here on, a failure is trouble on top of what the files said (damage still wins),
    // not a usage error.
    let mut trouble: Option<anyhow::Error> = None;
    if let Some(e) = io_error {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            return Ok(reporter.summary.exit(verb));
        }
        trouble = Some(anyhow::Error::new(e).context("writing output"));
    }
    if let Some(stores) = &stores
        && !reporter.summary.interrupted
    {
        for done in done_rx.try_iter() {
            match done {
                Ok(stats) => protect_stats.add(stats),
                Err((dir, e)) => {
                    trouble = Some(anyhow::anyhow!("writing parity in {}: {e}", dir.display()));
                }
            }
        }
        for (dir, store) in stores {
            if let Err(e) = store.commit() {
                trouble = Some(anyhow::anyhow!("writing parity in {}: {e}", dir.display()));
            }
        }
        for path in &protect_stats.changed {
            eprintln!(
                "intact: warning: {}: changed while its parity was computed: no parity",
                intact::report::escape(path)
            );
            trouble.get_or_insert(anyhow::anyhow!("some files changed while being protected"));
        }
        if !output.quiet && !output.json {
            eprintln!(
                "protect: wrote {} PAR2 sets, {}",
                protect_stats.sets,
                intact::report::bytes(protect_stats.bytes)
            );
        }
    }
    if let Some(e) = archive_error {
        trouble = Some(anyhow::Error::new(e).context("writing the archive; nothing was left"));
    } else if let Some(w) = archiver
        && !reporter.summary.interrupted
    {
        let dest = w.dest().to_path_buf();
        match w.finish() {
            Ok(stats) if !output.quiet && !output.json => eprintln!(
                "archive: wrote {}: {} members, {} of data in {} compressed",
                intact::report::escape(&dest),
                stats.members,
                intact::report::bytes(stats.bytes),
                intact::report::bytes(stats.compressed),
            ),
            Ok(_) => {}
            Err(e) => {
                trouble = Some(anyhow::Error::new(e).context("finishing the archive"));
            }
        }
    }
    if let Some(listing) = listing
        && !reporter.summary.interrupted
        && trouble.is_none()
        && let Err(e) = listing.finish()
    {
        trouble = Some(anyhow::Error::new(e).context("writing the manifest"));
    }
    let mut exit = reporter.finish().unwrap_or_else(|e| {
        trouble.get_or_insert(anyhow::Error::new(e).context("writing output"));
        reporter.summary.exit(verb)
    });
    if let Some(e) = trouble {
        eprintln!("intact: error: {e:#}");
        exit = exit.merge(Exit::Trouble);
    }
    if bad_manifest_lines {
        exit = exit.merge(Exit::Trouble);
    }
    Ok(exit)
}

/// Where a tree's parity store is by default: in the tree (beside a file given as PATH).
fn store_dir(path: &Path) -> PathBuf {
    if path.is_dir() {
        path.join(parity::DEFAULT_DIR)
    } else {
        path.parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .join(parity::DEFAULT_DIR)
    }
}

/// One store per root: the one given, or each root's own.
fn open_stores(
    roots: &[PathBuf],
    given: Option<&Path>,
    redundancy: f64,
    threads: usize,
) -> anyhow::Result<Vec<(PathBuf, parity::Store)>> {
    roots
        .iter()
        .map(|root| {
            let dir = given.map_or_else(|| store_dir(root), Path::to_path_buf);
            // Names are relative to the root, or for a file to its directory.
            let base = if root.is_dir() {
                root.clone()
            } else {
                root.parent()
                    .filter(|p| !p.as_os_str().is_empty())
                    .unwrap_or(Path::new("."))
                    .to_path_buf()
            };
            let store = parity::Store::open(&dir, &base, redundancy, threads)
                .with_context(|| format!("opening the parity store {}", dir.display()))?;
            Ok((dir, store))
        })
        .collect()
}

/// Gives a verified file to its root's store; damaged, unreadable and skipped files get none.
/// Returns the set to compute, if the file completes one, with its store's index.
fn protect(
    stores: &[(PathBuf, parity::Store)],
    roots: &[PathBuf],
    report: &mut FileReport,
) -> Option<(usize, parity::Job)> {
    let (Some(digest), Some(size)) = (report.digest, report.size) else {
        return None;
    };
    if report.status.is_damage() || matches!(report.status, Status::Error | Status::Changed) {
        return None;
    }
    let i = roots.iter().position(|r| report.path.starts_with(r))?;
    // Names are relative to the root (a root that is a file: its own name).
    let name = match report.path.strip_prefix(&roots[i]) {
        Ok(rel) if !rel.as_os_str().is_empty() => rel.as_os_str(),
        _ => report.path.file_name().unwrap_or_default(),
    };
    let added = stores[i].1.add(parity::Protectee {
        path: report.path.clone(),
        name: name.as_bytes().to_vec(),
        size,
        digest,
    });
    if !matches!(added, parity::Added::Already) {
        // Said before the set is written: a failure to write it is reported at the end.
        report.action = Some(intact::engine::Action::Protected);
    }
    match added {
        parity::Added::Run(job) => Some((i, job)),
        _ => None,
    }
}

fn verbosity(output: &Output) -> Verbosity {
    if output.quiet {
        Verbosity::Quiet
    } else if output.verbose {
        Verbosity::Verbose
    } else {
        Verbosity::Normal
    }
}

/// `archive verify`: every member against its own tag, then the stream's checksums.
fn verify(path: &Path, output: &Output) -> anyhow::Result<Exit> {
    let out = std::io::BufWriter::new(std::io::stdout().lock());
    let mut reporter = Reporter::new(
        Verb::Verify,
        output.json,
        verbosity(output),
        out,
        std::io::stderr(),
    );
    let start = Instant::now();
    let mut io_error = None;
    let read = archive::read(path, |mut visit| {
        let report = archive::verify_member(&mut visit);
        match reporter.file(&report) {
            Ok(()) => std::ops::ControlFlow::Continue(()),
            Err(e) => {
                io_error = Some(e);
                std::ops::ControlFlow::Break(())
            }
        }
    });
    reporter.summary.elapsed = start.elapsed();
    let mut exit = reporter.finish().context("writing output")?;
    if let Some(e) = io_error
        && e.kind() != std::io::ErrorKind::BrokenPipe
    {
        return Err(e).context("writing output");
    }
    if let Err(e) = read {
        eprintln!("intact: error: {}: {e}", intact::report::escape(path));
        exit = exit.merge(if e.damaged {
            Exit::Damage
        } else {
            Exit::Trouble
        });
    }
    Ok(exit)
}

/// `archive list`: one line per member, like `tar -tv`, with the digest its tag holds.
fn list(path: &Path) -> anyhow::Result<Exit> {
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let mut io_error = None;
    let read = archive::read(path, |visit| {
        let m = visit.member;
        let digest = m
            .stored()
            .best()
            .map_or_else(|| "-".to_string(), |t| t.digest.to_string());
        let kind = match &m.kind {
            archive::Kind::File => '-',
            archive::Kind::Link(_) => 'h',
            archive::Kind::Symlink(_) => 'l',
            archive::Kind::Other => '?',
        };
        // humantime stops at the year 9999; later (or earlier than 1970) shows as seconds.
        let mtime = match m.mtime.sec {
            sec @ 0..=253_402_300_799 => humantime::format_rfc3339_seconds(
                std::time::UNIX_EPOCH + Duration::from_secs(sec as u64),
            )
            .to_string(),
            sec => format!("@{sec}"),
        };
        let target = match &m.kind {
            archive::Kind::Link(t) | archive::Kind::Symlink(t) => format!(
                " -> {}",
                intact::report::escape(Path::new(std::ffi::OsStr::from_bytes(t)))
            ),
            _ => String::new(),
        };
        let line = writeln!(
            out,
            "{kind}{} {}/{} {:>12} {mtime} {digest} {}{target}{}",
            mode_string(m.mode),
            m.uid,
            m.gid,
            m.size,
            intact::report::escape(&m.path()),
            m.damaged
                .as_ref()
                .map_or(String::new(), |v| format!("  [archived although {v}]"))
        );
        match line {
            Ok(()) => std::ops::ControlFlow::Continue(()),
            Err(e) => {
                io_error = Some(e);
                std::ops::ControlFlow::Break(())
            }
        }
    });
    out.flush().ok();
    if let Some(e) = io_error
        && e.kind() != std::io::ErrorKind::BrokenPipe
    {
        return Err(e).context("writing output");
    }
    match read {
        Ok(()) => Ok(Exit::Clean),
        Err(e) => {
            eprintln!("intact: error: {}: {e}", intact::report::escape(path));
            Ok(if e.damaged {
                Exit::Damage
            } else {
                Exit::Trouble
            })
        }
    }
}

/// `rwxr-xr-x` for permission bits.
fn mode_string(mode: u32) -> String {
    let mut s = String::with_capacity(9);
    for shift in [6, 3, 0] {
        let bits = mode >> shift;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    s
}

/// Where an export's manifest lines go.
enum Listing {
    Stdout(std::io::BufWriter<std::io::StdoutLock<'static>>),
    /// A temp file beside the destination, put in its place when complete.
    File {
        temp: intact::fs::atomic::Temp,
        dest: PathBuf,
        out: std::io::BufWriter<std::fs::File>,
    },
}

impl Listing {
    fn file(dest: &Path) -> anyhow::Result<Listing> {
        dest.file_name().context("--output needs a file name")?;
        let temp = intact::fs::atomic::Temp::beside(dest)
            .with_context(|| format!("creating a file beside {}", dest.display()))?;
        let out = std::io::BufWriter::new(temp.file().try_clone()?);
        Ok(Listing::File {
            temp,
            dest: dest.to_path_buf(),
            out,
        })
    }

    /// Lists a file whose tag still describes it: unchanged, or changed in size under the
    /// same mtime (the tag then holds the good data's digest, and the manifest should fail).
    fn add(&mut self, root: &Path, report: &FileReport) -> std::io::Result<()> {
        let (Some(tag), Status::Ok | Status::Corrupt) = (&report.tag, report.status) else {
            return Ok(());
        };
        let rel = match report.path.strip_prefix(root) {
            Ok(rel) if !rel.as_os_str().is_empty() => rel,
            _ => Path::new(report.path.file_name().unwrap_or(report.path.as_os_str())),
        };
        let line = manifest::format_line(&tag.digest, rel.as_os_str().as_bytes());
        match self {
            Listing::Stdout(out) => out.write_all(&line),
            Listing::File { out, .. } => out.write_all(&line),
        }
    }

    /// Flushes stdout, or puts the file in place; an unfinished file leaves nothing behind.
    fn finish(self) -> std::io::Result<()> {
        match self {
            Listing::Stdout(mut out) => out.flush(),
            Listing::File { temp, dest, out } => {
                out.into_inner().map_err(|e| e.into_error())?;
                temp.commit(dest.file_name().expect("checked when created"))
            }
        }
    }
}

/// Worker threads for the chosen speed. Spinning disks need no fewer: the engine lets one
/// worker at a time read from each of them, and the rest hash what is cached.
fn threads(common: &Common) -> usize {
    match (common.threads, common.speed) {
        (Some(n), _) => n as usize,
        (None, Speed::Background) => 1,
        (None, _) => std::thread::available_parallelism().map_or(1, |n| n.get()),
    }
}

/// A bar on stderr with throughput, ETA and the current file. The total is counted by a
/// metadata-only walk running alongside, so the bar starts at once and the ETA firms up.
fn progress_bar<'s>(
    s: &'s std::thread::Scope<'s, '_>,
    roots: &'s [PathBuf],
    walk_opts: &'s WalkOptions,
    progress: &'s Progress,
) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr_with_hz(10));
    bar.set_style(
        ProgressStyle::with_template(
            "{bytes:>10}/{total_bytes:10} {bytes_per_sec:>12} ETA {eta:>4}  {wide_msg}",
        )
        .expect("valid template"),
    );
    let counter = bar.clone();
    s.spawn(move || {
        let _ = walk::walk(roots, walk_opts, |entry| {
            if let Entry::File { size, .. } = entry {
                counter.inc_length(size);
            }
            if counter.is_finished() {
                std::ops::ControlFlow::Break(())
            } else {
                std::ops::ControlFlow::Continue(())
            }
        });
    });
    let ticker = bar.clone();
    s.spawn(move || {
        while !ticker.is_finished() {
            ticker.set_position(progress.bytes.load(Ordering::Relaxed));
            if let Ok(current) = progress.current.lock() {
                ticker.set_message(format!(
                    "{} files  {}",
                    progress.files.load(Ordering::Relaxed),
                    intact::report::escape(&current)
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    bar
}

fn generate(what: Generated) -> anyhow::Result<Exit> {
    let mut cmd = Cli::command();
    let mut out = std::io::stdout().lock();
    let shell = match what {
        Generated::Man => {
            clap_mangen::Man::new(cmd).render(&mut out)?;
            return Ok(Exit::Clean);
        }
        Generated::Bash => clap_complete::Shell::Bash,
        Generated::Zsh => clap_complete::Shell::Zsh,
        Generated::Fish => clap_complete::Shell::Fish,
        Generated::Elvish => clap_complete::Shell::Elvish,
        Generated::Powershell => clap_complete::Shell::PowerShell,
    };
    clap_complete::generate(shell, &mut cmd, "intact", &mut out);
    out.flush()?;
    Ok(Exit::Clean)
}
