//! Archives: redundant copies that carry their own digests.
//!
//! An archive is a plain PAX tar compressed with zstd, so stock tools restore it, tags and
//! all (`tar --xattrs --xattrs-include='*' -I zstd -xf`). Each member holds the file's mode,
//! owner, nanosecond mtime and user xattrs (`SCHILY.xattr.*`, the intact tag among them);
//! sparse files use GNU's sparse format 1.0, so they stay sparse in the archive and when
//! restored. Because every member carries its tag, a copy can be proven good on its own:
//! `archive verify` re-hashes each member against the tag it carries, and `repair` uses a
//! member only once its bytes hash to the damaged file's tag.
//!
//! Writing takes the engine's verdicts: a file goes in only if it was just proven to match
//! its tag (or was tagged just now), and its bytes are hashed again on their way into the
//! archive, so a file that changed between the two reads is caught and reported.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::ops::ControlFlow;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::core::classify::Status;
use crate::core::digest::{Digest, Hasher};
use crate::core::tag::{self, Timestamp, names};
use crate::engine::{Action, FileError, FileReport};
use crate::fs::anchor::Anchor;
use crate::fs::atomic::Temp;
use crate::fs::read::AlignedBuf;
use crate::fs::walk::SkipReason;
use crate::fs::xattr::{self, Stored};

/// How to write an archive.
#[derive(Clone, Debug)]
pub struct Options {
    /// zstd compression level (1–22).
    pub level: i32,
    /// zstd worker threads (0: compress on the calling thread).
    pub threads: u32,
    /// Archive files found damaged too, marked as such, instead of leaving them out.
    pub include_damaged: bool,
}

/// What went into an archive.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    /// Members written.
    pub members: u64,
    /// Bytes of file data archived.
    pub bytes: u64,
    /// Size of the compressed archive.
    pub compressed: u64,
}

/// The PAX `comment` a member archived in spite of a damage verdict carries (tar ignores
/// comments silently; `archive verify` and `repair` read it).
const DAMAGED_MARK: &str = "intact: archived although found ";

/// An archive being written: to a temp file beside the destination, renamed over it by
/// [`Writer::finish`]; dropped unfinished, it leaves nothing behind.
pub struct Writer {
    /// Small writes (headers, small files) are gathered before they reach zstd, whose
    /// multi-threaded streaming takes locks on every call.
    out: Option<BufWriter<FrameEncoder<BufWriter<File>>>>,
    temp: Option<Temp>,
    dest: PathBuf,
    roots: Vec<(PathBuf, Vec<u8>)>,
    anchors: Vec<Anchor>,
    /// Inodes with several links already archived, and the member name they went in under.
    links: HashMap<(u64, u64), Vec<u8>>,
    buf: AlignedBuf,
    opts: Options,
    /// The zstd frame being written, and the file data in it so far.
    frame: u64,
    frame_bytes: u64,
    /// Running totals.
    pub stats: Stats,
    /// Temp files that killed runs had left beside the archive, removed.
    pub removed: Vec<PathBuf>,
}

/// A new zstd frame starts at the first member boundary past this much data: damage to the
/// archive then costs the members of one frame, and reading resumes at the next.
pub const FRAME_BYTES: u64 = 64 << 20;

/// The PAX comment that opens each frame with its number (in a global header, which tar
/// ignores), so that reading can resume after damage without visiting a member twice.
const FRAME_MARK: &str = "intact frame ";

impl Writer {
    /// Starts an archive at `dest` for files found under `roots`. Members are named as
    /// `tar -C <parent of root> <root name>` would name them.
    pub fn create(dest: &Path, roots: &[PathBuf], opts: Options) -> io::Result<Writer> {
        if dest.file_name().is_none() {
            return Err(io::Error::other("the archive needs a file name"));
        }
        let removed = crate::fs::atomic::remove_stale(crate::fs::atomic::parent(dest));
        let temp = Temp::beside(dest)?;
        let file = temp.file().try_clone()?;
        let mut writer = Writer {
            out: None,
            temp: Some(temp),
            dest: dest.to_path_buf(),
            roots: roots.iter().map(|r| (r.clone(), root_name(r))).collect(),
            anchors: roots.iter().map(|r| Anchor::new(r)).collect(),
            links: HashMap::new(),
            buf: AlignedBuf::new(crate::fs::read::BUF_SIZE),
            opts,
            frame: 0,
            frame_bytes: 0,
            stats: Stats::default(),
            removed,
        };
        let enc = FrameEncoder::new(
            BufWriter::with_capacity(1 << 20, file),
            writer.opts.level,
            writer.opts.threads,
        )?;
        writer.out = Some(BufWriter::with_capacity(1 << 20, enc));
        writer.start_frame()?;
        Ok(writer)
    }

    /// Writes the numbered global header that opens a frame.
    fn start_frame(&mut self) -> io::Result<()> {
        let mut pax = Pax::default();
        pax.add("comment", format!("{FRAME_MARK}{}", self.frame).as_bytes());
        let out = self.out.as_mut().expect("open until finished");
        pax.write_as(out, tar::EntryType::XGlobalHeader)?;
        self.frame_bytes = 0;
        Ok(())
    }

    /// Ends the frame and starts the next, once the frame holds enough.
    fn next_frame_if_full(&mut self) -> io::Result<()> {
        if self.frame_bytes < FRAME_BYTES {
            return Ok(());
        }
        let out = self.out.as_mut().expect("open until finished");
        out.flush()?;
        out.get_mut().end_frame()?;
        self.frame += 1;
        self.start_frame()
    }

    /// Archives the file `report` is about, if its verdict allows, noting in the report what
    /// was done. An `Err` is a failure to write the archive itself, which ends the run.
    pub fn add(&mut self, report: &mut FileReport) -> io::Result<()> {
        self.next_frame_if_full()?;
        let Some(root) = self
            .roots
            .iter()
            .position(|(r, _)| report.path.starts_with(r))
        else {
            return Ok(());
        };
        let name = self.member_name(root, &report.path);
        match report.status {
            Status::Skipped => match report.skip {
                Some(SkipReason::Symlink) => self.add_symlink(report, root, &name),
                Some(SkipReason::HardLink) => self.add_hard_link(report, root, &name),
                _ => Ok(()),
            },
            Status::Error | Status::Changed | Status::Missing => Ok(()),
            s if s.is_damage() && !self.opts.include_damaged => {
                report.detail = Some(format!(
                    "not archived: its data no longer matches its tag{}",
                    report
                        .detail
                        .as_ref()
                        .map_or(String::new(), |d| format!(" ({d})"))
                ));
                Ok(())
            }
            _ => self.add_file(report, root, &name),
        }
    }

    fn member_name(&self, root: usize, path: &Path) -> Vec<u8> {
        let (root_path, prefix) = &self.roots[root];
        let rel = path.strip_prefix(root_path).unwrap_or(path);
        let mut name = prefix.clone();
        for part in rel.components() {
            if !name.is_empty() {
                name.push(b'/');
            }
            name.extend_from_slice(part.as_os_str().as_bytes());
        }
        name
    }

    fn add_file(&mut self, report: &mut FileReport, root: usize, name: &[u8]) -> io::Result<()> {
        let file = match self.anchors[root].open(&report.path, false) {
            Ok(f) => f,
            Err(e) => {
                report.fail(FileError::Open(e));
                return Ok(());
            }
        };
        let (before, attrs) = match (file.metadata(), xattr::read_all(&file)) {
            (Ok(m), Ok(a)) => (m, a),
            (Err(e), _) => {
                report.fail(FileError::Read(e));
                return Ok(());
            }
            (_, Err(e)) => {
                report.fail(FileError::ReadTags(e));
                return Ok(());
            }
        };
        if Some(before.len()) != report.size {
            changed(report, "size changed between verifying and archiving");
            return Ok(());
        }
        let damaged = report.status.is_damage();
        let attrs = member_attrs(attrs, report.digest.as_ref(), before.len(), damaged);
        let mut segments = data_segments(&file, &before);
        if segments.len() >= MAX_RUNS {
            segments = vec![(0, before.len())];
        }
        let mut pax = Pax::default();
        let mut header = tar::Header::new_ustar();
        set_meta(&mut header, &mut pax, &before);
        let data_len: u64 = segments.iter().map(|s| s.1).sum();
        let map = match &segments {
            s if s.len() == 1 && s[0] == (0, before.len()) => None,
            _ => Some(sparse_map(&segments, before.len())),
        };
        let body = match &map {
            Some(map) => {
                pax.add("GNU.sparse.major", b"1");
                pax.add("GNU.sparse.minor", b"0");
                pax.add("GNU.sparse.name", name);
                pax.add("GNU.sparse.realsize", before.len().to_string().as_bytes());
                set_name(&mut header, &sparse_header_name(name));
                map.len() as u64 + data_len
            }
            None => {
                pax.add("path", name);
                set_name(&mut header, name);
                data_len
            }
        };
        if damaged {
            let mark = format!("{DAMAGED_MARK}{}", report.status.name());
            pax.add("comment", mark.as_bytes());
        }
        for (attr, value) in &attrs {
            pax.add(&format!("SCHILY.xattr.{}", encode_key(attr)), value);
        }
        set_size(&mut header, &mut pax, body);
        header.set_entry_type(tar::EntryType::Regular);
        let out = self.out.as_mut().expect("open until finished");
        pax.write(out)?;
        header.set_cksum();
        out.write_all(header.as_bytes())?;
        if let Some(map) = &map {
            out.write_all(map)?;
        }
        let algo = report.digest.as_ref().map(|d| d.algo);
        let copied = copy_data(
            &file,
            &segments,
            before.len(),
            algo.map(Hasher::new),
            self.buf.as_mut_slice(),
            out,
        )?;
        pad(out, body)?;
        self.stats.members += 1;
        self.stats.bytes += before.len();
        self.frame_bytes += body;
        if before.nlink() > 1 {
            self.links
                .insert((before.dev(), before.ino()), name.to_vec());
        }
        if let Err(e) = copied.error {
            report.fail(FileError::Read(e));
            report.detail = Some("the archived copy is incomplete and fails verify".into());
            return Ok(());
        }
        // The bytes archived are the bytes verified if they hash the same; without a digest
        // to compare (an untagged file), the file must at least look untouched.
        let same = match (&copied.digest, &report.digest) {
            (Some(now), Some(verified)) => now == verified,
            _ => file.metadata().is_ok_and(|a| {
                a.len() == before.len()
                    && a.mtime() == before.mtime()
                    && a.mtime_nsec() == before.mtime_nsec()
                    && a.ctime() == before.ctime()
                    && a.ctime_nsec() == before.ctime_nsec()
            }),
        };
        if !same {
            changed(
                report,
                "changed between verifying and archiving: the archived copy fails verify",
            );
            return Ok(());
        }
        report.action = Some(Action::Archived);
        Ok(())
    }

    fn add_symlink(&mut self, report: &mut FileReport, root: usize, name: &[u8]) -> io::Result<()> {
        let (meta, target) = match self.lstat(root, &report.path, true) {
            Ok((m, Some(t))) => (m, t),
            Ok(_) => return Ok(()),
            Err(e) => {
                report.fail(FileError::Open(e));
                return Ok(());
            }
        };
        let mut pax = Pax::default();
        let mut header = tar::Header::new_ustar();
        set_meta(&mut header, &mut pax, &meta);
        pax.add("path", name);
        pax.add("linkpath", target.as_os_str().as_bytes());
        set_name(&mut header, name);
        header.set_entry_type(tar::EntryType::Symlink);
        self.add_entry(header, pax)?;
        report.action = Some(Action::Archived);
        Ok(())
    }

    // The stat fields' types differ between Linux and macOS.
    #[allow(clippy::unnecessary_cast)]
    fn add_hard_link(
        &mut self,
        report: &mut FileReport,
        root: usize,
        name: &[u8],
    ) -> io::Result<()> {
        let Ok((meta, _)) = self.lstat(root, &report.path, false) else {
            return Ok(());
        };
        let id = (meta.st_dev as u64, meta.st_ino as u64);
        let Some(target) = self.links.get(&id).cloned() else {
            // The first name of this inode was not archived (damaged, unreadable).
            report.detail = Some("not archived: the file it links to was not".into());
            return Ok(());
        };
        let mut pax = Pax::default();
        let mut header = tar::Header::new_ustar();
        set_meta(&mut header, &mut pax, &meta);
        pax.add("path", name);
        pax.add("linkpath", &target);
        set_name(&mut header, name);
        header.set_entry_type(tar::EntryType::Link);
        self.add_entry(header, pax)?;
        report.action = Some(Action::Archived);
        Ok(())
    }

    /// The metadata of `path` (not following a symlink at its end) and, with `link`, the
    /// target of the symlink it is, looked up in its directory opened beneath the root: a
    /// directory swapped for a symlink since the walk cannot send the archive elsewhere.
    fn lstat(
        &self,
        root: usize,
        path: &Path,
        link: bool,
    ) -> io::Result<(rustix::fs::Stat, Option<PathBuf>)> {
        let name = path.file_name().unwrap_or(path.as_os_str());
        let dir = self.anchors[root].open_dir(crate::fs::atomic::parent(path))?;
        let st = rustix::fs::statat(&dir, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)?;
        let is_link = rustix::fs::FileType::from_raw_mode(st.st_mode).is_symlink();
        let target = if link && is_link {
            let t = rustix::fs::readlinkat(&dir, name, Vec::new())?;
            Some(PathBuf::from(OsStr::from_bytes(t.as_bytes())))
        } else {
            None
        };
        Ok((st, target))
    }

    /// Writes a member without data.
    fn add_entry(&mut self, mut header: tar::Header, pax: Pax) -> io::Result<()> {
        header.set_size(0);
        header.set_cksum();
        let out = self.out.as_mut().expect("open until finished");
        pax.write(out)?;
        out.write_all(header.as_bytes())?;
        self.stats.members += 1;
        Ok(())
    }

    /// Where the archive goes.
    pub fn dest(&self) -> &Path {
        &self.dest
    }

    /// Ends the archive, makes it durable and moves it into place.
    pub fn finish(mut self) -> io::Result<Stats> {
        let mut out = self.out.take().expect("open until finished");
        // The end-of-archive marker: two zero blocks.
        out.write_all(&[0u8; 1024])?;
        let encoder = out.into_inner().map_err(|e| e.into_error())?;
        let file = encoder.finish()?.into_inner().map_err(|e| e.into_error())?;
        self.stats.compressed = file.metadata()?.len();
        drop(file);
        let name = self.dest.file_name().expect("checked in create");
        self.temp
            .take()
            .expect("open until finished")
            .commit(name)?;
        Ok(std::mem::take(&mut self.stats))
    }
}

fn changed(report: &mut FileReport, what: &str) {
    report.status = Status::Changed;
    report.action = None;
    report.detail = Some(what.into());
}

/// The name a root's members start with: its last component, as `tar -C` its parent would
/// give; none for `/`.
fn root_name(root: &Path) -> Vec<u8> {
    let named = |p: &Path| p.file_name().map(|n| n.as_bytes().to_vec());
    named(root)
        .or_else(|| root.canonicalize().ok().and_then(|p| named(&p)))
        .unwrap_or_default()
}

/// The member's attributes: the file's own, with intact's tag kept only if it describes the
/// data archived (a stale or malformed one would make a good copy look damaged). A file
/// archived as damaged keeps its tag: the evidence of what it should be.
fn member_attrs(
    mut attrs: Vec<(String, Vec<u8>)>,
    digest: Option<&Digest>,
    size: u64,
    damaged: bool,
) -> Vec<(String, Vec<u8>)> {
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
fn data_segments(file: &File, meta: &std::fs::Metadata) -> Vec<(u64, u64)> {
    let size = meta.len();
    let whole = vec![(0, size)];
    if size == 0 || meta.blocks() * 512 >= size {
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

/// The sparse map that starts a GNU 1.0 sparse member's data: the number of runs, then each
/// run's offset and length, one decimal number per line, padded to whole blocks. A file
/// ending in a hole gets a last, empty run at its end, so its size is restored.
fn sparse_map(segments: &[(u64, u64)], size: u64) -> Vec<u8> {
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

/// The header name GNU tar gives a sparse member (the real name is in `GNU.sparse.name`), so
/// a tar that does not know the format extracts the raw data somewhere harmless.
fn sparse_header_name(name: &[u8]) -> Vec<u8> {
    let (dir, base) = match name.iter().rposition(|&b| b == b'/') {
        Some(i) => (&name[..=i], &name[i + 1..]),
        None => (&b""[..], name),
    };
    [dir, b"GNUSparseFile.0/", base].concat()
}

/// The ustar name field: the name if it fits, else a prefix of it (the PAX record holds the
/// real name; readers that know PAX ignore this one).
fn set_name(header: &mut tar::Header, name: &[u8]) {
    let field = &mut header.as_old_mut().name;
    let n = name.len().min(field.len());
    field[..n].copy_from_slice(&name[..n]);
}

/// What a member's header says of the file besides its name and size.
struct MemberMeta {
    mode: u32,
    uid: u32,
    gid: u32,
    mtime: Timestamp,
}

impl From<&std::fs::Metadata> for MemberMeta {
    fn from(m: &std::fs::Metadata) -> Self {
        MemberMeta {
            mode: m.mode(),
            uid: m.uid(),
            gid: m.gid(),
            mtime: Timestamp {
                sec: m.mtime(),
                nsec: m.mtime_nsec() as u32,
            },
        }
    }
}

// The stat fields' types differ between Linux and macOS.
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

fn set_meta(header: &mut tar::Header, pax: &mut Pax, meta: impl Into<MemberMeta>) {
    let meta = meta.into();
    header.set_mode(meta.mode & 0o7777);
    header.set_uid(meta.uid.into());
    header.set_gid(meta.gid.into());
    header.set_mtime(meta.mtime.sec.max(0) as u64);
    pax.add("mtime", pax_time(meta.mtime).as_bytes());
}

/// Sizes past the ustar field's 8 GiB go in a PAX record too.
fn set_size(header: &mut tar::Header, pax: &mut Pax, size: u64) {
    header.set_size(size);
    if size >= 1 << 33 {
        pax.add("size", size.to_string().as_bytes());
    }
}

/// A PAX time: seconds with a nanosecond fraction (`-1.5` for half a second before 1970).
fn pax_time(t: Timestamp) -> String {
    if t.sec < 0 && t.nsec > 0 {
        format!("-{}.{:09}", -(t.sec + 1), 1_000_000_000 - t.nsec)
    } else {
        format!("{}.{:09}", t.sec, t.nsec)
    }
}

/// Parses a PAX time; `None` if malformed.
fn parse_pax_time(s: &str) -> Option<Timestamp> {
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

/// zstd compression whose frames end and begin again on one context, so the worker threads
/// and their buffers carry on (a new encoder for each frame cost about 50 ms here).
struct FrameEncoder<W: Write> {
    raw: zstd::stream::raw::Encoder<'static>,
    out: W,
    buf: Vec<u8>,
}

impl<W: Write> FrameEncoder<W> {
    fn new(out: W, level: i32, threads: u32) -> io::Result<Self> {
        use zstd::stream::raw::CParameter;
        let mut raw = zstd::stream::raw::Encoder::new(level)?;
        raw.set_parameter(CParameter::ChecksumFlag(true))?;
        if threads > 0 {
            raw.set_parameter(CParameter::NbWorkers(threads))?;
        }
        Ok(FrameEncoder {
            raw,
            out,
            buf: vec![0; zstd::zstd_safe::CCtx::out_size()],
        })
    }

    /// Ends the current frame; what is written next begins a new one.
    fn end_frame(&mut self) -> io::Result<()> {
        use zstd::stream::raw::{Operation, OutBuffer};
        loop {
            let mut output = OutBuffer::around(&mut self.buf[..]);
            let left = self.raw.finish(&mut output, true)?;
            let n = output.pos();
            self.out.write_all(&self.buf[..n])?;
            if left == 0 {
                break;
            }
        }
        self.raw.reinit()
    }

    /// Ends the last frame and hands back the writer.
    fn finish(mut self) -> io::Result<W> {
        self.end_frame()?;
        Ok(self.out)
    }
}

impl<W: Write> Write for FrameEncoder<W> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        use zstd::stream::raw::{InBuffer, Operation, OutBuffer};
        let mut input = InBuffer::around(data);
        while input.pos() < data.len() {
            let mut output = OutBuffer::around(&mut self.buf[..]);
            self.raw.run(&mut input, &mut output)?;
            let n = output.pos();
            self.out.write_all(&self.buf[..n])?;
        }
        Ok(data.len())
    }

    /// Passes the flush on, without making zstd cut its blocks short.
    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// An xattr name as a PAX key: `%` and `=` percent-encoded, as GNU tar writes and reads them.
fn encode_key(name: &str) -> String {
    name.replace('%', "%25").replace('=', "%3D")
}

fn decode_key(key: &str) -> String {
    key.replace("%3D", "=").replace("%25", "%")
}

/// PAX extended header records for one member.
#[derive(Default)]
struct Pax(Vec<u8>);

impl Pax {
    /// Appends `<len> <key>=<value>\n`, where `len` counts the whole record, itself included.
    fn add(&mut self, key: &str, value: &[u8]) {
        let rest = key.len() + value.len() + 3;
        let mut len = rest + 1;
        while len != rest + len.to_string().len() {
            len = rest + len.to_string().len();
        }
        self.0.extend_from_slice(format!("{len} {key}=").as_bytes());
        self.0.extend_from_slice(value);
        self.0.push(b'\n');
    }

    fn write(&self, out: &mut impl Write) -> io::Result<()> {
        self.write_as(out, tar::EntryType::XHeader)
    }

    /// Writes the records as an extended header of `kind` (`x` for the next member, `g` for
    /// all that follow).
    fn write_as(&self, out: &mut impl Write, kind: tar::EntryType) -> io::Result<()> {
        if self.0.is_empty() {
            return Ok(());
        }
        let mut header = tar::Header::new_ustar();
        set_name(&mut header, b"././@PaxHeader");
        header.set_mode(0o644);
        header.set_size(self.0.len() as u64);
        header.set_entry_type(kind);
        header.set_cksum();
        out.write_all(header.as_bytes())?;
        out.write_all(&self.0)?;
        pad(out, self.0.len() as u64)
    }
}

/// Zeros up to the next block boundary.
fn pad(out: &mut impl Write, len: u64) -> io::Result<()> {
    let rem = (len % 512) as usize;
    if rem > 0 {
        out.write_all(&[0u8; 512][..512 - rem])?;
    }
    Ok(())
}

/// What copying a file's data found.
struct Copied {
    digest: Option<Digest>,
    error: io::Result<()>,
}

/// Writes exactly the bytes of `segments` to `out` (the member's size is already in its
/// header, so a file that shrank is padded with zeros and one that grew is cut), feeding
/// `hasher` the whole logical file, holes as zeros. A read error ends the copy with zeros
/// too: the archive stays well-formed, and the member fails verify.
fn copy_data(
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

/// What kind of thing a member is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A regular file.
    File,
    /// A hard link to an earlier member.
    Link(Vec<u8>),
    /// A symbolic link.
    Symlink(Vec<u8>),
    /// A directory, device or anything else.
    Other,
}

/// One member's metadata, as its headers describe it.
#[derive(Clone, Debug)]
pub struct Member {
    /// Its name, as archived (never used to decide where to write).
    pub name: Vec<u8>,
    /// What it is.
    pub kind: Kind,
    /// The file's size (for a sparse file, with its holes).
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    /// Owner.
    pub uid: u64,
    /// Group.
    pub gid: u64,
    /// Modification time.
    pub mtime: Timestamp,
    /// The file's extended attributes.
    pub xattrs: Vec<(String, Vec<u8>)>,
    /// The damage verdict it was archived under, if it was archived although damaged.
    pub damaged: Option<String>,
    /// The data runs of a sparse file (offset, length).
    sparse: Option<Vec<(u64, u64)>>,
}

impl Member {
    /// The tags the member carries.
    pub fn stored(&self) -> Stored {
        Stored::from_attrs(|name| {
            Ok(self
                .xattrs
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.clone()))
        })
        .unwrap_or_default()
    }

    /// The name, for paths in reports.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(OsStr::from_bytes(&self.name))
    }
}

/// A piece of a member's data, in order.
pub enum Chunk<'a> {
    /// Bytes.
    Data(&'a [u8]),
    /// This many zero bytes that a sparse file does not store.
    Hole(u64),
}

/// Where reading an archive failed.
#[derive(Debug, thiserror::Error)]
#[error("{}{error}", member.as_ref().map_or(String::new(), |m| format!("at member {}: ", crate::report::escape(Path::new(OsStr::from_bytes(m))))))]
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
        let mut buf = vec![0u8; 1 << 20];
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

/// The decompressed stream of an archive from some frame on, counting the compressed bytes
/// taken from the file (where to look for the next frame after damage).
type Stream = zstd::stream::read::Decoder<'static, BufReader<Counting>>;

/// A file read from an offset, counting what it gave.
struct Counting {
    file: File,
    taken: u64,
}

impl Read for Counting {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.file.read(buf)?;
        self.taken += n as u64;
        Ok(n)
    }
}

/// Bytes of compressed input read ahead of the decompressor.
const READ_AHEAD: usize = 128 << 10;

/// The archive's tar stream from the frame at compressed offset `at`.
fn open_at(path: &Path, at: u64) -> io::Result<tar::Archive<Stream>> {
    use std::io::Seek;
    let mut file = File::open(path)?;
    file.seek(io::SeekFrom::Start(at))?;
    let reader = BufReader::with_capacity(READ_AHEAD, Counting { file, taken: 0 });
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

/// Where a member visit stood when a frame turned out damaged.
struct Broken {
    error: ReadError,
    /// Compressed bytes taken from the file before the error.
    reached: u64,
}

/// Visits each member of the archive at `path` in order, until `visit` breaks. Member names
/// are data, never paths to write to. Damage ends the frame it is in (its remaining members
/// are lost); reading resumes at the next intact frame, and the first damage met is
/// returned at the end. The stream is read to its end, so that zstd's checksum of every
/// frame is verified.
pub fn read(
    path: &Path,
    mut visit: impl FnMut(Visit<'_, '_>) -> ControlFlow<()>,
) -> Result<(), ReadError> {
    check_magic(path).map_err(|error| ReadError {
        member: None,
        damaged: false,
        error,
    })?;
    let mut first_damage = None;
    let mut at = 0;
    let mut frame = None;
    loop {
        match read_from(path, at, &mut frame, &mut visit) {
            Ok(()) => break,
            Err(broken) => {
                first_damage.get_or_insert(broken.error);
                // The next frame starts after the error, which is at most a read-ahead before
                // what the decompressor had taken.
                let from = (at + broken.reached).saturating_sub(READ_AHEAD as u64 + 4);
                match next_frame(path, from.max(at + 1), frame) {
                    Some(next) => at = next,
                    None => break,
                }
            }
        }
    }
    first_damage.map_or(Ok(()), Err)
}

/// Reads members from the frame at `at` to the end (or until `visit` breaks), keeping
/// `frame` at the number of the last frame entered.
fn read_from(
    path: &Path,
    at: u64,
    frame: &mut Option<u64>,
    visit: &mut impl FnMut(Visit<'_, '_>) -> ControlFlow<()>,
) -> Result<(), Broken> {
    let mut archive = open_at(path, at).map_err(|error| Broken {
        error: ReadError {
            member: None,
            damaged: true,
            error,
        },
        reached: 0,
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
                if let Some(n) = frame_number(&data) {
                    *frame = Some(n);
                }
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
    result.map_err(|error| Broken {
        reached: stream.get_ref().get_ref().taken,
        error: ReadError {
            member: member_name,
            damaged: true,
            error,
        },
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
/// archive later than `after`: a zstd magic whose stream opens with our global header.
fn next_frame(path: &Path, from: u64, after: Option<u64>) -> Option<u64> {
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
            if frame_at(path, start).is_some_and(|n| after.is_none_or(|a| n > a)) {
                return Some(start);
            }
        }
    }
    None
}

/// The number of the frame at `at`, if a frame of ours starts there.
fn frame_at(path: &Path, at: u64) -> Option<u64> {
    let mut archive = open_at(path, at).ok()?;
    let mut entries = archive.entries().ok()?.raw(true);
    let mut entry = entries.next()?.ok()?;
    if entry.header().entry_type() != tar::EntryType::XGlobalHeader || entry.size() > 4096 {
        return None;
    }
    let mut data = Vec::new();
    entry.read_to_end(&mut data).ok()?;
    frame_number(&data)
}

/// Upper bound on an extended header (names, xattrs) of one member.
const MAX_EXTENSION: u64 = 16 << 20;

/// One PAX record: key and value.
type Record<'a> = (&'a [u8], &'a [u8]);

/// Parses PAX extended header records: `<len> <key>=<value>\n`, where `len` counts the
/// whole record, so values may hold newlines and any other byte.
fn parse_pax(mut data: &[u8]) -> Result<Vec<Record<'_>>, &'static str> {
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

/// Upper bound on a sparse map's text, and on its runs (the writer stores a file with more
/// runs whole, holes and all).
const MAX_SPARSE_MAP: usize = 40 << 20;
const MAX_RUNS: usize = 1 << 20;

fn malformed(why: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why.to_owned())
}

/// Parses a GNU 1.0 sparse map block by block, each byte once: the number of runs, then each
/// run's offset and length, one decimal number per line.
#[derive(Default)]
struct MapParser {
    count: Option<usize>,
    numbers: Vec<u64>,
    line: Vec<u8>,
}

impl MapParser {
    /// Feeds the next block: the runs once the map is complete, `None` if it goes on.
    fn feed(&mut self, block: &[u8]) -> Result<Option<Vec<(u64, u64)>>, &'static str> {
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
            let to = crate::report::escape(Path::new(OsStr::from_bytes(to)));
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
            Chunk::Hole(n) => hasher.update_zeros(n),
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

    #[test]
    fn member_tag_kept_only_when_it_describes_the_data() {
        let d = crate::core::digest::digest_bytes(crate::core::digest::Algo::Sha256, b"data");
        let t = Timestamp { sec: 1, nsec: 0 };
        let attrs = |size| {
            vec![
                ("user.other".to_string(), b"x".to_vec()),
                (
                    names::INTACT.to_string(),
                    tag::encode(&d, size, t, 2).into_bytes(),
                ),
            ]
        };
        assert_eq!(member_attrs(attrs(4), Some(&d), 4, false).len(), 2);
        assert_eq!(member_attrs(attrs(5), Some(&d), 4, false).len(), 1);
        assert_eq!(member_attrs(attrs(4), None, 4, false).len(), 1);
        assert_eq!(member_attrs(attrs(5), Some(&d), 4, true).len(), 2);
    }

    #[test]
    fn member_names_follow_tar_conventions() {
        assert_eq!(root_name(Path::new("/a/photos")), b"photos");
        assert_eq!(root_name(Path::new("/")), b"");
        assert_eq!(sparse_header_name(b"a/b/c"), b"a/b/GNUSparseFile.0/c");
        assert_eq!(sparse_header_name(b"c"), b"GNUSparseFile.0/c");
    }
}
