//! The machine's damage index: the damage root's runs found, without names (file system,
//! inode, the digest of the tag it was found under and of the damaged bytes, when), in a
//! folder of its own that every user may read. Every run reads it, whatever database it
//! keeps (root's second one, a user's, none with `--no-state`), so that damage one database
//! knows is never blessed by a run on another (a `touch`, then an `update` elsewhere, made
//! it an edit, and the first database then saw a matching tag). Root writes it; a user's
//! runs read it only where root owns it and nobody else can write it, and keep their own
//! memory of damage in the journal beside their database; root never reads a user's.
//!
//! It holds the journal's lines with the path left out ([`super::journal`]): damage found,
//! and lines that end it. It is compacted to what is not ended when it grows; an entry whose
//! file was deleted stays (it can match no other file: a file on that inode would need the
//! same tag and the same damaged bytes), at a hundred bytes a damaged file.

use std::fs::OpenOptions;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::damage::add_damage;
use super::journal::{self, Entry};
use crate::engine::KnownDamage;

/// Where it is unless `INTACT_DAMAGE_INDEX` says (a test's own, a packager's choice).
pub const DEFAULT: &str = "/var/lib/intact-damage/index";

/// An index longer than this is compacted when root next writes it.
const COMPACT_AT: u64 = 256 << 10;

/// Where the machine's damage index is. None for the library's own unit tests: they run as
/// root, side by side, and must neither write the machine's index nor read what it holds
/// (the binary's tests each give theirs).
pub fn path() -> Option<PathBuf> {
    if cfg!(test) {
        return None;
    }
    let chosen = std::env::var_os("INTACT_DAMAGE_INDEX").filter(|p| !p.is_empty());
    Some(chosen.map_or_else(|| PathBuf::from(DEFAULT), PathBuf::from))
}

/// Where this run keeps the index, if it does (root's runs do).
pub fn kept() -> Option<PathBuf> {
    path().filter(|_| rustix::process::geteuid().is_root())
}

/// Adds `entries` (damage found, or ended) to the index at `path`, durably, without their
/// paths; its folder is made `0755` and the index `0644`, neither through a symlink.
pub fn append(path: &Path, entries: &[Entry]) -> io::Result<()> {
    let dir = crate::fs::atomic::parent(path);
    match std::fs::DirBuilder::new().mode(0o755).create(dir) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    if !trusted(dir)? {
        return Err(io::Error::other(format!(
            "{} is not a folder of root's that only root can write",
            crate::text::escape(dir)
        )));
    }
    let unnamed: Vec<Entry> = entries
        .iter()
        .map(|e| Entry {
            path: PathBuf::new(),
            ..e.clone()
        })
        .collect();
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.len() > COMPACT_AT) {
        let mut kept = read_from(path)?;
        kept.extend(unnamed);
        let text: String = journal::outstanding(kept).iter().map(Entry::line).collect();
        let temp = crate::fs::atomic::Temp::beside(path)?;
        temp.file().write_all(text.as_bytes())?;
        temp.file()
            .set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644))?;
        return temp.commit(path.file_name().unwrap_or_default());
    }
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    let lines: String = unnamed.iter().map(Entry::line).collect();
    f.write_all(lines.as_bytes())?;
    f.sync_data()
}

/// Adds the damage the index knows (and has not seen end) to `known`, if the index is one to
/// trust: root's, in a folder of root's, neither writable by anyone else.
pub fn read_into(known: &mut KnownDamage) {
    let Some(path) = path() else { return };
    let trusty = trusted(crate::fs::atomic::parent(&path)).unwrap_or(false)
        && trusted(&path).unwrap_or(false);
    if !trusty {
        return;
    }
    for e in journal::outstanding(read_from(&path).unwrap_or_default()) {
        add_damage(known, e.ino, &e.tag, &e.damaged, e.found, e.fs);
    }
}

/// The entries of the index at `path`, read without following a symlink.
fn read_from(path: &Path) -> io::Result<Vec<Entry>> {
    match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
    {
        Ok(f) => journal::read_file(f),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// Whether `p` (not followed if a symlink) is root's and only root can write it.
fn trusted(p: &Path) -> io::Result<bool> {
    let m = std::fs::symlink_metadata(p)?;
    Ok(!m.file_type().is_symlink() && m.uid() == 0 && m.mode() & 0o022 == 0)
}
