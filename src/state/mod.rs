//! The state database: when each file was last proven good, what the last verdict on it was,
//! and which copies of it exist. It is a cache of schedules, never the source of truth: the
//! tags on the files are. Losing it loses only the schedule; a database that cannot be read
//! is moved aside and rebuilt, and the run verifies as it would without it.
//!
//! A file is known by (file system, inode, digest): a renamed or moved file keeps its
//! history, a replaced or re-tagged one starts afresh. The path is kept for reports only.
//! SQLite in WAL mode: other runs and `sqlite3` can read while a run writes; writes are
//! committed at least every second, so an interrupted run keeps what it recorded, and a
//! second writer waits for the first ([`LOCK_WAIT`] at most, giving up at once when the run
//! is interrupted) rather than failing. A file archived is recorded with the run that archived
//! it, and counts as archived once that run's archive is durable (`runs.copied`): an archive
//! that failed or was killed claims nothing.
//!
//! Damage is remembered with the digest of the damaged bytes, so that the same bytes found
//! again under a moved mtime stay damage ([`crate::core::classify::since_damage`]); a
//! database found damaged and rebuilt says so (`lost`) until every file has been checked
//! again. It stays bounded: a file re-tagged or replaced leaves no row of its old content,
//! and only the latest runs are kept.

use std::collections::HashMap;
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TryRecvError, bounded, unbounded};
use rusqlite::{CachedStatement, Connection, OptionalExtension, params};

pub mod journal;

use crate::core::classify::Status;
use crate::core::digest::{Algo, Digest};
use crate::core::tag::Damage;
use crate::engine::{Action, FileReport, KnownDamage};

/// The schema, its tables in the schema `prefix` names (`""`, or `"state."` where the
/// database is attached); `user_version` says which one a database has.
pub(crate) fn schema(prefix: &str) -> String {
    tables(prefix) + &INDEXES.replace("{s}", prefix)
}

/// The tables alone: indexes on columns a migration adds come after it.
fn tables(prefix: &str) -> String {
    SCHEMA.replace("{s}", prefix)
}

const SCHEMA: &str = "
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
CREATE TABLE IF NOT EXISTS {s}lost (
    at INTEGER NOT NULL,        -- when an earlier database was found damaged and replaced
    aside BLOB,                 -- where it was moved
    why TEXT
);
";
const INDEXES: &str = "
CREATE INDEX IF NOT EXISTS {s}files_path ON files (path);
CREATE INDEX IF NOT EXISTS {s}files_damaged ON files (damaged) WHERE damaged IS NOT NULL;
CREATE INDEX IF NOT EXISTS {s}files_gone ON files (gone) WHERE gone IS NOT NULL;
";
const VERSION: i64 = 3;

/// How long a run waits for the lock of a database that another process is writing: other
/// runs of intact hold it for a moment at a time (their writes are committed at least every
/// second), so a wait this long is a stuck or foreign writer, and the run fails (exit 3).
pub const LOCK_WAIT: Duration = Duration::from_secs(60);

/// Runs kept in `runs` (older ones are forgotten, their archived copies kept on the files).
const RUNS_KEPT: i64 = 1000;

/// What a wait for a lock answers to: a flag that ends it (the run was interrupted), and a
/// function told once that a wait has begun to take long.
struct Waits {
    cancel: &'static AtomicBool,
    notice: fn(Duration),
}

static WAITS: OnceLock<Waits> = OnceLock::new();

/// Makes every wait for a lock of the database give up as soon as `cancel` is set (so that
/// Ctrl-C and SIGTERM end a run within a second), and call `notice` once, the first time a
/// wait lasts a second, with how long it may last.
pub fn on_lock_waits(cancel: &'static AtomicBool, notice: fn(Duration)) {
    let _ = WAITS.set(Waits { cancel, notice });
}

/// SQLite's busy handler: waits in steps of 10 ms, up to [`LOCK_WAIT`] for each lock.
fn busy(tries: i32) -> bool {
    const STEP: Duration = Duration::from_millis(10);
    static NOTICED: AtomicBool = AtomicBool::new(false);
    if let Some(w) = WAITS.get() {
        if w.cancel.load(Ordering::Relaxed) {
            return false;
        }
        if tries >= 100 && !NOTICED.swap(true, Ordering::Relaxed) {
            (w.notice)(LOCK_WAIT);
        }
    }
    if STEP * tries.max(0) as u32 >= LOCK_WAIT {
        return false;
    }
    std::thread::sleep(STEP);
    true
}

/// Makes `conn` wait for locks as [`busy`] says.
pub(crate) fn wait_for_locks(conn: &mut Connection) -> rusqlite::Result<()> {
    conn.busy_handler(Some(busy))
}

/// Recorded rows are written at least this often ...
const COMMIT_EVERY: Duration = Duration::from_secs(1);
/// ... or once this many are waiting. Batches are handed over, not committed: the writer
/// commits once a second whatever their size, so a small batch costs nothing, and bounds what
/// waits for a writer that lags (up to four batches are alive: measured on 1M files, batches
/// of 4,096 rows raised a scrub's peak by 3 MiB where the database's pages came from disk).
const BATCH: usize = 1024;

/// Where the database is by default: `$XDG_STATE_HOME/intact/state.db`; for root without
/// that variable `/var/lib/intact/state.db`; else `~/.local/state/intact/state.db`.
pub fn default_path() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("XDG_STATE_HOME").filter(|d| !d.is_empty()) {
        return Some(Path::new(&dir).join("intact/state.db"));
    }
    if rustix::process::geteuid().is_root() {
        return Some(PathBuf::from("/var/lib/intact/state.db"));
    }
    let home = std::env::var_os("HOME").filter(|h| !h.is_empty())?;
    Some(Path::new(&home).join(".local/state/intact/state.db"))
}

/// The current time in Unix milliseconds, the database's unit of time (fine enough that
/// scrubs run back to back keep their order).
pub fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// An open state database.
pub struct State {
    conn: Connection,
    path: Option<PathBuf>,
    /// File system ids by device number.
    fsids: FsIds,
    /// The working directory, once: relative paths are stored absolute.
    cwd: PathBuf,
    /// Rows waiting to be written, and since when.
    pending: Vec<Row>,
    /// Where they go.
    writer: Writer,
    pending_since: Option<Instant>,
    /// This run's row in `runs`.
    run: Option<i64>,
    /// The first error met while recording; recording stops there.
    pub failed: Option<String>,
    /// SQLite found the database damaged: it should be moved aside.
    pub broken: bool,
    /// The damage journal beside the database (none in memory).
    journal: Option<PathBuf>,
}

/// Why the database could not be used.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// SQLite said so.
    #[error("{}", why(.0))]
    Sql(#[from] rusqlite::Error),
    /// Creating its directory or moving it aside failed.
    #[error("{0}")]
    Io(#[from] io::Error),
}

impl State {
    /// Opens (creating it if need be) the database at `path`. One that is not a database or
    /// is damaged is moved aside (to `state.db.broken-TIME`) and a new one made, which
    /// remembers that ([`State::history_lost`]); the returned note says so.
    pub fn open(path: &Path) -> Result<(State, Option<Rebuilt>), StateError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        match State::open_at(path) {
            Ok(state) => Ok((state, None)),
            Err(StateError::Sql(e)) if is_damage(&e) => {
                let rebuilt = rebuild(path, &e.to_string())?;
                Ok((State::open_at(path)?, Some(rebuilt)))
            }
            Err(e) => Err(e),
        }
    }

    fn open_at(path: &Path) -> Result<State, StateError> {
        room_for_shared_memory(path)?;
        let mut conn = Connection::open(path)?;
        // Another run writing: wait for it rather than fail.
        wait_for_locks(&mut conn)?;
        // Turning a new database to WAL takes a lock whose holder SQLite does not wait for
        // (seen with two scrubs started at once): try again a while.
        for tries in 1.. {
            match conn.pragma_update(None, "journal_mode", "WAL") {
                Err(e)
                    if tries < 200
                        && e.sqlite_error_code() == Some(rusqlite::ErrorCode::DatabaseBusy) =>
                {
                    std::thread::sleep(Duration::from_millis(50));
                }
                done => {
                    done?;
                    break;
                }
            }
        }
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
        if version > VERSION {
            return Err(StateError::Io(io::Error::other(format!(
                "the state database {} was written by a newer intact (schema {version})",
                crate::text::escape(path)
            ))));
        }
        // Reading every table proves the file is a database and its schema is whole.
        conn.execute_batch(&tables(""))?;
        conn.query_row("SELECT count(*) FROM runs", [], |_| Ok(()))?;
        if version < VERSION {
            // In one write transaction, so that two runs never both add a column.
            transaction(&conn, migrate)?;
        }
        conn.execute_batch(&INDEXES.replace("{s}", ""))?;
        if version != VERSION {
            conn.pragma_update(None, "user_version", VERSION)?;
        }
        // A new database (the old one deleted, damaged or replaced) learns again the damage
        // the journal remembers; a long journal is compacted to what is still damage.
        let entries = journal::path_of(path);
        let long = std::fs::metadata(&entries).is_ok_and(|m| m.len() > JOURNAL_COMPACT_AT);
        if version == 0 || long {
            transaction(&conn, |conn| {
                replay(conn, &entries, version == 0).map_err(|e| {
                    rusqlite::Error::SqliteFailure(
                        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_IOERR),
                        Some(format!(
                            "the damage journal {}: {e}",
                            crate::text::escape(&entries)
                        )),
                    )
                })
            })?;
        }
        let writer = Writer::open(path)?;
        Ok(State::with(conn, writer, Some(path.to_path_buf())))
    }

    fn with(conn: Connection, writer: Writer, path: Option<PathBuf>) -> State {
        State {
            journal: path.as_deref().map(journal::path_of),
            conn,
            writer,
            path,
            fsids: FsIds::default(),
            cwd: std::env::current_dir().unwrap_or_default(),
            pending: Vec::new(),
            pending_since: None,
            run: None,
            failed: None,
            broken: false,
        }
    }

    /// Where the database is (`None` in memory).
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Records the start of a run of `verb` over `roots` (once).
    pub fn begin_run(&mut self, verb: &str, roots: &[PathBuf]) {
        if self.run.is_some() {
            return;
        }
        let roots = roots_key(roots);
        let result = self
            .conn
            .execute(
                "INSERT INTO runs (verb, roots, started) VALUES (?1, ?2, ?3)",
                params![verb, roots, now()],
            )
            .map(|_| self.conn.last_insert_rowid());
        match result {
            Ok(id) => self.run = Some(id),
            Err(e) => self.fail(e),
        }
    }

    /// Records the end of this run, and forgets runs beyond the last [`RUNS_KEPT`]: their
    /// archived copies are kept on the files' rows first.
    pub fn end_run(&mut self, files: u64, bytes: u64, seconds: f64, exit_code: i32) {
        self.commit();
        let Some(id) = self.run else { return };
        let result = self
            .conn
            .execute(
                "UPDATE runs SET ended = ?2, files = ?3, bytes = ?4, seconds = ?5, \
                 exit_code = ?6 WHERE id = ?1",
                params![id, now(), files as i64, bytes as i64, seconds, exit_code],
            )
            .and_then(|_| {
                // Once in a while: the fold reads the whole table of files.
                if id % 100 != 0 || id <= RUNS_KEPT {
                    return Ok(());
                }
                transaction(&self.conn, |conn| {
                    let old = id - RUNS_KEPT;
                    conn.execute(
                        "UPDATE files SET archived = coalesce((SELECT copied FROM runs \
                         WHERE id = files.archived_in), archived), archived_in = NULL \
                         WHERE archived_in <= ?1",
                        [old],
                    )?;
                    conn.execute("DELETE FROM runs WHERE id <= ?1", [old])?;
                    Ok(())
                })
            });
        if let Err(e) = result {
            self.fail(e);
        }
    }

    /// The damage this database remembers, for the engine to know it again: by inode and
    /// the digest of the tag it was found under.
    pub fn known_damage(&mut self) -> KnownDamage {
        let mut known = KnownDamage::new();
        if let Err(e) = load_damage(&self.conn, &mut known) {
            self.fail(e);
        }
        known
    }

    /// Damage this database knows under `roots` that this run did not see: files found
    /// damaged before, neither repaired, accepted nor edited since, and still there (the same
    /// inode under the path last seen). A run that is not told of them would say nothing of
    /// damage that is still there.
    pub fn outstanding(&mut self, roots: &[PathBuf]) -> Vec<Damaged> {
        self.commit();
        let mut found = Vec::new();
        let run = self.run.unwrap_or(0);
        let rows = (|| -> rusqlite::Result<Vec<(i64, i64, Damaged)>> {
            let mut stmt = self.conn.prepare_cached(
                // Damaged rows are few: through their own index, never a walk of the tree's.
                "SELECT fs, ino, path, status, damaged FROM files INDEXED BY files_damaged \
                 WHERE damaged IS NOT NULL \
                 AND coalesce(seen, 0) != ?3 AND gone IS NULL \
                 AND ((path >= ?1 AND path < ?2) OR path = ?4) ORDER BY path",
            )?;
            let mut all = Vec::new();
            for root in roots {
                let (low, high, exact) = under(root);
                let rows = stmt.query_map(params![low, high, run, exact], |r| {
                    let path: Vec<u8> = r.get(2)?;
                    Ok((
                        r.get::<_, i64>(0)?,
                        r.get::<_, i64>(1)?,
                        Damaged {
                            path: PathBuf::from(std::ffi::OsString::from_vec(path)),
                            status: r.get(3)?,
                            found: r.get(4)?,
                        },
                    ))
                })?;
                for row in rows {
                    all.push(row?);
                }
            }
            Ok(all)
        })();
        match rows {
            Ok(rows) => {
                for (fs, ino, damaged) in rows {
                    let there = std::fs::symlink_metadata(&damaged.path).is_ok_and(|m| {
                        m.ino() as i64 == ino && self.fsids.of(m.dev(), &damaged.path) == fs
                    });
                    if there && !found.iter().any(|d: &Damaged| d.path == damaged.path) {
                        found.push(damaged);
                    }
                }
            }
            Err(e) => self.fail(e),
        }
        found
    }

    /// The files this database knows under `roots` that this run did not see and whose path
    /// holds nothing now: deleted (or moved out of the trees), with the content they had.
    pub fn missing(&mut self, roots: &[PathBuf]) -> Vec<Missing> {
        self.commit();
        let run = self.run.unwrap_or(0);
        let mut found: Vec<Missing> = Vec::new();
        let rows = (|| -> rusqlite::Result<Vec<Missing>> {
            let mut stmt = self.conn.prepare_cached(
                "SELECT ino, digest, path, size, verified FROM files \
                 WHERE coalesce(seen, 0) != ?3 AND length(digest) > 1 \
                 AND ((path >= ?1 AND path < ?2) OR path = ?4) ORDER BY path",
            )?;
            let mut all = Vec::new();
            for root in roots {
                let (low, high, exact) = under(root);
                let rows = stmt.query_map(params![low, high, run, exact], |r| {
                    let key: Vec<u8> = r.get(1)?;
                    let path: Vec<u8> = r.get(2)?;
                    Ok((
                        r.get::<_, i64>(0)?,
                        key,
                        path,
                        r.get::<_, i64>(3)?,
                        r.get(4)?,
                    ))
                })?;
                for row in rows {
                    let (ino, key, path, size, verified) = row?;
                    if let Some(digest) = digest_from_key(&key) {
                        all.push(Missing {
                            path: PathBuf::from(std::ffi::OsString::from_vec(path)),
                            digest,
                            size: size as u64,
                            ino: ino as u64,
                            verified,
                        });
                    }
                }
            }
            Ok(all)
        })();
        match rows {
            Ok(rows) => {
                for m in rows {
                    let gone = matches!(
                        std::fs::symlink_metadata(&m.path),
                        Err(e) if e.kind() == io::ErrorKind::NotFound
                    );
                    if gone && !found.iter().any(|f| f.path == m.path) {
                        found.push(m);
                    }
                }
            }
            Err(e) => self.fail(e),
        }
        found
    }

    /// The damaged files under `roots` (the index of the root each is under, and its path
    /// there), where this database can say: it knows files under every root, each has a
    /// verdict, and some are damaged (none with other names). Else `None`, and the trees are
    /// walked: a repair asked for where no damage is known is looking for damage. Damage no run has found yet is
    /// not among them: the owner's `repair --full` reads every file.
    pub fn known_damage_under(&mut self, roots: &[PathBuf]) -> Option<Vec<(usize, PathBuf)>> {
        self.commit();
        let judged = |conn: &Connection, root: &Path| -> rusqlite::Result<bool> {
            let (low, high, exact) = under(root);
            conn.query_row(
                "SELECT count(*), count(*) FILTER (WHERE checked IS NULL) FROM files \
                 WHERE gone IS NULL AND ((path >= ?1 AND path < ?2) OR path = ?3)",
                params![low, high, exact],
                |r| Ok(r.get::<_, i64>(0)? > 0 && r.get::<_, i64>(1)? == 0),
            )
        };
        for root in roots {
            match judged(&self.conn, root) {
                Ok(true) => {}
                Ok(false) => return None,
                Err(e) => {
                    self.fail(e);
                    return None;
                }
            }
        }
        let damaged = self.outstanding(roots);
        // A file with other names: only a walk finds them, to say each was repaired.
        let linked = |d: &Damaged| std::fs::symlink_metadata(&d.path).is_ok_and(|m| m.nlink() > 1);
        if damaged.is_empty() || damaged.iter().any(linked) {
            return None;
        }
        Some(
            damaged
                .into_iter()
                .filter_map(|d| {
                    roots.iter().enumerate().find_map(|(k, root)| {
                        let rel = d.path.strip_prefix(absolute(root)).ok()?;
                        let path = match rel.as_os_str().is_empty() {
                            true => root.clone(),
                            false => root.join(rel),
                        };
                        Some((k, path))
                    })
                })
                .collect(),
        )
    }

    /// What the owner was last told about `roots`, if anything.
    pub fn told(&self, roots: &[PathBuf]) -> Option<crate::notify::Told> {
        self.conn
            .query_row(
                "SELECT at, alarm, items FROM told WHERE roots = ?1",
                [roots_key(roots)],
                |r| {
                    let items: String = r.get(2)?;
                    Ok(crate::notify::Told {
                        at: r.get(0)?,
                        alarm: r.get(1)?,
                        keys: items.lines().map(String::from).collect(),
                    })
                },
            )
            .optional()
            .ok()
            .flatten()
    }

    /// Remembers that the owner was told `told` about `roots`.
    pub fn tell(&mut self, roots: &[PathBuf], told: &crate::notify::Told) {
        // Keys are one line each: escaped names, texts without newlines.
        let items: Vec<String> = told.keys.iter().map(|k| k.replace('\n', " ")).collect();
        let result = self.conn.execute(
            "INSERT OR REPLACE INTO told (roots, at, alarm, items) VALUES (?1, ?2, ?3, ?4)",
            params![roots_key(roots), told.at, told.alarm, items.join("\n")],
        );
        if let Err(e) = result {
            self.fail(e);
        }
    }

    /// When this database replaced one found damaged, if it did: what that one knew of damage
    /// and verification is lost until every file has been checked again.
    pub fn history_lost(&self) -> Option<Lost> {
        self.conn
            .query_row(
                "SELECT at, aside FROM lost ORDER BY at DESC LIMIT 1",
                [],
                |r| {
                    let aside: Option<Vec<u8>> = r.get(1)?;
                    Ok(Lost {
                        at: r.get(0)?,
                        aside: aside.map(|a| PathBuf::from(std::ffi::OsString::from_vec(a))),
                    })
                },
            )
            .optional()
            .ok()
            .flatten()
    }

    /// Records what a report says of its file: a verdict (verified, damaged, modified,
    /// unreadable), a new tag, a repair, a parity set or an archived copy (which counts once
    /// [`State::settle`] says the run's archive is durable). Reports that say
    /// none of these (new, skipped files) are not recorded. Rows are written in batches by
    /// the writer thread and committed at least every second: other runs never wait longer
    /// for this one, and a run killed loses at most its last second.
    pub fn record(&mut self, report: &FileReport) {
        for (fact, key) in facts(report) {
            self.add(report, fact, key);
        }
        self.send_when_due();
    }

    /// Hands the queued rows to the writer once there are enough of them, or they have
    /// waited long enough.
    fn send_when_due(&mut self) {
        if self.pending.len() >= BATCH
            || self
                .pending_since
                .is_some_and(|t| t.elapsed() >= COMMIT_EVERY)
        {
            self.send();
        }
    }

    /// The copies this run made (an archive) are durable, or will never be: the files
    /// recorded as archived by it count as such from now on, or never. One row, whatever the
    /// number of files (applying 20,000 rows at the end took longer than the archive's own
    /// fsync).
    pub fn settle(&mut self, durable: bool) {
        self.commit();
        let (Some(run), true) = (self.run, durable) else {
            return;
        };
        if self.failed.is_some() {
            return;
        }
        let result = self.conn.execute(
            "UPDATE runs SET copied = ?2 WHERE id = ?1",
            params![run, now()],
        );
        if let Err(e) = result {
            self.fail(e);
        }
    }

    /// Queues the row for `fact` about the file of `report`.
    fn add(&mut self, report: &FileReport, fact: Fact, key: Vec<u8>) {
        if self.failed.is_some() {
            return;
        }
        // A repaired file is a new inode under the old name.
        let id = match fact {
            Fact::Repaired => std::fs::symlink_metadata(&report.path)
                .ok()
                .map(|m| (m.dev(), m.ino())),
            _ => report.inode,
        };
        let (Some((dev, ino)), Some(size)) = (id, report.size) else {
            return;
        };
        let fs = self.fsids.of(dev, &report.path);
        let t = now();
        let damage = match (fact, report.digest) {
            (Fact::Damaged, Some(d)) => {
                // Found before, these same bytes: since then.
                let known = report.known_damage.filter(|k| k.digest == d);
                let found = known.map_or(t, |k| k.found.saturating_mul(1000));
                if known.is_none() {
                    self.journal(journal::Entry {
                        found,
                        fs,
                        ino: ino as i64,
                        tag: key.clone(),
                        damaged: digest_key(&d),
                        status: report.status.name().into(),
                        path: absolute_from(&self.cwd, &report.path),
                    });
                }
                Some((digest_key(&d), found))
            }
            // Damage known before ends here (repaired, accepted, edited, read whole again):
            // the journal says so, lest a replay bring it back (a repair in place keeps the
            // inode and the tag the damage was found under).
            (Fact::Verified | Fact::VerifiedArchived | Fact::Edited | Fact::Repaired, _) => {
                if let (Some(tag), Some((_, old_ino))) = (&report.tag, report.inode)
                    && report.known_damage.is_some()
                {
                    self.journal(journal::Entry::ended(
                        t,
                        fs,
                        old_ino as i64,
                        digest_key(&tag.digest),
                        absolute_from(&self.cwd, &report.path),
                    ));
                }
                None
            }
            _ => None,
        };
        // Allocated only for a re-tag (rare): every row pays for the comparison alone.
        let was = report
            .tag
            .as_ref()
            .filter(|t| digest_from_key(&key) != Some(t.digest))
            .map(|t| digest_key(&t.digest));
        let row = Row {
            fact,
            fs,
            ino: ino as i64,
            key,
            path: absolute_from(&self.cwd, &report.path)
                .into_os_string()
                .into_vec(),
            size: size as i64,
            t,
            status: report.status.name(),
            damage,
            old_ino: report.inode.map(|(_, ino)| ino as i64),
            was,
        };
        self.pending_since.get_or_insert_with(Instant::now);
        self.pending.push(row);
    }

    /// Writes the queued rows and waits until every row recorded so far is written.
    pub fn commit(&mut self) {
        self.hand_over(true);
        self.collect(true);
    }

    /// Hands the queued rows to the writer, without waiting for them to be written.
    pub fn send(&mut self) {
        self.hand_over(false);
        self.collect(false);
    }

    /// Gives the queued rows to the writer, and with `commit` the word to commit them and
    /// all before them at once.
    fn hand_over(&mut self, commit: bool) {
        self.pending_since = None;
        if self.failed.is_some() {
            self.pending.clear();
            return;
        }
        if self.pending.is_empty() && !commit {
            return;
        }
        let batch = Batch {
            rows: std::mem::take(&mut self.pending),
            seen: self.run,
            commit,
        };
        match &self.writer.rows {
            Some(tx) if tx.send(batch).is_ok() => self.writer.in_flight += 1,
            _ => self.fail(writer_gone()),
        }
    }

    /// Takes in what the writer says of the batches it wrote (waiting for all of them if
    /// `all`); a failure stops the recording.
    fn collect(&mut self, all: bool) {
        while self.writer.in_flight > 0 {
            let said = if all {
                self.writer
                    .results
                    .recv()
                    .map_err(|_| TryRecvError::Disconnected)
            } else {
                self.writer.results.try_recv()
            };
            match said {
                Ok(written) => {
                    self.writer.in_flight -= 1;
                    if let Err(e) = written {
                        self.fail(e);
                    }
                }
                Err(TryRecvError::Empty) => return,
                Err(TryRecvError::Disconnected) => {
                    self.writer.in_flight = 0;
                    self.fail(writer_gone());
                }
            }
        }
    }

    /// Moves a database found damaged while in use aside, and starts a new one in its place
    /// that remembers that.
    pub fn quarantine(self) -> Result<Rebuilt, StateError> {
        let path = self
            .path
            .clone()
            .ok_or_else(|| StateError::Io(io::Error::other("no database file")))?;
        drop(self);
        rebuild(&path, "found damaged while in use")
    }

    /// Writes damage just found (or ended) into the journal, durably, before the database
    /// knows it; failing that, the run says so.
    fn journal(&mut self, entry: journal::Entry) {
        let Some(path) = &self.journal else { return };
        if let Err(e) = journal::append(path, &entry) {
            let lost = if entry.is_end() {
                "damage that ended now may be reported again"
            } else {
                "the damage found now is forgotten"
            };
            self.failed.get_or_insert_with(|| {
                format!(
                    "the damage journal {} could not be written ({e}): if the state database \
                     is lost, {lost}",
                    crate::text::escape(path)
                )
            });
        }
    }

    fn fail(&mut self, e: rusqlite::Error) {
        self.broken |= is_damage(&e);
        self.pending.clear();
        self.failed.get_or_insert_with(|| {
            let place = self
                .path
                .as_deref()
                .map_or("in memory".into(), crate::text::escape);
            format!(
                "the state database {place} could not be written ({}); nothing more was \
                 recorded this run, so the next run knows nothing of what this one found",
                why(&e)
            )
        });
    }

    /// The files this run saw that were never proven good, and the oldest verification
    /// among those that were (damaged ones left out: they have their own count).
    pub fn seen_summary(&self) -> Option<(u64, Option<i64>)> {
        let run = self.run?;
        self.conn
            .query_row(
                "SELECT count(*) FILTER (WHERE verified IS NULL), \
                 min(verified) FILTER (WHERE damaged IS NULL) FROM files WHERE seen = ?1",
                [run],
                |r| Ok((r.get::<_, i64>(0)? as u64, r.get(1)?)),
            )
            .optional()
            .ok()
            .flatten()
    }

    /// The pace of the recent scrubs of `roots` (the last ten that ended), or, without any,
    /// of the recent checks of them.
    pub fn pace(&self, roots: &[PathBuf]) -> Option<Pace> {
        let key = roots_key(roots);
        ["scrub", "check"].iter().find_map(|verb| {
            self.conn
                .query_row(
                    "SELECT count(*), sum(bytes), sum(seconds), min(started), max(started) \
                     FROM (SELECT bytes, seconds, started FROM runs \
                     WHERE verb = ?1 AND roots = ?2 AND ended IS NOT NULL AND bytes > 0 \
                     ORDER BY id DESC LIMIT 10)",
                    params![verb, key],
                    |r| {
                        let runs: i64 = r.get(0)?;
                        let (bytes, seconds): (Option<i64>, Option<f64>) = (r.get(1)?, r.get(2)?);
                        let (first, last): (Option<i64>, Option<i64>) = (r.get(3)?, r.get(4)?);
                        Ok(match (bytes, seconds) {
                            (Some(b), Some(s)) if runs > 0 && s > 0.0 => Some(Pace {
                                scrubs: *verb == "scrub",
                                bytes_per_run: b as f64 / runs as f64,
                                bytes_per_second: b as f64 / s,
                                every: match (first, last) {
                                    (Some(f), Some(l)) if runs > 1 && l > f => {
                                        Some((l - f) as f64 / 1e3 / (runs - 1) as f64)
                                    }
                                    _ => None,
                                },
                            }),
                            _ => None,
                        })
                    },
                )
                .ok()
                .flatten()
        })
    }
}

/// How fast recent runs verified a tree, for the time a full cycle takes.
#[derive(Debug, Clone, Copy)]
pub struct Pace {
    /// Scrubs (else checks).
    pub scrubs: bool,
    /// Bytes a run read.
    pub bytes_per_run: f64,
    /// Bytes a second while running.
    pub bytes_per_second: f64,
    /// Seconds from one run's start to the next, if there were several.
    pub every: Option<f64>,
}

impl Drop for State {
    fn drop(&mut self) {
        self.commit();
    }
}

/// What a writer that stopped (it panicked) leaves to say.
fn writer_gone() -> rusqlite::Error {
    rusqlite::Error::SqliteFailure(
        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ERROR),
        Some("the database writer stopped".into()),
    )
}

/// Brings a database of an older schema to this one. Schema 1 (before the columns existed)
/// recorded an archived copy only at the end of its run; schema 2 kept no digest of damaged
/// bytes and forgot files gone at once.
fn migrate(conn: &Connection) -> rusqlite::Result<()> {
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

/// Runs `f` on `conn` in a transaction of its own.
fn transaction(
    conn: &Connection,
    f: impl FnOnce(&Connection) -> rusqlite::Result<()>,
) -> rusqlite::Result<()> {
    conn.execute_batch("BEGIN IMMEDIATE")?;
    match f(conn) {
        Ok(()) => conn.execute_batch("COMMIT"),
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

/// Writes batches of rows on a connection and a thread of its own, so that a run does not
/// wait for the database: on a cold cache, its pages come from the disk while files are
/// hashed (measured on 20,000 files of 4 KiB read cold: the check took 20% longer while the
/// rows were written on the reporting thread).
///
/// One transaction takes the batches of up to a second ([`COMMIT_EVERY`]): a page is then
/// written once a second rather than once a batch, and a batch of a tree's files touches
/// most of the table's pages (measured on 20,000 rows in walk order: 110 ms in transactions
/// of 4,096 rows, 44 ms in one). Another run waits at most that second for the lock, and
/// one killed loses at most its last second of rows.
struct Writer {
    rows: Option<Sender<Batch>>,
    results: Receiver<rusqlite::Result<()>>,
    /// Batches sent and not yet reported on.
    in_flight: usize,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Writer {
    fn open(path: &Path) -> rusqlite::Result<Writer> {
        let mut conn = Connection::open(path)?;
        wait_for_locks(&mut conn)?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        // SQLite's default cache (2 MiB): a second's pages that outgrow it spill to the WAL
        // early, which measured no slower (20,000 files of 4 KiB, first and later checks);
        // 8 MiB filled up on large trees and made a nightly scrub's peak grow with the tree
        // (15 MiB at 50,000 files, 27 at 1,000,000).
        let (rows, batches) = bounded::<Batch>(2);
        let (said, results) = unbounded();
        let thread = std::thread::Builder::new()
            .name("intact-state".into())
            .spawn(move || serve(&conn, &batches, &said))
            .expect("spawning the state writer");
        Ok(Writer {
            rows: Some(rows),
            results,
            in_flight: 0,
            thread: Some(thread),
        })
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.rows = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The writer's loop: writes each batch into the open transaction (beginning one if need
/// be) and says how that went; commits when told to, and a second after the transaction
/// began, whether or not more rows came meanwhile. A commit that fails on the clock is said
/// with the next batch.
fn serve(conn: &Connection, batches: &Receiver<Batch>, said: &Sender<rusqlite::Result<()>>) {
    let mut began: Option<Instant> = None;
    let mut failed: Option<rusqlite::Error> = None;
    let end = |conn: &Connection, sql: &str| {
        conn.execute_batch(sql).inspect_err(|_| {
            let _ = conn.execute_batch("ROLLBACK");
        })
    };
    loop {
        let next = match began {
            Some(t) => batches.recv_deadline(t + COMMIT_EVERY),
            None => batches.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        let batch = match next {
            Ok(batch) => batch,
            Err(RecvTimeoutError::Timeout) => {
                began = None;
                failed = failed.or(end(conn, "COMMIT").err());
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => {
                if began.is_some() {
                    let _ = end(conn, "COMMIT");
                }
                return;
            }
        };
        let mut result = failed.take().map_or(Ok(()), Err);
        if result.is_ok() && !batch.rows.is_empty() {
            if began.is_none() {
                result = conn.execute_batch("BEGIN IMMEDIATE");
                began = result.is_ok().then(Instant::now);
            }
            result = result.and_then(|()| write_rows(conn, &batch.rows, batch.seen));
        }
        let due = batch.commit || began.is_some_and(|t| t.elapsed() >= COMMIT_EVERY);
        if result.is_err() && began.is_some() {
            let _ = conn.execute_batch("ROLLBACK");
            began = None;
        } else if due && began.take().is_some() {
            result = end(conn, "COMMIT");
        }
        if said.send(result).is_err() {
            return;
        }
    }
}

/// Rows for the writer to write, of the run `seen`; with `commit`, the word to commit them
/// and every row before them.
struct Batch {
    rows: Vec<Row>,
    seen: Option<i64>,
    commit: bool,
}

/// Writes `rows` (of the run `seen`), inside the writer's transaction.
fn write_rows(conn: &Connection, rows: &[Row], seen: Option<i64>) -> rusqlite::Result<()> {
    // Each fact's statements, prepared once a batch: looking them up by their text for
    // every row cost a fifth of the writer's time.
    let mut prepared: [Option<[CachedStatement; 2]>; Fact::ALL] = Default::default();
    // A file met under a new key or a new path no longer holds what other rows say: the
    // rows of its inode's earlier content under the same path (re-tagged), and those of
    // another inode that was at its path (replaced: an editor's save, a restore), unless
    // they hold damage not dealt with (that inode may only have moved, and is reported
    // until it is). A row of its inode's earlier content under *another* path stays, unless
    // it is the content the file's own tag named (the file moved, then was re-tagged): the
    // file there was deleted and its inode reused by another, and that row is all that is
    // left of it for `--missing` (a scrub tells which: see `scrub::Plan::gone`).
    let mut stale = conn.prepare_cached(
        "DELETE FROM files WHERE (fs = ?1 AND ino = ?2 AND digest != ?3 \
         AND (path = ?4 OR length(digest) <= 1 OR digest = ?5)) \
         OR (path = ?4 AND (fs != ?1 OR ino != ?2) AND damaged IS NULL)",
    )?;
    let mut repaired = conn.prepare_cached(
        "DELETE FROM files WHERE fs = ?1 AND ino = ?2 AND digest = ?3 AND ?2 != ?4",
    )?;
    for row in rows {
        let [update, upsert] = match &mut prepared[row.fact as usize] {
            Some(statements) => statements,
            slot => {
                let [update, upsert] = row.fact.statements();
                slot.insert([conn.prepare_cached(update)?, conn.prepare_cached(upsert)?])
            }
        };
        let (damaged, found) = match &row.damage {
            Some((d, f)) => (Some(d.as_slice()), Some(*f)),
            None => (None, None),
        };
        let all = params![
            row.fs,
            row.ino,
            row.key,
            row.path,
            row.size,
            seen,
            row.t,
            row.status,
            damaged,
            found,
            row.old_ino
        ];
        let n = update.parameter_count();
        if update.execute(&all[..n])? == 0 {
            // First: a repaired file's row takes the copies of its damaged inode's.
            let n = upsert.parameter_count();
            upsert.execute(&all[..n])?;
            // An untagged file's row (the empty key) stands beside none other.
            if !row.key.is_empty() {
                stale.execute(params![row.fs, row.ino, row.key, row.path, row.was])?;
            }
        }
        if row.fact == Fact::Repaired
            && let Some(old) = row.old_ino
        {
            repaired.execute(params![row.fs, old, row.key, row.ino])?;
        }
    }
    Ok(())
}

/// A row waiting to be written.
struct Row {
    fact: Fact,
    fs: i64,
    ino: i64,
    key: Vec<u8>,
    path: Vec<u8>,
    size: i64,
    t: i64,
    status: &'static str,
    /// Damage: the digest of the damaged bytes, and when they were first found.
    damage: Option<(Vec<u8>, i64)>,
    /// A repair: the inode the damaged bytes were in (the repaired file is a new one).
    old_ino: Option<i64>,
    /// The key of the tag the file carried before this run re-tagged it, if another.
    was: Option<Vec<u8>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fact {
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

impl Fact {
    /// How many there are (the last is the last variant).
    const ALL: usize = Fact::VerifiedArchived as usize + 1;

    /// The statements that record it: one that updates the row of a file still under the
    /// same path (the common case, which leaves the path index alone), and one that creates
    /// the row or updates it, path included. Parameters: fs, ino, digest, path, size, seen
    /// (the run), time, status, the damaged bytes' digest, when they were found, the
    /// repaired file's old inode (each statement takes those up to the last it uses).
    fn statements(self) -> [&'static str; 2] {
        // The columns a new row sets beyond the key, path, size and seen; their values; and
        // what an existing row gets. A row written is a file seen: not gone.
        macro_rules! sql {
            ($cols:literal, $values:literal, $set:expr) => {
                [
                    concat!(
                        "UPDATE files SET size = ?5, seen = ?6, gone = NULL, ",
                        $set,
                        " WHERE fs = ?1 AND ino = ?2 AND digest = ?3 AND path = ?4"
                    ),
                    concat!(
                        "INSERT INTO files (fs, ino, digest, path, size, seen, ",
                        $cols,
                        ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ",
                        $values,
                        ") ON CONFLICT DO UPDATE SET path = ?4, size = ?5, seen = ?6, gone = NULL, ",
                        $set
                    ),
                ]
            };
        }
        // The archive of this run (`?6`) stands once the run's copies are durable; the one the
        // file was last archived in before, if that one's are, is its latest copy till then.
        macro_rules! archived {
            () => {
                "archived = coalesce((SELECT copied FROM runs WHERE id = files.archived_in), \
                 files.archived), archived_in = ?6"
            };
        }
        match self {
            Fact::Verified => sql!(
                "verified, checked, status",
                "?7, ?7, ?8",
                "verified = ?7, checked = ?7, status = ?8, damaged = NULL, damaged_digest = NULL"
            ),
            Fact::Damaged => sql!(
                "checked, status, damaged_digest, damaged",
                "?7, ?8, ?9, ?10",
                "checked = ?7, status = ?8, damaged_digest = ?9, \
                 damaged = coalesce(files.damaged, ?10)"
            ),
            Fact::Edited => sql!(
                "checked, status",
                "?7, ?8",
                "checked = ?7, status = ?8, damaged = NULL, damaged_digest = NULL"
            ),
            Fact::Judged => sql!("checked, status", "?7, ?8", "checked = ?7, status = ?8"),
            // The repaired file keeps the copies its damaged inode had (same content).
            Fact::Repaired => [
                "UPDATE files SET size = ?5, seen = ?6, gone = NULL, verified = ?7, \
                 checked = ?7, status = 'repaired', damaged = NULL, damaged_digest = NULL \
                 WHERE fs = ?1 AND ino = ?2 AND digest = ?3 AND path = ?4",
                "INSERT INTO files (fs, ino, digest, path, size, seen, verified, checked, \
                 status, protected, archived, archived_in) \
                 SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7, 'repaired', o.protected, \
                 coalesce(o.archived, (SELECT copied FROM runs WHERE id = o.archived_in)), \
                 o.archived_in FROM (SELECT 1) LEFT JOIN files o \
                 ON o.fs = ?1 AND o.ino = ?11 AND o.digest = ?3 WHERE true \
                 ON CONFLICT DO UPDATE SET path = ?4, size = ?5, seen = ?6, gone = NULL, \
                 verified = ?7, checked = ?7, status = 'repaired', damaged = NULL, \
                 damaged_digest = NULL",
            ],
            Fact::Protected => sql!("protected", "?7", "protected = ?7"),
            Fact::Archived => sql!("archived_in", "?6", archived!()),
            Fact::VerifiedArchived => sql!(
                "verified, checked, status, archived_in",
                "?7, ?7, ?8, ?6",
                concat!(
                    "verified = ?7, checked = ?7, status = ?8, damaged = NULL, ",
                    "damaged_digest = NULL, ",
                    archived!()
                )
            ),
        }
    }
}

/// What a report says that is worth remembering, each fact with the content it is about:
/// the verdict, and a copy made.
fn facts(r: &FileReport) -> Vec<(Fact, Vec<u8>)> {
    let tagged = r.tag.as_ref().map(|t| t.digest);
    // An untagged file that could not be tagged (update, scrub --update): under the empty
    // key, which the plan gives untagged files, so that it waits for the next cycle.
    if tagged.is_none() && matches!(r.status, Status::Error | Status::Changed) {
        return vec![(Fact::Judged, Vec::new())];
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
    let copy = match r.action {
        Some(Action::Protected) => r.digest.or(tagged).map(|d| (Fact::Protected, d)),
        Some(Action::Archived) => r.digest.or(tagged).map(|d| (Fact::Archived, d)),
        _ => None,
    };
    // A verification and an archived copy of the same content are one row: half the
    // writes of an archive run.
    let facts: Vec<(Fact, Digest)> = match (verdict, copy) {
        (Some((Fact::Verified, v)), Some((Fact::Archived, c))) if v == c => {
            vec![(Fact::VerifiedArchived, v)]
        }
        (verdict, copy) => verdict.into_iter().chain(copy).collect(),
    };
    facts
        .into_iter()
        .map(|(fact, d)| (fact, digest_key(&d)))
        .collect()
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

/// `path` made absolute (against the working directory), without resolving symlinks, and
/// without a trailing slash: `/srv/photos/` and `/srv/photos` are one tree.
pub fn absolute(path: &Path) -> PathBuf {
    absolute_from(&std::env::current_dir().unwrap_or_default(), path)
}

/// As [`absolute`], relative to `cwd`.
fn absolute_from(cwd: &Path, path: &Path) -> PathBuf {
    // The walk's paths are most often already in the form that `components` gives, or are
    // that under the working directory (`intact check photos`): building them again was
    // most of recording a file (55 M of the 364 M instructions recording 20,000 cost).
    let b = path.as_os_str().as_bytes();
    let formed = !b.is_empty()
        && b != b"."
        && !b.starts_with(b"./")
        && !b.ends_with(b"/")
        && !b.ends_with(b"/.")
        && !b.windows(2).any(|w| w == b"//")
        && !b.windows(3).any(|w| w == b"/./");
    let c = cwd.as_os_str().as_bytes();
    match b.first() {
        Some(b'/') if formed => path.to_path_buf(),
        Some(_) if formed && c.first() == Some(&b'/') => {
            let mut joined = Vec::with_capacity(c.len() + 1 + b.len());
            joined.extend_from_slice(c);
            if !c.ends_with(b"/") {
                joined.push(b'/');
            }
            joined.extend_from_slice(b);
            PathBuf::from(std::ffi::OsString::from_vec(joined))
        }
        _ => cwd.join(path).components().collect(),
    }
}

/// File system ids by device number: stable across reboots and remounts, where device
/// numbers are not (statvfs `f_fsid`; the device number where that fails).
#[derive(Default)]
pub struct FsIds(HashMap<u64, i64>);

impl FsIds {
    /// The id of device `dev`, which `path` is on.
    pub fn of(&mut self, dev: u64, path: &Path) -> i64 {
        *self
            .0
            .entry(dev)
            .or_insert_with(|| rustix::fs::statvfs(path).map_or(dev as i64, |s| s.f_fsid as i64))
    }
}

/// The key of a run's roots: their absolute paths, one per line.
pub fn roots_key(roots: &[PathBuf]) -> Vec<u8> {
    roots
        .iter()
        .map(|r| absolute(r).into_os_string().into_vec())
        .collect::<Vec<_>>()
        .join(&b'\n')
}

/// Adds the damage the database on `conn` remembers to `known`.
fn load_damage(conn: &Connection, known: &mut KnownDamage) -> rusqlite::Result<()> {
    let mut stmt = conn.prepare(
        "SELECT ino, digest, damaged_digest, damaged, fs FROM files \
         WHERE damaged IS NOT NULL AND damaged_digest IS NOT NULL",
    )?;
    let mut rows = stmt.query([])?;
    while let Some(r) = rows.next()? {
        let (tag, bad): (Vec<u8>, Vec<u8>) = (r.get(1)?, r.get(2)?);
        add_damage(known, r.get(0)?, &tag, &bad, r.get(3)?, r.get(4)?);
    }
    Ok(())
}

fn add_damage(known: &mut KnownDamage, ino: i64, tag: &[u8], bad: &[u8], found_ms: i64, fs: i64) {
    if let (Some(tag), Some(digest)) = (digest_from_key(tag), digest_from_key(bad)) {
        let found = found_ms.div_euclid(1000);
        let entry = known.entry((ino as u64, tag)).or_default();
        if !entry.iter().any(|(f, d)| *f == fs && d.digest == digest) {
            entry.push((fs, Damage { digest, found }));
        }
    }
}

/// The damage the database at `db` and its journal remember, read without writing anything
/// (`--no-state` runs, which must never bless known damage either); `None` if neither
/// exists.
pub fn known_damage_at(db: &Path) -> Option<KnownDamage> {
    let entries = journal::read(&journal::path_of(db)).unwrap_or_default();
    let conn = db
        .exists()
        .then(|| Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).ok())
        .flatten();
    if conn.is_none() && entries.is_empty() && !journal::path_of(db).exists() {
        return None;
    }
    let mut known = KnownDamage::new();
    if let Some(conn) = &conn {
        let _ = load_damage(conn, &mut known);
    }
    for e in journal::outstanding(entries) {
        add_damage(&mut known, e.ino, &e.tag, &e.damaged, e.found, e.fs);
    }
    Some(known)
}

/// A damage journal longer than this is compacted when the database opens.
const JOURNAL_COMPACT_AT: u64 = 64 << 10;

/// Brings the damage the journal at `path` remembers into the database (`insert`: a new one),
/// and keeps in the journal only what is still damage: entries whose file is still there,
/// the same inode under the same tag (repaired, accepted, edited or deleted files are not).
fn replay(conn: &Connection, path: &Path, insert: bool) -> io::Result<()> {
    let entries = journal::read(path)?;
    if entries.is_empty() {
        return Ok(());
    }
    let tag_of = |f: &std::fs::File| {
        crate::fs::xattr::read(f)
            .ok()
            .and_then(|s| s.best().map(|t| digest_key(&t.digest)))
    };
    let mut keep: Vec<journal::Entry> = Vec::new();
    for e in journal::outstanding(entries) {
        if !e.still_there(&tag_of) {
            continue;
        }
        if insert {
            let size = std::fs::symlink_metadata(&e.path).map_or(0, |m| m.len() as i64);
            conn.execute(
                "INSERT INTO files (fs, ino, digest, path, size, checked, status, damaged, \
                 damaged_digest) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?6, ?8) \
                 ON CONFLICT DO UPDATE SET damaged = coalesce(files.damaged, ?6), \
                 damaged_digest = ?8, status = ?7",
                params![
                    e.fs,
                    e.ino,
                    e.tag,
                    e.path.as_os_str().as_bytes(),
                    size,
                    e.found,
                    e.status,
                    e.damaged
                ],
            )
            .map_err(io::Error::other)?;
        }
        keep.push(e);
    }
    journal::rewrite(path, &keep)
}

/// Space a state database needs free before SQLite touches it: its shared memory (`-shm`)
/// is a sparse file that SQLite maps and writes into, and a page of it that the file system
/// cannot allocate kills the process with SIGBUS (seen on a full ext4 of 1 KiB blocks, where
/// SQLite's one byte written per 4 KiB page leaves three blocks of each unallocated). With
/// less than this free, the database is not used, and the run says so. (A log that cannot
/// grow is an error SQLite reports: it needs no room set aside here.) The shared memory is
/// not allocated ahead through a descriptor of intact's own: closing any descriptor of a
/// file drops the process's POSIX locks on it, SQLite's among them, and another process
/// then truncated the shared memory under this one's map (SIGBUS, seen with two scrubs at
/// once).
const ROOM_NEEDED: u64 = 64 << 10;

/// Fails unless the file system of the database at `path` has [`ROOM_NEEDED`] free for
/// anyone (not counting the blocks reserved for root, of which the file system keeps some
/// that not even root can have).
fn room_for_shared_memory(path: &Path) -> Result<(), StateError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let Ok(st) = rustix::fs::statvfs(dir) else {
        return Ok(());
    };
    let free = st.f_bavail.saturating_mul(st.f_frsize);
    if free < ROOM_NEEDED {
        return Err(StateError::Io(io::Error::other(format!(
            "its file system is full ({} free; it needs {} for its shared memory)",
            crate::text::bytes(free),
            crate::text::bytes(ROOM_NEEDED)
        ))));
    }
    Ok(())
}

/// `path` with `suffix` appended to its last component (`state.db` → `state.db-wal`), for
/// any path, UTF-8 or not.
fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut p = path.as_os_str().to_os_string();
    p.push(suffix);
    PathBuf::from(p)
}

/// Moves the database at `path` (and its WAL) aside, to `PATH.broken-TIME`.
fn move_aside(path: &Path) -> io::Result<PathBuf> {
    let aside = with_suffix(path, &format!(".broken-{}", now()));
    std::fs::rename(path, &aside)?;
    for suffix in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(with_suffix(path, suffix));
    }
    Ok(aside)
}

/// A damaged database moved aside and replaced by a new one.
#[derive(Debug)]
pub struct Rebuilt {
    /// Where the damaged one is now.
    pub aside: PathBuf,
    /// What SQLite said of it.
    pub why: String,
}

/// A file found damaged, as the database remembers it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Damaged {
    /// Where it was last seen.
    #[serde(serialize_with = "crate::text::escaped")]
    pub path: PathBuf,
    /// The verdict (corrupt, mismatch).
    pub status: Option<String>,
    /// When the damage was found (Unix milliseconds).
    pub found: Option<i64>,
}

/// A file the database knew that is gone from its path.
#[derive(Debug, Clone)]
pub struct Missing {
    /// Where it was last seen.
    pub path: PathBuf,
    /// The content it had (its tag's digest).
    pub digest: Digest,
    /// Its size.
    pub size: u64,
    /// Its inode then.
    pub ino: u64,
    /// When it was last verified (Unix milliseconds).
    pub verified: Option<i64>,
}

/// When a database found damaged was replaced by a new one.
#[derive(Debug, Clone)]
pub struct Lost {
    /// When (Unix milliseconds).
    pub at: i64,
    /// Where the damaged one was moved.
    pub aside: Option<PathBuf>,
}

/// The rows under `root`: the range of paths `["ROOT/", "ROOT0")`, and `ROOT` itself (a root
/// that is a file).
pub(crate) fn under(root: &Path) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    let exact = absolute(root).into_os_string().into_vec();
    let mut low = exact.clone();
    // "/" is the one root that ends in a slash.
    if low.last() != Some(&b'/') {
        low.push(b'/');
    }
    let mut high = low.clone();
    *high.last_mut().expect("not empty") = b'/' + 1;
    (low, high, exact)
}

/// Moves the damaged database at `path` aside and makes a new one there that remembers when
/// and why (`lost`): what the old one knew of damage and verification is gone, and every run
/// says so until each file has been checked again.
fn rebuild(path: &Path, why: &str) -> Result<Rebuilt, StateError> {
    let aside = move_aside(path)?;
    let fresh = State::open_at(path)?;
    fresh.conn.execute(
        "INSERT INTO lost (at, aside, why) VALUES (?1, ?2, ?3)",
        params![now(), aside.as_os_str().as_bytes(), why],
    )?;
    Ok(Rebuilt {
        aside,
        why: why.to_string(),
    })
}

/// What SQLite said, in words that say what to do where it can.
pub fn why(e: &rusqlite::Error) -> String {
    match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked) => {
            match WAITS.get() {
                Some(w) if w.cancel.load(Ordering::Relaxed) => {
                    "interrupted while waiting for another process's lock on it".into()
                }
                _ => format!(
                    "another process holds its lock, still after {} s",
                    LOCK_WAIT.as_secs()
                ),
            }
        }
        Some(rusqlite::ErrorCode::DiskFull) => format!("{e}: the disk under it is full"),
        Some(rusqlite::ErrorCode::ReadOnly | rusqlite::ErrorCode::CannotOpen) => {
            format!("{e}: it, or its directory, cannot be written")
        }
        _ => e.to_string(),
    }
}

/// Whether SQLite says the file is not a database, or a damaged one.
pub fn is_damage(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::NotADatabase | rusqlite::ErrorCode::DatabaseCorrupt)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::digest::{Algo, digest_bytes};
    use crate::core::tag::{Format, Tag};
    use crate::engine::Action;

    /// Records `files` files of `dir` as verified and archived by `state`'s run.
    fn archived(state: &mut State, dir: &Path, files: u64) {
        for i in 0..files {
            let mut r = verified(&dir.join(format!("f{i}")), i + 1);
            r.action = Some(Action::Archived);
            state.record(&r);
            // Written as they come, not kept until the archive is durable (a tree of 200,000
            // files once kept 77 MiB of rows here).
            assert!(
                state.pending.len() <= BATCH,
                "{} rows queued",
                state.pending.len()
            );
        }
        state.commit();
    }

    /// The report of a file of one byte, inode `ino`, found to match its tag.
    fn verified(path: &Path, ino: u64) -> FileReport {
        let digest = digest_bytes(Algo::Sha256, b"x");
        let mut r = FileReport::new(path.to_path_buf(), Status::Ok);
        (r.inode, r.size, r.digest) = (Some((1, ino)), Some(1), Some(digest));
        r.tag = Some(Tag {
            format: Format::Intact,
            digest,
            size: Some(1),
            mtime: None,
            mtime_slack_ns: 0,
            tagged: None,
        });
        r
    }

    fn count(state: &State, sql: &str) -> i64 {
        state.conn.query_row(sql, [], |row| row.get(0)).unwrap()
    }

    /// What status counts as archived.
    const ARCHIVED: &str = "SELECT count(*) FROM files AS f WHERE coalesce(f.archived, \
         (SELECT copied FROM runs WHERE id = f.archived_in)) IS NOT NULL";
    const VERIFIED: &str = "SELECT count(*) FROM files WHERE verified IS NOT NULL";

    fn run(path: &Path) -> State {
        let (mut state, _) = State::open(path).unwrap();
        state.begin_run("archive", &[path.to_path_buf()]);
        state
    }

    /// Rows handed to the writer are committed within about a second, whether or not more
    /// come (a run killed loses at most that second), and another writer meanwhile gets the
    /// lock within that second.
    #[test]
    fn recorded_rows_are_committed_within_a_second() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("state.db");
        let mut state = run(&db);
        state.record(&verified(&dir.path().join("f"), 1));
        state.send();
        let other = Connection::open(&db).unwrap();
        let seen = || -> i64 {
            other
                .query_row("SELECT count(*) FROM files", [], |r| r.get(0))
                .unwrap()
        };
        let start = Instant::now();
        while seen() == 0 {
            assert!(
                start.elapsed() < COMMIT_EVERY * 3,
                "not committed after {:?}",
                start.elapsed()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(seen(), 1);
        // The writer holds no lock between its transactions.
        other.busy_timeout(Duration::ZERO).unwrap();
        other
            .execute_batch("BEGIN IMMEDIATE; ROLLBACK")
            .expect("lock still held after the commit");
        drop(state);
    }

    /// A run's archived copies count once its archive is durable, and never if it failed or
    /// the run was killed; what the files were found to be stands either way, and a failed
    /// archive leaves the copy an earlier one made.
    #[test]
    fn archived_copies_count_once_their_archive_is_durable() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("state.db");
        let mut failed = run(&db);
        archived(&mut failed, dir.path(), 100);
        failed.settle(false);
        assert_eq!(failed.failed, None);
        assert_eq!(count(&failed, ARCHIVED), 0);
        assert_eq!(count(&failed, VERIFIED), 100);
        drop(failed);
        let mut durable = run(&db);
        archived(&mut durable, dir.path(), 10);
        assert_eq!(
            count(&durable, ARCHIVED),
            0,
            "claimed before the archive was durable"
        );
        durable.settle(true);
        assert_eq!(durable.failed, None);
        assert_eq!(count(&durable, ARCHIVED), 10);
        drop(durable);
        // Never settled (killed after its rows were written), then failed: the 10 keep
        // their copy.
        let mut killed = run(&db);
        archived(&mut killed, dir.path(), 20);
        drop(killed);
        let mut failed = run(&db);
        archived(&mut failed, dir.path(), 30);
        failed.settle(false);
        assert_eq!(count(&failed, ARCHIVED), 10);
    }

    /// Paths are recorded absolute, in one form, whichever way a run was given them.
    #[test]
    fn paths_are_made_absolute_and_plain() {
        let cwd = Path::new("/home/u");
        for (path, want) in [
            ("/srv/photos", "/srv/photos"),
            ("/srv/photos/", "/srv/photos"),
            ("/srv//photos/.", "/srv/photos"),
            ("/srv/./photos/../x", "/srv/photos/../x"),
            ("//srv", "/srv"),
            ("/", "/"),
            ("photos/a.jpg", "/home/u/photos/a.jpg"),
            ("./photos", "/home/u/photos"),
            ("photos//a.jpg", "/home/u/photos/a.jpg"),
            ("photos/./a.jpg", "/home/u/photos/a.jpg"),
            ("photos/", "/home/u/photos"),
            ("photos/.", "/home/u/photos"),
            ("../photos", "/home/u/../photos"),
            (".", "/home/u"),
        ] {
            let got = absolute_from(cwd, Path::new(path));
            assert_eq!(got, Path::new(want), "{path}");
            // One form, byte for byte: what `components` makes of it.
            let plain: PathBuf = got.components().collect();
            assert_eq!(got.as_os_str(), plain.as_os_str(), "{path}");
        }
        let root = Path::new("/");
        assert_eq!(
            absolute_from(root, Path::new("srv/x")).as_os_str(),
            "/srv/x"
        );
    }

    /// A database of schema 1 (archived copies applied at the end of their run) opens with
    /// what it knew, and takes this schema's records.
    #[test]
    fn a_schema_1_database_is_brought_up_to_date() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("state.db");
        let old = Connection::open(&db).unwrap();
        old.execute_batch(
            "CREATE TABLE files (fs INTEGER NOT NULL, ino INTEGER NOT NULL, \
             digest BLOB NOT NULL, path BLOB NOT NULL, size INTEGER NOT NULL, verified INTEGER, \
             checked INTEGER, status TEXT, damaged INTEGER, protected INTEGER, \
             archived INTEGER, seen INTEGER, PRIMARY KEY (fs, ino, digest)) WITHOUT ROWID;
             CREATE INDEX files_path ON files (path);
             CREATE TABLE runs (id INTEGER PRIMARY KEY, verb TEXT NOT NULL, roots BLOB NOT NULL, \
             started INTEGER NOT NULL, ended INTEGER, files INTEGER, bytes INTEGER, \
             seconds REAL, exit_code INTEGER);
             CREATE TABLE cycles (root BLOB PRIMARY KEY, started INTEGER NOT NULL);
             INSERT INTO files (fs, ino, digest, path, size, archived) \
             VALUES (1, 999, x'00', x'2f61', 1, 5);
             PRAGMA user_version = 1;",
        )
        .unwrap();
        drop(old);
        let mut state = run(&db);
        assert_eq!(state.failed, None);
        assert_eq!(count(&state, ARCHIVED), 1);
        archived(&mut state, dir.path(), 3);
        state.settle(true);
        assert_eq!(state.failed, None);
        assert_eq!(count(&state, ARCHIVED), 4);
        assert_eq!(count(&state, "PRAGMA user_version"), VERSION);
    }
}
