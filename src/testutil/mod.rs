//! Helpers shared by the unit tests: seeded cases for the parsers (`skip!` is at the crate's
//! root, as in the test binaries).

/// A seeded generator (fastrand's, as every test of the workspace uses): the same cases on
/// every run.
pub struct Rng(fastrand::Rng);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(fastrand::Rng::with_seed(seed))
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        self.0.usize(..n.max(1))
    }
}

/// Applies 1 to `most` random edits: flip a bit, drop a byte, insert one of `alphabet`, or
/// cut the rest off.
pub fn mutate(rng: &mut Rng, v: &mut Vec<u8>, most: usize, alphabet: &[u8]) {
    for _ in 0..1 + rng.below(most) {
        let at = rng.below(v.len() + 1);
        match rng.below(4) {
            0 if at < v.len() => v[at] ^= 1 << rng.below(8),
            1 if at < v.len() => drop(v.remove(at)),
            2 => v.insert(at, alphabet[rng.below(alphabet.len())]),
            _ => v.truncate(at),
        }
    }
}
