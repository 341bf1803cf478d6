//! The classification table end to end: real files, real xattrs, real damage.

use std::fs;
use std::os::unix::fs::FileExt;

use crate::common::*;

fn tagged_tree(algo: &str) -> Tree {
    let t = Tree::new();
    t.write("a.txt", b"alpha\n");
    t.write("dir/b.bin", data(300_000, 1));
    t.write("dir/deeper/c.bin", data(5_000_000, 2));
    let r = intact!("tag", "--algo", algo, t.root()).expect_code(0);
    assert!(r.stdout.is_empty(), "tag printed {:?}", r.stdout);
    t
}

fn check(t: &Tree) -> Run {
    intact!("check", "--json", t.root())
}

#[test]
fn tag_then_check_is_all_ok() {
    for algo in ALGOS {
        let t = tagged_tree(algo);
        let tag = intact_tag(&t.path("a.txt"));
        assert_eq!((tag.algo, tag.size), (algo, 6), "{tag:?}");
        let (sec, nsec) = tag.mtime;
        assert_eq!((sec, nsec as i64), mtime(&t.path("a.txt")));
        let data = fs::read(t.path("a.txt")).unwrap();
        if algo == "sha256" {
            assert_eq!(
                tag.digest,
                <sha2::Sha256 as sha2::Digest>::digest(&data).to_vec()
            );
        }
        let r = check(&t).expect_code(0);
        let j = r.json();
        assert_eq!(j.count("ok"), 3, "{algo}");
        assert_eq!(
            j.summary["bytes"].as_u64().unwrap(),
            6 + 300_000 + 5_000_000
        );
        let a = j.file("a.txt");
        assert_eq!(a["algo"], algo);
        assert_eq!(a["expected"], a["actual"]);
        // Human output of a clean check: nothing on stdout, a summary on stderr.
        let human = intact!("check", t.root()).expect_code(0);
        assert_eq!(human.stdout, "");
        assert!(human.stderr.contains("3 ok"), "{}", human.stderr);
    }
}

#[test]
fn second_tag_reads_no_data() {
    let t = tagged_tree("sha256");
    let before = getxattr(&t.path("dir/b.bin"), TAG);
    let j = intact!("tag", "--json", t.root()).expect_code(0).json();
    assert_eq!(j.summary["bytes"], 0);
    assert_eq!(j.count("already-tagged"), 3);
    assert_eq!(getxattr(&t.path("dir/b.bin"), TAG), before, "tag rewritten");
    // --force reads and re-tags everything.
    let j = intact!("tag", "--force", "--json", t.root())
        .expect_code(0)
        .json();
    assert_eq!(j.summary["bytes"].as_u64().unwrap(), 5_300_006);
    assert_eq!(j.summary["actions"]["tagged"], 3);
}

#[test]
fn tagging_keeps_data_and_mtime() {
    let t = Tree::new();
    let p = t.write("f", data(70_000, 3));
    set_mtime(&p, (1_500_000_000, 123_456_789));
    intact!("tag", t.root()).expect_code(0);
    assert_eq!(mtime(&p), (1_500_000_000, 123_456_789));
    assert_eq!(fs::read(&p).unwrap(), data(70_000, 3));
    assert_eq!(intact_tag(&p).mtime, (1_500_000_000, 123_456_789));
}

#[test]
fn flipped_byte_is_corrupt_and_update_keeps_the_evidence() {
    for algo in ALGOS {
        let t = tagged_tree(algo);
        let victim = t.path("dir/deeper/c.bin");
        let old_tag = getxattr(&victim, TAG).unwrap();
        flip_byte(&victim, 2_500_000);

        let j = check(&t).expect_code(1).json();
        assert_eq!(j.status("c.bin"), "corrupt");
        assert_ne!(j.file("c.bin")["expected"], j.file("c.bin")["actual"]);
        assert_eq!(j.count("ok"), 2);
        // The second run knows the damage (from the state database), and says since when.
        let human = intact!("check", t.root()).expect_code(1);
        let line = format!("corrupt  {}: found damaged at ", victim.display());
        assert!(human.stdout.starts_with(&line), "{}", human.stdout);
        assert!(
            human.stdout.ends_with(", not yet repaired\n"),
            "{}",
            human.stdout
        );
        assert_eq!(human.stdout.lines().count(), 1, "{}", human.stdout);

        let up = intact!("update", "--json", t.root()).expect_code(1);
        assert_eq!(up.json().file("c.bin")["action"], "kept");
        assert_eq!(
            getxattr(&victim, TAG).unwrap(),
            old_tag,
            "update re-baselined corruption"
        );
        check(&t).expect_code(1);

        // Accepting is an answer to the damage: the run that accepts it exits 0.
        let acc = intact!("update", "--accept-corrupt", "--json", t.root()).expect_code(0);
        assert_eq!(acc.json().file("c.bin")["action"], "accepted");
        assert_ne!(getxattr(&victim, TAG).unwrap(), old_tag);
        check(&t).expect_code(0);
    }
}

#[test]
fn truncated_or_extended_under_the_same_mtime_is_corrupt() {
    for algo in ALGOS {
        let t = tagged_tree(algo);
        behind_the_back(&t.path("dir/b.bin"), |p| {
            fs::OpenOptions::new()
                .write(true)
                .open(p)
                .unwrap()
                .set_len(1000)
                .unwrap();
        });
        behind_the_back(&t.path("a.txt"), |p| {
            fs::OpenOptions::new()
                .append(true)
                .open(p)
                .unwrap()
                .write_at(b"!", 6)
                .unwrap();
        });
        let j = check(&t).expect_code(1).json();
        assert_eq!(j.status("b.bin"), "corrupt");
        assert_eq!(j.status("a.txt"), "corrupt");
        assert_eq!(j.file("b.bin")["size"], 1000);
        // show tells from metadata alone that the size moved under a fixed mtime.
        let s = intact!("show", "--json", t.root()).json();
        assert_eq!(s.status("b.bin"), "corrupt");
        assert_eq!(s.summary["bytes"], 0);
    }
}

#[test]
fn edit_with_newer_mtime_is_modified_and_update_retags() {
    for algo in ALGOS {
        let t = tagged_tree(algo);
        let p = t.path("a.txt");
        let (sec, nsec) = mtime(&p);
        fs::write(&p, b"alpha, edited\n").unwrap();
        set_mtime(&p, (sec + 10, nsec));
        let j = check(&t).expect_code(0).json();
        assert_eq!(j.status("a.txt"), "modified");
        let human = intact!("check", t.root()).expect_code(0);
        assert_eq!(human.stdout, format!("modified {}\n", p.display()));

        let up = intact!("update", "--json", t.root()).expect_code(0);
        let f = up.json();
        assert_eq!(f.file("a.txt")["action"], "tagged");
        assert_eq!(f.file("a.txt")["algo"], algo);
        assert_eq!(f.count("ok"), 2);
        let after = check(&t).expect_code(0).json();
        assert_eq!(after.count("ok"), 3);
    }
}

#[test]
fn mtime_only_change_is_touched_and_update_refreshes() {
    for algo in ALGOS {
        let t = tagged_tree(algo);
        let p = t.path("a.txt");
        let (sec, nsec) = mtime(&p);
        set_mtime(&p, (sec + 100, nsec));
        let j = check(&t).expect_code(0).json();
        assert_eq!(j.status("a.txt"), "touched");
        // Quiet by default: a touch is not worth a line.
        let human = intact!("check", t.root()).expect_code(0);
        assert_eq!(human.stdout, "");
        let up = intact!("update", "--json", t.root()).json();
        assert_eq!(up.file("a.txt")["action"], "refreshed");
        let (tsec, tnsec) = intact_tag(&p).mtime;
        assert_eq!((tsec, tnsec as i64), (sec + 100, nsec));
        assert_eq!(check(&t).json().status("a.txt"), "ok");
    }
}

#[test]
fn older_mtime_with_new_content_is_older() {
    for algo in ALGOS {
        let t = tagged_tree(algo);
        let p = t.path("a.txt");
        let (sec, nsec) = mtime(&p);
        fs::write(&p, b"an older version\n").unwrap();
        set_mtime(&p, (sec - 3600, nsec));
        let j = check(&t).expect_code(0).json();
        assert_eq!(j.status("a.txt"), "older");
        let up = intact!("update", "--json", t.root()).json();
        assert_eq!(up.file("a.txt")["action"], "tagged");
        assert_eq!(check(&t).json().status("a.txt"), "ok");
    }
}

#[test]
fn mtime_window_absorbs_coarse_timestamps() {
    let t = tagged_tree("sha256");
    let p = t.path("a.txt");
    let (sec, _) = mtime(&p);
    behind_the_back(&p, |p| fs::write(p, b"alphA\n").unwrap());
    set_mtime(&p, (sec + 1, 0));
    assert_eq!(check(&t).json().status("a.txt"), "modified");
    let r = intact!("check", "--mtime-window", "2", "--json", t.root());
    assert_eq!(r.expect_code(1).json().status("a.txt"), "corrupt");
}

#[test]
fn mtime_zero_and_empty_files() {
    for algo in ALGOS {
        let t = Tree::new();
        let zero = t.write("zero", b"ostree");
        let empty = t.write("empty", b"");
        set_mtime(&zero, (0, 0));
        set_mtime(&empty, (0, 0));
        intact!("tag", "--algo", algo, t.root()).expect_code(0);
        assert_eq!(intact_tag(&zero).mtime, (0, 0));
        assert_eq!(check(&t).expect_code(0).json().count("ok"), 2);
        flip_byte(&zero, 0);
        behind_the_back(&empty, |p| fs::write(p, b"x").unwrap());
        let j = check(&t).expect_code(1).json();
        assert_eq!(j.status("zero"), "corrupt");
        assert_eq!(j.status("empty"), "corrupt");
    }
}

#[test]
fn files_around_the_buffer_size() {
    const BUF: usize = 1 << 20;
    for algo in ALGOS {
        let t = Tree::new();
        for (name, len) in [
            ("minus", BUF - 1),
            ("exact", BUF),
            ("plus", BUF + 1),
            ("two", 2 * BUF),
        ] {
            t.write(name, data(len, len as u64));
        }
        intact!("tag", "--algo", algo, t.root()).expect_code(0);
        assert_eq!(check(&t).expect_code(0).json().count("ok"), 4);
        // Damage in the last byte, i.e. the byte after a full buffer, must be seen.
        flip_byte(&t.path("plus"), BUF as u64);
        flip_byte(&t.path("exact"), BUF as u64 - 1);
        let j = check(&t).expect_code(1).json();
        assert_eq!(j.status("plus"), "corrupt");
        assert_eq!(j.status("exact"), "corrupt");
        assert_eq!(j.status("minus"), "ok");
    }
}

#[test]
fn sparse_3_gib_file() {
    let t = Tree::new();
    let p = t.path("sparse");
    let f = fs::File::create(&p).unwrap();
    f.set_len(3 << 30).unwrap();
    f.write_at(b"end", (3 << 30) - 3).unwrap();
    drop(f);
    let j = intact!("tag", "--json", t.root()).expect_code(0).json();
    assert_eq!(j.summary["bytes"].as_u64().unwrap(), 3 << 30);
    assert_eq!(intact_tag(&p).size, 3u64 << 30);
    flip_byte(&p, 1 << 30);
    assert_eq!(check(&t).expect_code(1).json().status("sparse"), "corrupt");
}

#[test]
fn new_files_are_reported_by_check_and_tagged_by_update() {
    for algo in ALGOS {
        let t = tagged_tree(algo);
        t.write("late.txt", b"added later");
        let j = check(&t).expect_code(0).json();
        assert_eq!(j.status("late.txt"), "new");
        assert!(
            getxattr(&t.path("late.txt"), TAG).is_none(),
            "check wrote a tag"
        );
        let up = intact!("update", "--algo", algo, "--json", t.root());
        assert_eq!(up.json().file("late.txt")["action"], "tagged");
        assert_eq!(intact_tag(&t.path("late.txt")).algo, algo);
    }
}

#[test]
fn update_with_another_algorithm_migrates_on_retag() {
    let t = tagged_tree("sha256");
    let p = t.path("a.txt");
    let (sec, nsec) = mtime(&p);
    fs::write(&p, b"new text\n").unwrap();
    set_mtime(&p, (sec + 5, nsec));
    let j = intact!("update", "--algo", "blake3", "--json", t.root())
        .expect_code(0)
        .json();
    assert_eq!(j.status("a.txt"), "modified");
    // Ok files are upgraded too: --algo asks for it.
    assert_eq!(j.file("b.bin")["action"], "tagged");
    for f in ["a.txt", "dir/b.bin", "dir/deeper/c.bin"] {
        assert_eq!(intact_tag(&t.path(f)).algo, "blake3", "{f}");
    }
    assert_eq!(check(&t).expect_code(0).json().count("ok"), 3);
}

#[test]
fn check_never_writes() {
    let t = tagged_tree("sha256");
    t.write("new", b"untagged");
    flip_byte(&t.path("dir/b.bin"), 7);
    let snapshot = |t: &Tree| {
        ["a.txt", "new", "dir/b.bin", "dir/deeper/c.bin"]
            .map(|f| {
                let st = rustix::fs::stat(t.path(f)).unwrap();
                (
                    getxattr(&t.path(f), TAG),
                    st.st_ctime,
                    st.st_ctime_nsec,
                    fs::read(t.path(f)).unwrap(),
                )
            })
            .to_vec()
    };
    let before = snapshot(&t);
    check(&t).expect_code(1);
    assert!(
        before == snapshot(&t),
        "check changed a file, a tag or a ctime"
    );
}

#[test]
fn strip_removes_only_intacts_tag() {
    let t = tagged_tree("sha256");
    setxattr(&t.path("a.txt"), "user.other", b"keep me");
    let r = intact!("strip", "--json", t.root()).expect_code(0);
    assert_eq!(r.json().summary["actions"]["removed"], 3);
    assert!(getxattr(&t.path("a.txt"), TAG).is_none());
    assert_eq!(
        getxattr(&t.path("a.txt"), "user.other").unwrap(),
        b"keep me"
    );
    assert_eq!(check(&t).json().count("new"), 3);
}

#[test]
fn an_edit_in_the_second_a_file_was_tagged_is_not_corruption_on_whole_second_timestamps() {
    require_faults!();
    let t = Tree::new();
    // 128-byte inodes have no room for nanoseconds: every timestamp is a whole second.
    let disk = crate::faultfs::LoopFs::ext4(t.root(), 32, &["-I", "128"]);
    for round in 0..4 {
        let f = disk.root.join(format!("f{round}"));
        fs::write(&f, b"first version").unwrap();
        intact!("tag", &f).expect_code(0);
        // Same size, and (before the fix) the same second as the tag: the mtime cannot move.
        fs::write(&f, b"second versio").unwrap();
        let j = intact!("check", "--json", &f).expect_code(0).json();
        assert_eq!(j.files[0]["status"], "modified", "round {round}");
    }
}

#[test]
fn large_files_hashed_side_by_side_keep_their_own_verdicts_in_walk_order() {
    // Large enough that each worker lends its slot on and SHA-256 goes from reading to
    // mapping once the others crowd in; small files between them take the slots lent.
    let t = Tree::new();
    for i in 0..5u64 {
        t.write(format!("d/{i}-large"), data(17 << 20, i));
        t.write(format!("d/{i}-small"), data(5_000, 10 + i));
    }
    intact!("tag", t.root()).expect_code(0);
    flip_byte(&t.path("d/3-large"), (17 << 20) - 5);
    flip_byte(&t.path("d/1-small"), 10);
    let paths = |j: &Json| -> Vec<String> {
        j.files
            .iter()
            .map(|f| f["path"].as_str().unwrap().to_string())
            .collect()
    };
    let one = intact!("check", "--json", "--no-state", "--threads", "1", t.root())
        .expect_code(1)
        .json();
    let j = intact!("check", "--json", "--no-state", t.root())
        .expect_code(1)
        .json();
    assert_eq!(paths(&j), paths(&one), "the output order is the walk's");
    assert_eq!(j.status("3-large"), "corrupt");
    assert_eq!(j.status("1-small"), "corrupt");
    assert_eq!(j.count("ok"), 8);
    for f in &j.files {
        let name = f["path"].as_str().unwrap();
        let same = one.files.iter().find(|o| o["path"] == f["path"]).unwrap();
        assert_eq!(
            f["actual"], same["actual"],
            "{name}: the digest of its own bytes"
        );
    }
}
