//! The integration tests: the real `intact` binary on real files in temp trees, with real
//! xattrs, real corruption and real faults. One binary, one module per feature.

#[macro_use]
#[path = "../../src/testutil/skip.rs"]
mod skip;
#[macro_use]
mod common;
#[macro_use]
mod faultfs;

mod alerts;
mod archive;
mod backups;
mod bad_sectors;
mod confinement;
mod damage_memory;
mod faults;
mod full_disks;
mod interop;
mod kills;
mod loud;
mod notify;
mod output;
mod parity;
mod progress;
mod receiver;
mod repair;
mod scrub;
mod security;
mod sources;
mod tags;
mod verdicts;
mod walking;
mod watch;
