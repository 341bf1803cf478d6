//! Text for people: paths made safe to print, numbers grouped, sizes, times and shares. A
//! leaf that every module may use, so the pure core imports nothing above it.

use std::path::Path;
use std::time::{Duration, UNIX_EPOCH};

/// 1234567 → "1,234,567".
pub fn group(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A byte count in decimal units, as disk makers and `dd` use them.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["kB", "MB", "GB", "TB", "PB"];
    if n < 1000 {
        return format!("{n} B");
    }
    let mut v = n as f64;
    let mut unit = "B";
    for u in UNITS {
        if v < 1000.0 {
            break;
        }
        v /= 1000.0;
        unit = u;
    }
    format!("{v:.2} {unit}")
}

/// A path made safe to print on one line: backslash, control characters and bytes that are
/// not UTF-8 are written as `\\`, `\n`, `\t`, `\r` and `\xNN`; everything else as is.
pub fn escape(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut out = String::new();
    for chunk in path.as_os_str().as_bytes().utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\t' => out.push_str("\\t"),
                '\r' => out.push_str("\\r"),
                c if c.is_control() => {
                    let mut b = [0u8; 4];
                    for byte in c.encode_utf8(&mut b).bytes() {
                        out.push_str(&format!("\\x{byte:02x}"));
                    }
                }
                c => out.push(c),
            }
        }
        for byte in chunk.invalid() {
            out.push_str(&format!("\\x{byte:02x}"));
        }
    }
    out
}

/// A path in JSON, escaped as [`escape`] prints it (`#[serde(serialize_with)]`).
pub fn escaped<S: serde::Serializer>(p: &Path, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&escape(p))
}

/// Unix seconds as an RFC 3339 time (UTC, to the second); times humantime cannot show
/// (before 1970, after 9999) as `@SECONDS`.
pub fn time(secs: i64) -> String {
    match secs {
        0..=253_402_300_799 => {
            humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(secs as u64))
                .to_string()
        }
        _ => format!("@{secs}"),
    }
}

/// Unix milliseconds (the state database's unit) as [`time`] shows them.
pub fn time_ms(ms: i64) -> String {
    time(ms.div_euclid(1000))
}

/// `part` of `whole` as a percentage that never rounds the truth away: "100%" only when it
/// is all, "0%" only when it is none (111,404 of 111,492 is "99.9%", 1 of 10,000 "0.01%").
pub fn percent(part: u64, whole: u64) -> String {
    if whole == 0 || part >= whole {
        return "100%".into();
    }
    if part == 0 {
        return "0%".into();
    }
    let p = 100.0 * part as f64 / whole as f64;
    // The fewest decimals that keep it off both ends.
    for decimals in 0..=6 {
        let shown = format!("{p:.decimals$}");
        let v: f64 = shown.parse().unwrap_or(p);
        if v > 0.0 && v < 100.0 {
            return format!("{shown}%");
        }
    }
    format!("{p}%")
}

/// `word` as one word for a POSIX shell: as it is where that is safe, else single-quoted (in
/// double quotes where it holds single quotes and nothing a shell expands there).
pub fn shell_word(word: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "/._-+,:@%=".contains(c);
    if !word.is_empty() && word.chars().all(safe) {
        word.to_string()
    } else if word.contains('\'') && !word.contains(['"', '$', '`', '\\', '!']) {
        format!("\"{word}\"")
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// `s` with the password of every URL in it (`scheme://user:PASSWORD@host`) replaced by
/// `***`: a repository URL (restic's `rest:https://u:pw@host/`) is said in error lines, reports
/// and the messages sent to outside services, which must carry no secret.
pub fn redact(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at + 3);
        out.push_str(head);
        let authority = tail.find(['/', ' ', '\t']).map_or(tail, |end| &tail[..end]);
        match authority
            .rfind('@')
            .and_then(|a| authority[..a].find(':').map(|c| (c, a)))
        {
            Some((colon, a)) => {
                out.push_str(&authority[..=colon]);
                out.push_str("***");
                out.push_str(&authority[a..]);
            }
            None => out.push_str(authority),
        }
        rest = &tail[authority.len()..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn passwords_in_urls_are_never_said() {
        assert_eq!(
            redact("restic:rest:https://u:pw@host:8000/repo --host nas"),
            "restic:rest:https://u:***@host:8000/repo --host nas"
        );
        assert_eq!(
            redact("a s3://k:s@b/x and sftp://me@nas/r"),
            "a s3://k:***@b/x and sftp://me@nas/r"
        );
        for plain in [
            "/backup/restic",
            "borg:ssh://nas/./b",
            "restic:sftp:me@nas:/r",
            "",
        ] {
            assert_eq!(redact(plain), plain);
        }
    }

    use super::*;
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;

    #[test]
    fn escapes_what_would_break_a_line() {
        let p = Path::new(OsStr::from_bytes(b"a b\\c\nd\te\xff\x01\xc3\xa9"));
        assert_eq!(escape(p), "a b\\\\c\\nd\\te\\xff\\x01é");
    }

    #[test]
    fn numbers_for_people() {
        assert_eq!(group(1234567), "1,234,567");
        assert_eq!(group(12), "12");
        assert_eq!(bytes(999), "999 B");
        assert_eq!(bytes(1_500_000), "1.50 MB");
        assert_eq!(bytes(2_000_000_000), "2.00 GB");
    }

    #[test]
    fn shares_never_round_to_all_or_none() {
        assert_eq!(percent(111_404, 111_492), "99.9%");
        assert_eq!(percent(1, 2), "50%");
        assert_eq!(percent(2, 3), "67%");
        assert_eq!(percent(1, 10_000), "0.01%");
        assert_eq!(percent(9_999, 10_000), "99.99%");
        assert_eq!(percent(5, 5), "100%");
        assert_eq!(percent(0, 5), "0%");
        assert_eq!(percent(0, 0), "100%");
    }

    #[test]
    fn times_for_people() {
        assert_eq!(time(0), "1970-01-01T00:00:00Z");
        assert_eq!(time(-1), "@-1");
        assert_eq!(time_ms(1_500), "1970-01-01T00:00:01Z");
    }

    #[test]
    fn shell_words_are_quoted_only_where_needed() {
        assert_eq!(shell_word("/srv/photos"), "/srv/photos");
        assert_eq!(shell_word("/srv/my photos"), "'/srv/my photos'");
        assert_eq!(shell_word("it's"), r#""it's""#);
        assert_eq!(shell_word("$(x)"), "'$(x)'");
        assert_eq!(shell_word("'a b' -x"), r#""'a b' -x""#);
        assert_eq!(shell_word("'$x'"), r"''\''$x'\'''");
        // What a shell makes of each: the word itself.
        for word in ["'a b' -x", "'$x'", "it's", "\"q\" 'r'", "a\\b"] {
            let out = std::process::Command::new("sh")
                .arg("-c")
                .arg(format!("printf %s {}", shell_word(word)))
                .output()
                .unwrap();
            assert_eq!(String::from_utf8_lossy(&out.stdout), word);
        }
    }
}
