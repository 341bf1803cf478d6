//! The tar extensions archives use, as pure functions over bytes: PAX extended header
//! records (`<len> <key>=<value>\n`, parsed by their lengths so values may hold any byte),
//! nanosecond times, xattr names as GNU tar encodes them, and GNU sparse maps (format 1.0).
//! Fuzzed by mutation: an archive may come from anywhere.

use crate::core::tag::Timestamp;

/// The sparse map that starts a GNU 1.0 sparse member's data: the number of runs, then each
/// run's offset and length, one decimal number per line, padded to whole blocks. A file
/// ending in a hole gets a last, empty run at its end, so its size is restored.
pub fn sparse_map(segments: &[(u64, u64)], size: u64) -> Vec<u8> {
    let mut runs = segments.to_vec();
    if runs.last().is_none_or(|&(o, l)| o + l < size) {
        runs.push((size, 0));
    }
    let mut map = format!("{}\n", runs.len());
    for (offset, len) in runs {
        map.push_str(&format!("{offset}\n{len}\n"));
    }
    let mut map = map.into_bytes();
    map.resize(map.len().next_multiple_of(512), 0);
    map
}

/// A PAX time: seconds with a nanosecond fraction (`-1.5` for half a second before 1970).
pub fn pax_time(t: Timestamp) -> String {
    let mut out = Vec::new();
    write_time(&mut out, t);
    String::from_utf8(out).expect("digits")
}

fn write_time(out: &mut impl std::io::Write, t: Timestamp) {
    // Writing to a Vec, or to the room `Pax::add_time` gives it, cannot fail.
    let _ = if t.sec < 0 && t.nsec > 0 {
        write!(out, "-{}.{:09}", -(t.sec + 1), 1_000_000_000 - t.nsec)
    } else {
        write!(out, "{}.{:09}", t.sec, t.nsec)
    };
}

/// Parses a PAX time; `None` if malformed.
pub fn parse_pax_time(s: &str) -> Option<Timestamp> {
    let (neg, s) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s),
    };
    let (whole, frac) = s.split_once('.').unwrap_or((s, ""));
    if whole.is_empty() || !whole.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let sec: i64 = whole.parse().ok()?;
    let mut nsec = 0u32;
    for (i, d) in frac.bytes().take(9).enumerate() {
        nsec += (d - b'0') as u32 * 10u32.pow(8 - i as u32);
    }
    Some(match (neg, nsec) {
        (false, _) => Timestamp { sec, nsec },
        (true, 0) => Timestamp { sec: -sec, nsec: 0 },
        (true, n) => Timestamp {
            sec: -sec - 1,
            nsec: 1_000_000_000 - n,
        },
    })
}

/// The xattr name a PAX key stands for: `%` and `=` were percent-encoded, as GNU tar
/// writes and reads them (the inverse of [`Pax::add_xattr`]'s key).
pub fn decode_key(key: &str) -> String {
    key.replace("%3D", "=").replace("%25", "%")
}

/// The prefix of an xattr's PAX key.
const XATTR: &[u8] = b"SCHILY.xattr.";

/// PAX extended header records for one member, written without an allocation a record
/// (an archive of 20,000 small files made about fifteen a file for them).
#[derive(Default)]
pub struct Pax(Vec<u8>);

impl Pax {
    /// Appends `<len> <key>=<value>\n`, where `len` counts the whole record, itself included.
    pub fn add(&mut self, key: &str, value: &[u8]) {
        self.record(
            key.len(),
            |out| out.extend_from_slice(key.as_bytes()),
            value,
        );
    }

    /// Appends the record of the extended attribute `name`: its key is `SCHILY.xattr.` and
    /// the name with `%` and `=` percent-encoded.
    pub fn add_xattr(&mut self, name: &str, value: &[u8]) {
        let escaped = name.bytes().filter(|b| matches!(b, b'%' | b'=')).count();
        let key = |out: &mut Vec<u8>| {
            out.extend_from_slice(XATTR);
            for b in name.bytes() {
                match b {
                    b'%' => out.extend_from_slice(b"%25"),
                    b'=' => out.extend_from_slice(b"%3D"),
                    _ => out.push(b),
                }
            }
        };
        self.record(XATTR.len() + name.len() + 2 * escaped, key, value);
    }

    /// Appends the time `t` as `key`'s value (see [`pax_time`]).
    pub fn add_time(&mut self, key: &str, t: Timestamp) {
        // A sign, 19 digits, a point and 9: room on the stack.
        let mut buf = [0u8; 32];
        let mut at = std::io::Cursor::new(&mut buf[..]);
        write_time(&mut at, t);
        let n = at.position() as usize;
        self.add(key, &buf[..n]);
    }

    /// A record whose key is `key_len` bytes, written by `key`.
    fn record(&mut self, key_len: usize, key: impl FnOnce(&mut Vec<u8>), value: &[u8]) {
        use std::io::Write;
        let digits = |n: usize| n.checked_ilog10().unwrap_or(0) as usize + 1;
        let rest = key_len + value.len() + 3;
        let mut len = rest + 1;
        while len != rest + digits(len) {
            len = rest + digits(len);
        }
        // Writing to a Vec cannot fail.
        let _ = write!(self.0, "{len} ");
        key(&mut self.0);
        self.0.push(b'=');
        self.0.extend_from_slice(value);
        self.0.push(b'\n');
    }

    /// The records, as they go into an extended header.
    pub fn bytes(&self) -> &[u8] {
        &self.0
    }
}

/// One PAX record: key and value.
pub type Record<'a> = (&'a [u8], &'a [u8]);

/// Parses PAX extended header records: `<len> <key>=<value>\n`, where `len` counts the
/// whole record, so values may hold newlines and any other byte.
pub fn parse_pax(mut data: &[u8]) -> Result<Vec<Record<'_>>, &'static str> {
    let mut records = Vec::new();
    while !data.is_empty() {
        if data.iter().all(|&b| b == 0) {
            break;
        }
        let space = data
            .iter()
            .take(20)
            .position(|&b| b == b' ')
            .ok_or("malformed PAX record length")?;
        let len: usize = std::str::from_utf8(&data[..space])
            .ok()
            .filter(|s| s.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|s| s.parse().ok())
            .ok_or("malformed PAX record length")?;
        if len <= space + 1 || len > data.len() || data[len - 1] != b'\n' {
            return Err("PAX record length does not fit");
        }
        let record = &data[space + 1..len - 1];
        let eq = record
            .iter()
            .position(|&b| b == b'=')
            .ok_or("PAX record without '='")?;
        records.push((&record[..eq], &record[eq + 1..]));
        data = &data[len..];
    }
    Ok(records)
}

/// Upper bound on a sparse map's runs: the writer stores a file with more runs whole, holes
/// and all, and the reader refuses a map that claims more.
pub const MAX_RUNS: usize = 1 << 20;

/// Parses a GNU 1.0 sparse map block by block, each byte once: the number of runs, then each
/// run's offset and length, one decimal number per line.
#[derive(Default)]
pub struct MapParser {
    count: Option<usize>,
    numbers: Vec<u64>,
    line: Vec<u8>,
}

impl MapParser {
    /// Feeds the next block: the runs once the map is complete, `None` if it goes on.
    pub fn feed(&mut self, block: &[u8]) -> Result<Option<Vec<(u64, u64)>>, &'static str> {
        for &b in block {
            if b != b'\n' {
                if !b.is_ascii_digit() || self.line.len() == 20 {
                    return Err("malformed sparse map");
                }
                self.line.push(b);
                continue;
            }
            let n: u64 = std::str::from_utf8(&self.line)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or("malformed sparse map")?;
            self.line.clear();
            match self.count {
                None if n > MAX_RUNS as u64 => return Err("sparse map too large"),
                None => self.count = Some(n as usize),
                Some(_) => self.numbers.push(n),
            }
            if self.count == Some(self.numbers.len() / 2) && self.numbers.len().is_multiple_of(2) {
                return Ok(Some(self.numbers.chunks(2).map(|p| (p[0], p[1])).collect()));
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
fn parse_sparse_map(text: &[u8]) -> Result<Option<Vec<(u64, u64)>>, &'static str> {
    MapParser::default().feed(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pax_records_count_their_own_length() {
        for value_len in [0, 1, 5, 6, 7, 88, 89, 90, 991, 992, 993, 9990, 9991] {
            let mut pax = Pax::default();
            pax.add("k", &vec![b'x'; value_len]);
            let text = &pax.0;
            let space = text.iter().position(|&b| b == b' ').unwrap();
            let len: usize = std::str::from_utf8(&text[..space])
                .unwrap()
                .parse()
                .unwrap();
            assert_eq!(len, text.len(), "value of {value_len}");
        }
    }

    #[test]
    fn xattr_keys_and_times_are_written_as_gnu_tar_reads_them() {
        let mut pax = Pax::default();
        pax.add_xattr("user.a%b=c", b"v=\n");
        pax.add_time(
            "mtime",
            Timestamp {
                sec: -2,
                nsec: 500_000_000,
            },
        );
        let records = parse_pax(pax.bytes()).expect("well formed");
        assert_eq!(
            records[0],
            (&b"SCHILY.xattr.user.a%25b%3Dc"[..], &b"v=\n"[..])
        );
        let key = std::str::from_utf8(&records[0].0[XATTR.len()..]).expect("text");
        assert_eq!(decode_key(key), "user.a%b=c");
        assert_eq!(records[1], (&b"mtime"[..], &b"-1.500000000"[..]));
    }

    #[test]
    fn pax_times_round_trip() {
        for (sec, nsec) in [
            (0, 0),
            (1_700_000_000, 123_456_789),
            (-1, 500_000_000),
            (-2, 0),
        ] {
            let t = Timestamp { sec, nsec };
            assert_eq!(parse_pax_time(&pax_time(t)), Some(t), "{}", pax_time(t));
        }
        assert_eq!(
            pax_time(Timestamp {
                sec: -2,
                nsec: 500_000_000
            }),
            "-1.500000000"
        );
        assert_eq!(
            parse_pax_time("12.5"),
            Some(Timestamp {
                sec: 12,
                nsec: 500_000_000
            })
        );
        for bad in ["", ".", "1.x", "x", "--1", "1e3"] {
            assert_eq!(parse_pax_time(bad), None, "{bad}");
        }
    }

    #[test]
    fn sparse_maps_round_trip() {
        let runs = vec![(0, 4096), (1 << 20, 100)];
        let map = sparse_map(&runs, 2 << 20);
        assert_eq!(map.len() % 512, 0);
        assert_eq!(
            parse_sparse_map(&map),
            Ok(Some(vec![(0, 4096), (1 << 20, 100), (2 << 20, 0)]))
        );
        // Cut anywhere before its end, the map asks for more.
        let text_len = map.iter().position(|&b| b == 0).unwrap();
        for cut in 0..text_len - 1 {
            assert_eq!(parse_sparse_map(&map[..cut]), Ok(None), "cut at {cut}");
        }
        assert!(parse_sparse_map(b"1\n-5\n0\n").is_err());
        assert!(parse_sparse_map(b"99999999999999\n").is_err());
    }

    #[test]
    fn sparse_map_parser_never_panics() {
        let mut rng = crate::testutil::Rng::new(7);
        let good = sparse_map(&[(0, 10), (4096, 20), (9000, 1)], 10000);
        for _ in 0..20_000 {
            let mut input = good.clone();
            crate::testutil::mutate(&mut rng, &mut input, 6, b"0123456789\n\0-");
            let _ = parse_sparse_map(&input);
        }
    }

    #[test]
    fn pax_records_parse_by_length_with_any_bytes() {
        let mut pax = Pax::default();
        pax.add("path", b"a\nb=c");
        pax.add("SCHILY.xattr.user.x", &[0, 10, 255, b'=']);
        let parsed = parse_pax(&pax.0).unwrap();
        assert_eq!(
            parsed,
            vec![
                (&b"path"[..], &b"a\nb=c"[..]),
                (&b"SCHILY.xattr.user.x"[..], &[0, 10, 255, b'='][..])
            ]
        );
        for bad in [
            &b"5 a=b\n"[..],
            b"x a=b\n",
            b"6 ab\n\n",
            b"99 a=b\n",
            b"7 a=bc",
        ] {
            assert!(
                parse_pax(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let mut rng = crate::testutil::Rng::new(11);
        for _ in 0..20_000 {
            let mut input = pax.0.clone();
            crate::testutil::mutate(&mut rng, &mut input, 6, b"0123456789 =\n");
            let _ = parse_pax(&input);
        }
    }
}
