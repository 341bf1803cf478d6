//! No hole in the damage memory: known damage ends only by repair, acceptance, a real edit or
//! deletion — never by excluding the file from a run, stripping its tag, or `tag --force`.

use std::fs;
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
