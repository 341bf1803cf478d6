//! What the state database knows of the files a walk meets, looked up as it meets them: the
//! walk goes a directory at a time, so each directory's entries are read once, when the walk
//! enters it, and held until it leaves (the join a scrub's plan needs, in the memory of one
//! directory). Entries the walk did not meet where they say are handed back: files gone,
//! moved, excluded or replaced, for the plan to tell which.

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

/// The lookup of a walk's files in the state database, through a read-only connection of
/// its own.
pub struct Lookup {
    conn: Option<Connection>,
    damage: HashMap<FileKey, Found>,
    /// Damage by inode alone: a file whose tag was stripped is still damaged.
    by_inode: HashMap<(i64, i64), Found>,
    /// The directory held, its entries, and which of them the walk met.
    dir: Vec<u8>,
    entries: Vec<Entry>,
    met: Vec<bool>,
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
            dir: Vec::new(),
            entries: Vec::new(),
            met: Vec::new(),
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
        if dir != self.dir.as_slice() {
            self.leave(unmet);
            self.enter(dir);
        }
        // (Most trees have no damage: no key is copied to look for it.)
        let damaged = match key.is_empty() {
            _ if self.damage.is_empty() && self.by_inode.is_empty() => None,
            true => self.by_inode.get(&(fs, ino)).cloned(),
            false => self.damage.get(&(fs, ino, key.to_vec())).cloned(),
        };
        let entry = match find(&self.entries, name) {
            Ok(at) => {
                let e = &self.entries[at];
                let same = (e.fs, e.ino, e.key.as_slice()) == (fs, ino, key);
                self.met[at] |= same;
                same.then_some(e)
            }
            Err(_) => None,
        };
        Known { entry, damaged }
    }

    fn enter(&mut self, dir: &[u8]) {
        self.dir = dir.to_vec();
        self.visited.insert(self.dir.clone());
        self.entries = self.read(dir);
        self.met = vec![false; self.entries.len()];
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

    /// Hands the entries of the directory held that the walk did not meet to `unmet`.
    fn leave(&mut self, unmet: &mut impl FnMut(Vec<u8>, Entry, Option<Found>)) {
        let entries = std::mem::take(&mut self.entries);
        for (e, met) in entries.into_iter().zip(std::mem::take(&mut self.met)) {
            if !met {
                let damaged = self.damage.get(&(e.fs, e.ino, e.key.clone())).cloned();
                unmet(join(&self.dir, &e.name), e, damaged);
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
        self.leave(unmet);
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
            if self.visited.contains(&dir) {
                continue;
            }
            self.dir = dir.clone();
            self.entries = self.read(&dir);
            self.met = vec![false; self.entries.len()];
            self.leave(unmet);
        }
    }
}
