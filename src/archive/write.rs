//! Writing an archive: each file, verified from the very bytes archived, with its tag and
//! xattrs, into zstd frames cut at member boundaries, in a temp file put in place at the end.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, BufWriter, Seek, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crossbeam_channel::{Receiver, Sender};

use super::{DAMAGED_MARK, FRAME_BYTES, FRAME_MARK, FRAME_MEMBERS, Options, Stats};
use crate::core::classify::Status;
use crate::core::digest::{Digest, Hasher, digest_bytes};
use crate::core::pax::{MAX_RUNS, Pax, encode_key, pax_time, sparse_map};
use crate::core::tag::{self, Timestamp, names};
use crate::engine::{Action, FileError, FileReport};
use crate::fs::anchor::Anchor;
use crate::fs::atomic::Temp;
use crate::fs::hash::AlignedBuf;
use crate::fs::walk::{SkipReason, Stat};
use crate::fs::xattr::{self, Attrs};
use crate::sink::{Failure, Out, Sink};

/// An archive being written: to a temp file beside the destination, renamed over it by
/// [`Writer::finish`]; dropped unfinished, it leaves nothing behind.
pub struct Writer {
    /// Small writes (headers, small files) are gathered before they reach zstd, whose
    /// multi-threaded streaming takes locks on every call.
    out: Option<BufWriter<FrameEncoder<Spool>>>,
    temp: Option<Temp>,
    dest: PathBuf,
    roots: Vec<(PathBuf, Vec<u8>)>,
    anchors: Vec<Anchor>,
    /// Inodes with several links already archived, and the member name they went in under.
    links: HashMap<(u64, u64), Vec<u8>>,
    /// Inodes with several links found damaged, and the first name.
    damaged: crate::engine::Damaged,
    buf: AlignedBuf,
    opts: Options,
    /// The zstd frame being written, and the file data in it so far.
    frame: u64,
    frame_bytes: u64,
    frame_members: u64,
    /// Running totals.
    pub stats: Stats,
    /// Temp files that killed runs had left beside the archive, removed.
    pub removed: Vec<PathBuf>,
}

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
            damaged: HashMap::new(),
            buf: AlignedBuf::new(crate::fs::hash::BUF_SIZE),
            opts,
            frame: 0,
            frame_bytes: 0,
            frame_members: 0,
            stats: Stats::default(),
            removed,
        };
        let enc = FrameEncoder::new(Spool::new(file)?, writer.opts.level, writer.opts.threads)?;
        writer.out = Some(BufWriter::with_capacity(1 << 20, enc));
        writer.start_frame()?;
        Ok(writer)
    }

    /// Writes the numbered global header that opens a frame.
    fn start_frame(&mut self) -> io::Result<()> {
        let mut pax = Pax::default();
        pax.add("comment", format!("{FRAME_MARK}{}", self.frame).as_bytes());
        let out = self.out.as_mut().expect("open until finished");
        write_pax(out, &pax, tar::EntryType::XGlobalHeader)?;
        self.frame_bytes = 0;
        self.frame_members = 0;
        Ok(())
    }

    /// Ends the frame and starts the next, once the frame holds enough.
    fn next_frame_if_full(&mut self) -> io::Result<()> {
        if self.frame_bytes < FRAME_BYTES && self.frame_members < FRAME_MEMBERS {
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
        let added = self.add_member_of(report);
        // Damage found here, in a file the engine left unread, is said under its other names.
        if let Some(inode) = report.linked {
            crate::engine::name_damage(report, inode, &mut self.damaged);
        }
        added
    }

    fn add_member_of(&mut self, report: &mut FileReport) -> io::Result<()> {
        self.next_frame_if_full()?;
        self.frame_members += 1;
        let root = report.root;
        let name = self.member_name(root, &report.path);
        // A second name is a link member, whatever its first name's verdict (the first name
        // decides whether there is anything to link to).
        match report.skip {
            Some(SkipReason::Symlink) => return self.add_symlink(report, root, &name),
            Some(SkipReason::HardLink) => return self.add_hard_link(report, root, &name),
            _ => {}
        }
        match report.status {
            Status::Skipped => Ok(()),
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

    /// Opens `path` beneath root `root`: the file, its state and its attributes.
    fn open(&self, root: usize, path: &Path) -> Result<(File, Stat, Attrs), FileError> {
        let file = self.anchors[root]
            .open(path, false)
            .map_err(FileError::Open)?;
        let (stat, _) = Stat::of(&file).map_err(FileError::Read)?;
        let attrs = xattr::read_all(&file).map_err(FileError::ReadTags)?;
        Ok((file, stat, attrs))
    }

    fn add_file(&mut self, report: &mut FileReport, root: usize, name: &[u8]) -> io::Result<()> {
        // A file the engine left open comes with its state and attributes, read then.
        let opened = match report.open.take() {
            Some(open) => Ok(open.into_parts()),
            None => self.open(root, &report.path),
        };
        let (file, before, attrs) = match opened {
            Ok(opened) => opened,
            Err(e) => {
                report.fail(e);
                return Ok(());
            }
        };
        if Some(before.size) != report.size {
            changed(report, "size changed between verifying and archiving");
            return Ok(());
        }
        // A file the engine left unread (its tag describes it, nothing was to be written) is
        // verified here, from the bytes archived: each file is read and hashed once.
        let unread = report.unread().cloned();
        let algo = unread.as_ref().map(|t| t.digest.algo);
        let algo = algo.or(report.digest.as_ref().map(|d| d.algo));
        // One that fits the buffer is read and judged before anything of it is written; a
        // larger one goes in speculatively, in frames of its own that are cut off again if
        // it turns out damaged.
        let mut whole = None;
        if let Some(tag) = &unread
            && before.size <= crate::fs::hash::BUF_SIZE as u64
        {
            let data = &mut self.buf.as_mut_slice()[..before.size as usize];
            if let Err(e) = read_whole(&file, data) {
                report.fail(FileError::Read(e));
                return Ok(());
            }
            let digest = digest_bytes(tag.digest.algo, data);
            if !untouched(&file, &before) {
                changed(report, "changed while it was archived: not archived");
                return Ok(());
            }
            if !self.judge(report, tag, &digest, &before) && !self.opts.include_damaged {
                return Ok(());
            }
            whole = Some(digest);
        }
        let mark = match (&unread, whole) {
            (Some(_), None) => Some(self.mark()?),
            _ => None,
        };
        let damaged = report.status.is_damage();
        let digest = unread.as_ref().map(|t| t.digest).or(report.digest);
        let attrs = member_attrs(attrs, digest.as_ref(), before.size, damaged);
        let mut segments = data_segments(&file, &before);
        if segments.len() >= MAX_RUNS {
            segments = vec![(0, before.size)];
        }
        let damage = damaged.then_some(report.status);
        let head = FileHead::new(name, &before, &segments, &attrs, damage);
        let body = head.body;
        let out = self.out.as_mut().expect("open until finished");
        head.write(out)?;
        let copied = match whole {
            Some(digest) => {
                let buf = &self.buf.as_mut_slice()[..before.size as usize];
                for &(offset, len) in &segments {
                    out.write_all(&buf[offset as usize..(offset + len) as usize])?;
                }
                Copied {
                    digest: Some(digest),
                    error: Ok(()),
                }
            }
            None => copy_data(
                &file,
                &segments,
                before.size,
                algo.map(Hasher::new),
                self.buf.as_mut_slice(),
                out,
            )?,
        };
        pad(out, body)?;
        self.stats.members += 1;
        self.stats.bytes += before.size;
        self.frame_bytes += body;
        if let Err(e) = copied.error {
            report.fail(FileError::Read(e));
            report.detail = Some(match mark {
                Some(mark) => {
                    self.rewind(mark)?;
                    "not archived".into()
                }
                None => "the archived copy is incomplete and fails verify".into(),
            });
            return Ok(());
        }
        if let (Some(mark), Some(tag), Some(now)) = (mark, &unread, &copied.digest) {
            // Data that differs from its tag is damage only if the file did not change
            // while it was read.
            if !untouched(&file, &before) {
                self.rewind(mark)?;
                changed(report, "changed while it was archived: not archived");
                return Ok(());
            }
            if !self.judge(report, tag, now, &before) {
                self.rewind(mark)?;
                // Asked to keep the damaged too: once more, now marked as such.
                return match report.status.is_damage() && self.opts.include_damaged {
                    true => self.add_file(report, root, name),
                    false => Ok(()),
                };
            }
        }
        // The bytes archived are the bytes verified if they hash the same (those verified
        // here did); an untagged file, with no digest to compare, must look untouched.
        let same = match (&copied.digest, &report.digest) {
            _ if unread.is_some() => true,
            (Some(now), Some(verified)) => now == verified,
            _ => untouched(&file, &before),
        };
        if !same {
            changed(
                report,
                "changed between verifying and archiving: the archived copy fails verify",
            );
            return Ok(());
        }
        // Only a copy proven good is worth linking other names to.
        if before.nlink > 1 {
            self.links.insert((before.dev, before.ino), name.to_vec());
        }
        report.action = Some(Action::Archived);
        Ok(())
    }

    /// Classifies a file the engine left unread against its `tag`, with the digest of the
    /// bytes just read; whether its data is as the tag says. A damaged one keeps its tag (the
    /// evidence), and goes in only if asked for, marked.
    fn judge(
        &self,
        report: &mut FileReport,
        tag: &tag::Tag,
        digest: &Digest,
        before: &Stat,
    ) -> bool {
        let window = self.opts.mtime_window_ns;
        report.judge(tag, before.size, before.mtime, *digest, window);
        if !report.status.is_damage() {
            return true;
        }
        if !self.opts.include_damaged {
            report.detail = Some("not archived: its data no longer matches its tag".into());
        }
        false
    }

    /// Ends the frame being written, so that what follows can be cut off again by
    /// [`Writer::rewind`].
    fn mark(&mut self) -> io::Result<Mark> {
        let at = self.flush_frame()?.stream_position()?;
        self.frame += 1;
        self.start_frame()?;
        Ok(Mark {
            at,
            frame: self.frame,
            stats: self.stats,
        })
    }

    /// Cuts off everything written since `mark`.
    fn rewind(&mut self, mark: Mark) -> io::Result<()> {
        let file = self.flush_frame()?;
        file.set_len(mark.at)?;
        file.seek(io::SeekFrom::Start(mark.at))?;
        self.frame = mark.frame;
        self.stats = mark.stats;
        self.start_frame()
    }

    /// Ends the frame being written and passes all of it to the file, which it hands back.
    fn flush_frame(&mut self) -> io::Result<&mut File> {
        let out = self.out.as_mut().expect("open until finished");
        out.flush()?;
        let enc = out.get_mut();
        enc.end_frame()?;
        let spool = enc.inner();
        spool.flush()?;
        Ok(spool.file())
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
        write_pax(out, &pax, tar::EntryType::XHeader)?;
        out.write_all(header.as_bytes())?;
        self.stats.members += 1;
        Ok(())
    }

    /// Ends the archive, makes it durable and puts it in place.
    fn commit(&mut self) -> io::Result<Stats> {
        let mut out = self.out.take().expect("open until finished");
        // The end-of-archive marker: two zero blocks.
        out.write_all(&[0u8; 1024])?;
        let encoder = out.into_inner().map_err(|e| e.into_error())?;
        let file = encoder.finish()?.into_file()?;
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

/// Each file is written into the archive as its report comes; the report says `archived`
/// only once the whole archive is durable under its name, so reports are held until then.
impl Sink for Writer {
    fn take(&mut self, mut report: FileReport, out: &mut dyn Out) -> Result<(), Failure> {
        let before = report.action;
        let added = self.add(&mut report);
        out.hold(report, before);
        added.map_err(|e| Failure::new("writing the archive; nothing was left", e))
    }

    fn finish(&mut self, interrupted: bool, out: &mut dyn Out) -> Result<(), Failure> {
        if interrupted || self.out.is_none() {
            // Dropping the temp file leaves nothing under the archive's name.
            self.temp = None;
            out.settle(false);
            return Ok(());
        }
        match self.commit() {
            Ok(stats) => {
                out.settle(true);
                out.note(format!(
                    "archive: wrote {}: {} members, {} of data in {} compressed",
                    crate::text::escape(&self.dest),
                    stats.members,
                    crate::text::bytes(stats.bytes),
                    crate::text::bytes(stats.compressed),
                ));
                Ok(())
            }
            Err(e) => {
                self.temp = None;
                out.settle(false);
                Err(Failure::new("finishing the archive; nothing was left", e))
            }
        }
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
fn member_attrs(mut attrs: Attrs, digest: Option<&Digest>, size: u64, damaged: bool) -> Attrs {
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
fn data_segments(file: &File, stat: &Stat) -> Vec<(u64, u64)> {
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

/// What goes before a regular file's data: its PAX records, its ustar header, and for a
/// file with holes the sparse map; and the length of what follows the header.
struct FileHead {
    pax: Pax,
    header: tar::Header,
    map: Option<Vec<u8>>,
    body: u64,
}

impl FileHead {
    /// The head of the member `name` for a file of `stat` whose data lies in `segments`,
    /// with `attrs`, marked with its `damage` if it has some.
    fn new(
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
            pax.add(&format!("SCHILY.xattr.{}", encode_key(attr)), value);
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

    fn write(&self, out: &mut impl Write) -> io::Result<()> {
        write_pax(out, &self.pax, tar::EntryType::XHeader)?;
        out.write_all(self.header.as_bytes())?;
        if let Some(map) = &self.map {
            out.write_all(map)?;
        }
        Ok(())
    }
}

/// What a member's header says of the file besides its name and size.
struct MemberMeta {
    mode: u32,
    uid: u32,
    gid: u32,
    mtime: Timestamp,
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

/// The input of each zstd worker's job.
const JOB_BYTES: u32 = 1 << 20;

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
            // zstd's default job at level 3 is 8 MiB, and each worker holds its job's input
            // and output besides a pool of spares: 64 MB of RSS for two workers. Jobs of
            // 1 MiB (the smallest it takes is 512 KiB, which measured 4x slower) cost
            // 16 MB, compress (b), (c) and (d) to within 0.05% of the same size, as fast.
            raw.set_parameter(CParameter::JobSize(JOB_BYTES))?;
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

    /// The writer of the compressed stream.
    fn inner(&mut self) -> &mut W {
        &mut self.out
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

/// The compressed stream's writes to the archive, on a thread of their own, in 1 MiB
/// pieces, each sent on its way to the disk once written: the fsync that must come before
/// any file is reported archived then waits for the last piece only (five 800 MiB files:
/// 10-21 s before, 8.3-8.9 s after). The page-cache copies also leave the thread that builds
/// the members and feeds zstd (a third of its time on 20,000 files of 4 KiB), which every
/// other thread waits on.
struct Spool {
    /// The bytes not yet handed over.
    buf: Vec<u8>,
    pieces: Option<Sender<Piece>>,
    /// Emptied pieces back from the thread, for reuse.
    spare: Receiver<Vec<u8>>,
    /// The thread's answer to each flush: the first error since the last one.
    flushed: Receiver<io::Result<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// The archive file, for seeking and truncating while the thread waits (its descriptor
    /// shares this one's offset).
    file: File,
}

enum Piece {
    Bytes(Vec<u8>),
    Flush,
}

fn spool_gone() -> io::Error {
    io::Error::other("the archive's writing thread stopped")
}

/// Bytes handed to the thread at a time.
const SPOOL_PIECE: usize = 1 << 20;

impl Spool {
    fn new(file: File) -> io::Result<Spool> {
        let mut out = file.try_clone()?;
        // Two pieces wait at most: the memory stays a few MiB whatever the disk's speed.
        let (pieces, rx) = crossbeam_channel::bounded::<Piece>(2);
        let (back, spare) = crossbeam_channel::unbounded();
        let (said, flushed) = crossbeam_channel::unbounded();
        let thread = std::thread::spawn(move || {
            let mut failed = None;
            for piece in rx {
                match piece {
                    Piece::Bytes(mut b) => {
                        if failed.is_none() {
                            match out.write_all(&b) {
                                // On its way to the disk while the rest is made: the
                                // archive's fsync at the end waits for the last piece only.
                                Ok(()) => crate::fs::sys::start_writeback(&out),
                                Err(e) => failed = Some(e),
                            }
                        }
                        b.clear();
                        let _ = back.send(b);
                    }
                    Piece::Flush => {
                        let _ = said.send(failed.take().map_or(Ok(()), Err));
                    }
                }
            }
        });
        Ok(Spool {
            buf: Vec::with_capacity(SPOOL_PIECE),
            pieces: Some(pieces),
            spare,
            flushed,
            thread: Some(thread),
            file,
        })
    }

    fn send(&mut self, piece: Piece) -> io::Result<()> {
        self.pieces
            .as_ref()
            .ok_or_else(spool_gone)?
            .send(piece)
            .map_err(|_| spool_gone())
    }

    /// Hands over what is buffered.
    fn hand_over(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let next = self
            .spare
            .try_recv()
            .unwrap_or_else(|_| Vec::with_capacity(SPOOL_PIECE));
        let full = std::mem::replace(&mut self.buf, next);
        self.send(Piece::Bytes(full))
    }

    /// The archive file; everything written so far is in it once [`Write::flush`] returned.
    fn file(&mut self) -> &mut File {
        &mut self.file
    }

    /// Everything written, in the file, which is handed back.
    fn into_file(mut self) -> io::Result<File> {
        self.flush()?;
        self.pieces = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.file.try_clone()
    }
}

impl Write for Spool {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let n = data.len().min(SPOOL_PIECE - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == SPOOL_PIECE {
            self.hand_over()?;
        }
        Ok(n)
    }

    /// Returns once the thread has written everything, with its first error since the last
    /// flush, if any.
    fn flush(&mut self) -> io::Result<()> {
        self.hand_over()?;
        self.send(Piece::Flush)?;
        self.flushed.recv().map_err(|_| spool_gone())?
    }
}

impl Drop for Spool {
    fn drop(&mut self) {
        self.pieces = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
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

/// Where the archive stood before a member written speculatively.
#[derive(Clone, Copy)]
struct Mark {
    /// The end of the last frame in the file.
    at: u64,
    /// The number of the frame begun there.
    frame: u64,
    stats: Stats,
}

/// Fills `buf` from the start of `file`; a file that ended first is filled with zeros (its
/// size, checked after, tells the change).
fn read_whole(file: &File, buf: &mut [u8]) -> io::Result<()> {
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
fn untouched(file: &File, before: &Stat) -> bool {
    Stat::of(file).is_ok_and(|(now, _)| now.changes_since(before, before.size).is_none())
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

/// Writes `pax` as an extended header of `kind` (`x` for the next member, `g` for all that
/// follow); nothing if it holds no records.
fn write_pax(out: &mut impl Write, pax: &Pax, kind: tar::EntryType) -> io::Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_tag_kept_only_when_it_describes_the_data() {
        let d = crate::core::digest::digest_bytes(crate::core::digest::Algo::Sha256, b"data");
        let t = Timestamp { sec: 1, nsec: 0 };
        let attrs = |size| {
            vec![
                ("user.other".to_string(), b"x".to_vec()),
                (names::INTACT.to_string(), tag::encode(&d, size, t, 2)),
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
