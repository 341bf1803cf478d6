//! What kind of device a tree lives on: spinning disks want one reader at a time, in walk
//! order, because parallel reads turn sequential streams into seeks.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Whether `path` is on a rotational block device, as the kernel reports it
/// (`/sys/dev/block/MAJOR:MINOR/queue/rotational`, or the parent disk's for a partition).
/// `None` when it cannot tell (network and RAM file systems, no sysfs).
pub fn is_rotational(path: &Path) -> Option<bool> {
    let dev = std::fs::symlink_metadata(path).ok()?.dev();
    let base = format!("/sys/dev/block/{}:{}", libc::major(dev), libc::minor(dev));
    ["queue/rotational", "../queue/rotational"]
        .iter()
        .find_map(|rel| std::fs::read_to_string(format!("{base}/{rel}")).ok())
        .map(|s| s.trim() == "1")
}
