//! What the database knows under some trees laid out as rows, one a file (schema 3's shape),
//! for the queries that read many files at once and have no plan (`repair --missing`, a
//! repair straight to the known damage, the summary of a check): its pages, its files gone,
//! and damage whose file has no entry.

use std::collections::{HashMap, HashSet};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use rusqlite::{Connection, params};

use super::entries::{Proof, decode, join, split};
use super::pages::PROOF;
use super::paths::{absolute, under};

/// A file as damage knows it: file system, inode, the digest key of its tag.
type FileKey = (i64, i64, Vec<u8>);

/// The roots of which none is under another (a file under two roots is one file).
fn outermost(roots: &[PathBuf]) -> Vec<PathBuf> {
    let all: Vec<PathBuf> = roots.iter().map(|r| absolute(r)).collect();
    let mut kept: Vec<PathBuf> = Vec::new();
    for (i, r) in all.iter().enumerate() {
        let inside = all
            .iter()
            .enumerate()
            .any(|(j, o)| (r != o && r.starts_with(o)) || (r == o && j < i));
        if !inside {
            kept.push(r.clone());
        }
    }
    kept
}

/// The columns of a file's row in [`lay_out`]'s table (schema 3's `files`).
const COLUMNS: &str = "fs INTEGER, ino INTEGER, digest BLOB, path BLOB, size INTEGER, \
    verified INTEGER, checked INTEGER, status TEXT, damaged INTEGER, protected INTEGER, \
    archived INTEGER, archived_in INTEGER, seen INTEGER, damaged_digest BLOB, gone INTEGER, \
    dup INTEGER, was BLOB, owner BLOB";

/// One row of a laid-out table, as an entry, a file gone or damage without an entry fills it.
struct Laid {
    key: FileKey,
    path: Vec<u8>,
    size: i64,
    verified: Option<i64>,
    checked: Option<i64>,
    status: Option<String>,
    damaged: Option<i64>,
    protected: Option<i64>,
    archived: Option<i64>,
    archived_in: Option<i64>,
    seen: Option<i64>,
    damaged_digest: Option<Vec<u8>>,
    gone: Option<i64>,
    was: Option<Vec<u8>>,
    owner: Option<Vec<u8>>,
}

impl Laid {
    fn new(key: FileKey, path: Vec<u8>) -> Self {
        Laid {
            key,
            path,
            size: 0,
            verified: None,
            checked: None,
            status: None,
            damaged: None,
            protected: None,
            archived: None,
            archived_in: None,
            seen: None,
            damaged_digest: None,
            gone: None,
            was: None,
            owner: None,
        }
    }

    fn insert(self, stmt: &mut rusqlite::Statement<'_>) -> rusqlite::Result<()> {
        stmt.execute(params![
            self.key.0,
            self.key.1,
            self.key.2,
            self.path,
            self.size,
            self.verified,
            self.checked,
            self.status,
            self.damaged,
            self.protected,
            self.archived,
            self.archived_in,
            self.seen,
            self.damaged_digest,
            self.gone,
            self.was,
            self.owner
        ])
        .map(drop)
    }
}

/// Lays out what the database (its tables in the schema `from` names) knows under `roots` as
/// rows of the table `name` in the schema `into` (made anew), one a file: entries, files
/// gone, and damage whose file has no entry (it was replaced or moved). Returns the number of
/// rows.
pub(crate) fn lay_out(
    conn: &Connection,
    from: &str,
    (into, name): (&str, &str),
    roots: &[PathBuf],
) -> rusqlite::Result<u64> {
    conn.execute_batch(&format!(
        "DROP TABLE IF EXISTS {into}.{name}; CREATE TABLE {into}.{name} ({COLUMNS});"
    ))?;
    type Damage = (Vec<u8>, Option<Vec<u8>>, i64, Option<String>);
    let mut damage: HashMap<FileKey, Damage> = HashMap::new();
    {
        let mut stmt = conn.prepare(&format!(
            "SELECT fs, ino, digest, path, damaged_digest, found, status FROM {from}damage"
        ))?;
        let mut rows = stmt.query([])?;
        while let Some(r) = rows.next()? {
            damage.insert(
                (r.get(0)?, r.get(1)?, r.get(2)?),
                (r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?),
            );
        }
    }
    let tx = conn.unchecked_transaction()?;
    let mut n = 0u64;
    {
        let mut insert = tx.prepare(&format!(
            "INSERT INTO {into}.{name} (fs, ino, digest, path, size, verified, checked, status, \
             damaged, protected, archived, archived_in, seen, damaged_digest, gone, was, owner) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)"
        ))?;
        let mut dirs = tx.prepare(&format!(
            "SELECT d.path, d.entries, {PROOF} FROM {from}dirs d \
             LEFT JOIN {from}proven p ON p.path = d.path AND p.first = d.first \
             WHERE (d.path >= ?1 AND d.path < ?2) OR d.path = ?3 OR d.path = ?4"
        ))?;
        let mut gone = tx.prepare(&format!(
            "SELECT path, fs, ino, digest, size, verified, damaged, at, owner FROM {from}gone \
             WHERE (path >= ?1 AND path < ?2) OR path = ?3"
        ))?;
        let mut used: HashSet<FileKey> = HashSet::new();
        let roots = outermost(roots);
        let ranges: Vec<_> = roots.iter().map(|r| under(r)).collect();
        let inside = |path: &[u8]| {
            ranges.iter().any(|(low, high, exact)| {
                path == exact.as_slice() || (path >= &low[..] && path < &high[..])
            })
        };
        for (low, high, exact) in &ranges {
            let parent = split(exact).0.to_vec();
            let mut rows = dirs.query(params![low, high, exact, parent])?;
            while let Some(r) = rows.next()? {
                let dir: Vec<u8> = r.get(0)?;
                let value: Vec<u8> = r.get(1)?;
                let mut entries = decode(&value).unwrap_or_default();
                if let Some(proof) = Proof::read(r, 2)? {
                    proof.apply(&mut entries);
                }
                for e in entries {
                    let path = join(&dir, &e.name);
                    let in_this = path == *exact || (path >= *low && path < *high);
                    if !in_this {
                        continue;
                    }
                    let key = (e.fs, e.ino, e.key);
                    let d = damage.get(&key);
                    if d.is_some() {
                        used.insert(key.clone());
                    }
                    let row = Laid {
                        size: e.size,
                        verified: e.verified,
                        checked: e.checked,
                        status: Some(e.status),
                        damaged: d.map(|d| d.2),
                        protected: e.protected,
                        archived: e.archived,
                        archived_in: e.archived_in,
                        seen: e.seen,
                        damaged_digest: d.and_then(|d| d.1.clone()),
                        was: (!e.was.is_empty()).then_some(e.was),
                        owner: e.owner.map(|o| o.to_bytes().to_vec()),
                        ..Laid::new(key, path)
                    };
                    row.insert(&mut insert)?;
                    n += 1;
                }
            }
            let mut rows = gone.query(params![low, high, exact])?;
            while let Some(r) = rows.next()? {
                let row = Laid {
                    size: r.get(4)?,
                    verified: r.get(5)?,
                    damaged: r.get(6)?,
                    gone: Some(r.get(7)?),
                    owner: r.get(8)?,
                    ..Laid::new((r.get(1)?, r.get(2)?, r.get(3)?), r.get(0)?)
                };
                row.insert(&mut insert)?;
                n += 1;
            }
        }
        for (key, (path, damaged_digest, found, status)) in &damage {
            if used.contains(key) || !inside(path) {
                continue;
            }
            let size = crate::fs::sys::lstat(std::ffi::OsStr::from_bytes(path).as_ref())
                .map_or(0, |m| m.len() as i64);
            let row = Laid {
                size,
                checked: Some(*found),
                status: status.clone(),
                damaged: Some(*found),
                damaged_digest: damaged_digest.clone(),
                ..Laid::new(key.clone(), path.clone())
            };
            row.insert(&mut insert)?;
            n += 1;
        }
    }
    tx.commit()?;
    conn.execute_batch(&format!(
        "CREATE INDEX {into}.{name}_key ON {name} (fs, ino, digest); \
         CREATE INDEX {into}.{name}_path ON {name} (path);"
    ))?;
    // Two entries of one file: a file moved and recorded under its new name, whose old
    // entry a scrub has not settled yet, or a second name of it (a hard link). The one seen
    // last stands for it; the other is marked `dup`. Most trees have none: counted first
    // (a walk of the index), the ranking only then.
    let dups: i64 = conn.query_row(
        &format!(
            "SELECT count(*) FROM (SELECT 1 FROM {into}.{name} WHERE gone IS NULL \
             GROUP BY fs, ino, digest HAVING count(*) > 1)"
        ),
        [],
        |r| r.get(0),
    )?;
    if dups > 0 {
        conn.execute_batch(&format!(
            "UPDATE {into}.{name} SET dup = 1 WHERE rowid IN (SELECT rowid FROM (SELECT \
             rowid, row_number() OVER (PARTITION BY fs, ino, digest ORDER BY \
             coalesce(seen, 0) DESC, coalesce(checked, 0) DESC, rowid DESC) AS n \
             FROM {into}.{name} WHERE gone IS NULL) WHERE n > 1)"
        ))?;
    }
    Ok(n)
}
