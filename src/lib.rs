//! intact keeps files intact: it stores a digest of each file's data in an extended attribute
//! on the file itself, later proves that the data still matches, and tells silent corruption
//! (data changed under an unchanged mtime) apart from a legitimate edit.
//!
//! The library does all the work and never prints: [`engine::run`] walks trees and yields one
//! [`engine::FileReport`] per file; [`report::Reporter`] renders those for people or as JSON
//! and decides the exit code. The binary parses the command line and runs each verb in
//! phases (its settings, the engine through the verb's sink, the state database, the
//! owner's notice: `src/cmd`); it holds no file logic of its own.

pub mod archive;
pub mod core;
pub mod engine;
pub mod export;
pub mod fs;
pub mod metrics;
pub mod notify;
pub mod parity;
pub mod process;
pub mod repair;
pub mod report;
pub mod scrub;
pub mod sink;
pub mod state;
#[cfg(test)]
#[macro_use]
#[path = "testutil/skip.rs"]
mod skip;
#[cfg(test)]
mod testutil;
pub mod text;
pub mod verb;
pub mod watch;
