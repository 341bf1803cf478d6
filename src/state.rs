//! The state database: when each file was last proven good, what the last verdict on it was,
//! and which copies of it exist. It is a cache of schedules, never the source of truth: the
//! tags on the files are. Losing it loses only the schedule; a database that cannot be read
//! is moved aside and rebuilt, and the run verifies as it would without it.
//!
//! A file is known by (file system, inode, digest): a renamed or moved file keeps its
//! history, a replaced or re-tagged one starts afresh. The path is kept for reports only.
//! SQLite in WAL mode: other runs and `sqlite3` can read while a run writes; writes are
//! committed at least every second, so an interrupted run keeps what it recorded, and a
//! second writer waits for the first rather than failing. A file archived is recorded with
//! the run that archived it, and counts as archived once that run's archive is durable
//! (`runs.copied`): an archive that failed or was killed claims nothing.

use std::collections::HashMap;
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crossbeam_channel::{Receiver, Sender, TryRecvError, bounded, unbounded};
use rusqlite::{CachedStatement, Connection, OptionalExtension, params};

use crate::core::classify::Status;
use crate::core::digest::{Algo, Digest};
use crate::engine::{Action, FileReport};

/// The schema; `user_version` says which one a database has.
/// The schema, its tables in the schema `prefix` names (`""`, or `"state."` where the
/// database is attached); `user_version` says which one a database has.
pub(crate) fn schema(prefix: &str) -> String {
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
    damaged INTEGER,            -- when damage was found, until repaired or accepted
    protected INTEGER,          -- when parity was written for it
    archived INTEGER,           -- when it was copied into an archive (one known durable) ...
    archived_in INTEGER,        -- ... or the last run that archived it, once runs.copied says
                                -- that archive is durable
    seen INTEGER,               -- the run that last saw it
    PRIMARY KEY (fs, ino, digest)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS {s}files_path ON files (path);
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
";
const VERSION: i64 = 2;

/// Recorded rows are written at least this often ...
const COMMIT_EVERY: Duration = Duration::from_secs(1);
/// ... or once this many are waiting.
const BATCH: usize = 4096;

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
}

/// Why the database could not be used.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// SQLite said so.
    #[error("{0}")]
    Sql(#[from] rusqlite::Error),
    /// Creating its directory or moving it aside failed.
    #[error("{0}")]
    Io(#[from] io::Error),
}

impl State {
    /// Opens (creating it if need be) the database at `path`. One that is not a database or
    /// is damaged is moved aside (to `state.db.broken-TIME`) and a new one made: the returned
    /// warning says so.
    pub fn open(path: &Path) -> Result<(State, Option<String>), StateError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        match State::open_at(path) {
            Ok(state) => Ok((state, None)),
            Err(StateError::Sql(e)) if is_damage(&e) => {
                let aside = move_aside(path)?;
                let state = State::open_at(path)?;
                let warning = format!(
                    "the state database {} was unreadable ({e}); moved it to {} and started \
                     a new one (only the schedule is lost: tags are on the files)",
                    path.display(),
                    aside.display()
                );
                Ok((state, Some(warning)))
            }
            Err(e) => Err(e),
        }
    }

    fn open_at(path: &Path) -> Result<State, StateError> {
        let conn = Connection::open(path)?;
        // Another run writing: wait for it rather than fail.
        conn.busy_timeout(Duration::from_secs(600))?;
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
                path.display()
            ))));
        }
        // Reading every table proves the file is a database and its schema is whole.
        conn.execute_batch(&schema(""))?;
        conn.query_row("SELECT count(*) FROM runs", [], |_| Ok(()))?;
        if version < VERSION {
            // In one write transaction, so that two runs never both add a column.
            transaction(&conn, migrate)?;
        }
        if version != VERSION {
            conn.pragma_update(None, "user_version", VERSION)?;
        }
        let writer = Writer::open(path)?;
        Ok(State::with(conn, writer, Some(path.to_path_buf())))
    }

    fn with(conn: Connection, writer: Writer, path: Option<PathBuf>) -> State {
        State {
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

    /// Records the end of this run.
    pub fn end_run(&mut self, files: u64, bytes: u64, seconds: f64, exit_code: i32) {
        self.commit();
        let Some(id) = self.run else { return };
        let result = self.conn.execute(
            "UPDATE runs SET ended = ?2, files = ?3, bytes = ?4, seconds = ?5, \
             exit_code = ?6 WHERE id = ?1",
            params![id, now(), files as i64, bytes as i64, seconds, exit_code],
        );
        if let Err(e) = result {
            self.fail(e);
        }
    }

    /// Records what a report says of its file: a verdict (verified, damaged, modified,
    /// unreadable), a new tag, a repair, a parity set or an archived copy (which counts once
    /// [`State::settle`] says the run's archive is durable). Reports that say
    /// none of these (new, skipped files) are not recorded. Rows are written in batches, each
    /// in a short transaction: other runs never wait long for this one.
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
            _ => report.id,
        };
        let (Some((dev, ino)), Some(size)) = (id, report.size) else {
            return;
        };
        let fs = self.fsids.of(dev, &report.path);
        let row = Row {
            fact,
            fs,
            ino: ino as i64,
            key,
            path: absolute_from(&self.cwd, &report.path)
                .into_os_string()
                .into_vec(),
            size: size as i64,
            t: now(),
            status: report.status.name(),
        };
        self.pending_since.get_or_insert_with(Instant::now);
        self.pending.push(row);
    }

    /// Writes the queued rows and waits until every row recorded so far is written.
    pub fn commit(&mut self) {
        self.send();
        self.collect(true);
    }

    /// Hands the queued rows to the writer, without waiting for them to be written.
    pub fn send(&mut self) {
        self.pending_since = None;
        if self.pending.is_empty() || self.failed.is_some() {
            self.pending.clear();
            return;
        }
        let rows = std::mem::take(&mut self.pending);
        self.hand((rows, self.run));
        self.collect(false);
    }

    /// Gives the writer a batch; a writer gone stops the recording.
    fn hand(&mut self, batch: Batch) {
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

    /// Moves a damaged database aside, so that the next run starts a new one; says so.
    pub fn quarantine(self) -> Option<String> {
        let path = self.path.clone()?;
        drop(self);
        Some(match move_aside(&path) {
            Ok(aside) => format!(
                "the state database {} is damaged; moved it to {} (a new one takes its place; \
                 only the schedule is lost)",
                path.display(),
                aside.display()
            ),
            Err(e) => format!(
                "the state database {} is damaged, and could not be moved aside ({e}): remove it",
                path.display()
            ),
        })
    }

    fn fail(&mut self, e: rusqlite::Error) {
        self.broken |= is_damage(&e);
        self.pending.clear();
        self.failed.get_or_insert_with(|| {
            let place = self
                .path
                .as_ref()
                .map_or("in memory".into(), |p| p.display().to_string());
            format!("the state database {place} could not be written ({e}); nothing more is recorded this run")
        });
    }

    /// The file system id of device `dev` (`path` is on it): stable across reboots and
    /// remounts, where device numbers are not.
    /// The files this run saw that were never proven good, and the oldest verification
    /// among those that were.
    pub fn seen_summary(&self) -> Option<(u64, Option<i64>)> {
        let run = self.run?;
        self.conn
            .query_row(
                "SELECT count(*) FILTER (WHERE verified IS NULL), min(verified) \
                 FROM files WHERE seen = ?1",
                [run],
                |r| Ok((r.get::<_, i64>(0)? as u64, r.get(1)?)),
            )
            .optional()
            .ok()
            .flatten()
    }

    /// Bytes per second read by the recent complete runs of `verb` (the last ten), if any.
    pub fn throughput(&self, verb: &str) -> Option<f64> {
        self.conn
            .query_row(
                "SELECT sum(bytes), sum(seconds) FROM (SELECT bytes, seconds FROM runs \
                 WHERE verb = ?1 AND ended IS NOT NULL AND bytes > 0 ORDER BY id DESC LIMIT 10)",
                [verb],
                |r| Ok((r.get::<_, Option<i64>>(0)?, r.get::<_, Option<f64>>(1)?)),
            )
            .ok()
            .and_then(|(b, s)| match (b, s) {
                (Some(b), Some(s)) if s > 0.0 => Some(b as f64 / s),
                _ => None,
            })
    }
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
/// recorded an archived copy only at the end of its run.
fn migrate(conn: &Connection) -> rusqlite::Result<()> {
    for (table, column) in [("files", "archived_in"), ("runs", "copied")] {
        let has: i64 = conn.query_row(
            "SELECT count(*) FROM pragma_table_info(?1) WHERE name = ?2",
            [table, column],
            |r| r.get(0),
        )?;
        if has == 0 {
            conn.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column} INTEGER"))?;
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
struct Writer {
    rows: Option<Sender<Batch>>,
    results: Receiver<rusqlite::Result<()>>,
    /// Batches sent and not yet reported on.
    in_flight: usize,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Writer {
    fn open(path: &Path) -> rusqlite::Result<Writer> {
        let conn = Connection::open(path)?;
        conn.busy_timeout(Duration::from_secs(600))?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        let (rows, batches) = bounded::<Batch>(2);
        let (said, results) = unbounded();
        let thread = std::thread::Builder::new()
            .name("intact-state".into())
            .spawn(move || {
                for (rows, seen) in batches {
                    let _ = said.send(write_rows(&conn, &rows, seen));
                }
            })
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

/// Rows for the writer to write, of the run `.1`.
type Batch = (Vec<Row>, Option<i64>);

/// Writes `rows` (of the run `seen`) in one short transaction.
fn write_rows(conn: &Connection, rows: &[Row], seen: Option<i64>) -> rusqlite::Result<()> {
    transaction(conn, |conn| {
        // Each fact's statements, prepared once a batch: looking them up by their text for
        // every row cost a fifth of the writer's time.
        let mut prepared: [Option<[CachedStatement; 2]>; Fact::ALL] = Default::default();
        for row in rows {
            let [update, upsert] = match &mut prepared[row.fact as usize] {
                Some(statements) => statements,
                slot => {
                    let [update, upsert] = row.fact.statements();
                    slot.insert([conn.prepare_cached(update)?, conn.prepare_cached(upsert)?])
                }
            };
            let all = params![
                row.fs, row.ino, row.key, row.path, row.size, seen, row.t, row.status
            ];
            // An archived copy's time is its run's (see `State::settle`).
            let n =
                6 + usize::from(row.fact != Fact::Archived) + usize::from(row.fact.has_status());
            if update.execute(&all[..n])? == 0 {
                upsert.execute(&all[..n])?;
            }
        }
        Ok(())
    })
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
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fact {
    /// The data matched its tag.
    Verified,
    /// The data no longer matches an unchanged tag.
    Damaged,
    /// A verdict that is neither (modified, older, conflict, unreadable, changed while
    /// read), or a new tag: the file was looked at this cycle, but is not proven good.
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
    /// (the run)[, time (but for `Archived`)][, status].
    fn statements(self) -> [&'static str; 2] {
        // The columns a new row sets beyond the key, path, size and seen; their values; and
        // what an existing row gets.
        macro_rules! sql {
            ($cols:literal, $values:literal, $set:expr) => {
                [
                    concat!(
                        "UPDATE files SET size = ?5, seen = ?6, ",
                        $set,
                        " WHERE fs = ?1 AND ino = ?2 AND digest = ?3 AND path = ?4"
                    ),
                    concat!(
                        "INSERT INTO files (fs, ino, digest, path, size, seen, ",
                        $cols,
                        ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ",
                        $values,
                        ") ON CONFLICT DO UPDATE SET path = ?4, size = ?5, seen = ?6, ",
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
                "verified = ?7, checked = ?7, status = ?8, damaged = NULL"
            ),
            Fact::Damaged => sql!(
                "checked, status, damaged",
                "?7, ?8, ?7",
                "checked = ?7, status = ?8, damaged = coalesce(files.damaged, ?7)"
            ),
            Fact::Judged => sql!("checked, status", "?7, ?8", "checked = ?7, status = ?8"),
            Fact::Repaired => sql!(
                "verified, checked, status",
                "?7, ?7, 'repaired'",
                "verified = ?7, checked = ?7, status = 'repaired', damaged = NULL"
            ),
            Fact::Protected => sql!("protected", "?7", "protected = ?7"),
            Fact::Archived => sql!("archived_in", "?6", archived!()),
            Fact::VerifiedArchived => sql!(
                "verified, checked, status, archived_in",
                "?7, ?7, ?8, ?6",
                concat!(
                    "verified = ?7, checked = ?7, status = ?8, damaged = NULL, ",
                    archived!()
                )
            ),
        }
    }

    fn has_status(self) -> bool {
        matches!(
            self,
            Fact::Verified | Fact::Damaged | Fact::Judged | Fact::VerifiedArchived
        )
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
        // A new tag describes the data just read, but proves nothing yet: the file has not
        // been verified since it was tagged.
        (Some(Action::Tagged), _) => r.digest.map(|d| (Fact::Judged, d)),
        // The data matched the tag (only the mtime moved, and was refreshed).
        (Some(Action::Refreshed), _) => r.digest.map(|d| (Fact::Verified, d)),
        (Some(Action::Repaired), _) => tagged.map(|d| (Fact::Repaired, d)),
        // Read, and it matched (touched: under another mtime).
        (_, Status::Ok | Status::Touched) if r.digest.is_some() => {
            tagged.map(|d| (Fact::Verified, d))
        }
        (_, s) if s.is_damage() => tagged.map(|d| (Fact::Damaged, d)),
        (
            _,
            Status::Modified | Status::Older | Status::Conflict | Status::Error | Status::Changed,
        ) => tagged.map(|d| (Fact::Judged, d)),
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
    // The walk's paths (under an absolute root) are most often already in the form that
    // `components` gives: building them again was most of recording a file.
    let b = path.as_os_str().as_bytes();
    let formed = b.len() > 1
        && b[0] == b'/'
        && !b.ends_with(b"/")
        && !b.ends_with(b"/.")
        && !b.windows(2).any(|w| w == b"//")
        && !b.windows(3).any(|w| w == b"/./");
    if formed {
        return path.to_path_buf();
    }
    cwd.join(path).components().collect()
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

/// Moves the database at `path` (and its WAL) aside, to `PATH.broken-TIME`.
fn move_aside(path: &Path) -> io::Result<PathBuf> {
    let aside = PathBuf::from(format!("{}.broken-{}", path.display(), now()));
    std::fs::rename(path, &aside)?;
    for suffix in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    Ok(aside)
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
        let digest = digest_bytes(Algo::Sha256, b"x");
        for i in 0..files {
            let mut r = FileReport::new(dir.join(format!("f{i}")), Status::Ok);
            r.id = Some((1, i + 1));
            r.size = Some(1);
            r.digest = Some(digest);
            r.action = Some(Action::Archived);
            r.tag = Some(Tag {
                format: Format::Intact,
                digest,
                size: Some(1),
                mtime: None,
                mtime_slack_ns: 0,
                tagged: None,
            });
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
            (".", "/home/u"),
        ] {
            assert_eq!(
                absolute_from(cwd, Path::new(path)),
                Path::new(want),
                "{path}"
            );
        }
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
