//! Helpers shared by the unit tests of the parsers.

/// A small deterministic xorshift generator: the same cases on every run.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed | 1)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n.max(1) as u64) as usize
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
