//! A night: the shipped unit's command run as systemd would run it (its `ExecStart=` from
//! contrib/systemd, the owner's settings in its environment, days later by the fake clock),
//! what a person then receives, and what `status` says.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::receiver::Receiver;

/// What one run of intact did.
pub struct Ran {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
    /// Its peak resident memory (KiB).
    pub max_rss_kib: u64,
    pub seconds: f64,
}

/// Runs `intact ARGS` `days` days after the simulation's start (libfaketime), with `env`; its
/// code, output, time and peak memory.
pub fn intact(args: &[String], days: u32, env: &[(&str, String)]) -> Ran {
    let mut c = crate::common::Cmd::new(&[]).args(args).days_later(days);
    for (k, v) in env {
        c = c.env(k, v);
    }
    let (run, max_rss_kib, took) = c.measure();
    Ran {
        code: run.code,
        stdout: run.stdout,
        stderr: run.stderr,
        max_rss_kib,
        seconds: took.as_secs_f64(),
    }
}

/// The nightly unit's command for `tree`, with `scrub_args` as the owner's
/// `INTACT_SCRUB_ARGS`, the state database `db` and the metrics file `metrics`.
pub fn unit_command(tree: &Path, scrub_args: &str, db: &Path, metrics: &Path) -> Vec<String> {
    let unit = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("contrib/systemd/intact-scrub@.service"),
    )
    .unwrap();
    let exec = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("an ExecStart");
    let mut args = Vec::new();
    for word in exec.split_whitespace().skip(1) {
        match word {
            "$INTACT_SCRUB_ARGS" => args.extend(scrub_args.split_whitespace().map(String::from)),
            "/var/lib/intact/state.db" => args.push(db.display().to_string()),
            "%f" => args.push(tree.display().to_string()),
            w if w.starts_with("${INTACT_METRICS_DIR}") => args.push(metrics.display().to_string()),
            w => {
                assert!(
                    !w.contains(['$', '%']),
                    "a word the simulator cannot expand: {w}"
                );
                args.push(w.to_string());
            }
        }
    }
    args
}

/// What reached the receiver during a night: messages (title, body, type) and heartbeats.
#[derive(Default, Debug)]
pub struct Heard {
    pub messages: Vec<(String, String, String)>,
    pub heartbeats: usize,
}

/// What the receiver got since it had `seen` requests; `seen` moves on. Deliveries end
/// before intact does, so they are all there when it has exited.
pub fn heard(receiver: &Receiver, seen: &mut usize) -> Heard {
    // The receiver writes each request whole under its final name.
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut all = receiver.messages();
    while all.len() < *seen && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        all = receiver.messages();
    }
    let mut heard = Heard::default();
    for request in &all[*seen..] {
        let (line, body) = request.split_once('\n').unwrap_or((request, ""));
        if line.starts_with("GET /heartbeat") {
            heard.heartbeats += 1;
        } else if line.starts_with("POST /notify") {
            let v: Value = serde_json::from_str(body).unwrap();
            let s = |k: &str| v[k].as_str().unwrap_or_default().to_string();
            heard.messages.push((s("title"), s("message"), s("type")));
        } else {
            panic!("an unexpected request: {line}");
        }
    }
    *seen = all.len();
    heard
}

/// The files a message lists as damaged (its DAMAGED section), as written there.
pub fn named_damaged(body: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut inside = false;
    for line in body.lines() {
        if line.starts_with("DAMAGED:") {
            inside = true;
            continue;
        }
        if !inside {
            continue;
        }
        let Some(item) = line.strip_prefix("  ").or_else(|| line.strip_prefix("* ")) else {
            break;
        };
        let item = item.rsplit_once(" (found ").map_or(item, |(path, _)| path);
        names.push(item.to_string());
    }
    names
}

/// `status -v --json` of `tree`: its exit code, the damage it lists, the files it calls
/// removed, whether the database's history was lost, when each file was last proven good,
/// and the document.
pub struct Status {
    pub code: i32,
    pub damaged: Vec<PathBuf>,
    pub removed: Vec<PathBuf>,
    pub history_lost: bool,
    pub verified: Vec<(PathBuf, Option<i64>)>,
    pub doc: Value,
}

pub fn status(tree: &Path, db: &Path, days: u32) -> Status {
    let args: Vec<String> = ["status", "-v", "--json", "--state"]
        .iter()
        .map(|s| s.to_string())
        .chain([db.display().to_string(), tree.display().to_string()])
        .collect();
    let ran = intact(&args, days, &[]);
    let mut verified = Vec::new();
    let mut doc = Value::Null;
    for line in ran.stdout.lines() {
        let v: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("status --json: {e}: {line}\n{}", ran.stderr));
        match v["type"].as_str() {
            Some("file") => {
                let when = v["verified"].as_str().and_then(|t| {
                    let t = humantime::parse_rfc3339_weak(t).ok()?;
                    let secs = t.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs();
                    Some(secs as i64)
                });
                verified.push((PathBuf::from(v["path"].as_str().unwrap()), when));
            }
            _ => doc = v,
        }
    }
    let paths = |v: &Value| -> Vec<PathBuf> {
        v.as_array()
            .unwrap_or_else(|| panic!("status --json: {doc}"))
            .iter()
            .map(|d| PathBuf::from(d["path"].as_str().unwrap()))
            .collect()
    };
    Status {
        code: ran.code,
        damaged: paths(&doc["overview"]["damage"]),
        removed: paths(&doc["removed"]),
        history_lost: !doc["history_lost"].is_null(),
        verified,
        doc,
    }
}
