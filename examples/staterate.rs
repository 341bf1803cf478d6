//! How fast the state database records verdicts, on one core and with nothing else running:
//! the bound it puts on a check of tiny files, whatever the number of hashing cores.
//!
//!     taskset -c 0 cargo run --release --example staterate -- [FILES] [PER_DIR]
//!
//! Three ways, each on a new database in a temp dir, each run twice over the same files (a
//! first check inserts, later ones update):
//! - `rows`: schema 3 as intact writes it, through [`intact::state::State`]: a row per file,
//!   upserted by the writer thread;
//! - `dirs, binary`: one row per directory, its files' entries packed in one value (name,
//!   inode, digest, size, times, verdict: about 70 bytes and the name), read, merged and
//!   written back once per directory touched;
//! - `dirs, JSON`: the same entries as a JSON array (what a `files` view through
//!   `json_each` would read).
//!
//! The verdicts are made up (the same for every file: verified now); the files need not
//! exist.

#![allow(unsafe_code)]

use std::path::{Path, PathBuf};

use intact::core::classify::Status;
use intact::core::digest::{Algo, Digest, digest_bytes};
use intact::core::tag::{Format, Tag};
use intact::engine::FileReport;
use intact::state::State;
use rusqlite::{Connection, params};

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("FILES and PER_DIR are numbers"))
        .collect();
    let files = args.first().copied().unwrap_or(200_000);
    let per_dir = args.get(1).copied().unwrap_or(200);
    let tmp = tempfile::tempdir().expect("a temp dir");
    println!("{files} files, {per_dir} a folder; files/s of one core, first run / second run");
    // What making the reports costs, taken off the others' figures.
    let cpu = cpu_seconds();
    for i in 0..files {
        std::hint::black_box(report(i, per_dir));
    }
    let making = cpu_seconds() - cpu;
    println!(
        "{:>14}: {:.2} us a file (taken off the figures below)",
        "the reports",
        making * 1e6 / files as f64
    );
    let rate = |name: &str, mut run: Box<dyn FnMut(i64)>| {
        let rates: Vec<f64> = (1..=2)
            .map(|n| {
                let cpu = cpu_seconds();
                run(n);
                files as f64 / (cpu_seconds() - cpu - making)
            })
            .collect();
        println!(
            "{name:>14}: {:>9.0} / {:>9.0} files/s ({:.2} / {:.2} us a file)",
            rates[0],
            rates[1],
            1e6 / rates[0],
            1e6 / rates[1]
        );
    };
    let db = tmp.path().join("rows.db");
    rate(
        "rows",
        Box::new(move |_| {
            let (mut state, _) = State::open(&db).expect("the database");
            state.begin_run("check", &[PathBuf::from("/bench")]);
            for i in 0..files {
                state.record(&report(i, per_dir));
            }
            state.end_run(files as u64, 0, 1.0, 0);
        }),
    );
    for (name, json) in [("dirs, binary", false), ("dirs, JSON", true)] {
        let conn = Connection::open(tmp.path().join(format!("{json}.db"))).expect("a database");
        conn.execute_batch(
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;
             CREATE TABLE dirs (path BLOB PRIMARY KEY, entries BLOB NOT NULL) WITHOUT ROWID;",
        )
        .expect("the table");
        rate(
            name,
            Box::new(move |run| dirs(&conn, files, per_dir, run, json)),
        );
    }
}

/// The report of file `i`: verified, with a digest of its own.
fn report(i: usize, per_dir: usize) -> FileReport {
    let digest = digest_bytes(Algo::Sha256, &i.to_le_bytes());
    let mut r = FileReport::new(
        PathBuf::from(format!("/bench/d{:05}/f{i:07}", i / per_dir)),
        Status::Ok,
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

/// A file's entry in its directory's value.
#[derive(serde::Serialize, serde::Deserialize)]
struct Entry {
    name: String,
    ino: u64,
    digest: Vec<u8>,
    size: u64,
    verified: i64,
    checked: i64,
    status: u8,
    seen: i64,
}

/// A check of `files` files as the packed design records it: the verdicts of a directory
/// gathered, its value read, merged and written back, in one transaction a second's worth
/// (here: all).
fn dirs(conn: &Connection, files: usize, per_dir: usize, run: i64, json: bool) {
    conn.execute_batch("BEGIN").expect("begin");
    let mut read = conn
        .prepare_cached("SELECT entries FROM dirs WHERE path = ?1")
        .expect("select");
    let mut write = conn
        .prepare_cached("INSERT OR REPLACE INTO dirs (path, entries) VALUES (?1, ?2)")
        .expect("insert");
    let mut i = 0;
    while i < files {
        let reports: Vec<FileReport> = (i..files.min(i + per_dir))
            .map(|i| report(i, per_dir))
            .collect();
        i += reports.len();
        let dir = reports[0].path.parent().expect("a folder").to_path_buf();
        let old: Option<Vec<u8>> = read.query_row(params![path_bytes(&dir)], |r| r.get(0)).ok();
        let mut entries: Vec<Entry> = match &old {
            Some(v) if json => serde_json::from_slice(v).expect("JSON entries"),
            Some(v) => decode(v),
            None => Vec::new(),
        };
        for r in &reports {
            let name = r.path.file_name().expect("a name").to_string_lossy();
            let digest = r.digest.as_ref().expect("a digest");
            let entry = Entry {
                name: name.into_owned(),
                ino: r.inode.expect("an inode").1,
                digest: key(digest),
                size: r.size.unwrap_or(0),
                verified: intact::state::now(),
                checked: intact::state::now(),
                status: 0,
                seen: run,
            };
            match entries.binary_search_by(|e| e.name.as_str().cmp(&entry.name)) {
                Ok(at) => entries[at] = entry,
                Err(at) => entries.insert(at, entry),
            }
        }
        let value = match json {
            true => serde_json::to_vec(&entries).expect("JSON"),
            false => encode(&entries),
        };
        write
            .execute(params![path_bytes(&dir), value])
            .expect("written");
    }
    conn.execute_batch("COMMIT").expect("commit");
}

fn path_bytes(p: &Path) -> &[u8] {
    use std::os::unix::ffi::OsStrExt;
    p.as_os_str().as_bytes()
}

fn key(d: &Digest) -> Vec<u8> {
    intact::state::digest_key(d)
}

/// Entries packed: each its name's length (u16) and name, then its fixed fields.
fn encode(entries: &[Entry]) -> Vec<u8> {
    let mut v = Vec::with_capacity(entries.len() * 96);
    for e in entries {
        v.extend_from_slice(&(e.name.len() as u16).to_le_bytes());
        v.extend_from_slice(e.name.as_bytes());
        v.extend_from_slice(&e.ino.to_le_bytes());
        v.push(e.digest.len() as u8);
        v.extend_from_slice(&e.digest);
        v.extend_from_slice(&e.size.to_le_bytes());
        v.extend_from_slice(&e.verified.to_le_bytes());
        v.extend_from_slice(&e.checked.to_le_bytes());
        v.push(e.status);
        v.extend_from_slice(&e.seen.to_le_bytes());
    }
    v
}

fn decode(v: &[u8]) -> Vec<Entry> {
    let mut entries = Vec::new();
    let mut rest = v;
    while !rest.is_empty() {
        let mut take = |n: usize| {
            let (a, b) = rest.split_at(n);
            rest = b;
            a
        };
        let len = u16::from_le_bytes(take(2).try_into().expect("2")) as usize;
        let name = String::from_utf8_lossy(take(len)).into_owned();
        let ino = u64::from_le_bytes(take(8).try_into().expect("8"));
        let dl = take(1)[0] as usize;
        let digest = take(dl).to_vec();
        let size = u64::from_le_bytes(take(8).try_into().expect("8"));
        let verified = i64::from_le_bytes(take(8).try_into().expect("8"));
        let checked = i64::from_le_bytes(take(8).try_into().expect("8"));
        let status = take(1)[0];
        let seen = i64::from_le_bytes(take(8).try_into().expect("8"));
        entries.push(Entry {
            name,
            ino,
            digest,
            size,
            verified,
            checked,
            status,
            seen,
        });
    }
    entries
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
