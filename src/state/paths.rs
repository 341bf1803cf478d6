//! How files and trees are named in the database: absolute paths, file system ids, the
//! range of paths under a root.

use std::collections::HashMap;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

/// `path` made absolute (against the working directory), without resolving symlinks, and
/// without a trailing slash: `/srv/photos/` and `/srv/photos` are one tree.
pub fn absolute(path: &Path) -> PathBuf {
    absolute_from(&std::env::current_dir().unwrap_or_default(), path)
}

/// As [`absolute`], relative to `cwd`.
pub(crate) fn absolute_from(cwd: &Path, path: &Path) -> PathBuf {
    let b = path.as_os_str().as_bytes();
    let c = cwd.as_os_str().as_bytes();
    match b.first() {
        Some(b'/') if formed(b) => path.to_path_buf(),
        Some(_) if formed(b) && c.first() == Some(&b'/') => {
            let mut joined = Vec::with_capacity(c.len() + 1 + b.len());
            joined.extend_from_slice(c);
            if !c.ends_with(b"/") {
                joined.push(b'/');
            }
            joined.extend_from_slice(b);
            PathBuf::from(std::ffi::OsString::from_vec(joined))
        }
        _ => cwd.join(path).components().collect(),
    }
}

/// As [`absolute_from`], taking `path`: one already absolute and formed (a walk's, from an
/// absolute root) is kept, not copied.
pub(crate) fn absolute_owned(cwd: &Path, path: PathBuf) -> PathBuf {
    let b = path.as_os_str().as_bytes();
    if b.first() == Some(&b'/') && formed(b) {
        return path;
    }
    absolute_from(cwd, &path)
}

/// Whether `b` is already in the form that `components` gives. The walk's paths most often
/// are, or are that under the working directory (`intact check photos`): building them again
/// was most of recording a file (55 M of the 364 M instructions recording 20,000 cost).
fn formed(b: &[u8]) -> bool {
    let ends = b.is_empty()
        || b == b"."
        || b.starts_with(b"./")
        || b.ends_with(b"/")
        || b.ends_with(b"/.");
    // No `//` or `/./` within: only what follows a slash can make one, and one pass over the
    // bytes looks (two scans of every window of two and three bytes were 8% of the
    // reporting thread's samples on small files).
    !ends
        && !b
            .iter()
            .enumerate()
            .any(|(i, &c)| c == b'/' && matches!(&b[i + 1..], [b'/', ..] | [b'.', b'/', ..]))
}

/// File system ids by device number: stable across reboots and remounts, where device
/// numbers are not (statvfs `f_fsid`; the device number where that fails).
#[derive(Default)]
pub struct FsIds {
    by_dev: HashMap<u64, i64>,
    /// The last asked for: most files are on the device of the one before.
    last: Option<(u64, i64)>,
}

impl FsIds {
    /// The id of device `dev`, which `path` is on.
    pub fn of(&mut self, dev: u64, path: &Path) -> i64 {
        if let Some((d, id)) = self.last
            && d == dev
        {
            return id;
        }
        // A path too long for one call is asked of the nearest folder above it that is not
        // (the same file system: a mount that deep is not looked for).
        let id = *self.by_dev.entry(dev).or_insert_with(|| {
            let asked = path.ancestors().find_map(|p| match rustix::fs::statvfs(p) {
                Err(rustix::io::Errno::NAMETOOLONG) => None,
                asked => Some(asked),
            });
            asked
                .and_then(Result::ok)
                .map_or(dev as i64, |s| s.f_fsid as i64)
        });
        self.last = Some((dev, id));
        id
    }
}

/// The key of a run's roots: their absolute paths, one per line.
pub fn roots_key(roots: &[PathBuf]) -> Vec<u8> {
    roots
        .iter()
        .map(|r| absolute(r).into_os_string().into_vec())
        .collect::<Vec<_>>()
        .join(&b'\n')
}

/// The rows under `root`: the range of paths `["ROOT/", "ROOT0")`, and `ROOT` itself (a root
/// that is a file).
pub(crate) fn under(root: &Path) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    let exact = absolute(root).into_os_string().into_vec();
    let mut low = exact.clone();
    // "/" is the one root that ends in a slash.
    if low.last() != Some(&b'/') {
        low.push(b'/');
    }
    let mut high = low.clone();
    *high.last_mut().expect("not empty") = b'/' + 1;
    (low, high, exact)
}

/// Whether the directory `dir` is `above` or beneath it (both absolute, as the database
/// files them).
pub(crate) fn within(dir: &[u8], above: &[u8]) -> bool {
    dir.strip_prefix(above)
        .is_some_and(|rest| rest.is_empty() || rest[0] == b'/' || above.ends_with(b"/"))
}

/// Where a missing file's path now leads to another file system than the one it was recorded
/// on (`fs`): the nearest folder of its path that exists, if that is on another file system
/// (a disk mounted there is not now). File systems that report no identity (0) say nothing.
pub(crate) fn unmounted(path: &Path, fs: i64) -> Option<PathBuf> {
    let holder = path.ancestors().skip(1).find(|a| a.exists())?;
    let now = rustix::fs::statvfs(holder).ok()?.f_fsid as i64;
    (now != fs && now != 0 && fs != 0).then(|| holder.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::within;

    #[test]
    fn a_directory_is_within_itself_and_its_ancestors_only() {
        assert!(within(b"/t", b"/t"));
        assert!(within(b"/t/b", b"/t"));
        assert!(within(b"/t/b/c", b"/t"));
        assert!(within(b"/t", b"/"));
        assert!(!within(b"/tb", b"/t"));
        assert!(!within(b"/t", b"/t/b"));
        assert!(!within(b"/u", b"/t"));
    }
}
