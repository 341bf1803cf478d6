//! What each verb does to one file once it is open: show, strip, check, tag, update, import.

use super::read::racy_window;
use super::{INTERRUPTED_REPAIR, Outcome, Subject, Worker, fail, unmark};
use crate::core::classify::{self, Status};
use crate::core::digest::{Algo, Digests};
use crate::core::tag::{Compat, Damage, Format, Tag, Timestamp};
use crate::engine::outcome::{Action, FileError, FileReport};
use crate::fs::xattr;

// Both sides of an Outcome carry a report: boxing the error side would only add an allocation.
#[allow(clippy::result_large_err)]
impl<'a> Worker<'a> {
    /// What a check would expect from metadata alone, for the richest tag (of `algo`).
    pub(super) fn show(
        &self,
        mut report: FileReport,
        s: &Subject,
        algo: Option<Algo>,
    ) -> FileReport {
        if let Some(algo) = algo {
            report.tag = s
                .stored
                .tags
                .iter()
                .find(|t| t.digest.algo == algo)
                .cloned();
            // A manifest that silently left tagged files out would pass for complete.
            if let (None, Some(other)) = (&report.tag, s.stored.best()) {
                return fail(report, FileError::OtherAlgorithm(other.digest.algo));
            }
        }
        if let Some(t) = &report.tag {
            report.status =
                classify::expect(t, s.meta.size, s.meta.mtime, self.config.mtime_window_ns);
            if s.stored.repairing {
                report.status = classify::after_interrupted_repair(report.status);
                report.detail = Some(INTERRUPTED_REPAIR.into());
            } else if let Some(damage) = s.stored.damage {
                // Found damaged and not dealt with since: a check will most likely agree.
                report.status = if t.mtime.is_some() {
                    Status::Corrupt
                } else {
                    Status::Mismatch
                };
                report.known_damage = Some(damage);
                report.detail = Some(format!(
                    "found damaged at {}, not yet repaired",
                    crate::text::time(damage.found)
                ));
            }
        }
        report
    }

    pub(super) fn strip(&self, mut report: FileReport, s: &Subject) -> FileReport {
        report.status = Status::Ok;
        let mut removed = match xattr::remove_intact(s.file) {
            Ok(r) => r,
            Err(e) => return fail(report, FileError::RemoveTag(e)),
        };
        for &format in &self.config.compat {
            match xattr::remove_compat(s.file, format) {
                Ok(r) => removed |= r,
                Err(e) => return fail(report, FileError::RemoveTag(e)),
            }
        }
        if removed {
            report.action = Some(Action::Removed);
        }
        report
    }

    pub(super) fn check(&mut self, report: FileReport, s: &Subject) -> Outcome {
        let Some(best) = s.stored.best() else {
            return Ok(report);
        };
        // Every tag present is verified, in one pass even if they use different algorithms.
        let (mut report, d) = self.read(report, s, s.stored.tags.iter().map(|t| t.digest.algo))?;
        self.judge(&mut report, best, s, &d);
        self.read_again(&mut report, best, s);
        let matches = |t: &Tag| t.digest == d.of(t.digest.algo);
        if s.stored.tags.iter().any(|t| matches(t) != matches(best)) {
            let names = |m: bool| {
                let n: Vec<&str> = s
                    .stored
                    .tags
                    .iter()
                    .filter(|&t| matches(t) == m)
                    .map(|t| t.format.name())
                    .collect();
                n.join(" and ")
            };
            report.detail = Some(format!(
                "tags disagree: the data matches the {} tag, not the {} tag",
                names(true),
                names(false)
            ));
            if !report.status.is_damage() {
                report.status = Status::Conflict;
            }
        }
        Ok(report)
    }

    pub(super) fn tag(&mut self, mut report: FileReport, s: &Subject) -> Outcome {
        if s.stored.best().is_some() && !self.config.force {
            report.status = Status::AlreadyTagged;
            // Compat tags can be added without reading: from intact's SHA-256, while the file
            // is as it was when tagged.
            let window = self.config.mtime_window_ns;
            return Ok(
                match s.stored.intact().filter(|t| {
                    t.digest.algo == Algo::Sha256
                        && classify::expect(t, s.meta.size, s.meta.mtime, window) == Status::Ok
                }) {
                    Some(t) => self.write_compat(report, s, &t.digest),
                    None if !self.config.compat.is_empty() => {
                        report.detail = Some(
                            "no compat tags added: no SHA-256 to copy from an unchanged intact \
                             tag; `update --compat` reads the file"
                                .into(),
                        );
                        report
                    }
                    None => report,
                },
            );
        }
        let algo = self.config.new_algo();
        let (mut report, d) = self.read(
            report,
            s,
            [algo]
                .into_iter()
                .chain(s.stored.best().map(|t| t.digest.algo))
                .chain(s.stored.damage.map(|m| m.digest.algo)),
        )?;
        if let Some(t) = s.stored.best() {
            self.judge(&mut report, t, s, &d);
            // `--force` re-tags what it reads, but never blesses damage.
            if report.status.is_damage() {
                report.detail = Some(format!(
                    "{}; not re-tagged (`update --accept-corrupt` accepts it as it is)",
                    report.detail.as_deref().unwrap_or("its data is damaged")
                ));
                return Ok(report);
            }
        } else if let Some(damage) = self.still_damaged(s, &d) {
            return Ok(untagged_damage(report, damage));
        }
        report.digest = Some(d.of(algo));
        Ok(self.write(report, s, &d, algo, Action::Tagged))
    }

    /// For a file without a tag (stripped, lost in a copy), the damage found in it before, if
    /// its data is still those damaged bytes: by its own mark, else by what the state database
    /// remembers of its inode. Such a file is not tagged: a tag taken off does not make
    /// damaged bytes good.
    pub(super) fn still_damaged(&self, s: &Subject, d: &Digests) -> Option<Damage> {
        if self.config.accept_corrupt {
            return None;
        }
        let same = |damage: &Damage| d.get(damage.digest.algo) == Some(damage.digest);
        let damage = s.stored.damage.filter(same).or_else(|| {
            let known = self.config.known_damage.as_ref()?;
            let fs = rustix::fs::fstatvfs(s.file).map_or(s.meta.dev as i64, |v| v.f_fsid as i64);
            known
                .iter()
                .filter(|((ino, _), _)| *ino == s.meta.ino)
                .flat_map(|(_, found)| found)
                .find(|(f, damage)| *f == fs && same(damage))
                .map(|(_, damage)| *damage)
        })?;
        Some(damage)
    }

    pub(super) fn update(&mut self, mut report: FileReport, s: &Subject) -> Outcome {
        let Some(tag) = s.stored.best() else {
            let algo = self.config.new_algo();
            let algos = [algo]
                .into_iter()
                .chain(s.stored.damage.map(|m| m.digest.algo));
            let (mut report, d) = self.read(report, s, algos)?;
            if let Some(damage) = self.still_damaged(s, &d) {
                return Ok(untagged_damage(report, damage));
            }
            report.digest = Some(d.of(algo));
            return Ok(self.write(report, s, &d, algo, Action::Tagged));
        };
        // A re-tag keeps the tag's algorithm unless one was asked for; one pass computes all.
        let algo = self.config.algo.unwrap_or(tag.digest.algo);
        let left = match &self.config.sink_verifies {
            Some(reads) => (reads.reads)(s.root, &tag.digest),
            None => self.config.changed_only && self.written_at(s).is_none(),
        };
        if left && algo == tag.digest.algo && self.unchanged(tag, s) {
            report.status = Status::AlreadyTagged;
            return Ok(report);
        }
        let all = s.stored.tags.iter().map(|t| t.digest.algo);
        let (mut report, d) =
            self.read(report, s, [tag.digest.algo, algo].into_iter().chain(all))?;
        self.judge(&mut report, tag, s, &d);
        self.read_again(&mut report, tag, s);
        let upgrade = s.stored.intact().is_none() || algo != tag.digest.algo;
        let mut report = match report.status {
            Status::Ok if upgrade => self.write(report, s, &d, algo, Action::Tagged),
            // The data is whole again: a repair's or a damage's mark left behind is only noise.
            Status::Ok if s.stored.repairing || s.stored.damage.is_some() => match unmark(s) {
                Ok(()) => {
                    report.action = Some(Action::Refreshed);
                    self.compat(report, s, &d)
                }
                Err(e) => fail(report, FileError::WriteTag(e)),
            },
            Status::Ok => self.compat(report, s, &d),
            // The disk holds the tag's bytes: nothing to accept or re-tag.
            Status::Unstable => report,
            Status::Corrupt | Status::Mismatch if !self.config.accept_corrupt => {
                // Nothing is written to a damaged file: a mark would move its ctime, and backup
                // tools would then store the damaged bytes over the good ones they hold. The
                // state database and its damage journal remember the damage instead.
                report.action = Some(Action::Kept);
                return Ok(report);
            }
            Status::Corrupt | Status::Mismatch => self.write(report, s, &d, algo, Action::Accepted),
            Status::Modified | Status::Older => self.write(report, s, &d, algo, Action::Tagged),
            Status::Touched => self.write(report, s, &d, algo, Action::Refreshed),
            _ => report,
        };
        // intact's tag now describes the data (and, on a re-tag, the other tools' tags the
        // file carries); another tool's that was not rewritten and describes other data is a
        // conflict the user should settle.
        let retagged = self.config.write
            && matches!(
                report.action,
                Some(Action::Tagged | Action::Refreshed | Action::Accepted)
            );
        if !retagged && report.status != Status::Error && !report.status.is_damage() {
            let stale: Vec<&str> = s
                .stored
                .tags
                .iter()
                .filter(|t| Compat::of(t.format).is_some_and(|c| !self.config.compat.contains(&c)))
                .filter(|t| t.digest != d.of(t.digest.algo))
                .map(|t| t.format.name())
                .collect();
            if !stale.is_empty() {
                report.status = Status::Conflict;
                report.detail = Some(format!(
                    "the {0} tag does not match the data: `--compat {0}` rewrites it, `strip --compat {0}` removes it",
                    stale.join(",")
                ));
            }
        }
        Ok(report)
    }

    /// Whether `tag`, the file's only one, describes it as it is, so that if its data still
    /// matches, an update has nothing to write; and it last changed long enough ago that a
    /// write after this would show in its ctime.
    pub(super) fn unchanged(&self, tag: &Tag, s: &Subject) -> bool {
        let window = self.config.mtime_window_ns;
        s.stored.tags.len() == 1
            && tag.format == Format::Intact
            && !s.stored.repairing
            && s.stored.damage.is_none()
            && self.config.compat.is_empty()
            && self.config.manifest.is_none()
            && classify::expect(tag, s.meta.size, s.meta.mtime, window) == Status::Ok
            && Timestamp::now().nanos() - s.meta.ctime.nanos() >= racy_window(s.meta.ctime)
    }

    /// Tags files whose data matches the manifest.
    pub(super) fn import(&mut self, report: FileReport, s: &Subject) -> Outcome {
        let Some(expected) = s.stored.best() else {
            return Ok(report);
        };
        // The file's own tags: compat tags already right need no write, and an intact tag that
        // finds the data damaged must survive a manifest made after the damage.
        let own = Subject {
            root: s.root,
            file: s.file,
            meta: s.meta,
            stored: xattr::read(s.file).unwrap_or_default(),
        };
        let mine = own.stored.intact();
        let algo = self
            .config
            .algo
            .or(mine.map(|t| t.digest.algo))
            .unwrap_or(expected.digest.algo);
        let (mut report, d) = self.read(
            report,
            s,
            [expected.digest.algo, algo]
                .into_iter()
                .chain(mine.map(|t| t.digest.algo)),
        )?;
        self.judge(&mut report, expected, s, &d);
        if report.status != Status::Ok {
            return Ok(report);
        }
        if let Some(mine) = mine {
            let verdict = classify::classify(
                mine,
                s.meta.size,
                s.meta.mtime,
                &d.of(mine.digest.algo),
                self.config.mtime_window_ns,
            );
            if verdict.is_damage() {
                report.status = verdict;
                report.digest = Some(d.of(mine.digest.algo));
                report.tag = Some(mine.clone());
                report.action = Some(Action::Kept);
                report.detail = Some(
                    "matches the manifest but not its own tag, under the same mtime: the manifest \
                     was made after the damage? Its tag is kept"
                        .into(),
                );
                return Ok(report);
            }
            if verdict == Status::Ok && mine.digest.algo == algo {
                return Ok(self.compat(report, &own, &d));
            }
        }
        Ok(self.write(report, &own, &d, algo, Action::Tagged))
    }
}

/// Why a damage mark is evidence of nothing against `tag`, if it is: one of another algorithm
/// cannot be compared, and one naming the tag's own digest calls the tag's own bytes damage
/// (a forged or garbled mark: intact never writes one).
pub(super) fn mark_contradicts(mark: &Damage, tag: &Tag) -> Option<&'static str> {
    if mark.digest.algo != tag.digest.algo {
        Some("a damage mark of another algorithm than the tag's")
    } else if mark.digest == tag.digest {
        Some("a damage mark naming the tag's own digest, which no damage has")
    } else {
        None
    }
}

/// The report of an untagged file whose data is still the bytes found damaged before: damage,
/// not a new file.
pub(super) fn untagged_damage(mut report: FileReport, damage: Damage) -> FileReport {
    report.status = Status::Corrupt;
    report.digest = Some(damage.digest);
    report.known_damage = Some(damage);
    report.detail = Some(format!(
        "its tag is gone, but its data is still the bytes found damaged at {}: not tagged \
         (`update --accept-corrupt` accepts it as it is)",
        crate::text::time(damage.found)
    ));
    report
}
