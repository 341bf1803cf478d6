//! The schema of the state database, and how a database of an older one is brought up to it.

use std::collections::HashMap;

use rusqlite::{Connection, params};

use super::entries::{Entry, Proof, decode, find, split};
use super::pages;

/// The schema, its tables in the schema `prefix` names (`""`, or `"state."` where the
/// database is attached); `user_version` says which one a database has.
pub(crate) fn schema(prefix: &str) -> String {
    tables(prefix) + &INDEXES.replace("{s}", prefix)
}

/// The tables alone: indexes on columns a migration adds come after it.
pub(super) fn tables(prefix: &str) -> String {
    SCHEMA.replace("{s}", prefix)
}

pub(super) const SCHEMA: &str = "
-- Each directory's files, in pages of at most 1,024: their entries packed, sorted by name
-- (src/state/entries.rs, src/state/pages.rs). A file is known by its directory and name; its
-- entry keeps its file system, inode and digest, so that a file moved is recognised where it
-- went.
CREATE TABLE IF NOT EXISTS {s}dirs (
    path BLOB NOT NULL,         -- the directory, absolute
    first BLOB NOT NULL,        -- the page's key: it holds the names from it to the next key
    entries BLOB NOT NULL,
    PRIMARY KEY (path, first)
);
-- A run that proved every file of a page good, unchanged: all a check of a tree that is
-- well writes (a page's entries are rewritten only when one of them changes). An entry last
-- judged no later than `at` was proven good by that run, at that time. An archive of the
-- whole page says so here too, rather than in each entry: each entry's `archived_in` is then
-- this row's, and its `archived` this row's where that is set.
CREATE TABLE IF NOT EXISTS {s}proven (
    path BLOB NOT NULL,         -- the directory
    first BLOB NOT NULL,        -- the page
    run INTEGER,
    at INTEGER NOT NULL,
    print BLOB,                 -- what its entries are (see src/state/dirs.rs, `Print`)
    archived_in INTEGER,        -- the run whose archive last copied every entry
    archived INTEGER,           -- when the archive they were in before became durable
    PRIMARY KEY (path, first)
) WITHOUT ROWID;
-- Damage found and not yet dealt with (repaired, accepted, edited): few rows, read whole
-- by every run; the journal beside the database mirrors it line for line.
CREATE TABLE IF NOT EXISTS {s}damage (
    fs INTEGER NOT NULL,
    ino INTEGER NOT NULL,
    digest BLOB NOT NULL,       -- the tag it was found under (algorithm byte, then digest)
    path BLOB NOT NULL,         -- where it was found
    damaged_digest BLOB,        -- the digest of the damaged bytes
    -- Times are Unix milliseconds: datetime(found / 1000, 'unixepoch') in sqlite3.
    found INTEGER NOT NULL,
    status TEXT,                -- corrupt, mismatch
    PRIMARY KEY (fs, ino, digest)
) WITHOUT ROWID;
-- Files a scrub found gone from their tree, kept 30 days whatever becomes of the inode
-- (`repair --missing` brings them back).
CREATE TABLE IF NOT EXISTS {s}gone (
    path BLOB PRIMARY KEY,
    fs INTEGER NOT NULL,
    ino INTEGER NOT NULL,
    digest BLOB NOT NULL,
    size INTEGER NOT NULL,
    verified INTEGER,           -- when it was last proven good
    damaged INTEGER,            -- when damage was found in it, if it was
    at INTEGER NOT NULL,        -- when it was found gone
    owner BLOB                  -- its owner, group and mode (src/engine/outcome.rs, Owner)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS {s}runs (
    id INTEGER PRIMARY KEY,
    verb TEXT NOT NULL,
    roots BLOB NOT NULL,
    started INTEGER NOT NULL,
    ended INTEGER,
    files INTEGER,
    bytes INTEGER,              -- bytes of data read
    seconds REAL,
    exit_code INTEGER,
    copied INTEGER              -- when the copies it made (an archive) became durable
);
CREATE TABLE IF NOT EXISTS {s}cycles (
    root BLOB PRIMARY KEY,      -- a scrubbed root, absolute
    started INTEGER NOT NULL    -- when its current cycle began
);
-- What the owner was last told of a set of trees (notifications): so that a reminder says
-- what is new, and an all-clear follows an alarm once. Added to schema 3 as it stands (a
-- table of its own, created on open): no migration.
CREATE TABLE IF NOT EXISTS {s}told (
    roots BLOB PRIMARY KEY,     -- the trees, as runs.roots
    at INTEGER NOT NULL,        -- when
    alarm INTEGER NOT NULL,     -- 1 an alarm or reminder, 0 an all-clear
    items TEXT NOT NULL         -- what it told, one key a line
);
-- Writes `intact watch` saw, until it tagged what they wrote: a later check calls data
-- changed under the old mtime an edit where the write came after the tag. Few rows (the
-- files written and not yet tagged); a table of its own, created on open: no migration.
CREATE TABLE IF NOT EXISTS {s}written (
    fs INTEGER NOT NULL,
    ino INTEGER NOT NULL,
    at INTEGER NOT NULL,        -- the latest write seen
    PRIMARY KEY (fs, ino)
) WITHOUT ROWID;
-- Each tree a run was given, as the database first met it: the file system and the inode of
-- the folder its path led to (src/state/roots.rs). A table of its own, created on open: no
-- migration.
CREATE TABLE IF NOT EXISTS {s}roots (
    path BLOB PRIMARY KEY,
    fs INTEGER NOT NULL,
    ino INTEGER NOT NULL,
    at INTEGER NOT NULL         -- when it was recorded (first met, or accepted)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS {s}lost (
    at INTEGER NOT NULL,        -- when an earlier database was found damaged and replaced
    aside BLOB,                 -- where it was moved
    why TEXT
);
";
pub(super) const INDEXES: &str = "
CREATE INDEX IF NOT EXISTS {s}gone_at ON gone (at);
";
pub(super) const VERSION: i64 = 6;

/// Brings a database of an older schema to this one. Schema 1 (before the columns existed)
/// recorded an archived copy only at the end of its run; schema 2 kept no digest of damaged
/// bytes and forgot files gone at once; schema 3 kept a row a file (`files`), which schema 4
/// packs by directory, with damage and files gone in tables of their own; schema 5 cuts each
/// directory's value into pages (a folder of a million files was one value of 130 MB);
/// schema 6 keeps each file's owner, group and mode (in its entry, which schema 5's entries
/// read as not knowing, and in `gone`).
pub(super) fn migrate(conn: &Connection) -> rusqlite::Result<()> {
    let has = |table: &str, column: &str| -> rusqlite::Result<bool> {
        conn.query_row(
            "SELECT count(*) FROM pragma_table_info(?1) WHERE name = ?2",
            [table, column],
            |r| r.get::<_, i64>(0).map(|n| n > 0),
        )
    };
    if has("dirs", "entries")? && !has("dirs", "first")? {
        paginate(conn)?;
    }
    if !has("gone", "owner")? {
        conn.execute_batch("ALTER TABLE gone ADD COLUMN owner BLOB")?;
    }
    if !has("files", "path")? {
        return Ok(());
    }
    for (table, column, kind) in [
        ("files", "archived_in", "INTEGER"),
        ("runs", "copied", "INTEGER"),
        ("files", "damaged_digest", "BLOB"),
        ("files", "gone", "INTEGER"),
    ] {
        if !has(table, column)? {
            conn.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column} {kind}"))?;
        }
    }
    convert(conn)
}

/// Cuts schema 4's one value a directory into pages: each directory's entries, with what its
/// row in `proven` said applied to them (the next run that proves a page good marks it so
/// again), written as pages.
fn paginate(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch("ALTER TABLE dirs RENAME TO dirs4; ALTER TABLE proven RENAME TO proven4;")?;
    conn.execute_batch(&tables(""))?;
    {
        let mut stmt = conn.prepare(
            "SELECT d.path, d.entries, p.run, p.at, p.archived_in, p.archived FROM dirs4 d \
             LEFT JOIN proven4 p ON p.path = d.path",
        )?;
        let mut rows = stmt.query([])?;
        while let Some(r) = rows.next()? {
            let dir: Vec<u8> = r.get(0)?;
            let mut entries = decode(&r.get::<_, Vec<u8>>(1)?).unwrap_or_default();
            if let Some(proof) = Proof::read(r, 2)? {
                proof.apply(&mut entries);
            }
            pages::store_all(conn, "", &dir, &entries)?;
        }
    }
    conn.execute_batch("DROP TABLE dirs4; DROP TABLE proven4;")
}

/// Brings schema 3's `files` into directories' values, damage and files gone, and drops it.
/// In bounded memory: the directories gathered are merged into what is stored every so many
/// files (rows come by path, and a directory's files are not all together in that order).
fn convert(conn: &Connection) -> rusqlite::Result<()> {
    const HELD: usize = 20_000;
    let mut stmt = conn.prepare(
        "SELECT fs, ino, digest, path, size, verified, checked, status, damaged, protected, \
         archived, archived_in, seen, damaged_digest, gone FROM files ORDER BY path",
    )?;
    let mut rows = stmt.query([])?;
    let mut held: HashMap<Vec<u8>, Vec<Entry>> = HashMap::new();
    let mut count = 0;
    let merge = |held: &mut HashMap<Vec<u8>, Vec<Entry>>| -> rusqlite::Result<()> {
        for (dir, new) in held.drain() {
            let mut entries = pages::load_all(conn, "", &dir)?;
            for e in new {
                match find(&entries, &e.name) {
                    // Two rows under one name (a damaged file replaced): the later seen.
                    Ok(at)
                        if entries[at].seen.max(entries[at].checked) >= e.seen.max(e.checked) => {}
                    Ok(at) => entries[at] = e,
                    Err(at) => entries.insert(at, e),
                }
            }
            pages::store_all(conn, "", &dir, &entries)?;
        }
        Ok(())
    };
    while let Some(r) = rows.next()? {
        let (fs, ino, key, path): (i64, i64, Vec<u8>, Vec<u8>) =
            (r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?);
        let (damaged, gone): (Option<i64>, Option<i64>) = (r.get(8)?, r.get(14)?);
        if let Some(found) = damaged {
            conn.execute(
                "INSERT OR IGNORE INTO damage (fs, ino, digest, path, damaged_digest, found, \
                 status) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![
                    fs,
                    ino,
                    key,
                    path,
                    r.get::<_, Option<Vec<u8>>>(13)?,
                    found,
                    r.get::<_, Option<String>>(7)?
                ],
            )?;
        }
        if let Some(at) = gone {
            conn.execute(
                "INSERT INTO gone (path, fs, ino, digest, size, verified, damaged, at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) ON CONFLICT DO UPDATE SET fs = ?2, \
                 ino = ?3, digest = ?4, size = ?5, verified = ?6, damaged = ?7, at = ?8 \
                 WHERE at < ?8",
                params![
                    path,
                    fs,
                    ino,
                    key,
                    r.get::<_, i64>(4)?,
                    r.get::<_, Option<i64>>(5)?,
                    damaged,
                    at
                ],
            )?;
            continue;
        }
        let (dir, name) = split(&path);
        held.entry(dir.to_vec()).or_default().push(Entry {
            name: name.to_vec(),
            fs,
            ino,
            key,
            size: r.get(4)?,
            verified: r.get(5)?,
            checked: r.get(6)?,
            status: r.get::<_, Option<String>>(7)?.unwrap_or_default(),
            protected: r.get(9)?,
            archived: r.get(10)?,
            archived_in: r.get(11)?,
            seen: r.get(12)?,
            was: Vec::new(),
            owner: None,
        });
        count += 1;
        if count % HELD == 0 {
            merge(&mut held)?;
        }
    }
    drop(rows);
    drop(stmt);
    merge(&mut held)?;
    conn.execute_batch("DROP TABLE files")
}
