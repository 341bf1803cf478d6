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

use cli::{AlgoArg, Cli, Command, Common, CompatArg, Generated, Speed};
use intact::classify::Status;
use intact::digest::Algo;
use intact::engine::{self, Config, FileReport, Progress, Verb};
use intact::manifest::{self, Expected};
use intact::report::{Exit, Reporter, Verbosity};
use intact::tag::Format;
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

/// The command line turned into work: the engine's configuration, what to walk, and where
/// an export goes.
struct Job {
    config: Config,
    roots: Vec<PathBuf>,
    common: Common,
    export: Option<(PathBuf, Option<PathBuf>)>,
    bad_manifest_lines: bool,
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
    let (config, roots, common, export) = match cli.command {
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
            (config, paths.paths, common, None)
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
            (config, paths.paths, common, None)
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
            (config, paths.paths, common, None)
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
            (config, paths.paths, common, None)
        }
        Command::Show { paths, common } => (Config::new(Verb::Show), paths.paths, common, None),
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
            (config, vec![path.clone()], common, Some((path, output)))
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
            let roots = expected.listed().map(|(_, path)| path).collect();
            let config = Config {
                compat: compat(c),
                manifest: Some(expected),
                ..Config::new(Verb::Import)
            };
            (config, roots, common, None)
        }
        Command::Generate { what } => return generate(what).map(Err),
    };
    let config = Config {
        mtime_window_ns: common.mtime_window.unwrap_or(0),
        threads: threads(&common),
        drop_cache: common.speed == Speed::Background,
        gate_spinning: common.speed != Speed::Fast,
        walk: WalkOptions {
            one_file_system: common.one_file_system,
            excludes: common.exclude.clone(),
        },
        ..config
    };
    walk::check_globs(&config.walk.excludes).context("bad --exclude pattern")?;
    Ok(Ok(Job {
        config,
        roots,
        common,
        export,
        bad_manifest_lines: bad,
    }))
}

/// Reads and parses a manifest; lines it cannot read are warned about (and make the exit
/// code 3), the rest is used.
fn load_manifest(file: &Path, root: &Path, algo: Algo) -> anyhow::Result<(Arc<Expected>, bool)> {
    let data = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
    let parsed = manifest::parse(&data, algo);
    for bad in &parsed.bad {
        eprintln!("intact: warning: {}: {bad}", intact::report::escape(file));
    }
    Ok((
        Arc::new(Expected::new(root, &parsed)),
        !parsed.bad.is_empty(),
    ))
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
        export,
        bad_manifest_lines,
    } = job;
    let verb = config.verb;
    if common.speed == Speed::Background {
        for e in intact::sys::lowest_priority() {
            eprintln!("intact: warning: could not lower priority: {e}");
        }
    }
    ctrlc::set_handler(|| {
        // A second Ctrl-C means now: nothing half-written can be left (tags are one
        // atomic setxattr, an export goes to a temp file), so exiting at once is safe.
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
    // An export's manifest owns stdout (or a temp file renamed at the end); its per-file
    // lines then go to stderr.
    let mut listing = match &export {
        Some((_, Some(file))) => Some(Listing::file(file)?),
        Some((_, None)) => Some(Listing::Stdout(std::io::BufWriter::new(
            std::io::stdout().lock(),
        ))),
        None => None,
    };
    let out: Box<dyn Write> = match &export {
        Some(_) => Box::new(std::io::stderr()),
        None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
    };
    let mut reporter = Reporter::new(verb, common.json, verbosity, out, std::io::stderr());
    let progress = Progress::default();
    let show_bar = verb.reads_data()
        && !common.quiet
        && !common.no_progress
        && std::io::stderr().is_terminal();
    let start = Instant::now();
    let mut io_error = None;

    std::thread::scope(|s| -> anyhow::Result<()> {
        let bar = show_bar.then(|| progress_bar(s, &roots, &config.walk, &progress));
        let result = engine::run(&config, &roots, &INTERRUPTED, &progress, |report| {
            if io_error.is_some() {
                return;
            }
            let mut result = match &bar {
                Some(bar) if reporter.prints(&report) => bar.suspend(|| reporter.file(&report)),
                _ => reporter.file(&report),
            };
            if let (Some(listing), Some((root, _))) = (&mut listing, &export) {
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
        result.context("walking")?;
        Ok(())
    })?;

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

/// Where an export's manifest lines go.
enum Listing {
    Stdout(std::io::BufWriter<std::io::StdoutLock<'static>>),
    /// A temp file beside the destination, renamed over it when complete.
    File {
        temp: PathBuf,
        dest: PathBuf,
        out: Option<std::io::BufWriter<std::fs::File>>,
    },
}

impl Listing {
    fn file(dest: &Path) -> anyhow::Result<Listing> {
        let mut name = dest
            .file_name()
            .context("--output needs a file name")?
            .to_os_string();
        name.push(format!(".intact-{}.tmp", std::process::id()));
        let temp = dest.with_file_name(name);
        let out =
            std::fs::File::create(&temp).with_context(|| format!("creating {}", temp.display()))?;
        Ok(Listing::File {
            temp,
            dest: dest.to_path_buf(),
            out: Some(std::io::BufWriter::new(out)),
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
            Listing::File { out, .. } => {
                out.as_mut().expect("open until finished").write_all(&line)
            }
        }
    }

    fn finish(mut self) -> std::io::Result<()> {
        match &mut self {
            Listing::Stdout(out) => out.flush(),
            Listing::File { temp, dest, out } => {
                let out = out.take().expect("open until finished");
                let file = out.into_inner().map_err(|e| e.into_error())?;
                file.sync_all()?;
                std::fs::rename(&*temp, &*dest)?;
                temp.clear();
                Ok(())
            }
        }
    }
}

impl Drop for Listing {
    fn drop(&mut self) {
        // An unfinished export leaves nothing behind (after a rename the temp is gone).
        if let Listing::File { temp, .. } = self
            && !temp.as_os_str().is_empty()
        {
            let _ = std::fs::remove_file(temp);
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
