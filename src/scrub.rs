//! Planning scrubs and overviews: which files are due, least recently verified first.
//!
//! A plan walks the trees reading tags and metadata only (no file data), puts one row per
//! regular file in a temporary SQLite table, with what the state database knows of it (each
//! directory's entries read as the walk enters it), and lets SQLite sort it: on disk, not in
//! memory, so a tree of ten million files plans in the memory of a tree of ten. The scrub then streams the sorted queue, a page at a time, into the engine.
//!
//! A cycle is the time it takes to look at every tagged file once: verify it, or find it
//! damaged, edited or unreadable (each a verdict, recorded as `checked`). The plan remembers
//! when the current cycle of its roots began; files checked since are done for this cycle, and
//! the queue puts every file not yet done first, so repeated budgeted scrubs check each file
//! once before any file twice, and a file that fails every time cannot hold the cycle up.
//! Under `--update`, an untagged file that could not be tagged is done for the cycle too.

use std::collections::HashMap;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OpenFlags, OptionalExtension, params};

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

    /// The bytes it allows, of `tagged` bytes under the roots, if it limits them.
    pub fn bytes(&self, tagged: u64) -> Option<u64> {
        let percent = self
            .max_percent
            .map(|p| (tagged as f64 * p / 100.0).ceil() as u64);
        match (self.max_bytes, percent) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// Files gone at once from a tree that make an alarm rather than routine deletions: at least
/// this many (so that small trees do not cry wolf), and more than a percentage of the files
/// known under it, [`MASS_REMOVAL_PERCENT`] unless told (SnapRAID refuses to sync past a like
/// threshold).
pub const MASS_REMOVAL_FILES: u64 = 50;
/// The default share of a tree's files that, gone at once, is an alarm.
pub const MASS_REMOVAL_PERCENT: f64 = 10.0;
/// Below [`MASS_REMOVAL_FILES`] files gone at once, what is still an alarm: a whole folder of
/// at least this many, or more than half of a tree of at least this many (deleting 25 of a
/// 40-file tree was a routine deletion). At [`MASS_REMOVAL_FILES`] and more, the share decides.
pub const MASS_REMOVAL_SMALL: u64 = 10;

/// A tree that vanished, or lost many files at once: held as an alarm, nothing marked gone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Removal {
    /// The root.
    pub root: PathBuf,
    /// Files the state database knew under it that are gone.
    pub removed: u64,
    /// Files it knew under it.
    pub known: u64,
    /// Whether the walk found no file at all under it.
    pub vanished: bool,
    /// A folder under it whose every file (at least [`MASS_REMOVAL_SMALL`]) is gone at once,
    /// and how many it held.
    pub folder: Option<(PathBuf, u64)>,
}

impl Removal {
    /// The alarm `gone` files gone at once from `root` make, of `known` recorded there, where
    /// the walk found `files`: a tree that holds nothing of what it held, or lost more than
    /// `alarm_at` percent (and [`MASS_REMOVAL_FILES`]) at once, or, fewer, what
    /// [`MASS_REMOVAL_SMALL`] says (`folder`: the largest folder whose every file is gone).
    pub fn of(
        root: &Path,
        gone: u64,
        known: u64,
        files: u64,
        alarm_at: f64,
        folder: Option<(PathBuf, u64)>,
    ) -> Option<Removal> {
        let vanished = files == 0 && gone > 0;
        let many = gone >= MASS_REMOVAL_FILES && gone as f64 * 100.0 > known as f64 * alarm_at;
        // Fewer than MASS_REMOVAL_FILES: a small tree losing more than half (or the share
        // asked for, if more), or a whole folder (unless every share is allowed: 100%).
        let few = gone < MASS_REMOVAL_FILES;
        let small = few
            && known >= MASS_REMOVAL_SMALL
            && gone as f64 * 100.0 > known as f64 * alarm_at.max(50.0);
        let folder = folder.filter(|(_, n)| few && alarm_at < 100.0 && *n >= MASS_REMOVAL_SMALL);
        (vanished || many || small || folder.is_some()).then(|| Removal {
            root: root.to_path_buf(),
            removed: gone,
            known,
            vanished,
            folder,
        })
    }

    /// In words, with what to do.
    pub fn describe(&self) -> String {
        let root = crate::text::escape(&self.root);
        let what = if self.vanished {
            format!(
                "{root} holds none of the {} files recorded under it: is its disk mounted, was \
                 it moved or renamed, or deleted by mistake?",
                crate::text::group(self.known)
            )
        } else if let Some((folder, n)) = &self.folder {
            format!(
                "the folder {} and its {} files are gone at once ({} of the {} files recorded \
                 under {root}): deleted by mistake, or a disk that did not mount?",
                crate::text::escape(folder),
                crate::text::group(*n),
                crate::text::group(self.removed),
                crate::text::group(self.known)
            )
        } else {
            format!(
                "{} of the {} files recorded under {root} are gone at once: a disk that did not \
                 mount, a folder deleted by mistake?",
                crate::text::group(self.removed),
                crate::text::group(self.known)
            )
        };
        format!(
            "{what} Nothing was marked deleted; if the deletion was meant, `intact scrub \
             --accept-removed {root}` records it"
        )
    }
}

/// An entry the walk did not meet where it says, with what the plan knows of its file
/// elsewhere.
struct Unmet {
    /// Which root it is under.
    root: usize,
    /// Where it was, and its times.
    gone: Gone,
    fs: i64,
    ino: i64,
    key: Vec<u8>,
    /// Its size, as its entry says.
    size: i64,
    /// Where the walk met its inode with its content (moved there).
    met: Option<Vec<u8>>,
    /// Whether the walk met its inode re-tagged from its content (moved, then edited).
    retagged: bool,
}

impl Unmet {
    fn path(&self) -> Vec<u8> {
        self.gone.path.as_os_str().as_bytes().to_vec()
    }

    fn id(&self) -> (i64, i64, &[u8]) {
        (self.fs, self.ino, &self.key)
    }
}

/// What became of an entry the walk did not meet where it says.
enum Fate {
    /// The file itself is still there under its name (the walk did not meet it: excluded, on
    /// another file system under -x, in a directory it could not read): its record, and its
    /// damage, stay; `outdated` if the walk met its inode under other content (a second name
    /// of an edited file), so the entry describes nothing any more.
    Stays { outdated: bool },
    /// Moved, with its history: to where the walk met it (`None`: moved, then edited).
    Moved(Option<Vec<u8>>),
    /// Its file system is not mounted now (what holds its path, given, is another one).
    Unmounted(PathBuf),
    /// Gone: removed, or `replaced` by something else under its name (an editor's save, a
    /// copy put there: not a file gone, damaged or not).
    Gone { replaced: bool },
}

/// The files found gone by earlier scrubs under `roots`, still remembered.
fn recorded_gone(conn: &Connection, roots: &[PathBuf]) -> rusqlite::Result<Vec<Gone>> {
    let mut stmt = conn.prepare_cached(
        "SELECT path, verified, damaged, at FROM state.gone \
         WHERE (path >= ?1 AND path < ?2) OR path = ?3 ORDER BY path",
    )?;
    let mut gone = Vec::new();
    for root in roots {
        let (low, high, exact) = state::under(root);
        for row in stmt.query_map(params![low, high, exact], Gone::from_row)? {
            gone.push(row?);
        }
    }
    Ok(gone)
}

/// The entries the walk did not meet where they say, each looked up among the plan's files
/// by an index built only now that it is needed (most runs need none).
fn unmet(conn: &Connection) -> rusqlite::Result<Vec<Unmet>> {
    if !conn.query_row("SELECT EXISTS (SELECT 1 FROM unmet)", [], |r| r.get(0))? {
        return Ok(Vec::new());
    }
    conn.execute_batch("CREATE INDEX IF NOT EXISTS plan_key ON plan (fs, ino, digest)")?;
    let mut stmt = conn.prepare(
        "SELECT path, verified, damaged, NULL, fs, ino, digest, \
         (SELECT p.abs FROM plan p WHERE p.fs = u.fs AND p.ino = u.ino \
         AND p.digest = u.digest LIMIT 1), \
         EXISTS (SELECT 1 FROM plan p WHERE p.fs = u.fs AND p.ino = u.ino \
         AND p.was = u.digest), root, size FROM unmet u ORDER BY path",
    )?;
    let rows = stmt.query_map([], |r| {
        Ok(Unmet {
            root: r.get::<_, i64>(9)? as usize,
            gone: Gone::from_row(r)?,
            fs: r.get(4)?,
            ino: r.get(5)?,
            key: r.get(6)?,
            size: r.get(10)?,
            met: r.get(7)?,
            retagged: r.get(8)?,
        })
    })?;
    rows.collect()
}

/// What became of `u`; `alarms`: whether a file system not mounted now is told apart (else
/// its files are gone).
fn fate(conn: &Connection, u: &Unmet, alarms: bool) -> Fate {
    let now = crate::fs::sys::lstat(&u.gone.path);
    if now.as_ref().is_ok_and(|m| m.ino() as i64 == u.ino) {
        let met = conn
            .prepare_cached("SELECT 1 FROM plan WHERE fs = ?1 AND ino = ?2 AND digest != ?3")
            .and_then(|mut s| s.exists(params![u.fs, u.ino, u.key]));
        return Fate::Stays {
            outdated: met.unwrap_or(false),
        };
    }
    if u.met.is_some() || u.retagged {
        return Fate::Moved(u.met.clone());
    }
    if now.is_err()
        && alarms
        && let Some(holder) = state::unmounted(&u.gone.path, u.fs)
    {
        return Fate::Unmounted(holder);
    }
    Fate::Gone {
        replaced: now.is_ok(),
    }
}

/// A file moved keeps its history: in this plan (`status` too), and, with `mark`, in the
/// state database, its entry moved where it is now (`to`; `None`: moved, then edited, and
/// only forgotten where it was).
fn moved(conn: &Connection, u: &Unmet, to: Option<&[u8]>, mark: bool) -> rusqlite::Result<()> {
    let entry = match mark {
        true => state::forget(conn, "state.", &u.path(), u.id())?,
        false => state::entry_at(conn, "state.", &u.gone.path)?,
    };
    let (Some(e), Some(to)) = (entry, to) else {
        return Ok(());
    };
    share_history(conn, u, &e)?;
    if mark {
        state::settle_moved(conn, "state.", to, e)?;
    }
    Ok(())
}

/// A file still where its entry says, but met by the walk under another of its names first
/// (a hard link made since, earlier in walk order): that name is the same file, with the
/// same history. Unknown there, it counted as not yet checked in its cycle, and a link made
/// every night held the cycle open for good.
fn also_named(conn: &Connection, u: &Unmet) -> rusqlite::Result<()> {
    match state::entry_at(conn, "state.", &u.gone.path)? {
        Some(e) => share_history(conn, u, &e),
        None => Ok(()),
    }
}

/// Gives the walk's rows of the file of `u` (its file system, inode and tag) the history of
/// its entry `e` where they have none, or an older one: a file's history is its inode's,
/// whichever of its names it was read under (a folder moved can change which name the walk
/// meets first, and that name's entry said the file unproven since it was last read there).
fn share_history(conn: &Connection, u: &Unmet, e: &state::entries::Entry) -> rusqlite::Result<()> {
    conn.execute(
        "UPDATE plan SET known = 1, verified = ?4, checked = ?5, status = ?6, \
         protected = coalesce(?7, protected), archived = coalesce(?8, archived), \
         archived_in = coalesce(?9, archived_in) \
         WHERE fs = ?1 AND ino = ?2 AND digest = ?3 \
         AND (known IS NULL OR coalesce(checked, 0) < coalesce(?5, 0))",
        params![
            u.fs,
            u.ino,
            u.key,
            e.verified,
            e.checked,
            e.status,
            e.protected,
            e.archived,
            e.archived_in
        ],
    )?;
    Ok(())
}

/// How long a file found gone from its tree is remembered (and shown by `status`).
pub const GONE_KEPT: std::time::Duration = std::time::Duration::from_secs(30 * 86_400);

/// A planned walk: the files under the roots in a temporary table, with what the state knows.
pub struct Plan {
    conn: Arc<Mutex<Connection>>,
    /// The roots' key for their cycle: their absolute paths.
    cycle_key: Vec<u8>,
    /// The state database the plan's rows say what of (read as the walk went).
    read_from: Option<PathBuf>,
    /// Why the state database could not be read then, if it could not.
    read_error: Option<(Option<PathBuf>, rusqlite::Error)>,
    /// Tagged files and their bytes.
    pub tagged: (u64, u64),
    /// Untagged regular files and their bytes.
    pub untagged: (u64, u64),
    /// When the roots' current cycle began (Unix milliseconds).
    pub cycle_started: i64,
    /// Whether that cycle is recorded under the roots' own key (not only inherited).
    cycle_saved: bool,
    /// Tagged files (and bytes) checked since the cycle began, before this run.
    pub cycle_done: (u64, u64),
    /// Whether the walk saw every file (not interrupted, no directory unreadable).
    pub complete: bool,
    /// Per root: regular files, and tagged ones among them.
    pub per_root: Vec<(u64, u64)>,
    /// The files found gone by this scrub's planning, to be told once.
    pub gone_now: Vec<Gone>,
    /// The files found gone under the roots and still remembered (within [`GONE_KEPT`]).
    pub removed_kept: u64,
    attached: bool,
    /// Why the queue ended early, if it failed.
    failed: Arc<Mutex<Option<String>>>,
    /// The latest verification of a file in the plan.
    latest: Option<i64>,
    /// Plan rows the state database knows.
    known: u64,
    /// Files found gone that the walk met again where they were, as they were.
    back: Vec<Vec<u8>>,
}

/// The plan's own database: a private temporary one, on disk, with the state database's
/// locks waited for as the state's are (it is attached to it), and its tables made.
fn scratch() -> rusqlite::Result<Connection> {
    let mut conn = state::sqlite::open(Path::new(""), OpenFlags::default())?;
    state::wait_for_locks(&mut conn)?;
    // The state database is attached to it.
    state::leave_the_wal(&conn)?;
    // A throwaway: no journal, no syncs; a cache of 512 KiB (it is read in order, and a
    // larger one only made the peak grow with the tree), then its file (temporary tables
    // too), never memory only.
    conn.execute_batch(
        "PRAGMA temp_store = FILE; PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF; \
         PRAGMA cache_size = -512;",
    )?;
    conn.execute_batch(
        "CREATE TABLE plan (
            seq INTEGER PRIMARY KEY,
            fs INTEGER, ino INTEGER,
            digest BLOB NOT NULL,   -- the state's key; empty for an untagged file
            tagged INTEGER NOT NULL,
            path BLOB NOT NULL,     -- as walked
            abs BLOB NOT NULL,      -- absolute, as the state database files it
            size INTEGER NOT NULL,
            root INTEGER NOT NULL,
            changed INTEGER NOT NULL, -- untagged, or its tag no longer describes it (an edit?)
            marked INTEGER,         -- when a writing verb found it damaged (its mark), ms
            -- What the state database knows of it (its entry: the file under this name,
            -- inode and tag), as the walk met it:
            known INTEGER,          -- 1 if it has an entry
            verified INTEGER, checked INTEGER, status TEXT, protected INTEGER,
            archived INTEGER, archived_in INTEGER,
            damaged INTEGER,        -- when damage not dealt with was found in it
            was BLOB                -- its tag's key before its last re-tag
        );
        -- The state's entries under the roots that the walk did not meet where they say.
        CREATE TABLE unmet (
            path BLOB NOT NULL, fs INTEGER, ino INTEGER, digest BLOB, size INTEGER,
            verified INTEGER, damaged INTEGER, root INTEGER NOT NULL
        );",
    )?;
    Ok(conn)
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
    db: Option<&Path>,
    mut other: impl FnMut(FileReport),
) -> rusqlite::Result<Plan> {
    let conn = scratch()?;
    let show = Config {
        work: Work::Show,
        ..config.clone()
    };
    let mut fsids = state::FsIds::default();
    let cwd = std::env::current_dir().unwrap_or_default();
    let ranges: Vec<_> = roots.iter().map(|r| state::under(r)).collect();
    let mut lookup = state::Lookup::open(db);
    let mut unmet_failed = None;
    let mut failed = None;
    let tx = conn.unchecked_transaction()?;
    let mut complete = true;
    let mut per_root = vec![(0u64, 0u64); roots.len()];
    // Files and bytes of the plan's rows, tagged and not, counted as they go in.
    let (mut tagged, mut untagged) = ((0u64, 0u64), (0u64, 0u64));
    let walked = {
        let mut insert = tx.prepare(
            "INSERT INTO plan (fs, ino, digest, tagged, path, size, root, changed, marked, abs, \
             known, verified, checked, status, protected, archived, archived_in, damaged, was) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, \
             ?18, ?19)",
        )?;
        let mut unmet_row = tx.prepare(
            "INSERT INTO unmet (path, fs, ino, digest, size, verified, damaged, root) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        )?;
        // An entry not met goes to `unmet` if it is under a root (a root that is a file
        // shares its directory with files that are not).
        let mut unmet = |path: Vec<u8>, e: state::entries::Entry, d: Option<state::Found>| {
            let Some(root) = ranges
                .iter()
                .position(|(low, high, exact)| path == *exact || (path >= *low && path < *high))
            else {
                return;
            };
            let inserted = unmet_row.execute(params![
                path,
                e.fs,
                e.ino,
                e.key,
                e.size,
                e.verified,
                d.map(|d| d.at),
                root as i64
            ]);
            if let Err(e) = inserted {
                unmet_failed.get_or_insert(e);
            }
        };
        let walked = engine::run(&show, roots, cancel, &Progress::default(), |report| {
            let row = match (&report.tag, report.inode, report.size, report.status) {
                (_, _, _, Status::Skipped | Status::Error) => None,
                (Some(tag), Some(id), Some(size), _) => Some((Some(tag.digest), id, size)),
                (None, Some(id), Some(size), _) if untagged_too => Some((None, id, size)),
                _ => None,
            };
            if report.status == Status::Error {
                complete = false;
            }
            if report.status != Status::Skipped
                && let Some(count) = per_root.get_mut(report.root)
            {
                count.0 += 1;
                count.1 += u64::from(report.tag.is_some());
            }
            let Some((digest, (dev, ino), size)) = row else {
                other(report);
                return;
            };
            let fs = fsids.of(dev, &report.path);
            let key = digest.as_ref().map(digest_key).unwrap_or_default();
            let abs = state::absolute_from(&cwd, &report.path);
            let abs = abs.as_os_str().as_bytes();
            let known = lookup.file(abs, (fs, ino as i64, &key), &mut unmet);
            let e = known.entry;
            let inserted = insert.execute(params![
                fs,
                ino as i64,
                key,
                digest.is_some(),
                report.path.as_os_str().as_bytes(),
                size as i64,
                report.root as i64,
                digest.is_none() || report.status != Status::Ok,
                report.known_damage.map(|d| d.found.saturating_mul(1000)),
                abs,
                e.map(|_| 1),
                e.and_then(|e| e.verified),
                e.and_then(|e| e.checked),
                known
                    .damaged
                    .as_ref()
                    .and_then(|d| d.status.as_deref())
                    .or_else(|| e.map(|e| e.status.as_str())),
                e.and_then(|e| e.protected),
                e.and_then(|e| e.archived),
                e.and_then(|e| e.archived_in),
                known.damaged.as_ref().map(|d| d.at),
                e.map(|e| e.was.as_slice()).filter(|w| !w.is_empty()),
            ]);
            match inserted {
                Ok(_) => {
                    let count = if digest.is_some() {
                        &mut tagged
                    } else {
                        &mut untagged
                    };
                    *count = (count.0 + 1, count.1 + size);
                }
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        });
        lookup.finish(&ranges, &mut unmet);
        walked
    };
    if let Some(e) = failed.or(unmet_failed) {
        return Err(e);
    }
    complete &= walked.is_ok() && !cancel.load(std::sync::atomic::Ordering::Relaxed);
    tx.commit()?;
    Ok(Plan {
        conn: Arc::new(Mutex::new(conn)),
        cycle_key: state::roots_key(roots),
        read_from: db.filter(|_| lookup.error.is_none()).map(Path::to_path_buf),
        read_error: lookup.error.take().map(|e| (db.map(Path::to_path_buf), e)),
        tagged,
        untagged,
        cycle_started: 0,
        cycle_saved: false,
        cycle_done: (0, 0),
        complete,
        per_root,
        gone_now: Vec::new(),
        removed_kept: 0,
        attached: false,
        failed: Arc::default(),
        latest: None,
        known: 0,
        back: std::mem::take(&mut lookup.back),
    })
}

/// The cycle of the scrubbed root that the plan's files were last seen under, for roots
/// that have none of their own: the one most of a sample of them were under (the deepest
/// such root among equals).
fn inherited_cycle(conn: &Connection) -> rusqlite::Result<Option<i64>> {
    let cycles: Vec<(Vec<u8>, i64)> = conn
        .prepare("SELECT root, started FROM state.cycles")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    if cycles.is_empty() {
        return Ok(None);
    }
    let seen: Vec<Vec<u8>> = conn
        .prepare("SELECT abs FROM plan WHERE tagged AND known LIMIT 64")?
        .query_map([], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    let under = |path: &[u8], root: &[u8]| {
        root == b"/" || (path.starts_with(root) && path.get(root.len()) == Some(&b'/'))
    };
    Ok(cycles
        .iter()
        .map(|(root, started)| {
            let n = seen.iter().filter(|p| under(p, root)).count();
            (n, root.len(), *started)
        })
        .filter(|&(n, _, _)| n > 0)
        .max()
        .map(|(_, _, started)| started))
}

impl Plan {
    /// Attaches the state database at `db` (one in memory if `None`: every file then counts
    /// as never verified), instead of any attached before, and reads the roots' cycle.
    pub fn attach(&mut self, db: Option<&Path>) -> rusqlite::Result<()> {
        // The database could not be read as the walk went: said here, where a damaged one is
        // dealt with.
        if let Some((from, e)) = self.read_error.take()
            && from.as_deref() == db
        {
            return Err(e);
        }
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
            // The plan's joins read the state through its index in walk order: a small cache
            // does as well as SQLite's 2 MiB, which filled up on large trees (peak memory
            // would otherwise grow with the tree).
            conn.execute_batch("PRAGMA state.cache_size = -512")?;
            if db.is_none() {
                conn.execute_batch(&state::schema("state."))?;
            }
        }
        self.attached = true;
        // What the rows say another database knew (one found damaged and rebuilt since, or
        // none) says nothing of this one; the damage this one knows is taken instead (a
        // database rebuilt as the walk read it learnt it again from the damage journal), as
        // the walk takes it: an untagged file's by its inode, a tagged one's by its tag too.
        if self.read_from.as_deref() != db {
            self.conn().execute_batch(
                "UPDATE plan SET known = NULL, verified = NULL, checked = NULL, status = NULL, \
                 protected = NULL, archived = NULL, archived_in = NULL, damaged = NULL, \
                 was = NULL; DELETE FROM unmet;
                 UPDATE plan SET damaged = d.found, status = d.status FROM state.damage AS d \
                 WHERE d.fs = plan.fs AND d.ino = plan.ino \
                 AND (plan.digest = X'' OR d.digest = plan.digest);",
            )?;
            self.read_from = db.map(Path::to_path_buf);
            self.back.clear();
        }
        self.load_cycle()
    }

    /// Goes through the plan's files in walk order, each with its entry in the state database
    /// now (after a run recorded what it found): the entry of its name, if it is of the same
    /// file (file system and inode: a file the run re-tagged is the same file).
    fn now(
        &self,
        mut each: impl FnMut(&PlanFile, Option<&state::entries::Entry>),
    ) -> rusqlite::Result<()> {
        use state::entries::{find, split};
        use state::pages::{keys, load, page_of};
        let conn = self.conn();
        let mut stmt = conn.prepare(
            "SELECT abs, fs, ino, tagged, size, verified, checked FROM plan ORDER BY seq",
        )?;
        let mut rows = stmt.query([])?;
        // The directory and page read, and where in it the next file likely is.
        let (mut dir, mut pages, mut page) = (Vec::new(), Vec::new(), None);
        let (mut entries, mut next) = (Vec::new(), 0);
        while let Some(r) = rows.next()? {
            let file = PlanFile {
                fs: r.get(1)?,
                ino: r.get(2)?,
                tagged: r.get(3)?,
                size: r.get::<_, i64>(4)?.max(0) as u64,
                verified: r.get(5)?,
                checked: r.get(6)?,
            };
            let (d, name) = split(r.get_ref(0)?.as_blob()?);
            if d != dir.as_slice() {
                dir = d.to_vec();
                pages = keys(&conn, "state.", &dir)?;
                (page, entries) = (None, Vec::new());
            }
            let p = page_of(&pages, name);
            if page != Some(p) && p < pages.len() {
                entries = load(&conn, "state.", &dir, &pages[p])?;
                (page, next) = (Some(p), 0);
            }
            // A page's files come in the walk's order, which is its entries' order too: the
            // entry after the last one found is looked at first.
            let at = match entries.get(next) {
                Some(e) if e.name == name => Ok(next),
                _ => find(&entries, name),
            };
            let entry = at.ok().map(|at| {
                next = at + 1;
                &entries[at]
            });
            each(
                &file,
                entry.filter(|e| (e.fs, e.ino) == (file.fs, file.ino)),
            );
        }
        Ok(())
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads the roots' cycle: when it began, and what was verified since. Roots that have
    /// no cycle of their own yet (a tree renamed, a part of a scrubbed tree scrubbed on its
    /// own) go on with the one their files were last seen under.
    fn load_cycle(&mut self) -> rusqlite::Result<()> {
        let conn = self.conn();
        let own: Option<i64> = conn
            .query_row(
                "SELECT started FROM state.cycles WHERE root = ?1",
                [&self.cycle_key],
                |r| r.get(0),
            )
            .optional()?;
        let started = match own {
            Some(started) => started,
            None => inherited_cycle(&conn)?.unwrap_or(0),
        };
        // One pass: what this cycle has done, the latest verification, the rows known.
        let (done, size, latest, known): (i64, i64, Option<i64>, i64) = conn.query_row(
            "SELECT count(*) FILTER (WHERE checked >= ?1), \
             coalesce(sum(size) FILTER (WHERE checked >= ?1), 0), \
             max(checked), count(known) FROM plan WHERE tagged",
            [started],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )?;
        drop(conn);
        self.cycle_started = started;
        self.cycle_saved = own.is_some();
        self.cycle_done = (done as u64, size as u64);
        self.latest = latest;
        self.known = known as u64;
        Ok(())
    }

    /// Starts a new cycle if none is open or the last one is complete: when a scrub begins.
    /// It begins after every verification recorded so far.
    pub fn start_cycle(&mut self, now: i64) -> rusqlite::Result<()> {
        let open = self.cycle_started > 0 && self.cycle_done.0 < self.tagged.0;
        if open && self.cycle_saved {
            return Ok(());
        }
        let started = if open {
            self.cycle_started
        } else {
            now.max(self.latest.map_or(0, |l| l + 1))
        };
        self.conn().execute(
            "INSERT INTO state.cycles (root, started) VALUES (?1, ?2) \
             ON CONFLICT DO UPDATE SET started = excluded.started",
            params![self.cycle_key, started],
        )?;
        if !open {
            self.cycle_done = (0, 0);
        }
        self.cycle_started = started;
        self.cycle_saved = true;
        Ok(())
    }

    /// How many files under `roots` were found gone and are still remembered.
    pub fn removed_kept(&self, roots: &[PathBuf]) -> rusqlite::Result<u64> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(
            "SELECT count(*) FROM state.gone WHERE (path >= ?1 AND path < ?2) OR path = ?3",
        )?;
        let mut n = 0;
        for root in roots {
            let (low, high, exact) = state::under(root);
            n += stmt.query_row(params![low, high, exact], |r| r.get::<_, i64>(0))?;
        }
        Ok(n.max(0) as u64)
    }

    /// After a complete walk, before the run records anything: the files the state database
    /// knows under `roots` that are no longer there (not at their path, and not met by the
    /// walk under another: not moved). With `mark` (a scrub), those found gone now are moved
    /// to the files gone, and returned (each is told once); those found gone more than
    /// [`GONE_KEPT`] ago are forgotten, as are the entries of files replaced under their path
    /// (an editor's save, a restore), and a file moved has its entry moved where it is now.
    /// Without (`status`), every file gone within that time is returned.
    ///
    /// A root under which the walk found no file, or more than `alarm_at` percent (and
    /// [`MASS_REMOVAL_FILES`]) of whose files are gone at once, is returned as a [`Removal`]
    /// instead, and nothing under it is marked or returned as gone; `None` accepts every
    /// deletion (the owner said it was meant).
    ///
    /// The cycle's progress is counted again after: a file moved is known, with its history,
    /// where it is now (counted as not yet checked in its cycle before, a move made the cycle
    /// look unfinished, and the run that then found every file checked read nothing).
    pub fn gone(
        &mut self,
        roots: &[PathBuf],
        now: i64,
        mark: bool,
        alarm_at: Option<f64>,
    ) -> rusqlite::Result<(Vec<Gone>, Vec<Removal>)> {
        if !self.complete {
            return Ok((Vec::new(), Vec::new()));
        }
        let conn = self.conn();
        // A file found gone and met again where it was, as it was, is gone no more.
        let mut gone = match mark {
            true => {
                let mut forget = conn.prepare_cached("DELETE FROM state.gone WHERE path = ?1")?;
                for path in &self.back {
                    forget.execute([path])?;
                }
                Vec::new()
            }
            false => recorded_gone(&conn, roots)?
                .into_iter()
                .filter(|g| !self.back.contains(&g.path.as_os_str().as_bytes().to_vec()))
                .collect(),
        };
        let mut removed = Vec::new();
        let mut unmounted: Vec<(PathBuf, u64)> = Vec::new();
        for u in unmet(&conn)? {
            match fate(&conn, &u, alarm_at.is_some()) {
                Fate::Stays { outdated: false } => also_named(&conn, &u)?,
                Fate::Stays { outdated: true } if mark => {
                    // Damaged content stays known until it is dealt with.
                    let damaged: bool = conn
                        .prepare_cached(
                            "SELECT 1 FROM state.damage WHERE fs = ?1 AND ino = ?2 AND digest = ?3",
                        )?
                        .exists(params![u.fs, u.ino, u.key])?;
                    if !damaged {
                        state::forget(&conn, "state.", &u.path(), u.id())?;
                    }
                }
                Fate::Stays { outdated: true } => {}
                Fate::Moved(to) => moved(&conn, &u, to.as_deref(), mark)?,
                Fate::Unmounted(holder) => match unmounted.iter_mut().find(|h| h.0 == holder) {
                    Some(h) => h.1 += 1,
                    None => unmounted.push((holder, 1)),
                },
                Fate::Gone { replaced } => removed.push((u, replaced)),
            }
        }
        let mut alarms = self.alarms(&conn, roots, &removed, alarm_at)?;
        let held: Vec<PathBuf> = alarms.iter().map(|a| a.root.clone()).collect();
        alarms.extend(unmounted.into_iter().map(|(root, removed)| Removal {
            root,
            removed,
            known: removed,
            vanished: true,
            folder: None,
        }));
        for (u, replaced) in removed {
            if held.contains(&roots[u.root]) {
                continue;
            }
            if mark {
                let entry = state::forget(&conn, "state.", &u.path(), u.id())?;
                // Its inode is gone from its name, deleted or replaced: so is its damage.
                conn.execute(
                    "DELETE FROM state.damage WHERE fs = ?1 AND ino = ?2 AND digest = ?3",
                    params![u.fs, u.ino, u.key],
                )?;
                if !replaced {
                    let g = &u.gone;
                    conn.execute(
                        "INSERT OR REPLACE INTO state.gone (path, fs, ino, digest, size, \
                         verified, damaged, at, owner) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, \
                         ?9)",
                        params![
                            u.path(),
                            u.fs,
                            u.ino,
                            u.key,
                            u.size,
                            g.verified,
                            g.damaged,
                            now,
                            entry.and_then(|e| e.owner).map(|o| o.to_bytes().to_vec())
                        ],
                    )?;
                }
            }
            if !replaced {
                gone.push(Gone {
                    gone: Some(now),
                    ..u.gone
                });
            }
        }
        if mark {
            conn.execute(
                "DELETE FROM state.gone WHERE at < ?1",
                [now - GONE_KEPT.as_millis() as i64],
            )?;
        }
        drop(conn);
        self.load_cycle()?;
        gone.sort_by(|a, b| a.path.cmp(&b.path));
        Ok((gone, alarms))
    }

    /// The roots whose removals are an alarm: a tree that holds nothing of what it held, or
    /// lost a large share at once, is an unmounted disk or a folder deleted by mistake, not
    /// routine deletions.
    fn alarms(
        &self,
        conn: &Connection,
        roots: &[PathBuf],
        removed: &[(Unmet, bool)],
        alarm_at: Option<f64>,
    ) -> rusqlite::Result<Vec<Removal>> {
        let Some(alarm_at) = alarm_at else {
            return Ok(Vec::new());
        };
        let mut alarms = Vec::new();
        for (i, root) in roots.iter().enumerate() {
            // Files known under it: the entries the walk met there, and those it did not.
            let known = conn.query_row(
                "SELECT (SELECT count(*) FROM plan WHERE known AND root = ?1) \
                 + (SELECT count(*) FROM unmet WHERE root = ?1)",
                [i as i64],
                |r| r.get::<_, i64>(0),
            )? as u64;
            let gone: Vec<&Unmet> = removed
                .iter()
                .filter(|(u, replaced)| u.root == i && !replaced)
                .map(|(u, _)| u)
                .collect();
            let files = self.per_root.get(i).map_or(0, |c| c.0);
            let folder = whole_folder(conn, &gone)?;
            alarms.extend(Removal::of(
                root,
                gone.len() as u64,
                known,
                files,
                alarm_at,
                folder,
            ));
        }
        Ok(alarms)
    }

    /// The queue of a scrub: tagged files (and untagged ones if `untagged_too`), not yet
    /// verified in this cycle first, then least recently verified first, walk order among
    /// equals; within `budget` of bytes. With `untagged_too` (`--update`), files new or
    /// changed since tagged come before all others, whatever the cycle, so that new content
    /// is protected the same night, and on top of the byte budget: it is the cycle's, which
    /// a night's new files would otherwise stretch without end (the time budget bounds them
    /// all). A budgeted scrub ends with its cycle (the next one begins a new cycle); one
    /// without a budget verifies every file. A byte budget is spent once the bytes of the
    /// files started reach it: the file that reaches it is the last.
    pub fn queue(&self, budget: Budget, untagged_too: bool, now: i64) -> rusqlite::Result<Queue> {
        let conn = self.conn();
        let older = budget.older_than.map(|s| now - s);
        let limit = budget.bytes(self.tagged.1);
        // Within a byte budget only the first files are wanted, and SQLite keeps only as many
        // as a `LIMIT` asks while it sorts (sorting every file was most of a nightly scrub's
        // time on one thread): enough for twice the budget in files of the tree's mean size,
        // asked for again, with more, if they fall short of it. -1: no limit.
        let mut rows = limit.map_or(-1, |bytes| {
            let mean = (self.tagged.1 / self.tagged.0.max(1)).max(1);
            let files = bytes.div_ceil(mean).saturating_mul(2).saturating_add(64);
            files.min(i64::MAX as u64 / 4) as i64
        });
        loop {
            conn.execute_batch(
                "DROP TABLE IF EXISTS queue;
                 CREATE TABLE queue (id INTEGER PRIMARY KEY, path BLOB, size INTEGER, \
                 root INTEGER, cost INTEGER);",
            )?;
            conn.execute(
                "INSERT INTO queue (path, size, root, cost) SELECT path, size, root, \
                 CASE WHEN ?1 AND changed THEN 0 ELSE size END FROM plan \
                 WHERE (tagged OR ?1) \
                 AND (?2 IS NULL OR verified IS NULL OR verified < ?2 OR (?1 AND changed)) \
                 AND NOT (?4 AND coalesce(checked >= ?3, 0) AND NOT (?1 AND changed)) \
                 ORDER BY (?1 AND changed) DESC, coalesce(checked >= ?3, 0), \
                 verified IS NOT NULL, verified, seq LIMIT ?5",
                params![
                    untagged_too,
                    older,
                    self.cycle_started,
                    budget.is_set(),
                    rows
                ],
            )?;
            let (files, bytes): (i64, i64) = conn.query_row(
                "SELECT count(*), coalesce(sum(cost), 0) FROM queue",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )?;
            match limit {
                Some(limit) if files == rows && (bytes as u64) < limit => {
                    rows = rows.saturating_mul(4)
                }
                _ => break,
            }
        }
        // What the queue will give: every file that starts before the budget is spent.
        let planned = match limit {
            None => "SELECT count(*), coalesce(sum(size), 0) FROM queue WHERE ?1 IS NULL",
            Some(_) => {
                "SELECT count(*), coalesce(sum(size), 0) FROM (SELECT id, size, \
                 sum(cost) OVER (ORDER BY id ROWS UNBOUNDED PRECEDING) - cost AS before \
                 FROM queue) WHERE before < ?1 OR id = (SELECT min(id) FROM queue)"
            }
        };
        let (files, bytes): (i64, i64) =
            conn.query_row(planned, [limit.map(|l| l as i64)], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })?;
        Ok(Queue {
            conn: self.conn.clone(),
            failed: self.failed.clone(),
            page: Vec::new().into_iter(),
            last: 0,
            limit,
            taken: 0,
            started: false,
            done: false,
            planned: (files as u64, bytes as u64),
        })
    }

    /// Tagged files (and bytes) checked since the cycle began, now: by inode, so that a file
    /// re-tagged by this run (whose tag the plan no longer holds) counts.
    pub fn cycle_progress(&self) -> rusqlite::Result<(u64, u64)> {
        let (mut files, mut bytes) = (0, 0);
        self.now(|f, e| {
            if f.tagged
                && e.map_or(f.checked, |e| e.checked.max(f.checked)) >= Some(self.cycle_started)
            {
                (files, bytes) = (files + 1, bytes + f.size);
            }
        })?;
        Ok((files, bytes))
    }

    /// Files never verified (untagged ones included), and the oldest verification of the
    /// others that are not damaged (damage is counted apart, and would otherwise age the tree
    /// for ever). After a run: a file it tagged or re-tagged is proven good as of then.
    pub fn ages(&self) -> rusqlite::Result<(u64, Option<i64>)> {
        let damaged = self.damaged_now()?;
        let (mut never, mut oldest) = (0, None::<i64>);
        self.now(
            |f, e| match e.map_or(f.verified, |e| e.verified.max(f.verified)) {
                None => never += 1,
                Some(v) => {
                    let damaged =
                        e.is_some_and(|e| damaged.contains(&(e.fs, e.ino, e.key.clone())));
                    if f.tagged && !damaged {
                        oldest = Some(oldest.map_or(v, |o| o.min(v)));
                    }
                }
            },
        )?;
        Ok((never, oldest))
    }

    /// The damage the state database knows now, by file.
    fn damaged_now(&self) -> rusqlite::Result<std::collections::HashSet<(i64, i64, Vec<u8>)>> {
        let conn = self.conn();
        let mut stmt = conn.prepare("SELECT fs, ino, digest FROM state.damage")?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
        rows.collect()
    }

    /// The damage known under the roots: found by a check and neither repaired, accepted nor
    /// edited since (the state database), or marked on the file by a writing verb and not
    /// judged since (a database lost, or a check found it whole). A file whose tag was
    /// stripped since is still damaged while the database knows damage of its inode: a tag
    /// taken off does not make damaged bytes good.
    pub fn damage(&self) -> rusqlite::Result<Vec<state::Damaged>> {
        let conn = self.conn();
        let mut stmt = conn.prepare(
            "SELECT path, coalesce(status, 'corrupt'), coalesce(damaged, marked) FROM plan \
             WHERE damaged IS NOT NULL \
             OR (marked IS NOT NULL AND (checked IS NULL OR checked < marked)) ORDER BY seq",
        )?;
        let rows = stmt.query_map([], |r| {
            let path: Vec<u8> = r.get(0)?;
            Ok(state::Damaged {
                path: PathBuf::from(std::ffi::OsString::from_vec(path)),
                status: r.get(1)?,
                found: r.get(2)?,
            })
        })?;
        rows.collect()
    }

    /// Tagged files not checked since `at` (when the state database was rebuilt), now.
    pub fn unchecked_since(&self, at: i64) -> rusqlite::Result<u64> {
        let mut n = 0;
        self.now(|f, e| {
            if f.tagged
                && e.map_or(f.checked, |e| e.checked.max(f.checked))
                    .is_none_or(|c| c < at)
            {
                n += 1;
            }
        })?;
        Ok(n)
    }

    /// What `status` shows: verification ages, damage not yet repaired, copies; files last
    /// proven good before `deadline` (Unix milliseconds) are overdue.
    pub fn overview(&self, now: i64, deadline: i64) -> rusqlite::Result<Overview> {
        let damage = self.damage()?;
        let conn = self.conn();
        let day = 86_400_000i64;
        // One pass over the plan for every count (per age bucket, copies, this cycle), added
        // up here: the same sums as aggregates in SQL took three times as long (21 of them,
        // each filtered, on every file).
        let mut ages = [Count::default(); AGES.len()];
        let [mut protected, mut archived, mut cycle_verified, mut overdue] = [Count::default(); 4];
        let mut oldest: Option<i64> = None;
        // When the archive of a run became durable, by run.
        let mut copied = std::collections::HashMap::<i64, Option<i64>>::new();
        let mut stmt = conn.prepare(
            "SELECT verified, size, protected, archived, archived_in, checked, damaged \
             FROM plan WHERE tagged",
        )?;
        let mut rows = stmt.query([])?;
        while let Some(r) = rows.next()? {
            let verified: Option<i64> = r.get(0)?;
            let size = r.get::<_, i64>(1)? as u64;
            let add = |c: &mut Count| *c = (c.files + 1, c.bytes + size).into();
            let bucket = match verified {
                None => 0,
                Some(v) => AGES
                    .iter()
                    .position(|(_, days)| days.is_some_and(|d| now - v < d * day))
                    .unwrap_or(AGES.len() - 1),
            };
            add(&mut ages[bucket]);
            if r.get::<_, Option<i64>>(2)?.is_some() {
                add(&mut protected);
            }
            let copy = match (r.get::<_, Option<i64>>(3)?, r.get::<_, Option<i64>>(4)?) {
                (Some(at), _) => Some(at),
                (None, Some(run)) => state::copied(&conn, "state.", &mut copied, run)?,
                (None, None) => None,
            };
            if copy.is_some() {
                add(&mut archived);
            }
            if r.get::<_, Option<i64>>(5)?
                .is_some_and(|c| c >= self.cycle_started)
            {
                add(&mut cycle_verified);
            }
            if r.get::<_, Option<i64>>(6)?.is_none()
                && let Some(v) = verified
            {
                oldest = Some(oldest.map_or(v, |o| o.min(v)));
                if v < deadline {
                    add(&mut overdue);
                }
            }
        }
        let ages = AGES
            .iter()
            .zip(ages)
            .map(|((label, _), c)| Age {
                label,
                files: c.files,
                bytes: c.bytes,
            })
            .collect();
        Ok(Overview {
            tagged: self.tagged.into(),
            untagged: self.untagged.into(),
            ages,
            damage,
            protected,
            parity: None,
            archived,
            cycle_verified,
            overdue,
            oldest,
        })
    }

    /// What parity the tagged files have in their trees' own stores, if any tree has one.
    pub fn parity(&self, roots: &[PathBuf]) -> rusqlite::Result<Option<Parity>> {
        // A root's own store, or its tree's above it (a status of a subfolder).
        let dirs: Vec<Option<PathBuf>> =
            roots.iter().map(|r| crate::parity::store_over(r)).collect();
        let stores: Vec<Option<crate::parity::Store>> = dirs
            .iter()
            .map(|dir| {
                dir.as_ref()
                    .and_then(|d| crate::parity::Store::read(d).ok())
            })
            .collect();
        if stores.iter().all(Option::is_none) {
            return Ok(None);
        }
        let mut parity = Parity::default();
        let conn = self.conn();
        let mut stmt = conn.prepare("SELECT digest, size, root, abs FROM plan WHERE tagged")?;
        let mut rows = stmt.query([])?;
        // Pack members met under the name their pack records, and under another only.
        let (mut placed, mut misplaced) = (std::collections::HashSet::new(), Vec::new());
        while let Some(r) = rows.next()? {
            let (key, size, root): (Vec<u8>, i64, i64) = (r.get(0)?, r.get(1)?, r.get(2)?);
            let store = stores.get(root as usize).and_then(Option::as_ref);
            if let (Some(store), Some(d)) = (store, state::digest_from_key(&key)) {
                let abs: Vec<u8> = r.get(3)?;
                let name = Path::new(std::ffi::OsStr::from_bytes(&abs))
                    .strip_prefix(&store.root)
                    .map_or(&abs[..], |p| p.as_os_str().as_bytes());
                match store.packed_at(&d, name) {
                    Some(true) => {
                        placed.insert(d);
                    }
                    Some(false) => misplaced.push((d, size.max(0) as u64)),
                    None => {}
                }
            }
            let count = match (store, state::digest_from_key(&key)) {
                (Some(store), Some(d)) => match store.current(&d) {
                    Some(true) => &mut parity.current,
                    Some(false) => &mut parity.stale,
                    None => &mut parity.none,
                },
                _ => &mut parity.none,
            };
            count.files += 1;
            count.bytes += size.max(0) as u64;
        }
        for (d, size) in misplaced {
            if !placed.contains(&d) {
                parity.misnamed.files += 1;
                parity.misnamed.bytes += size;
            }
        }
        // A store two roots share counts once.
        let mut counted = std::collections::HashSet::new();
        for (dir, store) in dirs.iter().zip(&stores) {
            let Some(store) = store.as_ref().filter(|_| counted.insert(dir)) else {
                continue;
            };
            let (current, stale) = store.sizes();
            parity.store_bytes += current;
            parity.stale_bytes += stale;
        }
        Ok(Some(parity))
    }

    /// Calls `each` with every tagged file's path, size and what the state database says of
    /// it: never verified ones first, then the least recently verified.
    pub fn files(&self, mut each: impl FnMut(FileState)) -> rusqlite::Result<()> {
        let conn = self.conn();
        let mut stmt = conn.prepare(
            "SELECT path, size, verified, checked, status, damaged, protected, archived, \
             archived_in FROM plan WHERE tagged ORDER BY verified IS NOT NULL, verified, seq",
        )?;
        let mut copied = HashMap::<i64, Option<i64>>::new();
        let mut rows = stmt.query([])?;
        while let Some(r) = rows.next()? {
            let path: Vec<u8> = r.get(0)?;
            let archived = match (r.get::<_, Option<i64>>(7)?, r.get::<_, Option<i64>>(8)?) {
                (Some(at), _) => Some(at),
                (None, Some(run)) => state::copied(&conn, "state.", &mut copied, run)?,
                (None, None) => None,
            };
            each(FileState {
                path: PathBuf::from(std::ffi::OsString::from_vec(path)),
                size: r.get::<_, i64>(1)? as u64,
                verified: r.get(2)?,
                checked: r.get(3)?,
                status: r.get(4)?,
                damaged: r.get(5)?,
                protected: r.get::<_, Option<i64>>(6)?.is_some(),
                archived: archived.is_some(),
            });
        }
        Ok(())
    }

    /// Why the queue ended before its end, if it did.
    pub fn failure(&self) -> Option<String> {
        self.failed.lock().ok().and_then(|f| f.clone())
    }
}

/// A scrub's queue, read a page at a time.
pub struct Queue {
    conn: Arc<Mutex<Connection>>,
    failed: Arc<Mutex<Option<String>>>,
    /// Rows: id, path, size, root, and what the file costs of the byte budget.
    page: std::vec::IntoIter<(i64, PathBuf, u64, usize, u64)>,
    last: i64,
    limit: Option<u64>,
    taken: u64,
    started: bool,
    done: bool,
    /// The files and bytes it will give, if the time budget lasts.
    pub planned: (u64, u64),
}

/// Rows read from the queue at a time.
const PAGE: i64 = 1024;

impl Queue {
    fn next_page(&mut self) -> rusqlite::Result<()> {
        let conn = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        let mut stmt = conn.prepare_cached(
            "SELECT id, path, size, root, cost FROM queue WHERE id > ?1 ORDER BY id LIMIT ?2",
        )?;
        let rows = stmt
            .query_map(params![self.last, PAGE], |r| {
                let path: Vec<u8> = r.get(1)?;
                Ok((
                    r.get::<_, i64>(0)?,
                    PathBuf::from(std::ffi::OsStr::from_bytes(&path)),
                    r.get::<_, i64>(2)? as u64,
                    r.get::<_, i64>(3)? as usize,
                    r.get::<_, i64>(4)? as u64,
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
        let (id, path, size, root, cost) = match self.page.next() {
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
            && cost > 0
            && self.taken >= limit
        {
            self.done = true;
            return None;
        }
        self.started = true;
        self.taken += cost;
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
    /// Damage found and neither repaired, accepted nor edited since.
    pub damage: Vec<state::Damaged>,
    /// Tagged files whose content has a parity set, and their bytes: where the trees have
    /// stores, a current set (in the store, not moved aside); else as the state database
    /// recorded it written.
    pub protected: Count,
    /// What the trees' own parity stores hold for the tagged files, if any tree has one.
    pub parity: Option<Parity>,
    /// Tagged files whose content was archived, and their bytes.
    pub archived: Count,
    /// Tagged files checked since the current cycle began, and their bytes.
    pub cycle_verified: Count,
    /// Tagged files, not damaged, last proven good before the deadline the status set (1.5
    /// cycles, or 45 days): the scrubs do not keep up.
    pub overdue: Count,
    /// The least recent verification (Unix milliseconds).
    pub oldest: Option<i64>,
}

/// The parity the tagged files' contents have in their trees' own stores (read from the
/// stores' names and pack indexes: no data is read).
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct Parity {
    /// A current set: written from verified bytes, and in the store.
    pub current: Count,
    /// Only a set moved aside as stale (still a source for repair, until removed).
    pub stale: Count,
    /// None.
    pub none: Count,
    /// Bytes of the stores' current sets ...
    pub store_bytes: u64,
    /// ... and of the sets moved aside.
    pub stale_bytes: u64,
    /// Files in packs that record them under another name (moved since they were packed):
    /// par2cmdline would see them missing until a `protect` of the whole tree writes their
    /// packs again (intact's repair finds them by tag). Large files' own sets are not read
    /// here: the same `protect` renames them.
    pub misnamed: Count,
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

/// A file the state database knew under the roots that is no longer there.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Gone {
    /// Where it was last seen.
    #[serde(serialize_with = "crate::text::escaped")]
    pub path: PathBuf,
    /// When it was last verified (Unix milliseconds).
    pub verified: Option<i64>,
    /// When it had been found damaged, if it was.
    pub damaged: Option<i64>,
    /// When a scrub found it gone.
    pub gone: Option<i64>,
}

impl Gone {
    fn from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Gone> {
        let path: Vec<u8> = r.get(0)?;
        Ok(Gone {
            path: PathBuf::from(std::ffi::OsString::from_vec(path)),
            verified: r.get(1)?,
            damaged: r.get(2)?,
            gone: r.get(3)?,
        })
    }
}

/// A file of the plan, as [`Plan::now`] gives it.
struct PlanFile {
    fs: i64,
    ino: i64,
    tagged: bool,
    size: u64,
    /// Its history as the plan knows it: under another of its names (a hard link the walk
    /// met first), the file has no entry of its own.
    verified: Option<i64>,
    checked: Option<i64>,
}

/// A tagged file, as the state database knows it (`status -v`).
#[derive(Debug, Clone)]
pub struct FileState {
    /// Where it is, as walked.
    pub path: PathBuf,
    /// Its size.
    pub size: u64,
    /// When its data last matched its tag (Unix milliseconds).
    pub verified: Option<i64>,
    /// When it was last judged.
    pub checked: Option<i64>,
    /// That verdict.
    pub status: Option<String>,
    /// When damage was found in it, if it is damaged.
    pub damaged: Option<i64>,
    /// Whether a parity set was written for its content.
    pub protected: bool,
    /// Whether its content was archived.
    pub archived: bool,
}

/// The largest folder all of whose recorded files are among `removed` (files gone at once, not
/// moved: a folder renamed is met elsewhere), and how many it held; none of fewer than
/// [`MASS_REMOVAL_SMALL`].
fn whole_folder(conn: &Connection, removed: &[&Unmet]) -> rusqlite::Result<Option<(PathBuf, u64)>> {
    let mut by_folder: HashMap<Vec<u8>, u64> = HashMap::new();
    for u in removed {
        let path = u.path();
        if let Some(at) = path.iter().rposition(|&b| b == b'/') {
            *by_folder.entry(path[..at].to_vec()).or_default() += 1;
        }
    }
    let mut best: Option<(PathBuf, u64)> = None;
    for (folder, gone) in by_folder {
        if gone < MASS_REMOVAL_SMALL || best.as_ref().is_some_and(|(_, n)| *n >= gone) {
            continue;
        }
        // The files recorded directly in it: met by the walk there, or not met (those gone
        // among them).
        let (low, high) = ([&folder[..], b"/"].concat(), [&folder[..], b"0"].concat());
        let after = folder.len() as i64 + 2;
        let recorded: i64 = conn.query_row(
            "SELECT (SELECT count(*) FROM plan WHERE known AND abs >= ?1 AND abs < ?2 \
             AND instr(substr(abs, ?3), '/') = 0) \
             + (SELECT count(*) FROM unmet WHERE path >= ?1 AND path < ?2 \
             AND instr(substr(path, ?3), '/') = 0)",
            params![low, high, after],
            |r| r.get(0),
        )?;
        if recorded as u64 == gone {
            best = Some((PathBuf::from(std::ffi::OsString::from_vec(folder)), gone));
        }
    }
    Ok(best)
}
