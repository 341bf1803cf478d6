//! What the engine says of each file: one value per path, rendered by the reporter.

use std::io;
use std::path::{Path, PathBuf};

use crate::core::classify::{self, Status};
use crate::core::digest::{Algo, Digest};
use crate::core::tag::{self, Damage, Tag, Timestamp};
use crate::fs::walk::{Inode, SkipReason};

/// What was done to a file's tags.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    /// A tag was written with a freshly computed digest.
    Tagged,
    /// The digest was unchanged; the tag was rewritten with the file's current mtime.
    Refreshed,
    /// The file looks corrupt: its old tag was kept as evidence.
    Kept,
    /// intact's tag was removed.
    Removed,
    /// The file was copied into an archive.
    Archived,
    /// Recovery data was written for the file.
    Protected,
    /// The file's data was restored from a verified copy.
    Repaired,
    /// The file was damaged, and its data was accepted as it is (`--accept-corrupt`):
    /// re-tagged.
    Accepted,
}

impl Action {
    /// Every action, in declaration order (summaries count by `action as usize`).
    pub const ALL: [Action; 8] = [
        Action::Tagged,
        Action::Refreshed,
        Action::Kept,
        Action::Removed,
        Action::Archived,
        Action::Protected,
        Action::Repaired,
        Action::Accepted,
    ];

    /// The word used in output.
    pub fn name(self) -> &'static str {
        match self {
            Action::Tagged => "tagged",
            Action::Refreshed => "refreshed",
            Action::Kept => "kept",
            Action::Removed => "removed",
            Action::Archived => "archived",
            Action::Protected => "protected",
            Action::Repaired => "repaired",
            Action::Accepted => "accepted",
        }
    }
}

/// Why a file could not be processed.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// Opening failed.
    #[error("cannot open: {}", cause(.0))]
    Open(io::Error),
    /// Reading the data failed.
    #[error("cannot read: {}", cause(.0))]
    Read(io::Error),
    /// Reading the extended attributes failed.
    #[error("cannot read tags: {}", cause(.0))]
    ReadTags(io::Error),
    /// Writing the tag failed.
    #[error("cannot write tag: {}", cause(.0))]
    WriteTag(io::Error),
    /// Removing the tag failed.
    #[error("cannot remove tag: {}", cause(.0))]
    RemoveTag(io::Error),
    /// The walk could not look at this path.
    #[error("{}", cause(.0))]
    Walk(io::Error),
    /// A temp file left by a killed run could not be removed.
    #[error("cannot remove this temp file of a killed run: {}", cause(.0))]
    RemoveTemp(io::Error),
    /// The file's parity could not be written.
    #[error("cannot write its parity: {}", cause(.0))]
    Protect(io::Error),
    /// Restoring the file's data failed, or was declined; the file was left as it was.
    #[error("cannot repair: {0}; the file was left as it was")]
    Repair(Declined),
    /// Rewriting the file in place failed part way (a file with several names).
    #[error(
        "repair stopped part way: {}; the file is marked, so checks report it as damaged \
         until a repair completes",
        cause(.0)
    )]
    RepairPartial(io::Error),
    /// `export` was asked for one algorithm; the file is tagged with the other.
    #[error("tagged with {0} only: `export --algo {0}` lists it")]
    OtherAlgorithm(Algo),
}

impl FileError {
    /// A stable, machine-readable name for the cause.
    pub fn kind(&self) -> &'static str {
        let e = match self {
            FileError::Open(e)
            | FileError::Read(e)
            | FileError::ReadTags(e)
            | FileError::WriteTag(e)
            | FileError::RemoveTag(e)
            | FileError::RemoveTemp(e)
            | FileError::RepairPartial(e)
            | FileError::Protect(e)
            | FileError::Walk(e) => e,
            FileError::OtherAlgorithm(_) => return "other-algorithm",
            FileError::Repair(declined) => return declined.kind(),
        };
        errno_kind(e)
    }
}

/// The machine-readable name of an I/O error's cause.
fn errno_kind(e: &io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::ENOTSUP) => "no-xattr-support",
        Some(libc::EACCES | libc::EPERM) => "permission-denied",
        Some(libc::ENOENT) => "vanished",
        Some(libc::ENOSPC | libc::E2BIG | libc::EDQUOT) => "no-space",
        Some(libc::EROFS) => "read-only-file-system",
        Some(libc::EIO) => "io-error",
        _ => "other",
    }
}

/// Why a repair left the damaged file (or the path of a missing one) as it was: the file
/// system said no, or the file is no longer what was checked, and replacing it would lose
/// what is there now.
#[derive(Debug, thiserror::Error)]
pub enum Declined {
    /// The file system refused (permission, no space, ...).
    #[error("{}", cause(.0))]
    Io(#[from] io::Error),
    /// Size, mtime or tag moved since the check: an edit must not be overwritten.
    #[error("the file changed since it was checked; run repair again")]
    ChangedSinceChecked,
    /// The file moved while its copy was read.
    #[error("the file changed while its copy was read; run repair again")]
    ChangedWhileRead,
    /// Another file is under its name now.
    #[error("the file was replaced since it was checked; run repair again")]
    Replaced,
    /// A missing file's path holds another file now.
    #[error("its path is taken by another file now, which was left as it is")]
    PathTaken,
    /// Every name to keep the damaged bytes under is taken.
    #[error("no free name to keep the damaged copy under")]
    NoNameToKeep,
    /// The path names no file (a root such as `/`).
    #[error("its path names no file")]
    Unnamed,
    /// The repaired file is in place, but its directory could not be made durable.
    #[error("the repaired file may not survive a crash: {}", cause(.0))]
    NotDurable(io::Error),
}

impl Declined {
    /// A stable, machine-readable name for the cause (see [`FileError::kind`]).
    fn kind(&self) -> &'static str {
        match self {
            Declined::Io(e) | Declined::NotDurable(e) => errno_kind(e),
            Declined::ChangedSinceChecked | Declined::ChangedWhileRead | Declined::Replaced => {
                "changed"
            }
            Declined::PathTaken => "path-taken",
            Declined::NoNameToKeep | Declined::Unnamed => "other",
        }
    }
}

/// The cause in words a user can act on.
pub(crate) fn cause(e: &io::Error) -> String {
    let hint = match e.raw_os_error() {
        Some(libc::ENOTSUP) => "the file system does not support user extended attributes",
        Some(libc::ENOENT) => "the file vanished",
        Some(libc::ENOSPC) => {
            "no space left (on the device or in the file's extended attribute block)"
        }
        Some(libc::E2BIG) => "the extended attribute is too large for this file system",
        Some(libc::EDQUOT) => "disk quota exceeded",
        Some(libc::EROFS) => "read-only file system",
        Some(libc::EIO) => "input/output error (the device could not read it: a failing disk?)",
        Some(libc::ELOOP) => "a directory on its path is now a symbolic link (not followed)",
        _ => return e.to_string(),
    };
    format!("{hint} ({e})")
}

/// Who a file belongs to and who may read it, as it was when looked at: what `repair
/// --missing` gives a file back (another user's private file restored by root must not
/// become root's, readable by everyone).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owner {
    /// Its owner.
    pub uid: u32,
    /// Its group.
    pub gid: u32,
    /// Its permission bits (`0o7777` at most).
    pub mode: u32,
}

impl Owner {
    /// As the state database keeps it: the three fields, little-endian.
    pub fn to_bytes(self) -> [u8; 12] {
        let mut b = [0; 12];
        b[..4].copy_from_slice(&self.uid.to_le_bytes());
        b[4..8].copy_from_slice(&self.gid.to_le_bytes());
        b[8..].copy_from_slice(&self.mode.to_le_bytes());
        b
    }

    /// What [`Owner::to_bytes`] made; `None` for anything else.
    pub fn from_bytes(b: &[u8]) -> Option<Owner> {
        let b: &[u8; 12] = b.try_into().ok()?;
        let word = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        Some(Owner {
            uid: word(0),
            gid: word(4),
            mode: word(8) & 0o7777,
        })
    }
}

/// The outcome for one path: a value, rendered by the reporter.
#[derive(Debug)]
pub struct FileReport {
    /// The path as walked.
    pub path: PathBuf,
    /// The index of the root (of those given) it was found under.
    pub root: usize,
    /// Its inode (device, number), if it has several names: what they share (one read,
    /// damage said under each name).
    pub linked: Option<Inode>,
    /// Its inode (device, number), once it was opened.
    pub inode: Option<Inode>,
    /// What was found.
    pub status: Status,
    /// What was done about it (its tag, its data).
    pub action: Option<Action>,
    /// A copy this run made of it, beside that: `Archived` or `Protected` (a file tagged the
    /// night it is protected was both). It stands once the copy is durable.
    pub copy: Option<Action>,
    /// The file's size now.
    pub size: Option<u64>,
    /// The file's mtime when it was looked at.
    pub mtime: Option<Timestamp>,
    /// Its owner, group and mode when it was looked at.
    pub owner: Option<Owner>,
    /// The tag the verdict is based on.
    pub tag: Option<Tag>,
    /// The digest just computed, if the data was read.
    pub digest: Option<Digest>,
    /// Why the file was skipped.
    pub skip: Option<SkipReason>,
    /// Why the file could not be processed.
    pub error: Option<FileError>,
    /// More about the status: what changed while reading, which tags disagree.
    pub detail: Option<String>,
    /// Malformed tags found on the file (attribute, reason).
    pub malformed: Vec<(&'static str, tag::Malformed)>,
    /// Damage found in it earlier (by the mark on the file or the state database) that this
    /// verdict took into account.
    pub known_damage: Option<Damage>,
    /// Bytes of data read.
    pub bytes_read: u64,
    /// The file itself, left open for the sink to verify (see `Config::sink_verifies`).
    /// Boxed: rare, and a report is moved several times on its way to the sink (a quarter
    /// of its 512 bytes).
    pub open: Option<Box<super::OpenFile>>,
}

impl FileReport {
    /// A report with `status` and nothing else known yet.
    pub fn new(path: PathBuf, status: Status) -> Self {
        FileReport {
            path,
            root: 0,
            linked: None,
            inode: None,
            status,
            action: None,
            copy: None,
            size: None,
            mtime: None,
            owner: None,
            tag: None,
            digest: None,
            skip: None,
            error: None,
            detail: None,
            malformed: Vec::new(),
            known_damage: None,
            bytes_read: 0,
            open: None,
        }
    }

    pub(crate) fn error(path: PathBuf, error: FileError) -> Self {
        FileReport {
            error: Some(error),
            ..FileReport::new(path, Status::Error)
        }
    }

    /// Attaches an error. A damage verdict already reached stays the status: the error (say,
    /// a re-tag that could not be written) must not hide the corruption.
    pub(crate) fn fail(&mut self, error: FileError) {
        if !self.status.is_damage() {
            self.status = Status::Error;
        }
        self.action = None;
        self.error = Some(error);
    }

    pub(crate) fn skipped(path: PathBuf, reason: SkipReason) -> Self {
        FileReport {
            skip: Some(reason),
            ..FileReport::new(path, Status::Skipped)
        }
    }
}

impl FileReport {
    /// The tag of a file the engine left unread for its sink to verify as it reads it
    /// (`already-tagged`: see `Config::sink_verifies`).
    pub fn unread(&self) -> Option<&Tag> {
        match (self.status, &self.tag) {
            (Status::AlreadyTagged, Some(tag)) => Some(tag),
            _ => None,
        }
    }

    /// The verdict on such a file, from the `digest` of the `size` bytes its sink read under
    /// `mtime`: as a check's. A damaged one keeps its tag (the evidence).
    pub fn judge(&mut self, tag: &Tag, size: u64, mtime: Timestamp, digest: Digest, window: u64) {
        self.digest = Some(digest);
        self.bytes_read = size;
        self.status = classify::classify(tag, size, mtime, &digest, window);
        if self.status.is_damage() {
            self.action = Some(Action::Kept);
        }
    }

    /// The path relative to the root it was found under (`roots[self.root]`); for a root
    /// that is a file, its name.
    pub fn relative<'a>(&'a self, roots: &[PathBuf]) -> &'a Path {
        match roots.get(self.root).map(|r| self.path.strip_prefix(r)) {
            Some(Ok(rel)) if !rel.as_os_str().is_empty() => rel,
            _ => Path::new(self.path.file_name().unwrap_or(self.path.as_os_str())),
        }
    }
}
