//! The tree the simulator plays with, and its ground truth: every name, the inode behind it,
//! the content it should hold (the bytes last written on purpose, regenerated from a seed
//! whenever they are needed), and the damage it holds (made when, how, found when). Each day
//! brings seeded churn: files added, edited, saved by rename, deleted, renamed, moved, folders
//! moved, hard links made, and rot (a byte flipped below the file system or through it with
//! the mtime put back, an edit that puts the old mtime back, a truncation under the mtime).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use sha2::Digest as _;

use crate::disk::Disk;

/// One day, in seconds.
pub const DAY: i64 = 86_400;

/// An inode the simulator made, as it knows it.
pub type Id = u64;

/// What a file should hold: its bytes are `bytes(seed, size)`.
#[derive(Clone, Debug)]
pub struct Content {
    pub seed: u64,
    pub size: u64,
    /// SHA-256 of those bytes.
    pub good: [u8; 32],
    /// The mtime the simulator gave it (seconds, nanoseconds).
    pub mtime: (i64, u32),
    /// The night it was written before.
    pub born: u32,
    /// Damage it holds, if any.
    pub damage: Option<Damage>,
}

/// Damage the simulator made in a file: what intact must find and keep saying.
#[derive(Clone, Debug)]
pub struct Damage {
    /// The night it was made before.
    pub made: u32,
    pub rot: Rot,
    /// SHA-256 of the damaged bytes.
    pub bytes: [u8; 32],
    /// The night intact first said so.
    pub found: Option<u32>,
}

/// How the damage came.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rot {
    /// A byte flipped in the disk image: the file system saw nothing.
    Below,
    /// A byte flipped through the file system, the mtime put back (the ctime moved).
    Above,
    /// New content written with the old mtime put back, no watch running: corrupt by design,
    /// an alarm until the owner accepts it (then this is the content).
    SilentEdit { seed: u64, size: u64 },
    /// Cut short, the mtime put back.
    Truncated,
}

/// The bytes of content `seed` of `size` bytes.
pub fn bytes(seed: u64, size: u64) -> Vec<u8> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut v = vec![0u8; size as usize];
    rng.fill(&mut v);
    v
}

pub fn sha256(data: &[u8]) -> [u8; 32] {
    sha2::Sha256::digest(data).into()
}

/// The tree and its truth.
pub struct World {
    pub root: PathBuf,
    pub rng: fastrand::Rng,
    /// Every file name (relative to the root), and the inode it names.
    pub names: BTreeMap<PathBuf, Id>,
    pub contents: BTreeMap<Id, Content>,
    /// Every folder (relative; the root is the empty path).
    pub dirs: BTreeSet<PathBuf>,
    next_id: Id,
    next_name: u64,
    /// When the simulation's clock began (Unix seconds): night `n` is `n` days after.
    pub start: i64,
    /// What each day did (by night), for a failure's report.
    pub log: Vec<(u32, String)>,
    /// The night the day's churn leads to.
    pub night: u32,
    /// Rot made so far.
    pub rot_made: u32,
    /// Names deleted (the night before which), whose content had no other name and had met
    /// a nightly run: each is a file gone that intact must say, for 30 days.
    pub deleted: Vec<(u32, PathBuf)>,
    /// The contents of those: said gone under that name (intact says a file with several
    /// names gone under one).
    pub deleted_ids: std::collections::HashSet<Id>,
    /// Bytes of content edited away or deleted, by night: what stale parity may keep.
    pub churned: Vec<(u32, u64)>,
    /// Names given today (moves, renames, links): no run has seen a file under them yet.
    pub named_today: std::collections::HashSet<PathBuf>,
    /// Names deleted today of contents that kept another.
    unnamed_today: HashMap<Id, Vec<PathBuf>>,
}

/// Files deleted at once by mistake: what they were, to be brought back.
pub struct MassDeletion {
    pub night: u32,
    pub files: Vec<(PathBuf, Id, Content)>,
    /// Names given that day, under which no run saw the files.
    pub named: std::collections::HashSet<PathBuf>,
    /// Files with other names (hard links): intact keeps one of them.
    pub linked: std::collections::HashSet<Id>,
}

impl World {
    pub fn new(root: PathBuf, seed: u64, start: i64) -> World {
        fs::create_dir_all(&root).unwrap();
        let mut dirs = BTreeSet::new();
        dirs.insert(PathBuf::new());
        World {
            root,
            rng: fastrand::Rng::with_seed(seed),
            names: BTreeMap::new(),
            contents: BTreeMap::new(),
            dirs,
            next_id: 1,
            next_name: 1,
            start,
            log: Vec::new(),
            night: 1,
            rot_made: 0,
            deleted: Vec::new(),
            deleted_ids: Default::default(),
            churned: Vec::new(),
            named_today: Default::default(),
            unnamed_today: Default::default(),
        }
    }

    /// Notes what the day did.
    pub fn note(&mut self, what: String) {
        self.log.push((self.night, what));
    }

    pub fn path(&self, rel: &Path) -> PathBuf {
        self.root.join(rel)
    }

    /// A time during the day before night `night`.
    fn daytime(&mut self, night: u32) -> (i64, u32) {
        let sec = self.start + (night as i64 - 1) * DAY + self.rng.i64(0..20 * 3600);
        (sec, self.rng.u32(0..1_000_000_000))
    }

    /// A size as files come: mostly small, some larger (about 37 kB on average, as the
    /// issue's year of 50,000 files in 1.7 GB).
    fn size(&mut self) -> u64 {
        match self.rng.u32(0..100) {
            0..70 => self.rng.u64(1..16 << 10),
            70..98 => self.rng.u64(16 << 10..128 << 10),
            _ => self.rng.u64(128 << 10..1 << 20),
        }
    }

    fn fresh_name(&mut self, prefix: &str) -> String {
        self.next_name += 1;
        format!("{prefix}{:05}", self.next_name)
    }

    /// Fills the tree with `files` files in nested folders (files beside subfolders).
    pub fn populate(&mut self, files: usize) {
        let folders = (files / 25).max(4);
        for _ in 0..folders {
            self.add_dir();
        }
        for _ in 0..files {
            self.add(1);
        }
    }

    fn add_dir(&mut self) -> PathBuf {
        let parent = self.pick_dir();
        // Not too deep: a few levels, as photo libraries are.
        let parent = if parent.components().count() >= 4 {
            PathBuf::new()
        } else {
            parent
        };
        let dir = parent.join(self.fresh_name("d"));
        fs::create_dir(self.path(&dir)).unwrap();
        self.dirs.insert(dir.clone());
        dir
    }

    fn pick_dir(&mut self) -> PathBuf {
        let n = self.rng.usize(..self.dirs.len());
        self.dirs.iter().nth(n).unwrap().clone()
    }

    fn pick_name(&mut self) -> Option<PathBuf> {
        if self.names.is_empty() {
            return None;
        }
        let n = self.rng.usize(..self.names.len());
        self.names.keys().nth(n).cloned()
    }

    /// Names of `id`.
    pub fn names_of(&self, id: Id) -> Vec<&PathBuf> {
        self.names
            .iter()
            .filter(|(_, i)| **i == id)
            .map(|(p, _)| p)
            .collect()
    }

    /// Writes content `c` at `rel` (truncating what is there, the same inode), with its mtime.
    fn write(&self, rel: &Path, c: &Content) {
        let path = self.path(rel);
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        f.write_all(&bytes(c.seed, c.size)).unwrap();
        drop(f);
        set_mtime(&path, c.mtime);
    }

    fn new_content(&mut self, night: u32) -> Content {
        let (seed, size) = (self.rng.u64(..), self.size());
        Content {
            seed,
            size,
            good: sha256(&bytes(seed, size)),
            mtime: self.daytime(night),
            born: night,
            damage: None,
        }
    }

    /// One day's churn before night `night`: `ops` operations drawn by the seed, and now and
    /// then rot (`rot` in a hundred days bring one).
    pub fn day(&mut self, night: u32, ops: usize, rot: u32, disk: &Disk) {
        self.night = night;
        self.named_today.clear();
        self.unnamed_today.clear();
        for _ in 0..ops {
            match self.rng.u32(0..100) {
                0..35 => self.add(night),
                35..50 => self.edit(night),
                50..57 => self.save_by_rename(night),
                57..72 => self.delete(),
                72..84 => self.rename(false),
                84..94 => self.rename(true),
                94..96 => self.move_folder(),
                96..98 => self.link(),
                _ => {
                    self.add_dir();
                }
            }
        }
        if self.rng.u32(0..100) < rot {
            let kind = match self.rng.u32(0..100) {
                0..50 => Kind::Below,
                50..80 => Kind::Above,
                80..90 => Kind::SilentEdit,
                _ => Kind::Truncated,
            };
            // A few tries for a file that rot can hit.
            for _ in 0..20 {
                if self.rot(night, disk, kind) {
                    break;
                }
            }
        }
    }

    fn add(&mut self, night: u32) {
        let dir = if self.rng.u32(0..10) == 0 {
            self.add_dir()
        } else {
            self.pick_dir()
        };
        let rel = dir.join(self.fresh_name("f"));
        let c = self.new_content(night);
        self.write(&rel, &c);
        let id = self.next_id;
        self.next_id += 1;
        self.note(format!("add {}", rel.display()));
        self.names.insert(rel, id);
        self.contents.insert(id, c);
    }

    /// Rewrites a file in place under a new mtime: an edit (it ends any damage).
    fn edit(&mut self, night: u32) {
        let Some(rel) = self.pick_name() else { return };
        let id = self.names[&rel];
        let mut c = self.new_content(night);
        c.mtime = c.mtime.max(later(self.contents[&id].mtime));
        self.write(&rel, &c);
        self.note(format!("edit {}", rel.display()));
        self.churned.push((night, self.contents[&id].size));
        self.contents.insert(id, c);
    }

    /// An editor's save: a new file written beside, renamed over the name (a new inode).
    fn save_by_rename(&mut self, night: u32) {
        let Some(rel) = self.pick_name() else { return };
        let old = self.names[&rel];
        let mut c = self.new_content(night);
        c.mtime = c.mtime.max(later(self.contents[&old].mtime));
        self.churned.push((night, self.contents[&old].size));
        let temp = rel.with_file_name(".save.tmp");
        self.write(&temp, &c);
        fs::rename(self.path(&temp), self.path(&rel)).unwrap();
        let id = self.next_id;
        self.next_id += 1;
        self.note(format!("save {}", rel.display()));
        self.names.insert(rel, id);
        self.contents.insert(id, c);
        self.forget_if_unnamed(old);
    }

    fn delete(&mut self) {
        let Some(rel) = self.pick_name() else { return };
        fs::remove_file(self.path(&rel)).unwrap();
        let id = self.names.remove(&rel).unwrap();
        self.note(format!("delete {}", rel.display()));
        if self.names.values().any(|i| *i == id) {
            self.unnamed_today.entry(id).or_default().push(rel);
        } else {
            self.churned.push((self.night, self.contents[&id].size));
            // A file with several names, all deleted today, is said gone under the one the
            // last run knew it by: the first in path order (the walk's), not new today. (One
            // moved today is known, and said gone, under the name it had.)
            let known = self
                .unnamed_today
                .remove(&id)
                .unwrap_or_default()
                .into_iter()
                .chain([rel])
                .filter(|n| !self.named_today.contains(n))
                .min();
            if let Some(rel) = known.filter(|_| self.contents[&id].born < self.night) {
                self.deleted.push((self.night, rel));
                self.deleted_ids.insert(id);
            }
        }
        self.forget_if_unnamed(id);
    }

    /// A folder deleted by mistake: a fifth of the files, at least 60 (what intact must take
    /// for an alarm, not routine deletions).
    pub fn mass_delete(&mut self, night: u32) -> Option<MassDeletion> {
        let n = (self.names.len() / 5).max(60);
        if self.names.len() < 2 * n {
            return None;
        }
        let start = self.rng.usize(..self.names.len() - n);
        let names: Vec<PathBuf> = self.names.keys().skip(start).take(n).cloned().collect();
        let linked = names
            .iter()
            .map(|rel| self.names[rel])
            .filter(|id| self.names_of(*id).len() > 1)
            .collect();
        let mut files = Vec::new();
        for rel in names {
            fs::remove_file(self.path(&rel)).unwrap();
            let id = self.names.remove(&rel).unwrap();
            files.push((rel, id, self.contents[&id].clone()));
        }
        for (_, id, _) in &files {
            self.forget_if_unnamed(*id);
        }
        self.note(format!("mass deletion of {} files", files.len()));
        Some(MassDeletion {
            night,
            files,
            named: self.named_today.clone(),
            linked,
        })
    }

    /// Brings back what a mass deletion took (restored with their content: new inodes, the
    /// same names and bytes).
    pub fn undelete(&mut self, mass: MassDeletion) {
        for (rel, _, mut c) in mass.files {
            // Whatever damage it held, what comes back is its good content, in a file of its
            // own (a second name it had is another file now).
            c.damage = None;
            let id = self.next_id;
            self.next_id += 1;
            self.names.insert(rel, id);
            self.contents.insert(id, c);
        }
    }

    fn forget_if_unnamed(&mut self, id: Id) {
        if !self.names.values().any(|i| *i == id) {
            self.contents.remove(&id);
        }
    }

    /// Renames a file in its folder, or moves it to another.
    fn rename(&mut self, elsewhere: bool) {
        let Some(rel) = self.pick_name() else { return };
        let dir = if elsewhere {
            self.pick_dir()
        } else {
            rel.parent().unwrap().to_path_buf()
        };
        let to = dir.join(self.fresh_name("m"));
        fs::rename(self.path(&rel), self.path(&to)).unwrap();
        self.note(format!("move {} {}", rel.display(), to.display()));
        let id = self.names.remove(&rel).unwrap();
        self.named_today.insert(to.clone());
        self.names.insert(to, id);
    }

    /// Moves a whole folder into another (not beneath itself).
    fn move_folder(&mut self) {
        let from = self.pick_dir();
        if from.as_os_str().is_empty() {
            return;
        }
        let parent = self.pick_dir();
        if parent.starts_with(&from) || parent.components().count() >= 4 {
            return;
        }
        let to = parent.join(self.fresh_name("d"));
        fs::rename(self.path(&from), self.path(&to)).unwrap();
        self.note(format!("move folder {} {}", from.display(), to.display()));
        let moved = |p: &Path| p.strip_prefix(&from).ok().map(|rest| to.join(rest));
        self.dirs = self
            .dirs
            .iter()
            .map(|d| moved(d).unwrap_or_else(|| d.clone()))
            .collect();
        self.names = self
            .names
            .iter()
            .map(|(p, id)| (moved(p).unwrap_or_else(|| p.clone()), *id))
            .collect();
        let renamed: Vec<PathBuf> = self
            .names
            .keys()
            .filter(|p| p.starts_with(&to))
            .cloned()
            .collect();
        self.named_today.extend(renamed);
    }

    /// A second name for a file.
    fn link(&mut self) {
        let Some(rel) = self.pick_name() else { return };
        let to = self.pick_dir().join(self.fresh_name("l"));
        fs::hard_link(self.path(&rel), self.path(&to)).unwrap();
        self.note(format!("link {} {}", rel.display(), to.display()));
        let id = self.names[&rel];
        self.named_today.insert(to.clone());
        self.names.insert(to, id);
    }

    /// Whether the content `id` is a fit target for rot: one name, data, no damage yet, and
    /// a tag on it that describes its good content (rot hits what intact protects).
    fn rots(&self, id: Id) -> bool {
        let c = &self.contents[&id];
        let names = self.names_of(id);
        names.len() == 1
            && c.size > 0
            && c.damage.is_none()
            && tag_digest(&self.path(names[0])) == Some(c.good)
    }

    fn rot(&mut self, night: u32, disk: &Disk, kind: Kind) -> bool {
        let Some(rel) = self.pick_name() else {
            return false;
        };
        let id = self.names[&rel];
        if !self.rots(id) {
            return false;
        }
        let path = self.path(&rel);
        let mut c = self.contents[&id].clone();
        // Rot puts back the mtime the file has (a restore may have given it another than the
        // one the simulator wrote).
        let m = fs::metadata(&path).unwrap();
        c.mtime = (m.mtime(), m.mtime_nsec() as u32);
        let mut data = bytes(c.seed, c.size);
        let at = self.rng.u64(..c.size);
        let rot = match kind {
            Kind::Below => {
                disk.flip_below(&path, at).unwrap();
                data[at as usize] ^= 0x10;
                Rot::Below
            }
            Kind::Above => {
                data[at as usize] ^= 0x01;
                let f = fs::OpenOptions::new().write(true).open(&path).unwrap();
                std::os::unix::fs::FileExt::write_all_at(&f, &data[at as usize..=at as usize], at)
                    .unwrap();
                drop(f);
                set_mtime(&path, c.mtime);
                Rot::Above
            }
            Kind::SilentEdit => {
                let (seed, size) = (self.rng.u64(..), self.size());
                data = bytes(seed, size);
                self.write(
                    &rel,
                    &Content {
                        seed,
                        size,
                        ..c.clone()
                    },
                );
                Rot::SilentEdit { seed, size }
            }
            Kind::Truncated => {
                data.truncate(at as usize);
                fs::OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .unwrap()
                    .set_len(at)
                    .unwrap();
                set_mtime(&path, c.mtime);
                Rot::Truncated
            }
        };
        let on_disk = sha256(&fs::read(&path).unwrap());
        assert_eq!(on_disk, sha256(&data), "{kind:?} of {}", rel.display());
        self.note(format!("rot {kind:?} {}", rel.display()));
        self.rot_made += 1;
        self.contents.get_mut(&id).unwrap().damage = Some(Damage {
            made: night,
            rot,
            bytes: sha256(&data),
            found: None,
        });
        true
    }

    /// The owner puts a damaged file's good bytes back by hand (as from a backup: a new
    /// mtime, as `cp` gives), or accepts a silent edit as meant; either ends the damage.
    pub fn restore_by_hand(&mut self, id: Id, night: u32) {
        let mut c = self.contents[&id].clone();
        let rel = self.names_of(id)[0].clone();
        if let Some(Damage {
            rot: Rot::SilentEdit { seed, size },
            ..
        }) = c.damage
        {
            // Accepted (by `update --accept-corrupt`, run by the caller): it is the content now.
            c.seed = seed;
            c.size = size;
            c.good = sha256(&bytes(seed, size));
        } else {
            c.mtime = later(self.daytime(night).max(c.mtime));
            self.write(&rel, &c);
        }
        c.damage = None;
        self.note(format!("restore {}", rel.display()));
        self.contents.insert(id, c);
    }

    /// Contents with damage, and whether intact has said so.
    pub fn damaged(&self) -> impl Iterator<Item = (Id, &Content, &Damage)> {
        self.contents
            .iter()
            .filter_map(|(id, c)| c.damage.as_ref().map(|d| (*id, c, d)))
    }
}

/// What rot to make.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Below,
    Above,
    SilentEdit,
    Truncated,
}

/// A moment after `t`.
fn later((sec, nsec): (i64, u32)) -> (i64, u32) {
    (sec + 1, nsec)
}

pub fn set_mtime(path: &Path, (sec, nsec): (i64, u32)) {
    crate::common::set_mtime(path, (sec, i64::from(nsec)));
}

/// The SHA-256 digest intact's tag on `path` holds, if it has one of SHA-256 (the layout of
/// docs/tag-format.md, version 2).
pub fn tag_digest(path: &Path) -> Option<[u8; 32]> {
    let mut buf = [0u8; 256];
    let n = rustix::fs::lgetxattr(path, "user.intact", &mut buf[..]).ok()?;
    let raw = &buf[..n];
    (raw.len() == 62 && raw[0] == 2 && raw[1] == 1).then(|| raw[2..34].try_into().unwrap())
}
