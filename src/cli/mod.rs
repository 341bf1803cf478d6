//! The command line as typed: clap definitions, from which help, man page and completions
//! are all generated; [`settings`] turns them into what the engine and reporter need.

pub mod settings;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

pub const EXIT_CODES: &str = "\
Exit codes:
  0    everything processed, no damage found
  1    damage found: a file's data changed under an unchanged mtime (corrupt), or a tag
       without an mtime no longer matches (mismatch), or did at a first read but not at a
       second one around the page cache (unstable: memory, a cable or a controller); also
       damage an earlier run found that is still there, read by this run or not; wins over
       every other code
  2    usage error (also an output that is not a regular file: it is never replaced)
  3    nothing was verified under a PATH (no files, none tagged); a tree vanished or lost
       more than 10% (and 50) of its files at once (nothing is marked deleted: `scrub
       --accept-removed`); the owner could not be told (--notify, --heartbeat); the state
       database could not be used, or was found damaged and rebuilt; some files could not be processed or
       verified: unreadable, vanished, tag could not be written (no xattr support,
       permission, no space), changed while being read, tags in conflict, listed in a
       manifest but missing, unusable manifest lines, malformed tag in check, tagged with
       the other algorithm in export; a PATH that is not there; or the work itself (an
       archive, a manifest, a parity store) could not be written
  130  interrupted (Ctrl-C, SIGTERM, SIGHUP) before the end (1 if damage is outstanding: a
       line on stderr says it was interrupted, even with -q), or cut short quietly by the
       reader of its output going away (`intact check -v | head`)";

#[derive(Parser, Debug)]
#[command(
    name = "intact",
    version,
    about = "Keep files intact: digests stored on the files themselves, and checked",
    long_about = "intact stores a SHA-256 (or BLAKE3) digest of each file's data in an extended \
attribute on the file itself (user.intact), so it follows the file through moves, renames and \
xattr-preserving copies. `check` later proves the data still matches, and tells silent \
corruption (data changed, mtime not) apart from a legitimate edit (mtime moved too). \
`archive`, `protect` and `repair` keep redundant copies and PAR2 parity, and restore damaged files \
from them once the restored bytes match the tag.",
    after_help = EXIT_CODES,
    propagate_version = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Hash and tag files that have no valid tag (tagged files are not read)
    Tag(TagArgs),
    /// Re-hash tagged files and report any that changed; never writes anything
    #[command(after_help = EXIT_CODES)]
    Check(CheckArgs),
    /// Check, then tag new files and re-tag legitimately changed ones; corrupt files keep
    /// their old tag
    #[command(after_help = EXIT_CODES)]
    Update(UpdateArgs),
    /// Verify tagged files least recently verified first, within a budget: run from a timer,
    /// repeated runs verify every file once per cycle
    #[command(after_help = SCRUB_HELP)]
    Scrub(ScrubArgs),
    /// A service: tags new and edited files seconds after they are written, as `update` would,
    /// and knows a write it saw from bit rot even when the writer put the old mtime back
    #[command(after_help = WATCH_HELP)]
    Watch(WatchArgs),
    /// Show, from tags and the state database alone (no data read), how recently the files
    /// were verified, damage not yet repaired, and how many have parity or archived copies
    #[command(after_help = STATUS_HELP)]
    Status(StatusArgs),
    /// Remove intact's tag (user.intact) from files, and other tools' with --compat
    Strip(StripArgs),
    /// Print each file's stored tag and what a check would expect, without reading data
    Show(ShowArgs),
    /// Write a manifest that `sha256sum -c` (or `b3sum -c`) accepts, from the tags alone,
    /// with paths relative to PATH
    Export(ExportArgs),
    /// Tag the files a manifest lists, after verifying that their data matches it
    Import(ImportArgs),
    /// Redundant compressed copies that carry their tags: create, verify, list
    #[command(subcommand)]
    Archive(ArchiveCommand),
    /// Write PAR2 recovery data for the files under PATH into a parity store, after
    /// verifying them; par2cmdline can use it too
    #[command(after_help = PROTECT_HELP)]
    Protect(ProtectArgs),
    /// Restore damaged files bit-exactly from archives, parity or backup trees, verified first
    #[command(after_help = REPAIR_HELP)]
    Repair(RepairArgs),
    /// Send a test message through the notification channels (`intact notify --test`)
    Notify(NotifyTestArgs),
    /// Write the man pages or print a shell completion script
    Generate(GenerateArgs),
}

impl Command {
    /// The verb's name, if it was asked for JSON: a run that fails before it begins still
    /// ends its output with a summary object then.
    pub fn json_verb(&self) -> Option<intact::verb::Verb> {
        use intact::verb::Verb;
        let (verb, output) = match self {
            Command::Tag(a) => (Verb::Tag, &a.common.output),
            Command::Check(a) => (Verb::Check, &a.common.output),
            Command::Update(a) => (Verb::Update, &a.common.output),
            Command::Scrub(a) => (Verb::Scrub, &a.common.output),
            Command::Watch(a) => (Verb::Watch, &a.common.output),
            Command::Status(a) => (Verb::Status, &a.common.output),
            Command::Strip(a) => (Verb::Strip, &a.common.output),
            Command::Show(a) => (Verb::Show, &a.common.output),
            Command::Import(a) => (Verb::Import, &a.common.output),
            Command::Export(a) => (Verb::Export, &a.common.output),
            Command::Archive(ArchiveCommand::Create(a)) => (Verb::Archive, &a.common.output),
            Command::Archive(ArchiveCommand::Verify(a)) => (Verb::Verify, &a.output),
            Command::Protect(a) => (Verb::Protect, &a.common.output),
            Command::Repair(a) => (Verb::Repair, &a.common.output),
            Command::Archive(ArchiveCommand::List(_))
            | Command::Generate(_)
            | Command::Notify(_) => return None,
        };
        output.json.then_some(verb)
    }
}

#[derive(Args, Debug)]
pub struct TagArgs {
    #[command(flatten)]
    pub paths: Paths,
    #[command(flatten)]
    pub common: Common,
    /// Digest algorithm for new tags
    #[arg(long, value_enum, default_value_t = AlgoArg::Sha256)]
    pub algo: AlgoArg,
    /// Re-hash and re-tag files that already have a tag
    #[arg(long)]
    pub force: bool,
    #[command(flatten)]
    pub compat: Compat,
    #[command(flatten)]
    pub state: StateArgs,
}

#[derive(Args, Debug)]
pub struct CheckArgs {
    #[command(flatten)]
    pub paths: Paths,
    #[command(flatten)]
    pub common: Common,
    /// Check against a manifest (sha256sum, b3sum, rhash or hashdeep format, paths
    /// relative to the one PATH) instead of xattrs: for media that cannot hold them
    #[arg(long, value_name = "FILE")]
    pub manifest: Option<PathBuf>,
    /// The algorithm of the manifest's digests (sha256sum and b3sum lines look alike)
    #[arg(long, value_enum, default_value_t = AlgoArg::Sha256, requires = "manifest")]
    pub algo: AlgoArg,
    #[command(flatten)]
    pub notify: NotifyArgs,
    #[command(flatten)]
    pub state: StateArgs,
    #[command(flatten)]
    pub metrics: Metrics,
}

#[derive(Args, Debug)]
pub struct UpdateArgs {
    #[command(flatten)]
    pub paths: Paths,
    #[command(flatten)]
    pub common: Common,
    /// Digest algorithm for new tags and re-tags [default: sha256 for new tags, the
    /// existing tag's for re-tags]
    #[arg(long, value_enum)]
    pub algo: Option<AlgoArg>,
    /// Also re-tag files whose data changed under an unchanged mtime (only if you know
    /// the change was intended: the old tag is the evidence of corruption)
    #[arg(long)]
    pub accept_corrupt: bool,
    #[command(flatten)]
    pub compat: Compat,
    #[command(flatten)]
    pub notify: NotifyArgs,
    #[command(flatten)]
    pub state: StateArgs,
    #[command(flatten)]
    pub metrics: Metrics,
}

#[derive(Args, Debug)]
pub struct WatchArgs {
    #[command(flatten)]
    pub paths: Paths,
    #[command(flatten)]
    pub common: Common,
    /// Look at a file once nothing in its folder has been written for this long (a download
    /// or an export is then hashed once, when done)
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "5s")]
    pub settle: std::time::Duration,
    /// Digest algorithm for new tags [default: sha256; re-tags keep the tag's]
    #[arg(long, value_enum)]
    pub algo: Option<AlgoArg>,
    #[command(flatten)]
    pub compat: Compat,
    #[command(flatten)]
    pub notify: NotifyArgs,
    #[command(flatten)]
    pub state: StateArgs,
}

const WATCH_HELP: &str = "\
Runs until stopped (Ctrl-C, SIGTERM). At start it looks at the whole trees for files changed \
while it was not running (only files whose tag no longer describes them are read); then it \
waits for the kernel's events: fanotify on whole file systems when run as root, inotify \
watches on every folder otherwise (fs.inotify.max_user_watches caps them; reaching it is an \
error). Events lost to a full queue make it look at the whole trees again.

A file whose data changed under an unchanged mtime is damage for `check`, unless this \
service saw a write to it after its tag was written: then it is an edit, re-tagged, and \
said so. What it saw is kept in the state database until it has tagged the file, so a later \
`check` or `scrub` knows it too. Writes made while it is not running, and writes through a \
shared mmap (which raise no event), are judged as `check` judges them.

It runs at idle CPU and I/O priority. The nightly scrub keeps running beside it: watch \
protects what is written, the scrub proves what is not. `intact status` says whether a tree \
is watched, and since when. Problems found are told to the owner (--notify) at most once a \
minute, what is new only (the scrub reminds and sends the all-clear).

Exit codes: 0 stopped by a signal, 2 usage error, 3 it could not watch (or record).";

#[derive(Args, Debug)]
pub struct ScrubArgs {
    #[command(flatten)]
    pub paths: Paths,
    #[command(flatten)]
    pub common: Common,
    /// Start no file after this long (e.g. 2h, 30m); files already started finish
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub max_time: Option<std::time::Duration>,
    /// Verify at most this much data (e.g. 500G, 1.5T, 200MB; K, M, G, T are powers of 1024,
    /// kB, MB, GB, TB of 1000); with --update, new and edited files are read on top
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub max_bytes: Option<u64>,
    /// Verify at most this share of the data tagged under PATH (as SnapRAID's scrub -p)
    #[arg(long, value_name = "N", value_parser = parse_share)]
    pub max_percent: Option<f64>,
    /// Only files not verified for this long (e.g. 10d, 4w; as SnapRAID's scrub -o)
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub older_than: Option<std::time::Duration>,
    /// Apply update's rules to the files visited: tag new files, re-tag edited ones (never
    /// corrupt ones). Without it a scrub writes nothing to the files, as check
    #[arg(long)]
    pub update: bool,
    /// With --update: also give the files visited parity, in each tree's store
    /// (PATH/.intact-parity; for a tree another user owns, outside it), as `protect` does, at 10% (--protect=5% for another share): new
    /// and edited files are protected the night they are tagged; files whose content has
    /// parity cost nothing; packs of content edited away are rewritten. Other stale parity is
    /// moved aside by `protect`, which sees the whole tree
    #[arg(long, value_name = "REDUNDANCY", num_args = 0..=1, require_equals = true,
          default_missing_value = "10%", value_parser = parse_percent, requires = "update")]
    pub protect: Option<f64>,
    /// Record the files gone from a tree even when the tree holds none of its files or
    /// lost more than --max-removed of them at once: without it that is an alarm (exit 3), in
    /// case a disk did not mount or a folder was deleted by mistake, and nothing is recorded
    #[arg(long)]
    pub accept_removed: bool,
    /// The share of a tree's known files that, gone at once (and at least 50), is an alarm
    /// rather than routine deletions. Fewer than 50 are an alarm too when they are a whole
    /// folder of at least 10, or more than half (or this share) of a tree of at least 10; 100%
    /// leaves only a tree that holds none of its files an alarm
    #[arg(long, value_name = "PERCENT", default_value = "10%", value_parser = parse_share)]
    pub max_removed: f64,
    #[command(flatten)]
    pub notify: NotifyArgs,
    #[command(flatten)]
    pub state: StateArgs,
    #[command(flatten)]
    pub metrics: Metrics,
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    #[command(flatten)]
    pub paths: Paths,
    #[command(flatten)]
    pub common: Common,
    /// List this many damaged files at most (all with --json)
    #[arg(long, value_name = "N", default_value_t = 20)]
    pub damage_lines: usize,
    #[command(flatten)]
    pub notify: NotifyArgs,
    #[command(flatten)]
    pub state: StateArgs,
    #[command(flatten)]
    pub metrics: Metrics,
}

#[derive(Args, Debug)]
pub struct StateArgs {
    /// The state database: when each file was last verified, damage found, copies made
    /// [default: $XDG_STATE_HOME/intact/state.db; /var/lib/intact/state.db for root;
    /// ~/.local/state/intact/state.db]
    #[arg(
        long,
        value_name = "FILE",
        env = "INTACT_STATE",
        hide_env_values = true
    )]
    pub state: Option<PathBuf>,
    /// Record nothing in the state database (the run verifies just the same); wins over
    /// --state and INTACT_STATE
    #[arg(long)]
    pub no_state: bool,
    /// Take each PATH as the tree the state database knows there although it now leads to
    /// another folder (a tree restored from a backup, its file system made anew): without
    /// it that is an alarm (exit 3) and nothing under it is verified or recorded, in case a
    /// disk did not mount or someone pointed the path elsewhere
    #[arg(long)]
    pub accept_moved_root: bool,
}

/// Telling a person. URLs and tokens are secrets: keep them in the environment
/// (/etc/default/intact, `chmod 600`) or an Apprise configuration file rather than on a command
/// line that `ps` shows.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Notifications")]
pub struct NotifyArgs {
    /// Tell a person when something is wrong (damage, files not verified, a tree vanished, a
    /// run cut short), with reminders while it stays so and one all-clear after: an Apprise
    /// URL (mailto://, ntfy://, gotify://, slack://, matrix://, tgram://, json:// ...; needs
    /// `apprise`) or sendmail:ADDRESS[,ADDRESS] (the system's sendmail). Repeatable;
    /// INTACT_NOTIFY holds URLs separated by spaces
    #[arg(
        long,
        value_name = "URL",
        env = "INTACT_NOTIFY",
        value_delimiter = ' ',
        hide_env_values = true
    )]
    pub notify: Vec<String>,
    /// An Apprise configuration file of URLs to tell (keep it `chmod 600`)
    #[arg(
        long,
        value_name = "FILE",
        env = "INTACT_NOTIFY_CONFIG",
        hide_env_values = true
    )]
    pub notify_config: Option<PathBuf>,
    /// While something stays wrong, remind at most this often [default: every run]
    #[arg(
        long,
        value_name = "DURATION",
        env = "INTACT_REMIND_EVERY",
        value_parser = parse_duration,
        hide_env_values = true
    )]
    pub remind_every: Option<std::time::Duration>,
    /// After a run that verified what it planned and found nothing wrong, fetch this URL
    /// (healthchecks.io, Uptime Kuma's push monitor), so that silence from intact itself
    /// raises an alarm there; with curl
    #[arg(
        long,
        value_name = "URL",
        env = "INTACT_HEARTBEAT",
        hide_env_values = true
    )]
    pub heartbeat: Option<String>,
    /// Where good copies are, as for `repair --from`: shown in the commands a message gives.
    /// Words as sh splits them; a restic: or borg: source's selectors follow it
    /// (INTACT_REPAIR_FROM="restic:/srv/restic --host nas /mnt/mirror")
    #[arg(
        long,
        value_name = "SOURCES",
        env = "INTACT_REPAIR_FROM",
        hide_env_values = true
    )]
    pub repair_from: Vec<String>,
    /// How long a delivery (apprise, sendmail, curl) may take before it is stopped
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_duration)]
    pub notify_timeout: std::time::Duration,
}

#[derive(Args, Debug)]
pub struct NotifyTestArgs {
    /// Send a test message through the channels (--notify, INTACT_NOTIFY, --notify-config)
    /// and ping the heartbeat, to prove they reach a person
    #[arg(long, required = true)]
    pub test: bool,
    #[command(flatten)]
    pub notify: NotifyArgs,
}

#[derive(Args, Debug)]
pub struct Metrics {
    /// Write Prometheus metrics of the run to FILE (atomically), for node_exporter's textfile
    /// collector
    #[arg(long, value_name = "FILE")]
    pub metrics: Option<PathBuf>,
}

impl Metrics {
    /// The metrics file, checked: only a regular file is ever replaced.
    pub fn file(&self) -> anyhow::Result<Option<PathBuf>> {
        self.metrics
            .as_deref()
            .map(|p| settings::output(p, "the metrics"))
            .transpose()
    }
}

#[derive(Args, Debug)]
pub struct StripArgs {
    #[command(flatten)]
    pub paths: Paths,
    #[command(flatten)]
    pub common: Common,
    /// Also remove these tools' tags: shatag, dintch (INTACT_COMPAT does not apply here:
    /// removing is never a default)
    #[arg(long, value_enum, value_delimiter = ',', value_name = "FORMATS")]
    pub compat: Vec<CompatArg>,
}

#[derive(Args, Debug)]
pub struct ShowArgs {
    #[command(flatten)]
    pub paths: Paths,
    #[command(flatten)]
    pub common: Common,
}

#[derive(Args, Debug)]
pub struct ExportArgs {
    /// The file or directory to list
    #[arg(value_name = "PATH")]
    pub path: PathBuf,
    #[command(flatten)]
    pub common: Common,
    /// Which digests to list: sha256 for sha256sum, blake3 for b3sum
    #[arg(long, value_enum, default_value_t = AlgoArg::Sha256)]
    pub algo: AlgoArg,
    /// Write the manifest to FILE (atomically) instead of standard output
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct ImportArgs {
    /// The manifest (sha256sum, b3sum, BSD --tag, rhash or hashdeep format)
    #[arg(value_name = "MANIFEST")]
    pub manifest: PathBuf,
    /// The directory its paths are relative to [default: the manifest's directory]
    #[arg(value_name = "DIR")]
    pub dir: Option<PathBuf>,
    #[command(flatten)]
    pub common: Common,
    /// The algorithm of the manifest's digests (sha256sum and b3sum lines look alike)
    #[arg(long, value_enum, default_value_t = AlgoArg::Sha256)]
    pub algo: AlgoArg,
    #[command(flatten)]
    pub compat: Compat,
    #[command(flatten)]
    pub state: StateArgs,
}

#[derive(Args, Debug)]
pub struct ProtectArgs {
    #[command(flatten)]
    pub paths: Paths,
    #[command(flatten)]
    pub common: Common,
    /// Recovery data as a share of the data: this much of each file (or pack of small
    /// files) can be rebuilt
    #[arg(long, short = 'r', default_value = "10%", value_parser = parse_percent)]
    pub redundancy: f64,
    /// The parity store [default: PATH/.intact-parity for each PATH of the running user's that
    /// no one else can write; else, outside the tree, INTACT_STORES/TREE (/var/lib/intact/parity
    /// for root)]
    #[arg(long, value_name = "DIR")]
    pub store: Option<PathBuf>,
    /// How long parity no file of the tree needs any more (its file edited or deleted) is
    /// kept in the store's stale/ folder before it is removed (as long as a deletion is
    /// remembered: `repair --missing` rebuilds a deleted file from it); never while it can
    /// repair a damaged file
    #[arg(long, value_name = "DURATION", default_value = "30d", value_parser = parse_duration)]
    pub keep_stale: std::time::Duration,
    #[command(flatten)]
    pub state: StateArgs,
}

#[derive(Args, Debug)]
pub struct RepairArgs {
    #[command(flatten)]
    pub paths: Paths,
    #[command(flatten)]
    pub common: Common,
    /// Where to look for good copies: archives made by `intact archive create`, parity
    /// stores made by `intact protect`, directories of tagged files (a backup, a mirror),
    /// PAR2 sets, or backup repositories: `restic:REPO` (password from RESTIC_PASSWORD,
    /// RESTIC_PASSWORD_FILE ...; `restic:` for RESTIC_REPOSITORY) and `borg:REPO[::ARCHIVE]`
    /// (BORG_PASSPHRASE ...; `borg:` for BORG_REPO), each perhaps followed by the tool's
    /// selectors ('restic:REPO --host nas'); `configured`: the sources INTACT_REPAIR_FROM
    /// names (in the environment, else in /etc/default/intact). Searched in order; each
    /// PATH's parity store is searched last if it exists
    #[arg(long, short = 'f', value_name = "SOURCE")]
    pub from: Vec<PathBuf>,
    /// A command that prints a good copy of a file, run with `sh -c` for each damaged file,
    /// `{}` replaced by its path relative to PATH, quoted for that shell (e.g. 'rclone cat
    /// remote:photos/{}'); `{ssh}` quoted twice, for ssh, whose remote shell parses the
    /// path again (e.g. 'ssh nas cat /srv/photos/{ssh}'). Never inside quotes of your own.
    /// Searched after the --from sources; its output replaces nothing unless it hashes to
    /// the file's tag
    #[arg(long, value_name = "CMD")]
    pub from_command: Vec<String>,
    /// How long a backup tool or --from-command may say nothing before it is stopped, with
    /// every process it started (it runs with no terminal: a passphrase prompt fails at once)
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = parse_duration)]
    pub source_timeout: std::time::Duration,
    /// Find and verify good copies, and say what would be repaired from where; change
    /// nothing
    #[arg(long, short = 'n')]
    pub dry_run: bool,
    /// Keep damaged originals under DIR (at their path relative to PATH) instead of
    /// beside the repaired file as NAME.damaged
    #[arg(long, value_name = "DIR", conflicts_with = "discard_damaged")]
    pub keep_damaged_in: Option<PathBuf>,
    /// Do not keep the damaged originals
    #[arg(long)]
    pub discard_damaged: bool,
    /// Also bring back files the state database knows were under PATH and are gone (as
    /// SnapRAID's fix -m): found by the digest they had, to their last known path, never
    /// over a file that took it since. Without it, a deletion is left as the owner's choice
    #[arg(long)]
    pub missing: bool,
    /// Read every file under PATH for damage. Without it, where the state database has a
    /// verdict for every file under PATH and knows of damage, only the damaged files are read
    #[arg(long)]
    pub full: bool,
    #[command(flatten)]
    pub notify: NotifyArgs,
    #[command(flatten)]
    pub state: StateArgs,
}

#[derive(Args, Debug)]
pub struct GenerateArgs {
    /// What to generate
    #[arg(value_enum)]
    pub what: Generated,
    /// For `man`: write every page (intact.1 and one per verb, intact-VERB.1) into DIR;
    /// without it, intact.1 goes to stdout
    pub dir: Option<PathBuf>,
}

pub const REPAIR_HELP: &str = "\
A damaged file is one a check finds corrupt (or in mismatch): its tag says which bytes it
should hold. Copies are found by that digest, so a file moved or renamed since it was copied
is still found. A copy's bytes must hash to the tag before they replace anything; the new
file gets the original's mode, owner, xattrs and mtime, and is renamed into place. A file
with several hard links is rewritten in place, so every name sees the repair; it is marked
first (user.intact.repairing), so a run killed midway leaves damage every check reports.
The damaged original is kept as NAME.damaged, marked (user.intact.damaged) so that later
runs skip it rather than take it for a good file.

Backups: --from restic:REPO and --from borg:REPO[::ARCHIVE] try every distinct version of a
damaged file's path, newest first, listing each version in the damaged files' folders only;
then files of its size elsewhere. The tools' own selectors may follow the repository:
'restic:REPO --host nas --path /srv/photos', 'borg:REPO --glob-archives nas-*'. A tree
mounted elsewhere than where it was backed up is found by its files' names and sizes, and
said. --from-command runs a command that prints a copy ({ssh} for ssh). Bytes replace
nothing unless they hash to the tag; nothing is written into a repository. Tools run with
no terminal, and are stopped with their children when silent for --source-timeout or when
the repair is interrupted.

Where the state database has a verdict for every file under PATH and knows of damage, only
the files it knows are damaged are read (--full reads every file).

Exit codes: 0 nothing damaged is left; 1 some damage could not be repaired (or --dry-run);
3 errors; as for check otherwise.";

pub const PROTECT_HELP: &str = "\
Files are verified first (untagged ones are tagged, like update); damaged files get no
parity. Each file of 256 KiB or more gets a PAR2 set of its own, named by its digest, so a
moved or renamed file still finds it and protecting again only adds what changed; smaller
files share packs, about one slice each. Names in the sets are relative to PATH:
`par2 verify -B PATH SET.par2` and `par2 repair -B PATH SET.par2` work on them.

Exit codes: 0 all protected; 1 damaged files found; 3 some files could not be protected.";

pub const SCRUB_HELP: &str = "\
Files are verified in rolling order: those not yet checked in the current cycle first (never
verified ones before all others), then the least recently verified. A cycle ends when every
tagged file has been checked once (verified, or found damaged, edited or unreadable); the
summary says how far through it the tree is; a budgeted scrub ends with its cycle. A budget
is spent once the files started reach it, so a budget of 1/N of the tree completes a cycle
in at most N runs. With --update, new and edited files come first. Without a budget a scrub
verifies every file once. Damage found by earlier runs and not yet dealt with is listed on
every run (exit 1), read tonight or not; files gone since they were last seen are told once.
Verdicts, output and exit codes are check's; the state database (see --state) remembers when
each file was verified. Planning reads tags and metadata only.

Exit codes: as for check (1 damage found, 3 errors, 130 interrupted).";

pub const STATUS_HELP: &str = "\
Reads tags and metadata, and the state database; no file data. In the order of the questions:
is anything wrong (damage not yet repaired or accepted, files overdue: not proven good for 1.5
full cycles, or 45 days while the cycle is unknown; files gone; damaged copies repair kept;
a vanished tree or a state database that cannot be used, said first on stderr); when the
last scrub ran, how long, with what result; when every file will have been proven good again
at the pace of the last runs; what has parity or an archived copy; then how many files are
tagged and a chart of how long since each was last verified.

-q shows only what needs action (damage, overdue files, damaged copies left, and the errors),
nothing when nothing does; -v lists every tagged file, oldest verification first: when it was
last proven good, its last verdict, its copies (p parity, a archived), size and path.

Exit codes: 0; 1 damage found earlier is not yet repaired or accepted; 3 errors, or the state
database was rebuilt and files have not all been checked since.";

/// `2h`, `30m`, `10d`, `1w 2d` as a duration.
fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{s:?}: {e} (e.g. 2h, 30m, 10d)"))
}

/// `500G`, `1.5T`, `200MB`, `4096` as bytes.
fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (n, unit) = t.split_at(split);
    let n: f64 = n.parse().map_err(|_| format!("{s:?} is not a size"))?;
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024f64.powi(2),
        "g" | "gib" => 1024f64.powi(3),
        "t" | "tib" => 1024f64.powi(4),
        "p" | "pib" => 1024f64.powi(5),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        "pb" => 1e15,
        _ => {
            return Err(format!(
                "{s:?}: unknown unit (K, M, G, T, or kB, MB, GB, TB)"
            ));
        }
    };
    Ok((n * scale) as u64)
}

/// A share in percent, more than 0 and at most 100.
fn parse_share(s: &str) -> Result<f64, String> {
    match s.trim_end_matches('%').parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 100.0 => Ok(v),
        _ => Err(format!("{s:?}: a percentage more than 0 and at most 100")),
    }
}

/// `10%`, `10` or `0.5%` as a fraction.
fn parse_percent(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim_end_matches('%')
        .parse()
        .map_err(|_| format!("{s:?} is not a percentage"))?;
    if v > 0.0 && v <= 100.0 {
        Ok(v / 100.0)
    } else {
        Err(format!(
            "{s:?}: the redundancy must be more than 0% and at most 100%"
        ))
    }
}

#[derive(Subcommand, Debug)]
pub enum ArchiveCommand {
    /// Write a .tar.zst of the files under PATH, each with its tag and xattrs, after
    /// verifying it; damaged files are left out
    #[command(after_help = ARCHIVE_HELP)]
    Create(CreateArgs),
    /// Re-hash every member against the tag it carries, and check the zstd checksums
    Verify(VerifyArgs),
    /// List members with mode, owner, size, mtime and digest, like `tar -tv`
    List(ListArgs),
}

#[derive(Args, Debug)]
pub struct CreateArgs {
    /// The archive to write (by convention NAME.tar.zst); replaced atomically
    #[arg(value_name = "ARCHIVE")]
    pub dest: PathBuf,
    #[command(flatten)]
    pub paths: Paths,
    #[command(flatten)]
    pub common: Common,
    /// zstd compression level (1-19; higher is smaller and slower)
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(i32).range(1..=19))]
    pub level: i32,
    /// zstd compression threads [default: one per core]
    #[arg(long, value_name = "N")]
    pub compress_threads: Option<u32>,
    /// Archive files found damaged too, marked as such (their members fail verify and
    /// are never used by repair)
    #[arg(long)]
    pub include_damaged: bool,
    /// Leave the files untouched: untagged files are archived without a tag instead of
    /// being tagged first
    #[arg(long)]
    pub untagged: bool,
    /// Digest algorithm for new tags [default: sha256]
    #[arg(long, value_enum)]
    pub algo: Option<AlgoArg>,
    #[command(flatten)]
    pub state: StateArgs,
}

#[derive(Args, Debug)]
pub struct VerifyArgs {
    /// The archive
    #[arg(value_name = "ARCHIVE")]
    pub archive: PathBuf,
    #[command(flatten)]
    pub output: Output,
}

#[derive(Args, Debug)]
pub struct ListArgs {
    /// The archive
    #[arg(value_name = "ARCHIVE")]
    pub archive: PathBuf,
}

pub const ARCHIVE_HELP: &str = "\
The archive is a PAX tar compressed with zstd: `tar --xattrs --xattrs-include='*' -I zstd -xf
ARCHIVE` restores the files with their tags, modes, owners, nanosecond mtimes and sparse
holes. Files are verified as they are archived (untagged ones are tagged first, like update);
one that fails its check is reported and left out unless --include-damaged.

Exit codes: 0 all archived; 1 damaged files found; 3 some files could not be archived
(unreadable, changed while read) or the archive could not be written.";

#[derive(Args, Debug)]
pub struct Paths {
    /// Files and directories (directories are walked recursively; a PATH that is a symlink
    /// is followed, symlinks inside never are)
    #[arg(required = true, value_name = "PATH")]
    pub paths: Vec<PathBuf>,
}

#[derive(Args, Debug)]
pub struct Compat {
    /// Other tools' tags to keep beside intact's (written, or removed by strip): shatag
    /// (cshatag/shatag: user.shatag.sha256 and .ts), dintch (Dintch/Fintch: 32 raw bytes)
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        env = "INTACT_COMPAT",
        value_name = "FORMATS",
        hide_env_values = true
    )]
    pub compat: Vec<CompatArg>,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompatArg {
    Shatag,
    Dintch,
}

#[derive(Args, Debug)]
pub struct Output {
    /// Print one JSON object per file and a final summary object (JSON Lines)
    #[arg(long)]
    pub json: bool,

    /// Print only damage and errors, no summary
    #[arg(short, long, conflicts_with = "verbose")]
    pub quiet: bool,

    /// Print a line for every file, including those that are fine
    #[arg(short, long)]
    pub verbose: bool,

    /// Never show a progress bar (it is only shown on a terminal anyway)
    #[arg(long)]
    pub no_progress: bool,
}

#[derive(Args, Debug)]
pub struct Common {
    #[command(flatten)]
    pub output: Output,

    /// How hard to work: normal = all cores, but one uncached reader at a time per spinning
    /// disk; fast = all cores reading everywhere; background = one thread at idle CPU and I/O
    /// priority, reading around the page cache (O_DIRECT) so it leaves it as it found it
    #[arg(long, value_enum, default_value_t = Speed::Normal)]
    pub speed: Speed,

    /// Number of worker threads (overrides --speed's choice)
    #[arg(short = 'j', long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub threads: Option<u16>,

    /// Do not cross file system boundaries
    #[arg(short = 'x', long)]
    pub one_file_system: bool,

    /// Leave out paths matching GLOB (gitignore syntax; repeatable). A .intactignore file
    /// in any directory is read too.
    #[arg(long, value_name = "GLOB")]
    pub exclude: Vec<String>,

    /// Treat mtimes this many seconds apart as equal (for copies through SMB, FAT or macOS;
    /// like rsync's --modify-window) [default: 0, nanosecond precision]
    #[arg(long, value_name = "SECONDS", value_parser = parse_window)]
    pub mtime_window: Option<u64>,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum AlgoArg {
    Sha256,
    Blake3,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Speed {
    Fast,
    Normal,
    Background,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
pub enum Generated {
    Man,
    Bash,
    Zsh,
    Fish,
    Elvish,
    Powershell,
}

/// Seconds (fractions allowed) to nanoseconds.
fn parse_window(s: &str) -> Result<u64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && (0.0..=1e9).contains(&v) => Ok((v * 1e9).round() as u64),
        _ => Err(format!(
            "{s:?} is not a number of seconds between 0 and 1e9"
        )),
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        super::Cli::command().debug_assert();
    }

    /// Settings from the environment hold secrets (tokens, URLs with passwords): `--help`
    /// names each variable and never prints its value.
    #[test]
    fn help_never_shows_a_variable_s_value() {
        fn check(c: &clap::Command, seen: &mut usize) {
            for a in c.get_arguments().filter(|a| a.get_env().is_some()) {
                *seen += 1;
                assert!(
                    a.is_hide_env_values_set(),
                    "{} --{}: hide_env_values",
                    c.get_name(),
                    a.get_id()
                );
            }
            for sub in c.get_subcommands() {
                check(sub, seen);
            }
        }
        let mut seen = 0;
        check(&super::Cli::command(), &mut seen);
        assert!(seen > 5, "{seen} arguments from the environment");
    }

    #[test]
    fn sizes_in_both_kinds_of_units() {
        assert_eq!(super::parse_size("4096"), Ok(4096));
        assert_eq!(super::parse_size("2K"), Ok(2048));
        assert_eq!(super::parse_size("1.5G"), Ok(3 << 29));
        assert_eq!(super::parse_size("500GB"), Ok(500_000_000_000));
        assert!(super::parse_size("5 parsecs").is_err());
        assert!(super::parse_size("G").is_err());
    }
}
