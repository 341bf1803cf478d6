//! What the state database knows of the files a walk meets, looked up as it meets them: the
//! walk goes depth first, so each directory's entries are read once, when the walk enters
//! it, and held until it has left it for good (the join a scrub's plan needs, in the memory
//! of the directories on the walk's path). A directory's files and subdirectories come in
//! one sorted order (`a`, `b/x`, `c`): the walk comes back to a directory after each
//! subdirectory, so it is held while the walk is beneath it, not left at the first
//! subdirectory (its files met after one were taken for files gone, and forgotten). Entries
//! the walk did not meet where they say are handed back: files gone, moved, excluded or
//! replaced, for the plan to tell which.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use rusqlite::{Connection, OpenFlags, params};

use super::dirs::load;
use super::entries::{Entry, find, join, split};

/// A file as damage knows it: file system, inode, the digest key of its tag.
type FileKey = (i64, i64, Vec<u8>);

/// Damage found in a file: when, and the verdict.
#[derive(Clone, Debug)]
pub struct Found {
    /// When (Unix milliseconds).
    pub at: i64,
    /// The verdict (corrupt, mismatch).
    pub status: Option<String>,
}

/// What the database knows of one file the walk met.
#[derive(Default)]
pub struct Known<'a> {
    /// Its entry: the file under the name, inode and tag the walk met.
    pub entry: Option<&'a Entry>,
    /// Damage found in it and not dealt with.
    pub damaged: Option<Found>,
}

/// A directory held: its entries, and which of them the walk met.
struct Held {
    dir: Vec<u8>,
    entries: Vec<Entry>,
    met: Vec<bool>,
    /// Entered before and left (roots that overlap): what it did not meet then was said.
    again: bool,
}

/// Whether `dir` is `above` or beneath it.
fn within(dir: &[u8], above: &[u8]) -> bool {
    dir.strip_prefix(above)
        .is_some_and(|rest| rest.is_empty() || rest[0] == b'/' || above.ends_with(b"/"))
}

/// The lookup of a walk's files in the state database, through a read-only connection of
/// its own.
pub struct Lookup {
    conn: Option<Connection>,
    damage: HashMap<FileKey, Found>,
    /// Damage by inode alone: a file whose tag was stripped is still damaged.
    by_inode: HashMap<(i64, i64), Found>,
    /// The directories held: the one the walk is in and those above it on its path.
    held: Vec<Held>,
    visited: HashSet<Vec<u8>>,
    /// Why the database could not be read, if it could not (then nothing is known).
    pub error: Option<rusqlite::Error>,
}

impl Lookup {
    /// A lookup in the database at `db` (none: nothing is known).
    pub fn open(db: Option<&Path>) -> Lookup {
        let mut lookup = Lookup {
            conn: None,
            damage: HashMap::new(),
            by_inode: HashMap::new(),
            held: Vec::new(),
            visited: HashSet::new(),
            error: None,
        };
        let Some(db) = db.filter(|db| db.exists()) else {
            return lookup;
        };
        let opened = super::sqlite::open(db, OpenFlags::SQLITE_OPEN_READ_ONLY).and_then(|conn| {
            conn.execute_batch("PRAGMA cache_size = -512")?;
            let mut stmt = conn.prepare("SELECT fs, ino, digest, found, status FROM damage")?;
            let mut rows = stmt.query([])?;
            while let Some(r) = rows.next()? {
                let (fs, ino) = (r.get(0)?, r.get(1)?);
                let found = Found {
                    at: r.get(3)?,
                    status: r.get(4)?,
                };
                lookup.by_inode.insert((fs, ino), found.clone());
                lookup.damage.insert((fs, ino, r.get(2)?), found);
            }
            drop(rows);
            drop(stmt);
            Ok(conn)
        });
        match opened {
            Ok(conn) => lookup.conn = Some(conn),
            Err(e) => lookup.error = Some(e),
        }
        lookup
    }

    /// What the database knows of the file at `path` (absolute), met as `(fs, ino, key)`
    /// (`key` empty: untagged). Entries of a directory the walk has left that it did not
    /// meet go to `unmet`, with their path and damage.
    pub fn file(
        &mut self,
        path: &[u8],
        (fs, ino, key): (i64, i64, &[u8]),
        unmet: &mut impl FnMut(Vec<u8>, Entry, Option<Found>),
    ) -> Known<'_> {
        let (dir, name) = split(path);
        if self.held.last().is_none_or(|h| h.dir != dir) {
            while let Some(h) = self.held.pop_if(|h| !within(dir, &h.dir)) {
                self.leave(h, unmet);
            }
            if self.held.last().is_none_or(|h| h.dir != dir) {
                self.enter(dir);
            }
        }
        // (Most trees have no damage: no key is copied to look for it.)
        let damaged = match key.is_empty() {
            _ if self.damage.is_empty() && self.by_inode.is_empty() => None,
            true => self.by_inode.get(&(fs, ino)).cloned(),
            false => self.damage.get(&(fs, ino, key.to_vec())).cloned(),
        };
        let h = self.held.last_mut().expect("the directory entered");
        let entry = match find(&h.entries, name) {
            Ok(at) => {
                let e = &h.entries[at];
                let same = (e.fs, e.ino, e.key.as_slice()) == (fs, ino, key);
                h.met[at] |= same;
                same.then_some(e)
            }
            Err(_) => None,
        };
        Known { entry, damaged }
    }

    fn enter(&mut self, dir: &[u8]) {
        let again = !self.visited.insert(dir.to_vec());
        let entries = self.read(dir);
        self.held.push(Held {
            dir: dir.to_vec(),
            met: vec![false; entries.len()],
            entries,
            again,
        });
    }

    fn read(&mut self, dir: &[u8]) -> Vec<Entry> {
        let Some(conn) = &self.conn else {
            return Vec::new();
        };
        match load(conn, "", dir) {
            Ok(entries) => entries,
            Err(e) => {
                self.error.get_or_insert(e);
                self.conn = None;
                Vec::new()
            }
        }
    }

    /// Hands the entries of a directory left for good that the walk did not meet to `unmet`.
    fn leave(&self, h: Held, unmet: &mut impl FnMut(Vec<u8>, Entry, Option<Found>)) {
        if h.again {
            return;
        }
        for (e, met) in h.entries.into_iter().zip(h.met) {
            if !met {
                let damaged = self.damage.get(&(e.fs, e.ino, e.key.clone())).cloned();
                unmet(join(&h.dir, &e.name), e, damaged);
            }
        }
    }

    /// After the walk: the entries it did not meet, in the directory it was in last and in
    /// the directories under `ranges` (the roots' ranges of paths) it never entered
    /// (deleted, excluded, unreadable, on a disk not mounted).
    pub fn finish(
        &mut self,
        ranges: &[(Vec<u8>, Vec<u8>, Vec<u8>)],
        unmet: &mut impl FnMut(Vec<u8>, Entry, Option<Found>),
    ) {
        while let Some(h) = self.held.pop() {
            self.leave(h, unmet);
        }
        let Some(conn) = &self.conn else { return };
        let mut dirs: Vec<Vec<u8>> = Vec::new();
        let listed = conn
            .prepare("SELECT path FROM dirs WHERE (path >= ?1 AND path < ?2) OR path = ?3")
            .and_then(|mut stmt| {
                for (low, high, exact) in ranges {
                    let rows = stmt.query_map(params![low, high, exact], |r| r.get(0))?;
                    for dir in rows {
                        dirs.push(dir?);
                    }
                }
                Ok(())
            });
        if let Err(e) = listed {
            self.error.get_or_insert(e);
            return;
        }
        for dir in dirs {
            if !self.visited.contains(&dir) {
                self.enter(&dir);
                let h = self.held.pop().expect("the directory entered");
                self.leave(h, unmet);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::dirs::store;

    /// A directory's files before and after a subdirectory (`a`, `b/x`, `c`) are all met:
    /// the directory is held while the walk is beneath it. Left at `b`, `c` and then `a` were
    /// handed back as unmet, and a scrub forgot their history.
    #[test]
    fn files_beside_a_subdirectory_are_met_wherever_the_walk_comes_back() {
        let tmp = tempfile::tempdir().unwrap();
        let db = tmp.path().join("state.db");
        let conn = Connection::open(&db).unwrap();
        conn.execute_batch(&crate::state::schema("")).unwrap();
        let entry = |name: &str, ino| Entry {
            name: name.into(),
            fs: 1,
            ino,
            key: vec![0; 33],
            ..Entry::default()
        };
        store(
            &conn,
            "",
            b"/t",
            &[entry("a", 1), entry("c", 3), entry("d", 4)],
        )
        .unwrap();
        store(&conn, "", b"/t/b", &[entry("x", 2)]).unwrap();
        store(&conn, "", b"/t/b/y", &[entry("z", 5)]).unwrap();
        drop(conn);
        let mut lookup = Lookup::open(Some(&db));
        let mut unmet = Vec::new();
        let mut said = |path: Vec<u8>, _: Entry, _: Option<Found>| unmet.push(path);
        let key = [0u8; 33];
        for (path, ino) in [("/t/a", 1), ("/t/b/x", 2), ("/t/b/y/z", 5), ("/t/c", 3)] {
            let known = lookup.file(path.as_bytes(), (1, ino, &key), &mut said);
            assert!(known.entry.is_some(), "{path} not known");
        }
        lookup.finish(&[crate::state::under(Path::new("/t"))], &mut said);
        assert_eq!(unmet, vec![b"/t/d".to_vec()]);
    }

    #[test]
    fn a_directory_is_within_itself_and_its_ancestors_only() {
        assert!(within(b"/t", b"/t"));
        assert!(within(b"/t/b", b"/t"));
        assert!(within(b"/t/b/c", b"/t"));
        assert!(within(b"/t", b"/"));
        assert!(!within(b"/tb", b"/t"));
        assert!(!within(b"/t", b"/t/b"));
        assert!(!within(b"/u", b"/t"));
    }
}
