//! What people and scripts see: lines, JSON, verbosity, exit codes, generated docs.

use std::fs;

use crate::common::*;

#[test]
fn json_fields_for_each_kind_of_file() {
    let t = Tree::new();
    let ok = t.write("ok.txt", b"fine");
    let bad = t.write("bad.txt", b"will rot");
    intact!("tag", "--algo", "blake3", t.root()).expect_code(0);
    t.write("new.txt", b"untagged");
    std::os::unix::fs::symlink("ok.txt", t.path("link")).unwrap();
    flip_byte(&bad, 2);

    let j = intact!("check", "--json", t.root()).expect_code(1).json();
    assert_eq!(j.files.len(), 4);
    let f = j.file("ok.txt");
    assert_eq!(f["type"], "file");
    assert_eq!(f["path"], ok.to_str().unwrap());
    assert_eq!(f["status"], "ok");
    assert_eq!(f["size"], 4);
    assert_eq!(f["format"], "intact");
    assert_eq!(f["algo"], "blake3");
    assert_eq!(f["expected"], blake3::hash(b"fine").to_hex().as_str());
    assert_eq!(f["actual"], f["expected"]);
    let (sec, nsec) = mtime(&ok);
    assert_eq!(f["tag_mtime"], format!("{sec}.{nsec:09}"));
    assert!(f["tagged"].as_i64().unwrap() > 1_700_000_000);
    assert!(f.get("error").is_none());

    let b = j.file("bad.txt");
    assert_eq!(b["status"], "corrupt");
    assert_eq!(b["expected"], blake3::hash(b"will rot").to_hex().as_str());
    assert_eq!(
        b["actual"],
        blake3::hash(&std::fs::read(&bad).unwrap())
            .to_hex()
            .as_str()
    );

    let n = j.file("new.txt");
    assert_eq!(n["status"], "new");
    assert!(n.get("expected").is_none() && n.get("actual").is_none());
    assert_eq!(j.file("link")["skip"], "symlink");

    let s = &j.summary;
    assert_eq!(s["verb"], "check");
    // Files are the regular files looked at: the symlink is counted apart, as skipped.
    assert_eq!(s["files"], 3);
    assert_eq!(s["counts"]["skipped"], 1);
    assert_eq!(s["bytes"], 12);
    assert_eq!(s["counts"]["ok"], 1);
    assert_eq!(s["counts"]["corrupt"], 1);
    assert_eq!(s["counts"]["new"], 1);
    assert_eq!(s["counts"]["skipped"], 1);
    assert_eq!(s["exit_code"], 1);
    assert_eq!(s["interrupted"], false);
    assert!(s["elapsed_s"].as_f64().unwrap() >= 0.0);
}

#[test]
fn verbosity_levels() {
    let t = Tree::new();
    t.write("a", b"a");
    t.write("b", b"b");
    intact!("tag", t.root()).expect_code(0);
    t.write("c", b"new");
    let normal = intact!("check", t.root()).expect_code(0);
    assert_eq!(
        normal.stdout,
        format!("new      {}\n", t.path("c").display())
    );
    assert!(
        normal.stderr.starts_with("check: 3 files"),
        "{}",
        normal.stderr
    );
    assert!(normal.stderr.contains("2 ok, 1 new"), "{}", normal.stderr);

    let quiet = intact!("check", "-q", t.root()).expect_code(0);
    assert_eq!((quiet.stdout.as_str(), quiet.stderr.as_str()), ("", ""));

    let verbose = intact!("check", "-v", t.root()).expect_code(0);
    assert_eq!(verbose.stdout.lines().count(), 3);
    assert!(
        verbose
            .stdout
            .contains(&format!("ok       {}\n", t.path("a").display()))
    );

    flip_byte(&t.path("a"), 0);
    let quiet = intact!("check", "-q", t.root()).expect_code(1);
    assert_eq!(
        quiet.stdout,
        format!("corrupt  {}\n", t.path("a").display())
    );
    assert_eq!(quiet.stderr, "");
}

#[test]
fn show_reads_no_data() {
    let t = Tree::new();
    let p = t.write("f", b"shown");
    intact!("tag", p).expect_code(0);
    t.write("g", b"untagged");
    let r = intact!("show", t.root()).expect_code(0);
    let digest = sha2_hex(b"shown");
    assert_eq!(
        r.stdout,
        format!(
            "ok       intact sha256:{digest} {}\nnew      -      - {}\n",
            p.display(),
            t.path("g").display()
        )
    );
}

fn sha2_hex(data: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(data))
}

#[test]
fn usage_errors_exit_2() {
    intact!("check").expect_code(2);
    intact!("frobnicate", ".").expect_code(2);
    intact!("check", "--mtime-window", "soon", ".").expect_code(2);
    intact!("check", "--threads", "0", ".").expect_code(2);
    let r = intact!("check", "--exclude", "a[", ".").expect_code(2);
    assert!(r.stderr.contains("bad --exclude pattern"), "{}", r.stderr);
    // Under --json, a run that ends before it begins ends with the summary every run ends
    // with: the same fields, its counts zero, why among its errors.
    let t = Tree::new();
    t.write("d/f", b"x");
    intact!("tag", "-q", "--no-state", t.path("d")).expect_code(0);
    let normal = intact!("check", "--json", "--no-state", t.path("d"))
        .expect_code(0)
        .json()
        .summary;
    let failed = intact!("check", "--json", "--exclude", "a[", t.path("d"))
        .expect_code(2)
        .json()
        .summary;
    let keys = |v: &serde_json::Value| {
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.retain(|k| k != "errors");
        k.sort();
        k
    };
    assert_eq!(keys(&failed), keys(&normal), "{failed}");
    assert_eq!(failed["exit_code"], 2);
    assert!(
        failed["errors"][0].as_str().unwrap().contains("--exclude"),
        "{failed}"
    );
}

#[test]
fn help_documents_exit_codes_and_docs_are_generated() {
    let help = intact!("--help").expect_code(0);
    for needle in [
        "Exit codes:",
        "  1    damage found",
        "  3    nothing was verified under a PATH",
        "still there",
        "130",
    ] {
        assert!(help.stdout.contains(needle), "{needle}: {}", help.stdout);
    }
    let check_help = intact!("check", "--help").expect_code(0);
    assert!(check_help.stdout.contains("--mtime-window"));
    assert!(check_help.stdout.contains("Exit codes:"));

    let man = intact!("generate", "man").expect_code(0);
    assert!(man.stdout.starts_with(".ie"), "{}", &man.stdout[..100]);
    assert!(man.stdout.contains(".TH intact 1"));
    assert!(man.stdout.contains(".SH \"EXIT STATUS\""));
    // A page per verb, each named in intact(1).
    let t = Tree::new();
    intact!("generate", "man", t.root()).expect_code(0);
    for verb in [
        "tag",
        "check",
        "scrub",
        "status",
        "archive-create",
        "repair",
    ] {
        let page = fs::read_to_string(t.path(format!("intact-{verb}.1"))).unwrap();
        assert!(page.contains(".SH OPTIONS"), "{verb}: {page}");
        let top = verb.split('-').next().unwrap();
        assert!(man.stdout.contains(&format!("intact\\-{top}(1)")), "{verb}");
    }
    let scrub = fs::read_to_string(t.path("intact-scrub.1")).unwrap();
    assert!(scrub.contains("max\\-percent"), "{scrub}");
    assert!(!t.path("intact-help.1").exists());
    intact!("generate", "bash", t.root()).expect_code(2);
    let bash = intact!("generate", "bash").expect_code(0);
    assert!(
        bash.stdout.contains("complete -F _intact"),
        "{}",
        bash.stdout
    );
    assert!(bash.stdout.contains("--mtime-window"));
}

#[test]
fn tag_summary_words_statuses_apart_from_actions() {
    let t = Tree::new();
    t.write("a", b"one");
    intact!("tag", t.root()).expect_code(0);
    t.write("b", b"two");
    let r = intact!("tag", t.root()).expect_code(0);
    assert!(
        r.stderr.contains("tag: 2 files,")
            && r.stderr.contains(": 1 new, 1 already-tagged, 1 tagged"),
        "{}",
        r.stderr
    );
    let r = intact!("check", t.path("a")).expect_code(0);
    assert!(r.stderr.contains("check: 1 file,"), "{}", r.stderr);
}

/// A reader that goes away (`intact ... | head`) ends the run quietly (no error on stderr).
/// Met during the run, a verifying run says it was cut short (130, never 0: the files after
/// were not verified); met only after the last line (the lines waited in a buffer), the run's
/// own code stands; a listing stops at 0, as `tar -t` does.
#[test]
fn a_closed_pipe_ends_a_run_quietly_and_says_whether_it_was_cut_short() {
    use std::process::{Command, Stdio};
    for (files, cut) in [(20, 0), (3000, 130)] {
        let t = Tree::new();
        for i in 0..files {
            t.write(format!("src/f{i:04}"), data(100, i));
        }
        intact!("tag", "-q", t.path("src")).expect_code(0);
        let archive = t.path("a.tar.zst");
        intact!("archive", "create", "-q", &archive, t.path("src")).expect_code(0);
        let src = t.path("src");
        let cases: [(&[&std::ffi::OsStr], i32); 3] = [
            (&["check".as_ref(), "-v".as_ref(), src.as_os_str()], cut),
            (
                &["archive".as_ref(), "list".as_ref(), archive.as_os_str()],
                0,
            ),
            (
                &[
                    "archive".as_ref(),
                    "verify".as_ref(),
                    "-v".as_ref(),
                    archive.as_os_str(),
                ],
                cut,
            ),
        ];
        for (args, code) in cases {
            let mut child = Command::new(bin())
                .args(args)
                .env("XDG_STATE_HOME", t.path("state"))
                .env_remove("INTACT_STATE")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            // The reader is gone before the first line is written.
            drop(child.stdout.take());
            let out = child.wait_with_output().unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(
                out.status.code(),
                Some(code),
                "{files} files, {args:?}: {stderr}"
            );
            assert!(!stderr.contains("error"), "{args:?}: {stderr}");
        }
    }
}

/// A test that cannot run here says so in `cargo test`'s own output (the harness captures
/// `eprintln!`), at once and again, counted, when the test binary ends.
#[test]
fn a_skipped_test_is_visible_in_the_runs_output() {
    require_root!();
    let test = "watch::a_write_that_puts_the_old_mtime_back_is_an_edit";
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"])
        .arg(std::env::current_exe().unwrap())
        .args([test, "--exact"])
        .env_remove("CI")
        .current_dir("/")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{out:?}");
    let said = format!("SKIPPED {test}: needs root");
    assert!(err.starts_with(&said), "{err}");
    assert!(
        err.ends_with(&format!(
            "\n1 test skipped here, not run (under CI=true a skip is a failure):\n  {said}\n"
        )),
        "{err}"
    );
}
