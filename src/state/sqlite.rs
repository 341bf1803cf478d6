//! How intact opens SQLite: every connection, to the state database or to a scrub's plan,
//! is made here, so that each one is set up alike.

#![allow(unsafe_code)]

use std::path::Path;
use std::sync::Once;

use rusqlite::config::DbConfig;
use rusqlite::{Connection, OpenFlags};

/// Opens the database at `path` (`""`: a private temporary one) with `flags`.
///
/// Before the first, SQLite is told to keep no statistics of its memory: nothing reads them,
/// and keeping them takes a process-wide lock in every allocation SQLite makes (6% of the
/// state writer's CPU). Each statement is then planned once, whatever the values bound to
/// it: otherwise a statement whose plan looked at a bound value (the join that loads a
/// directory's entries does) is planned again whenever its bindings change, and rusqlite
/// clears them each time a cached statement goes back to its cache; every directory loaded
/// was parsed and planned anew, a fifth of the writer's CPU at 20 files a folder. intact's
/// statements look rows up by key: no value can make another plan better.
pub(crate) fn open(path: &Path, flags: OpenFlags) -> rusqlite::Result<Connection> {
    static STARTED: Once = Once::new();
    STARTED.call_once(|| {
        // SAFETY: an option SQLite documents, with its one `int` argument, set before any
        // connection of this process exists (the `Once` holds back every other opening until
        // it is done). Had SQLite started already, it would refuse (SQLITE_MISUSE), changing
        // nothing.
        unsafe {
            rusqlite::ffi::sqlite3_config(
                rusqlite::ffi::SQLITE_CONFIG_MEMSTATUS,
                0 as std::ffi::c_int,
            )
        };
    });
    let conn = Connection::open_with_flags(path, flags)?;
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
    Ok(conn)
}
