//! The faults a night may bring, drawn by the seed: the nightly run killed (SIGKILL) or
//! stopped (SIGTERM, as systemd's timeout stops it) after its Nth file, the state database
//! deleted or overwritten with garbage (its damage journal kept), a folder deleted by
//! mistake (many files gone at once, which the owner then brings back or confirms).

use std::io::{BufRead, BufReader};
use std::path::Path;

/// What goes wrong tonight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The run gets `signal` after `after` files (of its `--json` stream), and the timer's
    /// next run follows.
    Kill { signal: i32, after: usize },
    /// The state database and its WAL are deleted (the journal stays).
    LostDb,
    /// The state database is overwritten with garbage (the journal stays).
    BrokenDb,
    /// A good share of the tree is deleted at once.
    MassDeletion,
}

/// Tonight's fault, if any: about one night in nine brings one.
pub fn draw(rng: &mut fastrand::Rng) -> Option<Fault> {
    match rng.u32(0..100) {
        0..5 => Some(Fault::Kill {
            signal: if rng.bool() {
                libc::SIGKILL
            } else {
                libc::SIGTERM
            },
            after: rng.usize(1..150),
        }),
        5..7 => Some(Fault::LostDb),
        7..9 => Some(Fault::BrokenDb),
        9..11 => Some(Fault::MassDeletion),
        _ => None,
    }
}

/// Runs the nightly command (`args`, with `--json -v` in place of `-q`, so that each file is
/// a line) `days` days on, and sends it `signal` once it has said `after` files. Whether the
/// signal came before the run ended, and its exit code (or -signal).
pub fn killed_run(
    args: &[String],
    days: u32,
    env: &[(&str, String)],
    signal: i32,
    after: usize,
) -> (bool, i32) {
    let args: Vec<&String> = args.iter().filter(|a| *a != "-q").collect();
    let mut c = crate::common::Cmd::new(&[])
        .args(args)
        .args(["--json", "-v"])
        .days_later(days);
    for (k, v) in env {
        c = c.env(k, v);
    }
    let mut child = c.command().spawn().unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    let (mut files, mut landed) = (0, false);
    for line in out.lines() {
        let Ok(line) = line else { break };
        if line.starts_with(r#"{"type":"file""#) {
            files += 1;
            if files == after && !landed {
                // SAFETY: kill(2) of our own child, not yet reaped.
                unsafe { libc::kill(child.id() as i32, signal) };
                landed = true;
            }
        }
    }
    let status = child.wait().unwrap();
    let code = status.code().unwrap_or(-1);
    (landed, code)
}

/// Leftovers a killed run may leave (temp files), which the next run must have removed.
pub fn leftovers(dir: &Path) -> Vec<std::path::PathBuf> {
    crate::common::leftovers(dir)
}
