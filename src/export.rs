//! `export`: a manifest that `sha256sum -c` (or `b3sum -c`) accepts, from the tags alone,
//! written as the engine reports each file: to standard output, or to a file put in place
//! only once it is whole.

use std::io::{self, BufWriter, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use crate::core::classify::Status;
use crate::core::manifest;
use crate::engine::FileReport;
use crate::fs::atomic::Temp;
use crate::sink::{Failure, Out, Sink};

/// Where the manifest's lines go.
pub struct Listing {
    roots: Vec<PathBuf>,
    to: To,
}

enum To {
    Stdout(BufWriter<io::Stdout>),
    /// A temp file beside the destination, put in its place when complete.
    File {
        temp: Option<Temp>,
        dest: PathBuf,
        out: BufWriter<std::fs::File>,
    },
}

impl Listing {
    /// A manifest of the files under `roots` (names relative to their root) on stdout.
    pub fn stdout(roots: &[PathBuf]) -> Listing {
        Listing {
            roots: roots.to_vec(),
            to: To::Stdout(BufWriter::new(io::stdout())),
        }
    }

    /// A manifest written to `dest`, atomically.
    pub fn file(roots: &[PathBuf], dest: PathBuf) -> io::Result<Listing> {
        if dest.file_name().is_none() {
            return Err(io::Error::other("the manifest needs a file name"));
        }
        let temp = Temp::beside(&dest)?;
        let out = BufWriter::new(temp.file().try_clone()?);
        Ok(Listing {
            roots: roots.to_vec(),
            to: To::File {
                temp: Some(temp),
                dest,
                out,
            },
        })
    }

    fn write(&mut self, bytes: &[u8]) -> Result<(), Failure> {
        let what = "writing the manifest";
        match &mut self.to {
            To::Stdout(out) => out
                .write_all(bytes)
                .map_err(|e| Failure::on_stdout(what, e)),
            To::File { out, .. } => out.write_all(bytes).map_err(|e| Failure::new(what, e)),
        }
    }
}

impl Sink for Listing {
    /// Lists a file whose tag still describes it: unchanged, or changed in size under the
    /// same mtime (the tag then holds the good data's digest, and the manifest should fail).
    fn take(&mut self, report: FileReport, out: &mut dyn Out) -> Result<(), Failure> {
        if let (Some(tag), Status::Ok | Status::Corrupt) = (&report.tag, report.status) {
            let rel = report.relative(&self.roots).as_os_str().as_bytes().to_vec();
            let line = manifest::format_line(&tag.digest, &rel);
            self.write(&line)?;
        }
        out.send(report);
        Ok(())
    }

    fn finish(&mut self, interrupted: bool, _out: &mut dyn Out) -> Result<(), Failure> {
        let failed = |e| Failure::new("writing the manifest", e);
        match &mut self.to {
            To::Stdout(out) => out
                .flush()
                .map_err(|e| Failure::on_stdout("writing the manifest", e)),
            // An unfinished manifest leaves nothing behind: the temp file goes with it.
            To::File { temp, dest, out } if !interrupted => {
                out.flush().map_err(failed)?;
                let name = dest.file_name().expect("checked when created");
                temp.take()
                    .expect("finished once")
                    .commit(name)
                    .map_err(failed)
            }
            To::File { temp, .. } => {
                temp.take();
                Ok(())
            }
        }
    }
}
