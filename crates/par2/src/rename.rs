//! A one-file set renamed after its file: the name is part of the file's ID (the MD5 of its
//! first 16 KiB's MD5, its length and its name), the file IDs make the main packet, whose MD5
//! is the set's ID, and every packet's header carries that ID and an MD5 over it. So every
//! packet is written again, but no recovery data is computed again: with one file its slices
//! are in no other order (a set of several files orders them by file ID, so a renamed member
//! changes the recovery data of the whole set: those are made again instead).

use std::io::{self, Read, Write};

use crate::md5x::Md5;
use crate::packet::{self, Found, Id, Packet, kind};
use crate::read_full;

/// How a one-file set is renamed: what its packets become.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rename {
    id: Id,
    set: Id,
    slice_size: u64,
    md5: Id,
    md5_16k: Id,
    len: u64,
    name: Vec<u8>,
}

/// The largest packet copied (a recovery slice of the largest slice, and its header).
const MAX_PACKET: u64 = crate::MAX_SLICE + 68;

impl Rename {
    /// The renaming of the set whose index begins with `head` (its main packet and its file's
    /// description, as sets begin) to `name`: `None` when `head` does not hold them, when the
    /// set has more than one file, or when the file already has that name.
    pub fn new(head: &[u8], name: &[u8]) -> Option<Rename> {
        let found = packet::parse(head);
        let slice_size = found.iter().find_map(|f| match &f.packet {
            Packet::Main {
                slice_size,
                files,
                others,
            } if files.len() + others.len() == 1 => Some(*slice_size),
            _ => None,
        })?;
        let (md5, md5_16k, len, old) = found.iter().find_map(|f| match &f.packet {
            Packet::FileDesc {
                md5,
                md5_16k,
                len,
                name,
                ..
            } => Some((*md5, *md5_16k, *len, name.clone())),
            _ => None,
        })?;
        if old == name {
            return None;
        }
        let id = packet::file_id(&md5_16k, len, name);
        let set = Md5::digest(&packet::main_body(slice_size, &[id]));
        Some(Rename {
            id,
            set,
            slice_size,
            md5,
            md5_16k,
            len,
            name: name.to_vec(),
        })
    }

    /// The name a set's index records for its one file, from the index's first bytes.
    pub fn recorded(head: &[u8]) -> Option<Vec<u8>> {
        packet::parse(head)
            .into_iter()
            .find_map(|f| match f.packet {
                Packet::FileDesc { name, .. } => Some(name),
                _ => None,
            })
    }

    /// Copies one file of the set (its index, or a volume) from `from` to `to`, a packet at a
    /// time, each under the new name and set ID. Whatever the set's packets said of the file
    /// before (the old name, or already the new one: a copy cut short by a kill is done
    /// again) becomes the new; a packet that is not whole is an error, and nothing is kept.
    pub fn copy(&self, from: &mut dyn Read, to: &mut impl Write) -> io::Result<()> {
        let mut header = [0u8; 64];
        loop {
            match read_full(from, &mut header)? {
                0 => return Ok(()),
                64 => {}
                _ => return Err(malformed("a packet cut short")),
            }
            let len = u64::from_le_bytes(header[8..16].try_into().expect("8 bytes"));
            if &header[..8] != packet::MAGIC
                || len < 64
                || !len.is_multiple_of(4)
                || len > MAX_PACKET
            {
                return Err(malformed("not a PAR2 packet"));
            }
            let mut packet = header.to_vec();
            packet.resize(len as usize, 0);
            if read_full(from, &mut packet[64..])? != len as usize - 64 {
                return Err(malformed("a packet cut short"));
            }
            let found = packet::parse(&packet);
            let [Found { packet: parsed, .. }] = &found[..] else {
                return Err(malformed("a damaged packet"));
            };
            to.write_all(&self.packet(parsed, &packet))?;
        }
    }

    /// `parsed` (whose bytes are `bytes`) as the renamed set has it.
    fn packet(&self, parsed: &Packet, bytes: &[u8]) -> Vec<u8> {
        let body = |r: &std::ops::Range<usize>| &bytes[r.clone()];
        match parsed {
            Packet::Main { .. } => packet::encode(
                &self.set,
                kind::MAIN,
                &[&packet::main_body(self.slice_size, &[self.id])],
            ),
            Packet::FileDesc { .. } => packet::encode(
                &self.set,
                kind::FILE_DESC,
                &[
                    &self.id,
                    &self.md5,
                    &self.md5_16k,
                    &self.len.to_le_bytes(),
                    &self.name,
                ],
            ),
            Packet::Ifsc { slices, .. } => {
                let mut b = Vec::with_capacity(16 + 20 * slices.len());
                b.extend_from_slice(&self.id);
                for (md5, crc) in slices {
                    b.extend_from_slice(md5);
                    b.extend_from_slice(&crc.to_le_bytes());
                }
                packet::encode(&self.set, kind::IFSC, &[&b])
            }
            Packet::Recovery { exponent, data } => packet::encode(
                &self.set,
                kind::RECOVERY,
                &[&exponent.to_le_bytes(), body(data)],
            ),
            // Kept as they are but for the set's ID (a body's padding is kept too).
            Packet::Creator(_) | Packet::Other { .. } => {
                let kind: [u8; 16] = bytes[48..64].try_into().expect("16 bytes");
                packet::encode(&self.set, &kind, &[&bytes[64..]])
            }
        }
    }
}

fn malformed(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("renaming a PAR2 set: {what}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Input, Plan, create, test_data};

    /// A set renamed is the set made under the new name, byte for byte: index and volume.
    #[test]
    fn a_renamed_set_is_the_set_made_under_the_new_name() {
        let data = test_data(300_000, 9);
        let make = |name: &[u8]| {
            let inputs = [Input {
                name: name.to_vec(),
                len: data.len() as u64,
            }];
            let files = vec![data.clone()];
            let plan = Plan {
                slice_size: 8192,
                recovery_count: 5,
                threads: 1,
                memory: 1 << 20,
            };
            let mut volume = io::Cursor::new(Vec::new());
            let created = create(&inputs, &files, &plan, &mut volume).unwrap();
            (created.index, volume.into_inner())
        };
        let (index, volume) = make(b"2024/IMG_0001.jpg");
        let (new_index, new_volume) = make(b"albums/beach.jpg");
        let r = Rename::new(&index[..4096.min(index.len())], b"albums/beach.jpg").unwrap();
        for (old, new) in [(&index, &new_index), (&volume, &new_volume)] {
            let mut out = Vec::new();
            r.copy(&mut &old[..], &mut out).unwrap();
            assert_eq!(&out, new);
            // Done again over its own output (a copy a kill cut short): the same.
            let mut again = Vec::new();
            r.copy(&mut &out[..], &mut again).unwrap();
            assert_eq!(&again, new);
        }
        assert_eq!(Rename::recorded(&new_index).unwrap(), b"albums/beach.jpg");
        // Already so named: nothing to do. Cut short: an error, not a shorter set.
        assert!(Rename::new(&new_index, b"albums/beach.jpg").is_none());
        let mut out = Vec::new();
        assert!(r.copy(&mut &volume[..volume.len() - 10], &mut out).is_err());
    }
}
