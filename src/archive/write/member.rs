//! One archive member: its PAX header (name, times, xattrs with the tag, sparse map) and its
//! data, copied from the very bytes that are hashed.

use std::fs::File;
use std::io::{self, Write};

use super::super::{DAMAGED_MARK, Stats};
use crate::core::classify::Status;
use crate::core::digest::{Digest, Hasher};
use crate::core::pax::{Pax, sparse_map};
use crate::core::tag::{self, Timestamp, names};
use crate::fs::walk::Stat;
use crate::fs::xattr::Attrs;

/// The member's attributes: the file's own, with intact's tag kept only if it describes the
/// data archived (a stale or malformed one would make a good copy look damaged). A file
/// archived as damaged keeps its tag: the evidence of what it should be.
pub(super) fn member_attrs(
    mut attrs: Attrs,
    digest: Option<&Digest>,
    size: u64,
    damaged: bool,
) -> Attrs {
    if !damaged {
        attrs.retain(|(name, value)| {
            name != names::INTACT
                || tag::parse_intact(value)
                    .is_ok_and(|t| Some(&t.digest) == digest && t.size == Some(size))
        });
    }
    attrs
}

/// The file's data as (offset, length) runs: one run covering it all, or, for a file with
/// holes, only the runs with data (found with SEEK_DATA/SEEK_HOLE).
pub(super) fn data_segments(file: &File, stat: &Stat) -> Vec<(u64, u64)> {
    let size = stat.size;
    let whole = vec![(0, size)];
    if size == 0 || stat.blocks * 512 >= size {
        return whole;
    }
    let mut segments = Vec::new();
    let mut offset = 0;
    while offset < size {
        let start = match rustix::fs::seek(file, rustix::fs::SeekFrom::Data(offset)) {
            Ok(start) => start,
            Err(rustix::io::Errno::NXIO) => break,
            Err(_) => return whole,
        };
        if start >= size {
            break;
        }
        let end = match rustix::fs::seek(file, rustix::fs::SeekFrom::Hole(start)) {
            Ok(end) => end.min(size),
            Err(_) => return whole,
        };
        segments.push((start, end - start));
        offset = end;
    }
    if segments.len() == 1 && segments[0] == (0, size) {
        return whole;
    }
    segments
}

/// The header name GNU tar gives a sparse member (the real name is in `GNU.sparse.name`), so
/// a tar that does not know the format extracts the raw data somewhere harmless.
pub(super) fn sparse_header_name(name: &[u8]) -> Vec<u8> {
    let (dir, base) = match name.iter().rposition(|&b| b == b'/') {
        Some(i) => (&name[..=i], &name[i + 1..]),
        None => (&b""[..], name),
    };
    [dir, b"GNUSparseFile.0/", base].concat()
}

/// The ustar name field: the name if it fits, else a prefix of it (the PAX record holds the
/// real name; readers that know PAX ignore this one).
pub(super) fn set_name(header: &mut tar::Header, name: &[u8]) {
    let field = &mut header.as_old_mut().name;
    let n = name.len().min(field.len());
    field[..n].copy_from_slice(&name[..n]);
}

/// What goes before a regular file's data: its PAX records, its ustar header, and for a
/// file with holes the sparse map; and the length of what follows the header.
pub(super) struct FileHead {
    pub(super) pax: Pax,
    pub(super) header: tar::Header,
    pub(super) map: Option<Vec<u8>>,
    pub(super) body: u64,
}

impl FileHead {
    /// The head of the member `name` for a file of `stat` whose data lies in `segments`,
    /// with `attrs`, marked with its `damage` if it has some.
    pub(super) fn new(
        name: &[u8],
        stat: &Stat,
        segments: &[(u64, u64)],
        attrs: &Attrs,
        damage: Option<Status>,
    ) -> FileHead {
        let mut pax = Pax::default();
        let mut header = tar::Header::new_ustar();
        set_meta(&mut header, &mut pax, stat);
        let data_len: u64 = segments.iter().map(|s| s.1).sum();
        let map = match segments {
            [(0, len)] if *len == stat.size => None,
            _ => Some(sparse_map(segments, stat.size)),
        };
        let body = match &map {
            Some(map) => {
                pax.add("GNU.sparse.major", b"1");
                pax.add("GNU.sparse.minor", b"0");
                pax.add("GNU.sparse.name", name);
                pax.add("GNU.sparse.realsize", stat.size.to_string().as_bytes());
                set_name(&mut header, &sparse_header_name(name));
                map.len() as u64 + data_len
            }
            None => {
                pax.add("path", name);
                set_name(&mut header, name);
                data_len
            }
        };
        if let Some(status) = damage {
            let mark = format!("{DAMAGED_MARK}{}", status.name());
            pax.add("comment", mark.as_bytes());
        }
        for (attr, value) in attrs {
            pax.add_xattr(attr, value);
        }
        set_size(&mut header, &mut pax, body);
        header.set_entry_type(tar::EntryType::Regular);
        header.set_cksum();
        FileHead {
            pax,
            header,
            map,
            body,
        }
    }

    pub(super) fn write(&self, out: &mut impl Write) -> io::Result<()> {
        write_pax(out, &self.pax, tar::EntryType::XHeader)?;
        out.write_all(self.header.as_bytes())?;
        if let Some(map) = &self.map {
            out.write_all(map)?;
        }
        Ok(())
    }
}

/// What a member's header says of the file besides its name and size.
pub(super) struct MemberMeta {
    pub(super) mode: u32,
    pub(super) uid: u32,
    pub(super) gid: u32,
    pub(super) mtime: Timestamp,
}

impl From<&Stat> for MemberMeta {
    fn from(st: &Stat) -> Self {
        MemberMeta {
            mode: st.mode,
            uid: st.uid,
            gid: st.gid,
            mtime: st.mtime,
        }
    }
}

#[allow(clippy::unnecessary_cast)]
impl From<&rustix::fs::Stat> for MemberMeta {
    fn from(st: &rustix::fs::Stat) -> Self {
        MemberMeta {
            mode: st.st_mode as u32,
            uid: st.st_uid,
            gid: st.st_gid,
            mtime: Timestamp {
                sec: st.st_mtime as i64,
                nsec: st.st_mtime_nsec as u32,
            },
        }
    }
}

pub(super) fn set_meta(header: &mut tar::Header, pax: &mut Pax, meta: impl Into<MemberMeta>) {
    let meta = meta.into();
    header.set_mode(meta.mode & 0o7777);
    header.set_uid(meta.uid.into());
    header.set_gid(meta.gid.into());
    header.set_mtime(meta.mtime.sec.max(0) as u64);
    pax.add_time("mtime", meta.mtime);
}

/// Sizes past the ustar field's 8 GiB go in a PAX record too.
pub(super) fn set_size(header: &mut tar::Header, pax: &mut Pax, size: u64) {
    header.set_size(size);
    if size >= 1 << 33 {
        pax.add("size", size.to_string().as_bytes());
    }
}

/// Zeros up to the next block boundary.
pub(super) fn pad(out: &mut impl Write, len: u64) -> io::Result<()> {
    let rem = (len % 512) as usize;
    if rem > 0 {
        out.write_all(&[0u8; 512][..512 - rem])?;
    }
    Ok(())
}

/// Where the archive stood before a member written speculatively.
#[derive(Clone, Copy)]
pub(super) struct Mark {
    /// The end of the last frame in the file.
    pub(super) at: u64,
    /// The number of the frame begun there.
    pub(super) frame: u64,
    pub(super) stats: Stats,
}

/// Fills `buf` from the start of `file`; a file that ended first is filled with zeros (its
/// size, checked after, tells the change).
pub(super) fn read_whole(file: &File, buf: &mut [u8]) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], done as u64) {
            Ok(0) => {
                buf[done..].fill(0);
                break;
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Whether `file` is still as `before` said: same size, mtime and ctime (which no program
/// can set back).
pub(super) fn untouched(file: &File, before: &Stat) -> bool {
    Stat::of(file).is_ok_and(|(now, _)| now.changes_since(before, before.size).is_none())
}

/// What copying a file's data found.
pub(super) struct Copied {
    pub(super) digest: Option<Digest>,
    pub(super) error: io::Result<()>,
}

/// Writes exactly the bytes of `segments` to `out` (the member's size is already in its
/// header, so a file that shrank is padded with zeros and one that grew is cut), feeding
/// `hasher` the whole logical file, holes as zeros. A read error ends the copy with zeros
/// too: the archive stays well-formed, and the member fails verify.
pub(super) fn copy_data(
    file: &File,
    segments: &[(u64, u64)],
    size: u64,
    mut hasher: Option<Hasher>,
    buf: &mut [u8],
    out: &mut impl Write,
) -> io::Result<Copied> {
    use std::os::unix::fs::FileExt;
    if size > buf.len() as u64 {
        crate::fs::sys::advise_sequential(file);
    }
    let mut error = Ok(());
    let mut at = 0;
    for &(offset, len) in segments {
        if let Some(h) = hasher.as_mut() {
            h.update_zeros(offset - at);
        }
        let mut done = 0;
        while done < len {
            let want = (len - done).min(buf.len() as u64) as usize;
            let n = if error.is_ok() {
                match file.read_at(&mut buf[..want], offset + done) {
                    Ok(0) => {
                        error = Err(io::Error::from(io::ErrorKind::UnexpectedEof));
                        0
                    }
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        error = Err(e);
                        0
                    }
                }
            } else {
                0
            };
            let n = if n == 0 {
                buf[..want].fill(0);
                want
            } else {
                n
            };
            if let Some(h) = hasher.as_mut() {
                h.update(&buf[..n]);
            }
            out.write_all(&buf[..n])?;
            done += n as u64;
        }
        at = offset + len;
    }
    if let Some(h) = hasher.as_mut() {
        h.update_zeros(size - at);
    }
    // A short file is a change, reported by the caller from its size; not a read error.
    if let Err(e) = &error
        && e.kind() == io::ErrorKind::UnexpectedEof
    {
        error = Ok(());
    }
    Ok(Copied {
        digest: hasher.map(Hasher::finalize),
        error,
    })
}

/// Writes `pax` as an extended header of `kind` (`x` for the next member, `g` for all that
/// follow); nothing if it holds no records.
pub(super) fn write_pax(out: &mut impl Write, pax: &Pax, kind: tar::EntryType) -> io::Result<()> {
    let records = pax.bytes();
    if records.is_empty() {
        return Ok(());
    }
    let mut header = tar::Header::new_ustar();
    set_name(&mut header, b"././@PaxHeader");
    header.set_mode(0o644);
    header.set_size(records.len() as u64);
    header.set_entry_type(kind);
    header.set_cksum();
    out.write_all(header.as_bytes())?;
    out.write_all(records)?;
    pad(out, records.len() as u64)
}
