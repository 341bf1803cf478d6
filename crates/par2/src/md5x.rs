//! MD5, which PAR2 names for files, slices and packets. Many equal-length messages at once:
//! one message per SIMD lane (16 with AVX-512, 8 with AVX2), as every slice of a set needs
//! its own MD5; one MD5 stream is a chain of dependent steps that leaves most of a core idle,
//! and independent lanes fill it. A single message ([`Md5`]): scalar, with the part of each
//! step that does not wait for the previous one computed ahead (0.79 GB/s on Zen 4 against
//! 0.64 for the `md-5` crate, `examples/md5speed.rs`), able to hand each block to another
//! hash as it goes, or to compute a SHA-256 in the same pass ([`crate::sha256`]).

#![allow(unsafe_code)]

/// An MD5 digest: PAR2's IDs (of sets, files and packets) are MD5s.
pub type Id = [u8; 16];

/// The MD5 of each message. All messages must have the same length (a set's slices do).
pub fn digest_many(msgs: &[&[u8]]) -> Vec<Id> {
    #[cfg(target_arch = "x86_64")]
    if msgs.len() > 1 {
        if x86::has_avx512() {
            return x86::many(msgs, x86::Lanes::Avx512);
        }
        if is_x86_feature_detected!("avx2") {
            return x86::many(msgs, x86::Lanes::Avx2);
        }
    }
    portable(msgs)
}

/// Feeds each of `hashes` its piece of `pieces`, as [`Md5::update`] would one by one, many
/// at once where the pieces are of one length and the hashes equally far along (a set's
/// recovery packets, each hashed a strip at a time: 420 MB of them for five 800 MiB files at
/// 10%, which one core hashed alone between the passes).
pub fn update_many(hashes: &mut [Md5], pieces: &[&[u8]]) {
    assert_eq!(hashes.len(), pieces.len(), "a piece a hash");
    let in_step = pieces.iter().all(|p| p.len() == pieces[0].len())
        && hashes
            .iter()
            .all(|h| h.pending_len == hashes[0].pending_len);
    #[cfg(target_arch = "x86_64")]
    if hashes.len() > 1 && in_step {
        let lanes = if x86::has_avx512() {
            Some(x86::Lanes::Avx512)
        } else if is_x86_feature_detected!("avx2") {
            Some(x86::Lanes::Avx2)
        } else {
            None
        };
        if let Some(lanes) = lanes {
            // What completes each pending block, on its own; then the whole blocks, all the
            // hashes at once; what is left waits in each hash, as `update` leaves it.
            let len = pieces[0].len();
            let head = ((64 - hashes[0].pending_len) % 64).min(len);
            let blocks = (len - head) / 64;
            for (h, p) in hashes.iter_mut().zip(pieces) {
                h.update(&p[..head]);
            }
            let starts: Vec<*const u8> = pieces.iter().map(|p| p[head..].as_ptr()).collect();
            x86::blocks(hashes, &starts, blocks, lanes);
            for (h, p) in hashes.iter_mut().zip(pieces) {
                h.len = h.len.wrapping_add(blocks as u64 * 64);
                h.update(&p[head + blocks * 64..]);
            }
            return;
        }
    }
    for (h, p) in hashes.iter_mut().zip(pieces) {
        h.update(p);
    }
}

fn portable(msgs: &[&[u8]]) -> Vec<Id> {
    msgs.iter().map(|m| Md5::digest(m)).collect()
}

/// The MD5 of one message, fed piece by piece.
#[derive(Clone)]
pub struct Md5 {
    pub(crate) state: [u32; 4],
    /// The start of a block not yet complete.
    pending: [u8; 64],
    pub(crate) pending_len: usize,
    pub(crate) len: u64,
}

impl Default for Md5 {
    fn default() -> Self {
        Md5::new()
    }
}

impl Md5 {
    /// A hash of nothing yet.
    pub fn new() -> Self {
        Md5 {
            state: INIT,
            pending: [0; 64],
            pending_len: 0,
            len: 0,
        }
    }

    /// The MD5 of `data`.
    pub fn digest(data: &[u8]) -> Id {
        let mut h = Md5::new();
        h.update(data);
        h.finalize()
    }

    /// Hashes `data` after what came before.
    pub fn update(&mut self, data: impl AsRef<[u8]>) {
        self.update_along(data.as_ref(), &mut |_| {});
    }

    /// Hashes `data`, handing it to `along` piece by piece, each right after its block is
    /// hashed: the two hashes' instructions then interleave in the core (MD5 alone waits on
    /// its own latency chain). Together they see every byte once, in order.
    pub fn update_along(&mut self, mut data: &[u8], along: &mut dyn FnMut(&[u8])) {
        self.len = self.len.wrapping_add(data.len() as u64);
        if self.pending_len > 0 {
            let n = data.len().min(64 - self.pending_len);
            self.pending[self.pending_len..][..n].copy_from_slice(&data[..n]);
            self.pending_len += n;
            along(&data[..n]);
            data = &data[n..];
            if self.pending_len < 64 {
                return;
            }
            compress(&mut self.state, &self.pending);
            self.pending_len = 0;
        }
        let mut blocks = data.chunks_exact(64);
        for block in &mut blocks {
            compress(&mut self.state, block.try_into().expect("64 bytes"));
            along(block);
        }
        let tail = blocks.remainder();
        self.pending[..tail.len()].copy_from_slice(tail);
        self.pending_len = tail.len();
        along(tail);
    }

    /// The digest of everything given.
    pub fn finalize(mut self) -> Id {
        let (last, blocks) = final_blocks(&self.pending[..self.pending_len], self.len);
        for block in last[..blocks * 64].chunks_exact(64) {
            compress(&mut self.state, block.try_into().expect("64 bytes"));
        }
        let mut out = [0u8; 16];
        for (o, w) in out.chunks_exact_mut(4).zip(self.state) {
            o.copy_from_slice(&w.to_le_bytes());
        }
        out
    }
}

/// One block into the state.
#[inline(always)]
pub(crate) fn compress(state: &mut [u32; 4], block: &[u8; 64]) {
    macro_rules! nothing {
        ($quarter:literal, $latest:ident) => {};
    }
    md5_block!(state, block, nothing);
}

/// One MD5 block (`$block`, 64 bytes) into `$state`, invoking the macro `$between` after
/// each four of its 64 steps with their number (0 to 15) and the word the fourth made: another
/// hash's instructions placed there run while MD5 waits on its chain of dependent steps (see
/// [`crate::sha256`]).
macro_rules! md5_block {
    ($state:expr, $block:expr, $between:ident) => {{
        let block: &[u8; 64] = $block;
        let m: [u32; 16] = std::array::from_fn(|i| {
            u32::from_le_bytes(block[4 * i..][..4].try_into().expect("4"))
        });
        let [mut a, mut b, mut c, mut d] = *$state;
        // `a + m + k` does not depend on the step before: computed first, and kept apart
        // (the empty asm) so that the compiler does not fold the constant in after the
        // round function, on the chain every step waits for.
        macro_rules! step {
            ($a:ident, $b:ident, $c:ident, $d:ident, $i:expr, $s:expr, $f:expr) => {
                #[allow(unused_mut)]
                let mut early = $a
                    .wrapping_add(m[$crate::md5x::WORD[$i]])
                    .wrapping_add($crate::md5x::K[$i]);
                #[cfg(target_arch = "x86_64")]
                // SAFETY: an empty template: the value stays in its register, unchanged.
                unsafe {
                    std::arch::asm!("/* {0:e} */", inout(reg) early, options(pure, nomem, nostack))
                };
                $a = $b.wrapping_add(early.wrapping_add($f).rotate_left($s));
            };
        }
        // Four steps from step `4 * $q`; the rotations as literals (a rotation by a variable
        // is a slower instruction).
        macro_rules! four {
            ($q:literal, [$s0:expr, $s1:expr, $s2:expr, $s3:expr], $f:expr) => {
                step!(a, b, c, d, 4 * $q, $s0, $f(b, c, d));
                step!(d, a, b, c, 4 * $q + 1, $s1, $f(a, b, c));
                step!(c, d, a, b, 4 * $q + 2, $s2, $f(d, a, b));
                step!(b, c, d, a, 4 * $q + 3, $s3, $f(c, d, a));
                $between!($q, b);
            };
        }
        let f = |x: u32, y: u32, z: u32| z ^ (x & (y ^ z));
        let g = |x: u32, y: u32, z: u32| (y & !z).wrapping_add(x & z);
        let h = |x: u32, y: u32, z: u32| x ^ (y ^ z);
        let i = |x: u32, y: u32, z: u32| y ^ (x | !z);
        four!(0, [7, 12, 17, 22], f);
        four!(1, [7, 12, 17, 22], f);
        four!(2, [7, 12, 17, 22], f);
        four!(3, [7, 12, 17, 22], f);
        four!(4, [5, 9, 14, 20], g);
        four!(5, [5, 9, 14, 20], g);
        four!(6, [5, 9, 14, 20], g);
        four!(7, [5, 9, 14, 20], g);
        four!(8, [4, 11, 16, 23], h);
        four!(9, [4, 11, 16, 23], h);
        four!(10, [4, 11, 16, 23], h);
        four!(11, [4, 11, 16, 23], h);
        four!(12, [6, 10, 15, 21], i);
        four!(13, [6, 10, 15, 21], i);
        four!(14, [6, 10, 15, 21], i);
        four!(15, [6, 10, 15, 21], i);
        for (s, v) in $state.iter_mut().zip([a, b, c, d]) {
            *s = s.wrapping_add(v);
        }
    }};
}
pub(crate) use md5_block;

/// The additive constants, `floor(abs(sin(i + 1)) * 2^32)`.
pub(crate) const K: [u32; 64] = [
    0xd76aa478, 0xe8c7b756, 0x242070db, 0xc1bdceee, 0xf57c0faf, 0x4787c62a, 0xa8304613, 0xfd469501,
    0x698098d8, 0x8b44f7af, 0xffff5bb1, 0x895cd7be, 0x6b901122, 0xfd987193, 0xa679438e, 0x49b40821,
    0xf61e2562, 0xc040b340, 0x265e5a51, 0xe9b6c7aa, 0xd62f105d, 0x02441453, 0xd8a1e681, 0xe7d3fbc8,
    0x21e1cde6, 0xc33707d6, 0xf4d50d87, 0x455a14ed, 0xa9e3e905, 0xfcefa3f8, 0x676f02d9, 0x8d2a4c8a,
    0xfffa3942, 0x8771f681, 0x6d9d6122, 0xfde5380c, 0xa4beea44, 0x4bdecfa9, 0xf6bb4b60, 0xbebfbc70,
    0x289b7ec6, 0xeaa127fa, 0xd4ef3085, 0x04881d05, 0xd9d4d039, 0xe6db99e5, 0x1fa27cf8, 0xc4ac5665,
    0xf4292244, 0x432aff97, 0xab9423a7, 0xfc93a039, 0x655b59c3, 0x8f0ccc92, 0xffeff47d, 0x85845dd1,
    0x6fa87e4f, 0xfe2ce6e0, 0xa3014314, 0x4e0811a1, 0xf7537e82, 0xbd3af235, 0x2ad7d2bb, 0xeb86d391,
];

/// Each step's left rotation.
const S: [u32; 64] = {
    let per_round = [
        [7, 12, 17, 22],
        [5, 9, 14, 20],
        [4, 11, 16, 23],
        [6, 10, 15, 21],
    ];
    let mut s = [0; 64];
    let mut i = 0;
    while i < 64 {
        s[i] = per_round[i / 16][i % 4];
        i += 1;
    }
    s
};

/// Which message word each step adds.
pub(crate) const WORD: [usize; 64] = {
    let mut w = [0; 64];
    let mut i = 0;
    while i < 64 {
        w[i] = match i / 16 {
            0 => i,
            1 => (5 * i + 1) % 16,
            2 => (3 * i + 5) % 16,
            _ => (7 * i) % 16,
        };
        i += 1;
    }
    w
};

pub(crate) const INIT: [u32; 4] = [0x67452301, 0xefcdab89, 0x98badcfe, 0x10325476];

/// The padding MD5 appends to a message of `len` bytes whose last `tail.len()` bytes do not
/// fill a block: those bytes, 0x80, zeros, the length in bits; one or two blocks.
fn final_blocks(tail: &[u8], len: u64) -> ([u8; 128], usize) {
    let mut out = [0u8; 128];
    out[..tail.len()].copy_from_slice(tail);
    out[tail.len()] = 0x80;
    let blocks = if tail.len() < 56 { 1 } else { 2 };
    out[blocks * 64 - 8..blocks * 64].copy_from_slice(&(len.wrapping_mul(8)).to_le_bytes());
    (out, blocks)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::Id;
    use super::{INIT, K, S, WORD, final_blocks};

    #[derive(Clone, Copy, PartialEq, Debug)]
    pub enum Lanes {
        Avx512,
        Avx2,
    }

    pub fn has_avx512() -> bool {
        is_x86_feature_detected!("avx512f")
    }

    /// The caller checked that the CPU has `lanes`' instructions.
    pub fn many(msgs: &[&[u8]], lanes: Lanes) -> Vec<Id> {
        let width = match lanes {
            Lanes::Avx512 => 16,
            Lanes::Avx2 => 8,
        };
        let len = msgs[0].len();
        assert!(
            msgs.iter().all(|m| m.len() == len),
            "messages of one length"
        );
        let full = len / 64;
        let mut out = Vec::with_capacity(msgs.len());
        let mut tails = vec![[0u8; 128]; width];
        for group in msgs.chunks(width) {
            // Lanes past the end of the messages hash the first one again, unread.
            let mut starts = [0u64; 16];
            let mut tail_blocks = 0;
            for lane in 0..width {
                let m = group.get(lane).unwrap_or(&group[0]);
                starts[lane] = m.as_ptr() as u64;
                let (block, n) = final_blocks(&m[full * 64..], len as u64);
                tails[lane] = block;
                tail_blocks = n;
            }
            let mut tail_starts = [0u64; 16];
            for (lane, t) in tails.iter().enumerate() {
                tail_starts[lane] = t.as_ptr() as u64;
            }
            let mut state = INIT.map(|w| [w; 16]);
            // SAFETY: each lane's start has `full` whole blocks behind it (the message), each
            // tail start `tail_blocks` (its buffer); the CPU has the instructions (caller).
            unsafe {
                match lanes {
                    Lanes::Avx512 => {
                        avx512(&mut state, &starts, &tail_starts, full, tail_blocks);
                    }
                    Lanes::Avx2 => avx2(&mut state, &starts, &tail_starts, full, tail_blocks),
                }
            }
            for lane in 0..group.len() {
                let mut id = [0u8; 16];
                for (word, s) in state.iter().enumerate() {
                    id[word * 4..word * 4 + 4].copy_from_slice(&s[lane].to_le_bytes());
                }
                out.push(id);
            }
        }
        out
    }

    /// Feeds each of `hashes` the `blocks` whole blocks at its start in `starts`, `lanes` of
    /// them at a time. The caller checked that the CPU has `lanes`' instructions, and that
    /// each start has `blocks` blocks behind it.
    pub fn blocks(hashes: &mut [super::Md5], starts: &[*const u8], blocks: usize, lanes: Lanes) {
        let width = match lanes {
            Lanes::Avx512 => 16,
            Lanes::Avx2 => 8,
        };
        for (group, at) in hashes.chunks_mut(width).zip(starts.chunks(width)) {
            // Lanes past the end hash the first one's blocks again, and are not kept.
            let mut from = [0u64; 16];
            let mut state = [[0u32; 16]; 4];
            for lane in 0..width {
                from[lane] = *at.get(lane).unwrap_or(&at[0]) as u64;
                let h = group.get(lane).unwrap_or(&group[0]);
                for (word, s) in state.iter_mut().zip(h.state) {
                    word[lane] = s;
                }
            }
            // SAFETY: the caller's promises; no tail blocks are read.
            unsafe {
                match lanes {
                    Lanes::Avx512 => avx512(&mut state, &from, &from, blocks, 0),
                    Lanes::Avx2 => avx2(&mut state, &from, &from, blocks, 0),
                }
            }
            for (lane, h) in group.iter_mut().enumerate() {
                h.state = std::array::from_fn(|w| state[w][lane]);
            }
        }
    }

    /// MD5 of every lane: from its state in `state`, its `full` blocks from `starts`, then its
    /// `tail_blocks` padded blocks from `tail_starts`, into `state`, with the vector
    /// operations of the ISA the caller defines by name: `addrs` loads the lanes' addresses,
    /// `next` moves them one block on, `words` takes the words of each lane's block, `load`
    /// and `store` read and write a state word of every lane; `add`, the mixing functions `f`
    /// to `i`, `rotl` and `splat`.
    macro_rules! lanes {
        ($state:ident, $starts:ident, $tail_starts:ident, $full:ident, $tail_blocks:ident) => {{
            let (mut a, mut b, mut c, mut d) = (
                load(&$state[0]),
                load(&$state[1]),
                load(&$state[2]),
                load(&$state[3]),
            );
            for (from, blocks) in [($starts, $full), ($tail_starts, $tail_blocks)] {
                let (mut lo, mut hi) = addrs(from);
                for _ in 0..blocks {
                    // SAFETY: as the caller promised, each address has a whole block.
                    let m: [_; 16] = unsafe { words(lo, hi) };
                    let (a0, b0, c0, d0) = (a, b, c, d);
                    for step in 0..64 {
                        let mix = match step / 16 {
                            0 => f(b, c, d),
                            1 => g(b, c, d),
                            2 => h(b, c, d),
                            _ => i(b, c, d),
                        };
                        let t = add(add(a, mix), add(splat(K[step] as i32), m[WORD[step]]));
                        a = d;
                        d = c;
                        c = b;
                        b = add(b, rotl(t, S[step]));
                    }
                    a = add(a, a0);
                    b = add(b, b0);
                    c = add(c, c0);
                    d = add(d, d0);
                    (lo, hi) = (next(lo), next(hi));
                }
            }
            for (out, v) in $state.iter_mut().zip([a, b, c, d]) {
                store(out, v);
            }
        }};
    }

    /// 16 lanes: the mixing functions are one `vpternlogd` each, the rotation one `vprolvd`.
    #[target_feature(enable = "avx512f")]
    unsafe fn avx512(
        state: &mut [[u32; 16]; 4],
        starts: &[u64; 16],
        tail_starts: &[u64; 16],
        full: usize,
        tail_blocks: usize,
    ) {
        #[inline]
        #[target_feature(enable = "avx512f")]
        fn add(x: __m512i, y: __m512i) -> __m512i {
            _mm512_add_epi32(x, y)
        }
        #[inline]
        #[target_feature(enable = "avx512f")]
        fn f(x: __m512i, y: __m512i, z: __m512i) -> __m512i {
            _mm512_ternarylogic_epi32::<0xca>(x, y, z)
        }
        #[inline]
        #[target_feature(enable = "avx512f")]
        fn g(x: __m512i, y: __m512i, z: __m512i) -> __m512i {
            _mm512_ternarylogic_epi32::<0xe4>(x, y, z)
        }
        #[inline]
        #[target_feature(enable = "avx512f")]
        fn h(x: __m512i, y: __m512i, z: __m512i) -> __m512i {
            _mm512_ternarylogic_epi32::<0x96>(x, y, z)
        }
        #[inline]
        #[target_feature(enable = "avx512f")]
        fn i(x: __m512i, y: __m512i, z: __m512i) -> __m512i {
            _mm512_ternarylogic_epi32::<0x39>(x, y, z)
        }
        #[inline]
        #[target_feature(enable = "avx512f")]
        fn rotl(x: __m512i, s: u32) -> __m512i {
            _mm512_rolv_epi32(x, _mm512_set1_epi32(s as i32))
        }
        #[inline]
        #[target_feature(enable = "avx512f")]
        fn splat(x: i32) -> __m512i {
            _mm512_set1_epi32(x)
        }
        /// The 16 words of the block at each lane's address (addresses as 64-bit integers),
        /// word by word: each lane's block loaded whole and the 16 x 16 words transposed
        /// (64 shuffles). Gathering them took twice as long: a gather per 8 words, whose loads
        /// the core neither overlaps nor prefetches as well as plain ones.
        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn words(lo: __m512i, hi: __m512i) -> [__m512i; 16] {
            let mut at = [0u64; 16];
            // SAFETY: 16 u64 = two 512-bit stores; the caller's addresses point at whole
            // blocks; a prefetch never faults, wherever it points.
            let r: [__m512i; 16] = unsafe {
                _mm512_storeu_si512(at.as_mut_ptr().cast(), lo);
                _mm512_storeu_si512(at.as_mut_ptr().add(8).cast(), hi);
                std::array::from_fn(|l| {
                    let p = std::ptr::with_exposed_provenance::<i8>(at[l] as usize);
                    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(8 * 64));
                    _mm512_loadu_si512(p.cast())
                })
            };
            // Pairs of lanes' words interleaved, then pairs of pairs: u[4i + j] holds words
            // j, j + 4, j + 8, j + 12 (one per 128-bit quarter) of lanes 4i to 4i + 3.
            let t: [__m512i; 16] = std::array::from_fn(|k| {
                let (a, b) = (r[k & !1], r[k | 1]);
                if k % 2 == 0 {
                    _mm512_unpacklo_epi32(a, b)
                } else {
                    _mm512_unpackhi_epi32(a, b)
                }
            });
            let u: [__m512i; 16] = std::array::from_fn(|k| {
                let (i, j) = (k / 4, k % 4);
                let (a, b) = (t[4 * i + j / 2], t[4 * i + j / 2 + 2]);
                if j % 2 == 0 {
                    _mm512_unpacklo_epi64(a, b)
                } else {
                    _mm512_unpackhi_epi64(a, b)
                }
            });
            // Then the quarters gathered: word j + 4q is quarter q of u[j], u[4 + j],
            // u[8 + j], u[12 + j].
            let mut out = [_mm512_setzero_si512(); 16];
            for j in 0..4 {
                let x0 = _mm512_shuffle_i32x4::<0x88>(u[j], u[4 + j]);
                let x1 = _mm512_shuffle_i32x4::<0xdd>(u[j], u[4 + j]);
                let y0 = _mm512_shuffle_i32x4::<0x88>(u[8 + j], u[12 + j]);
                let y1 = _mm512_shuffle_i32x4::<0xdd>(u[8 + j], u[12 + j]);
                out[j] = _mm512_shuffle_i32x4::<0x88>(x0, y0);
                out[j + 8] = _mm512_shuffle_i32x4::<0xdd>(x0, y0);
                out[j + 4] = _mm512_shuffle_i32x4::<0x88>(x1, y1);
                out[j + 12] = _mm512_shuffle_i32x4::<0xdd>(x1, y1);
            }
            out
        }
        #[inline]
        #[target_feature(enable = "avx512f")]
        fn addrs(from: &[u64; 16]) -> (__m512i, __m512i) {
            // SAFETY: 16 u64 = two 512-bit loads.
            unsafe {
                (
                    _mm512_loadu_si512(from.as_ptr().cast()),
                    _mm512_loadu_si512(from.as_ptr().add(8).cast()),
                )
            }
        }
        #[inline]
        #[target_feature(enable = "avx512f")]
        fn next(v: __m512i) -> __m512i {
            _mm512_add_epi64(v, _mm512_set1_epi64(64))
        }
        #[inline]
        #[target_feature(enable = "avx512f")]
        fn load(word: &[u32; 16]) -> __m512i {
            // SAFETY: 16 u32 = one 512-bit load.
            unsafe { _mm512_loadu_si512(word.as_ptr().cast()) }
        }
        #[inline]
        #[target_feature(enable = "avx512f")]
        fn store(out: &mut [u32; 16], v: __m512i) {
            // SAFETY: 16 u32 = one 512-bit store.
            unsafe { _mm512_storeu_si512(out.as_mut_ptr().cast(), v) }
        }
        lanes!(state, starts, tail_starts, full, tail_blocks);
    }

    /// 8 lanes, with AVX2's shifts and logic.
    #[target_feature(enable = "avx2")]
    unsafe fn avx2(
        state: &mut [[u32; 16]; 4],
        starts: &[u64; 16],
        tail_starts: &[u64; 16],
        full: usize,
        tail_blocks: usize,
    ) {
        #[inline]
        #[target_feature(enable = "avx2")]
        fn add(x: __m256i, y: __m256i) -> __m256i {
            _mm256_add_epi32(x, y)
        }
        #[inline]
        #[target_feature(enable = "avx2")]
        fn f(x: __m256i, y: __m256i, z: __m256i) -> __m256i {
            _mm256_xor_si256(z, _mm256_and_si256(x, _mm256_xor_si256(y, z)))
        }
        #[inline]
        #[target_feature(enable = "avx2")]
        fn g(x: __m256i, y: __m256i, z: __m256i) -> __m256i {
            _mm256_xor_si256(y, _mm256_and_si256(z, _mm256_xor_si256(x, y)))
        }
        #[inline]
        #[target_feature(enable = "avx2")]
        fn h(x: __m256i, y: __m256i, z: __m256i) -> __m256i {
            _mm256_xor_si256(_mm256_xor_si256(x, y), z)
        }
        #[inline]
        #[target_feature(enable = "avx2")]
        fn i(x: __m256i, y: __m256i, z: __m256i) -> __m256i {
            let not_z = _mm256_xor_si256(z, _mm256_set1_epi32(-1));
            _mm256_xor_si256(y, _mm256_or_si256(x, not_z))
        }
        #[inline]
        #[target_feature(enable = "avx2")]
        fn rotl(x: __m256i, s: u32) -> __m256i {
            let left = _mm_cvtsi32_si128(s as i32);
            let right = _mm_cvtsi32_si128(32 - s as i32);
            _mm256_or_si256(_mm256_sll_epi32(x, left), _mm256_srl_epi32(x, right))
        }
        #[inline]
        #[target_feature(enable = "avx2")]
        fn splat(x: i32) -> __m256i {
            _mm256_set1_epi32(x)
        }
        /// As AVX-512's `words`: each lane's block loaded whole (two halves of 8 words)
        /// and each half's 8 x 8 words transposed (48 shuffles a block, where gathers
        /// took 32 gathers of 4 words: slow on AMD's cores).
        #[inline]
        #[target_feature(enable = "avx2")]
        unsafe fn words(lo: __m256i, hi: __m256i) -> [__m256i; 16] {
            let mut at = [0u64; 8];
            // SAFETY: 8 u64 = two 256-bit stores; the caller's addresses point at whole
            // blocks; a prefetch never faults, wherever it points.
            let r: [[__m256i; 2]; 8] = unsafe {
                _mm256_storeu_si256(at.as_mut_ptr().cast(), lo);
                _mm256_storeu_si256(at.as_mut_ptr().add(4).cast(), hi);
                std::array::from_fn(|l| {
                    let p = std::ptr::with_exposed_provenance::<__m256i>(at[l] as usize);
                    _mm_prefetch::<_MM_HINT_T0>(p.cast::<i8>().wrapping_add(8 * 64));
                    [_mm256_loadu_si256(p), _mm256_loadu_si256(p.add(1))]
                })
            };
            let mut out = [_mm256_setzero_si256(); 16];
            for h in 0..2 {
                // Pairs of lanes' words interleaved: t[2i + j] holds words 2j, 2j + 1 (and
                // 4 on, in the upper 128 bits) of lanes 2i, 2i + 1.
                let t: [__m256i; 8] = std::array::from_fn(|k| {
                    let (a, b) = (r[k & !1][h], r[k | 1][h]);
                    if k % 2 == 0 {
                        _mm256_unpacklo_epi32(a, b)
                    } else {
                        _mm256_unpackhi_epi32(a, b)
                    }
                });
                // Then pairs of pairs: u[4i + w] holds word w (and w + 4 above) of lanes
                // 4i to 4i + 3.
                let u: [__m256i; 8] = std::array::from_fn(|k| {
                    let (i, w) = (k / 4, k % 4);
                    let (a, b) = (t[4 * i + w / 2], t[4 * i + w / 2 + 2]);
                    if w % 2 == 0 {
                        _mm256_unpacklo_epi64(a, b)
                    } else {
                        _mm256_unpackhi_epi64(a, b)
                    }
                });
                for w in 0..4 {
                    out[8 * h + w] = _mm256_permute2x128_si256::<0x20>(u[w], u[4 + w]);
                    out[8 * h + w + 4] = _mm256_permute2x128_si256::<0x31>(u[w], u[4 + w]);
                }
            }
            out
        }
        #[inline]
        #[target_feature(enable = "avx2")]
        fn addrs(from: &[u64; 16]) -> (__m256i, __m256i) {
            // SAFETY: the first 8 u64 = two 256-bit loads.
            unsafe {
                (
                    _mm256_loadu_si256(from.as_ptr().cast()),
                    _mm256_loadu_si256(from.as_ptr().add(4).cast()),
                )
            }
        }
        #[inline]
        #[target_feature(enable = "avx2")]
        fn next(v: __m256i) -> __m256i {
            _mm256_add_epi64(v, _mm256_set1_epi64x(64))
        }
        #[inline]
        #[target_feature(enable = "avx2")]
        fn load(word: &[u32; 16]) -> __m256i {
            // SAFETY: the first 8 u32 = one 256-bit load.
            unsafe { _mm256_loadu_si256(word.as_ptr().cast()) }
        }
        #[inline]
        #[target_feature(enable = "avx2")]
        fn store(out: &mut [u32; 16], v: __m256i) {
            // SAFETY: the first 8 u32 = one 256-bit store.
            unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), v) }
        }
        lanes!(state, starts, tail_starts, full, tail_blocks);
    }
}

#[cfg(test)]
mod tests {
    use md5::Digest as _;

    use super::*;

    /// Every backend this CPU has (the scalar one among them), against the `md-5` crate, on
    /// lengths around the block and padding boundaries and counts around the lane widths.
    #[test]
    fn every_backend_matches_the_reference_md5() {
        type Backend = Box<dyn Fn(&[&[u8]]) -> Vec<Id>>;
        let mut backends: Vec<Backend> = vec![Box::new(portable), Box::new(digest_many)];
        #[cfg(target_arch = "x86_64")]
        {
            if x86::has_avx512() {
                backends.push(Box::new(|m| x86::many(m, x86::Lanes::Avx512)));
            }
            if is_x86_feature_detected!("avx2") {
                backends.push(Box::new(|m| x86::many(m, x86::Lanes::Avx2)));
            }
        }
        let mut seed = 1;
        for len in [
            0, 1, 3, 55, 56, 57, 63, 64, 65, 119, 120, 128, 1000, 4096, 4100,
        ] {
            for count in [1, 2, 7, 8, 9, 15, 16, 17, 33] {
                let data: Vec<Vec<u8>> = (0..count)
                    .map(|_| {
                        seed += 1;
                        crate::test_data(len, seed)
                    })
                    .collect();
                let msgs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
                let want: Vec<Id> = msgs.iter().map(|m| md5::Md5::digest(m).into()).collect();
                for (n, backend) in backends.iter().enumerate() {
                    assert_eq!(
                        backend(&msgs),
                        want,
                        "backend {n}, length {len}, {count} messages"
                    );
                }
            }
        }
    }

    /// Many hashes fed at once, as far along as each other or not, equal pieces or not: as
    /// each fed its piece alone; and each SIMD width this CPU has, fed whole blocks.
    #[test]
    fn many_hashes_fed_at_once_are_each_fed_alone() {
        let mut seed = 300;
        for before in [0, 1, 36, 63, 64, 100] {
            for len in [0, 1, 27, 28, 29, 64, 100, 1000] {
                for count in [1, 2, 15, 16, 17, 40] {
                    let mut pieces: Vec<Vec<u8>> = (0..count)
                        .map(|_| {
                            seed += 1;
                            crate::test_data(len, seed)
                        })
                        .collect();
                    let start: Vec<Md5> = (0..count)
                        .map(|i| {
                            let mut h = Md5::new();
                            h.update(crate::test_data(before, i as u64));
                            h
                        })
                        .collect();
                    for uneven in [false, true] {
                        if uneven && count > 1 {
                            pieces[1].push(7);
                        }
                        let refs: Vec<&[u8]> = pieces.iter().map(Vec::as_slice).collect();
                        let (mut many, mut alone) = (start.clone(), start.clone());
                        update_many(&mut many, &refs);
                        for (h, p) in alone.iter_mut().zip(&refs) {
                            h.update(p);
                        }
                        let ids =
                            |hs: Vec<Md5>| hs.into_iter().map(Md5::finalize).collect::<Vec<_>>();
                        assert_eq!(
                            ids(many),
                            ids(alone),
                            "{before} + {len} bytes, {count} hashes"
                        );
                    }
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        for (lanes, has) in [
            (x86::Lanes::Avx512, x86::has_avx512()),
            (x86::Lanes::Avx2, is_x86_feature_detected!("avx2")),
        ] {
            if !has {
                continue;
            }
            let data: Vec<Vec<u8>> = (0..20).map(|i| crate::test_data(640, 900 + i)).collect();
            let starts: Vec<*const u8> = data.iter().map(|d| d.as_ptr()).collect();
            let mut many = vec![Md5::new(); 20];
            x86::blocks(&mut many, &starts, 10, lanes);
            for (h, d) in many.iter_mut().zip(&data) {
                h.len = 640;
                assert_eq!(h.clone().finalize(), Md5::digest(d), "{lanes:?}");
            }
        }
    }

    /// The scalar MD5 fed in pieces of every size, against the `md-5` crate; what it hands
    /// along is the message, once, in order.
    #[test]
    fn the_streaming_md5_matches_the_reference_and_hands_every_byte_along() {
        let mut seed = 100;
        for len in [0, 1, 55, 56, 63, 64, 65, 127, 128, 129, 1000, 5000] {
            seed += 1;
            let data = crate::test_data(len, seed);
            let want: Id = md5::Md5::digest(&data).into();
            assert_eq!(Md5::digest(&data), want, "length {len}");
            for piece in [1, 3, 63, 64, 65, 200] {
                let mut h = Md5::new();
                let mut seen = Vec::new();
                for p in data.chunks(piece) {
                    h.update_along(p, &mut |b| seen.extend_from_slice(b));
                }
                assert_eq!(h.finalize(), want, "length {len}, pieces of {piece}");
                assert_eq!(seen, data, "length {len}, pieces of {piece}");
            }
        }
    }
}
