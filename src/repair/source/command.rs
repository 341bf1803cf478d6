//! `--from-command`: any command that prints a good copy of a file (rclone, ssh, a script),
//! run by `sh -c` with the file's path quoted into it. It only offers bytes, which replace
//! nothing unless they hash to the damaged file's tag.

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::{Attempts, BadSource, Search, Template, Unusable, stream};
use crate::process::{self, Watch};
use crate::text::escape;

/// A command that prints a good copy of a file (`--from-command`), run with `sh -c`: `{}`
/// becomes the file's path relative to the PATH it is under, quoted for that shell; `{ssh}`
/// the same quoted twice, for a command that hands its arguments to a second shell (ssh
/// joins them and the remote shell parses them again: a name such as `$(touch x)` would run
/// there). The command chooses nothing: it only offers bytes, which replace nothing unless
/// they hash to the damaged file's tag.
pub struct FromCommand {
    template: String,
    silence: Duration,
}

/// A template cut at its placeholders.
#[derive(Debug, PartialEq)]
enum Part<'t> {
    Text(&'t str),
    /// `{}`: quoted once.
    Path,
    /// `{ssh}`: quoted twice.
    Twice,
}

impl FromCommand {
    /// The command `template`, given up on once silent for `silence`. A placeholder inside
    /// the template's own quotes is refused (intact's quoting would end them, and the name
    /// would be parsed as shell code), and so is `{}` in an ssh command (`{ssh}` is the safe
    /// one there).
    pub fn new(template: &str, silence: Duration) -> Result<FromCommand, BadSource> {
        let bad = |why| BadSource::Command {
            template: template.to_string(),
            why,
        };
        let parts = parts(template).map_err(bad)?;
        // `timeout 60 ssh nas cat {}` ran hostile names on the remote.
        if process::runs_ssh(template) && parts.contains(&Part::Path) {
            return Err(bad(Template::SshPath));
        }
        if !parts.iter().any(|p| matches!(p, Part::Path | Part::Twice)) {
            return Err(bad(Template::NoPath));
        }
        Ok(FromCommand {
            template: template.into(),
            silence,
        })
    }

    /// The command line for the file at `rel`, as bytes (a name that is not UTF-8 reaches
    /// the command as it is).
    fn line(&self, rel: &[u8]) -> OsString {
        let once = quoted(rel);
        let mut line = Vec::new();
        for part in parts(&self.template).unwrap_or_default() {
            match part {
                Part::Text(t) => line.extend_from_slice(t.as_bytes()),
                Part::Path => line.extend_from_slice(&once),
                Part::Twice => line.extend_from_slice(&quoted(&once)),
            }
        }
        OsString::from_vec(line)
    }
}

/// `template` cut at its placeholders, or why it is refused: a placeholder inside single or
/// double quotes of its own.
fn parts(template: &str) -> Result<Vec<Part<'_>>, Template> {
    #[derive(PartialEq)]
    enum In {
        Plain,
        Single,
        Double,
    }
    let mut parts = Vec::new();
    let (mut quote, mut escaped, mut from, mut i) = (In::Plain, false, 0, 0);
    let b = template.as_bytes();
    while i < b.len() {
        let placeholder = [("{}", Part::Path), ("{ssh}", Part::Twice)]
            .into_iter()
            .find(|(p, _)| template[i..].starts_with(p));
        match (placeholder, b[i]) {
            (Some((p, part)), _) if !escaped => {
                if quote != In::Plain {
                    return Err(Template::QuotedPlaceholder { placeholder: p });
                }
                parts.push(Part::Text(&template[from..i]));
                parts.push(part);
                i += p.len();
                from = i;
                continue;
            }
            _ if escaped => escaped = false,
            (_, b'\\') if quote != In::Single => escaped = true,
            (_, b'\'') if quote != In::Double => {
                quote = if quote == In::Single {
                    In::Plain
                } else {
                    In::Single
                }
            }
            (_, b'"') if quote != In::Single => {
                quote = if quote == In::Double {
                    In::Plain
                } else {
                    In::Double
                }
            }
            _ => {}
        }
        i += 1;
    }
    parts.push(Part::Text(&template[from..]));
    parts.retain(|p| *p != Part::Text(""));
    Ok(parts)
}

impl Search for FromCommand {
    fn name(&self) -> String {
        format!("the command `{}`", self.template)
    }

    fn search(&self, work: &mut dyn Attempts, cancel: &AtomicBool) -> Result<(), Unusable> {
        let watch = Watch::quiet_for(cancel, self.silence);
        for i in 0..work.count() {
            if cancel.load(Ordering::Relaxed) {
                break;
            }
            let Some(want) = work.want(i) else { continue };
            let line = self.line(want.rel.as_os_str().as_bytes());
            let from = format!("`{}`", escape(Path::new(&line)));
            work.offer(i, &from, &mut |sink| {
                stream(Command::new("sh").arg("-c").arg(&line), watch, sink)
            });
        }
        Ok(())
    }
}

/// `bytes` quoted for `sh`: in single quotes, each single quote closed, escaped, reopened.
fn quoted(bytes: &[u8]) -> Vec<u8> {
    let mut q = vec![b'\''];
    for &b in bytes {
        if b == b'\'' {
            q.extend_from_slice(b"'\\''");
        } else {
            q.push(b);
        }
    }
    q.push(b'\'');
    q
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_quoted_once_or_twice_and_never_inside_quotes() {
        let s = Duration::from_secs(1);
        let line = |t: &str, rel: &[u8]| FromCommand::new(t, s).unwrap().line(rel);
        assert_eq!(
            line("rclone cat remote:p/{}", b"a b"),
            OsString::from("rclone cat remote:p/'a b'")
        );
        // What a second shell makes of `{ssh}`: the name itself, whatever it holds.
        let hostile = b"$(echo pwned)'\"x\\ y";
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(line("sh -c printf\\ %s\\ {ssh}", hostile))
            .output()
            .unwrap();
        assert_eq!(out.stdout, hostile);
        // A brace that is no placeholder, and an escaped quote, are text.
        assert_eq!(
            line(r"echo \' {x} {}", b"f"),
            OsString::from(r"echo \' {x} 'f'")
        );
        for bad in [
            "cat \"/srv/{}\"",
            "cat '/srv/{}'",
            "ssh nas cat /srv/{}",
            "/usr/bin/ssh nas cat {}",
            "timeout 60 ssh nas cat {}",
            "env LC_ALL=C ssh nas cat {}",
            "nice -n 19 ssh nas cat {}",
            "cd /srv && ssh nas cat {}",
            "cat /srv/file",
        ] {
            assert!(FromCommand::new(bad, s).is_err(), "{bad}");
        }
    }

    #[test]
    fn paths_are_quoted_for_the_shell() {
        assert_eq!(quoted(b"it's here"), b"'it'\\''s here'");
        assert_eq!(quoted(b"$(rm -rf /)"), b"'$(rm -rf /)'");
        assert_eq!(quoted(b"caf\xe9"), b"'caf\xe9'");
    }
}
