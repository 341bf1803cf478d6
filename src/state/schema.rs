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
CREATE TABLE IF NOT EXISTS {s}files (
    fs INTEGER NOT NULL,        -- file system id (statvfs f_fsid)
    ino INTEGER NOT NULL,
    digest BLOB NOT NULL,       -- algorithm byte (0 SHA-256, 1 BLAKE3), then the digest
    path BLOB NOT NULL,         -- absolute, where it was last seen
    size INTEGER NOT NULL,
    -- Times are Unix milliseconds: datetime(verified / 1000, 'unixepoch') in sqlite3.
    verified INTEGER,           -- last time its data matched its tag
    checked INTEGER,            -- time of the last verdict
    status TEXT,                -- the last verdict
    damaged INTEGER,            -- when damage was found, until repaired, accepted or edited
    protected INTEGER,          -- when parity was written for it
    archived INTEGER,           -- when it was copied into an archive (one known durable) ...
    archived_in INTEGER,        -- ... or the last run that archived it, once runs.copied says
                                -- that archive is durable
    seen INTEGER,               -- the run that last saw it
    damaged_digest BLOB,        -- the digest of the damaged bytes (as digest), while damaged
    gone INTEGER,               -- when a scrub found it gone from its tree
    PRIMARY KEY (fs, ino, digest)
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
CREATE INDEX IF NOT EXISTS {s}files_path ON files (path);
CREATE INDEX IF NOT EXISTS {s}files_damaged ON files (damaged) WHERE damaged IS NOT NULL;
CREATE INDEX IF NOT EXISTS {s}files_gone ON files (gone) WHERE gone IS NOT NULL;
";
pub(super) const VERSION: i64 = 3;

/// Brings a database of an older schema to this one. Schema 1 (before the columns existed)
/// recorded an archived copy only at the end of its run; schema 2 kept no digest of damaged
/// bytes and forgot files gone at once.
pub(super) fn migrate(conn: &Connection) -> rusqlite::Result<()> {
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
    Ok(())
}
