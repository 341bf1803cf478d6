//! The file systems mounted beneath a tree (`/proc/self/mountinfo`) and those the machine is
//! told to mount there (`/etc/fstab`): a run with no state database knows a sub-mount that
//! is not mounted only from the latter.

use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

/// A mount point as both tables write it: spaces, tabs, newlines and backslashes as octal
/// escapes (`\040`).
fn unescape(field: &[u8]) -> PathBuf {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let octal = field.get(i + 1..i + 4).and_then(|d| {
            let d = std::str::from_utf8(d).ok()?;
            u8::from_str_radix(d, 8).ok()
        });
        match (field[i], octal) {
            (b'\\', Some(b)) => {
                out.push(b);
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

fn strictly_beneath(m: &Path, roots: &[PathBuf]) -> bool {
    roots.iter().any(|r| m != r && m.starts_with(r))
}

/// The mount points strictly beneath `roots` in `mountinfo` (its fifth field).
pub fn mounts_under(mountinfo: &[u8], roots: &[PathBuf]) -> Vec<PathBuf> {
    mountinfo
        .split(|&b| b == b'\n')
        .filter_map(|line| line.split(|&b| b == b' ').nth(4))
        .map(unescape)
        .filter(|m| strictly_beneath(m, roots))
        .collect()
}

/// The mount points strictly beneath `roots` that `fstab` mounts at boot (its second field;
/// `noauto` entries are mounted by hand or on demand, so their absence says nothing).
pub fn listed_under(fstab: &[u8], roots: &[PathBuf]) -> Vec<PathBuf> {
    fstab
        .split(|&b| b == b'\n')
        .filter(|line| !line.trim_ascii_start().starts_with(b"#"))
        .filter_map(|line| {
            let mut fields = line
                .split(|b| b.is_ascii_whitespace())
                .filter(|f| !f.is_empty());
            let point = fields.nth(1)?;
            let options = fields.nth(1).unwrap_or_default();
            let noauto = options.split(|&b| b == b',').any(|o| o == b"noauto");
            (!noauto).then(|| unescape(point))
        })
        .filter(|m| strictly_beneath(m, roots))
        .collect()
}

/// The file systems `/etc/fstab` mounts beneath `roots` that are not mounted now: their
/// files are not in the tree, and a run that does not say so would pass them silently.
pub fn not_mounted_under(roots: &[PathBuf]) -> Vec<PathBuf> {
    let fstab = std::fs::read("/etc/fstab").unwrap_or_default();
    let mountinfo = std::fs::read("/proc/self/mountinfo").unwrap_or_default();
    let mounted = mounts_under(&mountinfo, roots);
    listed_under(&fstab, roots)
        .into_iter()
        .filter(|m| !mounted.contains(m))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mounts_beneath_the_trees_are_found() {
        let info = b"22 27 0:21 / /proc rw - proc proc rw\n\
            30 27 8:1 / /srv/photos rw - ext4 /dev/sda1 rw\n\
            31 30 8:2 / /srv/photos/2024\\040trip rw - ext4 /dev/sda2 rw\n\
            32 30 8:3 / /srv/photosX rw - ext4 /dev/sda3 rw\n";
        let found = mounts_under(info, &[PathBuf::from("/srv/photos")]);
        assert_eq!(found, vec![PathBuf::from("/srv/photos/2024 trip")]);
        assert!(mounts_under(info, &[PathBuf::from("/home")]).is_empty());
    }

    #[test]
    fn what_fstab_mounts_at_boot_beneath_the_trees_is_found() {
        let fstab = b"# <file system> <mount point> <type> <options> <dump> <pass>\n\
            UUID=1 / ext4 errors=remount-ro 0 1\n\
            UUID=2\t/srv/photos\text4\tdefaults\t0\t2\n\
            UUID=3  /srv/photos/2024\\040trip  ext4  defaults,nofail  0 2\n\
            UUID=4 /srv/photos/usb ext4 noauto,user 0 0\n\
            \t# UUID=5 /srv/photos/old ext4 defaults 0 2\n\
            /swapfile none swap sw 0 0\n\
            UUID=6 /srv/photosX ext4 defaults\n";
        let found = listed_under(fstab, &[PathBuf::from("/srv/photos")]);
        assert_eq!(found, vec![PathBuf::from("/srv/photos/2024 trip")]);
        assert!(listed_under(fstab, &[PathBuf::from("/home")]).is_empty());
    }
}
