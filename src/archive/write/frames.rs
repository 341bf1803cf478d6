//! The zstd frames of an archive: each cut at a member boundary, so that a reader can start
//! at any frame, compressed on the library's worker threads in jobs of a fixed size.

use std::io::{self, Write};

use super::spool::Spool;

/// The input of each zstd worker's job.
pub(super) const JOB_BYTES: u32 = 1 << 20;

/// zstd compression whose frames end and begin again on one context, so the worker threads
/// and their buffers carry on (a new encoder for each frame cost about 50 ms here). zstd
/// writes into the spool's piece itself: a copy through a buffer of its own was a third of
/// the copies on the thread that feeds zstd.
pub(super) struct FrameEncoder {
    pub(super) raw: zstd::stream::raw::Encoder<'static>,
    pub(super) out: Spool,
}

impl FrameEncoder {
    pub(super) fn new(out: Spool, level: i32, threads: u32) -> io::Result<Self> {
        use zstd::stream::raw::CParameter;
        let mut raw = zstd::stream::raw::Encoder::new(level)?;
        raw.set_parameter(CParameter::ChecksumFlag(true))?;
        if threads > 0 {
            raw.set_parameter(CParameter::NbWorkers(threads))?;
            // zstd's default job at level 3 is 8 MiB, and each worker holds its job's input
            // and output besides a pool of spares: 64 MB of RSS for two workers. Jobs of
            // 1 MiB (the smallest it takes is 512 KiB, which measured 4x slower) cost
            // 16 MB, compress (b), (c) and (d) to within 0.05% of the same size, as fast.
            raw.set_parameter(CParameter::JobSize(JOB_BYTES))?;
        }
        Ok(FrameEncoder { raw, out })
    }

    /// Ends the current frame; what is written next begins a new one.
    pub(super) fn end_frame(&mut self) -> io::Result<()> {
        use zstd::stream::raw::{Operation, OutBuffer};
        loop {
            let piece = self.out.room()?;
            let at = piece.len();
            let left = self
                .raw
                .finish(&mut OutBuffer::around_pos(piece, at), true)?;
            if left == 0 {
                break;
            }
        }
        self.raw.reinit()
    }

    /// The writer of the compressed stream.
    pub(super) fn inner(&mut self) -> &mut Spool {
        &mut self.out
    }

    /// Ends the last frame and hands back the writer.
    pub(super) fn finish(mut self) -> io::Result<Spool> {
        self.end_frame()?;
        Ok(self.out)
    }
}

impl Write for FrameEncoder {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        use zstd::stream::raw::{InBuffer, Operation, OutBuffer};
        let mut input = InBuffer::around(data);
        while input.pos() < data.len() {
            let piece = self.out.room()?;
            let at = piece.len();
            self.raw
                .run(&mut input, &mut OutBuffer::around_pos(piece, at))?;
        }
        Ok(data.len())
    }

    /// Passes the flush on, without making zstd cut its blocks short.
    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}
