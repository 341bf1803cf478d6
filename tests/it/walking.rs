//! Walking trees: what is followed (nothing), skipped, escaped, excluded, and in what order.

#![allow(unsafe_code)]

use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::symlink;

use crate::common::*;

#[test]
fn symlinks_are_never_followed() {
    let outside = Tree::new();
    let target = outside.write("target.txt", b"outside the tree");
    outside.write("dir/inner.txt", b"also outside");
    let t = Tree::new();
    t.write("real.txt", b"inside");
    symlink(&target, t.path("to-file")).unwrap();
    symlink(outside.path("dir"), t.path("to-dir")).unwrap();
    fs::create_dir(t.path("sub")).unwrap();
    symlink("..", t.path("sub/loop")).unwrap();

    let j = intact!("tag", "--json", t.root()).expect_code(0).json();
    assert_eq!(j.files.len(), 4);
    for link in ["to-file", "to-dir", "sub/loop"] {
        assert_eq!(j.status(link), "skipped");
        assert_eq!(j.file(link)["skip"], "symlink");
    }
    assert!(getxattr(&target, TAG).is_none(), "tagged through a symlink");
    assert!(getxattr(&outside.path("dir/inner.txt"), TAG).is_none());

    // A symlink given on the command line is followed, as `find -H` does: it names the tree
    // the user means (here one whose file is not tagged: nothing verified, exit 3).
    let r = intact!("check", "-v", t.path("to-dir")).expect_code(3);
    assert!(r.stdout.contains("inner.txt"), "{}", r.stdout);
    assert!(
        r.stderr.contains("is tagged: nothing was verified"),
        "{}",
        r.stderr
    );
    // Inside a tree, never.
    let r = intact!("check", "-v", t.root()).expect_code(0);
    assert!(
        r.stdout.contains("symbolic link, not followed"),
        "{}",
        r.stdout
    );
}

#[test]
fn hard_links_are_hashed_once() {
    let t = Tree::new();
    let a = t.write("a", data(100_000, 9));
    fs::hard_link(&a, t.path("b")).unwrap();
    fs::hard_link(&a, t.path("c")).unwrap();
    let j = intact!("tag", "--json", t.root()).expect_code(0).json();
    assert_eq!(j.summary["bytes"], 100_000);
    assert_eq!(j.file("a")["action"], "tagged");
    assert_eq!(j.file("b")["skip"], "hard-link");
    assert_eq!(j.file("c")["skip"], "hard-link");
    let j = intact!("check", "--json", t.root()).expect_code(0).json();
    assert_eq!(j.summary["bytes"], 100_000);
    assert_eq!(j.status("a"), "ok");
    // The tag lives on the inode, so every name carries it.
    assert_eq!(getxattr(&t.path("c"), TAG), getxattr(&a, TAG));

    // Damage is counted in one unit, names, for its status and for what was done.
    flip_byte(&a, 500);
    let j = intact!("update", "--json", t.root()).expect_code(1).json();
    assert_eq!(j.count("corrupt"), 3);
    assert_eq!(j.summary["actions"]["kept"], 3);
    for name in ["a", "b", "c"] {
        assert_eq!(j.file(name)["action"], "kept", "{name}");
    }
}

#[test]
fn a_path_that_is_not_there_is_said_so_and_counts_no_file() {
    let t = Tree::new();
    t.write("a", b"here");
    intact!("tag", "-q", t.root()).expect_code(0);
    let typo = t.path("nope");
    let j = intact!("check", "--json", &typo, t.root())
        .expect_code(3)
        .json();
    assert_eq!(j.summary["files"], 1);
    assert_eq!(j.status("a"), "ok");
    let errors = j.summary["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 1, "{errors:?}");
    let said = errors[0].as_str().unwrap();
    assert!(said.ends_with("nope: no such file or directory"), "{said}");
    let r = intact!("check", &typo).expect_code(3);
    assert!(!r.stdout.contains("vanished"), "{}", r.stdout);
    assert!(r.stderr.contains("check: 0 files"), "{}", r.stderr);
    assert!(
        r.stderr.contains("no such file or directory"),
        "{}",
        r.stderr
    );
}

#[test]
fn special_files_are_skipped_without_blocking() {
    let t = Tree::new();
    t.write("file", b"data");
    let fifo = std::ffi::CString::new(t.path("fifo").as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid C string path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    let j = intact!("tag", "--json", t.root()).expect_code(0).json();
    assert_eq!(j.file("fifo")["skip"], "special");
    assert_eq!(j.status("file"), "new");
    // Named directly, a FIFO is skipped too rather than opened for reading; and a check that
    // verified nothing says so.
    let r = intact!("check", "--json", t.path("fifo")).expect_code(3);
    let j = r.json();
    assert_eq!(j.status("fifo"), "skipped");
    assert!(
        j.summary["errors"][0]
            .as_str()
            .unwrap()
            .contains("not a regular file or a directory"),
        "{}",
        j.summary
    );
}

#[test]
fn odd_names_are_processed_and_printed_escaped() {
    let t = Tree::new();
    let invalid = t.root().join(OsStr::from_bytes(b"caf\xe9.txt"));
    let newline = t.path("two\nlines.txt");
    let backslash = t.path("back\\slash.txt");
    for p in [&invalid, &newline, &backslash] {
        fs::write(p, b"odd").unwrap();
    }
    intact!("tag", t.root()).expect_code(0);
    for p in [&invalid, &newline, &backslash] {
        assert!(getxattr(p, TAG).is_some(), "{p:?} not tagged");
        flip_byte(p, 1);
    }
    let r = intact!("check", t.root()).expect_code(1);
    let root = t.root().display();
    assert_eq!(
        r.stdout,
        format!(
            "corrupt  {root}/back\\\\slash.txt\ncorrupt  {root}/caf\\xe9.txt\ncorrupt  {root}/two\\nlines.txt\n"
        )
    );
    let j = intact!("check", "--json", t.root()).json();
    assert_eq!(j.status("caf\\xe9.txt"), "corrupt");
    assert_eq!(j.status("two\\nlines.txt"), "corrupt");
}

#[test]
fn hidden_files_are_included_and_excludes_apply() {
    let t = Tree::new();
    t.write(".hidden", b"h");
    t.write(".config/settings", b"s");
    t.write("keep.txt", b"k");
    t.write("scratch.tmp", b"t");
    t.write("cache/blob", b"c");
    t.write("docs/draft.bak", b"d");
    t.write("docs/.intactignore", b"*.bak\n");
    let j = intact!(
        "tag",
        "--exclude",
        "*.tmp",
        "--exclude",
        "cache/",
        "--json",
        t.root()
    )
    .expect_code(0)
    .json();
    let paths: Vec<&str> = j
        .files
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    let root = t.root().display().to_string();
    let rel: Vec<String> = paths
        .iter()
        .map(|p| p.strip_prefix(&root).unwrap().to_string())
        .collect();
    assert_eq!(
        rel,
        [
            "/.config/settings",
            "/.hidden",
            "/docs/.intactignore",
            "/keep.txt"
        ]
    );
    assert!(getxattr(&t.path("scratch.tmp"), TAG).is_none());
}

#[test]
fn one_file_system_stays_on_the_root_device() {
    require_root!();
    let t = Tree::new();
    t.write("here.txt", b"root fs");
    let m = Mount::new("tmpfs", "size=1m", t.path("mnt"));
    fs::write(m.0.join("there.txt"), b"other fs").unwrap();
    let all = intact!("show", "--json", t.root()).json();
    assert_eq!(all.files.len(), 2);
    let one = intact!("show", "-x", "--json", t.root()).json();
    assert_eq!(one.files.len(), 1);
    assert_eq!(one.status("here.txt"), "new");
}

#[test]
fn output_order_is_the_same_with_one_thread_and_many() {
    let t = Tree::new();
    for d in 0..12 {
        for f in 0..40 {
            // Mixed sizes so that workers finish out of order.
            let len = if f % 13 == 0 {
                2_000_000
            } else {
                1 + (d * 40 + f) * 37
            };
            t.write(format!("d{d:02}/f{f:03}"), data(len, (d * 100 + f) as u64));
        }
    }
    intact!("tag", t.root()).expect_code(0);
    flip_byte(&t.path("d03/f013"), 10);
    let run = |threads: &str| {
        let j = intact!("check", "-j", threads, "--json", t.root())
            .expect_code(1)
            .json();
        j.files
            .iter()
            .map(|f| format!("{} {}", f["status"], f["path"]))
            .collect::<Vec<_>>()
    };
    let one = run("1");
    assert_eq!(one.len(), 480);
    let mut sorted = one.clone();
    sorted.sort_by_key(|l| l.split_once(' ').unwrap().1.to_string());
    assert_eq!(one, sorted, "not in path order");
    assert_eq!(run("8"), one);
    assert_eq!(run("3"), one);
}
