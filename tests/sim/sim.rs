//! One simulated life: a tree on its own disk, a receiver for what the owner is told, and
//! night after night of churn, rot, the owner's repairs and the shipped unit's run, each
//! night checked against the ground truth.

use std::collections::{BTreeSet, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};

use crate::disk::Disk;
use crate::faults;
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
    /// The database knew the whole tree (it was not lost or rebuilt within a cycle).
    pub whole: bool,
}

/// The means of some nights: database bytes a file, peak RSS (MiB), seconds.
pub struct Span {
    pub per_file: f64,
    pub rss_mib: f64,
    pub seconds: f64,
}

/// The first and the last `k` (at most 20) of the nights whose database knew the whole tree
/// (one filling again after a loss is no baseline), `k`, and how many such nights there were.
pub fn ends(nights: &[Measured]) -> (Span, Span, usize, usize) {
    let whole: Vec<&Measured> = nights.iter().filter(|m| m.whole).collect();
    let span = |ns: &[&Measured]| {
        let n = ns.len().max(1) as f64;
        let mean = |f: &dyn Fn(&Measured) -> f64| ns.iter().map(|m| f(m)).sum::<f64>() / n;
        Span {
            per_file: mean(&|m| m.db_bytes as f64 / m.files.max(1) as f64),
            rss_mib: mean(&|m| m.max_rss_kib as f64 / 1024.0),
            seconds: mean(&|m| m.seconds),
        }
    };
    let k = whole.len().min(20);
    (
        span(&whole[..k]),
        span(&whole[whole.len() - k..]),
        k,
        whole.len(),
    )
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
    pub from_backup: u32,
    pub restored: u32,
    pub accepted: u32,
    pub alarms: u32,
    pub all_clears: u32,
    /// Faults made: runs killed or stopped mid-run, databases lost, databases damaged, mass
    /// deletions (brought back, confirmed).
    pub kills: u32,
    pub lost_dbs: u32,
    pub broken_dbs: u32,
    pub mass_restored: u32,
    pub mass_confirmed: u32,
    /// Files said removed, in all; sets verified by par2 as they were written.
    pub removed_said: u32,
    pub sets_verified: u32,
    /// The store against the data, at most (current sets over a fresh protect's share, and
    /// what was moved aside over its allowance).
    pub worst_store: f64,
    pub worst_stale: f64,
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
    // Room for the data (about 37 kB a file), its parity and what is moved aside.
    let mib = (setup.files as u64 * 40 * 4 / 1024).max(256);
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
        mass: None,
        reset: None,
        fresh_share: 0.0,
        run_began: std::time::SystemTime::now(),
        repo: scratch.path().join("restic"),
        restic_env: vec![
            ("RESTIC_PASSWORD", "sim".into()),
            (
                "RESTIC_CACHE_DIR",
                scratch.path().join("restic-cache").display().to_string(),
            ),
        ],
    };
    life.restic(&["init", "-q"]);
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
    let fresh = night::status(&life.world.root, &life.db, 0);
    let parity = &fresh.doc["overview"]["parity"];
    life.fresh_share = parity["store_bytes"].as_f64().unwrap_or(0.0)
        / parity["current"]["bytes"].as_f64().unwrap_or(1.0).max(1.0);
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
            let fault = (night > 2)
                .then(|| faults::draw(&mut self.world.rng))
                .flatten();
            if night > 1 {
                let ops = (setup.files / 100).max(4);
                self.world.day(night, ops, setup.rot, &self.disk);
            }
            self.fault(night, fault);
            // The owner: a mass deletion the morning after it is told, damage now and then,
            // and a protect of the whole tree once a month (what prunes stale parity).
            if self.mass.as_ref().is_some_and(|m| night > m.night) {
                self.owner_mass(night)
                    .map_err(|w| fail(w, &self.world.log))?;
            }
            if night % setup.owner_every == 0 {
                self.owner(night).map_err(|w| fail(w, &self.world.log))?;
            }
            if night % 30 == 0 {
                let mut protect = self.state_args(&["protect", "-q"]);
                protect.push(self.world.root.display().to_string());
                let ran = night::intact(&protect, night, &[]);
                self.world
                    .note(format!("owner: intact protect: exit {}", ran.code));
            }
            if let Some(faults::Fault::Kill { signal, after }) = fault {
                let (landed, code) = faults::killed_run(args, night, env, signal, after);
                self.world.note(format!(
                    "the run got signal {signal} after {after} files (landed: {landed}, exit \
                     {code}); the timer's next run follows"
                ));
                self.summary.kills += u32::from(landed);
                // Stopped, it tells the owner so (an alarm); killed, nothing.
                let told = night::heard(receiver, &mut self.seen);
                if let Some((_, _, kind)) = told.messages.last() {
                    self.alarmed = kind == "failure";
                }
            }
            let made = self.world.damaged().count();
            self.run_began = std::time::SystemTime::now();
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
                whole: self.reset.is_none_or(|r| night > r + deadline(&setup) + 1),
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
            self.backup(night);
        }
        flat(&self.summary.nights).map_err(|what| Failure {
            night: setup.nights,
            what,
            log: Vec::new(),
        })?;
        Ok(std::mem::take(&mut self.summary))
    }
}

/// What stays flat over a long life (40 nights or more whose database knew the whole
/// tree): the database's bytes a file and the nightly run's peak memory, the last 20 such
/// nights against the first 20 (at most 1.25 times). Time a night is reported, not asserted.
fn flat(nights: &[Measured]) -> Result<(), String> {
    let (first, last, _, whole) = ends(nights);
    if whole < 40 {
        return Ok(());
    }
    for (what, a, b) in [
        ("database bytes a file", first.per_file, last.per_file),
        ("peak RSS (MiB)", first.rss_mib, last.rss_mib),
    ] {
        if b > 1.25 * a {
            return Err(format!(
                "{what} grew from {a:.1} (the first 20 nights) to {b:.1} (the last 20)"
            ));
        }
    }
    Ok(())
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
    /// A mass deletion the owner has not dealt with yet.
    mass: Option<crate::world::MassDeletion>,
    /// The last night the database was lost or damaged (its schedule starts again).
    reset: Option<u32>,
    /// What a fresh protect of the tree stores against its data.
    fresh_share: f64,
    /// When tonight's run began (real time): sets written since are tonight's.
    run_began: std::time::SystemTime,
    /// The nightly backup: a restic repository (outside the tree), and its environment.
    repo: PathBuf,
    restic_env: Vec<(&'static str, String)>,
}

impl Life {
    /// Runs restic on the nightly backup's repository.
    fn restic(&self, args: &[&str]) {
        let out = std::process::Command::new("restic")
            .arg("--repo")
            .arg(&self.repo)
            .args(args)
            .envs(self.restic_env.iter().map(|(k, v)| (k, v)))
            .output()
            .expect("restic");
        assert!(
            out.status.success(),
            "restic {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The nightly backup, after the run, dated by the night (the fake clock's day).
    fn backup(&self, night: u32) {
        let at = std::time::UNIX_EPOCH
            + std::time::Duration::from_secs(
                (self.world.start + night as i64 * crate::world::DAY) as u64,
            );
        let date = humantime::format_rfc3339_seconds(at).to_string();
        let time = date.trim_end_matches('Z').replace('T', " ");
        let root = self.world.root.display().to_string();
        self.restic(&[
            "backup",
            "-q",
            "--time",
            &time,
            "--exclude",
            ".intact-parity",
            &root,
        ]);
    }

    /// `--from` the nightly backup, and the environment restic needs.
    fn backup_source(&self) -> (Vec<String>, Vec<(&str, String)>) {
        let from = vec![
            "--from".to_string(),
            format!("restic:{}", self.repo.display()),
        ];
        (from, self.restic_env.clone())
    }

    /// Makes tonight's fault, before the run (a kill comes with the run itself).
    fn fault(&mut self, night: u32, fault: Option<faults::Fault>) {
        let db = self.db.display().to_string();
        match fault {
            Some(faults::Fault::LostDb) => {
                for suffix in ["", "-wal", "-shm"] {
                    let _ = std::fs::remove_file(format!("{db}{suffix}"));
                }
                self.world.note("the state database was deleted".into());
                self.reset = Some(night);
                // What the owner was told is remembered there: no all-clear is owed by a new
                // database that never sent the alarm.
                self.alarmed = false;
                self.summary.lost_dbs += 1;
            }
            Some(faults::Fault::BrokenDb) => {
                let garbage: Vec<u8> = (0..64 << 10).map(|i| (i * 7 % 251) as u8).collect();
                std::fs::write(&db, garbage).unwrap();
                for suffix in ["-wal", "-shm"] {
                    let _ = std::fs::remove_file(format!("{db}{suffix}"));
                }
                self.world.note("the state database was overwritten".into());
                self.reset = Some(night);
                self.alarmed = false;
                self.summary.broken_dbs += 1;
            }
            // (Files the database has not met again since it was lost are unknown to it: a
            // mass deletion is one once a cycle has read them.)
            Some(faults::Fault::MassDeletion)
                if self.mass.is_none()
                    && self
                        .reset
                        .is_none_or(|r| night > r + deadline(&self.setup) + 1) =>
            {
                self.mass = self.world.mass_delete(night);
            }
            _ => {}
        }
    }

    /// The owner deals with files gone at once (told as an alarm): brings them back with
    /// `repair --missing` (from the tree's parity), or confirms the deletion.
    fn owner_mass(&mut self, night: u32) -> Result<(), String> {
        let mass = self.mass.take().expect("a mass deletion");
        let root = self.world.root.display().to_string();
        if self.world.rng.bool() {
            let (from, env) = self.backup_source();
            let mut args = self.state_args(&["repair", "-q", "--missing"]);
            args.extend(from);
            args.push(root);
            let ran = night::intact(&args, night, &env);
            self.world.note(format!(
                "owner: repair --missing of {} files: exit {}",
                mass.files.len(),
                ran.code
            ));
            // What the last backup held: the files written before the day of the deletion.
            // (A file moved or renamed that day is known under its name before: it comes back
            // there, not under the name no run saw.)
            let mut mass = mass;
            mass.files.retain(|(rel, id, c)| {
                c.born < mass.night && !mass.named.contains(rel) && !mass.linked.contains(id)
            });
            for (rel, _, c) in &mass.files {
                let now = std::fs::read(self.world.path(rel)).map(|b| sha256(&b));
                if now.as_ref().ok() != Some(&c.good) {
                    return Err(format!(
                        "{} (deleted before night {}) was not brought back by repair \
                         --missing from the nightly backup: exit {}\n{}{}",
                        rel.display(),
                        mass.night,
                        ran.code,
                        ran.stdout,
                        ran.stderr
                    ));
                }
            }
            self.world.undelete(mass);
            // It repairs what it finds damaged on its way too.
            self.summary.from_backup += self.repaired();
            // `--missing` brings back every file gone within 30 days: the owner deletes again
            // those deleted on purpose.
            for rel in strays(&self.world.root, &self.world.root, &self.world.names) {
                std::fs::remove_file(self.world.path(&rel)).unwrap();
                self.world
                    .note(format!("owner: deleted again {}", rel.display()));
                self.world.deleted.push((night, rel));
            }
            self.summary.mass_restored += 1;
        } else {
            let mut args = self.state_args(&["scrub", "-q", "--accept-removed"]);
            args.push(root);
            let ran = night::intact(&args, night, &[]);
            self.world.note(format!(
                "owner: scrub --accept-removed of {} files: exit {}",
                mass.files.len(),
                ran.code
            ));
            // A file with several names is known by one, the first the walk meets: the
            // first in path order (the files are), unless a name is new that day.
            let named_today: HashSet<Id> = mass
                .files
                .iter()
                .filter(|(rel, id, _)| mass.linked.contains(id) && mass.named.contains(rel))
                .map(|(_, id, _)| *id)
                .collect();
            // A content whose other name was deleted since, its last, is said gone under
            // that one (the long run's night 103: a name lost in the mass deletion, the
            // link made that night deleted 25 nights later, the deletion then confirmed).
            let mut said: HashSet<Id> = self.world.deleted_ids.clone();
            for (rel, id, c) in mass.files {
                self.world.churned.push((night, c.size));
                // (One moved that day was known, and is said gone, under its name before.)
                let known = c.born < mass.night && !mass.named.contains(&rel);
                let its_name = !mass.linked.contains(&id) || said.insert(id);
                if known
                    && its_name
                    && !named_today.contains(&id)
                    && !self.world.contents.contains_key(&id)
                {
                    self.world.deleted.push((night, rel));
                }
            }
            self.summary.mass_confirmed += 1;
        }
        Ok(())
    }

    /// The damaged files that hold their good bytes again (a repair restored them): their
    /// damage is over. How many.
    fn repaired(&mut self) -> u32 {
        let damaged: Vec<(Id, PathBuf, [u8; 32])> = self
            .world
            .damaged()
            .map(|(id, c, _)| (id, self.world.names_of(id)[0].clone(), c.good))
            .collect();
        let mut n = 0;
        for (id, rel, good) in damaged {
            let now = std::fs::read(self.world.path(&rel)).map(|b| sha256(&b));
            if now.as_ref().ok() == Some(&good) {
                self.world.contents.get_mut(&id).unwrap().damage = None;
                self.world.note(format!("repaired {}", rel.display()));
                n += 1;
            }
        }
        n
    }

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
        self.summary.repaired += self.repaired();
        // Then from the nightly backup, which holds the good bytes of rot it never saw change.
        let (from, env) = self.backup_source();
        let mut args = self.state_args(&["repair", "-q"]);
        args.extend(from);
        args.push(self.world.root.display().to_string());
        let ran = night::intact(&args, night, &env);
        self.world.note(format!(
            "owner: intact repair --from restic: exit {}",
            ran.code
        ));
        self.summary.from_backup += self.repaired();
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
        // A database lost is a schedule lost: its cycle starts again.
        let reset = self.reset.unwrap_or(0);
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
                None if night >= d.made.max(reset) + limit => {
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
        // The exit code says it: damage (1) before an alarm without damage (3: files gone at
        // once, a database's history lost), before all is well (0).
        let alarm = self.mass.is_some() || status.history_lost;
        let expected = match (outstanding.is_empty(), alarm) {
            (false, _) => 1,
            (true, true) => 3,
            (true, false) => 0,
        };
        if ran.code != expected {
            return Err(format!(
                "the nightly run exited {} with {} damaged file(s) outstanding, alarm {alarm} \
                 (expected {expected})",
                ran.code,
                outstanding.len(),
            ));
        }
        if status.code != expected {
            return Err(format!(
                "status exited {} with {} damaged file(s) outstanding, alarm {alarm}",
                status.code,
                outstanding.len()
            ));
        }
        // A person hears it: an alarm or reminder naming every damaged file while any is
        // outstanding, one all-clear after, the heartbeat only when all is well.
        let root = self.world.root.display().to_string();
        if outstanding.is_empty() && alarm {
            let [(_, body, kind)] = &heard.messages[..] else {
                return Err(format!(
                    "an alarm (mass deletion {}, history lost {}) and the owner got {:?}",
                    self.mass.is_some(),
                    status.history_lost,
                    heard.messages
                ));
            };
            if kind != "failure" || !night::named_damaged(body).is_empty() {
                return Err(format!(
                    "an alarm without damage, and the owner got:\n{body}"
                ));
            }
            if heard.heartbeats != 0 {
                return Err("an alarm and the heartbeat beat".into());
            }
            self.summary.alarms += 1;
            self.alarmed = true;
        } else if outstanding.is_empty() {
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
        self.check_removed(night, status)?;
        self.check_parity(night, status)?;
        self.check_proven(night, status)?;
        let left = faults::leftovers(&self.world.root);
        if !left.is_empty() {
            return Err(format!("temp files left after the run: {left:?}"));
        }
        Ok(())
    }

    /// `status`'s files gone are the files deleted: none it lists is there, and every file
    /// deleted within 30 days (a cycle after the database was last lost, and not while many
    /// were gone at once) is listed.
    fn check_removed(&mut self, night: u32, status: &Status) -> Result<(), String> {
        let mut said = BTreeSet::new();
        for p in &status.removed {
            let rel = p
                .strip_prefix(&self.world.root)
                .map_err(|_| format!("status lists {} removed, outside the tree", p.display()))?;
            if self.world.names.contains_key(rel) {
                return Err(format!(
                    "status lists {} removed, and it is there",
                    rel.display()
                ));
            }
            said.insert(rel.to_path_buf());
        }
        // A database lost is a schedule lost: a file is known again once a cycle read it.
        let since = self.reset.map_or(0, |r| r + deadline(&self.setup) + 1);
        for (deleted, rel) in &self.world.deleted {
            let recent = *deleted > since && night < deleted + 28;
            if recent
                && self.mass.is_none()
                && !said.contains(rel)
                && !self.world.names.contains_key(rel)
            {
                return Err(format!(
                    "{} was deleted before night {deleted}, and status does not list it removed",
                    rel.display()
                ));
            }
        }
        self.summary.removed_said = self.summary.removed_said.max(said.len() as u32);
        Ok(())
    }

    /// The parity: every set written tonight verifies with par2cmdline; the sets in the store
    /// cost at most a quarter more than a fresh protect of the tree, and of what changed since
    /// the last protect of the whole tree, would; what is moved aside at most a tenth more
    /// than what was edited or deleted within the grace, and two pack indexes for each such
    /// change.
    fn check_parity(&mut self, night: u32, status: &Status) -> Result<(), String> {
        let store = self.world.root.join(".intact-parity");
        let mut sets = Vec::new();
        for dir in std::fs::read_dir(&store).into_iter().flatten().flatten() {
            if dir.file_name() == "stale" || !dir.path().is_dir() {
                continue;
            }
            for f in std::fs::read_dir(dir.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                let name = f.file_name().to_string_lossy().into_owned();
                let new = f
                    .metadata()
                    .and_then(|m| m.modified())
                    .is_ok_and(|m| m >= self.run_began);
                if new && name.ends_with(".par2") && !name.contains(".vol") {
                    sets.push(f.path());
                }
            }
        }
        for set in sets {
            let out = std::process::Command::new("par2")
                .args(["verify", "-q", "-B"])
                .arg(&self.world.root)
                .arg(&set)
                .output()
                .map_err(|e| format!("par2: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "the set {} written tonight does not verify:\n{}",
                    set.display(),
                    String::from_utf8_lossy(&out.stdout)
                ));
            }
            self.summary.sets_verified += 1;
        }
        let p = &status.doc["overview"]["parity"];
        let (store_bytes, stale, current) = (
            p["store_bytes"].as_f64().unwrap_or(0.0),
            p["stale_bytes"].as_f64().unwrap_or(0.0),
            p["current"]["bytes"].as_f64().unwrap_or(0.0),
        );
        const MIB: f64 = 1048576.0;
        // A scrub gives new content parity and leaves the sets of content edited away or
        // deleted to the monthly protect of the whole tree (another file may hold it).
        let last_protect = night - night % 30;
        let since: u64 = self
            .world
            .churned
            .iter()
            .filter(|(n, _)| *n > last_protect)
            .map(|(_, b)| *b)
            .sum::<u64>()
            // Files gone at once keep their parity whole until the owner says.
            + self.mass.as_ref().map_or(0, |m| m.files.iter().map(|f| f.2.size).sum());
        let allowed = 1.25 * self.fresh_share * (current + since as f64) + MIB;
        self.summary.worst_store = self.summary.worst_store.max(store_bytes / allowed);
        if store_bytes > allowed {
            return Err(format!(
                "the current sets hold {store_bytes} bytes for {current}, and {since} bytes \
                 changed since the last protect: more than 1.25 times a fresh protect's share \
                 ({:.3})",
                self.fresh_share
            ));
        }
        let window: Vec<u64> = self
            .world
            .churned
            .iter()
            .filter(|(n, _)| night < n + 31)
            .map(|(_, b)| *b)
            .collect();
        let churned: u64 = window.iter().sum();
        // Rebuilding a file deleted from a pack takes recovery slices of its size (and a
        // slice more at most), beside the pack's description, which the index and the
        // trimmed volume both carry (docs/parity.md): what a change may leave aside.
        let index = std::fs::read_dir(store.join("packs"))
            .into_iter()
            .flatten()
            .flatten()
            .filter(|f| !f.file_name().to_string_lossy().contains(".vol"))
            .filter_map(|f| f.metadata().ok().map(|m| m.len()))
            .max()
            .unwrap_or(0);
        let allowed = 1.1 * churned as f64 + 2.0 * index as f64 * window.len() as f64 + MIB;
        self.summary.worst_stale = self.summary.worst_stale.max(stale / allowed);
        if stale > allowed {
            return Err(format!(
                "{stale} bytes moved aside for {churned} bytes edited or deleted in {} \
                 changes within the grace",
                window.len()
            ));
        }
        Ok(())
    }

    /// Every file not damaged was proven good within the last cycle (and a night).
    fn check_proven(&mut self, night: u32, status: &Status) -> Result<(), String> {
        let nights = deadline(&self.setup) + 1;
        let settled = self.reset.is_none_or(|r| night > r + nights) && self.mass.is_none();
        if !settled || night <= nights {
            return Ok(());
        }
        let since = self.world.start + (night - nights) as i64 * crate::world::DAY;
        for (path, verified) in &status.verified {
            let Some(rel) = path.strip_prefix(&self.world.root).ok() else {
                continue;
            };
            let Some(c) = self.world.names.get(rel).map(|id| &self.world.contents[id]) else {
                continue;
            };
            if c.damage.is_some() || c.born + nights > night {
                continue;
            }
            if verified.is_none_or(|v| v < since) {
                return Err(format!(
                    "{} was last proven good {verified:?} (Unix seconds), before the cycle \
                     ({nights} nights)",
                    rel.display()
                ));
            }
        }
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

/// The files under `dir` the simulator does not know of (but intact's store and the damaged
/// copies `repair` keeps), relative to `root`.
fn strays(
    root: &Path,
    dir: &Path,
    names: &std::collections::BTreeMap<PathBuf, Id>,
) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = e.path();
        let Ok(kind) = e.file_type() else { continue };
        if kind.is_dir() && e.file_name() != ".intact-parity" {
            found.extend(strays(root, &path, names));
        } else if kind.is_file() && !path.to_string_lossy().ends_with(".damaged") {
            let rel = path.strip_prefix(root).unwrap().to_path_buf();
            if !names.contains_key(&rel) {
                found.push(rel);
            }
        }
    }
    found
}
