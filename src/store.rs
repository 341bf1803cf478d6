//! The tag store: reading every known tag from an open file and writing intact's own.
//!
//! All calls go through the file descriptor, never the path, so a file renamed or replaced
//! by a symlink mid-run cannot redirect a write.

use std::fs::File;
use std::io;

use rustix::fs::{XattrFlags, fgetxattr, fgetxattr_query, flistxattr, flistxattr_query};

use crate::tag::{self, Malformed, Tag, names};

/// Every tag found on one file.
#[derive(Clone, Debug, Default)]
pub struct Stored {
    /// The valid tags, richest format first.
    pub tags: Vec<Tag>,
    /// Attributes that hold something intact cannot use, with the reason.
    pub malformed: Vec<(&'static str, Malformed)>,
}

impl Stored {
    /// The tag a check goes by: the richest valid one.
    pub fn best(&self) -> Option<&Tag> {
        self.tags.first()
    }

    /// intact's own tag, if present and valid.
    pub fn intact(&self) -> Option<&Tag> {
        self.tags.iter().find(|t| t.format == tag::Format::Intact)
    }
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
    let present = |name: &str| list.split(|&b| b == 0).any(|n| n == name.as_bytes());

    let mut stored = Stored::default();
    let mut keep = |attr: &'static str, parsed: Result<Tag, Malformed>| match parsed {
        Ok(t) => stored.tags.push(t),
        Err(m) => stored.malformed.push((attr, m)),
    };
    if present(names::INTACT) {
        keep(
            names::INTACT,
            get(file, names::INTACT)?
                .as_deref()
                .map_or_else(gone, tag::parse_intact),
        );
    }
    if present(names::SHATAG_SHA256) {
        let hash = get(file, names::SHATAG_SHA256)?;
        let ts = get(file, names::SHATAG_TS)?;
        keep(
            names::SHATAG_SHA256,
            hash.as_deref()
                .map_or_else(gone, |h| tag::parse_shatag(h, ts.as_deref())),
        );
    }
    for attr in [names::DINTCH_HASH, names::DINTCH_HASH_S] {
        if present(attr) {
            let hash = get(file, attr)?;
            let time = get(file, names::DINTCH_TIME)?;
            keep(
                attr,
                hash.as_deref()
                    .map_or_else(gone, |h| tag::parse_dintch(h, time.as_deref())),
            );
            break;
        }
    }
    stored.tags.sort_by_key(|t| t.format);
    Ok(stored)
}

fn gone() -> Result<Tag, Malformed> {
    Err(Malformed("removed while being read".into()))
}

/// One attribute's value, or `None` if absent. Values longer than any tag are cut to
/// [`tag::MAX_TAG_LEN`] + 1 bytes, which the parsers reject as too long.
fn get(file: &File, name: &str) -> io::Result<Option<Vec<u8>>> {
    let mut buf = [0u8; tag::MAX_TAG_LEN + 1];
    match fgetxattr(file, name, &mut buf[..]) {
        Ok(n) => Ok(Some(buf[..n].to_vec())),
        Err(rustix::io::Errno::NODATA) => Ok(None),
        Err(rustix::io::Errno::RANGE) => {
            let len = fgetxattr_query(file, name)?;
            Ok(Some(vec![b'?'; len.max(buf.len())]))
        }
        Err(e) => Err(e.into()),
    }
}

/// Writes intact's tag in one `fsetxattr`: the value is replaced whole or not at all.
pub fn write_intact(file: &File, value: &str) -> io::Result<()> {
    rustix::fs::fsetxattr(file, names::INTACT, value.as_bytes(), XattrFlags::empty())?;
    Ok(())
}

/// Removes intact's tag; `Ok(false)` if there was none.
pub fn remove_intact(file: &File) -> io::Result<bool> {
    match rustix::fs::fremovexattr(file, names::INTACT) {
        Ok(()) => Ok(true),
        Err(rustix::io::Errno::NODATA) => Ok(false),
        Err(e) => Err(e.into()),
    }
}
