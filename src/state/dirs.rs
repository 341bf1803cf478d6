//! The directories' values: read, changed by what a run recorded, written back once; and
//! laid out as rows (one a file, schema 3's shape) for the queries that read many files at
//! once (a scrub's plan, `status`, a repair's known damage).

use std::collections::{HashMap, HashSet};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use rusqlite::{Connection, OptionalExtension, params};

use super::entries::{Copied, Entry, Proof, bytes, decode, encode, find, join, split};
use super::paths::{absolute, under};
use super::rows::{Fact, Row};

/// The entries of the directory `dir` (none if it has no value, or one that does not decode:
/// a cache loses only its schedule), with what a run that proved them all good since says.
pub(crate) fn load(conn: &Connection, from: &str, dir: &[u8]) -> rusqlite::Result<Vec<Entry>> {
    let value: Option<(Vec<u8>, Option<Proof>)> = conn
        .prepare_cached(&format!(
            "SELECT d.entries, {PROOF} FROM {from}dirs d LEFT JOIN {from}proven p \
             ON p.path = d.path WHERE d.path = ?1"
        ))?
        .query_row([dir], |r| Ok((r.get(0)?, Proof::read(r, 1)?)))
        .optional()?;
    let Some((value, proof)) = value else {
        return Ok(Vec::new());
    };
    let mut entries = decode(&value).unwrap_or_default();
    if let Some(proof) = proof {
        proof.apply(&mut entries);
    }
    Ok(entries)
}

/// The columns of `proven` (as `p`) that [`Proof::read`] reads.
const PROOF: &str = "p.run, p.at, p.archived_in, p.archived";

/// Writes the entries of `dir` (removes its value if there are none): what they say stands
/// alone, so a run that proved them good before is forgotten.
pub(crate) fn store(
    conn: &Connection,
    from: &str,
    dir: &[u8],
    entries: &[Entry],
) -> rusqlite::Result<()> {
    if entries.is_empty() {
        conn.prepare_cached(&format!("DELETE FROM {from}dirs WHERE path = ?1"))?
            .execute([dir])?;
    } else {
        conn.prepare_cached(&format!(
            "INSERT INTO {from}dirs (path, entries) VALUES (?1, ?2) \
             ON CONFLICT DO UPDATE SET entries = excluded.entries"
        ))?
        .execute(params![dir, encode(entries)])?;
    }
    conn.prepare_cached(&format!("DELETE FROM {from}proven WHERE path = ?1"))?
        .execute([dir])?;
    Ok(())
}

/// Removes the entry of the file at `path` if it is still the one of `(fs, ino, key)`, and
/// returns it.
pub(crate) fn forget(
    conn: &Connection,
    from: &str,
    path: &[u8],
    (fs, ino, key): (i64, i64, &[u8]),
) -> rusqlite::Result<Option<Entry>> {
    let (dir, name) = split(path);
    let mut entries = load(conn, from, dir)?;
    let Ok(at) = find(&entries, name) else {
        return Ok(None);
    };
    let e = &entries[at];
    if (e.fs, e.ino, e.key.as_slice()) != (fs, ino, key) {
        return Ok(None);
    }
    let e = entries.remove(at);
    store(conn, from, dir, &entries)?;
    Ok(Some(e))
}

/// Puts `entry` at `path` (a file found moved there), unless an entry is there already; then
/// that one keeps what it knows, and takes the moved one's copies where it has none.
pub(crate) fn settle_moved(
    conn: &Connection,
    from: &str,
    path: &[u8],
    mut entry: Entry,
) -> rusqlite::Result<()> {
    let (dir, name) = split(path);
    let mut entries = load(conn, from, dir)?;
    match find(&entries, name) {
        Ok(at) => {
            let e = &mut entries[at];
            if (e.fs, e.ino, &e.key) != (entry.fs, entry.ino, &entry.key) {
                return Ok(());
            }
            e.protected = e.protected.or(entry.protected);
            if e.archived.is_none() && e.archived_in.is_none() {
                (e.archived, e.archived_in) = (entry.archived, entry.archived_in);
            }
            e.verified = e.verified.max(entry.verified);
        }
        Err(at) => {
            entry.name = name.to_vec();
            entries.insert(at, entry);
        }
    }
    store(conn, from, dir, &entries)
}

/// A file as damage knows it: file system, inode, the digest key of its tag.
type FileKey = (i64, i64, Vec<u8>);

/// What the writer holds of the directories it is changing, in one transaction: each
/// directory's entries read once and written once (rows come in walk order, so a directory's
/// files come together), the damage known, and which runs' archives are durable.
#[derive(Default)]
pub(super) struct Open {
    dirs: HashMap<Vec<u8>, Held>,
    /// The directory of the last row: left open for the next batch, which likely goes on
    /// with it.
    last: Vec<u8>,
    /// The damage rows (their path by key), read when the transaction began.
    damage: Option<HashMap<FileKey, Vec<u8>>>,
    copied: HashMap<i64, Option<i64>>,
}

impl Open {
    /// Applies `rows` (of the run `seen`): owned, so that a proof is kept without a copy.
    pub(super) fn write(
        &mut self,
        conn: &Connection,
        rows: Vec<Row>,
        seen: Option<i64>,
    ) -> rusqlite::Result<()> {
        if self.damage.is_none() {
            let mut stmt = conn.prepare_cached("SELECT fs, ino, digest, path FROM damage")?;
            let keys = stmt
                .query_map([], |r| Ok(((r.get(0)?, r.get(1)?, r.get(2)?), r.get(3)?)))?
                .collect::<rusqlite::Result<_>>()?;
            self.damage = Some(keys);
        }
        for row in rows {
            let (dir, name) = split(&row.path);
            if dir != self.last.as_slice() {
                self.last = dir.to_vec();
            }
            let held = match self.dirs.get_mut(dir) {
                Some(held) => held,
                None => {
                    let held = Held::open(conn, dir, seen, row.t)?;
                    self.dirs.entry(dir.to_vec()).or_insert(held)
                }
            };
            held.at = held.at.max(row.t);
            let proof = held.proves(&row);
            // A directory whose entries are known by their print is not read while every row
            // is a proof: the prints of the proofs are summed, and compared at the end.
            if let Some(proofs) = &mut held.proofs {
                if proof {
                    held.sum = held.sum.wrapping_add(Print::of_row(&row));
                    keep_damage(&mut self.damage, conn, &row)?;
                    proofs.push(row);
                    continue;
                }
                held.read(conn, dir)?;
                let proofs = held.proofs_read.take().unwrap_or_default();
                for p in &proofs {
                    held.take(p, split(&p.path).1, seen, conn, &mut self.copied)?;
                }
            }
            held.take(&row, name, seen, conn, &mut self.copied)?;
            keep_damage(&mut self.damage, conn, &row)?;
        }
        // Directories the walk has left are done with: written now, so that what the writer
        // holds stays about a batch.
        let last = &self.last;
        let done: Vec<Vec<u8>> = self.dirs.keys().filter(|d| *d != last).cloned().collect();
        for dir in done {
            if let Some(held) = self.dirs.remove(&dir) {
                held.write(conn, &dir, &mut self.copied)?;
            }
        }
        Ok(())
    }
}

impl Held {
    /// The directory `dir`, as the database has it: its print if a run proved it good (its
    /// entries are read only if need be), else its entries.
    fn open(conn: &Connection, dir: &[u8], run: Option<i64>, at: i64) -> rusqlite::Result<Held> {
        let (print, marked): (Option<Vec<u8>>, Option<Copied>) = conn
            .prepare_cached("SELECT print, archived_in, archived FROM proven WHERE path = ?1")?
            .query_row([dir], |r| Ok((r.get(0)?, Copied::read(r, 1)?)))
            .optional()?
            .unwrap_or_default();
        let mut held = Held {
            entries: Vec::new(),
            proven: Vec::new(),
            added: std::collections::BTreeMap::new(),
            only_proven: true,
            run,
            at,
            stored: print.as_deref().and_then(Print::from_bytes),
            marked,
            archiving: None,
            proofs: None,
            proofs_read: None,
            sum: 0,
        };
        match held.stored {
            Some(_) => held.proofs = Some(Vec::new()),
            None => held.read(conn, dir)?,
        }
        Ok(held)
    }

    /// Reads the entries (the proofs gathered so far are to be taken as rows again).
    fn read(&mut self, conn: &Connection, dir: &[u8]) -> rusqlite::Result<()> {
        self.entries = load(conn, "", dir)?;
        self.proven = vec![None; self.entries.len()];
        self.proofs_read = self.proofs.take();
        Ok(())
    }

    /// Takes `row` (of the file `name`) into the entries.
    fn take(
        &mut self,
        row: &Row,
        name: &[u8],
        seen: Option<i64>,
        conn: &Connection,
        copies: &mut HashMap<i64, Option<i64>>,
    ) -> rusqlite::Result<()> {
        let found = find(&self.entries, name);
        // Proven good, the same file under the same tag and size as its entry says.
        let same =
            |e: &Entry| (e.fs, e.ino, &e.key, e.size) == (row.fs, row.ino, &row.key, row.size);
        match found {
            // Marked only, while every row of the directory is such a proof (the common
            // case, and what costs a check of many small files).
            Ok(at) if self.only_proven && same(&self.entries[at]) && self.proves(row) => {
                self.proven[at] = Some(row.t);
                return Ok(());
            }
            _ => self.settle(seen, conn, copies)?,
        }
        // A name new to the directory waits beside its entries, which stay sorted for
        // the lookups (inserting each in place moved the others: a first tag of folders
        // of 1,000 files took twice as long).
        let e = match found {
            Ok(at) => &mut self.entries[at],
            Err(_) => self
                .added
                .entry(name.to_vec())
                .or_insert_with(|| fresh(name, row)),
        };
        let archived = match row.fact {
            Fact::Archived | Fact::VerifiedArchived => before(e, conn, copies)?,
            _ => None,
        };
        apply(e, row, seen, archived);
        Ok(())
    }

    /// Whether `row` proves its file good, unchanged, as the directory's other proofs do: all
    /// verifications, or all verifications of files archived too (what one run records).
    fn proves(&mut self, row: &Row) -> bool {
        let archived = match row.fact {
            Fact::Verified => false,
            Fact::VerifiedArchived => true,
            _ => return false,
        };
        row.status == "ok"
            && row.was.is_none()
            && *self.archiving.get_or_insert(archived) == archived
    }

    /// What the row in `proven` is to say of the archive every entry was last copied into:
    /// as it said, unless this run archived them all; `None` if that cannot be one mark.
    fn remark(
        &self,
        conn: &Connection,
        copies: &mut HashMap<i64, Option<i64>>,
    ) -> rusqlite::Result<Option<Option<Copied>>> {
        Ok(match (self.archiving, self.run) {
            (Some(true), Some(run)) => self.mark(run, conn, copies)?.map(Some),
            (Some(true), None) => None,
            _ => Some(self.marked),
        })
    }

    /// The mark that says every entry was copied into the archive of `run` (in place of
    /// each entry rewritten), from the mark before or else from the entries: none if they
    /// differ in what they keep of the archive they were in before.
    fn mark(
        &self,
        run: i64,
        conn: &Connection,
        copies: &mut HashMap<i64, Option<i64>>,
    ) -> rusqlite::Result<Option<Copied>> {
        if let Some(m) = self.marked {
            let kept = copied(conn, "", copies, m.run)?.or(m.kept);
            return Ok(Some(Copied { run, kept }));
        }
        // What each entry will keep (as `apply` makes it): a mark keeps none where each
        // keeps its own, or one where all keep the same.
        let (mut own, mut first, mut same) = (true, None, true);
        for e in &self.entries {
            let kept = before(e, conn, copies)?.or(e.archived);
            own &= kept == e.archived;
            same &= *first.get_or_insert(kept) == kept;
        }
        Ok(match first {
            _ if own => Some(Copied { run, kept: None }),
            Some(Some(kept)) if same => Some(Copied {
                run,
                kept: Some(kept),
            }),
            _ => None,
        })
    }
}

/// Keeps the damage table, and `known` (what it holds, by file), as `row` says: damage
/// found, or ended. (Of [`Open`]'s fields, this one alone: the directory held stays borrowed.)
fn keep_damage(
    known: &mut Option<HashMap<FileKey, Vec<u8>>>,
    conn: &Connection,
    row: &Row,
) -> rusqlite::Result<()> {
    let known = known.get_or_insert_with(HashMap::new);
    match (row.fact, &row.damage) {
        (Fact::Damaged, Some((damaged, found))) => {
            conn.prepare_cached(
                "INSERT INTO damage (fs, ino, digest, path, damaged_digest, found, status) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT DO UPDATE SET path = ?4, \
                     damaged_digest = ?5, status = ?7",
            )?
            .execute(params![
                row.fs, row.ino, row.key, row.path, damaged, found, row.status
            ])?;
            known.insert((row.fs, row.ino, row.key.clone()), row.path.clone());
        }
        // Damage ends when the file is proven good, edited, repaired, or re-tagged where
        // it was found (damage accepted).
        (Fact::Verified | Fact::VerifiedArchived | Fact::Edited | Fact::Repaired, _) => {
            let inodes = [
                Some(row.ino),
                row.old_ino.filter(|_| row.fact == Fact::Repaired),
            ];
            let ended: Vec<FileKey> = known
                .iter()
                .filter(|((fs, ino, key), path)| {
                    *fs == row.fs
                        && inodes.contains(&Some(*ino))
                        && (*key == row.key || **path == row.path)
                })
                .map(|(k, _)| k.clone())
                .collect();
            for key in ended {
                known.remove(&key);
                conn.prepare_cached(
                    "DELETE FROM damage WHERE fs = ?1 AND ino = ?2 AND digest = ?3",
                )?
                .execute(params![key.0, key.1, key.2])?;
            }
        }
        _ => {}
    }
    Ok(())
}

impl Open {
    /// Writes every directory still held; the transaction can commit.
    pub(super) fn flush(&mut self, conn: &Connection) -> rusqlite::Result<()> {
        for (dir, held) in std::mem::take(&mut self.dirs) {
            held.write(conn, &dir, &mut self.copied)?;
        }
        self.forget();
        Ok(())
    }

    /// Forgets what it held (the transaction ended: committed, or rolled back).
    pub(super) fn forget(&mut self) {
        self.dirs.clear();
        self.damage = None;
        self.copied.clear();
    }
}

/// A directory being changed.
struct Held {
    entries: Vec<Entry>,
    /// When this transaction proved each entry good, unchanged (not yet in the entry).
    proven: Vec<Option<i64>>,
    /// Entries of names new to the directory.
    added: std::collections::BTreeMap<Vec<u8>, Entry>,
    /// Whether every row so far only proved an entry good, unchanged: then, if every entry
    /// was, the directory is recorded as proven (one small row), its entries left as they
    /// are.
    only_proven: bool,
    /// The run, and the time of the latest row.
    run: Option<i64>,
    at: i64,
    /// The print of the entries a run proved good, if one did.
    stored: Option<(u128, i64)>,
    /// The archive its row in `proven` says every entry was last copied into.
    marked: Option<Copied>,
    /// Whether the proofs so far were of files archived too (a run's proofs are all one or
    /// all the other): none before the first.
    archiving: Option<bool>,
    /// While the entries are not read: the proofs so far, and the sum of their prints.
    proofs: Option<Vec<Row>>,
    proofs_read: Option<Vec<Row>>,
    sum: u128,
}

/// What a directory's entries are, in 24 bytes: the sum of a hash of each entry's name, file
/// system, inode, tag and size (XXH3, 128 bits: a cache's check, not a security one), and
/// their number. A run whose proofs sum to it proved every entry good, unchanged. Prints
/// stored by earlier builds (BLAKE3's) no longer match: each such directory has its entries
/// read once, by the next run that proves it, which stores its print anew.
struct Print;

impl Print {
    fn of(name: &[u8], fs: i64, ino: i64, key: &[u8], size: i64) -> u128 {
        // The fields end to end, hashed in one call; on the stack unless a name is longer
        // than Linux allows. Once a file, on the writer's one thread: BLAKE3 (300 ns on 100
        // bytes) was two fifths of the writer's time on 20,000 files of 4 KiB.
        let len = 40 + name.len() + key.len();
        let (mut stack, mut heap) = ([0u8; 384], Vec::new());
        let buf = match stack.get_mut(..len) {
            Some(b) => b,
            None => {
                heap.resize(len, 0);
                &mut heap[..]
            }
        };
        let mut at = 0;
        for part in [
            &(name.len() as u64).to_le_bytes()[..],
            name,
            &fs.to_le_bytes(),
            &ino.to_le_bytes(),
            &(key.len() as u64).to_le_bytes(),
            key,
            &size.to_le_bytes(),
        ] {
            buf[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
        xxhash_rust::xxh3::xxh3_128(&buf[..at])
    }

    fn of_row(row: &Row) -> u128 {
        Print::of(split(&row.path).1, row.fs, row.ino, &row.key, row.size)
    }

    fn of_entries(entries: &[Entry]) -> (u128, i64) {
        let sum = entries.iter().fold(0u128, |s, e| {
            s.wrapping_add(Print::of(&e.name, e.fs, e.ino, &e.key, e.size))
        });
        (sum, entries.len() as i64)
    }

    fn to_bytes((sum, n): (u128, i64)) -> Vec<u8> {
        let mut v = sum.to_le_bytes().to_vec();
        v.extend_from_slice(&n.to_le_bytes());
        v
    }

    fn from_bytes(b: &[u8]) -> Option<(u128, i64)> {
        let sum = u128::from_le_bytes(b.get(..16)?.try_into().ok()?);
        let n = i64::from_le_bytes(b.get(16..24)?.try_into().ok()?);
        Some((sum, n))
    }
}

impl Held {
    /// Puts the proofs marked so far into the entries: they are to be written.
    fn settle(
        &mut self,
        seen: Option<i64>,
        conn: &Connection,
        copies: &mut HashMap<i64, Option<i64>>,
    ) -> rusqlite::Result<()> {
        if !self.only_proven {
            return Ok(());
        }
        self.only_proven = false;
        let archived = self.archiving == Some(true);
        for (e, t) in self.entries.iter_mut().zip(&self.proven) {
            if let Some(t) = *t {
                (e.verified, e.checked, e.seen) = (Some(t), Some(t), seen);
                if e.status != "ok" {
                    e.status = "ok".into();
                }
                if archived {
                    let before = before(e, conn, copies)?;
                    archive(e, seen, before);
                }
            }
        }
        Ok(())
    }

    fn write(
        mut self,
        conn: &Connection,
        dir: &[u8],
        copies: &mut HashMap<i64, Option<i64>>,
    ) -> rusqlite::Result<()> {
        if let Some(proofs) = &self.proofs {
            // Every entry proved good, unchanged, and nothing else: the proof row only (an
            // archive's mark made from the one before: without one, from the entries).
            if self.stored == Some((self.sum, proofs.len() as i64))
                && (self.archiving != Some(true) || self.marked.is_some())
                && let Some(mark) = self.remark(conn, copies)?
            {
                conn.prepare_cached(
                    "UPDATE proven SET run = ?2, at = ?3, archived_in = ?4, archived = ?5 \
                     WHERE path = ?1",
                )?
                .execute(params![
                    dir,
                    self.run,
                    self.at,
                    mark.map(|m| m.run),
                    mark.and_then(|m| m.kept)
                ])?;
                return Ok(());
            }
            self.read(conn, dir)?;
            for p in self.proofs_read.take().unwrap_or_default() {
                self.take(&p, split(&p.path).1, self.run, conn, copies)?;
            }
        }
        if self.only_proven
            && self.proven.iter().all(Option::is_some)
            && let Some(mark) = self.remark(conn, copies)?
        {
            let print = Print::to_bytes(Print::of_entries(&self.entries));
            conn.prepare_cached(
                "INSERT OR REPLACE INTO proven (path, run, at, print, archived_in, archived) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?
            .execute(params![
                dir,
                self.run,
                self.at,
                print,
                mark.map(|m| m.run),
                mark.and_then(|m| m.kept)
            ])?;
            return Ok(());
        }
        self.settle(self.run, conn, copies)?;
        if !self.added.is_empty() {
            self.entries
                .extend(std::mem::take(&mut self.added).into_values());
            self.entries.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        }
        store(conn, "", dir, &self.entries)
    }
}

/// When the archive of `run` became durable, if it did: asked of the database once a run,
/// in the schema `from` (`"state."` where it is attached).
pub(crate) fn copied(
    conn: &Connection,
    from: &str,
    cache: &mut HashMap<i64, Option<i64>>,
    run: i64,
) -> rusqlite::Result<Option<i64>> {
    if let Some(&c) = cache.get(&run) {
        return Ok(c);
    }
    let c: Option<i64> = conn
        .prepare_cached(&format!("SELECT copied FROM {from}runs WHERE id = ?1"))?
        .query_row([run], |r| r.get(0))
        .optional()?
        .flatten();
    cache.insert(run, c);
    Ok(c)
}

/// When the archive the entry `e` was last copied into became durable, if it did.
fn before(
    e: &Entry,
    conn: &Connection,
    copies: &mut HashMap<i64, Option<i64>>,
) -> rusqlite::Result<Option<i64>> {
    match e.archived_in {
        Some(run) => copied(conn, "", copies, run),
        None => Ok(None),
    }
}

/// Records `row` in the entry of its file's name `e` (a fresh one if there was none), of the
/// run `seen`; `copied`: when the archive the entry last named became durable. A file under
/// a new inode or a new tag replaces the entry of its name (a re-tag, an editor's save, a
/// restore), keeping nothing of it but, for a repair, the copies (the same content).
pub(super) fn apply(e: &mut Entry, row: &Row, seen: Option<i64>, copied: Option<i64>) {
    if (e.fs, e.ino, &e.key) != (row.fs, row.ino, &row.key) {
        let same_content = row.fact == Fact::Repaired
            && Some(e.ino) == row.old_ino
            && (e.fs, &e.key) == (row.fs, &row.key);
        let kept = same_content.then(|| {
            (
                e.protected,
                e.archived.or_else(|| e.archived_in.and(copied)),
                e.archived_in,
            )
        });
        let name = std::mem::take(&mut e.name);
        *e = fresh(&name, row);
        if let Some((protected, archived, archived_in)) = kept {
            (e.protected, e.archived, e.archived_in) = (protected, archived, archived_in);
        }
    }
    e.size = row.size;
    e.seen = seen;
    if let Some(was) = &row.was {
        e.was = was.clone();
    }
    let t = Some(row.t);
    let verdict = |e: &mut Entry| {
        e.checked = t;
        if e.status != row.status {
            e.status = row.status.to_string();
        }
    };
    match row.fact {
        Fact::Verified | Fact::VerifiedArchived => {
            verdict(e);
            e.verified = t;
        }
        Fact::Repaired => {
            e.verified = t;
            e.checked = t;
            e.status = "repaired".into();
        }
        Fact::Damaged | Fact::Edited | Fact::Judged => verdict(e),
        Fact::Protected => e.protected = t,
        Fact::Archived => {}
    }
    if matches!(row.fact, Fact::Archived | Fact::VerifiedArchived) {
        archive(e, seen, copied);
    }
}

/// Records the entry `e` copied into the archive of the run `seen`; `copied`: when the
/// archive it was last in before became durable. This run's archive stands once its copies
/// are durable; the one before, if its copies are, is the file's latest copy till then.
fn archive(e: &mut Entry, seen: Option<i64>, copied: Option<i64>) {
    e.archived = copied.or(e.archived);
    e.archived_in = seen;
}

fn fresh(name: &[u8], row: &Row) -> Entry {
    Entry {
        name: name.to_vec(),
        fs: row.fs,
        ino: row.ino,
        key: row.key.clone(),
        ..Entry::default()
    }
}

/// The roots of which none is under another (a file under two roots is one file).
fn outermost(roots: &[PathBuf]) -> Vec<PathBuf> {
    let all: Vec<PathBuf> = roots.iter().map(|r| absolute(r)).collect();
    let mut kept: Vec<PathBuf> = Vec::new();
    for (i, r) in all.iter().enumerate() {
        let inside = all
            .iter()
            .enumerate()
            .any(|(j, o)| (r != o && r.starts_with(o)) || (r == o && j < i));
        if !inside {
            kept.push(r.clone());
        }
    }
    kept
}

/// The columns of a file's row in [`lay_out`]'s table (schema 3's `files`).
const COLUMNS: &str = "fs INTEGER, ino INTEGER, digest BLOB, path BLOB, size INTEGER, \
    verified INTEGER, checked INTEGER, status TEXT, damaged INTEGER, protected INTEGER, \
    archived INTEGER, archived_in INTEGER, seen INTEGER, damaged_digest BLOB, gone INTEGER, \
    dup INTEGER, was BLOB";

/// One row of a laid-out table, as an entry, a file gone or damage without an entry fills it.
struct Laid {
    key: FileKey,
    path: Vec<u8>,
    size: i64,
    verified: Option<i64>,
    checked: Option<i64>,
    status: Option<String>,
    damaged: Option<i64>,
    protected: Option<i64>,
    archived: Option<i64>,
    archived_in: Option<i64>,
    seen: Option<i64>,
    damaged_digest: Option<Vec<u8>>,
    gone: Option<i64>,
    was: Option<Vec<u8>>,
}

impl Laid {
    fn new(key: FileKey, path: Vec<u8>) -> Self {
        Laid {
            key,
            path,
            size: 0,
            verified: None,
            checked: None,
            status: None,
            damaged: None,
            protected: None,
            archived: None,
            archived_in: None,
            seen: None,
            damaged_digest: None,
            gone: None,
            was: None,
        }
    }

    fn insert(self, stmt: &mut rusqlite::Statement<'_>) -> rusqlite::Result<()> {
        stmt.execute(params![
            self.key.0,
            self.key.1,
            self.key.2,
            self.path,
            self.size,
            self.verified,
            self.checked,
            self.status,
            self.damaged,
            self.protected,
            self.archived,
            self.archived_in,
            self.seen,
            self.damaged_digest,
            self.gone,
            self.was
        ])
        .map(drop)
    }
}

/// Lays out what the database (its tables in the schema `from` names) knows under `roots` as
/// rows of the table `name` in the schema `into` (made anew), one a file: entries, files
/// gone, and damage whose file has no entry (it was replaced or moved). Returns the number of
/// rows.
pub(crate) fn lay_out(
    conn: &Connection,
    from: &str,
    (into, name): (&str, &str),
    roots: &[PathBuf],
) -> rusqlite::Result<u64> {
    conn.execute_batch(&format!(
        "DROP TABLE IF EXISTS {into}.{name}; CREATE TABLE {into}.{name} ({COLUMNS});"
    ))?;
    type Damage = (Vec<u8>, Option<Vec<u8>>, i64, Option<String>);
    let mut damage: HashMap<FileKey, Damage> = HashMap::new();
    {
        let mut stmt = conn.prepare(&format!(
            "SELECT fs, ino, digest, path, damaged_digest, found, status FROM {from}damage"
        ))?;
        let mut rows = stmt.query([])?;
        while let Some(r) = rows.next()? {
            damage.insert(
                (r.get(0)?, r.get(1)?, r.get(2)?),
                (r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?),
            );
        }
    }
    let tx = conn.unchecked_transaction()?;
    let mut n = 0u64;
    {
        let mut insert = tx.prepare(&format!(
            "INSERT INTO {into}.{name} (fs, ino, digest, path, size, verified, checked, status, \
             damaged, protected, archived, archived_in, seen, damaged_digest, gone, was) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)"
        ))?;
        let mut dirs = tx.prepare(&format!(
            "SELECT d.path, d.entries, {PROOF} FROM {from}dirs d \
             LEFT JOIN {from}proven p ON p.path = d.path \
             WHERE (d.path >= ?1 AND d.path < ?2) OR d.path = ?3 OR d.path = ?4"
        ))?;
        let mut gone = tx.prepare(&format!(
            "SELECT path, fs, ino, digest, size, verified, damaged, at FROM {from}gone \
             WHERE (path >= ?1 AND path < ?2) OR path = ?3"
        ))?;
        let mut used: HashSet<FileKey> = HashSet::new();
        let roots = outermost(roots);
        let ranges: Vec<_> = roots.iter().map(|r| under(r)).collect();
        let inside = |path: &[u8]| {
            ranges.iter().any(|(low, high, exact)| {
                path == exact.as_slice() || (path >= &low[..] && path < &high[..])
            })
        };
        for (low, high, exact) in &ranges {
            let parent = split(exact).0.to_vec();
            let mut rows = dirs.query(params![low, high, exact, parent])?;
            while let Some(r) = rows.next()? {
                let dir: Vec<u8> = r.get(0)?;
                let value: Vec<u8> = r.get(1)?;
                let mut entries = decode(&value).unwrap_or_default();
                if let Some(proof) = Proof::read(r, 2)? {
                    proof.apply(&mut entries);
                }
                for e in entries {
                    let path = join(&dir, &e.name);
                    let in_this = path == *exact || (path >= *low && path < *high);
                    if !in_this {
                        continue;
                    }
                    let key = (e.fs, e.ino, e.key);
                    let d = damage.get(&key);
                    if d.is_some() {
                        used.insert(key.clone());
                    }
                    let row = Laid {
                        size: e.size,
                        verified: e.verified,
                        checked: e.checked,
                        status: Some(e.status),
                        damaged: d.map(|d| d.2),
                        protected: e.protected,
                        archived: e.archived,
                        archived_in: e.archived_in,
                        seen: e.seen,
                        damaged_digest: d.and_then(|d| d.1.clone()),
                        was: (!e.was.is_empty()).then_some(e.was),
                        ..Laid::new(key, path)
                    };
                    row.insert(&mut insert)?;
                    n += 1;
                }
            }
            let mut rows = gone.query(params![low, high, exact])?;
            while let Some(r) = rows.next()? {
                let row = Laid {
                    size: r.get(4)?,
                    verified: r.get(5)?,
                    damaged: r.get(6)?,
                    gone: Some(r.get(7)?),
                    ..Laid::new((r.get(1)?, r.get(2)?, r.get(3)?), r.get(0)?)
                };
                row.insert(&mut insert)?;
                n += 1;
            }
        }
        for (key, (path, damaged_digest, found, status)) in &damage {
            if used.contains(key) || !inside(path) {
                continue;
            }
            let size = std::fs::symlink_metadata(std::ffi::OsStr::from_bytes(path))
                .map_or(0, |m| m.len() as i64);
            let row = Laid {
                size,
                checked: Some(*found),
                status: status.clone(),
                damaged: Some(*found),
                damaged_digest: damaged_digest.clone(),
                ..Laid::new(key.clone(), path.clone())
            };
            row.insert(&mut insert)?;
            n += 1;
        }
    }
    tx.commit()?;
    conn.execute_batch(&format!(
        "CREATE INDEX {into}.{name}_key ON {name} (fs, ino, digest); \
         CREATE INDEX {into}.{name}_path ON {name} (path);"
    ))?;
    // Two entries of one file: a file moved and recorded under its new name, whose old
    // entry a scrub has not settled yet, or a second name of it (a hard link). The one seen
    // last stands for it; the other is marked `dup`. Most trees have none: counted first
    // (a walk of the index), the ranking only then.
    let dups: i64 = conn.query_row(
        &format!(
            "SELECT count(*) FROM (SELECT 1 FROM {into}.{name} WHERE gone IS NULL \
             GROUP BY fs, ino, digest HAVING count(*) > 1)"
        ),
        [],
        |r| r.get(0),
    )?;
    if dups > 0 {
        conn.execute_batch(&format!(
            "UPDATE {into}.{name} SET dup = 1 WHERE rowid IN (SELECT rowid FROM (SELECT \
             rowid, row_number() OVER (PARTITION BY fs, ino, digest ORDER BY \
             coalesce(seen, 0) DESC, coalesce(checked, 0) DESC, rowid DESC) AS n \
             FROM {into}.{name} WHERE gone IS NULL) WHERE n > 1)"
        ))?;
    }
    Ok(n)
}

/// Brings schema 3's `files` into directories' values, damage and files gone, and drops it.
/// In bounded memory: the directories gathered are merged into what is stored every so many
/// files (rows come by path, and a directory's files are not all together in that order).
pub(super) fn convert(conn: &Connection) -> rusqlite::Result<()> {
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
            let mut entries = load(conn, "", &dir)?;
            for e in new {
                match find(&entries, &e.name) {
                    // Two rows under one name (a damaged file replaced): the later seen.
                    Ok(at)
                        if entries[at].seen.max(entries[at].checked) >= e.seen.max(e.checked) => {}
                    Ok(at) => entries[at] = e,
                    Err(at) => entries.insert(at, e),
                }
            }
            store(conn, "", &dir, &entries)?;
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

/// Every entry of the database changed by `f` where it says so (returns true); the
/// directories changed are written back. A page of directories at a time, in path order, so
/// that what is held stays a page whatever the tree.
pub(super) fn rewrite_all(
    conn: &Connection,
    mut f: impl FnMut(&mut Entry) -> bool,
) -> rusqlite::Result<()> {
    const PAGE: i64 = 256;
    let mut after: Vec<u8> = Vec::new();
    loop {
        let mut page: Vec<(Vec<u8>, Vec<Entry>)> = Vec::new();
        {
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT d.path, d.entries, {PROOF} FROM dirs d \
                 LEFT JOIN proven p ON p.path = d.path WHERE d.path > ?1 \
                 ORDER BY d.path LIMIT ?2"
            ))?;
            let mut rows = stmt.query(params![after, PAGE])?;
            while let Some(r) = rows.next()? {
                let dir: Vec<u8> = r.get(0)?;
                let mut entries = decode(&r.get::<_, Vec<u8>>(1)?).unwrap_or_default();
                if let Some(proof) = Proof::read(r, 2)? {
                    proof.apply(&mut entries);
                }
                page.push((dir, entries));
            }
        }
        let Some((last, _)) = page.last() else {
            return Ok(());
        };
        after = last.clone();
        for (dir, mut entries) in page {
            let mut any = false;
            for e in &mut entries {
                any |= f(e);
            }
            if any {
                store(conn, "", &dir, &entries)?;
            }
        }
    }
}

/// The entry of the file at `path`, if the database has one.
pub(crate) fn entry_at(
    conn: &Connection,
    from: &str,
    path: &std::path::Path,
) -> rusqlite::Result<Option<Entry>> {
    let (dir, name) = split(bytes(path));
    let entries = load(conn, from, dir)?;
    Ok(find(&entries, name).ok().map(|at| entries[at].clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A print hashes each field, its length first where it has one: prints stored by one
    /// version are the prints of the next (the layout is the stored format).
    #[test]
    fn a_print_is_the_hash_of_its_fields_end_to_end() {
        let fed = |name: &[u8], key: &[u8]| {
            let mut h = xxhash_rust::xxh3::Xxh3::new();
            h.update(&(name.len() as u64).to_le_bytes());
            h.update(name);
            h.update(&7i64.to_le_bytes());
            h.update(&(-9i64).to_le_bytes());
            h.update(&(key.len() as u64).to_le_bytes());
            h.update(key);
            h.update(&4096i64.to_le_bytes());
            h.digest128()
        };
        let key = [1u8; 33];
        for name in [&b"a"[..], &[b'n'; 255], &[b'x'; 700]] {
            assert_eq!(Print::of(name, 7, -9, &key, 4096), fed(name, &key));
        }
        assert_ne!(
            Print::of(b"a", 7, -9, &key, 4096),
            Print::of(b"a", 7, -9, &key, 4097)
        );
    }

    #[test]
    fn every_directory_is_rewritten_a_page_at_a_time() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(&crate::state::schema("")).unwrap();
        for d in 0..600 {
            let e = Entry {
                name: b"f".to_vec(),
                archived_in: Some(d % 2),
                checked: Some(1),
                ..Entry::default()
            };
            store(&conn, "", format!("/t/d{d:03}").as_bytes(), &[e]).unwrap();
        }
        conn.execute(
            "INSERT INTO proven (path, run, at) VALUES (CAST('/t/d001' AS BLOB), 9, 5)",
            [],
        )
        .unwrap();
        let mut seen = 0;
        rewrite_all(&conn, |e| {
            seen += 1;
            let old = e.archived_in == Some(1);
            if old {
                (e.archived, e.archived_in) = (Some(7), None);
            }
            old
        })
        .unwrap();
        assert_eq!(seen, 600);
        let rewritten = |dir: &str| load(&conn, "", dir.as_bytes()).unwrap().remove(0);
        assert_eq!(rewritten("/t/d001").archived, Some(7));
        assert_eq!(rewritten("/t/d001").verified, Some(5), "the proof kept");
        assert_eq!(rewritten("/t/d599").archived, Some(7));
        assert_eq!(rewritten("/t/d598").archived, None);
        assert_eq!(rewritten("/t/d598").archived_in, Some(0));
    }

    #[test]
    fn a_directory_looked_up_again_is_not_planned_again() {
        let tmp = tempfile::tempdir().unwrap();
        let conn = crate::state::connect(&tmp.path().join("state.db")).unwrap();
        conn.execute_batch(&crate::state::schema("")).unwrap();
        for d in [&b"/t/a"[..], b"/t/b"] {
            let e = Entry {
                name: b"f".to_vec(),
                ..Entry::default()
            };
            store(&conn, "", d, &[e]).unwrap();
        }
        for i in 0..10 {
            let dir = [&b"/t/a"[..], b"/t/b"][i % 2];
            assert_eq!(load(&conn, "", dir).unwrap().len(), 1);
        }
        // The statement `load` runs, from the cache it left it in.
        let stmt = conn
            .prepare_cached(&format!(
                "SELECT d.entries, {PROOF} FROM dirs d LEFT JOIN proven p \
                 ON p.path = d.path WHERE d.path = ?1"
            ))
            .unwrap();
        assert_eq!(stmt.get_status(rusqlite::StatementStatus::Run), 10);
        assert_eq!(stmt.get_status(rusqlite::StatementStatus::RePrepare), 0);
    }
}
