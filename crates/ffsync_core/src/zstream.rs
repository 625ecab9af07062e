//! Shared compression contexts inside one batch (capability `BATCH_STREAM`): consecutive
//! records of a group are the flushed pieces of one zstd stream, so each record compresses
//! against the records before it in its group (the previous chunk of a JS bundle, the
//! `.js` twin of a `.mjs` file), yet still decodes to exactly its own bytes and is
//! verified on its own. A batch is cut into about one group per core, so compression
//! stays parallel.
//!
//! Decoding is bounded: a record decodes into a buffer of exactly its declared length
//! (more output is an error, nothing beyond it is written), nothing may stay pending in
//! the decoder after a record (it would spill into the next), and a frame asking for a
//! window over 2^WINDOW_LOG bytes is refused before anything is allocated.

use zstd::zstd_safe::{
    get_error_name, zstd_sys::ZSTD_EndDirective::ZSTD_e_flush, CCtx, CParameter, DCtx, DParameter, InBuffer, OutBuffer,
};

/// A group's window: every batch fits (2 MiB + 64 KiB), so a record can match any earlier
/// record of its group.
pub const WINDOW_LOG: u32 = 22;
/// Groups smaller than this are not worth a core of their own.
pub const MIN_GROUP_BYTES: u64 = 256 * 1024;

/// Cut items of these sizes into about one contiguous group per core (by bytes).
pub fn groups(sizes: &[u64]) -> Vec<(usize, usize)> {
    let total: u64 = sizes.iter().sum();
    let n = (total / MIN_GROUP_BYTES).clamp(1, rayon::current_num_threads().max(1) as u64);
    let per = total.div_ceil(n).max(1);
    let mut bounds = vec![0usize];
    let mut acc = 0u64;
    for (i, s) in sizes.iter().enumerate() {
        if acc >= per * bounds.len() as u64 && bounds.last() != Some(&i) {
            bounds.push(i);
        }
        acc += s;
    }
    bounds.push(sizes.len());
    bounds.windows(2).map(|w| (w[0], w[1])).filter(|(a, b)| a < b).collect()
}

/// The compressing side of one group.
pub struct GroupEncoder {
    level: i32,
    cctx: Option<CCtx<'static>>,
}

impl GroupEncoder {
    pub fn new(level: i32) -> Self {
        GroupEncoder { level, cctx: None }
    }

    /// Compress `data` as the group's next record, appending the flushed bytes to `out`.
    /// Some(true) if this record starts a stream, Some(false) if it continues one; None
    /// if compression failed or the result is over `limit` bytes: the caller sends the
    /// record another way, and the next record starts a new stream (`out` is restored).
    pub fn push(&mut self, data: &[u8], out: &mut Vec<u8>, limit: usize) -> Option<bool> {
        let start = self.cctx.is_none();
        if start {
            let mut c = CCtx::create();
            c.set_parameter(CParameter::CompressionLevel(self.level)).ok()?;
            c.set_parameter(CParameter::WindowLog(WINDOW_LOG)).ok()?;
            c.set_parameter(CParameter::ChecksumFlag(false)).ok()?;
            self.cctx = Some(c);
        }
        let base = out.len();
        let ok = (|| {
            let c = self.cctx.as_mut()?;
            out.reserve(zstd::zstd_safe::compress_bound(data.len()) + 64);
            let mut input = InBuffer::around(data);
            loop {
                let pos = out.len();
                let mut output = OutBuffer::around_pos(out, pos);
                let left = c.compress_stream2(&mut output, &mut input, ZSTD_e_flush).ok()?;
                if left == 0 && input.pos() == data.len() {
                    return Some(());
                }
                out.reserve(left.max(4096));
            }
        })();
        if ok.is_none() || out.len() - base > limit {
            out.truncate(base);
            self.cctx = None;
            return None;
        }
        Some(start)
    }
}

/// The decoding side of one batch: records in order, each starting or continuing a stream.
#[derive(Default)]
pub struct GroupDecoder {
    dctx: Option<DCtx<'static>>,
}

impl GroupDecoder {
    /// Decode one record into exactly `out` (its declared length).
    pub fn next(&mut self, start: bool, payload: &[u8], out: &mut [u8]) -> Result<(), String> {
        let err = |c| format!("does not decompress: {}", get_error_name(c));
        if start {
            let mut d = DCtx::create();
            d.set_parameter(DParameter::WindowLogMax(WINDOW_LOG)).map_err(err)?;
            self.dctx = Some(d);
        }
        let Some(d) = self.dctx.as_mut() else {
            return Err("continues a stream that was never started".into());
        };
        let want = out.len();
        let mut input = InBuffer::around(payload);
        let mut output = OutBuffer::around(out);
        loop {
            let (i0, o0) = (input.pos(), output.pos());
            d.decompress_stream(&mut output, &mut input).map_err(err)?;
            if input.pos() == payload.len() {
                break;
            }
            if input.pos() == i0 && output.pos() == o0 {
                return Err("decompresses to more than its declared length".into());
            }
        }
        if output.pos() != want {
            return Err(format!("decompresses to {} bytes, declared {want}", output.pos()));
        }
        let mut probe = [0u8; 1];
        let mut empty = InBuffer::around(&[]);
        let mut po = OutBuffer::around(&mut probe[..]);
        d.decompress_stream(&mut po, &mut empty).map_err(err)?;
        if po.pos() != 0 {
            return Err("decompresses to more than its declared length".into());
        }
        Ok(())
    }
}
