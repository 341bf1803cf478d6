//! The small-file floor: what reading and hashing files costs with nothing else, for the
//! benchmark to compare `intact check` and `intact tag` against. Lists the files under DIR
//! first (not timed), then on THREADS threads does, per file: open, fstat, fgetxattr, read,
//! SHA-256, close; with `--set`, also fsetxattr of `user.intact` with 62 bytes (a tag's size, not a valid tag).
//!
//!     cargo run --release --example floor -- [--set] THREADS DIR

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use rustix::fs::{Mode, OFlags, XattrFlags};
use sha2::{Digest, Sha256};

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let set = args.first().is_some_and(|a| a == "--set");
    if set {
        args.remove(0);
    }
    let [threads, dir] = &args[..] else {
        panic!("usage: floor [--set] THREADS DIR");
    };
    let threads: usize = threads.parse().expect("THREADS");
    let mut files = Vec::new();
    let mut dirs = vec![PathBuf::from(dir)];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir") {
            let e = e.expect("entry");
            if e.file_type().expect("type").is_dir() {
                dirs.push(e.path());
            } else {
                files.push(e.path());
            }
        }
    }
    let next = AtomicUsize::new(0);
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                let mut buf = vec![0u8; 1 << 20];
                let mut value = [0u8; 128];
                while let Some(path) = files.get(next.fetch_add(1, Ordering::Relaxed)) {
                    let fd =
                        rustix::fs::open(path, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())
                            .expect("open");
                    let st = rustix::fs::fstat(&fd).expect("fstat");
                    let _ = rustix::fs::fgetxattr(&fd, "user.intact", &mut value[..]);
                    let mut hasher = Sha256::new();
                    let mut done = 0;
                    while done < st.st_size as usize {
                        let n = rustix::io::read(&fd, &mut buf[..]).expect("read");
                        if n == 0 {
                            break;
                        }
                        hasher.update(&buf[..n]);
                        done += n;
                    }
                    let digest = hasher.finalize();
                    if set {
                        value[..32].copy_from_slice(&digest);
                        rustix::fs::fsetxattr(
                            &fd,
                            "user.intact",
                            &value[..62],
                            XattrFlags::empty(),
                        )
                        .expect("fsetxattr");
                    }
                    std::hint::black_box(digest);
                }
            });
        }
    });
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{} files in {secs:.3} s: {:.0} files/s",
        files.len(),
        files.len() as f64 / secs
    );
}
