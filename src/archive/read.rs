//! Reading an archive: member by member, frames apart on several threads, each frame to its
//! end (so zstd's checksums are checked), resuming at the next intact frame after damage.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, BufReader, Read};
use std::ops::ControlFlow;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use super::{Chunk, DAMAGED_MARK, FRAME_MARK, Kind, MAX_EXTENSION, Member};
use crate::core::classify::Status;
use crate::core::digest::Hasher;
use crate::core::pax::{MapParser, decode_key, parse_pax, parse_pax_time};
use crate::core::tag::Timestamp;
use crate::engine::FileReport;

/// Where reading an archive failed.
#[derive(Debug, thiserror::Error)]
#[error("{}{error}", member.as_ref().map_or(String::new(), |m| format!("at member {}: ", crate::text::escape(Path::new(OsStr::from_bytes(m))))))]
pub struct ReadError {
    /// The member being read, if any.
    pub member: Option<Vec<u8>>,
    /// Whether the archive itself is damaged (rather than unreadable: missing, no access).
    pub damaged: bool,
    /// What went wrong: the zstd frame or tar structure is damaged, or I/O failed.
    pub error: io::Error,
}

/// A member being visited: its metadata, and its data for the taking.
pub struct Visit<'a, 'r> {
    /// The member's metadata.
    pub member: &'a Member,
    entry: &'a mut tar::Entry<'r, Stream>,
    read: bool,
}

impl Visit<'_, '_> {
    /// Streams the member's data to `out` in order, holes as [`Chunk::Hole`].
    pub fn data(&mut self, mut out: impl FnMut(Chunk<'_>) -> io::Result<()>) -> io::Result<()> {
        assert!(!self.read, "a member's data is read once");
        self.read = true;
        // No larger than the member: zeroing 1 MiB for each small member of an archive
        // would cost more than reading it.
        let mut buf = vec![0u8; self.member.size.clamp(1, 1 << 20) as usize];
        let mut at = 0;
        let runs = match &self.member.sparse {
            Some(runs) => runs.clone(),
            None => vec![(0, self.member.size)],
        };
        for (offset, len) in runs {
            if offset > at {
                out(Chunk::Hole(offset - at))?;
            }
            let mut left = len;
            while left > 0 {
                let want = left.min(buf.len() as u64) as usize;
                self.entry.read_exact(&mut buf[..want])?;
                out(Chunk::Data(&buf[..want]))?;
                left -= want as u64;
            }
            at = offset + len;
        }
        if self.member.size > at {
            out(Chunk::Hole(self.member.size - at))?;
        }
        Ok(())
    }
}

/// The decompressed stream of an archive from some frame on.
type Stream = zstd::stream::read::Decoder<'static, BufReader<io::Take<File>>>;

/// Bytes of compressed input read ahead of the decompressor.
const READ_AHEAD: usize = 128 << 10;

/// The archive's tar stream from the frame at compressed offset `at`, through at most `len`
/// compressed bytes.
fn open_at(path: &Path, at: u64, len: u64) -> io::Result<tar::Archive<Stream>> {
    use std::io::Seek;
    let mut file = File::open(path)?;
    file.seek(io::SeekFrom::Start(at))?;
    let file = file.take(len);
    let reader = BufReader::with_capacity(READ_AHEAD, file);
    Ok(tar::Archive::new(zstd::stream::read::Decoder::with_buffer(
        reader,
    )?))
}

/// Checks that `path` is a zstd stream at all.
fn check_magic(path: &Path) -> io::Result<()> {
    let mut magic = [0u8; 4];
    let n = File::open(path)?.read(&mut magic)?;
    if n < 4 || magic != ZSTD_MAGIC {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not a zstd-compressed archive (intact archives are .tar.zst)",
        ));
    }
    Ok(())
}

const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

/// Visits each member of the archive at `path`, its frames read apart by `threads` threads:
/// `map` turns each member into a value on the thread reading its frame (it may read the
/// member's data), and `each` takes the values on the calling thread, in archive order, until
/// it breaks. Member names are data, never paths to write to. Frames are found by walking
/// their block headers; damage ends the frame it is in (its remaining members are lost), and
/// where a frame's headers do not lead to the next frame, the next intact one is searched
/// for. Each frame is read to its end, so that zstd's checksum of every frame is verified;
/// the first damage met is returned at the end.
pub fn read<T: Send>(
    path: &Path,
    threads: usize,
    map: impl Fn(&mut Visit<'_, '_>) -> T + Sync,
    mut each: impl FnMut(T) -> ControlFlow<()>,
) -> Result<(), ReadError> {
    let unreadable = |error| ReadError {
        member: None,
        damaged: false,
        error,
    };
    check_magic(path).map_err(unreadable)?;
    let file = File::open(path).map_err(unreadable)?;
    let size = file.metadata().map_err(unreadable)?.len();
    let threads = threads.max(1);
    let stop = &AtomicBool::new(false);
    let map = &map;
    type Frame<T> = crossbeam_channel::Receiver<Result<Vec<T>, ReadError>>;
    std::thread::scope(|s| {
        let (jobs, job_rx) = crossbeam_channel::bounded(threads);
        let (order, frames) = crossbeam_channel::bounded::<Frame<T>>(2 * threads);
        s.spawn(move || {
            let mut at = Some(0);
            while let Some(start) = at.filter(|_| !stop.load(Ordering::Relaxed)) {
                // A part ends where one of intact's frames starts: frames that do not open
                // with its global header (an archive compressed by another tool in several
                // frames, cut anywhere) are read with the frames before them.
                let mut end = start;
                let next = loop {
                    match frame_end(&file, end, size) {
                        Some(e) if e == size => {
                            end = e;
                            break None;
                        }
                        Some(e) => {
                            end = e;
                            if frame_at(path, e).is_some() {
                                break Some(e);
                            }
                        }
                        None => {
                            let next = next_frame(path, end + 1);
                            end = next.unwrap_or(size);
                            break next;
                        }
                    }
                };
                // Values of members not yet taken: bounds memory on frames of tiny files.
                let (tx, rx) = crossbeam_channel::bounded(LOOKAHEAD);
                if order.send(rx).is_err() || jobs.send(((start, end - start), tx)).is_err() {
                    break;
                }
                at = next;
            }
        });
        for _ in 0..threads {
            let job_rx = job_rx.clone();
            s.spawn(move || {
                for (range, tx) in job_rx {
                    if stop.load(Ordering::Relaxed) {
                        continue;
                    }
                    // Values go in batches: one hand-over per tiny member cost more than
                    // reading it.
                    let tx: crossbeam_channel::Sender<Result<Vec<T>, ReadError>> = tx;
                    let mut batch = Vec::with_capacity(BATCH);
                    let read = read_from(path, range, &mut |mut visit| {
                        batch.push(map(&mut visit));
                        if batch.len() < BATCH {
                            return ControlFlow::Continue(());
                        }
                        match tx.send(Ok(std::mem::take(&mut batch))) {
                            Ok(()) => ControlFlow::Continue(()),
                            Err(_) => ControlFlow::Break(()),
                        }
                    });
                    let _ = tx.send(Ok(batch));
                    if let Err(broken) = read {
                        let _ = tx.send(Err(broken));
                    }
                }
            });
        }
        drop(job_rx);
        let mut first_damage = None;
        'frames: for frame in &frames {
            for values in &frame {
                match values {
                    Ok(values) => {
                        for value in values {
                            if each(value).is_break() {
                                break 'frames;
                            }
                        }
                    }
                    Err(broken) => {
                        first_damage.get_or_insert(broken);
                    }
                }
            }
        }
        // Winds down the threads: queued frames are skipped, and dropping the last receiver
        // of frames drops those not taken (crossbeam discards a disconnected channel's
        // messages), which fails their threads' next send: a thread waiting for room in a
        // frame never taken does not wait forever (test `a_repair_done_early_...`).
        stop.store(true, Ordering::Relaxed);
        drop(frames);
        first_damage.map_or(Ok(()), Err)
    })
}

/// Batches of values of one frame's members a thread may hold before they are taken in
/// order, and values a batch.
const LOOKAHEAD: usize = 16;
const BATCH: usize = 256;

/// Where the zstd frame at `at` ends, found by walking its header and block headers; `None`
/// if they do not lead to the end of the file or to the start of another frame (damage).
fn frame_end(file: &File, at: u64, size: u64) -> Option<u64> {
    use std::os::unix::fs::FileExt;
    let byte = |at: u64| {
        let mut b = [0u8; 1];
        file.read_exact_at(&mut b, at).ok().map(|()| b[0])
    };
    let mut magic = [0u8; 4];
    file.read_exact_at(&mut magic, at).ok()?;
    if magic != ZSTD_MAGIC {
        return None;
    }
    // Frame header descriptor: content size field, single segment, checksum, dictionary ID.
    let fhd = byte(at + 4)?;
    let single = fhd & 0x20 != 0;
    let fcs = match fhd >> 6 {
        0 => u64::from(single),
        1 => 2,
        2 => 4,
        _ => 8,
    };
    let dict = [0, 1, 2, 4][(fhd & 3) as usize];
    let mut pos = at + 5 + u64::from(!single) + dict + fcs;
    loop {
        let mut h = [0u8; 3];
        file.read_exact_at(&mut h, pos).ok()?;
        let h = u32::from_le_bytes([h[0], h[1], h[2], 0]);
        let len = u64::from(h >> 3);
        pos += 3 + match (h >> 1) & 3 {
            0 | 2 => len,
            1 => 1,
            _ => return None,
        };
        if pos > size {
            return None;
        }
        if h & 1 == 1 {
            break;
        }
    }
    if fhd & 0x04 != 0 {
        pos += 4;
    }
    let mut next = [0u8; 4];
    match pos {
        p if p == size => Some(p),
        p if p < size && file.read_exact_at(&mut next, p).is_ok() && next == ZSTD_MAGIC => Some(p),
        _ => None,
    }
}

/// Reads members from the frame at `at` through `len` compressed bytes (or until `visit`
/// breaks).
fn read_from(
    path: &Path,
    (at, len): (u64, u64),
    visit: &mut impl FnMut(Visit<'_, '_>) -> ControlFlow<()>,
) -> Result<(), ReadError> {
    let mut archive = open_at(path, at, len).map_err(|error| ReadError {
        member: None,
        damaged: true,
        error,
    })?;
    let mut stopped = false;
    let mut member_name: Option<Vec<u8>> = None;
    let result = (|| -> io::Result<()> {
        // Raw entries: tar-rs splits PAX records at newlines, which names and binary xattr
        // values may contain, so the extended headers are parsed here, by their lengths.
        let entries = archive.entries()?.raw(true);
        let mut pax: Option<Vec<u8>> = None;
        let mut long_name: Option<Vec<u8>> = None;
        let mut long_link: Option<Vec<u8>> = None;
        for entry in entries {
            let mut entry = entry?;
            let kind = entry.header().entry_type();
            let slot = match kind {
                tar::EntryType::XHeader | tar::EntryType::XGlobalHeader => &mut pax,
                tar::EntryType::GNULongName => &mut long_name,
                tar::EntryType::GNULongLink => &mut long_link,
                _ => {
                    let member = member(
                        &mut entry,
                        pax.take().as_deref(),
                        long_name.take(),
                        long_link.take(),
                    )?;
                    member_name = Some(member.name.clone());
                    let flow = visit(Visit {
                        member: &member,
                        entry: &mut entry,
                        read: false,
                    });
                    // Reading on to the next member needs the data consumed; a broken stream
                    // shows here if the visitor did not read it.
                    io::copy(&mut entry, &mut io::sink())?;
                    member_name = None;
                    if flow.is_break() {
                        stopped = true;
                        break;
                    }
                    continue;
                }
            };
            if entry.size() > MAX_EXTENSION {
                return Err(malformed("extended header too large"));
            }
            let mut data = Vec::with_capacity(entry.size() as usize);
            entry.read_to_end(&mut data)?;
            if kind == tar::EntryType::XGlobalHeader {
                continue;
            }
            if kind != tar::EntryType::XHeader {
                // GNU long names end in a NUL.
                while data.last() == Some(&0) {
                    data.pop();
                }
            }
            *slot = Some(data);
        }
        Ok(())
    })();
    let mut stream = archive.into_inner();
    let result = result.and_then(|()| {
        if stopped {
            return Ok(());
        }
        io::copy(&mut stream, &mut io::sink()).map(drop)
    });
    result.map_err(|error| ReadError {
        member: member_name,
        damaged: true,
        error,
    })
}

/// The frame number a global header announces, if it is one of ours.
fn frame_number(records: &[u8]) -> Option<u64> {
    parse_pax(records).ok()?.into_iter().find_map(|(k, v)| {
        let v = std::str::from_utf8(v).ok()?;
        (k == b"comment").then(|| v.strip_prefix(FRAME_MARK)?.parse().ok())?
    })
}

/// The offset, at or after `from`, of the first frame that starts a numbered part of the
/// archive: a zstd magic whose stream opens with our global header.
fn next_frame(path: &Path, from: u64) -> Option<u64> {
    use std::io::Seek;
    let mut file = File::open(path).ok()?;
    file.seek(io::SeekFrom::Start(from)).ok()?;
    let mut reader = BufReader::with_capacity(1 << 20, file);
    let mut offset = from;
    let mut window = [0u8; 4];
    let mut filled = 0;
    let mut byte = [0u8; 1];
    while reader.read_exact(&mut byte).is_ok() {
        window.rotate_left(1);
        window[3] = byte[0];
        filled += 1;
        offset += 1;
        if filled >= 4 && window == ZSTD_MAGIC {
            let start = offset - 4;
            if frame_at(path, start).is_some() {
                return Some(start);
            }
        }
    }
    None
}

/// The number of the frame at `at`, if a frame of ours starts there.
fn frame_at(path: &Path, at: u64) -> Option<u64> {
    let mut archive = open_at(path, at, u64::MAX).ok()?;
    let mut entries = archive.entries().ok()?.raw(true);
    let mut entry = entries.next()?.ok()?;
    if entry.header().entry_type() != tar::EntryType::XGlobalHeader || entry.size() > 4096 {
        return None;
    }
    let mut data = Vec::new();
    entry.read_to_end(&mut data).ok()?;
    frame_number(&data)
}

/// The metadata of the entry at hand, with the extended header records that preceded it;
/// for a GNU 1.0 sparse file, its map is read off the front of the data.
fn member<R: Read>(
    entry: &mut tar::Entry<'_, R>,
    pax: Option<&[u8]>,
    long_name: Option<Vec<u8>>,
    long_link: Option<Vec<u8>>,
) -> io::Result<Member> {
    let header = entry.header();
    let link = || {
        long_link
            .clone()
            .or_else(|| header.link_name_bytes().map(|n| n.into_owned()))
            .unwrap_or_default()
    };
    let kind = match header.entry_type() {
        tar::EntryType::Regular | tar::EntryType::Continuous => Kind::File,
        tar::EntryType::Link => Kind::Link(link()),
        tar::EntryType::Symlink => Kind::Symlink(link()),
        _ => Kind::Other,
    };
    let mut m = Member {
        name: long_name.unwrap_or_else(|| header.path_bytes().into_owned()),
        kind,
        size: entry.size(),
        mode: header.mode().unwrap_or(0),
        uid: header.uid().unwrap_or(0),
        gid: header.gid().unwrap_or(0),
        mtime: Timestamp {
            sec: header.mtime().unwrap_or(0) as i64,
            nsec: 0,
        },
        xattrs: Vec::new(),
        damaged: None,
        sparse: None,
    };
    let mut sparse = (None, None, None);
    let records = parse_pax(pax.unwrap_or_default()).map_err(malformed)?;
    for (key, value) in records {
        let Ok(key) = std::str::from_utf8(key) else {
            continue;
        };
        let text = || std::str::from_utf8(value).ok();
        let number = || text().and_then(|t| t.parse::<u64>().ok());
        if let Some(attr) = key.strip_prefix("SCHILY.xattr.") {
            m.xattrs.push((decode_key(attr), value.to_vec()));
        }
        match key {
            "path" => m.name = value.to_vec(),
            "linkpath" => {
                if let Kind::Link(t) | Kind::Symlink(t) = &mut m.kind {
                    *t = value.to_vec();
                }
            }
            "uid" => m.uid = number().unwrap_or(m.uid),
            "gid" => m.gid = number().unwrap_or(m.gid),
            "mtime" => {
                if let Some(t) = text().and_then(parse_pax_time) {
                    m.mtime = t;
                }
            }
            "comment" => {
                if let Some(v) = text().and_then(|t| t.strip_prefix(DAMAGED_MARK)) {
                    m.damaged = Some(v.to_owned());
                }
            }
            "GNU.sparse.major" => sparse.0 = text().map(str::to_owned),
            "GNU.sparse.name" => sparse.1 = Some(value.to_vec()),
            "GNU.sparse.realsize" => sparse.2 = number(),
            _ => {}
        }
    }
    if let (Some(major), Some(name), Some(size)) = sparse {
        if major != "1" {
            return Err(malformed("unsupported GNU sparse format"));
        }
        let mut parser = MapParser::default();
        let mut map_len = 0usize;
        let runs = loop {
            let mut block = [0u8; 512];
            entry.read_exact(&mut block)?;
            map_len += block.len();
            match parser.feed(&block) {
                Ok(Some(runs)) => break runs,
                Ok(None) if map_len < MAX_SPARSE_MAP => {}
                Ok(None) => return Err(malformed("sparse map too large")),
                Err(why) => return Err(malformed(why)),
            }
        };
        let fits = runs
            .iter()
            .all(|&(o, l)| o.checked_add(l).is_some_and(|end| end <= size))
            && runs.windows(2).all(|w| w[0].0 + w[0].1 <= w[1].0);
        // Runs inside the file that do not overlap cannot sum past its size.
        if !fits
            || Some(runs.iter().map(|r| r.1).sum::<u64>()) != m.size.checked_sub(map_len as u64)
        {
            return Err(malformed("sparse map does not fit the member"));
        }
        m.name = name;
        m.size = size;
        m.sparse = Some(runs);
    }
    Ok(m)
}

/// Upper bound on a sparse map's text.
const MAX_SPARSE_MAP: usize = 40 << 20;

fn malformed(why: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why.to_owned())
}

/// What `verify` found in one member: a report as `check` would give for a file.
pub fn verify_member(visit: &mut Visit<'_, '_>) -> FileReport {
    let m = visit.member;
    let stored = m.stored();
    let mut report = FileReport::new(m.path(), Status::New);
    report.size = Some(m.size);
    report.malformed = stored.malformed.clone();
    match &m.kind {
        Kind::File => {}
        Kind::Link(to) | Kind::Symlink(to) => {
            report.status = Status::Skipped;
            let what = if matches!(m.kind, Kind::Link(_)) {
                "hard link"
            } else {
                "symbolic link"
            };
            let to = crate::text::escape(Path::new(OsStr::from_bytes(to)));
            report.detail = Some(format!("{what} to {to}"));
            return report;
        }
        Kind::Other => {
            report.status = Status::Skipped;
            return report;
        }
    }
    let Some(tag) = stored.best().cloned() else {
        report.detail = Some("archived without a tag: nothing to verify it against".into());
        return report;
    };
    if tag.size.is_some_and(|s| s != m.size) {
        report.status = Status::Corrupt;
        report.detail = Some("its size differs from the size in its tag".into());
        report.tag = Some(tag);
        return report;
    }
    let mut hasher = Hasher::new(tag.digest.algo);
    let mut bytes = 0;
    let read = visit.data(|chunk| {
        match chunk {
            Chunk::Data(d) => {
                hasher.update(d);
                bytes += d.len() as u64;
            }
            // Holes count as data read, as when the engine reads a sparse file.
            Chunk::Hole(n) => {
                hasher.update_zeros(n);
                bytes += n;
            }
        }
        Ok(())
    });
    report.bytes_read = bytes;
    if let Err(e) = read {
        report.status = Status::Corrupt;
        report.detail = Some(format!("the archive is damaged here: {e}"));
        report.tag = Some(tag);
        return report;
    }
    let digest = hasher.finalize();
    report.status = if digest == tag.digest && tag.size.is_none_or(|s| s == m.size) {
        Status::Ok
    } else {
        Status::Corrupt
    };
    if let Some(verdict) = &m.damaged {
        report.detail = Some(format!("archived although found {verdict}"));
    }
    report.digest = Some(digest);
    report.tag = Some(tag);
    report
}
