//! The multiplication at the heart of PAR2: slices times powers of their constants, added
//! into recovery slices over GF(2^16), shared among threads and cache-blocked.

use std::sync::Mutex;

use crate::{gf, lock};

/// Products (bytes of slice times recovery slices) below which a multiplication stays on
/// one thread: starting one costs about what 2 MB of products do (30 us), and sets of small
/// files are thousands of tiny multiplications.
const SHARED_WORK: usize = 64 << 20;

/// How many of `threads` a multiplication of `batch` into `out` is worth sharing among.
pub(crate) fn shared(out: &[gf::Buffer], batch: &[(gf::Buffer, u16)], threads: usize) -> usize {
    let work = out.len() * batch.iter().map(|(b, _)| b.len()).sum::<usize>();
    threads.min(work.div_ceil(SHARED_WORK)).max(1)
}

/// Adds each slice of `batch` (with its constant) into every recovery slice, the recovery
/// slices shared out among `threads`.
pub(crate) fn accumulate(recovery: &mut [gf::Buffer], batch: &[(gf::Buffer, u16)], threads: usize) {
    let exponents: Vec<u64> = (0..recovery.len() as u64).collect();
    multiply_into(recovery, &exponents, batch, threads);
}

/// Bytes of each slice worked on at a time: a recovery slice's piece stays in the L1 cache
/// while every input slice of the batch is added into it, four at a time, and the batch's
/// pieces stay in L2 (a batch of 100 slices of 8 KiB pieces nearly fills 1 MiB). Measured
/// on Zen 4 with buffers on cache lines (`examples/gfspeed.rs`, a slow day): 16 KiB 58 GB/s,
/// 8 KiB 63, 4 KiB 68.
const CHUNK: usize = 4 << 10;

/// Rows of `out` a thread takes at a time: small enough that threads finish together though
/// one of them shares its core with the reader of the next batch (halves given out up front
/// left a core idle a fifth of the time), large enough that the batch's pieces read into L2
/// serve many rows.
const ROWS_AT_A_TIME: usize = 8;

/// `out[r] ^= sum over the batch of c^exponents[r] * slice`, the rows of `out` taken
/// [`ROWS_AT_A_TIME`] at a time by `threads` threads, cache-blocked by [`CHUNK`]. Rows and
/// slices are in the native layout ([`gf::to_native`]).
pub(crate) fn multiply_into(
    out: &mut [gf::Buffer],
    exponents: &[u64],
    batch: &[(gf::Buffer, u16)],
    threads: usize,
) {
    if batch.is_empty() || out.is_empty() {
        return;
    }
    let multiply = |rows: &mut [gf::Buffer], exps: &[u64]| {
        let coefs: Vec<Vec<gf::Multiplier>> = exps
            .iter()
            .map(|&e| {
                let cs: Vec<u16> = batch.iter().map(|(_, c)| gf::pow(*c, e)).collect();
                gf::multipliers(&cs)
            })
            .collect();
        let len = rows[0].len();
        let mut srcs: Vec<&[u8]> = Vec::with_capacity(batch.len());
        for start in (0..len).step_by(CHUNK) {
            let end = (start + CHUNK).min(len);
            srcs.clear();
            srcs.extend(batch.iter().map(|(slice, _)| &slice[start..end]));
            for (row, coefs) in rows.iter_mut().zip(&coefs) {
                gf::mul_add_native_many(&mut row[start..end], &srcs, coefs);
            }
        }
    };
    let threads = shared(out, batch, threads);
    let groups = Mutex::new(
        out.chunks_mut(ROWS_AT_A_TIME)
            .zip(exponents.chunks(ROWS_AT_A_TIME)),
    );
    let work = || {
        loop {
            // Taken in a statement of its own: the lock is let go before the work.
            let next = lock(&groups).next();
            let Some((rows, exps)) = next else { break };
            multiply(rows, exps);
        }
    };
    // On the pool's threads, kept between multiplications: a thread started for each one
    // often began milliseconds late, the other core idle meanwhile (one 800 MiB file's set
    // used 1.25 cores of 2 and took 5.1 s; on the pool 1.52 and 4.4 s).
    match threads {
        1 => work(),
        _ => rayon_core::scope(|s| {
            for _ in 1..threads {
                s.spawn(|_| work());
            }
            work();
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_multiplication_shared_among_threads_is_the_one_made_on_one() {
        // Enough products (128 rows x 16 slices of 64 KiB) to be shared.
        let mut seed = 0x9e37_79b9_u32;
        let batch: Vec<(gf::Buffer, u16)> = gf::input_constants(16)
            .into_iter()
            .map(|c| {
                let mut slice = gf::Buffer::zeroed(64 << 10);
                for b in slice.iter_mut() {
                    seed ^= seed << 13;
                    seed ^= seed >> 17;
                    seed ^= seed << 5;
                    *b = seed as u8;
                }
                gf::to_native(&mut slice);
                (slice, c)
            })
            .collect();
        let rows = vec![gf::Buffer::zeroed(64 << 10); 128];
        assert_eq!(shared(&rows, &batch, 2), 2, "the work is shared");
        let (mut one, mut two) = (rows.clone(), rows);
        accumulate(&mut one, &batch, 1);
        accumulate(&mut two, &batch, 2);
        assert!(one.iter().all(|r| r.iter().any(|&b| b != 0)));
        assert!(one.iter().zip(&two).all(|(a, b)| **a == **b));
    }
}
