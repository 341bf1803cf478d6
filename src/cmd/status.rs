//! `status`: how well verified and protected the trees are, from tags and the state
//! database alone.

use std::fmt::Write as _;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::{Duration, UNIX_EPOCH};

use anyhow::Context;

use crate::cli::StatusArgs;
use crate::cli::settings::Settings;
use intact::engine::Work;
use intact::metrics::Metrics;
use intact::report::{Exit, Verb, bytes, escape, group};
use intact::scrub::Overview;
use intact::state;

pub fn run(a: StatusArgs) -> anyhow::Result<Exit> {
    let mut s = Settings::new(Verb::Show, Work::Show, a.paths.paths, &a.common)?;
    s.record(&a.state);
    let state = s.state.as_deref().and_then(super::open_state);
    let mut errors = 0u64;
    let mut plan = intact::scrub::plan(&s.config, &s.roots, true, &super::STOP, |r| {
        if r.status == intact::core::classify::Status::Error {
            errors += 1;
            eprintln!(
                "intact: error: {}: {}",
                escape(&r.path),
                r.error.as_ref().map_or(String::new(), |e| e.to_string())
            );
        }
    })
    .context("reading the trees")?;
    let mut state = state;
    super::on_state(&mut state, |db| plan.attach(db)).context("reading the state database")?;
    let db = state.as_ref().and_then(|st| st.path().map(PathBuf::from));
    let now = state::now();
    let overview = plan.overview(now)?;
    let (cycle_files, cycle_bytes) = (overview.cycle_verified.files, overview.cycle_verified.bytes);
    let speed = state
        .as_ref()
        .and_then(|st| st.throughput("scrub").or_else(|| st.throughput("check")));
    let cycle_seconds = speed.map(|bps| overview.tagged.bytes as f64 / bps);
    let (never, oldest) = (overview.ages[0].files, overview.oldest);
    let mut exit = if overview.damage.is_empty() {
        Exit::Clean
    } else {
        Exit::Damage
    };
    if errors > 0 {
        exit = exit.merge(Exit::Trouble);
    }
    let mut out = std::io::stdout().lock();
    if s.json {
        let json = serde_json::json!({
            "type": "status",
            "overview": overview,
            "cycle": {
                "started": (plan.cycle_started > 0).then(|| rfc3339(plan.cycle_started)),
                "files_checked": cycle_files,
                "bytes_checked": cycle_bytes,
                "seconds_for_a_cycle": cycle_seconds,
            },
            "never_verified": never,
            "oldest_verification": oldest.map(rfc3339),
            "state": db,
            "exit_code": exit as i32,
        });
        writeln!(out, "{json}")?;
    } else {
        let width = terminal_width();
        let text = render(&overview, a.damage_lines, width, cycle_seconds, speed);
        out.write_all(text.as_bytes())?;
        if plan.cycle_started > 0 {
            writeln!(
                out,
                "cycle       since {}: {} of {} tagged files checked ({})",
                rfc3339(plan.cycle_started),
                group(cycle_files),
                group(overview.tagged.files),
                bytes(cycle_bytes)
            )?;
        }
        if db.is_none() {
            writeln!(
                out,
                "(no state database: every file counts as never verified)"
            )?;
        }
    }
    out.flush()?;
    if let Some(path) = &a.metrics.metrics {
        let mut m = Metrics::default();
        let v = [("verb", "status")];
        let pairs = [
            (
                "files_tagged",
                "Tagged files under the roots.",
                overview.tagged.files,
            ),
            (
                "bytes_tagged",
                "Bytes in tagged files under the roots.",
                overview.tagged.bytes,
            ),
            (
                "files_untagged",
                "Untagged regular files under the roots.",
                overview.untagged.files,
            ),
            (
                "files_damaged",
                "Files found damaged and not yet repaired or accepted.",
                overview.damage.len() as u64,
            ),
            (
                "files_protected",
                "Tagged files with a parity set.",
                overview.protected.files,
            ),
            (
                "files_archived",
                "Tagged files with an archived copy.",
                overview.archived.files,
            ),
        ];
        for (name, help, value) in pairs {
            m.gauge(name, help, &v, value as f64);
        }
        super::verification_ages(&mut m, "status", never + overview.untagged.files, oldest);
        if let Some(secs) = cycle_seconds {
            m.gauge(
                "cycle_estimate_seconds",
                "How long verifying every tagged file takes at the speed of recent scrubs.",
                &v,
                secs,
            );
        }
        m.write(path)
            .with_context(|| format!("writing the metrics {}", escape(path)))?;
    }
    Ok(exit)
}

/// Unix milliseconds as an RFC 3339 time.
fn rfc3339(ms: i64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64))
        .to_string()
}

/// The width to draw the chart for: the terminal's, `$COLUMNS`, or 80.
fn terminal_width() -> usize {
    let stdout = std::io::stdout();
    if stdout.is_terminal()
        && let Ok(size) = rustix::termios::tcgetwinsize(&stdout)
        && size.ws_col > 0
    {
        return size.ws_col as usize;
    }
    std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(80)
}

/// The overview for people: counts, the age chart with bars scaled to `width`, damage.
fn render(
    o: &Overview,
    damage_lines: usize,
    width: usize,
    cycle_seconds: Option<f64>,
    speed: Option<f64>,
) -> String {
    let mut t = String::new();
    let drawn = (|| -> std::fmt::Result {
        writeln!(
            t,
            "files       {} tagged ({}), {} untagged ({})",
            group(o.tagged.files),
            bytes(o.tagged.bytes),
            group(o.untagged.files),
            bytes(o.untagged.bytes)
        )?;
        writeln!(
            t,
            "verified    files by time since their last verification:"
        )?;
        let most = o.ages.iter().map(|a| a.files).max().unwrap_or(0).max(1);
        let bar_width = width.saturating_sub(36).clamp(10, 60);
        for a in &o.ages {
            let len = (a.files as f64 / most as f64 * bar_width as f64).round() as usize;
            let len = if a.files > 0 { len.max(1) } else { 0 };
            writeln!(
                t,
                "  {:<10} {:<w$} {:>9} {:>9}",
                a.label,
                "#".repeat(len),
                group(a.files),
                bytes(a.bytes),
                w = bar_width
            )?;
        }
        let share = |n: u64| {
            if o.tagged.files == 0 {
                0.0
            } else {
                100.0 * n as f64 / o.tagged.files as f64
            }
        };
        writeln!(
            t,
            "copies      {} with parity ({:.0}%), {} archived ({:.0}%)",
            group(o.protected.files),
            share(o.protected.files),
            group(o.archived.files),
            share(o.archived.files)
        )?;
        match (cycle_seconds, speed) {
            (Some(secs), Some(bps)) => writeln!(
                t,
                "full cycle  about {} at {}/s (recent scrubs)",
                humantime::format_duration(Duration::from_secs(secs.ceil() as u64)),
                bytes(bps as u64)
            )?,
            _ => writeln!(t, "full cycle  unknown: no scrub or check recorded yet")?,
        }
        if o.damage.is_empty() {
            writeln!(t, "damage      none found that is not repaired")?;
        } else {
            writeln!(
                t,
                "damage      {} file(s) found damaged, not yet repaired or accepted:",
                o.damage.len()
            )?;
            for d in o.damage.iter().take(damage_lines) {
                writeln!(
                    t,
                    "  {:<8} {}  (found {})",
                    d.status.as_deref().unwrap_or("damaged"),
                    escape(&d.path),
                    d.found.map_or("?".into(), rfc3339)
                )?;
            }
            if o.damage.len() > damage_lines {
                writeln!(
                    t,
                    "  ... and {} more (--json lists all)",
                    o.damage.len() - damage_lines
                )?;
            }
        }
        Ok(())
    })();
    drawn.expect("writing to a String");
    t
}

#[cfg(test)]
mod tests {
    use intact::scrub::{Age, Count, Overview};

    fn overview() -> Overview {
        let ages = [("never", 5), ("< 1 day", 20), ("< 1 week", 0), ("older", 1)]
            .into_iter()
            .map(|(label, files)| Age {
                label,
                files,
                bytes: files * 100,
            })
            .collect();
        Overview {
            tagged: Count {
                files: 26,
                bytes: 2600,
            },
            untagged: Count::default(),
            ages,
            damage: Vec::new(),
            protected: Count::default(),
            archived: Count::default(),
            cycle_verified: Count::default(),
            oldest: None,
        }
    }

    /// The longest run of `#` in each line of the chart.
    fn bars(text: &str) -> Vec<usize> {
        text.lines()
            .filter(|l| l.starts_with("  "))
            .map(|l| l.matches('#').count())
            .collect()
    }

    #[test]
    fn the_age_chart_scales_to_the_terminal() {
        let narrow = bars(&super::render(&overview(), 20, 60, None, None));
        let wide = bars(&super::render(&overview(), 20, 120, None, None));
        // The largest bucket spans the room there is; the others keep their proportion; an
        // empty bucket has no bar, a small one at least a mark.
        assert_eq!(narrow, vec![6, 24, 0, 1]);
        assert_eq!(wide, vec![15, 60, 0, 3]);
    }
}
