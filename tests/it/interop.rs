//! Meeting other tools where they are: their tags written and read back byte for byte,
//! manifests round-tripped through sha256sum, b3sum, rhash and hashdeep.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::*;
use sha2::Digest as _;

fn sha256(data: &[u8]) -> [u8; 32] {
    sha2::Sha256::digest(data).into()
}

/// A tree with the names that break naive manifests.
fn odd_tree(with_invalid_utf8: bool) -> (Tree, Vec<PathBuf>) {
    let t = Tree::new();
    let mut files = vec![
        t.write("plain.txt", b"plain"),
        t.write("with space.txt", b"space"),
        t.write("back\\slash.txt", b"backslash"),
        t.write("new\nline.txt", b"newline"),
        t.write("sub/dir/deep.bin", data(300_000, 5)),
    ];
    if with_invalid_utf8 {
        let p = t.root().join(OsStr::from_bytes(b"caf\xe9.txt"));
        fs::write(&p, b"latin-1").unwrap();
        files.push(p);
    }
    (t, files)
}

/// Runs a stock tool in `dir`; returns (exit code, stdout+stderr).
fn stock(dir: &Path, program: &str, args: &[&str]) -> (i32, String) {
    let out = Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("{program} is needed for this test (.ci/run installs it): {e}"));
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn export_passes_sha256sum_and_fails_after_damage() {
    let (t, files) = odd_tree(true);
    intact!("tag", t.root()).expect_code(0);
    let manifest = t.path("SHA256SUMS");
    let r = intact!("export", "-o", manifest, t.root()).expect_code(0);
    assert_eq!(r.stdout, "", "the manifest went to the file");
    let text = fs::read(&manifest).unwrap();
    assert_eq!(
        text.split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .count(),
        files.len()
    );
    assert!(
        text.windows(2).any(|w| w == b"\\\\"),
        "backslash not escaped"
    );
    assert!(
        !text.windows(3).any(|w| w == b"\\SH"),
        "manifest lists itself"
    );

    let (code, out) = stock(t.root(), "sha256sum", &["-c", "SHA256SUMS"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(out.matches(": OK").count(), files.len(), "{out}");

    flip_byte(&t.path("sub/dir/deep.bin"), 1000);
    let (code, out) = stock(t.root(), "sha256sum", &["-c", "SHA256SUMS"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("sub/dir/deep.bin: FAILED"), "{out}");
}

#[test]
fn export_blake3_passes_b3sum_and_fails_after_damage() {
    // b3sum cannot check names that are not UTF-8, so none here.
    let (t, files) = odd_tree(false);
    intact!("tag", "--algo", "blake3", t.root()).expect_code(0);
    let r = intact!("export", "--algo", "blake3", t.root()).expect_code(0);
    fs::write(t.path("B3SUMS"), &r.stdout).unwrap();
    let (code, out) = stock(t.root(), "b3sum", &["-c", "B3SUMS"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(out.matches(": OK").count(), files.len(), "{out}");
    flip_byte(&t.path("with space.txt"), 0);
    let (code, out) = stock(t.root(), "b3sum", &["-c", "B3SUMS"]);
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("with space.txt: FAILED"), "{out}");
}

#[test]
fn export_never_passes_off_a_partial_manifest() {
    let t = Tree::new();
    t.write("b3", b"blake3 tagged");
    intact!("tag", "--algo", "blake3", t.root()).expect_code(0);
    let r = intact!("export", t.root()).expect_code(3);
    assert_eq!(r.stdout, "");
    assert!(
        r.stderr
            .contains("tagged with blake3 only: `export --algo blake3` lists it"),
        "{}",
        r.stderr
    );
    // And tag --compat says when it cannot copy a SHA-256 it does not have.
    let r = intact!("tag", "--compat", "shatag", t.root()).expect_code(0);
    assert!(r.stdout.contains("no compat tags added"), "{}", r.stdout);
}

#[test]
fn export_reads_no_data_and_leaves_out_stale_tags() {
    let t = Tree::new();
    t.write("same", b"unchanged");
    let edited = t.write("edited", b"before");
    intact!("tag", t.root()).expect_code(0);
    let (sec, nsec) = mtime(&edited);
    fs::write(&edited, b"after").unwrap();
    set_mtime(&edited, (sec + 5, nsec));
    t.write("untagged", b"x");
    let r = intact!("export", "--json", t.root());
    // JSON and the manifest would share stdout: per-file reports go to stderr for export.
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(
        lines,
        [format!("{}  same", hex::encode(sha256(b"unchanged")))]
    );
    let reports: Vec<serde_json::Value> = r
        .stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let summary = reports.last().unwrap();
    assert_eq!(summary["bytes"], 0);
    assert_eq!(summary["counts"]["modified"], 1);
    assert_eq!(summary["counts"]["new"], 1);
}

#[test]
fn import_manifests_from_stock_tools() {
    let sha_tools: [(&str, &[&str]); 4] = [
        (
            "sha256sum",
            &[
                "sha256sum",
                "plain.txt",
                "with space.txt",
                "back\\slash.txt",
                "sub/dir/deep.bin",
            ],
        ),
        (
            "sha256sum --tag",
            &[
                "sha256sum",
                "--tag",
                "plain.txt",
                "with space.txt",
                "sub/dir/deep.bin",
            ],
        ),
        // rhash takes a backslash for a path separator and neither it nor hashdeep escapes
        // a newline, so their manifests cannot hold those names in the first place.
        (
            "rhash",
            &[
                "rhash",
                "--sha256",
                "plain.txt",
                "with space.txt",
                "sub/dir/deep.bin",
            ],
        ),
        (
            "hashdeep",
            &[
                "hashdeep",
                "-c",
                "md5,sha256",
                "-l",
                "plain.txt",
                "with space.txt",
                "sub/dir/deep.bin",
            ],
        ),
    ];
    for (name, cmd) in sha_tools {
        let (t, _) = odd_tree(false);
        let out = Command::new(cmd[0])
            .args(&cmd[1..])
            .current_dir(t.root())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let manifest = t.path("manifest.txt");
        fs::write(&manifest, &out.stdout).unwrap();
        flip_byte(&t.path("plain.txt"), 1);
        let r = intact!("import", "--json", manifest).expect_code(1);
        let j = r.json();
        assert_eq!(j.status("plain.txt"), "mismatch", "{name}");
        assert!(
            getxattr(&t.path("plain.txt"), TAG).is_none(),
            "{name}: tagged a mismatch"
        );
        assert_eq!(j.file("deep.bin")["action"], "tagged", "{name}");
        assert_eq!(j.file("with space.txt")["action"], "tagged", "{name}");
        // What was imported now checks out from the xattrs alone.
        let c = intact!("check", "--json", t.path("sub"))
            .expect_code(0)
            .json();
        assert_eq!(c.status("deep.bin"), "ok");
    }
    // b3sum manifests need --algo blake3: the lines look like sha256sum's.
    let (t, _) = odd_tree(false);
    let out = Command::new("b3sum")
        .args(["plain.txt", "new\nline.txt", "back\\slash.txt"])
        .current_dir(t.root())
        .output()
        .unwrap();
    fs::write(t.path("B3SUMS"), &out.stdout).unwrap();
    let j = intact!("import", "--algo", "blake3", "--json", t.path("B3SUMS"))
        .expect_code(0)
        .json();
    assert_eq!(j.count("ok"), 3);
    assert_eq!(intact_tag(&t.path("new\nline.txt")).algo, "blake3");
}

#[test]
fn check_against_a_manifest_without_xattrs() {
    let (t, files) = odd_tree(true);
    intact!("tag", t.root()).expect_code(0);
    let manifest = t.path("../manifest-for-check");
    intact!("export", "-o", manifest, t.root()).expect_code(0);
    // A copy on media without xattrs: strip them all.
    intact!("strip", t.root()).expect_code(0);
    let check = |code| {
        intact!("check", "--manifest", manifest, "--json", t.root())
            .expect_code(code)
            .json()
    };
    let j = check(0);
    assert_eq!(j.count("ok"), files.len() as u64);
    assert_eq!(j.file("plain.txt")["format"], "manifest");

    flip_byte(&t.path("with space.txt"), 0);
    fs::remove_file(t.path("plain.txt")).unwrap();
    t.write("extra.txt", b"not listed");
    let j = check(1);
    assert_eq!(j.status("with space.txt"), "mismatch");
    assert_eq!(j.status("plain.txt"), "missing");
    assert_eq!(j.status("extra.txt"), "new");
    // A manifest holds no mtimes: even a newer mtime cannot excuse different data (a copy to
    // a stick gives every file a new one).
    set_mtime(&t.path("with space.txt"), (4_000_000_000, 0));
    let j = check(1);
    assert_eq!(j.status("with space.txt"), "mismatch");
    assert_eq!(j.count("missing"), 1);
    let _ = fs::remove_file(manifest);
}

#[test]
fn absolute_manifest_paths_under_the_root_match() {
    let (t, _) = odd_tree(false);
    // hashdeep's default: absolute names.
    let out = Command::new("hashdeep")
        .args(["-c", "sha256", "-r"])
        .arg(t.root())
        .output()
        .unwrap();
    fs::write(t.path("HASHES"), &out.stdout).unwrap();
    let j = intact!("import", "--json", t.path("HASHES")).json();
    // Names with a newline are lost in hashdeep's own format; the rest are imported.
    assert_eq!(j.file("deep.bin")["action"], "tagged");
    assert_eq!(j.file("plain.txt")["action"], "tagged");
    assert_eq!(j.count("missing"), 0);
    let c = intact!("check", "--manifest", t.path("HASHES"), "--json", t.root()).json();
    assert_eq!(c.status("deep.bin"), "ok");
}

#[test]
fn import_never_rebaselines_a_file_its_own_tag_finds_damaged() {
    let t = Tree::new();
    let p = t.write("photo.jpg", data(50_000, 3));
    intact!("tag", p).expect_code(0);
    let good_tag = getxattr(&p, TAG).unwrap();
    flip_byte(&p, 100);
    // A manifest made after the damage matches the damaged bytes...
    let out = Command::new("sha256sum")
        .arg("photo.jpg")
        .current_dir(t.root())
        .output()
        .unwrap();
    fs::write(t.path("SUMS"), &out.stdout).unwrap();
    let j = intact!("import", "--json", t.path("SUMS"))
        .expect_code(1)
        .json();
    // ... but the file's own tag knows better.
    assert_eq!(j.status("photo.jpg"), "corrupt");
    assert_eq!(j.file("photo.jpg")["action"], "kept");
    assert_eq!(getxattr(&p, TAG).unwrap(), good_tag);
}

#[test]
fn compat_tags_are_written_byte_exact_and_stripped() {
    let t = Tree::new();
    let body = b"interoperable".as_slice();
    let p = t.write("f", body);
    set_mtime(&p, (1_600_000_000, 42));
    intact!("tag", "--compat", "shatag,dintch", t.root()).expect_code(0);
    let digest = sha256(body);
    assert_eq!(
        getxattr(&p, "user.shatag.sha256").unwrap(),
        hex::encode(digest).into_bytes()
    );
    assert_eq!(
        getxattr(&p, "user.shatag.ts").unwrap(),
        b"1600000000.000000042"
    );
    assert_eq!(
        getxattr(&p, "user.co.eclecticlight.dintch.hash").unwrap(),
        digest
    );
    assert!(getxattr(&p, "user.co.eclecticlight.dintch.hash#S").is_none());
    assert_eq!(mtime(&p), (1_600_000_000, 42), "tagging moved the mtime");

    // A file back from a Mac carries the `#S` spelling too: both are kept in step.
    setxattr(
        &p,
        "user.co.eclecticlight.dintch.hash#S",
        &sha256(b"what it was on the Mac"),
    );
    let (sec, nsec) = mtime(&p);
    fs::write(&p, b"edited since").unwrap();
    set_mtime(&p, (sec + 10, nsec));
    intact!("update", "--compat", "shatag,dintch", t.root()).expect_code(0);
    let body = b"edited since".as_slice();
    let digest = sha256(body);
    assert_eq!(
        getxattr(&p, "user.co.eclecticlight.dintch.hash").unwrap(),
        digest
    );
    assert_eq!(
        getxattr(&p, "user.co.eclecticlight.dintch.hash#S").unwrap(),
        digest
    );
    assert_eq!(
        getxattr(&p, "user.shatag.sha256").unwrap(),
        hex::encode(digest).into_bytes()
    );

    // Each tag on its own checks the file: remove intact's and the others still work.
    intact!("strip", t.root()).expect_code(0);
    let j = intact!("check", "--json", t.root()).expect_code(0).json();
    assert_eq!(j.file("f")["format"], "shatag");

    let r = intact!("strip", "--compat", "shatag,dintch", "--json", t.root());
    assert_eq!(r.expect_code(0).json().file("f")["action"], "removed");
    for attr in [
        "user.shatag.sha256",
        "user.shatag.ts",
        "user.co.eclecticlight.dintch.hash",
    ] {
        assert!(getxattr(&p, attr).is_none(), "{attr} left behind");
    }
}

#[test]
fn compat_tags_for_tagged_files_need_no_read_and_blake3_files_get_sha256() {
    let t = Tree::new();
    let a = t.write("a", data(2_000_000, 7));
    let b = t.write("b", b"blake3 tagged");
    intact!("tag", a).expect_code(0);
    intact!("tag", "--algo", "blake3", b).expect_code(0);
    let j = intact!("tag", "--compat", "shatag", "--json", a)
        .expect_code(0)
        .json();
    assert_eq!(j.summary["bytes"], 0);
    assert_eq!(j.file("a")["action"], "tagged");
    assert_eq!(
        getxattr(&a, "user.shatag.sha256").unwrap(),
        hex::encode(sha256(&data(2_000_000, 7))).into_bytes()
    );
    // A BLAKE3-tagged file needs its SHA-256 computed: update reads it once for both.
    let j = intact!("update", "--compat", "dintch", "--json", b)
        .expect_code(0)
        .json();
    assert_eq!(j.file("b")["action"], "tagged");
    assert_eq!(
        getxattr(&b, "user.co.eclecticlight.dintch.hash").unwrap(),
        sha256(b"blake3 tagged")
    );
    assert_eq!(intact_tag(&b).algo, "blake3", "intact's own tag changed");
    // The compat variable sets the default.
    let c = t.write("c", b"env");
    let out = Cmd::new(&[])
        .command()
        .env("INTACT_COMPAT", "shatag")
        .arg("tag")
        .arg(&c)
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(getxattr(&c, "user.shatag.sha256").is_some());
}

#[test]
fn disagreeing_tags_are_a_conflict_until_settled() {
    let t = Tree::new();
    let p = t.write("f", b"current data");
    intact!("tag", p).expect_code(0);
    // An old shatag from before an edit, still on the file.
    setxattr(
        &p,
        "user.shatag.sha256",
        hex::encode(sha256(b"older data")).as_bytes(),
    );
    let (sec, nsec) = mtime(&p);
    setxattr(
        &p,
        "user.shatag.ts",
        format!("{sec:010}.{nsec:09}").as_bytes(),
    );

    let r = intact!("check", p).expect_code(3);
    assert!(r.stdout.starts_with("conflict "), "{}", r.stdout);
    assert!(
        r.stdout
            .contains("tags disagree: the data matches the intact tag, not the shatag tag"),
        "{}",
        r.stdout
    );

    // Damage wins over a conflict: flip a byte and it is corrupt, exit 1.
    flip_byte(&p, 0);
    let j = intact!("check", "--json", p).expect_code(1).json();
    assert_eq!(j.status("f"), "corrupt");
    flip_byte(&p, 0);

    // update alone cannot settle it, and says how.
    let r = intact!("update", p).expect_code(3);
    assert!(r.stdout.contains("--compat shatag"), "{}", r.stdout);
    // update --compat shatag rewrites the stale tag; then all is well.
    intact!("update", "--compat", "shatag", p).expect_code(0);
    assert_eq!(
        getxattr(&p, "user.shatag.sha256").unwrap(),
        hex::encode(sha256(b"current data")).into_bytes()
    );
    intact!("check", p).expect_code(0);
}
