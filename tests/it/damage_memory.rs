//! No hole in the damage memory: known damage ends only by repair, acceptance, a real edit or
//! deletion — never by excluding the file from a run, stripping its tag, or `tag --force`.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;

use crate::common::*;

/// A tagged tree of three files in `t`, with `a`'s data flipped under its mtime.
fn damaged_tree(t: &Tree) -> (PathBuf, PathBuf) {
    for name in ["a", "b", "c"] {
        t.write(
            format!("tree/{name}"),
            data(4000, name.len() as u64 + name.as_bytes()[0] as u64),
        );
    }
    let root = t.path("tree");
    intact!("tag", "-q", &root).expect_code(0);
    let a = root.join("a");
    flip_byte(&a, 100);
    (root, a)
}

/// Damage that a parity set's first read finds (a file without parity, left unread by the
/// engine for its set to read) is remembered as any other: every later run says so. The rot
/// comes a day after the tag, as it does: read at once, the file would be within its racy
/// window and read by the engine itself.
#[test]
fn damage_found_by_protect_in_a_file_without_parity_is_remembered() {
    let protects: [&[&str]; 2] = [&["scrub", "--update", "--protect"], &["protect"]];
    for protect in protects {
        let t = Tree::new();
        for i in 0..20 {
            t.write(format!("dq/d1/f{i:02}"), data(8192, i));
        }
        let root = t.path("dq");
        let db = t.path("state.db");
        intact!("tag", "-q", "--state", &db, &root).expect_code(0);
        flip_byte(&root.join("d1/f05"), 100);
        let r = cmd!()
            .args(protect)
            .args([OsStr::new("--state"), db.as_os_str(), root.as_os_str()])
            .days_later(1)
            .run()
            .expect_code(1);
        assert!(r.stdout.contains("corrupt  "), "{protect:?}: {}", r.stdout);
        let r = cmd!("status", "-q", "--state", &db, &root)
            .days_later(1)
            .run()
            .expect_code(1);
        assert!(r.stdout.contains("d1/f05"), "{protect:?}: {}", r.stdout);
        // The next night, with or without parity, still says so.
        cmd!(
            "scrub",
            "-q",
            "--update",
            "--protect",
            "--state",
            &db,
            &root
        )
        .days_later(2)
        .run()
        .expect_code(1);
        cmd!("check", "-q", "--state", &db, &root)
            .days_later(2)
            .run()
            .expect_code(1);
    }
}

#[test]
fn an_excluded_damaged_file_is_not_removed_and_stays_damaged() {
    let t = Tree::new();
    let (root, _) = damaged_tree(&t);
    let db = t.path("state.db");
    intact!("scrub", "-q", "--state", &db, &root).expect_code(1);
    let r = intact!("scrub", "--state", &db, "--exclude", "a", &root).expect_code(1);
    assert!(!r.stdout.contains("removed"), "{}", r.stdout);
    assert!(r.stdout.contains("not yet repaired"), "{}", r.stdout);
    // Every later run of the tree still says so, excluded or not.
    intact!("check", "-q", "--state", &db, "--exclude", "a", &root).expect_code(1);
    intact!("status", "-q", "--state", &db, &root).expect_code(1);
    intact!("scrub", "-q", "--state", &db, &root).expect_code(1);
}

#[test]
fn a_stripped_damaged_file_is_never_tagged_with_its_damaged_bytes() {
    // Known by the mark a writing scrub leaves, and by the state database alone.
    for marked in [true, false] {
        let t = Tree::new();
        let (root, a) = damaged_tree(&t);
        let db = t.path("state.db");
        let scrub: &[&str] = if marked { &["--update"] } else { &[] };
        cmd!("scrub", "-q", "--state", &db)
            .args(scrub)
            .arg(&root)
            .run()
            .expect_code(1);
        intact!("strip", "-q", &a).expect_code(0);
        let r = intact!("update", "--state", &db, &root).expect_code(1);
        assert!(
            r.stdout
                .contains("its tag is gone, but its data is still the bytes found damaged"),
            "marked {marked}: {}",
            r.stdout
        );
        let lines = r
            .stdout
            .lines()
            .filter(|l| l.starts_with("corrupt "))
            .count();
        assert_eq!(lines, 1, "said once: {}", r.stdout);
        assert!(
            getxattr(&a, TAG).is_none(),
            "marked {marked}: tagged its damaged bytes"
        );
        intact!("status", "-q", "--state", &db, &root).expect_code(1);
        // Accepted on purpose: tagged as it is, and the damage is over.
        intact!("update", "-q", "--state", &db, "--accept-corrupt", &root).expect_code(0);
        assert!(getxattr(&a, TAG).is_some());
        intact!("check", "-q", "--state", &db, &root).expect_code(0);
    }
}

#[test]
fn tag_force_refuses_to_bless_damage() {
    let t = Tree::new();
    let (root, a) = damaged_tree(&t);
    let db = t.path("state.db");
    intact!("scrub", "-q", "--update", "--state", &db, &root).expect_code(1);
    let before = getxattr(&a, TAG);
    let r = intact!("tag", "--force", &root).expect_code(1);
    assert!(r.stdout.contains("not re-tagged"), "{}", r.stdout);
    assert_eq!(
        getxattr(&a, TAG),
        before,
        "the tag of the damaged file is unchanged"
    );
    // The other files were re-tagged as asked.
    assert!(r.stderr.contains("2 tagged"), "{}", r.stderr);
    intact!("check", "-q", "--state", &db, &root).expect_code(1);
    let _ = fs::metadata(&a).unwrap();
}

/// A damage mark (version 1, the algorithm, a digest, when found) as intact writes one.
fn mark(algo: u8, digest: &[u8], found: i64) -> Vec<u8> {
    let mut v = vec![1, algo];
    v.extend_from_slice(digest);
    v.extend_from_slice(&found.to_le_bytes());
    v
}

#[test]
fn a_mark_that_contradicts_the_data_is_evidence_of_nothing() {
    let t = Tree::new();
    let f = t.write("tree/f", data(3000, 7));
    let root = t.path("tree");
    intact!("tag", "-q", &root).expect_code(0);
    let sha = intact_tag(&f).digest;
    let db = t.path("state.db");
    // Naming the tag's own digest: the file is ok, the mark is said malformed.
    setxattr(&f, "user.intact.corrupt", &mark(1, &sha, 0));
    let r = intact!("check", "--state", &db, &root).expect_code(3);
    assert!(!r.stdout.contains("corrupt"), "{}", r.stdout);
    assert!(
        r.stderr.contains("naming the tag's own digest"),
        "{}",
        r.stderr
    );
    // A writing verb removes it; then all is well.
    intact!("update", "-q", "--state", &db, &root).expect_code(0);
    assert!(getxattr(&f, "user.intact.corrupt").is_none());
    intact!("check", "-q", "--state", &db, &root).expect_code(0);
    // Of another algorithm than the tag's: said, like any malformed mark.
    setxattr(&f, "user.intact.corrupt", &mark(2, &[7; 32], 0));
    let r = intact!("check", "--state", &db, &root).expect_code(3);
    assert!(r.stderr.contains("another algorithm"), "{}", r.stderr);
}

/// Rot below the file system (a byte flipped in the loop device's image: the file's ctime
/// does not move, as with real bit rot), found by every verb that judges, `scrub --update`
/// included: the file is left exactly as found, so the next `restic backup` finds it
/// unmodified and the repository keeps the good bytes. The damage survives the loss of the
/// state database, a `touch` included, through the damage journal.
#[test]
fn damage_found_leaves_the_file_as_found_so_backups_keep_the_good_bytes() {
    require_faults!();
    use std::os::unix::fs::{FileExt, MetadataExt};
    use std::process::Command;
    let t = Tree::new();
    let disk = crate::faultfs::LoopFs::ext4(t.root(), 32, &["-b", "4096"]);
    let tree = disk.root.join("photos");
    fs::create_dir_all(&tree).unwrap();
    let photo = tree.join("photo.jpg");
    fs::write(&photo, data(64 << 10, 3)).unwrap();
    fs::write(tree.join("other.jpg"), data(10_000, 4)).unwrap();
    intact!("tag", "-q", &tree).expect_code(0);
    let db = t.path("state/state.db");
    fs::create_dir_all(db.parent().unwrap()).unwrap();
    intact!("check", "-q", "--state", &db, &tree).expect_code(0);
    let restic = || {
        let mut c = Command::new("restic");
        c.env("RESTIC_PASSWORD", "correct horse")
            .env("RESTIC_CACHE_DIR", t.path("restic-cache"))
            .arg("--repo")
            .arg(t.path("repo"));
        c
    };
    let backup = || {
        let out = restic()
            .args(["backup", "--json"])
            .arg(&tree)
            .output()
            .expect("restic is installed (.ci/run installs it)");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let summary: serde_json::Value = text
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|v| v["message_type"] == "summary")
            .unwrap_or_else(|| panic!("no summary in {text}"));
        summary
    };
    assert!(restic().args(["init", "-q"]).status().unwrap().success());
    backup();
    // Rot in the image, under the file system: the block that holds the photo's first bytes.
    std::process::Command::new("sync").status().unwrap();
    let out = Command::new("filefrag")
        .args(["-v", "-b4096"])
        .arg(&photo)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let block: u64 = text
        .lines()
        .find(|l| l.trim_start().starts_with("0:"))
        .and_then(|l| l.split(':').nth(2))
        .and_then(|p| p.trim().split("..").next())
        .and_then(|b| b.trim().parse().ok())
        .unwrap_or_else(|| panic!("no extent in {text}"));
    let image = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(t.root().join("ext4.img"))
        .unwrap();
    let at = block * 4096 + 100;
    let mut b = [0u8];
    image.read_exact_at(&mut b, at).unwrap();
    image.write_all_at(&[b[0] ^ 0x20], at).unwrap();
    image.sync_all().unwrap();
    crate::faultfs::drop_caches();
    let before = fs::metadata(&photo).unwrap();
    let attrs = |p: &std::path::Path| {
        let mut names: Vec<String> = xattr_names(p);
        names.sort();
        names
    };
    let attrs_before = attrs(&photo);
    let tag_before = getxattr(&photo, TAG);
    for args in [
        &["check"][..],
        &["scrub"],
        &["scrub", "--update"],
        &["update"],
    ] {
        let r = cmd!().args(args).arg("--state").arg(&db).arg(&tree).run();
        assert_eq!(r.code, 1, "{args:?}: {}{}", r.stdout, r.stderr);
        assert!(r.stdout.contains("corrupt"), "{args:?}: {}", r.stdout);
        let now = fs::metadata(&photo).unwrap();
        assert_eq!(
            (now.ctime(), now.ctime_nsec(), now.mtime(), now.mtime_nsec()),
            (
                before.ctime(),
                before.ctime_nsec(),
                before.mtime(),
                before.mtime_nsec()
            ),
            "{args:?} wrote to the damaged file"
        );
        assert_eq!(
            attrs(&photo),
            attrs_before,
            "{args:?} changed its attributes"
        );
        assert_eq!(getxattr(&photo, TAG), tag_before);
    }
    // The nightly backup after it: the photo unmodified, the good bytes kept.
    let summary = backup();
    assert_eq!(summary["files_changed"], 0, "{summary}");
    assert_eq!(summary["files_unmodified"], 2, "{summary}");
    // The database lost (deleted, then replaced by garbage), and the photo touched: still
    // damage, through the journal.
    set_mtime(&photo, (2_000_000_000, 0));
    fs::remove_file(&db).unwrap();
    let r = intact!("update", "--state", &db, &tree).expect_code(1);
    assert!(r.stdout.contains("corrupt"), "{}", r.stdout);
    assert_eq!(getxattr(&photo, TAG), tag_before, "the damage was blessed");
    fs::write(&db, vec![0x5a; 8192]).unwrap();
    for verb in ["check", "status"] {
        let r = intact!(verb, "--state", &db, &tree).expect_code(1);
        assert!(r.stdout.contains("corrupt"), "{verb}: {}", r.stdout);
    }
}

/// Damage that ended is never brought back by the journal: a file with two names is repaired
/// in place (the same inode, the same tag as when it was found damaged), so only the journal's
/// end line tells the damage is over; a database lost after that knows no damage. Damage
/// found in another file, and not ended, is still brought back.
#[test]
fn damage_that_ended_is_never_brought_back_from_the_journal() {
    let t = Tree::new();
    let one = t.write("tree/one", data(300_000, 10));
    fs::hard_link(&one, t.path("tree/two")).unwrap();
    let other = t.write("tree/other", data(20_000, 11));
    let tree = t.path("tree");
    intact!("tag", "-q", &tree).expect_code(0);
    let copy = t.path("copy.tar.zst");
    intact!("archive", "create", "-q", &copy, &tree).expect_code(0);
    let ino = fs::metadata(&one).unwrap().ino();
    flip_byte(&one, 1000);
    flip_byte(&other, 1000);
    let db = t.path("state.db");
    intact!("check", "-q", "--state", &db, &tree).expect_code(1);
    let journal = t.path("state.db.damage");
    assert_eq!(fs::read_to_string(&journal).unwrap().lines().count(), 2);
    let j = intact!(
        "repair",
        "--json",
        "--state",
        &db,
        "--discard-damaged",
        &one,
        "--from",
        &copy
    )
    .expect_code(0)
    .json();
    assert_eq!(j.file("one")["action"], "repaired", "{:?}", j.files);
    assert_eq!(
        fs::metadata(&one).unwrap().ino(),
        ino,
        "not repaired in place"
    );
    let lines = fs::read_to_string(&journal).unwrap();
    assert!(lines.lines().any(|l| l.contains("\tended\t")), "{lines}");
    // The database lost: `one` is whole, `other` is still damage.
    fs::remove_file(&db).unwrap();
    let r = intact!("status", "--state", &db, &tree).expect_code(1);
    assert!(r.stdout.contains("other"), "{}", r.stdout);
    assert!(
        !r.stdout.contains(&format!("{} ", one.display())),
        "ended damage came back: {}",
        r.stdout
    );
    // Compacted on the way: the ended entry and its end line are gone, the other kept.
    let lines = fs::read_to_string(&journal).unwrap();
    assert_eq!(lines.lines().count(), 1, "{lines}");
    let j = intact!("check", "--json", "--state", &db, &tree)
        .expect_code(1)
        .json();
    assert_eq!(j.status("one"), "ok");
    assert_eq!(j.status("other"), "corrupt");
}

/// The names of a file's extended attributes.
fn xattr_names(p: &std::path::Path) -> Vec<String> {
    let mut buf = vec![0u8; 4096];
    let n = rustix::fs::llistxattr(p, &mut buf[..]).unwrap();
    buf[..n]
        .split(|&b| b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
}

#[test]
fn no_state_records_nothing_but_never_blesses_known_damage() {
    let t = Tree::new();
    let (root, a) = damaged_tree(&t);
    let db = t.path("state.db");
    intact!("check", "-q", "--state", &db, &root).expect_code(1);
    let rows = |db: &std::path::Path| fs::read(db).unwrap();
    let before = rows(&db);
    set_mtime(&a, (2_000_000_000, 0));
    let tag = getxattr(&a, TAG);
    let r = intact!("update", "--no-state", "--state", &db, &root).expect_code(1);
    assert!(r.stdout.contains("corrupt"), "{}", r.stdout);
    assert_eq!(getxattr(&a, TAG), tag, "--no-state blessed known damage");
    assert_eq!(rows(&db), before, "--no-state wrote to the database");
    // With no database anywhere, the machine's damage index (root's runs keep it) knows.
    let none = t.path("none.db");
    let r = intact!("update", "--no-state", "--state", &none, &root).expect_code(1);
    assert!(r.stdout.contains("corrupt"), "{}", r.stdout);
    // Without it too, the run says what it cannot know.
    let r = cmd!("update", "--no-state", "--state", &none, &root)
        .env("INTACT_DAMAGE_INDEX", t.path("no-index/index"))
        .run()
        .expect_code(0);
    assert!(
        r.stderr.contains("damage found earlier cannot be known"),
        "{}",
        r.stderr
    );
}

/// A bit flipped between the disk and the reader (the FUSE file system returns it flipped
/// once, the bytes on its disk are good): a second read around the page cache gets the tag's
/// bytes, so the verdict is `unstable` (damage for the exit code, with advice), never `ok` and
/// never `corrupt`. Flipped on every read, it is `corrupt`. Read whole later, it is `ok`.
#[test]
fn a_second_uncached_read_tells_a_transient_fault_from_rot() {
    require_faults!();
    use crate::faultfs::FaultFs;
    for algo in ALGOS {
        let t = Tree::new();
        t.write("backing/photo.jpg", data(1 << 20, 11));
        t.write("backing/other.jpg", data(100_000, 12));
        let mnt = t.path("mnt");
        fs::create_dir(&mnt).unwrap();
        let fuse = FaultFs::mount(&t.path("backing"), &mnt).unwrap();
        intact!("tag", "-q", "--algo", algo, &mnt).expect_code(0);
        let db = t.path("state.db");
        let check = |code: i32| {
            crate::faultfs::drop_caches();
            intact!("check", "--json", "--state", &db, &mnt)
                .expect_code(code)
                .json()
        };
        fuse.flip("photo.jpg", 300_000, 1);
        let j = check(1);
        assert_eq!(j.status("photo.jpg"), "unstable", "{algo}: {:?}", j.files);
        assert!(
            j.file("photo.jpg")["detail"]
                .as_str()
                .unwrap()
                .contains("memory"),
            "{}",
            j.file("photo.jpg")
        );
        assert_eq!(j.status("other.jpg"), "ok");
        // It stays damage in the state database until two reads match again: one lucky
        // read (the second, around the page cache, flipped) does not clear it ...
        intact!("status", "-q", "--state", &db, &mnt).expect_code(1);
        fuse.flip_later("photo.jpg", 300_000, 1, 1);
        let j = check(1);
        assert_eq!(j.status("photo.jpg"), "unstable", "{algo}: {:?}", j.files);
        intact!("status", "-q", "--state", &db, &mnt).expect_code(1);
        // ... two good reads do.
        let j = check(0);
        assert_eq!(j.status("photo.jpg"), "ok", "{algo}");
        intact!("status", "-q", "--state", &db, &mnt).expect_code(0);
        // The same flip on every read: the disk says so twice, it is rot.
        fuse.flip("photo.jpg", 300_000, usize::MAX);
        let j = check(1);
        assert_eq!(j.status("photo.jpg"), "corrupt", "{algo}");
        fuse.heal();
    }
}

/// A bind mount, undone on drop (also when a test fails).
struct Bind(PathBuf);

impl Bind {
    fn new(from: &std::path::Path, at: &std::path::Path) -> Bind {
        let ok = std::process::Command::new("mount")
            .arg("--bind")
            .arg(from)
            .arg(at)
            .status()
            .unwrap();
        assert!(ok.success(), "mount --bind");
        Bind(at.to_path_buf())
    }
}

impl Drop for Bind {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// Damage on a file system mounted inside the tree, left out by `-x`, then unmounted: the
/// files are not gone (their file system is not there), so their damage stays recorded and
/// said (exit 1: damage wins over the alarm); the run says the sub-mount holds none of its
/// files; mounted again, the damage is there.
#[test]
fn damage_on_an_unmounted_sub_mount_is_not_forgotten() {
    require_faults!();
    let t = Tree::new();
    let root = t.path("tree");
    t.write("tree/top.jpg", data(5000, 1));
    let disk = crate::faultfs::LoopFs::ext4(t.root(), 8, &[]);
    let sub = root.join("sub");
    fs::create_dir_all(&sub).unwrap();
    let mounted = Bind::new(&disk.root, &sub);
    let photo = sub.join("photo.jpg");
    fs::write(&photo, data(5000, 2)).unwrap();
    intact!("tag", "-q", &root).expect_code(0);
    flip_byte(&photo, 10);
    let db = t.path("state.db");
    intact!("scrub", "-q", "--state", &db, &root).expect_code(1);
    intact!("scrub", "-q", "-x", "--state", &db, &root).expect_code(1);
    drop(mounted);
    let r = intact!("scrub", "--state", &db, &root).expect_code(1);
    assert!(!r.stdout.contains("removed"), "{}", r.stdout);
    assert!(
        r.stdout.contains("sub/photo.jpg: found damaged"),
        "{}",
        r.stdout
    );
    assert!(
        r.stderr.contains("holds none of the 1 files"),
        "{}",
        r.stderr
    );
    intact!("status", "-q", "--state", &db, &root).expect_code(1);
    let _mounted = Bind::new(&disk.root, &sub);
    let r = intact!("scrub", "--state", &db, &root).expect_code(1);
    assert!(r.stdout.contains("corrupt"), "{}", r.stdout);
}

/// A damaged file moved (its folder renamed) is still damaged where it is now: a scrub that
/// does not read it says so, under its new name, as does `status`.
#[test]
fn a_damaged_file_moved_is_still_said_by_a_scrub_that_does_not_read_it() {
    let t = Tree::new();
    for i in 0..30 {
        t.write(format!("tree/d{}/f{i:02}", i % 3), data(4000, i));
    }
    let root = t.path("tree");
    let db = t.path("state.db");
    intact!("tag", "-q", "--state", &db, &root).expect_code(0);
    flip_byte(&root.join("d0/f03"), 100);
    // A first slice of the cycle reads d0's files and finds the damage.
    cmd!("scrub", "-q", "--state", &db, "--max-bytes", "20000", &root)
        .days_later(1)
        .run()
        .expect_code(1);
    fs::rename(root.join("d0"), root.join("moved")).unwrap();
    // The next slices read files not yet checked in the cycle: not the damaged one.
    let r = cmd!(
        "scrub",
        "--json",
        "--state",
        &db,
        "--max-bytes",
        "4000",
        &root
    )
    .days_later(2)
    .run()
    .expect_code(1)
    .json();
    assert_eq!(r.summary["damaged_outstanding"], 1, "{}", r.summary);
    let said = r.known[0]["path"].as_str().unwrap();
    assert!(said.ends_with("/moved/f03"), "{said}");
    let out = cmd!("scrub", "--state", &db, "--max-bytes", "4000", &root)
        .days_later(3)
        .run()
        .expect_code(1)
        .stdout;
    assert!(out.contains("moved/f03: found damaged"), "{out}");
    let out = intact!("status", "-q", "--state", &db, &root)
        .expect_code(1)
        .stdout;
    assert!(out.contains("moved/f03"), "{out}");
}

/// Damage one database knows is not blessed by a run on another, or on none: root's damage
/// goes into the machine's damage index (no names), which every run reads. The damaged file
/// touched, then `update` with no database (or another one) keeps it corrupt, untagged
/// with its damaged bytes; the first database still says so.
#[test]
fn damage_known_to_one_database_is_not_blessed_by_a_run_on_another() {
    require_root!();
    let t = Tree::new();
    let (root, a) = damaged_tree(&t);
    let db = t.path("w.db");
    cmd!("scrub", "-q", "--state", &db, &root)
        .days_later(1)
        .run()
        .expect_code(1);
    let tag = getxattr(&a, TAG);
    set_mtime(&a, (2_000_000_000, 0));
    let other = t.path("other.db");
    for state in [&["--no-state"][..], &["--state", other.to_str().unwrap()]] {
        let r = cmd!("update")
            .args(state)
            .arg(&root)
            .days_later(2)
            .run()
            .expect_code(1);
        assert!(r.stdout.contains("corrupt"), "{state:?}: {}", r.stdout);
        assert_eq!(getxattr(&a, TAG), tag, "{state:?}: re-tagged");
    }
    cmd!("check", "-q", "--state", &db, &root)
        .days_later(3)
        .run()
        .expect_code(1);
    // The index names no file, and anyone may read it.
    let index = fs::read_dir(std::env::temp_dir())
        .unwrap()
        .flatten()
        .map(|e| e.path().join("damage-index/index"))
        .filter(|p| p.exists())
        .find(|p| {
            p.to_string_lossy()
                .contains("not_blessed_by_a_run_on_another")
        })
        .expect("the test's damage index");
    let text = fs::read_to_string(&index).unwrap();
    assert!(!text.is_empty());
    assert!(text.lines().all(|l| l.ends_with('\t')), "{text}");
    assert_eq!(
        fs::metadata(&index).unwrap().permissions().mode() & 0o777,
        0o644
    );
}

/// Damage on a file system mounted inside the tree is still damage when that file system is
/// not mounted: check, update, scrub and status keep saying so (exit 1), and status lists it.
#[test]
fn damage_on_a_sub_mount_not_mounted_now_is_still_said() {
    require_faults!();
    let t = Tree::new();
    let root = t.path("tree");
    t.write("tree/b", data(4000, 1));
    let disk = crate::faultfs::LoopFs::new(
        &{
            let image = t.path("sub.img");
            fs::File::create(&image).unwrap().set_len(16 << 20).unwrap();
            image
        },
        &["mkfs.ext4", "-q", "-F"],
        &root.join("m"),
    );
    let a = t.write("tree/m/a", data(4000, 2));
    let db = t.path("state.db");
    intact!("tag", "-q", "--state", &db, &root).expect_code(0);
    flip_byte(&a, 100);
    cmd!("check", "-q", "--state", &db, &root)
        .days_later(1)
        .run()
        .expect_code(1);
    drop(disk);
    assert!(!a.exists());
    for verb in ["check", "update", "scrub"] {
        let r = cmd!(verb, "--state", &db, &root).days_later(2).run();
        assert_eq!(r.code, 1, "{verb}: {}{}", r.stdout, r.stderr);
        assert!(
            r.stdout.contains("m/a: found damaged"),
            "{verb}: {}",
            r.stdout
        );
    }
    let r = intact!("status", "-q", "--state", &db, &root).expect_code(1);
    assert!(r.stdout.contains("m/a"), "{}", r.stdout);
}

/// With no state database (`--no-state`) a sub-mount that is not mounted cannot be seen:
/// the damage the default database knows on it is said all the same (exit 1), and a file
/// system /etc/fstab mounts beneath the tree, not mounted now, is an error (exit 3), not a
/// pass; mounted, or one fstab leaves to be mounted by hand (`noauto`), it is no trouble.
#[test]
fn a_sub_mount_not_mounted_is_said_by_a_run_with_no_state() {
    require_faults!();
    let t = Tree::new();
    let root = t.path("tree");
    t.write("tree/b", data(4000, 1));
    let disk = crate::faultfs::LoopFs::ext4(t.root(), 8, &[]);
    let m = root.join("m");
    fs::create_dir_all(&m).unwrap();
    let mounted = Bind::new(&disk.root, &m);
    let a = m.join("a");
    fs::write(&a, data(4000, 2)).unwrap();
    intact!("tag", "-q", &root).expect_code(0);
    flip_byte(&a, 100);
    cmd!("check", "-q", &root)
        .days_later(1)
        .run()
        .expect_code(1);
    drop(mounted);
    assert!(!a.exists());
    let r = cmd!("check", "--no-state", &root).days_later(2).run();
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("m/a: found damaged"), "{}", r.stdout);

    // A tree no database knows: only fstab says what should be mounted in it.
    let other = t.path("other");
    t.write("other/b", data(4000, 3));
    let usb = other.join("usb");
    fs::create_dir_all(&usb).unwrap();
    intact!("tag", "-q", "--no-state", &other).expect_code(0);
    let fstab = t.path("fstab");
    let line = |options: &str| {
        let point = usb.to_str().unwrap().replace(' ', "\\040");
        format!(
            "# the machine's\nUUID=0000 / ext4 defaults 0 1\nUUID=1234 {point} ext4 {options} 0 2\n"
        )
    };
    fs::write(&fstab, line("defaults,nofail")).unwrap();
    let r = cmd!("check", "--no-state", &other).fstab(&fstab).run();
    assert_eq!(r.code, 3, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stderr
            .contains("usb: /etc/fstab mounts a file system here, which is not mounted"),
        "{}",
        r.stderr
    );
    let _mounted = Bind::new(&disk.root, &usb);
    let r = cmd!("check", "--no-state", &other).fstab(&fstab).run();
    assert!(!r.stderr.contains("fstab"), "{}", r.stderr);
    drop(_mounted);
    fs::write(&fstab, line("noauto,user")).unwrap();
    cmd!("check", "-q", "--no-state", &other)
        .fstab(&fstab)
        .run()
        .expect_code(0);
}

/// A damage journal with lines that are not entries, or that is not a file, hides the
/// damage it recorded: every run says so (exit 3), not once.
#[test]
fn a_damage_journal_that_cannot_be_read_is_said_by_every_run() {
    let t = Tree::new();
    let (root, _) = damaged_tree(&t);
    let db = t.path("state.db");
    cmd!("scrub", "-q", "--state", &db, &root)
        .days_later(1)
        .run()
        .expect_code(1);
    let journal = t.path("state.db.damage");
    let good = fs::read(&journal).unwrap();
    fs::write(&journal, [&good[..], b"garbage\tline\n"].concat()).unwrap();
    for _ in 0..2 {
        let r = intact!("status", "-q", "--state", &db, &root);
        assert_ne!(r.code, 0, "{}", r.stderr);
        assert!(r.stderr.contains("not entries"), "{}", r.stderr);
    }
    // A torn last line (a crash mid-append) is no trouble.
    fs::write(&journal, [&good[..], b"1764728045000\t-5\t4"].concat()).unwrap();
    let r = intact!("status", "-q", "--state", &db, &root).expect_code(1);
    assert!(!r.stderr.contains("journal"), "{}", r.stderr);
    fs::remove_file(&journal).unwrap();
    fs::create_dir(&journal).unwrap();
    for verb in ["status", "check"] {
        let r = intact!(verb, "-q", "--state", &db, &root);
        assert_ne!(r.code, 0, "{verb}");
        assert!(r.stderr.contains("is not a file"), "{verb}: {}", r.stderr);
    }
}

/// A damaged file moved, then the state database lost: the new database learns the damage
/// again from the journal, which keeps it though the file is no longer where it was found
/// (a journal that kept only files at their paths forgot it), and the walk finds it by its
/// inode and tag where it is now.
#[test]
fn a_damaged_file_moved_is_remembered_when_the_database_is_lost() {
    let t = Tree::new();
    for i in 0..10 {
        t.write(format!("tree/d{}/f{i:02}", i % 2), data(4000, i));
    }
    let root = t.path("tree");
    let db = t.path("state.db");
    intact!("tag", "-q", "--state", &db, &root).expect_code(0);
    flip_byte(&root.join("d0/f04"), 100);
    cmd!("scrub", "-q", "--state", &db, &root)
        .days_later(1)
        .run()
        .expect_code(1);
    fs::rename(root.join("d0"), root.join("moved")).unwrap();
    for f in ["state.db", "state.db-wal", "state.db-shm"] {
        let _ = fs::remove_file(t.path(f));
    }
    let r = cmd!("scrub", "--state", &db, "--max-bytes", "4000", &root)
        .days_later(2)
        .run();
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("moved/f04"), "{}", r.stdout);
    intact!("status", "-q", "--state", &db, &root).expect_code(1);
}

/// A machine damage index that cannot be written (here: in a folder anyone can write, which
/// intact refuses) is said, and costs nothing else: the database still records the run's
/// verdicts, the damage and the cycle's progress (the run that met damage recorded nothing
/// at all, so its files were read again and again and the cycle never ended).
#[test]
fn a_damage_index_that_cannot_be_written_loses_no_verdict() {
    require_root!();
    let t = Tree::new();
    let (root, _) = damaged_tree(&t);
    let open = t.path("open");
    fs::create_dir_all(&open).unwrap();
    fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
    let db = t.path("state.db");
    let r = cmd!("scrub", "--json", "--state", &db, &root)
        .env("INTACT_DAMAGE_INDEX", open.join("index"))
        .days_later(1)
        .run()
        .expect_code(1);
    let j = r.json();
    assert!(
        j.summary["errors"].to_string().contains("damage index"),
        "{}",
        j.summary
    );
    assert_eq!(j.summary["cycle"]["files_checked"], 3, "{}", j.summary);
    assert_eq!(j.summary["cycle"]["complete"], true, "{}", j.summary);
    let out = intact!("status", "-q", "--state", &db, &root)
        .expect_code(1)
        .stdout;
    assert!(out.contains("tree/a"), "{out}");
}
