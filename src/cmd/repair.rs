//! `repair`: damaged files restored from the sources named and each tree's own parity
//! store, verified before anything is replaced.

use crate::cli::RepairArgs;
use crate::cli::settings::{Settings, usage};
use intact::parity::{self, Store};
use intact::repair::{self, Keep, Repairer};
use intact::report::Exit;
use intact::verb::Verb;

pub fn run(a: RepairArgs) -> anyhow::Result<Exit> {
    let keep = match (a.keep_damaged_in, a.discard_damaged) {
        (Some(dir), _) => Keep::In(dir),
        (None, true) => Keep::Discard,
        (None, false) => Keep::Beside,
    };
    let mut from = a.from;
    // Each PATH's own parity store, if it has one, is searched after the sources named.
    for p in &a.paths.paths {
        let store = parity::store_dir(p);
        if Store::is_store(&store) && !from.contains(&store) {
            from.push(store);
        }
    }
    if from.is_empty() && a.from_command.is_empty() {
        let looked: Vec<String> = a
            .paths
            .paths
            .iter()
            .map(|p| intact::text::escape(&parity::store_dir(p)))
            .collect();
        return Err(usage(format!(
            "no sources: give --from ARCHIVE|DIR|STORE|restic:REPO|borg:REPO or \
             --from-command CMD (no parity store at {})",
            looked.join(", ")
        )));
    }
    let commands = a
        .from_command
        .iter()
        .map(|c| repair::FromCommand::new(c, a.source_timeout))
        .collect::<Result<Vec<_>, _>>()
        .map_err(usage)?;
    let mut s = Settings::new(Verb::Repair, a.paths.paths, &a.common)?;
    s.changes_files(!a.dry_run);
    s.known_damage_only = !a.full;
    // A dry run records nothing, but where it is to find what is missing it reads (and so
    // records its check) too.
    if !a.dry_run || a.missing {
        s.record(&a.state);
    }
    if a.missing && s.state.is_none() {
        return Err(usage(
            "--missing restores what the state database knew: it needs one (not --no-state)",
        ));
    }
    // A dry run changes nothing and tells nobody: it is the owner asking.
    if !a.dry_run {
        s.notify(&a.notify)?;
    }
    let opts = repair::Options {
        dry_run: a.dry_run,
        keep,
        missing: a.missing,
        source_timeout: a.source_timeout,
    };
    // Sources that cannot be used are said before anything runs.
    let mut repairer =
        Repairer::new(&s.roots, &from, commands, opts, &super::STOP).map_err(usage)?;
    super::drive(s, &mut repairer)
}
