//! The shipped alert rules (`contrib/prometheus/intact.rules.yml`), tested by `promtool test
//! rules` on the metrics intact actually writes in each situation: damage found, damage
//! outstanding on a night its file was not read, a run that could not record, a timer that
//! stopped, files not verified for too long, and all well.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::*;

/// The samples of a metrics file intact wrote: (series, value).
fn samples(prom: &Path) -> Vec<(String, f64)> {
    fs::read_to_string(prom)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').unwrap();
            (series.to_string(), value.parse().unwrap())
        })
        .collect()
}

/// One situation: the metrics files intact wrote in it, when to look (hours after), and the
/// alerts that must fire then (name, extra labels beyond `root`).
struct Case {
    name: &'static str,
    proms: Vec<PathBuf>,
    at_hours: u64,
    fire: Vec<(&'static str, Vec<(&'static str, &'static str)>)>,
}

/// A promtool test of `case` for the tree at `root`. promtool's clock starts at 0, so the
/// run's end timestamp is shifted back by the time the runs ended; every other value is as
/// intact wrote it, repeated every 5 minutes (as a collector scrapes it: rules with `for:`
/// see a series with no gap).
fn promtool_test(case: &Case, root: &Path, ended: f64) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "  - interval: 5m\n    name: {}\n    input_series:",
        case.name
    );
    for prom in &case.proms {
        for (series, value) in samples(prom) {
            let value = if series.starts_with("intact_run_end_timestamp_seconds") {
                (value - ended).max(0.0)
            } else {
                value
            };
            let _ = writeln!(
                t,
                "      - series: '{series}'\n        values: '{value}+0x{}'",
                (case.at_hours + 2) * 12
            );
        }
    }
    let _ = writeln!(t, "    alert_rule_test:");
    let root = root.display().to_string();
    for alert in [
        "IntactDamage",
        "IntactRunFailed",
        "IntactScrubsStopped",
        "IntactVerificationStale",
        "IntactTreeVanished",
        "IntactScrubsInterrupted",
        "IntactNotifyFailed",
    ] {
        let _ = writeln!(
            t,
            "      - eval_time: {}h\n        alertname: {alert}\n        exp_alerts:",
            case.at_hours
        );
        for (name, labels) in case.fire.iter().filter(|(n, _)| *n == alert) {
            let _ = name;
            let _ = writeln!(t, "          - exp_labels:\n              root: \"{root}\"");
            for (k, v) in labels {
                let _ = writeln!(t, "              {k}: \"{v}\"");
            }
            let _ = writeln!(t, "            exp_annotations:");
            for (k, v) in annotations(alert, &root, labels) {
                let _ = writeln!(
                    t,
                    "              {k}: {}",
                    serde_json::to_string(&v).unwrap()
                );
            }
        }
        if !case.fire.iter().any(|(n, _)| *n == alert) {
            t.truncate(t.trim_end_matches("exp_alerts:\n").len());
            let _ = writeln!(t, "exp_alerts: []");
        }
    }
    t
}

/// The annotations the rules file gives `alert`, with its labels filled in as Prometheus's
/// templates would.
fn annotations(alert: &str, root: &str, labels: &[(&str, &str)]) -> Vec<(String, String)> {
    let rules = fs::read_to_string(rules()).unwrap();
    let block = rules
        .split("- alert: ")
        .find(|b| b.starts_with(alert))
        .unwrap();
    let verb = labels
        .iter()
        .find(|(k, _)| *k == "verb")
        .map_or("", |(_, v)| *v);
    ["summary", "description"]
        .iter()
        .map(|key| {
            let line = block
                .lines()
                .find(|l| l.trim_start().starts_with(&format!("{key}:")))
                .unwrap();
            let text: String = serde_json::from_str(line.split_once(": ").unwrap().1).unwrap();
            (
                key.to_string(),
                text.replace("{{ $labels.root }}", root)
                    .replace("{{ $labels.verb }}", verb),
            )
        })
        .collect()
}

/// Writes to `prom` the metrics of a scrub stopped by SIGTERM mid-run (of a tree of its own,
/// in `t`); returns that tree.
fn interrupted_scrub(t: &Tree, prom: &Path) -> PathBuf {
    let tree = t.path("big");
    for i in 0..200 {
        t.write(format!("big/f{i:03}"), data(1 << 20, i));
    }
    intact!("tag", "-q", &tree).expect_code(0);
    let db = t.path("big.db");
    terminated_mid_run(
        || {
            cmd!(
                "scrub",
                "-q",
                "-j1",
                "--speed",
                "background",
                "--state",
                &db
            )
            .arg("--metrics")
            .arg(prom)
            .arg(&tree)
        },
        |run| run.code == 130,
    );
    tree
}

fn rules() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("contrib/prometheus/intact.rules.yml")
}

#[test]
fn the_alert_rules_fire_on_what_intact_writes() {
    let t = Tree::new();
    let tree = t.path("tree");
    for i in 0..10 {
        t.write(format!("tree/f{i}"), data(1_000, i));
    }
    intact!("tag", "-q", &tree).expect_code(0);
    let db = t.path("state.db");
    let prom = |name: &str| t.path(format!("{name}.prom"));
    let scrub = |p: &Path, extra: &[&str]| {
        cmd!("scrub", "-q", "--state", &db, "--metrics", p)
            .args(extra)
            .arg(&tree)
            .run()
    };
    let status = |p: &Path| {
        intact!("status", "-q", "--state", &db, "--metrics", p, &tree);
    };
    // All well.
    scrub(&prom("clean"), &[]).expect_code(0);
    status(&prom("clean-status"));
    // Damage found by tonight's scrub, then outstanding on a night its file is not read.
    flip_byte(&tree.join("f3"), 7);
    scrub(&prom("found"), &[]).expect_code(1);
    scrub(&prom("outstanding"), &["--max-bytes", "1000"]).expect_code(1);
    status(&prom("outstanding-status"));
    fs::write(tree.join("f3"), data(1_000, 3)).unwrap();
    intact!("update", "-q", "--state", &db, &tree).expect_code(0);
    // A run that could not record (its database a directory).
    let r = cmd!(
        "scrub",
        "-q",
        "--state",
        t.path("tree"),
        "--metrics",
        prom("failed"),
        &tree
    )
    .run();
    assert_eq!(r.code, 3, "{}", r.stderr);
    // Files last verified 50 days ago (the clock moved on; the database says when).
    db_change_entries(&db, |e| {
        e.verified = e.verified.map(|v| v - 50 * 86_400_000)
    });
    status(&prom("stale"));
    // A state database that cannot be read: damage unknown, never "0 damaged".
    let r = cmd!(
        "status",
        "-q",
        "--state",
        t.path("tree"),
        "--metrics",
        prom("unknown"),
        &tree
    )
    .run();
    assert_eq!(r.code, 3, "{}", r.stderr);
    // The tree's files gone at once (a disk that did not mount): nothing marked deleted.
    for i in 0..10 {
        fs::remove_file(tree.join(format!("f{i}"))).unwrap();
    }
    scrub(&prom("vanished"), &[]).expect_code(3);
    let big = interrupted_scrub(&t, &prom("interrupted"));
    let ended = samples(&prom("stale"))
        .iter()
        .find(|(s, _)| s.starts_with("intact_run_end_timestamp_seconds"))
        .unwrap()
        .1;

    let scrub_labels = vec![("verb", "scrub"), ("severity", "warning")];
    let cases = [
        Case {
            name: "all well",
            proms: vec![prom("clean"), prom("clean-status")],
            at_hours: 1,
            fire: vec![],
        },
        Case {
            name: "damage found",
            proms: vec![prom("found")],
            at_hours: 1,
            fire: vec![("IntactDamage", vec![("severity", "critical")])],
        },
        Case {
            name: "damage outstanding on a night its file was not read",
            proms: vec![prom("outstanding"), prom("outstanding-status")],
            at_hours: 1,
            fire: vec![("IntactDamage", vec![("severity", "critical")])],
        },
        Case {
            name: "a run that could not do its job",
            proms: vec![prom("failed")],
            at_hours: 1,
            fire: vec![("IntactRunFailed", scrub_labels.clone())],
        },
        Case {
            name: "the timer stopped",
            proms: vec![prom("clean")],
            at_hours: 72,
            fire: vec![("IntactScrubsStopped", scrub_labels.clone())],
        },
        Case {
            name: "damage that cannot be known",
            proms: vec![prom("unknown")],
            at_hours: 1,
            fire: vec![
                ("IntactDamage", vec![("severity", "critical")]),
                (
                    "IntactRunFailed",
                    vec![("verb", "status"), ("severity", "warning")],
                ),
            ],
        },
        Case {
            name: "a tree that vanished",
            proms: vec![prom("vanished")],
            at_hours: 1,
            fire: vec![
                ("IntactTreeVanished", vec![("severity", "critical")]),
                ("IntactRunFailed", scrub_labels.clone()),
            ],
        },
        Case {
            name: "files not verified for too long",
            proms: vec![prom("stale")],
            at_hours: 1,
            fire: vec![(
                "IntactVerificationStale",
                vec![("verb", "status"), ("severity", "warning")],
            )],
        },
    ];
    let mut spec = format!(
        "rule_files:\n  - {}\nevaluation_interval: 1m\ntests:\n",
        rules().display()
    );
    for case in &cases {
        // Every run's end is shifted by the same time: the runs ended within a minute.
        spec.push_str(&promtool_test(case, &tree, ended - 60.0));
    }
    // Of a tree of its own: cut short, and still so at the next night's run.
    let cut_short = Case {
        name: "scrubs cut short night after night",
        proms: vec![prom("interrupted")],
        at_hours: 27,
        fire: vec![
            ("IntactScrubsInterrupted", scrub_labels.clone()),
            ("IntactRunFailed", scrub_labels.clone()),
        ],
    };
    spec.push_str(&promtool_test(&cut_short, &big, ended - 60.0));
    let file = t.path("tests.yml");
    fs::write(&file, &spec).unwrap();
    let out = Command::new("promtool")
        .args(["test", "rules"])
        .arg(&file)
        .output()
        .expect("promtool (Debian's prometheus package) is installed");
    assert!(
        out.status.success(),
        "{}{}\n{spec}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let check = Command::new("promtool")
        .args(["check", "rules"])
        .arg(rules())
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stdout)
    );
}
