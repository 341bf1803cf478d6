//! The writer: recorded rows go to the database on a thread and a connection of their own,
//! committed at least every second.

use std::path::Path;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, bounded, unbounded};
use rusqlite::{CachedStatement, Connection, params};

use super::locks::wait_for_locks;
use super::rows::{Fact, Row};

/// Recorded rows are committed at least this often.
pub(super) const COMMIT_EVERY: Duration = Duration::from_secs(1);

/// What a writer that stopped (it panicked) leaves to say.
pub(super) fn writer_gone() -> rusqlite::Error {
    rusqlite::Error::SqliteFailure(
        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ERROR),
        Some("the database writer stopped".into()),
    )
}

/// Runs `f` on `conn` in a transaction of its own.
pub(super) fn transaction(
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
pub(super) struct Writer {
    pub(super) rows: Option<Sender<Batch>>,
    pub(super) results: Receiver<rusqlite::Result<()>>,
    /// Batches sent and not yet reported on.
    pub(super) in_flight: usize,
    pub(super) thread: Option<std::thread::JoinHandle<()>>,
}

impl Writer {
    pub(super) fn open(path: &Path) -> rusqlite::Result<Writer> {
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
pub(super) fn serve(
    conn: &Connection,
    batches: &Receiver<Batch>,
    said: &Sender<rusqlite::Result<()>>,
) {
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
pub(super) struct Batch {
    pub(super) rows: Vec<Row>,
    pub(super) seen: Option<i64>,
    pub(super) commit: bool,
}

/// Writes `rows` (of the run `seen`), inside the writer's transaction.
pub(super) fn write_rows(
    conn: &Connection,
    rows: &[Row],
    seen: Option<i64>,
) -> rusqlite::Result<()> {
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
