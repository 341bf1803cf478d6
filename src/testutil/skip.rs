//! `skip!`: the one way a test that cannot run here says so. Shared by the unit tests and the
//! test binaries (included by path), so that the rule is written once.

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
        eprintln!("SKIPPED: {why}");
        return $ret;
    }};
}
