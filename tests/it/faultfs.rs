//! Real faults: a FUSE file system that mirrors the files of one flat directory and answers
//! reads of a chosen byte range of a chosen file with EIO, as a disk with a bad sector does;
//! and ext4 on a loop device whose backing file lives there ([`BadDisk`]), for a genuine
//! block-device I/O error under a real file system with xattrs, renames and fsyncs.
//!
//! It can also return a flipped bit in the next reads of a chosen byte ([`FaultFs::flip`]):
//! bytes changed between the disk and the reader, which a second read gets right.
//!
//! Everything mounted is unmounted and detached on drop, also when a test fails.

#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner,
    MountOption, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry,
    ReplyOpen, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

/// Which reads fail: byte range `[start, end)` of the file named `name`.
#[derive(Clone, Debug)]
pub struct Bad {
    pub name: OsString,
    pub start: u64,
    pub end: u64,
}

/// A byte that the next `times` reads of it return with its lowest bit flipped.
/// A name, a byte's offset, reads of it left alone first, then reads of it flipped.
type Flip = (OsString, u64, usize, usize);

/// The mounted file system; unmounted on drop.
pub struct FaultFs {
    bad: Arc<Mutex<Vec<Bad>>>,
    flips: Arc<Mutex<Vec<Flip>>>,
    slow: Arc<AtomicU64>,
    _session: fuser::BackgroundSession,
}

impl FaultFs {
    /// Mounts a mirror of the regular files in `backing` at `mountpoint`.
    pub fn mount(backing: &Path, mountpoint: &Path) -> std::io::Result<FaultFs> {
        let mut names: Vec<OsString> = std::fs::read_dir(backing)?
            .filter_map(|e| e.ok())
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .map(|e| e.file_name())
            .collect();
        names.sort();
        let bad = Arc::new(Mutex::new(Vec::new()));
        let flips = Arc::new(Mutex::new(Vec::new()));
        let slow = Arc::new(AtomicU64::new(0));
        let fs = Mirror {
            backing: backing.to_path_buf(),
            names,
            bad: bad.clone(),
            flips: flips.clone(),
            slow: slow.clone(),
            xattrs: Mutex::new(HashMap::new()),
        };
        let mut config = fuser::Config::default();
        config.mount_options = vec![MountOption::FSName("intact-faultfs".into())];
        let session = fuser::spawn_mount(fs, mountpoint, &config)?;
        Ok(FaultFs {
            bad,
            flips,
            slow,
            _session: session,
        })
    }

    /// From now on, every read takes at least `delay` (one at a time: a slow disk).
    pub fn slow(&self, delay: Duration) {
        self.slow.store(delay.as_micros() as u64, Ordering::Relaxed);
    }

    /// From now on, reads of `[start, end)` of `name` fail with EIO (as well as those that
    /// failed before).
    pub fn fail(&self, name: &str, start: u64, end: u64) {
        self.bad.lock().unwrap().push(Bad {
            name: name.into(),
            start,
            end,
        });
    }

    /// The next `times` reads of byte `offset` of `name` return it with a bit flipped (the
    /// file itself keeps its bytes).
    pub fn flip(&self, name: &str, offset: u64, times: usize) {
        self.flip_later(name, offset, 0, times);
    }

    /// As [`FaultFs::flip`], once `skip` reads of that byte returned it as it is.
    pub fn flip_later(&self, name: &str, offset: u64, skip: usize, times: usize) {
        self.flips
            .lock()
            .unwrap()
            .push((name.into(), offset, skip, times));
    }

    /// Reads succeed again.
    pub fn heal(&self) {
        self.bad.lock().unwrap().clear();
    }
}

struct Mirror {
    backing: PathBuf,
    /// Inode n+2 is `names[n]`; 1 is the root.
    names: Vec<OsString>,
    bad: Arc<Mutex<Vec<Bad>>>,
    flips: Arc<Mutex<Vec<Flip>>>,
    /// Microseconds each read takes at least.
    slow: Arc<AtomicU64>,
    xattrs: Mutex<HashMap<Xattr, Vec<u8>>>,
}

/// An attribute: the inode and the name.
type Xattr = (u64, Vec<u8>);

const TTL: Duration = Duration::from_secs(0);

impl Mirror {
    fn name(&self, ino: INodeNo) -> Option<&OsStr> {
        let i = u64::from(ino).checked_sub(2)? as usize;
        self.names.get(i).map(|n| n.as_os_str())
    }

    fn path(&self, ino: INodeNo) -> Option<PathBuf> {
        self.name(ino).map(|n| self.backing.join(n))
    }

    fn attr(&self, ino: INodeNo) -> Option<FileAttr> {
        if u64::from(ino) == 1 {
            return Some(FileAttr {
                ino,
                size: 0,
                blocks: 0,
                atime: UNIX_EPOCH,
                mtime: UNIX_EPOCH,
                ctime: UNIX_EPOCH,
                crtime: UNIX_EPOCH,
                kind: FileType::Directory,
                perm: 0o755,
                nlink: 2,
                uid: 0,
                gid: 0,
                rdev: 0,
                flags: 0,
                blksize: 4096,
            });
        }
        let m = std::fs::metadata(self.path(ino)?).ok()?;
        let t = |s: i64, ns: i64| UNIX_EPOCH + Duration::new(s as u64, ns as u32);
        Some(FileAttr {
            ino,
            size: m.len(),
            blocks: m.blocks(),
            atime: t(m.atime(), m.atime_nsec()),
            mtime: t(m.mtime(), m.mtime_nsec()),
            ctime: t(m.ctime(), m.ctime_nsec()),
            crtime: t(m.ctime(), m.ctime_nsec()),
            kind: FileType::RegularFile,
            perm: (m.mode() & 0o7777) as u16,
            nlink: 1,
            uid: m.uid(),
            gid: m.gid(),
            rdev: 0,
            flags: 0,
            blksize: 4096,
        })
    }

    fn is_bad(&self, ino: INodeNo, offset: u64, len: u64) -> bool {
        let Some(name) = self.name(ino) else {
            return false;
        };
        let bad = self.bad.lock().unwrap();
        bad.iter()
            .any(|b| name == b.name && offset < b.end && offset + len > b.start)
    }
}

impl Filesystem for Mirror {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let found = (u64::from(parent) == 1)
            .then(|| self.names.iter().position(|n| n == name))
            .flatten()
            .and_then(|i| self.attr(INodeNo(i as u64 + 2)));
        match found {
            Some(attr) => reply.entry(&TTL, &attr, Generation(0)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.attr(ino) {
            Some(attr) => reply.attr(&TTL, &attr),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<std::time::SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<std::time::SystemTime>,
        _chgtime: Option<std::time::SystemTime>,
        _bkuptime: Option<std::time::SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let Some(path) = self.path(ino) else {
            return reply.error(Errno::ENOENT);
        };
        let file = std::fs::OpenOptions::new().write(true).open(&path);
        let done = file.and_then(|f| {
            if let Some(size) = size {
                f.set_len(size)?;
            }
            if let Some(TimeOrNow::SpecificTime(t)) = mtime {
                f.set_modified(t)?;
            }
            Ok(())
        });
        match (done, self.attr(ino)) {
            (Ok(()), Some(attr)) => reply.attr(&TTL, &attr),
            _ => reply.error(Errno::EIO),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // No FOPEN_KEEP_CACHE: each open starts from what this file system says, so a
        // fault set after an earlier read is met by the next open.
        match self.name(ino) {
            Some(_) => reply.opened(FileHandle(0), FopenFlags::empty()),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        if self.is_bad(ino, offset, size as u64) {
            return reply.error(Errno::EIO);
        }
        std::thread::sleep(Duration::from_micros(self.slow.load(Ordering::Relaxed)));
        let Some(path) = self.path(ino) else {
            return reply.error(Errno::ENOENT);
        };
        let mut buf = vec![0u8; size as usize];
        let read = File::open(path).and_then(|f| {
            let mut n = 0;
            while n < buf.len() {
                match f.read_at(&mut buf[n..], offset + n as u64)? {
                    0 => break,
                    k => n += k,
                }
            }
            Ok(n)
        });
        if let (Ok(n), Some(name)) = (&read, self.name(ino)) {
            for (flip, at, skip, times) in self.flips.lock().unwrap().iter_mut() {
                if *flip != name || !(offset..offset + *n as u64).contains(at) {
                    continue;
                }
                if *skip > 0 {
                    *skip -= 1;
                } else if *times > 0 {
                    buf[(*at - offset) as usize] ^= 1;
                    *times -= 1;
                }
            }
        }
        match read {
            Ok(n) => reply.data(&buf[..n]),
            Err(_) => reply.error(Errno::EIO),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let Some(path) = self.path(ino) else {
            return reply.error(Errno::ENOENT);
        };
        let written = std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .and_then(|f| f.write_all_at(data, offset));
        match written {
            Ok(()) => reply.written(data.len() as u32),
            Err(_) => reply.error(Errno::EIO),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if u64::from(ino) != 1 {
            return reply.error(Errno::ENOTDIR);
        }
        let entries = [
            (1, FileType::Directory, OsStr::new(".")),
            (1, FileType::Directory, OsStr::new("..")),
        ]
        .into_iter()
        .chain(
            self.names
                .iter()
                .enumerate()
                .map(|(i, n)| (i as u64 + 2, FileType::RegularFile, n.as_os_str())),
        );
        for (i, (ino, kind, name)) in entries.enumerate().skip(offset as usize) {
            if reply.add(INodeNo(ino), i as u64 + 1, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let key = (u64::from(ino), name.as_bytes().to_vec());
        self.xattrs.lock().unwrap().insert(key, value.to_vec());
        reply.ok();
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let key = (u64::from(ino), name.as_bytes().to_vec());
        match self.xattrs.lock().unwrap().get(&key) {
            None => reply.error(Errno::ENODATA),
            Some(v) if size == 0 => reply.size(v.len() as u32),
            Some(v) if v.len() > size as usize => reply.error(Errno::ERANGE),
            Some(v) => reply.data(v),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let mut list = Vec::new();
        for (i, name) in self.xattrs.lock().unwrap().keys() {
            if *i == u64::from(ino) {
                list.extend_from_slice(name);
                list.push(0);
            }
        }
        if size == 0 {
            reply.size(list.len() as u32)
        } else if list.len() > size as usize {
            reply.error(Errno::ERANGE)
        } else {
            reply.data(&list)
        }
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let key = (u64::from(ino), name.as_bytes().to_vec());
        match self.xattrs.lock().unwrap().remove(&key) {
            Some(_) => reply.ok(),
            None => reply.error(Errno::ENODATA),
        }
    }
}

/// Why fault tests cannot run here, if they cannot: they need root, /dev/fuse, losetup and
/// mkfs.ext4.
pub fn unsupported() -> Option<String> {
    if !crate::common::is_root() {
        return Some("needs root".into());
    }
    if !Path::new("/dev/fuse").exists() {
        return Some("no /dev/fuse".into());
    }
    for tool in ["losetup", "mkfs.ext4", "mount", "umount"] {
        if !crate::common::has(tool) {
            return Some(format!("no {tool}"));
        }
    }
    None
}

/// Fault tests say why they skip, and pass vacuously, where faults cannot be made; under
/// `CI=true` a skip is a failure (CI runs as root with FUSE and loop devices).
#[macro_export]
macro_rules! require_faults {
    () => {
        if let Some(why) = $crate::faultfs::unsupported() {
            skip!(format!("fault test cannot run: {why}"));
        }
    };
}

/// A file system made on a loop device over an image file, mounted; unmounted and detached
/// on drop (lazily, so a test that failed with files still open leaves nothing behind).
pub struct LoopFs {
    /// Where it is mounted.
    pub root: PathBuf,
    dev: String,
}

impl LoopFs {
    /// Makes a file system on `image` with `mkfs` (its device appended) and mounts it at
    /// `root`.
    pub fn new(image: &Path, mkfs: &[&str], root: &Path) -> LoopFs {
        let out = std::process::Command::new("losetup")
            .args(["--find", "--show"])
            .arg(image)
            .output()
            .unwrap();
        assert!(out.status.success(), "losetup: {out:?}");
        let fs = LoopFs {
            root: root.to_path_buf(),
            dev: String::from_utf8(out.stdout).unwrap().trim().to_string(),
        };
        std::fs::create_dir_all(root).unwrap();
        sh(std::process::Command::new(mkfs[0])
            .args(&mkfs[1..])
            .arg(&fs.dev));
        sh(std::process::Command::new("mount").arg(&fs.dev).arg(root));
        fs
    }

    /// An ext4 file system of `size_mib` MiB in a temp dir, made with `mkfs.ext4 -q -F` and
    /// `options` (`-I 128`: whole-second timestamps).
    pub fn ext4(dir: &Path, size_mib: u64, options: &[&str]) -> LoopFs {
        let image = dir.join("ext4.img");
        File::create(&image)
            .unwrap()
            .set_len(size_mib << 20)
            .unwrap();
        let mkfs = [&["mkfs.ext4", "-q", "-F"][..], options].concat();
        LoopFs::new(&image, &mkfs, &dir.join("ext4"))
    }
}

fn sh(c: &mut std::process::Command) {
    let out = c.output().unwrap();
    assert!(out.status.success(), "{c:?}: {out:?}");
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.root)
            .status();
        let _ = std::process::Command::new("losetup")
            .args(["-d", &self.dev])
            .status();
        // The loop device lets go of its backing file asynchronously.
        for _ in 0..100 {
            let busy = std::fs::read_to_string("/proc/mounts").is_ok_and(|m| m.contains(&self.dev));
            if !busy {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// An ext4 file system on a loop device whose backing file is on a [`FaultFs`]: reads of a
/// chosen block fail in the block layer, as on a disk with a bad sector.
pub struct BadDisk {
    /// Where the ext4 file system is mounted.
    pub root: PathBuf,
    // Dropped in this order: the file system, then the FUSE mount under it.
    _disk: LoopFs,
    fs: FaultFs,
    _dir: tempfile::TempDir,
}

const IMAGE: &str = "disk.img";
const BLOCK: u64 = 4096;

impl BadDisk {
    /// A fresh `size_mib` MiB ext4 file system (4 KiB blocks, 256-byte inodes).
    pub fn new(size_mib: u64) -> BadDisk {
        let dir = tempfile::Builder::new()
            .prefix("intact-baddisk")
            .tempdir()
            .unwrap();
        let (backing, fuse) = (dir.path().join("backing"), dir.path().join("fuse"));
        for d in [&backing, &fuse] {
            std::fs::create_dir(d).unwrap();
        }
        File::create(backing.join(IMAGE))
            .unwrap()
            .set_len(size_mib << 20)
            .unwrap();
        let fs = FaultFs::mount(&backing, &fuse).unwrap();
        let mkfs = ["mkfs.ext4", "-q", "-F", "-b", "4096", "-I", "256"];
        let disk = LoopFs::new(&fuse.join(IMAGE), &mkfs, &dir.path().join("ext4"));
        BadDisk {
            root: disk.root.clone(),
            _disk: disk,
            fs,
            _dir: dir,
        }
    }

    /// From now on, reading the 4 KiB block at `offset` of `file` (on this disk) fails with
    /// EIO, whatever the page cache held before.
    pub fn fail(&self, file: &Path, offset: u64) {
        let f = File::open(file).unwrap();
        f.sync_all().unwrap();
        let mut block: libc::c_int = (offset / BLOCK) as libc::c_int;
        // FIBMAP: the file's logical block in, the device's block out.
        // SAFETY: the ioctl reads and writes one int.
        let r = unsafe { libc::ioctl(std::os::fd::AsRawFd::as_raw_fd(&f), 1, &mut block) };
        assert!(
            r == 0 && block > 0,
            "FIBMAP: {}",
            std::io::Error::last_os_error()
        );
        drop(f);
        let start = block as u64 * BLOCK;
        self.fs.fail(IMAGE, start, start + BLOCK);
        drop_caches();
    }

    /// Reads succeed again.
    pub fn heal(&self) {
        self.fs.heal();
        drop_caches();
    }
}

/// Writes back and drops every clean page, so that the next read goes to the device.
pub fn drop_caches() {
    let _cache = page_cache();
    rustix::fs::sync();
    std::fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
}

/// The page cache is the machine's, and the tests of this binary run side by side: a test
/// that asserts what the cache holds keeps this while it runs, and dropping the cache waits
/// for it (one such drop once evicted a test's cached file mid-check, in CI).
pub fn page_cache() -> std::sync::MutexGuard<'static, ()> {
    static CACHE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    CACHE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
