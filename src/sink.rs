//! What happens to the engine's reports. Every verb's consumer (the archive writer, the
//! parity protector, the repairer, the export listing) is a [`Sink`] in one loop, so the
//! driver handles progress, Ctrl-C, broken pipes and the exit code once for all of them: the
//! sink acts on each report in walk order and hands on, through [`Out`], the reports it is
//! done with, in the same order.
//!
//! A sink that reads files anyway says which (`engine::Config::sink_verifies`): those whose
//! tag already describes them come unread, `already-tagged` with that tag, and the sink
//! verifies them from what it reads, so that each file is read and hashed once.
//!
//! A report says a file was archived or protected only once that is durable: a sink holds
//! such reports until its work is committed ([`Out::hold`] and [`Out::settle`], or its own
//! queue), and a failure of the work itself is a [`Failure`] of the run (exit 3), never a
//! per-file claim left standing.

use std::fmt;
use std::io;

use crate::engine::FileReport;

/// Where a sink's reports go: the reporter, behind the driver.
pub trait Out {
    /// A report that is final.
    fn send(&mut self, report: FileReport);
    /// A report whose copy stands only once the work is durable, and goes without it
    /// otherwise. Held reports go out, in order, at [`Out::settle`]; nothing may be sent while
    /// reports are held.
    fn hold(&mut self, report: FileReport);
    /// Lets the held reports out: with their copy if the work is `durable`.
    fn settle(&mut self, durable: bool);
    /// A line for people, printed with the summary (e.g. what was written where).
    fn note(&mut self, line: String);
    /// A warning, printed at once.
    fn warn(&mut self, line: String);
    /// A tree that vanished or lost many files at once: an alarm (exit 3), nothing taken
    /// for deleted.
    fn removal(&mut self, removal: &crate::scrub::Removal);
}

/// A verb's consumer of reports.
pub trait Sink {
    /// Acts on one report, in walk order, handing on through `out` those that are final.
    fn take(&mut self, report: FileReport, out: &mut dyn Out) -> Result<(), Failure>;

    /// After the walk: completes the work unless the run was `interrupted`, and hands on
    /// every report still held. Called once, also after a failure.
    fn finish(&mut self, interrupted: bool, out: &mut dyn Out) -> Result<(), Failure>;

    /// Whether it wants, before [`Sink::finish`], the files the state database knows under
    /// the roots that the walk did not meet and that are gone (`repair --missing`, a
    /// `protect` of the whole tree).
    fn wants_missing(&self) -> bool {
        false
    }

    /// Those files; it returns those to record as deleted (a run that saw the whole tree and
    /// found a few gone, as a scrub records them).
    fn missing(&mut self, _files: Vec<crate::state::Missing>) -> Vec<crate::state::Missing> {
        Vec::new()
    }
}

/// Reports go straight to the reporter: the verbs whose work is the engine's alone (tag,
/// check, update, strip, show, import).
pub struct Pass;

impl Sink for Pass {
    fn take(&mut self, report: FileReport, out: &mut dyn Out) -> Result<(), Failure> {
        out.send(report);
        Ok(())
    }

    fn finish(&mut self, _interrupted: bool, _out: &mut dyn Out) -> Result<(), Failure> {
        Ok(())
    }
}

/// The work itself could not be done (an archive or a parity store could not be written):
/// the run stops, and its exit code is 3.
#[derive(Debug)]
pub struct Failure {
    /// What was being done.
    pub what: String,
    /// Why it failed.
    pub error: io::Error,
    /// It was writing to standard output: a closed pipe there ends the run quietly, as it
    /// does for the reports (`intact export | head`).
    pub stdout: bool,
}

impl Failure {
    /// A failure of `what`.
    pub fn new(what: impl Into<String>, error: io::Error) -> Self {
        Failure {
            what: what.into(),
            error,
            stdout: false,
        }
    }

    /// A failure of `what`, writing to standard output.
    pub fn on_stdout(what: impl Into<String>, error: io::Error) -> Self {
        Failure {
            stdout: true,
            ..Failure::new(what, error)
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.what, crate::engine::cause(&self.error))
    }
}

impl std::error::Error for Failure {}
