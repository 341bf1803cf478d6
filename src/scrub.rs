//! Planning scrubs and overviews: which files are due, least recently verified first.
//!
//! A plan walks the trees reading tags and metadata only (no file data), puts one row per
//! regular file in a temporary SQLite table, and lets SQLite join it with the state database
//! and sort it: on disk, not in memory, so a tree of ten million files plans in the memory of
//! a tree of ten. The scrub then streams the sorted queue, a page at a time, into the engine.
//!
//! A cycle is the time it takes to look at every tagged file once: verify it, or find it
//! damaged, edited or unreadable (each a verdict, recorded as `checked`). The plan remembers
//! when the current cycle of its roots began; files checked since are done for this cycle, and
//! the queue puts every file not yet done first, so repeated budgeted scrubs check each file
//! once before any file twice, and a file that fails every time cannot hold the cycle up.
//! Under `--update`, an untagged file that could not be tagged is done for the cycle too.

use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, params};

use crate::core::classify::Status;
use crate::engine::{self, Config, FileReport, Progress, Work};
use crate::fs::walk::Entry;
use crate::state::{self, digest_key};

/// What a scrub may verify.
#[derive(Clone, Copy, Debug, Default)]
pub struct Budget {
    /// Bytes of data at most (a file larger than the whole budget is verified alone when
    /// its turn comes, so that no file is skipped for ever).
    pub max_bytes: Option<u64>,
    /// A share (0 to 100) of the bytes tagged under the roots.
    pub max_percent: Option<f64>,
    /// Only files not verified for this many milliseconds.
    pub older_than: Option<i64>,
    /// A time limit applies (kept by the engine's deadline).
    pub timed: bool,
}

impl Budget {
    /// Whether any limit is set (a time limit counts: `max_time`).
    pub fn is_set(&self) -> bool {
        self.max_bytes.is_some() || self.max_percent.is_some() || self.timed
    }
}

/// A planned walk: the files under the roots in a temporary table, joined with the state.
pub struct Plan {
    conn: Arc<Mutex<Connection>>,
    /// The roots' key for their cycle: their absolute paths.
    cycle_key: Vec<u8>,
    /// Tagged files and their bytes.
    pub tagged: (u64, u64),
    /// Untagged regular files and their bytes.
    pub untagged: (u64, u64),
    /// When the roots' current cycle began (Unix milliseconds).
    pub cycle_started: i64,
    /// Tagged files (and bytes) checked since the cycle began, before this run.
    pub cycle_done: (u64, u64),
    /// Whether the walk saw every file (not interrupted, no directory unreadable).
    pub complete: bool,
    attached: bool,
    /// Why the queue ended early, if it failed.
    failed: Arc<Mutex<Option<String>>>,
    /// The latest verification of a file in the plan.
    latest: Option<i64>,
    /// Plan rows the state database knows.
    known: u64,
}

/// Walks `roots` (by `config.walk`, reading no data) into a plan: a private database on
/// disk that the state database is then attached to ([`Plan::attach`]). Reports that no plan
/// row stands for (skipped and unreadable paths, and untagged files unless `untagged_too`) go
/// to `other` as the walk finds them.
pub fn plan(
    config: &Config,
    roots: &[PathBuf],
    untagged_too: bool,
    cancel: &AtomicBool,
    mut other: impl FnMut(FileReport),
) -> rusqlite::Result<Plan> {
    // "": a private temporary database, on disk.
    let conn = Connection::open("")?;
    conn.busy_timeout(std::time::Duration::from_secs(600))?;
    // A throwaway: no journal, no syncs; SQLite's default cache (2 MiB), then its file
    // (temporary tables too), never memory only.
    conn.execute_batch(
        "PRAGMA temp_store = FILE; PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF;",
    )?;
    conn.execute_batch(
        "CREATE TABLE plan (
            seq INTEGER PRIMARY KEY,
            fs INTEGER, ino INTEGER,
            digest BLOB NOT NULL,   -- the state's key; empty for an untagged file
            tagged INTEGER NOT NULL,
            path BLOB NOT NULL,     -- as walked
            size INTEGER NOT NULL,
            root INTEGER NOT NULL
        );",
    )?;
    let show = Config {
        work: Work::Show,
        ..config.clone()
    };
    let mut fsids = state::FsIds::default();
    let mut failed = None;
    let tx = conn.unchecked_transaction()?;
    let mut complete = true;
    let walked = {
        let mut insert = tx.prepare(
            "INSERT INTO plan (fs, ino, digest, tagged, path, size, root) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )?;
        engine::run(&show, roots, cancel, &Progress::default(), |report| {
            let row = match (&report.tag, report.id, report.size, report.status) {
                (_, _, _, Status::Skipped | Status::Error) => None,
                (Some(tag), Some(id), Some(size), _) => Some((Some(tag.digest), id, size)),
                (None, Some(id), Some(size), _) if untagged_too => Some((None, id, size)),
                _ => None,
            };
            if report.status == Status::Error {
                complete = false;
            }
            let Some((digest, (dev, ino), size)) = row else {
                other(report);
                return;
            };
            let fs = fsids.of(dev, &report.path);
            let inserted = insert.execute(params![
                fs,
                ino as i64,
                digest.as_ref().map(digest_key).unwrap_or_default(),
                digest.is_some(),
                report.path.as_os_str().as_bytes(),
                size as i64,
                report.root as i64
            ]);
            if let Err(e) = inserted {
                failed.get_or_insert(e);
            }
        })
    };
    if let Some(e) = failed {
        return Err(e);
    }
    complete &= walked.is_ok() && !cancel.load(std::sync::atomic::Ordering::Relaxed);
    tx.commit()?;
    let count = |sql: &str| -> rusqlite::Result<(u64, u64)> {
        conn.query_row(sql, [], |r| {
            Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64))
        })
    };
    let tagged = count("SELECT count(*), coalesce(sum(size), 0) FROM plan WHERE tagged")?;
    let untagged = count("SELECT count(*), coalesce(sum(size), 0) FROM plan WHERE NOT tagged")?;
    Ok(Plan {
        conn: Arc::new(Mutex::new(conn)),
        cycle_key: state::roots_key(roots),
        tagged,
        untagged,
        cycle_started: 0,
        cycle_done: (0, 0),
        complete,
        attached: false,
        failed: Arc::default(),
        latest: None,
        known: 0,
    })
}

/// The join of a plan row with its state row.
const JOIN: &str =
    "plan p LEFT JOIN state.files f ON f.fs = p.fs AND f.ino = p.ino AND f.digest = p.digest";

impl Plan {
    /// Attaches the state database at `db` (one in memory if `None`: every file then counts
    /// as never verified), instead of any attached before, and reads the roots' cycle.
    pub fn attach(&mut self, db: Option<&Path>) -> rusqlite::Result<()> {
        {
            let conn = self.conn();
            if self.attached {
                conn.execute_batch("DETACH DATABASE state")?;
            }
            let name = match db {
                None => ":memory:",
                Some(p) => p
                    .to_str()
                    .ok_or_else(|| rusqlite::Error::InvalidPath(p.to_path_buf()))?,
            };
            conn.execute("ATTACH DATABASE ?1 AS state", [name])?;
            if db.is_none() {
                conn.execute_batch(&state::schema("state."))?;
            }
        }
        self.attached = true;
        self.load_cycle()
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads the roots' cycle: when it began, and what was verified since.
    fn load_cycle(&mut self) -> rusqlite::Result<()> {
        let conn = self.conn();
        let started: Option<i64> = conn
            .query_row(
                "SELECT started FROM state.cycles WHERE root = ?1",
                [&self.cycle_key],
                |r| r.get(0),
            )
            .or_else(|e| match e {
                rusqlite::Error::QueryReturnedNoRows => Ok(None),
                e => Err(e),
            })?;
        let started = started.unwrap_or(0);
        // One pass: what this cycle has done, the latest verification, the rows known.
        let (done, size, latest, known): (i64, i64, Option<i64>, i64) = conn.query_row(
            &format!(
                "SELECT count(*) FILTER (WHERE f.checked >= ?1), \
                 coalesce(sum(p.size) FILTER (WHERE f.checked >= ?1), 0), \
                 max(f.checked), count(f.fs) FROM {JOIN} WHERE p.tagged"
            ),
            [started],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )?;
        drop(conn);
        self.cycle_started = started;
        self.cycle_done = (done as u64, size as u64);
        self.latest = latest;
        self.known = known as u64;
        Ok(())
    }

    /// Starts a new cycle if none is open or the last one is complete: when a scrub begins.
    /// It begins after every verification recorded so far.
    pub fn start_cycle(&mut self, now: i64) -> rusqlite::Result<()> {
        if self.cycle_started > 0 && self.cycle_done.0 < self.tagged.0 {
            return Ok(());
        }
        let now = now.max(self.latest.map_or(0, |l| l + 1));
        self.conn().execute(
            "INSERT INTO state.cycles (root, started) VALUES (?1, ?2) \
             ON CONFLICT DO UPDATE SET started = excluded.started",
            params![self.cycle_key, now],
        )?;
        self.cycle_started = now;
        self.cycle_done = (0, 0);
        Ok(())
    }

    /// After a complete walk: forgets the state of files under the roots that are gone (or
    /// were replaced, or re-tagged).
    pub fn forget_the_gone(&self, roots: &[PathBuf]) -> rusqlite::Result<u64> {
        if !self.complete {
            return Ok(0);
        }
        let conn = self.conn();
        let mut gone = 0;
        // Everything whose path starts with "ROOT/": the range ["ROOT/", "ROOT0").
        let ranges: Vec<(Vec<u8>, Vec<u8>)> = roots
            .iter()
            .map(|root| {
                let mut low = state::absolute(root).into_os_string().into_vec();
                // "/" is the one root that ends in a slash.
                if low.last() != Some(&b'/') {
                    low.push(b'/');
                }
                let mut high = low.clone();
                *high.last_mut().expect("not empty") = b'/' + 1;
                (low, high)
            })
            .collect();
        // Only rows the walk did not meet can be gone: none if the trees hold no more rows
        // than it met (a count on the path index, cheaper than the delete's lookups).
        let mut rows = 0;
        for (low, high) in &ranges {
            rows += conn.query_row(
                "SELECT count(*) FROM state.files WHERE path >= ?1 AND path < ?2",
                params![low, high],
                |r| r.get::<_, i64>(0),
            )? as u64;
        }
        if rows <= self.known {
            return Ok(0);
        }
        // Forgetting looks each state row up among the plan's: by an index built only now
        // that it is needed (cheaper than kept up while inserting, and most runs need none).
        conn.execute_batch("CREATE INDEX IF NOT EXISTS plan_key ON plan (fs, ino, digest)")?;
        for (low, high) in &ranges {
            gone += conn.execute(
                "DELETE FROM state.files WHERE path >= ?1 AND path < ?2 AND NOT EXISTS \
                 (SELECT 1 FROM plan p WHERE p.fs = files.fs AND p.ino = files.ino \
                  AND p.digest = files.digest)",
                params![low, high],
            )? as u64;
        }
        Ok(gone)
    }

    /// The queue of a scrub: tagged files (and untagged ones if `untagged_too`), not yet
    /// verified in this cycle first, then least recently verified first, walk order among
    /// equals; within `budget` of bytes. A budgeted scrub ends with its cycle (the next one
    /// begins a new cycle); one without a budget verifies every file. Returns the entries (streamed from the database in
    /// pages) and the bytes they hold at most.
    pub fn queue(
        &self,
        budget: Budget,
        untagged_too: bool,
        now: i64,
    ) -> rusqlite::Result<(Queue, u64)> {
        let conn = self.conn();
        let older = budget.older_than.map(|s| now - s);
        conn.execute_batch(
            "DROP TABLE IF EXISTS queue;
             CREATE TABLE queue (id INTEGER PRIMARY KEY, path BLOB, size INTEGER, root INTEGER);",
        )?;
        conn.execute(
            &format!(
                "INSERT INTO queue (path, size, root) SELECT p.path, p.size, p.root FROM {JOIN} \
                 WHERE (p.tagged OR ?1) AND (?2 IS NULL OR f.verified IS NULL OR f.verified < ?2) \
                 AND NOT (?4 AND coalesce(f.checked >= ?3, 0)) \
                 ORDER BY coalesce(f.checked >= ?3, 0), f.verified IS NOT NULL, f.verified, p.seq"
            ),
            params![untagged_too, older, self.cycle_started, budget.is_set()],
        )?;
        let queued: i64 =
            conn.query_row("SELECT coalesce(sum(size), 0) FROM queue", [], |r| r.get(0))?;
        let percent = budget
            .max_percent
            .map(|p| (self.tagged.1 as f64 * p / 100.0) as u64);
        let limit = match (budget.max_bytes, percent) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let bytes = limit.map_or(queued as u64, |l| l.min(queued as u64));
        let queue = Queue {
            conn: self.conn.clone(),
            failed: self.failed.clone(),
            page: Vec::new().into_iter(),
            last: 0,
            limit,
            taken: 0,
            started: false,
            done: false,
        };
        Ok((queue, bytes))
    }

    /// Tagged files (and bytes) checked since the cycle began, now.
    pub fn cycle_progress(&self) -> rusqlite::Result<(u64, u64)> {
        self.conn().query_row(
            &format!(
                "SELECT count(*), coalesce(sum(p.size), 0) FROM {JOIN} \
                 WHERE p.tagged AND f.checked >= ?1"
            ),
            [self.cycle_started],
            |r| Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64)),
        )
    }

    /// Tagged files never verified, and the oldest verification of the others.
    pub fn ages(&self) -> rusqlite::Result<(u64, Option<i64>)> {
        self.conn().query_row(
            &format!(
                "SELECT count(*) FILTER (WHERE f.verified IS NULL), min(f.verified) FROM {JOIN} \
                 WHERE p.tagged"
            ),
            [],
            |r| Ok((r.get::<_, i64>(0)? as u64, r.get(1)?)),
        )
    }

    /// What `status` shows: verification ages, damage not yet repaired, copies.
    pub fn overview(&self, now: i64) -> rusqlite::Result<Overview> {
        let conn = self.conn();
        let day = 86_400_000i64;
        // One pass over the plan for every count: per age bucket, copies, this cycle.
        let bucket = format!(
            "CASE WHEN f.verified IS NULL THEN 0 {} ELSE {} END",
            AGES.iter()
                .enumerate()
                .skip(1)
                .filter_map(|(i, (_, days))| days
                    .map(|d| format!("WHEN ?1 - f.verified < {} THEN {i}", d * day)))
                .collect::<Vec<_>>()
                .join(" "),
            AGES.len() - 1
        );
        let mut columns: Vec<String> = (0..AGES.len())
            .map(|i| {
                format!(
                    "count(*) FILTER (WHERE b = {i}), coalesce(sum(size) FILTER (WHERE b = {i}), 0)"
                )
            })
            .collect();
        for filter in [
            "protected IS NOT NULL",
            "archived IS NOT NULL",
            "checked >= ?2",
        ] {
            columns.push(format!(
                "count(*) FILTER (WHERE {filter}), coalesce(sum(size) FILTER (WHERE {filter}), 0)"
            ));
        }
        columns.push("min(verified)".into());
        let sql = format!(
            "SELECT {} FROM (SELECT {bucket} AS b, p.size AS size, f.verified AS verified, \
             f.protected AS protected, coalesce(f.archived, (SELECT copied FROM state.runs \
             WHERE id = f.archived_in)) AS archived, f.checked AS checked FROM {JOIN} \
             WHERE p.tagged)",
            columns.join(", ")
        );
        let (ages, copies, oldest) =
            conn.query_row(&sql, params![now, self.cycle_started], |r| {
                let count = |i: usize| -> rusqlite::Result<Count> {
                    Ok(Count {
                        files: r.get::<_, i64>(2 * i)? as u64,
                        bytes: r.get::<_, i64>(2 * i + 1)? as u64,
                    })
                };
                let ages = AGES
                    .iter()
                    .enumerate()
                    .map(|(i, (label, _))| {
                        count(i).map(|c| Age {
                            label,
                            files: c.files,
                            bytes: c.bytes,
                        })
                    })
                    .collect::<rusqlite::Result<Vec<Age>>>()?;
                let n = AGES.len();
                let copies = [count(n)?, count(n + 1)?, count(n + 2)?];
                Ok((ages, copies, r.get::<_, Option<i64>>(2 * (n + 3))?))
            })?;
        let mut damage = Vec::new();
        let mut stmt = conn.prepare(&format!(
            "SELECT p.path, f.status, f.damaged FROM {JOIN} WHERE f.damaged IS NOT NULL ORDER BY p.seq"
        ))?;
        let rows = stmt.query_map([], |r| {
            let path: Vec<u8> = r.get(0)?;
            Ok(Damage {
                path: PathBuf::from(std::ffi::OsStr::from_bytes(&path)),
                status: r.get(1)?,
                found: r.get(2)?,
            })
        })?;
        for row in rows {
            damage.push(row?);
        }
        Ok(Overview {
            tagged: self.tagged.into(),
            untagged: self.untagged.into(),
            ages,
            damage,
            protected: copies[0],
            archived: copies[1],
            cycle_verified: copies[2],
            oldest,
        })
    }

    /// Why the queue ended before its end, if it did.
    pub fn failure(&self) -> Option<String> {
        self.failed.lock().ok().and_then(|f| f.clone())
    }

    /// Runs `f` on the plan's connection (for `status`' queries over `plan` and `files`).
    pub fn with_conn<T>(&self, f: impl FnOnce(&Connection) -> T) -> T {
        f(&self.conn())
    }
}

/// A scrub's queue, read a page at a time.
pub struct Queue {
    conn: Arc<Mutex<Connection>>,
    failed: Arc<Mutex<Option<String>>>,
    page: std::vec::IntoIter<(i64, PathBuf, u64, usize)>,
    last: i64,
    limit: Option<u64>,
    taken: u64,
    started: bool,
    done: bool,
}

/// Rows read from the queue at a time.
const PAGE: i64 = 1024;

impl Queue {
    fn next_page(&mut self) -> rusqlite::Result<()> {
        let conn = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        let mut stmt = conn.prepare_cached(
            "SELECT id, path, size, root FROM queue WHERE id > ?1 ORDER BY id LIMIT ?2",
        )?;
        let rows = stmt
            .query_map(params![self.last, PAGE], |r| {
                let path: Vec<u8> = r.get(1)?;
                Ok((
                    r.get::<_, i64>(0)?,
                    PathBuf::from(std::ffi::OsStr::from_bytes(&path)),
                    r.get::<_, i64>(2)? as u64,
                    r.get::<_, i64>(3)? as usize,
                ))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        self.page = rows.into_iter();
        Ok(())
    }
}

impl Iterator for Queue {
    type Item = Entry;

    fn next(&mut self) -> Option<Entry> {
        if self.done {
            return None;
        }
        let (id, path, size, root) = match self.page.next() {
            Some(row) => row,
            None => {
                // A database that fails mid-scrub ends the queue (the run says so); what was
                // verified stands.
                if let Err(e) = self.next_page() {
                    if let Ok(mut failed) = self.failed.lock() {
                        failed.get_or_insert(e.to_string());
                    }
                    self.done = true;
                    return None;
                }
                self.page.next()?
            }
        };
        if let Some(limit) = self.limit
            && self.started
            && self.taken + size > limit
        {
            self.done = true;
            return None;
        }
        self.started = true;
        self.taken += size;
        self.last = id;
        Some(Entry::File {
            path,
            size,
            root,
            inode: None,
            stat: None,
        })
    }
}

/// The verification-age buckets, with their upper bound in days.
const AGES: [(&str, Option<i64>); 7] = [
    ("never", None),
    ("< 1 day", Some(1)),
    ("< 1 week", Some(7)),
    ("< 1 month", Some(31)),
    ("< 3 months", Some(92)),
    ("< 1 year", Some(366)),
    ("older", None),
];

/// What `status` shows of a tree, from tags and the state database.
#[derive(Debug, serde::Serialize)]
pub struct Overview {
    /// Tagged files and their bytes.
    pub tagged: Count,
    /// Untagged regular files and their bytes.
    pub untagged: Count,
    /// Tagged files by how long ago they were last verified.
    pub ages: Vec<Age>,
    /// Damage found and neither repaired nor accepted since.
    pub damage: Vec<Damage>,
    /// Tagged files whose content has a parity set, and their bytes.
    pub protected: Count,
    /// Tagged files whose content was archived, and their bytes.
    pub archived: Count,
    /// Tagged files checked since the current cycle began, and their bytes.
    pub cycle_verified: Count,
    /// The least recent verification (Unix milliseconds).
    pub oldest: Option<i64>,
}

/// Files and their bytes.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct Count {
    /// Files.
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
}

impl From<(u64, u64)> for Count {
    fn from((files, bytes): (u64, u64)) -> Count {
        Count { files, bytes }
    }
}

/// One bucket of the verification-age chart.
#[derive(Debug, serde::Serialize)]
pub struct Age {
    /// Its name.
    pub label: &'static str,
    /// Files in it.
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
}

/// A damaged file.
#[derive(Debug, serde::Serialize)]
pub struct Damage {
    /// Where it is, as walked.
    pub path: PathBuf,
    /// The verdict.
    pub status: Option<String>,
    /// When the damage was found (Unix milliseconds).
    pub found: Option<i64>,
}
