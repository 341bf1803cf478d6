//! Waiting for another process's lock on the database: bounded, and given up at once when the
//! run is interrupted. A global, because rusqlite's busy handler is a plain `fn` that can
//! capture nothing.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rusqlite::Connection;

/// How long a run waits for the lock of a database that another process is writing: other
/// runs of intact hold it for a moment at a time (their writes are committed at least every
/// second), so a wait this long is a stuck or foreign writer, and the run fails (exit 3).
pub const LOCK_WAIT: Duration = Duration::from_secs(60);

/// What a wait for a lock answers to: a flag that ends it (the run was interrupted), and a
/// function told once that a wait has begun to take long.
pub(super) struct Waits {
    pub(super) cancel: &'static AtomicBool,
    pub(super) notice: fn(Duration),
}

pub(super) static WAITS: OnceLock<Waits> = OnceLock::new();

/// Makes every wait for a lock of the database give up as soon as `cancel` is set (so that
/// Ctrl-C and SIGTERM end a run within a second), and call `notice` once, the first time a
/// wait lasts a second, with how long it may last.
pub fn on_lock_waits(cancel: &'static AtomicBool, notice: fn(Duration)) {
    let _ = WAITS.set(Waits { cancel, notice });
}

/// SQLite's busy handler: waits in steps of 10 ms, up to [`LOCK_WAIT`] for each lock.
pub(super) fn busy(tries: i32) -> bool {
    const STEP: Duration = Duration::from_millis(10);
    static NOTICED: AtomicBool = AtomicBool::new(false);
    if let Some(w) = WAITS.get() {
        if w.cancel.load(Ordering::Relaxed) {
            return false;
        }
        if tries >= 100 && !NOTICED.swap(true, Ordering::Relaxed) {
            (w.notice)(LOCK_WAIT);
        }
    }
    if STEP * tries.max(0) as u32 >= LOCK_WAIT {
        return false;
    }
    std::thread::sleep(STEP);
    true
}

/// Makes `conn` wait for locks as [`busy`] says.
pub(crate) fn wait_for_locks(conn: &mut Connection) -> rusqlite::Result<()> {
    conn.busy_handler(Some(busy))
}

/// Why a wait for a lock ended without it.
pub(super) fn why_busy() -> String {
    match WAITS.get() {
        Some(w) if w.cancel.load(Ordering::Relaxed) => {
            "interrupted while waiting for another process's lock on it".into()
        }
        _ => format!(
            "another process holds its lock, still after {} s",
            LOCK_WAIT.as_secs()
        ),
    }
}
