//! Parity that follows the tree: sets whose content is no longer in it are moved aside to
//! the store's `stale/` folder, renamed `*.par2.stale` (where neither intact nor par2cmdline
//! takes them for a set to repair with: `par2 repair` of an old set would put old bytes back
//! over an edit, or bring back a deleted file), and removed once older than the grace
//! period; never while a file they could repair is damaged. A set whose content was only
//! edited away (its file holds other content now) is removed at once: nothing in it is
//! wanted back. A pack with a changed or deleted
//! member is moved aside with only as many recovery slices as its members gone from the
//! tree have slices (what rebuilds them while the others are as it describes them; a pack
//! that cannot is removed), and its members still in the tree are packed again by the same
//! run.
//!
//! Each step is a rename or an unlink of one file: a run killed at any moment leaves sets
//! that are whole (an index means a complete set, as when they are written) or volumes with
//! no index, which the next run moves aside.

use std::collections::{HashMap, HashSet};
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::{PACK_BYTES, PACK_FILES, PackId, Store, is_index, lock, pack_digests, pack_id};
use crate::core::digest::{Algo, Digest};

/// The store's folder of stale sets: a folder a day under it (`stale/DAY/`, days since 1970,
/// UTC) holds what was moved aside that day. When a set was moved aside is in its path, not
/// in its files' mtimes, which anyone who can write the store can set.
pub const STALE_DIR: &str = "stale";

/// Where what was moved aside on `day` is in the store at `dir` (`None`: straight in
/// `stale/`, as an earlier build moved sets aside).
pub(super) fn stale_folder(dir: &Path, day: Option<u32>) -> PathBuf {
    let stale = dir.join(STALE_DIR);
    match day {
        Some(d) => stale.join(d.to_string()),
        None => stale,
    }
}

/// The day of `t`, as `stale/` names its folders.
pub fn day(t: SystemTime) -> u32 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| (d.as_secs() / 86_400) as u32)
}
/// What a stale set's files are renamed with.
pub(super) const STALE_EXT: &str = "stale";

/// The contents a run found in the tree: their parity stays. Kept as 8 bytes of each digest
/// (a million files cost 16 MiB): two contents that share them keep each other's parity,
/// which is harmless.
#[derive(Default)]
pub struct Live {
    keys: HashSet<u64>,
    /// Contents of damaged files: the parity that can repair them is never removed.
    damaged: HashSet<Digest>,
    /// Contents edited away (a file's tag named them, its data is another now): their
    /// parity is not wanted back, and goes at once rather than aside.
    edited: HashSet<u64>,
    /// Pack members met under the name their pack records, and under another only: a file
    /// moved since it was packed.
    placed: HashSet<u64>,
    misplaced: HashSet<u64>,
}

impl Live {
    /// `digest` is in the tree.
    pub fn add(&mut self, digest: &Digest) {
        self.keys.insert(key(digest));
    }

    /// A file in the tree is damaged and should hold `digest`.
    pub fn damaged(&mut self, digest: &Digest) {
        self.add(digest);
        self.damaged.insert(*digest);
    }

    /// A file's content `digest` was edited away.
    pub fn edited(&mut self, digest: &Digest) {
        self.edited.insert(key(digest));
    }

    /// A pack member `digest` is in the tree under the name its pack records, or not.
    pub fn met(&mut self, digest: &Digest, at_recorded_name: bool) {
        if at_recorded_name {
            self.placed.insert(key(digest));
        } else {
            self.misplaced.insert(key(digest));
        }
    }

    /// Whether the pack member `digest` is in the tree only under another name than its
    /// pack records: par2cmdline would see it missing.
    fn moved(&self, digest: &Digest) -> bool {
        let k = key(digest);
        self.misplaced.contains(&k) && !self.placed.contains(&k)
    }

    fn holds(&self, digest: &Digest) -> bool {
        self.keys.contains(&key(digest))
    }
}

fn key(d: &Digest) -> u64 {
    u64::from_le_bytes(d.bytes[..8].try_into().expect("8 bytes")) ^ d.algo as u64
}

/// A content under a name, as 8 bytes (in one process: the hasher's keys are fixed).
pub(super) fn name_key(d: &Digest, name: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    key(d).hash(&mut h);
    name.hash(&mut h);
    h.finish()
}

/// A pack's member: its name in the set, its content.
type Member = (Vec<u8>, Digest);

/// What a prune did.
#[derive(Debug, Default)]
pub struct Pruned {
    /// Sets moved aside (packs among them).
    pub moved: u64,
    /// Small packs merged into fuller ones.
    pub merged: u64,
    /// Sets of contents edited away, removed at once.
    pub dropped: u64,
    /// Packs with more of their members gone than their recovery slices rebuild: of no use,
    /// removed at once.
    pub spent: u64,
    /// Stale files removed, past their grace period ...
    pub removed: u64,
    /// ... and their bytes.
    pub removed_bytes: u64,
    /// Stale files kept past their grace period: they can repair a damaged file.
    pub kept_for_damage: u64,
    /// Packs taken apart because a member moved (par2cmdline finds members by the names
    /// their pack records): their members are packed again under their names now.
    pub renamed: u64,
    /// Members of packs moved aside that are still in the tree: their name there and their
    /// content, to be packed again.
    pub repack: Vec<(Vec<u8>, Digest)>,
    /// Packs a scrub took apart, to be settled once their members are packed again.
    pub retired: Vec<Retired>,
}

impl Pruned {
    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &Pruned) {
        self.moved += other.moved;
        self.renamed += other.renamed;
        self.merged += other.merged;
        self.dropped += other.dropped;
        self.spent += other.spent;
        self.removed += other.removed;
        self.removed_bytes += other.removed_bytes;
        self.kept_for_damage += other.kept_for_damage;
    }
}

/// A pack a scrub took apart because a member was edited: its files (the index among them),
/// left in place until its other members have parity again.
#[derive(Debug)]
pub struct Retired {
    files: Vec<PathBuf>,
    index: PathBuf,
}

impl Store {
    /// Moves aside the sets no content of `live` needs, and removes those moved aside more
    /// than `keep` ago (unless they can repair a damaged file).
    pub fn prune(&self, live: &Live, keep: Duration) -> io::Result<Pruned> {
        let mut pruned = Pruned::default();
        let stale = stale_folder(&self.dir, Some(day(SystemTime::now())));
        for entry in std::fs::read_dir(&self.dir)?.flatten() {
            let dir = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if !entry.file_type().is_ok_and(|t| t.is_dir()) || name == STALE_DIR {
                continue;
            }
            if name == "packs" {
                self.prune_packs(&dir, live, &stale, &mut pruned)?;
                continue;
            }
            // One content's sets: `ALGO-XX/HEX.par2` and its volume.
            let Some(algo) = name.split('-').next().and_then(|a| a.parse::<Algo>().ok()) else {
                continue;
            };
            for (stem, files) in sets_in(&dir)? {
                let Some(digest) = digest_of(algo, &stem) else {
                    continue;
                };
                if !live.holds(&digest) {
                    let set = u64::from(files.iter().any(|f| is_index(f)));
                    if live.edited.contains(&key(&digest)) {
                        pruned.dropped += set;
                        drop_set(files)?;
                    } else {
                        pruned.moved += set;
                        for f in files {
                            aside(&f, &stale.join(&name))?;
                        }
                    }
                }
            }
        }
        self.remove_past_grace(&self.dir.join(STALE_DIR), keep, live, &mut pruned)?;
        Ok(pruned)
    }

    /// What a run that saw only part of the tree (a scrub) may do: the packs holding content
    /// it saw edited away are taken apart: their other members are to be packed again, and
    /// the pack is then settled ([`Store::settle_retired`]); never a pack with a damaged
    /// member. (A file's own set of old content waits for a `protect` that sees the whole
    /// tree: another file may hold that content.)
    pub fn retire(&self, live: &Live) -> io::Result<Pruned> {
        let mut pruned = Pruned::default();
        let ids: HashSet<PackId> = lock(&self.packed)
            .iter()
            .filter(|(d, _)| live.edited.contains(&key(d)))
            .map(|(_, id)| *id)
            .collect();
        if ids.is_empty() {
            return Ok(pruned);
        }
        let dir = self.dir.join("packs");
        let mut sets = sets_in(&dir)?;
        for id in ids {
            let stem = hex::encode(id);
            let Ok(bytes) = crate::fs::sys::read_regular(&dir.join(format!("{stem}.par2"))) else {
                continue;
            };
            let (members, _) = members(&bytes);
            if members.iter().any(|(_, d)| live.damaged.contains(d)) {
                continue;
            }
            pruned.repack.extend(
                members
                    .into_iter()
                    .filter(|(_, d)| !live.edited.contains(&key(d))),
            );
            lock(&self.packed).retain(|_, p| *p != id);
            pruned.retired.push(Retired {
                files: sets.remove(&stem).unwrap_or_default(),
                index: dir.join(format!("{stem}.par2")),
            });
        }
        Ok(pruned)
    }

    /// Settles the packs a scrub took apart, once their members still in the tree that were
    /// found (`packed_again`) have durable parity again: a pack whose every member is packed
    /// again or edited away is removed (nothing in it is wanted back: a whole pack moved
    /// aside for every edit grew the store to twelve times its sets in a simulated year); one
    /// with members not found (moved, deleted) is moved aside with only as many recovery
    /// slices as those members have.
    pub fn settle_retired(
        &self,
        retired: Vec<Retired>,
        live: &Live,
        packed_again: &HashSet<Digest>,
    ) -> io::Result<Pruned> {
        let mut pruned = Pruned::default();
        let stale = stale_folder(&self.dir, Some(day(SystemTime::now()))).join("packs");
        for Retired { files, index } in retired {
            let Ok(bytes) = crate::fs::sys::read_regular(&index) else {
                continue;
            };
            let unsettled =
                |d: &Digest| !packed_again.contains(d) && !live.edited.contains(&key(d));
            let gone = slices_of(&bytes, unsettled);
            if gone == 0 {
                pruned.dropped += 1;
                drop_set(files)?;
            } else if aside_trimmed(&files, &index, gone, &stale)? {
                pruned.moved += 1;
                for f in files.iter().filter(|f| f.exists()) {
                    aside(f, &stale)?;
                }
            } else {
                pruned.spent += 1;
                drop_set(files)?;
            }
        }
        Ok(pruned)
    }

    /// Packs with a member no longer in the tree are moved aside; their other members are
    /// to be packed again.
    fn prune_packs(
        &self,
        dir: &Path,
        live: &Live,
        stale: &Path,
        pruned: &mut Pruned,
    ) -> io::Result<()> {
        // Packs of live members too small to be worth a set of their own (a night's new
        // files): merged, so that the store does not become many sets of one recovery slice.
        let mut small: Vec<(Vec<PathBuf>, Vec<Member>)> = Vec::new();
        // The contents of each pack, as known since the store was opened: a pack whose
        // members are all in the tree and that is not small is left unread.
        let mut contents: HashMap<PackId, Vec<Digest>> = HashMap::new();
        for (d, id) in lock(&self.packed).iter() {
            contents.entry(*id).or_default().push(*d);
        }
        for (stem, files) in sets_in(dir)? {
            let index = dir.join(format!("{stem}.par2"));
            let known = pack_id(&index).and_then(|id| {
                let (count, bytes) = *lock(&self.pack_sizes).get(&id)?;
                let digests = contents.get(&id).filter(|d| d.len() == count)?;
                Some((digests, count, bytes))
            });
            if let Some((digests, count, bytes)) = known
                && digests.iter().all(|d| live.holds(d) && !live.moved(d))
                && (digests.iter().any(|d| live.damaged.contains(d))
                    || count >= PACK_FILES / 4
                    || bytes >= PACK_BYTES / 4)
            {
                continue;
            }
            let (members, bytes) = match crate::fs::sys::read_regular(&index) {
                Ok(bytes) => members(&bytes),
                // Volumes whose index is gone (a killed run): of no use.
                Err(e) if e.kind() == io::ErrorKind::NotFound => (Vec::new(), 0),
                Err(e) => return Err(e),
            };
            // A pack that can repair a damaged member stays as it is until that is repaired:
            // it is never rewritten around damage.
            let all_live = members.iter().all(|(_, d)| live.holds(d));
            let damaged = members.iter().any(|(_, d)| live.damaged.contains(d));
            // A member moved: par2cmdline would see it missing (renaming it would change its
            // file ID, and with it the whole pack's recovery data). The pack is taken apart
            // as a scrub takes one: its members packed again under their names now, the pack
            // removed once they have durable parity again.
            if all_live && !damaged && members.iter().any(|(_, d)| live.moved(d)) {
                if let Some(id) = pack_id(&index) {
                    lock(&self.packed).retain(|_, p| *p != id);
                }
                pruned.repack.extend(members);
                pruned.renamed += 1;
                pruned.retired.push(Retired { files, index });
                continue;
            }
            if !members.is_empty() && (all_live || damaged) {
                if all_live && !damaged && members.len() < PACK_FILES / 4 && bytes < PACK_BYTES / 4
                {
                    small.push((files, members));
                }
                continue;
            }
            // Only edited away: nothing in it is wanted back.
            let edited = members
                .iter()
                .all(|(_, d)| live.holds(d) || live.edited.contains(&key(d)));
            let set = u64::from(!members.is_empty());
            pruned
                .repack
                .extend(members.into_iter().filter(|(_, d)| live.holds(d)));
            if let Some(id) = pack_id(&index) {
                lock(&self.packed).retain(|_, p| *p != id);
            }
            if edited && set > 0 {
                pruned.dropped += 1;
                drop_set(files)?;
                continue;
            }
            if set > 0 {
                let gone = slices_of(&crate::fs::sys::read_regular(&index)?, |d| !live.holds(d));
                if !aside_trimmed(&files, &index, gone, &stale.join("packs"))? {
                    pruned.spent += 1;
                    drop_set(files)?;
                    continue;
                }
            }
            pruned.moved += set;
            for f in files {
                if f.exists() {
                    aside(&f, &stale.join("packs"))?;
                }
            }
        }
        if small.len() > 1 {
            for (files, members) in small {
                // Their content stays in the tree and is packed again: nothing to keep.
                drop_set(files)?;
                let ids: Vec<Digest> = members.iter().map(|(_, d)| *d).collect();
                lock(&self.packed).retain(|d, _| !ids.contains(d));
                pruned.merged += 1;
                pruned.repack.extend(members);
            }
        }
        Ok(())
    }

    /// Removes what was moved aside more than `keep` ago (by the day folder it is in), but
    /// for sets that can repair a damaged file. What an earlier build moved aside straight
    /// into `stale/` (dated by mtimes) starts its grace today.
    fn remove_past_grace(
        &self,
        stale: &Path,
        keep: Duration,
        live: &Live,
        pruned: &mut Pruned,
    ) -> io::Result<()> {
        let Ok(entries) = std::fs::read_dir(stale) else {
            return Ok(());
        };
        let today = day(SystemTime::now());
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Ok(moved) = name.parse::<u32>() else {
                let made = name == "packs"
                    || name
                        .split('-')
                        .next()
                        .is_some_and(|a| a.parse::<Algo>().is_ok());
                if made && entry.file_type().is_ok_and(|t| t.is_dir()) {
                    let to = stale.join(today.to_string()).join(&name);
                    std::fs::create_dir_all(stale.join(today.to_string()))?;
                    if std::fs::rename(entry.path(), &to).is_err() {
                        for f in std::fs::read_dir(entry.path())?.flatten() {
                            std::fs::create_dir_all(&to)?;
                            std::fs::rename(f.path(), to.join(f.file_name()))?;
                        }
                        let _ = std::fs::remove_dir(entry.path());
                    }
                }
                continue;
            };
            let age = Duration::from_secs(u64::from(today.saturating_sub(moved)) * 86_400);
            if age < keep {
                continue;
            }
            for dir in std::fs::read_dir(entry.path())?.flatten() {
                self.remove_sets_in(&dir.path(), live, pruned)?;
                // Fails, harmlessly, unless the folder is empty.
                let _ = std::fs::remove_dir(dir.path());
            }
            let _ = std::fs::remove_dir(entry.path());
        }
        Ok(())
    }

    /// Removes the stale sets in `dir` (a day's `packs/` or `ALGO-XX/`), but for those that
    /// can repair a damaged file.
    fn remove_sets_in(&self, dir: &Path, live: &Live, pruned: &mut Pruned) -> io::Result<()> {
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let algo = name.split('-').next().and_then(|a| a.parse::<Algo>().ok());
        for (stem, files) in sets_in(dir)? {
            // What it could repair: its content, or its members'.
            let contents: Vec<Digest> = match algo {
                _ if name == "packs" => {
                    let index = dir.join(format!("{stem}.par2.{STALE_EXT}"));
                    crate::fs::sys::read_regular(&index)
                        .map(|b| members(&b).0.into_iter().map(|(_, d)| d).collect())
                        .unwrap_or_default()
                }
                Some(algo) => digest_of(algo, &stem).into_iter().collect(),
                None => Vec::new(),
            };
            if contents.iter().any(|d| live.damaged.contains(d)) {
                pruned.kept_for_damage += files.len() as u64;
                continue;
            }
            for f in files {
                let len = std::fs::symlink_metadata(&f)?.len();
                std::fs::remove_file(&f)?;
                pruned.removed += 1;
                pruned.removed_bytes += len;
            }
        }
        Ok(())
    }
}

/// The files of `dir` by set: the name before its first dot (a digest's hex, a pack's ID),
/// with `.stale` taken off. Only files intact made are in it, as the callers move and remove
/// them: regular files of the user running intact, named as sets are (temp files of a run in
/// progress are not).
fn sets_in(dir: &Path) -> io::Result<HashMap<String, Vec<PathBuf>>> {
    use std::os::unix::fs::MetadataExt;
    let me = rustix::process::geteuid().as_raw();
    let mut sets: HashMap<String, Vec<PathBuf>> = HashMap::new();
    for e in std::fs::read_dir(dir)?.flatten() {
        let Some(name) = e.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        // `DirEntry::metadata` does not follow a symlink.
        if !is_set_name(&name) || !e.metadata().is_ok_and(|m| m.is_file() && m.uid() == me) {
            continue;
        }
        let stem = name.split('.').next().unwrap_or_default().to_string();
        sets.entry(stem).or_default().push(e.path());
    }
    Ok(sets)
}

/// Whether `name` is one intact gives a set's file: `HEX.par2` or `HEX.volA+B.par2`, HEX a
/// digest's or a pack's, perhaps with `.stale` after it.
fn is_set_name(name: &str) -> bool {
    let name = name.strip_suffix(&format!(".{STALE_EXT}")).unwrap_or(name);
    let Some(rest) = name.strip_suffix(".par2") else {
        return false;
    };
    let (stem, volume) = match rest.split_once('.') {
        Some((stem, volume)) => (stem, Some(volume)),
        None => (rest, None),
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let volume_ok = volume.is_none_or(|v| {
        v.strip_prefix("vol")
            .and_then(|v| v.split_once('+'))
            .is_some_and(|(first, count)| digits(first) && digits(count))
    });
    matches!(stem.len(), 32 | 64)
        && stem.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        && volume_ok
}

/// The content a set named `hex` protects.
fn digest_of(algo: Algo, hex: &str) -> Option<Digest> {
    let bytes: [u8; 32] = hex::decode(hex).ok()?.try_into().ok()?;
    Some(Digest { algo, bytes })
}

/// A pack's members (their names and contents), from its index `bytes`, and their bytes:
/// from its file descriptions alone (each is checked as it is parsed).
fn members(bytes: &[u8]) -> (Vec<Member>, u64) {
    let digests = pack_digests(bytes);
    let mut seen = HashSet::new();
    let (mut members, mut total) = (Vec::new(), 0);
    for found in par2::packet::parse(bytes) {
        if let par2::packet::Packet::FileDesc { id, len, name, .. } = found.packet
            && seen.insert(id)
            && let Some((_, d)) = digests.iter().find(|(i, _)| *i == id)
        {
            total += len;
            members.push((name, *d));
        }
    }
    (members, total)
}

/// How many slices of the pack with the index `bytes` hold the members `wanted` says (gone
/// from the tree, not packed again): as many of its recovery slices rebuild them, while its
/// other members are as it describes them.
fn slices_of(bytes: &[u8], wanted: impl Fn(&Digest) -> bool) -> u64 {
    let digests = pack_digests(bytes);
    let (mut slice, mut lens) = (0, HashMap::new());
    for found in par2::packet::parse(bytes) {
        match found.packet {
            par2::packet::Packet::Main { slice_size, .. } => slice = slice_size,
            par2::packet::Packet::FileDesc { id, len, .. } => {
                lens.insert(id, len);
            }
            _ => {}
        }
    }
    digests
        .iter()
        .filter(|(_, d)| wanted(d))
        .filter_map(|(id, _)| lens.get(id))
        .map(|len| len.div_ceil(slice.max(1)))
        .sum()
}

/// Puts in `to` a volume of the pack with the index `index` that holds only its first
/// `keep` recovery slices, and removes the pack's own volume: a stale pack is kept for the
/// members gone from the tree it can rebuild (the others are packed again), and the rest of
/// its recovery data would cost the store as much again for a month. False, leaving the
/// pack as it was, if it has fewer (it rebuilds nothing). The index is left to be moved.
fn aside_trimmed(files: &[PathBuf], index: &Path, keep: u64, to: &Path) -> io::Result<bool> {
    let Some(volume) = files.iter().find(|f| !is_index(f)) else {
        return Ok(false);
    };
    let bytes = crate::fs::sys::read_regular(volume)?;
    // intact's volumes hold their recovery packets first, each a header (magic, length at
    // 8, type at 48) and its body.
    let (mut end, mut kept) = (0usize, 0u64);
    while kept < keep {
        let Some(header) = bytes.get(end..end + 64) else {
            break;
        };
        let len = u64::from_le_bytes(header[8..16].try_into().expect("8 bytes")) as usize;
        if &header[..8] != par2::packet::MAGIC
            || &header[48..64] != par2::packet::kind::RECOVERY
            || len < 64
            || end + len > bytes.len()
        {
            break;
        }
        end += len;
        kept += 1;
    }
    if kept < keep || keep == 0 {
        return Ok(false);
    }
    let stem = index.file_stem().unwrap_or_default().to_string_lossy();
    let name = format!("{}.{STALE_EXT}", par2::volume_name(&stem, 0, keep as u32));
    std::fs::create_dir_all(to)?;
    let temp = crate::fs::atomic::Temp::beside(&to.join(&name))?;
    let mut out = temp.file();
    std::io::Write::write_all(&mut out, &bytes[..end])?;
    std::io::Write::write_all(&mut out, &crate::fs::sys::read_regular(index)?)?;
    temp.commit(name.as_ref())?;
    std::fs::remove_file(volume)?;
    Ok(true)
}

/// Removes a set's files: the index first (volumes without one are of no use, and go with
/// the next run).
fn drop_set(mut files: Vec<PathBuf>) -> io::Result<()> {
    files.sort_by_key(|f| !is_index(f));
    for f in files {
        std::fs::remove_file(f)?;
    }
    Ok(())
}

/// Moves `file` into the folder `to` (under today's folder of `stale/`: its grace period
/// starts), renamed `NAME.stale`.
fn aside(file: &Path, to: &Path) -> io::Result<()> {
    std::fs::create_dir_all(to)?;
    let mut name = file.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{STALE_EXT}"));
    std::fs::rename(file, to.join(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_names_intact_gives_sets_are_taken_for_sets() {
        let digest = "3f".repeat(32);
        let pack = "5c".repeat(16);
        for ok in [
            format!("{digest}.par2"),
            format!("{digest}.vol00+12.par2"),
            format!("{pack}.par2.stale"),
            format!("{pack}.vol0+3.par2.stale"),
        ] {
            assert!(is_set_name(&ok), "{ok}");
        }
        for not in [
            "photo.jpg".to_string(),
            format!("{digest}.par2.bak"),
            format!("{digest}x.par2"),
            format!("{}.par2", "3F".repeat(32)),
            format!("{pack}.volx+3.par2"),
            format!("{pack}.vol1.par2"),
            format!("{}.par2", "ab".repeat(10)),
            ".par2".to_string(),
        ] {
            assert!(!is_set_name(&not), "{not}");
        }
    }
}
