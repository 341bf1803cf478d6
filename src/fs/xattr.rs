//! The tag store: reading every known tag from an open file and writing intact's own.
//!
//! All calls go through the file descriptor, never the path, so a file renamed or replaced
//! by a symlink mid-run cannot redirect a write.

use std::fs::File;
use std::io;

use rustix::fs::{XattrFlags, fgetxattr, fgetxattr_query, flistxattr, flistxattr_query};

use crate::core::digest::{Algo, Digest};
use crate::core::tag::{self, Compat, Damage, Format, Malformed, Tag, Timestamp, names};

/// Every tag found on one file.
#[derive(Clone, Debug, Default)]
pub struct Stored {
    /// The valid tags, richest format first.
    pub tags: Vec<Tag>,
    /// Attributes that hold something intact cannot use, with the reason.
    pub malformed: Vec<(&'static str, Malformed)>,
    /// A repair was rewriting the file in place and did not finish: its bytes may be mixed,
    /// whatever its mtime says.
    pub repairing: bool,
    /// The file is a damaged copy that a repair kept: evidence, never verified or tagged.
    pub kept_damaged: bool,
    /// An older intact found the file damaged and marked it: the digest of the damaged bytes,
    /// and when.
    pub damage: Option<Damage>,
}

impl Stored {
    /// The tag a check goes by: the richest valid one.
    pub fn best(&self) -> Option<&Tag> {
        self.tags.first()
    }

    /// intact's own tag, if present and valid.
    pub fn intact(&self) -> Option<&Tag> {
        self.of(Format::Intact)
    }

    /// The valid tag of one format, if any.
    pub fn of(&self, format: Format) -> Option<&Tag> {
        self.tags.iter().find(|t| t.format == format)
    }

    /// Whether the tag of `compat` already says exactly what writing it would.
    pub fn compat_current(&self, compat: Compat, sha256: &Digest, mtime: Timestamp) -> bool {
        self.of(compat.format())
            .is_some_and(|t| &t.digest == sha256 && (!compat.has_mtime() || t.mtime == Some(mtime)))
    }
}

/// Writes another tool's tag, for a SHA-256 `digest` of the data at `mtime`.
///
/// shatag: the hash first, then the timestamp (as cshatag does: a crash in between leaves a
/// hash with a stale timestamp, which reads as modified, never as a false ok). Dintch: the
/// 32 raw bytes under the plain name, and under the `#S` spelling too if the file already
/// carries that one (it goes back to a Mac, where `#S` means "syncable"); an old Dintch
/// tagging time is removed.
pub fn write_compat(
    file: &File,
    compat: Compat,
    digest: &Digest,
    mtime: Timestamp,
) -> io::Result<()> {
    assert_eq!(digest.algo, Algo::Sha256, "compat tags hold SHA-256");
    let set =
        |name: &str, value: &[u8]| rustix::fs::fsetxattr(file, name, value, XattrFlags::empty());
    match compat {
        Compat::Shatag => {
            set(names::SHATAG_SHA256, digest.hex().as_bytes())?;
            set(names::SHATAG_TS, tag::encode_shatag_ts(mtime).as_bytes())?;
        }
        Compat::Dintch => {
            set(names::DINTCH_WRITE, &digest.bytes)?;
            // Keep both spellings in step when a file carries both.
            for other in [names::DINTCH_HASH, names::DINTCH_HASH_S] {
                if other != names::DINTCH_WRITE && get(file, other)?.is_some() {
                    set(other, &digest.bytes)?;
                }
            }
            // A tagging time left from an older hash could later excuse a mismatch as an edit.
            remove(file, names::DINTCH_TIME)?;
        }
    }
    Ok(())
}

/// Removes another tool's tag (all its attributes); `Ok(false)` if there was none.
pub fn remove_compat(file: &File, compat: Compat) -> io::Result<bool> {
    let mut removed = false;
    for attr in compat.attributes() {
        removed |= remove(file, attr)?;
    }
    Ok(removed)
}

/// Reads intact's, shatag's and Dintch's tags from `file`.
///
/// One `flistxattr` tells which are present, so an untagged file costs one syscall and a
/// tagged one two.
pub fn read(file: &File) -> io::Result<Stored> {
    let mut small = [0u8; 512];
    let mut large;
    let list: &[u8] = match flistxattr(file, &mut small[..]) {
        Ok(n) => &small[..n],
        Err(rustix::io::Errno::RANGE) => {
            large = vec![0u8; flistxattr_query(file)? + 256];
            let n = flistxattr(file, &mut large[..])?;
            &large[..n]
        }
        // No xattr support means no tags: a check reports the files as new.
        Err(rustix::io::Errno::NOTSUP) => &[],
        Err(e) => return Err(e.into()),
    };
    // The list is scanned once for the names a tag may live under: asking it once a name
    // (seven times a file) was most of reading a tagged file's tags.
    let mut present = 0u16;
    for name in list.split(|&b| b == 0) {
        if let Some(i) = KNOWN.iter().position(|k| k.as_bytes() == name) {
            present |= 1 << i;
        }
    }
    Stored::from_attrs(|name| {
        let here = match KNOWN.iter().position(|k| *k == name) {
            Some(i) => present & (1 << i) != 0,
            None => list.split(|&b| b == 0).any(|n| n == name.as_bytes()),
        };
        if here { get(file, name) } else { Ok(None) }
    })
}

/// The attributes [`Stored::from_attrs`] asks for.
const KNOWN: [&str; 9] = [
    names::INTACT,
    names::SHATAG_SHA256,
    names::SHATAG_TS,
    names::DINTCH_HASH,
    names::DINTCH_HASH_S,
    names::DINTCH_TIME,
    names::REPAIRING,
    names::CORRUPT,
    names::KEPT_DAMAGED,
];

impl Stored {
    /// Parses every known tag out of attributes already read (names and values, as
    /// [`read_all`] gives them or an archive member carries them).
    pub fn from_list(attrs: &[(String, Vec<u8>)]) -> Stored {
        Stored::from_attrs(|name| {
            Ok(attrs
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| Value::of(v)))
        })
        .unwrap_or_default()
    }

    /// Parses every known tag out of a file's attributes, as `lookup` gives them (`None` for
    /// an absent one): from the file system, or from an archive member's records.
    pub fn from_attrs(
        mut lookup: impl FnMut(&str) -> io::Result<Option<Value>>,
    ) -> io::Result<Stored> {
        let mut stored = Stored::default();
        let mut keep = |attr: &'static str, parsed: Result<Tag, Malformed>| match parsed {
            Ok(t) => stored.tags.push(t),
            Err(m) => stored.malformed.push((attr, m)),
        };
        if let Some(value) = lookup(names::INTACT)? {
            keep(names::INTACT, tag::parse_intact(&value));
        }
        if let Some(hash) = lookup(names::SHATAG_SHA256)? {
            let ts = lookup(names::SHATAG_TS)?;
            keep(
                names::SHATAG_SHA256,
                tag::parse_shatag(&hash, ts.as_deref()),
            );
        }
        for attr in [names::DINTCH_HASH, names::DINTCH_HASH_S] {
            if let Some(hash) = lookup(attr)? {
                let time = lookup(names::DINTCH_TIME)?;
                keep(attr, tag::parse_dintch(&hash, time.as_deref()));
                break;
            }
        }
        stored.repairing = lookup(names::REPAIRING)?.is_some();
        if let Some(mark) = lookup(names::CORRUPT)? {
            match tag::parse_damage(&mark) {
                Ok(d) => stored.damage = Some(d),
                Err(m) => stored.malformed.push((names::CORRUPT, m)),
            }
        }
        stored.kept_damaged = lookup(names::KEPT_DAMAGED)?.is_some();
        stored.tags.sort_by_key(|t| t.format);
        Ok(stored)
    }
}

/// Extended attributes, names and values.
pub type Attrs = Vec<(String, Vec<u8>)>;

/// A file's own extended attributes (the `user.` namespace on Linux; all on macOS), names
/// and values, as a copy or an archive member should carry them.
pub fn read_all(file: &File) -> io::Result<Attrs> {
    let mut list = vec![0u8; 1024];
    loop {
        match flistxattr(file, &mut list[..]) {
            Ok(n) => {
                list.truncate(n);
                break;
            }
            Err(rustix::io::Errno::RANGE) => list.resize(flistxattr_query(file)? + 256, 0),
            Err(rustix::io::Errno::NOTSUP) => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        }
    }
    let mut attrs = Vec::new();
    for name in list.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let Ok(name) = std::str::from_utf8(name) else {
            continue;
        };
        if cfg!(not(target_os = "macos")) && !name.starts_with("user.") {
            continue;
        }
        // Removed since it was listed if `None`.
        if let Some(value) = get_whole(file, name, 256)? {
            attrs.push((name.to_owned(), value));
        }
    }
    Ok(attrs)
}

/// One attribute's whole value, however long, or `None` if absent; `first` bytes are asked
/// for first.
fn get_whole(file: &File, name: &str, first: usize) -> io::Result<Option<Vec<u8>>> {
    let mut value = vec![0u8; first];
    loop {
        match fgetxattr(file, name, &mut value[..]) {
            Ok(n) => {
                value.truncate(n);
                return Ok(Some(value));
            }
            // Longer than asked for, or grown since it was measured.
            Err(rustix::io::Errno::RANGE) => value.resize(fgetxattr_query(file, name)? + 256, 0),
            Err(rustix::io::Errno::NODATA) => return Ok(None),
            Err(e) => return Err(e.into()),
        }
    }
}

/// Sets each attribute on `file`.
pub fn write_all<'a>(
    file: &File,
    attrs: impl IntoIterator<Item = &'a (String, Vec<u8>)>,
) -> io::Result<()> {
    for (name, value) in attrs {
        rustix::fs::fsetxattr(file, name.as_str(), value, XattrFlags::empty())?;
    }
    Ok(())
}

/// An attribute's value as the tag parsers take it: inline if as short as tags are (every
/// file's tag is read: no allocation for it, and little to copy).
pub enum Value {
    /// Up to [`INLINE`] bytes.
    Inline(u8, [u8; INLINE]),
    /// A longer one.
    Long(Vec<u8>),
}

/// The longest value held inline: intact's tag takes about 60 bytes, shatag's 64.
const INLINE: usize = 128;

impl Value {
    fn of(bytes: &[u8]) -> Value {
        let mut inline = [0u8; INLINE];
        match inline.get_mut(..bytes.len()) {
            Some(to) => {
                to.copy_from_slice(bytes);
                Value::Inline(bytes.len() as u8, inline)
            }
            None => Value::Long(bytes.to_vec()),
        }
    }
}

impl std::ops::Deref for Value {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Value::Inline(n, bytes) => &bytes[..*n as usize],
            Value::Long(bytes) => bytes,
        }
    }
}

/// One attribute's value, or `None` if absent.
fn get(file: &File, name: &str) -> io::Result<Option<Value>> {
    let mut buf = [0u8; tag::MAX_TAG_LEN + 1];
    match fgetxattr(file, name, &mut buf[..]) {
        Ok(n) => Ok(Some(Value::of(&buf[..n]))),
        Err(rustix::io::Errno::NODATA) => Ok(None),
        // Longer than any tag: read whole (rare), for the parsers to say what it is.
        Err(rustix::io::Errno::RANGE) => Ok(get_whole(file, name, 2 * buf.len())?.map(Value::Long)),
        Err(e) => Err(e.into()),
    }
}

/// Writes intact's tag in one `fsetxattr`: the value is replaced whole or not at all.
pub fn write_intact(file: &File, value: &[u8]) -> io::Result<()> {
    rustix::fs::fsetxattr(file, names::INTACT, value, XattrFlags::empty())?;
    Ok(())
}

/// Marks a file that a repair is about to rewrite in place (see [`Stored::repairing`]).
pub fn mark_repairing(file: &File) -> io::Result<()> {
    let value = format!("rewriting in place (pid {})", std::process::id());
    rustix::fs::fsetxattr(
        file,
        names::REPAIRING,
        value.as_bytes(),
        XattrFlags::empty(),
    )?;
    Ok(())
}

/// Removes a damage mark (see [`Stored::damage`]; older versions of intact wrote them);
/// `Ok(false)` if there was none.
pub fn unmark_damaged(file: &File) -> io::Result<bool> {
    remove(file, names::CORRUPT)
}

/// Removes the mark of [`mark_repairing`]; `Ok(false)` if there was none.
pub fn unmark_repairing(file: &File) -> io::Result<bool> {
    remove(file, names::REPAIRING)
}

/// Marks a damaged copy that a repair keeps, saying what it is a copy of: no later run
/// verifies or tags it as if it were a good file.
pub fn mark_kept_damaged(file: &File, note: &str) -> io::Result<()> {
    rustix::fs::fsetxattr(
        file,
        names::KEPT_DAMAGED,
        note.as_bytes(),
        XattrFlags::empty(),
    )?;
    Ok(())
}

/// Removes intact's tag; `Ok(false)` if there was none.
pub fn remove_intact(file: &File) -> io::Result<bool> {
    remove(file, names::INTACT)
}

fn remove(file: &File, name: &str) -> io::Result<bool> {
    match rustix::fs::fremovexattr(file, name) {
        Ok(()) => Ok(true),
        Err(rustix::io::Errno::NODATA) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::tag::Timestamp;

    #[test]
    fn values_short_and_long_read_from_a_file_as_from_a_list() {
        let dir = tempfile::tempdir().unwrap();
        let digest = Digest {
            algo: Algo::Sha256,
            bytes: [7; 32],
        };
        let mtime = Timestamp {
            sec: 1_700_000_000,
            nsec: 5,
        };
        let tag = tag::encode(&digest, 5, mtime, 1_700_000_001);
        let mut long_garbage = vec![b'x'; INLINE + 1];
        long_garbage[..2].copy_from_slice(b"v=");
        let cases: [(&str, Vec<u8>); 4] = [
            ("tag", tag),
            ("inline garbage", b"v=1 nonsense".to_vec()),
            ("just longer than inline", long_garbage),
            ("longer than any tag", vec![b'v'; 3000]),
        ];
        for (what, value) in cases {
            let path = dir.path().join(what);
            std::fs::write(&path, b"data!").unwrap();
            let file = File::open(&path).unwrap();
            rustix::fs::fsetxattr(&file, names::INTACT, &value, XattrFlags::empty()).unwrap();
            let read = read(&file).unwrap();
            let listed = Stored::from_list(&[(names::INTACT.to_string(), value.clone())]);
            assert_eq!(read.tags, listed.tags, "{what}");
            assert_eq!(read.malformed, listed.malformed, "{what}");
            assert_eq!(read.tags.len() + read.malformed.len(), 1, "{what}");
        }
        let path = dir.path().join("longer than any tag");
        let stored = read(&File::open(path).unwrap()).unwrap();
        assert!(
            stored.malformed[0].1.0.contains("3000 bytes long"),
            "{:?}",
            stored.malformed
        );
    }
}
