//! Tags written by hand with raw setxattr: malformed ones, and those of cshatag/shatag and
//! the Dintch family.

use std::fs;

use crate::common::*;
use sha2::Digest as _;

fn sha256(data: &[u8]) -> [u8; 32] {
    sha2::Sha256::digest(data).into()
}

#[test]
fn malformed_tags_are_untagged_with_a_warning() {
    let t = Tree::new();
    let good = "v=1 sha256=2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824 size=5 mtime=1.000000000 tagged=1";
    let cases: [(&str, &[u8]); 6] = [
        ("empty", b""),
        ("garbage", b"not a tag at all"),
        ("nonhex", b"v=1 sha256=zzf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824 size=5 mtime=1.000000000"),
        ("truncated", &good.as_bytes()[..40]),
        ("version", b"v=9 sha256=2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824 size=5 mtime=1.000000000"),
        ("binary", b"\x00\xff\x10"),
    ];
    for (name, value) in cases {
        let p = t.write(name, b"hello");
        setxattr(&p, TAG, value);
    }
    let r = intact!("check", t.root()).expect_code(3);
    for (name, _) in cases {
        assert!(
            r.stderr.contains(&format!(
                "warning: {}: ignoring malformed user.intact",
                t.path(name).display()
            )),
            "{name}: {}",
            r.stderr
        );
        assert!(
            r.stdout
                .contains(&format!("new      {}\n", t.path(name).display())),
            "{}",
            r.stdout
        );
    }
    let j = intact!("check", "--json", t.root()).expect_code(3).json();
    assert_eq!(j.count("new"), cases.len() as u64);
    assert_eq!(j.summary["malformed_tags"], cases.len() as u64);
    assert!(
        j.file("garbage")["warnings"][0]
            .as_str()
            .unwrap()
            .contains("malformed")
    );

    // update replaces them with valid tags; then all is well.
    intact!("update", t.root()).expect_code(0);
    assert_eq!(
        intact!("check", "--json", t.root())
            .expect_code(0)
            .json()
            .count("ok"),
        6
    );
}

#[test]
fn cshatag_and_shatag_tags_are_checked() {
    let t = Tree::new();
    let body = b"photo bytes".as_slice();
    let hex = hex::encode(sha256(body));
    // cshatag 2.x, old cshatag (trailing NUL), shatag (Python float timestamp).
    type Style = (&'static str, Vec<u8>, fn(i64, i64) -> String);
    let styles: [Style; 3] = [
        ("cshatag", hex.clone().into_bytes(), |s, n| {
            format!("{s:010}.{n:09}")
        }),
        ("old-cshatag", format!("{hex}\0").into_bytes(), |s, n| {
            format!("{s:010}.{n:09}")
        }),
        ("shatag", hex.clone().into_bytes(), |s, n| {
            format!("{}", s as f64 + n as f64 / 1e9)
        }),
    ];
    for (name, hash, ts) in &styles {
        let p = t.write(name, body);
        set_mtime(&p, (1_560_177_334, 20_775_123));
        setxattr(&p, "user.shatag.sha256", hash);
        setxattr(
            &p,
            "user.shatag.ts",
            ts(1_560_177_334, 20_775_123).as_bytes(),
        );
    }
    let j = intact!("check", "--json", t.root()).expect_code(0).json();
    for (name, _, _) in &styles {
        assert_eq!(j.status(name), "ok", "{name}");
        assert_eq!(j.file(name)["format"], "shatag");
    }
    for (name, _, _) in &styles {
        flip_byte(&t.path(name), 3);
    }
    let j = intact!("check", "--json", t.root()).expect_code(1).json();
    for (name, _, _) in &styles {
        assert_eq!(j.status(name), "corrupt", "{name}");
    }
    // A newer mtime over the same damaged bytes (a touch) blesses nothing ...
    for (name, _, _) in &styles {
        set_mtime(&t.path(name), (1_600_000_000, 0));
    }
    let j = intact!("check", "--json", t.root()).expect_code(1).json();
    assert_eq!(j.count("corrupt"), 3);
    // ... while an edit with a newer mtime is an edit, in every style.
    for (name, _, _) in &styles {
        fs::write(t.path(name), b"edited photo").unwrap();
        set_mtime(&t.path(name), (1_600_000_000, 0));
    }
    let j = intact!("check", "--json", t.root()).expect_code(0).json();
    assert_eq!(j.count("modified"), 3);
}

#[test]
fn dintch_tags_are_checked_with_and_without_the_sync_suffix() {
    let t = Tree::new();
    let body = b"document".as_slice();
    for (name, attr) in [
        ("plain", "user.co.eclecticlight.dintch.hash"),
        ("synced", "user.co.eclecticlight.dintch.hash#S"),
    ] {
        let p = t.write(name, body);
        setxattr(&p, attr, &sha256(body));
    }
    let j = intact!("check", "--json", t.root()).expect_code(0).json();
    assert_eq!(j.status("plain"), "ok");
    assert_eq!(j.status("synced"), "ok");
    assert_eq!(j.file("synced")["format"], "dintch");

    // No mtime in a Dintch tag: a change is a mismatch whose cause cannot be told.
    flip_byte(&t.path("plain"), 0);
    flip_byte(&t.path("synced"), 0);
    let j = intact!("check", "--json", t.root()).expect_code(1).json();
    assert_eq!(j.status("plain"), "mismatch");
    assert_eq!(j.status("synced"), "mismatch");

    // ... unless the file was written after the recorded tagging time (with other bytes
    // than the damaged ones already found).
    behind_the_back(&t.path("plain"), |p| fs::write(p, b"docu-edit").unwrap());
    setxattr(
        &t.path("plain"),
        "user.co.eclecticlight.dintch.time",
        b"1000000000",
    );
    let j = intact!("check", "--json", t.root()).expect_code(1).json();
    assert_eq!(j.status("plain"), "modified");

    // A hash of the wrong length is malformed, not trusted.
    let bad = t.write("short", body);
    setxattr(
        &bad,
        "user.co.eclecticlight.dintch.hash",
        &sha256(body)[..20],
    );
    let r = intact!("check", t.root());
    assert!(
        r.stderr
            .contains("short: ignoring malformed user.co.eclecticlight.dintch.hash"),
        "{}",
        r.stderr
    );
}

#[test]
fn intact_tag_wins_over_foreign_ones_and_update_adopts_foreign() {
    let t = Tree::new();
    let body = b"shared".as_slice();
    let p = t.write("f", body);
    setxattr(&p, "user.co.eclecticlight.dintch.hash", &sha256(body));
    // update verifies the Dintch tag and adds intact's richer one.
    let j = intact!("update", "--json", t.root()).expect_code(0).json();
    assert_eq!(j.status("f"), "ok");
    assert_eq!(j.file("f")["action"], "tagged");
    let j = intact!("check", "--json", t.root()).expect_code(0).json();
    assert_eq!(j.file("f")["format"], "intact");
    // Tagging a file that only has a foreign tag reads nothing: it is tagged already.
    let q = t.write("g", body);
    setxattr(&q, "user.co.eclecticlight.dintch.hash", &sha256(body));
    let j = intact!("tag", "--json", q).expect_code(0).json();
    assert_eq!(j.status("g"), "already-tagged");
    assert!(getxattr(&q, TAG).is_none());
    let _ = fs::remove_file(q);
}

/// A tag fits inside the inode of a default ext4 (256-byte inodes): tagging 2,000 files
/// allocates no attribute block, which a version 1 tag (about 130 bytes) did for every file.
#[test]
fn tags_fit_in_the_inode_of_a_default_ext4() {
    require_faults!();
    use std::os::unix::fs::MetadataExt;
    let t = Tree::new();
    let disk = crate::faultfs::LoopFs::ext4(t.root(), 64, &[]);
    let files: Vec<_> = (0..2000)
        .map(|i| {
            let p = disk.root.join(format!("d{}/f{i}", i % 20));
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(&p, data(100 + i, i as u64)).unwrap();
            p
        })
        .collect();
    let blocks = || -> u64 {
        files
            .iter()
            .map(|p| fs::metadata(p).unwrap().blocks())
            .sum()
    };
    let before = blocks();
    intact!("tag", "--algo", "blake3", &disk.root).expect_code(0);
    intact!("tag", "--force", &disk.root).expect_code(0);
    assert_eq!(intact_tag(&files[7]).algo, "sha256");
    assert_eq!(blocks(), before, "tags took attribute blocks");
    assert_eq!(
        intact!("check", "--json", &disk.root)
            .expect_code(0)
            .json()
            .count("ok"),
        2000
    );
    // The measure can see a block: a value the size of a version 1 tag takes one.
    setxattr(&files[0], "user.v1-sized", &[b'x'; 130]);
    assert!(blocks() > before, "an attribute block went unnoticed");
}

/// Moving from cshatag is one command: `update` adopts a tree tagged by cshatag, and on an
/// edit re-tags the shatag tag the file carries too, so both tools keep working side by side
/// (before, the stale shatag tag made every later check a conflict, exit 3).
#[test]
fn update_keeps_the_cshatag_tags_a_tree_carries() {
    let t = Tree::new();
    let p = t.write("doc.txt", b"first draft");
    set_mtime(&p, (1_700_000_000, 5));
    setxattr(
        &p,
        "user.shatag.sha256",
        hex::encode(sha256(b"first draft")).as_bytes(),
    );
    setxattr(&p, "user.shatag.ts", b"1700000000.000000005");
    intact!("update", "-q", t.root()).expect_code(0);
    assert!(getxattr(&p, TAG).is_some(), "adopted");
    fs::write(&p, b"second draft").unwrap();
    set_mtime(&p, (1_800_000_000, 7));
    let j = intact!("update", "--json", t.root()).expect_code(0).json();
    assert_eq!(j.status("doc.txt"), "modified");
    assert_eq!(
        getxattr(&p, "user.shatag.sha256").unwrap(),
        hex::encode(sha256(b"second draft")).into_bytes()
    );
    assert_eq!(
        getxattr(&p, "user.shatag.ts").unwrap(),
        b"1800000000.000000007".to_vec()
    );
    intact!("check", t.root()).expect_code(0);
}
