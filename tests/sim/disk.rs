//! The simulator's disk: an ext4 file system on a loop device over an image file, and rot
//! made below it (a byte of a file's data block flipped in the image, the file's cached
//! pages dropped): the file system sees nothing, so its ctime, mtime and attributes stay.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The file system's block size (made with `-b 4096`).
const BLOCK: u64 = 4096;

/// A mounted ext4 file system on a loop device, unmounted and detached on drop.
pub struct Disk {
    /// Where it is mounted.
    pub mount: PathBuf,
    image: PathBuf,
    dev: String,
}

impl Disk {
    /// A fresh ext4 file system of `mib` MiB (sparse) in `dir`, mounted at `dir/mnt`.
    pub fn new(dir: &Path, mib: u64) -> io::Result<Disk> {
        let image = dir.join("disk.img");
        File::create(&image)?.set_len(mib << 20)?;
        let dev = run(Command::new("losetup")
            .args(["--find", "--show"])
            .arg(&image))?;
        let disk = Disk {
            mount: dir.join("mnt"),
            image,
            dev: dev.trim().to_string(),
        };
        std::fs::create_dir_all(&disk.mount)?;
        run(Command::new("mkfs.ext4")
            .args(["-q", "-F", "-b", "4096", "-I", "256"])
            .arg(&disk.dev))?;
        run(Command::new("mount").arg(&disk.dev).arg(&disk.mount))?;
        Ok(disk)
    }

    /// Flips the byte at `offset` of `file` (on this disk) in the image, below the file
    /// system, and drops the file's pages so that the next read comes from the disk.
    pub fn flip_below(&self, file: &Path, offset: u64) -> io::Result<()> {
        let f = File::open(file)?;
        f.sync_all()?;
        let block = device_block(&f, offset / BLOCK)?;
        let image = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&self.image)?;
        let at = block * BLOCK + offset % BLOCK;
        let mut b = [0u8];
        image.read_exact_at(&mut b, at)?;
        image.write_all_at(&[b[0] ^ 0x10], at)?;
        image.sync_data()?;
        rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed)?;
        Ok(())
    }
}

/// The device block that holds the file's logical block `logical` (FIBMAP).
fn device_block(f: &File, logical: u64) -> io::Result<u64> {
    const FIBMAP: libc::Ioctl = 1;
    let mut block = logical as libc::c_int;
    // SAFETY: FIBMAP reads and writes the one int it is given.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), FIBMAP, &mut block) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    if block <= 0 {
        return Err(io::Error::other(format!("no block for block {logical}")));
    }
    Ok(block as u64)
}

/// Runs `c`; its stdout, or an error with what it said.
fn run(c: &mut Command) -> io::Result<String> {
    let out = c.output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "{c:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl Drop for Disk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
        let _ = Command::new("losetup").args(["-d", &self.dev]).status();
        for _ in 0..100 {
            let busy = std::fs::read_to_string("/proc/mounts").is_ok_and(|m| m.contains(&self.dev));
            if !busy {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}
