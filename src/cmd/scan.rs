//! The verbs whose work is the engine's alone: tag, check, update, strip, show, import.

use std::path::PathBuf;

use crate::cli::settings::{Settings, algo, formats, usage};
use crate::cli::{CheckArgs, ImportArgs, ShowArgs, StripArgs, TagArgs, UpdateArgs};
use intact::report::Exit;
use intact::sink::Pass;
use intact::verb::Verb;

pub fn tag(a: TagArgs) -> anyhow::Result<Exit> {
    let mut s = Settings::new(Verb::Tag, a.paths.paths, &a.common)?;
    s.config.algo = Some(algo(a.algo));
    s.config.force = a.force;
    s.config.compat = formats(&a.compat.compat);
    // What it tagged is recorded: a file deleted before any check can still be brought back
    // (`repair --missing`), and damage known before is never tagged over.
    s.record(&a.state);
    super::drive(s, &mut Pass)
}

pub fn check(a: CheckArgs) -> anyhow::Result<Exit> {
    let mut s = Settings::new(Verb::Check, a.paths.paths, &a.common)?;
    if let Some(file) = a.manifest {
        let [root] = s.roots.as_slice() else {
            return Err(usage(
                "--manifest checks exactly one PATH (the manifest's paths are relative to it)",
            ));
        };
        let root = root.clone();
        s.manifest(&file, &root, algo(a.algo))?;
    }
    s.record(&a.state);
    s.metrics(&a.metrics)?;
    s.notify(&a.notify)?;
    super::drive(s, &mut Pass)
}

pub fn update(a: UpdateArgs) -> anyhow::Result<Exit> {
    let mut s = Settings::new(Verb::Update, a.paths.paths, &a.common)?;
    s.config.algo = a.algo.map(algo);
    s.config.accept_corrupt = a.accept_corrupt;
    s.config.compat = formats(&a.compat.compat);
    s.record(&a.state);
    s.metrics(&a.metrics)?;
    s.notify(&a.notify)?;
    super::drive(s, &mut Pass)
}

pub fn strip(a: StripArgs) -> anyhow::Result<Exit> {
    let mut s = Settings::new(Verb::Strip, a.paths.paths, &a.common)?;
    s.config.compat = formats(&a.compat);
    super::drive(s, &mut Pass)
}

pub fn show(a: ShowArgs) -> anyhow::Result<Exit> {
    let s = Settings::new(Verb::Show, a.paths.paths, &a.common)?;
    super::drive(s, &mut Pass)
}

/// The files the manifest lists are opened beneath DIR, never through a symlink: DIR is the
/// one root.
pub fn import(a: ImportArgs) -> anyhow::Result<Exit> {
    let dir = a.dir.unwrap_or_else(|| match a.manifest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    });
    let mut s = Settings::new(Verb::Import, vec![dir.clone()], &a.common)?;
    s.manifest(&a.manifest, &dir, algo(a.algo))?;
    s.config.compat = formats(&a.compat.compat);
    s.record(&a.state);
    super::drive(s, &mut Pass)
}
