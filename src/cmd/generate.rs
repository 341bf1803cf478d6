//! `generate`: the man pages and shell completions, from the one CLI definition.
//!
//! One page per verb (`intact-scrub(1)`, `intact-archive-create(1)` ...), as `intact(1)` names
//! them. clap_mangen renders each page's name, synopsis, description and options; the notes
//! after them (`after_help`) are rendered here, because clap_mangen gives each of their lines
//! to roff as it is, and roff then breaks the indented exit-code table mid-sentence.

use std::io::Write;
use std::path::Path;

use clap::CommandFactory;
use roff::{Roff, bold, roman};

use crate::cli::settings::usage;
use crate::cli::{Cli, GenerateArgs, Generated};
use intact::report::Exit;

pub fn run(a: GenerateArgs) -> anyhow::Result<Exit> {
    let mut cmd = Cli::command();
    let mut out = std::io::stdout().lock();
    let shell = match a.what {
        Generated::Man => {
            // `help` is a flag of every verb, not a page of its own.
            let mut cmd = cmd.disable_help_subcommand(true);
            cmd.build();
            match a.dir {
                Some(dir) => pages(&cmd, &dir)?,
                None => page(&cmd, &mut out)?,
            }
            out.flush()?;
            return Ok(Exit::Clean);
        }
        _ if a.dir.is_some() => {
            return Err(usage(
                "a directory is for `generate man` only: completions go to stdout",
            ));
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

/// Writes the page of `cmd` and of each of its verbs into `dir`, as `NAME.1`.
fn pages(cmd: &clap::Command, dir: &Path) -> anyhow::Result<()> {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        pages(sub, dir)?;
    }
    let man = clap_mangen::Man::new(cmd.clone());
    let file = crate::cli::settings::output(&dir.join(man.get_filename()), "a man page")?;
    let mut text = Vec::new();
    page(cmd, &mut text)?;
    std::fs::write(&file, text)
        .map_err(|e| anyhow::anyhow!("writing {}: {e}", intact::text::escape(&file)))
}

/// The page of `cmd`: clap_mangen's, with the notes after the options rendered here.
fn page(cmd: &clap::Command, out: &mut dyn Write) -> std::io::Result<()> {
    let bare = cmd
        .clone()
        .after_help(None::<&str>)
        .after_long_help(None::<&str>);
    clap_mangen::Man::new(bare).render(out)?;
    notes(cmd, out)?;
    if cmd.get_display_name().is_some_and(|n| n.contains('-')) {
        let mut roff = Roff::new();
        roff.control("SH", ["SEE ALSO"])
            .text([bold("intact"), roman("(1)")]);
        out.write_all(roff.to_roff().as_bytes())?;
    }
    Ok(())
}

/// The text after the options: paragraphs of prose under NOTES, and a list of `CODE  words`
/// lines (after "Exit codes:") as EXIT STATUS, each code a tagged paragraph.
fn notes(cmd: &clap::Command, out: &mut dyn Write) -> std::io::Result<()> {
    let Some(text) = cmd.get_after_long_help().or_else(|| cmd.get_after_help()) else {
        return Ok(());
    };
    let text = text.to_string();
    let mut prose = Roff::new();
    let mut codes = Roff::new();
    let mut has_prose = false;
    for para in text.split("\n\n") {
        let mut lines = para.lines();
        let first = lines.next().unwrap_or_default();
        if let Some(rest) = first.strip_prefix("Exit codes:") {
            if rest.trim().is_empty() {
                for (code, words) in items(lines) {
                    codes
                        .control("TP", [])
                        .text([bold(code)])
                        .text([roman(words)]);
                }
            } else {
                // In a sentence ("as for check (1 damage found ...)").
                let sentence = joined(std::iter::once(rest).chain(lines));
                codes.control("PP", []).text([roman(sentence)]);
            }
        } else {
            has_prose = true;
            prose.control("PP", []).text([roman(joined(para.lines()))]);
        }
    }
    if has_prose {
        out.write_all(b".SH NOTES\n")?;
        out.write_all(prose.to_roff().as_bytes())?;
    }
    let codes = codes.to_roff();
    if !codes.is_empty() {
        out.write_all(b".SH \"EXIT STATUS\"\n")?;
        out.write_all(codes.as_bytes())?;
    }
    Ok(())
}

/// `  CODE  words` lines, and the deeper-indented lines that go on with their words.
fn items<'a>(lines: impl Iterator<Item = &'a str>) -> Vec<(String, String)> {
    let mut items: Vec<(String, String)> = Vec::new();
    for line in lines {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        match (indent <= 2, trimmed.split_once("  "), items.last_mut()) {
            (true, Some((code, words)), _) => items.push((code.into(), words.trim().into())),
            (_, _, Some((_, words))) => {
                words.push(' ');
                words.push_str(trimmed);
            }
            (_, _, None) => items.push((String::new(), trimmed.into())),
        }
    }
    items
}

/// Lines of a paragraph as one, for roff to fill.
fn joined<'a>(lines: impl Iterator<Item = &'a str>) -> String {
    lines.map(str::trim).collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_are_items_with_their_continued_words() {
        let text = "  0    all good\n  1    damage: a file\n       changed\n  130  interrupted";
        assert_eq!(
            items(text.lines()),
            [
                ("0".into(), "all good".into()),
                ("1".into(), "damage: a file changed".into()),
                ("130".into(), "interrupted".into()),
            ]
        );
    }

    #[test]
    fn every_verb_has_a_page_with_its_options_and_exit_status() {
        let mut cmd = Cli::command().disable_help_subcommand(true);
        cmd.build();
        let scrub = cmd.find_subcommand("scrub").unwrap();
        assert_eq!(
            clap_mangen::Man::new(scrub.clone()).get_filename(),
            "intact-scrub.1"
        );
        let mut text = Vec::new();
        page(scrub, &mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        for needle in [
            "max\\-percent",
            ".SH NOTES",
            ".SH \"EXIT STATUS\"",
            "SEE ALSO",
        ] {
            assert!(text.contains(needle), "{needle}: {text}");
        }
        let mut text = Vec::new();
        page(&cmd, &mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(
            text.contains(".SH \"EXIT STATUS\"\n.TP\n\\fB0\\fR"),
            "{text}"
        );
        assert!(text.contains(".TP\n\\fB130\\fR\ninterrupted"), "{text}");
        assert!(!text.contains("intact\\-help"), "{text}");
    }
}
