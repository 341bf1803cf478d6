//! Tags: what intact and its peers store on a file, parsed and encoded as pure functions.
//!
//! intact's own tag is one extended attribute of 62 bytes (version 2, binary; see
//! [`encode`]), so that a single `setxattr` writes it atomically and it fits inside the inode
//! of a default ext4 (256-byte inodes leave exactly 64 bytes for the value of `user.intact`;
//! a longer value costs every file a 4 KiB attribute block, and a cold check one more read).
//! Version 1, a line of ASCII (`v=1 sha256=<64 hex> size=.. mtime=<sec>.<nsec> tagged=..`),
//! is still read.
//!
//! The tags of cshatag/shatag and of the Dintch family are read too, so files they tagged can
//! be checked. Anything malformed is reported, never trusted.

use std::fmt;

use crate::core::digest::{Algo, Digest};

/// The extended attribute names, as spelled on this platform.
pub mod names {
    macro_rules! attrs {
        ($($(#[$doc:meta])* $name:ident = $linux:literal, $macos:literal;)*) => {$(
            $(#[$doc])*
            #[cfg(not(target_os = "macos"))]
            pub const $name: &str = $linux;
            $(#[$doc])*
            #[cfg(target_os = "macos")]
            pub const $name: &str = $macos;
        )*};
    }

    attrs! {
        /// intact's own tag; on macOS `#S` makes it survive iCloud and cross-volume copies.
        INTACT = "user.intact", "intact#S";
        /// cshatag/shatag: the hex SHA-256.
        SHATAG_SHA256 = "user.shatag.sha256", "shatag.sha256";
        /// cshatag/shatag: the mtime the hash belongs to.
        SHATAG_TS = "user.shatag.ts", "shatag.ts";
        /// Dintch/Fintch/cintch: 32 raw SHA-256 bytes.
        DINTCH_HASH = "user.co.eclecticlight.dintch.hash", "co.eclecticlight.dintch.hash";
        /// The same after an rsync from a Mac, which keeps the `#S` flag as literal text.
        DINTCH_HASH_S = "user.co.eclecticlight.dintch.hash#S", "co.eclecticlight.dintch.hash#S";
        /// The Dintch name intact writes: plain on Linux; with the syncable flag on macOS, as
        /// Dintch itself writes it there.
        DINTCH_WRITE = "user.co.eclecticlight.dintch.hash", "co.eclecticlight.dintch.hash#S";
        /// A repair was rewriting this file in place (a hard-linked one) and did not finish.
        REPAIRING = "user.intact.repairing", "intact.repairing";
        /// A damaged copy kept by repair: what it is a copy of, and when it was kept.
        KEPT_DAMAGED = "user.intact.damaged", "intact.damaged";
        /// A file a writing verb found damaged: the digest of its damaged bytes and when
        /// (see [`super::Damage`]).
        CORRUPT = "user.intact.corrupt", "intact.corrupt";
        /// Dintch: when the file was tagged.
        DINTCH_TIME = "user.co.eclecticlight.dintch.time", "co.eclecticlight.dintch.time";
    }

    /// The attributes that hold a digest a check reads: a file that carries one is tagged.
    pub const DIGESTS: [&str; 4] = [INTACT, SHATAG_SHA256, DINTCH_HASH, DINTCH_HASH_S];
}

/// A file time: seconds and nanoseconds since the Unix epoch, as in `struct timespec`
/// (`nsec` is always in 0..1e9, also before 1970).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp {
    /// Whole seconds (may be negative).
    pub sec: i64,
    /// Nanoseconds, 0..=999_999_999.
    pub nsec: u32,
}

impl Timestamp {
    /// Nanoseconds since the epoch.
    pub fn nanos(self) -> i128 {
        self.sec as i128 * 1_000_000_000 + self.nsec as i128
    }

    /// Now, from the system clock.
    pub fn now() -> Self {
        match std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
            Ok(d) => Timestamp {
                sec: d.as_secs() as i64,
                nsec: d.subsec_nanos(),
            },
            Err(_) => Timestamp { sec: 0, nsec: 0 },
        }
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:09}", self.sec, self.nsec)
    }
}

/// Which tool's convention a tag follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// intact's own `user.intact` line: digest, size, mtime, tagging time.
    Intact,
    /// cshatag/shatag: SHA-256 and mtime.
    Shatag,
    /// Dintch family: SHA-256 only (and sometimes a tagging time).
    Dintch,
    /// A line of a checksum manifest (sha256sum, b3sum ...): a digest, nothing else.
    Manifest,
}

impl Format {
    /// Lowercase name for output.
    pub fn name(self) -> &'static str {
        match self {
            Format::Intact => "intact",
            Format::Shatag => "shatag",
            Format::Dintch => "dintch",
            Format::Manifest => "manifest",
        }
    }
}

/// Another tool's tag, which intact writes beside its own on request (`--compat`) and removes
/// with `strip --compat`: the one place that says which there are and what they are made of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Compat {
    /// cshatag/shatag: the SHA-256 in hex, then the mtime.
    Shatag,
    /// The Dintch family: the SHA-256's bytes (under either spelling of its name).
    Dintch,
}

impl Compat {
    /// The format its tag is read as.
    pub fn format(self) -> Format {
        match self {
            Compat::Shatag => Format::Shatag,
            Compat::Dintch => Format::Dintch,
        }
    }

    /// The tag `format` is, if it is another tool's.
    pub fn of(format: Format) -> Option<Compat> {
        [Compat::Shatag, Compat::Dintch]
            .into_iter()
            .find(|c| c.format() == format)
    }

    /// Its attributes: each one its tag may have.
    pub fn attributes(self) -> &'static [&'static str] {
        match self {
            Compat::Shatag => &[names::SHATAG_SHA256, names::SHATAG_TS],
            Compat::Dintch => &[names::DINTCH_HASH, names::DINTCH_HASH_S, names::DINTCH_TIME],
        }
    }

    /// Whether its tag records the mtime (shatag's does; a Dintch tag holds only the hash).
    pub fn has_mtime(self) -> bool {
        self == Compat::Shatag
    }
}

/// What a tag says about the file it sits on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tag {
    /// The convention it was read from.
    pub format: Format,
    /// The digest of the file's data when tagged.
    pub digest: Digest,
    /// The size when tagged, if the format records it.
    pub size: Option<u64>,
    /// The mtime the digest belongs to, if the format records it.
    pub mtime: Option<Timestamp>,
    /// How far the stored mtime may be from the true one because the format rounded it
    /// (shatag stores a Python float): 0 for exact.
    pub mtime_slack_ns: u64,
    /// When the tag was written, in Unix seconds, if recorded.
    pub tagged: Option<i64>,
}

/// Why a stored value is not a usable tag.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Malformed(pub String);

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn bad<T>(msg: impl Into<String>) -> Result<T, Malformed> {
    Err(Malformed(msg.into()))
}

/// Longest value intact will consider; a version 1 tag is about 130 bytes.
pub const MAX_TAG_LEN: usize = 1024;

/// The length of a version 2 tag.
pub const TAG_LEN: usize = 62;

/// The first byte of a version 2 tag (a version 1 tag begins with `v`).
const V2: u8 = 2;

/// Encodes intact's own tag, version 2: fixed fields, integers little-endian.
///
/// ```text
/// offset  size  field
///      0     1  version: 2
///      1     1  algorithm: 1 = SHA-256, 2 = BLAKE3
///      2    32  digest
///     34     8  size in bytes, unsigned
///     42     8  mtime, whole seconds since the Unix epoch, signed
///     50     4  mtime, nanoseconds 0..=999,999,999, unsigned
///     54     8  tagged: Unix seconds when written, signed
/// ```
pub fn encode(digest: &Digest, size: u64, mtime: Timestamp, tagged: i64) -> Vec<u8> {
    let mut v = Vec::with_capacity(TAG_LEN);
    v.push(V2);
    v.push(algo_code(digest.algo));
    v.extend_from_slice(&digest.bytes);
    v.extend_from_slice(&size.to_le_bytes());
    v.extend_from_slice(&mtime.sec.to_le_bytes());
    v.extend_from_slice(&mtime.nsec.to_le_bytes());
    v.extend_from_slice(&tagged.to_le_bytes());
    debug_assert_eq!(v.len(), TAG_LEN);
    v
}

fn algo_code(algo: Algo) -> u8 {
    match algo {
        Algo::Sha256 => 1,
        Algo::Blake3 => 2,
    }
}

/// cshatag's timestamp for `user.shatag.ts`: `%010d.%09d`.
pub fn encode_shatag_ts(mtime: Timestamp) -> String {
    format!("{:010}.{:09}", mtime.sec, mtime.nsec)
}

/// Parses intact's own tag, of either version.
pub fn parse_intact(raw: &[u8]) -> Result<Tag, Malformed> {
    match raw.first() {
        None => bad("empty value"),
        Some(&V2) => parse_v2(raw),
        Some(b'v') => parse_v1(raw),
        Some(&b) if b < b' ' => bad(format!("unsupported version {b}")),
        Some(_) => bad("does not start with a version"),
    }
}

fn parse_v2(raw: &[u8]) -> Result<Tag, Malformed> {
    let Ok(raw) = <&[u8; TAG_LEN]>::try_from(raw) else {
        return bad(format!(
            "{} bytes instead of {TAG_LEN} (version 2)",
            raw.len()
        ));
    };
    let algo = match raw[1] {
        1 => Algo::Sha256,
        2 => Algo::Blake3,
        n => return bad(format!("unknown algorithm {n}")),
    };
    let field = |at: usize| -> [u8; 8] { raw[at..at + 8].try_into().expect("8 bytes") };
    let nsec = u32::from_le_bytes(raw[50..54].try_into().expect("4 bytes"));
    if nsec > 999_999_999 {
        return bad(format!("{nsec} nanoseconds"));
    }
    Ok(Tag {
        format: Format::Intact,
        digest: Digest {
            algo,
            bytes: raw[2..34].try_into().expect("32 bytes"),
        },
        size: Some(u64::from_le_bytes(field(34))),
        mtime: Some(Timestamp {
            sec: i64::from_le_bytes(field(42)),
            nsec,
        }),
        mtime_slack_ns: 0,
        tagged: Some(i64::from_le_bytes(field(54))),
    })
}

/// Version 1: fields are `key=value` separated by single spaces; the first is `v=1`;
/// unknown keys are ignored.
fn parse_v1(raw: &[u8]) -> Result<Tag, Malformed> {
    if raw.len() > MAX_TAG_LEN {
        return bad(format!("{} bytes long", raw.len()));
    }
    let Ok(text) = std::str::from_utf8(raw) else {
        return bad("not text");
    };
    if !text.is_ascii() || text.bytes().any(|b| b.is_ascii_control()) {
        return bad("not a line of printable ASCII");
    }
    let mut fields = text.split(' ');
    match fields.next() {
        Some("v=1") => {}
        Some(v) if v.starts_with("v=") => return bad(format!("unsupported version {v:?}")),
        _ => return bad("does not start with v=1"),
    }
    let (mut digest, mut size, mut mtime, mut tagged) = (None, None, None, None);
    for field in fields {
        let Some((key, value)) = field.split_once('=') else {
            return bad(format!("field {field:?} is not key=value"));
        };
        let dup = match key {
            "sha256" | "blake3" => digest
                .replace(parse_hex_digest(key.parse().expect("known algo"), value)?)
                .is_some(),
            "size" => size.replace(parse_u64(value)?).is_some(),
            "mtime" => mtime.replace(parse_timestamp(value)?).is_some(),
            "tagged" => tagged.replace(parse_i64(value)?).is_some(),
            _ => false,
        };
        if dup {
            let what = if matches!(key, "sha256" | "blake3") {
                "digest"
            } else {
                key
            };
            return bad(format!("more than one {what}"));
        }
    }
    let Some(digest) = digest else {
        return bad("no digest");
    };
    let Some(size) = size else {
        return bad("no size");
    };
    let Some(mtime) = mtime else {
        return bad("no mtime");
    };
    Ok(Tag {
        format: Format::Intact,
        digest,
        size: Some(size),
        mtime: Some(mtime),
        mtime_slack_ns: 0,
        tagged,
    })
}

/// Parses the cshatag/shatag pair. Old cshatag ends the hash with a NUL byte; shatag writes
/// the time as a Python float (`1560177334.020775`), cshatag as `%010d.%09d`.
pub fn parse_shatag(hash: &[u8], ts: Option<&[u8]>) -> Result<Tag, Malformed> {
    let hash = hash.strip_suffix(b"\0").unwrap_or(hash);
    let Ok(hex) = std::str::from_utf8(hash) else {
        return bad("hash is not text");
    };
    let digest = parse_hex_digest(Algo::Sha256, hex)?;
    let Some(ts) = ts else {
        return bad("user.shatag.ts is missing");
    };
    let ts = ts.strip_suffix(b"\0").unwrap_or(ts);
    let Ok(ts) = std::str::from_utf8(ts) else {
        return bad("timestamp is not text");
    };
    let (sec, frac) = ts.split_once('.').unwrap_or((ts, ""));
    let sec = parse_i64(sec)?;
    if frac.len() > 9 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return bad(format!("timestamp {ts:?} is not seconds.fraction"));
    }
    let nsec: u32 = format!("{frac:0<9}").parse().expect("nine digits");
    // A float rounds the true mtime by at most about 0.25 µs at today's epoch values.
    let slack = if frac.len() < 9 { 1_000 } else { 0 };
    Ok(Tag {
        format: Format::Shatag,
        digest,
        size: None,
        mtime: Some(Timestamp { sec, nsec }),
        mtime_slack_ns: slack,
        tagged: None,
    })
}

/// Parses a Dintch tag: the 32 raw bytes of the SHA-256, and optionally the tagging time
/// as text (Unix seconds, or a date such as `2019-06-12 10:23:45 +0000`).
pub fn parse_dintch(hash: &[u8], time: Option<&[u8]>) -> Result<Tag, Malformed> {
    let Ok(bytes) = <[u8; 32]>::try_from(hash) else {
        return bad(format!("{} bytes instead of 32", hash.len()));
    };
    Ok(Tag {
        format: Format::Dintch,
        digest: Digest {
            algo: Algo::Sha256,
            bytes,
        },
        size: None,
        mtime: None,
        mtime_slack_ns: 0,
        tagged: time.and_then(parse_loose_time),
    })
}

/// Best effort: an unreadable Dintch time only loses the modified/mismatch distinction.
fn parse_loose_time(raw: &[u8]) -> Option<i64> {
    let text = std::str::from_utf8(raw).ok()?.trim_end_matches('\0').trim();
    if let Ok(sec) = text.parse::<f64>() {
        return Some(sec as i64);
    }
    // "2019-06-12 10:23:45 +0000": humantime reads the date and time; the zone is UTC here.
    let (datetime, zone) = match text.rsplit_once(' ') {
        Some((dt, z)) if z.starts_with(['+', '-']) => (dt, Some(z)),
        _ => (text.trim_end_matches('Z'), None),
    };
    let t = humantime::parse_rfc3339_weak(datetime).ok()?;
    let mut sec = t.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs() as i64;
    if let Some(z) = zone {
        let sign = if z.starts_with('-') { -1 } else { 1 };
        let digits = &z[1..];
        if digits.len() == 4 && digits.bytes().all(|b| b.is_ascii_digit()) {
            let h: i64 = digits[..2].parse().ok()?;
            let m: i64 = digits[2..].parse().ok()?;
            sec -= sign * (h * 3600 + m * 60);
        }
    }
    Some(sec)
}

/// Damage found earlier: the digest of the damaged bytes (with the tag's algorithm) and when
/// it was found. Kept in the state database and its damage journal (older versions also
/// marked the file itself, `user.intact.corrupt`), so that a later run knows the same damage
/// under a moved mtime (a touch, a sync tool) for what it is, and only an edit (other bytes)
/// ends it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Damage {
    /// The digest of the damaged data.
    pub digest: Digest,
    /// When the damage was found, Unix seconds.
    pub found: i64,
}

/// The length of a damage mark.
pub const DAMAGE_LEN: usize = 42;

/// Encodes a damage mark, version 1, integers little-endian:
///
/// ```text
/// offset  size  field
///      0     1  version: 1
///      1     1  algorithm: 1 = SHA-256, 2 = BLAKE3
///      2    32  digest of the damaged data
///     34     8  found: Unix seconds, signed
/// ```
pub fn encode_damage(d: &Damage) -> Vec<u8> {
    let mut v = Vec::with_capacity(DAMAGE_LEN);
    v.push(1);
    v.push(algo_code(d.digest.algo));
    v.extend_from_slice(&d.digest.bytes);
    v.extend_from_slice(&d.found.to_le_bytes());
    v
}

/// Parses a damage mark (see [`encode_damage`]).
pub fn parse_damage(raw: &[u8]) -> Result<Damage, Malformed> {
    let Ok(raw) = <&[u8; DAMAGE_LEN]>::try_from(raw) else {
        return bad(format!("{} bytes instead of {DAMAGE_LEN}", raw.len()));
    };
    if raw[0] != 1 {
        return bad(format!("unsupported version {}", raw[0]));
    }
    let algo = match raw[1] {
        1 => Algo::Sha256,
        2 => Algo::Blake3,
        n => return bad(format!("unknown algorithm {n}")),
    };
    Ok(Damage {
        digest: Digest {
            algo,
            bytes: raw[2..34].try_into().expect("32 bytes"),
        },
        found: i64::from_le_bytes(raw[34..42].try_into().expect("8 bytes")),
    })
}

fn parse_hex_digest(algo: Algo, hex: &str) -> Result<Digest, Malformed> {
    if hex.len() != 64 {
        return bad(format!(
            "{algo} digest has {} characters instead of 64",
            hex.len()
        ));
    }
    if !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return bad(format!("{algo} digest is not lowercase hex"));
    }
    let mut bytes = [0u8; 32];
    hex::decode_to_slice(hex, &mut bytes).expect("checked hex");
    Ok(Digest { algo, bytes })
}

fn parse_u64(s: &str) -> Result<u64, Malformed> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return bad(format!("{s:?} is not a number"));
    }
    s.parse().or_else(|_| bad(format!("{s:?} is out of range")))
}

fn parse_i64(s: &str) -> Result<i64, Malformed> {
    let digits = s.strip_prefix('-').unwrap_or(s);
    parse_u64(digits)?;
    s.parse().or_else(|_| bad(format!("{s:?} is out of range")))
}

fn parse_timestamp(s: &str) -> Result<Timestamp, Malformed> {
    let Some((sec, nsec)) = s.split_once('.') else {
        return bad(format!("mtime {s:?} is not seconds.nanoseconds"));
    };
    if nsec.len() != 9 {
        return bad(format!("mtime {s:?} needs 9 digits of nanoseconds"));
    }
    Ok(Timestamp {
        sec: parse_i64(sec)?,
        nsec: parse_u64(nsec)? as u32,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::digest::digest_bytes;

    fn sample() -> (Digest, Timestamp) {
        (
            digest_bytes(Algo::Sha256, b"hello"),
            Timestamp {
                sec: 1_700_000_000,
                nsec: 5,
            },
        )
    }

    /// A version 1 tag, as intact wrote them before version 2.
    fn encode_v1(digest: &Digest, size: u64, mtime: Timestamp, tagged: i64) -> String {
        format!(
            "v=1 {}={} size={size} mtime={mtime} tagged={tagged}",
            digest.algo,
            digest.hex()
        )
    }

    #[test]
    fn intact_round_trip() {
        let (d, m) = sample();
        let raw = encode(&d, 42, m, 1_800_000_000);
        // Fits in the inode of a default ext4 (64 bytes for the value).
        assert_eq!(raw.len(), TAG_LEN);
        assert!(raw.len() <= 64);
        assert_eq!(raw[..2], [2, 1]);
        assert_eq!(raw[2..34], d.bytes);
        assert_eq!(raw[34..42], 42u64.to_le_bytes());
        let tag = parse_intact(&raw).unwrap();
        assert_eq!(tag.digest, d);
        assert_eq!(tag.size, Some(42));
        assert_eq!(tag.mtime, Some(m));
        assert_eq!(tag.tagged, Some(1_800_000_000));
        assert_eq!(tag.format, Format::Intact);
    }

    #[test]
    fn version_1_still_reads() {
        let (d, m) = sample();
        let line = encode_v1(&d, 42, m, 1_800_000_000);
        assert_eq!(
            line,
            format!(
                "v=1 sha256={} size=42 mtime=1700000000.000000005 tagged=1800000000",
                d.hex()
            )
        );
        let tag = parse_intact(line.as_bytes()).unwrap();
        assert_eq!(
            (tag.digest, tag.size, tag.mtime, tag.tagged),
            (d, Some(42), Some(m), Some(1_800_000_000))
        );
        // Unknown fields are ignored.
        let line = encode_v1(&d, 1, m, 2) + " future=yes";
        assert_eq!(parse_intact(line.as_bytes()).unwrap().size, Some(1));
    }

    #[test]
    fn intact_blake3_and_extreme_times() {
        let d = digest_bytes(Algo::Blake3, b"x");
        for (m, size, tagged) in [
            (Timestamp { sec: -2, nsec: 500 }, 0, 0),
            (
                Timestamp {
                    sec: i64::MIN,
                    nsec: 999_999_999,
                },
                u64::MAX,
                i64::MAX,
            ),
        ] {
            let tag = parse_intact(&encode(&d, size, m, tagged)).unwrap();
            assert_eq!(
                (tag.digest, tag.size, tag.mtime, tag.tagged),
                (d, Some(size), Some(m), Some(tagged))
            );
            let tag = parse_intact(encode_v1(&d, size, m, tagged).as_bytes()).unwrap();
            assert_eq!((tag.digest, tag.mtime), (d, Some(m)));
        }
    }

    #[test]
    fn intact_v2_rejects_malformed() {
        let (d, m) = sample();
        let good = encode(&d, 1, m, 2);
        let mut cases = vec![
            good[..TAG_LEN - 1].to_vec(),
            [&good[..], &[0]].concat(),
            vec![2],
        ];
        for (at, byte) in [(0, 3), (0, 1), (1, 0), (1, 3), (53, 0xff)] {
            let mut v = good.clone();
            v[at] = byte;
            cases.push(v);
        }
        for case in cases {
            assert!(parse_intact(&case).is_err(), "accepted {case:?}");
        }
    }

    #[test]
    fn intact_v1_rejects_malformed() {
        let (d, m) = sample();
        let good = encode_v1(&d, 1, m, 2);
        let cases: Vec<String> = vec![
            String::new(),
            "garbage".into(),
            good.replace("v=1", "v=2"),
            good.replace(" size=1", ""),
            good.replace(" mtime=1700000000.000000005", ""),
            good.replace(&d.hex(), &d.hex()[..63]),
            good.replace(&d.hex(), &d.hex().to_uppercase()),
            good.replace(&d.hex()[..2], "zz"),
            good.replace("size=1", "size=-1"),
            good.replace("mtime=1700000000.000000005", "mtime=1700000000.5"),
            good.replace(' ', "  "),
            format!("{good} size=3"),
            format!("{good}\n"),
            good[..good.len() / 2].to_string(),
        ];
        for case in cases {
            assert!(parse_intact(case.as_bytes()).is_err(), "accepted {case:?}");
        }
        assert!(parse_intact(&[0xff, 0xfe]).is_err());
        assert!(parse_intact(&vec![b'a'; MAX_TAG_LEN + 1]).is_err());
    }

    #[test]
    fn shatag_styles() {
        let d = digest_bytes(Algo::Sha256, b"hello");
        let hex = d.hex();
        let cshatag = parse_shatag(hex.as_bytes(), Some(b"1560177334.020775123")).unwrap();
        assert_eq!(cshatag.digest, d);
        assert_eq!(
            cshatag.mtime,
            Some(Timestamp {
                sec: 1560177334,
                nsec: 20775123
            })
        );
        assert_eq!(cshatag.mtime_slack_ns, 0);

        let with_nul = format!("{hex}\0");
        let old = parse_shatag(with_nul.as_bytes(), Some(b"0000000012.000000000")).unwrap();
        assert_eq!(old.digest, d);
        assert_eq!(old.mtime, Some(Timestamp { sec: 12, nsec: 0 }));

        let float = parse_shatag(hex.as_bytes(), Some(b"1560177334.020775")).unwrap();
        assert_eq!(float.mtime.unwrap().nsec, 20_775_000);
        assert!(float.mtime_slack_ns > 0);

        let whole = parse_shatag(hex.as_bytes(), Some(b"1560177334")).unwrap();
        assert_eq!(whole.mtime.unwrap().nsec, 0);
    }

    #[test]
    fn shatag_rejects_malformed() {
        let hex = digest_bytes(Algo::Sha256, b"hello").hex();
        assert!(parse_shatag(&hex.as_bytes()[..60], Some(b"1.0")).is_err());
        assert!(parse_shatag(hex.as_bytes(), None).is_err());
        assert!(parse_shatag(hex.as_bytes(), Some(b"yesterday")).is_err());
        assert!(parse_shatag(hex.as_bytes(), Some(b"1.0000000001")).is_err());
        assert!(parse_shatag(b"", Some(b"1.0")).is_err());
    }

    #[test]
    fn dintch_raw_bytes() {
        let d = digest_bytes(Algo::Sha256, b"hello");
        let tag = parse_dintch(&d.bytes, None).unwrap();
        assert_eq!(tag.digest, d);
        assert_eq!(tag.mtime, None);
        assert!(parse_dintch(&d.bytes[..31], None).is_err());
        assert!(parse_dintch(d.hex().as_bytes(), None).is_err());
        let timed = parse_dintch(&d.bytes, Some(b"2019-06-12 10:23:45 +0100")).unwrap();
        // 10:23:45 at +01:00 is 09:23:45 UTC.
        assert_eq!(timed.tagged, Some(1560335025 - 3600));
        let unix = parse_dintch(&d.bytes, Some(b"1560331425")).unwrap();
        assert_eq!(unix.tagged, Some(1560331425));
    }

    #[test]
    fn damage_marks_round_trip_and_reject_what_they_are_not() {
        let (d, _) = sample();
        let mark = Damage {
            digest: d,
            found: -3,
        };
        let raw = encode_damage(&mark);
        assert_eq!(raw.len(), DAMAGE_LEN);
        assert_eq!(parse_damage(&raw), Ok(mark));
        assert!(parse_damage(&raw[..41]).is_err());
        let mut v2 = raw.clone();
        v2[0] = 2;
        assert!(parse_damage(&v2).is_err());
        let mut algo = raw;
        algo[1] = 9;
        assert!(parse_damage(&algo).is_err());
    }

    /// Mutations of valid tags (flipped, dropped, inserted, truncated bytes) never panic a
    /// parser, and whatever parse_intact accepts encodes back to an equivalent tag.
    #[test]
    fn mutated_tags_never_panic_and_accepted_ones_round_trip() {
        let (d, m) = sample();
        let seeds: Vec<Vec<u8>> = vec![
            encode(&d, 42, m, 1_800_000_000),
            encode_v1(&d, 42, m, 1_800_000_000).into_bytes(),
            encode(
                &digest_bytes(Algo::Blake3, b"y"),
                0,
                Timestamp { sec: -5, nsec: 9 },
                0,
            ),
            d.hex().into_bytes(),
            b"1560177334.020775".to_vec(),
            d.bytes.to_vec(),
            encode_damage(&Damage {
                digest: d,
                found: 1_800_000_000,
            }),
        ];
        let mut rng = crate::testutil::Rng::new(0x9e37_79b9_7f4a_7c15);
        for round in 0..20_000 {
            let mut v = seeds[round % seeds.len()].clone();
            crate::testutil::mutate(
                &mut rng,
                &mut v,
                4,
                &[b' ', b'=', b'.', b'-', b'0', b'a', 0, 0xff],
            );
            if let Ok(tag) = parse_intact(&v) {
                let again = encode(
                    &tag.digest,
                    tag.size.unwrap(),
                    tag.mtime.unwrap(),
                    tag.tagged.unwrap_or(0),
                );
                let back = parse_intact(&again).unwrap();
                assert_eq!(
                    (back.digest, back.size, back.mtime),
                    (tag.digest, tag.size, tag.mtime)
                );
            }
            let _ = parse_shatag(&v, Some(&v));
            let _ = parse_dintch(&v, Some(&v));
            if let Ok(mark) = parse_damage(&v) {
                assert_eq!(parse_damage(&encode_damage(&mark)), Ok(mark));
            }
        }
    }
}
