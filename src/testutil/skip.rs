//! `skip!`: the one way a test that cannot run here says so. Shared by the unit tests and the
//! test binaries (included by path, at each crate's root as `skip`), so that the rule is
//! written once.
//!
//! A skip is visible in `cargo test`'s own output: said at once on the process's stderr (the
//! test harness captures `eprintln!`, not writes to stderr itself), and counted, with every
//! reason, when the test binary exits.

use std::io::Write;
use std::sync::Mutex;

/// Ends the test, saying why it cannot run here, and passes vacuously; under `CI=true` a skip
/// is a failure (CI runs as root, with FUSE, loop devices and every tool). With a second
/// argument, returns that from the function (a helper that answers whether to go on).
#[macro_export]
macro_rules! skip {
    ($why:expr) => {
        $crate::skip!($why, ())
    };
    ($why:expr, $ret:expr) => {{
        let why = $why;
        assert!(
            std::env::var_os("CI").is_none(),
            "{why}, and a skip under CI is a failure"
        );
        $crate::skip::said(&why);
        return $ret;
    }};
}

/// The skips of this process: test, and why.
static SKIPPED: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Says a skip now, past the harness's capture, and keeps it for the count at exit.
pub fn said(why: &str) {
    // The harness names each test's thread after the test.
    let line = format!(
        "SKIPPED {}: {why}",
        std::thread::current().name().unwrap_or("a test")
    );
    let _ = writeln!(std::io::stderr(), "{line}");
    let mut skipped = SKIPPED.lock().unwrap_or_else(|e| e.into_inner());
    if skipped.is_empty() {
        register();
    }
    skipped.push(line);
}

#[allow(unsafe_code)]
fn register() {
    // SAFETY: `atexit` takes a plain function of no arguments, which `at_exit` is; it runs
    // when the harness returns from main (or calls `exit` on a failure).
    unsafe {
        libc::atexit(at_exit);
    }
}

/// The count at the end of the run, after the harness's own summary.
extern "C" fn at_exit() {
    let skipped = SKIPPED.lock().unwrap_or_else(|e| e.into_inner());
    let mut text = format!(
        "\n{} {} skipped here, not run (under CI=true a skip is a failure):\n",
        skipped.len(),
        if skipped.len() == 1 { "test" } else { "tests" }
    );
    for line in skipped.iter() {
        text.push_str(&format!("  {line}\n"));
    }
    let _ = std::io::stderr().write_all(text.as_bytes());
}
