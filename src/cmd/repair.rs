//! `repair`: damaged files restored from the sources named and each tree's own parity
//! store, verified before anything is replaced.

use crate::cli::RepairArgs;
use crate::cli::settings::{Settings, usage};
use intact::parity;
use intact::repair::{self, Keep, Repairer};
use intact::report::Exit;
use intact::verb::Verb;

pub fn run(a: RepairArgs) -> anyhow::Result<Exit> {
    let keep = match (a.keep_damaged_in, a.discard_damaged) {
        (Some(dir), _) => Keep::In(dir),
        (None, true) => Keep::Discard,
        (None, false) => Keep::Beside,
    };
    let mut from = Vec::new();
    for f in a.from {
        // The sources the owner configured (what messages print where a source holds a
        // secret): a folder named so is `./configured`.
        if f.as_os_str() == "configured" {
            from.extend(
                configured()
                    .map_err(usage)?
                    .into_iter()
                    .map(std::path::PathBuf::from),
            );
        } else {
            from.push(f);
        }
    }
    // Each PATH's parity store (its own, or its tree's above it), if it has one, is searched
    // after the sources named.
    for p in &a.paths.paths {
        if let Some(store) = parity::store_over(p)
            && !from.contains(&store)
        {
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
             --from-command CMD (no parity store at or above {})",
            looked.join(", ")
        )));
    }
    let commands = a
        .from_command
        .iter()
        .map(|c| repair::FromCommand::new(c, a.source_timeout))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| usage(e.to_string()))?;
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
    let mut repairer = Repairer::new(&s.roots, &from, commands, opts, &super::STOP)
        .map_err(|e| usage(e.to_string()))?;
    super::drive(s, &mut repairer)
}

/// Where good copies are, as the owner configured them for the units: `INTACT_REPAIR_FROM`,
/// else its line in /etc/default/intact (the units' settings, which a shell has not read).
fn configured() -> Result<Vec<String>, String> {
    let from = match std::env::var("INTACT_REPAIR_FROM") {
        Ok(v) if !v.trim().is_empty() => v,
        _ => {
            let file = std::path::Path::new(SETTINGS);
            let text = intact::fs::sys::read_regular(file).unwrap_or_default();
            setting(&String::from_utf8_lossy(&text), "INTACT_REPAIR_FROM").unwrap_or_default()
        }
    };
    let sources = repair::sources(&from).map_err(|e| format!("--from configured: {e}"))?;
    if sources.is_empty() {
        return Err(format!(
            "--from configured: no source is configured (INTACT_REPAIR_FROM, in the \
             environment or in {SETTINGS})"
        ));
    }
    Ok(sources)
}

/// The units' settings file.
const SETTINGS: &str = "/etc/default/intact";

/// The value of `name` in a file of `NAME=value` lines as systemd's `EnvironmentFile=` reads
/// it (the value perhaps in single or double quotes; `#` lines are comments).
fn setting(text: &str, name: &str) -> Option<String> {
    text.lines().rev().find_map(|line| {
        let value = line.trim().strip_prefix(name)?.strip_prefix('=')?.trim();
        let unquoted = ['"', '\'']
            .iter()
            .find_map(|q| value.strip_prefix(*q)?.strip_suffix(*q))
            .unwrap_or(value);
        Some(unquoted.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::setting;

    #[test]
    fn a_setting_is_read_as_systemd_reads_the_file() {
        let text = "# sources\nINTACT_REPAIR_FROM=/old\n INTACT_REPAIR_FROM=\"restic:/r /mnt/b\"\n\
                    INTACT_REPAIR_FROM_X=no\n";
        assert_eq!(
            setting(text, "INTACT_REPAIR_FROM").as_deref(),
            Some("restic:/r /mnt/b")
        );
        assert_eq!(setting("A='x y'", "A").as_deref(), Some("x y"));
        assert_eq!(setting("# A=x", "A"), None);
    }
}
