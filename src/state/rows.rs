//! What a report says that is worth remembering, as rows for the writer, and the statements
//! that record each fact.

use crate::core::classify::Status;
use crate::core::digest::{Algo, Digest};
use crate::engine::{Action, FileReport};

/// A row waiting to be written.
#[derive(Clone)]
pub(super) struct Row {
    pub(super) fact: Fact,
    pub(super) fs: i64,
    pub(super) ino: i64,
    pub(super) key: Vec<u8>,
    pub(super) path: Vec<u8>,
    pub(super) size: i64,
    pub(super) t: i64,
    pub(super) status: &'static str,
    /// Damage: the digest of the damaged bytes, and when they were first found.
    pub(super) damage: Option<(Vec<u8>, i64)>,
    /// A repair: the inode the damaged bytes were in (the repaired file is a new one).
    pub(super) old_ino: Option<i64>,
    /// The key of the tag the file carried before this run re-tagged it, if another.
    pub(super) was: Option<Vec<u8>>,
    /// Its owner, group and mode, where the run looked.
    pub(super) owner: Option<crate::engine::Owner>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Fact {
    /// The data matched its tag, or was just tagged from what was read: proven good now.
    Verified,
    /// The data no longer matches an unchanged tag.
    Damaged,
    /// The data changed under a moved mtime (modified, older): an edit, which ends any
    /// damage; the file was looked at this cycle, but is not proven good.
    Edited,
    /// A verdict that proves nothing either way (conflict, unreadable, changed while read):
    /// looked at this cycle; damage found before stands.
    Judged,
    /// Restored from a verified copy.
    Repaired,
    /// Parity was written.
    Protected,
    /// Copied into an archive by this run: a copy once the run's copies are durable
    /// ([`State::settle`]).
    Archived,
    /// Both `Verified` and `Archived`.
    VerifiedArchived,
}

/// What a report says that is worth remembering, each fact with the content it is about
/// (none: the empty key): the verdict, and a copy made. At most two, and no allocation:
/// this runs for every file.
pub(super) fn facts(r: &FileReport) -> impl Iterator<Item = (Fact, Option<Digest>)> {
    let tagged = r.tag.as_ref().map(|t| t.digest);
    // An untagged file that could not be tagged (update, scrub --update): under the empty
    // key, which the plan gives untagged files, so that it waits for the next cycle.
    if tagged.is_none() && matches!(r.status, Status::Error | Status::Changed) {
        return [Some((Fact::Judged, None)), None].into_iter().flatten();
    }
    let verdict = match (r.action, r.status) {
        // A new tag describes the data just read (a new file, an edit, damage accepted):
        // proven good as of now.
        (Some(Action::Tagged | Action::Accepted), _) => r.digest.map(|d| (Fact::Verified, d)),
        // The data matched the tag (only the mtime moved, and was refreshed).
        (Some(Action::Refreshed), _) => r.digest.map(|d| (Fact::Verified, d)),
        (Some(Action::Repaired), _) => tagged.map(|d| (Fact::Repaired, d)),
        // Read, and it matched (touched: under another mtime).
        (_, Status::Ok | Status::Touched) if r.digest.is_some() => {
            tagged.map(|d| (Fact::Verified, d))
        }
        (_, s) if s.is_damage() => tagged.map(|d| (Fact::Damaged, d)),
        (_, Status::Modified | Status::Older) => tagged.map(|d| (Fact::Edited, d)),
        (_, Status::Conflict | Status::Error | Status::Changed) => {
            tagged.map(|d| (Fact::Judged, d))
        }
        _ => None,
    };
    let copy = match r.copy {
        Some(Action::Protected) => r.digest.or(tagged).map(|d| (Fact::Protected, d)),
        Some(Action::Archived) => r.digest.or(tagged).map(|d| (Fact::Archived, d)),
        _ => None,
    };
    // A verification and an archived copy of the same content are one row: half the
    // writes of an archive run.
    let facts = match (verdict, copy) {
        (Some((Fact::Verified, v)), Some((Fact::Archived, c))) if v == c => {
            [Some((Fact::VerifiedArchived, v)), None]
        }
        (verdict, copy) => [verdict, copy],
    };
    facts
        .map(|f| f.map(|(fact, d)| (fact, Some(d))))
        .into_iter()
        .flatten()
}

/// The digest a database key holds (see [`digest_key`]).
pub fn digest_from_key(key: &[u8]) -> Option<Digest> {
    let (&algo, bytes) = key.split_first()?;
    let algo = match algo {
        0 => Algo::Sha256,
        1 => Algo::Blake3,
        _ => return None,
    };
    Some(Digest {
        algo,
        bytes: bytes.try_into().ok()?,
    })
}

/// A digest as the database keys it: the algorithm byte, then the bytes.
pub fn digest_key(d: &Digest) -> Vec<u8> {
    let mut key = Vec::with_capacity(33);
    key.push(match d.algo {
        Algo::Sha256 => 0,
        Algo::Blake3 => 1,
    });
    key.extend_from_slice(&d.bytes);
    key
}
