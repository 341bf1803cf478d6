//! Files written whole or not at all, and what a killed run left behind.
//!
//! Every file intact creates (an archive, a manifest, a parity set, a repaired file, a kept
//! damaged copy) is written under a temp name in its destination's directory, made durable,
//! renamed into place, and the rename made durable by an fsync of the directory. Nothing is
//! ever under its final name before its bytes are on the medium; a failure before the rename
//! (a full disk, Ctrl-C) removes the temp file. A [`Batch`] makes many files durable with one
//! `syncfs` instead of an fsync each.
//!
//! A run killed outright (SIGKILL, power loss) cannot clean up. So temp names say who made
//! them, `.intact-PID-N.tmp`, and a later run recognises a temp file as stale once no intact
//! process runs under that PID, and removes it ([`is_stale`], [`remove_stale`]).

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{AtFlags, Mode, OFlags};

const PREFIX: &str = ".intact-";
const SUFFIX: &str = ".tmp";

/// A file being written under a temp name in its destination's directory; removed on drop
/// unless it was put in place.
#[derive(Debug)]
pub struct Temp {
    dir: OwnedFd,
    name: OsString,
    file: File,
    placed: bool,
}

impl Temp {
    /// A new, empty temp file (mode 0600) in the open directory `dir`.
    pub fn new_in(dir: impl AsFd) -> io::Result<Temp> {
        let dir = dir.as_fd().try_clone_to_owned()?;
        loop {
            let name = next_name();
            let flags =
                OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
            match rustix::fs::openat(&dir, &name, flags, Mode::from_raw_mode(0o600)) {
                Ok(fd) => {
                    return Ok(Temp {
                        dir,
                        name,
                        file: File::from(fd),
                        placed: false,
                    });
                }
                // Left by an earlier run that had this PID: take the next number.
                Err(rustix::io::Errno::EXIST) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// A new temp file beside `dest`, to be put in place under `dest`'s name.
    pub fn beside(dest: &Path) -> io::Result<Temp> {
        Temp::new_in(open_dir(parent(dest))?)
    }

    /// The open file.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// The temp name, in the destination's directory.
    pub fn name(&self) -> &OsStr {
        &self.name
    }

    /// The directory it is in.
    pub fn dir(&self) -> &OwnedFd {
        &self.dir
    }

    /// Makes the file durable and puts it in place under `name` (in the same directory),
    /// replacing what was there; then makes the rename durable.
    pub fn commit(mut self, name: &OsStr) -> io::Result<()> {
        self.file.sync_all()?;
        self.rename(name, false)?;
        rustix::fs::fsync(&self.dir)?;
        Ok(())
    }

    /// As [`Temp::commit`], but never over an existing file: `AlreadyExists` if `name` is
    /// taken (the temp file is then still there to try another name).
    pub fn commit_new(&mut self, name: &OsStr) -> io::Result<()> {
        self.file.sync_all()?;
        self.rename(name, true)?;
        rustix::fs::fsync(&self.dir)?;
        Ok(())
    }

    /// Puts the file in place under `name`, replacing what was there, without making
    /// anything durable: the caller made its data durable before and makes the rename
    /// durable after (an fsync of the directory).
    pub fn place(&mut self, name: &OsStr) -> io::Result<()> {
        self.rename(name, false)
    }

    /// Puts the file in place without making anything durable (a [`Batch`] does that).
    fn rename(&mut self, name: &OsStr, exclusive: bool) -> io::Result<()> {
        if exclusive {
            rustix::fs::renameat_with(
                &self.dir,
                &self.name,
                &self.dir,
                name,
                rustix::fs::RenameFlags::NOREPLACE,
            )?;
        } else {
            // Checked again just before: nothing but a regular file is replaced.
            replaceable_at(&self.dir, name)?;
            rustix::fs::renameat(&self.dir, &self.name, &self.dir, name)?;
        }
        self.placed = true;
        Ok(())
    }
}

/// Whether intact may put a file at `dest`: nothing is there, or a regular file. A device
/// (`--metrics /dev/null`), a FIFO, a socket, a directory or a symbolic link is never
/// replaced by a rename: an error says what it is.
pub fn replaceable(dest: &Path) -> io::Result<()> {
    let name = dest
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?;
    match open_dir(parent(dest)) {
        Ok(dir) => replaceable_at(&dir, name),
        // Nothing is there to replace; writing there will say why it cannot.
        Err(_) => Ok(()),
    }
}

fn replaceable_at(dir: &OwnedFd, name: &OsStr) -> io::Result<()> {
    use rustix::fs::FileType;
    let st = match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Err(rustix::io::Errno::NOENT) => return Ok(()),
        Err(e) => return Err(e.into()),
        Ok(st) => st,
    };
    let what = match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => return Ok(()),
        FileType::Directory => "a directory",
        FileType::Symlink => "a symbolic link (give the path it points to)",
        FileType::CharacterDevice | FileType::BlockDevice => "a device",
        FileType::Fifo => "a FIFO",
        FileType::Socket => "a socket",
        FileType::Unknown => "not a regular file",
    };
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!(
            "it is {what}; intact writes a file by replacing it whole, and only ever replaces a regular file"
        ),
    ))
}

impl Drop for Temp {
    fn drop(&mut self) {
        if !self.placed {
            let _ = rustix::fs::unlinkat(&self.dir, &self.name, AtFlags::empty());
        }
    }
}

/// Temp files to be put in place together, in the order added, after one `syncfs` of the
/// file system that holds them: a thousand small parity sets cost one sync, not a thousand
/// fsyncs, and still no file is under its final name before its bytes are durable.
#[derive(Debug, Default)]
pub struct Batch {
    /// Each temp file (made with [`Temp::beside`] its destination) and that destination.
    pending: Vec<(Temp, PathBuf)>,
}

impl Batch {
    /// Adds a written temp file, to be put in place as `dest`.
    pub fn add(&mut self, temp: Temp, dest: PathBuf) {
        self.pending.push((temp, dest));
    }

    /// How many files wait.
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    /// Whether no file waits.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Whether a file waits to be put in place as `dest`.
    pub fn has(&self, dest: &Path) -> bool {
        self.pending.iter().any(|(_, d)| d == dest)
    }

    /// Makes every waiting file durable, puts each in place in the order added, then makes
    /// the renames durable. After a failure, the files not yet in place are removed.
    pub fn commit(&mut self) -> io::Result<()> {
        let mut syncs = Syncs::default();
        for (mut temp, dest) in std::mem::take(&mut self.pending) {
            syncs.data(&temp)?;
            let name = dest.file_name().unwrap_or(dest.as_os_str());
            temp.rename(name, false)?;
            syncs.renamed_in(&temp)?;
        }
        for (_, synced) in syncs.dirs() {
            synced?;
        }
        Ok(())
    }
}

/// The syncs that make many temp files and their renames durable, for every writer of many
/// files: the data of all of them at once before any is put in place (one `syncfs` per file
/// system on Linux; an fsync each elsewhere), and the renames with one fsync per directory.
/// No name ever holds bytes before they are durable.
#[derive(Default)]
pub struct Syncs {
    /// Each file system synced (by device), and how that went (elsewhere each file is
    /// synced on its own).
    #[cfg(target_os = "linux")]
    filesystems: Vec<(u64, io::Result<()>)>,
    /// Each directory renamed in (device, inode).
    dirs: Vec<((u64, u64), OwnedFd)>,
}

impl Syncs {
    /// Makes `temp`'s data durable: on Linux with every file written on its file system
    /// (the first call for that file system syncs it; all of a batch are written by then).
    pub fn data(&mut self, temp: &Temp) -> io::Result<()> {
        #[cfg(target_os = "linux")]
        {
            let dev = identity(&temp.file)?.0;
            if !self.filesystems.iter().any(|(d, _)| *d == dev) {
                let done = rustix::fs::syncfs(&temp.file).map_err(io::Error::from);
                self.filesystems.push((dev, done));
            }
            match self.filesystems.iter().find(|(d, _)| *d == dev) {
                Some((_, Err(e))) => Err(io::Error::new(e.kind(), e.to_string())),
                _ => Ok(()),
            }
        }
        #[cfg(not(target_os = "linux"))]
        {
            temp.file.sync_all()
        }
    }

    /// Notes that `temp` was put in place in its directory; that directory's identity.
    pub fn renamed_in(&mut self, temp: &Temp) -> io::Result<(u64, u64)> {
        let id = identity(&temp.dir)?;
        if !self.dirs.iter().any(|(d, _)| *d == id) {
            self.dirs.push((id, temp.dir.try_clone()?));
        }
        Ok(id)
    }

    /// Makes the renames durable: each directory's identity, and how its fsync went.
    pub fn dirs(self) -> Vec<((u64, u64), io::Result<()>)> {
        self.dirs
            .into_iter()
            .map(|(id, dir)| (id, rustix::fs::fsync(dir).map_err(io::Error::from)))
            .collect()
    }
}

/// The device and inode of an open file or directory.
#[allow(clippy::unnecessary_cast)] // The stat fields' types differ between systems.
fn identity(fd: impl AsFd) -> io::Result<(u64, u64)> {
    let st = rustix::fs::fstat(fd)?;
    Ok((st.st_dev as u64, st.st_ino as u64))
}

/// The directory a path is in (`.` for a bare name).
pub fn parent(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Opens a directory for `*at` calls and fsync.
pub fn open_dir(dir: &Path) -> io::Result<OwnedFd> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    Ok(rustix::fs::open(dir, flags, Mode::empty())?)
}

/// A temp name not yet used by this process (the PID makes it unique among running
/// processes; one left by an earlier process with the same PID may exist).
fn next_name() -> OsString {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    OsString::from(format!(
        "{PREFIX}{}-{}{SUFFIX}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ))
}

/// Gives the file `name` in `dir` a second name, a temp name (which a later run removes
/// should this one be killed), and returns it.
pub fn link_temp(dir: &OwnedFd, name: &OsStr) -> io::Result<OsString> {
    loop {
        let temp = next_name();
        match rustix::fs::linkat(dir, name, dir, &temp, rustix::fs::AtFlags::empty()) {
            Err(rustix::io::Errno::EXIST) => continue,
            Err(e) => return Err(e.into()),
            Ok(()) => return Ok(temp),
        }
    }
}

/// The PID in the name of a temp file intact made, if `name` is one.
pub fn temp_pid(name: &OsStr) -> Option<u32> {
    let rest = name
        .as_bytes()
        .strip_prefix(PREFIX.as_bytes())?
        .strip_suffix(SUFFIX.as_bytes())?;
    let (pid, n) = std::str::from_utf8(rest).ok()?.split_once('-')?;
    n.parse::<u64>().ok()?;
    pid.parse().ok()
}

/// Whether `name` is a temp file left by a run of intact that no longer runs.
pub fn is_stale(name: &OsStr) -> bool {
    temp_pid(name).is_some_and(|pid| !intact_runs_as(pid))
}

/// Whether a process with this PID runs and is intact (by its command name, so a PID reused
/// by another program does not keep a stale file alive).
fn intact_runs_as(pid: u32) -> bool {
    if pid == std::process::id() {
        return true;
    }
    let comm = |pid: &str| std::fs::read(format!("/proc/{pid}/comm"));
    match (comm(&pid.to_string()), comm("self")) {
        (Ok(theirs), Ok(ours)) => theirs == ours,
        (Err(_), Ok(_)) => false,
        // No /proc: all that can be asked is whether the PID runs at all.
        _ => rustix::process::Pid::from_raw(pid as i32)
            .is_some_and(|p| rustix::process::test_kill_process(p).is_ok()),
    }
}

/// Removes the stale temp files in `dir` (not below it); returns their paths.
pub fn remove_stale(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| is_stale(&e.file_name()) && e.file_type().is_ok_and(|t| t.is_file()))
        .filter(|e| std::fs::remove_file(e.path()).is_ok())
        .map(|e| e.path())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn committed_whole_or_removed() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("out");
        std::fs::write(&dest, b"old").unwrap();
        let temp = Temp::beside(&dest).unwrap();
        let temp_path = dir.path().join(temp.name());
        assert_eq!(temp_pid(temp.name()), Some(std::process::id()));
        assert!(!is_stale(temp.name()), "our own temp is not stale");
        temp.file().write_all(b"new").unwrap();
        drop(temp);
        assert!(!temp_path.exists(), "a dropped temp file is removed");
        assert_eq!(std::fs::read(&dest).unwrap(), b"old");

        let temp = Temp::beside(&dest).unwrap();
        temp.file().write_all(b"new").unwrap();
        temp.commit(OsStr::new("out")).unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), b"new");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);

        let mut temp = Temp::beside(&dest).unwrap();
        let err = temp.commit_new(OsStr::new("out")).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AlreadyExists);
        temp.commit_new(OsStr::new("out.1")).unwrap();
        assert!(dir.path().join("out.1").exists());
    }

    #[test]
    fn batches_rename_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let mut batch = Batch::default();
        for name in ["a", "b"] {
            let dest = dir.path().join(name);
            let temp = Temp::beside(&dest).unwrap();
            temp.file().write_all(name.as_bytes()).unwrap();
            batch.add(temp, dest);
        }
        assert!(batch.has(&dir.path().join("b")));
        assert!(!dir.path().join("a").exists());
        batch.commit().unwrap();
        assert!(batch.is_empty());
        assert_eq!(std::fs::read(dir.path().join("b")).unwrap(), b"b");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
    }

    #[test]
    fn stale_temps_are_told_by_name_and_dead_pid() {
        let dir = tempfile::tempdir().unwrap();
        // A PID far above any pid_max (2^22) never runs.
        let dead = ".intact-99999999-0.tmp";
        let live = format!(".intact-{}-7.tmp", std::process::id());
        for name in [
            dead,
            &live,
            "intact-1-0.tmp",
            ".intact-1-x.tmp",
            "photo.jpg",
        ] {
            std::fs::write(dir.path().join(name), b"x").unwrap();
        }
        assert_eq!(temp_pid(OsStr::new(dead)), Some(99999999));
        assert_eq!(temp_pid(OsStr::new(".intact-1-x.tmp")), None);
        assert_eq!(
            remove_stale(dir.path()),
            vec![dir.path().join(dead)],
            "only the dead run's temp file goes"
        );
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 4);
    }
}
