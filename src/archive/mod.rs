//! Archives: redundant copies that carry their own digests.
//!
//! An archive is a plain PAX tar compressed with zstd, so stock tools restore it, tags and
//! all (`tar --xattrs --xattrs-include='*' -I zstd -xf`). Each member holds the file's mode,
//! owner, nanosecond mtime and user xattrs (`SCHILY.xattr.*`, the intact tag among them);
//! sparse files use GNU's sparse format 1.0, so they stay sparse in the archive and when
//! restored. Because every member carries its tag, a copy can be proven good on its own:
//! `archive verify` re-hashes each member against the tag it carries, and `repair` uses a
//! member only once its bytes hash to the damaged file's tag.
//!
//! Writing takes the engine's verdicts: a file goes in only if it was just proven to match
//! its tag (or was tagged just now), and its bytes are hashed again on their way into the
//! archive, so a file that changed between the two reads is caught and reported.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use crate::core::tag::Timestamp;
use crate::fs::xattr::Stored;

mod read;
mod write;

pub use read::{ReadError, Visit, read, verify_member};
pub use write::Writer;

/// How to write an archive.
#[derive(Clone, Debug)]
pub struct Options {
    /// zstd compression level (1–22).
    pub level: i32,
    /// zstd worker threads (0: compress on the calling thread).
    pub threads: u32,
    /// Archive files found damaged too, marked as such, instead of leaving them out.
    pub include_damaged: bool,
    /// mtimes closer than this count as equal, when judging a file the engine left unread.
    pub mtime_window_ns: u64,
}

/// What went into an archive.
#[derive(Clone, Copy, Debug, Default)]
pub struct Stats {
    /// Members written.
    pub members: u64,
    /// Bytes of file data archived.
    pub bytes: u64,
    /// Size of the compressed archive.
    pub compressed: u64,
}

/// The PAX `comment` a member archived in spite of a damage verdict carries (tar ignores
/// comments silently; `archive verify` and `repair` read it).
const DAMAGED_MARK: &str = "intact: archived although found ";

/// A new zstd frame starts at the first member boundary past this much data or this many
/// members: damage to the archive then costs the members of one frame, reading resumes at
/// the next, and frames are read in parallel (an archive of 200,000 tiny files is 13
/// frames, not one).
pub const FRAME_BYTES: u64 = 64 << 20;
const FRAME_MEMBERS: u64 = 16 << 10;

/// The PAX comment that opens each frame with its number (in a global header, which tar
/// ignores), so that reading can resume after damage without visiting a member twice.
const FRAME_MARK: &str = "intact frame ";

/// What kind of thing a member is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A regular file.
    File,
    /// A hard link to an earlier member.
    Link(Vec<u8>),
    /// A symbolic link.
    Symlink(Vec<u8>),
    /// A directory, device or anything else.
    Other,
}

/// One member's metadata, as its headers describe it.
#[derive(Clone, Debug)]
pub struct Member {
    /// Its name, as archived (never used to decide where to write).
    pub name: Vec<u8>,
    /// What it is.
    pub kind: Kind,
    /// The file's size (for a sparse file, with its holes).
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    /// Owner.
    pub uid: u64,
    /// Group.
    pub gid: u64,
    /// Modification time.
    pub mtime: Timestamp,
    /// The file's extended attributes.
    pub xattrs: crate::fs::xattr::Attrs,
    /// The damage verdict it was archived under, if it was archived although damaged.
    pub damaged: Option<String>,
    /// The data runs of a sparse file (offset, length).
    sparse: Option<Vec<(u64, u64)>>,
}

impl Member {
    /// The tags the member carries.
    pub fn stored(&self) -> Stored {
        Stored::from_list(&self.xattrs)
    }

    /// The name, for paths in reports.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(OsStr::from_bytes(&self.name))
    }
}

/// A piece of a member's data, in order.
pub enum Chunk<'a> {
    /// Bytes.
    Data(&'a [u8]),
    /// This many zero bytes that a sparse file does not store.
    Hole(u64),
}

/// Upper bound on an extended header (names, xattrs) of one member.
const MAX_EXTENSION: u64 = 16 << 20;
