//! Other programs intact runs (backup tools, source commands, notification programs). Each
//! runs in a session of its own, with no controlling terminal (a tool that would prompt for a
//! passphrase on `/dev/tty` fails at once rather than wait for a person who is not there),
//! and is stopped together with every process it started when the run is interrupted or the
//! program stays silent too long: a program can fail, never hang a run or outlive it.

#![allow(unsafe_code)]

use std::io::{self, Read};
use std::os::fd::AsFd;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How often a wait looks at the run's cancel flag: Ctrl-C and SIGTERM end a child (and the
/// run) within this.
const TICK: Duration = Duration::from_millis(100);

/// Makes `cmd` start in a session of its own: no controlling terminal, and a process group
/// of its own that [`stop`] ends whole (ssh, `sh -c` pipelines and their children).
pub fn own_session(cmd: &mut Command) -> &mut Command {
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
pub fn stop(child: &mut Child) {
    kill_group(child);
    let _ = child.wait();
}

/// Kills what is left of `child`'s group (after it ended: what it started and left behind,
/// which may hold its pipes open). The group's id is not reused while any of it lives.
pub fn kill_group(child: &Child) {
    if let Some(pid) = rustix::process::Pid::from_raw(child.id() as i32) {
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
    }
}

/// What a child's output is read under: the run's cancel flag, and how long it may stay
/// silent.
#[derive(Clone, Copy)]
pub struct Watch<'a> {
    /// Set when the run is interrupted.
    pub cancel: &'a AtomicBool,
    /// How long the child may say nothing before it is given up on.
    pub silence: Duration,
}

/// A child's pipe, read under a [`Watch`]: a read that would wait past the silence allowed
/// fails with `TimedOut`, and one interrupted by the run with `Interrupted`. The caller stops
/// the child ([`stop`]) on either.
pub struct Watched<'a, R> {
    /// The pipe.
    pub pipe: R,
    /// What it is read under.
    pub watch: Watch<'a>,
    /// The program, for the errors.
    pub program: String,
}

impl<R: Read + AsFd> Read for Watched<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let start = Instant::now();
        loop {
            if self.watch.cancel.load(Ordering::Relaxed) {
                return Err(io::Error::new(
                    io::ErrorKind::Interrupted,
                    format!("{} was stopped: the run was interrupted", self.program),
                ));
            }
            let waited = start.elapsed();
            if waited >= self.watch.silence {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "{} said nothing for {} and was stopped (--source-timeout)",
                        self.program,
                        humantime::format_duration(self.watch.silence)
                    ),
                ));
            }
            let wait = TICK.min(self.watch.silence - waited);
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
    use std::process::Stdio;

    fn spawn(script: &str) -> Child {
        own_session(Command::new("sh").arg("-c").arg(script))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap()
    }

    /// `child`'s stdout, read under `cancel` and `silence`.
    fn watched<'a>(
        child: &mut Child,
        cancel: &'a AtomicBool,
        silence: Duration,
    ) -> Watched<'a, std::process::ChildStdout> {
        Watched {
            pipe: child.stdout.take().unwrap(),
            watch: Watch { cancel, silence },
            program: "sh".into(),
        }
    }

    #[test]
    fn a_silent_child_times_out_and_is_stopped_with_its_children() {
        let mut child = spawn("echo hi; sleep 30 & wait");
        let cancel = AtomicBool::new(false);
        let mut out = watched(&mut child, &cancel, Duration::from_millis(300));
        let mut got = Vec::new();
        let start = Instant::now();
        let e = out.read_to_end(&mut got).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
        assert!(e.to_string().contains("said nothing"), "{e}");
        assert_eq!(got, b"hi\n");
        assert!(start.elapsed() < Duration::from_secs(5));
        let group = child.id() as i32;
        assert!(running_in(group) >= 2, "sh and sleep");
        stop(&mut child);
        // The grandchild (sleep) went with it: nothing is left running in its group.
        let start = Instant::now();
        while running_in(group) > 0 && start.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(running_in(group), 0, "a process of the group still runs");
    }

    /// Processes of process group `group` that are not zombies (a killed grandchild waits
    /// for its new parent to reap it).
    fn running_in(group: i32) -> usize {
        std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("stat")).ok())
            .filter(|stat| {
                // After the command's name in parentheses: state, ppid, pgrp.
                let fields: Vec<&str> = stat
                    .rsplit_once(')')
                    .map_or(vec![], |(_, rest)| rest.split_whitespace().collect());
                fields.len() > 2 && fields[0] != "Z" && fields[2] == group.to_string()
            })
            .count()
    }

    #[test]
    fn a_cancelled_run_stops_reading_at_once() {
        let mut child = spawn("sleep 30");
        let cancel = AtomicBool::new(true);
        let mut out = watched(&mut child, &cancel, Duration::from_secs(60));
        let e = out.read(&mut [0; 8]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::Interrupted);
        stop(&mut child);
    }

    #[test]
    fn a_child_leads_a_session_of_its_own_so_it_has_no_terminal() {
        let child = spawn("cat /proc/self/stat");
        let id = child.id().to_string();
        let out = child.wait_with_output().unwrap();
        let stat = String::from_utf8(out.stdout).unwrap();
        // After the command's name: state, ppid, pgrp, session.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .unwrap()
            .1
            .split_whitespace()
            .collect();
        assert_eq!((fields[2], fields[3]), (id.as_str(), id.as_str()), "{stat}");
    }
}
