//! Each tree as the database first met it: the file system and the folder its PATH led to.
//! A PATH that now leads elsewhere (a disk that did not mount, leaving the empty folder under
//! it; a folder another user swapped for theirs) is not the same tree: its files are neither
//! verified against nor recorded over the tree's history until the owner says it is
//! (`--accept-moved-root`: a tree restored from a backup, a file system made anew).

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use rusqlite::{OptionalExtension, params};

use super::{State, absolute, entries::bytes, now, under};

/// A PATH that now leads to another folder than the tree the state database knows there.
#[derive(Debug)]
pub struct OtherFolder {
    /// The PATH, escaped.
    root: String,
    /// On another file system (a disk that did not mount?).
    other_fs: bool,
    /// Since when the database has known the tree (Unix milliseconds).
    since: i64,
}

impl std::fmt::Display for OtherFolder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: now {} than the tree the state database has known there since {}: nothing \
             under it was verified or recorded. If it is the same tree (restored from a backup, \
             its file system made anew), `--accept-moved-root` takes it as such",
            self.root,
            if self.other_fs {
                "a folder on another file system (a disk that did not mount?)"
            } else {
                "another folder"
            },
            crate::text::time_ms(self.since)
        )
    }
}

impl std::error::Error for OtherFolder {}

impl State {
    /// Whether `root` is still the folder the database knows under its path. A root met for
    /// the first time, `accept`ed, or now another folder but with no file known under it, is
    /// recorded as it is now; a file given as a root, or one that cannot be looked at (said by
    /// the walk), is let be. The error says what changed and what to do.
    pub fn same_root(&mut self, root: &Path, accept: bool) -> Result<(), OtherFolder> {
        let Ok(meta) = crate::fs::sys::lstat(root) else {
            return Ok(());
        };
        if !meta.is_dir() {
            return Ok(());
        }
        let path = absolute(root);
        let now_is = (self.fsids.of(meta.dev(), &path), meta.ino() as i64);
        let known = self
            .conn
            .query_row(
                "SELECT fs, ino, at FROM roots WHERE path = ?1",
                [bytes(&path)],
                |r| {
                    Ok((
                        r.get::<_, i64>(0)?,
                        r.get::<_, i64>(1)?,
                        r.get::<_, i64>(2)?,
                    ))
                },
            )
            .optional();
        let known = match known {
            Ok(known) => known,
            // Unread, it is neither accepted nor overwritten.
            Err(e) => {
                self.fail(e);
                return Ok(());
            }
        };
        // A tree of which nothing is known (emptied and made again) has no history to guard.
        let (low, high, exact) = under(&path);
        let history = || {
            self.conn
                .query_row(
                    "SELECT EXISTS (SELECT 1 FROM dirs WHERE (path >= ?1 AND path < ?2) \
                     OR path = ?3)",
                    params![low, high, exact],
                    |r| r.get::<_, bool>(0),
                )
                .unwrap_or(true)
        };
        match known {
            Some((fs, ino, _)) if (fs, ino) == now_is => Ok(()),
            Some((fs, _, at)) if !accept && history() => Err(OtherFolder {
                root: crate::text::escape(root),
                other_fs: fs != now_is.0,
                since: at,
            }),
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
