//! Writes `intact watch` saw: recorded as it sees them (so that a service killed before it
//! tagged what they wrote leaves the evidence behind), read by every run that judges data,
//! forgotten once the watch has tagged the file.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use rusqlite::params;

use super::{State, writer::transaction};
use crate::engine::Written;

impl State {
    /// The writes seen and not yet forgotten.
    pub fn written(&mut self) -> Written {
        let read = || -> rusqlite::Result<Written> {
            let mut stmt = self.conn.prepare("SELECT fs, ino, at FROM written")?;
            let rows = stmt.query_map([], |r| {
                Ok(((r.get(0)?, r.get::<_, i64>(1)? as u64), r.get(2)?))
            })?;
            rows.collect()
        };
        match read() {
            Ok(w) => w,
            Err(e) => {
                self.fail(e);
                Written::new()
            }
        }
    }

    /// Records writes seen at `at` (Unix milliseconds) to the files at `paths` that carry a
    /// tag, in one transaction. An untagged file has no tag a write could be told apart from
    /// rot against: a copy of 100,000 new files records nothing.
    pub fn saw_writes<'p>(&mut self, paths: impl IntoIterator<Item = &'p Path>, at: i64) {
        use std::os::unix::fs::OpenOptionsExt;
        let ids: Vec<(i64, i64)> = paths
            .into_iter()
            .filter_map(|p| {
                // Never through a symlink; a FIFO must not block the service.
                let f = std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
                    .open(p)
                    .ok()?;
                let m = f.metadata().ok().filter(|m| m.is_file())?;
                crate::fs::xattr::read(&f).ok()?.best()?;
                Some((self.fsids.of(m.dev(), p), m.ino() as i64))
            })
            .collect();
        if ids.is_empty() {
            return;
        }
        let result = transaction(&self.conn, |conn| {
            let mut stmt = conn.prepare_cached(
                "INSERT INTO written (fs, ino, at) VALUES (?1, ?2, ?3) \
                 ON CONFLICT DO UPDATE SET at = max(at, excluded.at)",
            )?;
            for (fs, ino) in &ids {
                stmt.execute(params![fs, ino, at])?;
            }
            Ok(())
        });
        if let Err(e) = result {
            self.fail(e);
        }
    }

    /// Forgets the writes seen before `before` to the files `(dev, ino, path)`: they are
    /// tagged as they are now (a write seen since stays, for the next look).
    pub fn forget_writes(&mut self, files: &[(u64, u64, std::path::PathBuf)], before: i64) {
        if files.is_empty() {
            return;
        }
        let ids: Vec<(i64, i64)> = files
            .iter()
            .map(|(dev, ino, path)| (self.fsids.of(*dev, path), *ino as i64))
            .collect();
        let result = transaction(&self.conn, |conn| {
            let mut stmt =
                conn.prepare_cached("DELETE FROM written WHERE fs = ?1 AND ino = ?2 AND at < ?3")?;
            for (fs, ino) in &ids {
                stmt.execute(params![fs, ino, before])?;
            }
            Ok(())
        });
        if let Err(e) = result {
            self.fail(e);
        }
    }
}
