//! The few calls that differ between Linux and macOS, in one place. Linux gets the real
//! thing; elsewhere each degrades to what is safe (no advice, no cache probe).

#![allow(unsafe_code)]

use std::fs::File;
use std::io;

/// Tells the kernel the file will be read once, front to back.
pub fn advise_sequential(file: &File) {
    #[cfg(target_os = "linux")]
    let _ = rustix::fs::fadvise(file, 0, None, rustix::fs::Advice::Sequential);
    #[cfg(not(target_os = "linux"))]
    let _ = file;
}

/// Drops a range already read from the page cache.
pub fn drop_pages(file: &File, offset: u64, len: u64) {
    #[cfg(target_os = "linux")]
    if let Some(len) = std::num::NonZeroU64::new(len) {
        let _ = rustix::fs::fadvise(file, offset, Some(len), rustix::fs::Advice::DontNeed);
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (file, offset, len);
}

/// Starts writing the file's dirty pages to the device, without waiting for them: a later
/// fsync then waits only for what was written since.
pub fn start_writeback(file: &File) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: a plain system call on a descriptor `file` keeps open; the range (0, 0) is
        // the whole file.
        unsafe { libc::sync_file_range(file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE) };
    }
    #[cfg(not(target_os = "linux"))]
    let _ = file;
}

/// Reads at `offset` only what the page cache holds (`preadv2` with `RWF_NOWAIT`):
/// `Some(n)` bytes, or `None` when that would wait for the device or is not supported. With
/// `confirm`, a refusal is checked against the page cache (four more calls) before it is
/// believed: for the run that has met no cold data yet, which a false refusal would turn cold.
pub fn read_cached(
    file: &File,
    buf: &mut [u8],
    offset: u64,
    confirm: bool,
) -> Option<io::Result<usize>> {
    #[cfg(target_os = "linux")]
    loop {
        let mut slices = [io::IoSliceMut::new(buf)];
        let flags = rustix::io::ReadWriteFlags::NOWAIT;
        match rustix::io::preadv2(file, &mut slices, offset, flags) {
            Ok(n) => return Some(Ok(n)),
            Err(rustix::io::Errno::INTR) => continue,
            // The page cache holds it after all: a page still marked for read-ahead (as a
            // plain read by another program leaves it) makes the kernel refuse to read
            // without waiting, and one such file would make a warm run behave as a cold one.
            Err(rustix::io::Errno::AGAIN) if confirm && cached(file, offset, buf.len()) => loop {
                match rustix::io::pread(file, &mut *buf, offset) {
                    Err(rustix::io::Errno::INTR) => continue,
                    read => return Some(read.map_err(io::Error::from)),
                }
            },
            Err(
                rustix::io::Errno::AGAIN | rustix::io::Errno::NOSYS | rustix::io::Errno::OPNOTSUPP,
            ) => {
                return None;
            }
            Err(e) => return Some(Err(e.into())),
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (file, buf, offset, confirm);
        None
    }
}

/// Whether the page cache holds every page of `file` from `offset` for `len` bytes (or to its
/// end): `mincore` over a map of them that is never touched.
#[cfg(target_os = "linux")]
fn cached(file: &File, offset: u64, len: usize) -> bool {
    use std::os::fd::AsRawFd;
    let Ok(size) = file.metadata().map(|m| m.len()) else {
        return false;
    };
    // SAFETY: sysconf reads a constant of the system.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
    let start = offset - offset % page;
    let end = size.min(offset.saturating_add(len as u64));
    if end <= offset {
        return false;
    }
    let span = (end - start) as usize;
    // SAFETY: a new read-only shared map of an open file, never read through, unmapped below.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            span,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            start as libc::off_t,
        )
    };
    if addr == libc::MAP_FAILED {
        return false;
    }
    let mut pages = vec![0u8; span.div_ceil(page as usize)];
    // SAFETY: the live map above, one byte of result per page of it.
    let ok = unsafe { libc::mincore(addr, span, pages.as_mut_ptr()) } == 0;
    // SAFETY: unmapping what was mapped above; nothing refers to it.
    unsafe { libc::munmap(addr, span) };
    ok && pages.iter().all(|p| p & 1 == 1)
}

/// Where `file`'s data starts on its device (the physical byte offset of its first extent,
/// from `FIEMAP`), to read many small files from a disk that seeks in the order they lie on
/// it. `None` for a file with no data on the device (empty, inline, delayed allocation) or
/// where the file system does not say.
pub fn first_block(file: &File) -> Option<u64> {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        // struct fiemap with room for one struct fiemap_extent (linux/fiemap.h).
        #[repr(C)]
        #[derive(Default)]
        struct Fiemap {
            start: u64,
            length: u64,
            flags: u32,
            mapped_extents: u32,
            extent_count: u32,
            reserved: u32,
            logical: u64,
            physical: u64,
            extent_length: u64,
            reserved64: [u64; 2],
            extent_flags: u32,
            extent_reserved: [u32; 3],
        }
        // Data not yet on the device (delayed allocation) or with no address of its own.
        const UNKNOWN: u32 = 0x0002 | 0x0004 | 0x0100 | 0x0200;
        const FS_IOC_FIEMAP: libc::Ioctl = libc::_IOWR::<[u64; 4]>(b'f' as u32, 11);
        let mut map = Fiemap {
            length: u64::MAX,
            extent_count: 1,
            ..Fiemap::default()
        };
        // SAFETY: FS_IOC_FIEMAP reads the header and writes at most `extent_count` (1)
        // extents after it, which `map` has room for.
        let r = unsafe { libc::ioctl(file.as_raw_fd(), FS_IOC_FIEMAP, &mut map as *mut Fiemap) };
        (r == 0 && map.mapped_extents > 0 && map.extent_flags & UNKNOWN == 0)
            .then_some(map.physical)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = file;
        None
    }
}

/// Extra open flags: do not update the access time (owner or root only; callers retry
/// without on `EPERM`).
pub fn noatime() -> rustix::fs::OFlags {
    #[cfg(target_os = "linux")]
    return rustix::fs::OFlags::NOATIME;
    #[cfg(not(target_os = "linux"))]
    return rustix::fs::OFlags::empty();
}

/// A handle on a root directory for [`open_beneath`] and the `*at` calls (`O_PATH` on Linux:
/// no read permission needed). `None` for a root that is a file.
pub fn open_anchor(root: &std::path::Path) -> Option<rustix::fd::OwnedFd> {
    use rustix::fs::OFlags;
    #[cfg(target_os = "linux")]
    let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
    #[cfg(not(target_os = "linux"))]
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    rustix::fs::open(root, flags, rustix::fs::Mode::empty()).ok()
}

/// Opens `rel` under the directory `dir` without following any symlink and without leaving
/// it (`openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`). `None` where that call does not
/// exist (Linux before 5.6, other systems): the caller opens by path instead.
pub fn open_beneath(
    dir: &rustix::fd::OwnedFd,
    rel: &std::path::Path,
    flags: rustix::fs::OFlags,
) -> Option<io::Result<rustix::fd::OwnedFd>> {
    #[cfg(target_os = "linux")]
    {
        use rustix::fs::ResolveFlags;
        let resolve =
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
        // openat2 asks for a retry when a rename raced with the lookup; a tree renamed
        // without pause must not keep the run here forever.
        let mut retries = 0;
        loop {
            match rustix::fs::openat2(dir, rel, flags, rustix::fs::Mode::empty(), resolve) {
                Err(rustix::io::Errno::NOSYS) => return None,
                Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) if retries < 64 => {
                    retries += 1
                }
                // Leaving the root through ".." (a directory moved away meanwhile).
                Err(rustix::io::Errno::XDEV) => {
                    return Some(Err(io::Error::other(
                        "the file moved out of the tree during the run",
                    )));
                }
                other => return Some(other.map_err(io::Error::from)),
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (dir, rel, flags);
        None
    }
}

/// Opens a regular file to read: never through a symlink at its end, never blocking on a
/// FIFO or a device (opened `O_NONBLOCK`, cleared once `fstat` says it is a regular file),
/// never taking a terminal for the controlling one. Anything else is refused: a FIFO that
/// anyone who can write a tree or a parity store plants must not stop a run.
pub fn open_regular(path: &std::path::Path) -> io::Result<File> {
    use rustix::fs::{FileType, Mode, OFlags};
    let flags =
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK | OFlags::NOCTTY;
    let fd = match rustix::fs::open(path, flags, Mode::empty()) {
        Err(rustix::io::Errno::NAMETOOLONG) => open_stepwise(path, flags)?,
        opened => opened?,
    };
    if FileType::from_raw_mode(rustix::fs::fstat(&fd)?.st_mode) != FileType::RegularFile {
        return Err(io::Error::other("not a regular file"));
    }
    rustix::fs::fcntl_setfl(&fd, rustix::fs::fcntl_getfl(&fd)? - OFlags::NONBLOCK)?;
    Ok(File::from(fd))
}

/// `path` opened with `flags` one folder at a time, each resolved as one call would resolve
/// it: a path longer than PATH_MAX (4,096 bytes), which one call refuses (folders nested
/// that deep by any user of a tree, whose files must still be verified and repaired).
fn open_stepwise(
    path: &std::path::Path,
    flags: rustix::fs::OFlags,
) -> io::Result<rustix::fd::OwnedFd> {
    use rustix::fs::{Mode, OFlags};
    use std::path::Component;
    let dir_flags = passage() | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let start = if path.is_absolute() { "/" } else { "." };
    let mut dir = rustix::fs::open(start, dir_flags, Mode::empty())?;
    let mut parts = path
        .components()
        .filter(|c| !matches!(c, Component::RootDir | Component::CurDir))
        .peekable();
    while let Some(part) = parts.next() {
        let last = parts.peek().is_none();
        let at = if last { flags } else { dir_flags };
        dir = rustix::fs::openat(&dir, part.as_os_str(), at, Mode::empty())?;
    }
    Ok(dir)
}

/// How a folder is opened only to pass through it: `O_PATH` where there is one (search
/// permission is enough, as for a path resolved in one call), else for reading.
pub fn passage() -> rustix::fs::OFlags {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    return rustix::fs::OFlags::PATH;
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    return rustix::fs::OFlags::RDONLY;
}

/// What `std::fs::symlink_metadata` says of `path`, for paths of any length: one longer than
/// PATH_MAX is looked at in its folder, opened one step at a time (Linux: the folder is
/// named by its handle).
pub fn lstat(path: &std::path::Path) -> io::Result<std::fs::Metadata> {
    match std::fs::symlink_metadata(path) {
        Err(e) if cfg!(target_os = "linux") && e.raw_os_error() == Some(libc::ENAMETOOLONG) => {
            use std::os::fd::AsRawFd;
            let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
                return Err(e);
            };
            let flags = passage() | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC;
            let dir = open_stepwise(parent, flags)?;
            let at = std::path::PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd()));
            std::fs::symlink_metadata(at.join(name))
        }
        looked => looked,
    }
}

/// The bytes of a regular file (see [`open_regular`]).
pub fn read_regular(path: &std::path::Path) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    io::Read::read_to_end(&mut open_regular(path)?, &mut bytes)?;
    Ok(bytes)
}

/// Open flag that reads around the page cache.
pub fn direct() -> rustix::fs::OFlags {
    #[cfg(target_os = "linux")]
    return rustix::fs::OFlags::DIRECT;
    #[cfg(not(target_os = "linux"))]
    return rustix::fs::OFlags::empty();
}

/// Whether `file` was opened with O_DIRECT (the file system may have refused it).
pub fn is_direct(file: &File) -> bool {
    let d = direct();
    !d.is_empty() && rustix::fs::fcntl_getfl(file).is_ok_and(|f| f.contains(d))
}

/// Reads a mapped range in and fills its page tables (`MADV_POPULATE_READ`, Linux 5.14):
/// `EFAULT` when a page cannot be read (a device error, or past the end of the file), `EINVAL`
/// where the kernel cannot do it.
///
/// # Safety
/// `addr..addr+len` must be a live mapping.
pub unsafe fn populate_read(addr: *mut libc::c_void, len: usize) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        loop {
            // SAFETY: advice on a live mapping (the caller's promise); it changes no contents.
            if unsafe { libc::madvise(addr, len, libc::MADV_POPULATE_READ) } == 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (addr, len);
        Err(io::Error::from_raw_os_error(libc::EINVAL))
    }
}

/// Whether the page at `addr` is in the page cache.
///
/// # Safety
/// `addr` must be page-aligned and inside a live mapping.
pub unsafe fn page_resident(addr: *mut libc::c_void) -> bool {
    let mut v = 0;
    // SAFETY: one page of a live mapping (the caller's promise), one byte of result.
    let ok = unsafe { libc::mincore(addr as _, 1, &mut v) } == 0;
    ok && v & 1 == 1
}

/// Whether the block device `dev` rotates, as Linux's sysfs says (for a partition, its disk's).
/// `None` when it cannot tell (network and RAM file systems, no sysfs, not Linux).
pub fn is_rotational(dev: u64) -> Option<bool> {
    #[cfg(target_os = "linux")]
    {
        let base = format!("/sys/dev/block/{}:{}", libc::major(dev), libc::minor(dev));
        ["queue/rotational", "../queue/rotational"]
            .iter()
            .find_map(|rel| std::fs::read_to_string(format!("{base}/{rel}")).ok())
            .map(|s| s.trim() == "1")
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = dev;
        None
    }
}

/// How far a thread steps back for the rest of the machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gentle {
    /// Nice 19 and the lowest best-effort I/O level: served little, but served, on a machine
    /// that is never idle (the watch's tagging, which must not wait for the machine to rest).
    Low,
    /// Nice 19, `SCHED_IDLE` and the idle I/O class: served only when nothing else wants the
    /// CPU or the disk (a background scrub).
    Idle,
}

/// Lowers the CPU and I/O priority of this thread and of those it starts later (Linux keeps
/// both per thread). Returns what could not be set.
pub fn lower_priority(how: Gentle) -> Vec<io::Error> {
    let mut failed = Vec::new();
    // SAFETY: plain syscalls on the calling thread with valid arguments.
    unsafe {
        if libc::setpriority(libc::PRIO_PROCESS, 0, 19) != 0 {
            failed.push(io::Error::last_os_error());
        }
        #[cfg(target_os = "linux")]
        {
            if how == Gentle::Idle {
                let param = libc::sched_param { sched_priority: 0 };
                if libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) != 0 {
                    failed.push(io::Error::last_os_error());
                }
            }
            // ioprio_set(IOPRIO_WHO_PROCESS, 0, IOPRIO_PRIO_VALUE(class, level))
            const IOPRIO_WHO_PROCESS: libc::c_int = 1;
            const IOPRIO_CLASS_BE: libc::c_int = 2;
            const IOPRIO_CLASS_IDLE: libc::c_int = 3;
            const IOPRIO_CLASS_SHIFT: libc::c_int = 13;
            let prio = match how {
                Gentle::Low => (IOPRIO_CLASS_BE << IOPRIO_CLASS_SHIFT) | 7,
                Gentle::Idle => IOPRIO_CLASS_IDLE << IOPRIO_CLASS_SHIFT,
            };
            if libc::syscall(libc::SYS_ioprio_set, IOPRIO_WHO_PROCESS, 0, prio) != 0 {
                failed.push(io::Error::last_os_error());
            }
        }
        #[cfg(not(target_os = "linux"))]
        let _ = how;
    }
    failed
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// Each level as it says, kept by threads started afterwards; the thread that asked
    /// is the only one lowered (the watch's loop keeps its priority while its runs step back).
    #[test]
    fn lowered_priority_is_inherited_by_later_threads_only() {
        // SAFETY: plain queries of the calling thread.
        let now = || unsafe {
            let ioprio = libc::syscall(libc::SYS_ioprio_get, 1, 0);
            (
                libc::getpriority(libc::PRIO_PROCESS, 0),
                libc::sched_getscheduler(0),
                ioprio >> 13,
                ioprio & 0xff,
            )
        };
        let before = now();
        for (how, policy, class, level) in [
            (Gentle::Low, libc::SCHED_OTHER, 2, 7),
            (Gentle::Idle, libc::SCHED_IDLE, 3, 0),
        ] {
            let (lowered, child) = std::thread::spawn(move || {
                assert!(lower_priority(how).is_empty());
                (now(), std::thread::spawn(now).join().unwrap())
            })
            .join()
            .unwrap();
            assert_eq!(lowered, (19, policy, class as i64, level), "{how:?}");
            assert_eq!(child, lowered, "{how:?}");
        }
        assert_eq!(now(), before, "the asking thread only");
    }

    /// What the page cache holds is told apart from what it does not, whatever read-ahead
    /// marks: the judge of a read the kernel declined to make without waiting.
    #[test]
    fn the_page_cache_is_asked_page_by_page() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![7u8; 3 * 4096 + 100]).unwrap();
        let file = File::open(&path).unwrap();
        file.sync_all().unwrap();
        std::io::Read::read_to_end(&mut &file, &mut Vec::new()).unwrap();
        assert!(cached(&file, 0, 1 << 20), "read just now");
        assert!(cached(&file, 4096 + 5, 10));
        drop_pages(&file, 2 * 4096, 4096);
        assert!(!cached(&file, 0, 1 << 20), "a page dropped");
        assert!(cached(&file, 0, 2 * 4096), "the pages before it");
        assert!(!cached(&file, 1 << 20, 10), "past the end");
        let mut buf = vec![0u8; 1 << 20];
        let n = read_cached(&file, &mut buf, 0, true).unwrap().unwrap();
        assert!(n > 0 && buf[..n].iter().all(|&b| b == 7));
    }

    #[test]
    fn a_file_with_data_on_the_device_says_where_it_starts() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, len: usize| {
            let path = dir.path().join(name);
            std::fs::write(&path, vec![7u8; len]).unwrap();
            let file = File::open(&path).unwrap();
            // Allocated: delayed allocation has no address yet.
            file.sync_all().unwrap();
            file
        };
        let (a, b, empty) = (write("a", 64 << 10), write("b", 64 << 10), write("e", 0));
        let (Some(a), Some(b)) = (first_block(&a), first_block(&b)) else {
            crate::skip!("FIEMAP not supported here: not tested");
        };
        assert_ne!(a, b, "two files with data at one place");
        assert_eq!(a % 512, 0, "not a device offset: {a}");
        assert_eq!(first_block(&empty), None);
    }
}

/// The CPUs this process may run on: threads by default. Asked once: the answer reads cgroup
/// files, and hashing asks for every large file's every window.
pub fn cores() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}
