//! Never quiet while something is wrong: if intact says nothing, everything it was asked to
//! verify was verified; if something is wrong, it says so, with an exit code, on every run
//! until the owner deals with it. One test per way it once went quiet (issue 27's table).

#![allow(unsafe_code)]

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::*;

/// `n` tagged files of `size` bytes under `t/tree`; the state database goes to `t/state.db`.
fn tagged_tree(t: &Tree, n: usize, size: usize) -> (PathBuf, PathBuf) {
    for i in 0..n {
        t.write(format!("tree/f{i:02}"), data(size, 500 + i as u64));
    }
    intact!("tag", "-q", t.path("tree")).expect_code(0);
    (t.path("tree"), t.path("state.db"))
}

fn status_json(db: &Path, tree: &Path, code: i32) -> serde_json::Value {
    let out = intact!("status", "--json", "--state", db, tree)
        .expect_code(code)
        .stdout;
    serde_json::from_str(out.lines().last().unwrap()).unwrap()
}

/// Row 1: a budgeted scrub that does not reach the damaged file tonight still says it is
/// there, every night, until it is repaired; and its metrics say so to the alert.
#[test]
fn damage_stays_loud_on_every_budgeted_scrub() {
    let t = Tree::new();
    let (tree, db) = tagged_tree(&t, 10, 10_000);
    intact!("scrub", "-q", "--state", &db, &tree).expect_code(0);
    flip_byte(&tree.join("f03"), 5);
    let prom = t.path("m.prom");
    let mut codes = String::new();
    for night in 0..12 {
        let r = cmd!(
            "scrub",
            "-q",
            "--max-percent",
            "10",
            "--state",
            &db,
            "--metrics",
            &prom,
            &tree
        )
        .run();
        codes.push_str(&r.code.to_string());
        let metrics = fs::read_to_string(&prom).unwrap();
        if r.code == 1 {
            // Said on stdout, even with -q, whether or not tonight's slice held it.
            assert!(r.stdout.contains("f03"), "night {night}: {}", r.stdout);
            assert!(
                metrics.contains("intact_files_damaged{") && metrics.contains("} 1\n"),
                "{metrics}"
            );
        }
    }
    // Quiet until the file's turn came, then loud every night after.
    let first = codes.find('1').expect("the damage was found");
    assert!(first <= 10, "{codes}");
    assert!(
        codes[first..].chars().all(|c| c == '1'),
        "went quiet: {codes}"
    );
    // Repaired (here: restored by hand and accepted as whole by update), it goes quiet.
    fs::write(tree.join("f03"), data(10_000, 503)).unwrap();
    intact!("update", "-q", "--state", &db, &tree).expect_code(0);
    intact!("scrub", "-q", "--max-percent", "10", "--state", &db, &tree).expect_code(0);
}

/// Row 2: a file found damaged and then touched is still damaged: not blessed by update or
/// scrub --update, with the state database or without it (the file carries a mark); only an
/// edit (other bytes) ends it.
#[test]
fn known_damage_is_never_blessed_by_a_moved_mtime() {
    for lose_the_database in [false, true] {
        let t = Tree::new();
        let (tree, db) = tagged_tree(&t, 3, 5_000);
        let f = tree.join("f01");
        let tag = getxattr(&f, TAG).unwrap();
        flip_byte(&f, 9);
        let before = fs::metadata(&f).unwrap();
        let r = cmd!("scrub", "--update", "--json", "--state", &db, &tree)
            .run()
            .expect_code(1);
        assert_eq!(r.json().status("f01"), "corrupt");
        // Left exactly as found: no mark, so its ctime stays and backups keep the good bytes.
        assert!(getxattr(&f, "user.intact.corrupt").is_none(), "marked");
        let after = fs::metadata(&f).unwrap();
        assert_eq!(
            (after.ctime(), after.ctime_nsec()),
            (before.ctime(), before.ctime_nsec()),
            "the damaged file was written to"
        );
        if lose_the_database {
            // The damage journal beside it is what a new database learns the damage from.
            fs::remove_file(&db).unwrap();
        }
        // An app, a sync tool: the mtime moves, the bytes do not.
        set_mtime(&f, (2_000_000_000, 0));
        for verb in [vec!["scrub", "--update"], vec!["update"], vec!["check"]] {
            let r = cmd!()
                .args(&verb)
                .args(["--json", "--state"])
                .arg(&db)
                .arg(&tree)
                .run()
                .expect_code(1);
            let j = r.json();
            assert_eq!(j.status("f01"), "corrupt", "{verb:?}");
            assert!(
                j.file("f01")["detail"]
                    .as_str()
                    .unwrap()
                    .contains("its mtime moved since"),
                "{verb:?}: {}",
                j.file("f01")
            );
            assert_eq!(
                getxattr(&f, TAG).unwrap(),
                tag,
                "{verb:?} blessed the damage"
            );
        }
        let v = status_json(&db, &tree, 1);
        assert_eq!(v["overview"]["damage"].as_array().unwrap().len(), 1, "{v}");
        // An edit writes other bytes: that ends the damage, and update tags it.
        fs::write(&f, b"the owner wrote this").unwrap();
        let r = cmd!("update", "--json", "--state", &db, &tree)
            .run()
            .expect_code(0);
        assert_eq!(r.json().status("f01"), "modified");
        assert!(getxattr(&f, "user.intact.corrupt").is_none(), "mark left");
        status_json(&db, &tree, 0);
    }
}

/// Damage only a read-only check found (no mark on the file) is known to the verbs that
/// write by update's rules too: a touched damaged file is neither archived nor re-tagged.
#[test]
fn archive_and_protect_do_not_bless_what_a_check_found() {
    let t = Tree::new();
    let (tree, db) = tagged_tree(&t, 3, 5_000);
    let f = tree.join("f02");
    let tag = getxattr(&f, TAG).unwrap();
    flip_byte(&f, 11);
    intact!("check", "-q", "--state", &db, &tree).expect_code(1);
    assert!(
        getxattr(&f, "user.intact.corrupt").is_none(),
        "check writes nothing"
    );
    set_mtime(&f, (2_000_000_000, 0));
    let archive = t.path("a.tar.zst");
    for run in [
        cmd!(
            "archive", "create", "--json", "--state", &db, &archive, &tree
        ),
        cmd!("protect", "--json", "--state", &db, &tree),
    ] {
        let j = run.run().expect_code(1).json();
        assert_eq!(j.status("f02"), "corrupt");
        assert_ne!(j.file("f02")["copy"], "archived");
        assert_ne!(j.file("f02")["copy"], "protected");
        assert_eq!(getxattr(&f, TAG).unwrap(), tag, "blessed");
    }
}

/// Row 4: a status that cannot read the database that held the damage does not say "none
/// found": it says the history was lost, and until every file is checked again, exit 3.
#[test]
fn a_status_after_the_database_was_lost_says_so() {
    let t = Tree::new();
    let (tree, db) = tagged_tree(&t, 40, 3_000);
    for i in [1, 2, 3] {
        flip_byte(&tree.join(format!("f{i:02}")), 1);
    }
    intact!("check", "-q", "--state", &db, &tree).expect_code(1);
    {
        use std::os::unix::fs::FileExt;
        let f = fs::OpenOptions::new().write(true).open(&db).unwrap();
        let len = f.metadata().unwrap().len();
        let mut at = 8192;
        while at + 64 < len {
            f.write_all_at(&[0xa5; 64], at).unwrap();
            at += 4096;
        }
    }
    // The damage itself is known again from the damage journal (exit 1 wins); when files
    // were verified is what is lost, and that is said.
    let r = intact!("status", "--state", &db, &tree).expect_code(1);
    assert!(!r.stdout.contains("none found"), "{}", r.stdout);
    assert_eq!(r.stdout.matches("corrupt").count(), 3, "{}", r.stdout);
    assert!(r.stderr.contains("is lost"), "{}", r.stderr);
    let r = intact!("status", "--state", &db, &tree).expect_code(1);
    assert!(r.stderr.contains("not been checked since"), "{}", r.stderr);
    // A full check finds the damage again, and the history is whole from there on.
    intact!("check", "-q", "--state", &db, &tree).expect_code(1);
    let v = status_json(&db, &tree, 1);
    assert_eq!(v["overview"]["damage"].as_array().unwrap().len(), 3, "{v}");
}

/// A database whose damage the opening does not meet (only the directories' table, which
/// the walk reads) is found damaged while in use and rebuilt there: the damage the journal
/// remembers is said all the same, not the nothing a walk that read the old one left.
#[test]
fn damage_is_said_after_a_database_found_damaged_in_the_walk() {
    let t = Tree::new();
    let (tree, db) = tagged_tree(&t, 40, 3_000);
    for i in [4, 5] {
        flip_byte(&tree.join(format!("f{i:02}")), 7);
    }
    intact!("check", "-q", "--state", &db, &tree).expect_code(1);
    let dirs_page: i64 = {
        let conn = rusqlite::Connection::open(&db).unwrap();
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .unwrap();
        conn.query_row(
            "SELECT rootpage FROM sqlite_master WHERE name = 'dirs'",
            [],
            |r| r.get(0),
        )
        .unwrap()
    };
    {
        use std::os::unix::fs::FileExt;
        let f = fs::OpenOptions::new().write(true).open(&db).unwrap();
        f.write_all_at(&[0xa5; 4096], (dirs_page as u64 - 1) * 4096)
            .unwrap();
    }
    let r = intact!("status", "--state", &db, &tree).expect_code(1);
    assert!(
        r.stderr.contains("found damaged while in use"),
        "{}",
        r.stderr
    );
    assert_eq!(r.stdout.matches("corrupt").count(), 2, "{}", r.stdout);
    assert!(
        r.stdout.contains("f04") && r.stdout.contains("f05"),
        "{}",
        r.stdout
    );
}

/// Undoes `chattr +i` on drop, also when the test fails.
struct Immutable(PathBuf);

impl Immutable {
    fn new(p: &Path) -> Self {
        let ok = Command::new("chattr").arg("+i").arg(p).status().unwrap();
        assert!(ok.success(), "chattr +i");
        Immutable(p.to_path_buf())
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        let _ = Command::new("chattr").arg("-i").arg(&self.0).status();
    }
}

/// Row 5: a database that cannot be written (an immutable directory, as a full disk would)
/// makes every scrub fail, saying why: its schedule could not move.
#[test]
fn a_scrub_that_cannot_record_does_not_report_success() {
    require_root!();
    let t = Tree::new();
    let (tree, _) = tagged_tree(&t, 8, 2_000);
    let dir = t.path("state");
    fs::create_dir(&dir).unwrap();
    let db = dir.join("state.db");
    let _frozen = Immutable::new(&dir);
    for _ in 0..2 {
        let r = cmd!("scrub", "--max-percent", "25", "--state", &db, &tree)
            .run()
            .expect_code(3);
        assert!(
            r.stderr.contains("cannot use the state database"),
            "{}",
            r.stderr
        );
    }
}

/// Row 6: a database another process holds locked: the run says it is waiting, gives up
/// within a second of SIGTERM, and claims no cycle it did not plan; a lock held for good
/// fails the run once the documented wait is over.
#[test]
fn a_locked_database_is_waited_for_a_bounded_time_and_never_silently() {
    let t = Tree::new();
    let (tree, db) = tagged_tree(&t, 5, 2_000);
    intact!("scrub", "-q", "--state", &db, &tree).expect_code(0);
    let hold = |secs: u64| {
        let db = db.clone();
        let (locked_tx, locked_rx) = std::sync::mpsc::channel();
        let holder = std::thread::spawn(move || {
            let conn = rusqlite::Connection::open(&db).unwrap();
            conn.execute_batch("BEGIN IMMEDIATE").unwrap();
            locked_tx.send(()).unwrap();
            std::thread::sleep(Duration::from_secs(secs));
            conn.execute_batch("ROLLBACK").unwrap();
        });
        locked_rx.recv().unwrap();
        holder
    };
    let holder = hold(20);
    let child = cmd!("scrub", "--state", &db, &tree)
        .command()
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let signalled = Instant::now();
    // SAFETY: kill(2) of our own unreaped child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    let took = signalled.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        took < Duration::from_secs(2),
        "{took:?} after SIGTERM: {stderr}"
    );
    assert!(matches!(out.status.code(), Some(130 | 3)), "{stderr}");
    assert!(
        stderr.contains("waiting for the state database"),
        "{stderr}"
    );
    assert!(!stderr.contains("cycle is complete"), "{stderr}");
    holder.join().unwrap();

    // A wait is part of the run's time, in its metrics too.
    let holder = hold(3);
    let prom = t.path("m.prom");
    cmd!("check", "-q", "--state", &db, "--metrics", &prom, &tree)
        .within(Duration::from_secs(60))
        .run()
        .expect_code(0);
    holder.join().unwrap();
    let metrics = fs::read_to_string(&prom).unwrap();
    let duration: f64 = metrics
        .lines()
        .find(|l| l.starts_with("intact_run_duration_seconds{"))
        .and_then(|l| l.rsplit_once(' '))
        .map(|(_, v)| v.parse().unwrap())
        .unwrap();
    assert!(
        duration >= 2.0,
        "a run that waited for the lock took {duration} s: {metrics}"
    );

    let holder = hold(75);
    let started = Instant::now();
    let r = cmd!("check", "-q", "--state", &db, &tree)
        .within(Duration::from_secs(90))
        .run()
        .expect_code(3);
    let took = started.elapsed();
    assert!(
        (Duration::from_secs(58)..Duration::from_secs(72)).contains(&took),
        "waited {took:?}"
    );
    assert!(
        r.stderr.contains("another process holds its lock"),
        "{}",
        r.stderr
    );
    holder.join().unwrap();
}

/// Row 7: nothing but a regular file is replaced by an output: not a device, a FIFO, a
/// symlink or a directory; a usage error says so (exit 2) before any work.
#[test]
fn outputs_never_replace_what_is_not_a_regular_file() {
    require_root!();
    let t = Tree::new();
    let (tree, _) = tagged_tree(&t, 2, 100);
    let null = t.path("null");
    let status = Command::new("mknod")
        .arg(&null)
        .args(["c", "1", "3"])
        .status()
        .unwrap();
    assert!(status.success());
    let target = t.write("target", b"keep me");
    std::os::unix::fs::symlink(&target, t.path("link")).unwrap();
    fs::create_dir(t.path("dir")).unwrap();
    for dest in [&null, &t.path("link"), &t.path("dir")] {
        for run in [
            cmd!("check", "--no-state", "--metrics", dest, &tree),
            cmd!("export", "-o", dest, &tree),
            cmd!("archive", "create", "--no-state", dest, &tree),
        ] {
            let r = run.run().expect_code(2);
            assert!(
                r.stderr.contains("only ever replaces a regular file"),
                "{}",
                r.stderr
            );
        }
    }
    assert!(
        fs::symlink_metadata(&null)
            .unwrap()
            .file_type()
            .is_char_device()
    );
    assert!(
        fs::symlink_metadata(t.path("link"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(fs::read(&target).unwrap(), b"keep me");
    assert!(t.path("dir").is_dir());
    // A regular file is replaced, as ever.
    let prom = t.write("m.prom", b"old");
    intact!("check", "--no-state", "--metrics", &prom, &tree).expect_code(0);
    assert!(fs::read_to_string(&prom).unwrap().contains("intact_files"));
}

/// Row 8: the state database kept inside the tree it records is never a file of it.
#[test]
fn the_state_database_is_never_a_file_of_the_tree() {
    let t = Tree::new();
    let (tree, _) = tagged_tree(&t, 3, 100);
    let db = tree.join("state.db");
    for _ in 0..2 {
        let j = cmd!("scrub", "--update", "--json", "-v", "--state", &db, &tree)
            .run()
            .expect_code(0)
            .json();
        assert_eq!(j.count("new"), 0, "{:#?}", j.files);
        assert_eq!(j.count("modified"), 0, "{:#?}", j.files);
        let skipped: Vec<&str> = j
            .files
            .iter()
            .filter(|f| f["skip"] == "state-database")
            .map(|f| f["path"].as_str().unwrap())
            .collect();
        assert!(
            skipped.iter().any(|p| p.ends_with("/state.db")),
            "{skipped:?}"
        );
    }
    assert!(getxattr(&db, TAG).is_none(), "the database was tagged");
    intact!("check", "-q", "--state", &db, &tree).expect_code(0);
}

/// Row 9: a scrub proves it did something: a PATH that is a symlink is followed; a tree with
/// files but no tags, one on a file system without xattrs, and an empty one fail (exit 3).
#[test]
fn a_scrub_that_verifies_nothing_is_never_green() {
    let t = Tree::new();
    let (tree, db) = tagged_tree(&t, 4, 100);
    let link = t.path("photos");
    std::os::unix::fs::symlink(&tree, &link).unwrap();
    let prom = t.path("m.prom");
    let r = cmd!("scrub", "--json", "--state", &db, "--metrics", &prom, &link)
        .run()
        .expect_code(0);
    assert_eq!(r.json().count("ok"), 4);
    // A copy that lost its tags.
    let lost = t.path("lost");
    let copied = Command::new("cp")
        .arg("-r")
        .arg(&tree)
        .arg(&lost)
        .status()
        .unwrap();
    assert!(copied.success());
    let r = cmd!("scrub", "-q", "--state", &db, &lost)
        .run()
        .expect_code(3);
    assert!(r.stderr.contains("none of the 4 file(s)"), "{}", r.stderr);
    cmd!("check", "-q", "--state", &db, &lost)
        .run()
        .expect_code(3);
    // A disk that did not mount: an empty mount point.
    fs::create_dir(t.path("empty")).unwrap();
    let r = cmd!("scrub", "-q", "--state", &db, t.path("empty"))
        .run()
        .expect_code(3);
    assert!(r.stderr.contains("holds no files"), "{}", r.stderr);
    // --update tags what it finds: that is doing something.
    cmd!("scrub", "-q", "--update", "--state", &db, &lost)
        .run()
        .expect_code(0);
    if !is_root() {
        skip!("the no-xattr part needs root to mount ramfs");
    }
    let ram = Mount::new("ramfs", "size=1m", t.path("ram"));
    fs::write(ram.0.join("f"), b"no room for tags").unwrap();
    let r = cmd!("check", "-q", "--state", &db, &ram.0)
        .run()
        .expect_code(3);
    assert!(
        r.stderr.contains("does not support extended attributes"),
        "{}",
        r.stderr
    );
    // Tagging there: the first file's error, a count of the others (one cause, not a line
    // a file; `--json` lists each), then one line that says why and what serves.
    for name in ["g", "h"] {
        fs::write(ram.0.join(name), b"no room either").unwrap();
    }
    let r = cmd!("tag", "-q", "--state", &db, &ram.0)
        .run()
        .expect_code(3);
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{}", r.stdout);
    assert!(
        lines[0].contains("cannot write tag: the file system does not support user extended")
            && lines[1].starts_with("error    ... and 2 more files on file systems without"),
        "{}",
        r.stdout
    );
    let json = cmd!("tag", "--json", "--state", &db, &ram.0)
        .run()
        .expect_code(3);
    assert_eq!(json.json().count("error"), 3, "{}", json.stdout);
    assert!(
        r.stderr.contains(&format!(
            "intact: error: {}: its file system does not support extended attributes, so none \
             of its 3 file(s) can carry a tag: keep them on one that does",
            ram.0.display()
        )),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr.contains("`intact check --manifest FILE`"),
        "{}",
        r.stderr
    );
}

/// Row 10: the metrics of two trees in one collector directory never repeat a series, and
/// each file passes promtool.
#[test]
fn metrics_of_two_trees_are_valid_together() {
    let t = Tree::new();
    let (a, db) = tagged_tree(&t, 2, 100);
    let b = t.path("b");
    t.write("b/x", b"other tree");
    intact!("tag", "-q", &b).expect_code(0);
    let mut series = std::collections::BTreeSet::new();
    for (tree, prom) in [(&a, t.path("a.prom")), (&b, t.path("b.prom"))] {
        intact!("scrub", "-q", "--state", &db, "--metrics", &prom, tree).expect_code(0);
        let status = prom.with_extension("status.prom");
        intact!("status", "-q", "--state", &db, "--metrics", &status, tree).expect_code(0);
        for file in [prom, status] {
            let text = fs::read_to_string(&file).unwrap();
            for line in text.lines().filter(|l| !l.starts_with('#')) {
                let (name, _) = line.rsplit_once(' ').unwrap();
                assert!(series.insert(name.to_string()), "{name} repeats");
            }
            let out = Command::new("promtool")
                .args(["check", "metrics"])
                .stdin(fs::File::open(&file).unwrap())
                .output()
                .expect("promtool (Debian's prometheus package) is installed");
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

/// Row 11: `status -v` says when each file was last proven good, oldest first; `-q` says
/// only what needs attention.
#[test]
fn status_answers_per_file() {
    let t = Tree::new();
    let (tree, db) = tagged_tree(&t, 3, 100);
    intact!("check", "-q", "--state", &db, tree.join("f01")).expect_code(0);
    std::thread::sleep(Duration::from_millis(1100));
    intact!("check", "-q", "--state", &db, tree.join("f02")).expect_code(0);
    let r = intact!("status", "-v", "--state", &db, &tree).expect_code(0);
    let lines: Vec<&str> = r.stdout.lines().filter(|l| l.contains("/f0")).collect();
    assert_eq!(lines.len(), 3, "{}", r.stdout);
    assert!(
        lines[0].starts_with("never") && lines[0].ends_with("f00"),
        "{lines:?}"
    );
    assert!(
        lines[1].ends_with("f01") && lines[2].ends_with("f02"),
        "{lines:?}"
    );
    assert!(lines[1].contains(" ok "), "{lines:?}");
    assert!(
        lines.iter().all(|l| l.contains(" -- ")),
        "no copies yet: {lines:?}"
    );
    // Each file's copies: p parity, a archived.
    intact!("protect", "-q", "--state", &db, tree.join("f00")).expect_code(0);
    intact!(
        "archive",
        "create",
        "-q",
        "--state",
        &db,
        t.path("a.tar.zst"),
        tree.join("f01")
    )
    .expect_code(0);
    let r = intact!("status", "-v", "--state", &db, &tree).expect_code(0);
    let mark = |name: &str| {
        let line = r.stdout.lines().find(|l| l.ends_with(name)).unwrap();
        line.split_whitespace().nth(2).unwrap().to_string()
    };
    let marks = [mark("/f00"), mark("/f01"), mark("/f02")];
    assert_eq!(marks, ["p-", "-a", "--"], "{}", r.stdout);
    let r = intact!("status", "-q", "--state", &db, &tree).expect_code(0);
    assert_eq!(r.stdout, "", "-q: nothing needs attention");
    flip_byte(&tree.join("f02"), 3);
    intact!("check", "-q", "--state", &db, &tree).expect_code(1);
    let r = intact!("status", "-q", "--state", &db, &tree).expect_code(1);
    assert!(
        r.stdout.starts_with("damage ") && r.stdout.contains("f02"),
        "{}",
        r.stdout
    );
    assert_eq!(r.stdout.lines().count(), 2, "{}", r.stdout);
    let r = intact!("status", "-v", "--json", "--state", &db, &tree).expect_code(1);
    let files: Vec<serde_json::Value> = r
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|v: &serde_json::Value| v["type"] == "file")
        .collect();
    assert_eq!(files.len(), 3);
    assert!(files.iter().all(|f| f["verified"].is_string()), "{files:?}");
    let copies: Vec<_> = files
        .iter()
        .map(|f| (f["protected"].as_bool(), f["archived"].as_bool()))
        .collect();
    assert!(
        copies.contains(&(Some(true), Some(false))) && copies.contains(&(Some(false), Some(true))),
        "{files:?}"
    );
}

/// Row 12: a file verified before and gone now is told once by the next scrub, shown by
/// status (with a metric) for a while, and is no damage.
#[test]
fn files_that_vanish_are_told_not_forgotten() {
    let t = Tree::new();
    let (tree, db) = tagged_tree(&t, 3, 100);
    intact!("scrub", "-q", "--state", &db, &tree).expect_code(0);
    fs::remove_file(tree.join("f01")).unwrap();
    let r = intact!("scrub", "--state", &db, &tree).expect_code(0);
    assert!(
        r.stdout.contains("removed ") && r.stdout.contains("f01"),
        "{}",
        r.stdout
    );
    // Told once, counted for 30 days: the metric a dashboard alerts on does not drop to 0
    // the night after.
    let prom = t.path("scrub.prom");
    let r = intact!("scrub", "--json", "--state", &db, "--metrics", &prom, &tree).expect_code(0);
    assert_eq!(r.json().summary["removed"], 0, "told once");
    let metric = |p: &std::path::Path| {
        fs::read_to_string(p)
            .unwrap()
            .lines()
            .find(|l| l.starts_with("intact_files_removed{"))
            .map(str::to_string)
    };
    assert!(
        metric(&prom).is_some_and(|l| l.ends_with(" 1")),
        "{:?}",
        metric(&prom)
    );
    let v = status_json(&db, &tree, 0);
    let removed = v["removed"].as_array().unwrap();
    assert_eq!(removed.len(), 1, "{v}");
    assert!(removed[0]["path"].as_str().unwrap().ends_with("/f01"));
    let prom = t.path("s.prom");
    intact!("status", "-q", "--state", &db, "--metrics", &prom, &tree).expect_code(0);
    assert!(
        fs::read_to_string(&prom)
            .unwrap()
            .lines()
            .any(|l| l.starts_with("intact_files_removed{") && l.ends_with(" 1")),
    );
    // A file replaced under its name (an editor's save) is not gone.
    let f = tree.join("f02");
    let tmp = tree.join(".f02.swp");
    fs::write(&tmp, b"saved anew").unwrap();
    fs::rename(&tmp, &f).unwrap();
    let r = intact!("scrub", "--json", "--state", &db, &tree).expect_code(0);
    assert_eq!(r.json().summary["removed"], 0);
}

/// Changes get protected first: a budgeted `scrub --update` tags new files and re-tags
/// edited ones before the rolling order, on top of its byte budget, which goes on with the
/// cycle; `N` runs with a budget of 1/N of the tree complete a cycle; a file just tagged from
/// its data is not "never verified".
#[test]
fn changes_are_protected_first_and_budgets_keep_their_promise() {
    let t = Tree::new();
    let (tree, db) = tagged_tree(&t, 20, 1_000);
    for round in 0..3 {
        let mut runs = 0;
        loop {
            runs += 1;
            let j = cmd!(
                "scrub",
                "--json",
                "--max-percent",
                "25",
                "--state",
                &db,
                &tree
            )
            .run()
            .expect_code(0)
            .json();
            if j.summary["cycle"]["complete"] == true {
                break;
            }
            assert!(runs < 10, "no end to the cycle");
        }
        assert!(runs <= 4, "round {round}: {runs} runs of 25%");
    }
    let new = t.write("tree/zz-new", data(1_000, 77));
    fs::write(tree.join("f07"), data(1_000, 78)).unwrap();
    set_mtime(&tree.join("f07"), (2_000_000_000, 0));
    let j = cmd!(
        "scrub",
        "--update",
        "--json",
        "-v",
        "--max-bytes",
        "2000",
        "--state",
        &db,
        &tree
    )
    .run()
    .expect_code(0)
    .json();
    // The two changes, then two files of the cycle (2,000 bytes).
    assert_eq!(j.files.len(), 4, "{:#?}", j.files);
    assert_eq!(j.count("ok"), 2, "{}", j.summary);
    assert_eq!(j.status("zz-new"), "new");
    assert_eq!(j.status("f07"), "modified");
    assert!(getxattr(&new, TAG).is_some());
    let v = status_json(&db, &tree, 0);
    assert_eq!(v["never_verified"], 0, "{v}");
}

/// The database stays bounded without scrubs: over rounds of edits (in place and by
/// rename) and updates, it holds one row per file.
#[test]
fn the_database_stays_bounded_without_scrubs() {
    let t = Tree::new();
    let (tree, db) = tagged_tree(&t, 10, 100);
    let rows = || db_entries(&db).len() as i64;
    for round in 0..20u64 {
        for i in 0..10u64 {
            let f = tree.join(format!("f{i:02}"));
            if (round + i) % 2 == 0 {
                fs::write(&f, data(100, round * 100 + i)).unwrap();
            } else {
                let tmp = tree.join(".save");
                fs::write(&tmp, data(100, round * 100 + i)).unwrap();
                fs::rename(&tmp, &f).unwrap();
            }
            set_mtime(&f, (1_900_000_000 + round as i64, 0));
        }
        intact!("update", "-q", "--state", &db, &tree).expect_code(0);
        assert_eq!(rows(), 10, "round {round}");
    }
}

/// The WAL left beside the database between runs holds one run's writes: the first check of
/// a large tree writes its whole database there, the next run copies that in and starts
/// the WAL again, cut back to 1 MiB; what it knows stays whole.
#[test]
fn the_wal_left_between_runs_stays_bounded() {
    let t = Tree::new();
    for d in 0..80 {
        for f in 0..200 {
            t.write(format!("tree/d{d:02}/f{f:03}"), [d as u8, f as u8]);
        }
    }
    let (tree, db) = (t.path("tree"), t.path("state.db"));
    intact!("tag", "-q", &tree).expect_code(0);
    let wal = t.path("state.db-wal");
    let size = || fs::metadata(&wal).map_or(0, |m| m.len());
    intact!("check", "-q", "--state", &db, &tree).expect_code(0);
    assert!(size() > 1 << 20, "the first record is larger: {}", size());
    intact!("check", "-q", "--state", &db, &tree).expect_code(0);
    assert!(size() <= 1 << 20, "the WAL kept {} bytes", size());
    let conn = rusqlite::Connection::open(&db).unwrap();
    let ok: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(ok, "ok");
    drop(conn);
    assert_eq!(db_entries(&db).len(), 16_000);
}

/// Numbers that do not round the truth away; a repaired file still counts as archived; and
/// repair names every name of an inode it repaired.
#[test]
fn numbers_and_names_say_the_truth() {
    let t = Tree::new();
    let (tree, db) = tagged_tree(&t, 1000, 10);
    let r = intact!("scrub", "--state", &db, "--max-bytes", "9990", &tree).expect_code(0);
    assert!(
        r.stderr.contains("(9.99 kB of 10.00 kB, 99.9%)"),
        "{}",
        r.stderr
    );

    let t = Tree::new();
    let (tree, db) = tagged_tree(&t, 3, 5_000);
    fs::hard_link(tree.join("f00"), tree.join("second")).unwrap();
    let archive = t.path("a.tar.zst");
    intact!("archive", "create", "-q", "--state", &db, &archive, &tree).expect_code(0);
    flip_byte(&tree.join("f00"), 4);
    flip_byte(&tree.join("f01"), 4);
    let r = intact!(
        "repair",
        "--discard-damaged",
        "--state",
        &db,
        "--from",
        &archive,
        &tree
    )
    .expect_code(0);
    for name in ["f00", "second", "f01"] {
        assert!(
            r.stdout
                .lines()
                .any(|l| l.starts_with("repaired ") && l.contains(name)),
            "{name}: {}",
            r.stdout
        );
    }
    let v = status_json(&db, &tree, 0);
    assert_eq!(v["overview"]["archived"]["files"], 3, "{v}");
    // A finished repair leaves tag and mtime agreeing: a later flip is damage.
    flip_byte(&tree.join("f01"), 5);
    let j = cmd!("check", "--json", "--state", &db, &tree)
        .run()
        .expect_code(1)
        .json();
    assert_eq!(j.status("f01"), "corrupt");
}
