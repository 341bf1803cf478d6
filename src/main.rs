//! The `intact` command: parses the command line and hands it to the verb's module, which
//! builds settings and runs the engine (see `cmd`); maps the outcome to an exit code.

#![allow(unsafe_code)]

mod cli;
mod cmd;

use std::process::ExitCode;

use clap::Parser;

use cli::settings::Usage;
use cli::{ArchiveCommand, Cli, Command};
use cmd::{archive, export, generate, notify, protect, repair, scan, scrub, status, watch};
use intact::report::Exit;

fn main() -> ExitCode {
    no_core_dumps();
    let cli = Cli::parse();
    raise_file_limit();
    room_for_descriptors();
    return_large_blocks();
    let json = cli.command.json_verb();
    let outcome = match cli.command {
        Command::Tag(a) => scan::tag(a),
        Command::Check(a) => scan::check(a),
        Command::Update(a) => scan::update(a),
        Command::Scrub(a) => scrub::run(a),
        Command::Watch(a) => watch::run(a),
        Command::Status(a) => status::run(a),
        Command::Strip(a) => scan::strip(a),
        Command::Show(a) => scan::show(a),
        Command::Import(a) => scan::import(a),
        Command::Export(a) => export::run(a),
        Command::Archive(ArchiveCommand::Create(a)) => archive::create(a),
        Command::Archive(ArchiveCommand::Verify(a)) => archive::verify(a),
        Command::Archive(ArchiveCommand::List(a)) => archive::list(a),
        Command::Protect(a) => protect::run(a),
        Command::Repair(a) => repair::run(a),
        Command::Generate(a) => generate::run(a),
        Command::Notify(a) => notify::test(a),
    };
    let exit = outcome.unwrap_or_else(|e| {
        eprintln!("intact: error: {e:#}");
        // Usage errors are clap's code; anything else stopped the run before it began.
        let exit = if e.is::<Usage>() {
            Exit::Usage
        } else {
            Exit::Trouble
        };
        if let Some(verb) = json {
            println!(
                "{}",
                intact::report::failed_start(verb, format!("{e:#}"), exit)
            );
        }
        exit
    });
    ExitCode::from(exit as u8)
}

/// Blocks of 1 MiB and more (parity's buffers, sized per set) are mapped and returned to the
/// system when freed. glibc's default threshold climbs with every such block freed, after
/// which they come from its per-thread heaps and stay resident there: `protect` of a copy of
/// /usr/share (44,000 files) peaked at 75 MiB with its heap holding 30 (49 MiB with this).
fn return_large_blocks() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets a parameter of the allocator; called before any thread starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
    }
}

/// The table of descriptors, grown once before any thread starts. It grows by doubling as
/// files are held open (a window of them for the archive writer: up to 4,096), and in a
/// process with threads each growth waits for an RCU grace period while every thread that
/// opens a file waits for it: at the start of an archive of 20,000 small files, two spells
/// of 6-8 ms in which no thread of the run was on a core (`perf sched`). A process alone
/// grows it at once. Its room costs 64 KiB.
fn room_for_descriptors() {
    use rustix::fs::{Mode, OFlags, open};
    use rustix::process::{Resource, getrlimit};
    const ROOM: u64 = 8192;
    let limit = getrlimit(Resource::Nofile).current.unwrap_or(ROOM);
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    if let Ok(fd) = open("/", flags, Mode::empty()) {
        // The lowest free descriptor from there on: nothing open is touched.
        let _ = rustix::io::fcntl_dupfd_cloexec(&fd, (ROOM.min(limit) - 1) as i32);
    }
}

/// Files are opened ahead of the workers, a few batches' worth: more than the 1,024
/// descriptors many systems allow by default. The hard limit is ours to take.
/// No core file: the process holds notification tokens and repository passwords (from its
/// environment), which a core file would leave on disk for whoever can read it.
fn no_core_dumps() {
    use rustix::process::{Resource, Rlimit, setrlimit};
    let none = Rlimit {
        current: Some(0),
        maximum: Some(0),
    };
    let _ = setrlimit(Resource::Core, none);
}

fn raise_file_limit() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        limit.current = Some(limit.maximum.unwrap_or(1 << 16).min(1 << 16));
        let _ = setrlimit(Resource::Nofile, limit);
    }
}
