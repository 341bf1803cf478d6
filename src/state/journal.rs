//! The damage journal: a small append-only file beside the state database that remembers
//! every damage found, so that losing the database (deleted, damaged, replaced) never loses
//! the memory of damage. intact writes nothing to a damaged file (no mark: a mark moves the
//! ctime, and backup tools would then store the damaged bytes), so this journal, not the
//! file, is what a new database is rebuilt from.
//!
//! One line per damage found, written and synced when it is found:
//! `found fs ino tag damaged status path`, tab-separated, digests and the path in hex, so that
//! any name fits on a line. A torn last line (a crash mid-append) is skipped. Damage ends by
//! repair, acceptance, an edit, or deletion. Where intact ends it (a repair, an acceptance, an
//! edit or a good read of a file known damaged), it appends a line of the same shape whose
//! status is `ended` (its time is when the damage ended, its damaged digest empty): it ends
//! every earlier entry of that file system, inode and tag. A repair in place (a file with
//! several names) keeps both, so only that line tells its damage is over. An entry that no
//! longer describes the file under its path (deleted, replaced, re-tagged) is dropped too.
//! Neither is ever replayed, so a replay never brings back damage that ended; compaction
//! keeps only what is still damage.

use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::MetadataExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// One damage found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// When (Unix milliseconds).
    pub found: i64,
    /// The file system id and inode of the damaged file.
    pub fs: i64,
    /// Its inode.
    pub ino: i64,
    /// The digest key (as the database keeps it) of the tag the damage was found under.
    pub tag: Vec<u8>,
    /// The digest key of the damaged bytes.
    pub damaged: Vec<u8>,
    /// The verdict (corrupt, mismatch).
    pub status: String,
    /// Where it was, absolute.
    pub path: PathBuf,
}

/// The status of a line that ends damage.
const ENDED: &str = "ended";

impl Entry {
    /// The line that says the damage of `fs`, `ino` under `tag` (at `path`) ended `at`.
    pub fn ended(at: i64, fs: i64, ino: i64, tag: Vec<u8>, path: PathBuf) -> Entry {
        Entry {
            found: at,
            fs,
            ino,
            tag,
            damaged: Vec::new(),
            status: ENDED.into(),
            path,
        }
    }

    /// Whether this line ends damage rather than records it.
    pub fn is_end(&self) -> bool {
        self.status == ENDED
    }

    /// The entry as a line of the journal.
    pub(super) fn line(&self) -> String {
        format!(
            "{}\t{}\t{}\t{}\t{}\t{}\t{}\n",
            self.found,
            self.fs,
            self.ino,
            hex::encode(&self.tag),
            hex::encode(&self.damaged),
            self.status,
            hex::encode(self.path.as_os_str().as_encoded_bytes())
        )
    }

    /// Parses a line; `None` for anything else (a torn last line).
    fn parse(line: &str) -> Option<Entry> {
        let mut f = line.split('\t');
        let entry = Entry {
            found: f.next()?.parse().ok()?,
            fs: f.next()?.parse().ok()?,
            ino: f.next()?.parse().ok()?,
            tag: hex::decode(f.next()?).ok()?,
            damaged: hex::decode(f.next()?).ok()?,
            status: f.next()?.to_string(),
            path: PathBuf::from(std::ffi::OsString::from_vec(hex::decode(f.next()?).ok()?)),
        };
        (f.next().is_none() && !entry.status.is_empty()).then_some(entry)
    }

    /// Whether the file under its path is still the one found damaged, under the same tag:
    /// `tag_of` reads the digest key of a file's tag.
    pub fn still_there(&self, tag_of: &dyn Fn(&File) -> Option<Vec<u8>>) -> bool {
        let Ok(file) = File::open(&self.path) else {
            return false;
        };
        file.metadata()
            .is_ok_and(|m| m.ino() as i64 == self.ino && m.is_file())
            && tag_of(&file).as_deref() == Some(&self.tag[..])
    }
}

/// The journal of the database at `db`: `db` with `.damage` appended.
pub fn path_of(db: &Path) -> PathBuf {
    super::recover::with_suffix(db, ".damage")
}

/// Appends `entries` to the journal at `path`, durably: one write and one sync for all of
/// them (one sync each made a scrub that found 5,000 damaged files ten times as slow as the
/// same scrub of a healthy tree).
pub fn append(path: &Path, entries: &[Entry]) -> io::Result<()> {
    let lines: String = entries.iter().map(Entry::line).collect();
    // Only the running user's, never through a symlink (it names damaged files).
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    if !f.metadata()?.is_file() {
        return Err(io::Error::other("not a regular file"));
    }
    f.write_all(lines.as_bytes())?;
    f.sync_data()
}

/// Every entry in the journal at `path` (none if there is none).
pub fn read(path: &Path) -> io::Result<Vec<Entry>> {
    match crate::fs::sys::open_regular(path) {
        Ok(f) => read_file(f),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// Every entry in the journal open as `f`.
pub(super) fn read_file(f: File) -> io::Result<Vec<Entry>> {
    let mut entries = Vec::new();
    for line in BufReader::new(f).lines() {
        if let Some(e) = Entry::parse(line?.trim_end_matches('\n')) {
            entries.push(e);
        }
    }
    Ok(entries)
}

/// What is wrong with the journal at `path`, if anything: not a file, unreadable, or lines
/// that are not entries (but a torn last line, a crash mid-append). Said by every run until
/// it is dealt with: the damage such a journal recorded is not known.
pub fn problem(path: &Path) -> Option<String> {
    let shown = crate::text::escape(path);
    let text = match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return None,
        Ok(m) if !m.is_file() => {
            return Some(format!(
                "the damage journal {shown} is not a file: the damage it records cannot be \
                 read, nor new damage written there (move it aside)"
            ));
        }
        _ => std::fs::read(path),
    };
    let text = match text {
        Ok(text) => text,
        Err(e) => return Some(format!("the damage journal {shown} cannot be read ({e})")),
    };
    // What follows the last newline is a line not yet whole.
    let whole = text.split(|&b| b == b'\n').count() - 1;
    let bad = text
        .split(|&b| b == b'\n')
        .take(whole)
        .filter(|l| std::str::from_utf8(l).ok().and_then(Entry::parse).is_none())
        .count();
    (bad > 0).then(|| {
        format!(
            "the damage journal {shown} holds {bad} line(s) that are not entries: damage they \
             recorded is not known (remove them)"
        )
    })
}

/// The damage `entries` (a journal, in order) still record: each file's (file system, inode,
/// tag) once, as first found, and none that a later line ended.
pub fn outstanding(entries: Vec<Entry>) -> Vec<Entry> {
    let mut open: Vec<Entry> = Vec::new();
    for e in entries {
        let same = |k: &Entry| (k.fs, k.ino, &k.tag) == (e.fs, e.ino, &e.tag);
        if e.is_end() {
            open.retain(|k| !same(k));
        } else if !open.iter().any(same) {
            open.push(e);
        }
    }
    open
}

/// Rewrites the journal at `path` with `keep` only (atomically: a crash leaves the old or
/// the new journal).
pub fn rewrite(path: &Path, keep: &[Entry]) -> io::Result<()> {
    let text: String = keep.iter().map(Entry::line).collect();
    let temp = crate::fs::atomic::Temp::beside(path)?;
    let mut file = temp.file();
    file.write_all(text.as_bytes())?;
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::other("no file name"))?;
    temp.commit(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_any_name_and_torn_lines_are_skipped() {
        let e = Entry {
            found: 1_764_728_045_000,
            fs: -5,
            ino: 42,
            tag: vec![0, 1, 2],
            damaged: vec![0, 9, 9],
            status: "corrupt".into(),
            path: PathBuf::from(std::ffi::OsString::from_vec(b"/t/a\n\tb\xff".to_vec())),
        };
        let dir = tempfile::tempdir().unwrap();
        let j = dir.path().join("state.db.damage");
        append(&j, std::slice::from_ref(&e)).unwrap();
        append(&j, std::slice::from_ref(&e)).unwrap();
        // A crash mid-append.
        let mut f = OpenOptions::new().append(true).open(&j).unwrap();
        f.write_all(b"1764728045000\t-5\t4").unwrap();
        assert_eq!(read(&j).unwrap(), vec![e.clone(), e.clone()]);
        rewrite(&j, std::slice::from_ref(&e)).unwrap();
        assert_eq!(read(&j).unwrap(), vec![e]);
        assert!(read(&dir.path().join("none")).unwrap().is_empty());
    }

    #[test]
    fn an_end_line_ends_only_earlier_damage_of_its_file_and_tag() {
        let found = |ino: i64, tag: u8, at: i64| Entry {
            found: at,
            fs: 1,
            ino,
            tag: vec![0, tag],
            damaged: vec![0, 9],
            status: "corrupt".into(),
            path: PathBuf::from(format!("/t/{ino}")),
        };
        let end = |ino: i64, tag: u8, at: i64| {
            Entry::ended(at, 1, ino, vec![0, tag], PathBuf::from(format!("/t/{ino}")))
        };
        let journal = vec![
            found(1, 1, 10),
            found(1, 1, 11), // found again: one entry, as first found
            found(2, 1, 12),
            found(3, 1, 13),
            end(1, 1, 20),   // repaired in place
            end(3, 2, 21),   // another tag of inode 3: not its damage
            found(1, 1, 30), // damaged again after the repair
        ];
        assert_eq!(
            outstanding(journal),
            vec![found(2, 1, 12), found(3, 1, 13), found(1, 1, 30)]
        );
    }
}
