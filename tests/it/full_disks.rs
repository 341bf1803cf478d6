//! Full disks: every writing verb says what could not be written, claims nothing it did not
//! make durable (no file `archived` or `protected` without its archive or set in place),
//! exits 3 with a summary that says 3 too, and leaves nothing behind.

use std::fs;
use std::io::Write;
use std::path::Path;

use crate::common::*;

/// Fills the file system that holds `dir` until it has no space left.
fn fill(dir: &Path) {
    let mut f = fs::File::create(dir.join("filler")).unwrap();
    // Smaller and smaller writes, down to the last byte a block can hold.
    for size in [64 << 10, 4 << 10, 512, 1] {
        let block = vec![0x5au8; size];
        while f.write_all(&block).is_ok() && f.sync_data().is_ok() {}
    }
    // Every free block, also those a file would need for its first byte.
    for i in 0.. {
        if fs::write(dir.join(format!("filler{i}")), b"x").is_err() {
            break;
        }
    }
}

/// Asserts that no file claims `action`, and that the summary states the exit code 3.
fn claims_nothing(j: &Json, action: &str) {
    for f in &j.files {
        assert_ne!(f["action"], action, "{f}");
        assert_ne!(f["copy"], action, "{f}");
    }
    assert_eq!(j.summary["actions"][action], 0, "{}", j.summary);
    assert_eq!(j.summary["exit_code"], 3, "{}", j.summary);
    assert!(
        !j.summary["errors"].as_array().unwrap().is_empty(),
        "{}",
        j.summary
    );
}

fn tagged_tree(t: &Tree) -> std::path::PathBuf {
    for i in 0..6 {
        t.write(format!("src/f{i}"), data(300_000, 40 + i));
    }
    intact!("tag", t.path("src")).expect_code(0);
    t.path("src")
}

#[test]
fn an_archive_or_manifest_into_a_full_disk_claims_nothing_and_leaves_nothing() {
    require_root!();
    let t = Tree::new();
    let src = tagged_tree(&t);
    let m = Mount::new("tmpfs", "size=1m", t.path("full"));
    fill(&m.0);
    let j = intact!("archive", "create", "--json", m.0.join("a.tar.zst"), &src)
        .expect_code(3)
        .json();
    claims_nothing(&j, "archived");
    assert!(!m.0.join("a.tar.zst").exists());
    let j = intact!("export", "--json", "-o", m.0.join("SUMS"), &src)
        .expect_code(3)
        .json();
    assert_eq!(j.summary["exit_code"], 3);
    assert!(!m.0.join("SUMS").exists());
    assert!(leftovers(&m.0).is_empty(), "{:?}", leftovers(&m.0));
    // Without --json: the summary, then what failed.
    let r = intact!("archive", "create", m.0.join("a.tar.zst"), &src).expect_code(3);
    assert!(r.stderr.contains("intact: error: "), "{}", r.stderr);
    assert!(!r.stderr.contains("archived"), "{}", r.stderr);
}

#[test]
fn parity_that_does_not_fit_is_never_claimed() {
    require_root!();
    let t = Tree::new();
    let src = tagged_tree(&t);
    let m = Mount::new("tmpfs", "size=1m", t.path("full"));
    let store = m.0.join("store");
    // The store exists and protects one file, then its disk fills up.
    intact!("protect", "--store", &store, t.path("src/f0")).expect_code(0);
    fill(&m.0);
    let j = intact!("protect", "--json", "--store", &store, &src)
        .expect_code(3)
        .json();
    assert_eq!(j.summary["exit_code"], 3);
    for f in &j.files {
        if f["copy"] == "protected" {
            // Only f0, whose parity was there before.
            assert!(f["path"].as_str().unwrap().ends_with("/f0"), "{f}");
        } else {
            assert_eq!(f["status"], "error", "{f}");
            assert_eq!(f["error_kind"], "no-space", "{f}");
        }
    }
    assert!(leftovers(&m.0).is_empty(), "{:?}", leftovers(&m.0));
    // No empty set directories: every directory in the store holds a set.
    for e in fs::read_dir(&store).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            assert!(
                fs::read_dir(e.path()).unwrap().next().is_some(),
                "{e:?} is empty"
            );
        }
    }
}

#[test]
fn tags_that_do_not_fit_are_errors_that_say_so() {
    require_faults!();
    let t = Tree::new();
    // A small ext4: a tag that does not fit in the inode needs a block, and there is none.
    let disk = crate::faultfs::LoopFs::ext4(t.root(), 4, &["-I", "128", "-N", "64", "-m", "0"]);
    for i in 0..4 {
        fs::write(disk.root.join(format!("f{i}")), data(1000, i)).unwrap();
    }
    fill(&disk.root);
    let j = intact!("tag", "--json", &disk.root).expect_code(3).json();
    for i in 0..4 {
        let f = j.file(&format!("f{i}"));
        assert_eq!(f["status"], "error", "{f}");
        assert_eq!(f["error_kind"], "no-space", "{f}");
        assert!(f.get("action").is_none(), "{f}");
    }
    assert_eq!(j.summary["actions"]["tagged"], 0);
}

#[test]
fn protect_on_a_read_only_file_system_is_an_error_not_a_usage_error() {
    require_root!();
    let t = Tree::new();
    let m = Mount::new("tmpfs", "size=1m,mode=0755", t.path("ro"));
    // A folder only root writes (tmpfs is 1777 by default): its store is in it.
    fs::write(m.0.join("f"), b"data").unwrap();
    let status = std::process::Command::new("mount")
        .args(["-o", "remount,ro"])
        .arg(&m.0)
        .status()
        .unwrap();
    assert!(status.success());
    let r = intact!("protect", &m.0).expect_code(3);
    assert!(r.stderr.contains("Read-only file system"), "{}", r.stderr);
}

/// A state database on a full disk: every run that needs it fails, saying so, and `status`
/// does not pretend to know there is no damage.
#[test]
fn a_state_database_on_a_full_disk_is_never_silent() {
    require_root!();
    let t = Tree::new();
    let src = tagged_tree(&t);
    // A tmpfs is 1777 unless told: a state folder others can write is refused.
    let m = Mount::new("tmpfs", "size=256k,mode=0755", t.path("full"));
    let db = m.0.join("state.db");
    intact!("check", "-q", "--state", &db, src.join("f0")).expect_code(0);
    fill(&m.0);
    for verb in ["check", "scrub"] {
        let r = intact!(verb, "-q", "--state", &db, &src).expect_code(3);
        assert!(r.stderr.contains("state database"), "{verb}: {}", r.stderr);
    }
    let r = intact!("status", "--state", &db, &src).expect_code(3);
    assert!(!r.stdout.contains("none found"), "{}", r.stdout);
    assert!(r.stdout.contains("damage      unknown"), "{}", r.stdout);
}

/// A state database on an almost-full ext4 of 1 KiB blocks (what mkfs.ext4 makes of a small
/// disk): SQLite's shared memory is a sparse file it maps, and a page it could not allocate
/// killed every verb with SIGBUS (exit 135, nothing said). Each verb now says the database
/// cannot be used (exit 3) and does its job without it.
#[test]
fn a_state_database_on_a_full_ext4_never_kills_a_run() {
    require_faults!();
    let t = Tree::new();
    let src = tagged_tree(&t);
    let disk = crate::faultfs::LoopFs::ext4(t.root(), 8, &[]);
    let db = disk.root.join("state.db");
    intact!("check", "-q", "--state", &db, &src).expect_code(0);
    // Filled as `dd bs=64k` fills it: less than one write's worth is left, so SQLite's byte
    // per page is written, and the rest of the page cannot be.
    {
        let mut f = fs::File::create(disk.root.join("filler")).unwrap();
        while f.write_all(&[0x5a; 64 << 10]).is_ok() {}
        let _ = f.sync_all();
    }
    for args in [
        &["check", "-q"][..],
        &["scrub", "-q"],
        &["scrub", "-q", "--update"],
        &["update", "-q"],
        &["status", "-q"],
    ] {
        let r = cmd!().args(args).arg("--state").arg(&db).arg(&src).run();
        assert_eq!(r.code, 3, "{args:?}: {}", r.stderr);
        assert!(
            r.stderr.contains("cannot use the state database") && r.stderr.contains("is full"),
            "{args:?}: {}",
            r.stderr
        );
    }
    // Room again: the database is used, and still knows what it knew.
    for f in fs::read_dir(&disk.root).unwrap() {
        let f = f.unwrap().path();
        if f.file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("filler")
        {
            fs::remove_file(f).unwrap();
        }
    }
    intact!("check", "-q", "--state", &db, &src).expect_code(0);
}
