//! GF(2^16) with PAR2's generator polynomial 0x1100B, and the multiply-accumulate over whole
//! slices that all of PAR2's work comes down to.
//!
//! A slice is a run of little-endian 16-bit words. [`Multiplier::mul_add_native`] computes
//! `dst ^= c * src` word by word, on slices put in the kernels' layout first ([`to_native`]:
//! low and high bytes apart, 64 words a block). On x86-64 the product is four GFNI affine
//! transforms (AVX-512 or AVX2), else the XOR of four lookups in split nibble tables, one per
//! nibble, 32 or 16 bytes at a time with `pshufb` (AVX2, SSSE3). Elsewhere, two 256-entry
//! tables per constant.

#![allow(unsafe_code)]

use std::sync::OnceLock;

/// The field's generator polynomial, x^16 + x^12 + x^3 + x + 1.
pub const POLY: u32 = 0x1100B;
const ORDER: usize = 65535;

struct Tables {
    /// exp[i] = 2^i, for i in 0..2*ORDER (doubled so that log a + log b needs no modulo).
    exp: Vec<u16>,
    /// log[a] for a != 0.
    log: Vec<u16>,
}

fn tables() -> &'static Tables {
    static T: OnceLock<Tables> = OnceLock::new();
    T.get_or_init(|| {
        let mut exp = vec![0u16; 2 * ORDER];
        let mut log = vec![0u16; ORDER + 1];
        let mut x: u32 = 1;
        for (i, e) in exp.iter_mut().take(ORDER).enumerate() {
            *e = x as u16;
            log[x as usize] = i as u16;
            x <<= 1;
            if x & 0x10000 != 0 {
                x ^= POLY;
            }
        }
        for i in ORDER..2 * ORDER {
            exp[i] = exp[i - ORDER];
        }
        Tables { exp, log }
    })
}

/// a * b.
pub fn mul(a: u16, b: u16) -> u16 {
    if a == 0 || b == 0 {
        return 0;
    }
    let t = tables();
    t.exp[t.log[a as usize] as usize + t.log[b as usize] as usize]
}

/// 1 / a (a != 0).
pub fn inv(a: u16) -> u16 {
    assert!(a != 0, "zero has no inverse");
    let t = tables();
    t.exp[(ORDER - t.log[a as usize] as usize) % ORDER]
}

/// 2^n.
pub fn exp2(n: u64) -> u16 {
    tables().exp[(n % ORDER as u64) as usize]
}

/// a^n.
pub fn pow(a: u16, n: u64) -> u16 {
    if a == 0 {
        return if n == 0 { 1 } else { 0 };
    }
    let t = tables();
    let l = t.log[a as usize] as u64;
    t.exp[((l * (n % ORDER as u64)) % ORDER as u64) as usize]
}

/// The PAR2 constants of the first `count` input slices: 2^n for the successive n (from 1)
/// that share no factor with 65535, so that every constant has full order.
pub fn input_constants(count: usize) -> Vec<u16> {
    let mut out = Vec::with_capacity(count);
    let mut n: u64 = 0;
    while out.len() < count {
        n += 1;
        if !n.is_multiple_of(3)
            && !n.is_multiple_of(5)
            && !n.is_multiple_of(17)
            && !n.is_multiple_of(257)
        {
            out.push(exp2(n));
        }
    }
    out
}

/// The most input slices a set can have: the constants run out after this many.
pub const MAX_INPUT_SLICES: usize = 32768;

/// Bytes the kernels take at a time: buffers whose length is a multiple of this are
/// multiplied by them alone. A shorter tail goes word by word: the 104 bytes that end each
/// 400 KiB slice cost 2% of a large file's parity.
pub const BLOCK: usize = 128;

/// The multiply-accumulate kernels, the best this CPU has chosen once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kernel {
    /// GFNI's affine transforms on AVX-512, four sources at a time.
    Gfni512,
    /// GFNI on AVX2.
    Gfni256,
    /// Split nibble tables and `pshufb`, on AVX2.
    Shuffle256,
    /// The same on SSSE3.
    Shuffle128,
    /// Two 256-entry tables per constant, in the plain layout.
    Portable,
}

fn kernel() -> Kernel {
    static KERNEL: OnceLock<Kernel> = OnceLock::new();
    *KERNEL.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            if has!("gfni") && has!("avx512f") && has!("avx512bw") {
                return Kernel::Gfni512;
            }
            if has!("gfni") && has!("avx2") {
                return Kernel::Gfni256;
            }
            if has!("avx2") {
                return Kernel::Shuffle256;
            }
            if has!("ssse3") {
                return Kernel::Shuffle128;
            }
        }
        Kernel::Portable
    })
}

/// A constant prepared for [`Multiplier::mul_add_native`]: what its kernel needs (GFNI's
/// matrices, or the shuffles' nibble tables) is made once, not per call.
#[derive(Clone, Copy, Debug)]
pub struct Multiplier {
    c: u16,
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    affine: [i64; 4],
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    nibbles: [[u8; 16]; 8],
}

impl Multiplier {
    /// Prepares `c`.
    pub fn new(c: u16) -> Self {
        let (mut affine, mut nibbles) = ([0; 4], [[0; 16]; 8]);
        // Only what this CPU's kernel reads is made.
        match kernel() {
            Kernel::Gfni512 | Kernel::Gfni256 => affine = self::affine(c),
            #[cfg(target_arch = "x86_64")]
            Kernel::Shuffle256 | Kernel::Shuffle128 => nibbles = x86::nibble_tables(c),
            _ => {}
        }
        Multiplier { c, affine, nibbles }
    }

    /// `dst ^= c * src` on buffers in the native layout (see [`to_native`]): what the
    /// multiply-accumulate of a whole set uses, so that no call packs or unpacks bytes.
    pub fn mul_add_native(&self, dst: &mut [u8], src: &[u8]) {
        mul_add_native_many(dst, &[src], std::slice::from_ref(self))
    }

    /// As [`Multiplier::mul_add_native`], with `kernel` (not `Gfni512`'s many sources).
    fn apply(&self, kernel: Kernel, dst: &mut [u8], src: &[u8]) {
        match self.c {
            0 => return,
            1 => {
                for (d, s) in dst.iter_mut().zip(src) {
                    *d ^= s;
                }
                return;
            }
            _ => {}
        }
        // SAFETY: `kernel()` chose the kernel for features this CPU has.
        #[cfg(target_arch = "x86_64")]
        let done = unsafe {
            match kernel {
                Kernel::Gfni512 => x86::gfni512::<1>(dst, &[src], std::array::from_ref(self)),
                Kernel::Gfni256 => x86::gfni256(dst, src, self.affine),
                Kernel::Shuffle256 => x86::shuffle256(dst, src, &self.nibbles),
                Kernel::Shuffle128 => x86::shuffle128(dst, src, &self.nibbles),
                Kernel::Portable => 0,
            }
        };
        #[cfg(not(target_arch = "x86_64"))]
        let done = {
            let _ = kernel;
            0
        };
        // What is left is shorter than a block, and in the plain layout.
        if done < dst.len() {
            portable(&mut dst[done..], &src[done..], self.c)
        }
    }
}

/// `dst ^= sum of mults[k] * srcs[k]`, in the native layout: as [`Multiplier::mul_add_native`]
/// for each source, the kernel chosen once a call; where the CPU has GFNI and AVX-512, six at
/// a time while eight or more are left, then the rest in one or two calls: each call loads
/// and stores `dst` once, and a set's batches are about ten slices (4 + 4 + 2 took ×1.03 the
/// time of 6 + 4, `examples/gfspeed.rs`; six sources' 24 matrices and the sums fill the 32
/// vector registers, where eight measured no faster than four).
pub fn mul_add_native_many(dst: &mut [u8], srcs: &[&[u8]], mults: &[Multiplier]) {
    assert_eq!(srcs.len(), mults.len());
    assert!(dst.len().is_multiple_of(2), "slices are whole words");
    assert!(srcs.iter().all(|s| s.len() == dst.len()));
    let kernel = kernel();
    let mut k = 0;
    while k < srcs.len() {
        k += match (kernel, srcs.len() - k) {
            #[cfg(target_arch = "x86_64")]
            (Kernel::Gfni512, n) if n >= 8 || n == 6 => group::<6>(dst, &srcs[k..], &mults[k..]),
            #[cfg(target_arch = "x86_64")]
            (Kernel::Gfni512, n) if n >= 7 || n == 5 => group::<5>(dst, &srcs[k..], &mults[k..]),
            #[cfg(target_arch = "x86_64")]
            (Kernel::Gfni512, 4) => group::<4>(dst, &srcs[k..], &mults[k..]),
            #[cfg(target_arch = "x86_64")]
            (Kernel::Gfni512, 3) => group::<3>(dst, &srcs[k..], &mults[k..]),
            #[cfg(target_arch = "x86_64")]
            (Kernel::Gfni512, n) if n >= 2 => group::<2>(dst, &srcs[k..], &mults[k..]),
            _ => {
                mults[k].apply(kernel, dst, srcs[k]);
                1
            }
        };
    }
}

/// The first `N` of `srcs` multiplied into `dst` by the GFNI kernel; returns `N`.
#[cfg(target_arch = "x86_64")]
fn group<const N: usize>(dst: &mut [u8], srcs: &[&[u8]], mults: &[Multiplier]) -> usize {
    // References to the first N, not copies: arrays of sources and matrices passed by value
    // were copied at every call (2% of a large set's CPU in `memcpy`).
    let src: &[&[u8]; N] = srcs[..N].try_into().expect("N sources");
    let mults: &[Multiplier; N] = mults[..N].try_into().expect("N constants");
    // SAFETY: the caller detected the features; every source is as long as dst.
    let done = unsafe { x86::gfni512(dst, src, mults) };
    if done < dst.len() {
        for j in 0..N {
            portable(&mut dst[done..], &src[j][done..], mults[j].c);
        }
    }
    N
}

/// Bytes that start on a cache line: the kernels' 64-byte loads and stores then never
/// straddle two lines (a buffer from the allocator starts 16 bytes into one: the
/// multiplication ran 15% slower on Zen 4).
#[derive(Clone, Default)]
pub struct Buffer {
    lines: Vec<Line>,
    len: usize,
}

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

impl Buffer {
    /// `len` zero bytes.
    pub fn zeroed(len: usize) -> Buffer {
        let mut b = Buffer::default();
        b.resize(len);
        b
    }

    /// Grows (with zeros) or shrinks to `len` bytes.
    pub fn resize(&mut self, len: usize) {
        let old = self.len;
        self.lines.resize(len.div_ceil(64), Line([0; 64]));
        self.len = len;
        if len > old {
            // The line that held the old end may hold bytes of an earlier, longer use.
            let stale = (old.div_ceil(64) * 64).min(len);
            self[old..stale].fill(0);
        }
    }

    /// Replaces the bytes with `bytes`.
    pub fn copy_from(&mut self, bytes: &[u8]) {
        self.lines.resize(bytes.len().div_ceil(64), Line([0; 64]));
        self.len = bytes.len();
        self.copy_from_slice(bytes);
    }
}

impl std::ops::Deref for Buffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `lines` holds at least `len` initialized bytes (Line is plain bytes).
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr().cast(), self.len) }
    }
}

impl std::ops::DerefMut for Buffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `self` is borrowed mutably.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr().cast(), self.len) }
    }
}

/// Puts a slice in the layout the kernels work in: on x86-64 (with SSSE3, as every kernel
/// there needs), each 128-byte block holds the low bytes of its 64 words, then their high
/// bytes, so that no kernel packs and unpacks bytes at every multiplication (on AVX2 alone
/// that was a third of its work); a tail shorter than a block stays as it is. Elsewhere the
/// layout is the plain one. Multiplying is linear and this is a permutation of bytes, so
/// slices can be added up in it and put back after.
pub fn to_native(buf: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if kernel() != Kernel::Portable {
        x86::split(buf)
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = buf;
}

/// The inverse of [`to_native`].
pub fn from_native(buf: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if kernel() != Kernel::Portable {
        x86::unsplit(buf)
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = buf;
}

/// Which multiply-accumulate this CPU runs.
pub fn simd() -> &'static str {
    match kernel() {
        Kernel::Gfni512 => "gfni-avx512",
        Kernel::Gfni256 => "gfni-avx2",
        Kernel::Shuffle256 => "avx2",
        Kernel::Shuffle128 => "ssse3",
        Kernel::Portable => "portable",
    }
}

/// `dst ^= c * src` in the plain layout, word by word: a word at a time for a few words,
/// else two lookups per word in the products of `c` with every low byte and every high byte.
fn portable(dst: &mut [u8], src: &[u8], c: u16) {
    if dst.len() < 1024 {
        for (d, s) in dst.chunks_exact_mut(2).zip(src.chunks_exact(2)) {
            let p = mul(c, u16::from_le_bytes([s[0], s[1]]));
            d[0] ^= p as u8;
            d[1] ^= (p >> 8) as u8;
        }
        return;
    }
    let mut lo = [0u16; 256];
    let mut hi = [0u16; 256];
    for b in 0..256u16 {
        lo[b as usize] = mul(c, b);
        hi[b as usize] = mul(c, b << 8);
    }
    for (d, s) in dst.chunks_exact_mut(2).zip(src.chunks_exact(2)) {
        let p = lo[s[0] as usize] ^ hi[s[1] as usize];
        d[0] ^= p as u8;
        d[1] ^= (p >> 8) as u8;
    }
}

/// Multiplying by a constant is linear over GF(2): on the low and high bytes of a word it is
/// four 8x8 bit matrices (low to low, high to low, low to high, high to high), in the layout
/// of GF2P8AFFINEQB (the row for output bit i in byte 7 - i).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
/// The matrices of `c`, from a table of every constant's built once (2 MiB): a set's
/// multiplication prepares every coefficient of every batch in every pass (millions for a
/// large file), and building them took a twentieth of protect's time.
fn affine(c: u16) -> [i64; 4] {
    affine_table()[c as usize]
}

fn affine_table() -> &'static [[i64; 4]] {
    static TABLE: OnceLock<Box<[[i64; 4]]>> = OnceLock::new();
    TABLE.get_or_init(|| (0..=u16::MAX).map(affine_matrices).collect())
}

/// Prepares each of `cs`: the table's lines asked for all at once first (a batch's
/// coefficients are hundreds of lookups, each a miss in a table of 2 MiB, which the core
/// otherwise waited for one by one: four fifths of building them).
pub fn multipliers(cs: &[u16]) -> Vec<Multiplier> {
    #[cfg(target_arch = "x86_64")]
    if matches!(kernel(), Kernel::Gfni512 | Kernel::Gfni256) {
        let table = affine_table();
        for &c in cs {
            // SAFETY: a prefetch never faults; the address is inside the table.
            unsafe {
                use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
                _mm_prefetch::<_MM_HINT_T0>(table.as_ptr().add(c as usize).cast());
            }
        }
    }
    cs.iter().map(|&c| Multiplier::new(c)).collect()
}

fn affine_matrices(c: u16) -> [i64; 4] {
    // Column j of each matrix is the image of bit j: c times x^j, by doubling.
    let mut cols = [0u16; 16];
    let mut v = c as u32;
    for col in &mut cols {
        *col = v as u16;
        v <<= 1;
        if v & 0x10000 != 0 {
            v ^= POLY;
        }
    }
    // A matrix with column j in byte j, transposed (bit b of byte a <-> bit a of byte b),
    // holds row i in byte i; GF2P8AFFINEQB wants row i in byte 7 - i.
    let matrix = |cols: &[u16], shift: u32| {
        let mut x = cols.iter().enumerate().fold(0u64, |q, (j, &col)| {
            q | (((col >> shift) as u8 as u64) << (8 * j))
        });
        let t = (x ^ (x >> 7)) & 0x00AA_00AA_00AA_00AA;
        x ^= t ^ (t << 7);
        let t = (x ^ (x >> 14)) & 0x0000_CCCC_0000_CCCC;
        x ^= t ^ (t << 14);
        let t = (x ^ (x >> 28)) & 0x0000_0000_F0F0_F0F0;
        x ^= t ^ (t << 28);
        x.swap_bytes() as i64
    };
    let (lo, hi) = cols.split_at(8);
    [matrix(lo, 0), matrix(hi, 0), matrix(lo, 8), matrix(hi, 8)]
}

/// The kernels, all on the split layout of [`to_native`]: byte j of a block's first half and
/// byte j of its second are one word's low and high bytes. Each returns how many bytes (whole
/// blocks) it did; the caller does the rest.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Low bytes of each 128-byte block's words first, then the high bytes (in an order of
    /// SSE2's packing, the same for both halves).
    pub fn split(buf: &mut [u8]) {
        let done = buf.len() / 128 * 128;
        // SAFETY: SSE2 is part of x86-64; every load and store is within buf[..done].
        unsafe {
            let low = _mm_set1_epi16(0x00ff);
            for block in buf[..done].chunks_exact_mut(128) {
                let p = block.as_mut_ptr().cast::<__m128i>();
                let w: [__m128i; 8] = std::array::from_fn(|k| _mm_loadu_si128(p.add(k)));
                for k in 0..4 {
                    let (a, b) = (w[2 * k], w[2 * k + 1]);
                    let lo = _mm_packus_epi16(_mm_and_si128(a, low), _mm_and_si128(b, low));
                    let hi = _mm_packus_epi16(_mm_srli_epi16(a, 8), _mm_srli_epi16(b, 8));
                    _mm_storeu_si128(p.add(k), lo);
                    _mm_storeu_si128(p.add(4 + k), hi);
                }
            }
        }
    }

    /// The inverse of `split`.
    pub fn unsplit(buf: &mut [u8]) {
        let done = buf.len() / 128 * 128;
        // SAFETY: as in `split`.
        unsafe {
            for block in buf[..done].chunks_exact_mut(128) {
                let p = block.as_mut_ptr().cast::<__m128i>();
                let w: [__m128i; 8] = std::array::from_fn(|k| _mm_loadu_si128(p.add(k)));
                for k in 0..4 {
                    let (lo, hi) = (w[k], w[4 + k]);
                    _mm_storeu_si128(p.add(2 * k), _mm_unpacklo_epi8(lo, hi));
                    _mm_storeu_si128(p.add(2 * k + 1), _mm_unpackhi_epi8(lo, hi));
                }
            }
        }
    }

    /// For each nibble position k of a word and each nibble value v, the low and high bytes
    /// of c * (v << 4k): eight 16-byte tables for `pshufb`. Multiplying is linear, so entry v
    /// is the XOR of the products of v's bits, c times a power of x, taken for eight values
    /// at once in SSE2's lanes (a table is made for every coefficient of every pass: byte by
    /// byte it cost 3% of protect's time).
    pub fn nibble_tables(c: u16) -> [[u8; 16]; 8] {
        let mut x = [0u16; 16];
        let mut v = c as u32;
        for x in &mut x {
            *x = v as u16;
            v = (v << 1) ^ ((v >> 15) * super::POLY);
        }
        let mut t = [[0u8; 16]; 8];
        // SAFETY: SSE2 is part of x86-64; each store is one of `t`'s 16-byte tables.
        unsafe {
            // Lane v (of 8) is all ones where v has bit j.
            let bit = |j: i16| {
                let lanes = _mm_setr_epi16(0, 1, 2, 3, 4, 5, 6, 7);
                let b = _mm_set1_epi16(1 << j);
                _mm_cmpeq_epi16(_mm_and_si128(lanes, b), b)
            };
            let (m0, m1, m2) = (bit(0), bit(1), bit(2));
            let low = _mm_set1_epi16(0x00ff);
            for k in 0..4 {
                let b = |j: usize| _mm_set1_epi16(x[4 * k + j] as i16);
                let first = _mm_xor_si128(
                    _mm_xor_si128(_mm_and_si128(m0, b(0)), _mm_and_si128(m1, b(1))),
                    _mm_and_si128(m2, b(2)),
                );
                let second = _mm_xor_si128(first, b(3));
                let lo = _mm_packus_epi16(_mm_and_si128(first, low), _mm_and_si128(second, low));
                let hi = _mm_packus_epi16(_mm_srli_epi16(first, 8), _mm_srli_epi16(second, 8));
                _mm_storeu_si128(t[2 * k].as_mut_ptr().cast(), lo);
                _mm_storeu_si128(t[2 * k + 1].as_mut_ptr().cast(), hi);
            }
        }
        t
    }

    /// GFNI with AVX-512 for `N` sources at once: four affine transforms per source and the
    /// XORs, nothing else; `dst` is loaded and stored once per `N` products (the loads and
    /// stores, not the arithmetic, bound a kernel of one source).
    #[target_feature(enable = "avx512f,avx512bw,gfni")]
    pub unsafe fn gfni512<const N: usize>(
        dst: &mut [u8],
        src: &[&[u8]; N],
        mults: &[super::Multiplier; N],
    ) -> usize {
        let done = dst.len() / 128 * 128;
        // SAFETY: every load and store below is within dst/src[..done] (the caller gives
        // sources as long as dst); unaligned forms.
        unsafe {
            let m: [[__m512i; 4]; N] =
                std::array::from_fn(|k| mults[k].affine.map(|x| _mm512_set1_epi64(x)));
            let mut i = 0;
            while i < done {
                let dl = dst.as_mut_ptr().add(i);
                let dh = dst.as_mut_ptr().add(i + 64);
                let mut rl = _mm512_loadu_si512(dl.cast());
                let mut rh = _mm512_loadu_si512(dh.cast());
                for k in 0..N {
                    let lo = _mm512_loadu_si512(src[k].as_ptr().add(i).cast());
                    let hi = _mm512_loadu_si512(src[k].as_ptr().add(i + 64).cast());
                    let [ll, lh, hl, hh] = m[k];
                    rl = _mm512_ternarylogic_epi64::<0x96>(
                        rl,
                        _mm512_gf2p8affine_epi64_epi8::<0>(lo, ll),
                        _mm512_gf2p8affine_epi64_epi8::<0>(hi, lh),
                    );
                    rh = _mm512_ternarylogic_epi64::<0x96>(
                        rh,
                        _mm512_gf2p8affine_epi64_epi8::<0>(lo, hl),
                        _mm512_gf2p8affine_epi64_epi8::<0>(hi, hh),
                    );
                }
                _mm512_storeu_si512(dl.cast(), rl);
                _mm512_storeu_si512(dh.cast(), rh);
                i += 128;
            }
        }
        done
    }

    /// GFNI on 32 bytes at a time: four affine transforms (one per byte-to-byte matrix).
    #[target_feature(enable = "avx2,gfni")]
    pub unsafe fn gfni256(dst: &mut [u8], src: &[u8], matrices: [i64; 4]) -> usize {
        let done = dst.len() / 128 * 128;
        // SAFETY: every load and store below is within dst/src[..done]; unaligned forms.
        unsafe {
            let [ll, lh, hl, hh] = matrices.map(|x| _mm256_set1_epi64x(x));
            let mut i = 0;
            while i < done {
                for half in [0, 32] {
                    let s = src.as_ptr().add(i + half);
                    let (lo, hi) = (
                        _mm256_loadu_si256(s.cast()),
                        _mm256_loadu_si256(s.add(64).cast()),
                    );
                    let rl = _mm256_xor_si256(
                        _mm256_gf2p8affine_epi64_epi8::<0>(lo, ll),
                        _mm256_gf2p8affine_epi64_epi8::<0>(hi, lh),
                    );
                    let rh = _mm256_xor_si256(
                        _mm256_gf2p8affine_epi64_epi8::<0>(lo, hl),
                        _mm256_gf2p8affine_epi64_epi8::<0>(hi, hh),
                    );
                    let dl = dst.as_mut_ptr().add(i + half).cast::<__m256i>();
                    let dh = dst.as_mut_ptr().add(i + half + 64).cast::<__m256i>();
                    _mm256_storeu_si256(dl, _mm256_xor_si256(_mm256_loadu_si256(dl), rl));
                    _mm256_storeu_si256(dh, _mm256_xor_si256(_mm256_loadu_si256(dh), rh));
                }
                i += 128;
            }
        }
        done
    }

    /// Split nibble tables and byte shuffles, 32 words at a time: each word's product is the
    /// XOR of four lookups (one per nibble) in the low-byte tables and four in the high-byte
    /// ones.
    #[target_feature(enable = "avx2")]
    pub unsafe fn shuffle256(dst: &mut [u8], src: &[u8], t: &[[u8; 16]; 8]) -> usize {
        let done = dst.len() / 128 * 128;
        // SAFETY: every load and store below is within dst/src[..done]; unaligned forms.
        unsafe {
            let tab: [__m256i; 8] = std::array::from_fn(|k| {
                _mm256_broadcastsi128_si256(_mm_loadu_si128(t[k].as_ptr().cast()))
            });
            let nib = _mm256_set1_epi8(0x0f);
            let mut i = 0;
            while i < done {
                for half in [0, 32] {
                    let s = src.as_ptr().add(i + half);
                    let (lo, hi) = (
                        _mm256_loadu_si256(s.cast()),
                        _mm256_loadu_si256(s.add(64).cast()),
                    );
                    let n = [
                        _mm256_and_si256(lo, nib),
                        _mm256_and_si256(_mm256_srli_epi16(lo, 4), nib),
                        _mm256_and_si256(hi, nib),
                        _mm256_and_si256(_mm256_srli_epi16(hi, 4), nib),
                    ];
                    let look = |byte: usize| {
                        let q = |k: usize| _mm256_shuffle_epi8(tab[2 * k + byte], n[k]);
                        _mm256_xor_si256(_mm256_xor_si256(q(0), q(1)), _mm256_xor_si256(q(2), q(3)))
                    };
                    let dl = dst.as_mut_ptr().add(i + half).cast::<__m256i>();
                    let dh = dst.as_mut_ptr().add(i + half + 64).cast::<__m256i>();
                    _mm256_storeu_si256(dl, _mm256_xor_si256(_mm256_loadu_si256(dl), look(0)));
                    _mm256_storeu_si256(dh, _mm256_xor_si256(_mm256_loadu_si256(dh), look(1)));
                }
                i += 128;
            }
        }
        done
    }

    /// The same as `shuffle256`, 16 words at a time.
    #[target_feature(enable = "ssse3")]
    pub unsafe fn shuffle128(dst: &mut [u8], src: &[u8], t: &[[u8; 16]; 8]) -> usize {
        let done = dst.len() / 128 * 128;
        // SAFETY: every load and store below is within dst/src[..done]; unaligned forms.
        unsafe {
            let tab: [__m128i; 8] = std::array::from_fn(|k| _mm_loadu_si128(t[k].as_ptr().cast()));
            let nib = _mm_set1_epi8(0x0f);
            let mut i = 0;
            while i < done {
                for quarter in [0, 16, 32, 48] {
                    let s = src.as_ptr().add(i + quarter);
                    let (lo, hi) = (_mm_loadu_si128(s.cast()), _mm_loadu_si128(s.add(64).cast()));
                    let n = [
                        _mm_and_si128(lo, nib),
                        _mm_and_si128(_mm_srli_epi16(lo, 4), nib),
                        _mm_and_si128(hi, nib),
                        _mm_and_si128(_mm_srli_epi16(hi, 4), nib),
                    ];
                    let look = |byte: usize| {
                        let q = |k: usize| _mm_shuffle_epi8(tab[2 * k + byte], n[k]);
                        _mm_xor_si128(_mm_xor_si128(q(0), q(1)), _mm_xor_si128(q(2), q(3)))
                    };
                    let dl = dst.as_mut_ptr().add(i + quarter).cast::<__m128i>();
                    let dh = dst.as_mut_ptr().add(i + quarter + 64).cast::<__m128i>();
                    _mm_storeu_si128(dl, _mm_xor_si128(_mm_loadu_si128(dl), look(0)));
                    _mm_storeu_si128(dh, _mm_xor_si128(_mm_loadu_si128(dh), look(1)));
                }
                i += 128;
            }
        }
        done
    }
}

/// Solves `a * x = b` over the field for square, invertible `a` (row-major, n x n); returns
/// the inverse of `a`, or `None` if it is singular.
pub fn invert(mut a: Vec<Vec<u16>>) -> Option<Vec<Vec<u16>>> {
    let n = a.len();
    let mut inv_m: Vec<Vec<u16>> = (0..n)
        .map(|i| (0..n).map(|j| u16::from(i == j)).collect())
        .collect();
    for col in 0..n {
        let pivot = (col..n).find(|&r| a[r][col] != 0)?;
        a.swap(col, pivot);
        inv_m.swap(col, pivot);
        let f = inv(a[col][col]);
        for j in 0..n {
            a[col][j] = mul(a[col][j], f);
            inv_m[col][j] = mul(inv_m[col][j], f);
        }
        for r in 0..n {
            if r != col && a[r][col] != 0 {
                let f = a[r][col];
                for j in 0..n {
                    a[r][j] ^= mul(f, a[col][j]);
                    inv_m[r][j] ^= mul(f, inv_m[col][j]);
                }
            }
        }
    }
    Some(inv_m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn affine_matrices_are_the_bit_by_bit_definition() {
        // Row i of a matrix (byte 7 - i) has bit j set when bit i (of the low or high byte)
        // of c times bit j (of the low or high byte) is set.
        for c in 0..=u16::MAX {
            let q = affine_matrices(c);
            for (m, (from, to)) in [(0, 0), (8, 0), (0, 8), (8, 8)].into_iter().enumerate() {
                for i in 0..8 {
                    for j in 0..8 {
                        let want = (mul(c, 1 << (j + from)) >> (i + to)) & 1;
                        let got = (q[m] as u64 >> (8 * (7 - i) + j)) & 1;
                        assert_eq!(got, want as u64, "c {c} matrix {m} row {i} bit {j}");
                    }
                }
            }
        }
    }

    #[test]
    fn field_axioms_hold() {
        assert_eq!(exp2(0), 1);
        assert_eq!(exp2(16), (POLY ^ 0x10000) as u16);
        for a in [1u16, 2, 3, 0x1234, 0xffff, 0x8000] {
            assert_eq!(mul(a, inv(a)), 1);
            assert_eq!(pow(a, 65535), 1);
            for b in [0u16, 1, 7, 0xabcd] {
                assert_eq!(mul(a, b), mul(b, a));
                // Distributive over XOR.
                assert_eq!(mul(a, b ^ 0x5555), mul(a, b) ^ mul(a, 0x5555));
            }
        }
    }

    #[test]
    fn constants_skip_exponents_sharing_a_factor_with_65535() {
        let c = input_constants(6);
        assert_eq!(
            c,
            vec![exp2(1), exp2(2), exp2(4), exp2(7), exp2(8), exp2(11)]
        );
        let all = input_constants(MAX_INPUT_SLICES);
        let mut seen = std::collections::HashSet::new();
        assert!(
            all.iter().all(|c| seen.insert(*c)),
            "constants are distinct"
        );
    }

    #[test]
    fn buffers_start_on_a_cache_line_and_grow_with_zeros() {
        let mut b = Buffer::zeroed(100);
        assert_eq!(b.as_ptr() as usize % 64, 0);
        assert!(b.iter().all(|&x| x == 0));
        b.fill(0xee);
        // Shrunk then grown again: the bytes past the old end are zeros, not the old ones.
        b.resize(10);
        b.resize(130);
        assert_eq!(&b[..10], &[0xee; 10]);
        assert!(b[10..].iter().all(|&x| x == 0));
        b.copy_from(&[1, 2, 3]);
        assert_eq!(&b[..], &[1, 2, 3]);
        assert_eq!(b.as_ptr() as usize % 64, 0);
    }

    #[test]
    fn many_sources_at_once_match_one_at_a_time() {
        // Native layout: split on x86-64, plain elsewhere.
        let len = 4096 + 38;
        let srcs: Vec<Vec<u8>> = (0..14)
            .map(|k| {
                let mut s = crate::test_data(len, 77 + k);
                to_native(&mut s);
                s
            })
            .collect();
        let mults: Vec<Multiplier> = [
            0u16, 1, 2, 0x100b, 0xffff, 0x1234, 3, 0x8000, 5, 7, 9, 0x4321, 11, 0xfffe,
        ]
        .iter()
        .map(|&c| Multiplier::new(c))
        .collect();
        for count in 0..=14 {
            let refs: Vec<&[u8]> = srcs[..count].iter().map(Vec::as_slice).collect();
            let mut many = vec![0x5au8; len];
            mul_add_native_many(&mut many, &refs, &mults[..count]);
            let mut one = vec![0x5au8; len];
            for (s, m) in refs.iter().zip(&mults) {
                m.mul_add_native(&mut one, s);
            }
            assert_eq!(many, one, "{count} sources");
            // And against the definition, in the plain layout.
            let mut plain = vec![0x5au8; len];
            for (s, m) in srcs[..count].iter().zip(&mults) {
                let mut s = s.clone();
                from_native(&mut s);
                definition(&mut plain, &s, m.c);
            }
            // A buffer of one repeated byte is the same in both layouts.
            from_native(&mut many);
            assert_eq!(many, plain, "{count} sources, plain layout");
        }
    }

    /// The product by the definition, word by word.
    fn definition(dst: &mut [u8], src: &[u8], c: u16) {
        for (d, s) in dst.chunks_exact_mut(2).zip(src.chunks_exact(2)) {
            let p = mul(c, u16::from_le_bytes([s[0], s[1]])) ^ u16::from_le_bytes([d[0], d[1]]);
            d.copy_from_slice(&p.to_le_bytes());
        }
    }

    #[test]
    fn every_kernel_matches_the_definition() {
        let src = crate::test_data(4096 + 38, 0x9e3779b97f4a7c15);
        for c in [0u16, 1, 2, 0x100b, 0xffff, 0x1234, 0x8000] {
            let mut slow = vec![0x5au8; src.len()];
            definition(&mut slow, &src, c);
            for short in [0, 2, 200, 1500, src.len()] {
                let mut port = vec![0x5au8; short];
                portable(&mut port, &src[..short], c);
                assert_eq!(port, slow[..short], "portable, {short} bytes, c = {c:#x}");
            }
            let mut fast = vec![0x5au8; src.len()];
            let mut native = src.clone();
            to_native(&mut native);
            to_native(&mut fast);
            Multiplier::new(c).mul_add_native(&mut fast, &native);
            from_native(&mut fast);
            assert_eq!(fast, slow, "c = {c:#x} with {}", simd());
            #[cfg(target_arch = "x86_64")]
            {
                if kernel() == Kernel::Portable {
                    continue;
                }
                type KernelFn = unsafe fn(&mut [u8], &[u8], u16) -> usize;
                // SAFETY (all four): the caller's promise, passed on.
                unsafe fn gfni512(dst: &mut [u8], src: &[u8], c: u16) -> usize {
                    unsafe { x86::gfni512::<1>(dst, &[src], &[Multiplier::new(c)]) }
                }
                unsafe fn gfni256(dst: &mut [u8], src: &[u8], c: u16) -> usize {
                    unsafe { x86::gfni256(dst, src, affine_matrices(c)) }
                }
                unsafe fn shuffle256(dst: &mut [u8], src: &[u8], c: u16) -> usize {
                    unsafe { x86::shuffle256(dst, src, &x86::nibble_tables(c)) }
                }
                unsafe fn shuffle128(dst: &mut [u8], src: &[u8], c: u16) -> usize {
                    unsafe { x86::shuffle128(dst, src, &x86::nibble_tables(c)) }
                }
                let kernels: [(&str, bool, KernelFn); 4] = [
                    ("gfni512", kernel() == Kernel::Gfni512, gfni512),
                    (
                        "gfni256",
                        is_x86_feature_detected!("gfni") && is_x86_feature_detected!("avx2"),
                        gfni256,
                    ),
                    ("shuffle256", is_x86_feature_detected!("avx2"), shuffle256),
                    ("shuffle128", true, shuffle128),
                ];
                for (name, present, kernel) in kernels {
                    if !present {
                        eprintln!("{name}: not on this CPU");
                        continue;
                    }
                    let mut out = vec![0x5au8; src.len()];
                    to_native(&mut out);
                    // SAFETY: the CPU has the kernel's features (checked).
                    let done = unsafe { kernel(&mut out, &native, c) };
                    assert_eq!(done, src.len() / 128 * 128, "{name}: whole blocks");
                    portable(&mut out[done..], &native[done..], c);
                    from_native(&mut out);
                    assert_eq!(out, slow, "{name}, c = {c:#x}");
                }
            }
        }
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn nibble_tables_hold_the_products_of_each_nibble() {
        for c in (0..=u16::MAX).step_by(7).chain([0xffff, 0x8000]) {
            let t = x86::nibble_tables(c);
            for k in 0..4 {
                for v in 0..16u16 {
                    let p = mul(c, v << (4 * k));
                    assert_eq!(
                        [t[2 * k][v as usize], t[2 * k + 1][v as usize]],
                        p.to_le_bytes()
                    );
                }
            }
        }
    }

    #[test]
    fn the_native_layout_adds_up_like_the_plain_one() {
        for len in [0usize, 2, 126, 128, 256 + 6, 4096 + 130] {
            let bytes = |seed| crate::test_data(len, seed);
            let (a, b, start) = (bytes(1), bytes(2), bytes(3));
            let (ca, cb) = (0x1d3bu16, 0x8001u16);
            let mut want = start.clone();
            definition(&mut want, &a, ca);
            definition(&mut want, &b, cb);
            let (mut na, mut nb, mut acc) = (a.clone(), b.clone(), start.clone());
            for buf in [&mut na, &mut nb, &mut acc] {
                to_native(buf);
            }
            Multiplier::new(ca).mul_add_native(&mut acc, &na);
            Multiplier::new(cb).mul_add_native(&mut acc, &nb);
            from_native(&mut acc);
            assert_eq!(acc, want, "len {len}");
            from_native(&mut na);
            assert_eq!(na, a, "round trip, len {len}");
        }
    }

    #[test]
    fn inversion_solves() {
        let c = input_constants(5);
        // A Vandermonde-like PAR2 matrix: rows are exponents, columns constants.
        let a: Vec<Vec<u16>> = [0u64, 3, 9]
            .iter()
            .map(|&e| [c[0], c[2], c[4]].iter().map(|&k| pow(k, e)).collect())
            .collect();
        let inv_m = invert(a.clone()).unwrap();
        for (i, row) in a.iter().enumerate() {
            for j in 0..3 {
                let s = row
                    .iter()
                    .zip(&inv_m)
                    .fold(0, |s, (&x, r)| s ^ mul(x, r[j]));
                assert_eq!(s, u16::from(i == j));
            }
        }
        assert!(invert(vec![vec![1, 1], vec![1, 1]]).is_none());
    }
}
