//! intact's simulator (as TigerBeetle's VOPR and FoundationDB's simulation): seeded nights of
//! a file server's life on a real ext4 file system on a loop device, under a fake clock that
//! runs a day ahead each night (libfaketime). Each night brings churn and rot (see
//! `world.rs`), now and then the owner's repairs, and the shipped nightly unit's command with
//! every feature on (`scrub --update --protect`, a notification and a heartbeat to a receiver
//! on 127.0.0.1); after it the promise is checked against the simulator's own ground truth
//! (`sim.rs`): if intact says nothing, everything was verified; if something is wrong, a
//! person is told on every run until they deal with it.
//!
//! The seed fixes every operation and fault: a failure prints its seed and night, and the
//! same arguments replay it. `cargo test` runs it sized for CI (two new seeds each run,
//! printed); by hand (docs/reliability.md):
//!
//! ```text
//! cargo test --release --test sim -- --nights 200 --files 50000 --max-percent 5
//! cargo test --release --test sim -- --seed 1234 --nights 17 -v   # a failure, replayed
//! ```
//!
//! It needs root (a loop device), mkfs.ext4, libfaketime, apprise and curl: where they are
//! missing it says so and passes, except under `CI=true`, where that is a failure.

#![allow(unsafe_code)]

#[macro_use]
#[path = "../../src/testutil/skip.rs"]
mod skip;
#[macro_use]
#[path = "../it/common.rs"]
mod common;
#[path = "../it/receiver.rs"]
mod receiver;

mod disk;
mod faults;
mod night;
mod sim;
mod world;

use std::process::ExitCode;

use sim::Setup;

/// What the command line asks.
struct Args {
    seeds: Vec<u64>,
    setup: Setup,
}

impl Args {
    /// The arguments; `None` where a test filter (`cargo test NAME`) leaves the simulator out.
    fn parse() -> Result<Option<Args>, String> {
        let mut seeds = Vec::new();
        let mut runs = 2;
        let mut setup = Setup {
            nights: 30,
            files: 1000,
            max_percent: 20,
            owner_every: 10,
            rot: 40,
            verbose: false,
            keep: false,
        };
        let mut filtered = false;
        let mut args = std::env::args().skip(1);
        while let Some(a) = args.next() {
            let mut value = |name: &str| -> Result<u64, String> {
                args.next()
                    .and_then(|v| v.parse().ok())
                    .ok_or_else(|| format!("{name} wants a number"))
            };
            match a.as_str() {
                "--seed" => seeds.push(value("--seed")?),
                "--seeds" => runs = value("--seeds")?,
                "--nights" => setup.nights = value("--nights")? as u32,
                "--files" => setup.files = value("--files")? as usize,
                "--max-percent" => setup.max_percent = value("--max-percent")? as u32,
                "--owner-every" => setup.owner_every = value("--owner-every")? as u32,
                "--rot" => setup.rot = value("--rot")? as u32,
                "-v" | "--verbose" => setup.verbose = true,
                "--keep" => setup.keep = true,
                // What cargo test hands every test binary.
                a if a.starts_with('-') => {}
                filter => filtered |= !"simulator".contains(filter),
            }
        }
        if filtered {
            return Ok(None);
        }
        if seeds.is_empty() {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap();
            let base = now.as_nanos() as u64 ^ u64::from(std::process::id());
            seeds = (0..runs)
                .map(|i| fastrand::Rng::with_seed(base + i).u64(..))
                .collect();
        }
        Ok(Some(Args { seeds, setup }))
    }
}

/// Why the simulator cannot run here, if it cannot.
fn unsupported() -> Option<String> {
    if !common::is_root() {
        return Some("needs root (a loop device)".into());
    }
    for tool in [
        "losetup",
        "mkfs.ext4",
        "mount",
        "apprise",
        "curl",
        "restic",
        "par2",
    ] {
        if !common::has(tool) {
            return Some(format!("no {tool}"));
        }
    }
    let faketime = std::panic::catch_unwind(common::faketime);
    faketime.err().map(|_| "no libfaketime".into())
}

fn main() -> ExitCode {
    let args = match Args::parse() {
        Ok(Some(args)) => args,
        Ok(None) => return ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sim: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(why) = unsupported() {
        let skipped = || -> ExitCode {
            skip!(format!("simulator: {why}"), ExitCode::SUCCESS);
        };
        return skipped();
    }
    let s = &args.setup;
    for &seed in &args.seeds {
        eprintln!(
            "simulator: seed {seed}, {} nights, {} files, --max-percent {}",
            s.nights, s.files, s.max_percent
        );
        match sim::run(seed, s) {
            Ok(summary) => print!("{}", table(seed, s, &summary)),
            Err(failure) => {
                eprintln!("simulator: seed {seed} failed on {failure}");
                eprintln!(
                    "replay: cargo test --test sim -- --seed {seed} --nights {} --files {} \
                     --max-percent {} --owner-every {} --rot {} -v",
                    failure.night, s.files, s.max_percent, s.owner_every, s.rot
                );
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}

/// The invariants held and what was measured, as the long run's note quotes them.
fn table(seed: u64, s: &Setup, m: &sim::Summary) -> String {
    let (first, last, k, _) = sim::ends(&m.nights);
    let files = |i: usize| m.nights.get(i).map_or(0, |x| x.files);
    format!(
        "simulator: seed {seed}: {} nights held, {} -> {} files at --max-percent {}\n\
         | invariant | held |\n|---|---|\n\
         | every night with damage outstanding exits 1, every other 0 | yes |\n\
         | the message names every damaged file, no healthy one; all-clear once, heartbeat only when clean | yes ({} alarms, {} all-clears) |\n\
         | every rot found within a cycle and a night ({} nights) | yes: {} made, {} found, at most {} nights after |\n\
         | status lists exactly the damage outstanding | yes |\n\
         | no tag describes damaged bytes; every other file tagged with what it holds | yes |\n\
         | the owner's repairs | {} from parity, {} from the nightly restic backup, {} restored by hand, {} accepted |\n\
         | faults: runs killed or stopped mid-run, databases lost, databases damaged | {} / {} / {} |\n\
         | files gone at once: an alarm (exit 3) until brought back by repair --missing or confirmed | yes: {} brought back, {} confirmed |\n\
         | status's files removed are the files deleted (30 days) | yes (up to {} listed) |\n\
         | every set written verifies with par2cmdline | yes ({} sets) |\n\
         | sets within 1.25x a fresh protect's share of the data and of what changed since the monthly protect; moved aside within 1.1x what changed in 30 nights, two pack indexes a change | yes (at most {:.2} / {:.2} of the bound) |\n\
         | every file not damaged proven good within a cycle and two nights; no temp file left | yes |\n\
         | database bytes a file, first {k} nights / last {k} its database knew the whole tree (at most 1.25x over 40 nights or more) | {:.0} / {:.0} |\n\
         | peak RSS, mean of the first {k} nights / last {k} (at most 1.25x) | {:.1} / {:.1} MiB |\n\
         | seconds a night, first {k} nights / last {k} | {:.2} / {:.2} |\n",
        m.nights.len(),
        files(0),
        files(m.nights.len() - 1),
        s.max_percent,
        m.alarms,
        m.all_clears,
        sim::deadline(s),
        m.rot_made,
        m.rot_found,
        m.latest_find,
        m.repaired,
        m.from_backup,
        m.restored,
        m.accepted,
        m.kills,
        m.lost_dbs,
        m.broken_dbs,
        m.mass_restored,
        m.mass_confirmed,
        m.removed_said,
        m.sets_verified,
        m.worst_store,
        m.worst_stale,
        first.per_file,
        last.per_file,
        first.rss_mib,
        last.rss_mib,
        first.seconds,
        last.seconds,
    )
}
