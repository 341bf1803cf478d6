//! A database that cannot serve: a full file system under it, a damaged one moved aside and
//! replaced, and SQLite's errors said in words.

use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rusqlite::params;

use super::{State, StateError, now};

/// Space a state database needs free before SQLite touches it: its shared memory (`-shm`)
/// is a sparse file that SQLite maps and writes into, and a page of it that the file system
/// cannot allocate kills the process with SIGBUS (seen on a full ext4 of 1 KiB blocks, where
/// SQLite's one byte written per 4 KiB page leaves three blocks of each unallocated). With
/// less than this free, the database is not used, and the run says so. (A log that cannot
/// grow is an error SQLite reports: it needs no room set aside here.) The shared memory is
/// not allocated ahead through a descriptor of intact's own: closing any descriptor of a
/// file drops the process's POSIX locks on it, SQLite's among them, and another process
/// then truncated the shared memory under this one's map (SIGBUS, seen with two scrubs at
/// once).
pub(super) const ROOM_NEEDED: u64 = 64 << 10;

/// Fails unless the file system of the database at `path` has [`ROOM_NEEDED`] free for
/// anyone (not counting the blocks reserved for root, of which the file system keeps some
/// that not even root can have).
pub(super) fn room_for_shared_memory(path: &Path) -> Result<(), StateError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let Ok(st) = rustix::fs::statvfs(dir) else {
        return Ok(());
    };
    let free = st.f_bavail.saturating_mul(st.f_frsize);
    if free < ROOM_NEEDED {
        return Err(StateError::Io(io::Error::other(format!(
            "its file system is full ({} free; it needs {} for its shared memory)",
            crate::text::bytes(free),
            crate::text::bytes(ROOM_NEEDED)
        ))));
    }
    Ok(())
}

/// `path` with `suffix` appended to its last component (`state.db` → `state.db-wal`), for
/// any path, UTF-8 or not.
pub(super) fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut p = path.as_os_str().to_os_string();
    p.push(suffix);
    PathBuf::from(p)
}

/// Moves the database at `path` (and its WAL) aside, to `PATH.broken-TIME`.
pub(super) fn move_aside(path: &Path) -> io::Result<PathBuf> {
    let aside = with_suffix(path, &format!(".broken-{}", now()));
    std::fs::rename(path, &aside)?;
    for suffix in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(with_suffix(path, suffix));
    }
    Ok(aside)
}

/// A damaged database moved aside and replaced by a new one.
#[derive(Debug)]
pub struct Rebuilt {
    /// Where the damaged one is now.
    pub aside: PathBuf,
    /// What SQLite said of it.
    pub why: String,
}

/// Moves the damaged database at `path` aside and makes a new one there that remembers when
/// and why (`lost`): what the old one knew of damage and verification is gone, and every run
/// says so until each file has been checked again.
pub(super) fn rebuild(path: &Path, why: &str) -> Result<Rebuilt, StateError> {
    let aside = move_aside(path)?;
    let fresh = State::open_at(path)?;
    fresh.conn.execute(
        "INSERT INTO lost (at, aside, why) VALUES (?1, ?2, ?3)",
        params![now(), aside.as_os_str().as_bytes(), why],
    )?;
    Ok(Rebuilt {
        aside,
        why: why.to_string(),
    })
}

/// What SQLite said, in words that say what to do where it can.
pub fn why(e: &rusqlite::Error) -> String {
    match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked) => {
            super::locks::why_busy()
        }
        Some(rusqlite::ErrorCode::DiskFull) => format!("{e}: the disk under it is full"),
        Some(rusqlite::ErrorCode::ReadOnly | rusqlite::ErrorCode::CannotOpen) => {
            format!("{e}: it, or its directory, cannot be written")
        }
        _ => e.to_string(),
    }
}

/// Whether SQLite says the file is not a database, or a damaged one.
pub fn is_damage(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::NotADatabase | rusqlite::ErrorCode::DatabaseCorrupt)
    )
}
