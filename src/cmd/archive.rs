//! `archive create`, `verify` and `list`: redundant copies that carry their tags.

use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::cli::settings::{Settings, algo, verbosity};
use crate::cli::{CreateArgs, ListArgs, VerifyArgs};
use intact::archive;
use intact::report::{Exit, Reporter};
use intact::text::escape;
use intact::verb::Verb;

pub fn create(a: CreateArgs) -> anyhow::Result<Exit> {
    let mut s = Settings::new(Verb::Archive, a.paths.paths, &a.common)?;
    s.config.algo = a.algo.map(algo);
    // --untagged: the files are left untouched, tags and leftovers alike.
    s.changes_files(!a.untagged);
    // The archive reads every file.
    s.config.sink_verifies = Some(intact::engine::SinkReads {
        reads: std::sync::Arc::new(|_, _| true),
        takes_open: true,
    });
    s.record(&a.state);
    let opts = archive::Options {
        level: a.level,
        threads: a.compress_threads.unwrap_or(s.config.threads as u32),
        include_damaged: a.include_damaged,
        mtime_window_ns: s.config.mtime_window_ns,
    };
    crate::cli::settings::output(&a.dest, "the archive")?;
    let mut writer = archive::Writer::create(&a.dest, &s.roots, opts)
        .with_context(|| format!("creating {}", escape(&a.dest)))?;
    for stale in std::mem::take(&mut writer.removed) {
        super::removed(&stale);
    }
    super::drive(s, &mut writer)
}

/// `archive verify`: every member against its own tag, then the stream's checksums.
pub fn verify(a: VerifyArgs) -> anyhow::Result<Exit> {
    let (path, output) = (a.archive.as_path(), &a.output);
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
    let read = archive::read(
        path,
        intact::fs::sys::cores(),
        archive::verify_member,
        |report| match reporter.file(&report) {
            Ok(()) => std::ops::ControlFlow::Continue(()),
            Err(e) => {
                io_error = Some(e);
                std::ops::ControlFlow::Break(())
            }
        },
    );
    reporter.summary.elapsed = start.elapsed();
    // The summary states the exit code, the archive's own damage included.
    match read {
        Err(e) if e.damaged => reporter.summary.damage(format!("{}: {e}", escape(path))),
        Err(e) => reporter.summary.fail(format!("{}: {e}", escape(path))),
        Ok(()) => {}
    }
    if let Some(e) = io_error {
        // Cut short: the members after it were not verified.
        reporter.summary.interrupted = true;
        return super::output_failed(e, reporter.summary.exit(Verb::Verify));
    }
    let done = reporter.finish();
    done.or_else(|e| super::output_failed(e, reporter.summary.exit(Verb::Verify)))
}

/// `archive list`: one line per member, like `tar -tv`, with the digest its tag holds.
pub fn list(a: ListArgs) -> anyhow::Result<Exit> {
    let path = a.archive.as_path();
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let mut io_error = None;
    let read = archive::read(path, intact::fs::sys::cores(), line, |line| {
        match out.write_all(line.as_bytes()) {
            Ok(()) => std::ops::ControlFlow::Continue(()),
            Err(e) => {
                io_error = Some(e);
                std::ops::ControlFlow::Break(())
            }
        }
    });
    let exit = match read {
        Ok(()) => Exit::Clean,
        Err(e) => {
            eprintln!("intact: error: {}: {e}", escape(path));
            if e.damaged {
                Exit::Damage
            } else {
                Exit::Trouble
            }
        }
    };
    match io_error.or_else(|| out.flush().err()) {
        Some(e) => super::output_failed(e, exit),
        None => Ok(exit),
    }
}

/// A member's line in `archive list`.
fn line(visit: &mut archive::Visit<'_, '_>) -> String {
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
        archive::Kind::Link(t) | archive::Kind::Symlink(t) => {
            format!(" -> {}", escape(Path::new(std::ffi::OsStr::from_bytes(t))))
        }
        _ => String::new(),
    };
    format!(
        "{kind}{} {}/{} {:>12} {mtime} {digest} {}{target}{}\n",
        mode_string(m.mode),
        m.uid,
        m.gid,
        m.size,
        escape(&m.path()),
        m.damaged
            .as_ref()
            .map_or(String::new(), |v| format!("  [archived although {v}]"))
    )
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
