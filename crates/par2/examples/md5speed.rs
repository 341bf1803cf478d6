//! MD5 throughput: multi-buffer (`md5x::digest_many`) and scalar (`md5x::Md5`) against the
//! `md-5` crate, one message at a time; then one MD5 with a SHA-256 beside it, block by block
//! and in one pass (`sha256`): `cargo run --release -p intact-par2 --example md5speed`.

use intact_par2::{md5x, sha256};
use md5::{Digest as _, Md5};
fn main() {
    for (n, len) in [
        (64usize, 4096usize),
        (80, 409600),
        (8192, 4096),
        (1, 64 << 20),
    ] {
        let data: Vec<Vec<u8>> = (0..n).map(|i| vec![i as u8; len]).collect();
        let msgs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
        let total = (n * len) as f64;
        for _ in 0..2 {
            let t = std::time::Instant::now();
            let a = md5x::digest_many(&msgs);
            let simd = t.elapsed().as_secs_f64();
            let t = std::time::Instant::now();
            let b: Vec<[u8; 16]> = msgs.iter().map(|m| md5x::Md5::digest(m)).collect();
            let ours = t.elapsed().as_secs_f64();
            let t = std::time::Instant::now();
            let c: Vec<[u8; 16]> = msgs.iter().map(|m| Md5::digest(m).into()).collect();
            let crate_md5 = t.elapsed().as_secs_f64();
            assert!(a == c && b == c);
            println!(
                "{n} x {len}: many {:.2} GB/s, scalar {:.2} GB/s, md-5 {:.2} GB/s",
                total / simd / 1e9,
                total / ours / 1e9,
                total / crate_md5 / 1e9
            );
        }
    }
    let data = vec![7u8; 64 << 20];
    for _ in 0..3 {
        let t = std::time::Instant::now();
        let (mut md5, mut sha) = (md5x::Md5::new(), sha2::Sha256::new());
        for piece in data.chunks(1 << 20) {
            md5.update_along(piece, &mut |b| sha2::Digest::update(&mut sha, b));
        }
        let a = (md5.finalize(), sha.finalize());
        let along = t.elapsed().as_secs_f64();
        let t = std::time::Instant::now();
        let (mut md5, mut sha) = (md5x::Md5::new(), sha256::Sha256::new());
        for piece in data.chunks(1 << 20) {
            md5.update_with_sha256(piece, &mut sha);
        }
        let b = (md5.finalize(), sha.finalize());
        let one_pass = t.elapsed().as_secs_f64();
        assert!(a.0 == b.0 && a.1[..] == b.1[..]);
        println!(
            "1 x {}: MD5 and SHA-256 block by block {:.2} GB/s, in one pass {:.2} GB/s",
            data.len(),
            data.len() as f64 / along / 1e9,
            data.len() as f64 / one_pass / 1e9
        );
    }
}
