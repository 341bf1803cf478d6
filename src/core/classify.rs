//! The classification table: stored tag × the file's metadata now × a fresh digest → status.
//!
//! This is the heart of telling bit rot from an edit: applications that change a file also
//! move its mtime forward, while a flipped bit on disk changes the data under an unchanged
//! mtime. Written down, with one test per row, in `docs/classification.md`.

use crate::core::digest::Digest;
use crate::core::tag::{Damage, Tag, Timestamp};

/// What intact found for one file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    /// Tagged, and the data matches.
    Ok,
    /// Data changed under an unchanged mtime: silent corruption.
    Corrupt,
    /// Data changed and the tag records no mtime to tell why (Dintch tags): possibly corrupt.
    Mismatch,
    /// The data did not match its tag, but a second read around the page cache did: the
    /// disk holds the good bytes, and something between it and the CPU (memory, a cable, a
    /// controller) changed them on the way. Damage all the same, until a read matches again.
    Unstable,
    /// Data changed and the mtime moved forward: a legitimate edit.
    Modified,
    /// Data changed and the mtime moved backwards: perhaps an older copy was restored.
    Older,
    /// Same data, different mtime.
    Touched,
    /// No valid tag.
    New,
    /// Has a tag that was not verified (`tag` does not read tagged files).
    AlreadyTagged,
    /// The file's tags disagree about its data (one matches, another does not).
    Conflict,
    /// Listed in the manifest, absent from the tree.
    Missing,
    /// The file changed while it was being read: no verdict, nothing stored.
    #[serde(rename = "changed-while-read")]
    Changed,
    /// The file could not be processed.
    Error,
    /// Not a regular file (symlink, FIFO, device ...) or another link to an inode already seen.
    Skipped,
}

impl Status {
    /// The word used in output.
    pub fn name(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Corrupt => "corrupt",
            Status::Mismatch => "mismatch",
            Status::Unstable => "unstable",
            Status::Modified => "modified",
            Status::Older => "older",
            Status::Touched => "touched",
            Status::New => "new",
            Status::AlreadyTagged => "already-tagged",
            Status::Conflict => "conflict",
            Status::Missing => "missing",
            Status::Changed => "changed-while-read",
            Status::Error => "error",
            Status::Skipped => "skipped",
        }
    }

    /// Every status, in declaration order, which is the order summaries list them in (and
    /// count them by: `status as usize`).
    pub const ALL: [Status; 14] = [
        Status::Ok,
        Status::Corrupt,
        Status::Mismatch,
        Status::Unstable,
        Status::Modified,
        Status::Older,
        Status::Touched,
        Status::New,
        Status::AlreadyTagged,
        Status::Conflict,
        Status::Missing,
        Status::Changed,
        Status::Error,
        Status::Skipped,
    ];

    /// Whether the data may have been damaged without a legitimate write.
    pub fn is_damage(self) -> bool {
        matches!(self, Status::Corrupt | Status::Mismatch | Status::Unstable)
    }
}

/// How the mtime now relates to the stored one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeOrder {
    /// Within the tolerance.
    Same,
    /// Later than stored.
    Newer,
    /// Earlier than stored.
    Older,
}

/// Compares mtimes, allowing `window_ns` (as rsync's `--modify-window`) plus whatever rounding
/// the tag format itself introduced.
pub fn compare_mtime(tag: &Tag, now: Timestamp, window_ns: u64) -> Option<TimeOrder> {
    let stored = tag.mtime?;
    let slack = window_ns.max(tag.mtime_slack_ns) as i128;
    let diff = now.nanos() - stored.nanos();
    Some(if diff.abs() <= slack {
        TimeOrder::Same
    } else if diff > 0 {
        TimeOrder::Newer
    } else {
        TimeOrder::Older
    })
}

/// The verdict for a tagged file whose data was just hashed into `fresh` (with the tag's
/// algorithm). `size` and `mtime` are the file's now. A size other than the tag's is other
/// data, whatever the digest says (only a tag that contradicts itself could match), so this
/// agrees with [`expect`], which sees the size alone.
pub fn classify(tag: &Tag, size: u64, mtime: Timestamp, fresh: &Digest, window_ns: u64) -> Status {
    let same_data = *fresh == tag.digest && tag.size.is_none_or(|s| s == size);
    match compare_mtime(tag, mtime, window_ns) {
        Some(TimeOrder::Same) if same_data => Status::Ok,
        Some(TimeOrder::Same) => Status::Corrupt,
        Some(_) if same_data => Status::Touched,
        Some(TimeOrder::Newer) => Status::Modified,
        Some(TimeOrder::Older) => Status::Older,
        // No stored mtime (Dintch): the tagging time, if known, can still prove an edit.
        None if same_data => Status::Ok,
        None => match tag.tagged {
            Some(t) if mtime.sec > t => Status::Modified,
            _ => Status::Mismatch,
        },
    }
}

/// The verdict for a file that a repair was rewriting in place when it stopped (see
/// [`crate::fs::xattr::Stored::repairing`]): the rewrite moved its mtime, so a moved mtime proves
/// no edit, and data that does not match the tag is damage.
pub fn after_interrupted_repair(verdict: Status) -> Status {
    match verdict {
        Status::Modified | Status::Older => Status::Corrupt,
        other => other,
    }
}

/// How the data now relates to damage found earlier ([`Damage`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SinceDamage {
    /// Still the damaged bytes: the same damage, whatever the mtime says.
    Same,
    /// The data matches its tag again (restored by hand): the damage is over.
    Whole,
    /// Other bytes under a moved mtime: new content the owner wrote, which ends the damage.
    Edited,
    /// Other bytes under the same mtime: damaged again, differently.
    Worse,
}

/// The verdict on a file found damaged before, from its `verdict` by the table and the
/// `fresh` digest: data that still hashes to the damaged bytes is that damage even if the
/// mtime moved since (a touch, a sync tool), which the table alone would call an edit.
pub fn since_damage(
    tag: &Tag,
    verdict: Status,
    fresh: &Digest,
    damage: &Damage,
) -> (Status, SinceDamage) {
    if *fresh == damage.digest {
        // A tag without an mtime (Dintch) says mismatch where others say corrupt.
        let same = if tag.mtime.is_some() {
            Status::Corrupt
        } else {
            Status::Mismatch
        };
        return (same, SinceDamage::Same);
    }
    let how = match verdict {
        Status::Ok | Status::Touched => SinceDamage::Whole,
        Status::Corrupt | Status::Mismatch => SinceDamage::Worse,
        _ => SinceDamage::Edited,
    };
    (verdict, how)
}

/// What a check would most likely say, from metadata alone (no data read): used by `show`.
pub fn expect(tag: &Tag, size: u64, mtime: Timestamp, window_ns: u64) -> Status {
    let size_differs = tag.size.is_some_and(|s| s != size);
    match compare_mtime(tag, mtime, window_ns) {
        // A different size under the same mtime cannot be an edit.
        Some(TimeOrder::Same) if size_differs => Status::Corrupt,
        Some(TimeOrder::Same) => Status::Ok,
        Some(TimeOrder::Newer) => Status::Modified,
        Some(TimeOrder::Older) => Status::Older,
        None => Status::Ok,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::digest::{Algo, digest_bytes};
    use crate::core::tag::Format;

    const T: Timestamp = Timestamp {
        sec: 1_700_000_000,
        nsec: 123_456_789,
    };

    fn tag(format: Format) -> Tag {
        Tag {
            format,
            digest: digest_bytes(Algo::Sha256, b"original"),
            size: Some(8),
            mtime: (format != Format::Dintch).then_some(T),
            mtime_slack_ns: 0,
            tagged: Some(T.sec),
        }
    }

    fn at(delta_ns: i64) -> Timestamp {
        let n = T.nanos() + delta_ns as i128;
        Timestamp {
            sec: n.div_euclid(1_000_000_000) as i64,
            nsec: n.rem_euclid(1_000_000_000) as u32,
        }
    }

    fn same() -> Digest {
        digest_bytes(Algo::Sha256, b"original")
    }
    fn other() -> Digest {
        digest_bytes(Algo::Sha256, b"0riginal")
    }

    #[test]
    fn row_ok() {
        assert_eq!(classify(&tag(Format::Intact), 8, T, &same(), 0), Status::Ok);
    }

    #[test]
    fn row_corrupt_same_mtime_other_data() {
        assert_eq!(
            classify(&tag(Format::Intact), 8, T, &other(), 0),
            Status::Corrupt
        );
    }

    #[test]
    fn row_modified_newer_mtime_other_data() {
        assert_eq!(
            classify(&tag(Format::Intact), 8, at(1), &other(), 0),
            Status::Modified
        );
    }

    #[test]
    fn row_older_earlier_mtime_other_data() {
        assert_eq!(
            classify(&tag(Format::Intact), 8, at(-1), &other(), 0),
            Status::Older
        );
    }

    #[test]
    fn row_touched_other_mtime_same_data() {
        assert_eq!(
            classify(&tag(Format::Intact), 8, at(1), &same(), 0),
            Status::Touched
        );
        assert_eq!(
            classify(&tag(Format::Intact), 8, at(-1), &same(), 0),
            Status::Touched
        );
    }

    #[test]
    fn row_interrupted_repair_other_data_is_corrupt_whatever_the_mtime() {
        let t = tag(Format::Intact);
        for mtime in [T, at(1), at(-1)] {
            let verdict = after_interrupted_repair(classify(&t, 8, mtime, &other(), 0));
            assert_eq!(verdict, Status::Corrupt, "{mtime:?}");
        }
        // A repair that finished writing but not unmarking left good data.
        assert_eq!(
            after_interrupted_repair(classify(&t, 8, T, &same(), 0)),
            Status::Ok
        );
        assert_eq!(
            after_interrupted_repair(classify(&t, 8, at(5), &same(), 0)),
            Status::Touched
        );
    }

    /// Row "known damage, mtime moved": the damaged bytes are damage whatever the mtime,
    /// other bytes under a moved mtime an edit that ends it, the tag's bytes whole again.
    #[test]
    fn row_known_damage_is_never_blessed_by_a_moved_mtime() {
        let t = tag(Format::Intact);
        let damage = Damage {
            digest: other(),
            found: T.sec,
        };
        let edit = digest_bytes(Algo::Sha256, b"an edit!");
        for mtime in [T, at(1), at(-1)] {
            let verdict = classify(&t, 8, mtime, &other(), 0);
            assert_eq!(
                since_damage(&t, verdict, &other(), &damage),
                (Status::Corrupt, SinceDamage::Same),
                "{mtime:?}"
            );
        }
        let touched = classify(&t, 8, at(1), &same(), 0);
        assert_eq!(
            since_damage(&t, touched, &same(), &damage),
            (Status::Touched, SinceDamage::Whole)
        );
        let edited = classify(&t, 8, at(1), &edit, 0);
        assert_eq!(
            since_damage(&t, edited, &edit, &damage),
            (Status::Modified, SinceDamage::Edited)
        );
        let worse = classify(&t, 8, T, &edit, 0);
        assert_eq!(
            since_damage(&t, worse, &edit, &damage),
            (Status::Corrupt, SinceDamage::Worse)
        );
        // A Dintch tag cannot tell corrupt from edited: it stays a mismatch.
        let dintch = tag(Format::Dintch);
        for mtime in [T, at(2_000_000_000)] {
            let verdict = classify(&dintch, 8, mtime, &other(), 0);
            assert_eq!(
                since_damage(&dintch, verdict, &other(), &damage),
                (Status::Mismatch, SinceDamage::Same)
            );
        }
    }

    #[test]
    fn a_size_other_than_the_tags_is_other_data_as_show_expects() {
        let t = tag(Format::Intact);
        assert_eq!(classify(&t, 9, T, &same(), 0), Status::Corrupt);
        assert_eq!(expect(&t, 9, T, 0), Status::Corrupt);
        assert_eq!(classify(&t, 9, at(1), &same(), 0), Status::Modified);
    }

    #[test]
    fn nanosecond_precision_by_default_and_window_when_asked() {
        let t = tag(Format::Intact);
        assert_eq!(classify(&t, 8, at(1), &other(), 0), Status::Modified);
        assert_eq!(
            classify(&t, 8, at(999_999_999), &other(), 1_000_000_000),
            Status::Corrupt
        );
        assert_eq!(
            classify(&t, 8, at(-1_000_000_000), &other(), 1_000_000_000),
            Status::Corrupt
        );
        assert_eq!(
            classify(&t, 8, at(1_000_000_001), &other(), 1_000_000_000),
            Status::Modified
        );
    }

    #[test]
    fn float_timestamps_get_their_rounding_as_slack() {
        let mut t = tag(Format::Shatag);
        t.mtime_slack_ns = 1_000;
        assert_eq!(classify(&t, 8, at(300), &same(), 0), Status::Ok);
        assert_eq!(classify(&t, 8, at(300), &other(), 0), Status::Corrupt);
        assert_eq!(classify(&t, 8, at(5_000), &other(), 0), Status::Modified);
    }

    #[test]
    fn mtime_zero_is_an_ordinary_time() {
        let mut t = tag(Format::Intact);
        t.mtime = Some(Timestamp { sec: 0, nsec: 0 });
        let zero = Timestamp { sec: 0, nsec: 0 };
        assert_eq!(classify(&t, 8, zero, &same(), 0), Status::Ok);
        assert_eq!(classify(&t, 8, zero, &other(), 0), Status::Corrupt);
        assert_eq!(classify(&t, 8, T, &other(), 0), Status::Modified);
    }

    #[test]
    fn dintch_without_mtime() {
        let t = tag(Format::Dintch);
        assert_eq!(classify(&t, 8, T, &same(), 0), Status::Ok);
        // Not later than the tagging time: the cause cannot be told.
        assert_eq!(classify(&t, 8, T, &other(), 0), Status::Mismatch);
        assert_eq!(
            classify(&t, 8, at(2_000_000_000), &other(), 0),
            Status::Modified
        );
        let mut untimed = t.clone();
        untimed.tagged = None;
        assert_eq!(
            classify(&untimed, 8, at(2_000_000_000), &other(), 0),
            Status::Mismatch
        );
    }

    #[test]
    fn all_is_in_declaration_order() {
        for (i, s) in Status::ALL.iter().enumerate() {
            assert_eq!(*s as usize, i, "{s:?}");
        }
        for (i, a) in crate::engine::Action::ALL.iter().enumerate() {
            assert_eq!(*a as usize, i, "{a:?}");
        }
    }

    #[test]
    fn json_names_are_the_display_names() {
        for s in Status::ALL {
            assert_eq!(serde_json::to_value(s).unwrap(), s.name());
        }
    }

    #[test]
    fn expectation_from_metadata() {
        let t = tag(Format::Intact);
        assert_eq!(expect(&t, 8, T, 0), Status::Ok);
        assert_eq!(expect(&t, 9, T, 0), Status::Corrupt);
        assert_eq!(expect(&t, 9, at(1), 0), Status::Modified);
        assert_eq!(expect(&t, 8, at(-1), 0), Status::Older);
    }
}
