//! The writer's side of a directory's pages: the rows a run recorded, taken into the page
//! of each file's directory that holds its name, each page read once and written once; a
//! page whose every file a run proved good, unchanged, is one small row (`proven`) and its
//! entries are not rewritten (nor read, where their print says they are what the run met).

use std::collections::HashMap;

use rusqlite::{Connection, OptionalExtension, params};

use super::entries::{Copied, Entry, Owner, find, split};
use super::pages;
use super::paths::within;
use super::rows::{Fact, Row};

/// A file as damage knows it: file system, inode, the digest key of its tag.
type FileKey = (i64, i64, Vec<u8>);

/// What the writer holds of the directories it is changing, in one transaction: a page of
/// each, read once and written once (rows come in walk order: a directory's files come by
/// name, a page after another, before and after its subdirectories'), the damage known, and
/// which runs' archives are durable.
#[derive(Default)]
pub(super) struct Open {
    dirs: HashMap<Vec<u8>, Dir>,
    /// The directory of the last row: it and the directories above it are left open for the
    /// next batch, which likely goes on with them.
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
            let d = match self.dirs.get_mut(dir) {
                Some(d) => d,
                None => {
                    let keys = pages::keys(conn, "", dir)?;
                    self.dirs
                        .entry(dir.to_vec())
                        .or_insert(Dir { keys, page: None })
                }
            };
            let held = d.page_of(conn, dir, name, (seen, row.t), &mut self.copied)?;
            held.at = held.at.max(row.t);
            let proof = held.proves(&row);
            // A page whose entries are known by their print is not read while every row is a
            // proof: the prints of the proofs are summed, and compared at the end.
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
            d.cut_if_full(conn, dir, name, &mut self.copied)?;
        }
        // Directories the walk has left are done with: written now, so that what the writer
        // holds stays about a batch.
        let last = &self.last;
        let done: Vec<Vec<u8>> = self
            .dirs
            .keys()
            .filter(|d| !within(last, d))
            .cloned()
            .collect();
        for dir in done {
            if let Some((_, held)) = self.dirs.remove(&dir).and_then(|d| d.page) {
                held.write(conn, &dir, &mut self.copied)?;
            }
        }
        Ok(())
    }
}

/// A directory being changed: the keys of its pages, and the page held (its place among
/// them).
struct Dir {
    keys: Vec<Vec<u8>>,
    page: Option<(usize, Held)>,
}

impl Dir {
    /// The page that holds `name`, held (the one held before is written back if it is
    /// another), for the run `seen` at `t`.
    fn page_of(
        &mut self,
        conn: &Connection,
        dir: &[u8],
        name: &[u8],
        (seen, t): (Option<i64>, i64),
        copies: &mut HashMap<i64, Option<i64>>,
    ) -> rusqlite::Result<&mut Held> {
        let page = pages::page_of(&self.keys, name);
        if self.page.as_ref().is_some_and(|(at, _)| *at != page) {
            let (_, held) = self.page.take().expect("a page held");
            if held.write(conn, dir, copies)? {
                self.keys = pages::keys(conn, "", dir)?;
            }
        }
        if self.page.is_none() {
            let page = pages::page_of(&self.keys, name);
            // A directory without entries yet: its first page, keyed by its first name.
            let key = self.keys.get(page).map_or(name, Vec::as_slice);
            self.page = Some((page, Held::open(conn, dir, key, seen, t)?));
        }
        Ok(&mut self.page.as_mut().expect("a page held").1)
    }

    /// After the row of `name`: a page that has grown past its bound with names in order (a
    /// folder of many new files) writes out what comes before `name`, and goes on from it.
    fn cut_if_full(
        &mut self,
        conn: &Connection,
        dir: &[u8],
        name: &[u8],
        copies: &mut HashMap<i64, Option<i64>>,
    ) -> rusqlite::Result<()> {
        let Some((at, held)) = self.page.as_mut() else {
            return Ok(());
        };
        if held.entries.len() + held.added.len() <= pages::MAX || !held.in_order {
            return Ok(());
        }
        held.cut(conn, dir, name, copies)?;
        self.keys = pages::keys(conn, "", dir)?;
        let key = held.key.clone();
        let next = self.keys.partition_point(|k| *k < key);
        self.keys.insert(next, key);
        *at = next;
        Ok(())
    }
}

impl Held {
    /// The page `key` of the directory `dir`, as the database has it: its print if a run
    /// proved it good (its entries are read only if need be), else its entries.
    fn open(
        conn: &Connection,
        dir: &[u8],
        key: &[u8],
        run: Option<i64>,
        at: i64,
    ) -> rusqlite::Result<Held> {
        let (print, marked): (Option<Vec<u8>>, Option<Copied>) = conn
            .prepare_cached(
                "SELECT print, archived_in, archived FROM proven WHERE path = ?1 AND first = ?2",
            )?
            .query_row(params![dir, key], |r| Ok((r.get(0)?, Copied::read(r, 1)?)))
            .optional()?
            .unwrap_or_default();
        let mut held = Held {
            key: key.to_vec(),
            in_order: true,
            last_name: Vec::new(),
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
        self.entries = pages::load(conn, "", dir, &self.key)?;
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
        self.in_order &= name >= self.last_name.as_slice();
        if self.in_order {
            self.last_name = name.to_vec();
        }
        let found = find(&self.entries, name);
        // Proven good, the same file under the same tag and size as its entry says.
        let same = |e: &Entry| {
            (e.fs, e.ino, &e.key, e.size, e.owner)
                == (row.fs, row.ino, &row.key, row.size, row.owner)
        };
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
            let kept = pages::copied(conn, "", copies, m.run)?.or(m.kept);
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
    /// Writes every page still held; the transaction can commit.
    pub(super) fn flush(&mut self, conn: &Connection) -> rusqlite::Result<()> {
        for (dir, d) in std::mem::take(&mut self.dirs) {
            if let Some((_, held)) = d.page {
                held.write(conn, &dir, &mut self.copied)?;
            }
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

/// A page being changed.
struct Held {
    /// Its key.
    key: Vec<u8>,
    /// Whether its rows came in name order (the name of the last one): then what comes
    /// before the last can be written out early.
    in_order: bool,
    last_name: Vec<u8>,
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
/// system, inode, tag, size and owner where known (XXH3, 128 bits: a cache's check, not a
/// security one; a file given to another user or made private is an entry to rewrite), and
/// their number. A run whose proofs sum to it proved every entry good, unchanged. Prints
/// stored by earlier builds (BLAKE3's) no longer match: each such directory has its entries
/// read once, by the next run that proves it, which stores its print anew.
struct Print;

impl Print {
    fn of(name: &[u8], fs: i64, ino: i64, key: &[u8], size: i64, owner: Option<Owner>) -> u128 {
        // The fields end to end, hashed in one call; on the stack unless a name is longer
        // than Linux allows. Once a file, on the writer's one thread: BLAKE3 (300 ns on 100
        // bytes) was two fifths of the writer's time on 20,000 files of 4 KiB.
        let len = 52 + name.len() + key.len();
        let (mut stack, mut heap) = ([0u8; 384], Vec::new());
        let buf = match stack.get_mut(..len) {
            Some(b) => b,
            None => {
                heap.resize(len, 0);
                &mut heap[..]
            }
        };
        let owned = owner.map(Owner::to_bytes);
        let mut at = 0;
        for part in [
            &(name.len() as u64).to_le_bytes()[..],
            name,
            &fs.to_le_bytes(),
            &ino.to_le_bytes(),
            &(key.len() as u64).to_le_bytes(),
            key,
            &size.to_le_bytes(),
            owned.as_ref().map_or(&[][..], |o| &o[..]),
        ] {
            buf[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
        xxhash_rust::xxh3::xxh3_128(&buf[..at])
    }

    fn of_row(row: &Row) -> u128 {
        Print::of(
            split(&row.path).1,
            row.fs,
            row.ino,
            &row.key,
            row.size,
            row.owner,
        )
    }

    fn of_entries(entries: &[Entry]) -> (u128, i64) {
        let sum = entries.iter().fold(0u128, |s, e| {
            s.wrapping_add(Print::of(&e.name, e.fs, e.ino, &e.key, e.size, e.owner))
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

    /// Writes the page; whether that changed the directory's pages (cut, re-keyed,
    /// removed).
    fn write(
        mut self,
        conn: &Connection,
        dir: &[u8],
        copies: &mut HashMap<i64, Option<i64>>,
    ) -> rusqlite::Result<bool> {
        if let Some(proofs) = &self.proofs {
            // Every entry proved good, unchanged, and nothing else: the proof row only (an
            // archive's mark made from the one before: without one, from the entries).
            if self.stored == Some((self.sum, proofs.len() as i64))
                && (self.archiving != Some(true) || self.marked.is_some())
                && let Some(mark) = self.remark(conn, copies)?
            {
                conn.prepare_cached(
                    "UPDATE proven SET run = ?3, at = ?4, archived_in = ?5, archived = ?6 \
                     WHERE path = ?1 AND first = ?2",
                )?
                .execute(params![
                    dir,
                    self.key,
                    self.run,
                    self.at,
                    mark.map(|m| m.run),
                    mark.and_then(|m| m.kept)
                ])?;
                return Ok(false);
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
                "INSERT OR REPLACE INTO proven (path, first, run, at, print, archived_in, \
                 archived) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )?
            .execute(params![
                dir,
                self.key,
                self.run,
                self.at,
                print,
                mark.map(|m| m.run),
                mark.and_then(|m| m.kept)
            ])?;
            return Ok(false);
        }
        self.settle(self.run, conn, copies)?;
        self.merge_added();
        let written = pages::store(conn, "", dir, &self.key, &self.entries)?;
        Ok(written != [self.key.clone()])
    }

    /// Puts the names new to the page among its entries.
    fn merge_added(&mut self) {
        if !self.added.is_empty() {
            self.entries
                .extend(std::mem::take(&mut self.added).into_values());
            self.entries.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        }
    }

    /// Writes out the entries before `name` (rows come in name order, so none of them is
    /// changed again by this run), and goes on as the page keyed by `name`.
    fn cut(
        &mut self,
        conn: &Connection,
        dir: &[u8],
        name: &[u8],
        copies: &mut HashMap<i64, Option<i64>>,
    ) -> rusqlite::Result<()> {
        self.settle(self.run, conn, copies)?;
        self.merge_added();
        let at = self.entries.partition_point(|e| e.name.as_slice() < name);
        let rest = self.entries.split_off(at);
        pages::store(conn, "", dir, &self.key, &self.entries)?;
        self.entries = rest;
        self.proven = vec![None; self.entries.len()];
        self.key = name.to_vec();
        Ok(())
    }
}

/// When the archive the entry `e` was last copied into became durable, if it did.
fn before(
    e: &Entry,
    conn: &Connection,
    copies: &mut HashMap<i64, Option<i64>>,
) -> rusqlite::Result<Option<i64>> {
    match e.archived_in {
        Some(run) => pages::copied(conn, "", copies, run),
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
    if row.owner.is_some() {
        e.owner = row.owner;
    }
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
            assert_eq!(Print::of(name, 7, -9, &key, 4096, None), fed(name, &key));
        }
        assert_ne!(
            Print::of(b"a", 7, -9, &key, 4096, None),
            Print::of(b"a", 7, -9, &key, 4097, None)
        );
    }
}
