//! One search of a repository for the damaged files of a repair: versions newest first,
//! each listed in the damaged files' folders (whole while a tree's place in the repository is
//! not known), every distinct copy of a path offered once.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use super::{Backup, Copy, ELSEWHERE, Hit, LISTED_WHOLE, Map, Repository, Sought, Version, loose};
use crate::process::Watch;
use crate::repair::source::{Attempts, Unusable, stream};

/// One search of a repository for the damaged files of a repair: what it has learnt so far.
pub(super) struct Hunt<'a, R> {
    backup: &'a Backup<R>,
    watch: Watch<'a>,
    sought: Vec<Sought>,
    /// Newest first.
    versions: Vec<Version>,
    /// Where each tree was backed up from.
    maps: Vec<Map>,
    /// A tree is placed once one of its files is found at its path (as mapped).
    placed: Vec<bool>,
    /// The trees whose files were not found where they are now: looked for in whole
    /// listings.
    lost: Vec<bool>,
    /// The damaged files of each size.
    by_size: HashMap<u64, Vec<usize>>,
    /// What each file's path held in a newer version: an older one holding the same is the
    /// same stored content, not tried again.
    seen: Vec<Vec<Met>>,
    /// Copies of each file's size found elsewhere in whole listings.
    elsewhere: Vec<Vec<Copy>>,
    /// Which versions were listed whole.
    listed_whole: Vec<bool>,
    /// The groups one of whose versions was listed whole.
    groups: Vec<String>,
}

/// A copy of a file's path met in a version: the same size and stamp in an older version is
/// the same stored content.
struct Met {
    size: u64,
    stamp: String,
    /// What it was offered as (the newest version holding it).
    from: String,
    /// The oldest version met holding it since, while the file still wanted a copy (not yet
    /// said).
    back_to: Option<usize>,
}

impl<'a, R: Repository + Send> Hunt<'a, R> {
    pub(super) fn new(
        backup: &'a Backup<R>,
        watch: Watch<'a>,
        sought: Vec<Sought>,
        trees: usize,
        versions: Vec<Version>,
    ) -> Self {
        let mut by_size: HashMap<u64, Vec<usize>> = HashMap::new();
        for (k, s) in sought.iter().enumerate() {
            if let Some(size) = s.size {
                by_size.entry(size).or_default().push(k);
            }
        }
        Hunt {
            backup,
            watch,
            seen: sought.iter().map(|_| Vec::new()).collect(),
            elsewhere: sought.iter().map(|_| Vec::new()).collect(),
            sought,
            listed_whole: vec![false; versions.len()],
            versions,
            maps: vec![Map::default(); trees],
            placed: vec![false; trees],
            lost: vec![false; trees],
            by_size,
            groups: Vec::new(),
        }
    }

    /// Offers the copies of every version in turn, newest first, while files want one.
    pub(super) fn run(mut self, work: &mut dyn Attempts) -> Result<(), Unusable> {
        self.newest_unlisted(work);
        let mut v = 0;
        while v < self.versions.len() {
            if self.watch.cancel.load(Ordering::Relaxed) || work.remaining() == 0 {
                return Ok(());
            }
            let open: Vec<usize> = self.open(work);
            if open.is_empty() {
                break;
            }
            // Not where they are now: this version again, whole, to find where.
            if !self.at_paths(v, &open, work)? {
                v += 1;
            }
        }
        self.date(work, 0..self.sought.len());
        self.elsewhere_listed(work)?;
        self.last_tries(work);
        Ok(())
    }

    /// Says, of each damaged copy the files `ks` were offered, the oldest version that
    /// holds it too: the day the damage entered the backups (not the newest that copied it).
    fn date(&mut self, work: &mut dyn Attempts, ks: impl IntoIterator<Item = usize>) {
        for k in ks {
            for met in &mut self.seen[k] {
                if let Some(v) = met.back_to.take() {
                    work.dated(self.sought[k].i, &met.from, &self.versions[v].label);
                }
            }
        }
    }

    /// The damaged files still wanting a copy.
    fn open(&self, work: &dyn Attempts) -> Vec<usize> {
        (0..self.sought.len())
            .filter(|&k| work.want(self.sought[k].i).is_some())
            .collect()
    }

    /// The newest version first, fetched without a listing: most damage is repaired from
    /// the newest backup, by one run of the tool.
    fn newest_unlisted(&self, work: &mut dyn Attempts) {
        if self.versions.is_empty() {
            return;
        }
        let blind: Vec<(usize, Copy)> = (0..self.sought.len())
            .map(|k| {
                let copy = Copy {
                    version: 0,
                    path: self.sought[k].own.clone(),
                    stamp: String::new(),
                };
                (k, copy)
            })
            .collect();
        self.offer(work, blind, true);
    }

    fn offer(&self, work: &mut dyn Attempts, copies: Vec<(usize, Copy)>, blind: bool) {
        let (sought, versions, maps) = (&self.sought, &self.versions, &self.maps);
        self.backup
            .offer(work, sought, copies, versions, maps, self.watch, blind);
    }

    /// Whether another version may be listed whole (a tree not found where it is now is
    /// looked for in the newest version of each group).
    fn may_list_whole(&self, group: &str) -> bool {
        self.listed_whole.iter().filter(|&&w| w).count() < LISTED_WHOLE
            && !self.groups.iter().any(|g| g == group)
    }

    /// Lists version `v` (in the `open` files' folders, or whole while a tree of theirs is
    /// lost) and offers each new copy at a file's path; a tree not placed yet takes the map
    /// most of its files agree on. Whether `v` is to be listed again, whole.
    fn at_paths(
        &mut self,
        v: usize,
        open: &[usize],
        work: &mut dyn Attempts,
    ) -> Result<bool, Unusable> {
        let group = self.versions[v].group.clone();
        let whole = self.may_list_whole(&group)
            && open.iter().any(|&k| {
                let tree = self.sought[k].tree;
                !self.placed[tree] && self.lost[tree]
            });
        self.listed_whole[v] = whole;
        if whole {
            self.groups.push(group.clone());
        }
        let mut by_path: HashMap<String, Vec<usize>> = HashMap::new();
        for &k in open {
            let s = &self.sought[k];
            by_path
                .entry(loose(&self.maps[s.tree].apply(&s.own)))
                .or_default()
                .push(k);
        }
        let mut folders: Vec<Vec<u8>> = by_path
            .values()
            .map(|ks| {
                let s = &self.sought[ks[0]];
                let there = self.maps[s.tree].apply(&s.own);
                match there.iter().rposition(|&b| b == b'/') {
                    Some(at) => there[..at].to_vec(),
                    None => Vec::new(),
                }
            })
            .collect();
        folders.sort();
        folders.dedup();
        // A file at the root of the repository's tree: list it whole.
        let within: &[Vec<u8>] = if whole || folders.iter().any(Vec::is_empty) {
            &[]
        } else {
            &folders
        };
        let mut hits: Vec<Hit> = Vec::new();
        let mut votes: HashMap<(usize, Map), Vec<Hit>> = HashMap::new();
        let (sought, maps, placed, by_size) =
            (&self.sought, &self.maps, &self.placed, &self.by_size);
        let elsewhere = &mut self.elsewhere;
        let version = &self.versions[v];
        self.backup
            .repo
            .list(version, within, self.watch, &mut |listed, size, stamp| {
                let fits = |k: usize| sought[k].size.is_none_or(|s| s == size);
                let mut at_path = Vec::new();
                for &k in by_path.get(&loose(listed.as_bytes())).into_iter().flatten() {
                    if fits(k) {
                        let s = &sought[k];
                        at_path.push(k);
                        let path = maps[s.tree].apply(&s.own);
                        let copy = Copy {
                            version: v,
                            path,
                            stamp: stamp.clone(),
                        };
                        hits.push(Hit { k, copy, size });
                    }
                }
                if !whole {
                    return;
                }
                for &k in by_size.get(&size).into_iter().flatten() {
                    let s = &sought[k];
                    if at_path.contains(&k) || work.want(s.i).is_none() {
                        continue;
                    }
                    let copy = || Copy {
                        version: v,
                        path: listed.as_bytes().to_vec(),
                        stamp: stamp.clone(),
                    };
                    // Where an unplaced tree may have been backed up from.
                    if !placed[s.tree]
                        && let Some(map) = Map::between(&s.own, listed)
                    {
                        let same = map.apply(&s.own);
                        let c = Copy {
                            path: same,
                            ..copy()
                        };
                        votes
                            .entry((s.tree, map))
                            .or_default()
                            .push(Hit { k, copy: c, size });
                    }
                    let known = elsewhere[k]
                        .iter()
                        .any(|c| c.path == listed.as_bytes() && c.stamp == stamp);
                    if !known && elsewhere[k].len() < ELSEWHERE {
                        elsewhere[k].push(copy());
                    }
                }
            })?;
        for k in hits.iter().map(|h| h.k) {
            self.placed[self.sought[k].tree] = true;
        }
        let mut again = false;
        if !whole {
            for &k in open {
                let tree = self.sought[k].tree;
                if !self.placed[tree] && !self.lost[tree] {
                    self.lost[tree] = true;
                    again |= self.may_list_whole(&group);
                }
            }
        }
        self.place(votes, &mut hits);
        let mut copies = Vec::new();
        for Hit { k, copy, size } in hits {
            if work.want(self.sought[k].i).is_none() {
                continue;
            }
            let seen = &mut self.seen[k];
            if let Some(met) = seen
                .iter_mut()
                .find(|m| m.size == size && m.stamp == copy.stamp)
            {
                // The same stored content in an older version: the damage is that old.
                met.back_to = Some(v);
                continue;
            }
            let from = self
                .backup
                .label(&copy, &self.versions, &self.maps[self.sought[k].tree]);
            seen.push(Met {
                size,
                stamp: copy.stamp.clone(),
                from,
                back_to: None,
            });
            // The newest version's copy at the file's own path was tried before the listing.
            if v == 0 && self.maps[self.sought[k].tree] == Map::default() {
                continue;
            }
            copies.push((k, copy));
        }
        // Said before a newer copy is offered: a repair's report is written when one serves.
        self.date(work, copies.iter().map(|(k, _)| *k).collect::<Vec<_>>());
        self.offer(work, copies, false);
        Ok(again)
    }

    /// Each unplaced tree takes the map most of its files agree on (the longest shared tail
    /// breaks a tie), and the copies that map finds join `hits`.
    fn place(&mut self, mut votes: HashMap<(usize, Map), Vec<Hit>>, hits: &mut Vec<Hit>) {
        for tree in 0..self.maps.len() {
            if self.placed[tree] {
                continue;
            }
            let best = votes
                .iter()
                .filter(|((t, _), _)| *t == tree)
                .map(|((_, map), found)| {
                    let mut files: Vec<usize> = found.iter().map(|f| f.k).collect();
                    files.sort_unstable();
                    files.dedup();
                    (files.len(), std::cmp::Reverse(map.own.len()), map.clone())
                })
                .max_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
            if let Some((_, _, map)) = best {
                hits.extend(votes.remove(&(tree, map.clone())).unwrap_or_default());
                self.maps[tree] = map;
                self.placed[tree] = true;
            }
        }
    }

    /// Files still wanting: files of their size elsewhere in the newest versions (one moved
    /// since the backup), from versions not listed whole yet.
    fn elsewhere_listed(&mut self, work: &dyn Attempts) -> Result<(), Unusable> {
        for v in 0..self.versions.len().min(LISTED_WHOLE) {
            let open = self.open(work);
            if open.is_empty() || self.watch.cancel.load(Ordering::Relaxed) {
                break;
            }
            if self.listed_whole[v] {
                continue;
            }
            let (sought, maps, by_size) = (&self.sought, &self.maps, &self.by_size);
            let elsewhere = &mut self.elsewhere;
            self.backup.repo.list(
                &self.versions[v],
                &[],
                self.watch,
                &mut |listed, size, stamp| {
                    for &k in by_size.get(&size).into_iter().flatten() {
                        let s = &sought[k];
                        let at_path =
                            loose(listed.as_bytes()) == loose(&maps[s.tree].apply(&s.own));
                        let known = elsewhere[k]
                            .iter()
                            .any(|c| c.path == listed.as_bytes() && c.stamp == stamp);
                        if !at_path && !known && elsewhere[k].len() < ELSEWHERE && open.contains(&k)
                        {
                            elsewhere[k].push(Copy {
                                version: v,
                                path: listed.as_bytes().to_vec(),
                                stamp: stamp.clone(),
                            });
                        }
                    }
                },
            )?;
        }
        Ok(())
    }

    /// The copies of each file's size found elsewhere, then, for a file still wanting, what
    /// was tried.
    fn last_tries(&mut self, work: &mut dyn Attempts) {
        let cancel = self.watch.cancel;
        let name = self.backup.repo.name();
        for (k, s) in self.sought.iter().enumerate() {
            // A tree placed after its listing held it: the copy at its path was tried.
            let at_path = loose(&self.maps[s.tree].apply(&s.own));
            let mut others = std::mem::take(&mut self.elsewhere[k]);
            others.retain(|c| loose(&c.path) != at_path);
            let moved = others.len();
            for copy in others {
                if work.want(s.i).is_none() || cancel.load(Ordering::Relaxed) {
                    break;
                }
                let from = self.backup.label(&copy, &self.versions, &Map::default());
                let version = &self.versions[copy.version];
                let repo = &self.backup.repo;
                work.offer(s.i, &from, &mut |sink| {
                    stream(&mut repo.dump(version, &copy.path), self.watch, sink)
                });
            }
            if work.want(s.i).is_some() && !cancel.load(Ordering::Relaxed) {
                let (tried, n) = (self.seen[k].len(), self.versions.len());
                let whole = LISTED_WHOLE.min(n);
                work.tried(
                    s.i,
                    if tried + moved == 0 {
                        format!(
                            "{name}: no copy of its path in its {n} versions, nor of its size \
                             elsewhere in the newest {whole}"
                        )
                    } else {
                        format!(
                            "{name}: every distinct copy tried ({tried} of its path in {n} \
                             versions, {moved} of its size elsewhere in the newest {whole}); \
                             none holds the bytes of its tag"
                        )
                    },
                );
            }
        }
    }
}
