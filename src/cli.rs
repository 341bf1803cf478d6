//! The command line as typed: clap definitions, from which help, man page and completions
//! are all generated.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

pub const EXIT_CODES: &str = "\
Exit codes:
  0    everything processed, no damage found
  1    damage found: a file's data changed under an unchanged mtime (corrupt), or a tag
       without an mtime no longer matches (mismatch); wins over every other code
  2    usage error
  3    some files could not be processed or verified: unreadable, vanished, tag could not
       be written (no xattr support, permission, no space), changed while being read, tags
       in conflict, listed in a manifest but missing, unreadable manifest lines, malformed
       tag in check, tagged with the other algorithm in export
  130  interrupted (Ctrl-C) before the end";

#[derive(Parser, Debug)]
#[command(
    name = "intact",
    version,
    about = "Keep files intact: digests stored on the files themselves, and checked",
    long_about = "intact stores a SHA-256 (or BLAKE3) digest of each file's data in an extended \
attribute on the file itself (user.intact), so it follows the file through moves, renames and \
xattr-preserving copies. `check` later proves the data still matches, and tells silent \
corruption (data changed, mtime not) apart from a legitimate edit (mtime moved too).",
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
    Tag {
        #[command(flatten)]
        paths: Paths,
        #[command(flatten)]
        common: Common,
        /// Digest algorithm for new tags
        #[arg(long, value_enum, default_value_t = AlgoArg::Sha256)]
        algo: AlgoArg,
        /// Re-hash and re-tag files that already have a tag
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        compat: Compat,
    },
    /// Re-hash tagged files and report any that changed; never writes anything
    #[command(after_help = EXIT_CODES)]
    Check {
        #[command(flatten)]
        paths: Paths,
        #[command(flatten)]
        common: Common,
        /// Check against a manifest (sha256sum, b3sum, rhash or hashdeep format, paths
        /// relative to the one PATH) instead of xattrs: for media that cannot hold them
        #[arg(long, value_name = "FILE")]
        manifest: Option<PathBuf>,
        /// The algorithm of the manifest's digests (sha256sum and b3sum lines look alike)
        #[arg(long, value_enum, default_value_t = AlgoArg::Sha256, requires = "manifest")]
        algo: AlgoArg,
    },
    /// Check, then tag new files and re-tag legitimately changed ones; corrupt files keep
    /// their old tag
    #[command(after_help = EXIT_CODES)]
    Update {
        #[command(flatten)]
        paths: Paths,
        #[command(flatten)]
        common: Common,
        /// Digest algorithm for new tags and re-tags [default: sha256 for new tags, the
        /// existing tag's for re-tags]
        #[arg(long, value_enum)]
        algo: Option<AlgoArg>,
        /// Also re-tag files whose data changed under an unchanged mtime (only if you know
        /// the change was intended: the old tag is the evidence of corruption)
        #[arg(long)]
        accept_corrupt: bool,
        #[command(flatten)]
        compat: Compat,
    },
    /// Remove intact's tag (user.intact) from files, and other tools' with --compat
    Strip {
        #[command(flatten)]
        paths: Paths,
        #[command(flatten)]
        common: Common,
        /// Also remove these tools' tags: shatag, dintch (INTACT_COMPAT does not apply here:
        /// removing is never a default)
        #[arg(long, value_enum, value_delimiter = ',', value_name = "FORMATS")]
        compat: Vec<CompatArg>,
    },
    /// Print each file's stored tag and what a check would expect, without reading data
    Show {
        #[command(flatten)]
        paths: Paths,
        #[command(flatten)]
        common: Common,
    },
    /// Write a manifest that `sha256sum -c` (or `b3sum -c`) accepts, from the tags alone,
    /// with paths relative to PATH
    Export {
        /// The file or directory to list
        #[arg(value_name = "PATH")]
        path: PathBuf,
        #[command(flatten)]
        common: Common,
        /// Which digests to list: sha256 for sha256sum, blake3 for b3sum
        #[arg(long, value_enum, default_value_t = AlgoArg::Sha256)]
        algo: AlgoArg,
        /// Write the manifest to FILE (atomically) instead of standard output
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
    },
    /// Tag the files a manifest lists, after verifying that their data matches it
    Import {
        /// The manifest (sha256sum, b3sum, BSD --tag, rhash or hashdeep format)
        #[arg(value_name = "MANIFEST")]
        manifest: PathBuf,
        /// The directory its paths are relative to [default: the manifest's directory]
        #[arg(value_name = "DIR")]
        dir: Option<PathBuf>,
        #[command(flatten)]
        common: Common,
        /// The algorithm of the manifest's digests (sha256sum and b3sum lines look alike)
        #[arg(long, value_enum, default_value_t = AlgoArg::Sha256)]
        algo: AlgoArg,
        #[command(flatten)]
        compat: Compat,
    },
    /// Print the man page or a shell completion script
    Generate {
        /// What to generate
        #[arg(value_enum)]
        what: Generated,
    },
}

#[derive(Args, Debug)]
pub struct Paths {
    /// Files and directories (directories are walked recursively; symlinks never followed)
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
        value_name = "FORMATS"
    )]
    pub compat: Vec<CompatArg>,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompatArg {
    Shatag,
    Dintch,
}

#[derive(Args, Debug)]
pub struct Common {
    /// Print one JSON object per file and a final summary object (JSON Lines)
    #[arg(long)]
    pub json: bool,

    /// Print only damage and errors, no summary
    #[arg(short, long, conflicts_with = "verbose")]
    pub quiet: bool,

    /// Print a line for every file, including those that are fine
    #[arg(short, long)]
    pub verbose: bool,

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

    /// Never show a progress bar (it is only shown on a terminal anyway)
    #[arg(long)]
    pub no_progress: bool,
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
