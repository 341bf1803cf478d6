//! The owner hears it: real deliveries through Debian's `apprise` (json:// to an HTTP
//! receiver, mailto:// to an SMTP server) and msmtp's `sendmail`, every receiver on 127.0.0.1,
//! started and stopped by the test. Alarms, reminders and the all-clear; the heartbeat; a
//! failed or hanging delivery; a vanished tree; an interrupted run; unknown damage.

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;
use crate::receiver::*;

/// Whether the tools a delivery test needs are here; outside CI a test without them skips,
/// under CI that is a failure (`.ci/run` installs them).
fn have(what: &[(&str, &str)]) -> bool {
    let missing: Vec<&str> = what
        .iter()
        .filter(|(check, _)| {
            !Command::new("sh")
                .args(["-c", check])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .map(|(_, name)| *name)
        .collect();
    if missing.is_empty() {
        return true;
    }
    skip!(format!("notification test: missing {missing:?}"), false);
}

const APPRISE: (&str, &str) = ("command -v apprise", "apprise");
const AIOSMTPD: (&str, &str) = ("/usr/bin/python3 -c 'import aiosmtpd'", "python3-aiosmtpd");
const MSMTP: (&str, &str) = ("command -v msmtp", "msmtp-mta");
const CURL: (&str, &str) = ("command -v curl", "curl");

/// A tagged tree of `n` files in `t`, under `name`.
fn tagged(t: &Tree, name: &str, n: usize) -> PathBuf {
    for i in 0..n {
        t.write(format!("{name}/d{}/f{i:03}", i % 4), data(2000, i as u64));
    }
    let root = t.path(name);
    intact!("tag", "-q", &root).expect_code(0);
    root
}

#[test]
fn damage_is_told_with_what_is_new_reminded_and_cleared_once() {
    if !have(&[APPRISE]) {
        return;
    }
    let rx = Receiver::http();
    let t = Tree::new();
    let root = tagged(&t, "photos", 6);
    let db = t.path("state.db");
    let check = |extra: &[&str]| {
        cmd!(
            "check",
            "-q",
            "--state",
            &db,
            "--notify",
            rx.json_url(),
            &root
        )
        .args(extra)
        .within(Duration::from_secs(120))
        .run()
    };
    // All well: nobody is told anything.
    check(&[]).expect_code(0);
    flip_byte(&root.join("d1/f001"), 10);
    check(&[]).expect_code(1);
    let got = rx.wait_for(1);
    assert_eq!(got.len(), 1, "one message for a run that finds damage");
    let (title, body, kind) = posted(&got[0]);
    assert_eq!(kind, "failure");
    assert!(title.starts_with("intact: 1 damaged file in "), "{title}");
    let name = root.join("d1/f001").display().to_string();
    assert!(body.contains(&format!("  {name} (found ")), "{body}");
    assert!(
        body.contains(&format!("intact status -q {}", root.display())),
        "{body}"
    );
    assert!(body.contains("intact repair "), "{body}");
    // Still there: reminded every run by default, never twice in one run.
    check(&[]).expect_code(1);
    let got = rx.wait_for(2);
    assert_eq!(got.len(), 2);
    let (title, body, _) = posted(&got[1]);
    assert!(
        title.starts_with("Reminder: intact: 1 damaged file"),
        "{title}"
    );
    assert!(body.starts_with("Reminder: intact on "), "{body}");
    assert!(
        body.contains(
            "Nothing is new since the last message, and this is still outstanding: the \
             oldest damage was found "
        ),
        "{body}"
    );
    assert!(body.contains("(less than an hour ago)"), "{body}");
    // The same tree by a relative PATH (`status`, from its parent): the same items, so a
    // reminder, with the files' absolute paths (it sent the first alarm again, with
    // relative ones).
    let parent = root.parent().unwrap();
    cmd!("status", "-q", "--state", &db, "--notify", rx.json_url())
        .arg(root.file_name().unwrap())
        .current_dir(parent)
        .within(Duration::from_secs(120))
        .run()
        .expect_code(1);
    let got = rx.wait_for(3);
    let (title, body, _) = posted(&got[2]);
    assert!(
        title.starts_with("Reminder: intact: 1 damaged file"),
        "{title}"
    );
    assert!(body.contains(&format!("  {name} (found ")), "{body}");
    // Reminders spaced out: none due yet.
    check(&["--remind-every", "1d"]).expect_code(1);
    // Something new is told at once, the new one marked, whatever the spacing; a file of
    // two names (a hard link) is one file, its names said apart.
    std::fs::hard_link(root.join("d2/f002"), root.join("d2/f002-link")).unwrap();
    flip_byte(&root.join("d2/f002"), 20);
    check(&["--remind-every", "1d"]).expect_code(1);
    let got = rx.wait_for(4);
    assert_eq!(
        got.len(),
        4,
        "no reminder before its time; the new damage at once"
    );
    let (title, body, _) = posted(&got[3]);
    assert!(
        title.starts_with("intact: 2 damaged files (3 names: hard links) in "),
        "{title}"
    );
    let second = root.join("d2/f002").display().to_string();
    assert!(body.contains(&format!("* {second} (found ")), "{body}");
    assert!(body.contains(&format!("* {second}-link (found ")), "{body}");
    assert!(body.contains(&format!("  {name} (found ")), "{body}");
    assert!(
        body.contains("New since the last message: 2 items"),
        "{body}"
    );
    // Dealt with: one all-clear, then silence.
    intact!("update", "-q", "--state", &db, "--accept-corrupt", &root).expect_code(0);
    check(&[]).expect_code(0);
    let got = rx.wait_for(5);
    assert_eq!(got.len(), 5);
    let (title, _, kind) = posted(&got[4]);
    assert!(title.starts_with("intact: all clear in "), "{title}");
    assert_eq!(kind, "success");
    check(&[]).expect_code(0);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(rx.messages().len(), 5, "the all-clear is said once");
}

#[test]
fn mail_through_sendmail_and_through_apprise_reaches_an_smtp_server() {
    if !have(&[APPRISE, AIOSMTPD, MSMTP]) {
        return;
    }
    let smtp = Receiver::smtp();
    let t = Tree::new();
    let root = tagged(&t, "docs", 3);
    // A hostile name: a newline and a header in it must not make a line of the message.
    let hostile = root.join("evil\nSubject: you won");
    fs::write(&hostile, b"some data").unwrap();
    // A path of 3,800 bytes, not UTF-8: one line of it over 998 bytes made every mail bounce.
    let mut deep = root.clone();
    let mut shown = root.display().to_string();
    while deep.as_os_str().len() < 3_550 {
        let name = [&b"caf\xe9-"[..], &[b'x'; 240][..]].concat();
        deep.push(std::ffi::OsStr::from_bytes(&name));
        shown.push_str(&format!("/caf\\xe9-{}", "x".repeat(240)));
    }
    fs::create_dir_all(&deep).unwrap();
    let long = deep.join("photo.jpg");
    shown.push_str("/photo.jpg");
    fs::write(&long, data(5000, 9)).unwrap();
    assert!(long.as_os_str().len() > 3_500);
    intact!("tag", "-q", &root).expect_code(0);
    flip_byte(&hostile, 2);
    flip_byte(&long, 2);
    // msmtp, as Debian's msmtp-mta installs it for `sendmail`, pointed at the local server.
    let home = t.path("home");
    fs::create_dir_all(&home).unwrap();
    let rc = home.join(".msmtprc");
    fs::write(
        &rc,
        format!(
            "account default\nhost 127.0.0.1\nport {}\nfrom intact@localhost\nauth off\ntls off\n",
            smtp.port
        ),
    )
    .unwrap();
    fs::set_permissions(&rc, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    cmd!("check", "-q", "--no-state", &root)
        .env("HOME", &home)
        .env("INTACT_NOTIFY", "sendmail:owner@localhost")
        .env("INTACT_REPAIR_FROM", "/mnt/backup/docs")
        .within(Duration::from_secs(120))
        .run()
        .expect_code(1);
    let mail = smtp.wait_for(1);
    assert_eq!(mail.len(), 1, "one mail");
    let (head, body) = mail[0].split_once("\n\n").unwrap();
    // As a mail reader shows it: folded header lines unfolded.
    let head = head.replace("\n ", " ");
    // Every line short, as SMTP servers demand; the text whole once decoded.
    for line in mail[0].lines() {
        assert!(line.len() <= 78, "a line of {} bytes: {line}", line.len());
    }
    assert!(
        head.contains("Content-Transfer-Encoding: quoted-printable"),
        "{head}"
    );
    let body = quoted_printable::decode(body, quoted_printable::ParseMode::Robust).unwrap();
    let body = String::from_utf8(body).unwrap();
    assert!(body.contains(&format!("{shown} (found ")), "{body}");
    assert!(head.contains("To: owner@localhost"), "{head}");
    assert_eq!(
        head.lines().filter(|l| l.starts_with("Subject:")).count(),
        1,
        "{head}"
    );
    assert!(
        head.contains("Subject: intact: 2 damaged files in "),
        "{head}"
    );
    assert!(head.contains("charset=utf-8"), "{head}");
    assert!(body.contains("evil\\nSubject: you won (found "), "{body}");
    assert!(
        body.contains(&format!(
            "intact repair {} --from /mnt/backup/docs --dry-run",
            root.display()
        )),
        "{body}"
    );
    // Apprise's own mailto:// to the same server.
    let url = format!(
        "mailto://127.0.0.1:{}?from=intact@localhost&to=owner@localhost",
        smtp.port
    );
    cmd!("check", "-q", "--no-state", "--notify", url, &root)
        .within(Duration::from_secs(120))
        .run()
        .expect_code(1);
    let mail = smtp.wait_for(2);
    assert_eq!(mail.len(), 2);
    assert!(mail[1].contains("X-Application: Apprise"), "{}", mail[1]);
    assert!(
        mail[1].contains("Subject: intact: 2 damaged files in"),
        "{}",
        mail[1]
    );
}

#[test]
fn the_heartbeat_beats_after_clean_runs_only() {
    if !have(&[CURL]) {
        return;
    }
    let rx = Receiver::http();
    let t = Tree::new();
    let root = tagged(&t, "tree", 3);
    let db = t.path("state.db");
    let url = format!("http://127.0.0.1:{}/ping/abc", rx.port);
    cmd!("scrub", "-q", "--state", &db, &root)
        .env("INTACT_HEARTBEAT", &url)
        .run()
        .expect_code(0);
    let got = rx.wait_for(1);
    assert_eq!(got.len(), 1);
    assert!(got[0].starts_with("GET /ping/abc\n"), "{}", got[0]);
    // With damage outstanding, no beat: silence raises the alarm where it is watched.
    flip_byte(&root.join("d0/f000"), 5);
    cmd!("scrub", "-q", "--state", &db, &root)
        .env("INTACT_HEARTBEAT", &url)
        .run()
        .expect_code(1);
    cmd!("status", "-q", "--state", &db, &root)
        .env("INTACT_HEARTBEAT", &url)
        .run()
        .expect_code(1);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        rx.messages().len(),
        1,
        "no heartbeat while damage is outstanding"
    );
    // A heartbeat that cannot be sent is said, and is trouble.
    intact!("update", "-q", "--accept-corrupt", "--state", &db, &root).expect_code(0);
    let r = cmd!("check", "-q", "--state", &db, &root)
        .env(
            "INTACT_HEARTBEAT",
            format!("http://127.0.0.1:{}/", free_port()),
        )
        .run()
        .expect_code(3);
    assert!(
        r.stderr.contains("the heartbeat could not be sent"),
        "{}",
        r.stderr
    );
}

#[test]
fn a_failed_or_hanging_delivery_is_said_bounded_and_leaves_verdicts_alone() {
    if !have(&[APPRISE]) {
        return;
    }
    let t = Tree::new();
    let root = tagged(&t, "tree", 3);
    flip_byte(&root.join("d1/f001"), 5);
    let prom = t.path("m.prom");
    // Nobody listens there: damage still wins (1), the failure is said even under -q.
    let refused = format!("json://127.0.0.1:{}/", free_port());
    let r = cmd!(
        "check",
        "-q",
        "--no-state",
        "--metrics",
        &prom,
        "--notify",
        &refused,
        &root
    )
    .within(Duration::from_secs(120))
    .run()
    .expect_code(1);
    assert!(r.stdout.contains("corrupt "), "{}", r.stdout);
    // Why, and which: apprise's own warning, without its log prefix.
    assert!(
        r.stderr.contains(
            "the owner could not be told what this run found: apprise failed (exit status: 1): \
             A Connection error occurred sending JSON notification to 127.0.0.1."
        ),
        "{}",
        r.stderr
    );
    // Under --json too, on stderr (the JSON is for the machine, stderr for the log).
    let r = cmd!("check", "--json", "--no-state", "--notify", &refused, &root)
        .within(Duration::from_secs(120))
        .run()
        .expect_code(1);
    assert!(r.stdout.contains("\"errors\""), "{}", r.stdout);
    assert!(
        r.stderr.contains(
            "intact: error: the owner could not be told what this run found: apprise failed"
        ),
        "{}",
        r.stderr
    );
    let m = fs::read_to_string(&prom).unwrap();
    assert!(m.contains("intact_notify_failed{"), "{m}");
    assert!(
        m.lines()
            .any(|l| l.starts_with("intact_notify_failed{") && l.ends_with(" 1")),
        "{m}"
    );
    // A deliverer that hangs is stopped within its time, its children with it.
    let bin = t.path("bin");
    fs::create_dir_all(&bin).unwrap();
    let fake = bin.join("apprise");
    fs::write(&fake, "#!/bin/sh\nsleep 300 &\nsleep 300\n").unwrap();
    fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    let start = Instant::now();
    let r = cmd!("check", "-q", "--no-state", "--notify-timeout", "2s", &root)
        .env("PATH", &path)
        .env("INTACT_NOTIFY", "json://127.0.0.1:9/")
        .within(Duration::from_secs(60))
        .run()
        .expect_code(1);
    assert!(start.elapsed() < Duration::from_secs(30));
    assert!(
        r.stderr
            .contains("apprise did not finish within 2s and was stopped"),
        "{}",
        r.stderr
    );
    // Not installed at all: said, with where to get it.
    let r = cmd!(
        "check",
        "-q",
        "--no-state",
        "--notify",
        "json://127.0.0.1:9/",
        &root
    )
    .env("PATH", "/nonexistent")
    .run()
    .expect_code(1);
    assert!(
        r.stderr.contains("apprise is not installed"),
        "{}",
        r.stderr
    );
    // A sendmail URL without an address is a usage error before anything runs.
    let r = intact!("check", "--notify", "sendmail:", &root).expect_code(2);
    assert!(
        r.stderr.contains("sendmail URL names the addresses"),
        "{}",
        r.stderr
    );
}

#[test]
fn notify_test_sends_a_test_message() {
    if !have(&[APPRISE]) {
        return;
    }
    let rx = Receiver::http();
    let r = cmd!("notify", "--test")
        .env("INTACT_NOTIFY", rx.json_url())
        .run()
        .expect_code(0);
    assert!(
        r.stderr.contains("sent a test message through apprise"),
        "{}",
        r.stderr
    );
    let got = rx.wait_for(1);
    let (title, body, _) = posted(&got[0]);
    assert!(title.starts_with("intact: test message from "), "{title}");
    assert!(body.contains("If you read this"), "{body}");
    // A configured restic repository without its password where the run is: said, trouble.
    let test = |password: &str| {
        cmd!("notify", "--test")
            .env("INTACT_NOTIFY", rx.json_url())
            .env(
                "INTACT_REPAIR_FROM",
                "restic:/srv/restic --host nas /mnt/mirror",
            )
            .env("RESTIC_PASSWORD", "")
            .env("RESTIC_PASSWORD_COMMAND", "")
            .env("RESTIC_PASSWORD_FILE", password)
            .run()
    };
    let r = test("").expect_code(3);
    assert!(
        r.stderr
            .contains("names a restic repository, but none of RESTIC_PASSWORD_FILE"),
        "{}",
        r.stderr
    );
    test("/etc/intact/restic.pass").expect_code(0);
    // The URL is never on apprise's command line, where `ps` shows it.
    let r = intact!("notify", "--test").expect_code(2);
    assert!(r.stderr.contains("nothing to test"), "{}", r.stderr);
}

#[test]
fn a_vanished_tree_is_an_alarm_and_its_records_are_kept() {
    if !have(&[APPRISE]) {
        return;
    }
    let rx = Receiver::http();
    let t = Tree::new();
    let root = tagged(&t, "photos", 200);
    let db = t.path("state.db");
    let scrub = |extra: &[&str]| {
        cmd!("scrub", "--state", &db, "--notify", rx.json_url(), &root)
            .args(extra)
            .within(Duration::from_secs(120))
            .run()
    };
    scrub(&[]).expect_code(0);
    // A few deletions are routine: quiet lines, exit 0, nobody told.
    fs::remove_file(root.join("d0/f000")).unwrap();
    let r = scrub(&[]).expect_code(0);
    assert!(r.stdout.contains("removed "), "{}", r.stdout);
    // A whole folder of many files gone at once is an alarm: nothing marked gone.
    fs::remove_dir_all(root.join("d1")).unwrap();
    fs::remove_dir_all(root.join("d2")).unwrap();
    let r = scrub(&[]).expect_code(3);
    assert!(!r.stdout.contains("removed "), "{}", r.stdout);
    assert!(
        r.stderr.contains("100 of the 199 files recorded under"),
        "{}",
        r.stderr
    );
    let got = rx.wait_for(1);
    assert_eq!(got.len(), 1);
    let (title, body, _) = posted(&got[0]);
    assert!(title.contains("vanished"), "{title}");
    assert!(body.contains("intact scrub --accept-removed"), "{body}");
    assert!(
        body.contains("If the folder was moved or renamed, scrub it where it is now"),
        "{body}"
    );
    // Still an alarm next run, and under a lower threshold; status says so too.
    scrub(&["--max-removed", "40%"]).expect_code(3);
    intact!("status", "--state", &db, &root).expect_code(3);
    // Under a higher threshold they are routine deletions, recorded once.
    let r = scrub(&["--max-removed", "60%"]).expect_code(0);
    assert_eq!(r.stdout.matches("removed ").count(), 100, "{}", r.stdout);
    scrub(&[]).expect_code(0);
    // The owner confirms a deletion that was meant.
    fs::remove_dir_all(root.join("d3")).unwrap();
    scrub(&[]).expect_code(3);
    let r = scrub(&["--accept-removed"]).expect_code(0);
    assert_eq!(r.stdout.matches("removed ").count(), 50, "{}", r.stdout);
    scrub(&[]).expect_code(0);
    // The whole tree gone (a disk that did not mount): an alarm whatever the threshold.
    fs::remove_dir_all(root.join("d0")).unwrap();
    let r = scrub(&["--max-removed", "100%"]).expect_code(3);
    assert!(
        r.stderr.contains(
            "holds none of the 49 files recorded under it: is its disk mounted, was it moved \
             or renamed"
        ),
        "{}",
        r.stderr
    );
    let r = intact!("status", "--state", &db, &root).expect_code(3);
    assert!(
        r.stdout.contains("holds none") || r.stderr.contains("holds none"),
        "{}{}",
        r.stdout,
        r.stderr
    );
}

#[test]
fn status_of_an_empty_or_untagged_tree_fails() {
    let t = Tree::new();
    let empty = t.path("empty");
    fs::create_dir_all(&empty).unwrap();
    let r = intact!("status", &empty).expect_code(3);
    assert!(r.stderr.contains("holds no files"), "{}", r.stderr);
    t.write("untagged/a", b"data");
    let r = intact!("status", t.path("untagged")).expect_code(3);
    assert!(r.stderr.contains("is tagged"), "{}", r.stderr);
}

#[test]
fn unknown_damage_is_never_said_to_be_none() {
    let t = Tree::new();
    let root = tagged(&t, "tree", 3);
    // A state database that cannot be opened: a directory where the file should be.
    let db = t.path("state.db");
    fs::create_dir_all(&db).unwrap();
    let prom = t.path("m.prom");
    intact!("status", "--state", &db, "--metrics", &prom, &root).expect_code(3);
    let m = fs::read_to_string(&prom).unwrap();
    assert!(!m.contains("intact_files_damaged{"), "{m}");
    assert!(
        m.lines()
            .any(|l| l.starts_with("intact_damage_unknown{") && l.ends_with(" 1")),
        "{m}"
    );
}

#[test]
fn an_interrupted_scrub_says_so_even_when_damage_wins() {
    let t = Tree::new();
    let root = t.path("tree");
    for i in 0..200 {
        t.write(format!("tree/f{i:03}"), data(1 << 20, i));
    }
    intact!("tag", "-q", &root).expect_code(0);
    let db = t.path("state.db");
    flip_byte(&root.join("f000"), 1);
    intact!("check", "-q", "--state", &db, root.join("f000")).expect_code(1);
    let prom = t.path("m.prom");
    let run = terminated_mid_run(
        || {
            cmd!(
                "scrub",
                "-q",
                "-j1",
                "--speed",
                "background",
                "--state",
                &db,
                "--metrics",
                &prom,
                "--max-percent",
                "100",
                &root
            )
        },
        |_| {
            fs::read_to_string(&prom)
                .unwrap_or_default()
                .lines()
                .any(|l| l.starts_with("intact_run_interrupted{") && l.ends_with(" 1"))
        },
    );
    assert_eq!(run.code, 1, "damage still wins: {}", run.stderr);
    assert!(
        run.stderr
            .contains("intact: interrupted: the scrub stopped before it finished"),
        "{}",
        run.stderr
    );
}

/// The watch tells what it finds as the other verbs do, only what is new: damage its look at
/// start finds (a file whose size changed under its mtime) is told once, and a clean look
/// after sends no all-clear (that is the scrub's, which sees the whole tree).
#[test]
fn the_watch_tells_what_it_finds_and_no_all_clear() {
    if !have(&[APPRISE]) {
        return;
    }
    require_root!();
    let rx = Receiver::http();
    let t = Tree::new();
    let root = tagged(&t, "tree", 4);
    let damaged = root.join("d0/f000");
    behind_the_back(&damaged, |p| {
        let mut data = fs::read(p).unwrap();
        data.push(0);
        fs::write(p, data).unwrap();
    });
    let w = crate::watch::Watch::spawn(
        cmd!("watch", "--settle", "1s", &root).env("INTACT_NOTIFY", rx.json_url()),
    );
    let got = rx.wait_for(1);
    assert_eq!(got.len(), 1, "{}", w.log());
    let (title, message, kind) = posted(&got[0]);
    assert!(title.contains("damaged"), "{title}");
    assert!(message.contains("d0/f000"), "{message}");
    assert_eq!(kind, "failure");
    let new = t.write("tree/d1/new", b"a new file");
    w.until("the new file tagged", || crate::watch::tagged(&new));
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(rx.messages().len(), 1, "{:?}", rx.messages());
}

/// The sources the owner configured (a restic repository and its selectors, a folder whose
/// name has a space) are printed in a message as one `--from` each, and the repair command
/// the message gives runs as printed.
#[test]
fn the_repair_command_a_message_gives_runs_as_printed() {
    if !have(&[APPRISE, ("command -v restic", "restic")]) {
        return;
    }
    let rx = Receiver::http();
    let t = Tree::new();
    let root = tagged(&t, "docs", 3);
    let repo = t.path("restic repo");
    let restic = |args: &[&std::ffi::OsStr]| {
        let ok = Command::new("restic")
            .env("RESTIC_PASSWORD", "pw")
            .env("RESTIC_REPOSITORY", &repo)
            .args(args)
            .stdout(Stdio::null())
            .status()
            .unwrap()
            .success();
        assert!(ok, "restic {args:?}");
    };
    restic(&["init".as_ref(), "-q".as_ref()]);
    restic(&[
        "backup".as_ref(),
        "-q".as_ref(),
        "--host".as_ref(),
        "nas".as_ref(),
        root.as_os_str(),
    ]);
    let mirror = t.path("my mirror");
    fs::create_dir(&mirror).unwrap();
    let victim = root.join("d1/f001");
    let good = fs::read(&victim).unwrap();
    flip_byte(&victim, 100);
    let configured = format!(
        "'restic:{}' --host nas '{}'",
        repo.display(),
        mirror.display()
    );
    cmd!("check", "-q", &root)
        .env("INTACT_NOTIFY", rx.json_url())
        .env("INTACT_REPAIR_FROM", &configured)
        .within(Duration::from_secs(120))
        .run()
        .expect_code(1);
    let got = rx.wait_for(1);
    let (_, body, _) = posted(&got[0]);
    let line = body
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("intact repair "))
        .unwrap_or_else(|| panic!("no repair command in {body}"));
    assert!(
        line.contains(&format!(
            "--from \"'restic:{}' --host nas\"",
            repo.display()
        )),
        "{line}"
    );
    let words = shlex::split(line).unwrap();
    let from: Vec<&str> = words
        .windows(2)
        .filter(|w| w[0] == "--from")
        .map(|w| w[1].as_str())
        .collect();
    let restic_from = format!("'restic:{}' --host nas", repo.display());
    let mirror_from = mirror.display().to_string();
    assert_eq!(from, [restic_from.as_str(), mirror_from.as_str()], "{line}");
    // As printed (the dry run), then without --dry-run: the file is good again.
    assert_eq!(
        words.last().map(String::as_str),
        Some("--dry-run"),
        "{line}"
    );
    let r = cmd!().args(&words[1..]).env("RESTIC_PASSWORD", "pw").run();
    assert_eq!(r.code, 1, "{line}\n{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout.contains("would be repaired from restic:"),
        "{}",
        r.stdout
    );
    assert_ne!(fs::read(&victim).unwrap(), good, "a dry run repaired");
    let r = cmd!()
        .args(&words[1..words.len() - 1])
        .env("RESTIC_PASSWORD", "pw")
        .run();
    assert_eq!(r.code, 0, "{line}\n{}{}", r.stdout, r.stderr);
    assert_eq!(fs::read(&victim).unwrap(), good);
}
