//! Writing an archive: each file, verified from the very bytes archived, with its tag and
//! xattrs, into zstd frames cut at member boundaries, in a temp file put in place at the end.

mod frames;
mod member;
mod spool;

use frames::FrameEncoder;
use member::{
    Copied, FileHead, Mark, copy_data, data_segments, member_attrs, pad, read_whole, set_meta,
    set_name, untouched, write_pax,
};
use spool::Spool;

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, BufWriter, Seek, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::{FRAME_BYTES, FRAME_MARK, FRAME_MEMBERS, Options, Stats};
use crate::core::classify::Status;
use crate::core::digest::{Digest, Hasher, digest_bytes};
use crate::core::pax::{MAX_RUNS, Pax};
use crate::core::tag::{self};
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
    out: Option<BufWriter<FrameEncoder>>,
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
            Some(open) => Ok((*open).into_parts()),
            None => self
                .open(root, &report.path)
                .map(|(f, s, a)| (f, s, a, None)),
        };
        let (file, before, attrs, read) = match opened {
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
        // The worker may have read and hashed it already (a small file).
        let read = read.filter(|(data, _)| data.len() as u64 == before.size);
        if let Some(tag) = &unread
            && before.size <= crate::fs::hash::BUF_SIZE as u64
        {
            let digest = match &read {
                Some((_, digest)) => *digest,
                None => {
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
                    digest
                }
            };
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
                let buf = match &read {
                    Some((data, _)) => &data[..],
                    None => &self.buf.as_mut_slice()[..before.size as usize],
                };
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
        report.copy = Some(Action::Archived);
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
        report.copy = Some(Action::Archived);
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
        report.copy = Some(Action::Archived);
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
        let added = self.add(&mut report);
        out.hold(report);
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
    report.copy = None;
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

// The stat fields' types differ between Linux and macOS.

#[cfg(test)]
mod tests {
    use super::member::sparse_header_name;
    use super::*;
    use crate::core::tag::{Timestamp, names};

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
