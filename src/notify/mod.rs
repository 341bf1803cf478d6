//! Telling a person: what a run found wrong, as one message for a phone or a mailbox, sent
//! through the tools people already have (Apprise for 100+ services, `sendmail` for mail);
//! reminders while it stays wrong, one all-clear after; a heartbeat after a clean run so that
//! silence from intact itself raises an alarm elsewhere.
//!
//! The decisions are pure functions over values: [`Findings`] (a closed set of [`Problem`]s)
//! and the memory of what was last told ([`Told`], kept in the state database) give a
//! [`Decision`]; [`compose`] turns findings and decision into a [`Message`]. Only [`deliver`]
//! touches the world, through child processes bounded in time.

mod deliver;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::Duration;

pub use deliver::{Channel, NotifyError, deliver, heartbeat, parse_channels};

use crate::text::{escape, shell_word};

/// Names kept per kind of problem: enough to tell what is new since the last message on any
/// real night; the counts stay exact beyond it.
pub const NAMES_KEPT: usize = 1000;
/// Names a message shows per kind: readable on a phone; `intact status` lists the rest.
pub const NAMES_SHOWN: usize = 20;

/// Who is told, how, and how often: the settings of a run.
#[derive(Clone, Debug)]
pub struct Setup {
    /// Where messages go (none: only the heartbeat).
    pub channels: Vec<Channel>,
    /// Reminders at most this often (zero: every run).
    pub remind_every: Duration,
    /// Fetched after a clean run.
    pub heartbeat: Option<String>,
    /// Repair sources for the commands a message gives.
    pub repair_from: Vec<String>,
    /// How long one delivery may take.
    pub timeout: Duration,
}

/// One thing wrong after a run: a closed set, each said in its own words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Problem {
    /// A file whose data no longer matches its tag (or damage beyond one file, such as an
    /// archive's own stream), and when it was first found (Unix milliseconds).
    Damaged {
        /// The file, escaped for one line (or what is damaged, in words).
        what: String,
        /// When it was found, if known.
        found: Option<i64>,
    },
    /// A file that could not be verified: unreadable, vanished, changed while read.
    Unverified {
        /// The file, escaped, and why.
        what: String,
    },
    /// A tree that holds none of the files recorded under it (an unmounted disk, a folder
    /// deleted by mistake), or lost many of them at once.
    Vanished {
        /// In words: which tree and what is gone.
        what: String,
    },
    /// The run could not do part of its job (a state database it could not use, a time
    /// budget spent, a delivery of the last message that failed ...).
    Failure {
        /// In words.
        what: String,
    },
    /// The run was stopped before it finished (a timeout, a shutdown).
    Interrupted,
}

impl Problem {
    /// What identifies it from run to run, for "new since the last message".
    pub fn key(&self) -> String {
        match self {
            Problem::Damaged { what, .. } => format!("damaged {what}"),
            Problem::Unverified { what } => format!("unverified {what}"),
            Problem::Vanished { what } => format!("vanished {what}"),
            Problem::Failure { what } => format!("failure {what}"),
            Problem::Interrupted => "interrupted".into(),
        }
    }
}

/// What a run found wrong: the problems (names capped at [`NAMES_KEPT`] a kind) and the exact
/// counts.
#[derive(Clone, Debug, Default)]
pub struct Findings {
    /// Every problem kept, in the order found.
    pub problems: Vec<Problem>,
    /// Damaged files, all of them (beyond the names kept), by name: a hard-link group of
    /// three is three.
    pub damaged: u64,
    /// The damaged files' inodes (file system, inode), where known, each with its names (as
    /// hashes): a group of names counts once in [`Findings::damaged_files`], and a name told
    /// twice (runs merged) once.
    inodes: HashMap<(u64, u64), HashSet<u64>>,
    /// Damaged names whose inode is not known (damage in words, a file not there now).
    unknown_inodes: u64,
    /// Files not verified, all of them.
    pub unverified: u64,
    /// Of those, files gone that a repair could not bring back (`repair --missing`).
    pub missing: u64,
}

impl Findings {
    /// Adds a damaged file (or damage in words) found at `found`, with its inode where known
    /// (file system, inode).
    pub fn damaged(&mut self, what: String, found: Option<i64>, inode: Option<(u64, u64)>) {
        self.damaged += 1;
        match inode {
            Some(i) => {
                use std::hash::{Hash, Hasher};
                let mut h = std::hash::DefaultHasher::new();
                what.hash(&mut h);
                self.inodes.entry(i).or_default().insert(h.finish());
            }
            None => self.unknown_inodes += 1,
        }
        if self.damaged as usize <= NAMES_KEPT {
            self.problems.push(Problem::Damaged { what, found });
        }
    }

    /// Adds a file that could not be verified.
    pub fn unverified(&mut self, what: String) {
        self.unverified += 1;
        if self.unverified as usize <= NAMES_KEPT {
            self.problems.push(Problem::Unverified { what });
        }
    }

    /// Adds a file that is gone and that a repair could not bring back.
    pub fn missing(&mut self, what: String) {
        self.missing += 1;
        self.unverified(what);
    }

    /// Adds another problem.
    pub fn push(&mut self, p: Problem) {
        if !self.problems.contains(&p) {
            self.problems.push(p);
        }
    }

    /// Adds `other`'s findings to these (reports held until their work settled).
    pub fn merge(&mut self, other: &Findings) {
        self.damaged += other.damaged;
        self.unverified += other.unverified;
        self.missing += other.missing;
        for (inode, names) in &other.inodes {
            self.inodes.entry(*inode).or_default().extend(names);
        }
        self.unknown_inodes += other.unknown_inodes;
        let named = |f: &Findings, damaged: bool| {
            f.problems
                .iter()
                .filter(|p| match p {
                    Problem::Damaged { .. } => damaged,
                    Problem::Unverified { .. } => !damaged,
                    _ => false,
                })
                .count()
        };
        let (mut damaged, mut unverified) = (named(self, true), named(self, false));
        for p in &other.problems {
            let count = match p {
                Problem::Damaged { .. } => &mut damaged,
                Problem::Unverified { .. } => &mut unverified,
                other => {
                    self.push(other.clone());
                    continue;
                }
            };
            if *count < NAMES_KEPT {
                *count += 1;
                self.problems.push(p.clone());
            }
        }
    }

    /// Damaged files counted by inode where known: a hard-link group of three names is one.
    pub fn damaged_files(&self) -> u64 {
        (self.inodes.len() as u64 + self.unknown_inodes).min(self.damaged)
    }

    /// The damaged files in words, their names apart where they differ ("2 damaged files (3
    /// names: hard links)").
    pub fn damaged_count(&self, one: &str, many: &str) -> String {
        let files = self.damaged_files();
        let names = self.inodes.values().map(|n| n.len() as u64).sum::<u64>() + self.unknown_inodes;
        let mut t = plural(files, one, many);
        if names > files {
            t.push_str(&format!(
                " ({} names: hard links)",
                crate::text::group(names)
            ));
        }
        t
    }

    /// Whether nothing is wrong.
    pub fn is_clear(&self) -> bool {
        self.problems.is_empty() && self.damaged == 0 && self.unverified == 0
    }

    /// The keys of what is wrong, for the memory of what was told.
    pub fn keys(&self) -> Vec<String> {
        self.problems.iter().map(Problem::key).collect()
    }
}

/// What was last told about a set of trees (kept in the state database).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Told {
    /// When (Unix milliseconds).
    pub at: i64,
    /// Whether it was an alarm (else an all-clear).
    pub alarm: bool,
    /// The keys of the problems it told.
    pub keys: Vec<String>,
}

/// What to send after a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Nothing: all is well and was already said, or a reminder is not yet due.
    Quiet,
    /// Something is wrong: the keys new since the last message (all of them after an
    /// all-clear or without a memory); a reminder when none is new.
    Alarm {
        /// Keys of problems not in the last message.
        new: HashSet<String>,
    },
    /// All is well again after an alarm.
    AllClear {
        /// When the alarm was sent.
        since: i64,
    },
}

/// Decides what to send: an alarm when anything is new since the last message, a reminder
/// while something is outstanding (every run, or once `remind_every` has passed since the
/// last message), one all-clear when nothing is wrong any more.
pub fn decide(now: i64, keys: &[String], last: Option<&Told>, remind_every: Duration) -> Decision {
    let told: HashSet<&str> = match last {
        Some(t) if t.alarm => t.keys.iter().map(String::as_str).collect(),
        _ => HashSet::new(),
    };
    if keys.is_empty() {
        return match last {
            Some(t) if t.alarm => Decision::AllClear { since: t.at },
            _ => Decision::Quiet,
        };
    }
    let new: HashSet<String> = keys
        .iter()
        .filter(|k| !told.contains(k.as_str()))
        .cloned()
        .collect();
    let due = match last {
        Some(t) if t.alarm => now.saturating_sub(t.at) >= remind_every.as_millis() as i64,
        _ => true,
    };
    if new.is_empty() && !due {
        Decision::Quiet
    } else {
        Decision::Alarm { new }
    }
}

/// Where and when a message is about.
#[derive(Clone, Debug)]
pub struct Context {
    /// The machine's name.
    pub host: String,
    /// The verb that ran.
    pub verb: String,
    /// The trees it ran on.
    pub roots: Vec<PathBuf>,
    /// When it ended (Unix milliseconds).
    pub at: i64,
    /// Its exit code.
    pub exit: i32,
    /// Repair sources the owner configured (`INTACT_REPAIR_FROM`), for the commands shown.
    pub repair_from: Vec<String>,
    /// Whether one of them is a restic repository whose password this run's environment
    /// does not hold (the repair the message suggests would fail there).
    pub restic_without_password: bool,
}

/// How bad a message is: Apprise's notification types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    /// Something is wrong.
    Failure,
    /// All is well (an all-clear, a test).
    Success,
}

impl Severity {
    /// Apprise's name for it (`apprise -n`).
    pub fn apprise(self) -> &'static str {
        match self {
            Severity::Failure => "failure",
            Severity::Success => "success",
        }
    }
}

/// A message for a person: a subject of one line and a plain-text body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// One line, no control characters.
    pub subject: String,
    /// Plain text, lines short enough for a phone.
    pub body: String,
    /// How bad it is.
    pub severity: Severity,
}

/// The message for `decision`, if there is one to send.
pub fn compose(ctx: &Context, findings: &Findings, decision: &Decision) -> Option<Message> {
    // The host name is one line of printable text wherever it is shown.
    let ctx = &Context {
        host: subject(&ctx.host),
        ..ctx.clone()
    };
    match decision {
        Decision::Quiet => None,
        Decision::AllClear { since } => Some(all_clear(ctx, *since)),
        Decision::Alarm { new } => Some(alarm(ctx, findings, new)),
    }
}

/// The trees, as a person reads them.
fn trees(ctx: &Context) -> String {
    let shown: Vec<String> = ctx.roots.iter().map(|r| escape(r)).collect();
    match shown.len() {
        0 => "nothing".into(),
        1..=3 => shown.join(", "),
        n => format!("{} and {} more trees", shown[..2].join(", "), n - 2),
    }
}

/// The trees as arguments of a shell command.
fn tree_args(ctx: &Context) -> String {
    let args: Vec<String> = ctx.roots.iter().map(|r| shell_word(&escape(r))).collect();
    args.join(" ")
}

/// How long something has been outstanding, in the largest whole unit a person counts in.
fn outstanding(ms: i64) -> String {
    let hours = ms.max(0) / 3_600_000;
    match hours {
        0 => "less than an hour".into(),
        1..=47 => plural(hours as u64, "hour", "hours"),
        _ => plural((hours / 24) as u64, "day", "days"),
    }
}

fn plural(n: u64, one: &str, many: &str) -> String {
    format!(
        "{} {}",
        crate::text::group(n),
        if n == 1 { one } else { many }
    )
}

fn all_clear(ctx: &Context, since: i64) -> Message {
    let subject = subject(&format!(
        "intact: all clear in {} on {}",
        trees(ctx),
        ctx.host
    ));
    let body = format!(
        "intact on {host}, {verb} of {trees} at {at}: all clear.\n\n\
         Nothing reported in the message of {since} is outstanding any more: the damage was \
         repaired, accepted or deleted, and every file this run was asked to verify was \
         verified.\n\n-- intact {version} on {host}\n",
        host = ctx.host,
        verb = ctx.verb,
        trees = trees(ctx),
        at = crate::text::time_ms(ctx.at),
        since = crate::text::time_ms(since),
        version = env!("CARGO_PKG_VERSION"),
    );
    Message {
        subject,
        body,
        severity: Severity::Success,
    }
}

fn alarm(ctx: &Context, f: &Findings, new: &HashSet<String>) -> Message {
    let is_new = |p: &Problem| new.contains(&p.key());
    let reminder = new.is_empty();
    let fresh = f.problems.iter().filter(|p| is_new(p)).count();
    // Marks only where there is something to tell apart: some new, some told before.
    let marking = !reminder && fresh < f.problems.len();
    let mark = |p: &Problem| if marking && is_new(p) { "* " } else { "  " };
    let vanished: Vec<&Problem> = f
        .problems
        .iter()
        .filter(|p| matches!(p, Problem::Vanished { .. }))
        .collect();
    let headline = if !vanished.is_empty() {
        format!("{} vanished", trees(ctx))
    } else if f.damaged > 0 {
        format!(
            "{} in {}",
            f.damaged_count("damaged file", "damaged files"),
            trees(ctx)
        )
    } else if f.unverified > 0 {
        format!(
            "{} in {} could not be verified",
            plural(f.unverified, "file", "files"),
            trees(ctx)
        )
    } else if f.problems.iter().all(|p| *p == Problem::Interrupted) {
        format!(
            "the {} of {} stopped before it finished",
            ctx.verb,
            trees(ctx)
        )
    } else {
        format!("the {} of {} could not do its job", ctx.verb, trees(ctx))
    };
    let subject = subject(&format!(
        "{}intact: {headline} on {}",
        if reminder { "Reminder: " } else { "" },
        ctx.host
    ));
    let mut b = format!(
        "{}intact on {}, {} of {} at {} (exit {}).\n",
        if reminder { "Reminder: " } else { "" },
        ctx.host,
        ctx.verb,
        trees(ctx),
        crate::text::time_ms(ctx.at),
        ctx.exit
    );
    if reminder {
        b.push_str("Nothing is new since the last message, and this is still outstanding");
        let oldest = f
            .problems
            .iter()
            .filter_map(|p| match p {
                Problem::Damaged { found, .. } => *found,
                _ => None,
            })
            .min();
        match oldest {
            Some(found) => b.push_str(&format!(
                ": the oldest damage was found {} ({} ago).\n",
                crate::text::time_ms(found),
                outstanding(ctx.at - found)
            )),
            None => b.push_str(".\n"),
        }
    } else if marking {
        b.push_str(&format!(
            "New since the last message: {} (marked *).\n",
            plural(fresh as u64, "item", "items")
        ));
    }
    for p in &vanished {
        if let Problem::Vanished { what } = p {
            b.push_str(&format!("\nTREE VANISHED\n{}{what}\n", mark(p)));
        }
    }
    if !vanished.is_empty() {
        b.push_str(
            "Nothing was marked deleted: the records are kept until the files come back \
             (mount the disk, restore the folder) or you confirm the deletion with \
             `intact scrub --accept-removed`.\n",
        );
    }
    if f.damaged > 0 {
        b.push_str(&format!(
            "\nDAMAGED: {}. The data changed while the modification time did not: no program \
             saving a file does that; a failing disk, cable, controller or memory does.\n",
            f.damaged_count("file", "files")
        ));
        list(
            &mut b,
            f,
            |p| match p {
                Problem::Damaged { what, found } => Some(match found {
                    Some(t) => format!("{what} (found {})", crate::text::time_ms(*t)),
                    None => what.clone(),
                }),
                _ => None,
            },
            f.damaged,
            &mark,
        );
        b.push_str(
            "Backups made before the damage hold good copies: repair before their retention \
             drops them.\n",
        );
    }
    if f.unverified > 0 {
        b.push_str(&format!(
            "\nNOT VERIFIED: {} could not be read or checked.\n",
            plural(f.unverified, "file", "files")
        ));
        list(
            &mut b,
            f,
            |p| match p {
                Problem::Unverified { what } => Some(what.clone()),
                _ => None,
            },
            f.unverified,
            &mark,
        );
        if f.missing > 0 {
            let (n, are) = (
                crate::text::group(f.missing),
                if f.missing == 1 { "is" } else { "are" },
            );
            b.push_str(&format!(
                "{n} of them {are} gone, and no source given held a good copy.\n"
            ));
        }
    }
    let failures: Vec<&Problem> = f
        .problems
        .iter()
        .filter(|p| matches!(p, Problem::Failure { .. }))
        .collect();
    if !failures.is_empty() {
        b.push_str("\nPROBLEMS\n");
        for p in failures {
            if let Problem::Failure { what } = p {
                b.push_str(&format!("{}{what}\n", mark(p)));
            }
        }
    }
    if f.problems.contains(&Problem::Interrupted) {
        b.push_str(&format!(
            "\nINTERRUPTED: the {} stopped before it finished (a timeout, a shutdown, a \
             signal): what it did not reach was not verified this run.\n",
            ctx.verb
        ));
    }
    b.push_str(&what_to_do(ctx, f, !vanished.is_empty()));
    b.push_str(&format!(
        "\nYou are reminded while anything here is outstanding (--remind-every spaces the \
         reminders out), and told once when all is clear.\n-- intact {} on {}\n",
        env!("CARGO_PKG_VERSION"),
        ctx.host
    ));
    Message {
        subject,
        body: b,
        severity: Severity::Failure,
    }
}

/// Lists the first [`NAMES_SHOWN`] problems `pick` names, and how many more there are.
fn list(
    b: &mut String,
    f: &Findings,
    pick: impl Fn(&Problem) -> Option<String>,
    total: u64,
    mark: &dyn Fn(&Problem) -> &'static str,
) {
    let mut shown = 0u64;
    // New ones first: they are what the owner has not seen.
    let (fresh, old): (Vec<&Problem>, Vec<&Problem>) =
        f.problems.iter().partition(|p| mark(p) == "* ");
    for p in fresh.into_iter().chain(old) {
        if shown as usize >= NAMES_SHOWN {
            break;
        }
        if let Some(line) = pick(p) {
            b.push_str(&format!("{}{line}\n", mark(p)));
            shown += 1;
        }
    }
    if total > shown {
        b.push_str(&format!(
            "  ... and {} more\n",
            crate::text::group(total - shown)
        ));
    }
}

/// The commands that deal with what was found.
fn what_to_do(ctx: &Context, f: &Findings, vanished: bool) -> String {
    let trees = tree_args(ctx);
    let mut b = String::from("\nWHAT TO DO\n");
    if vanished {
        b.push_str(&format!(
            "If the disk did not mount, mount it and run the scrub again. If the folder was \
             moved or renamed, scrub it where it is now (`intact scrub --update NEW-PATH`: \
             verified there afresh) and confirm the old path as below. If the files were \
             deleted on purpose, confirm it:\n  intact scrub --accept-removed {trees}\n"
        ));
    }
    if f.damaged > 0 {
        b.push_str(&format!(
            "See every damaged file and when it was found:\n  intact status -q {trees}\n"
        ));
        // Sent to outside services: sources that hold a secret (a repository URL's password)
        // are named by where they are configured, so that the command runs as printed.
        let secret = ctx.repair_from.iter().any(|s| crate::text::redact(s) != *s);
        let from = if ctx.repair_from.is_empty() {
            "--from BACKUP".to_string()
        } else if secret {
            "--from configured".to_string()
        } else {
            ctx.repair_from
                .iter()
                .map(|s| format!("--from {}", shell_word(s)))
                .collect::<Vec<_>>()
                .join(" ")
        };
        b.push_str(&format!(
            "Repair from a copy (a backup tree, an archive, restic:REPO, borg:REPO, parity; \
             checked against the tag before anything is replaced), first as a dry run:\n  \
             intact repair {trees} {from} --dry-run\nthen the same without --dry-run. If a \
             change was yours after all, accept it:\n  intact update --accept-corrupt FILE\n"
        ));
        if ctx.restic_without_password {
            b.push_str(
                "restic needs the repository's password where the repair runs, and this run \
                 had none (RESTIC_PASSWORD_FILE, RESTIC_PASSWORD or RESTIC_PASSWORD_COMMAND; \
                 for the units, in /etc/default/intact).\n",
            );
        }
    }
    if f.missing > 0 {
        b.push_str(&format!(
            "Bring back what is gone from another copy (an older backup, another \
             repository), or, if it was deleted on purpose, confirm it:\n  intact repair \
             {trees} --missing --from BACKUP --dry-run\n  intact scrub --accept-removed {trees}\n"
        ));
    }
    if f.unverified > f.missing
        || f.problems
            .iter()
            .any(|p| matches!(p, Problem::Failure { .. }))
    {
        b.push_str(&format!(
            "See why files could not be verified (the run's own lines say it):\n  intact check \
             {trees}\n  journalctl -u 'intact-scrub@*' (for the nightly unit)\n"
        ));
    }
    if f.problems.contains(&Problem::Interrupted) {
        b.push_str(
            "If the run keeps being cut short, give it more time (TimeoutStopSec= of the unit) \
             or a smaller budget (--max-time).\n",
        );
    }
    b
}

/// A subject for mail headers and push titles: one line without control characters, of a
/// length a phone shows.
fn subject(s: &str) -> String {
    const MAX: usize = 120;
    let mut out: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if out.chars().count() > MAX {
        out = out.chars().take(MAX - 1).collect::<String>() + "…";
    }
    out
}

/// A test message, to prove that the channels reach a person.
pub fn test_message(host: &str) -> Message {
    Message {
        subject: subject(&format!("intact: test message from {host}")),
        body: format!(
            "This is a test message from intact on {host}.\n\nIf you read this, intact can \
             tell you when it finds damaged files, when it cannot verify a tree, and when all \
             is clear again.\n-- intact {}\n",
            env!("CARGO_PKG_VERSION")
        ),
        severity: Severity::Success,
    }
}

/// This machine's name, for messages.
pub fn host_name() -> String {
    let name = rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .into_owned();
    if name.is_empty() {
        "this machine".into()
    } else {
        subject(&name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn ctx() -> Context {
        Context {
            host: "nas".into(),
            verb: "scrub".into(),
            roots: vec![PathBuf::from("/srv/photos")],
            at: 1_764_728_045_000,
            exit: 1,
            repair_from: vec![],
            restic_without_password: false,
        }
    }

    fn told(at: i64, alarm: bool, keys: &[&str]) -> Told {
        Told {
            at,
            alarm,
            keys: keys.iter().map(|k| k.to_string()).collect(),
        }
    }

    fn keys(k: &[&str]) -> Vec<String> {
        k.iter().map(|k| k.to_string()).collect()
    }

    #[test]
    fn first_problem_is_an_alarm_with_everything_new() {
        let d = decide(10, &keys(&["a", "b"]), None, Duration::ZERO);
        assert_eq!(
            d,
            Decision::Alarm {
                new: ["a", "b"].map(String::from).into()
            }
        );
    }

    #[test]
    fn a_problem_after_an_all_clear_is_new_again() {
        let d = decide(
            10,
            &keys(&["a"]),
            Some(&told(5, false, &["a"])),
            Duration::MAX,
        );
        assert_eq!(
            d,
            Decision::Alarm {
                new: ["a"].map(String::from).into()
            }
        );
    }

    #[test]
    fn reminders_every_run_by_default_and_spaced_when_asked() {
        let last = told(1_000, true, &["a"]);
        assert_eq!(
            decide(2_000, &keys(&["a"]), Some(&last), Duration::ZERO),
            Decision::Alarm {
                new: HashSet::new()
            }
        );
        let day = Duration::from_secs(86_400);
        assert_eq!(
            decide(2_000, &keys(&["a"]), Some(&last), day),
            Decision::Quiet
        );
        assert_eq!(
            decide(1_000 + 86_400_000, &keys(&["a"]), Some(&last), day),
            Decision::Alarm {
                new: HashSet::new()
            }
        );
    }

    #[test]
    fn something_new_is_told_at_once_whatever_the_reminder_interval() {
        let last = told(1_000, true, &["a"]);
        let d = decide(
            1_001,
            &keys(&["a", "b"]),
            Some(&last),
            Duration::from_secs(86_400),
        );
        assert_eq!(
            d,
            Decision::Alarm {
                new: ["b"].map(String::from).into()
            }
        );
    }

    #[test]
    fn all_clear_once_after_an_alarm_then_quiet() {
        let d = decide(5, &[], Some(&told(1, true, &["a"])), Duration::ZERO);
        assert_eq!(d, Decision::AllClear { since: 1 });
        assert_eq!(
            decide(6, &[], Some(&told(5, false, &[])), Duration::ZERO),
            Decision::Quiet
        );
        assert_eq!(decide(6, &[], None, Duration::ZERO), Decision::Quiet);
    }

    #[test]
    fn a_reminder_says_it_is_one_and_how_long_the_damage_has_waited() {
        let mut f = Findings::default();
        let c = ctx();
        f.damaged(
            "/srv/photos/a.jpg".into(),
            Some(c.at - 12 * 86_400_000 - 5),
            None,
        );
        f.damaged("/srv/photos/b.jpg".into(), Some(c.at - 3_600_000), None);
        let reminder = Decision::Alarm {
            new: HashSet::new(),
        };
        let m = compose(&c, &f, &reminder).unwrap();
        assert!(
            m.subject.starts_with("Reminder: intact: 2 damaged files"),
            "{}",
            m.subject
        );
        let first = m.body.lines().next().unwrap();
        assert!(
            first.starts_with("Reminder: intact on nas, scrub of /srv/photos"),
            "{first}"
        );
        assert!(
            m.body.contains("the oldest damage was found 2025-11-21"),
            "{}",
            m.body
        );
        assert!(m.body.contains("(12 days ago)"), "{}", m.body);
        assert_eq!(outstanding(47 * 3_600_000), "47 hours");
        assert_eq!(outstanding(30 * 60_000), "less than an hour");
    }

    /// Names of one file (hard links) are counted as one file, the names said apart; merged
    /// findings (the watch's runs) keep that.
    #[test]
    fn hard_links_are_counted_as_files_and_names_apart() {
        let mut f = Findings::default();
        for name in ["a", "a-link", "a-other-link"] {
            f.damaged(format!("/srv/photos/{name}"), Some(1), Some((7, 100)));
        }
        let mut more = Findings::default();
        more.damaged("/srv/photos/b".into(), Some(1), Some((7, 101)));
        more.damaged("damage in words".into(), None, None);
        // A name told again (the watch merges its runs' findings) is one name.
        more.damaged("/srv/photos/a".into(), Some(1), Some((7, 100)));
        f.merge(&more);
        assert_eq!((f.damaged, f.damaged_files()), (6, 3));
        let d = Decision::Alarm {
            new: HashSet::new(),
        };
        let m = compose(&ctx(), &f, &d).unwrap();
        assert!(
            m.subject
                .contains("intact: 3 damaged files (5 names: hard links) in /srv/photos"),
            "{}",
            m.subject
        );
        assert!(
            m.body.contains("DAMAGED: 3 files (5 names: hard links)."),
            "{}",
            m.body
        );
        let mut single = Findings::default();
        single.damaged("/srv/photos/a".into(), Some(1), Some((7, 100)));
        let m = compose(&ctx(), &single, &d).unwrap();
        assert!(
            m.subject.contains("intact: 1 damaged file in"),
            "{}",
            m.subject
        );
    }

    #[test]
    fn a_restic_source_without_its_password_is_said_with_the_repair() {
        let mut f = Findings::default();
        f.damaged("/srv/photos/a.jpg".into(), Some(1), None);
        let d = Decision::Alarm {
            new: HashSet::new(),
        };
        let mut c = ctx();
        let said = "restic needs the repository's password where the repair runs";
        assert!(!compose(&c, &f, &d).unwrap().body.contains(said));
        c.restic_without_password = true;
        assert!(compose(&c, &f, &d).unwrap().body.contains(said));
    }

    #[test]
    fn files_a_repair_could_not_bring_back_get_the_commands_for_them() {
        let mut f = Findings::default();
        f.missing("/srv/photos/a.jpg (missing: no source held it)".into());
        let d = Decision::Alarm {
            new: HashSet::new(),
        };
        let m = compose(&ctx(), &f, &d).unwrap();
        assert!(
            m.body.contains("1 of them is gone, and no source"),
            "{}",
            m.body
        );
        assert!(
            m.body
                .contains("intact repair /srv/photos --missing --from BACKUP --dry-run"),
            "{}",
            m.body
        );
        assert!(
            m.body.contains("intact scrub --accept-removed /srv/photos"),
            "{}",
            m.body
        );
        // Not the advice for files that could not be read: nothing here is to be checked.
        assert!(!m.body.contains("intact check"), "{}", m.body);
        f.unverified("/srv/photos/b.jpg (error: Input/output error)".into());
        let m = compose(&ctx(), &f, &d).unwrap();
        assert!(m.body.contains("intact check /srv/photos"), "{}", m.body);
    }

    #[test]
    fn the_alarm_names_the_damage_marks_what_is_new_and_gives_the_commands() {
        let mut f = Findings::default();
        f.damaged("/srv/photos/old.jpg".into(), Some(1_764_000_000_000), None);
        f.damaged("/srv/photos/new.jpg".into(), Some(1_764_728_045_000), None);
        let new: HashSet<String> = [Problem::Damaged {
            what: "/srv/photos/new.jpg".into(),
            found: Some(1_764_728_045_000),
        }
        .key()]
        .into();
        let mut c = ctx();
        c.repair_from = vec!["restic:/backup/repo".into()];
        let m = compose(&c, &f, &Decision::Alarm { new: new.clone() }).unwrap();
        assert_eq!(m.subject, "intact: 2 damaged files in /srv/photos on nas");
        assert_eq!(m.severity, Severity::Failure);
        assert!(
            m.body
                .contains("* /srv/photos/new.jpg (found 2025-12-03T02:14:05Z)"),
            "{}",
            m.body
        );
        assert!(
            m.body.contains("  /srv/photos/old.jpg (found"),
            "{}",
            m.body
        );
        assert!(
            m.body.contains("New since the last message: 1 item"),
            "{}",
            m.body
        );
        assert!(
            m.body.contains("intact status -q /srv/photos"),
            "{}",
            m.body
        );
        assert!(
            m.body
                .contains("intact repair /srv/photos --from restic:/backup/repo --dry-run"),
            "{}",
            m.body
        );
        // The new one is listed before the old one.
        assert!(m.body.find("new.jpg").unwrap() < m.body.find("old.jpg").unwrap());
        // A source with a password is named by where it is configured, the secret nowhere.
        c.repair_from = vec![
            "/mnt/copy".into(),
            "restic:rest:https://u:hunter2@nas/repo".into(),
        ];
        let m = compose(&c, &f, &Decision::Alarm { new }).unwrap();
        assert!(
            m.body
                .contains("intact repair /srv/photos --from configured --dry-run"),
            "{}",
            m.body
        );
        assert!(!m.body.contains("hunter2"), "{}", m.body);
    }

    #[test]
    fn a_reminder_says_so_and_lists_at_most_twenty_names() {
        let mut f = Findings::default();
        for i in 0..25 {
            f.damaged(format!("/t/f{i}"), None, None);
        }
        let m = compose(
            &ctx(),
            &f,
            &Decision::Alarm {
                new: HashSet::new(),
            },
        )
        .unwrap();
        assert!(
            m.subject.starts_with("Reminder: intact: 25 damaged files"),
            "{}",
            m.subject
        );
        assert!(m.body.contains("... and 5 more"), "{}", m.body);
        assert!(!m.body.contains("/t/f20\n"), "{}", m.body);
    }

    #[test]
    fn hostile_names_cannot_fake_lines_or_headers() {
        let mut c = ctx();
        c.roots = vec![PathBuf::from("/t/a\nSubject: x")];
        c.host = "h\r\nBcc: evil".into();
        let mut f = Findings::default();
        f.damaged(escape(Path::new("/t/a\nSubject: x/f")), None, None);
        f.push(Problem::Interrupted);
        let m = compose(
            &c,
            &f,
            &Decision::Alarm {
                new: HashSet::new(),
            },
        )
        .unwrap();
        assert!(
            !m.subject.contains('\n') && !m.subject.contains('\r'),
            "{:?}",
            m.subject
        );
        assert!(
            m.body.contains("intact status -q '/t/a\\nSubject: x'"),
            "{}",
            m.body
        );
        assert!(m.body.contains("  /t/a\\nSubject: x/f\n"), "{}", m.body);
        assert!(
            !m.body
                .lines()
                .any(|l| l.starts_with("Subject:") || l.starts_with("Bcc:")),
            "{}",
            m.body
        );
    }
}
