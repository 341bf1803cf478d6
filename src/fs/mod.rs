//! The file-system side: walking trees, opening files beneath their roots, reading them to
//! hash, their extended attributes, atomic writes, and what differs between platforms and
//! devices.

pub mod anchor;
pub mod atomic;
pub mod chase;
pub mod device;
pub mod hash;
pub mod mapped;
#[cfg(target_os = "linux")]
pub mod mounts;
pub mod owned;
pub mod sys;
pub mod walk;
pub mod xattr;
