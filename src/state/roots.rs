//! Each tree as the database first met it: the file system and the folder its PATH led to.
//! A PATH that now leads elsewhere (a disk that did not mount, leaving the empty folder under
//! it; a folder another user swapped for theirs) is not the same tree: its files are neither
//! verified against nor recorded over the tree's history until the owner says it is
//! (`--accept-moved-root`: a tree restored from a backup, a file system made anew).

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use rusqlite::{OptionalExtension, params};

use super::{State, absolute, entries::bytes, now};

impl State {
    /// Whether `root` is still the folder the database knows under its path. A root met for
    /// the first time, or `accept`ed, is recorded as it is now; a file given as a root, or
    /// one that cannot be looked at (said by the walk), is let be. The error says what
    /// changed and what to do.
    pub fn same_root(&mut self, root: &Path, accept: bool) -> Result<(), String> {
        let Ok(meta) = crate::fs::sys::lstat(root) else {
            return Ok(());
        };
        if !meta.is_dir() {
            return Ok(());
        }
        let path = absolute(root);
        let now_is = (self.fsids.of(meta.dev(), &path), meta.ino() as i64);
        let known: Option<(i64, i64, i64)> = self
            .conn
            .query_row(
                "SELECT fs, ino, at FROM roots WHERE path = ?1",
                [bytes(&path)],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()
            .unwrap_or(None);
        match known {
            Some((fs, ino, _)) if (fs, ino) == now_is => Ok(()),
            Some((fs, _, at)) if !accept => {
                let what = if fs == now_is.0 {
                    "another folder"
                } else {
                    "a folder on another file system (a disk that did not mount?)"
                };
                Err(format!(
                    "{}: now {what} than the tree the state database has known there since {}: \
                     nothing under it was verified or recorded. If it is the same tree (restored \
                     from a backup, its file system made anew), `--accept-moved-root` takes it \
                     as such",
                    crate::text::escape(root),
                    crate::text::time_ms(at)
                ))
            }
            _ => {
                let recorded = self.conn.execute(
                    "INSERT INTO roots (path, fs, ino, at) VALUES (?1, ?2, ?3, ?4) \
                     ON CONFLICT DO UPDATE SET fs = ?2, ino = ?3, at = ?4",
                    params![bytes(&path), now_is.0, now_is.1, now()],
                );
                if let Err(e) = recorded {
                    self.fail(e);
                }
                Ok(())
            }
        }
    }
}
