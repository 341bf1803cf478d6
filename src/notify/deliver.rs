//! Delivery through other programs: Apprise (`apprise`, one URL for each of 100+ services),
//! a `sendmail` (msmtp-mta, nullmailer, postfix, exim) and, for the heartbeat, `curl`. intact
//! speaks no SMTP or HTTP itself: these tools already hold the owner's settings, TLS and
//! credentials.
//!
//! Secrets stay off command lines (where `ps` shows them to every user): Apprise URLs go in
//! the child's environment (`APPRISE_URLS`), the heartbeat URL on curl's standard input
//! (`-K -`). Every child runs in its own process group with no terminal to prompt on, and is
//! killed with its group once its time is up: a delivery can fail, never hang the run.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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
        program: &'static str,
        /// Where to get it.
        hint: &'static str,
    },
    /// It could not be started.
    #[error("could not start {program}: {error}")]
    Start {
        /// Which.
        program: &'static str,
        /// Why.
        error: std::io::Error,
    },
    /// It said it failed.
    #[error("{program} failed ({status}){}", if .said.is_empty() { String::new() } else { format!(": {}", .said) })]
    Failed {
        /// Which.
        program: &'static str,
        /// Its exit status.
        status: std::process::ExitStatus,
        /// The last of what it printed on stderr, on one line.
        said: String,
    },
    /// It did not finish in time, and was killed.
    #[error("{program} did not finish within {} s and was stopped", .after.as_secs())]
    TimedOut {
        /// Which.
        program: &'static str,
        /// The time it had.
        after: Duration,
    },
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
            run(cmd, APPRISE, APPRISE_HINT, m.body.as_bytes(), timeout)
        }
        Channel::AppriseConfig(file) => {
            let mut cmd = Command::new(APPRISE);
            title_args(&mut cmd);
            cmd.arg("--config").arg(file).env_remove("APPRISE_URLS");
            run(cmd, APPRISE, APPRISE_HINT, m.body.as_bytes(), timeout)
        }
        Channel::Sendmail(to) => {
            let mut cmd = Command::new(sendmail());
            // -i: a line of one dot is text; recipients as arguments, never read from the
            // headers (-t), so nothing in the message can add one.
            cmd.arg("-i").arg("--").args(to);
            let mail = mail(to, m);
            run(
                cmd,
                "sendmail",
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
        "curl",
        "Debian and Ubuntu: apt install curl",
        config.as_bytes(),
        timeout + Duration::from_secs(5),
    )
}

/// Runs `cmd` with `input` on its stdin, in its own process group, with no terminal;
/// kills the group once `timeout` has passed.
fn run(
    mut cmd: Command,
    program: &'static str,
    hint: &'static str,
    input: &[u8],
    timeout: Duration,
) -> Result<(), NotifyError> {
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    crate::process::own_session(&mut cmd);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(NotifyError::Missing { program, hint });
        }
        Err(error) => return Err(NotifyError::Start { program, error }),
    };
    // Written and read by threads of their own: a child that reads nothing, or fills its
    // stderr, cannot block the wait for its end.
    let mut stdin = child.stdin.take();
    let input = input.to_vec();
    std::thread::spawn(move || {
        if let Some(stdin) = &mut stdin {
            let _ = stdin.write_all(&input);
        }
    });
    let (said_tx, said_rx) = crossbeam_channel::bounded(1);
    let mut stderr = child.stderr.take();
    std::thread::spawn(move || {
        let mut all = Vec::new();
        if let Some(e) = &mut stderr {
            let _ = e.take(64 * 1024).read_to_end(&mut all);
        }
        let _ = said_tx.send(all);
    });
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if start.elapsed() < timeout => {
                std::thread::sleep(Duration::from_millis(20));
            }
            _ => {
                crate::process::stop(&mut child);
                return Err(NotifyError::TimedOut {
                    program,
                    after: timeout,
                });
            }
        }
    };
    if status.success() {
        return Ok(());
    }
    // What it said, if it said it before long (a grandchild may hold stderr open).
    let said = said_rx
        .recv_timeout(Duration::from_secs(1))
        .map(|b| last_line(&b))
        .unwrap_or_default();
    Err(NotifyError::Failed {
        program,
        status,
        said,
    })
}

/// The last lines of what a program said, on one line, short.
fn last_line(said: &[u8]) -> String {
    let text = String::from_utf8_lossy(said);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let tail = lines[lines.len().saturating_sub(2)..].join(" / ");
    let tail: String = tail.chars().filter(|c| !c.is_control()).collect();
    if tail.chars().count() > 300 {
        tail.chars().take(300).collect::<String>() + "…"
    } else {
        tail
    }
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
    fn a_hanging_program_is_stopped_in_time() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "sleep 30 & sleep 30"]);
        let start = Instant::now();
        let r = run(cmd, "sh", "", b"", Duration::from_millis(300));
        assert!(matches!(r, Err(NotifyError::TimedOut { .. })), "{r:?}");
        assert!(start.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn a_failing_program_says_why() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "cat >/dev/null; echo 'no route to host' >&2; exit 1"]);
        let r = run(cmd, "sh", "", b"hello", Duration::from_secs(20));
        match r {
            Err(NotifyError::Failed { said, .. }) => assert_eq!(said, "no route to host"),
            other => panic!("{other:?}"),
        }
        let r = run(
            Command::new("/nonexistent/apprise"),
            "apprise",
            "apt",
            b"",
            Duration::from_secs(1),
        );
        assert!(matches!(r, Err(NotifyError::Missing { .. })), "{r:?}");
    }
}
