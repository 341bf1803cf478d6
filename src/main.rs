//! The `intact` command: parses the command line into a [`Config`], runs the engine, shows
//! progress on a terminal, and maps the outcome to an exit code.

mod cli;

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{CommandFactory, Parser};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use cli::{AlgoArg, Cli, Command, Common, Generated, Speed};
use intact::digest::Algo;
use intact::engine::{self, Config, Progress, Verb};
use intact::report::{Exit, Reporter, Verbosity};
use intact::walk::{self, Entry, WalkOptions};

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

fn run(cli: Cli) -> anyhow::Result<Exit> {
    let (verb, common, algo, force, accept_corrupt) = match cli.command {
        Command::Tag {
            common,
            algo,
            force,
        } => (Verb::Tag, common, Some(algo), force, false),
        Command::Check { common } => (Verb::Check, common, None, false, false),
        Command::Update {
            common,
            algo,
            accept_corrupt,
        } => (Verb::Update, common, algo, false, accept_corrupt),
        Command::Strip { common } => (Verb::Strip, common, None, false, false),
        Command::Show { common } => (Verb::Show, common, None, false, false),
        Command::Generate { what } => return generate(what),
    };
    let config = Config {
        algo: algo.map(|a| match a {
            AlgoArg::Sha256 => Algo::Sha256,
            AlgoArg::Blake3 => Algo::Blake3,
        }),
        force,
        accept_corrupt,
        mtime_window_ns: common.mtime_window.unwrap_or(0),
        threads: threads(&common),
        drop_cache: common.speed == Speed::Background,
        gate_spinning: common.speed != Speed::Fast,
        walk: WalkOptions {
            one_file_system: common.one_file_system,
            excludes: common.exclude.clone(),
        },
        ..Config::new(verb)
    };
    walk::check_globs(&config.walk.excludes).context("bad --exclude pattern")?;
    if common.speed == Speed::Background {
        for e in intact::priority::background() {
            eprintln!("intact: warning: could not lower priority: {e}");
        }
    }
    ctrlc::set_handler(|| {
        // A second Ctrl-C means now: nothing half-written can be left (tags are one
        // atomic setxattr), so exiting at once is safe.
        if INTERRUPTED.swap(true, Ordering::SeqCst) {
            std::process::exit(Exit::Interrupted as i32);
        }
    })
    .context("installing the Ctrl-C handler")?;

    let verbosity = if common.quiet {
        Verbosity::Quiet
    } else if common.verbose {
        Verbosity::Verbose
    } else {
        Verbosity::Normal
    };
    let stdout = std::io::stdout().lock();
    let mut reporter = Reporter::new(
        verb,
        common.json,
        verbosity,
        std::io::BufWriter::new(stdout),
        std::io::stderr(),
    );
    let progress = Progress::default();
    let reads_data = matches!(verb, Verb::Tag | Verb::Check | Verb::Update);
    let show_bar =
        reads_data && !common.quiet && !common.no_progress && std::io::stderr().is_terminal();
    let start = Instant::now();
    let mut io_error = None;

    std::thread::scope(|s| -> anyhow::Result<()> {
        let bar = show_bar.then(|| progress_bar(s, &common.paths, &config.walk, &progress));
        let result = engine::run(&config, &common.paths, &INTERRUPTED, &progress, |report| {
            if io_error.is_some() {
                return;
            }
            let result = match &bar {
                Some(bar) if reporter.prints(&report) => bar.suspend(|| reporter.file(&report)),
                _ => reporter.file(&report),
            };
            if let Err(e) = result {
                // A closed pipe (`intact check | head`) ends the run like Ctrl-C.
                INTERRUPTED.store(true, Ordering::SeqCst);
                io_error = Some(e);
            }
        });
        if let Some(bar) = bar {
            bar.finish_and_clear();
        }
        result.context("walking")?;
        Ok(())
    })?;

    reporter.summary.elapsed = start.elapsed();
    reporter.summary.interrupted = INTERRUPTED.load(Ordering::SeqCst);
    if let Some(e) = io_error {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            return Ok(reporter.summary.exit(verb));
        }
        return Err(e).context("writing output");
    }
    Ok(reporter.finish()?)
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
            if let Entry::File(_, size) = entry {
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
