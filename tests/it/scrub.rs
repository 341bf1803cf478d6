//! Unattended scrubs: budgets, cycles that verify every file once, a state database that is
//! only a cache (deleted, truncated, garbage, shared by two runs), `status`, and metrics.

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common::*;

/// `n` tagged files of `size` bytes under `t/tree`; the state database goes to `t/state.db`.
fn tagged_tree(t: &Tree, n: usize, size: usize) -> (PathBuf, PathBuf) {
    for i in 0..n {
        t.write(
            format!("tree/d{}/f{i:03}", i % 3),
            data(size, 100 + i as u64),
        );
    }
    intact!("tag", "-q", t.path("tree")).expect_code(0);
    (t.path("tree"), t.path("state.db"))
}

/// Paths of the files a JSON run reported as verified ok.
fn verified(r: &Json) -> Vec<String> {
    r.files
        .iter()
        .filter(|f| f["status"] == "ok")
        .map(|f| f["path"].as_str().unwrap().to_string())
        .collect()
}

fn scrub(tree: &Path, db: &Path, extra: &[&str]) -> Json {
    cmd!("scrub", "--json", "-v", "--state", db, tree)
        .args(extra)
        .run()
        .expect_code(0)
        .json()
}

/// Files the state database holds as verified.
fn verified_rows(db: &Path) -> i64 {
    db_entries(db)
        .iter()
        .filter(|(_, e)| e.verified.is_some())
        .count() as i64
}

fn db_rows(db: &Path, sql: &str) -> i64 {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.query_row(sql, [], |r| r.get(0)).unwrap()
}

#[test]
fn budgeted_scrubs_verify_every_file_once_per_cycle() {
    let t = Tree::new();
    let (tree, db) = tagged_tree(&t, 10, 10_000);
    let mut seen = Vec::new();
    // 30,000 bytes a run: ceil(100,000 / 30,000) = 4 runs to a cycle.
    for run in 1..=4 {
        let r = scrub(&tree, &db, &["--max-bytes", "30000"]);
        let got = verified(&r);
        assert_eq!(got.len(), if run < 4 { 3 } else { 1 }, "run {run}: {got:?}");
        let cycle = &r.summary["cycle"];
        assert_eq!(cycle["files"], 10);
        assert_eq!(cycle["files_checked"], seen.len() as u64 + got.len() as u64);
        assert_eq!(cycle["complete"], run == 4, "run {run}: {cycle}");
        seen.extend(got);
    }
    let unique: BTreeSet<&String> = seen.iter().collect();
    assert_eq!(unique.len(), 10, "every file once, none twice: {seen:?}");
    // The next cycle starts with the files verified longest ago: the first run's.
    let r = scrub(&tree, &db, &["--max-bytes", "30000"]);
    assert_eq!(verified(&r), seen[..3].to_vec());
    assert_eq!(r.summary["cycle"]["files_checked"], 3);
}

#[test]
fn a_budget_of_small_files_is_spent_whole_beside_a_large_file() {
    // 199 files of 100 bytes, then (last in walk order) one of 1 MB: the tree's mean size,
    // about 5 KB, makes a budget of 15,000 bytes look like three files. The queue is sorted
    // only as far as the budget reaches, starting from a guess at the mean: that guess must
    // not cut it short.
    let t = Tree::new();
    for i in 0..199 {
        t.write(format!("tree/f{i:03}"), data(100, i));
    }
    t.write("tree/zz", data(1_000_000, 999));
    intact!("tag", "-q", t.path("tree")).expect_code(0);
    let (tree, db) = (t.path("tree"), t.path("state.db"));
    let r = scrub(&tree, &db, &["--max-bytes", "15000"]);
    let got = verified(&r);
    // The 150th starts at 14,900 bytes, before the budget is spent; the 151st would not.
    assert_eq!(got.len(), 150, "{got:?}");
    assert!(got.iter().all(|p| !p.ends_with("zz")));
    assert_eq!(r.summary["cycle"]["files_checked"], 150);
}

#[test]
fn percent_older_than_and_time_budgets() {
    let t = Tree::new();
    let (tree, db) = tagged_tree(&t, 10, 10_000);
    let r = scrub(&tree, &db, &["--max-percent", "20"]);
    assert_eq!(verified(&r).len(), 2);
    // No file is started once the time is up; a budget spent on planning is an error.
    let r = cmd!("scrub", "--json", "--state", &db, &tree, "--max-time", "0s")
        .run()
        .expect_code(3);
    assert_eq!(r.json().count("ok"), 0);
    assert!(
        r.json().summary["errors"][0]
            .as_str()
            .unwrap()
            .contains("ran out while planning")
    );
    // Without a budget: every file once.
    let r = scrub(&tree, &db, &[]);
    assert_eq!(verified(&r).len(), 10);
    // All were verified within the hour: none is due.
    let r = scrub(&tree, &db, &["--older-than", "1h"]);
    assert_eq!(verified(&r).len(), 0);
    assert_eq!(verified_rows(&db), 10);
}

#[test]
fn a_scrub_writes_nothing_to_the_files() {
    let t = Tree::new();
    let (tree, db) = tagged_tree(&t, 3, 5_000);
    t.write("tree/untagged", b"new");
    let f = tree.join("d0/f000");
    let before = fs::metadata(&f).unwrap();
    let r = scrub(&tree, &db, &[]);
    assert_eq!(r.count("ok"), 3);
    assert_eq!(r.count("new"), 1);
    let after = fs::metadata(&f).unwrap();
    // ctime unmoved: backup tools that watch it see nothing to copy again.
    assert_eq!(
        (before.ctime(), before.ctime_nsec()),
        (after.ctime(), after.ctime_nsec())
    );
    assert_eq!(getxattr(&tree.join("untagged"), "user.intact"), None);
    // --update tags it, as update would.
    let r = scrub(&tree, &db, &["--update"]);
    assert_eq!(r.summary["actions"]["tagged"], 1);
    assert!(getxattr(&tree.join("untagged"), "user.intact").is_some());
}

#[test]
fn a_renamed_file_keeps_its_history_a_replaced_one_starts_afresh() {
    let t = Tree::new();
    let (tree, db) = tagged_tree(&t, 4, 5_000);
    scrub(&tree, &db, &[]);
    fs::rename(tree.join("d0/f000"), tree.join("d0/renamed")).unwrap();
    // Same bytes, same tag value, but a new file (a restore from a backup, say).
    let replaced = tree.join("d1/f001");
    let tag = getxattr(&replaced, "user.intact").unwrap();
    let bytes = fs::read(&replaced).unwrap();
    let m = mtime(&replaced);
    let new = tree.join("d1/new");
    fs::write(&new, bytes).unwrap();
    set_mtime(&new, m);
    setxattr(&new, "user.intact", &tag);
    fs::rename(&new, &replaced).unwrap();
    // The one never verified comes first; the renamed one is not due before the others.
    let r = scrub(&tree, &db, &["--max-bytes", "5000"]);
    assert_eq!(verified(&r).len(), 1);
    assert!(verified(&r)[0].ends_with("d1/f001"), "{:?}", verified(&r));
    let status = intact!("status", "--json", "--state", db, tree)
        .expect_code(0)
        .stdout;
    let v: serde_json::Value = serde_json::from_str(status.trim()).unwrap();
    assert_eq!(v["never_verified"], 0, "{v}");
    // The replaced file's old row was forgotten; the renamed one's stands.
    assert_eq!(db_entries(&db).len(), 4);
    assert_eq!(verified_rows(&db), 4);
}

#[test]
fn status_charts_files_by_when_they_were_last_proven_good() {
    let t = Tree::new();
    let (tree, db) = tagged_tree(&t, 7, 1_000);
    scrub(&tree, &db, &[]);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let (hour, day) = (3_600_000, 86_400_000);
    // f000 never proven good, then one file in each later bucket of the chart.
    let ago = [
        None,
        Some(hour),
        Some(2 * day),
        Some(10 * day),
        Some(40 * day),
        Some(100 * day),
        Some(400 * day),
    ];
    db_change_entries(&db, |e| {
        let i: usize = std::str::from_utf8(&e.name[1..]).unwrap().parse().unwrap();
        e.verified = ago[i].map(|a| now - a);
    });
    let out = intact!("status", "--json", "--state", db, tree).stdout;
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let ages = v["overview"]["ages"].as_array().unwrap();
    let chart: Vec<(&str, u64, u64)> = ages
        .iter()
        .map(|a| {
            let n = |k: &str| a[k].as_u64().unwrap();
            (a["label"].as_str().unwrap(), n("files"), n("bytes"))
        })
        .collect();
    assert_eq!(
        chart,
        [
            ("never", 1, 1_000),
            ("< 1 day", 1, 1_000),
            ("< 1 week", 1, 1_000),
            ("< 1 month", 1, 1_000),
            ("< 3 months", 1, 1_000),
            ("< 1 year", 1, 1_000),
            ("older", 1, 1_000)
        ],
        "{v}"
    );
    assert_eq!(v["overview"]["oldest"], now - 400 * day, "{v}");
    assert_eq!(v["overview"]["tagged"]["files"], 7, "{v}");
}

#[test]
fn damage_found_by_a_scrub_stays_in_status_until_repaired_or_accepted() {
    let t = Tree::new();
    // Large enough for a parity set each (small files share one).
    let (tree, db) = tagged_tree(&t, 4, 300_000);
    intact!("protect", "-q", "--state", db, tree).expect_code(0);
    let archive = t.path("copies.tar.zst");
    intact!("archive", "create", "-q", "--state", db, archive, tree).expect_code(0);
    let a = tree.join("d0/f000");
    let b = tree.join("d1/f001");
    flip_byte(&a, 100);
    flip_byte(&b, 100);
    let r = cmd!("scrub", "--json", "--state", db, tree)
        .run()
        .expect_code(1);
    assert_eq!(r.json().count("corrupt"), 2);
    let status = |code| {
        let out = intact!("status", "--json", "--state", db, tree)
            .expect_code(code)
            .stdout;
        serde_json::from_str::<serde_json::Value>(out.trim()).unwrap()
    };
    let v = status(1);
    assert_eq!(v["overview"]["damage"].as_array().unwrap().len(), 2, "{v}");
    assert_eq!(v["overview"]["protected"]["files"], 4, "{v}");
    assert_eq!(v["overview"]["archived"]["files"], 4, "{v}");
    // Still there after a check that finds it again, and in the human view.
    intact!("check", "--state", db, tree).expect_code(1);
    let human = intact!("status", "--state", db, tree).expect_code(1).stdout;
    assert!(human.contains("2 files found damaged"), "{human}");
    let store = tree.join(".intact-parity");
    intact!(
        "repair",
        "--discard-damaged",
        "--state",
        db,
        "--from",
        store,
        &a
    )
    .expect_code(0);
    let v = status(1);
    let damage = v["overview"]["damage"].as_array().unwrap();
    assert_eq!(damage.len(), 1, "{v}");
    assert!(damage[0]["path"].as_str().unwrap().ends_with("d1/f001"));
    // Accepting ends the damage: the run that accepts it is done with it (exit 0).
    let accepted = intact!("update", "--accept-corrupt", "--state", db, &b).expect_code(0);
    assert!(
        accepted.stdout.starts_with("accepted "),
        "{}",
        accepted.stdout
    );
    let v = status(0);
    assert_eq!(v["overview"]["damage"].as_array().unwrap().len(), 0, "{v}");
}

#[test]
fn a_lost_or_broken_database_costs_only_the_schedule() {
    let t = Tree::new();
    let (tree, db) = tagged_tree(&t, 6, 10_000);
    scrub(&tree, &db, &["--max-bytes", "20000"]);
    fs::remove_file(&db).unwrap();
    let r = scrub(&tree, &db, &["--max-bytes", "20000"]);
    assert_eq!(verified(&r).len(), 2);
    let garbage = data(100_000, 9);
    // Found when the database is opened (a file that is no database, or shorter than it
    // says), or only when planning reads the table of files (its root page, the second,
    // overwritten).
    for (how, found, damage) in [
        (
            "random bytes",
            "was damaged (",
            Box::new(|p: &Path| fs::write(p, &garbage).unwrap()) as Box<dyn Fn(&Path)>,
        ),
        (
            "truncated",
            "was damaged (",
            Box::new(|p: &Path| {
                let f = fs::OpenOptions::new().write(true).open(p).unwrap();
                f.set_len(f.metadata().unwrap().len() / 2).unwrap();
            }),
        ),
        (
            "a damaged page",
            "found damaged while in use",
            Box::new(|p: &Path| {
                use std::os::unix::fs::FileExt;
                let f = fs::OpenOptions::new().write(true).open(p).unwrap();
                f.write_all_at(&garbage[..4096], 4096).unwrap();
            }),
        ),
    ] {
        // Grown past one page, so that a half is a broken database, not an empty one.
        scrub(&tree, &db, &[]);
        assert!(fs::metadata(&db).unwrap().len() > 8192, "{how}");
        damage(&db);
        // The run that finds it says what was lost (exit 3), and verifies all the same.
        let r = cmd!("scrub", "--json", "-v", "--state", &db, &tree)
            .run()
            .expect_code(3);
        let said = r.json().summary["errors"][0].as_str().unwrap().to_string();
        assert!(
            said.contains(found) && said.contains("moved it to") && said.contains("is lost"),
            "{how}: {said}"
        );
        assert_eq!(
            verified(&r.json()).len(),
            6,
            "{how}: the scrub still verifies"
        );
        let again = cmd!(
            "scrub",
            "--json",
            "--state",
            &db,
            &tree,
            "--max-bytes",
            "10000"
        )
        .run()
        .expect_code(0);
        assert_eq!(again.stderr, "", "{how}: rebuilt, no more warnings");
    }
    let aside = fs::read_dir(t.root())
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .contains(".broken-")
        })
        .count();
    assert_eq!(aside, 3);
}

#[test]
fn two_scrubs_at_once_share_the_database() {
    let t = Tree::new();
    let (tree, db) = tagged_tree(&t, 300, 4_000);
    let spawn = || {
        cmd!("scrub", "-q", "--state", &db, &tree)
            .command()
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn(), spawn());
    for child in [a, b] {
        let out = child.wait_with_output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&out.stderr), "");
    }
    let conn = rusqlite::Connection::open(&db).unwrap();
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
    assert_eq!(verified_rows(&db), 300);
    assert_eq!(
        db_rows(&db, "SELECT count(*) FROM runs WHERE exit_code = 0"),
        2
    );
}

#[test]
fn an_interrupted_scrub_keeps_what_it_recorded() {
    let t = Tree::new();
    let (tree, _) = tagged_tree(&t, 120, 1 << 20);
    // When the signal lands depends on the machine: try later and later until it lands
    // mid-scrub.
    for delay in [50, 100, 200, 400, 800, 1600] {
        let db = t.path(format!("state-{delay}.db"));
        let child = cmd!(
            "scrub",
            "--json",
            "-v",
            "-j1",
            "--speed",
            "background",
            "--state",
            &db,
            &tree
        )
        .command()
        .spawn()
        .unwrap();
        std::thread::sleep(Duration::from_millis(delay));
        Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status()
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let run = Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        };
        if run.code != 130 || !db.exists() {
            continue;
        }
        let done = verified(&run.json()).len();
        let recorded = verified_rows(&db);
        if done == 0 || done == 120 {
            continue;
        }
        assert_eq!(
            recorded as usize, done,
            "what was reported verified is recorded"
        );
        // The rest of the cycle, and nothing of what was done.
        let r = scrub(&tree, &db, &["--max-percent", "100"]);
        assert_eq!(verified(&r).len(), 120 - done);
        assert_eq!(r.summary["cycle"]["complete"], true);
        return;
    }
    panic!("no interruption landed mid-scrub");
}

#[test]
fn metrics_pass_promtool() {
    let t = Tree::new();
    let (tree, db) = tagged_tree(&t, 5, 1_000);
    flip_byte(&tree.join("d0/f000"), 10);
    let prom = t.path("intact.prom");
    intact!("scrub", "-q", "--state", db, "--metrics", prom, tree).expect_code(1);
    let text = fs::read_to_string(&prom).unwrap();
    let root = format!("root=\"{}\"", tree.display());
    for want in [
        format!("intact_files{{{root},verb=\"scrub\",status=\"corrupt\"}} 1"),
        format!("intact_run_exit_code{{{root},verb=\"scrub\"}} 1"),
        format!("intact_files_never_verified{{{root},verb=\"scrub\"}} 1"),
        format!("intact_files_damaged{{{root},verb=\"scrub\"}} 1"),
    ] {
        assert!(text.contains(&want), "{want} in {text}");
    }
    let status_prom = t.path("status.prom");
    intact!("status", "--state", db, "--metrics", status_prom, tree).expect_code(1);
    let status = fs::read_to_string(&status_prom).unwrap();
    for want in [
        format!("intact_files_damaged{{{root},verb=\"status\"}} 1"),
        format!("intact_run_exit_code{{{root},verb=\"status\"}} 1"),
        format!("intact_run_end_timestamp_seconds{{{root},verb=\"status\"}} "),
    ] {
        assert!(status.contains(&want), "{want} in {status}");
    }
    // Metrics that cannot be written fail the run, and the summary says so.
    let clean = Tree::new();
    let (clean_tree, _) = tagged_tree(&clean, 2, 1_000);
    let nowhere = t.path("no/such/dir/m.prom");
    let r = cmd!(
        "check",
        "--json",
        "--state",
        &db,
        "--metrics",
        &nowhere,
        &clean_tree
    )
    .run();
    assert_eq!(r.code, 3, "{}", r.stderr);
    let summary = r.json().summary;
    assert_eq!(summary["exit_code"], 3);
    assert!(
        summary["errors"][0]
            .as_str()
            .unwrap()
            .contains("writing the metrics"),
        "{summary}"
    );
    for file in [&prom, &status_prom] {
        let out = Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(fs::File::open(file).unwrap())
            .output()
            .expect("promtool (Debian's prometheus package) is installed");
        assert!(
            out.status.success(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn the_systemd_units_verify_and_their_scrub_runs() {
    let units = Path::new(env!("CARGO_MANIFEST_DIR")).join("contrib/systemd");
    let t = Tree::new();
    let dir = t.path("units");
    fs::create_dir_all(&dir).unwrap();
    let mut scrub = None;
    for unit in fs::read_dir(&units).unwrap() {
        let unit = unit.unwrap().path();
        // Pointed at the binary under test: systemd-analyze checks that it exists.
        let text = fs::read_to_string(&unit)
            .unwrap()
            .replace("/usr/bin/intact", bin());
        if unit.ends_with("intact-scrub@.service") {
            scrub = Some(text.clone());
        }
        fs::write(dir.join(unit.file_name().unwrap()), text).unwrap();
    }
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .args([
            "intact-scrub@srv-photos.service",
            "intact-scrub@srv-photos.timer",
            "intact-failure@intact-scrub@srv-photos.service.service",
            "intact-watch@srv-photos.service",
        ])
        .current_dir(&dir)
        .output()
        .expect("systemd-analyze (systemd) is installed");
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success() && said.trim().is_empty(), "{said}");
    // The service's command line, as systemd would run it on a tree: defaults substituted.
    let (tree, _) = tagged_tree(&t, 3, 1_000);
    let args = unit_command(
        &scrub.expect("the scrub's unit"),
        &[
            ("/var/lib/intact/state.db", &t.path("state.db")),
            ("%f", &tree),
            ("${INTACT_METRICS_DIR}", &t.path("m.prom")),
        ],
    );
    assert!(args.contains(&"--update".to_string()), "{args:?}");
    let r = cmd!().args(&args).run().expect_code(0);
    assert_eq!(r.stdout, "", "-q: nothing to say when all is well");
    let metrics = fs::read_to_string(t.path("m.prom")).unwrap();
    assert!(
        metrics.contains(&format!(
            "intact_files{{root=\"{}\",verb=\"scrub\",status=\"ok\"}} 3",
            tree.display()
        )),
        "{metrics}"
    );
    // The nightly run keeps new and edited files tagged, and touches nothing else.
    let new = t.write("tree/new-photo", b"taken today");
    let old = tree.join("d0/f000");
    let ctime = |p: &Path| {
        let m = fs::metadata(p).unwrap();
        (m.ctime(), m.ctime_nsec())
    };
    let before = ctime(&old);
    cmd!().args(&args).run().expect_code(0);
    assert!(
        getxattr(&new, TAG).is_some(),
        "the nightly scrub tags new files"
    );
    assert_eq!(ctime(&old), before, "an unchanged file is not written to");
}

#[test]
fn no_state_records_nothing_whatever_the_environment_says() {
    let t = Tree::new();
    let (tree, db) = tagged_tree(&t, 2, 1_000);
    cmd!("check", "-q", "--no-state", &tree)
        .env("INTACT_STATE", &db)
        .run()
        .expect_code(0);
    assert!(!db.exists());
    cmd!("check", "-q", &tree)
        .env("INTACT_STATE", &db)
        .run()
        .expect_code(0);
    assert_eq!(verified_rows(&db), 2);
}

#[test]
fn files_that_fail_or_changed_do_not_hold_a_cycle_up() {
    let t = Tree::new();
    let (tree, db) = tagged_tree(&t, 6, 10_000);
    // An edit, a touch (same bytes, new mtime) and bit rot: none of them verifies.
    let edited = tree.join("d0/f000");
    fs::write(&edited, data(10_000, 999)).unwrap();
    set_mtime(&edited, (2_000_000_000, 0));
    set_mtime(&tree.join("d1/f001"), (2_000_000_000, 0));
    flip_byte(&tree.join("d2/f002"), 7);
    let mut checked = BTreeSet::new();
    for run in 1..=3 {
        let r = cmd!(
            "scrub",
            "--json",
            "-v",
            "--state",
            &db,
            &tree,
            "--max-bytes",
            "20000"
        )
        .run();
        assert!(r.code == 0 || r.code == 1, "run {run}: {}", r.stderr);
        let r = r.json();
        assert_eq!(r.files.len(), 2, "run {run}");
        for f in &r.files {
            assert!(
                checked.insert(f["path"].as_str().unwrap().to_string()),
                "twice: {f}"
            );
        }
        assert_eq!(r.summary["cycle"]["complete"], run == 3, "run {run}");
    }
    // The next run begins a new cycle.
    let r = cmd!(
        "scrub",
        "--json",
        "--state",
        &db,
        &tree,
        "--max-bytes",
        "20000"
    )
    .run();
    assert_eq!(r.json().summary["cycle"]["files_checked"], 2);
}

/// The value of `intact_files_never_verified` a run wrote.
fn never_verified(prom: &Path) -> f64 {
    let text = fs::read_to_string(prom).unwrap();
    text.lines()
        .find(|l| l.starts_with("intact_files_never_verified{"))
        .and_then(|l| l.rsplit_once(' '))
        .map(|(_, v)| v.parse().unwrap())
        .unwrap_or_else(|| panic!("no intact_files_never_verified in\n{text}"))
}

#[test]
fn files_a_run_just_tagged_are_not_counted_never_verified() {
    let t = Tree::new();
    let (tree, db) = tagged_tree(&t, 4, 1_000);
    let prom = t.path("m.prom");
    let run = |args: &[&str], code: i32| {
        cmd!()
            .args(args)
            .arg("--state")
            .arg(&db)
            .arg("--metrics")
            .arg(&prom)
            .arg(&tree)
            .run()
            .expect_code(code);
        never_verified(&prom)
    };
    assert_eq!(run(&["scrub", "-q"], 0), 0.0);
    // A new file and an edit, tagged by the nightly scrub: proven good as of now.
    t.write("tree/new", b"new photo");
    let edited = tree.join("d0/f000");
    fs::write(&edited, b"edited").unwrap();
    set_mtime(&edited, (mtime(&edited).0 + 10, 0));
    assert_eq!(run(&["scrub", "-q", "--update"], 0), 0.0);
    assert_eq!(run(&["update", "-q"], 0), 0.0);
    // A new file a check leaves untagged is never verified, as status says.
    t.write("tree/another", b"another photo");
    assert_eq!(run(&["check", "-q"], 0), 1.0);
    assert_eq!(run(&["scrub", "-q"], 0), 1.0);
}

#[test]
fn a_metrics_file_inside_the_tree_is_never_a_file_of_it() {
    let t = Tree::new();
    let (tree, db) = tagged_tree(&t, 3, 1_000);
    let prom = tree.join("intact.prom");
    for verb in ["check", "scrub", "update", "check"] {
        let r = intact!(verb, "--json", "--state", &db, "--metrics", &prom, &tree)
            .expect_code(0)
            .json();
        assert_eq!(r.count("new"), 0, "{verb}: {:?}", r.files);
        assert!(prom.exists());
    }
    assert!(
        getxattr(&prom, TAG).is_none(),
        "the metrics file was tagged"
    );
    let r = intact!("status", "--state", &db, "--metrics", &prom, &tree).expect_code(0);
    assert!(!r.stdout.contains("1 untagged"), "{}", r.stdout);
}

/// A state database of schema 3 (a row a file), as intact wrote it before, is taken up by the
/// next run in one migration: its damage is still damage (`status` reads no data and says it,
/// exit 1), its file found gone is still listed, and its history still dates the files (none
/// "never verified"); a scrub then goes on from it.
#[test]
fn a_schema_3_database_keeps_its_damage_deletions_and_history() {
    let t = Tree::new();
    let (tree, db) = tagged_tree(&t, 3, 1_000);
    let fsid = rustix::fs::statvfs(&tree).unwrap().f_fsid as i64;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let day = 86_400_000i64;
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute_batch(
        "CREATE TABLE files (fs INTEGER NOT NULL, ino INTEGER NOT NULL, digest BLOB NOT NULL, \
         path BLOB NOT NULL, size INTEGER NOT NULL, verified INTEGER, checked INTEGER, \
         status TEXT, damaged INTEGER, protected INTEGER, archived INTEGER, \
         archived_in INTEGER, seen INTEGER, damaged_digest BLOB, gone INTEGER, \
         PRIMARY KEY (fs, ino, digest)) WITHOUT ROWID;
         CREATE INDEX files_path ON files (path);
         CREATE INDEX files_damaged ON files (damaged) WHERE damaged IS NOT NULL;
         CREATE INDEX files_gone ON files (gone) WHERE gone IS NOT NULL;
         CREATE TABLE runs (id INTEGER PRIMARY KEY, verb TEXT NOT NULL, roots BLOB NOT NULL, \
         started INTEGER NOT NULL, ended INTEGER, files INTEGER, bytes INTEGER, seconds REAL, \
         exit_code INTEGER, copied INTEGER);
         CREATE TABLE cycles (root BLOB PRIMARY KEY, started INTEGER NOT NULL);
         CREATE TABLE lost (at INTEGER NOT NULL, aside BLOB, why TEXT);
         PRAGMA user_version = 3;",
    )
    .unwrap();
    let files: Vec<PathBuf> = (0..3).map(|i| tree.join(format!("d{i}/f{i:03}"))).collect();
    let damaged = &files[0];
    flip_byte(damaged, 10);
    for f in &files {
        let mut key = vec![0u8];
        key.extend(intact_tag(f).digest);
        let found = (f == damaged).then_some(now - day);
        conn.execute(
            "INSERT INTO files (fs, ino, digest, path, size, verified, checked, status, \
             damaged, damaged_digest, seen) VALUES (?1, ?2, ?3, ?4, 1000, ?5, ?6, ?7, ?8, \
             ?9, 1)",
            rusqlite::params![
                fsid,
                fs::metadata(f).unwrap().ino() as i64,
                key,
                f.as_os_str().as_encoded_bytes(),
                now - 3 * day,
                found.unwrap_or(now - 3 * day),
                if found.is_some() { "corrupt" } else { "ok" },
                found,
                found.map(|_| vec![0u8; 33]),
            ],
        )
        .unwrap();
    }
    let gone = tree.join("d1/deleted.jpg");
    conn.execute(
        "INSERT INTO files (fs, ino, digest, path, size, verified, checked, status, gone) \
         VALUES (?1, 999999, ?2, ?3, 10, ?4, ?4, 'ok', ?5)",
        rusqlite::params![
            fsid,
            [0u8; 33].to_vec(),
            gone.as_os_str().as_encoded_bytes(),
            now - 5 * day,
            now - 2 * day
        ],
    )
    .unwrap();
    drop(conn);
    let status = intact!("status", "--json", "--state", db, tree).expect_code(1);
    let v: serde_json::Value = serde_json::from_str(status.stdout.trim()).unwrap();
    let damage = v["overview"]["damage"].as_array().unwrap();
    assert_eq!(damage.len(), 1, "{v}");
    assert!(
        damage[0]["path"].as_str().unwrap().ends_with("d0/f000"),
        "{v}"
    );
    assert_eq!(v["never_verified"], 0, "{v}");
    let removed = v["removed"].as_array().unwrap();
    assert_eq!(removed.len(), 1, "{v}");
    assert!(
        removed[0]["path"]
            .as_str()
            .unwrap()
            .ends_with("deleted.jpg"),
        "{v}"
    );
    let version: i64 = rusqlite::Connection::open(&db)
        .unwrap()
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, 6);
    // A scrub finds the damage again, and what the database knew stands after it.
    let r = cmd!("scrub", "--json", "--state", db, tree)
        .run()
        .expect_code(1);
    assert_eq!(r.json().count("corrupt"), 1);
    let v = status_json(&db, &tree);
    assert_eq!(v["removed"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(v["overview"]["damage"].as_array().unwrap().len(), 1, "{v}");
}

fn status_json(db: &Path, tree: &Path) -> serde_json::Value {
    let out = intact!("status", "--json", "--state", db, tree).stdout;
    serde_json::from_str(out.trim()).unwrap()
}

/// A file moved to another folder keeps its history: `status` knows it as verified before
/// any run has seen it there, and a scrub moves its entry where it is now (the database does
/// not keep it twice, nor call it deleted).
#[test]
fn a_moved_file_keeps_its_history() {
    let t = Tree::new();
    let (tree, db) = tagged_tree(&t, 6, 1_000);
    intact!("scrub", "-q", "--state", &db, &tree).expect_code(0);
    fs::rename(tree.join("d0/f000"), tree.join("d1/moved")).unwrap();
    let v = status_json(&db, &tree);
    assert_eq!(v["never_verified"], 0, "{v}");
    assert_eq!(v["removed"].as_array().unwrap().len(), 0, "{v}");
    let r = scrub(&tree, &db, &["--max-percent", "1"]);
    assert_eq!(r.summary["removed"], 0, "{}", r.summary);
    let entries = db_entries(&db);
    assert_eq!(entries.len(), 6, "{entries:?}");
    let moved: Vec<_> = entries
        .iter()
        .filter(|(p, _)| p.ends_with(b"d1/moved"))
        .collect();
    assert_eq!(moved.len(), 1, "{entries:?}");
    assert!(moved[0].1.verified.is_some());
    assert!(!entries.iter().any(|(p, _)| p.ends_with(b"d0/f000")));
}

/// A folder that holds files and subfolders (walked `a`, `b/x`, `c`: the walk comes back to
/// it after each subfolder) keeps every file's history through a night that reads none of
/// them: untouched files are never "never verified", and their entries stay in the database.
#[test]
fn files_beside_subfolders_keep_their_history_on_a_night_that_reads_nothing() {
    let t = Tree::new();
    for rel in ["t/a", "t/b/x", "t/b/y/z", "t/b/k", "t/c", "t/d/e", "t/f"] {
        t.write(rel, rel.as_bytes());
    }
    let (tree, db) = (t.path("t"), t.path("state.db"));
    intact!("tag", "-q", "--state", &db, &tree).expect_code(0);
    intact!("scrub", "-q", "--state", &db, &tree).expect_code(0);
    let r = cmd!(
        "scrub",
        "--json",
        "--state",
        &db,
        "--older-than",
        "1d",
        &tree
    )
    .run()
    .expect_code(0)
    .json();
    assert_eq!(r.summary["files"], 0, "{}", r.summary);
    let v = status_json(&db, &tree);
    assert_eq!(v["never_verified"], 0, "{v}");
    assert_eq!(db_entries(&db).len(), 7, "{:?}", db_entries(&db));
    let out = intact!("status", "-v", "--json", "--state", &db, &tree).stdout;
    for line in out.lines().filter(|l| l.contains(r#""type":"file""#)) {
        let f: serde_json::Value = serde_json::from_str(line).unwrap();
        assert!(f["verified"].is_string(), "{line}");
    }
}

/// A file deleted is remembered with the size it had, whatever folder it was in: `repair
/// --missing` passes over a copy of another size.
#[test]
fn a_deleted_file_is_remembered_with_its_size() {
    let t = Tree::new();
    for rel in ["t/a", "t/b/x", "t/c", "t/d/e"] {
        t.write(rel, rel.repeat(100));
    }
    let (tree, db) = (t.path("t"), t.path("state.db"));
    intact!("tag", "-q", "--state", &db, &tree).expect_code(0);
    intact!("scrub", "-q", "--state", &db, &tree).expect_code(0);
    intact!("scrub", "-q", "--state", &db, "--older-than", "1d", &tree).expect_code(0);
    for rel in ["t/c", "t/d/e", "t/a"] {
        fs::remove_file(t.path(rel)).unwrap();
    }
    intact!("scrub", "-q", "--update", "--state", &db, &tree).expect_code(0);
    let conn = rusqlite::Connection::open(&db).unwrap();
    let gone: Vec<(String, i64)> = conn
        .prepare("SELECT cast(path AS TEXT), size FROM gone ORDER BY path")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let names: Vec<&str> = gone
        .iter()
        .map(|(p, _)| &p[tree.as_os_str().len()..])
        .collect();
    assert_eq!(names, ["/a", "/c", "/d/e"], "{gone:?}");
    for ((path, size), name) in gone.iter().zip(names) {
        assert_eq!(*size as usize, name.len() * 100 + 100, "{path}");
    }
}

/// A file moved between runs is not the end of a cycle: the run after it reads its share
/// and a new cycle begins; with a move before every run (a photo library reorganised daily)
/// every file is still verified once a cycle.
#[test]
fn a_move_between_runs_does_not_end_the_cycle() {
    let t = Tree::new();
    for i in 0..100 {
        t.write(format!("mv/d0/f{i:03}"), data(1000, i));
    }
    fs::create_dir(t.path("mv/d1")).unwrap();
    let (tree, db) = (t.path("mv"), t.path("state.db"));
    intact!("tag", "-q", "--state", &db, &tree).expect_code(0);
    let half = ["--update", "--max-percent", "50"];
    for _ in 0..2 {
        scrub(&tree, &db, &half);
    }
    let mut seen: BTreeSet<String> = BTreeSet::new();
    for night in 0..4 {
        let from = tree.join(format!("d0/f{:03}", 10 * night));
        fs::rename(&from, tree.join(format!("d1/m{night}"))).unwrap();
        let r = scrub(&tree, &db, &half);
        assert_eq!(r.summary["files"], 50, "night {night}: {}", r.summary);
        seen.extend(verified(&r));
        if night % 2 == 1 {
            assert_eq!(seen.len(), 100, "night {night}: {seen:?}");
            seen.clear();
        }
    }
}

/// A file the nightly `scrub --update --protect` tags and protects is both: proven good as
/// of that night (not "never verified", which held every later cycle open and left the
/// budgeted scrubs reading only the newest files) and protected, and the run says both.
#[test]
fn a_file_tagged_and_protected_the_same_night_is_proven_good() {
    let t = Tree::new();
    let (tree, db) = tagged_tree(&t, 6, 2_000);
    intact!("scrub", "-q", "--state", &db, &tree).expect_code(0);
    for i in 0..3 {
        t.write(format!("tree/d{i}/new"), data(3_000, 900 + i));
    }
    let r = scrub(&tree, &db, &["--update", "--protect"]);
    for i in 0..3 {
        let f = r.file(&format!("d{i}/new"));
        assert_eq!(f["action"], "tagged", "{f}");
        assert_eq!(f["copy"], "protected", "{f}");
    }
    assert_eq!(r.summary["actions"]["tagged"], 3, "{}", r.summary);
    let v = status_json(&db, &tree);
    assert_eq!(v["never_verified"], 0, "{v}");
    let new: Vec<_> = db_entries(&db)
        .into_iter()
        .filter(|(p, _)| p.ends_with(b"/new"))
        .collect();
    assert_eq!(new.len(), 3);
    for (_, e) in new {
        assert!(e.verified.is_some() && e.protected.is_some(), "{e:?}");
    }
}

/// A file brought back where it was, as it was (`repair --missing`), is gone no more:
/// `status`, `status -q` and the metrics stop calling it removed once a run meets it.
#[test]
fn a_file_brought_back_by_repair_missing_is_no_longer_removed() {
    let t = Tree::new();
    let (tree, db) = tagged_tree(&t, 4, 2_000);
    let archive = t.path("a.tar.zst");
    intact!("archive", "create", "-q", &archive, &tree).expect_code(0);
    intact!("scrub", "-q", "--state", &db, &tree).expect_code(0);
    let f1 = tree.join("d1/f001");
    fs::remove_file(&f1).unwrap();
    let r = scrub(&tree, &db, &["--update"]);
    assert_eq!(r.summary["removed"], 1, "{}", r.summary);
    assert_eq!(
        status_json(&db, &tree)["removed"].as_array().unwrap().len(),
        1
    );
    // A routine deletion is in the overview, not in what needs action (-q).
    let full = intact!("status", "--state", &db, &tree)
        .expect_code(0)
        .stdout;
    assert!(
        full.contains("removed     1 file gone since last seen"),
        "{full}"
    );
    let quiet = intact!("status", "-q", "--state", &db, &tree)
        .expect_code(0)
        .stdout;
    assert_eq!(quiet, "", "status -q with nothing to act on");
    intact!(
        "repair",
        "-q",
        "--state",
        &db,
        "--missing",
        "--from",
        &archive,
        &tree
    )
    .expect_code(0);
    assert!(f1.exists());
    // Met again by the walk of `status`, and by the scrub that verifies it.
    let v = status_json(&db, &tree);
    assert_eq!(v["removed"].as_array().unwrap().len(), 0, "{v}");
    let prom = t.path("m.prom");
    cmd!(
        "scrub",
        "-q",
        "--update",
        "--state",
        &db,
        "--metrics",
        &prom,
        &tree
    )
    .run()
    .expect_code(0);
    let metrics = fs::read_to_string(&prom).unwrap();
    let removed = metrics
        .lines()
        .find(|l| l.starts_with("intact_files_removed"))
        .unwrap_or_else(|| panic!("{metrics}"));
    assert!(removed.ends_with(" 0"), "{removed}");
    let out = intact!("status", "-q", "--state", &db, &tree)
        .expect_code(0)
        .stdout;
    assert!(!out.contains("removed"), "{out}");
}

/// `status` answers in the order of the owner's questions: is anything wrong, when did the
/// last scrub run (how long, what it read, how it ended: what `zpool status` puts first), when
/// will every file have been proven good again, what is protected; then the coverage chart.
/// For the tree or any folder of it.
#[test]
fn status_says_when_the_last_scrub_ran_and_how_it_ended() {
    let t = Tree::new();
    let (tree, db) = tagged_tree(&t, 6, 5_000);
    let first = intact!("status", "--state", &db, &tree)
        .expect_code(0)
        .stdout;
    assert!(
        first.starts_with("damage      none found that is not repaired\nlast scrub  none recorded"),
        "{first}"
    );
    assert!(first.contains("\nproven by   unknown: "), "{first}");
    // Two budgeted scrubs make a pace: a fifth of the tree a run.
    for _ in 0..2 {
        intact!("scrub", "-q", "--max-percent", "20", "--state", &db, &tree).expect_code(0);
        std::thread::sleep(Duration::from_millis(1100));
    }
    let out = intact!("status", "--state", &db, &tree)
        .expect_code(0)
        .stdout;
    let starts: Vec<&str> = out.lines().map(|l| &l[..l.len().min(11)]).collect();
    let at = |label: &str| {
        starts
            .iter()
            .position(|s| s.trim_end() == label)
            .unwrap_or_else(|| panic!("{label}: {out}"))
    };
    assert!(
        at("damage") < at("last scrub")
            && at("last scrub") < at("proven by")
            && at("proven by") < at("copies")
            && at("copies") < at("files")
            && at("files") < at("verified"),
        "{out}"
    );
    let proven = out.lines().find(|l| l.starts_with("proven by")).unwrap();
    assert!(
        proven.starts_with("proven by   20")
            && proven.contains("every tagged file proven good again, ")
            && proven.ends_with("at the pace of the last ones"),
        "{proven}"
    );
    let v = status_json(&db, &tree);
    assert!(v["cycle"]["proven_good_again_by"].is_string(), "{v}");
    flip_byte(&tree.join("d1/f001"), 10);
    cmd!("scrub", "-q", "--state", &db, &tree)
        .run()
        .expect_code(1);
    for path in [tree.clone(), tree.join("d1")] {
        let out = intact!("status", "--state", &db, &path)
            .expect_code(1)
            .stdout;
        assert!(out.starts_with("damage      1 file found damaged"), "{out}");
        // A damaged file is not proven good: checked.
        let proven = out.lines().find(|l| l.starts_with("proven by")).unwrap();
        assert!(
            proven.contains("every tagged file checked again")
                || proven.contains("every tagged file was checked in this cycle"),
            "{proven}"
        );
        let line = out.lines().find(|l| l.starts_with("last scrub")).unwrap();
        assert!(line.starts_with("last scrub  20"), "{out}");
        assert!(
            line.ends_with(": 6 files, 30.00 kB read, damage found (exit 1)"),
            "{line}"
        );
    }
    let v = status_json(&db, &tree);
    assert_eq!(v["last_scrub"]["exit_code"], 1, "{v}");
    assert_eq!(v["last_scrub"]["files"], 6, "{v}");
    assert!(v["last_scrub"]["ended"].is_string(), "{v}");
    // A scrub of another tree is not this tree's, nor one of a PATH that is not there.
    let t2 = Tree::new();
    let (other, _) = tagged_tree(&t2, 2, 100);
    intact!("scrub", "-q", "--state", &db, &other).expect_code(0);
    cmd!("scrub", "-q", "--state", &db, t.path("not-there"))
        .run()
        .expect_code(3);
    assert_eq!(status_json(&db, &tree)["last_scrub"]["exit_code"], 1);
}

/// The damaged copies repair kept beside the files it repaired are said by `status` (and
/// `-q`): evidence that takes room until the owner deletes it.
#[test]
fn status_names_the_damaged_copies_repair_kept() {
    let t = Tree::new();
    let (tree, db) = tagged_tree(&t, 4, 3_000);
    let backup = t.path("backup");
    copy_tree(&tree, &backup);
    flip_byte(&tree.join("d1/f001"), 10);
    cmd!("scrub", "-q", "--state", &db, &tree)
        .run()
        .expect_code(1);
    intact!("repair", "-q", "--state", &db, "--from", &backup, &tree).expect_code(0);
    let kept = tree.join("d1/f001.damaged");
    assert!(kept.exists());
    for q in [&[][..], &["-q"][..]] {
        let out = cmd!("status", "--state", &db)
            .args(q)
            .arg(&tree)
            .run()
            .expect_code(0)
            .stdout;
        assert!(
            out.contains("kept        1 damaged copy kept by repair (3.00 kB): delete it"),
            "{q:?}: {out}"
        );
        assert!(out.contains(&format!("\n  {}\n", kept.display())), "{out}");
    }
    let v = status_json(&db, &tree);
    assert_eq!(v["damaged_copies"]["files"], 1, "{v}");
    assert_eq!(v["damaged_copies"]["paths"][0], kept.display().to_string());
    fs::remove_file(&kept).unwrap();
    let quiet = intact!("status", "-q", "--state", &db, &tree)
        .expect_code(0)
        .stdout;
    assert_eq!(quiet, "");
}

/// Below 50 files, a deletion is still an alarm when it empties a whole folder of at least 10
/// or takes more than half of a tree of at least 10 (25 of a 40-file tree was routine); a
/// folder renamed is a move; a few files are routine.
#[test]
fn a_small_tree_or_a_whole_folder_gone_is_an_alarm() {
    let t = Tree::new();
    let (tree, db) = tagged_tree(&t, 40, 100);
    let run = |extra: &[&str]| cmd!("scrub", "-q", "--state", &db, &tree).args(extra).run();
    run(&[]).expect_code(0);
    // 25 of 40 (more than half): an alarm, nothing marked gone.
    let mut gone = Vec::new();
    for i in 0..25 {
        let f = tree.join(format!("d{}/f{i:03}", i % 3));
        fs::remove_file(&f).unwrap();
        gone.push(f);
    }
    let r = run(&[]).expect_code(3);
    assert!(
        r.stderr.contains("25 of the 40 files recorded under"),
        "{}",
        r.stderr
    );
    // Confirmed: recorded once, then quiet.
    run(&["--accept-removed"]).expect_code(0);
    run(&[]).expect_code(0);

    let t = Tree::new();
    let (tree, db) = tagged_tree(&t, 60, 100);
    let run = |extra: &[&str]| cmd!("scrub", "-q", "--state", &db, &tree).args(extra).run();
    run(&[]).expect_code(0);
    // A folder of 20 renamed: a move, no alarm.
    fs::rename(tree.join("d1"), tree.join("moved")).unwrap();
    run(&[]).expect_code(0);
    // Two files of a folder: routine.
    fs::remove_file(tree.join("d2/f002")).unwrap();
    fs::remove_file(tree.join("d2/f005")).unwrap();
    let r = cmd!("scrub", "--state", &db, &tree).run().expect_code(0);
    assert_eq!(r.stdout.matches("removed ").count(), 2, "{}", r.stdout);
    // The whole folder (the 18 left of 60): an alarm that names it.
    fs::remove_dir_all(tree.join("d2")).unwrap();
    let r = run(&[]).expect_code(3);
    assert!(
        r.stderr.contains(&format!(
            "the folder {} and its 18 files are gone at once",
            tree.join("d2").display()
        )),
        "{}",
        r.stderr
    );
    // `--max-removed 100%`: only a vanished tree is an alarm.
    run(&["--max-removed", "100%"]).expect_code(0);
}

/// `status` of a PATH that is not there says so, and nothing else (it printed a page of zeros
/// first).
#[test]
fn status_of_a_path_that_is_not_there_says_only_that() {
    let t = Tree::new();
    let (tree, db) = tagged_tree(&t, 2, 100);
    let missing = tree.join("not-there");
    for q in [&[][..], &["-q"][..]] {
        let r = cmd!("status", "--state", &db)
            .args(q)
            .arg(&missing)
            .run()
            .expect_code(3);
        assert_eq!(r.stdout, "", "{q:?}");
        assert!(
            r.stderr.contains("no such file or directory"),
            "{}",
            r.stderr
        );
    }
}

/// A folder of 100,000 files is tagged, scrubbed, checked and summed up in the memory of a
/// few pages of it, not of the folder (the guard CI keeps; `scripts/bench.py --memory`
/// measures a million in one folder: about 30 MiB, where one value a folder took 800).
#[test]
fn a_folder_of_100000_files_takes_bounded_memory() {
    let t = Tree::new();
    let dir = t.path("one");
    fs::create_dir(&dir).unwrap();
    for i in 0..100_000u32 {
        fs::write(dir.join(format!("f{i:06}")), i.to_le_bytes()).unwrap();
    }
    let db = t.path("state.db");
    let runs: [&[&str]; 5] = [
        &["tag", "-q"],
        &["scrub", "-q"],
        &["scrub", "-q", "--max-percent", "10"],
        &["check", "-q"],
        &["status", "-q"],
    ];
    for args in runs {
        let (run, kib, _) = cmd!()
            .args(args)
            .args([OsStr::new("--state"), db.as_os_str(), dir.as_os_str()])
            .measure();
        let run = run.expect_code(0);
        eprintln!("{args:?}: {kib} KiB");
        assert!(kib < 40 << 10, "{args:?}: {kib} KiB\n{}", run.stderr);
    }
}

/// A night's new files are read on top of the byte budget, which is the cycle's: a tree that
/// grows by a fifth a night under `--update --max-percent 25` still completes its cycle in
/// four nights, and every new file is tagged the night it appears (when new files spent
/// the budget first, the cycle took five times as long).
#[test]
fn new_files_do_not_stretch_the_cycle() {
    let t = Tree::new();
    for i in 0..100 {
        t.write(format!("tree/old/f{i:03}"), data(4000, i));
    }
    let tree = t.path("tree");
    let db = t.path("state.db");
    intact!("tag", "-q", "--state", &db, &tree).expect_code(0);
    let mut added = 0;
    for night in 1..=4 {
        for _ in 0..20 {
            t.write(format!("tree/new/n{added:03}"), data(4000, 1000 + added));
            added += 1;
        }
        let r = cmd!("scrub", "--json", "--update", "--state", &db)
            .args(["--max-percent", "25"])
            .arg(&tree)
            .days_later(night)
            .run()
            .expect_code(0)
            .json();
        assert_eq!(r.count("new"), 20, "night {night}: {}", r.summary);
        assert_eq!(
            r.summary["cycle"]["complete"],
            night == 4,
            "night {night}: {}",
            r.summary
        );
    }
}

/// A hard link made every night, its name earlier in walk order than the file's (the walk
/// meets the file there first), is the same file with the same history: the cycle still
/// ends every two nights at `--max-percent 50`, where it stayed open for good (the new name
/// counted as not yet checked, the run read it alone and began no new cycle).
#[test]
fn a_hard_link_made_every_night_does_not_hold_the_cycle_open() {
    let t = Tree::new();
    for i in 10..30 {
        t.write(format!("tree/a/f{i}"), data(4000, i));
    }
    let tree = t.path("tree");
    let db = t.path("state.db");
    intact!("tag", "-q", "--state", &db, &tree).expect_code(0);
    for night in 1..=8u32 {
        if night > 2 {
            fs::hard_link(
                tree.join(format!("a/f{}", 10 + night)),
                tree.join(format!("a/a{night}")),
            )
            .unwrap();
        }
        let r = cmd!("scrub", "--json", "--update", "--state", &db)
            .args(["--max-percent", "50"])
            .arg(&tree)
            .days_later(night)
            .run()
            .expect_code(0)
            .json();
        assert_eq!(r.summary["files"], 10, "night {night}: {}", r.summary);
        assert_eq!(
            r.summary["cycle"]["complete"],
            night % 2 == 0,
            "night {night}: {}",
            r.summary
        );
    }
}

/// A file's history is its inode's, whichever of its names it was read under: a file with two
/// names, whose folder moves make first one name, then the other, the one the walk meets
/// first, is said proven good when it last was (the name met first kept the history of the
/// last time it was read there, days older).
#[test]
fn a_file_with_two_names_keeps_its_latest_history_whichever_name_comes_first() {
    let t = Tree::new();
    let f = t.write("tree/a/x/f", data(5000, 1));
    t.write("tree/c/other", data(5000, 2));
    let tree = t.path("tree");
    fs::hard_link(&f, tree.join("c/l")).unwrap();
    let db = t.path("state.db");
    intact!("tag", "-q", "--state", &db, &tree).expect_code(0);
    let scrub = |day: u32| {
        cmd!("scrub", "-q", "--state", &db, &tree)
            .days_later(day)
            .run()
            .expect_code(0)
    };
    scrub(1);
    fs::rename(tree.join("a/x"), tree.join("d")).unwrap();
    scrub(2);
    fs::create_dir(tree.join("b")).unwrap();
    fs::rename(tree.join("d"), tree.join("b/x")).unwrap();
    scrub(3);
    scrub(4);
    fs::create_dir(tree.join("e")).unwrap();
    fs::rename(tree.join("b/x"), tree.join("e/x")).unwrap();
    let files: Vec<serde_json::Value> = intact!("status", "-v", "--json", "--state", &db, &tree)
        .expect_code(0)
        .stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .filter(|v: &serde_json::Value| v["type"] == "file")
        .collect();
    let verified = |name: &str| {
        files
            .iter()
            .find(|v| v["path"].as_str().unwrap().ends_with(name))
            .map(|v| v["verified"].clone())
            .unwrap_or_else(|| panic!("{name} in {files:?}"))
    };
    assert_eq!(verified("/c/l"), verified("/c/other"), "{files:?}");
}

/// The units' sandbox (issue 67): each unit's exposure, as `systemd-analyze security`
/// scores it, is within its bar; and the scrub unit's command, run as its sandbox runs it
/// where systemd is not PID 1 (its capability bounding set, no new privileges, no core file,
/// umask 077), still does its whole job (tags a new file another user keeps unreadable in a
/// folder of theirs, finds damage, gives parity, tells the owner, writes metrics node_exporter
/// can read) with only the system calls its filter allows, traced with strace.
#[test]
fn the_units_sandbox_holds_every_call_intact_makes() {
    require_root!();
    let units = Path::new(env!("CARGO_MANIFEST_DIR")).join("contrib/systemd");
    for (unit, bar) in [
        ("intact-scrub@.service", 4.9),
        ("intact-watch@.service", 4.9),
        ("intact-failure@.service", 1.0),
    ] {
        let out = Command::new("systemd-analyze")
            .args(["security", "--offline=true", "--no-pager"])
            .arg(units.join(unit))
            .output()
            .expect("systemd-analyze (systemd) is installed");
        let said = String::from_utf8_lossy(&out.stdout);
        let score: f64 = said
            .lines()
            .find_map(|l| l.split("Overall exposure level for ").nth(1))
            .and_then(|l| {
                l.split(": ")
                    .nth(1)?
                    .split_whitespace()
                    .next()?
                    .parse()
                    .ok()
            })
            .unwrap_or_else(|| panic!("{unit}: no score in {said}"));
        assert!(score <= bar, "{unit}: exposure {score} over {bar}\n{said}");
    }
    let text = fs::read_to_string(units.join("intact-scrub@.service")).unwrap();
    let setting = |key: &str| -> Vec<String> {
        text.lines()
            .filter_map(|l| l.strip_prefix(&format!("{key}=")))
            .flat_map(|v| v.split_whitespace().map(String::from))
            .collect()
    };
    // Every call the filter allows: its groups expanded as systemd expands them.
    fn expand(name: &str, into: &mut BTreeSet<String>) {
        if !name.starts_with('@') {
            into.insert(name.to_string());
            return;
        }
        let out = Command::new("systemd-analyze")
            .args(["syscall-filter", "--no-pager", name])
            .output()
            .unwrap();
        for l in String::from_utf8_lossy(&out.stdout).lines().skip(1) {
            let l = l.trim();
            if !l.is_empty() && !l.starts_with('#') {
                expand(l, into);
            }
        }
    }
    let mut allowed = BTreeSet::new();
    for name in setting("SystemCallFilter") {
        expand(&name, &mut allowed);
    }
    assert!(allowed.len() > 100, "{allowed:?}");
    let caps: Vec<String> = setting("CapabilityBoundingSet")
        .iter()
        .map(|c| format!("+{}", c.trim_start_matches("CAP_").to_lowercase()))
        .collect();

    let t = Tree::new();
    let (tree, _) = tagged_tree(&t, 30, 5_000);
    let damaged = tree.join("d1/f004");
    flip_byte(&damaged, 9);
    // Another user's new file, unreadable but to them, in a folder of theirs.
    let theirs = t.write("tree/alice/new.jpg", data(3000, 9));
    for (p, mode) in [(&theirs, 0o400), (&tree.join("alice"), 0o700)] {
        std::os::unix::fs::chown(p, Some(65534), Some(65534)).unwrap();
        fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
    }
    let receiver = crate::receiver::Receiver::http();
    let metrics = t.path("metrics/m.prom");
    fs::create_dir_all(metrics.parent().unwrap()).unwrap();
    let mut args = unit_command(
        &text,
        &[
            ("/var/lib/intact/state.db", &t.path("state/state.db")),
            ("%f", &tree),
            ("${INTACT_METRICS_DIR}", &metrics),
        ],
    );
    args.splice(
        1..1,
        [
            "--protect".to_string(),
            "--notify".into(),
            receiver.json_url(),
        ],
    );
    let inner = cmd!().args(&args).command();
    let trace = t.path("trace");
    let mut c = Command::new("setpriv");
    c.arg(format!("--bounding-set=-all,{}", caps.join(",")))
        .args(["--no-new-privs", "strace", "-f", "-c", "-o"])
        .arg(&trace)
        .args([
            "prlimit",
            "--core=0",
            "sh",
            "-c",
            "umask 077 && exec \"$@\"",
            "sh",
        ])
        .arg(inner.get_program())
        .args(inner.get_args());
    for (k, v) in inner.get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    // As at night: the data is cold.
    fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
    let out = c.output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("corrupt"), "{said}");
    assert!(getxattr(&theirs, TAG).is_some(), "not tagged: {said}");
    assert!(tree.join(".intact-parity/INTACT-PARITY").exists(), "{said}");
    assert_eq!(receiver.wait_for(1).len(), 1, "{said}");
    let mode = fs::metadata(&metrics).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o644, "metrics node_exporter cannot read");
    let traced = fs::read_to_string(&trace).unwrap();
    let used: Vec<&str> = traced
        .lines()
        .filter(|l| !l.starts_with('%') && !l.starts_with('-'))
        .filter_map(|l| l.split_whitespace().last())
        .filter(|&s| s != "total")
        .collect();
    assert!(used.len() > 20, "{traced}");
    let refused: Vec<&&str> = used.iter().filter(|s| !allowed.contains(**s)).collect();
    assert!(refused.is_empty(), "calls the filter refuses: {refused:?}");
}

/// A PATH that leads to another folder than the tree the database knows there (a disk that
/// did not mount leaves the empty folder under it; a folder swapped) is an alarm, exit 3,
/// with nothing under it verified or recorded: the tree's files are not taken for deleted,
/// nor the other folder's for its own. The tree back, all is as before; a copy of it put in
/// its place (restored from a backup) is taken as the tree once the owner says so.
#[test]
fn a_path_that_now_leads_to_another_folder_is_an_alarm_not_the_tree() {
    let t = Tree::new();
    let (tree, db) = tagged_tree(&t, 6, 1_000);
    intact!("scrub", "-q", "--state", &db, &tree).expect_code(0);
    let aside = t.path("tree.aside");
    fs::rename(&tree, &aside).unwrap();
    t.write("tree/stranger.txt", b"not the tree's");
    for verb in ["scrub", "check", "update"] {
        let r = intact!(verb, "--state", &db, &tree).expect_code(3);
        assert!(
            r.stderr.contains("now another folder"),
            "{verb}: {}",
            r.stderr
        );
        assert!(!r.stdout.contains("removed"), "{verb}: {}", r.stdout);
    }
    assert_eq!(
        getxattr(&tree.join("stranger.txt"), TAG),
        None,
        "update tagged it"
    );
    let r = intact!("status", "--state", &db, &tree).expect_code(3);
    assert!(r.stderr.contains("now another folder"), "{}", r.stderr);
    fs::remove_dir_all(&tree).unwrap();
    fs::rename(&aside, &tree).unwrap();
    let r = intact!("scrub", "--json", "--state", &db, &tree).expect_code(0);
    assert!(!r.stdout.contains("\"status\":\"removed\""), "{}", r.stdout);
    assert!(
        r.stdout.contains("\"removed\":0,\"vanished\":0"),
        "{}",
        r.stdout
    );
    // A copy in its place (a restore): the same tree once accepted, its history kept.
    copy_tree(&tree, &aside);
    fs::remove_dir_all(&tree).unwrap();
    fs::rename(&aside, &tree).unwrap();
    intact!("scrub", "-q", "--state", &db, &tree).expect_code(3);
    let r = intact!(
        "scrub",
        "--accept-moved-root",
        "--json",
        "--state",
        &db,
        &tree
    )
    .expect_code(0)
    .json();
    assert_eq!(r.count("ok"), 6, "{:?}", r.files);
    let r = intact!("status", "--json", "--state", &db, &tree).expect_code(0);
    let v: serde_json::Value = serde_json::from_str(r.stdout.trim()).unwrap();
    assert_eq!(v["never_verified"], 0, "{v}");
    intact!("scrub", "-q", "--state", &db, &tree).expect_code(0);
}
