//! The writer: recorded rows go to the database on a thread and a connection of their own,
//! committed at least every second.

use std::path::Path;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, bounded, unbounded};
use rusqlite::Connection;

use super::dirs::Open;
use super::rows::Row;

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
    /// Starts the writer on `path`. It opens its connection on its own thread, beside the
    /// rest of the run's start (reading the schema again took a tenth of the time before a
    /// check's first file was read); a connection it cannot open is said in answer to the
    /// first batch, as a failed write would be.
    pub(super) fn open(path: &Path) -> Writer {
        // SQLite's default cache (2 MiB): a second's pages that outgrow it spill to the WAL
        // early, which measured no slower (20,000 files of 4 KiB, first and later checks);
        // 8 MiB filled up on large trees and made a nightly scrub's peak grow with the tree
        // (15 MiB at 50,000 files, 27 at 1,000,000).
        let (rows, batches) = bounded::<Batch>(2);
        let (said, results) = unbounded();
        let path = path.to_path_buf();
        let thread = std::thread::Builder::new()
            .name("intact-state".into())
            .spawn(move || match super::connect(&path) {
                Ok(conn) => serve(&conn, &batches, &said),
                Err(e) => {
                    if batches.recv().is_ok() {
                        let _ = said.send(Err(e));
                    }
                }
            })
            .expect("spawning the state writer");
        Writer {
            rows: Some(rows),
            results,
            in_flight: 0,
            thread: Some(thread),
        }
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
    // The directories being changed, written back before each commit.
    let mut open = Open::default();
    let mut checkpointed = false;
    let end = |open: &mut Open, conn: &Connection| {
        let done = open.flush(conn).and_then(|()| conn.execute_batch("COMMIT"));
        done.inspect_err(|_| {
            open.forget();
            let _ = conn.execute_batch("ROLLBACK");
        })
    };
    loop {
        let next = match began {
            Some(t) => batches.recv_deadline(t + COMMIT_EVERY),
            None => batches.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        let mut batch = match next {
            Ok(batch) => batch,
            Err(RecvTimeoutError::Timeout) => {
                began = None;
                failed = failed.or(end(&mut open, conn).err());
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => {
                if began.is_some() {
                    let _ = end(&mut open, conn);
                }
                return;
            }
        };
        let mut result = failed.take().map_or(Ok(()), Err);
        // The first transaction after the checkpoint is committed at once: it starts the WAL
        // again from its head, and SQLite syncs the WAL's new header with it (1 ms on this
        // VM's disk, more on a spinning one), here while files are hashed rather than at the
        // run's last commit, which the run waits for.
        let mut restart = false;
        if result.is_ok() && !batch.rows.is_empty() {
            if !checkpointed {
                restart = true;
                // What the last run left in the WAL (see [`super::connect`]) goes into the
                // database now, so that this run's writes start it again from its head. A
                // checkpoint that fails or cannot finish loses nothing: the next run tries.
                let _ = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()));
                checkpointed = true;
            }
            if began.is_none() {
                result = conn.execute_batch("BEGIN IMMEDIATE");
                began = result.is_ok().then(Instant::now);
            }
            result =
                result.and_then(|()| open.write(conn, std::mem::take(&mut batch.rows), batch.seen));
        }
        let due = batch.commit || restart || began.is_some_and(|t| t.elapsed() >= COMMIT_EVERY);
        if result.is_err() && began.is_some() {
            let _ = conn.execute_batch("ROLLBACK");
            open.forget();
            began = None;
        } else if due && began.take().is_some() {
            result = end(&mut open, conn);
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
