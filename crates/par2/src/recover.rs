//! Reading a set back (from its packets, in any PAR2 file of it) and repairing from it: which
//! slices are damaged (by their MD5 and CRC32), and the damaged ones rebuilt from recovery
//! slices by solving the linear system.

use std::collections::{BTreeMap, HashMap};
use std::io::{self, Read};

use crate::md5x::{self, Md5};
use crate::mul::multiply_into;
use crate::packet::{self, Id, Packet, kind};
use crate::{Error, FileEntry, MAX_REPAIR_MEMORY, MAX_SLICE, Recovery, Set, gf, read_full};

/// Bytes of slices a repair's scan holds to compute their MD5s at once.
const SCAN_BATCH: usize = 8 << 20;

impl Set {
    /// Assembles the set from the packets of one or more PAR2 files (their bytes). The set
    /// is the one whose main packet comes first; packets of other sets are ignored.
    pub fn load(files: &[&[u8]]) -> Result<Set, Error> {
        let found: Vec<(packet::Found, Option<Recovery>)> = files
            .iter()
            .flat_map(|b| {
                packet::parse(b).into_iter().map(|f| {
                    let data = match &f.packet {
                        Packet::Recovery { data, .. } => {
                            Some(Recovery::Bytes(b[data.clone()].to_vec()))
                        }
                        _ => None,
                    };
                    (f, data)
                })
            })
            .collect();
        Set::assemble(found, Vec::new())
    }

    /// Assembles the set from PAR2 files on disk, reading each once from end to end to check
    /// its packets; recovery slices stay in the files until a repair needs them.
    pub fn open(files: Vec<std::fs::File>) -> Result<Set, Error> {
        let mut found = Vec::new();
        for (i, file) in files.iter().enumerate() {
            scan(file, &mut |f, at| {
                found.push((f, at.map(|offset| Recovery::At(i, offset))));
            })?;
        }
        Set::assemble(found, files)
    }

    /// A recovery slice's data.
    fn recovery_data(&self, exponent: u32) -> io::Result<Vec<u8>> {
        match &self.recovery[&exponent] {
            Recovery::Bytes(b) => Ok(b.clone()),
            Recovery::At(file, offset) => {
                use std::os::unix::fs::FileExt;
                let mut buf = vec![0u8; self.slice_size as usize];
                self.sources[*file].read_exact_at(&mut buf, *offset)?;
                Ok(buf)
            }
        }
    }

    fn assemble(
        found: Vec<(packet::Found, Option<Recovery>)>,
        sources: Vec<std::fs::File>,
    ) -> Result<Set, Error> {
        let mut main = None;
        let mut descs: HashMap<Id, (Id, Id, u64, Vec<u8>)> = HashMap::new();
        let mut ifscs: HashMap<Id, Vec<(Id, u32)>> = HashMap::new();
        let mut recovery = BTreeMap::new();
        let id = found
            .iter()
            .find(|(f, _)| matches!(f.packet, Packet::Main { .. }))
            .map(|(f, _)| f.set)
            .ok_or_else(|| Error::Malformed("no main packet".into()))?;
        for (f, data) in found.into_iter().filter(|(f, _)| f.set == id) {
            match f.packet {
                Packet::Main {
                    slice_size, files, ..
                } => main = Some((slice_size, files)),
                Packet::FileDesc {
                    id,
                    md5,
                    md5_16k,
                    len,
                    name,
                } => {
                    descs.insert(id, (md5, md5_16k, len, name));
                }
                Packet::Ifsc { id, slices } => {
                    ifscs.insert(id, slices);
                }
                Packet::Recovery {
                    exponent,
                    data: range,
                } => {
                    if let Some(data) = data {
                        recovery
                            .entry(exponent)
                            .or_insert((data, range.len() as u64));
                    }
                }
                _ => {}
            }
        }
        let (slice_size, ids) = main.expect("a main packet was found");
        if ids.len() > gf::MAX_INPUT_SLICES {
            return Err(Error::Malformed("too many files".into()));
        }
        if slice_size > MAX_SLICE {
            return Err(Error::Malformed(format!("slices of {slice_size} bytes")));
        }
        let mut entries = Vec::with_capacity(ids.len());
        let mut total = 0u64;
        for fid in ids {
            let (md5, md5_16k, len, name) = descs
                .remove(&fid)
                .ok_or_else(|| Error::Malformed("a file description is missing".into()))?;
            let slices = ifscs
                .remove(&fid)
                .ok_or_else(|| Error::Malformed("a file's slice checksums are missing".into()))?;
            if packet::file_id(&md5_16k, len, &name) != fid {
                return Err(Error::Malformed(
                    "a file ID does not match its description".into(),
                ));
            }
            if slices.len() as u64 != len.div_ceil(slice_size) {
                return Err(Error::Malformed(
                    "slice checksums do not fit the file length".into(),
                ));
            }
            total += slices.len() as u64;
            if total > gf::MAX_INPUT_SLICES as u64 {
                return Err(Error::Malformed("more than 32768 input slices".into()));
            }
            entries.push(FileEntry {
                id: fid,
                md5,
                md5_16k,
                len,
                name,
                slices,
            });
        }
        // A slice far larger than every file is not one any program made (a tiny file may
        // have been given a generous slice size, up to a MiB).
        let largest = entries.iter().map(|e| e.len).max().unwrap_or(0);
        if slice_size > largest.next_multiple_of(4).max(1 << 20) {
            return Err(Error::Malformed("the slice size exceeds every file".into()));
        }
        let recovery = recovery
            .into_iter()
            .filter(|&(e, (_, len))| e < 65535 && len == slice_size)
            .map(|(e, (data, _))| (e, data))
            .collect();
        Ok(Set {
            id,
            slice_size,
            files: entries,
            recovery,
            sources,
        })
    }

    /// The global index of file `f`'s first slice.
    fn first_slice(&self, f: usize) -> usize {
        self.files[..f].iter().map(|e| e.slices.len()).sum()
    }

    /// Finds the damaged slices of every file (read through `open`; `None` for a file that
    /// is missing) and rebuilds them from the recovery slices. The result holds the original
    /// bytes of each rebuilt slice (zero-padded to the slice size), by global slice index.
    pub fn recover<'r>(
        &self,
        open: &mut dyn FnMut(usize) -> io::Result<Option<Box<dyn Read + 'r>>>,
        threads: usize,
    ) -> Result<Recovered, Error> {
        let size = self.slice_size as usize;
        let total: usize = self.files.iter().map(|f| f.slices.len()).sum();
        let constants = gf::input_constants(total);
        // First pass: which slices are damaged.
        let mut damaged = Vec::new();
        for (f, entry) in self.files.iter().enumerate() {
            let base = self.first_slice(f);
            match open(f)? {
                None => damaged.extend(base..base + entry.slices.len()),
                Some(mut r) => {
                    // Slices are read a few at a time, their MD5s computed at once (in SIMD
                    // lanes): up to 16, in at most SCAN_BATCH bytes.
                    let per = (SCAN_BATCH / size).clamp(1, 16);
                    let mut bufs = vec![vec![0u8; size]; per.min(entry.slices.len())];
                    for (at, expects) in entry.slices.chunks(per).enumerate() {
                        let first = at * per;
                        // Read whole, with the CRC32 that was expected.
                        let mut whole = Vec::with_capacity(expects.len());
                        for (j, expect) in expects.iter().enumerate() {
                            let k = (first + j) as u64;
                            // Only the slice's own bytes: a file longer than described is
                            // damaged past its end only, which costs no recovery slice.
                            let want = (entry.len - k * self.slice_size).min(self.slice_size);
                            let buf = &mut bufs[j];
                            let n = read_full(&mut *r, &mut buf[..want as usize])?;
                            buf[n..].fill(0);
                            whole.push(n as u64 >= want && crc32fast::hash(buf) == expect.1);
                        }
                        let checked: Vec<&[u8]> = (0..expects.len())
                            .filter(|&j| whole[j])
                            .map(|j| &bufs[j][..])
                            .collect();
                        let mut sums = md5x::digest_many(&checked).into_iter();
                        for (j, expect) in expects.iter().enumerate() {
                            if !(whole[j] && sums.next() == Some(expect.0)) {
                                damaged.push(base + first + j);
                            }
                        }
                    }
                }
            }
        }
        if damaged.is_empty() {
            return Ok(Recovered {
                slices: HashMap::new(),
            });
        }
        if damaged.len() > self.recovery.len() {
            return Err(Error::TooMuchDamage {
                damaged: damaged.len(),
                available: self.recovery.len(),
            });
        }
        // Memory for the solve: one buffer per damaged slice, twice.
        if (damaged.len() as u64).saturating_mul(2 * self.slice_size) > MAX_REPAIR_MEMORY {
            return Err(Error::Malformed(format!(
                "{} damaged slices of {} bytes: too much to rebuild in memory",
                damaged.len(),
                self.slice_size
            )));
        }
        // The first exponents at hand; PAR2's matrix is almost always invertible, and where
        // not, a later window of exponents is tried.
        let all: Vec<u32> = self.recovery.keys().copied().collect();
        let (exps, inverse) = (0..=all.len() - damaged.len())
            .find_map(|start| {
                let exps = all[start..start + damaged.len()].to_vec();
                let matrix: Vec<Vec<u16>> = exps
                    .iter()
                    .map(|&e| {
                        damaged
                            .iter()
                            .map(|&j| gf::pow(constants[j], e as u64))
                            .collect()
                    })
                    .collect();
                gf::invert(matrix).map(|inv| (exps, inv))
            })
            .ok_or_else(|| Error::Malformed("recovery slices are not independent".into()))?;
        // Second pass: each used recovery slice minus the contributions of the good slices.
        let mut rhs: Vec<gf::Buffer> = exps
            .iter()
            .map(|&e| {
                let mut b = gf::Buffer::default();
                b.copy_from(&self.recovery_data(e)?);
                Ok(b)
            })
            .collect::<io::Result<_>>()?;
        for r in &mut rhs {
            gf::to_native(r);
        }
        let is_damaged: std::collections::HashSet<usize> = damaged.iter().copied().collect();
        let batch_slices = (32usize << 20).div_ceil(size).max(1);
        let mut batch: Vec<(gf::Buffer, u16)> = Vec::new();
        for (f, entry) in self.files.iter().enumerate() {
            let base = self.first_slice(f);
            let Some(mut r) = open(f)? else { continue };
            for k in 0..entry.slices.len() {
                let mut buf = gf::Buffer::zeroed(size);
                let want = (entry.len - k as u64 * self.slice_size).min(self.slice_size);
                let n = read_full(&mut *r, &mut buf[..want as usize])?;
                buf[n..].fill(0);
                if !is_damaged.contains(&(base + k)) {
                    gf::to_native(&mut buf);
                    batch.push((buf, constants[base + k]));
                    if batch.len() == batch_slices {
                        subtract(&mut rhs, &exps, &batch, threads);
                        batch.clear();
                    }
                }
            }
        }
        subtract(&mut rhs, &exps, &batch, threads);
        // Solve: rhs[r] = sum_j c_{damaged j}^{exp r} * x_j.
        let mut slices = HashMap::new();
        for (j, &slice) in damaged.iter().enumerate() {
            let mut out = vec![0u8; size];
            for (r, data) in rhs.iter().enumerate() {
                gf::Multiplier::new(inverse[j][r]).mul_add_native(&mut out, data);
            }
            gf::from_native(&mut out);
            slices.insert(slice, out);
        }
        Ok(Recovered { slices })
    }

    /// Streams file `f` as it should be: its good slices read from `current` (if there is
    /// one), rebuilt ones from `recovered`, cut to the file's length.
    pub fn restore(
        &self,
        f: usize,
        recovered: &Recovered,
        mut current: Option<&mut dyn Read>,
        out: &mut dyn FnMut(&[u8]) -> io::Result<()>,
    ) -> Result<(), Error> {
        let entry = &self.files[f];
        let base = self.first_slice(f);
        let mut buf = vec![0u8; self.slice_size as usize];
        for k in 0..entry.slices.len() {
            let n = match current.as_mut() {
                Some(r) => read_full(&mut **r, &mut buf)?,
                None => 0,
            };
            let want = (entry.len - k as u64 * self.slice_size).min(self.slice_size) as usize;
            match recovered.slices.get(&(base + k)) {
                Some(slice) => out(&slice[..want])?,
                None if n >= want => out(&buf[..want])?,
                None => {
                    return Err(Error::Malformed(
                        "a slice changed between checking and restoring".into(),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Packets bigger than this are never held in memory: recovery packets are checked as they
/// stream by, and no description packet is this large.
const MAX_HELD_PACKET: u64 = 64 << 20;

/// Reads `file` from end to end and hands each intact packet to `each`, a recovery packet
/// with the offset of its data instead of the data.
fn scan(file: &std::fs::File, each: &mut dyn FnMut(packet::Found, Option<u64>)) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    let len = file.metadata()?.len();
    let mut buf = vec![0u8; 1 << 20];
    let mut pos = 0u64;
    while pos + 64 <= len {
        let n = (len - pos).min(buf.len() as u64) as usize;
        file.read_exact_at(&mut buf[..n], pos)?;
        let Some(i) = buf[..n].windows(8).position(|w| w == packet::MAGIC) else {
            // Keep the last bytes: a magic may straddle the chunks.
            pos += (n as u64).saturating_sub(7).max(1);
            continue;
        };
        let at = pos + i as u64;
        pos = at + 1;
        let mut header = [0u8; 64];
        if at + 64 > len || file.read_exact_at(&mut header, at).is_err() {
            continue;
        }
        let plen = u64::from_le_bytes(header[8..16].try_into().expect("8 bytes"));
        if plen < 64 || !plen.is_multiple_of(4) || plen > len - at {
            continue;
        }
        if &header[48..64] == kind::RECOVERY && plen >= 68 {
            // Checked by streaming its MD5, never held.
            let mut h = Md5::new();
            h.update(&header[32..]);
            let mut done = 64;
            while done < plen {
                let k = (plen - done).min(buf.len() as u64) as usize;
                file.read_exact_at(&mut buf[..k], at + done)?;
                h.update(&buf[..k]);
                done += k as u64;
            }
            if h.finalize()[..] != header[16..32] {
                continue;
            }
            let mut exponent = [0u8; 4];
            file.read_exact_at(&mut exponent, at + 64)?;
            let found = packet::Found {
                set: header[32..48].try_into().expect("16 bytes"),
                packet: Packet::Recovery {
                    exponent: u32::from_le_bytes(exponent),
                    data: 0..(plen - 68) as usize,
                },
            };
            each(found, Some(at + 68));
            pos = at + plen;
        } else if plen <= MAX_HELD_PACKET {
            let mut packet = vec![0u8; plen as usize];
            file.read_exact_at(&mut packet, at)?;
            if let [found] = &packet::parse(&packet)[..] {
                each(found.clone(), None);
                pos = at + plen;
            }
        }
    }
    Ok(())
}

/// Rebuilt slices, by global slice index.
#[derive(Debug)]
pub struct Recovered {
    /// The original bytes of each rebuilt slice, zero-padded.
    pub slices: HashMap<usize, Vec<u8>>,
}

/// Takes the good slices' share out of each recovery slice in use.
fn subtract(rhs: &mut [gf::Buffer], exps: &[u32], batch: &[(gf::Buffer, u16)], threads: usize) {
    let exponents: Vec<u64> = exps.iter().map(|&e| e as u64).collect();
    multiply_into(rhs, &exponents, batch, threads);
}
