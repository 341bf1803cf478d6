//! What the state database knows of the files a walk meets, looked up as it meets them: the
//! walk goes depth first and a directory's names come in order, so each page of a
//! directory's entries is read once, when the walk reaches its names, and held until it has
//! passed them (the join a scrub's plan needs, in the memory of a page for each directory on
//! the walk's path, whatever the size of a folder). A directory's files and subdirectories
//! come in one sorted order (`a`, `b/x`, `c`): the walk comes back to a directory after each
//! subdirectory, so its page is held while the walk is beneath it (left at the first
//! subdirectory, its files met after one were taken for files gone, and forgotten). Entries
//! the walk did not meet where they say are handed back: files gone, moved, excluded or
//! replaced, for the plan to tell which.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use rusqlite::{Connection, OpenFlags, params};

use super::entries::{Entry, find, join, split};
use super::pages::{self, page_of};
use super::paths::within;

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

/// A directory on the walk's path: its pages' keys, the page read (its place among them),
/// its entries and which of them the walk met, and which pages were handed back.
struct Held {
    dir: Vec<u8>,
    keys: Vec<Vec<u8>>,
    page: Option<usize>,
    entries: Vec<Entry>,
    met: Vec<bool>,
    /// Pages whose unmet entries were handed back (all of them where the directory was
    /// entered before and left: roots that overlap).
    left: Vec<bool>,
    /// The pages before this one are behind the walk.
    passed: usize,
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
    /// The files found gone (few): their path and content.
    gone: HashMap<Vec<u8>, Vec<u8>>,
    /// Files found gone that the walk met again where they were, with their content (a
    /// `repair --missing`, a restore by hand): gone no more.
    pub back: Vec<Vec<u8>>,
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
            gone: HashMap::new(),
            back: Vec::new(),
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
            let gone = conn
                .prepare("SELECT path, digest FROM gone")?
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<rusqlite::Result<_>>()?;
            lookup.gone = gone;
            Ok(conn)
        });
        match opened {
            Ok(conn) => lookup.conn = Some(conn),
            Err(e) => lookup.error = Some(e),
        }
        lookup
    }

    /// What the database knows of the file at `path` (absolute), met as `(fs, ino, key)`
    /// (`key` empty: untagged). Entries of pages the walk has passed that it did not meet go
    /// to `unmet`, with their path and damage.
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
        self.turn_to(name, unmet);
        if self.gone.get(path).is_some_and(|k| k.as_slice() == key) {
            self.back.push(path.to_vec());
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
        let keys = match &self.conn {
            Some(conn) => pages::keys(conn, "", dir).unwrap_or_else(|e| {
                self.error.get_or_insert(e);
                Vec::new()
            }),
            None => Vec::new(),
        };
        self.held.push(Held {
            dir: dir.to_vec(),
            left: vec![again; keys.len()],
            keys,
            page: None,
            entries: Vec::new(),
            met: Vec::new(),
            passed: 0,
        });
    }

    /// Reads the page of the directory held that holds `name`, handing back the pages the
    /// walk has passed.
    fn turn_to(&mut self, name: &[u8], unmet: &mut impl FnMut(Vec<u8>, Entry, Option<Found>)) {
        let h = self.held.last().expect("the directory entered");
        if h.keys.is_empty() {
            return;
        }
        let want = page_of(&h.keys, name);
        if h.page == Some(want) {
            return;
        }
        self.pass(want, unmet);
        self.read(want);
    }

    /// Hands back the pages of the directory held before `page` not yet handed back.
    fn pass(&mut self, page: usize, unmet: &mut impl FnMut(Vec<u8>, Entry, Option<Found>)) {
        let h = self.held.last_mut().expect("the directory entered");
        if h.page.is_some_and(|p| p < page) {
            self.hand_back(unmet);
        }
        let h = self.held.last_mut().expect("the directory entered");
        let (from, to) = (h.passed, page.min(h.keys.len()));
        h.passed = h.passed.max(to);
        for p in from..to {
            if !self.held.last().expect("held").left[p] {
                self.read(p);
                self.hand_back(unmet);
            }
        }
    }

    /// Reads page `p` of the directory held.
    fn read(&mut self, p: usize) {
        let h = self.held.last_mut().expect("the directory entered");
        let entries = match &self.conn {
            Some(conn) => match pages::load(conn, "", &h.dir, &h.keys[p]) {
                Ok(entries) => entries,
                Err(e) => {
                    self.error.get_or_insert(e);
                    self.conn = None;
                    Vec::new()
                }
            },
            None => Vec::new(),
        };
        h.met = vec![false; entries.len()];
        h.entries = entries;
        h.page = Some(p);
    }

    /// Hands the entries of the page held of the directory held that the walk did not meet
    /// to `unmet`, once.
    fn hand_back(&mut self, unmet: &mut impl FnMut(Vec<u8>, Entry, Option<Found>)) {
        let h = self.held.last_mut().expect("the directory entered");
        let Some(p) = h.page else { return };
        if std::mem::replace(&mut h.left[p], true) {
            return;
        }
        let entries = std::mem::take(&mut h.entries);
        let met = std::mem::take(&mut h.met);
        h.page = None;
        let dir = h.dir.clone();
        for (e, met) in entries.into_iter().zip(met) {
            if !met {
                let damaged = self.damage.get(&(e.fs, e.ino, e.key.clone())).cloned();
                unmet(join(&dir, &e.name), e, damaged);
            }
        }
    }

    /// Hands back what the walk did not meet of a directory left for good: the page held and
    /// every page not handed back yet.
    fn leave(&mut self, h: Held, unmet: &mut impl FnMut(Vec<u8>, Entry, Option<Found>)) {
        let pages = h.keys.len();
        self.held.push(h);
        self.hand_back(unmet);
        self.pass(pages, unmet);
        self.held.pop();
    }

    /// After the walk: the entries it did not meet, in the directories it was in last and in
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
            .prepare("SELECT DISTINCT path FROM dirs WHERE (path >= ?1 AND path < ?2) OR path = ?3")
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
    use crate::state::pages::{MAX, store};

    fn entry(name: &str, ino: i64) -> Entry {
        Entry {
            name: name.into(),
            fs: 1,
            ino,
            key: vec![0; 33],
            ..Entry::default()
        }
    }

    /// A directory's files before and after a subdirectory (`a`, `b/x`, `c`) are all met:
    /// the directory is held while the walk is beneath it. Left at `b`, `c` and then `a` were
    /// handed back as unmet, and a scrub forgot their history.
    #[test]
    fn files_beside_a_subdirectory_are_met_wherever_the_walk_comes_back() {
        let tmp = tempfile::tempdir().unwrap();
        let db = tmp.path().join("state.db");
        let conn = Connection::open(&db).unwrap();
        conn.execute_batch(&crate::state::schema("")).unwrap();
        let t = [entry("a", 1), entry("c", 3), entry("d", 4)];
        store(&conn, "", b"/t", b"a", &t).unwrap();
        store(&conn, "", b"/t/b", b"x", &[entry("x", 2)]).unwrap();
        store(&conn, "", b"/t/b/y", b"z", &[entry("z", 5)]).unwrap();
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

    /// A folder of many pages is read a page at a time as the walk's names go by: the files
    /// met are known, the pages passed and the pages after the last name met are handed
    /// back whole, each entry once.
    #[test]
    fn a_large_folder_is_looked_up_a_page_at_a_time() {
        let tmp = tempfile::tempdir().unwrap();
        let db = tmp.path().join("state.db");
        let conn = Connection::open(&db).unwrap();
        conn.execute_batch(&crate::state::schema("")).unwrap();
        let n = 3 * MAX;
        let all: Vec<Entry> = (0..n)
            .map(|i| entry(&format!("f{i:05}"), i as i64))
            .collect();
        store(&conn, "", b"/big", b"f00000", &all).unwrap();
        assert!(pages::keys(&conn, "", b"/big").unwrap().len() > 4);
        drop(conn);
        let mut lookup = Lookup::open(Some(&db));
        let mut unmet = Vec::new();
        let mut said = |path: Vec<u8>, _: Entry, _: Option<Found>| unmet.push(path);
        let key = [0u8; 33];
        // Every third file, up to two thirds of the way.
        let met: Vec<usize> = (0..2 * n / 3).step_by(3).collect();
        for &i in &met {
            let path = format!("/big/f{i:05}");
            let known = lookup.file(path.as_bytes(), (1, i as i64, &key), &mut said);
            assert!(known.entry.is_some(), "{path}");
            assert!(lookup.held[0].entries.len() <= MAX);
        }
        lookup.finish(&[crate::state::under(Path::new("/big"))], &mut said);
        assert_eq!(unmet.len(), n - met.len());
        let unique: HashSet<&Vec<u8>> = unmet.iter().collect();
        assert_eq!(unique.len(), unmet.len(), "an entry handed back twice");
    }
}
