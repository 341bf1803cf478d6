//! Prometheus metrics in the text exposition format, for node_exporter's textfile collector:
//! written to a temp file and renamed, so the collector never reads half a file. Every series
//! carries the tree it is about (`root`), so that the files of several trees in one collector
//! directory never repeat a series.

use std::fmt::Write as _;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::core::classify::Status;
use crate::engine::Action;
use crate::fs::atomic::Temp;
use crate::report::Summary;

/// Metric families, each with its help line, in the order added.
#[derive(Default)]
pub struct Metrics {
    /// The trees the metrics are about: the `root` label of every series.
    root: String,
    families: Vec<Family>,
}

/// A metric's name, help line, and samples (labels, value).
type Family = (String, String, Vec<(String, f64)>);

impl Metrics {
    /// Metrics about the trees at `roots`: absolute paths, escaped as intact prints paths,
    /// joined by `, ` in the `root` label.
    pub fn of(roots: &[PathBuf]) -> Metrics {
        let root = roots
            .iter()
            .map(|r| crate::text::escape(&crate::state::absolute(r)))
            .collect::<Vec<_>>()
            .join(", ");
        Metrics {
            root,
            families: Vec::new(),
        }
    }

    /// Adds a gauge sample `name{root, labels} value`.
    pub fn gauge(&mut self, name: &str, help: &str, labels: &[(&str, &str)], value: f64) {
        let inner: Vec<String> = [("root", self.root.as_str())]
            .iter()
            .chain(labels)
            .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
            .collect();
        let labels = format!("{{{}}}", inner.join(","));
        let name = format!("intact_{name}");
        match self.families.iter_mut().find(|f| f.0 == name) {
            Some(f) => f.2.push((labels, value)),
            None => self
                .families
                .push((name, help.to_string(), vec![(labels, value)])),
        }
    }

    /// Files found gone from the trees and still remembered: a scrub's, those of the last
    /// 30 days; another verb's, those it found.
    pub fn removed(&mut self, verb: &str, files: u64) {
        self.gauge(
            "files_removed",
            "Files found gone from the tree in the last 30 days (scrub), or by this run.",
            &[("verb", verb)],
            files as f64,
        );
    }

    /// What a run did: files by status and action, damage not dealt with, bytes read,
    /// duration, end, exit code.
    pub fn run(&mut self, verb: &str, s: &Summary, exit_code: i32, end_ms: i64) {
        self.gauge(
            "files_damaged",
            "Files found damaged (by this run or earlier ones) and not yet repaired or accepted.",
            &[("verb", verb)],
            s.damaged() as f64,
        );
        self.gauge(
            "tree_missing",
            "Trees that vanished (none of their recorded files there) or lost many files at once.",
            &[("verb", verb)],
            s.vanished as f64,
        );
        self.gauge(
            "files_removed_alarm",
            "Files gone at once in such numbers that their deletion is held as an alarm, not recorded.",
            &[("verb", verb)],
            s.removed_alarm as f64,
        );
        self.gauge(
            "run_interrupted",
            "1 if the last run was stopped (a signal, a timeout) before it finished.",
            &[("verb", verb)],
            f64::from(u8::from(s.interrupted)),
        );
        if let Some(failed) = s.notify_failed {
            self.gauge(
                "notify_failed",
                "1 if telling the owner (Apprise, sendmail, the heartbeat) failed in the last run.",
                &[("verb", verb)],
                f64::from(u8::from(failed)),
            );
        }
        self.end(verb, exit_code, end_ms);
        for st in Status::ALL {
            self.gauge(
                "files",
                "Files the last run reported, by status.",
                &[("verb", verb), ("status", st.name())],
                s.count(st) as f64,
            );
        }
        for a in Action::ALL {
            self.gauge(
                "actions",
                "Files the last run acted on, by action.",
                &[("verb", verb), ("action", a.name())],
                s.action(a) as f64,
            );
        }
        let v = &[("verb", verb)];
        self.gauge(
            "read_bytes",
            "Bytes of file data the last run read and verified.",
            v,
            s.bytes as f64,
        );
        self.gauge(
            "run_duration_seconds",
            "How long the last run took.",
            v,
            s.elapsed.as_secs_f64(),
        );
    }

    /// When the run ended, and its exit code.
    pub fn end(&mut self, verb: &str, exit_code: i32, end_ms: i64) {
        let v = &[("verb", verb)];
        self.gauge(
            "run_end_timestamp_seconds",
            "When the last run ended (Unix time).",
            v,
            end_ms as f64 / 1e3,
        );
        self.gauge(
            "run_exit_code",
            "The last run's exit code: 0 clean, 1 damage, 3 errors, 130 interrupted.",
            v,
            exit_code as f64,
        );
    }

    /// The text format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for (name, help, samples) in &self.families {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} gauge");
            for (labels, value) in samples {
                let _ = writeln!(out, "{name}{labels} {value}");
            }
        }
        out
    }

    /// Writes the metrics to `path`, atomically.
    pub fn write(&self, path: &Path) -> io::Result<()> {
        let name = path
            .file_name()
            .ok_or_else(|| io::Error::other("the metrics file needs a file name"))?;
        let temp = Temp::beside(path)?;
        temp.file().write_all(self.render().as_bytes())?;
        // The collector runs as another user: readable by all, as a plain file would be.
        rustix::fs::fchmod(temp.file(), rustix::fs::Mode::from_raw_mode(0o644))?;
        temp.commit(name)
    }
}

/// A label value with `\`, `"` and newlines escaped, as the format asks.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_help_per_family_and_escaped_labels() {
        let mut m = Metrics::of(&[PathBuf::from("/srv/\"photos\"")]);
        m.gauge("x", "An x.", &[("path", "a\"b\\c")], 1.0);
        m.gauge("x", "An x.", &[("path", "d")], 2.5);
        let text = m.render();
        assert_eq!(text.matches("# HELP intact_x").count(), 1);
        assert!(
            text.contains("intact_x{root=\"/srv/\\\"photos\\\"\",path=\"a\\\"b\\\\c\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("intact_x{root=\"/srv/\\\"photos\\\"\",path=\"d\"} 2.5\n"),
            "{text}"
        );
    }
}
