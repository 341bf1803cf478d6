//! The schema of the state database, and how a database of an older one is brought up to it.

use rusqlite::Connection;

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
-- Each directory's files, one value a directory: their entries packed, sorted by name
-- (src/state/entries.rs). A file is known by its directory and name; its entry keeps its
-- file system, inode and digest, so that a file moved is recognised where it went.
CREATE TABLE IF NOT EXISTS {s}dirs (
    path BLOB PRIMARY KEY,      -- absolute
    entries BLOB NOT NULL
);
-- A run that proved every file of a directory good, unchanged: all a check of a tree that
-- is well writes (a directory's entries are rewritten only when one of them changes). An
-- entry last judged no later than `at` was proven good by that run, at that time. An
-- archive of the whole directory says so here too, rather than in each entry: each entry's
-- `archived_in` is then this row's, and its `archived` this row's where that is set.
CREATE TABLE IF NOT EXISTS {s}proven (
    path BLOB PRIMARY KEY,      -- the directory
    run INTEGER,
    at INTEGER NOT NULL,
    print BLOB,                 -- what its entries are (see src/state/dirs.rs, `Print`)
    archived_in INTEGER,        -- the run whose archive last copied every entry
    archived INTEGER            -- when the archive they were in before became durable
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
    at INTEGER NOT NULL         -- when it was found gone
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
CREATE TABLE IF NOT EXISTS {s}lost (
    at INTEGER NOT NULL,        -- when an earlier database was found damaged and replaced
    aside BLOB,                 -- where it was moved
    why TEXT
);
";
pub(super) const INDEXES: &str = "
CREATE INDEX IF NOT EXISTS {s}gone_at ON gone (at);
";
pub(super) const VERSION: i64 = 4;

/// Brings a database of an older schema to this one. Schema 1 (before the columns existed)
/// recorded an archived copy only at the end of its run; schema 2 kept no digest of damaged
/// bytes and forgot files gone at once; schema 3 kept a row a file (`files`), which schema 4
/// packs by directory, with damage and files gone in tables of their own.
pub(super) fn migrate(conn: &Connection) -> rusqlite::Result<()> {
    let has_files: i64 = conn.query_row(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'files'",
        [],
        |r| r.get(0),
    )?;
    if has_files == 0 {
        return Ok(());
    }
    for (table, column, kind) in [
        ("files", "archived_in", "INTEGER"),
        ("runs", "copied", "INTEGER"),
        ("files", "damaged_digest", "BLOB"),
        ("files", "gone", "INTEGER"),
    ] {
        let has: i64 = conn.query_row(
            "SELECT count(*) FROM pragma_table_info(?1) WHERE name = ?2",
            [table, column],
            |r| r.get(0),
        )?;
        if has == 0 {
            conn.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column} {kind}"))?;
        }
    }
    super::dirs::convert(conn)
}
