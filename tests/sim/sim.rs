//! One simulated life: a tree on its own disk, a receiver for what the owner is told, and
//! night after night of churn, rot, the owner's repairs and the shipped unit's run, each
//! night checked against the ground truth.

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};

use crate::disk::Disk;
use crate::night::{self, Heard, Ran, Status};
use crate::receiver::Receiver;
use crate::world::{Id, Rot, World, sha256, tag_digest};

/// How a life is sized.
#[derive(Clone, Debug)]
pub struct Setup {
    pub nights: u32,
    pub files: usize,
    /// The nightly budget, a share of the tree (`--max-percent`).
    pub max_percent: u32,
    /// The owner deals with what was told every this many nights.
    pub owner_every: u32,
    /// Nights in a hundred that bring rot.
    pub rot: u32,
    /// Say what each night did.
    pub verbose: bool,
    /// Leave the disk mounted and the scratch folder in place at the end (to look).
    pub keep: bool,
}

/// A broken promise: on which night, and how.
pub struct Failure {
    pub night: u32,
    pub what: String,
    /// What the days did, by night.
    pub log: Vec<(u32, String)>,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "night {}: {}", self.night, self.what)?;
        // The day before it, and the history of the files it names (through their moves).
        let mut names: std::collections::HashSet<&str> = self
            .what
            .split_whitespace()
            .filter(|w| w.contains('/'))
            .collect();
        let mut shown = vec![false; self.log.len()];
        for (i, (night, l)) in self.log.iter().enumerate().rev() {
            let words: Vec<&str> = l.split_whitespace().filter(|w| w.contains('/')).collect();
            if *night == self.night || words.iter().any(|w| names.contains(w)) {
                shown[i] = true;
                if words.iter().any(|w| names.contains(w)) {
                    names.extend(words);
                }
            }
        }
        writeln!(f, "what the days did (the last, and to the files named):")?;
        for ((night, l), _) in self.log.iter().zip(&shown).filter(|(_, s)| **s) {
            writeln!(f, "  {night}: {l}")?;
        }
        Ok(())
    }
}

/// What a night measured.
#[derive(Clone, Debug, Default)]
pub struct Measured {
    pub files: usize,
    pub db_bytes: u64,
    pub max_rss_kib: u64,
    pub seconds: f64,
}

/// What a life came to.
#[derive(Debug, Default)]
pub struct Summary {
    pub nights: Vec<Measured>,
    pub rot_made: u32,
    pub rot_found: u32,
    /// Nights from rot to its first mention, at most.
    pub latest_find: u32,
    pub repaired: u32,
    pub restored: u32,
    pub accepted: u32,
    pub alarms: u32,
    pub all_clears: u32,
}

/// The nights a cycle of `max_percent` a night takes, and a night for what the budget's
/// rounding leaves: every rot must be said within this many nights of being made.
pub fn deadline(setup: &Setup) -> u32 {
    100u32.div_ceil(setup.max_percent) + 1
}

pub fn run(seed: u64, setup: &Setup) -> Result<Summary, Failure> {
    let scratch = tempfile::Builder::new()
        .prefix("intact-sim")
        .tempdir_in("/var/tmp")
        .unwrap();
    // Room for the data (about 70 kB a file), its parity and what is moved aside.
    let mib = (setup.files as u64 * 70 * 4 / 1024).max(256);
    let disk = Disk::new(scratch.path(), mib).unwrap_or_else(|e| panic!("the disk: {e}"));
    let receiver = Receiver::http();
    let start = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let mut world = World::new(disk.mount.join("data"), seed, start);
    world.populate(setup.files);
    let db = scratch.path().join("state/state.db");
    let metrics = scratch.path().join("intact-sim.prom");
    let args = night::unit_command(
        &world.root,
        &format!(
            "--max-time 2h --update --protect --max-percent {}",
            setup.max_percent
        ),
        &db,
        &metrics,
    );
    let env = [
        (
            "INTACT_NOTIFY",
            format!("json://127.0.0.1:{}/notify", receiver.port),
        ),
        (
            "INTACT_HEARTBEAT",
            format!("http://127.0.0.1:{}/heartbeat", receiver.port),
        ),
    ];
    let mut life = Life {
        setup: setup.clone(),
        world,
        db,
        disk,
        seen: 0,
        alarmed: false,
        summary: Summary::default(),
    };
    // The owner's setup, as the README has it: the tree tagged and given parity once, then
    // the timer enabled.
    for verb in ["tag", "protect"] {
        let mut args = life.state_args(&[verb, "-q"]);
        args.push(life.world.root.display().to_string());
        let ran = night::intact(&args, 0, &[]);
        if ran.code != 0 {
            return Err(Failure {
                night: 0,
                what: format!("{verb}: exit {}\n{}{}", ran.code, ran.stdout, ran.stderr),
                log: Vec::new(),
            });
        }
    }
    let result = life.nights(&args, &env, &receiver);
    if setup.keep {
        eprintln!(
            "simulator: kept {} (the tree in {}, the database {}): umount it, then remove it",
            scratch.path().display(),
            life.world.root.display(),
            life.db.display()
        );
        let log: String = life
            .world
            .log
            .iter()
            .map(|(night, l)| format!("{night}: {l}\n"))
            .collect();
        let _ = std::fs::write(scratch.path().join("log.txt"), log);
        std::mem::forget(life.disk);
        let _ = scratch.keep();
    }
    result
}

impl Life {
    /// Night after night: the day's churn, the owner now and then, the unit's run, and the
    /// checks.
    fn nights(
        &mut self,
        args: &[String],
        env: &[(&str, String)],
        receiver: &Receiver,
    ) -> Result<Summary, Failure> {
        let setup = self.setup.clone();
        for night in 1..=setup.nights {
            let fail = |what: String, log: &[(u32, String)]| Failure {
                night,
                what,
                log: log.to_vec(),
            };
            if night > 1 {
                let ops = (setup.files / 100).max(4);
                self.world.day(night, ops, setup.rot, &self.disk);
            }
            if night % setup.owner_every == 0 {
                self.owner(night).map_err(|w| fail(w, &self.world.log))?;
            }
            let made = self.world.damaged().count();
            let ran = night::intact(args, night, env);
            let heard = night::heard(receiver, &mut self.seen);
            let status = night::status(&self.world.root, &self.db, night);
            if let Err(w) = self.check(night, &ran, &heard, &status) {
                let said = format!(
                    "{w}\n--- the night's run: exit {}, {:?}\n--- stdout\n{}--- stderr\n{}",
                    ran.code, args, ran.stdout, ran.stderr
                );
                return Err(fail(said, &self.world.log));
            }
            let measured = Measured {
                files: self.world.names.len(),
                db_bytes: db_bytes(&self.db),
                max_rss_kib: ran.max_rss_kib,
                seconds: ran.seconds,
            };
            if setup.verbose {
                eprintln!(
                    "night {night}: exit {}, {} files, {made} damaged, {} told, {:.2} s, \
                     {} MiB, database {} B a file",
                    ran.code,
                    measured.files,
                    heard.messages.len(),
                    measured.seconds,
                    measured.max_rss_kib / 1024,
                    measured.db_bytes / measured.files.max(1) as u64
                );
            }
            self.summary.nights.push(measured);
        }
        Ok(std::mem::take(&mut self.summary))
    }
}

fn db_bytes(db: &Path) -> u64 {
    ["", "-wal"]
        .iter()
        .map(|s| std::fs::metadata(format!("{}{s}", db.display())).map_or(0, |m| m.len()))
        .sum()
}

struct Life {
    setup: Setup,
    world: World,
    db: PathBuf,
    disk: Disk,
    /// Requests the receiver had before tonight.
    seen: usize,
    /// Whether the last message was an alarm (an all-clear is owed when all is well).
    alarmed: bool,
    summary: Summary,
}

impl Life {
    fn state_args(&self, verb: &[&str]) -> Vec<String> {
        verb.iter()
            .map(|s| s.to_string())
            .chain(["--state".to_string(), self.db.display().to_string()])
            .collect()
    }

    /// The owner deals with the damage they were told of: `intact repair` of the tree (its
    /// parity), then by hand what that could not repair (a silent edit accepted as meant).
    fn owner(&mut self, night: u32) -> Result<(), String> {
        let told: Vec<Id> = self
            .world
            .damaged()
            .filter(|(_, _, d)| d.found.is_some())
            .map(|(id, _, _)| id)
            .collect();
        if told.is_empty() {
            return Ok(());
        }
        let mut args = self.state_args(&["repair", "-q"]);
        args.push(self.world.root.display().to_string());
        let ran = night::intact(&args, night, &[]);
        self.world
            .note(format!("owner: intact repair: exit {}", ran.code));
        // Whatever the repair restored is good again (rot not yet told of included).
        let damaged: Vec<(Id, PathBuf, [u8; 32])> = self
            .world
            .damaged()
            .map(|(id, c, _)| (id, self.world.names_of(id)[0].clone(), c.good))
            .collect();
        for (id, rel, good) in damaged {
            let path = self.world.path(&rel);
            let now = sha256(&std::fs::read(&path).map_err(|e| format!("{}: {e}", rel.display()))?);
            if now == good {
                self.world.contents.get_mut(&id).unwrap().damage = None;
                self.summary.repaired += 1;
                self.world.note(format!("repaired {}", rel.display()));
            }
        }
        remove_kept_copies(&self.world.root);
        for id in told {
            let Some(c) = self.world.contents.get(&id) else {
                continue;
            };
            let Some(d) = &c.damage else { continue };
            if let Rot::SilentEdit { .. } = d.rot {
                let rel = self.world.names_of(id)[0].clone();
                let mut args = self.state_args(&["update", "-q", "--accept-corrupt"]);
                args.push(self.world.path(&rel).display().to_string());
                let ran = night::intact(&args, night, &[]);
                if ran.code != 0 {
                    return Err(format!(
                        "update --accept-corrupt {}: exit {}\n{}{}",
                        rel.display(),
                        ran.code,
                        ran.stdout,
                        ran.stderr
                    ));
                }
                self.summary.accepted += 1;
            } else {
                self.summary.restored += 1;
            }
            self.world.restore_by_hand(id, night);
        }
        Ok(())
    }

    /// The promise, against the truth, after the night's run.
    fn check(
        &mut self,
        night: u32,
        ran: &Ran,
        heard: &Heard,
        status: &Status,
    ) -> Result<(), String> {
        // What status lists as damaged is damaged, and is now known to be.
        let mut listed = BTreeSet::new();
        for p in &status.damaged {
            let rel = p
                .strip_prefix(&self.world.root)
                .map_err(|_| format!("status lists {} outside the tree", p.display()))?;
            let id = self.world.names.get(rel).copied();
            let damage = id.and_then(|id| self.world.contents[&id].damage.as_ref());
            if damage.is_none() {
                return Err(format!(
                    "status lists {} as damaged, and it is not (a false alarm)",
                    rel.display(),
                ));
            }
            let id = id.unwrap();
            listed.insert(id);
            let d = self
                .world
                .contents
                .get_mut(&id)
                .unwrap()
                .damage
                .as_mut()
                .unwrap();
            if d.found.is_none() {
                d.found = Some(night);
                self.summary.rot_found += 1;
                self.summary.latest_find = self.summary.latest_find.max(night - d.made);
            }
        }
        let limit = deadline(&self.setup);
        let mut outstanding = Vec::new();
        for (id, _, d) in self.world.damaged() {
            let name = self.world.names_of(id)[0].clone();
            match d.found {
                Some(found) if !listed.contains(&id) => {
                    return Err(format!(
                        "{} ({:?}, found on night {found}) is damaged and status no longer \
                         lists it: the damage was forgotten",
                        name.display(),
                        d.rot,
                    ));
                }
                Some(_) => outstanding.push(name),
                None if night >= d.made + limit => {
                    return Err(format!(
                        "{} ({:?}, made before night {}) is still not found after {} nights \
                         (a cycle is {} nights at {}%)",
                        name.display(),
                        d.rot,
                        d.made,
                        night - d.made + 1,
                        100u32.div_ceil(self.setup.max_percent),
                        self.setup.max_percent
                    ));
                }
                None => {}
            }
        }
        // The exit code says it.
        let expected = if outstanding.is_empty() { 0 } else { 1 };
        if ran.code != expected {
            return Err(format!(
                "the nightly run exited {} with {} damaged file(s) outstanding (expected {expected})",
                ran.code,
                outstanding.len(),
            ));
        }
        if status.code != expected {
            return Err(format!(
                "status exited {} with {} damaged file(s) outstanding",
                status.code,
                outstanding.len()
            ));
        }
        // A person hears it: an alarm or reminder naming every damaged file while any is
        // outstanding, one all-clear after, the heartbeat only when all is well.
        let root = self.world.root.display().to_string();
        if outstanding.is_empty() {
            let clears = heard.messages.iter().filter(|m| m.2 == "success").count();
            let owed = usize::from(self.alarmed);
            if heard.messages.len() != owed || clears != owed {
                return Err(format!(
                    "all is well and the owner got {:?} (an all-clear owed: {})",
                    heard.messages, self.alarmed
                ));
            }
            if heard.heartbeats != 1 {
                return Err(format!(
                    "all is well and the heartbeat beat {} times",
                    heard.heartbeats
                ));
            }
            self.summary.all_clears += clears as u32;
            self.alarmed = false;
        } else {
            let [(_, body, kind)] = &heard.messages[..] else {
                return Err(format!(
                    "{} damaged file(s) outstanding and the owner got {} messages: {:?}",
                    outstanding.len(),
                    heard.messages.len(),
                    heard.messages
                ));
            };
            if kind != "failure" {
                return Err(format!("damage outstanding and a message of type {kind}"));
            }
            let named = night::named_damaged(body);
            for n in &named {
                let rel = n.strip_prefix(&format!("{root}/")).unwrap_or(n);
                if !outstanding.iter().any(|o| o.as_os_str() == rel) {
                    return Err(format!(
                        "the message names {n}, which is not damaged:\n{body}"
                    ));
                }
            }
            if outstanding.len() <= intact::notify::NAMES_SHOWN {
                for o in &outstanding {
                    if !named
                        .iter()
                        .any(|n| n.ends_with(&format!("/{}", o.display())))
                    {
                        return Err(format!(
                            "the message does not name {}, which is damaged:\n{body}",
                            o.display()
                        ));
                    }
                }
            }
            if heard.heartbeats != 0 {
                return Err("damage outstanding and the heartbeat beat".into());
            }
            self.summary.alarms += 1;
            self.alarmed = true;
        }
        // No tag ever describes damaged bytes, and every other file carries a tag of what
        // it holds: the night's `--update` tagged what was added and edited.
        for (rel, id) in &self.world.names {
            let c = &self.world.contents[id];
            let tag = tag_digest(&self.world.path(rel));
            match &c.damage {
                Some(d) if tag == Some(d.bytes) => {
                    return Err(format!(
                        "{} ({:?}) carries a tag of its damaged bytes: the damage was blessed",
                        rel.display(),
                        d.rot
                    ));
                }
                Some(_) => {}
                None if tag != Some(c.good) => {
                    return Err(format!(
                        "{} is not tagged with what it holds after the night's --update",
                        rel.display()
                    ));
                }
                None => {}
            }
        }
        self.summary.rot_made = self.world.rot_made;
        Ok(())
    }
}

/// Removes the damaged copies `repair` kept beside the files it repaired (the owner, once
/// the repair is seen to be good).
fn remove_kept_copies(dir: &Path) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = e.path();
        let Ok(kind) = e.file_type() else { continue };
        if kind.is_dir() && e.file_name() != ".intact-parity" {
            remove_kept_copies(&path);
        } else if kind.is_file() && path.to_string_lossy().ends_with(".damaged") {
            let _ = std::fs::remove_file(&path);
        }
    }
}
