//! Other tools' tags written beside intact's (`--compat`), and kept in step on a re-tag.

use super::{Subject, Worker, fail};
use crate::core::digest::{Algo, Digest, Digests};
use crate::core::tag::Compat;
use crate::engine::outcome::{Action, FileError, FileReport};
use crate::fs::xattr;

impl<'a> Worker<'a> {
    /// Writes the requested compat tags from the SHA-256 just computed.
    pub(super) fn compat(&self, report: FileReport, s: &Subject, d: &Digests) -> FileReport {
        if self.config.compat.is_empty() {
            return report;
        }
        self.write_compat(report, s, &d.of(Algo::Sha256))
    }

    /// As [`Worker::compat`], for a file intact just re-tagged: with the tags of other tools
    /// it already carries. They were there, so its owner uses both tools (moving from
    /// cshatag, or working beside it): left describing the old data, they would make every
    /// later check a conflict.
    pub(super) fn retag_compat(&self, report: FileReport, s: &Subject, d: &Digests) -> FileReport {
        let Some(sha256) = d.get(Algo::Sha256) else {
            return report;
        };
        let mut formats = self.config.compat.clone();
        formats.extend(s.stored.tags.iter().filter_map(|t| Compat::of(t.format)));
        formats.sort();
        formats.dedup();
        self.write_formats(report, s, &sha256, &formats)
    }

    /// Writes each requested compat tag that does not already say the same.
    pub(super) fn write_compat(
        &self,
        report: FileReport,
        s: &Subject,
        sha256: &Digest,
    ) -> FileReport {
        self.write_formats(report, s, sha256, &self.config.compat)
    }

    /// Writes each tag of `formats` that does not already say the same.
    pub(super) fn write_formats(
        &self,
        mut report: FileReport,
        s: &Subject,
        sha256: &Digest,
        formats: &[Compat],
    ) -> FileReport {
        if !self.config.write {
            return report;
        }
        for &format in formats {
            if s.stored.compat_current(format, sha256, s.meta.mtime) {
                continue;
            }
            if let Err(e) = xattr::write_compat(s.file, format, sha256, s.meta.mtime) {
                return fail(report, FileError::WriteTag(e));
            }
            report.action.get_or_insert(Action::Tagged);
        }
        report
    }
}
