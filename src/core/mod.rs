//! The pure core: values and functions over bytes, with no I/O. Digests, the tag codec, the
//! classification table, manifests. Everything here is unit-tested, and the parsers of
//! outside data are fuzzed.

pub mod classify;
pub mod digest;
pub mod manifest;
pub mod pax;
pub mod tag;
