//! Delivery through other programs: Apprise (`apprise`, one URL for each of 100+ services),
//! a `sendmail` (msmtp-mta, nullmailer, postfix, exim) and, for the heartbeat, `curl`. intact
//! speaks no SMTP or HTTP itself: these tools already hold the owner's settings, TLS and
//! credentials.
//!
//! Secrets stay off command lines (where `ps` shows them to every user): Apprise URLs go in
//! the child's environment (`APPRISE_URLS`), the heartbeat URL on curl's standard input
//! (`-K -`). Each runs through [`crate::process`], killed with everything it started once its
//! time is up: a delivery can fail, never hang the run.

use std::io::{self, Read};
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
        // -v: its warnings, which say why a URL failed and which (by its host).
        cmd.arg("-v")
            .arg("--title")
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

/// `m` as an RFC 5322 message of plain UTF-8 text, every line of it at most 76 characters
/// (the body quoted-printable, the subject folded into encoded words where it must be): a
/// line over 998 bytes, such as a long path's, makes SMTP servers refuse the whole mail.
fn mail(to: &[String], m: &Message) -> String {
    let body = m.body.replace("\r\n", "\n").replace('\n', "\r\n");
    format!(
        "To: {}\r\nSubject: {}\r\nMIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\n\
         Content-Transfer-Encoding: quoted-printable\r\nAuto-Submitted: auto-generated\r\n\
         X-Mailer: intact {}\r\n\r\n{}",
        to.join(", "),
        header_text(&m.subject),
        env!("CARGO_PKG_VERSION"),
        quoted_printable::encode_to_str(body),
    )
}

/// A header's text: printable ASCII as it is, folded at spaces into lines of at most 76;
/// anything else (or a word too long to fold) as RFC 2047 encoded words (Q encoding) of at
/// most 66 characters, one to a folded line, so that a name in any language and of any
/// length arrives intact.
fn header_text(s: &str) -> String {
    if s.chars().all(|c| c == ' ' || c.is_ascii_graphic()) {
        // Folded before a space: a reader unfolds by taking the line break out.
        let (mut out, mut len, mut fits) = (String::new(), "Subject: ".len(), true);
        for (i, word) in s.split(' ').enumerate() {
            if i > 0 {
                if len + 1 + word.len() > 76 {
                    out.push_str("\r\n");
                    len = 0;
                }
                out.push(' ');
                len += 1;
            }
            out.push_str(word);
            len += word.len();
            fits &= len <= 76;
        }
        if fits {
            return out;
        }
    }
    const OPEN: &str = "=?utf-8?q?";
    let mut words = vec![String::from(OPEN)];
    for c in s.chars() {
        let mut q = String::new();
        let mut utf8 = [0u8; 4];
        for &b in c.encode_utf8(&mut utf8).as_bytes() {
            match b {
                b' ' => q.push('_'),
                b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'.' | b',' | b'-' | b'/' | b':' => {
                    q.push(b as char)
                }
                _ => q.push_str(&format!("={b:02X}")),
            }
        }
        // A character is never split across words (each word must decode on its own).
        let last = words.last_mut().expect("one word");
        // 64: the first shares its line with `Subject: ` (a line of 76 at most).
        if last.len() + q.len() + 2 > 64 {
            words.push(String::from(OPEN));
        }
        words.last_mut().expect("one word").push_str(&q);
    }
    words
        .iter()
        .map(|w| format!("{w}?="))
        .collect::<Vec<_>>()
        .join("\r\n ")
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
    // apprise logs why a URL failed on its standard output: kept (its beginning) for that.
    let mut printed = Vec::new();
    crate::process::run(&mut cmd, watch, input, &[0], &mut |out| {
        out.take(64 * 1024).read_to_end(&mut printed)?;
        io::copy(out, &mut io::sink()).map(|_| ())
    })
    .map_err(|e| match e {
        crate::process::Error::Missing { program } => NotifyError::Missing { program, hint },
        crate::process::Error::Failed {
            program,
            status,
            said,
        } => {
            let said = if said.is_empty() {
                crate::process::one_line(&printed)
            } else {
                said
            };
            NotifyError::Run(crate::process::Error::Failed {
                program,
                status,
                said: logged(&said),
            })
        }
        e => NotifyError::Run(e),
    })
}

/// What a program said, its log lines' time and level taken off (apprise's `2026-12-07
/// 23:11:54,698 - WARNING - A Connection error occurred sending JSON notification to
/// 127.0.0.1.`): the reason is what the owner reads.
fn logged(said: &str) -> String {
    said.split(" / ")
        .map(|line| {
            let mut parts = line.splitn(3, " - ");
            match (parts.next(), parts.next(), parts.next()) {
                (Some(_), Some(level), Some(text))
                    if ["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"].contains(&level) =>
                {
                    text
                }
                _ => line,
            }
        })
        .collect::<Vec<_>>()
        .join(" / ")
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
    fn no_line_of_a_mail_is_long_whatever_the_path() {
        let long = format!("/srv/{}/caf\u{e9}.jpg", "\\xe9x".repeat(900));
        let m = Message {
            subject: format!("intact: 1 damaged file in {long} on nas"),
            body: format!("Damaged:\n  {long} (found 2026-12-07)\n"),
            severity: super::super::Severity::Failure,
        };
        let mail = mail(&["root@localhost".into()], &m);
        for line in mail.split("\r\n") {
            assert!(line.len() <= 76, "{} bytes: {line}", line.len());
            assert!(line.is_ascii(), "{line}");
        }
        let (head, body) = mail.split_once("\r\n\r\n").unwrap();
        let decoded = quoted_printable::decode(body, quoted_printable::ParseMode::Strict).unwrap();
        assert_eq!(
            String::from_utf8(decoded).unwrap(),
            m.body.replace('\n', "\r\n")
        );
        // The subject's words decode to the subject (unfolded, as a reader shows it).
        let words: String = head
            .split("Subject: ")
            .nth(1)
            .unwrap()
            .split("\r\n")
            .take_while(|l| l.starts_with("=?") || l.starts_with(" =?"))
            .map(|w| {
                w.trim()
                    .trim_start_matches("=?utf-8?q?")
                    .trim_end_matches("?=")
            })
            .collect();
        // Robust: the words joined are one line longer than a mail's.
        let bytes =
            quoted_printable::decode(words.replace('_', " "), quoted_printable::ParseMode::Robust)
                .unwrap();
        assert_eq!(String::from_utf8(bytes).unwrap(), m.subject);
        // Plain words are folded at spaces, and unfold to the subject.
        let subject = format!(
            "intact: 3 damaged files in {} on nas",
            "/srv/photos ".repeat(12).trim_end()
        );
        let folded = header_text(&subject);
        assert!(folded.contains("\r\n "), "{folded}");
        assert!(
            ("Subject: ".to_string() + &folded)
                .split("\r\n")
                .all(|l| l.len() <= 76),
            "{folded}"
        );
        assert_eq!(folded.replace("\r\n", ""), subject);
    }

    #[test]
    fn a_log_line_says_its_reason_alone() {
        assert_eq!(
            logged(
                "2026-12-07 23:11:54,698 - WARNING - A Connection error occurred sending JSON \
                 notification to 127.0.0.1. / plain - words - here"
            ),
            "A Connection error occurred sending JSON notification to 127.0.0.1. / plain - \
             words - here"
        );
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
