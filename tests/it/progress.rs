//! The progress bar, watched on a real pseudo-terminal (util-linux `script`), over a slow
//! disk (the FUSE mirror, each read delayed): it knows where it is going (a total of the data
//! the run reads, and an ETA), never reaches stdout, steps aside for per-file lines, fits a
//! narrow terminal, and is gone before the summary.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::common::*;
use crate::faultfs::FaultFs;

/// One frame of the bar: bytes done, the total, the ETA in seconds.
#[derive(Debug, Clone, Copy)]
struct Frame {
    done: f64,
    total: f64,
    eta: u64,
}

/// `12.50` and `MiB` as bytes.
fn size(n: &str, unit: &str) -> Option<f64> {
    let scale = match unit {
        "B" => 1.0,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    Some(n.parse::<f64>().ok()? * scale)
}

/// The frames the terminal was sent: each between carriage returns, escapes removed.
fn frames(log: &str) -> Vec<Frame> {
    log.split(['\r', '\n'])
        .filter_map(|raw| {
            let text = raw.replace("\x1b[2K", "");
            let words: Vec<&str> = text.split_whitespace().collect();
            let (done, rest) = (words.first()?, words.get(1)?);
            let (done_unit, total) = rest.split_once('/')?;
            let total_unit = words.get(2)?.trim_end_matches(|c: char| !c.is_alphabetic());
            let at = words.iter().position(|w| *w == "ETA")?;
            let eta = words.get(at + 1)?;
            let secs = eta
                .trim_end_matches(|c: char| c.is_alphabetic())
                .parse::<u64>()
                .ok()?;
            let secs = match eta.trim_start_matches(|c: char| c.is_ascii_digit()) {
                "s" => secs,
                "m" => secs * 60,
                "h" => secs * 3600,
                _ => return None,
            };
            Some(Frame {
                done: size(done, done_unit)?,
                total: size(total, total_unit)?,
                eta: secs,
            })
        })
        .collect()
}

/// Runs `intact ARGS` on a pseudo-terminal of `cols` columns, stdout sent to `out` unless
/// it is `None` (then it shares the terminal); returns what the terminal received.
fn on_a_terminal(t: &Tree, cols: u16, args: &str, out: Option<&Path>) -> String {
    let log = t.path("terminal.log");
    let redirect = out.map_or(String::new(), |o| format!(" > {}", o.display()));
    let script = format!("stty rows 24 cols {cols}; {} {args}{redirect}", bin());
    let status = Command::new("script")
        .args(["-q", "-e", "-c", &script])
        .arg(&log)
        .stdout(std::process::Stdio::null())
        .status()
        .expect("script (util-linux) is installed");
    assert!(
        matches!(status.code(), Some(0 | 1 | 3)),
        "{script}: {status}"
    );
    String::from_utf8_lossy(&fs::read(&log).unwrap()).into_owned()
}

#[test]
fn the_bar_knows_its_total_and_stays_on_the_terminal() {
    require_faults!();
    let t = Tree::new();
    let backing = t.path("backing");
    fs::create_dir(&backing).unwrap();
    for i in 0..4 {
        fs::write(backing.join(format!("big{i}")), data(16 << 20, i)).unwrap();
    }
    for i in 0..20 {
        fs::write(backing.join(format!("small{i:02}")), data(100_000, 100 + i)).unwrap();
    }
    let mount = t.path("slow");
    fs::create_dir(&mount).unwrap();
    let fs = FaultFs::mount(&backing, &mount).unwrap();
    for i in 0..4 {
        intact!("tag", "-q", mount.join(format!("big{i}"))).expect_code(0);
    }
    // About 25 MB/s, one read at a time: two and a half seconds of reading.
    fs.slow(Duration::from_millis(5));
    let tagged = 4.0 * (16 << 20) as f64;
    let m = mount.display();

    let out = t.path("out.txt");
    let log = on_a_terminal(&t, 100, &format!("check --no-state {m}"), Some(&out));
    let seen = frames(&log);
    assert!(seen.len() >= 5, "{} frames: {log:?}", seen.len());
    // A total from the start (the walk counts ahead of the reads), of what check reads: the
    // tagged files, not the untagged ones it skips.
    assert!(
        seen.iter().any(|f| f.done < f.total && f.eta >= 1),
        "no frame with work left and an ETA: {seen:?}"
    );
    let last = seen.last().unwrap();
    assert!(
        (last.total - tagged).abs() < tagged * 0.03,
        "total {} for {tagged} bytes read: {seen:?}",
        last.total
    );
    assert!(seen.iter().all(|f| f.done <= f.total), "{seen:?}");
    // Nothing of the bar on stdout; the bar cleared before the summary.
    let stdout = fs::read_to_string(&out).unwrap();
    assert!(
        !stdout.contains("ETA") && !stdout.contains('\x1b'),
        "{stdout:?}"
    );
    assert_eq!(stdout.lines().count(), 20, "the untagged files: {stdout}");
    // The bar cleared before the summary (and before any note that comes with it).
    let summary = log.find("check: ").expect("the summary");
    let before = &log[..summary];
    let cleared = before.rfind("\r\x1b[2K").expect("the bar cleared");
    assert!(
        !before[cleared..].contains("ETA") && before[cleared..].ends_with(['K', '\n']),
        "{:?}",
        &log[..summary]
    );

    // Per-file lines on the same terminal: each whole, at the start of its line.
    let log = on_a_terminal(&t, 100, &format!("check --no-state {m}"), None);
    let lines: Vec<&str> = log.split('\n').filter(|l| l.contains("new  ")).collect();
    assert_eq!(lines.len(), 20, "{log:?}");
    // As they are found, not after the summary.
    assert!(
        log.rfind("new  ") < log.find("check: "),
        "lines after the summary: {log:?}"
    );
    for line in lines {
        let shown = line.rsplit('\r').find(|s| !s.is_empty()).unwrap_or(line);
        assert!(
            shown.replace("\x1b[2K", "").starts_with("new      "),
            "{line:?}"
        );
    }

    // A narrow terminal: every frame fits on its line.
    let log = on_a_terminal(&t, 40, &format!("check --no-state {m}"), Some(&out));
    for frame in log.split(['\r', '\n']).filter(|f| f.contains("ETA")) {
        let width = frame.replace("\x1b[2K", "").trim_end().chars().count();
        assert!(width <= 40, "{width} columns: {frame:?}");
    }

    // A budgeted scrub: its total is the budget's share, not the tree.
    let log = on_a_terminal(
        &t,
        100,
        &format!("scrub --no-state --max-bytes 32MiB {m}"),
        Some(&out),
    );
    let seen = frames(&log);
    let last = seen.last().expect("frames of the scrub");
    assert!(
        (last.total - tagged / 2.0).abs() < tagged * 0.02,
        "scrub total {}: {seen:?}",
        last.total
    );
}
