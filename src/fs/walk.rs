//! Walking trees: every regular file once, in a deterministic order, nothing followed.
//!
//! The walk streams: it holds only the directories on the current path, so memory stays flat
//! however many files a tree has. The one thing it remembers across the tree is the inodes
//! of files with several hard links, so each inode is hashed once per run.
//!
//! Every directory is opened beneath its root without following symlinks (see
//! [`crate::fs::anchor`]) and listed through that descriptor: a directory swapped for a symlink
//! while the walk runs is an error, never a way out of the tree.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::fs;
use std::io::Read;
use std::ops::ControlFlow;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ignore::Match;
use ignore::gitignore::{Gitignore, GitignoreBuilder};
use ignore::overrides::{Override, OverrideBuilder};
use rustix::fs::AtFlags;

use crate::core::tag::Timestamp;
use crate::fs::anchor::Anchor;

/// The name of the per-directory ignore file (gitignore syntax).
pub const IGNORE_FILE: &str = ".intactignore";

/// How to walk.
#[derive(Clone, Debug, Default)]
pub struct WalkOptions {
    /// Stay on the file system of each root (`-x`).
    pub one_file_system: bool,
    /// Glob patterns (gitignore syntax) of paths to leave out.
    pub excludes: Vec<String>,
    /// intact's own files (its state database, the outputs of the run), if they are kept
    /// inside a tree: never files of it.
    pub own: OwnFiles,
    /// Only these parts of the trees (`intact watch`: where it saw changes), each reached
    /// through its parents as a whole walk reaches it, so that every exclude and ignore file
    /// has its say; `None`: all of them.
    pub only: Option<Arc<Only>>,
}

/// Parts of trees to walk: directories, by the path the walk reaches them by (the root's
/// joined with names), each with what of it.
#[derive(Clone, Debug, Default)]
pub struct Only(pub BTreeMap<PathBuf, Scope>);

/// What of a directory a partial walk takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    /// These entries of it.
    Names(BTreeSet<OsString>),
    /// Its files (not its directories).
    Files,
    /// Everything beneath it.
    Tree,
}

impl Only {
    /// Whether the walk takes everything beneath `dir`.
    fn whole(&self, dir: &Path) -> bool {
        dir.ancestors()
            .any(|a| self.0.get(a).is_some_and(|s| *s == Scope::Tree))
    }

    /// Whether `dir` is, or leads to, a part to walk.
    fn leads_to(&self, dir: &Path) -> bool {
        self.0
            .range::<Path, _>((std::ops::Bound::Included(dir), std::ops::Bound::Unbounded))
            .next()
            .is_some_and(|(k, _)| k.starts_with(dir))
    }

    /// Whether the entry `name` of the directory `dir` (a directory itself, if `is_dir`) is
    /// walked, where not all of `dir` is.
    fn takes(&self, dir: &Path, name: &OsStr, is_dir: bool) -> bool {
        if is_dir {
            return self.leads_to(&dir.join(name));
        }
        match self.0.get(dir) {
            Some(Scope::Names(names)) => names.contains(name),
            Some(Scope::Files | Scope::Tree) => true,
            None => false,
        }
    }
}

/// intact's own files, known by the directory they are in and their name, since they come
/// and go while a run walks: a state database (with its `-wal`, `-shm` and `-journal`, its
/// damage journal `.damage`, and copies of it moved aside as damaged, `.broken-TIME`) and the
/// run's outputs (metrics).
#[derive(Clone, Debug, Default)]
pub struct OwnFiles(Vec<Own>);

#[derive(Clone, Debug)]
struct Own {
    dir: Inode,
    name: OsString,
    /// A state database (with its companions), else an output.
    database: bool,
}

impl OwnFiles {
    /// Adds the state database at `db`, if its directory exists.
    pub fn database(&mut self, db: &Path) {
        self.add(db, true);
    }

    /// Adds an output at `path`, if its directory exists.
    pub fn output(&mut self, path: &Path) {
        self.add(path, false);
    }

    fn add(&mut self, path: &Path, database: bool) {
        let (Ok(dir), Some(name)) = (
            fs::metadata(crate::fs::atomic::parent(path)),
            path.file_name(),
        ) else {
            return;
        };
        self.0.push(Own {
            dir: (dir.dev(), dir.ino()),
            name: name.to_os_string(),
            database,
        });
    }

    /// Whether any of them is in the directory `dir`.
    fn in_dir(&self, dir: Inode) -> bool {
        self.0.iter().any(|o| o.dir == dir)
    }

    /// Why `name`, in the directory `dir`, is one of them, if it is.
    fn holds(&self, dir: Inode, name: &OsStr) -> Option<SkipReason> {
        self.0.iter().find_map(|o| {
            let rest = name.as_bytes().strip_prefix(o.name.as_bytes())?;
            let companion = matches!(rest, b"-wal" | b"-shm" | b"-journal" | b".damage")
                || rest.starts_with(b".broken-")
                || rest.starts_with(b".watch-");
            match (o.dir == dir, o.database) {
                (true, true) if rest.is_empty() || companion => Some(SkipReason::StateDatabase),
                (true, false) if rest.is_empty() => Some(SkipReason::Output),
                _ => None,
            }
        })
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Why an entry is not hashed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SkipReason {
    /// Symbolic links are never followed.
    Symlink,
    /// FIFOs, sockets and device nodes have no data to protect.
    Special,
    /// Another link to an inode already processed in this run.
    HardLink,
    /// A temp file left by a run of intact that was killed (see [`crate::fs::atomic`]).
    Leftover,
    /// A temp file a running intact is writing.
    Temporary,
    /// A damaged copy that repair kept (marked with `user.intact.damaged`): evidence, not a
    /// file to verify or tag.
    KeptDamaged,
    /// intact's state database (or its journal, or a damaged one moved aside).
    StateDatabase,
    /// An output of the run itself (its metrics).
    Output,
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SkipReason::Symlink => "symbolic link, not followed",
            SkipReason::Special => "not a regular file",
            SkipReason::HardLink => "hard link to a file already processed",
            SkipReason::Leftover => "left by an interrupted run of intact",
            SkipReason::Temporary => "being written by a running intact",
            SkipReason::KeptDamaged => "a damaged copy kept by repair",
            SkipReason::StateDatabase => "intact's state database",
            SkipReason::Output => "written by this run of intact (its metrics)",
        })
    }
}

/// One thing the walk found.
#[derive(Debug)]
pub enum Entry {
    /// A regular file to process.
    File {
        /// Its path, starting with its root's.
        path: PathBuf,
        /// Its size when walked.
        size: u64,
        /// The index of the root it was found under.
        root: usize,
        /// Its inode (device, number), if it has other names too.
        inode: Option<Inode>,
        /// What the walk's `stat` said of it (a file listed rather than walked has none).
        stat: Option<Stat>,
    },
    /// Something deliberately not processed.
    Skip {
        /// Its path.
        path: PathBuf,
        /// The index of the root it was found under.
        root: usize,
        /// Why.
        reason: SkipReason,
        /// For a second name of a file, the file's inode.
        inode: Option<Inode>,
    },
    /// A path that could not be examined (unreadable directory, vanished root ...).
    Error {
        /// Its path.
        path: PathBuf,
        /// The index of the root it was found under.
        root: usize,
        /// What went wrong.
        error: std::io::Error,
    },
}

/// A file's identity: its device and inode numbers.
pub type Inode = (u64, u64);

/// A file's identity and state, as `stat` gives them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stat {
    /// Device number.
    pub dev: u64,
    /// Inode number.
    pub ino: u64,
    /// Size in bytes.
    pub size: u64,
    /// Last change of the data.
    pub mtime: Timestamp,
    /// Last change of the data or the metadata (no program can set it).
    pub ctime: Timestamp,
    /// Type and permissions.
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Names the inode has.
    pub nlink: u64,
    /// 512-byte blocks allocated: fewer than the size needs means holes.
    pub blocks: u64,
}

impl Stat {
    /// The state of the open `file`, and whether it is a regular file.
    pub fn of(file: &std::fs::File) -> std::io::Result<(Stat, bool)> {
        let st = rustix::fs::fstat(file)?;
        let regular =
            rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::RegularFile;
        Ok((Stat::from_raw(&st), regular))
    }

    // The stat fields' types differ between Linux and macOS.
    #[allow(clippy::unnecessary_cast)]
    fn from_raw(st: &rustix::fs::Stat) -> Stat {
        Stat {
            dev: st.st_dev as u64,
            ino: st.st_ino as u64,
            size: st.st_size as u64,
            mtime: Timestamp {
                sec: st.st_mtime as i64,
                nsec: st.st_mtime_nsec as u32,
            },
            ctime: Timestamp {
                sec: st.st_ctime as i64,
                nsec: st.st_ctime_nsec as u32,
            },
            mode: st.st_mode as u32,
            uid: st.st_uid,
            gid: st.st_gid,
            nlink: st.st_nlink as u64,
            blocks: st.st_blocks as u64,
        }
    }

    fn from_meta(m: &fs::Metadata) -> Stat {
        Stat {
            dev: m.dev(),
            ino: m.ino(),
            size: m.len(),
            mtime: Timestamp {
                sec: m.mtime(),
                nsec: m.mtime_nsec() as u32,
            },
            ctime: Timestamp {
                sec: m.ctime(),
                nsec: m.ctime_nsec() as u32,
            },
            mode: m.mode(),
            uid: m.uid(),
            gid: m.gid(),
            nlink: m.nlink(),
            blocks: m.blocks(),
        }
    }

    /// Describes how `self` (after reading `bytes_read` bytes) differs from `before`, if it
    /// does: another file under the name, other data, other metadata.
    pub fn changes_since(&self, before: &Stat, bytes_read: u64) -> Option<String> {
        if (self.dev, self.ino) != (before.dev, before.ino) {
            Some("replaced by another file while being read".into())
        } else if self.size != before.size || bytes_read != before.size {
            Some(format!(
                "size changed while being read ({} bytes before, {} read, {} after)",
                before.size, bytes_read, self.size
            ))
        } else if self.mtime != before.mtime {
            Some("modified while being read".into())
        } else if self.ctime != before.ctime {
            Some("metadata changed while being read".into())
        } else {
            None
        }
    }
}

impl Entry {
    /// A path that could not be examined.
    fn error(path: PathBuf, root: usize, error: std::io::Error) -> Entry {
        Entry::Error { path, root, error }
    }
}

/// Checks exclude patterns up front, so a typo is a usage error rather than a failed walk.
pub fn check_globs(globs: &[String]) -> Result<(), ignore::Error> {
    let mut builder = OverrideBuilder::new("/");
    for glob in globs {
        builder.add(&format!("!{glob}"))?;
    }
    builder.build().map(drop)
}

/// Walks `roots` in order, depth first with names sorted bytewise, calling `visit` for every
/// entry that is not a directory. Stops early when `visit` breaks.
pub fn walk(
    roots: &[PathBuf],
    opts: &WalkOptions,
    mut visit: impl FnMut(Entry) -> ControlFlow<()>,
) -> Result<(), ignore::Error> {
    let mut links = HashSet::new();
    for (index, root) in roots.iter().enumerate() {
        if walk_root(index, root, opts, &mut links, &mut visit)?.is_break() {
            break;
        }
    }
    Ok(())
}

/// What a directory entry is, from its `d_type` or, where that says nothing, an `fstatat`.
enum Kind {
    Dir,
    File { nlink: u64, stat: Stat },
    Symlink,
    Special,
    Error(std::io::Error),
}

/// A directory being walked: the path it was reached by, the directory itself (its files are
/// stat'ed through it at their turn), its entries still to visit, and the patterns of its
/// ignore file.
struct Level {
    path: PathBuf,
    fd: OwnedFd,
    names: Vec<u8>,
    entries: std::vec::IntoIter<Item>,
    ignore: Option<Gitignore>,
    /// The directory, if it holds any of intact's own files.
    own_dir: Option<Inode>,
}

fn walk_root(
    index: usize,
    root: &Path,
    opts: &WalkOptions,
    links: &mut HashSet<Inode>,
    visit: &mut impl FnMut(Entry) -> ControlFlow<()>,
) -> Result<ControlFlow<()>, ignore::Error> {
    // intact never follows a symlink, not even one given as a root.
    let meta = match fs::symlink_metadata(root) {
        Err(e) => return Ok(visit(Entry::error(root.to_path_buf(), index, e))),
        Ok(m) => m,
    };
    if !meta.is_dir() {
        let own = fs::metadata(crate::fs::atomic::parent(root))
            .ok()
            .and_then(|d| {
                let name = root.file_name().unwrap_or_default();
                opts.own.holds((d.dev(), d.ino()), name)
            });
        if let Some(reason) = own {
            return Ok(visit(Entry::Skip {
                path: root.to_path_buf(),
                root: index,
                reason,
                inode: None,
            }));
        }
        let kind = kind_of(Ok(meta));
        return Ok(visit(entry(root.to_path_buf(), kind, index, links)));
    }
    let only = opts.only.as_deref().filter(|o| !o.whole(root));
    if only.is_some_and(|o| !o.leads_to(root)) {
        return Ok(ControlFlow::Continue(()));
    }
    let mut overrides = OverrideBuilder::new(root);
    for glob in &opts.excludes {
        overrides.add(&format!("!{glob}"))?;
    }
    let overrides = overrides.build()?;
    // A pattern that ends in a slash takes directories only (as the parity store's, which
    // every run has): a file is matched only where some pattern could take it (matching
    // cost ~800 instructions a file, a tenth of what a check does beside hashing).
    let files_matched = opts.excludes.iter().any(|g| !g.ends_with('/'));
    let anchor = Anchor::new(root);
    let mut stack: Vec<Level> = Vec::new();
    let enter = |path: PathBuf, stack: &mut Vec<Level>| -> Option<(PathBuf, std::io::Error)> {
        let listed = anchor.open_dir(&path).and_then(|fd| {
            let id = if opts.one_file_system || !opts.own.is_empty() {
                let st = rustix::fs::fstat(&fd)?;
                Some((st.st_dev as u64, st.st_ino as u64))
            } else {
                None
            };
            if opts.one_file_system && id.is_some_and(|(dev, _)| dev != meta.dev()) {
                return Ok(None);
            }
            // A partial walk lists only what leads to its parts (no `stat` of the rest).
            let part = only.filter(|o| !o.whole(&path));
            // The ignore file is read whatever the part (and visited only if taken).
            let keep = |name: &OsStr, is_dir: bool| {
                name == IGNORE_FILE || part.is_none_or(|o| o.takes(&path, name, is_dir))
            };
            list(&fd, keep).map(|listing| Some((listing, id, fd)))
        });
        match listed {
            Ok(Some((listing, id, fd))) => {
                let (ignore, bad) = ignore_file(&anchor, &path, &listing, &fd);
                stack.push(Level {
                    path,
                    fd,
                    names: listing.names,
                    entries: listing.entries.into_iter(),
                    ignore,
                    own_dir: id.filter(|id| opts.own.in_dir(*id)),
                });
                bad
            }
            Ok(None) => None,
            Err(e) => Some((path, e)),
        }
    };
    if let Some((path, e)) = enter(root.to_path_buf(), &mut stack)
        && visit(Entry::error(path, index, e)).is_break()
    {
        return Ok(ControlFlow::Break(()));
    }
    while let Some(level) = stack.last_mut() {
        let Some(item) = level.entries.next() else {
            stack.pop();
            continue;
        };
        // What the name decides, taken while the level (which holds it) is at hand.
        let (path, own, unasked, kind) = {
            let name = OsStr::from_bytes(item.name(&level.names));
            // Made at its length at once (`join` copies, then grows the copy).
            let mut path = PathBuf::with_capacity(level.path.as_os_str().len() + 1 + name.len());
            path.push(&level.path);
            path.push(name);
            let own = level.own_dir.and_then(|dir| opts.own.holds(dir, name));
            let unasked = name == IGNORE_FILE
                && only
                    .is_some_and(|o| !o.whole(&level.path) && !o.takes(&level.path, name, false));
            (path, own, unasked, item.kind)
        };
        if let Some(reason) = own {
            let skip = Entry::Skip {
                path,
                root: index,
                reason,
                inode: None,
            };
            if visit(skip).is_break() {
                return Ok(ControlFlow::Break(()));
            }
            continue;
        }
        let is_dir = kind == Type::Dir;
        if unasked {
            continue;
        }
        if excluded(&overrides, is_dir || files_matched, &stack, &path, is_dir) {
            continue;
        }
        let found = if is_dir {
            match enter(path, &mut stack) {
                Some((path, e)) => Entry::error(path, index, e),
                None => continue,
            }
        } else {
            let level = stack.last().expect("the level of the entry");
            let kind = kind.resolve(&level.fd, item.c_name(&level.names));
            entry(path, kind, index, links)
        };
        if visit(found).is_break() {
            return Ok(ControlFlow::Break(()));
        }
    }
    Ok(ControlFlow::Continue(()))
}

/// The entry for something that is not a directory. A file with several links is a file
/// the first time its inode is met, a skipped hard link after.
fn entry(path: PathBuf, kind: Kind, root: usize, links: &mut HashSet<Inode>) -> Entry {
    let skip = |path, reason, inode| Entry::Skip {
        path,
        root,
        reason,
        inode,
    };
    // A temp file of intact's may be a second name of a file being repaired: it must not
    // take the inode's turn (it is never read).
    let temp = || {
        path.file_name()
            .and_then(crate::fs::atomic::temp_pid)
            .is_some()
    };
    match kind {
        Kind::File { nlink, stat } if nlink > 1 && temp() => Entry::File {
            path,
            size: 0,
            root,
            inode: None,
            stat: Some(stat),
        },
        Kind::File { nlink, stat } if nlink > 1 && !links.insert((stat.dev, stat.ino)) => {
            skip(path, SkipReason::HardLink, Some((stat.dev, stat.ino)))
        }
        Kind::File { nlink, stat } => Entry::File {
            path,
            size: stat.size,
            root,
            inode: (nlink > 1).then_some((stat.dev, stat.ino)),
            stat: Some(stat),
        },
        Kind::Symlink => skip(path, SkipReason::Symlink, None),
        Kind::Special | Kind::Dir => skip(path, SkipReason::Special, None),
        Kind::Error(e) => Entry::error(path, root, e),
    }
}

fn kind_of(meta: std::io::Result<fs::Metadata>) -> Kind {
    match meta {
        Err(e) => Kind::Error(e),
        Ok(m) => {
            let t = m.file_type();
            if t.is_dir() {
                Kind::Dir
            } else if t.is_symlink() {
                Kind::Symlink
            } else if t.is_file() {
                Kind::File {
                    nlink: m.nlink(),
                    stat: Stat::from_meta(&m),
                }
            } else {
                Kind::Special
            }
        }
    }
}

/// What the file system says an entry is (`d_type`): a regular file's `stat` waits for its
/// turn in the walk, so that a listing holds a name and a byte an entry.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Type {
    Dir,
    Symlink,
    Special,
    /// A regular file, or an entry whose type the file system does not say.
    Other,
}

impl Type {
    /// What the entry `name` of the directory `dir` is, stat'ed where it must be.
    fn resolve(self, dir: &OwnedFd, name: &std::ffi::CStr) -> Kind {
        match self {
            Type::Dir => Kind::Dir,
            Type::Symlink => Kind::Symlink,
            Type::Special => Kind::Special,
            Type::Other => stat_kind(dir, name),
        }
    }
}

/// An entry of a listing: where its name is in the names, and its type.
#[derive(Clone, Copy)]
struct Item {
    at: u32,
    len: u16,
    kind: Type,
}

impl Item {
    fn name<'a>(&self, names: &'a [u8]) -> &'a [u8] {
        &names[self.at as usize..self.at as usize + self.len as usize]
    }

    /// The name with the NUL the listing keeps after it, for the system calls.
    fn c_name<'a>(&self, names: &'a [u8]) -> &'a std::ffi::CStr {
        let end = self.at as usize + self.len as usize + 1;
        std::ffi::CStr::from_bytes_with_nul(&names[self.at as usize..end])
            .expect("a name and its NUL")
    }
}

/// A directory's entries sorted by name: the names in one buffer, each followed by a NUL (a
/// name allocated for each entry, and another by rustix's `Dir`, were two of a check's ten
/// allocations a file), and eight bytes an entry (a million files in one folder: about 30 MB,
/// where a `stat` kept for each took 130).
struct Listing {
    names: Vec<u8>,
    entries: Vec<Item>,
}

/// The entries of the open directory `fd`, sorted by name, each with its type. Only entries
/// whose type the file system does not say cost an `fstatat` here.
fn list(fd: &OwnedFd, keep: impl Fn(&OsStr, bool) -> bool) -> std::io::Result<Listing> {
    use rustix::fs::FileType;
    let mut listing = Listing {
        names: Vec::new(),
        entries: Vec::new(),
    };
    each_entry(fd, |name, file_type| {
        let bytes = name.to_bytes();
        if bytes == b"." || bytes == b".." {
            return;
        }
        let os = OsStr::from_bytes(bytes);
        let kind = match file_type {
            FileType::Directory => Type::Dir,
            FileType::Symlink => Type::Symlink,
            FileType::Fifo
            | FileType::Socket
            | FileType::CharacterDevice
            | FileType::BlockDevice => Type::Special,
            FileType::RegularFile => Type::Other,
            // Said by nothing but a stat.
            _ => match stat_kind(fd, name) {
                Kind::Dir => Type::Dir,
                Kind::Symlink => Type::Symlink,
                Kind::Special => Type::Special,
                _ => Type::Other,
            },
        };
        if !keep(os, kind == Type::Dir) {
            return;
        }
        let at = listing.names.len();
        listing.names.extend_from_slice(name.to_bytes_with_nul());
        listing.entries.push(Item {
            at: at as u32,
            len: bytes.len() as u16,
            kind,
        });
    })?;
    let names = &listing.names;
    listing
        .entries
        .sort_unstable_by(|a, b| a.name(names).cmp(b.name(names)));
    Ok(listing)
}

/// Each entry of the directory `fd`, with the type the file system says. On Linux through
/// `getdents64` into one buffer (rustix's `Dir` allocates each entry's name).
#[cfg(target_os = "linux")]
fn each_entry(
    fd: &OwnedFd,
    mut each: impl FnMut(&std::ffi::CStr, rustix::fs::FileType),
) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(32 << 10);
    let mut dir = rustix::fs::RawDir::new(fd, buf.spare_capacity_mut());
    while let Some(e) = dir.next() {
        let e = e?;
        each(e.file_name(), e.file_type());
    }
    Ok(())
}

#[cfg(not(target_os = "linux"))]
fn each_entry(
    fd: &OwnedFd,
    mut each: impl FnMut(&std::ffi::CStr, rustix::fs::FileType),
) -> std::io::Result<()> {
    let mut dir = rustix::fs::Dir::read_from(fd)?;
    while let Some(e) = dir.next() {
        let e = e?;
        each(e.file_name(), e.file_type());
    }
    Ok(())
}

// The stat fields' types differ between Linux and macOS.
#[allow(clippy::unnecessary_cast)]
fn stat_kind(dir: impl AsFd, name: &std::ffi::CStr) -> Kind {
    use rustix::fs::FileType;
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Err(e) => Kind::Error(e.into()),
        Ok(st) => match FileType::from_raw_mode(st.st_mode) {
            FileType::RegularFile => Kind::File {
                nlink: st.st_nlink as u64,
                stat: Stat::from_raw(&st),
            },
            FileType::Directory => Kind::Dir,
            FileType::Symlink => Kind::Symlink,
            _ => Kind::Special,
        },
    }
}

/// The patterns of the ignore file in the directory `dir`, if it has one, read beneath the
/// root; and an error entry for lines that are not valid patterns.
fn ignore_file(
    anchor: &Anchor,
    dir: &Path,
    listing: &Listing,
    fd: &OwnedFd,
) -> (Option<Gitignore>, Option<(PathBuf, std::io::Error)>) {
    let (entries, names) = (&listing.entries, &listing.names);
    let has = entries
        .binary_search_by(|e| e.name(names).cmp(IGNORE_FILE.as_bytes()))
        .is_ok_and(|i| {
            let e = entries[i];
            e.kind == Type::Other
                && matches!(e.kind.resolve(fd, e.c_name(names)), Kind::File { .. })
        });
    if !has {
        return (None, None);
    }
    let path = dir.join(IGNORE_FILE);
    let mut text = String::new();
    if let Err(e) = anchor
        .open(&path, false)
        .and_then(|mut f| f.read_to_string(&mut text))
    {
        return (None, Some((path, e)));
    }
    let mut builder = GitignoreBuilder::new(dir);
    let mut bad = None;
    for line in text.lines() {
        if let Err(e) = builder.add_line(Some(path.clone()), line) {
            bad.get_or_insert((path.clone(), std::io::Error::other(e.to_string())));
        }
    }
    match builder.build() {
        Ok(gi) => (Some(gi), bad),
        Err(e) => (None, Some((path, std::io::Error::other(e.to_string())))),
    }
}

/// Whether `--exclude` (where `overridden` says it may take the path) or the nearest ignore
/// file that has a say leaves `path` out.
fn excluded(
    overrides: &Override,
    overridden: bool,
    stack: &[Level],
    path: &Path,
    is_dir: bool,
) -> bool {
    // Matching strips the root from the path component by component, even with no pattern.
    if overridden && !overrides.is_empty() && overrides.matched(path, is_dir).is_ignore() {
        return true;
    }
    for level in stack.iter().rev() {
        if let Some(gi) = &level.ignore {
            match gi.matched(path, is_dir) {
                Match::Ignore(_) => return true,
                Match::Whitelist(_) => return false,
                Match::None => {}
            }
        }
    }
    false
}

/// Every file under `roots` with the tags it carries (read without reading data; files are
/// opened beneath their root, never through a symlink).
pub fn tagged(
    roots: &[PathBuf],
    cancel: &std::sync::atomic::AtomicBool,
    mut each: impl FnMut(PathBuf, Vec<crate::core::tag::Tag>),
) {
    let anchors: Vec<crate::fs::anchor::Anchor> = roots
        .iter()
        .map(|r| crate::fs::anchor::Anchor::new(r))
        .collect();
    let _ = walk(roots, &WalkOptions::default(), |entry| {
        if cancel.load(std::sync::atomic::Ordering::Relaxed) {
            return ControlFlow::Break(());
        }
        if let Entry::File { path, root, .. } = entry
            && let Ok(file) = anchors[root].open(&path, false)
            && let Ok(stored) = crate::fs::xattr::read(&file)
            && !stored.tags.is_empty()
            && !stored.kept_damaged
        {
            each(path, stored.tags);
        }
        ControlFlow::Continue(())
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A partial walk takes the names, files or trees it is given, reached as a whole walk
    /// reaches them: an ignore file above a part still has its say.
    #[test]
    fn a_partial_walk_takes_only_its_parts() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        for rel in [
            "top.txt",
            "a/x",
            "a/y",
            "a/b/x",
            "c/1",
            "c/2",
            "c/sub/3",
            "d/e/4",
            "d/5",
            "skip/6",
            "d/e/junk.tmp",
        ] {
            let p = root.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, b"x").unwrap();
        }
        std::fs::write(root.join(IGNORE_FILE), "*.tmp\n").unwrap();
        let names = |n: &[&str]| Scope::Names(n.iter().map(OsString::from).collect());
        let only = Only(
            [
                (root.join("a"), names(&["x", "missing"])),
                (root.join("c"), Scope::Files),
                (root.join("d"), Scope::Tree),
            ]
            .into_iter()
            .collect(),
        );
        let opts = WalkOptions {
            only: Some(Arc::new(only)),
            ..WalkOptions::default()
        };
        let mut seen = Vec::new();
        walk(std::slice::from_ref(&root), &opts, |e| {
            if let Entry::File { path, .. } = e {
                seen.push(path.strip_prefix(&root).unwrap().to_path_buf());
            }
            ControlFlow::Continue(())
        })
        .unwrap();
        let want: Vec<PathBuf> = ["a/x", "c/1", "c/2", "d/5", "d/e/4"]
            .iter()
            .map(PathBuf::from)
            .collect();
        assert_eq!(seen, want);
    }

    #[test]
    fn any_difference_since_the_walk_is_a_change() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"data").unwrap();
        let mut walked = None;
        walk(&[dir.path().to_path_buf()], &WalkOptions::default(), |e| {
            if let Entry::File { stat, .. } = e {
                walked = stat;
            }
            ControlFlow::Continue(())
        })
        .unwrap();
        let walked = walked.expect("the walk stats what it finds");
        let (now, regular) = Stat::of(&fs::File::open(&path).unwrap()).unwrap();
        assert!(regular);
        assert_eq!(now, walked);
        assert_eq!(now.changes_since(&walked, 4), None);
        assert!(now.changes_since(&walked, 3).is_some(), "a short read");
        // Another file under the name, even with the same size and times.
        let other = Stat {
            ino: walked.ino + 1,
            ..walked
        };
        assert!(
            other
                .changes_since(&walked, 4)
                .unwrap()
                .contains("replaced")
        );
        let touched = Stat {
            ctime: Timestamp {
                sec: walked.ctime.sec + 1,
                ..walked.ctime
            },
            ..walked
        };
        assert!(touched.changes_since(&walked, 4).is_some());
    }

    fn collect(roots: &[PathBuf], opts: &WalkOptions) -> Vec<String> {
        let mut out = Vec::new();
        walk(roots, opts, |e| {
            out.push(match e {
                Entry::File { path, .. } => format!("file {}", path.display()),
                Entry::Skip { path, reason, .. } => format!("skip {} {reason:?}", path.display()),
                Entry::Error { path, .. } => format!("error {}", path.display()),
            });
            ControlFlow::Continue(())
        })
        .unwrap();
        out
    }

    #[test]
    fn sorted_hidden_included_links_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        fs::create_dir(d.join("sub")).unwrap();
        for name in ["b", ".hidden", "a", "sub/z", "sub/.x"] {
            fs::write(d.join(name), name).unwrap();
        }
        fs::hard_link(d.join("a"), d.join("c")).unwrap();
        // A repair's temp name for the same inode comes first, and must not take its turn.
        fs::hard_link(d.join("a"), d.join(".intact-1-0.tmp")).unwrap();
        std::os::unix::fs::symlink("a", d.join("link")).unwrap();
        std::os::unix::fs::symlink(".", d.join("loop")).unwrap();
        let got = collect(&[d.to_path_buf()], &WalkOptions::default());
        let d = d.display();
        assert_eq!(
            got,
            vec![
                format!("file {d}/.hidden"),
                format!("file {d}/.intact-1-0.tmp"),
                format!("file {d}/a"),
                format!("file {d}/b"),
                format!("skip {d}/c HardLink"),
                format!("skip {d}/link Symlink"),
                format!("skip {d}/loop Symlink"),
                format!("file {d}/sub/.x"),
                format!("file {d}/sub/z"),
            ]
        );
    }

    #[test]
    fn a_directory_larger_than_a_read_of_its_entries_is_walked_whole_and_sorted() {
        // 3,000 names of 200 bytes: about 660 KiB of entries, twenty reads of 32 KiB.
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let mut names: Vec<String> = (0..3000)
            .map(|i| format!("{:0>200}", (i * 7919) % 3000))
            .collect();
        for name in &names {
            fs::write(d.join(name), b"x").unwrap();
        }
        names.sort();
        let got = collect(&[d.to_path_buf()], &WalkOptions::default());
        let want: Vec<String> = names
            .iter()
            .map(|n| format!("file {}/{n}", d.display()))
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn excludes_and_ignore_file() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        fs::create_dir(d.join("cache")).unwrap();
        for name in ["keep", "x.tmp", "cache/y", "drop.bak"] {
            fs::write(d.join(name), name).unwrap();
        }
        fs::write(d.join(IGNORE_FILE), "*.bak\n").unwrap();
        let opts = WalkOptions {
            excludes: vec!["*.tmp".into(), "cache/".into()],
            ..Default::default()
        };
        let got = collect(&[d.to_path_buf()], &opts);
        let shown = d.display();
        assert_eq!(
            got,
            vec![
                format!("file {shown}/{IGNORE_FILE}"),
                format!("file {shown}/keep")
            ]
        );
        // Patterns of directories only leave out no file, even one of the same name.
        fs::create_dir(d.join("sub")).unwrap();
        fs::write(d.join("sub/cache"), "a file").unwrap();
        let opts = WalkOptions {
            excludes: vec!["cache/".into(), "keep/".into()],
            ..Default::default()
        };
        let got = collect(&[d.to_path_buf()], &opts);
        assert_eq!(
            got,
            vec![
                format!("file {shown}/{IGNORE_FILE}"),
                format!("file {shown}/keep"),
                format!("file {shown}/sub/cache"),
                format!("file {shown}/x.tmp"),
            ]
        );
    }

    #[test]
    fn root_symlink_and_missing_root() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::os::unix::fs::symlink("/", d.join("l")).unwrap();
        let got = collect(&[d.join("l"), d.join("missing")], &WalkOptions::default());
        assert_eq!(
            got,
            vec![
                format!("skip {}/l Symlink", d.display()),
                format!("error {}/missing", d.display())
            ]
        );
    }
}
