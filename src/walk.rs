//! Walking trees: every regular file once, in a deterministic order, nothing followed.
//!
//! The walk streams: it holds only the directories on the current path, so memory stays flat
//! however many files a tree has. The one thing it remembers across the tree is the inodes
//! of files with several hard links, so each inode is hashed once per run.

use std::collections::HashSet;
use std::fmt;
use std::fs;
use std::ops::ControlFlow;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use ignore::WalkBuilder;
use ignore::overrides::OverrideBuilder;

/// The name of the per-directory ignore file (gitignore syntax).
pub const IGNORE_FILE: &str = ".intactignore";

/// How to walk.
#[derive(Clone, Debug, Default)]
pub struct WalkOptions {
    /// Stay on the file system of each root (`-x`).
    pub one_file_system: bool,
    /// Glob patterns (gitignore syntax) of paths to leave out.
    pub excludes: Vec<String>,
}

/// Why an entry is not hashed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SkipReason {
    /// Symbolic links are never followed.
    Symlink,
    /// FIFOs, sockets and device nodes have no data to protect.
    Special,
    /// Another link to an inode already processed in this run.
    HardLink,
    /// A temp file left by a run of intact that was killed (see [`crate::atomic`]).
    Leftover,
    /// A temp file a running intact is writing.
    Temporary,
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SkipReason::Symlink => "symbolic link, not followed",
            SkipReason::Special => "not a regular file",
            SkipReason::HardLink => "hard link to a file already processed",
            SkipReason::Leftover => "left by an interrupted run of intact",
            SkipReason::Temporary => "being written by a running intact",
        })
    }
}

/// One thing the walk found.
#[derive(Debug)]
pub enum Entry {
    /// A regular file to process.
    File {
        /// Its path, starting with its root's.
        path: PathBuf,
        /// Its size when walked.
        size: u64,
        /// The index of the root it was found under.
        root: usize,
    },
    /// Something deliberately not processed.
    Skip(PathBuf, SkipReason),
    /// A path that could not be examined (unreadable directory, vanished root ...).
    Error(PathBuf, std::io::Error),
}

/// Checks exclude patterns up front, so a typo is a usage error rather than a failed walk.
pub fn check_globs(globs: &[String]) -> Result<(), ignore::Error> {
    let mut builder = OverrideBuilder::new("/");
    for glob in globs {
        builder.add(&format!("!{glob}"))?;
    }
    builder.build().map(drop)
}

/// Walks `roots` in order, depth first with names sorted bytewise, calling `visit` for every
/// entry that is not a directory. Stops early when `visit` breaks.
pub fn walk(
    roots: &[PathBuf],
    opts: &WalkOptions,
    mut visit: impl FnMut(Entry) -> ControlFlow<()>,
) -> Result<(), ignore::Error> {
    let mut links = HashSet::new();
    for (index, root) in roots.iter().enumerate() {
        if walk_root(index, root, opts, &mut links, &mut visit)?.is_break() {
            break;
        }
    }
    Ok(())
}

fn walk_root(
    index: usize,
    root: &Path,
    opts: &WalkOptions,
    links: &mut HashSet<(u64, u64)>,
    visit: &mut impl FnMut(Entry) -> ControlFlow<()>,
) -> Result<ControlFlow<()>, ignore::Error> {
    // The walker would follow a symlink given as a root; intact never follows one.
    match fs::symlink_metadata(root) {
        Err(e) => return Ok(visit(Entry::Error(root.to_path_buf(), e))),
        Ok(m) if m.file_type().is_symlink() => {
            return Ok(visit(Entry::Skip(root.to_path_buf(), SkipReason::Symlink)));
        }
        Ok(_) => {}
    }
    let mut overrides = OverrideBuilder::new(root);
    for glob in &opts.excludes {
        overrides.add(&format!("!{glob}"))?;
    }
    let walker = WalkBuilder::new(root)
        .standard_filters(false)
        .add_custom_ignore_filename(IGNORE_FILE)
        .follow_links(false)
        .same_file_system(opts.one_file_system)
        .overrides(overrides.build()?)
        .sort_by_file_name(|a, b| a.cmp(b))
        .build();
    for item in walker {
        let entry = match item {
            Ok(entry) => entry,
            Err(err) => {
                let (path, io) = split_error(root, err);
                if visit(Entry::Error(path, io)).is_break() {
                    return Ok(ControlFlow::Break(()));
                }
                continue;
            }
        };
        let Some(kind) = entry.file_type() else {
            continue;
        };
        let path = entry.into_path();
        let found = if kind.is_dir() {
            continue;
        } else if kind.is_symlink() {
            Entry::Skip(path, SkipReason::Symlink)
        } else if kind.is_fifo()
            || kind.is_socket()
            || kind.is_block_device()
            || kind.is_char_device()
        {
            Entry::Skip(path, SkipReason::Special)
        } else {
            match fs::symlink_metadata(&path) {
                Err(e) => Entry::Error(path, e),
                Ok(m) if m.nlink() > 1 && !links.insert((m.dev(), m.ino())) => {
                    Entry::Skip(path, SkipReason::HardLink)
                }
                Ok(m) => Entry::File {
                    path,
                    size: m.len(),
                    root: index,
                },
            }
        };
        if visit(found).is_break() {
            return Ok(ControlFlow::Break(()));
        }
    }
    Ok(ControlFlow::Continue(()))
}

/// Pulls the path and the I/O error out of the walker's layered error type.
fn split_error(root: &Path, err: ignore::Error) -> (PathBuf, std::io::Error) {
    let mut path = root.to_path_buf();
    let mut err = err;
    loop {
        match err {
            ignore::Error::WithPath {
                path: p,
                err: inner,
            } => {
                path = p;
                err = *inner;
            }
            ignore::Error::WithDepth { err: inner, .. }
            | ignore::Error::WithLineNumber { err: inner, .. } => {
                err = *inner;
            }
            ignore::Error::Io(io) => return (path, io),
            other => return (path, std::io::Error::other(other.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(roots: &[PathBuf], opts: &WalkOptions) -> Vec<String> {
        let mut out = Vec::new();
        walk(roots, opts, |e| {
            out.push(match e {
                Entry::File { path, .. } => format!("file {}", path.display()),
                Entry::Skip(p, r) => format!("skip {} {r:?}", p.display()),
                Entry::Error(p, _) => format!("error {}", p.display()),
            });
            ControlFlow::Continue(())
        })
        .unwrap();
        out
    }

    #[test]
    fn sorted_hidden_included_links_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        fs::create_dir(d.join("sub")).unwrap();
        for name in ["b", ".hidden", "a", "sub/z", "sub/.x"] {
            fs::write(d.join(name), name).unwrap();
        }
        fs::hard_link(d.join("a"), d.join("c")).unwrap();
        std::os::unix::fs::symlink("a", d.join("link")).unwrap();
        std::os::unix::fs::symlink(".", d.join("loop")).unwrap();
        let got = collect(&[d.to_path_buf()], &WalkOptions::default());
        let d = d.display();
        assert_eq!(
            got,
            vec![
                format!("file {d}/.hidden"),
                format!("file {d}/a"),
                format!("file {d}/b"),
                format!("skip {d}/c HardLink"),
                format!("skip {d}/link Symlink"),
                format!("skip {d}/loop Symlink"),
                format!("file {d}/sub/.x"),
                format!("file {d}/sub/z"),
            ]
        );
    }

    #[test]
    fn excludes_and_ignore_file() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        fs::create_dir(d.join("cache")).unwrap();
        for name in ["keep", "x.tmp", "cache/y", "drop.bak"] {
            fs::write(d.join(name), name).unwrap();
        }
        fs::write(d.join(IGNORE_FILE), "*.bak\n").unwrap();
        let opts = WalkOptions {
            excludes: vec!["*.tmp".into(), "cache/".into()],
            ..Default::default()
        };
        let got = collect(&[d.to_path_buf()], &opts);
        let d = d.display();
        assert_eq!(
            got,
            vec![format!("file {d}/{IGNORE_FILE}"), format!("file {d}/keep")]
        );
    }

    #[test]
    fn root_symlink_and_missing_root() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::os::unix::fs::symlink("/", d.join("l")).unwrap();
        let got = collect(&[d.join("l"), d.join("missing")], &WalkOptions::default());
        assert_eq!(
            got,
            vec![
                format!("skip {}/l Symlink", d.display()),
                format!("error {}/missing", d.display())
            ]
        );
    }
}
