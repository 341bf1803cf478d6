//! Digests of file data: the algorithms intact offers, as pure values and hashers.

use std::fmt;
use std::str::FromStr;

use sha2::Digest as _;

/// A digest algorithm intact can tag with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Algo {
    /// SHA-256 (FIPS 180-4), the default: studied for decades and hardware-accelerated.
    Sha256,
    /// BLAKE3: faster on every CPU, and able to use several cores on one file.
    Blake3,
}

impl Algo {
    /// The name used in tags, manifests and output.
    pub fn name(self) -> &'static str {
        match self {
            Algo::Sha256 => "sha256",
            Algo::Blake3 => "blake3",
        }
    }

    /// How many there are: the length of per-algorithm arrays.
    pub(crate) const COUNT: usize = 2;

    /// Its place among the algorithms, for per-algorithm arrays.
    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Algo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Algo {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "sha256" => Ok(Algo::Sha256),
            "blake3" => Ok(Algo::Blake3),
            _ => Err(format!("unknown digest algorithm {s:?}")),
        }
    }
}

/// A 256-bit digest together with the algorithm that produced it.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Digest {
    /// The algorithm.
    pub algo: Algo,
    /// The 32 digest bytes.
    pub bytes: [u8; 32],
}

impl Digest {
    /// Lowercase hexadecimal, as sha256sum and b3sum print it.
    pub fn hex(&self) -> String {
        hex::encode(self.bytes)
    }
}

/// What one read of a file computed: at most one digest per algorithm, kept inline (a read
/// per file, tens of thousands a second: no allocation for it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Digests([Option<Digest>; Algo::COUNT]);

impl Digests {
    /// The digest for `algo`, if the read computed it.
    pub fn get(&self, algo: Algo) -> Option<Digest> {
        self.0[algo.index()]
    }

    /// The digest for `algo`, which the caller asked the read for.
    pub fn of(&self, algo: Algo) -> Digest {
        self.get(algo).expect("the algorithm was hashed")
    }
}

impl FromIterator<Digest> for Digests {
    fn from_iter<I: IntoIterator<Item = Digest>>(digests: I) -> Self {
        let mut out = Digests::default();
        for d in digests {
            out.0[d.algo.index()] = Some(d);
        }
        out
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.algo, self.hex())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// An incremental hasher for one [`Algo`].
pub enum Hasher {
    /// SHA-256 via RustCrypto `sha2`, which picks SHA-NI / ARMv8 SHA at run time.
    Sha256(sha2::Sha256),
    /// BLAKE3; boxed because its state is large.
    Blake3(Box<blake3::Hasher>),
}

impl Hasher {
    /// A fresh hasher.
    pub fn new(algo: Algo) -> Self {
        match algo {
            Algo::Sha256 => Hasher::Sha256(sha2::Sha256::new()),
            Algo::Blake3 => Hasher::Blake3(Box::new(blake3::Hasher::new())),
        }
    }

    /// Feeds bytes.
    pub fn update(&mut self, data: &[u8]) {
        match self {
            // BLAKE3's tree lets every core work on one file. The pool's threads take the
            // work from the worker, which waits: below a mebibyte the hand-over costs more
            // than the cores gain while other workers keep them busy (2,000 files of 256 KiB
            // on two cores: 261 ms at 128 KiB and up, 176 ms without the pool).
            Hasher::Blake3(h) if data.len() >= 1 << 20 => {
                h.update_rayon(data);
            }
            _ => self.update_here(data),
        }
    }

    /// Feeds bytes on the calling thread alone: for a file hashed beside others that keep
    /// the other cores busy.
    pub fn update_here(&mut self, data: &[u8]) {
        match self {
            Hasher::Sha256(h) => h.update(data),
            Hasher::Blake3(h) => {
                h.update(data);
            }
        }
    }

    /// Feeds `n` zero bytes: a sparse file's hole.
    pub fn update_zeros(&mut self, mut n: u64) {
        static ZEROS: [u8; 64 << 10] = [0; 64 << 10];
        while n > 0 {
            let k = n.min(ZEROS.len() as u64) as usize;
            self.update(&ZEROS[..k]);
            n -= k as u64;
        }
    }

    /// The digest of everything fed so far.
    pub fn finalize(self) -> Digest {
        match self {
            Hasher::Sha256(h) => Digest {
                algo: Algo::Sha256,
                bytes: h.finalize().into(),
            },
            Hasher::Blake3(h) => Digest {
                algo: Algo::Blake3,
                bytes: *h.finalize().as_bytes(),
            },
        }
    }
}

/// BLAKE3 of an input of `len` bytes whose parts `part(offset, len)` hashes as subtrees
/// (chaining values) where it can read them: BLAKE3's own tree (its specification, section
/// 2.1) walked with `rayon::join` down to parts of at most `most` bytes (a power of two of
/// chunks), so that each core of the pool hashes whole parts on its own and each part can
/// be mapped, hashed and let go by the core that reaches it. Splitting one window at a time
/// over the cores instead (the crate's `update_rayon` on each) hands every window over and
/// waits for the slowest core (one 4 GiB file on an AMD EPYC Zen 5 VM, two cores, in turns:
/// x1.000 b3sum's time walked in 16 MiB parts against x1.023 in windows of 16 MiB, with the
/// page cache in 2 MiB folios; x0.947 against x0.975 in smaller ones). Needs at least two
/// parts: the root is a merge. Every part is asked for even after one failed (a `part` that
/// has failed answers the rest at once); an error is the answer.
pub fn blake3_in_parts<E: Send>(
    len: u64,
    most: u64,
    part: &(impl Fn(u64, usize) -> Result<Subtree, E> + Sync),
) -> Result<Digest, E> {
    use blake3::hazmat::{Mode, left_subtree_len, merge_subtrees_non_root, merge_subtrees_root};
    fn node<E: Send>(
        offset: u64,
        len: u64,
        most: u64,
        part: &(impl Fn(u64, usize) -> Result<Subtree, E> + Sync),
    ) -> Result<Subtree, E> {
        if len <= most {
            return part(offset, len as usize);
        }
        let (left, right) = halves(offset, len, most, part);
        Ok(merge_subtrees_non_root(&left?, &right?, Mode::Hash))
    }
    // A node of more than `most` bytes: its left subtree is the largest power of two of
    // chunks shorter than it, so every part starts at a multiple of `most`.
    fn halves<E: Send>(
        offset: u64,
        len: u64,
        most: u64,
        part: &(impl Fn(u64, usize) -> Result<Subtree, E> + Sync),
    ) -> (Result<Subtree, E>, Result<Subtree, E>) {
        let left = left_subtree_len(len);
        rayon_core::join(
            || node(offset, left, most, part),
            || node(offset + left, len - left, most, part),
        )
    }
    assert!(
        most.is_power_of_two() && most >= blake3::CHUNK_LEN as u64 && len > most,
        "parts of a power of two of chunks, and at least two"
    );
    let (left, right) = halves(0, len, most, part);
    Ok(Digest {
        algo: Algo::Blake3,
        bytes: *merge_subtrees_root(&left?, &right?, Mode::Hash).as_bytes(),
    })
}

/// The chaining value of a BLAKE3 subtree: what a core that hashed part of a file hands on.
pub type Subtree = blake3::hazmat::ChainingValue;

/// The chaining value of `data`, the subtree at `offset` of a larger input: one part of
/// [`blake3_in_parts`].
pub fn subtree(offset: u64, data: &[u8]) -> Subtree {
    use blake3::hazmat::HasherExt as _;
    blake3::Hasher::new()
        .set_input_offset(offset)
        .update(data)
        .finalize_non_root()
}

/// The digest of a byte slice (for tests and small inputs).
pub fn digest_bytes(algo: Algo, data: &[u8]) -> Digest {
    let mut h = Hasher::new(algo);
    h.update(data);
    h.finalize()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_answers() {
        // FIPS 180-2 and the BLAKE3 reference vectors for "abc" and "".
        assert_eq!(
            digest_bytes(Algo::Sha256, b"abc").hex(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            digest_bytes(Algo::Sha256, b"").hex(),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            digest_bytes(Algo::Blake3, b"").hex(),
            "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
        );
    }

    #[test]
    fn blake3_in_parts_is_blake3_of_the_whole() {
        let data: Vec<u8> = (0..400_000u32).map(|i| (i * 31 + i / 1021) as u8).collect();
        let chunk = blake3::CHUNK_LEN;
        fn part(data: &[u8]) -> impl Fn(u64, usize) -> Result<Subtree, ()> + Sync + '_ {
            move |offset, len| Ok(subtree(offset, &data[offset as usize..][..len]))
        }
        // Lengths at and around the tree's edges; parts of several sizes.
        for len in [
            2 * chunk,
            2 * chunk + 1,
            5 * chunk - 1,
            64 * chunk,
            64 * chunk + 7,
            293 * chunk + 100,
        ] {
            for most in [chunk, 4 * chunk, 16 * chunk]
                .into_iter()
                .filter(|&m| m < len)
            {
                let data = &data[..len];
                assert_eq!(
                    blake3_in_parts(len as u64, most as u64, &part(data)).unwrap(),
                    digest_bytes(Algo::Blake3, data),
                    "{len} bytes in parts of {most}"
                );
            }
        }
        // Every part is asked for once, in parts of `most` bytes but the last, and the first
        // error is the answer.
        let asked = std::sync::Mutex::new(Vec::new());
        let digest = blake3_in_parts(50 * chunk as u64 + 3, 8 * chunk as u64, &|offset, len| {
            asked.lock().unwrap().push((offset, len));
            if offset == 16 * chunk as u64 {
                Err(offset)
            } else {
                Ok(subtree(offset, &data[..len]))
            }
        });
        assert_eq!(digest, Err(16 * chunk as u64));
        let mut asked = asked.into_inner().unwrap();
        asked.sort();
        let whole: Vec<_> = (0..7)
            .map(|i| {
                (
                    (i * 8 * chunk) as u64,
                    if i < 6 { 8 * chunk } else { 2 * chunk + 3 },
                )
            })
            .collect();
        assert_eq!(asked, whole);
    }

    #[test]
    fn a_file_fed_on_one_core_or_spread_has_one_digest() {
        // Large enough that BLAKE3's pool splits the pieces fed through `update`.
        let data: Vec<u8> = (0..5u32 << 20).map(|i| (i * 7 + i / 4099) as u8).collect();
        for algo in [Algo::Sha256, Algo::Blake3] {
            let (mut spread, mut here) = (Hasher::new(algo), Hasher::new(algo));
            for piece in data.chunks(3 << 20) {
                spread.update(piece);
                here.update_here(piece);
            }
            // The crates' own one-shot functions, on one thread.
            let whole = Digest {
                algo,
                bytes: match algo {
                    Algo::Sha256 => sha2::Sha256::digest(&data).into(),
                    Algo::Blake3 => *blake3::hash(&data).as_bytes(),
                },
            };
            assert_eq!(spread.finalize(), whole, "{algo}");
            assert_eq!(here.finalize(), whole, "{algo}");
        }
    }
}
