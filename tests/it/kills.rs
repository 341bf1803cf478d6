//! Kills: SIGKILL or SIGTERM at any instant leaves every file either its old bytes (still
//! reported as damaged where it was) or its verified new bytes, never a half-written archive
//! or parity set under its name; and the next run removes what the killed one left behind.

#![allow(unsafe_code)]

use std::fs;
use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use crate::common::*;

fn signal(child: &Child, sig: i32) {
    // SAFETY: kill(2) of our own unreaped child.
    unsafe { libc::kill(child.id() as i32, sig) };
}

/// Waits for `child`, at most 60 s (a kill must never leave a hung run).
fn reap(mut child: Child) -> Option<i32> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code();
        }
        assert!(
            Instant::now() < deadline,
            "intact did not end after its signal"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Runs `cmd`, sends it `sig` after a pseudo-random delay below `max` (different each
/// call), and waits for it to end.
fn kill_within(cmd: Cmd, max: Duration, sig: i32, rng: &mut fastrand::Rng) {
    let child = cmd.command().spawn().unwrap();
    std::thread::sleep(max.mul_f64(rng.f64()));
    signal(&child, sig);
    reap(child);
}

/// Random delays, different each run; the seed is said, to tell a failing run apart.
fn delays() -> fastrand::Rng {
    let seed = fastrand::u64(..);
    eprintln!("random delays seeded with {seed}");
    fastrand::Rng::with_seed(seed)
}

/// The status a check gives `name` under `root`, asserting the exit code fits it.
fn checked(root: &Path, name: &str) -> String {
    let j = intact!("check", "--json", root).json();
    let status = j.status(name);
    let exit = j.summary["exit_code"].as_u64().unwrap();
    assert_eq!(exit, if status == "corrupt" { 1 } else { 0 }, "{status}");
    status
}

#[test]
fn killing_the_rewrite_of_a_hard_linked_file_never_hides_its_damage() {
    for sig in [libc::SIGKILL, libc::SIGTERM] {
        let t = Tree::new();
        let good = data(96 << 20, 7);
        let big = t.write("src/big.bin", &good);
        fs::hard_link(&big, t.path("src/second-name")).unwrap();
        t.write("src/small.txt", b"unharmed");
        intact!("tag", t.path("src")).expect_code(0);
        let backup = t.path("backup");
        assert!(
            std::process::Command::new("cp")
                .arg("-a")
                .arg(t.path("src"))
                .arg(&backup)
                .status()
                .unwrap()
                .success()
        );
        flip_byte(&big, 1_000);
        flip_byte(&big, 90 << 20);
        let damaged_mtime = mtime(&big);

        // Killed the moment the rewrite moves the mtime: mid-rewrite.
        let child = cmd!("repair", t.path("src"), "--from", &backup)
            .command()
            .spawn()
            .unwrap();
        let mut child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        while let Some(c) = &mut child {
            if mtime(&big) != damaged_mtime {
                signal(c, sig);
                reap(child.take().unwrap());
                break;
            }
            if c.try_wait().unwrap().is_some() {
                panic!("repair ended before its rewrite was seen");
            }
            assert!(Instant::now() < deadline, "no rewrite seen");
            std::thread::sleep(Duration::from_micros(200));
        }
        // Either the verified bytes, or damage that every check reports as such.
        let status = checked(&t.path("src"), "big.bin");
        if fs::read(&big).unwrap() == good {
            assert!(status == "ok" || status == "touched", "{status}");
        } else {
            assert_eq!(status, "corrupt", "mixed bytes must not pass for an edit");
            // update keeps the damaged file's tag: the damage is not blessed.
            let j = intact!("update", "--json", t.path("src"))
                .expect_code(1)
                .json();
            assert_eq!(j.file("big.bin")["action"], "kept");
        }
        // Running repair again finishes the job and clears what the killed run left.
        intact!("repair", t.path("src"), "--from", &backup).expect_code(0);
        assert_eq!(fs::read(&big).unwrap(), good);
        assert_eq!(fs::read(t.path("src/second-name")).unwrap(), good);
        assert_eq!(leftovers(t.root()), Vec::<std::path::PathBuf>::new());
        // Tag and file agree again (the mtime the killed rewrite moved is the tag's again):
        // a later silent flip is damage, not an edit.
        intact!("check", t.path("src")).expect_code(0);
        flip_byte(&big, 5_000);
        assert_eq!(checked(&t.path("src"), "big.bin"), "corrupt");
    }
}

#[test]
fn kills_at_random_moments_leave_old_bytes_or_verified_new_ones() {
    let mut delays = delays();
    let t = Tree::new();
    let src = t.path("src");
    let mut good = Vec::new();
    for i in 0..4 {
        let bytes = data(12 << 20, 20 + i);
        let one = t.write(format!("src/f{i}"), &bytes);
        good.push((one, bytes));
    }
    fs::hard_link(&good[0].0, t.path("src/linked")).unwrap();
    // Many small files: their repairs are put in place together, after one sync.
    for i in 0..30 {
        let bytes = data(5_000, 100 + i);
        good.push((t.write(format!("src/small/{i}"), &bytes), bytes));
    }
    let flip_all = |good: &[(std::path::PathBuf, Vec<u8>)]| {
        for (f, bytes) in good {
            flip_byte(f, (bytes.len() as u64 / 2).min(6 << 20));
        }
    };
    intact!("tag", &src).expect_code(0);
    let archive = t.path("out/backup.tar.zst");
    fs::create_dir(t.path("out")).unwrap();
    intact!("archive", "create", &archive, &src).expect_code(0);
    let store = t.path("store");

    for round in 0..6 {
        let sig = if round % 2 == 0 {
            libc::SIGKILL
        } else {
            libc::SIGTERM
        };
        flip_all(&good);
        // repair: each damaged file is either still damaged or whole again.
        let start = Instant::now();
        intact!("repair", "--discard-damaged", &src, "--from", &archive).expect_code(0);
        let took = start.elapsed();
        flip_all(&good);
        let repair = cmd!("repair", "--discard-damaged", &src, "--from", &archive);
        kill_within(repair, took, sig, &mut delays);
        let j = intact!("check", "--json", &src).json();
        for (f, bytes) in &good {
            let name = f.strip_prefix(&src).unwrap().to_str().unwrap();
            let status = j.status(name);
            if &fs::read(f).unwrap() == bytes {
                assert!(status == "ok" || status == "touched", "{name}: {status}");
            } else {
                assert_eq!(status, "corrupt", "{name}");
            }
        }
        intact!("repair", "--discard-damaged", &src, "--from", &archive).expect_code(0);

        // archive create and protect: the result is whole under its name, or absent.
        let again = t.path("out/again.tar.zst");
        let _ = fs::remove_file(&again);
        let start = Instant::now();
        intact!("archive", "create", &again, &src).expect_code(0);
        let took = start.elapsed();
        fs::remove_file(&again).unwrap();
        kill_within(
            cmd!("archive", "create", &again, &src),
            took,
            sig,
            &mut delays,
        );
        if again.exists() {
            intact!("archive", "verify", &again).expect_code(0);
        }

        let _ = fs::remove_dir_all(&store);
        kill_within(
            cmd!("protect", "--store", &store, &src),
            took,
            sig,
            &mut delays,
        );
        // Every index in place names a complete set that par2cmdline accepts.
        for index in par2_indexes(&store) {
            let ok = std::process::Command::new("par2")
                .args(["verify", "-q", "-B"])
                .arg(&src)
                .arg(&index)
                .output()
                .unwrap();
            assert!(ok.status.success(), "{}: {ok:?}", index.display());
        }
        intact!("protect", "--store", &store, &src).expect_code(0);
        intact!("check", &src).expect_code(0);
        intact!("archive", "create", &again, &src).expect_code(0);
        assert_eq!(
            leftovers(t.root()),
            Vec::<std::path::PathBuf>::new(),
            "round {round}"
        );
    }
}

/// The index files of the PAR2 sets under `dir`.
fn par2_indexes(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for e in fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if e.file_type().unwrap().is_dir() {
            found.extend(par2_indexes(&e.path()));
        } else if name.ends_with(".par2") && !name.contains(".vol") {
            found.push(e.path());
        }
    }
    found
}
