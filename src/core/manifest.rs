//! Checksum manifests, for media that cannot hold xattrs and for stock tools: the line
//! formats of sha256sum and b3sum (both directions), their BSD `--tag` form, rhash's, and
//! hashdeep's CSV. Pure functions over bytes: names are bytes on Unix, and a manifest may
//! come from anywhere.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fmt;
use std::io::{self, BufRead};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use crate::core::digest::{Algo, Digest};
use crate::core::tag::{Format, Tag};

/// One line of a manifest: a digest and the path it belongs to (as written, unescaped).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The digest the manifest claims.
    pub digest: Digest,
    /// The path bytes, relative to the manifest's root unless absolute.
    pub path: Vec<u8>,
    /// The 1-based number of its line.
    pub line: usize,
}

/// A line that could not be read, with its 1-based number.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadLine {
    /// 1-based line number.
    pub line: usize,
    /// Why.
    pub why: LineFault,
}

/// Why a manifest line cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LineFault {
    /// Too short for a digest, a separator and a name.
    #[error("too short for a digest and a name")]
    TooShort,
    /// Not `  ` or ` *` between the digest and the name.
    #[error("expected two characters (\"  \" or \" *\") after the digest")]
    Separator,
    /// A BSD-style line without its `) = `.
    #[error("BSD line without \") = \"")]
    BsdUnclosed,
    /// A BSD-style line whose name is empty, or a line with an empty name.
    #[error("empty name")]
    EmptyName,
    /// Not 64 hex digits where the digest goes.
    #[error("not a 64-digit hex digest")]
    Digest,
    /// A backslash in an escaped name that is not `\\`, `\n` or `\r`.
    #[error("bad escape in name")]
    Escape,
    /// A hashdeep line with another number of columns than its header.
    #[error("{found} columns instead of {expected}")]
    Columns {
        /// Columns on the line.
        found: usize,
        /// Columns in the header.
        expected: usize,
    },
    /// A hashdeep header that lists no SHA-256.
    #[error("hashdeep header without a sha256 column")]
    NoSha256,
    /// Longer than any file name.
    #[error("longer than {MAX_LINE} bytes, which no file name is")]
    TooLong,
    /// A path that leads out of the root (absolute elsewhere, or through `..`).
    #[error("{path} is not a path inside {root}: not followed")]
    Outside {
        /// The path, escaped.
        path: String,
        /// The root, escaped.
        root: String,
    },
}

impl fmt::Display for BadLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.why)
    }
}

/// A parsed manifest: entries in file order, lines that were not understood.
#[derive(Clone, Debug, Default)]
pub struct Parsed {
    /// The entries, in the order written.
    pub entries: Vec<Entry>,
    /// Lines skipped as unreadable.
    pub bad: Vec<BadLine>,
}

/// A manifest as the engine uses it: what each file under a root should hash to.
#[derive(Debug)]
pub struct Expected {
    root: PathBuf,
    order: Vec<PathBuf>,
    by_key: HashMap<PathBuf, Digest>,
}

impl Expected {
    /// Entries are relative to `root` (absolute ones under it are made relative). A manifest
    /// has no mtimes, and its own mtime says little (copying it, or the files, moves it), so
    /// every difference is a `mismatch`: a false alarm is preferred to a false pass.
    ///
    /// Entries that lead out of `root` (absolute paths elsewhere, `..`) are left out and
    /// returned as bad lines: a manifest never decides what intact reads or tags.
    pub fn new(root: &Path, parsed: &Parsed) -> (Self, Vec<BadLine>) {
        let mut order = Vec::new();
        let mut by_key = HashMap::new();
        let mut outside = Vec::new();
        // hashdeep and others write absolute paths: those under the root become relative.
        let absolute_root = std::fs::canonicalize(root).ok();
        for e in &parsed.entries {
            let path = Path::new(OsStr::from_bytes(&e.path));
            let under = |r: &Path| path.strip_prefix(r).ok().map(Path::to_path_buf);
            let path = match path.is_absolute() {
                true => under(root).or_else(|| absolute_root.as_deref().and_then(under)),
                false => Some(path.to_path_buf()),
            };
            let key = path.as_deref().map(normalize);
            let Some(key) = key.filter(|k| {
                !k.as_os_str().is_empty()
                    && k.components().all(|c| matches!(c, Component::Normal(_)))
            }) else {
                outside.push(BadLine {
                    line: e.line,
                    why: LineFault::Outside {
                        path: crate::text::escape(Path::new(OsStr::from_bytes(&e.path))),
                        root: crate::text::escape(root),
                    },
                });
                continue;
            };
            if by_key.insert(key.clone(), e.digest).is_none() {
                order.push(key);
            }
        }
        let expected = Expected {
            root: root.to_path_buf(),
            order,
            by_key,
        };
        (expected, outside)
    }

    /// The key of a walked path: relative to the root.
    pub fn key(&self, path: &Path) -> PathBuf {
        normalize(path.strip_prefix(&self.root).unwrap_or(path))
    }

    /// The tag the manifest implies for a walked path.
    pub fn tag(&self, path: &Path) -> Option<Tag> {
        self.by_key.get(&self.key(path)).map(|&digest| Tag {
            format: Format::Manifest,
            digest,
            size: None,
            mtime: None,
            mtime_slack_ns: 0,
            tagged: None,
        })
    }

    /// Every listed entry in manifest order, as (key, path under the root).
    pub fn listed(&self) -> impl Iterator<Item = (&PathBuf, PathBuf)> {
        self.order.iter().map(|k| (k, self.root.join(k)))
    }
}

/// `./a//b` → `a/b`: the same file however a tool spelled it.
fn normalize(p: &Path) -> PathBuf {
    p.components().filter(|c| *c != Component::CurDir).collect()
}

/// Writes one line as sha256sum/b3sum do: `HEX  NAME`, with a leading backslash and `\\`,
/// `\n` escapes when the name holds a backslash or a newline (sha256sum also escapes a
/// carriage return; b3sum 1.x does not unescape one, so it is left raw for BLAKE3).
pub fn format_line(digest: &Digest, path: &[u8]) -> Vec<u8> {
    let cr = digest.algo == Algo::Sha256;
    let needs = path
        .iter()
        .any(|&b| b == b'\\' || b == b'\n' || (cr && b == b'\r'));
    let mut out = Vec::with_capacity(path.len() + 70);
    if needs {
        out.push(b'\\');
    }
    out.extend_from_slice(digest.hex().as_bytes());
    out.extend_from_slice(b"  ");
    for &b in path {
        match b {
            b'\\' if needs => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' if cr => out.extend_from_slice(b"\\r"),
            b => out.push(b),
        }
    }
    out.push(b'\n');
    out
}

/// Manifest lines longer than this are rejected unread: no file name is anywhere near that
/// long (PATH_MAX is 4 KiB; escapes double it at most), and a hostile manifest must not cost
/// memory in proportion to its longest line.
pub const MAX_LINE: usize = 64 << 10;

/// Reads a manifest in any of the formats intact knows. `algo` says which algorithm 64-hex
/// digests are (sha256sum and b3sum lines look alike); BSD lines and hashdeep headers name
/// their own. Memory stays within the entries and one line of at most [`MAX_LINE`] bytes.
pub fn read(mut input: impl BufRead, algo: Algo) -> io::Result<Parsed> {
    let mut parser = Parser {
        algo,
        out: Parsed::default(),
        hashdeep: None,
        crlf: None,
    };
    let mut line = Vec::new();
    for number in 1.. {
        line.clear();
        match read_line(&mut input, &mut line)? {
            None => break,
            Some(true) => parser.line(number, &line),
            Some(false) => parser.out.bad.push(BadLine {
                line: number,
                why: LineFault::TooLong,
            }),
        }
    }
    Ok(parser.out)
}

/// [`read`] over bytes in memory.
pub fn parse(data: &[u8], algo: Algo) -> Parsed {
    read(data, algo).expect("reading from memory cannot fail")
}

/// Reads up to the next newline into `line` (without it): `Some(true)`, or `Some(false)`
/// if the line was longer than [`MAX_LINE`] (its bytes are skipped, not kept); `None` at the
/// end of the input.
fn read_line(input: &mut impl BufRead, line: &mut Vec<u8>) -> io::Result<Option<bool>> {
    let (mut any, mut fits) = (false, true);
    loop {
        let buf = match input.fill_buf() {
            Ok(buf) => buf,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if buf.is_empty() {
            return Ok(any.then_some(fits));
        }
        any = true;
        let (chunk, end) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (&buf[..i], Some(i + 1)),
            None => (buf, None),
        };
        if fits && line.len() + chunk.len() <= MAX_LINE {
            line.extend_from_slice(chunk);
        } else {
            fits = false;
            line.clear();
        }
        let used = end.unwrap_or(buf.len());
        input.consume(used);
        if end.is_some() {
            return Ok(Some(fits));
        }
    }
}

/// The state of reading a manifest line by line.
struct Parser {
    algo: Algo,
    out: Parsed,
    hashdeep: Option<HashdeepColumns>,
    /// Decided by the first line: a manifest written on Windows ends every line with CR LF.
    /// Otherwise a CR at the end belongs to the name (b3sum does not escape it).
    crlf: Option<bool>,
}

impl Parser {
    fn line(&mut self, number: usize, raw: &[u8]) {
        if raw.is_empty() {
            return;
        }
        let crlf = *self.crlf.get_or_insert(raw.ends_with(b"\r"));
        let line = if crlf {
            raw.strip_suffix(b"\r").unwrap_or(raw)
        } else {
            raw
        };
        if line.is_empty() {
            return;
        }
        let result = if line.starts_with(b"%%%% ") {
            match HashdeepColumns::from_header(&line[5..]) {
                Some(cols) => {
                    self.hashdeep = Some(cols);
                    return;
                }
                None if line.starts_with(b"%%%% HASHDEEP") => return,
                None => Err(LineFault::NoSha256),
            }
        } else if line.starts_with(b"#") || line.starts_with(b";") {
            // Comments: hashdeep's `##` lines, rhash's and SFV's `;`.
            return;
        } else if let Some(cols) = &self.hashdeep {
            cols.parse(line)
        } else {
            parse_line(line, self.algo)
        };
        match result {
            Ok(entry) if entry.path.is_empty() => self.out.bad.push(BadLine {
                line: number,
                why: LineFault::EmptyName,
            }),
            Ok(entry) => self.out.entries.push(Entry {
                line: number,
                ..entry
            }),
            Err(why) => self.out.bad.push(BadLine { line: number, why }),
        }
    }
}

/// `HEX  NAME`, `HEX *NAME` (binary mode), or BSD `ALGO (NAME) = HEX`; an escaped line
/// starts with a backslash.
fn parse_line(line: &[u8], algo: Algo) -> Result<Entry, LineFault> {
    let (escaped, line) = match line.strip_prefix(b"\\") {
        Some(rest) => (true, rest),
        None => (false, line),
    };
    if let Some(entry) = parse_bsd(line, escaped)? {
        return Ok(entry);
    }
    if line.len() < 66 {
        return Err(LineFault::TooShort);
    }
    let (hex, rest) = line.split_at(64);
    let digest = hex_digest(algo, hex)?;
    let name = match rest {
        [b' ', b' ' | b'*', name @ ..] if !name.is_empty() => name,
        _ => return Err(LineFault::Separator),
    };
    entry(digest, name, escaped)
}

/// An entry for `name` as written (unescaped if the line said so); its line is set later.
fn entry(digest: Digest, name: &[u8], escaped: bool) -> Result<Entry, LineFault> {
    Ok(Entry {
        digest,
        path: if escaped {
            unescape(name)?
        } else {
            name.to_vec()
        },
        line: 0,
    })
}

/// `SHA256 (name) = hex` as `sha256sum --tag`, `b3sum`-style tools and `rhash --bsd` write.
fn parse_bsd(line: &[u8], escaped: bool) -> Result<Option<Entry>, LineFault> {
    let Some(open) = line.iter().position(|&b| b == b'(') else {
        return Ok(None);
    };
    let algo = match &line[..open] {
        b"SHA256 " | b"SHA-256 " => Algo::Sha256,
        b"BLAKE3 " => Algo::Blake3,
        _ => return Ok(None),
    };
    let Some(close) = line.windows(4).rposition(|w| w == b") = ") else {
        return Err(LineFault::BsdUnclosed);
    };
    if close < open + 1 {
        return Err(LineFault::EmptyName);
    }
    let name = &line[open + 1..close];
    let digest = hex_digest(algo, &line[close + 4..])?;
    entry(digest, name, escaped).map(Some)
}

fn hex_digest(algo: Algo, hex: &[u8]) -> Result<Digest, LineFault> {
    let mut bytes = [0u8; 32];
    if hex.len() != 64 || hex::decode_to_slice(hex, &mut bytes).is_err() {
        return Err(LineFault::Digest);
    }
    Ok(Digest { algo, bytes })
}

/// Reverses coreutils' escaping: `\\` → `\`, `\n` → newline, `\r` → carriage return.
fn unescape(name: &[u8]) -> Result<Vec<u8>, LineFault> {
    let mut out = Vec::with_capacity(name.len());
    let mut it = name.iter();
    while let Some(&b) = it.next() {
        if b != b'\\' {
            out.push(b);
            continue;
        }
        match it.next() {
            Some(b'\\') => out.push(b'\\'),
            Some(b'n') => out.push(b'\n'),
            Some(b'r') => out.push(b'\r'),
            _ => return Err(LineFault::Escape),
        }
    }
    Ok(out)
}

/// Where hashdeep put the digest and the name, from its `%%%% size,md5,sha256,filename` line.
struct HashdeepColumns {
    digest: usize,
    count: usize,
}

impl HashdeepColumns {
    fn from_header(cols: &[u8]) -> Option<Self> {
        let names: Vec<&[u8]> = cols.split(|&b| b == b',').collect();
        if names.last() != Some(&&b"filename"[..]) {
            return None;
        }
        let digest = names.iter().position(|&n| n == b"sha256")?;
        Some(HashdeepColumns {
            digest,
            count: names.len(),
        })
    }

    fn parse(&self, line: &[u8]) -> Result<Entry, LineFault> {
        // The name is the last column and may itself hold commas.
        let fields: Vec<&[u8]> = line.splitn(self.count, |&b| b == b',').collect();
        if fields.len() != self.count {
            return Err(LineFault::Columns {
                found: fields.len(),
                expected: self.count,
            });
        }
        Ok(Entry {
            digest: hex_digest(Algo::Sha256, fields[self.digest])?,
            path: fields[self.count - 1].to_vec(),
            line: 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::digest::digest_bytes;

    fn d(algo: Algo) -> Digest {
        digest_bytes(algo, b"x")
    }

    #[test]
    fn plain_names_are_written_as_sha256sum_does() {
        let line = format_line(&d(Algo::Sha256), b"dir/a b.txt");
        assert_eq!(
            line,
            format!("{}  dir/a b.txt\n", d(Algo::Sha256).hex()).into_bytes()
        );
    }

    #[test]
    fn odd_names_are_escaped_and_read_back() {
        for algo in [Algo::Sha256, Algo::Blake3] {
            for name in [
                &b"back\\slash"[..],
                b"new\nline",
                b"cr\rret",
                b"bad\xe9",
                b"sp ace",
                b"*star",
            ] {
                let line = format_line(&d(algo), name);
                assert_eq!(line.iter().filter(|&&b| b == b'\n').count(), 1, "{line:?}");
                let parsed = parse(&line, algo);
                assert_eq!(parsed.bad, vec![]);
                assert_eq!(
                    parsed.entries,
                    vec![Entry {
                        digest: d(algo),
                        path: name.to_vec(),
                        line: 1,
                    }]
                );
            }
        }
        let hex = d(Algo::Sha256).hex();
        assert_eq!(
            format_line(&d(Algo::Sha256), b"a\\b"),
            format!("\\{hex}  a\\\\b\n").into_bytes()
        );
        assert_eq!(
            format_line(&d(Algo::Sha256), b"a\rb"),
            format!("\\{hex}  a\\rb\n").into_bytes()
        );
        let b3 = d(Algo::Blake3).hex();
        assert_eq!(
            format_line(&d(Algo::Blake3), b"a\rb"),
            format!("{b3}  a\rb\n").into_bytes()
        );
    }

    #[test]
    fn reads_binary_mode_bsd_and_hashdeep() {
        let hex = d(Algo::Sha256).hex();
        let text = format!(
            "{hex} *bin.dat\nSHA256 (tag (1).txt) = {hex}\n\\SHA256 (back\\\\slash) = {hex}\nBLAKE3 (b3) = {}\n",
            d(Algo::Blake3).hex()
        );
        let p = parse(text.as_bytes(), Algo::Sha256);
        assert_eq!(p.bad, vec![]);
        let paths: Vec<&[u8]> = p.entries.iter().map(|e| e.path.as_slice()).collect();
        assert_eq!(
            paths,
            [&b"bin.dat"[..], b"tag (1).txt", b"back\\slash", b"b3"]
        );
        assert_eq!(p.entries[3].digest.algo, Algo::Blake3);

        let hashdeep = format!(
            "%%%% HASHDEEP-1.0\n%%%% size,md5,sha256,filename\n## Invoked from: /x\n## $ hashdeep\n## \n\
             1,00112233445566778899aabbccddeeff,{hex},/x/a,b.txt\n"
        );
        let p = parse(hashdeep.as_bytes(), Algo::Sha256);
        assert_eq!(p.bad, vec![]);
        assert_eq!(
            p.entries,
            vec![Entry {
                digest: d(Algo::Sha256),
                path: b"/x/a,b.txt".to_vec(),
                line: 6,
            }]
        );
    }

    #[test]
    fn a_line_longer_than_any_name_is_skipped_unread() {
        let hex = d(Algo::Sha256).hex();
        let long = "x".repeat(MAX_LINE + 1);
        let text = format!("{hex}  a\n{hex}  {long}\n{hex}  b");
        // A reader that hands out a few bytes at a time, as a pipe would.
        let reader = std::io::BufReader::with_capacity(7, text.as_bytes());
        let p = read(reader, Algo::Sha256).unwrap();
        let paths: Vec<&[u8]> = p.entries.iter().map(|e| e.path.as_slice()).collect();
        assert_eq!(paths, [b"a", b"b"]);
        assert_eq!(p.entries[1].line, 3);
        assert_eq!(p.bad.len(), 1);
        assert_eq!(p.bad[0].line, 2);
    }

    #[test]
    fn entries_leading_out_of_the_root_are_bad_lines() {
        let hex = d(Algo::Sha256).hex();
        let text = format!(
            "{hex}  a\n{hex}  ../x\n{hex}  /etc/passwd\n{hex}  s/../../x\n{hex}  ./s/b\n{hex}  /r/c\n"
        );
        let (expected, outside) =
            Expected::new(Path::new("/r"), &parse(text.as_bytes(), Algo::Sha256));
        let listed: Vec<PathBuf> = expected.listed().map(|(_, p)| p).collect();
        assert_eq!(
            listed,
            [Path::new("/r/a"), Path::new("/r/s/b"), Path::new("/r/c")]
        );
        assert_eq!(
            outside.iter().map(|b| b.line).collect::<Vec<_>>(),
            [2, 3, 4]
        );
    }

    #[test]
    fn windows_line_ends_are_read() {
        let hex = d(Algo::Sha256).hex();
        let p = parse(format!("{hex}  a\r\n{hex}  b\r\n").as_bytes(), Algo::Sha256);
        let paths: Vec<&[u8]> = p.entries.iter().map(|e| e.path.as_slice()).collect();
        assert_eq!(paths, [b"a", b"b"]);
    }

    #[test]
    fn garbage_is_reported_by_line_and_never_panics() {
        let hex = d(Algo::Sha256).hex();
        let text = format!(
            "nonsense\n{hex}\n{}  short-digest\n\\{hex}  bad\\escape\n{hex}  good\n",
            &hex[..60]
        );
        let p = parse(text.as_bytes(), Algo::Sha256);
        assert_eq!(p.entries.len(), 1);
        assert_eq!(
            p.bad.iter().map(|b| b.line).collect::<Vec<_>>(),
            [1, 2, 3, 4]
        );
        for junk in [
            &b"SHA256 ("[..],
            b"SHA256 () = ",
            b"%%%% ,",
            b"\\",
            b"\xff\xfe",
            b"%%%% filename\n1",
        ] {
            let _ = parse(junk, Algo::Blake3);
        }
    }

    /// Random mutations of every supported format never panic the parser, and every entry it
    /// does accept formats back into a line it reads the same way.
    #[test]
    fn mutated_manifests_never_panic_and_entries_round_trip() {
        let hex = d(Algo::Sha256).hex();
        let seed = format!(
            "{hex}  a b\n\\{hex}  c\\\\d\\ne\nSHA256 (f) = {hex}\n%%%% HASHDEEP-1.0\n\
             %%%% size,sha256,filename\n1,{hex},/x/g,h\n"
        )
        .into_bytes();
        let mut rng = crate::testutil::Rng::new(0x2545_f491_4f6c_dd1d);
        for _ in 0..20_000 {
            let mut v = seed.clone();
            crate::testutil::mutate(&mut rng, &mut v, 6, b"\\\n\r(),% ");
            for e in parse(&v, Algo::Sha256).entries {
                if e.digest.algo != Algo::Sha256 {
                    continue;
                }
                let line = format_line(&e.digest, &e.path);
                assert_eq!(
                    parse(&line, Algo::Sha256).entries,
                    vec![Entry { line: 1, ..e }],
                    "{line:?}"
                );
            }
        }
    }
}
