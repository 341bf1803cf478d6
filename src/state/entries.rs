//! A directory's files as the state database keeps them: one value per directory, its
//! entries packed and sorted by name. Recording a check then costs one value rewritten per
//! directory, not one row updated per file (schema 3: about 2 µs of the writer a file,
//! x1.3 a check that records nothing; see docs/speed.md).
//!
//! An entry is its name's length (u16) and name, then fixed fields, little-endian: file
//! system, inode, the digest key's length (u8) and key, size, then verified, checked,
//! protected, archived, archived_in and seen (i64 each, i64::MIN for none), and the last
//! verdict's length (u8) and name, and the key of the tag before the last re-tag (u8 length,
//! then the key; none mostly), then, where the top bit of the name's length is set (schema
//! 6: no name is 32 KiB long, so an entry of schema 5 reads as one whose owner is not
//! known), the file's owner, group and mode ([`Owner::to_bytes`]). Times are Unix
//! milliseconds.

use std::os::unix::ffi::OsStrExt;
use std::path::Path;

pub use crate::engine::Owner;

/// A field that holds nothing.
const NONE: i64 = i64::MIN;

/// What the database knows of one file of a directory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Entry {
    /// Its name in the directory.
    pub name: Vec<u8>,
    /// Its file system (statvfs `f_fsid`).
    pub fs: i64,
    /// Its inode.
    pub ino: i64,
    /// The digest of its tag, as [`super::digest_key`] makes it; empty if untagged.
    pub key: Vec<u8>,
    /// Its size.
    pub size: i64,
    /// The last time its data matched its tag.
    pub verified: Option<i64>,
    /// The time of the last verdict.
    pub checked: Option<i64>,
    /// When parity was written for it.
    pub protected: Option<i64>,
    /// When it was copied into an archive known durable...
    pub archived: Option<i64>,
    /// ... or the last run that archived it, once `runs.copied` says that archive is durable.
    pub archived_in: Option<i64>,
    /// The run that last saw it.
    pub seen: Option<i64>,
    /// The last verdict.
    pub status: String,
    /// The digest key of the tag it carried before it was last re-tagged, if it was (a file
    /// moved and edited: its old entry is not a file deleted).
    pub was: Vec<u8>,
    /// Its owner, group and mode when last looked at (not known to schema 5).
    pub owner: Option<Owner>,
}

/// The top bit of an entry's name length: its owner follows its other fields.
const OWNED: u16 = 1 << 15;

/// `path` as the database files it: its directory, and its name there.
pub fn split(path: &[u8]) -> (&[u8], &[u8]) {
    match path.iter().rposition(|&b| b == b'/') {
        Some(0) => (b"/", &path[1..]),
        Some(i) => (&path[..i], &path[i + 1..]),
        None => (b"", path),
    }
}

/// The path of `name` in the directory `dir`.
pub fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    let mut path = Vec::with_capacity(dir.len() + 1 + name.len());
    path.extend_from_slice(dir);
    if path.last() != Some(&b'/') {
        path.push(b'/');
    }
    path.extend_from_slice(name);
    path
}

/// `path`'s bytes.
pub fn bytes(path: &Path) -> &[u8] {
    path.as_os_str().as_bytes()
}

/// Packs `entries` (sorted by name) into a directory's value.
pub fn encode(entries: &[Entry]) -> Vec<u8> {
    let mut v = Vec::with_capacity(entries.len() * 128);
    for e in entries {
        let name = &e.name[..e.name.len().min(OWNED as usize - 1)];
        let flag = if e.owner.is_some() { OWNED } else { 0 };
        v.extend_from_slice(&(name.len() as u16 | flag).to_le_bytes());
        v.extend_from_slice(name);
        v.extend_from_slice(&e.fs.to_le_bytes());
        v.extend_from_slice(&e.ino.to_le_bytes());
        let key = &e.key[..e.key.len().min(u8::MAX as usize)];
        v.push(key.len() as u8);
        v.extend_from_slice(key);
        v.extend_from_slice(&e.size.to_le_bytes());
        for t in [
            e.verified,
            e.checked,
            e.protected,
            e.archived,
            e.archived_in,
            e.seen,
        ] {
            v.extend_from_slice(&t.unwrap_or(NONE).to_le_bytes());
        }
        let status = &e.status.as_bytes()[..e.status.len().min(u8::MAX as usize)];
        v.push(status.len() as u8);
        v.extend_from_slice(status);
        let was = &e.was[..e.was.len().min(u8::MAX as usize)];
        v.push(was.len() as u8);
        v.extend_from_slice(was);
        if let Some(owner) = e.owner {
            v.extend_from_slice(&owner.to_bytes());
        }
    }
    v
}

/// The entries a directory's value holds; `None` if it is not one [`encode`] made.
pub fn decode(mut v: &[u8]) -> Option<Vec<Entry>> {
    let mut entries = Vec::with_capacity(v.len() / 128);
    fn take<'a>(v: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        let (a, b) = v.split_at_checked(n)?;
        *v = b;
        Some(a)
    }
    fn int(v: &mut &[u8]) -> Option<i64> {
        Some(i64::from_le_bytes(take(v, 8)?.try_into().ok()?))
    }
    fn time(v: &mut &[u8]) -> Option<Option<i64>> {
        int(v).map(|t| (t != NONE).then_some(t))
    }
    while !v.is_empty() {
        let head = u16::from_le_bytes(take(&mut v, 2)?.try_into().ok()?);
        let name = take(&mut v, (head & !OWNED) as usize)?.to_vec();
        let (fs, ino) = (int(&mut v)?, int(&mut v)?);
        let len = take(&mut v, 1)?[0] as usize;
        let key = take(&mut v, len)?.to_vec();
        let size = int(&mut v)?;
        let (verified, checked, protected) = (time(&mut v)?, time(&mut v)?, time(&mut v)?);
        let (archived, archived_in, seen) = (time(&mut v)?, time(&mut v)?, time(&mut v)?);
        let len = take(&mut v, 1)?[0] as usize;
        let status = String::from_utf8(take(&mut v, len)?.to_vec()).ok()?;
        let len = take(&mut v, 1)?[0] as usize;
        let was = take(&mut v, len)?.to_vec();
        let owner = match head & OWNED {
            0 => None,
            _ => Some(Owner::from_bytes(take(&mut v, 12)?)?),
        };
        entries.push(Entry {
            name,
            fs,
            ino,
            key,
            size,
            verified,
            checked,
            protected,
            archived,
            archived_in,
            seen,
            status,
            was,
            owner,
        });
    }
    Some(entries)
}

/// A row of the table `proven`: a run (`run`, at `at`) proved every file of a directory
/// good, unchanged; if it also copied them all into its archive (`archive`: an archive run
/// records a directory so, rather than rewriting each entry), the archive each entry was
/// last copied into is that run's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Proof {
    /// The run.
    pub run: Option<i64>,
    /// When.
    pub at: i64,
    /// The archive all the entries were last copied into, if a run's mark says so.
    pub archive: Option<Copied>,
}

/// Every entry of a directory copied into the archive of run `run`; `kept`, if some, is when
/// the archive each had been in before became durable (as [`Entry::archived`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Copied {
    /// The run whose archive holds them.
    pub run: i64,
    /// When their archive before that one became durable, if it did.
    pub kept: Option<i64>,
}

impl Copied {
    /// The mark the columns `archived_in, archived` from `first` on hold, if they hold one.
    pub fn read(r: &rusqlite::Row, first: usize) -> rusqlite::Result<Option<Copied>> {
        Ok(match r.get::<_, Option<i64>>(first)? {
            Some(run) => Some(Copied {
                run,
                kept: r.get(first + 1)?,
            }),
            None => None,
        })
    }
}

impl Proof {
    /// The proof the columns `run, at, archived_in, archived` from `first` on say (`at` is
    /// null where the directory has no proof).
    pub fn read(r: &rusqlite::Row, first: usize) -> rusqlite::Result<Option<Proof>> {
        let Some(at) = r.get::<_, Option<i64>>(first + 1)? else {
            return Ok(None);
        };
        Ok(Some(Proof {
            run: r.get(first)?,
            at,
            archive: Copied::read(r, first + 2)?,
        }))
    }

    /// What the proof says of the directory's `entries`: those last judged no later were
    /// proven good then; all of them were copied into the archive it names.
    pub fn apply(&self, entries: &mut [Entry]) {
        for e in entries {
            if e.checked.is_none_or(|c| c <= self.at) {
                e.verified = Some(self.at);
                e.checked = Some(self.at);
                e.seen = self.run;
                e.status = "ok".into();
            }
            if let Some(copied) = self.archive {
                e.archived = copied.kept.or(e.archived);
                e.archived_in = Some(copied.run);
            }
        }
    }
}

/// Where `name` is among `entries` (sorted by name), or where it would go.
pub fn find(entries: &[Entry], name: &[u8]) -> Result<usize, usize> {
    entries.binary_search_by(|e| e.name.as_slice().cmp(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_come_back_as_they_were_packed() {
        let entries = vec![
            Entry {
                name: b"a \xff name".to_vec(),
                fs: -3,
                ino: 1 << 40,
                key: vec![0; 33],
                size: 4096,
                verified: Some(1_700_000_000_000),
                checked: Some(1_700_000_000_001),
                seen: Some(7),
                status: "ok".into(),
                owner: Some(Owner {
                    uid: 65534,
                    gid: 100,
                    mode: 0o4600,
                }),
                ..Entry::default()
            },
            // Packed as schema 5 packed every entry (no owner): read as such.
            Entry {
                name: b"b".to_vec(),
                archived_in: Some(9),
                protected: Some(0),
                was: vec![1; 33],
                status: "changed-while-read".into(),
                ..Entry::default()
            },
        ];
        let packed = encode(&entries);
        assert_eq!(decode(&packed), Some(entries));
        // Cut anywhere inside, it is not taken for entries.
        for cut in 1..packed.len() {
            if cut != packed.len() {
                assert!(
                    decode(&packed[..cut]).is_none_or(|e| e.len() == 1),
                    "cut at {cut}"
                );
            }
        }
    }

    #[test]
    fn paths_split_into_directory_and_name() {
        assert_eq!(split(b"/srv/a.jpg"), (&b"/srv"[..], &b"a.jpg"[..]));
        assert_eq!(split(b"/a"), (&b"/"[..], &b"a"[..]));
        assert_eq!(join(b"/", b"a"), b"/a");
        assert_eq!(join(b"/srv", b"a"), b"/srv/a");
    }
}
