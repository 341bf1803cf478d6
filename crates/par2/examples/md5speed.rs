//! Multi-buffer MD5 (`md5x::digest_many`) against the `md-5` crate, one message at a time:
//! `cargo run --release -p intact-par2 --example md5speed`.

use md5::{Digest as _, Md5};
fn main() {
    for (n, len) in [(64usize, 4096usize), (80, 409600), (8192, 4096)] {
        let data: Vec<Vec<u8>> = (0..n).map(|i| vec![i as u8; len]).collect();
        let msgs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
        let total = (n * len) as f64;
        for _ in 0..2 {
            let t = std::time::Instant::now();
            let a = intact_par2::md5x::digest_many(&msgs);
            let simd = t.elapsed().as_secs_f64();
            let t = std::time::Instant::now();
            let b: Vec<[u8; 16]> = msgs.iter().map(|m| Md5::digest(m).into()).collect();
            let scalar = t.elapsed().as_secs_f64();
            assert_eq!(a, b);
            println!(
                "{n} x {len}: many {:.2} GB/s, md-5 {:.2} GB/s",
                total / simd / 1e9,
                total / scalar / 1e9
            );
        }
    }
}
