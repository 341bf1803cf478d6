//! A directory's entries as the database keeps them: in pages of at most [`MAX`] entries, each
//! page one row of `dirs` keyed by its directory and its first name, its entries packed and
//! sorted by name ([`super::entries`]). A walk reads a directory's names in order, so a
//! lookup, a plan or the writer holds one page of a directory at a time, whatever its size:
//! a folder of a million files cost 800 MB when it was one value.
//!
//! A page holds the names from its key up to the next page's key; the first page of a
//! directory also holds any name below its key (its key is then lowered to that name when it
//! is written). A page that grows past [`MAX`] is cut into pages of [`PAGE`] entries when it
//! is written; a page left empty is removed.

use std::collections::HashMap;

use rusqlite::{Connection, OptionalExtension, params};

use super::entries::{Entry, Proof, bytes, decode, encode, find, split};

/// Entries a page is cut to.
pub(crate) const PAGE: usize = 512;

/// Entries a page may hold before it is cut: twice [`PAGE`], so that a page cut in two does
/// not need cutting again at the next file added.
pub(crate) const MAX: usize = 2 * PAGE;

/// The columns of `proven` (as `p`) that [`Proof::read`] reads.
pub(crate) const PROOF: &str = "p.run, p.at, p.archived_in, p.archived";

/// The keys of the pages of the directory `dir`, in order (none: the directory has no
/// entries).
pub(crate) fn keys(conn: &Connection, from: &str, dir: &[u8]) -> rusqlite::Result<Vec<Vec<u8>>> {
    conn.prepare_cached(&format!(
        "SELECT first FROM {from}dirs WHERE path = ?1 ORDER BY first"
    ))?
    .query_map([dir], |r| r.get(0))?
    .collect()
}

/// Which of a directory's page `keys` holds `name`: the last whose key is not above it (the
/// first page for a name below every key).
pub(crate) fn page_of(keys: &[Vec<u8>], name: &[u8]) -> usize {
    keys.partition_point(|k| k.as_slice() <= name)
        .saturating_sub(1)
}

/// The entries of the page `key` of the directory `dir` (none if it has no such page, or one
/// that does not decode: a cache loses only its schedule), with what a run that proved them
/// all good since says.
pub(crate) fn load(
    conn: &Connection,
    from: &str,
    dir: &[u8],
    key: &[u8],
) -> rusqlite::Result<Vec<Entry>> {
    let value: Option<(Vec<u8>, Option<Proof>)> = conn
        .prepare_cached(&format!(
            "SELECT d.entries, {PROOF} FROM {from}dirs d LEFT JOIN {from}proven p \
             ON p.path = d.path AND p.first = d.first WHERE d.path = ?1 AND d.first = ?2"
        ))?
        .query_row(params![dir, key], |r| Ok((r.get(0)?, Proof::read(r, 1)?)))
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

/// Writes `entries` (sorted by name) as the page `key` of the directory `dir`: what they say
/// stands alone, so a run that proved them good before is forgotten. A page left empty is
/// removed; one whose first name is below its key is keyed by that name; one past [`MAX`]
/// entries is cut into pages of [`PAGE`]. Returns the keys it was written under.
pub(crate) fn store(
    conn: &Connection,
    from: &str,
    dir: &[u8],
    key: &[u8],
    entries: &[Entry],
) -> rusqlite::Result<Vec<Vec<u8>>> {
    conn.prepare_cached(&format!(
        "DELETE FROM {from}proven WHERE path = ?1 AND first = ?2"
    ))?
    .execute(params![dir, key])?;
    let lowered = entries.first().is_some_and(|e| e.name.as_slice() < key);
    if entries.is_empty() || lowered {
        conn.prepare_cached(&format!(
            "DELETE FROM {from}dirs WHERE path = ?1 AND first = ?2"
        ))?
        .execute(params![dir, key])?;
    }
    let chunks: Vec<&[Entry]> = match entries.len() {
        0 => Vec::new(),
        n if n > MAX => entries.chunks(PAGE).collect(),
        _ => vec![entries],
    };
    let mut written = Vec::with_capacity(chunks.len());
    for (i, chunk) in chunks.into_iter().enumerate() {
        let first = match i {
            0 if !lowered => key.to_vec(),
            _ => chunk[0].name.clone(),
        };
        conn.prepare_cached(&format!(
            "INSERT INTO {from}dirs (path, first, entries) VALUES (?1, ?2, ?3) \
             ON CONFLICT DO UPDATE SET entries = excluded.entries"
        ))?
        .execute(params![dir, first, encode(chunk)])?;
        written.push(first);
    }
    Ok(written)
}

/// Every entry of the directory `dir`, all its pages in order (for what needs a directory
/// whole and is rare: a schema's migration, tests).
pub(crate) fn load_all(conn: &Connection, from: &str, dir: &[u8]) -> rusqlite::Result<Vec<Entry>> {
    let mut all = Vec::new();
    for key in keys(conn, from, dir)? {
        all.append(&mut load(conn, from, dir, &key)?);
    }
    Ok(all)
}

/// Writes `entries` (sorted by name) as every page of the directory `dir`, in place of what
/// it held.
pub(crate) fn store_all(
    conn: &Connection,
    from: &str,
    dir: &[u8],
    entries: &[Entry],
) -> rusqlite::Result<()> {
    for table in ["dirs", "proven"] {
        conn.prepare_cached(&format!("DELETE FROM {from}{table} WHERE path = ?1"))?
            .execute([dir])?;
    }
    for chunk in entries.chunks(PAGE) {
        store(conn, from, dir, &chunk[0].name, chunk)?;
    }
    Ok(())
}

/// The page of the directory `dir` that holds `name`: its key and its entries (none: the
/// directory has no entries).
fn page_holding(
    conn: &Connection,
    from: &str,
    dir: &[u8],
    name: &[u8],
) -> rusqlite::Result<(Vec<u8>, Vec<Entry>)> {
    let keys = keys(conn, from, dir)?;
    let Some(key) = keys.get(page_of(&keys, name)) else {
        return Ok((name.to_vec(), Vec::new()));
    };
    Ok((key.clone(), load(conn, from, dir, key)?))
}

/// Entries looked up by path, each page read once for the paths in it that come one after
/// another (a list of damage, of paths, in order).
pub(crate) struct Lookups<'c> {
    conn: &'c Connection,
    from: &'c str,
    dir: Option<Vec<u8>>,
    keys: Vec<Vec<u8>>,
    page: Option<usize>,
    entries: Vec<Entry>,
}

impl<'c> Lookups<'c> {
    pub(crate) fn new(conn: &'c Connection, from: &'c str) -> Self {
        Lookups {
            conn,
            from,
            dir: None,
            keys: Vec::new(),
            page: None,
            entries: Vec::new(),
        }
    }

    /// The entry of the file at `path` (absolute), if the database has one.
    pub(crate) fn at(&mut self, path: &[u8]) -> rusqlite::Result<Option<&Entry>> {
        let (dir, name) = split(path);
        if self.dir.as_deref() != Some(dir) {
            self.keys = keys(self.conn, self.from, dir)?;
            self.dir = Some(dir.to_vec());
            self.page = None;
        }
        let p = page_of(&self.keys, name);
        if self.page != Some(p) {
            self.entries = match self.keys.get(p) {
                Some(key) => load(self.conn, self.from, dir, key)?,
                None => Vec::new(),
            };
            self.page = Some(p);
        }
        Ok(find(&self.entries, name).ok().map(|at| &self.entries[at]))
    }
}

/// The entry of the file at `path`, if the database has one.
pub(crate) fn entry_at(
    conn: &Connection,
    from: &str,
    path: &std::path::Path,
) -> rusqlite::Result<Option<Entry>> {
    let (dir, name) = split(bytes(path));
    let (_, entries) = page_holding(conn, from, dir, name)?;
    Ok(find(&entries, name).ok().map(|at| entries[at].clone()))
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
    let (page, mut entries) = page_holding(conn, from, dir, name)?;
    let Ok(at) = find(&entries, name) else {
        return Ok(None);
    };
    let e = &entries[at];
    if (e.fs, e.ino, e.key.as_slice()) != (fs, ino, key) {
        return Ok(None);
    }
    let e = entries.remove(at);
    store(conn, from, dir, &page, &entries)?;
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
    let (page, mut entries) = page_holding(conn, from, dir, name)?;
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
    store(conn, from, dir, &page, &entries).map(drop)
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

/// Every entry of the database changed by `f` where it says so (returns true); the pages
/// changed are written back. A batch of pages at a time, in order, so that what is held stays
/// a batch whatever the tree.
pub(super) fn rewrite_all(
    conn: &Connection,
    mut f: impl FnMut(&mut Entry) -> bool,
) -> rusqlite::Result<()> {
    const BATCH: i64 = 256;
    let mut after: (Vec<u8>, Vec<u8>) = (Vec::new(), Vec::new());
    loop {
        let mut batch: Vec<(Vec<u8>, Vec<u8>, Vec<Entry>)> = Vec::new();
        {
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT d.path, d.first, d.entries, {PROOF} FROM dirs d \
                 LEFT JOIN proven p ON p.path = d.path AND p.first = d.first \
                 WHERE (d.path, d.first) > (?1, ?2) ORDER BY d.path, d.first LIMIT ?3"
            ))?;
            let mut rows = stmt.query(params![after.0, after.1, BATCH])?;
            while let Some(r) = rows.next()? {
                let mut entries = decode(&r.get::<_, Vec<u8>>(2)?).unwrap_or_default();
                if let Some(proof) = Proof::read(r, 3)? {
                    proof.apply(&mut entries);
                }
                batch.push((r.get(0)?, r.get(1)?, entries));
            }
        }
        let Some((dir, key, _)) = batch.last() else {
            return Ok(());
        };
        after = (dir.clone(), key.clone());
        for (dir, key, mut entries) in batch {
            let mut any = false;
            for e in &mut entries {
                any |= f(e);
            }
            if any {
                store(conn, "", &dir, &key, &entries)?;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: String) -> Entry {
        Entry {
            name: name.into_bytes(),
            checked: Some(1),
            ..Entry::default()
        }
    }

    fn conn() -> Connection {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(&crate::state::schema("")).unwrap();
        conn
    }

    #[test]
    fn a_name_is_in_the_last_page_whose_key_is_not_above_it() {
        let keys: Vec<Vec<u8>> = vec![b"c".to_vec(), b"m".to_vec(), b"t".to_vec()];
        for (name, page) in [
            ("a", 0),
            ("c", 0),
            ("d", 0),
            ("m", 1),
            ("s", 1),
            ("t", 2),
            ("z", 2),
        ] {
            assert_eq!(page_of(&keys, name.as_bytes()), page, "{name}");
        }
        assert_eq!(page_of(&[], b"a"), 0);
    }

    /// A page past its bound is cut into pages of [`PAGE`]; a page whose first name is below
    /// its key is keyed by it; an empty page is removed; the directory reads back whole.
    #[test]
    fn pages_are_cut_rekeyed_and_removed() {
        let conn = conn();
        let names: Vec<String> = (0..MAX + 1).map(|i| format!("f{i:05}")).collect();
        let entries: Vec<Entry> = names.iter().cloned().map(entry).collect();
        let written = store(&conn, "", b"/d", b"f00000", &entries).unwrap();
        assert_eq!(written.len(), 3);
        assert_eq!(keys(&conn, "", b"/d").unwrap(), written);
        assert_eq!(written[1], names[PAGE].as_bytes());
        assert_eq!(load_all(&conn, "", b"/d").unwrap(), entries);
        // A name below every key goes into the first page, which takes its name as key.
        let first = keys(&conn, "", b"/d").unwrap()[0].clone();
        let mut page = load(&conn, "", b"/d", &first).unwrap();
        page.insert(0, entry("a".into()));
        store(&conn, "", b"/d", &first, &page).unwrap();
        let now = keys(&conn, "", b"/d").unwrap();
        assert_eq!(now[0], b"a");
        assert_eq!(now.len(), 3);
        assert_eq!(load_all(&conn, "", b"/d").unwrap().len(), MAX + 2);
        // Emptied, the page goes.
        store(&conn, "", b"/d", &now[1], &[]).unwrap();
        assert_eq!(
            keys(&conn, "", b"/d").unwrap(),
            vec![now[0].clone(), now[2].clone()]
        );
        // Found, moved and forgotten through the page that holds them.
        let last = names.last().unwrap();
        let path = format!("/d/{last}");
        assert!(
            entry_at(&conn, "", std::path::Path::new(&path))
                .unwrap()
                .is_some()
        );
        let gone = forget(&conn, "", path.as_bytes(), (0, 0, b"")).unwrap();
        assert!(gone.is_some());
        settle_moved(&conn, "", b"/d/zz", gone.unwrap()).unwrap();
        let all = load_all(&conn, "", b"/d").unwrap();
        assert_eq!(all.last().unwrap().name, b"zz");
        assert!(all.windows(2).all(|w| w[0].name < w[1].name));
    }

    #[test]
    fn every_page_is_rewritten_a_batch_at_a_time() {
        let conn = conn();
        for d in 0..600 {
            let e = Entry {
                name: b"f".to_vec(),
                archived_in: Some(d % 2),
                checked: Some(1),
                ..Entry::default()
            };
            store(&conn, "", format!("/t/d{d:03}").as_bytes(), b"f", &[e]).unwrap();
        }
        conn.execute(
            "INSERT INTO proven (path, first, run, at) VALUES (CAST('/t/d001' AS BLOB), \
             CAST('f' AS BLOB), 9, 5)",
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
        let rewritten = |dir: &str| load_all(&conn, "", dir.as_bytes()).unwrap().remove(0);
        assert_eq!(rewritten("/t/d001").archived, Some(7));
        assert_eq!(rewritten("/t/d001").verified, Some(5), "the proof kept");
        assert_eq!(rewritten("/t/d599").archived, Some(7));
        assert_eq!(rewritten("/t/d598").archived, None);
        assert_eq!(rewritten("/t/d598").archived_in, Some(0));
    }

    #[test]
    fn a_page_looked_up_again_is_not_planned_again() {
        let tmp = tempfile::tempdir().unwrap();
        let conn = crate::state::connect(&tmp.path().join("state.db")).unwrap();
        conn.execute_batch(&crate::state::schema("")).unwrap();
        for d in [&b"/t/a"[..], b"/t/b"] {
            store(&conn, "", d, b"f", &[entry("f".into())]).unwrap();
        }
        for i in 0..10 {
            let dir = [&b"/t/a"[..], b"/t/b"][i % 2];
            assert_eq!(load(&conn, "", dir, b"f").unwrap().len(), 1);
        }
        // The statement `load` runs, from the cache it left it in.
        let stmt = conn
            .prepare_cached(&format!(
                "SELECT d.entries, {PROOF} FROM dirs d LEFT JOIN proven p \
                 ON p.path = d.path AND p.first = d.first WHERE d.path = ?1 AND d.first = ?2"
            ))
            .unwrap();
        assert_eq!(stmt.get_status(rusqlite::StatementStatus::Run), 10);
        assert_eq!(stmt.get_status(rusqlite::StatementStatus::RePrepare), 0);
    }
}
