//! What a user who can write a tree can make root's intact do: nothing they could not do
//! themselves. Each test attacks as `nobody` (setpriv) against root's runs, and checks with a
//! snapshot of a root-owned decoy folder outside the tree (names, bytes, mtimes, xattrs) that
//! nothing outside changed, every run under a time limit.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common::*;

const LIMIT: Duration = Duration::from_secs(120);

/// Runs `program ARGS` as `nobody`; whether it succeeded.
fn as_nobody(program: &str, args: &[&OsStr]) -> bool {
    Command::new("setpriv")
        .args([
            "--reuid=nobody",
            "--regid=nogroup",
            "--clear-groups",
            program,
        ])
        .args(args)
        .status()
        .unwrap()
        .success()
}

/// A root-owned folder outside the tree, laid out as a parity store's moved-aside sets are
/// (a day folder long past any grace, sets named by digest, a pack) beside files of its own,
/// all months old: what a followed symlink would have had deleted or moved.
struct Decoy {
    dir: PathBuf,
    before: BTreeMap<PathBuf, (Vec<u8>, i64, Vec<u8>)>,
}

impl Decoy {
    fn new(t: &Tree) -> Decoy {
        let dir = t.path("decoy");
        let hex = "ab".repeat(32);
        for (rel, seed) in [
            ("photos/a.jpg".to_string(), 1),
            ("notes.txt".to_string(), 2),
            (format!("19000/sha256-ab/{hex}.par2.stale"), 3),
            (format!("sha256-ab/{hex}.par2"), 4),
            (format!("packs/{}.par2", "cd".repeat(16)), 5),
            (
                format!("stale/19000/packs/{}.par2.stale", "ef".repeat(16)),
                6,
            ),
        ] {
            let p = t.write(dir.join(rel), data(3000, seed));
            setxattr(&p, "user.decoy", b"mine");
            set_mtime(&p, (1_000_000_000, 0));
        }
        let before = Decoy::snapshot(&dir);
        Decoy { dir, before }
    }

    fn snapshot(dir: &Path) -> BTreeMap<PathBuf, (Vec<u8>, i64, Vec<u8>)> {
        let mut all = BTreeMap::new();
        let mut todo = vec![dir.to_path_buf()];
        while let Some(d) = todo.pop() {
            for e in fs::read_dir(&d).unwrap().flatten() {
                let (p, m) = (e.path(), e.metadata().unwrap());
                if m.is_dir() {
                    todo.push(p.clone());
                }
                let bytes = if m.is_file() {
                    fs::read(&p).unwrap()
                } else {
                    Vec::new()
                };
                let x = getxattr(&p, "user.decoy").unwrap_or_default();
                all.insert(p, (bytes, m.mtime(), x));
            }
        }
        all
    }

    fn untouched(&self, after: &str) {
        let now = Decoy::snapshot(&self.dir);
        assert_eq!(
            now.keys().collect::<Vec<_>>(),
            self.before.keys().collect::<Vec<_>>(),
            "names outside the tree changed {after}"
        );
        assert!(now == self.before, "files outside the tree changed {after}");
    }
}

/// A tree `nobody` can write (theirs), with root's files in it, tagged by root.
fn shared_tree(t: &Tree) -> PathBuf {
    t.open_to_all();
    let root = t.path("tree");
    for i in 0..12 {
        t.write(format!("tree/f{i:02}"), data(5000, i));
    }
    t.write("tree/big", data(400_000, 77));
    std::os::unix::fs::chown(&root, Some(65534), Some(65534)).unwrap();
    intact!("tag", "-q", &root).expect_code(0);
    root
}

/// Rows 1 and 2 of the review: a store at a symlink, or a store of the user's own with a
/// symlink in it, made root's `protect` delete files outside the tree (past their grace as
/// moved-aside sets) and write a marker, packs and sets there. Now such a store is refused,
/// loudly (exit 3), and the run goes on: every file is still verified.
#[test]
fn a_store_a_user_of_the_tree_planted_makes_root_write_or_delete_nothing_outside() {
    require_root!();
    let t = Tree::new();
    let root = shared_tree(&t);
    let decoy = Decoy::new(&t);
    let store = root.join(".intact-parity");
    let verified = |r: &Run| r.json().count("ok");

    // The store's name a symlink to the decoy. Root's store for a tree another user owns is
    // outside it, by default: the planted one is not even looked at.
    assert!(as_nobody(
        "ln",
        &["-s".as_ref(), decoy.dir.as_ref(), store.as_ref()]
    ));
    let r = cmd!("protect", "--json", &root)
        .within(LIMIT)
        .run()
        .expect_code(0);
    assert_eq!(verified(&r), 13, "{}", r.stdout);
    let outside = state_home(false).join("intact/parity");
    let made: Vec<_> = fs::read_dir(&outside)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    // Named as systemd names the path (the real tool says how).
    let escaped = Command::new("systemd-escape")
        .arg("--path")
        .arg(&root)
        .output()
        .expect("systemd-escape (systemd) is installed");
    let name = String::from_utf8(escaped.stdout)
        .unwrap()
        .trim()
        .to_string();
    assert!(made.iter().any(|n| *n == *name), "{name} in {made:?}");
    assert!(fs::symlink_metadata(&store).unwrap().is_symlink());
    decoy.untouched("(default store outside the tree)");
    fs::remove_dir_all(outside.join(&name)).unwrap();
    // Pointed at the tree's own (`--store`), rule 2 holds: refused, loudly.
    let r = cmd!("protect", "--json", "--store", &store, &root)
        .within(LIMIT)
        .run()
        .expect_code(3);
    assert!(r.stdout.contains("refused: a symlink"), "{}", r.stdout);
    assert_eq!(verified(&r), 13, "the run went on: {}", r.stdout);
    decoy.untouched("(store a symlink)");

    // A store of the user's own, its `stale` a symlink to the decoy.
    fs::remove_file(&store).unwrap();
    assert!(as_nobody(
        "mkdir",
        &["-p".as_ref(), store.join("packs").as_os_str()]
    ));
    assert!(as_nobody(
        "ln",
        &[
            "-s".as_ref(),
            decoy.dir.as_ref(),
            store.join("stale").as_ref()
        ]
    ));
    let r = cmd!("protect", "-q", "--store", &store, &root)
        .within(LIMIT)
        .days_later(60)
        .run()
        .expect_code(3);
    assert!(r.stderr.contains("belongs to user 65534"), "{}", r.stderr);
    decoy.untouched("(stale a symlink in the user's store)");

    // Root's own store in the tree: nothing can be put in it, and one swapped for a symlink
    // after it was made is refused.
    fs::remove_dir_all(&store).unwrap();
    intact!("protect", "-q", "--store", &store, &root).expect_code(0);
    let meta = fs::symlink_metadata(&store).unwrap();
    assert_eq!((meta.uid(), meta.mode() & 0o777), (0, 0o755));
    let planted = store.join("stale");
    assert!(!as_nobody(
        "ln",
        &["-s".as_ref(), decoy.dir.as_ref(), planted.as_ref()]
    ));
    assert!(as_nobody(
        "mv",
        &[store.as_ref(), root.join("old").as_ref()]
    ));
    assert!(as_nobody(
        "ln",
        &["-s".as_ref(), decoy.dir.as_ref(), store.as_ref()]
    ));
    flip_byte(&root.join("f03"), 10);
    // The nightly scrub now keeps its parity outside the tree; protect pointed at the
    // swapped store refuses it.
    let r = cmd!("scrub", "--update", "--protect", "--json", &root)
        .within(LIMIT)
        .days_later(60)
        .run()
        .expect_code(1);
    assert!(!r.stdout.contains("refused"), "{}", r.stdout);
    assert_eq!(r.json().status("f03"), "corrupt");
    decoy.untouched("(scrub beside a store swapped for a symlink)");
    let r = cmd!("protect", "--store", &store, "--json", &root)
        .within(LIMIT)
        .days_later(60)
        .run()
        // Damage wins over the failure.
        .expect_code(1);
    assert!(r.stdout.contains("refused: a symlink"), "{}", r.stdout);
    assert_eq!(r.json().status("f03"), "corrupt");
    decoy.untouched("(protect on a store swapped for a symlink)");

    // A store anyone can write is refused though it is root's (f03's damage, still there,
    // wins over the failure).
    fs::remove_file(&store).unwrap();
    fs::create_dir(&store).unwrap();
    fs::set_permissions(&store, fs::Permissions::from_mode(0o777)).unwrap();
    let r = cmd!("protect", "-q", "--store", &store, &root)
        .within(LIMIT)
        .run()
        .expect_code(1);
    assert!(
        r.stderr.contains("others can write in it (mode 0777)"),
        "{}",
        r.stderr
    );
    assert_eq!(fs::read_dir(&store).unwrap().count(), 0, "wrote in it");
}

/// Row 5: the state database names the files of every tree it knows, other users' private
/// folders among them: it, its WAL and shared memory and its damage journal are `0600` in a
/// `0700` folder (an earlier build's `0644` files are made so), and a journal replaced by a
/// symlink is refused, not appended to.
#[test]
fn the_state_database_and_its_journal_are_private_and_followed_through_no_symlink() {
    require_root!();
    let t = Tree::new();
    let root = t.path("tree");
    for i in 0..5 {
        t.write(format!("tree/f{i}"), data(2000, i));
    }
    let db = t.path("state/intact/state.db");
    let mode = |p: &Path| fs::symlink_metadata(p).unwrap().mode() & 0o777;
    let beside = |suffix: &str| PathBuf::from(format!("{}{suffix}", db.display()));
    intact!("tag", "-q", "--state", &db, &root).expect_code(0);
    flip_byte(&root.join("f2"), 7);
    intact!("check", "-q", "--state", &db, &root).expect_code(1);
    assert_eq!(mode(db.parent().unwrap()), 0o700);
    for file in [
        db.clone(),
        beside("-wal"),
        beside("-shm"),
        beside(".damage"),
    ] {
        assert_eq!(mode(&file), 0o600, "{}", file.display());
    }
    // An earlier build's files, readable by all, are made private by the next run.
    for suffix in ["", "-wal", "-shm", ".damage"] {
        fs::set_permissions(beside(suffix), fs::Permissions::from_mode(0o644)).unwrap();
    }
    intact!("check", "-q", "--state", &db, &root).expect_code(1);
    for suffix in ["", "-wal", "-shm", ".damage"] {
        assert_eq!(mode(&beside(suffix)), 0o600, "state.db{suffix}");
    }
    // A journal swapped for a symlink: nothing is appended to where it points.
    let decoy = t.write("decoy/passwd", b"root:x:0:0::/root:/bin/sh\n");
    fs::remove_file(beside(".damage")).unwrap();
    std::os::unix::fs::symlink(&decoy, beside(".damage")).unwrap();
    flip_byte(&root.join("f3"), 7);
    let r = intact!("check", "-q", "--state", &db, &root).expect_code(1);
    assert!(r.stderr.contains("follows no symlink"), "{}", r.stderr);
    assert_eq!(fs::read(&decoy).unwrap(), b"root:x:0:0::/root:/bin/sh\n");
    // A state folder others can write is refused.
    fs::remove_file(beside(".damage")).unwrap();
    fs::set_permissions(db.parent().unwrap(), fs::Permissions::from_mode(0o777)).unwrap();
    let r = intact!("check", "-q", "--state", &db, &root).expect_code(1);
    assert!(r.stderr.contains("others can write in it"), "{}", r.stderr);
}

/// Row 7: a repository word that begins with `-` reached borg's option parser
/// (`borg:--rsh=./evil.sh` ran evil.sh with `BORG_REPO` set): it is refused before any
/// program runs.
#[test]
fn a_repository_that_would_be_an_option_runs_nothing() {
    if !has("borg") {
        skip!("borg not installed");
    }
    let t = Tree::new();
    let f = t.write("tree/f", data(3000, 1));
    intact!("tag", "-q", &f).expect_code(0);
    flip_byte(&f, 5);
    let ran = t.path("evil-ran");
    let evil = t.write(
        "evil.sh",
        format!("#!/bin/sh\ntouch {}\nexec ssh \"$@\"\n", ran.display()),
    );
    fs::set_permissions(&evil, fs::Permissions::from_mode(0o755)).unwrap();
    for from in [format!("borg:--rsh={}", evil.display()), "borg:-e".into()] {
        let r = cmd!("repair", "--from", &from, t.path("tree"))
            .env("BORG_REPO", "ssh://nas/./repo")
            .within(LIMIT)
            .run()
            .expect_code(2);
        assert!(r.stderr.contains("may not begin with '-'"), "{}", r.stderr);
        assert!(!ran.exists(), "{from} ran a program");
    }
}

/// Row 3: a tree PATH through a folder another user owns was followed wherever they pointed
/// it: `mv bob bob.old; ln -s /root/only bob` made root's nightly `scrub --update` tag root's
/// private files. As root, a PATH with a step another user can swap is not followed (exit 3),
/// while a tree of theirs under root's folders stays fine.
#[test]
fn a_tree_path_another_user_can_swap_is_not_followed_as_root() {
    require_root!();
    let t = Tree::new();
    t.open_to_all();
    let shared = t.path("tU");
    let bob = shared.join("bob");
    t.write("tU/bob/photo", data(2000, 1));
    for p in [&shared, &bob, &bob.join("photo")] {
        std::os::unix::fs::chown(p, Some(65534), Some(65534)).unwrap();
    }
    let db = t.path("state/state.db");
    cmd!("scrub", "--update", "-q", "--state", &db, &bob)
        .within(LIMIT)
        .run()
        .expect_code(0);
    let private = t.write("root-only/shadow", b"root's own");
    fs::set_permissions(&private, fs::Permissions::from_mode(0o600)).unwrap();
    assert!(as_nobody(
        "mv",
        &[bob.as_ref(), shared.join("bob.old").as_ref()]
    ));
    assert!(as_nobody(
        "ln",
        &["-s".as_ref(), t.path("root-only").as_ref(), bob.as_ref()]
    ));
    let r = cmd!("scrub", "--update", "-q", "--state", &db, &bob)
        .within(LIMIT)
        .run()
        .expect_code(3);
    assert!(r.stderr.contains("not followed as root"), "{}", r.stderr);
    assert_eq!(getxattr(&private, TAG), None, "root's file was tagged");
}

/// Row 4: `repair --missing` brought another user's private file back as root's, mode 0644,
/// readable by everyone. Now each file gets the owner, group and mode its entry recorded (or,
/// once a scrub found it gone, its row of files gone), and a folder made again for it is
/// 0700 and its owner's (in a sticky folder, the file's).
#[test]
fn a_file_brought_back_is_its_owner_s_as_private_as_it_was() {
    require_root!();
    for scrubbed in [false, true] {
        brought_back(scrubbed);
    }
}

fn brought_back(scrubbed: bool) {
    let t = Tree::new();
    t.open_to_all();
    let root = t.path("tree");
    let shared = root.join("shared");
    fs::create_dir_all(&shared).unwrap();
    fs::set_permissions(&shared, fs::Permissions::from_mode(0o1777)).unwrap();
    let own = |p: &Path, uid: u32, gid: u32, mode: u32| {
        std::os::unix::fs::chown(p, Some(uid), Some(gid)).unwrap();
        fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
    };
    let diary = t.write("tree/shared/nobody/diary.txt", data(3000, 1));
    let notes = t.write("tree/shared/notes.txt", data(2000, 2));
    let report = t.write("tree/report.txt", data(1000, 3));
    // Files that stay: the three gone are not the whole tree (an alarm, not a deletion).
    for i in 0..5 {
        t.write(format!("tree/kept{i}"), data(500, 10 + i));
    }
    own(&shared.join("nobody"), 65534, 65534, 0o700);
    own(&diary, 65534, 65534, 0o600);
    own(&notes, 65534, 65534, 0o640);
    own(&report, 0, 4, 0o640);
    let db = t.path("state/state.db");
    cmd!("tag", "-q", "--state", &db, &root)
        .within(LIMIT)
        .run()
        .expect_code(0);
    let backup = t.path("backup");
    copy_tree(&root, &backup);
    assert!(as_nobody(
        "rm",
        &["-r".as_ref(), shared.join("nobody").as_ref()]
    ));
    assert!(as_nobody("rm", &[notes.as_ref()]));
    fs::remove_file(&report).unwrap();
    if scrubbed {
        cmd!("scrub", "-q", "--state", &db, &root)
            .within(LIMIT)
            .run();
        let known: i64 = rusqlite::Connection::open(&db)
            .unwrap()
            .query_row(
                "SELECT count(*) FROM gone WHERE length(owner) = 12",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(known, 3, "the files gone keep their owners");
    }
    let r = cmd!(
        "repair",
        "--missing",
        "--from",
        &backup,
        "--state",
        &db,
        &root
    )
    .within(LIMIT)
    .run()
    .expect_code(0);
    assert!(!r.stdout.contains("mode 0600"), "{}", r.stdout);
    let is = |p: &Path| {
        let m = fs::symlink_metadata(p).unwrap();
        (m.uid(), m.gid(), m.mode() & 0o7777)
    };
    assert_eq!(is(&diary), (65534, 65534, 0o600), "{}", r.stdout);
    assert_eq!(is(&shared.join("nobody")), (65534, 65534, 0o700));
    assert_eq!(is(&notes), (65534, 65534, 0o640));
    assert_eq!(is(&report), (0, 4, 0o640));
    assert_eq!(fs::read(&diary).unwrap(), data(3000, 1));
    // Its owner reads it, as before.
    assert!(as_nobody("cat", &[diary.as_ref()]));
    intact!("check", "-q", "--state", &db, &root).expect_code(0);
}

/// Row 9: folders nested past PATH_MAX (4,096 bytes; any user of a tree can make them) made
/// every run fail (exit 3, "File name too long") and left what is below unverified. Now a
/// file below is tagged, checked, scrubbed, protected, found damaged and repaired like any
/// other.
#[test]
fn a_file_deeper_than_path_max_is_verified_like_any_other() {
    use rustix::fs::{Mode, OFlags};
    let t = Tree::new();
    let root = t.path("tree");
    t.write("tree/top.txt", b"top");
    let name = "d".repeat(250);
    let dir_flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let mut dir = rustix::fs::open(&root, dir_flags, Mode::empty()).unwrap();
    for _ in 0..20 {
        rustix::fs::mkdirat(&dir, name.as_str(), Mode::from_raw_mode(0o755)).unwrap();
        dir = rustix::fs::openat(&dir, name.as_str(), dir_flags, Mode::empty()).unwrap();
    }
    let deep = |flags: OFlags| {
        let fd = rustix::fs::openat(&dir, "deep.txt", flags, Mode::from_raw_mode(0o644)).unwrap();
        fs::File::from(fd)
    };
    {
        use std::io::Write;
        let mut f = deep(OFlags::WRONLY | OFlags::CREATE);
        f.write_all(&data(5000, 9)).unwrap();
    }
    let db = t.path("state/state.db");
    for verb in ["tag", "check", "update", "scrub", "protect"] {
        let r = cmd!(verb, "--state", &db, &root).within(LIMIT).run();
        assert_eq!(r.code, 0, "{verb}: {}{}", r.stdout, r.stderr);
        assert!(r.stderr.contains("2 files"), "{verb}: {}", r.stderr);
    }
    // Rot below: found, under its whole path.
    {
        use std::os::unix::fs::FileExt;
        let f = deep(OFlags::RDWR);
        let before = rustix::fs::fstat(&f).unwrap();
        let mut b = [0u8; 1];
        f.read_exact_at(&mut b, 100).unwrap();
        f.write_all_at(&[b[0] ^ 1], 100).unwrap();
        let at = |sec: i64, nsec: u64| rustix::fs::Timespec {
            tv_sec: sec,
            tv_nsec: nsec as _,
        };
        let times = rustix::fs::Timestamps {
            last_access: at(before.st_atime as i64, before.st_atime_nsec as u64),
            last_modification: at(before.st_mtime as i64, before.st_mtime_nsec as u64),
        };
        rustix::fs::futimens(&f, &times).unwrap();
    }
    let r = cmd!("check", "--state", &db, &root).within(LIMIT).run();
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("corrupt "), "{}", r.stdout);
    assert!(r.stdout.contains("/deep.txt"), "{}", r.stdout);
    // Repaired from its parity, and known repaired.
    let r = cmd!("repair", "--state", &db, &root).within(LIMIT).run();
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(r.stderr.contains("1 repaired"), "{}", r.stderr);
    let mut back = Vec::new();
    std::io::Read::read_to_end(&mut deep(OFlags::RDONLY), &mut back).unwrap();
    assert!(back == data(5000, 9), "not the bytes it had");
    let r = cmd!("check", "--state", &db, &root).within(LIMIT).run();
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
}
