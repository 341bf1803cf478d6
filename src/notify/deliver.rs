//! Delivery through other programs: Apprise (`apprise`, one URL for each of 100+ services),
//! a `sendmail` (msmtp-mta, nullmailer, postfix, exim) and, for the heartbeat, `curl`. intact
//! speaks no SMTP or HTTP itself: these tools already hold the owner's settings, TLS and
//! credentials.
//!
//! Secrets stay off command lines (where `ps` shows them to every user): Apprise URLs go in
//! the child's environment (`APPRISE_URLS`), the heartbeat URL on curl's standard input
//! (`-K -`). Each runs through [`crate::process`], killed with everything it started once its
//! time is up: a delivery can fail, never hang the run.

use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::Message;

/// Where messages go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Channel {
    /// Apprise URLs (`mailto://`, `ntfy://`, `json://` ...), sent by one run of `apprise`.
    Apprise(Vec<String>),
    /// An Apprise configuration file (URLs and tags, kept `chmod 600`).
    AppriseConfig(PathBuf),
    /// Mail to these addresses through the system's `sendmail`.
    Sendmail(Vec<String>),
}

/// Why a message or a heartbeat did not get through.
#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    /// The program is not installed.
    #[error("{program} is not installed ({hint})")]
    Missing {
        /// Which.
        program: String,
        /// Where to get it.
        hint: &'static str,
    },
    /// It could not be started, failed, or did not finish in time.
    #[error(transparent)]
    Run(crate::process::Error),
    /// A `sendmail:` URL without an address.
    #[error("`{0}`: a sendmail URL names the addresses to mail, e.g. sendmail:root@localhost")]
    BadUrl(String),
}

/// Sorts URLs into channels: `sendmail:ADDRESS[,ADDRESS...]` for the system's sendmail, any
/// other for Apprise (which checks its own URLs). Empty words are left out, so that an empty
/// `INTACT_NOTIFY` means none.
pub fn parse_channels(urls: &[String], config: Option<&Path>) -> Result<Vec<Channel>, NotifyError> {
    let mut apprise = Vec::new();
    let mut mail = Vec::new();
    for url in urls.iter().flat_map(|u| u.split_whitespace()) {
        match url.strip_prefix("sendmail:") {
            Some(rest) => {
                let to: Vec<String> = rest
                    .trim_start_matches("//")
                    .split(',')
                    .filter(|a| !a.is_empty())
                    .map(String::from)
                    .collect();
                // An address is one word of a mail header: nothing that could end one.
                if to.is_empty()
                    || to
                        .iter()
                        .any(|a| a.starts_with('-') || a.chars().any(|c| c.is_control()))
                {
                    return Err(NotifyError::BadUrl(url.to_string()));
                }
                mail.extend(to);
            }
            None => apprise.push(url.to_string()),
        }
    }
    let mut channels = Vec::new();
    if !apprise.is_empty() {
        channels.push(Channel::Apprise(apprise));
    }
    if let Some(config) = config {
        channels.push(Channel::AppriseConfig(config.to_path_buf()));
    }
    if !mail.is_empty() {
        channels.push(Channel::Sendmail(mail));
    }
    Ok(channels)
}

/// Sends `message` through every channel, each within `timeout`; what failed, per channel.
pub fn deliver(channels: &[Channel], message: &Message, timeout: Duration) -> Vec<NotifyError> {
    channels
        .iter()
        .filter_map(|c| send(c, message, timeout).err())
        .collect()
}

fn send(channel: &Channel, m: &Message, timeout: Duration) -> Result<(), NotifyError> {
    const APPRISE: &str = "apprise";
    const APPRISE_HINT: &str =
        "Debian and Ubuntu: apt install apprise; elsewhere: pip install apprise";
    let title_args = |cmd: &mut Command| {
        cmd.arg("--title")
            .arg(&m.subject)
            .arg("--notification-type")
            .arg(m.severity.apprise());
    };
    match channel {
        Channel::Apprise(urls) => {
            let mut cmd = Command::new(APPRISE);
            title_args(&mut cmd);
            // Where `ps` cannot show them; APPRISE_CONFIG would be read instead of nothing.
            cmd.env("APPRISE_URLS", urls.join(" "))
                .env_remove("APPRISE_CONFIG");
            run(cmd, APPRISE_HINT, m.body.as_bytes(), timeout)
        }
        Channel::AppriseConfig(file) => {
            let mut cmd = Command::new(APPRISE);
            title_args(&mut cmd);
            cmd.arg("--config").arg(file).env_remove("APPRISE_URLS");
            run(cmd, APPRISE_HINT, m.body.as_bytes(), timeout)
        }
        Channel::Sendmail(to) => {
            let mut cmd = Command::new(sendmail());
            // -i: a line of one dot is text; recipients as arguments, never read from the
            // headers (-t), so nothing in the message can add one.
            cmd.arg("-i").arg("--").args(to);
            let mail = mail(to, m);
            run(
                cmd,
                "install a mail transfer agent: msmtp-mta, nullmailer, postfix or exim4",
                mail.as_bytes(),
                timeout,
            )
        }
    }
}

/// The system's sendmail: on the PATH, or where Debian and most systems put it.
fn sendmail() -> PathBuf {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .chain(["/usr/sbin".into(), "/usr/lib".into()])
        .map(|d| d.join("sendmail"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| "sendmail".into())
}

/// `m` as an RFC 5322 message of plain UTF-8 text.
fn mail(to: &[String], m: &Message) -> String {
    let body = m.body.replace("\r\n", "\n").replace('\n', "\r\n");
    format!(
        "To: {}\r\nSubject: {}\r\nMIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\n\
         Content-Transfer-Encoding: 8bit\r\nAuto-Submitted: auto-generated\r\n\
         X-Mailer: intact {}\r\n\r\n{body}",
        to.join(", "),
        header_text(&m.subject),
        env!("CARGO_PKG_VERSION"),
    )
}

/// A header's text: as it is in printable ASCII, else one RFC 2047 encoded word (Q
/// encoding), so that a name in any language arrives intact.
fn header_text(s: &str) -> String {
    if s.chars().all(|c| c == ' ' || c.is_ascii_graphic()) {
        return s.to_string();
    }
    let mut out = String::from("=?utf-8?q?");
    for b in s.bytes() {
        match b {
            b' ' => out.push('_'),
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'.' | b',' | b'-' | b'/' | b':' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("={b:02X}")),
        }
    }
    out.push_str("?=");
    out
}

/// Pings the heartbeat `url` (an HTTP GET, as healthchecks.io and Uptime Kuma's push monitors
/// expect) with curl, within `timeout`.
pub fn heartbeat(url: &str, timeout: Duration) -> Result<(), NotifyError> {
    let mut cmd = Command::new("curl");
    cmd.args([
        "--fail",
        "--silent",
        "--show-error",
        "--output",
        "/dev/null",
    ])
    .arg("--max-time")
    .arg(timeout.as_secs().max(1).to_string())
    .args(["--retry", "2", "--config", "-"]);
    // curl's configuration syntax: a quoted string, backslash and quote escaped.
    let config = format!(
        "url = \"{}\"\n",
        url.replace('\\', "\\\\").replace('"', "\\\"")
    );
    run(
        cmd,
        "Debian and Ubuntu: apt install curl",
        config.as_bytes(),
        timeout + Duration::from_secs(5),
    )
}

/// Runs `cmd` with `input` on its standard input, within `timeout`; a program that is not
/// installed is named with where to get it (`hint`).
fn run(
    mut cmd: Command,
    hint: &'static str,
    input: &[u8],
    timeout: Duration,
) -> Result<(), NotifyError> {
    let watch = crate::process::Watch::within(timeout);
    crate::process::run(&mut cmd, watch, input, &[0], &mut |out| {
        io::copy(out, &mut io::sink()).map(|_| ())
    })
    .map_err(|e| match e {
        crate::process::Error::Missing { program } => NotifyError::Missing { program, hint },
        e => NotifyError::Run(e),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_sorted_into_channels() {
        let urls = vec![
            "json://127.0.0.1:1/x ntfy://topic".to_string(),
            "sendmail:root@localhost,me@example.org".into(),
            "".into(),
        ];
        let c = parse_channels(&urls, Some(Path::new("/etc/intact/apprise.yml"))).unwrap();
        assert_eq!(
            c,
            vec![
                Channel::Apprise(vec!["json://127.0.0.1:1/x".into(), "ntfy://topic".into()]),
                Channel::AppriseConfig("/etc/intact/apprise.yml".into()),
                Channel::Sendmail(vec!["root@localhost".into(), "me@example.org".into()]),
            ]
        );
        assert!(parse_channels(&["".into()], None).unwrap().is_empty());
        assert!(parse_channels(&["sendmail:".into()], None).is_err());
        assert!(parse_channels(&["sendmail:-oQ/tmp".into()], None).is_err());
    }

    #[test]
    fn mail_headers_cannot_be_forged_and_say_utf8() {
        let m = Message {
            subject: "intact: 1 damaged file in /srv/Été on nas".into(),
            body: "line\nTo: evil@example.org\n".into(),
            severity: super::super::Severity::Failure,
        };
        let mail = mail(&["root@localhost".into()], &m);
        let (head, body) = mail.split_once("\r\n\r\n").unwrap();
        assert!(
            head.contains(
                "Subject: =?utf-8?q?intact:_1_damaged_file_in_/srv/=C3=89t=C3=A9_on_nas?="
            ),
            "{head}"
        );
        assert!(!head.contains("evil"), "{head}");
        assert_eq!(body, "line\r\nTo: evil@example.org\r\n");
    }

    #[test]
    fn a_missing_program_is_named_with_where_to_get_it() {
        let r = run(
            Command::new("/nonexistent/apprise"),
            "apt install apprise",
            b"",
            Duration::from_secs(1),
        );
        assert_eq!(
            r.unwrap_err().to_string(),
            "apprise is not installed (apt install apprise)"
        );
    }
}
