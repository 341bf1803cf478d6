//! The damage the database remembers, with its journal beside it (which survives the
//! database).

use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

use rusqlite::{Connection, params};

use super::rows::{digest_from_key, digest_key};
use super::{Damaged, journal};
use crate::core::tag::Damage;
use crate::engine::KnownDamage;

/// Adds the damage the database on `conn` remembers to `known`.
pub(super) fn load_damage(conn: &Connection, known: &mut KnownDamage) -> rusqlite::Result<()> {
    // A database of schema 3 read without writing (`--no-state`, not yet migrated) keeps its
    // damage on the files' rows.
    let mut stmt = conn
        .prepare(
            "SELECT ino, digest, damaged_digest, found, fs FROM damage \
             WHERE damaged_digest IS NOT NULL",
        )
        .or_else(|_| {
            conn.prepare(
                "SELECT ino, digest, damaged_digest, damaged, fs FROM files \
                 WHERE damaged IS NOT NULL AND damaged_digest IS NOT NULL",
            )
        })?;
    let mut rows = stmt.query([])?;
    while let Some(r) = rows.next()? {
        let (tag, bad): (Vec<u8>, Vec<u8>) = (r.get(1)?, r.get(2)?);
        add_damage(known, r.get(0)?, &tag, &bad, r.get(3)?, r.get(4)?);
    }
    Ok(())
}

pub(super) fn add_damage(
    known: &mut KnownDamage,
    ino: i64,
    tag: &[u8],
    bad: &[u8],
    found_ms: i64,
    fs: i64,
) {
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
        .then(|| super::sqlite::open(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).ok())
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
    super::index::read_into(&mut known);
    Some(known)
}

/// A damage journal longer than this is compacted when the database opens.
pub(super) const JOURNAL_COMPACT_AT: u64 = 64 << 10;

/// Brings the damage the journal at `path` remembers into the database (`insert`: a new one),
/// and keeps in the journal only what may still be damage: entries whose file is still there
/// (the same inode under the same tag), or whose path holds nothing now (the file may have
/// moved: the walk knows damage by its inode and tag wherever it meets it; a journal that
/// kept only the files at their paths forgot a moved damaged file when the database was
/// lost). Files repaired, accepted, edited or replaced under their name are not.
pub(super) fn replay(conn: &Connection, path: &Path, insert: bool) -> io::Result<()> {
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
        let moved =
            crate::fs::sys::lstat(&e.path).is_err_and(|err| err.kind() == io::ErrorKind::NotFound);
        if !moved && !e.still_there(&tag_of) {
            continue;
        }
        if insert {
            conn.execute(
                "INSERT INTO damage (fs, ino, digest, path, found, status, damaged_digest) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) \
                 ON CONFLICT DO UPDATE SET damaged_digest = ?7, status = ?6",
                params![
                    e.fs,
                    e.ino,
                    e.tag,
                    e.path.as_os_str().as_bytes(),
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

/// The damage the database at `db` and its journal remember under `roots` on a file system
/// that is not mounted now, read without writing anything: a `--no-state` run cannot see
/// those files, and would otherwise pass them silently.
pub fn unmounted_damage_at(db: &Path, roots: &[PathBuf]) -> Vec<Damaged> {
    let mut found: Vec<(i64, Damaged)> =
        journal::outstanding(journal::read(&journal::path_of(db)).unwrap_or_default())
            .into_iter()
            .map(|e| {
                let damaged = Damaged {
                    path: e.path,
                    status: Some(e.status),
                    found: Some(e.found),
                };
                (e.fs, damaged)
            })
            .collect();
    let conn = db
        .exists()
        .then(|| super::sqlite::open(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).ok())
        .flatten();
    if let Some(conn) = conn {
        let rows = conn
            .prepare("SELECT fs, path, status, found FROM damage")
            .and_then(|mut stmt| {
                stmt.query_map([], |r| {
                    let path: Vec<u8> = r.get(1)?;
                    let damaged = Damaged {
                        path: PathBuf::from(std::ffi::OsString::from_vec(path)),
                        status: r.get(2)?,
                        found: r.get(3)?,
                    };
                    Ok((r.get(0)?, damaged))
                })?
                .collect::<rusqlite::Result<Vec<_>>>()
            });
        // A database of schema 3 keeps no damage table: the journal has it all the same.
        found.extend(rows.unwrap_or_default());
    }
    let roots: Vec<PathBuf> = roots.iter().map(|r| super::absolute(r)).collect();
    found.retain(|(fs, d)| {
        let path = d.path.as_os_str().as_bytes();
        roots
            .iter()
            .any(|r| super::paths::within(path, r.as_os_str().as_bytes()))
            && crate::fs::sys::lstat(&d.path).is_err()
            && super::unmounted(&d.path, *fs).is_some()
    });
    let mut said: Vec<Damaged> = found.into_iter().map(|(_, d)| d).collect();
    said.sort_by(|a, b| a.path.cmp(&b.path));
    said.dedup_by(|a, b| a.path == b.path);
    said
}
