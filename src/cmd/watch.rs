//! `intact watch`: a service that tags what is written, seconds after, as `update` would.
//!
//! One loop: the kernel's events (fanotify or inotify, `intact::watch`) are gathered by
//! directory; the writes among them are recorded in the state database at once (a service
//! killed before it tagged what they wrote leaves the evidence for the next `check`); each
//! directory quiet for `--settle` becomes part of a run of `update` over just those parts of
//! the trees (the one loop every verb runs in, `drive`), which reads only files whose tag no
//! longer describes them or that were written. The writes it saw are forgotten once their
//! files are tagged. The owner is told what is new at most once a minute.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::cli::WatchArgs;
use crate::cli::settings::{Settings, algo, formats, usage};
use intact::engine::{Action, FileReport};
use intact::notify::{Findings, Problem};
use intact::report::Exit;
use intact::sink::{Failure, Out, Sink};
use intact::state::{self, State};
use intact::text::escape;
use intact::verb::Verb;
use intact::watch::{self, Pending, Seen};

/// The owner is told at most this often (what is found between waits for the next message).
const TELL_EVERY: Duration = Duration::from_secs(60);

pub fn run(a: WatchArgs) -> anyhow::Result<Exit> {
    // Events name directories by their real paths (fanotify), and the parts to look at are
    // found by those: the trees are taken by theirs.
    let mut roots = Vec::new();
    for p in &a.paths.paths {
        let real = std::fs::canonicalize(p).map_err(|e| usage(format!("{}: {e}", escape(p))))?;
        if !real.is_dir() {
            return Err(usage(format!(
                "{} is not a directory: watch watches trees",
                escape(p)
            )));
        }
        roots.push(real);
    }
    let mut s = Settings::new(Verb::Watch, roots.clone(), &a.common)?;
    s.config.algo = a.algo.map(algo);
    s.config.compat = formats(&a.compat.compat);
    s.config.changed_only = true;
    s.record(&a.state);
    s.notify(&a.notify)?;
    s.progress = false;
    let Some(db) = s.state.clone() else {
        return Err(usage(
            "watch keeps the writes it saw in the state database until it has tagged their \
             files: --no-state cannot be used with it",
        ));
    };
    let setup = s.notify.take();
    // Its runs step back for the machine (below); the loop keeps its priority: starved on
    // a busy machine it would record no write it saw and let the kernel's queue overflow
    // into looks at the whole trees.
    s.background = false;
    super::on_signals(true)?;
    let (mut events, fallback) =
        watch::open(&roots).map_err(|e| anyhow::anyhow!("cannot watch {}: {e}", list(&roots)))?;
    if let Some(why) = fallback {
        eprintln!("intact: note: {why}");
    }
    let how = events.describe();
    let (mut state, _) =
        State::open(&db).map_err(|e| anyhow::anyhow!("the state database {}: {e}", escape(&db)))?;
    let _claim = watch::claim(&db, &roots, &how)?;
    // Its folder exists now: a database kept inside a tree is never a file of it.
    s.config.walk.own.database(&db);
    eprintln!(
        "intact: watching {} ({how}); a file is tagged once its folder has not been written \
         for {}",
        list(&roots),
        humantime::format_duration(a.settle)
    );
    ready();
    let settle = a.settle;
    let mut pending = Pending::default();
    // First, what changed while no watch ran.
    pending.everything(&roots, Instant::now());
    let mut held = Findings::default();
    let mut told: Option<Instant> = None;
    let mut seen = Vec::new();
    let mut exit = Exit::Clean;
    // Each tree as it was when the watch began: one unmounted, removed or renamed is gone
    // (its path then leads elsewhere, or nowhere).
    let identity = |root: &PathBuf| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(root).ok().map(|m| (m.dev(), m.ino()))
    };
    let began: Vec<_> = roots.iter().map(identity).collect();
    while !super::STOP.load(Ordering::SeqCst) {
        if let Some(root) = roots
            .iter()
            .zip(&began)
            .find_map(|(r, was)| (identity(r) != *was).then_some(r))
        {
            let what = format!(
                "the watched tree {} is gone (unmounted, removed, or moved or renamed): the \
                 watch stopped; the unit starts it again once the tree is back",
                escape(root)
            );
            eprintln!("intact: error: {what}");
            held.push(Problem::Vanished { what });
            exit = Exit::Trouble;
            if let Some(setup) = &setup {
                for f in super::notify::tell(setup, &watched(&roots, &held, exit), Some(&mut state))
                {
                    eprintln!("intact: error: {f}");
                }
            }
            break;
        }
        let now = Instant::now();
        let timeout = pending
            .next_due(settle)
            .map_or(Duration::from_secs(1), |due| {
                due.saturating_duration_since(now)
            })
            .min(Duration::from_secs(1));
        if let Err(e) = events.wait(timeout, &mut seen) {
            held.push(Problem::Failure {
                what: format!("watching stopped: {e}"),
            });
            eprintln!("intact: error: watching stopped: {e}");
            exit = Exit::Trouble;
            break;
        }
        for problem in events.problems() {
            eprintln!("intact: error: {problem}");
            held.push(Problem::Failure { what: problem });
            exit = Exit::Trouble;
        }
        let now = Instant::now();
        let mut written = Vec::new();
        for event in seen.drain(..) {
            if let Seen::Written { dir, name } | Seen::Changed { dir, name } = &event {
                if watch::is_own(dir, name, Some(&db)) {
                    continue;
                }
                if matches!(event, Seen::Written { .. }) {
                    written.push(dir.join(name));
                }
            }
            pending.add(&event, &roots, now);
        }
        written.sort_unstable();
        written.dedup();
        state.saw_writes(written.iter().map(PathBuf::as_path), state::now());
        if let Some(failed) = state.failed.take() {
            eprintln!("intact: error: {failed}");
            held.push(Problem::Failure { what: failed });
            exit = Exit::Trouble;
        }
        if let Some(only) = pending.take_due(settle, now) {
            let mut batch = s.clone();
            batch.config.walk.only = Some(Arc::new(only));
            let started = state::now();
            let mut looked = Looked {
                tagged: Vec::new(),
                damaged: Vec::new(),
                events: &mut *events,
                seen: &mut seen,
            };
            // What a run finds is in the log and told to the owner; the service's own exit
            // code says whether it could watch. It runs on a thread of its own at low
            // priority (its readers inherit it): not the idle class of a background scrub,
            // which a machine that is never idle would never serve, and a file is to be
            // tagged seconds after it is written.
            let (_, found) = std::thread::scope(|scope| {
                scope
                    .spawn(|| {
                        for e in intact::fs::sys::lower_priority(intact::fs::sys::Gentle::Low) {
                            eprintln!("intact: warning: could not lower priority: {e}");
                        }
                        super::drive_for_findings(batch, &mut looked)
                    })
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })?;
            held.merge(&found);
            state.forget_writes(&looked.tagged, started);
        }
        if let Some(setup) = &setup
            && !held.is_clear()
            && told.is_none_or(|t| t.elapsed() >= TELL_EVERY)
        {
            let failed =
                super::notify::tell(setup, &watched(&roots, &held, exit), Some(&mut state));
            for f in &failed {
                eprintln!("intact: error: {f}");
            }
            if failed.is_empty() {
                held = Findings::default();
            }
            told = Some(Instant::now());
        }
    }
    eprintln!("intact: watch of {} stopped", list(&roots));
    Ok(exit)
}

/// What the watch tells: what is new in what it saw written (part of the trees).
fn watched<'a>(roots: &'a [PathBuf], held: &'a Findings, exit: Exit) -> super::notify::Run<'a> {
    super::notify::Run {
        verb: "watch",
        roots,
        findings: held,
        interrupted: false,
        exit,
        partial: true,
    }
}

fn list(roots: &[PathBuf]) -> String {
    roots
        .iter()
        .map(|r| escape(r))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Tells systemd the service is ready (`Type=notify`), where it asked.
fn ready() {
    let Some(socket) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    use std::os::unix::ffi::OsStrExt;
    let Ok(sock) = std::os::unix::net::UnixDatagram::unbound() else {
        return;
    };
    let bytes = socket.as_bytes();
    let sent = match bytes.strip_prefix(b"@") {
        // An abstract socket (Linux's own).
        #[cfg(target_os = "linux")]
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            std::os::unix::net::SocketAddr::from_abstract_name(name)
                .and_then(|addr| sock.send_to_addr(b"READY=1", &addr))
        }
        _ => sock.send_to(b"READY=1", std::path::Path::new(&socket)),
    };
    if let Err(e) = sent {
        eprintln!("intact: warning: could not tell systemd the service is ready: {e}");
    }
}

/// Hands the reports on, keeping the files whose tag now describes them (tagged, re-tagged,
/// or found to match): the writes seen to those are forgotten. Damage is held to the end of
/// the run: a file written while it was read (its write seen only now, in the events the
/// run leaves behind) is no damage found but a file to look at again, with its write known.
struct Looked<'e> {
    tagged: Vec<(u64, u64, PathBuf)>,
    damaged: Vec<FileReport>,
    events: &'e mut dyn watch::Events,
    /// Where the events read meanwhile go, for the loop to take in.
    seen: &'e mut Vec<Seen>,
}

impl Sink for Looked<'_> {
    fn take(&mut self, report: FileReport, out: &mut dyn Out) -> Result<(), Failure> {
        if report.status.is_damage() {
            self.damaged.push(report);
            return Ok(());
        }
        let described = matches!(
            report.action,
            Some(Action::Tagged | Action::Refreshed | Action::Accepted)
        ) || (report.action.is_none()
            && report.status == intact::core::classify::Status::Ok);
        if described && let Some((dev, ino)) = report.inode {
            self.tagged.push((dev, ino, report.path.clone()));
        }
        out.send(report);
        Ok(())
    }

    fn finish(&mut self, _interrupted: bool, out: &mut dyn Out) -> Result<(), Failure> {
        if self.damaged.is_empty() {
            return Ok(());
        }
        // The kernel queues an event as the write returns: one that raced the read is here.
        if let Err(e) = self.events.wait(Duration::ZERO, self.seen) {
            eprintln!("intact: error: reading events: {e}");
        }
        for report in self.damaged.drain(..) {
            let written = self
                .seen
                .iter()
                .any(|s| matches!(s, Seen::Written { dir, name } if dir.join(name) == report.path));
            if !written {
                out.send(report);
            }
        }
        Ok(())
    }
}
