//! fanotify on whole file systems (`FAN_MARK_FILESYSTEM`): one mark per file system holding
//! a watched tree, whatever its directories, reporting each event's directory and name
//! (`FAN_REPORT_DFID_NAME`, Linux 5.9). Root only (`CAP_SYS_ADMIN`). Events outside the trees
//! are dropped here; the directory's handle is turned back into its path by
//! `open_by_handle_at` on the file system's root, then `/proc/self/fd`. The roots are opened
//! only while events are read: an idle watch holds no descriptor in the trees, so `umount`
//! of a watched tree is not refused as busy.
//!
//! The event records are parsed from bytes by a pure function ([`parse`]), unit-tested; the
//! three calls the C library does not wrap safely (init, mark, open by handle) say why each
//! is sound.

#![allow(unsafe_code)]

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::time::Duration;

use super::{Events, Seen};

/// A fanotify group marking the file systems of a set of trees.
pub struct Fanotify {
    fd: OwnedFd,
    /// The trees, and per file system (its fsid) a watched root on it.
    roots: Vec<PathBuf>,
    mounts: Vec<([i32; 2], PathBuf)>,
    buf: Vec<u8>,
    /// Directories' paths by handle, inside the trees or not (`None`): the whole file system
    /// raises events, and most are elsewhere; looking each up costs two system calls.
    dirs: std::collections::HashMap<Vec<u8>, Option<PathBuf>>,
}

/// Directories whose paths are kept (then forgotten all at once).
const DIRS_KEPT: usize = 8192;

/// Reads of the queue per [`Events::wait`].
const READS_PER_WAIT: usize = 16;

const MASK: u64 = libc::FAN_MODIFY
    | libc::FAN_CLOSE_WRITE
    | libc::FAN_CREATE
    | libc::FAN_MOVED_TO
    | libc::FAN_ONDIR;

impl Fanotify {
    /// Marks the file systems holding `roots`, and those mounted beneath them.
    pub fn new(roots: &[PathBuf]) -> io::Result<Fanotify> {
        let mountinfo = std::fs::read("/proc/self/mountinfo").unwrap_or_default();
        let mut marked: Vec<PathBuf> = roots.to_vec();
        marked.extend(crate::fs::mounts::mounts_under(&mountinfo, roots));
        // SAFETY: plain flags; the call returns a new descriptor or -1.
        let raw = unsafe {
            libc::fanotify_init(
                libc::FAN_CLASS_NOTIF
                    | libc::FAN_CLOEXEC
                    | libc::FAN_NONBLOCK
                    | libc::FAN_REPORT_DFID_NAME,
                (libc::O_RDONLY | libc::O_LARGEFILE) as u32,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a descriptor just opened, owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let mut mounts: Vec<([i32; 2], PathBuf)> = Vec::new();
        for root in &marked {
            let c = CString::new(root.as_os_str().as_bytes())?;
            // SAFETY: `c` is a valid C string for the call's duration; the group is ours.
            let marked = unsafe {
                libc::fanotify_mark(
                    fd.as_raw_fd(),
                    libc::FAN_MARK_ADD | libc::FAN_MARK_FILESYSTEM,
                    MASK,
                    libc::AT_FDCWD,
                    c.as_ptr(),
                )
            };
            if marked < 0 {
                return Err(io::Error::last_os_error());
            }
            let fsid = fsid_of(&open_root(root)?)?;
            if !mounts.iter().any(|(f, _)| *f == fsid) {
                mounts.push((fsid, root.clone()));
            }
        }
        Ok(Fanotify {
            fd,
            roots: roots.to_vec(),
            mounts,
            buf: vec![0; 64 << 10],
            dirs: std::collections::HashMap::new(),
        })
    }

    /// The path of the directory whose handle is `handle` on the file system `fsid`; `open`
    /// holds the roots opened while this read of events lasts.
    fn dir_path(
        &self,
        fsid: [i32; 2],
        handle: &[u8],
        open: &mut Vec<([i32; 2], Option<OwnedFd>)>,
    ) -> Option<PathBuf> {
        let at = match open.iter().position(|(f, _)| *f == fsid) {
            Some(at) => at,
            None => {
                let (_, root) = self.mounts.iter().find(|(f, _)| *f == fsid)?;
                // A root unmounted (or replaced) since is another file system now: its
                // events are for nothing the watch can reach.
                let fd = open_root(root)
                    .ok()
                    .filter(|fd| fsid_of(fd).is_ok_and(|f| f == fsid));
                open.push((fsid, fd));
                open.len() - 1
            }
        };
        let mount = open[at].1.as_ref()?;
        // `struct file_handle` as the kernel gave it, in memory aligned for its fields.
        let mut words = vec![0u32; handle.len().div_ceil(4)];
        for (i, b) in handle.iter().enumerate() {
            let w = &mut words[i / 4];
            let mut bytes = w.to_ne_bytes();
            bytes[i % 4] = *b;
            *w = u32::from_ne_bytes(bytes);
        }
        // SAFETY: `words` holds a whole `file_handle` (its size field says how many bytes
        // follow, and the kernel checked them when it wrote the event); `mount` is open.
        let raw = unsafe {
            libc::open_by_handle_at(
                mount.as_raw_fd(),
                words.as_mut_ptr().cast::<libc::file_handle>(),
                libc::O_PATH | libc::O_CLOEXEC,
            )
        };
        if raw < 0 {
            return None;
        }
        // SAFETY: a descriptor just opened, owned by nothing else.
        let dir = unsafe { OwnedFd::from_raw_fd(raw) };
        let path = std::fs::read_link(format!("/proc/self/fd/{}", dir.as_raw_fd())).ok()?;
        // A directory removed since reads "... (deleted)": nothing left to look at.
        (!path.as_os_str().as_bytes().ends_with(b" (deleted)")).then_some(path)
    }
}

/// A watched root, opened for `open_by_handle_at` (not O_PATH: it wants a descriptor it can
/// use, EBADF else).
fn open_root(root: &std::path::Path) -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(
        root,
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?)
}

/// The file system id of `fd` as events carry it (`__kernel_fsid_t`, two words): the low and
/// high halves of `statvfs`'s `f_fsid`, which is how the C library and rustix join them.
fn fsid_of(fd: &impl AsFd) -> io::Result<[i32; 2]> {
    let id = rustix::fs::fstatvfs(fd)?.f_fsid;
    Ok([id as u32 as i32, (id >> 32) as u32 as i32])
}

/// One event as read: its mask, the process that caused it, and for each directory-and-name
/// record its file system, the directory's handle and the name.
#[derive(Debug, PartialEq, Eq)]
pub struct Raw<'a> {
    /// What happened (`FAN_*`).
    pub mask: u64,
    /// Who did it.
    pub pid: i32,
    /// The file system id, the directory's `file_handle` (size, type, bytes) and the name.
    pub dfid_name: Option<([i32; 2], &'a [u8], &'a OsStr)>,
}

/// The events in `buf` (what one read gave); a record too short for what it says ends them.
pub fn parse(mut buf: &[u8]) -> Vec<Raw<'_>> {
    let u16_at = |b: &[u8], i: usize| {
        b.get(i..i + 2)
            .map(|s| u16::from_ne_bytes(s.try_into().unwrap()))
    };
    let u32_at = |b: &[u8], i: usize| {
        b.get(i..i + 4)
            .map(|s| u32::from_ne_bytes(s.try_into().unwrap()))
    };
    let u64_at = |b: &[u8], i: usize| {
        b.get(i..i + 8)
            .map(|s| u64::from_ne_bytes(s.try_into().unwrap()))
    };
    let mut events = Vec::new();
    // fanotify_event_metadata: event_len u32, vers u8, reserved u8, metadata_len u16,
    // mask u64, fd i32, pid i32.
    while let (Some(len), Some(meta_len), Some(mask), Some(pid)) = (
        u32_at(buf, 0),
        u16_at(buf, 6),
        u64_at(buf, 8),
        u32_at(buf, 20),
    ) {
        let (len, meta_len) = (len as usize, meta_len as usize);
        if len < meta_len || meta_len < 24 || buf.len() < len {
            break;
        }
        let mut info = &buf[meta_len..len];
        let mut dfid_name = None;
        // Info records: type u8, pad u8, len u16; a DFID_NAME record then holds the fsid
        // (two i32), a file_handle (bytes u32, type i32, bytes) and a NUL-ended name.
        while let (Some(&kind), Some(rec_len)) = (info.first(), u16_at(info, 2)) {
            let rec_len = rec_len as usize;
            if rec_len < 4 || info.len() < rec_len {
                break;
            }
            let rec = &info[..rec_len];
            if kind == libc::FAN_EVENT_INFO_TYPE_DFID_NAME
                && let (Some(a), Some(b), Some(hbytes)) =
                    (u32_at(rec, 4), u32_at(rec, 8), u32_at(rec, 12))
            {
                let handle_end = 20 + hbytes as usize;
                if let Some(handle) = rec.get(12..handle_end) {
                    let name = &rec[handle_end..];
                    let name = &name[..name.iter().position(|&c| c == 0).unwrap_or(name.len())];
                    dfid_name = Some(([a as i32, b as i32], handle, OsStr::from_bytes(name)));
                }
            }
            info = &info[rec_len..];
        }
        events.push(Raw {
            mask,
            pid: pid as i32,
            dfid_name,
        });
        buf = &buf[len..];
    }
    events
}

impl Events for Fanotify {
    fn wait(&mut self, timeout: Duration, seen: &mut Vec<Seen>) -> io::Result<()> {
        if !super::readable(&self.fd, timeout)? {
            return Ok(());
        }
        let me = std::process::id() as i32;
        let mut buf = std::mem::take(&mut self.buf);
        // The roots opened for this read only (closed as it returns).
        let mut open = Vec::new();
        // A bounded number of reads per call: on a busy file system events may come as fast
        // as they are read, and the caller must get its turn (runs due, a signal).
        for _ in 0..READS_PER_WAIT {
            let n = match rustix::io::read(&self.fd, &mut buf) {
                Ok(0) | Err(rustix::io::Errno::WOULDBLOCK | rustix::io::Errno::INTR) => break,
                Ok(n) => n,
                Err(e) => {
                    self.buf = buf;
                    return Err(e.into());
                }
            };
            for raw in parse(&buf[..n]) {
                if raw.mask & libc::FAN_Q_OVERFLOW != 0 {
                    seen.push(Seen::Lost);
                    continue;
                }
                let Some((fsid, handle, name)) = raw.dfid_name else {
                    continue;
                };
                if raw.pid == me || name.is_empty() {
                    continue;
                }
                let dir = match self.dirs.get(handle) {
                    Some(dir) => dir.clone(),
                    None => {
                        let dir = self
                            .dir_path(fsid, handle, &mut open)
                            .filter(|d| self.roots.iter().any(|r| d.starts_with(r)));
                        if self.dirs.len() >= DIRS_KEPT {
                            self.dirs.clear();
                        }
                        self.dirs.insert(handle.to_vec(), dir.clone());
                        dir
                    }
                };
                // A directory moved anywhere may have moved into (or out of) the trees.
                if raw.mask & (libc::FAN_ONDIR | libc::FAN_MOVED_TO)
                    == libc::FAN_ONDIR | libc::FAN_MOVED_TO
                {
                    self.dirs.clear();
                }
                let Some(dir) = dir else {
                    continue;
                };
                let name = name.to_os_string();
                if raw.mask & libc::FAN_ONDIR != 0 {
                    if raw.mask & (libc::FAN_CREATE | libc::FAN_MOVED_TO) != 0 {
                        seen.push(Seen::Tree(dir.join(name)));
                    }
                } else if raw.mask & libc::FAN_MODIFY != 0 {
                    seen.push(Seen::Written {
                        dir: dir.clone(),
                        name: name.clone(),
                    });
                    if raw.mask & libc::FAN_CLOSE_WRITE != 0 {
                        seen.push(Seen::Changed { dir, name });
                    }
                } else {
                    seen.push(Seen::Changed { dir, name });
                }
            }
        }
        self.buf = buf;
        Ok(())
    }

    fn describe(&self) -> String {
        format!(
            "fanotify, {} file system(s) marked whole",
            self.mounts.len()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds one event: metadata, then a DFID_NAME record.
    fn event(mask: u64, pid: i32, fsid: [i32; 2], handle: &[u8], name: &[u8]) -> Vec<u8> {
        let mut rec = vec![libc::FAN_EVENT_INFO_TYPE_DFID_NAME, 0, 0, 0];
        rec.extend_from_slice(&fsid[0].to_ne_bytes());
        rec.extend_from_slice(&fsid[1].to_ne_bytes());
        rec.extend_from_slice(&(handle.len() as u32).to_ne_bytes());
        rec.extend_from_slice(&1i32.to_ne_bytes());
        rec.extend_from_slice(handle);
        rec.extend_from_slice(name);
        rec.push(0);
        while rec.len() % 4 != 0 {
            rec.push(0);
        }
        let rec_len = rec.len() as u16;
        rec[2..4].copy_from_slice(&rec_len.to_ne_bytes());
        let mut ev = Vec::new();
        ev.extend_from_slice(&((24 + rec.len()) as u32).to_ne_bytes());
        ev.extend_from_slice(&[3, 0]);
        ev.extend_from_slice(&24u16.to_ne_bytes());
        ev.extend_from_slice(&mask.to_ne_bytes());
        ev.extend_from_slice(&(-1i32).to_ne_bytes());
        ev.extend_from_slice(&pid.to_ne_bytes());
        ev.extend(rec);
        ev
    }

    #[test]
    fn events_are_parsed_and_a_short_record_ends_them() {
        let mut buf = event(libc::FAN_MODIFY, 7, [1, 2], &[9; 8], b"photo.png");
        buf.extend(event(
            libc::FAN_CREATE | libc::FAN_ONDIR,
            8,
            [1, 2],
            &[5; 12],
            b"new",
        ));
        let events = parse(&buf);
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].mask, libc::FAN_MODIFY);
        assert_eq!(events[0].pid, 7);
        let (fsid, handle, name) = events[0].dfid_name.unwrap();
        assert_eq!(fsid, [1, 2]);
        // The handle as open_by_handle_at takes it: its size, its type, its bytes.
        assert_eq!(handle.len(), 8 + 8);
        assert_eq!(&handle[8..], &[9; 8]);
        assert_eq!(name, OsStr::new("photo.png"));
        assert_eq!(events[1].dfid_name.unwrap().2, OsStr::new("new"));
        // Cut anywhere: never a panic, never a record read past its end.
        for cut in 0..buf.len() {
            let events = parse(&buf[..cut]);
            assert!(events.len() <= 1 || cut == buf.len());
        }
        // An overflow has no record.
        let mut ov = event(libc::FAN_Q_OVERFLOW, 0, [0, 0], &[], b"");
        ov.truncate(24);
        ov[0..4].copy_from_slice(&24u32.to_ne_bytes());
        assert_eq!(parse(&ov)[0].dfid_name, None);
    }
}
