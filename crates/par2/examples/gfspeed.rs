//! The GF(2^16) multiply-accumulate as a large set's strip pass makes it, on one thread: a
//! batch of slices' strips (10 by default, of 54 KiB: a set of 2,000 slices of 400 KiB at
//! 10% in 12 MiB) into 200 recovery strips, eight rows at a time, cache-blocked by chunk
//! (`CHUNK` in mul.rs). `cargo run --release -p intact-par2 --example gfspeed [SOURCES]`.

use intact_par2::gf;
fn main() {
    let size = 55_296usize;
    let sources: usize = std::env::args()
        .nth(1)
        .map_or(10, |a| a.parse().expect("a count"));
    let slices: Vec<gf::Buffer> = (0..sources)
        .map(|i| {
            let mut b = gf::Buffer::zeroed(size);
            b.fill(i as u8 + 3);
            b
        })
        .collect();
    let mut rows: Vec<gf::Buffer> = (0..200).map(|_| gf::Buffer::zeroed(size)).collect();
    for chunk in [4usize << 10, 8 << 10, 4 << 10, 8 << 10] {
        let t = std::time::Instant::now();
        let reps = 20;
        for _ in 0..reps {
            for (g, group) in rows.chunks_mut(8).enumerate() {
                let coefs: Vec<Vec<gf::Multiplier>> = (0..group.len())
                    .map(|r| {
                        let e = (g * 8 + r) as u64 + 1;
                        let cs: Vec<u16> = (0..sources).map(|s| gf::pow(2 + s as u16, e)).collect();
                        gf::multipliers(&cs)
                    })
                    .collect();
                let mut srcs: Vec<&[u8]> = Vec::with_capacity(sources);
                for start in (0..size).step_by(chunk) {
                    let end = (start + chunk).min(size);
                    srcs.clear();
                    srcs.extend(slices.iter().map(|s| &s[start..end]));
                    for (row, coefs) in group.iter_mut().zip(&coefs) {
                        gf::mul_add_native_many(&mut row[start..end], &srcs, coefs);
                    }
                }
            }
        }
        let s = t.elapsed().as_secs_f64();
        println!(
            "{sources} sources, chunk {chunk}: {:.1} GB/s",
            (size * sources * 200 * reps) as f64 / s / 1e9
        );
    }
}
