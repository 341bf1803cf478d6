//! SHA-256 computed with a file's MD5 on one core. The first pass of a set reads each file
//! once and needs its MD5 (PAR2 names files by it); a caller that proves those bytes are the
//! ones it verified hashes them with SHA-256 too. MD5 is one chain of dependent steps that
//! leaves most of a core idle, so SHA-NI's instructions placed between its steps cost almost
//! nothing: on Zen 4, MD5 alone 0.74 GB/s, MD5 then SHA-256 block by block 0.66, both in
//! one pass 0.70 (`examples/md5speed.rs`).

#![allow(unsafe_code)]

use crate::md5x::Md5;

/// The SHA-256 of one message, fed piece by piece: with [`Md5::update_with_sha256`], or
/// alone. Blocks not hashed together with an MD5 go to the `sha2` crate.
#[derive(Clone)]
pub struct Sha256 {
    state: [u32; 8],
    /// The start of a block not yet complete.
    pending: [u8; 64],
    pending_len: usize,
    len: u64,
}

impl Default for Sha256 {
    fn default() -> Self {
        Sha256::new()
    }
}

const INIT: [u32; 8] = [
    0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
];

impl Sha256 {
    /// A hash of nothing yet.
    pub fn new() -> Self {
        Sha256 {
            state: INIT,
            pending: [0; 64],
            pending_len: 0,
            len: 0,
        }
    }

    /// Hashes `data` after what came before.
    pub fn update(&mut self, mut data: &[u8]) {
        self.len = self.len.wrapping_add(data.len() as u64);
        if self.pending_len > 0 {
            let n = data.len().min(64 - self.pending_len);
            self.pending[self.pending_len..][..n].copy_from_slice(&data[..n]);
            self.pending_len += n;
            data = &data[n..];
            if self.pending_len < 64 {
                return;
            }
            sha2::block_api::compress256(&mut self.state, &[self.pending]);
            self.pending_len = 0;
        }
        let (blocks, tail) = data.as_chunks::<64>();
        sha2::block_api::compress256(&mut self.state, blocks);
        self.pending[..tail.len()].copy_from_slice(tail);
        self.pending_len = tail.len();
    }

    /// The digest of everything given.
    pub fn finalize(mut self) -> [u8; 32] {
        let n = self.pending_len;
        let mut last = [0u8; 128];
        last[..n].copy_from_slice(&self.pending[..n]);
        last[n] = 0x80;
        let blocks = if n < 56 { 1 } else { 2 };
        last[blocks * 64 - 8..blocks * 64].copy_from_slice(&self.len.wrapping_mul(8).to_be_bytes());
        let (last, _) = last[..blocks * 64].as_chunks::<64>();
        sha2::block_api::compress256(&mut self.state, last);
        let mut out = [0u8; 32];
        for (o, w) in out.chunks_exact_mut(4).zip(self.state) {
            o.copy_from_slice(&w.to_be_bytes());
        }
        out
    }
}

impl Md5 {
    /// Hashes `data` into this MD5 and into `sha`: in one pass over each whole block when
    /// the two have been fed the same bytes (as a file read through both is).
    pub fn update_with_sha256(&mut self, mut data: &[u8], sha: &mut Sha256) {
        if self.pending_len != sha.pending_len {
            self.update(data);
            sha.update(data);
            return;
        }
        if sha.pending_len > 0 {
            let n = data.len().min(64 - sha.pending_len);
            self.update(&data[..n]);
            sha.update(&data[..n]);
            data = &data[n..];
        }
        let (blocks, tail) = data.as_chunks::<64>();
        if !blocks.is_empty() {
            both(&mut self.state, &mut sha.state, blocks);
            let n = 64 * blocks.len() as u64;
            self.len = self.len.wrapping_add(n);
            sha.len = sha.len.wrapping_add(n);
        }
        self.update(tail);
        sha.update(tail);
    }
}

/// Whole blocks into both states, MD5 and SHA-256: in one pass, or one hash after the
/// other where the CPU has no SHA instructions.
fn both(md5: &mut [u32; 4], sha: &mut [u32; 8], blocks: &[[u8; 64]]) {
    #[cfg(target_arch = "x86_64")]
    if x86::usable() {
        // SAFETY: the CPU has the instructions.
        return unsafe { x86::both(md5, sha, blocks) };
    }
    portable(md5, sha, blocks);
}

fn portable(md5: &mut [u32; 4], sha: &mut [u32; 8], blocks: &[[u8; 64]]) {
    for block in blocks {
        crate::md5x::compress(md5, block);
        sha2::block_api::compress256(sha, std::slice::from_ref(block));
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use crate::md5x::md5_block;

    pub fn usable() -> bool {
        is_x86_feature_detected!("sha") && is_x86_feature_detected!("sse4.1")
    }

    /// The round constants.
    const K256: [u32; 64] = [
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
        0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
        0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
        0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
        0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
        0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
        0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
        0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2,
    ];

    /// MD5 and SHA-256 of the same blocks, SHA-256's rounds four at a time between MD5's
    /// steps. SHA-NI keeps the state as (A, B, E, F) and (C, D, G, H).
    #[target_feature(enable = "sha,sse2,ssse3,sse4.1")]
    pub unsafe fn both(md5: &mut [u32; 4], sha: &mut [u32; 8], blocks: &[[u8; 64]]) {
        // Big-endian words.
        let swap = _mm_set_epi64x(0x0c0d0e0f08090a0b, 0x0405060700010203);
        // SAFETY: `sha` is 8 words, read and written as two vectors unaligned.
        let (dcba, hgfe) = unsafe {
            (
                _mm_loadu_si128(sha.as_ptr().cast()),
                _mm_loadu_si128(sha.as_ptr().add(4).cast()),
            )
        };
        let cdab = _mm_shuffle_epi32(dcba, 0xB1);
        let efgh = _mm_shuffle_epi32(hgfe, 0x1B);
        let mut abef = _mm_alignr_epi8(cdab, efgh, 8);
        let mut cdgh = _mm_blend_epi16(efgh, cdab, 0xF0);
        for block in blocks {
            let (abef_in, cdgh_in) = (abef, cdgh);
            let p: *const __m128i = block.as_ptr().cast();
            // SAFETY: the block is 64 bytes: four unaligned vectors.
            let [mut w0, mut w1, mut w2, mut w3] = std::array::from_fn(|i| unsafe {
                _mm_shuffle_epi8(_mm_loadu_si128(p.add(i)), swap)
            });
            // Rounds 4q to 4q + 3, with the message words `$w` (from round 16 on, made from
            // the four words before them: `$w`, `$x`, `$y`, `$z` in order).
            macro_rules! rounds {
                ($q:literal, $w:ident, $x:ident, $y:ident, $z:ident) => {
                    if $q >= 4 {
                        let t = _mm_sha256msg1_epu32($w, $x);
                        let t = _mm_add_epi32(t, _mm_alignr_epi8($z, $y, 4));
                        $w = _mm_sha256msg2_epu32(t, $z);
                    }
                    // SAFETY: 4q + 3 < 64.
                    let k = unsafe { _mm_loadu_si128(K256.as_ptr().add(4 * $q).cast()) };
                    let wk = _mm_add_epi32($w, k);
                    cdgh = _mm_sha256rnds2_epu32(cdgh, abef, wk);
                    abef = _mm_sha256rnds2_epu32(abef, cdgh, _mm_shuffle_epi32(wk, 0x0E));
                };
            }
            // Each four rounds wait (in the compiler's eyes) for MD5's fourth step before them:
            // left to itself, it gathered them all after MD5's, where the core sees too few of
            // them at once to run them beside MD5's chain.
            macro_rules! sha_rounds {
                ($q:literal, $latest:ident) => {
                    // SAFETY: an empty template.
                    unsafe {
                        std::arch::asm!("/* {0} {1:e} */", inout(xmm_reg) cdgh, in(reg) $latest,
                            options(pure, nomem, nostack))
                    };
                    match $q % 4 {
                        0 => { rounds!($q, w0, w1, w2, w3); }
                        1 => { rounds!($q, w1, w2, w3, w0); }
                        2 => { rounds!($q, w2, w3, w0, w1); }
                        _ => { rounds!($q, w3, w0, w1, w2); }
                    }
                };
            }
            md5_block!(md5, block, sha_rounds);
            abef = _mm_add_epi32(abef, abef_in);
            cdgh = _mm_add_epi32(cdgh, cdgh_in);
        }
        let feba = _mm_shuffle_epi32(abef, 0x1B);
        let dchg = _mm_shuffle_epi32(cdgh, 0xB1);
        let dcba = _mm_blend_epi16(feba, dchg, 0xF0);
        let hgfe = _mm_alignr_epi8(dchg, feba, 8);
        // SAFETY: as the loads.
        unsafe {
            _mm_storeu_si128(sha.as_mut_ptr().cast(), dcba);
            _mm_storeu_si128(sha.as_mut_ptr().add(4).cast(), hgfe);
        }
    }
}

#[cfg(test)]
mod tests {
    use md5::Digest as _;

    use super::*;

    /// Both hashes against their reference crates, on lengths around the block and padding
    /// boundaries, fed whole and in pieces of every awkward size; and fed out of step.
    #[test]
    fn md5_and_sha256_together_match_the_reference_hashes() {
        for len in [0, 1, 55, 56, 63, 64, 65, 119, 120, 128, 1000, 4096, 100_003] {
            let data = crate::test_data(len, len as u64 + 7);
            let want_md5: [u8; 16] = md5::Md5::digest(&data).into();
            let want_sha: [u8; 32] = <sha2::Sha256 as sha2::Digest>::digest(&data).into();
            for piece in [1, 3, 63, 64, 65, 4096, 1 << 20] {
                let (mut md5, mut sha) = (Md5::new(), Sha256::new());
                for p in data.chunks(piece) {
                    md5.update_with_sha256(p, &mut sha);
                }
                assert_eq!(
                    md5.finalize(),
                    want_md5,
                    "MD5, length {len}, pieces of {piece}"
                );
                assert_eq!(
                    sha.finalize(),
                    want_sha,
                    "SHA-256, length {len}, pieces of {piece}"
                );
            }
            let mut sha = Sha256::new();
            for p in data.chunks(5) {
                sha.update(p);
            }
            assert_eq!(sha.finalize(), want_sha, "SHA-256 alone, length {len}");
            // Out of step: the SHA-256 was given the first 10 bytes before.
            if len >= 10 {
                let (mut md5, mut sha) = (Md5::new(), Sha256::new());
                sha.update(&data[..10]);
                md5.update(&data[..10]);
                for p in data[10..].chunks(100) {
                    md5.update_with_sha256(p, &mut sha);
                }
                assert_eq!(md5.finalize(), want_md5, "MD5 out of step, length {len}");
                assert_eq!(
                    sha.finalize(),
                    want_sha,
                    "SHA-256 out of step, length {len}"
                );
            }
        }
    }

    /// The one-pass kernel and the portable loop agree, where this CPU has the first.
    #[test]
    fn the_one_pass_kernel_matches_the_portable_one() {
        #[cfg(target_arch = "x86_64")]
        if x86::usable() {
            let data = crate::test_data(64 * 300, 11);
            let (blocks, _) = data.as_chunks::<64>();
            let (mut m1, mut s1) = (crate::md5x::INIT, INIT);
            let (mut m2, mut s2) = (crate::md5x::INIT, INIT);
            portable(&mut m1, &mut s1, blocks);
            // SAFETY: checked above.
            unsafe { x86::both(&mut m2, &mut s2, blocks) };
            assert_eq!((m1, s1), (m2, s2));
            return;
        }
        eprintln!("no SHA instructions here: only the portable loop runs");
    }
}
