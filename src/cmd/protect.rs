//! `protect`: PAR2 parity for verified files, in each tree's own store or the one given.

use std::path::Path;
use std::time::Duration;

use crate::cli::ProtectArgs;
use crate::cli::settings::{Settings, usage};
use intact::parity::{OpenError, Protector};
use intact::report::Exit;
use intact::sink::Pass;
use intact::verb::Verb;

pub fn run(a: ProtectArgs) -> anyhow::Result<Exit> {
    if a.store.is_some() && a.paths.paths.len() > 1 {
        return Err(usage(
            "--store takes one PATH (names in a store are relative to it)",
        ));
    }
    let mut s = Settings::new(Verb::Protect, a.paths.paths, &a.common)?;
    s.record(&a.state);
    match protector(&mut s, a.store.as_deref(), a.redundancy, Some(a.keep_stale))? {
        Some(mut protector) => super::drive(s, &mut protector),
        None => super::drive(s, &mut Pass),
    }
}

/// The protector of `s`'s trees, in the store given or each tree's own, at `redundancy`;
/// moving stale parity aside (kept `keep_stale`) unless `None`. Temp files that killed runs
/// left in the stores are removed, and said; the engine is told what it may leave unread.
/// A store that cannot be used (refused as unsafe, or failing) is a failure of the run, which
/// goes on without parity: `None`.
pub(super) fn protector(
    s: &mut Settings,
    store: Option<&Path>,
    redundancy: f64,
    keep_stale: Option<Duration>,
) -> anyhow::Result<Option<Protector>> {
    let opened = Protector::open(
        &s.roots,
        store,
        redundancy,
        s.config.threads,
        s.config.mtime_window_ns,
        keep_stale,
        &super::STOP,
    );
    let (protector, removed) = match opened {
        Ok(opened) => opened,
        Err(e @ OpenError::OtherTree { .. }) => return Err(usage(e.to_string())),
        Err(e @ OpenError::Io { .. }) => {
            s.failures.push(format!("{e}: no parity this run"));
            return Ok(None);
        }
    };
    for stale in removed {
        super::removed(&stale);
    }
    s.config.sink_verifies = Some(protector.reads());
    Ok(Some(protector))
}
