//! The one way intact runs another program: backup tools (restic, borg), `--from-command`'s
//! shell, and the notification programs (apprise, sendmail, curl). Each runs in a session of
//! its own, with no controlling terminal (a tool that would prompt for a passphrase on
//! `/dev/tty` fails at once rather than wait for a person who is not there) and nothing to
//! read but what intact gives it, and is stopped together with every process it started when
//! the run is interrupted, the program stays silent too long, or its time is up: a program
//! can fail, never hang a run or outlive it.
//!
//! Secrets never go in argv (`ps` shows argv to every user): callers pass repositories and
//! URLs in the child's environment or on its standard input. What a program says when it
//! fails is kept bounded, put on one line and stripped of URL passwords here, once, before
//! it reaches an error line, a report or a message to an outside service.

#![allow(unsafe_code)]

use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How often a wait looks at the run's cancel flag: Ctrl-C and SIGTERM end a child (and the
/// run) within this.
const TICK: Duration = Duration::from_millis(100);
/// What is kept of a program's standard error: its beginning (restic's `Fatal:`) and its end
/// (where apprise and curl say why).
const SAID: usize = 64 * 1024;
/// Characters of it that an error line carries.
const SAID_LINE: usize = 300;

/// What a program runs under.
#[derive(Clone, Copy)]
pub struct Watch<'a> {
    /// Set when the run is interrupted.
    pub cancel: &'a AtomicBool,
    /// How long it may say nothing before it is given up on (a hung ssh, a repository on a
    /// failing disk): a backup tool that streams for an hour is fine while it streams.
    pub silence: Duration,
    /// How long it may run in all, if that is bounded.
    pub within: Option<Duration>,
}

impl<'a> Watch<'a> {
    /// Stopped when the run is interrupted or it says nothing for `silence`.
    pub fn quiet_for(cancel: &'a AtomicBool, silence: Duration) -> Self {
        Watch {
            cancel,
            silence,
            within: None,
        }
    }
}

impl Watch<'static> {
    /// Stopped once `time` has passed, whatever it says, and only then: a message about an
    /// interrupted run is still sent.
    pub fn within(time: Duration) -> Self {
        static NEVER: AtomicBool = AtomicBool::new(false);
        Watch {
            cancel: &NEVER,
            silence: time,
            within: Some(time),
        }
    }
}

/// Why intact stopped a program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// The run was interrupted.
    Interrupted,
    /// It said nothing for this long.
    Silent(Duration),
    /// It had not finished when this time was up.
    Late(Duration),
}

/// Why a program did not do its part.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// It is not installed.
    #[error("{program} is not installed (no `{program}` on PATH)")]
    Missing {
        /// Which.
        program: String,
    },
    /// It could not be started.
    #[error("cannot run {program}: {source}")]
    Start {
        /// Which.
        program: String,
        /// Why.
        source: io::Error,
    },
    /// intact stopped it.
    #[error("{program} {}", match .why {
        Stop::Interrupted => "was stopped: the run was interrupted".to_string(),
        Stop::Silent(d) => format!("said nothing for {} and was stopped", humantime::format_duration(*d)),
        Stop::Late(d) => format!("did not finish within {} and was stopped", humantime::format_duration(*d)),
    })]
    Stopped {
        /// Which.
        program: String,
        /// Why.
        why: Stop,
    },
    /// What it printed could not be read, or not as what it should print.
    #[error("{program}: {source}")]
    Output {
        /// Which.
        program: String,
        /// Why.
        source: io::Error,
    },
    /// It ended with an exit status that means failure.
    #[error("{program} failed ({status}){}", if .said.is_empty() { String::new() } else { format!(": {said}") })]
    Failed {
        /// Which.
        program: String,
        /// How it ended.
        status: ExitStatus,
        /// What it said on standard error, on one line, short, without passwords.
        said: String,
    },
}

impl Error {
    /// The program it is about.
    pub fn program(&self) -> &str {
        match self {
            Error::Missing { program }
            | Error::Start { program, .. }
            | Error::Stopped { program, .. }
            | Error::Output { program, .. }
            | Error::Failed { program, .. } => program,
        }
    }
}

/// Runs `cmd` with `input` on its standard input, `consume` reading what it prints (an error
/// there stops it), under `watch`; it succeeds if it ends with one of the exit codes `ok`.
/// The child and every process it started are gone when this returns.
pub fn run(
    cmd: &mut Command,
    watch: Watch<'_>,
    input: &[u8],
    ok: &[i32],
    consume: &mut dyn FnMut(&mut dyn Read) -> io::Result<()>,
) -> Result<(), Error> {
    let program = Path::new(cmd.get_program())
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let mut child = own_session(cmd)
        .stdin(if input.is_empty() {
            Stdio::null()
        } else {
            Stdio::piped()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| match source.kind() {
            io::ErrorKind::NotFound => Error::Missing {
                program: program.clone(),
            },
            _ => Error::Start {
                program: program.clone(),
                source,
            },
        })?;
    let started = Instant::now();
    // Written and read by threads of their own: a child that reads nothing, or fills its
    // stderr, cannot block the reading of its output or the wait for its end.
    if let Some(mut stdin) = child.stdin.take() {
        let input = input.to_vec();
        std::thread::spawn(move || stdin.write_all(&input));
    }
    let (said_tx, said_rx) = crossbeam_channel::bounded(1);
    let mut stderr = child.stderr.take().expect("piped");
    std::thread::spawn(move || {
        let _ = said_tx.send(said(&mut stderr));
    });
    let mut out = Watched {
        pipe: child.stdout.take().expect("piped"),
        watch,
        started,
        stopped: None,
    };
    let fed = consume(&mut out);
    let stopped = out.stopped;
    drop(out);
    let halt = |child: &mut Child, why| {
        stop(child);
        Error::Stopped {
            program: program.clone(),
            why,
        }
    };
    if let Err(source) = fed {
        return Err(match stopped {
            Some(why) => halt(&mut child, why),
            None => {
                stop(&mut child);
                Error::Output {
                    program: program.clone(),
                    source,
                }
            }
        });
    }
    // Done printing: it has the silence allowed to end (a child that closed its output and
    // went on would hang the run).
    let done = Instant::now();
    let mut nap = Duration::from_millis(1);
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) => {}
            Err(source) => {
                stop(&mut child);
                return Err(Error::Start {
                    program: program.clone(),
                    source,
                });
            }
        }
        if let Some(why) = watch.over(started, done) {
            return Err(halt(&mut child, why));
        }
        std::thread::sleep(nap);
        nap = (nap * 2).min(TICK);
    };
    // What it left running goes with it (and lets go of its stderr).
    kill_group(&child);
    if status.code().is_some_and(|c| ok.contains(&c)) {
        return Ok(());
    }
    // What it said, if it said it before long (a process outside its group may hold stderr).
    let said = said_rx
        .recv_timeout(Duration::from_secs(1))
        .map(|b| one_line(&b))
        .unwrap_or_default();
    Err(Error::Failed {
        program,
        status,
        said,
    })
}

/// Runs `cmd` under `watch` and gives what it prints.
pub fn output(cmd: &mut Command, watch: Watch<'_>) -> Result<Vec<u8>, Error> {
    let mut all = Vec::new();
    run(cmd, watch, &[], &[0], &mut |out| {
        out.read_to_end(&mut all).map(|_| ())
    })?;
    Ok(all)
}

/// What `pipe` says, read to its end (a program never blocks on a full pipe): its first and
/// its last [`SAID`] / 2 bytes, where tools say what failed and why.
fn said(pipe: &mut impl Read) -> Vec<u8> {
    let (mut head, mut tail, mut dropped) = (Vec::new(), Vec::new(), false);
    let mut buf = [0u8; 8192];
    loop {
        let n = match pipe.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        let room = (SAID / 2).saturating_sub(head.len()).min(n);
        head.extend_from_slice(&buf[..room]);
        tail.extend_from_slice(&buf[room..n]);
        if tail.len() > SAID {
            tail.drain(..tail.len() - SAID / 2);
            dropped = true;
        }
    }
    if dropped {
        head.extend_from_slice(" …\n".as_bytes());
    }
    head.extend_from_slice(&tail);
    head
}

/// What a program said, on one line of at most [`SAID_LINE`] characters (its beginning and
/// its end, where tools say what and why), control characters and URL passwords taken out.
pub fn one_line(said: &[u8]) -> String {
    let text = String::from_utf8_lossy(said);
    let line = text
        .lines()
        .map(|l| l.trim())
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" / ");
    let line: String = crate::text::redact(&line)
        .chars()
        .filter(|c| !c.is_control())
        .collect();
    let count = line.chars().count();
    if count <= SAID_LINE {
        return line;
    }
    let half = SAID_LINE / 2;
    let head: String = line.chars().take(half).collect();
    let end: String = line.chars().skip(count - half).collect();
    format!("{head} … {end}")
}

/// Whether the shell command `line` runs ssh: as its first word or after `env`, `nice`,
/// `timeout`, a path, a pipe or `&&` (any word that is `ssh` or ends in `/ssh`). ssh hands
/// its arguments to a shell on the other host, which parses them again.
pub fn runs_ssh(line: &str) -> bool {
    line.split(|c: char| c.is_whitespace() || ";|&()`".contains(c))
        .map(|w| w.trim_matches(['\'', '"']))
        .any(|w| w == "ssh" || w.ends_with("/ssh"))
}

/// Makes `cmd` start in a session of its own: no controlling terminal, and a process group
/// of its own that [`stop`] ends whole (ssh, `sh -c` pipelines and their children).
fn own_session(cmd: &mut Command) -> &mut Command {
    // SAFETY: setsid is async-signal-safe, and the closure touches nothing of the parent's
    // memory: allowed between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            rustix::process::setsid()
                .map(|_| ())
                .map_err(io::Error::from)
        })
    }
}

/// Kills `child` and every process of its session's group, then reaps it.
fn stop(child: &mut Child) {
    kill_group(child);
    let _ = child.wait();
}

/// Kills what is left of `child`'s group (after it ended: what it started and left behind,
/// which may hold its pipes open). The group's id is not reused while any of it lives.
fn kill_group(child: &Child) {
    if let Some(pid) = rustix::process::Pid::from_raw(child.id() as i32) {
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
    }
}

impl Watch<'_> {
    /// Why a program started at `started`, silent since `quiet`, is to be stopped now, if it
    /// is.
    fn over(&self, started: Instant, quiet: Instant) -> Option<Stop> {
        if self.cancel.load(Ordering::Relaxed) {
            Some(Stop::Interrupted)
        } else if self.within.is_some_and(|w| started.elapsed() >= w) {
            self.within.map(Stop::Late)
        } else if quiet.elapsed() >= self.silence {
            Some(Stop::Silent(self.silence))
        } else {
            None
        }
    }

    /// How long a wait may last before [`Watch::over`] is asked again.
    fn next_look(&self, started: Instant, quiet: Instant) -> Duration {
        let left = |limit: Duration, since: Instant| limit.saturating_sub(since.elapsed());
        let mut wait = TICK.min(left(self.silence, quiet));
        if let Some(w) = self.within {
            wait = wait.min(left(w, started));
        }
        wait
    }
}

/// A child's output, read under a [`Watch`]: a read that would wait past what it allows
/// fails (`TimedOut`, `Interrupted`), and remembers why, so that [`run`] says so.
struct Watched<'a, R> {
    pipe: R,
    watch: Watch<'a>,
    started: Instant,
    stopped: Option<Stop>,
}

impl<R: Read + AsFd> Read for Watched<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let quiet = Instant::now();
        loop {
            if let Some(why) = self.watch.over(self.started, quiet) {
                self.stopped = Some(why);
                // Not `Interrupted`: readers such as `read_to_end` would retry it forever.
                return Err(io::Error::new(io::ErrorKind::TimedOut, "stopped"));
            }
            let wait = self.watch.next_look(self.started, quiet);
            let mut fds = [rustix::event::PollFd::new(
                &self.pipe,
                rustix::event::PollFlags::IN,
            )];
            let timeout = rustix::event::Timespec::try_from(wait).ok();
            match rustix::event::poll(&mut fds, timeout.as_ref()) {
                // Readable, at its end, or broken: the read says which.
                Ok(n) if n > 0 => match self.pipe.read(buf) {
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    done => return done,
                },
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Command {
        let mut c = Command::new("sh");
        c.arg("-c").arg(script);
        c
    }

    #[test]
    fn a_silent_child_is_stopped_with_its_children() {
        let cancel = AtomicBool::new(false);
        let watch = Watch::quiet_for(&cancel, Duration::from_millis(300));
        let pidfile = tempfile::NamedTempFile::new().unwrap();
        let script = format!(
            "echo hi; sleep 30 & echo $! > {}; wait",
            pidfile.path().display()
        );
        let mut got = Vec::new();
        let start = Instant::now();
        let e = run(&mut sh(&script), watch, &[], &[0], &mut |out| {
            out.read_to_end(&mut got).map(|_| ())
        })
        .unwrap_err();
        assert!(
            matches!(
                e,
                Error::Stopped {
                    why: Stop::Silent(_),
                    ..
                }
            ),
            "{e}"
        );
        assert_eq!(e.to_string(), "sh said nothing for 300ms and was stopped");
        assert_eq!(got, b"hi\n");
        assert!(start.elapsed() < Duration::from_secs(5));
        // The grandchild (sleep) went with it.
        let pid: i32 = std::fs::read_to_string(pidfile.path())
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(gone(pid), "sleep {pid} still runs");
    }

    /// Whether process `pid` is gone (or a zombie waiting for its new parent to reap it),
    /// within a few seconds.
    fn gone(pid: i32) -> bool {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(5) {
            match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
                Err(_) => return true,
                Ok(stat)
                    if stat
                        .rsplit_once(')')
                        .is_some_and(|(_, r)| r.trim_start().starts_with('Z')) =>
                {
                    return true;
                }
                Ok(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        false
    }

    #[test]
    fn a_child_that_talks_on_and_on_is_stopped_when_its_time_is_up() {
        let start = Instant::now();
        let late = |script: &str, ms: u64| {
            let e = run(
                &mut sh(script),
                Watch::within(Duration::from_millis(ms)),
                &[],
                &[0],
                &mut |out| io::copy(out, &mut io::sink()).map(|_| ()),
            )
            .unwrap_err();
            let stopped = matches!(
                e,
                Error::Stopped {
                    why: Stop::Late(_),
                    ..
                }
            );
            assert!(stopped, "{e}");
            e
        };
        let e = late("yes", 500);
        assert!(e.to_string().contains("did not finish within 500ms"), "{e}");
        assert!(start.elapsed() < Duration::from_secs(5));
        // Done printing but not ending: the same.
        late("exec >&-; sleep 30", 300);
    }

    #[test]
    fn a_cancelled_run_stops_its_child_at_once() {
        let cancel = AtomicBool::new(true);
        let start = Instant::now();
        let e = output(
            &mut sh("sleep 30"),
            Watch::quiet_for(&cancel, Duration::from_secs(60)),
        )
        .unwrap_err();
        assert_eq!(e.to_string(), "sh was stopped: the run was interrupted");
        assert!(start.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn input_goes_in_and_a_failure_says_why_on_one_line_without_passwords() {
        let cancel = AtomicBool::new(false);
        let watch = Watch::quiet_for(&cancel, Duration::from_secs(30));
        let out = run(
            &mut sh("tr a-z A-Z"),
            watch,
            b"secret\n",
            &[0],
            &mut |out| {
                let mut s = String::new();
                out.read_to_string(&mut s)?;
                assert_eq!(s, "SECRET\n");
                Ok(())
            },
        );
        assert!(out.is_ok());
        let e = output(
            &mut sh(
                "echo 'Fatal: rest:https://u:pw@host/r' >&2; printf '\\033]0;x\\007second\\n' >&2; exit 3",
            ),
            watch,
        )
        .unwrap_err();
        let Error::Failed { status, said, .. } = &e else {
            panic!("{e}")
        };
        assert_eq!(status.code(), Some(3));
        assert_eq!(said, "Fatal: rest:https://u:***@host/r / ]0;xsecond");
        // Long complaints keep their beginning and their end.
        let e = output(
            &mut sh("echo begin >&2; yes middle | head -n 20000 >&2; echo end >&2; exit 1"),
            watch,
        )
        .unwrap_err();
        let said = e.to_string();
        assert!(
            said.contains(": begin / middle") && said.ends_with("middle / end"),
            "{said}"
        );
        assert!(said.chars().count() < 400, "{said}");
        // Exit codes the caller takes for success.
        assert!(run(&mut sh("exit 1"), watch, &[], &[0, 1], &mut |_| Ok(())).is_ok());
        assert!(matches!(
            output(&mut Command::new("/nonexistent/tool"), watch),
            Err(Error::Missing { program }) if program == "tool"
        ));
    }

    #[test]
    fn a_child_leads_a_session_of_its_own_so_it_has_no_terminal() {
        let cancel = AtomicBool::new(false);
        let out = output(
            &mut sh("echo $$; cat /proc/self/stat"),
            Watch::quiet_for(&cancel, Duration::from_secs(30)),
        )
        .unwrap();
        let out = String::from_utf8(out).unwrap();
        let (shell, stat) = out.split_once('\n').unwrap();
        // After the command's name: state, ppid, pgrp, session (cat is the shell's child).
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .unwrap()
            .1
            .split_whitespace()
            .collect();
        assert_eq!((fields[2], fields[3]), (shell, shell), "{stat}");
        assert_eq!(fields[4], "0", "a controlling terminal: {stat}");
    }

    #[test]
    fn ssh_is_found_wherever_it_is_the_program_run() {
        for line in [
            "ssh nas cat",
            "/usr/bin/ssh nas cat",
            "timeout 60 ssh nas cat",
            "env LC_ALL=C ssh nas cat",
            "nice -n 19 ssh nas cat",
            "cd /srv && ssh nas cat",
            "x | 'ssh' nas",
        ] {
            assert!(runs_ssh(line), "{line}");
        }
        for line in ["cat /srv/file", "sshfs-cat x", "rclone cat remote:ssh/x"] {
            assert!(!runs_ssh(line), "{line}");
        }
    }
}
