//! Which trees a running `intact watch` watches, and since when: a file beside the state
//! database per set of trees, locked (`flock`) for as long as the service lives, so that a
//! killed service is never shown as watching, and two never watch the same trees.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use rustix::fs::{FlockOperation, flock};
use sha2::Digest as _;

/// A running watch's hold on its trees: released when dropped (or the process dies).
pub struct Claim {
    _file: File,
}

/// A live watch, as [`watched`] finds it.
#[derive(Clone, Debug)]
pub struct Watched {
    /// Its trees (absolute).
    pub roots: Vec<PathBuf>,
    /// When it started (Unix milliseconds).
    pub since: i64,
    /// Its process.
    pub pid: u32,
    /// How it watches (fanotify, inotify).
    pub how: String,
}

/// The claim file of `roots` beside the database `db`.
fn path_of(db: &Path, roots: &[PathBuf]) -> PathBuf {
    let key = crate::state::roots_key(roots);
    let hash = hex::encode(&sha2::Sha256::digest(&key)[..8]);
    let mut name = db.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".watch-{hash}"));
    db.with_file_name(name)
}

/// Claims `roots` for this process, watching them `how`; fails if a live watch holds them.
pub fn claim(db: &Path, roots: &[PathBuf], how: &str) -> io::Result<Claim> {
    let path = path_of(db, roots);
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)?;
    if let Err(e) = flock(&file, FlockOperation::NonBlockingLockExclusive) {
        let other = read(&mut file).map_or(String::new(), |w| format!(" (pid {})", w.pid));
        return Err(match e {
            rustix::io::Errno::WOULDBLOCK => io::Error::other(format!(
                "another intact watch{other} is watching these trees already"
            )),
            e => e.into(),
        });
    }
    let mut text =
        format!("{}\n{}\n{}\n", std::process::id(), crate::state::now(), how).into_bytes();
    for root in roots {
        text.extend_from_slice(root.as_os_str().as_bytes());
        text.push(b'\n');
    }
    file.set_len(0)?;
    file.write_all(&text)?;
    Ok(Claim { _file: file })
}

fn read(file: &mut File) -> Option<Watched> {
    let mut text = Vec::new();
    file.read_to_end(&mut text).ok()?;
    let mut lines = text.split(|&b| b == b'\n');
    let mut next = || std::str::from_utf8(lines.next()?).ok().map(String::from);
    let pid = next()?.parse().ok()?;
    let since = next()?.parse().ok()?;
    let how = next()?;
    let roots = text
        .split(|&b| b == b'\n')
        .skip(3)
        .filter(|l| !l.is_empty())
        .map(|l| PathBuf::from(std::ffi::OsString::from_vec(l.to_vec())))
        .collect();
    Some(Watched {
        roots,
        since,
        pid,
        how,
    })
}

/// The live watches that recorded into the database `db` (a claim whose lock is free is a
/// service that died: not watching).
pub fn watched(db: &Path) -> Vec<Watched> {
    let (Some(dir), Some(name)) = (db.parent(), db.file_name()) else {
        return Vec::new();
    };
    let mut prefix = name.as_bytes().to_vec();
    prefix.extend_from_slice(b".watch-");
    let Ok(entries) = std::fs::read_dir(if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    }) else {
        return Vec::new();
    };
    let mut live = Vec::new();
    for e in entries.flatten() {
        if !e.file_name().as_bytes().starts_with(&prefix) {
            continue;
        }
        let Ok(mut file) = File::open(e.path()) else {
            continue;
        };
        if let Err(rustix::io::Errno::WOULDBLOCK) =
            flock(&file, FlockOperation::NonBlockingLockShared)
        {
            live.extend(read(&mut file));
        }
    }
    live.sort_by_key(|w| w.since);
    live
}
