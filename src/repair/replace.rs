//! The verified replace: a copy's bytes are hashed on their way into a temp file beside the
//! damaged file, and only bytes that hash to its tag (and have its size) replace it, after
//! the file is proven to be still the one the check judged.
//!
//! The temp file gets the original's user xattrs, owner, mode and times, is made durable, and
//! is renamed over the original. A file with several hard links is rewritten in place instead
//! (every name must see the repair), after it is marked, so that a run killed midway leaves
//! damage that every later check reports. The damaged original is kept (marked so that no
//! later run takes it for a good file) unless the user says otherwise. Until the rename, a
//! failure leaves the original as it was and nothing else behind.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read, Seek, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags, RenameFlags};

use super::{Options, Want, keep_at, kept_note};
use crate::archive::Chunk;
use crate::core::digest::Hasher;
use crate::core::tag::{Timestamp, names};
use crate::engine::{Declined, FileReport, Owner};
use crate::fs::anchor::Anchor;
use crate::fs::atomic::{self, Syncs, Temp};
use crate::fs::xattr;

/// Restores the damaged file of `report` (under `anchor`'s root) from the bytes `fill`
/// streams: hashed on the way into a temp file beside it; only if they match `want` does the
/// temp file replace the original. In a dry run, the bytes are only hashed.
pub(super) fn restore(
    anchor: &Anchor,
    report: &FileReport,
    want: &Want,
    opts: &Options,
    fill: &mut super::Fill<'_>,
) -> Result<Staged, Refused> {
    let path = &report.path;
    let (dir_path, name) = match (path.parent(), path.file_name()) {
        (Some(d), Some(n)) => (d, n),
        _ => return Err(Refused::Target(Declined::Unnamed)),
    };
    let dir = anchor.open_dir(dir_path).map_err(target)?;
    let original = File::from(open_at(&dir, name, OFlags::RDONLY).map_err(target)?);
    let meta = original.metadata().map_err(target)?;
    unchanged(report, want, &original, &meta)?;
    let mut temp = if opts.dry_run {
        None
    } else {
        Some(Temp::new_in(&dir).map_err(target)?)
    };
    // A sparse file comes back sparse, whatever the source streams (parity and backup tools
    // give every zero as data).
    let sparse = meta.blocks().saturating_mul(512) < meta.len();
    let len = verified(
        want,
        temp.as_ref().map(|t| Out::new(t.file(), sparse)),
        fill,
    )?;
    let Some(temp) = temp.take() else {
        return Ok(Staged::Planned);
    };
    let keep = keep_at(&opts.keep, name, &want.rel);
    temp.file().set_len(len).map_err(target)?;
    if meta.nlink() > 1 {
        let restored = rewrite_in_place(temp, name, &original, &meta, want.mtime, len, keep)?;
        return Ok(Staged::Done(shown_in(dir_path, restored)));
    }
    prepare(&temp, &original, &meta, want.mtime).map_err(target)?;
    Ok(Staged::Pending(Box::new(Pending {
        temp,
        name: name.to_os_string(),
        dir_path: dir_path.to_path_buf(),
        original,
        meta,
        keep,
        size: len,
    })))
}

/// Streams the copy `fill` gives into `out` (none in a dry run), hashing it on the way: its
/// length if it is the content `want` names, else why not. The copy is stopped as soon as it
/// is longer than the file it should restore, or the target cannot be written.
fn verified(
    want: &Want,
    mut out: Option<Out<'_>>,
    fill: &mut super::Fill<'_>,
) -> Result<u64, Refused> {
    let mut hasher = Hasher::new(want.digest.algo);
    let mut len = 0u64;
    // Why the stream was stopped from this side.
    let mut write_err = None;
    let mut too_long = false;
    let filled = fill(&mut |chunk| {
        let n = match chunk {
            Chunk::Data(d) => d.len() as u64,
            Chunk::Hole(n) => n,
        };
        len = len.saturating_add(n);
        if want.size.is_some_and(|s| len > s) {
            too_long = true;
            return Err(io::Error::other("longer than the file it should restore"));
        }
        match chunk {
            Chunk::Data(d) => hasher.update(d),
            Chunk::Hole(n) => hasher.update_zeros(n),
        }
        let written = out.as_mut().map_or(Ok(()), |o| o.put(chunk));
        written.map_err(|e| {
            let stop = io::Error::new(e.kind(), "write failed");
            write_err = Some(e);
            stop
        })
    });
    if write_err.is_none()
        && let Some(Err(e)) = out.take().map(Out::finish)
    {
        write_err = Some(e);
    }
    if let Some(e) = write_err {
        return Err(target(e));
    }
    if too_long {
        return Err(Refused::CopyDamaged);
    }
    filled.map_err(Refused::Unreadable)?;
    if hasher.finalize() != want.digest || want.size.is_some_and(|s| s != len) {
        return Err(Refused::CopyDamaged);
    }
    Ok(len)
}

/// Where a verified copy's bytes go: its temp file, written in order. For a sparse file,
/// every block of zeros (4 KiB, aligned in the file) is left a hole, the stream cut into
/// blocks however its chunks fall.
struct Out<'f> {
    file: &'f File,
    sparse: bool,
    /// The bytes of the block being filled (sparse only).
    block: Vec<u8>,
}

const BLOCK: usize = 4096;

impl<'f> Out<'f> {
    fn new(file: &'f File, sparse: bool) -> Self {
        Out {
            file,
            sparse,
            block: Vec::with_capacity(if sparse { BLOCK } else { 0 }),
        }
    }

    fn put(&mut self, chunk: Chunk<'_>) -> io::Result<()> {
        let mut file = self.file;
        match (chunk, self.sparse) {
            (Chunk::Data(d), false) => file.write_all(d),
            (Chunk::Hole(n), false) => skip(file, n),
            (Chunk::Data(mut d), true) => {
                while !d.is_empty() {
                    let take = (BLOCK - self.block.len()).min(d.len());
                    self.block.extend_from_slice(&d[..take]);
                    d = &d[take..];
                    if self.block.len() == BLOCK {
                        self.flush_block()?;
                    }
                }
                Ok(())
            }
            (Chunk::Hole(mut n), true) => {
                if !self.block.is_empty() {
                    let take = ((BLOCK - self.block.len()) as u64).min(n);
                    self.block.resize(self.block.len() + take as usize, 0);
                    n -= take;
                    if self.block.len() == BLOCK {
                        self.flush_block()?;
                    }
                }
                let whole = n - n % BLOCK as u64;
                skip(file, whole)?;
                self.block.resize((n - whole) as usize, 0);
                Ok(())
            }
        }
    }

    /// The full block: a hole if it is all zeros, else written.
    fn flush_block(&mut self) -> io::Result<()> {
        let mut file = self.file;
        if self.block.iter().all(|&b| b == 0) {
            skip(file, self.block.len() as u64)?;
        } else {
            file.write_all(&self.block)?;
        }
        self.block.clear();
        Ok(())
    }

    /// Writes the last partial block (zeros there are the file's length's to give).
    fn finish(mut self) -> io::Result<()> {
        if self.block.iter().any(|&b| b != 0) {
            let mut file = self.file;
            file.write_all(&self.block)?;
        }
        self.block.clear();
        Ok(())
    }
}

/// Moves the write position `n` bytes on, leaving a hole.
fn skip(mut file: &File, n: u64) -> io::Result<()> {
    let n = i64::try_from(n).map_err(io::Error::other)?;
    file.seek(io::SeekFrom::Current(n)).map(drop)
}

/// Brings back a file that is gone (`--missing`) from the bytes `fill` streams: hashed on the
/// way into a temp file in its last directory (made again, beneath the root, if it is gone
/// too); only bytes that hash to the content it had become the file, under its name and
/// never over another file that took it since. It gets a new tag of that content (the mtime
/// is the restore's: the database keeps none) and the owner, group and mode the database
/// recorded; where it recorded none (an earlier intact's database), or they cannot be given
/// (a user restoring another user's file), the file is the restoring user's, mode 0600,
/// and the report says so: never readable by more people than it was.
pub(super) fn restore_missing(
    anchor: &Anchor,
    want: &Want,
    opts: &Options,
    fill: &mut super::Fill<'_>,
) -> Result<Staged, Refused> {
    let name = want
        .path
        .file_name()
        .ok_or(Refused::Target(Declined::Unnamed))?;
    let dir = dirs_beneath(anchor, &want.rel, opts.dry_run, want.owner).map_err(target)?;
    if let Some(dir) = &dir
        && rustix::fs::statat(dir, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW).is_ok()
    {
        return Err(Refused::Target(Declined::PathTaken));
    }
    let temp = match (&dir, opts.dry_run) {
        (Some(dir), false) => Some(Temp::new_in(dir).map_err(target)?),
        _ => None,
    };
    let len = verified(want, temp.as_ref().map(|t| Out::new(t.file(), false)), fill)?;
    let Some(mut temp) = temp else {
        return Ok(Staged::Planned);
    };
    let tagged = (|| -> io::Result<Option<String>> {
        temp.file().set_len(len)?;
        let (now, _) = crate::fs::walk::Stat::of(temp.file())?;
        let value = crate::core::tag::encode(&want.digest, len, now.mtime, Timestamp::now().sec);
        xattr::write_intact(temp.file(), &value)?;
        // After the tag: a user may tag only a file they may write (one recorded read-only
        // is made so last); owner and mode leave the mtime the tag holds as it is.
        give_back(temp.file(), want.owner)
    })();
    let warning = tagged.map_err(target)?;
    match temp.commit_new(name) {
        Ok(()) => Ok(Staged::Done(Restored {
            kept: None,
            warning,
        })),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Err(target(Declined::PathTaken)),
        Err(e) => Err(target(e)),
    }
}

/// Gives a file brought back its recorded owner, group and mode (the owner first: a change
/// of owner clears set-user-ID bits); else makes it the restoring user's, 0600. What could
/// not be given is returned, to be said.
fn give_back(file: &File, owner: Option<Owner>) -> io::Result<Option<String>> {
    let private = |why: String| -> io::Result<Option<String>> {
        rustix::fs::fchmod(file, Mode::from_raw_mode(0o600))?;
        Ok(Some(format!(
            "{why}: it is the restoring user's, mode 0600"
        )))
    };
    let Some(o) = owner else {
        return private(
            "its owner and mode were not recorded (a database of an earlier intact)".into(),
        );
    };
    let (uid, gid) = (
        rustix::fs::Uid::from_raw(o.uid),
        rustix::fs::Gid::from_raw(o.gid),
    );
    if let Err(e) = rustix::fs::fchown(file, Some(uid), Some(gid)) {
        return private(format!(
            "it could not be given back to user {} and group {} ({e})",
            o.uid, o.gid
        ));
    }
    rustix::fs::fchmod(file, Mode::from_raw_mode(o.mode as rustix::fs::RawMode))?;
    Ok(None)
}

/// The directory `rel` (a file's path relative to its root) is in, opened beneath the root
/// component by component without following symlinks, each that is gone made again unless
/// this is a dry run (then `None` where one is gone). A folder made again is `0700` and the
/// file's recorded owner's (else its parent's owner's): never a folder of the restoring
/// user's in someone else's tree, and one the file's owner can reach.
fn dirs_beneath(
    anchor: &Anchor,
    rel: &Path,
    dry_run: bool,
    owner: Option<Owner>,
) -> io::Result<Option<OwnedFd>> {
    let mut dir = anchor.open_dir(anchor.root())?;
    let parent = rel.parent().unwrap_or(Path::new(""));
    for part in parent.components() {
        let std::path::Component::Normal(part) = part else {
            return Err(io::Error::other("unexpected path component"));
        };
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        dir = match rustix::fs::openat(&dir, part, flags, Mode::empty()) {
            Ok(next) => next,
            Err(rustix::io::Errno::NOENT) if dry_run => return Ok(None),
            Err(rustix::io::Errno::NOENT) => {
                rustix::fs::mkdirat(&dir, part, Mode::from_raw_mode(0o700))?;
                let made = rustix::fs::openat(&dir, part, flags, Mode::empty())?;
                let parent = rustix::fs::fstat(&dir)?;
                let (uid, gid) = owner.map_or((parent.st_uid, parent.st_gid), |o| (o.uid, o.gid));
                // Only a folder of the restoring user's is given away: one another user put
                // in its place meanwhile is theirs already (and as a user, a folder can only
                // be one's own).
                let st = rustix::fs::fstat(&made)?;
                if st.st_uid == rustix::process::geteuid().as_raw() {
                    let _ = rustix::fs::fchown(
                        &made,
                        Some(rustix::fs::Uid::from_raw(uid)),
                        Some(rustix::fs::Gid::from_raw(gid)),
                    );
                }
                made
            }
            Err(e) => return Err(e.into()),
        };
    }
    Ok(Some(dir))
}

/// `restored`, its name kept beside shown with the directory `dir_path` it is in.
fn shown_in(dir_path: &Path, mut restored: Restored) -> Restored {
    restored.kept = restored.kept.map(|k| {
        if k.parent() == Some(Path::new("")) {
            dir_path.join(k)
        } else {
            k
        }
    });
    restored
}

/// What a verified copy became.
pub(super) enum Staged {
    /// The copy is verified, and a dry run leaves it at that: the plan, said as such.
    Planned,
    /// It is in place.
    Done(Restored),
    /// It waits to be put in place with others ([`commit`]).
    Pending(Box<Pending>),
}

/// Verified bytes in a temp file beside the damaged file, with the original's xattrs, owner,
/// mode and times, waiting for [`commit`].
pub(super) struct Pending {
    temp: Temp,
    name: OsString,
    dir_path: PathBuf,
    original: File,
    meta: std::fs::Metadata,
    keep: Option<KeepAt>,
    /// Bytes of data waiting to be made durable.
    pub size: u64,
}

/// Puts verified copies in place: one `syncfs` per file system makes every copy's bytes
/// durable, then each is renamed over its damaged file (if that is still as it was checked),
/// then one fsync per directory makes the renames durable. Many small repairs cost a few
/// syncs, not two fsyncs each; and as before, no name holds bytes before they are durable: a
/// kill at any moment leaves each file either its damaged bytes or its verified new ones.
/// The results are in the order of `pending`.
pub(super) fn commit(pending: Vec<Pending>) -> Vec<Result<Restored, Refused>> {
    let mut syncs = Syncs::default();
    // Each copy put in place, with its directory's identity.
    let placed: Vec<_> = pending
        .into_iter()
        .map(|mut p| {
            let put = (|| -> Result<_, Declined> {
                syncs.data(&p.temp)?;
                let linked = place(&mut p)?;
                Ok((linked, syncs.renamed_in(&p.temp)?))
            })();
            (p, put)
        })
        .collect();
    let dirs = syncs.dirs();
    placed
        .into_iter()
        .map(|(p, put)| {
            let (linked, id) = put.map_err(target)?;
            if let Some((_, Err(e))) = dirs.iter().find(|(d, _)| *d == id) {
                let e = io::Error::new(e.kind(), e.to_string());
                return Err(Refused::Target(Declined::NotDurable(e)));
            }
            Ok(shown_in(&p.dir_path, finish_keeping(&p, linked)))
        })
        .collect()
}

/// The damaged inode's temp name, and the name to keep it under once the repair is in place.
type Linked = (OsString, OsString);

/// Makes sure the damaged file is still the one the check judged: same size, same mtime,
/// same tag (an edit since the check must not be overwritten).
fn unchanged(
    report: &FileReport,
    want: &Want,
    file: &File,
    meta: &std::fs::Metadata,
) -> Result<(), Refused> {
    let now = Timestamp {
        sec: meta.mtime(),
        nsec: meta.mtime_nsec() as u32,
    };
    let same = meta.is_file()
        && Some(meta.len()) == report.size
        && Some(now) == report.mtime
        && xattr::read(file)
            .map_err(target)?
            .tags
            .iter()
            .any(|tag| tag.digest == want.digest);
    if same {
        Ok(())
    } else {
        Err(Refused::Target(Declined::ChangedSinceChecked))
    }
}

/// A successful restore.
#[derive(Default)]
pub(super) struct Restored {
    /// Where the damaged original was kept.
    pub kept: Option<PathBuf>,
    /// Something that went wrong after the repaired file was in place.
    pub warning: Option<String>,
}

/// Why a restore did not happen.
pub(super) enum Refused {
    /// The copy's bytes do not hash to the tag.
    CopyDamaged,
    /// The copy could not be read.
    Unreadable(io::Error),
    /// The damaged file or its directory could not be written: nothing was changed.
    Target(Declined),
    /// Rewriting a file with several names in place failed part way: it is marked, so every
    /// check reports it as damaged until a repair completes.
    Partial(io::Error),
}

/// The damaged file's side refused: trying other copies would fail the same way.
fn target(e: impl Into<Declined>) -> Refused {
    Refused::Target(e.into())
}

pub(super) enum KeepAt {
    /// A name in the same directory.
    Beside(OsString),
    /// A path elsewhere.
    Elsewhere(PathBuf),
}

/// Gives the verified bytes in `temp` the damaged file's user xattrs, owner, mode and times
/// (the mtime its tag records, if it records one: see [`set_times`]).
fn prepare(
    temp: &Temp,
    original: &File,
    meta: &std::fs::Metadata,
    mtime: Option<Timestamp>,
) -> io::Result<()> {
    let attrs = xattr::read_all(original)?;
    xattr::write_all(
        temp.file(),
        // The marks of an unfinished repair and of the damage do not describe the good copy.
        attrs
            .iter()
            .filter(|(n, _)| n != names::REPAIRING && n != names::CORRUPT),
    )?;
    let (uid, gid) = (meta.uid(), meta.gid());
    if let Err(e) = rustix::fs::fchown(
        temp.file(),
        Some(rustix::fs::Uid::from_raw(uid)),
        Some(rustix::fs::Gid::from_raw(gid)),
    ) && (uid, gid)
        != (
            rustix::process::getuid().as_raw(),
            rustix::process::getgid().as_raw(),
        )
    {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("cannot give the repaired file its owner {uid}:{gid} ({e})"),
        ));
    }
    rustix::fs::fchmod(
        temp.file(),
        Mode::from_raw_mode((meta.mode() & 0o7777) as _),
    )?;
    set_times(temp.file(), meta, mtime)
}

/// Renames the durable temp file of `p` over the damaged file, if that is still as it was
/// checked, after keeping the damaged bytes if asked. Kept beside, the damaged inode first
/// gets a temp name, and its kept name only once the repair is in place: a kill in between
/// leaves a temp file that the next run removes, never a second name that would make the next
/// repair rewrite both names in place. Returns that temp name and the name to keep under.
fn place(p: &mut Pending) -> Result<Option<Linked>, Declined> {
    let dir = p.temp.dir().try_clone()?;
    still_in_place(&dir, &p.name, &p.meta)?;
    let (linked, copied) = match &p.keep {
        None => (None, None),
        Some(KeepAt::Beside(k)) => (Some((atomic::link_temp(&dir, &p.name)?, k.clone())), None),
        Some(KeepAt::Elsewhere(path)) => (None, Some(copy_to(&p.original, &p.name, path)?)),
    };
    if let Err(e) = p.temp.place(&p.name) {
        if let Some((t, _)) = &linked {
            unkeep(&dir, Path::new(t));
        }
        if let Some(k) = &copied {
            unkeep(&dir, k);
        }
        return Err(e.into());
    }
    Ok(linked)
}

/// Once the repair of `p` is in place: the damaged inode kept beside (under the temp name
/// `linked`) gets its kept name, marked and without its tag, so that no later run reports
/// the same damage again or takes it for a good file.
fn finish_keeping(p: &Pending, linked: Option<Linked>) -> Restored {
    let mut restored = Restored::default();
    if let Some(KeepAt::Elsewhere(k)) = &p.keep {
        restored.kept = Some(k.clone());
    }
    let Some((t, k)) = linked else {
        return restored;
    };
    let dir = p.temp.dir();
    let finished = (|| {
        xattr::mark_kept_damaged(&p.original, &kept_note(&p.name))?;
        xattr::remove_intact(&p.original)?;
        free_name(&k, |k| {
            rustix::fs::renameat_with(dir, &t, dir, k, RenameFlags::NOREPLACE)
                .map_err(io::Error::from)
        })
    })();
    match finished {
        Ok(k) => restored.kept = Some(k),
        Err(e) => {
            restored.warning = Some(format!("keeping the damaged copy failed: {e}"));
            unkeep(dir, Path::new(&t));
        }
    }
    restored
}

/// Makes sure `name` in `dir` is still the damaged file as it was opened (same inode, size
/// and mtime), just before it is replaced: an edit or a replacement made while the copy was
/// being read must not be overwritten.
fn still_in_place(dir: &OwnedFd, name: &OsStr, meta: &std::fs::Metadata) -> Result<(), Declined> {
    let now = rustix::fs::statat(dir, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
        .map_err(io::Error::from)?;
    #[allow(clippy::unnecessary_cast)] // The stat fields' types differ between systems.
    let same = (now.st_dev as u64, now.st_ino as u64) == (meta.dev(), meta.ino())
        && now.st_size as u64 == meta.len()
        && (now.st_mtime as i64, now.st_mtime_nsec as i64) == (meta.mtime(), meta.mtime_nsec());
    if same {
        Ok(())
    } else {
        Err(Declined::ChangedWhileRead)
    }
}

/// For an inode with several names: every name must see the repair, so the verified bytes
/// are written into it. That is the one step that is not atomic, so the file is marked
/// first (an xattr, made durable before any byte changes): a run killed midway leaves mixed
/// bytes under a moved mtime, and the mark makes every later check report them as damage
/// (never as an edit) until a repair completes and removes it.
fn rewrite_in_place(
    temp: Temp,
    name: &OsStr,
    original: &File,
    meta: &std::fs::Metadata,
    mtime: Option<Timestamp>,
    len: u64,
    keep: Option<KeepAt>,
) -> Result<Restored, Refused> {
    let dir = temp.dir();
    still_in_place(dir, name, meta).map_err(target)?;
    // The damaged bytes are copied out first: a second link would see the repair too.
    let kept = match keep {
        None => None,
        Some(KeepAt::Beside(k)) => Some(copy_beside(dir, &k, original, name)),
        Some(KeepAt::Elsewhere(p)) => Some(copy_to(original, name, &p).map_err(Declined::from)),
    }
    .transpose()
    .map_err(target)?;
    let target = match open_at(dir, name, OFlags::WRONLY).map(File::from) {
        Ok(f)
            if f.metadata()
                .is_ok_and(|m| m.dev() == meta.dev() && m.ino() == meta.ino()) =>
        {
            f
        }
        Ok(_) | Err(_) => {
            if let Some(k) = &kept {
                unkeep(dir, k);
            }
            return Err(Refused::Target(Declined::Replaced));
        }
    };
    let marked = xattr::mark_repairing(&target).and_then(|()| target.sync_all());
    if let Err(e) = marked {
        if let Some(k) = &kept {
            unkeep(dir, k);
        }
        return Err(Refused::Target(e.into()));
    }
    let written = (|| {
        let mut from = temp.file();
        from.seek(io::SeekFrom::Start(0))?;
        io::copy(&mut from.take(len), &mut &target)?;
        target.set_len(len)?;
        set_times(&target, meta, mtime)?;
        target.sync_all()
    })();
    if let Err(e) = written {
        return Err(Refused::Partial(e));
    }
    let mut restored = Restored {
        kept,
        warning: None,
    };
    // Left behind, the marks would only keep a good file under suspicion (a check finds the
    // data matching and says ok): a warning, not a failure.
    if let Err(e) = xattr::unmark_damaged(&target).and_then(|_| xattr::unmark_repairing(&target)) {
        restored.warning = Some(format!("could not remove the repair mark: {e}"));
    }
    Ok(restored)
}

/// Opens `name` in `dir`, never through a symlink.
fn open_at(dir: &OwnedFd, name: &OsStr, flags: OFlags) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(
        dir,
        name,
        flags | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
        Mode::empty(),
    )?)
}

/// The original's access time, and the mtime the tag records (else the original's), to the
/// nanosecond. The restored bytes are the tag's, so they get its mtime: the file's own may
/// have moved since it was tagged (a touch of the damaged file, a rewrite in place that a
/// killed repair left), and a repaired file whose mtime disagreed with its tag would take a
/// later bit flip for an edit.
fn set_times(file: &File, meta: &std::fs::Metadata, mtime: Option<Timestamp>) -> io::Result<()> {
    let ts = |sec: i64, nsec: i64| rustix::fs::Timespec {
        tv_sec: sec,
        tv_nsec: nsec as _,
    };
    let modified = match mtime {
        Some(t) => ts(t.sec, t.nsec as i64),
        None => ts(meta.mtime(), meta.mtime_nsec()),
    };
    rustix::fs::futimens(
        file,
        &rustix::fs::Timestamps {
            last_access: ts(meta.atime(), meta.atime_nsec()),
            last_modification: modified,
        },
    )?;
    Ok(())
}

/// Copies the damaged bytes to a new file beside the original, under a free variant of
/// `keep`; nothing is under that name unless the whole copy is.
fn copy_beside(
    dir: &OwnedFd,
    keep: &OsStr,
    original: &File,
    name: &OsStr,
) -> Result<PathBuf, Declined> {
    let mut temp = Temp::new_in(dir)?;
    io::copy(&mut { original }, &mut temp.file())?;
    xattr::mark_kept_damaged(temp.file(), &kept_note(name))?;
    free_name(keep, |k| temp.commit_new(k))
}

/// Tries `make` on `keep`, then `keep.1`, `keep.2` ... until a name is free.
fn free_name(
    keep: &OsStr,
    mut make: impl FnMut(&OsStr) -> io::Result<()>,
) -> Result<PathBuf, Declined> {
    for n in 0..1000 {
        let mut k = keep.to_os_string();
        if n > 0 {
            k.push(format!(".{n}"));
        }
        match make(&k) {
            Ok(()) => return Ok(PathBuf::from(k)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(Declined::NoNameToKeep)
}

/// Removes a kept copy made for a repair that did not happen. Names beside the original are
/// relative to `dir`; others are paths.
fn unkeep(dir: &OwnedFd, kept: &Path) {
    if kept.parent() == Some(Path::new("")) {
        let _ = rustix::fs::unlinkat(dir, kept, rustix::fs::AtFlags::empty());
    } else {
        let _ = std::fs::remove_file(kept);
    }
}

/// Copies the damaged bytes to `path`, which must not exist yet; nothing is under that name
/// unless the whole copy is.
fn copy_to(original: &File, name: &OsStr, path: &Path) -> io::Result<PathBuf> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let mut temp = Temp::beside(path)?;
    io::copy(&mut { original }, &mut temp.file())?;
    // Marked where the file system can (a directory on a stick may hold no xattrs).
    let _ = xattr::mark_kept_damaged(temp.file(), &kept_note(name));
    temp.commit_new(path.file_name().unwrap_or(path.as_os_str()))?;
    Ok(path.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    /// A file brought back with no owner recorded is the restoring user's, 0600, and says so;
    /// with one, it is given it (here the restoring user's own, as any user may).
    #[test]
    fn a_file_brought_back_is_never_more_readable_than_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let file = File::create(&path).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .unwrap();
        let said = give_back(&file, None).unwrap().unwrap();
        assert!(said.contains("not recorded"), "{said}");
        assert!(said.contains("mode 0600"), "{said}");
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o7777, 0o600);
        let me = std::fs::metadata(&path).unwrap();
        let recorded = Owner {
            uid: me.uid(),
            gid: me.gid(),
            mode: 0o640,
        };
        assert_eq!(give_back(&file, Some(recorded)).unwrap(), None);
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o7777, 0o640);
    }
}
