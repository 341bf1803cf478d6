//! The thread that writes an archive's compressed stream and starts each piece's writeback,
//! so that the fsync before any file is reported archived waits for the last piece only.

use std::fs::File;
use std::io::{self, Write};

use crossbeam_channel::{Receiver, Sender};

/// The compressed stream's writes to the archive, on a thread of their own, in 1 MiB
/// pieces, each sent on its way to the disk once written: the fsync that must come before
/// any file is reported archived then waits for the last piece only (five 800 MiB files:
/// 10-21 s before, 8.3-8.9 s after). The page-cache copies also leave the thread that builds
/// the members and feeds zstd (a third of its time on 20,000 files of 4 KiB), which every
/// other thread waits on.
pub(super) struct Spool {
    /// The bytes not yet handed over.
    pub(super) buf: Vec<u8>,
    pub(super) pieces: Option<Sender<Piece>>,
    /// Emptied pieces back from the thread, for reuse.
    pub(super) spare: Receiver<Vec<u8>>,
    /// The thread's answer to each flush: the first error since the last one.
    pub(super) flushed: Receiver<io::Result<()>>,
    pub(super) thread: Option<std::thread::JoinHandle<()>>,
    /// The archive file, for seeking and truncating while the thread waits (its descriptor
    /// shares this one's offset).
    pub(super) file: File,
}

pub(super) enum Piece {
    Bytes(Vec<u8>),
    Flush,
}

pub(super) fn spool_gone() -> io::Error {
    io::Error::other("the archive's writing thread stopped")
}

/// Bytes handed to the thread at a time.
pub(super) const SPOOL_PIECE: usize = 1 << 20;

impl Spool {
    pub(super) fn new(file: File) -> io::Result<Spool> {
        let mut out = file.try_clone()?;
        // Two pieces wait at most: the memory stays a few MiB whatever the disk's speed.
        let (pieces, rx) = crossbeam_channel::bounded::<Piece>(2);
        let (back, spare) = crossbeam_channel::unbounded();
        let (said, flushed) = crossbeam_channel::unbounded();
        let thread = std::thread::spawn(move || {
            let mut failed = None;
            for piece in rx {
                match piece {
                    Piece::Bytes(mut b) => {
                        if failed.is_none() {
                            match out.write_all(&b) {
                                // On its way to the disk while the rest is made: the
                                // archive's fsync at the end waits for the last piece only.
                                Ok(()) => crate::fs::sys::start_writeback(&out),
                                Err(e) => failed = Some(e),
                            }
                        }
                        b.clear();
                        let _ = back.send(b);
                    }
                    Piece::Flush => {
                        let _ = said.send(failed.take().map_or(Ok(()), Err));
                    }
                }
            }
        });
        Ok(Spool {
            buf: Vec::with_capacity(SPOOL_PIECE),
            pieces: Some(pieces),
            spare,
            flushed,
            thread: Some(thread),
            file,
        })
    }

    pub(super) fn send(&mut self, piece: Piece) -> io::Result<()> {
        self.pieces
            .as_ref()
            .ok_or_else(spool_gone)?
            .send(piece)
            .map_err(|_| spool_gone())
    }

    /// Hands over what is buffered.
    pub(super) fn hand_over(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let next = self
            .spare
            .try_recv()
            .unwrap_or_else(|_| Vec::with_capacity(SPOOL_PIECE));
        let full = std::mem::replace(&mut self.buf, next);
        self.send(Piece::Bytes(full))
    }

    /// The piece being filled, with room in it (a full one is handed over first): to be
    /// written into past its length.
    pub(super) fn room(&mut self) -> io::Result<&mut Vec<u8>> {
        if self.buf.len() >= SPOOL_PIECE {
            self.hand_over()?;
        }
        Ok(&mut self.buf)
    }

    /// Returns once the thread has written everything, with its first error since the last
    /// flush, if any.
    pub(super) fn flush(&mut self) -> io::Result<()> {
        self.hand_over()?;
        self.send(Piece::Flush)?;
        self.flushed.recv().map_err(|_| spool_gone())?
    }

    /// The archive file; everything written so far is in it once [`Spool::flush`] returned.
    pub(super) fn file(&mut self) -> &mut File {
        &mut self.file
    }

    /// Everything written, in the file, which is handed back.
    pub(super) fn into_file(mut self) -> io::Result<File> {
        self.flush()?;
        self.pieces = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.file.try_clone()
    }
}

impl Drop for Spool {
    fn drop(&mut self) {
        self.pieces = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
