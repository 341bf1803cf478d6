//! The small-file floors: what reading and hashing files costs with nothing else, for the
//! benchmark to compare `intact check` and `intact tag` against.
//!
//!     cargo run --release --example floor -- [--set | --same-work] THREADS DIR
//!
//! By default the files under DIR are listed first (timed, not in parallel), then THREADS
//! threads do, per file: open, fstat, fgetxattr, read, SHA-256, close; with `--set`, also
//! fsetxattr of `user.intact` with 62 bytes (a tag's size, not a valid tag).
//!
//! `--same-work` is the floor of a correct check: the walk runs beside the hashing threads
//! (getdents and a statx per entry, as intact's walk, which learns the size and the change
//! time it must compare after reading), and each file gets open, flistxattr (which tags it
//! has, as cshatag's and Dintch's formats live beside intact's), fgetxattr, read, SHA-256,
//! fstat (did it change while read?), close.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use rustix::fs::{Mode, OFlags, XattrFlags};
use sha2::{Digest, Sha256};

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mode = match args.first().map(String::as_str) {
        Some("--set" | "--same-work") => args.remove(0),
        _ => String::new(),
    };
    let [threads, dir] = &args[..] else {
        panic!("usage: floor [--set | --same-work] THREADS DIR");
    };
    let threads: usize = threads.parse().expect("THREADS");
    let start = Instant::now();
    let files = match mode.as_str() {
        "--same-work" => same_work(threads, Path::new(dir)),
        set => listed_first(threads, Path::new(dir), set == "--set"),
    };
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{files} files in {secs:.3} s: {:.0} files/s",
        files as f64 / secs
    );
}

/// Reads the file's `size` bytes into `buf` as they come (no read to confirm the end: the
/// fstat after tells a file that grew) and returns their SHA-256.
fn hash(fd: &rustix::fd::OwnedFd, buf: &mut [u8], size: u64) -> [u8; 32] {
    let mut hasher = Sha256::new();
    let mut done = 0;
    while done < size {
        let n = rustix::io::read(fd, &mut *buf).expect("read");
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        done += n as u64;
    }
    hasher.finalize().into()
}

fn open(path: &Path) -> rustix::fd::OwnedFd {
    rustix::fs::open(path, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()).expect("open")
}

fn listed_first(threads: usize, dir: &Path, set: bool) -> usize {
    let mut files = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
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
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                let mut buf = vec![0u8; 1 << 20];
                let mut value = [0u8; 128];
                while let Some(path) = files.get(next.fetch_add(1, Ordering::Relaxed)) {
                    let fd = open(path);
                    let st = rustix::fs::fstat(&fd).expect("fstat");
                    let _ = rustix::fs::fgetxattr(&fd, "user.intact", &mut value[..]);
                    let digest = hash(&fd, &mut buf, st.st_size as u64);
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
    files.len()
}

fn same_work(threads: usize, dir: &Path) -> usize {
    // Batches of paths, as intact's walk hands them to its workers.
    let (tx, rx) = crossbeam_channel::bounded::<Vec<(PathBuf, u64)>>(threads * 2);
    let files = AtomicUsize::new(0);
    std::thread::scope(|s| {
        s.spawn(move || {
            let mut dirs = vec![dir.to_path_buf()];
            let mut batch = Vec::with_capacity(64);
            while let Some(d) = dirs.pop() {
                for e in std::fs::read_dir(&d).expect("read_dir") {
                    let path = e.expect("entry").path();
                    let meta = std::fs::symlink_metadata(&path).expect("statx");
                    if meta.is_dir() {
                        dirs.push(path);
                    } else if meta.is_file() {
                        batch.push((path, meta.len()));
                        if batch.len() == 64 {
                            tx.send(std::mem::take(&mut batch)).expect("send");
                        }
                    }
                }
            }
            if !batch.is_empty() {
                tx.send(batch).expect("send");
            }
        });
        for _ in 0..threads {
            let rx = rx.clone();
            let files = &files;
            s.spawn(move || {
                let mut buf = vec![0u8; 1 << 20];
                let (mut names, mut value) = ([0u8; 256], [0u8; 128]);
                for batch in rx {
                    for (path, size) in &batch {
                        let fd = open(path);
                        let _ = rustix::fs::flistxattr(&fd, &mut names[..]);
                        let _ = rustix::fs::fgetxattr(&fd, "user.intact", &mut value[..]);
                        let digest = hash(&fd, &mut buf, *size);
                        let st = rustix::fs::fstat(&fd).expect("fstat");
                        std::hint::black_box((digest, st.st_size as u64 == *size));
                    }
                    files.fetch_add(batch.len(), Ordering::Relaxed);
                }
            });
        }
    });
    files.into_inner()
}
