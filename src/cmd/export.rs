//! `export`: a manifest from the tags alone, on stdout (the reports then go to stderr) or
//! written atomically to a file.

use anyhow::Context;

use crate::cli::ExportArgs;
use crate::cli::settings::{Settings, algo};
use intact::export::Listing;
use intact::report::Exit;
use intact::verb::Verb;

pub fn run(a: ExportArgs) -> anyhow::Result<Exit> {
    let mut s = Settings::new(Verb::Export, vec![a.path], &a.common)?;
    s.config.algo = Some(algo(a.algo));
    let mut listing = match a.output {
        Some(file) => {
            crate::cli::settings::output(&file, "the manifest")?;
            for stale in intact::fs::atomic::remove_stale(intact::fs::atomic::parent(&file)) {
                super::removed(&stale);
            }
            Listing::file(&s.roots, file.clone())
                .with_context(|| format!("creating {}", intact::text::escape(&file)))?
        }
        None => {
            s.reports_to_stderr = true;
            Listing::stdout(&s.roots)
        }
    };
    super::drive(s, &mut listing)
}
