//! The GF(2^16) multiply-accumulate of a large set (80 slices of 400 KiB into 100 recovery
//! slices, one thread): one source per pass against four, by chunk size (`CHUNK` in lib.rs).
//! `cargo run --release -p intact-par2 --example gfspeed`.

use intact_par2::gf;
fn main() {
    let size = 409_600usize;
    let slices: Vec<gf::Buffer> = (0..80)
        .map(|i| {
            let mut b = gf::Buffer::zeroed(size);
            b.fill(i as u8 + 3);
            b
        })
        .collect();
    let mut rows: Vec<gf::Buffer> = (0..100).map(|_| gf::Buffer::zeroed(size)).collect();
    let coefs: Vec<Vec<gf::Multiplier>> = (0..100u64)
        .map(|r| {
            (0..80u64)
                .map(|s| gf::Multiplier::new(gf::pow(2 + s as u16, r + 1)))
                .collect()
        })
        .collect();
    for many in [false, true, false, true] {
        for chunk in [16usize << 10, 8 << 10, 4 << 10] {
            let t = std::time::Instant::now();
            for start in (0..size).step_by(chunk) {
                let end = (start + chunk).min(size);
                for (row, coefs) in rows.iter_mut().zip(&coefs) {
                    if many {
                        let srcs: Vec<&[u8]> = slices.iter().map(|s| &s[start..end]).collect();
                        gf::mul_add_native_many(&mut row[start..end], &srcs, coefs);
                    } else {
                        for (slice, coef) in slices.iter().zip(coefs) {
                            coef.mul_add_native(&mut row[start..end], &slice[start..end]);
                        }
                    }
                }
            }
            let s = t.elapsed().as_secs_f64();
            println!(
                "many {many} chunk {chunk}: {:.1} GB/s",
                (size * 80 * 100) as f64 / s / 1e9
            );
        }
    }
}
