//! How fast the state database records verdicts, on one core and with nothing else running:
//! the bound it puts on a check of tiny files, whatever the number of hashing cores.
//!
//!     taskset -c 0 cargo run --release --example staterate -- [FILES] [PER_DIR]
//!
//! Through [`intact::state::State`] as a check records (the writer thread's CPU time
//! included), on a new database in a temp dir, three runs over the same files: the first
//! (every directory's value written anew), the second (every file proven good, unchanged:
//! a small row a directory), and a third where one file of each directory was touched (its
//! mtime moved: every directory's value rewritten).
//!
//! The verdicts are made up (verified now); the files need not exist.

#![allow(unsafe_code)]

use std::path::PathBuf;

use intact::core::classify::Status;
use intact::core::digest::{Algo, digest_bytes};
use intact::core::tag::{Format, Tag};
use intact::engine::FileReport;
use intact::state::State;

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("FILES and PER_DIR are numbers"))
        .collect();
    let files = args.first().copied().unwrap_or(200_000);
    let per_dir = args.get(1).copied().unwrap_or(200);
    let tmp = tempfile::tempdir().expect("a temp dir");
    println!("{files} files, {per_dir} a folder; files/s of one core");
    // What making the reports costs, taken off the others' figures.
    let cpu = cpu_seconds();
    for i in 0..files {
        std::hint::black_box(report(i, per_dir, false));
    }
    let making = cpu_seconds() - cpu;
    println!(
        "{:>22}: {:.2} us a file (taken off the figures below)",
        "the reports",
        making * 1e6 / files as f64
    );
    let db = tmp.path().join("state.db");
    for (name, touched) in [
        ("first record", false),
        ("all proven good", false),
        ("one touched a folder", true),
    ] {
        let cpu = cpu_seconds();
        let (mut state, _) = State::open(&db).expect("the database");
        state.begin_run("check", &[PathBuf::from("/bench")]);
        for i in 0..files {
            state.record(report(i, per_dir, touched));
        }
        state.end_run(files as u64, 0, 1.0, 0);
        drop(state);
        let rate = files as f64 / (cpu_seconds() - cpu - making);
        println!(
            "{name:>22}: {rate:>9.0} files/s ({:.2} us a file)",
            1e6 / rate
        );
    }
}

/// The report of file `i`: verified (`touched`: the first of each folder under a moved
/// mtime), with a digest of its own.
fn report(i: usize, per_dir: usize, touched: bool) -> FileReport {
    let digest = digest_bytes(Algo::Sha256, &i.to_le_bytes());
    let mut r = FileReport::new(
        PathBuf::from(format!("/bench/d{:05}/f{i:07}", i / per_dir)),
        match touched && i.is_multiple_of(per_dir) {
            true => Status::Touched,
            false => Status::Ok,
        },
    );
    (r.inode, r.size, r.digest) = (Some((1, 1000 + i as u64)), Some(4096), Some(digest));
    r.tag = Some(Tag {
        format: Format::Intact,
        digest,
        size: Some(4096),
        mtime: None,
        mtime_slack_ns: 0,
        tagged: None,
    });
    r
}

/// CPU seconds this process has used, every thread's (the state writer's among them).
fn cpu_seconds() -> f64 {
    // SAFETY: getrusage writes the struct it is given, which lives until it returns.
    let u = unsafe {
        let mut u = std::mem::zeroed::<libc::rusage>();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        u
    };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(u.ru_utime) + t(u.ru_stime)
}
