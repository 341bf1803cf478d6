//! The state database: when each file was last proven good, what the last verdict on it was,
//! and which copies of it exist. It is a cache of schedules, never the source of truth: the
//! tags on the files are. Losing it loses only the schedule; a database that cannot be read
//! is moved aside and rebuilt, and the run verifies as it would without it.
//!
//! A file is filed under its directory and name: a directory's files are one value, their
//! entries packed ([`entries`]), read and written once per directory a run records, and a
//! directory whose files were all proven good, unchanged, is one small row (`proven`). An
//! entry keeps the file's file system, inode and digest: a file moved keeps its history (a
//! scrub finds it where it went), a replaced or re-tagged one starts afresh. Damage not dealt
//! with and files gone are tables of their own. SQLite in WAL mode: other runs and `sqlite3` can read while a run writes; writes are
//! committed at least every second, so an interrupted run keeps what it recorded, and a
//! second writer waits for the first ([`LOCK_WAIT`] at most, giving up at once when the run
//! is interrupted) rather than failing. A file archived is recorded with the run that archived
//! it, and counts as archived once that run's archive is durable (`runs.copied`): an archive
//! that failed or was killed claims nothing.
//!
//! Damage is remembered with the digest of the damaged bytes, so that the same bytes found
//! again under a moved mtime stay damage ([`crate::core::classify::since_damage`]); a
//! database found damaged and rebuilt says so (`lost`) until every file has been checked
//! again. It stays bounded: a file re-tagged or replaced leaves no entry of its old content,
//! files gone are forgotten after 30 days, and only the latest runs are kept.

use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crossbeam_channel::TryRecvError;

use entries::bytes;
use rusqlite::{Connection, OpenFlags, OptionalExtension, params};

mod damage;
mod dirs;
pub mod entries;
pub mod index;
pub mod journal;
mod layout;
mod locks;
mod lookup;
pub(crate) mod pages;
mod paths;
mod recover;
mod roots;
mod rows;
mod schema;
pub(crate) mod sqlite;
mod writer;
mod written;

use damage::{JOURNAL_COMPACT_AT, load_damage, replay};
pub use damage::{known_damage_at, unmounted_damage_at};
pub(crate) use layout::lay_out;
pub(crate) use locks::wait_for_locks;
pub use locks::{LOCK_WAIT, on_lock_waits};
pub use lookup::{Found, Lookup};
pub(crate) use pages::{copied, entry_at, forget, settle_moved};
use paths::absolute_owned;
pub(crate) use paths::under;
pub use paths::{FsIds, absolute, roots_key};
pub(crate) use paths::{absolute_from, unmounted};
pub use recover::{Rebuilt, is_damage, why};
use recover::{rebuild, room_for_shared_memory};
use rows::{Fact, Row, facts};
pub use rows::{digest_from_key, digest_key};
pub(crate) use schema::schema;
use schema::{INDEXES, VERSION, migrate, tables};
use writer::{Batch, COMMIT_EVERY, Writer, transaction, writer_gone};

use crate::core::digest::Digest;
use crate::engine::{FileReport, KnownDamage};

/// Bytes of WAL left on disk once it starts again (a nightly check of 20,000 files writes
/// about 130 KB there).
const WAL_KEPT: i64 = 1 << 20;

/// Runs kept in `runs` (older ones are forgotten, their archived copies kept on the files).
const RUNS_KEPT: i64 = 1000;

/// Recorded rows are handed to the writer once this many are waiting, or when a second
/// ([`COMMIT_EVERY`]) has passed. Batches are handed over, not committed: the writer
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

/// The (device, inode) of the file at `path` as it is now (not following a symlink), as
/// reports carry them: names of one file are told apart from files.
pub fn inode_of(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .ok()
        .filter(|m| m.is_file())
        .map(|m| (m.dev(), m.ino()))
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
    /// When the first of them was recorded (ms, as [`now`]).
    pending_since: Option<i64>,
    /// This run's row in `runs`.
    run: Option<i64>,
    /// What went wrong to say: the database's first error (recording stops there), or else
    /// a damage journal or index that could not be written (the database still records).
    pub failed: Option<String>,
    /// Recording stopped: the database could not be written.
    stopped: bool,
    /// SQLite found the database damaged: it should be moved aside.
    pub broken: bool,
    /// The damage journal beside the database (none in memory), and what is to be written
    /// there with the next batch.
    journal: Option<PathBuf>,
    journal_pending: Vec<journal::Entry>,
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

/// A connection to the database at `path` that waits for another run's lock rather than
/// fail, and leaves the WAL as it is when it closes: checkpointing it there (the default)
/// cost every run two `fsync`s and removing the WAL at its end, and re-creating it (an `fsync`
/// of the file and of its directory) at the start of the next, all while the run waited
/// (1-4 ms a run on this VM's disk, more on a spinning one). The writer copies what the last
/// run left into the database before it first writes ([`writer::serve`]), while files are
/// hashed, so the WAL holds about one run's writes; started again, the file is cut back to
/// [`WAL_KEPT`] (it would otherwise stay as large as the largest run made it: the first
/// check of a tree writes the whole database there).
fn connect(path: &Path) -> rusqlite::Result<Connection> {
    let mut conn = sqlite::open(path, OpenFlags::default())?;
    wait_for_locks(&mut conn)?;
    leave_the_wal(&conn)?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "journal_size_limit", WAL_KEPT)?;
    Ok(conn)
}

/// Leaves the WAL of the databases `conn` has open (attached ones too) as it is when it
/// closes, as [`connect`] does: the last connection to close would checkpoint it otherwise.
pub(crate) fn leave_the_wal(conn: &Connection) -> rusqlite::Result<()> {
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
        true,
    )
    .map(drop)
}

/// Makes sure the database at `path` and the files beside it hold no one else's reading: it
/// names the files of every tree it knows, other users' private folders among them. Its
/// folder (made `0700`) must be the running user's and writable by no one else (see
/// [`Owned`](crate::fs::owned::Owned)), so that no one can put a symlink where the database,
/// its WAL or its damage journal will be written; the database is made `0600` before SQLite
/// first opens it (SQLite gives the WAL and shared memory the database's mode), and those of
/// an earlier build (`0644`) become `0600`.
///
/// The files that exist are looked at and changed by name beneath the held folder, never
/// opened: closing any descriptor of a file drops every POSIX lock the process holds on it,
/// SQLite's own among them (a watch opens the database again for each run while its first
/// connection lives; another process's connection then took itself for the last one and
/// deleted the WAL the watch went on writing, its rows lost).
fn private(path: &Path) -> io::Result<()> {
    use rustix::fs::{AtFlags, FileType, Mode, OFlags};
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(io::Error::other(format!(
            "{}: not a file's path",
            crate::text::escape(path)
        )));
    };
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let folder = crate::fs::owned::Owned::open(dir, Some(0o700)).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("the state folder {}: {e}", crate::text::escape(dir)),
        )
    })?;
    let me = rustix::process::geteuid().as_raw();
    let beside = [
        PathBuf::from(name),
        recover::with_suffix(Path::new(name), "-wal"),
        recover::with_suffix(Path::new(name), "-shm"),
        journal::path_of(Path::new(name)),
    ];
    for (i, file) in beside.iter().enumerate() {
        let shown = crate::text::escape(&dir.join(file));
        let st = match rustix::fs::statat(folder.fd(), file, AtFlags::SYMLINK_NOFOLLOW) {
            Err(rustix::io::Errno::NOENT) if i == 0 => {
                // Not there: no connection of this process can hold it, so a descriptor
                // made and closed here drops no lock.
                let create = OFlags::WRONLY
                    | OFlags::CREATE
                    | OFlags::EXCL
                    | OFlags::NOFOLLOW
                    | OFlags::CLOEXEC;
                match rustix::fs::openat(folder.fd(), file, create, Mode::from_raw_mode(0o600)) {
                    // Another run made it meanwhile: looked at as any other.
                    Ok(_) | Err(rustix::io::Errno::EXIST) => {}
                    Err(e) => {
                        return Err(io::Error::new(
                            io::Error::from(e).kind(),
                            format!("{shown}: {e}"),
                        ));
                    }
                }
                rustix::fs::statat(folder.fd(), file, AtFlags::SYMLINK_NOFOLLOW)?
            }
            Err(rustix::io::Errno::NOENT) => continue,
            st => {
                st.map_err(|e| io::Error::new(io::Error::from(e).kind(), format!("{shown}: {e}")))?
            }
        };
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile || st.st_uid != me {
            return Err(io::Error::other(format!(
                "{shown} is not a regular file of the user running intact (intact follows no \
                 symlink there): refused"
            )));
        }
        if st.st_mode & 0o077 != 0 {
            // By name, and it follows a symlink: none can be put there since the look above,
            // in a folder no one else can write.
            rustix::fs::chmodat(
                folder.fd(),
                file,
                Mode::from_raw_mode(st.st_mode & 0o700),
                AtFlags::empty(),
            )?;
        }
    }
    Ok(())
}

impl State {
    /// Opens (creating it if need be) the database at `path`. One that is not a database or
    /// is damaged is moved aside (to `state.db.broken-TIME`) and a new one made, which
    /// remembers that ([`State::history_lost`]); the returned note says so.
    pub fn open(path: &Path) -> Result<(State, Option<Rebuilt>), StateError> {
        private(path)?;
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
        let conn = connect(path)?;
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
        // Schema 4 as first built had no prints of proven directories, nor archives marked
        // there (never released). Asked again in the write transaction that adds them:
        // another run may have added them meanwhile.
        const ADDED: [(&str, &str); 3] = [
            ("print", "BLOB"),
            ("archived_in", "INTEGER"),
            ("archived", "INTEGER"),
        ];
        let has = |conn: &Connection, column: &str| {
            conn.query_row(
                "SELECT count(*) FROM pragma_table_info('proven') WHERE name = ?1",
                [column],
                |r| r.get::<_, i64>(0).map(|n| n > 0),
            )
        };
        if !has(&conn, ADDED[ADDED.len() - 1].0)? {
            transaction(&conn, |conn| {
                for (column, kind) in ADDED {
                    if !has(conn, column)? {
                        conn.execute_batch(&format!(
                            "ALTER TABLE proven ADD COLUMN {column} {kind}"
                        ))?;
                    }
                }
                Ok(())
            })?;
        }
        if version < VERSION {
            // In one write transaction, so that two runs never both add a column.
            transaction(&conn, migrate)?;
            // Schema 3's rows are gone: their pages given back (a database of 20,000 files
            // from 6.6 to 2.4 MiB). Once, and only room: failing (a full disk) loses nothing.
            if version > 0 && version < 5 {
                let _ = conn.execute_batch("VACUUM");
            }
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
        let writer = Writer::open(path);
        Ok(State::with(conn, writer, Some(path.to_path_buf())))
    }

    fn with(conn: Connection, writer: Writer, path: Option<PathBuf>) -> State {
        State {
            journal: path.as_deref().map(journal::path_of),
            journal_pending: Vec::new(),
            conn,
            writer,
            path,
            fsids: FsIds::default(),
            cwd: std::env::current_dir().unwrap_or_default(),
            pending: Vec::new(),
            pending_since: None,
            run: None,
            failed: None,
            stopped: false,
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
                    let copied: std::collections::HashMap<i64, Option<i64>> = conn
                        .prepare("SELECT id, copied FROM runs WHERE id <= ?1")?
                        .query_map([old], |r| Ok((r.get(0)?, r.get(1)?)))?
                        .collect::<rusqlite::Result<_>>()?;
                    pages::rewrite_all(conn, |e| match e.archived_in {
                        Some(run) if run <= old => {
                            e.archived = copied.get(&run).copied().flatten().or(e.archived);
                            e.archived_in = None;
                            true
                        }
                        _ => false,
                    })?;
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
        index::read_into(&mut known);
        known
    }

    /// Damage this database knows under `roots` that this run did not see: files found
    /// damaged before, neither repaired, accepted nor edited since, and still there (the same
    /// inode under the path last seen), or on a file system that is not mounted now. A run
    /// that is not told of them would say nothing of damage that is still there.
    pub fn outstanding(&mut self, roots: &[PathBuf]) -> Vec<Damaged> {
        self.commit();
        let mut found = Vec::new();
        let run = self.run;
        let rows = self.under_roots(
            // Damage is a few rows: read whole, each file's entry looked up.
            "SELECT fs, ino, digest, path, status, found FROM damage \
             WHERE ((path >= ?1 AND path < ?2) OR path = ?4) AND ?3 = ?3 ORDER BY path",
            roots,
            |r| {
                let path: Vec<u8> = r.get(3)?;
                Ok(Some((
                    (
                        r.get::<_, i64>(0)?,
                        r.get::<_, i64>(1)?,
                        r.get::<_, Vec<u8>>(2)?,
                    ),
                    Damaged {
                        path: PathBuf::from(std::ffi::OsString::from_vec(path)),
                        status: r.get(4)?,
                        found: r.get(5)?,
                    },
                )))
            },
        );
        match rows {
            Ok(rows) => {
                // In path order: a page of entries read once for the damage in it.
                let mut entries = pages::Lookups::new(&self.conn, "");
                for ((fs, ino, key), damaged) in rows {
                    // Seen by this run: it said what it found.
                    let seen = entries.at(bytes(&damaged.path)).is_ok_and(|e| {
                        e.is_some_and(|e| {
                            (e.fs, e.ino, &e.key) == (fs, ino, &key)
                                && e.seen.is_some()
                                && e.seen == run
                        })
                    });
                    // There, or on a file system not mounted now (its damage cannot be known
                    // to be dealt with: it stays said).
                    let there = match crate::fs::sys::lstat(&damaged.path) {
                        Ok(m) => {
                            m.ino() as i64 == ino && self.fsids.of(m.dev(), &damaged.path) == fs
                        }
                        Err(_) => unmounted(&damaged.path, fs).is_some(),
                    };
                    let twice = found
                        .last()
                        .is_some_and(|d: &Damaged| d.path == damaged.path);
                    if there && !seen && !twice {
                        found.push(damaged);
                    }
                }
            }
            Err(e) => self.fail(e),
        }
        found
    }

    /// Of `paths` (absolute, in order), which this run judged: it said what it found.
    pub fn judged_now(&mut self, paths: &[PathBuf]) -> Vec<bool> {
        self.commit();
        let run = self.run;
        let mut entries = pages::Lookups::new(&self.conn, "");
        paths
            .iter()
            .map(|p| {
                entries
                    .at(bytes(p))
                    .is_ok_and(|e| e.is_some_and(|e| e.seen.is_some() && e.seen == run))
            })
            .collect()
    }

    /// Lays out what the database knows under `roots` as the temporary table `files`, a row
    /// a file (schema 3's), for the queries that read many files at once.
    fn lay_out(&self, roots: &[PathBuf]) -> rusqlite::Result<u64> {
        lay_out(&self.conn, "", ("temp", "files"), roots)
    }

    /// What `sql` selects under each of `roots` (its parameters: the range of paths under a
    /// root, ?1 to ?2, this run, ?3, and the root itself, ?4), each row made a value by `row`.
    fn under_roots<T>(
        &self,
        sql: &str,
        roots: &[PathBuf],
        mut row: impl FnMut(&rusqlite::Row) -> rusqlite::Result<Option<T>>,
    ) -> rusqlite::Result<Vec<T>> {
        let run = self.run.unwrap_or(0);
        let mut stmt = self.conn.prepare_cached(sql)?;
        let mut all = Vec::new();
        for root in roots {
            let (low, high, exact) = under(root);
            let mut rows = stmt.query(params![low, high, run, exact])?;
            while let Some(r) = rows.next()? {
                all.extend(row(r)?);
            }
        }
        Ok(all)
    }

    /// The files this database knows under `roots` that this run did not see and whose path
    /// holds nothing now: deleted (or moved out of the trees), with the content they had.
    pub fn missing(&mut self, roots: &[PathBuf]) -> Vec<Missing> {
        self.commit();
        let mut found: Vec<Missing> = Vec::new();
        let rows = self.lay_out(roots).and_then(|_| {
            self.under_roots(
                "SELECT ino, digest, path, size, verified, gone IS NOT NULL, fs, owner FROM files \
             WHERE coalesce(seen, 0) != ?3 AND length(digest) > 1 AND dup IS NULL \
             AND NOT EXISTS (SELECT 1 \
             FROM files o WHERE o.fs = files.fs AND o.ino = files.ino AND o.was = files.digest) \
             AND ((path >= ?1 AND path < ?2) OR path = ?4) ORDER BY path",
                roots,
                |r| {
                    let (key, path): (Vec<u8>, Vec<u8>) = (r.get(1)?, r.get(2)?);
                    let (ino, size, verified): (i64, i64, Option<i64>) =
                        (r.get(0)?, r.get(3)?, r.get(4)?);
                    let (recorded, fs): (bool, i64) = (r.get(5)?, r.get(6)?);
                    let owner: Option<Vec<u8>> = r.get(7)?;
                    Ok(digest_from_key(&key).map(|digest| Missing {
                        fs,
                        path: PathBuf::from(std::ffi::OsString::from_vec(path)),
                        digest,
                        size: size as u64,
                        ino: ino as u64,
                        verified,
                        recorded,
                        owner: owner.and_then(|o| crate::engine::Owner::from_bytes(&o)),
                    }))
                },
            )
        });
        match rows {
            Ok(rows) => {
                for m in rows {
                    let gone = matches!(
                        crate::fs::sys::lstat(&m.path),
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

    /// Records `files` (found gone by a run that saw their whole tree, and not many at once)
    /// as a scrub records files gone: their entries go, and they are kept as files gone for
    /// [`crate::scrub::GONE_KEPT`] (`repair --missing` brings them back).
    pub fn record_gone(&mut self, files: &[Missing]) {
        if files.is_empty() || self.stopped {
            return;
        }
        self.commit();
        let t = now();
        let result = transaction(&self.conn, |conn| {
            for m in files.iter().filter(|m| !m.recorded) {
                let key = digest_key(&m.digest);
                let path = bytes(&m.path);
                let owner = forget(conn, "", path, (m.fs, m.ino as i64, &key))?
                    .and_then(|e| e.owner)
                    .or(m.owner);
                conn.execute(
                    "INSERT OR REPLACE INTO gone (path, fs, ino, digest, size, verified, at, \
                     owner) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                    params![
                        path,
                        m.fs,
                        m.ino as i64,
                        key,
                        m.size as i64,
                        m.verified,
                        t,
                        owner.map(|o| o.to_bytes().to_vec())
                    ],
                )?;
                conn.execute(
                    "DELETE FROM damage WHERE fs = ?1 AND ino = ?2 AND digest = ?3",
                    params![m.fs, m.ino as i64, key],
                )?;
            }
            Ok(())
        });
        if let Err(e) = result {
            self.fail(e);
        }
    }

    /// The damaged files under `roots` (the index of the root each is under, and its path
    /// there), where this database can say: it knows files under every root, each has a
    /// verdict, and some are damaged (none with other names). Else `None`, and the trees are
    /// walked: a repair asked for where no damage is known is looking for damage. Damage no run has found yet is
    /// not among them: the owner's `repair --full` reads every file.
    pub fn known_damage_under(&mut self, roots: &[PathBuf]) -> Option<Vec<(usize, PathBuf)>> {
        self.commit();
        if let Err(e) = self.lay_out(roots) {
            self.fail(e);
            return None;
        }
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
        let linked = |d: &Damaged| crate::fs::sys::lstat(&d.path).is_ok_and(|m| m.nlink() > 1);
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
    ///
    /// It takes the report: its path becomes the row's, not copied (a copy a file was a
    /// seventh of the reporting thread's work on small files).
    pub fn record(&mut self, mut report: FileReport) {
        // One reading of the clock a file: its rows' time, and whether they are due.
        let t = now();
        let mut path = Some(absolute_owned(&self.cwd, std::mem::take(&mut report.path)));
        let mut facts = facts(&report).peekable();
        while let Some((fact, digest)) = facts.next() {
            let path = match facts.peek() {
                Some(_) => path.clone(),
                None => path.take(),
            };
            self.add(
                &report,
                path.unwrap_or_default(),
                fact,
                digest.as_ref().map_or_else(Vec::new, digest_key),
                t,
            );
        }
        self.send_when_due(t);
    }

    /// Hands the queued rows to the writer once there are enough of them, or they have
    /// waited long enough by the time `t` (or the clock went back).
    fn send_when_due(&mut self, t: i64) {
        let waited = |since: i64| !(0..COMMIT_EVERY.as_millis() as i64).contains(&(t - since));
        if self.pending.len() >= BATCH || self.pending_since.is_some_and(waited) {
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
        if self.stopped {
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

    /// Queues the row for `fact` about the file of `report`, at `path` (absolute).
    fn add(&mut self, report: &FileReport, path: PathBuf, fact: Fact, key: Vec<u8>, t: i64) {
        if self.stopped {
            return;
        }
        // A repaired file is a new inode under the old name, of its good size (the report's
        // is the damaged file's: a truncated file's size, recorded, had `--missing` seek
        // only copies of that size, which held none good).
        let (id, size) = match fact {
            Fact::Repaired => crate::fs::sys::lstat(&path)
                .ok()
                .map(|m| ((m.dev(), m.ino()), m.len()))
                .unzip(),
            // Damage keeps the size of the content its tag names (what a repair seeks), not
            // the damaged file's.
            Fact::Damaged => (
                report.inode,
                report.tag.as_ref().and_then(|t| t.size).or(report.size),
            ),
            _ => (report.inode, report.size),
        };
        let (Some((dev, ino)), Some(size)) = (id, size) else {
            return;
        };
        let fs = self.fsids.of(dev, &path);
        let damage = match (fact, report.digest) {
            (Fact::Damaged, Some(d)) => {
                // Found before, these same bytes: since then.
                let known = report.known_damage.filter(|k| k.digest == d);
                let found = known.map_or(t, |k| k.found.saturating_mul(1000));
                if known.is_none() {
                    self.journal_pending.push(journal::Entry {
                        found,
                        fs,
                        ino: ino as i64,
                        tag: key.clone(),
                        damaged: digest_key(&d),
                        status: report.status.name().into(),
                        path: path.clone(),
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
                    self.journal_pending.push(journal::Entry::ended(
                        t,
                        fs,
                        old_ino as i64,
                        digest_key(&tag.digest),
                        path.clone(),
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
            path: path.into_os_string().into_vec(),
            size: size as i64,
            t,
            status: report.status.name(),
            damage,
            old_ino: report.inode.map(|(_, ino)| ino as i64),
            was,
            owner: report.owner,
        };
        self.pending_since.get_or_insert(t);
        // A batch's room at once: grown row by row, it was copied ten times over.
        if self.pending.capacity() == 0 {
            self.pending.reserve_exact(BATCH);
        }
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
        self.journal();
        if self.stopped {
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

    /// Writes the damage found (or ended) since the last batch into the journal, durably,
    /// before the database is given the rows that say it; failing that, the run says so.
    fn journal(&mut self) {
        let entries = std::mem::take(&mut self.journal_pending);
        if entries.is_empty() {
            return;
        }
        // Root's damage is the machine's: every run reads the index, whatever its database.
        if let Some(index) = index::kept()
            && let Err(e) = index::append(&index, &entries)
        {
            self.failed.get_or_insert_with(|| {
                format!(
                    "the machine's damage index {} could not be written ({e}): runs on other \
                     databases do not know the damage found now",
                    crate::text::escape(&index)
                )
            });
        }
        let Some(path) = &self.journal else { return };
        if let Err(e) = journal::append(path, &entries) {
            let lost = if entries.iter().all(journal::Entry::is_end) {
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
        if std::mem::replace(&mut self.stopped, true) {
            return;
        }
        // The database's failure is the one to say (a journal's said before is the lesser).
        let place = self
            .path
            .as_deref()
            .map_or("in memory".into(), crate::text::escape);
        self.failed = Some(format!(
            "the state database {place} could not be written ({}); nothing more was recorded \
             this run, so the next run knows nothing of what this one found",
            why(&e)
        ));
    }

    /// The files this run saw that were never proven good, and the oldest verification
    /// among those that were (damaged ones left out: they have their own count).
    pub fn seen_summary(&mut self, roots: &[PathBuf]) -> Option<(u64, Option<i64>)> {
        let run = self.run?;
        self.commit();
        self.lay_out(roots).ok()?;
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

    /// The last run of `verb` over a tree that holds every one of `roots` (absolute), among
    /// the runs the database keeps: what `zpool status` says first.
    pub fn last_run(&self, verb: &str, roots: &[PathBuf]) -> Option<LastRun> {
        let wanted: Vec<PathBuf> = roots.iter().map(|r| absolute(r)).collect();
        let mut stmt = self
            .conn
            .prepare(
                "SELECT roots, started, ended, files, bytes, seconds, exit_code FROM runs \
                 WHERE verb = ?1 ORDER BY id DESC",
            )
            .ok()?;
        let mut rows = stmt.query([verb]).ok()?;
        while let Ok(Some(r)) = rows.next() {
            let key: Vec<u8> = r.get(0).ok()?;
            // A run whose every root was dropped (gone, or no longer the tree) ran over none.
            let ran: Vec<&Path> = key
                .split(|&b| b == b'\n')
                .filter(|p| !p.is_empty())
                .map(|p| Path::new(std::ffi::OsStr::from_bytes(p)))
                .collect();
            if !ran.is_empty() && wanted.iter().all(|w| ran.iter().any(|r| w.starts_with(r))) {
                return Some(LastRun {
                    started: r.get(1).ok()?,
                    ended: r.get(2).ok()?,
                    files: r.get::<_, Option<i64>>(3).ok()?.map(|n| n as u64),
                    bytes: r.get::<_, Option<i64>>(4).ok()?.map(|n| n as u64),
                    seconds: r.get(5).ok()?,
                    exit_code: r.get(6).ok()?,
                });
            }
        }
        None
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

/// A run as the database recorded it (a run killed before its end has no end).
#[derive(Debug, Clone, Copy)]
pub struct LastRun {
    /// When it started (Unix milliseconds).
    pub started: i64,
    /// When it ended, if it did.
    pub ended: Option<i64>,
    /// Files it saw.
    pub files: Option<u64>,
    /// Bytes of data it read.
    pub bytes: Option<u64>,
    /// How long it ran.
    pub seconds: Option<f64>,
    /// Its exit code.
    pub exit_code: Option<i32>,
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
    /// Its file system then.
    pub fs: i64,
    /// Its inode then.
    pub ino: u64,
    /// When it was last verified (Unix milliseconds).
    pub verified: Option<i64>,
    /// Whether a scrub recorded it gone (a deletion told, or confirmed); else the database
    /// still has it where it was (a deletion since the last scrub, or many files gone at
    /// once, not yet taken for deleted).
    pub recorded: bool,
    /// Its owner, group and mode, where the database knew them.
    pub owner: Option<crate::engine::Owner>,
}

/// When a database found damaged was replaced by a new one.
#[derive(Debug, Clone)]
pub struct Lost {
    /// When (Unix milliseconds).
    pub at: i64,
    /// Where the damaged one was moved.
    pub aside: Option<PathBuf>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::classify::Status;
    use crate::core::digest::{Algo, digest_bytes};
    use crate::core::tag::{Format, Tag};
    use crate::engine::Action;

    /// Records `files` files of `dir` as verified and archived by `state`'s run.
    fn archived(state: &mut State, dir: &Path, files: u64) {
        for i in 0..files {
            let mut r = verified(&dir.join(format!("f{i}")), i + 1);
            r.copy = Some(Action::Archived);
            state.record(r);
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

    /// What `sql` counts of the files the database knows (laid out as schema 3's rows).
    fn count(state: &State, sql: &str) -> i64 {
        state.lay_out(&[PathBuf::from("/")]).unwrap();
        state.conn.query_row(sql, [], |row| row.get(0)).unwrap()
    }

    /// The packed entries the database holds for the directory `dir`.
    fn dir_value(state: &State, dir: &Path) -> Vec<u8> {
        let dir = dir.as_os_str().as_encoded_bytes();
        state
            .conn
            .query_row("SELECT entries FROM dirs WHERE path = ?1", [dir], |r| {
                r.get(0)
            })
            .unwrap()
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
        state.record(verified(&dir.path().join("f"), 1));
        state.send();
        let other = Connection::open(&db).unwrap();
        let seen = || -> i64 {
            other
                .query_row("SELECT count(*) FROM dirs", [], |r| r.get(0))
                .unwrap()
        };
        let start = std::time::Instant::now();
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

    /// Opening the database again in a process whose connection lives (a watch, once a run)
    /// keeps that connection's locks: closing any descriptor of a file drops all of the
    /// process's POSIX locks on it, and another process's connection then took itself for
    /// the last, deleting the WAL the first went on writing.
    #[cfg(target_os = "linux")]
    #[test]
    fn opening_again_keeps_the_locks_of_a_connection_that_lives() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("state.db");
        let (first, _) = State::open(&db).unwrap();
        let shm = std::fs::metadata(recover::with_suffix(&db, "-shm")).unwrap();
        let held = || {
            let me = std::process::id().to_string();
            let inode = format!(":{}", shm.ino());
            std::fs::read_to_string("/proc/locks")
                .unwrap()
                .lines()
                .filter(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    f.len() > 5 && f[1] == "POSIX" && f[4] == me && f[5].ends_with(&inode)
                })
                .count()
        };
        let before = held();
        assert!(
            before > 0,
            "a live connection holds its shared memory's lock"
        );
        for _ in 0..2 {
            drop(State::open(&db).unwrap());
            assert_eq!(held(), before, "the first connection's locks");
        }
        drop(first);
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
            // The record's way, which keeps a path already in that form.
            let owned = absolute_owned(cwd, PathBuf::from(path));
            assert_eq!(owned.as_os_str(), got.as_os_str(), "{path}");
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

    /// A run that finds every file of a directory as its entries say writes one small row
    /// for the directory (`proven`), not its entries, and their verification follows from
    /// it; a directory where anything changed has its entries written (with what the row
    /// said), and the row goes.
    #[test]
    fn a_directory_proven_good_is_one_small_row() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("state.db");
        let files = dir.path().join("photos");
        let record = |n: u64| {
            let (mut state, _) = State::open(&db).unwrap();
            state.begin_run("check", std::slice::from_ref(&files));
            for i in 0..n {
                state.record(verified(&files.join(format!("f{i}")), i + 1));
            }
            state.commit();
            state
        };
        let value = |state: &State| dir_value(state, &files);
        let seen = |state: &State| {
            let run = state.run.unwrap();
            count(
                state,
                &format!("SELECT count(*) FROM files WHERE seen = {run}"),
            )
        };
        let first = record(3);
        let before = value(&first);
        assert_eq!(seen(&first), 3);
        drop(first);
        let again = record(3);
        assert_eq!(value(&again), before, "the entries were rewritten");
        assert_eq!(count(&again, "SELECT count(*) FROM proven"), 1);
        assert_eq!(seen(&again), 3, "proven by the second run");
        drop(again);
        // Again: now known by its print, the directory's value is not even read.
        let third = record(3);
        assert_eq!(value(&third), before);
        assert_eq!(seen(&third), 3, "proven by the third run");
        // A print stored by another hash (an earlier build's): it does not match, and the
        // run proves the entries themselves and stores its own print.
        let print = |state: &State| -> Vec<u8> {
            state
                .conn
                .query_row("SELECT print FROM proven", [], |r| r.get(0))
                .unwrap()
        };
        let good = print(&third);
        third
            .conn
            .execute("UPDATE proven SET print = ?1", [vec![7u8; 24]])
            .unwrap();
        drop(third);
        let fourth = record(3);
        assert_eq!(value(&fourth), before);
        assert_eq!(seen(&fourth), 3, "proven by a run that met another print");
        assert_eq!(print(&fourth), good, "its own print stored");
        drop(fourth);
        // A file of another size under the same tag: the print tells, the entries are read
        // and written with what changed.
        let (mut state, _) = State::open(&db).unwrap();
        state.begin_run("check", std::slice::from_ref(&files));
        for i in 0..3 {
            let mut r = verified(&files.join(format!("f{i}")), i + 1);
            if i == 1 {
                r.size = Some(2);
            }
            state.record(r);
        }
        state.commit();
        assert_ne!(value(&state), before);
        assert_eq!(
            count(&state, "SELECT count(*) FROM files WHERE size = 2"),
            1
        );
        assert_eq!(seen(&state), 3);
        drop(state);
        let more = record(4);
        assert_ne!(value(&more), before);
        assert_eq!(count(&more, "SELECT count(*) FROM proven"), 0);
        assert_eq!(seen(&more), 4);
    }

    /// An archive of every file of a directory, unchanged, marks the directory's row in
    /// `proven` instead of rewriting each entry; each file's copies are what entries
    /// written one by one would say: a copy counts once its archive is durable, a failed or
    /// killed archive leaves the copy before it, a check after keeps them, and an edit
    /// writes them into the entries. A database whose `proven` lacks the mark's columns
    /// gains them.
    #[test]
    fn an_archive_of_a_whole_directory_is_a_mark() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("state.db");
        let files = dir.path().join("photos");
        let value = |state: &State| dir_value(state, &files);
        let marked = "SELECT count(*) FROM proven WHERE archived_in IS NOT NULL";
        // The files whose latest durable copy is the archive of the run `n`-th of all.
        let copy_of = |state: &State, n: u32| {
            count(
                state,
                &format!(
                    "SELECT count(*) FROM files AS f WHERE coalesce((SELECT copied FROM runs \
                     WHERE id = f.archived_in), f.archived) = \
                     (SELECT copied FROM runs ORDER BY id LIMIT 1 OFFSET {})",
                    n - 1
                ),
            )
        };
        let archive = |durable: Option<bool>| {
            let (mut state, _) = State::open(&db).unwrap();
            state.begin_run("archive", std::slice::from_ref(&files));
            archived(&mut state, &files, 10);
            if let Some(durable) = durable {
                state.settle(durable);
            }
            state
        };
        // The first writes the entries; the second finds them all and makes the mark.
        let first = archive(Some(true));
        assert_eq!(copy_of(&first, 1), 10);
        let before = value(&first);
        drop(first);
        let second = archive(Some(true));
        assert_eq!(value(&second), before, "the entries were rewritten");
        assert_eq!(count(&second, marked), 1);
        assert_eq!(copy_of(&second, 2), 10);
        drop(second);
        // Failed, then killed: the mark moves on, the copy stays the second's.
        for durable in [Some(false), None] {
            let failed = archive(durable);
            assert_eq!(value(&failed), before);
            assert_eq!(count(&failed, marked), 1);
            assert_eq!(copy_of(&failed, 2), 10, "durable: {durable:?}");
            assert_eq!(count(&failed, ARCHIVED), 10);
        }
        let fifth = archive(Some(true));
        assert_eq!(copy_of(&fifth, 5), 10);
        drop(fifth);
        // A check keeps the mark.
        let (mut check, _) = State::open(&db).unwrap();
        check.begin_run("check", std::slice::from_ref(&files));
        for i in 0..10 {
            check.record(verified(&files.join(format!("f{i}")), i + 1));
        }
        check.commit();
        assert_eq!(value(&check), before);
        assert_eq!(count(&check, marked), 1);
        assert_eq!(copy_of(&check, 5), 10);
        drop(check);
        // An edit (another inode): the entries are written, the mark goes into them.
        let (mut edit, _) = State::open(&db).unwrap();
        edit.begin_run("check", std::slice::from_ref(&files));
        edit.record(verified(&files.join("f0"), 99));
        edit.commit();
        assert_ne!(value(&edit), before);
        assert_eq!(count(&edit, "SELECT count(*) FROM proven"), 0);
        assert_eq!(copy_of(&edit, 5), 9);
        assert_eq!(count(&edit, ARCHIVED), 9);
        // A database of schema 4 as first built: the columns are added on opening.
        edit.conn
            .execute_batch(
                "ALTER TABLE proven DROP COLUMN archived; \
                 ALTER TABLE proven DROP COLUMN archived_in; ALTER TABLE proven DROP COLUMN print",
            )
            .unwrap();
        drop(edit);
        let again = archive(Some(true));
        assert_eq!(count(&again, ARCHIVED), 10);
        let again = archive(Some(true));
        assert_eq!(count(&again, marked), 1);
        assert_eq!(count(&again, ARCHIVED), 10);
    }

    /// Damage found is written to the journal a batch at a time, one write and one sync for
    /// the batch, before the writer is given the batch's rows (one sync a damaged file made
    /// a scrub of 5,000 damaged files ten times as slow as one of the healthy tree).
    #[test]
    fn damage_is_journalled_a_batch_at_a_time_before_the_database_has_it() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("state.db");
        let (mut state, _) = State::open(&db).unwrap();
        state.begin_run("scrub", &[dir.path().to_path_buf()]);
        let journal = journal::path_of(&db);
        let n = 500;
        for i in 0..n {
            let mut r = verified(&dir.path().join(format!("f{i:04}")), i + 1);
            r.status = Status::Corrupt;
            r.digest = Some(digest_bytes(Algo::Sha256, b"y"));
            state.record(r);
        }
        assert!(
            journal::read(&journal).unwrap().is_empty(),
            "journalled before its batch went"
        );
        assert_eq!(count(&state, "SELECT count(*) FROM damage"), 0);
        state.send();
        assert_eq!(journal::read(&journal).unwrap().len(), n as usize);
        state.commit();
        assert_eq!(count(&state, "SELECT count(*) FROM damage"), n as i64);
    }

    /// A folder of many files is written in pages as its files come (a page at a time held,
    /// not the folder), and a run that proves them all good writes one small row a page.
    #[test]
    fn a_large_folder_is_recorded_in_pages() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("state.db");
        let files = dir.path().join("big");
        let n = 3 * pages::MAX as u64 + 5;
        let record = || {
            let (mut state, _) = State::open(&db).unwrap();
            state.begin_run("check", std::slice::from_ref(&files));
            for i in 0..n {
                state.record(verified(&files.join(format!("f{i:06}")), i + 1));
            }
            state.commit();
            state
        };
        let first = record();
        let dir_bytes = entries::bytes(&files);
        let keys = pages::keys(&first.conn, "", dir_bytes).unwrap();
        assert!(keys.len() >= 3, "{} pages", keys.len());
        let value_bytes: Vec<i64> = first
            .conn
            .prepare("SELECT length(entries) FROM dirs")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert!(
            value_bytes
                .iter()
                .all(|b| *b < (pages::MAX as i64 + 1) * 200),
            "{value_bytes:?}"
        );
        assert_eq!(count(&first, VERIFIED), n as i64);
        let pages = |state: &State| -> Vec<Vec<u8>> {
            state
                .conn
                .prepare("SELECT entries FROM dirs ORDER BY first")
                .unwrap()
                .query_map([], |r| r.get(0))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap()
        };
        let before = pages(&first);
        drop(first);
        let again = record();
        assert_eq!(
            count(&again, "SELECT count(*) FROM proven"),
            keys.len() as i64,
            "a proof a page"
        );
        assert_eq!(before, pages(&again), "pages rewritten");
        let run = again.run.unwrap();
        let seen = format!("SELECT count(*) FROM files WHERE seen = {run}");
        assert_eq!(count(&again, &seen), n as i64);
    }

    /// A database of schema 5 is taken up as it is: its entries read as knowing no owner, its
    /// files gone keep their rows and gain the column, and nothing is rewritten.
    #[test]
    fn a_schema_5_database_learns_owners_from_the_next_run() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("state.db");
        let old = Connection::open(&db).unwrap();
        old.execute_batch(&tables("")).unwrap();
        old.execute_batch(
            "ALTER TABLE gone DROP COLUMN owner;
             INSERT INTO gone (path, fs, ino, digest, size, at) VALUES \
             (CAST('/t/gone' AS BLOB), 1, 9, x'00', 10, 5000);",
        )
        .unwrap();
        let five = entries::Entry {
            name: b"kept".to_vec(),
            fs: 1,
            ino: 3,
            status: "ok".into(),
            ..Default::default()
        };
        pages::store_all(&old, "", b"/t", std::slice::from_ref(&five)).unwrap();
        old.execute_batch("PRAGMA user_version = 5;").unwrap();
        drop(old);
        let (state, rebuilt) = State::open(&db).unwrap();
        assert!(rebuilt.is_none());
        assert_eq!(count(&state, "PRAGMA user_version"), VERSION);
        assert_eq!(
            count(&state, "SELECT count(*) FROM gone WHERE owner IS NULL"),
            1
        );
        assert_eq!(pages::load_all(&state.conn, "", b"/t").unwrap(), vec![five]);
    }

    /// A database of schema 4 (one value a directory) is cut into pages: every entry still
    /// there, with what its directory's row in `proven` said (verified, archived) applied.
    #[test]
    fn a_schema_4_database_is_cut_into_pages() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("state.db");
        let old = Connection::open(&db).unwrap();
        old.execute_batch(
            "CREATE TABLE dirs (path BLOB PRIMARY KEY, entries BLOB NOT NULL);
             CREATE TABLE proven (path BLOB PRIMARY KEY, run INTEGER, at INTEGER NOT NULL, \
             print BLOB, archived_in INTEGER, archived INTEGER) WITHOUT ROWID;",
        )
        .unwrap();
        old.execute_batch(&tables("")).unwrap();
        let n = pages::MAX + 10;
        let entries: Vec<entries::Entry> = (0..n)
            .map(|i| entries::Entry {
                name: format!("f{i:05}").into_bytes(),
                fs: 1,
                ino: i as i64,
                checked: Some(1000),
                verified: Some(1000),
                status: "ok".into(),
                ..Default::default()
            })
            .collect();
        old.execute(
            "INSERT INTO dirs (path, entries) VALUES (CAST('/t/big' AS BLOB), ?1)",
            [entries::encode(&entries)],
        )
        .unwrap();
        old.execute_batch(
            "INSERT INTO proven (path, run, at, archived_in) VALUES (CAST('/t/big' AS BLOB), \
             3, 5000, 7); PRAGMA user_version = 4;",
        )
        .unwrap();
        drop(old);
        let (state, rebuilt) = State::open(&db).unwrap();
        assert!(rebuilt.is_none());
        assert_eq!(count(&state, "PRAGMA user_version"), VERSION);
        let keys = pages::keys(&state.conn, "", b"/t/big").unwrap();
        assert_eq!(keys.len(), n.div_ceil(pages::PAGE));
        let all = pages::load_all(&state.conn, "", b"/t/big").unwrap();
        assert_eq!(all.len(), n);
        assert!(
            all.iter()
                .all(|e| e.verified == Some(5000) && e.archived_in == Some(7)),
            "{:?}",
            all[0]
        );
        assert_eq!(
            count(
                &state,
                "SELECT count(*) FROM sqlite_master WHERE name LIKE '%4'"
            ),
            0,
            "schema 4's tables are left"
        );
    }

    /// A database of schema 3 (a row a file) is brought to schema 4 in one step: what it
    /// knew of verification, damage, files gone and archived copies is all still known, and
    /// its runs and cycles stay.
    #[test]
    fn a_schema_3_database_is_brought_up_to_date() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("state.db");
        let old = Connection::open(&db).unwrap();
        // Digests of 32 bytes after their algorithm's.
        let (z, o) = ("00".repeat(32), "ab".repeat(32));
        old.execute_batch(&format!(
            "CREATE TABLE files (fs INTEGER NOT NULL, ino INTEGER NOT NULL, \
             digest BLOB NOT NULL, path BLOB NOT NULL, size INTEGER NOT NULL, verified INTEGER, \
             checked INTEGER, status TEXT, damaged INTEGER, protected INTEGER, \
             archived INTEGER, archived_in INTEGER, seen INTEGER, damaged_digest BLOB, \
             gone INTEGER, PRIMARY KEY (fs, ino, digest)) WITHOUT ROWID;
             CREATE INDEX files_path ON files (path);
             CREATE INDEX files_damaged ON files (damaged) WHERE damaged IS NOT NULL;
             CREATE INDEX files_gone ON files (gone) WHERE gone IS NOT NULL;
             CREATE TABLE runs (id INTEGER PRIMARY KEY, verb TEXT NOT NULL, roots BLOB NOT NULL, \
             started INTEGER NOT NULL, ended INTEGER, files INTEGER, bytes INTEGER, \
             seconds REAL, exit_code INTEGER, copied INTEGER);
             CREATE TABLE cycles (root BLOB PRIMARY KEY, started INTEGER NOT NULL);
             INSERT INTO runs (id, verb, roots, started, copied) VALUES (1, 'archive', x'2f74', 1, 1500);
             INSERT INTO cycles VALUES (x'2f74', 700);
             INSERT INTO files (fs, ino, digest, path, size, verified, checked, status, seen, \
             archived_in, protected) VALUES (1, 10, x'00{z}', CAST('/t/a/ok.jpg' AS BLOB), \
             5, 1000, 1000, 'ok', 1, 1, 1200);
             INSERT INTO files (fs, ino, digest, path, size, verified, checked, status, damaged, \
             damaged_digest) VALUES (1, 11, x'01{z}', CAST('/t/a/bad.jpg' AS BLOB), \
             6, 500, 2000, 'corrupt', 2000, x'01{o}');
             INSERT INTO files (fs, ino, digest, path, size, verified, checked, status, gone) \
             VALUES (1, 12, x'00{o}', CAST('/t/b/gone.jpg' AS BLOB), 7, 900, 900, \
             'ok', 3000);
             PRAGMA user_version = 3;"
        ))
        .unwrap();
        drop(old);
        let (mut state, rebuilt) = State::open(&db).unwrap();
        assert!(rebuilt.is_none());
        assert_eq!(count(&state, "PRAGMA user_version"), VERSION);
        assert_eq!(
            count(
                &state,
                "SELECT count(*) FROM sqlite_master WHERE name LIKE 'files%'"
            ),
            0,
            "schema 3's table is left"
        );
        assert_eq!(count(&state, "SELECT count(*) FROM cycles"), 1);
        // Verified, archived (its archive durable), protected: as it was.
        assert_eq!(
            count(
                &state,
                "SELECT count(*) FROM files WHERE path = CAST('/t/a/ok.jpg' AS BLOB) \
                 AND verified = 1000 AND seen = 1 AND protected = 1200 AND archived_in = 1"
            ),
            1
        );
        assert_eq!(count(&state, ARCHIVED), 1);
        // The damage, with the digest of the damaged bytes, for the engine to know again.
        let known = state.known_damage();
        let damaged: Vec<_> = known.iter().filter(|((ino, _), _)| *ino == 11).collect();
        assert_eq!(damaged.len(), 1, "{known:?}");
        assert_eq!(damaged[0].1[0].1.found, 2);
        assert_eq!(
            count(
                &state,
                "SELECT count(*) FROM files WHERE damaged = 2000 AND status = 'corrupt'"
            ),
            1
        );
        // The file gone, kept with when it was found gone.
        assert_eq!(
            count(
                &state,
                "SELECT count(*) FROM gone WHERE path = CAST('/t/b/gone.jpg' AS BLOB) \
                 AND at = 3000 AND verified = 900 AND size = 7"
            ),
            1
        );
        // And it takes this schema's records.
        archived(&mut state, Path::new("/t/a"), 2);
        assert_eq!(state.failed, None);
        drop(state);
        let (state, _) = State::open(&db).unwrap();
        assert_eq!(
            count(
                &state,
                "SELECT count(*) FROM files WHERE verified IS NOT NULL AND gone IS NULL"
            ),
            4
        );
    }
}
