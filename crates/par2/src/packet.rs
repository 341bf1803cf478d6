//! PAR2 packets: encoding, and parsing as a pure function over bytes.
//!
//! Every packet starts with a 64-byte header: the magic `PAR2\0PKT`, the packet's length
//! (a multiple of 4, header included), the MD5 of everything from the recovery set ID to the
//! end, the recovery set ID, and a 16-byte type. Parsing scans for the magic, checks the
//! length and the MD5, and keeps what is whole; damaged or unknown packets are skipped, as
//! the specification asks. Nothing read here is trusted beyond its checksums: counts are
//! bounded by the bytes present, and names are data.

use crate::md5x::Md5;

/// The magic that starts every packet.
pub const MAGIC: &[u8; 8] = b"PAR2\0PKT";
const HEADER: usize = 64;

/// Packet types.
pub mod kind {
    /// The main packet: slice size and the set's file IDs.
    pub const MAIN: &[u8; 16] = b"PAR 2.0\0Main\0\0\0\0";
    /// A file's description: ID, MD5s, length, name.
    pub const FILE_DESC: &[u8; 16] = b"PAR 2.0\0FileDesc";
    /// A file's slice checksums (input file slice checksums).
    pub const IFSC: &[u8; 16] = b"PAR 2.0\0IFSC\0\0\0\0";
    /// One recovery slice.
    pub const RECOVERY: &[u8; 16] = b"PAR 2.0\0RecvSlic";
    /// The program that made the set.
    pub const CREATOR: &[u8; 16] = b"PAR 2.0\0Creator\0";
}

pub use crate::md5x::Id;

/// One parsed packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Packet {
    /// Slice size and file IDs (those with recovery data first).
    Main {
        /// Bytes per slice, a multiple of 4.
        slice_size: u64,
        /// Files covered by the recovery data, in the set's order.
        files: Vec<Id>,
        /// Files described but not covered.
        others: Vec<Id>,
    },
    /// A file's description.
    FileDesc {
        /// MD5 of (16 KiB MD5, length, name).
        id: Id,
        /// MD5 of the whole file.
        md5: Id,
        /// MD5 of its first 16 KiB.
        md5_16k: Id,
        /// Length in bytes.
        len: u64,
        /// Name as stored (padding removed): data, never a path to write to.
        name: Vec<u8>,
    },
    /// A file's slice checksums: MD5 and CRC32 of each slice, zero-padded to the slice size.
    Ifsc {
        /// The file.
        id: Id,
        /// One entry per slice.
        slices: Vec<(Id, u32)>,
    },
    /// A recovery slice; its data lies at `data` in the bytes parsed.
    Recovery {
        /// Its exponent.
        exponent: u32,
        /// Where its data is in the parsed bytes.
        data: std::ops::Range<usize>,
    },
    /// The creating program.
    Creator(Vec<u8>),
    /// A packet of another type (an application's own).
    Other {
        /// Its type.
        kind: [u8; 16],
        /// Its body's place in the parsed bytes.
        body: std::ops::Range<usize>,
    },
}

/// A packet and the recovery set it belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    /// The recovery set ID.
    pub set: Id,
    /// The packet.
    pub packet: Packet,
}

/// Parses every intact packet in `bytes`, skipping damage and anything malformed.
pub fn parse(bytes: &[u8]) -> Vec<Found> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(pos) = find_magic(&bytes[at..]) {
        let start = at + pos;
        match parse_one(bytes, start) {
            Some((found, len)) => {
                out.push(found);
                at = start + len;
            }
            None => at = start + 1,
        }
    }
    out
}

fn find_magic(bytes: &[u8]) -> Option<usize> {
    bytes.windows(MAGIC.len()).position(|w| w == MAGIC)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn id_at(b: &[u8], at: usize) -> Id {
    b[at..at + 16].try_into().expect("16 bytes")
}

/// The packet at `start`, and its length, if whole and well-formed.
fn parse_one(bytes: &[u8], start: usize) -> Option<(Found, usize)> {
    let rest = &bytes[start..];
    if rest.len() < HEADER {
        return None;
    }
    let len = u64_at(rest, 8);
    if len < HEADER as u64 || !len.is_multiple_of(4) || len > rest.len() as u64 {
        return None;
    }
    let len = len as usize;
    let packet = &rest[..len];
    if Md5::digest(&packet[32..]).as_slice() != &packet[16..32] {
        return None;
    }
    let set = id_at(packet, 32);
    let kind: [u8; 16] = packet[48..64].try_into().expect("16 bytes");
    let body = &packet[HEADER..];
    let body_at = start + HEADER;
    let parsed = match &kind {
        k if k == kind::MAIN => {
            if body.len() < 12 {
                return None;
            }
            let slice_size = u64_at(body, 0);
            let count = u32_at(body, 8) as usize;
            let ids = &body[12..];
            if slice_size == 0
                || !slice_size.is_multiple_of(4)
                || !ids.len().is_multiple_of(16)
                || count > ids.len() / 16
            {
                return None;
            }
            let all: Vec<Id> = ids
                .chunks_exact(16)
                .map(|c| c.try_into().expect("16"))
                .collect();
            Packet::Main {
                slice_size,
                files: all[..count].to_vec(),
                others: all[count..].to_vec(),
            }
        }
        k if k == kind::FILE_DESC => {
            if body.len() < 56 {
                return None;
            }
            let mut name = body[56..].to_vec();
            while name.last() == Some(&0) {
                name.pop();
            }
            Packet::FileDesc {
                id: id_at(body, 0),
                md5: id_at(body, 16),
                md5_16k: id_at(body, 32),
                len: u64_at(body, 48),
                name,
            }
        }
        k if k == kind::IFSC => {
            if body.len() < 16 || !(body.len() - 16).is_multiple_of(20) {
                return None;
            }
            Packet::Ifsc {
                id: id_at(body, 0),
                slices: body[16..]
                    .chunks_exact(20)
                    .map(|c| (id_at(c, 0), u32_at(c, 16)))
                    .collect(),
            }
        }
        k if k == kind::RECOVERY => {
            if body.len() < 4 {
                return None;
            }
            Packet::Recovery {
                exponent: u32_at(body, 0),
                data: body_at + 4..body_at + body.len(),
            }
        }
        k if k == kind::CREATOR => Packet::Creator(body.to_vec()),
        _ => Packet::Other {
            kind,
            body: body_at..body_at + body.len(),
        },
    };
    Some((
        Found {
            set,
            packet: parsed,
        },
        len,
    ))
}

/// Encodes a packet of `kind` with `body` (padded with zeros to a multiple of 4).
pub fn encode(set: &Id, kind: &[u8; 16], body: &[&[u8]]) -> Vec<u8> {
    let body_len: usize = body.iter().map(|b| b.len()).sum();
    let padded = body_len.next_multiple_of(4);
    let mut p = Vec::with_capacity(HEADER + padded);
    p.extend_from_slice(MAGIC);
    p.extend_from_slice(&((HEADER + padded) as u64).to_le_bytes());
    p.extend_from_slice(&[0u8; 16]);
    p.extend_from_slice(set);
    p.extend_from_slice(kind);
    for b in body {
        p.extend_from_slice(b);
    }
    p.resize(HEADER + padded, 0);
    let hash = Md5::digest(&p[32..]);
    p[16..32].copy_from_slice(&hash);
    p
}

/// The body of a main packet (its MD5 is the recovery set ID).
pub fn main_body(slice_size: u64, files: &[Id]) -> Vec<u8> {
    let mut b = Vec::with_capacity(12 + 16 * files.len());
    b.extend_from_slice(&slice_size.to_le_bytes());
    b.extend_from_slice(&(files.len() as u32).to_le_bytes());
    for id in files {
        b.extend_from_slice(id);
    }
    b
}

/// A file's ID: the MD5 of its first 16 KiB's MD5, its length and its name.
pub fn file_id(md5_16k: &Id, len: u64, name: &[u8]) -> Id {
    let mut h = Md5::new();
    h.update(md5_16k);
    h.update(len.to_le_bytes());
    h.update(name);
    h.finalize()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_damage_is_skipped() {
        let set = [7u8; 16];
        let mut bytes = encode(&set, kind::CREATOR, &[b"intact test"]);
        bytes.extend(encode(
            &set,
            kind::MAIN,
            &[&main_body(1024, &[[1u8; 16], [2u8; 16]])],
        ));
        let mut rec = 5u32.to_le_bytes().to_vec();
        rec.extend_from_slice(&[9u8; 1024]);
        bytes.extend(encode(&set, kind::RECOVERY, &[&rec]));
        let found = parse(&bytes);
        assert_eq!(found.len(), 3);
        assert_eq!(found[0].packet, Packet::Creator(b"intact test\0".to_vec()));
        assert!(
            matches!(&found[1].packet, Packet::Main { slice_size: 1024, files, .. } if files.len() == 2)
        );
        let Packet::Recovery { exponent: 5, data } = &found[2].packet else {
            panic!("{:?}", found[2]);
        };
        assert_eq!(&bytes[data.clone()], &[9u8; 1024][..]);
        // A flipped byte in the middle packet loses that packet only.
        let mut damaged = bytes.clone();
        damaged[100] ^= 1;
        let found = parse(&damaged);
        assert_eq!(found.len(), 2);
        assert!(matches!(found[1].packet, Packet::Recovery { .. }));
    }

    #[test]
    fn hostile_lengths_and_counts_are_rejected() {
        let set = [0u8; 16];
        // A main packet claiming more files than it holds.
        let mut body = main_body(1024, &[[1u8; 16]]);
        body[8..12].copy_from_slice(&1_000_000u32.to_le_bytes());
        assert!(parse(&encode(&set, kind::MAIN, &[&body])).is_empty());
        // Slice size 0 or not a multiple of 4.
        for size in [0u64, 6] {
            assert!(parse(&encode(&set, kind::MAIN, &[&main_body(size, &[])])).is_empty());
        }
        // A header whose length runs past the end.
        let mut p = encode(&set, kind::CREATOR, &[b"x"]);
        p[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(parse(&p).is_empty());
    }

    #[test]
    fn parser_never_panics_on_mutations() {
        let set = [3u8; 16];
        let bodies: Vec<(&[u8; 16], Vec<u8>)> = vec![
            (kind::MAIN, main_body(64, &[[1u8; 16], [2u8; 16]])),
            (kind::IFSC, [[1u8; 16].as_slice(), &[2u8; 40]].concat()),
            (
                kind::FILE_DESC,
                [[4u8; 56].as_slice(), b"../../etc/passwd"].concat(),
            ),
            (kind::RECOVERY, [1u8; 68].to_vec()),
        ];
        let mut rng = fastrand::Rng::with_seed(0x2545f4914f6cdd1d);
        let mut next = |n: usize| rng.usize(..n.max(1));
        let mut mutate = |mut m: Vec<u8>| {
            for _ in 0..1 + next(4) {
                let at = next(m.len() + 1);
                match next(3) {
                    0 if at < m.len() => m[at] ^= 1 << next(8),
                    1 => m.truncate(at),
                    _ => m.insert(at, next(256) as u8),
                }
            }
            m
        };
        for round in 0..20_000 {
            let (k, body) = &bodies[round % bodies.len()];
            // Mutated bodies under a valid checksum reach the body parsers; mutated whole
            // packets exercise the scanning and the header checks.
            let _ = parse(&encode(&set, k, &[&mutate(body.clone())]));
            let _ = parse(&mutate(encode(&set, k, &[body])));
        }
    }
}
