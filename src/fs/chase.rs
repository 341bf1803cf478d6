//! Whether root may follow a tree's PATH: no step of it is one that another user can swap.
//!
//! Beneath a tree intact follows no symlink (see [`anchor`](super::anchor)); the PATH that
//! names the tree is resolved as given, symlinks and all, because it says where the user
//! means. As root that is a risk when a user can change a folder on the way: `mv bob
//! bob.old; ln -s /root/only bob` in a folder of theirs made root's nightly `scrub --update`
//! tag root's private files elsewhere. So, as systemd-tmpfiles and `chase(CHASE_SAFE)` do, the
//! PATH is walked one component at a time and refused where a step leaves a folder that a
//! user other than root owns for something someone else owns (a symlink to `/` counts as a
//! step to `/`), or leaves a folder others can write, unless that folder is sticky and what is
//! in it is root's or the running user's. The tree's own folder, the last step, may belong to
//! anyone (`/srv/nas/alice`, a tree under `/tmp`).

use std::collections::VecDeque;
use std::ffi::OsString;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

/// Why following `path` is refused, if it is: the step that someone else could swap.
pub fn unsafe_step(path: &Path) -> io::Result<Option<String>> {
    let me = rustix::process::geteuid().as_raw();
    let absolute = std::path::absolute(path)?;
    let mut todo: VecDeque<OsString> = parts(&absolute);
    let (mut at, mut st) = (PathBuf::from("/"), std::fs::symlink_metadata("/")?);
    let mut links = 0;
    while let Some(part) = todo.pop_front() {
        if part == ".." {
            at.pop();
            st = std::fs::symlink_metadata(&at)?;
            continue;
        }
        let next = at.join(&part);
        let next_st = std::fs::symlink_metadata(&next)?;
        let last = todo.is_empty();
        let is_link = next_st.file_type().is_symlink();
        // The tree's own folder may be anyone's (but not a link planted where it was).
        if (!last || is_link)
            && let Some(why) = transition(&at, &st, &next, &next_st, me)
        {
            return Ok(Some(why));
        }
        if !is_link {
            (at, st) = (next, next_st);
            continue;
        }
        links += 1;
        if links > 40 {
            return Err(io::Error::from_raw_os_error(libc::ELOOP));
        }
        let target = std::fs::read_link(&next)?;
        for p in parts(&target).into_iter().rev() {
            todo.push_front(p);
        }
        if target.is_absolute() {
            let root = std::fs::symlink_metadata("/")?;
            // The link's folder hands over to `/`: root's, so only a folder of root's may.
            if let Some(why) = transition(&at, &st, Path::new("/"), &root, me) {
                return Ok(Some(why));
            }
            (at, st) = (PathBuf::from("/"), root);
        }
    }
    Ok(None)
}

/// The components of `p` that name something (`..` kept, `.` and `/` left out).
fn parts(p: &Path) -> VecDeque<OsString> {
    p.components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            Component::ParentDir => Some(OsString::from("..")),
            _ => None,
        })
        .collect()
}

/// Why the step from the folder `from` to `to` in it is one another user could swap.
fn transition(
    from: &Path,
    from_st: &std::fs::Metadata,
    to: &Path,
    to_st: &std::fs::Metadata,
    me: u32,
) -> Option<String> {
    let (from_said, to_said) = (crate::text::escape(from), crate::text::escape(to));
    if from_st.uid() != 0 && to_st.uid() != from_st.uid() {
        return Some(format!(
            "{to_said} belongs to user {} but is in {from_said}, which user {} owns and can \
             swap it in",
            to_st.uid(),
            from_st.uid()
        ));
    }
    let others_write = from_st.mode() & 0o022 != 0;
    let sticky = from_st.mode() & 0o1000 != 0;
    if others_write && !(sticky && (to_st.uid() == 0 || to_st.uid() == me)) {
        return Some(format!(
            "{from_said} can be written by others (mode {:04o}), who can swap {to_said} in it",
            from_st.mode() & 0o7777
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{PermissionsExt, chown, symlink};

    #[test]
    fn a_step_another_user_can_swap_is_refused() {
        if !rustix::process::geteuid().is_root() {
            crate::skip!("needs root (other users' folders)");
        }
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let mode = |p: &Path, m: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
        };
        mode(d, 0o755);
        // Root's folders, a tree of anyone's at the end: fine.
        std::fs::create_dir_all(d.join("srv/alice/photos")).unwrap();
        chown(d.join("srv/alice"), Some(65534), None).unwrap();
        assert_eq!(unsafe_step(&d.join("srv/alice")).unwrap(), None);
        // Within alice's folder, her own photos: fine; root's folder in it: refused.
        chown(d.join("srv/alice/photos"), Some(65534), None).unwrap();
        assert_eq!(unsafe_step(&d.join("srv/alice/photos")).unwrap(), None);
        std::fs::create_dir(d.join("srv/alice/photos/root")).unwrap();
        let why = unsafe_step(&d.join("srv/alice/photos/root/x"));
        assert!(why.is_err() || why.unwrap().is_some());
        std::fs::create_dir(d.join("srv/alice/photos/root/x")).unwrap();
        let why = unsafe_step(&d.join("srv/alice/photos/root/x"))
            .unwrap()
            .unwrap();
        assert!(why.contains("which user 65534 owns"), "{why}");
        // Row 3's attack: a link alice put in her folder, to root's files.
        std::fs::create_dir_all(d.join("root-only")).unwrap();
        symlink(d.join("root-only"), d.join("srv/alice/bob")).unwrap();
        std::os::unix::fs::lchown(d.join("srv/alice/bob"), Some(65534), None).unwrap();
        let why = unsafe_step(&d.join("srv/alice/bob")).unwrap().unwrap();
        assert!(why.contains("which user 65534 owns"), "{why}");
        // A link of root's, in root's folder: followed.
        symlink(d.join("srv/alice"), d.join("srv/link")).unwrap();
        assert_eq!(unsafe_step(&d.join("srv/link")).unwrap(), None);
        // Everyone can write: refused, unless sticky and the next step is root's or mine.
        std::fs::create_dir_all(d.join("open/tree")).unwrap();
        mode(&d.join("open"), 0o777);
        std::fs::create_dir_all(d.join("open/tree/sub")).unwrap();
        let why = unsafe_step(&d.join("open/tree/sub")).unwrap().unwrap();
        assert!(why.contains("mode 0777"), "{why}");
        assert_eq!(
            unsafe_step(&d.join("open/tree")).unwrap(),
            None,
            "the tree itself"
        );
        mode(&d.join("open"), 0o1777);
        assert_eq!(unsafe_step(&d.join("open/tree/sub")).unwrap(), None);
        chown(d.join("open/tree"), Some(65534), None).unwrap();
        let why = unsafe_step(&d.join("open/tree/sub")).unwrap().unwrap();
        assert!(why.contains("mode 1777"), "{why}");
    }
}
