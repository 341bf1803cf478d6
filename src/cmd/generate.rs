//! `generate`: the man page and shell completions, from the one CLI definition.

use std::io::Write;

use clap::CommandFactory;

use crate::cli::{Cli, GenerateArgs, Generated};
use intact::report::Exit;

pub fn run(a: GenerateArgs) -> anyhow::Result<Exit> {
    let mut cmd = Cli::command();
    let mut out = std::io::stdout().lock();
    let shell = match a.what {
        Generated::Man => {
            clap_mangen::Man::new(cmd).render(&mut out)?;
            return Ok(Exit::Clean);
        }
        Generated::Bash => clap_complete::Shell::Bash,
        Generated::Zsh => clap_complete::Shell::Zsh,
        Generated::Fish => clap_complete::Shell::Fish,
        Generated::Elvish => clap_complete::Shell::Elvish,
        Generated::Powershell => clap_complete::Shell::PowerShell,
    };
    clap_complete::generate(shell, &mut cmd, "intact", &mut out);
    out.flush()?;
    Ok(Exit::Clean)
}
