//! Chunk batches: the payload of a DATA frame. Several chunks per frame keep per-frame
//! overhead (and N-API crossings) low. Each record:
//! ```text
//! index u32 | encoding u8 | raw_len u32 | payload_len u32 | payload
//! ```
//! Encodings: 0 raw, 1 zstd, 2 delta (a librsync delta against the receiver's old region,
//! see [`crate::refine`]), 3 zstd delta (`delta_len u32` + zstd of the delta), 4 zstd
//! stream start and 5 zstd stream continued (capability `BATCH_STREAM`: consecutive
//! chunks of a batch share one zstd stream per group, see [`crate::zstream`]; the receiver
//! decodes them in order when it splits the batch), 6 and 7 the same for a delta, 8 and 9
//! a stream start (4, 6) whose history is the file's previous DATA frame (capability
//! `BATCH_PREFIX`: the batch compresses against the batch before it as well).
//! zstd is used only where it pays: a chunk that does not shrink by at least 1/32 is sent
//! raw, and after a run of incompressible chunks only chunks whose index is a multiple of 16
//! are tried (the miss counter is shared by the threads encoding a source), so random data
//! costs almost no compression CPU.

use crate::error::{CoreError, Result};
use crate::manifest::u32_at;
use crate::manifest::Manifest;
use rayon::prelude::*;
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};

pub const RECORD_HEADER: usize = 13;
pub const ENC_RAW: u8 = 0;
pub const ENC_ZSTD: u8 = 1;
pub const ENC_DELTA: u8 = 2;
pub const ENC_DELTA_ZSTD: u8 = 3;
pub const ENC_STREAM_START: u8 = 4;
pub const ENC_STREAM_CONT: u8 = 5;
/// A delta (`delta_len u32` + its bytes as the group's stream emitted them), starting or
/// continuing the group's stream (the same stream as encodings 4 and 5).
pub const ENC_DELTA_STREAM_START: u8 = 6;
pub const ENC_DELTA_STREAM_CONT: u8 = 7;
/// Stream starts (as 4 and 6) whose stream has the raw bytes of the previous DATA frame of
/// the same transfer as history (capability `BATCH_PREFIX`, [`decode_after`]).
pub const ENC_PREFIX_STREAM_START: u8 = 8;
pub const ENC_PREFIX_DELTA_STREAM_START: u8 = 9;
/// True for an encoding that opens a stream (with or without the previous frame).
fn starts_stream(encoding: u8) -> bool {
    matches!(
        encoding,
        ENC_STREAM_START | ENC_DELTA_STREAM_START | ENC_PREFIX_STREAM_START | ENC_PREFIX_DELTA_STREAM_START
    )
}
/// True for an encoding whose stream starts with the previous frame's bytes.
pub fn refers_to_previous(encoding: u8) -> bool {
    matches!(encoding, ENC_PREFIX_STREAM_START | ENC_PREFIX_DELTA_STREAM_START)
}
/// A delta is never worth more than its chunk; bound what a peer can make us decompress.
fn max_delta_len(raw_len: u32) -> usize {
    raw_len as usize + raw_len as usize / 8 + 1024
}
/// From this level a batch is one group, one zstd stream: each chunk compresses against
/// every chunk before it in the batch (a group per core saw only its own half). The governor
/// reaches such levels only while the link, not the encoder, is the bottleneck (or the user
/// pins one with `--compress-level`); the sender encodes two batches at once (`READ_AHEAD`),
/// or, for a file over 64 MiB the receiver lacks (early DATA), on a thread of its own beside
/// the scan, so both cores stay busy. Measured on the artifact release over 100 Mbit/s
/// (decisions §88; its files are under 64 MiB, so cold too is DATA answering NEED): about 1%
/// fewer bytes, no slower.
pub const ONE_GROUP_LEVEL: i32 = 8;
/// From this level a batch's stream starts with the previous batch's bytes as history
/// (`BATCH_PREFIX`). zstd indexes the history before the stream's first byte: with all of
/// the previous batch as history from level 6 (release A → B, decisions §89), 2.4% fewer bytes
/// at a pinned level 6 but 20% more sender CPU, and under the governor, where the encoder is
/// often the bottleneck at levels 6 and 7 (two streams a batch, each with the history), the
/// level settled lower and a cold copy sent more. From this level the link is the bottleneck.
pub const PREFIX_FROM_LEVEL: i32 = ONE_GROUP_LEVEL;
/// Of the previous frame's bytes, a stream's history is the last this many (or all of them,
/// when fewer). Most of the gain is in the nearest bytes, and zstd's cost of indexing the
/// history grows with it: release A → B at level 9, 1.6% fewer bytes with 1 MiB, 1.8% with
/// all 2 MiB; at level 19, 1.6% for 22% more sender CPU, 2.0% for 35% (decisions §89).
pub const HISTORY_BYTES: usize = 1 << 20;

/// The history a stream that refers to the previous frame starts with: the last
/// [`HISTORY_BYTES`] of `tail`, which ends with that frame's bytes.
pub fn history(tail: &[u8]) -> &[u8] {
    &tail[tail.len().saturating_sub(HISTORY_BYTES)..]
}

/// The chunks of the previous frame (`indices`, in its records' order) that hold its history:
/// the fewest last ones whose bytes cover [`HISTORY_BYTES`] (all of them when they do not).
pub fn history_chunks<'i>(indices: &'i [u32], manifest: &Manifest) -> &'i [u32] {
    let mut bytes = 0usize;
    for (k, &i) in indices.iter().enumerate().rev() {
        bytes += manifest.chunks.get(i as usize).map_or(0, |c| c.len as usize);
        if bytes >= HISTORY_BYTES {
            return &indices[k..];
        }
    }
    indices
}
/// The bytes of the previous frame's [`history_chunks`] as they sit at their offsets in `file`
/// (the sender's source, the receiver's partial), one after the other, and those chunks.
pub fn read_history_chunks<'i>(
    file: &std::fs::File,
    manifest: &Manifest,
    previous: &'i [u32],
) -> std::io::Result<(Vec<u8>, &'i [u32])> {
    let chunks = history_chunks(previous, manifest);
    let mut ranges = Vec::with_capacity(chunks.len());
    for &i in chunks {
        let c = manifest.chunks.get(i as usize).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("chunk index {i} out of range"),
            )
        })?;
        ranges.push((c.offset, c.len as usize));
    }
    let mut bytes = vec![0u8; ranges.iter().map(|r| r.1).sum()];
    let mut at = 0usize;
    for (offset, len) in ranges {
        crate::io::read_exact_at(file, &mut bytes[at..at + len], offset)?;
        at += len;
    }
    Ok((bytes, chunks))
}
const GIVE_UP_AFTER: u32 = 8;
const RETRY_EVERY: u32 = 16;

/// A record's slot for [`CompressPolicy::encode_groups`]: chunk index, slot, and the
/// length of a delta staged in it (None: the slot holds the chunk itself).
pub type GroupSlot<'a> = (u32, &'a mut [u8], Option<usize>);

/// Decides per chunk whether compression is worth trying.
pub struct CompressPolicy {
    level: AtomicI32,
    /// The peer decodes stream records (capability BATCH_STREAM).
    stream: bool,
    misses: AtomicU32,
}

impl CompressPolicy {
    /// `level` 0 disables compression.
    pub fn new(level: i32) -> Self {
        Self::with_stream(level, false)
    }

    /// With `stream`, chunks of a batch share zstd streams (encodings 4 and 5).
    pub fn with_stream(level: i32, stream: bool) -> Self {
        CompressPolicy {
            level: AtomicI32::new(level),
            stream,
            misses: AtomicU32::new(0),
        }
    }

    pub fn level(&self) -> i32 {
        self.level.load(Ordering::Relaxed)
    }

    /// The level for batches encoded from now on (the sender adapts it to the link).
    pub fn set_level(&self, level: i32) {
        self.level.store(level, Ordering::Relaxed);
    }

    /// True if chunks are left raw in their slots for [`Self::encode_groups`].
    pub fn streams(&self) -> bool {
        self.stream && self.level() != 0
    }

    fn worth_trying(&self, index: u32) -> bool {
        self.level() != 0 && (self.misses.load(Ordering::Relaxed) < GIVE_UP_AFTER || index % RETRY_EVERY == 0)
    }

    /// Encode chunks whose raw bytes sit in their slots (as for [`Self::encode_in_slot`]),
    /// consecutive ones sharing a zstd stream: about one group per core, each compressed in
    /// order, or one group for the whole batch from [`ONE_GROUP_LEVEL`]. A chunk that does not
    /// shrink by 1/32 goes raw (and the next one of its group starts a new stream). Returns
    /// each record's final length, in order.
    ///
    /// A slot given with `Some(delta_len)` holds `delta_len u32 | delta` instead of the
    /// chunk (see [`Self::stage_delta_in_slot`]): it goes as encoding 6/7, or as a plain delta.
    ///
    /// `prefix`: the raw bytes of the previous DATA frame (the receiver negotiated
    /// `BATCH_PREFIX`): every stream starts with them as history (encodings 8 and 9).
    pub fn encode_groups(&self, slots: &mut [GroupSlot<'_>], prefix: Option<&[u8]>) -> Vec<usize> {
        let sizes: Vec<u64> = slots
            .iter()
            .map(|(_, s, d)| d.unwrap_or(s.len() - RECORD_HEADER) as u64)
            .collect();
        let level = self.level();
        let ranges = if level >= ONE_GROUP_LEVEL {
            vec![(0, sizes.len())]
        } else {
            crate::zstream::groups(&sizes)
        };
        let mut parts: Vec<&mut [GroupSlot<'_>]> = Vec::with_capacity(ranges.len());
        let mut rest = slots;
        let mut at = 0;
        for (a, b) in ranges {
            let (_, tail) = rest.split_at_mut(a - at);
            let (g, tail) = tail.split_at_mut(b - a);
            parts.push(g);
            rest = tail;
            at = b;
        }
        let lens: Vec<Vec<usize>> = parts
            .into_par_iter()
            .map(|group| {
                // What the group's records may push: each stream declares the rest as its size.
                let bytes: u64 = group
                    .iter()
                    .map(|(_, s, d)| d.unwrap_or(s.len() - RECORD_HEADER) as u64)
                    .sum();
                let mut enc = match prefix {
                    Some(p) => crate::zstream::GroupEncoder::with_prefix(level, p),
                    None => crate::zstream::GroupEncoder::new(level),
                }
                .sized(bytes);
                let (start_enc, delta_start_enc) = if enc.has_prefix() {
                    (ENC_PREFIX_STREAM_START, ENC_PREFIX_DELTA_STREAM_START)
                } else {
                    (ENC_STREAM_START, ENC_DELTA_STREAM_START)
                };
                let mut z = Vec::new();
                group
                    .iter_mut()
                    .map(|(index, slot, delta)| {
                        let raw_len = slot.len() - RECORD_HEADER;
                        if let Some(dlen) = *delta {
                            z.clear();
                            let budget = raw_len.saturating_sub(8 + 4).min(dlen - dlen / 32);
                            let d = RECORD_HEADER + 4;
                            if let Some(start) = enc.push(&slot[d..d + dlen], &mut z, budget) {
                                slot[d..d + z.len()].copy_from_slice(&z);
                                let e = if start { delta_start_enc } else { ENC_DELTA_STREAM_CONT };
                                return write_header(slot, *index, e, raw_len, 4 + z.len());
                            }
                            slot.copy_within(d..d + dlen, RECORD_HEADER);
                            return write_header(slot, *index, ENC_DELTA, raw_len, dlen);
                        }
                        let (mut enc_byte, mut payload_len) = (ENC_RAW, raw_len);
                        if self.worth_trying(*index) {
                            z.clear();
                            match enc.push(&slot[RECORD_HEADER..], &mut z, raw_len - raw_len / 32 - 1) {
                                Some(start) => {
                                    self.misses.store(0, Ordering::Relaxed);
                                    slot[RECORD_HEADER..RECORD_HEADER + z.len()].copy_from_slice(&z);
                                    enc_byte = if start { start_enc } else { ENC_STREAM_CONT };
                                    payload_len = z.len();
                                }
                                None => {
                                    self.misses.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                        }
                        write_header(slot, *index, enc_byte, raw_len, payload_len)
                    })
                    .collect()
            })
            .collect();
        lens.into_iter().flatten().collect()
    }

    /// Encode chunk `index` whose raw bytes already sit in `slot[RECORD_HEADER..]`
    /// (`slot` is exactly RECORD_HEADER + raw length long). Compresses in place when it
    /// pays. Returns the record's final length (a prefix of `slot`).
    pub fn encode_in_slot(&self, index: u32, slot: &mut [u8]) -> usize {
        let raw_len = slot.len() - RECORD_HEADER;
        let try_it = self.worth_trying(index);
        let mut enc = ENC_RAW;
        let mut payload_len = raw_len;
        if try_it {
            let compressed = with_scratch(raw_len, |scratch| {
                let n = compress_with_thread_context(self.level(), &slot[RECORD_HEADER..], scratch)?;
                if n < raw_len - raw_len / 32 {
                    slot[RECORD_HEADER..RECORD_HEADER + n].copy_from_slice(&scratch[..n]);
                    Some(n)
                } else {
                    None
                }
            });
            match compressed {
                Some(n) => {
                    self.misses.store(0, Ordering::Relaxed);
                    enc = ENC_ZSTD;
                    payload_len = n;
                }
                None => {
                    self.misses.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        slot[0..4].copy_from_slice(&index.to_le_bytes());
        slot[4] = enc;
        slot[5..9].copy_from_slice(&(raw_len as u32).to_le_bytes());
        slot[9..13].copy_from_slice(&(payload_len as u32).to_le_bytes());
        RECORD_HEADER + payload_len
    }

    /// Stage `delta` in `slot` (as `delta_len u32 | delta`) for [`Self::encode_groups`] if it
    /// is smaller than the chunk; returns its length, or None (slot untouched) when the chunk
    /// should be sent as itself.
    pub fn stage_delta_in_slot(&self, delta: &[u8], slot: &mut [u8]) -> Option<usize> {
        let raw_len = slot.len() - RECORD_HEADER;
        if delta.len() + 4 > raw_len.saturating_sub(8) {
            return None;
        }
        slot[RECORD_HEADER..RECORD_HEADER + 4].copy_from_slice(&(delta.len() as u32).to_le_bytes());
        slot[RECORD_HEADER + 4..RECORD_HEADER + 4 + delta.len()].copy_from_slice(delta);
        Some(delta.len())
    }

    /// Encode chunk `index` as `delta` (a librsync delta of its raw bytes) into `slot`
    /// (RECORD_HEADER + raw length long) if that is smaller than the chunk (applying a
    /// delta is a copy, so any saving pays); the delta is zstd-compressed when that pays too. Returns None (slot untouched beyond
    /// the header area) when the chunk should be sent as itself.
    pub fn encode_delta_in_slot(&self, index: u32, delta: &[u8], slot: &mut [u8]) -> Option<usize> {
        let raw_len = slot.len() - RECORD_HEADER;
        let budget = raw_len.saturating_sub(8);
        let mut enc = ENC_DELTA;
        let mut payload_len = delta.len();
        if self.level() != 0 && delta.len() > 256 {
            let z = with_scratch(delta.len(), |scratch| {
                let n = compress_with_thread_context(self.level(), delta, scratch)?;
                (n + 4 < delta.len() - delta.len() / 32 && n + 4 <= budget).then(|| {
                    slot[RECORD_HEADER..RECORD_HEADER + 4].copy_from_slice(&(delta.len() as u32).to_le_bytes());
                    slot[RECORD_HEADER + 4..RECORD_HEADER + 4 + n].copy_from_slice(&scratch[..n]);
                    n + 4
                })
            });
            if let Some(n) = z {
                enc = ENC_DELTA_ZSTD;
                payload_len = n;
            }
        }
        if enc == ENC_DELTA {
            if delta.len() > budget {
                return None;
            }
            slot[RECORD_HEADER..RECORD_HEADER + delta.len()].copy_from_slice(delta);
        }
        slot[0..4].copy_from_slice(&index.to_le_bytes());
        slot[4] = enc;
        slot[5..9].copy_from_slice(&(raw_len as u32).to_le_bytes());
        slot[9..13].copy_from_slice(&(payload_len as u32).to_le_bytes());
        Some(RECORD_HEADER + payload_len)
    }

    /// A whole batch of raw-or-zstd records (chunk index, raw bytes), encoded on every core
    /// into one buffer: each chunk is copied once into its slot and compressed in place, then
    /// the records are packed down (as `ChunkSource::read_batch_into` does).
    pub fn encode_batch(&self, records: &[(u32, &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode_batch_into(records, &mut out);
        out
    }

    /// [`Self::encode_batch`] into `out`, whose memory is reused: a recycled buffer is
    /// neither zeroed again nor faulted in again. Every byte it ends with is written here
    /// (each slot gets its header and chunk before the records are packed), so nothing of
    /// its last batch survives.
    pub fn encode_batch_into(&self, records: &[(u32, &[u8])], out: &mut Vec<u8>) {
        let total: usize = records.iter().map(|(_, r)| RECORD_HEADER + r.len()).sum();
        if out.len() < total {
            out.resize(total, 0);
        } else {
            out.truncate(total);
        }
        let mut slots: Vec<&mut [u8]> = Vec::with_capacity(records.len());
        let mut rest = &mut out[..];
        for (_, raw) in records {
            let (slot, tail) = rest.split_at_mut(RECORD_HEADER + raw.len());
            slots.push(slot);
            rest = tail;
        }
        let used: Vec<usize> = if self.streams() {
            let mut indexed: Vec<GroupSlot<'_>> = slots
                .into_iter()
                .zip(records)
                .map(|(slot, &(index, raw))| {
                    slot[RECORD_HEADER..].copy_from_slice(raw);
                    (index, slot, None)
                })
                .collect();
            self.encode_groups(&mut indexed, None)
        } else {
            slots
                .par_iter_mut()
                .zip(records.par_iter())
                .map(|(slot, &(index, raw))| {
                    slot[RECORD_HEADER..].copy_from_slice(raw);
                    self.encode_in_slot(index, slot)
                })
                .collect()
        };
        let (mut write, mut read) = (0usize, 0usize);
        for (u, (_, raw)) in used.into_iter().zip(records) {
            out.copy_within(read..read + u, write);
            write += u;
            read += RECORD_HEADER + raw.len();
        }
        out.truncate(write);
    }

    /// Convenience for tests and small callers: append one encoded record to `out`.
    pub fn encode_record(&self, index: u32, raw: &[u8], out: &mut Vec<u8>) {
        let start = out.len();
        out.resize(start + RECORD_HEADER, 0);
        out.extend_from_slice(raw);
        let n = self.encode_in_slot(index, &mut out[start..]);
        out.truncate(start + n);
    }
}

fn write_header(slot: &mut [u8], index: u32, enc: u8, raw_len: usize, payload_len: usize) -> usize {
    slot[0..4].copy_from_slice(&index.to_le_bytes());
    slot[4] = enc;
    slot[5..9].copy_from_slice(&(raw_len as u32).to_le_bytes());
    slot[9..13].copy_from_slice(&(payload_len as u32).to_le_bytes());
    RECORD_HEADER + payload_len
}

// Per-thread zstd contexts and scratch space: creating a context or touching fresh
// memory per chunk costs more than compressing it (page faults are expensive).
thread_local! {
    static CCTX: std::cell::RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> = const { std::cell::RefCell::new(None) };
    static DCTX: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { std::cell::RefCell::new(None) };
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        if s.len() < len {
            s.resize(len, 0);
        }
        f(&mut s[..len])
    })
}

/// Compress into `dst`; None if it does not fit (i.e. does not shrink) or fails.
fn compress_with_thread_context(level: i32, src: &[u8], dst: &mut [u8]) -> Option<usize> {
    CCTX.with(|c| {
        let mut c = c.borrow_mut();
        if c.as_ref().map(|(l, _)| *l) != Some(level) {
            let mut fresh = zstd::bulk::Compressor::new(level).ok()?;
            for p in crate::zstream::table_caps(level) {
                fresh.set_parameter(*p).ok()?;
            }
            *c = Some((level, fresh));
        }
        c.as_mut()?.1.compress_to_buffer(src, dst).ok()
    })
}

/// Decompress exactly `dst.len()` bytes.
pub fn decompress_exact(src: &[u8], dst: &mut [u8]) -> std::result::Result<(), String> {
    DCTX.with(|d| {
        let mut d = d.borrow_mut();
        if d.is_none() {
            *d = Some(zstd::bulk::Decompressor::new().map_err(|e| e.to_string())?);
        }
        let n = d
            .as_mut()
            .unwrap()
            .decompress_to_buffer(src, dst)
            .map_err(|e| e.to_string())?;
        if n == dst.len() {
            Ok(())
        } else {
            Err(format!("decompressed to {n} bytes, expected {}", dst.len()))
        }
    })
}

/// One record of a batch: the chunk index and its payload as sent.
pub struct Record<'a> {
    pub index: u32,
    pub encoding: u8,
    pub payload: &'a [u8],
    pub raw_len: u32,
    /// A stream record's bytes, decoded (in order) when the batch was split.
    pub inflated: Option<Vec<u8>>,
}

impl Record<'_> {
    /// True if the payload is (or decompresses to) the chunk's bytes; false for deltas.
    pub fn is_delta(&self) -> bool {
        matches!(
            self.encoding,
            ENC_DELTA | ENC_DELTA_ZSTD | ENC_DELTA_STREAM_START | ENC_DELTA_STREAM_CONT | ENC_PREFIX_DELTA_STREAM_START
        )
    }

    /// The chunk's bytes where they already are, without a scratch buffer: a raw record's
    /// payload, or a stream record's decoded bytes (`inflated`). None for the rest (zstd of
    /// its own, deltas, or a stream record not decoded yet).
    pub fn bytes_here(&self) -> Option<&[u8]> {
        match self.encoding {
            ENC_RAW => Some(self.payload),
            ENC_STREAM_START | ENC_STREAM_CONT | ENC_PREFIX_STREAM_START => self.inflated.as_deref(),
            _ => None,
        }
    }

    /// True if the chunk's bytes are nowhere yet (they need a scratch buffer: `raw`, or a
    /// delta applied).
    pub fn needs_buffer(&self) -> bool {
        self.bytes_here().is_none()
    }

    /// The chunk's raw bytes, decompressing into `buf` if needed (not for deltas). A stream
    /// record's are its decoded bytes as they are: a copy into `buf` was a second copy of every
    /// decoded batch held until its write ended (decisions §118).
    pub fn raw<'b>(&'b self, buf: &'b mut Vec<u8>) -> Result<&'b [u8]> {
        if let Some(here) = self.bytes_here() {
            return Ok(here);
        }
        match self.encoding {
            ENC_STREAM_START | ENC_STREAM_CONT | ENC_PREFIX_STREAM_START => Err(CoreError::malformed(
                "chunk batch",
                format!("chunk {}: its stream was not decoded", self.index),
            )),
            ENC_ZSTD => {
                buf.resize(self.raw_len as usize, 0);
                decompress_exact(self.payload, &mut buf[..]).map_err(|e| {
                    CoreError::malformed("chunk batch", format!("chunk {} does not decompress: {e}", self.index))
                })?;
                Ok(&buf[..])
            }
            _ => Err(CoreError::malformed(
                "chunk batch",
                format!("chunk {} is a delta where none was asked for", self.index),
            )),
        }
    }

    /// A delta record's delta bytes, decompressing into `buf` if needed.
    pub fn delta<'b>(&'b self, buf: &'b mut Vec<u8>) -> Result<&'b [u8]> {
        let bad = |r: String| CoreError::malformed("chunk batch", format!("chunk {}: {r}", self.index));
        match self.encoding {
            ENC_DELTA => Ok(self.payload),
            ENC_DELTA_STREAM_START | ENC_DELTA_STREAM_CONT | ENC_PREFIX_DELTA_STREAM_START => {
                let d = self
                    .inflated
                    .as_deref()
                    .ok_or_else(|| bad("its stream was not decoded".into()))?;
                buf.clear();
                buf.extend_from_slice(d);
                Ok(&buf[..])
            }
            ENC_DELTA_ZSTD => {
                if self.payload.len() < 4 {
                    return Err(bad("truncated compressed delta".into()));
                }
                let len = u32_at(self.payload, 0) as usize;
                if len > max_delta_len(self.raw_len) {
                    return Err(bad(format!("delta of {len} bytes for a chunk of {}", self.raw_len)));
                }
                buf.resize(len, 0);
                decompress_exact(&self.payload[4..], &mut buf[..])
                    .map_err(|e| bad(format!("delta does not decompress: {e}")))?;
                Ok(&buf[..])
            }
            _ => Err(bad("not a delta".into())),
        }
    }
}

/// Split a batch from an untrusted peer into records. Indices must exist in `manifest`,
/// lengths must equal the manifest's; decompression (later) is bounded by that length. A
/// record that refers to a previous frame (8, 9) is refused: see [`decode_after`].
pub fn decode<'a>(batch: &'a [u8], manifest: &Manifest) -> Result<Vec<Record<'a>>> {
    decode_after(batch, manifest, || Ok(None))
}

/// [`decode`] for a DATA frame that may refer to the frame before it (`BATCH_PREFIX`):
/// `previous` gives that frame's raw bytes (its chunks in its records' order; at least those of
/// its [`history_chunks`]), or None when there is none; it is called only if a record refers
/// to them.
pub fn decode_after<'a>(
    batch: &'a [u8],
    manifest: &Manifest,
    previous: impl FnOnce() -> Result<Option<Vec<u8>>>,
) -> Result<Vec<Record<'a>>> {
    let bad = |r: String| CoreError::malformed("chunk batch", r);
    let mut out = Vec::new();
    let mut at = 0usize;
    while at < batch.len() {
        if batch.len() - at < RECORD_HEADER {
            return Err(bad("truncated record header".into()));
        }
        let index = u32_at(batch, at);
        let enc = batch[at + 4];
        let raw_len = u32_at(batch, at + 5);
        let plen = u32_at(batch, at + 9) as usize;
        at += RECORD_HEADER;
        let Some(chunk) = manifest.chunks.get(index as usize) else {
            return Err(bad(format!("chunk index {index} out of range")));
        };
        if raw_len != chunk.len {
            return Err(bad(format!(
                "chunk {index} has length {raw_len}, expected {}",
                chunk.len
            )));
        }
        if plen > batch.len() - at {
            return Err(bad(format!("chunk {index} payload runs past the frame")));
        }
        let payload = &batch[at..at + plen];
        at += plen;
        match enc {
            ENC_RAW if plen != raw_len as usize => {
                return Err(bad(format!("raw chunk {index} has payload length {plen}")))
            }
            ENC_RAW | ENC_ZSTD | ENC_DELTA | ENC_DELTA_ZSTD => {}
            ENC_STREAM_START | ENC_STREAM_CONT | ENC_PREFIX_STREAM_START => {}
            ENC_DELTA_STREAM_START | ENC_DELTA_STREAM_CONT | ENC_PREFIX_DELTA_STREAM_START => {
                if plen < 4 {
                    return Err(bad(format!("chunk {index}: truncated stream delta")));
                }
                let len = u32_at(payload, 0) as usize;
                if len > max_delta_len(raw_len) {
                    return Err(bad(format!(
                        "chunk {index}: delta of {len} bytes for a chunk of {raw_len}"
                    )));
                }
            }
            other => return Err(bad(format!("unknown chunk encoding {other}"))),
        }
        out.push(Record {
            index,
            encoding: enc,
            payload,
            raw_len,
            inflated: None,
        });
    }
    // Stream records decode in order within their group (each needs the records before it);
    // groups are independent (each opens with a start record), so they decode in parallel.
    let prefix = match out.iter().find(|r| refers_to_previous(r.encoding)) {
        Some(r) => Some(previous()?.ok_or_else(|| {
            bad(format!(
                "chunk {} refers to the previous frame, and there is none",
                r.index
            ))
        })?),
        None => None,
    };
    let prefix = prefix.as_deref().map(history);
    let starts = |r: &Record| starts_stream(r.encoding);
    let mut segments: Vec<&mut [Record]> = Vec::new();
    let mut rest = &mut out[..];
    while !rest.is_empty() {
        let cut = rest.iter().skip(1).position(starts).map_or(rest.len(), |p| p + 1);
        let (seg, tail) = rest.split_at_mut(cut);
        segments.push(seg);
        rest = tail;
    }
    segments.into_par_iter().try_for_each(|seg| -> Result<()> {
        let mut dec = crate::zstream::GroupDecoder::default();
        for r in seg.iter_mut() {
            let (len, payload) = match r.encoding {
                ENC_STREAM_START | ENC_STREAM_CONT | ENC_PREFIX_STREAM_START => (r.raw_len as usize, r.payload),
                ENC_DELTA_STREAM_START | ENC_DELTA_STREAM_CONT | ENC_PREFIX_DELTA_STREAM_START => {
                    (u32_at(r.payload, 0) as usize, &r.payload[4..])
                }
                _ => continue,
            };
            let history = prefix.filter(|_| refers_to_previous(r.encoding));
            let mut data = vec![0u8; len];
            dec.next(starts_stream(r.encoding), history, payload, &mut data)
                .map_err(|m| bad(format!("chunk {}: {m}", r.index)))?;
            r.inflated = Some(data);
        }
        Ok(())
    })?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scan::manifest_of_bytes;
    use crate::testutil::pseudo_random;

    fn fixture() -> (Vec<u8>, Manifest) {
        let mut data = pseudo_random(600_000, 4);
        data[..200_000].fill(7); // compressible head
        let m = manifest_of_bytes(&data, None, &crate::chunker::InMemory);
        (data, m)
    }

    fn encode_all(data: &[u8], m: &Manifest, level: i32) -> Vec<u8> {
        let p = CompressPolicy::new(level);
        let mut out = Vec::new();
        for (i, c) in m.chunks.iter().enumerate() {
            p.encode_record(i as u32, &data[c.offset as usize..c.end() as usize], &mut out);
        }
        out
    }

    #[test]
    fn round_trip_raw_and_zstd() {
        let (data, m) = fixture();
        for level in [0, 1, 3] {
            let batch = encode_all(&data, &m, level);
            let recs = decode(&batch, &m).unwrap();
            assert_eq!(recs.len(), m.chunks.len());
            let mut buf = Vec::new();
            for r in recs {
                let c = m.chunks[r.index as usize];
                assert_eq!(r.raw(&mut buf).unwrap(), &data[c.offset as usize..c.end() as usize]);
            }
            if level > 0 {
                assert!(batch.len() < data.len() - 150_000, "compressible head not compressed");
            }
        }
    }

    #[test]
    fn rejects_hostile_batches() {
        let (data, m) = fixture();
        let good = encode_all(&data, &m, 1);
        let mut wrong_index = good.clone();
        wrong_index[0..4].copy_from_slice(&999u32.to_le_bytes());
        let mut wrong_len = good.clone();
        wrong_len[5..9].copy_from_slice(&1u32.to_le_bytes());
        let mut huge_payload = good.clone();
        huge_payload[9..13].copy_from_slice(&u32::MAX.to_le_bytes());
        let mut bad_enc = good.clone();
        bad_enc[4] = 10;
        for (name, b) in [
            ("index", wrong_index),
            ("len", wrong_len),
            ("payload", huge_payload),
            ("enc", bad_enc),
        ] {
            assert!(decode(&b, &m).is_err(), "{name}");
        }
        assert!(decode(&good[..good.len() - 1], &m).is_err());
        // A zstd record whose payload is garbage fails when decompressed, not before.
        let recs = decode(&good, &m).unwrap();
        let z = recs
            .iter()
            .position(|r| r.encoding == ENC_ZSTD)
            .expect("fixture has a compressed chunk");
        let mut garbled = good.clone();
        let start: usize = recs[..z].iter().map(|r| RECORD_HEADER + r.payload.len()).sum();
        garbled[start + RECORD_HEADER + 5] ^= 0xff;
        let recs = decode(&garbled, &m).unwrap();
        let mut buf = Vec::new();
        let bad = recs[z].raw(&mut buf).map(|b| b.to_vec());
        let c = m.chunks[recs[z].index as usize];
        assert!(bad
            .map(|b| b != data[c.offset as usize..c.end() as usize])
            .unwrap_or(true));
        assert!(decode(&good[..5], &m).is_err());
    }

    #[test]
    fn a_zstd_bomb_in_a_record_is_decompressed_into_the_chunk_length_only() {
        let (_, m) = fixture();
        // Chunk 0's record, its payload 1 GiB of zeros (a few KiB of zstd).
        let bomb = {
            use std::io::Write;
            let mut e = zstd::stream::write::Encoder::new(Vec::new(), 1).unwrap();
            let z = vec![0u8; 1 << 20];
            for _ in 0..1024 {
                e.write_all(&z).unwrap();
            }
            e.finish().unwrap()
        };
        let mut b = Vec::new();
        b.extend_from_slice(&0u32.to_le_bytes());
        b.push(ENC_ZSTD);
        b.extend_from_slice(&m.chunks[0].len.to_le_bytes());
        b.extend_from_slice(&(bomb.len() as u32).to_le_bytes());
        b.extend_from_slice(&bomb);
        let recs = decode(&b, &m).unwrap();
        let t0 = std::time::Instant::now();
        let mut buf = Vec::new();
        let e = recs[0].raw(&mut buf).map(|_| ()).unwrap_err().to_string();
        assert!(e.contains("does not decompress"), "{e}");
        assert!(
            buf.capacity() <= m.chunks[0].len as usize,
            "output bounded by the chunk"
        );
        assert!(t0.elapsed() < std::time::Duration::from_secs(1));
    }

    /// Every chunk of `m` as a record (index, raw bytes).
    fn records_of<'d>(data: &'d [u8], m: &Manifest) -> Vec<(u32, &'d [u8])> {
        m.chunks
            .iter()
            .enumerate()
            .map(|(i, c)| (i as u32, &data[c.offset as usize..c.end() as usize]))
            .collect()
    }

    fn stream_batch(data: &[u8], m: &Manifest, level: i32) -> Vec<u8> {
        CompressPolicy::with_stream(level, true).encode_batch(&records_of(data, m))
    }

    fn check(batch: &[u8], data: &[u8], m: &Manifest) -> Result<()> {
        let mut buf = Vec::new();
        for r in decode(batch, m)? {
            let c = m.chunks[r.index as usize];
            if r.raw(&mut buf)? != &data[c.offset as usize..c.end() as usize] {
                return Err(CoreError::ChunkCorrupt {
                    index: r.index,
                    origin: "test",
                });
            }
        }
        Ok(())
    }

    /// A text-like file whose chunks repeat each other's phrases (as a JS bundle does),
    /// with an incompressible tail.
    fn texty() -> (Vec<u8>, Manifest) {
        let words: Vec<Vec<u8>> = (0..400).map(|i| pseudo_random(12 + i % 9, i as u64)).collect();
        let mut data = Vec::new();
        let mut x = 1u64;
        while data.len() < 900_000 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            data.extend_from_slice(&words[(x >> 33) as usize % words.len()]);
        }
        data.extend_from_slice(&pseudo_random(100_000, 9)); // incompressible tail: sent raw
        let m = manifest_of_bytes(&data, None, &crate::chunker::InMemory);
        (data, m)
    }

    #[test]
    fn a_batch_encoded_into_a_used_buffer_is_the_batch_encoded_into_a_new_one() {
        let (data, m) = texty();
        let records = records_of(&data, &m);
        for stream in [false, true] {
            let p = CompressPolicy::with_stream(3, stream);
            let expected = p.encode_batch(&records);
            check(&expected, &data, &m).unwrap();
            // Longer than needed and full of another batch's bytes, then shorter than needed.
            for mut used in [vec![0xA5u8; data.len() * 2], vec![0x5Au8; 1000]] {
                p.encode_batch_into(&records, &mut used);
                assert_eq!(used, expected, "stream {stream}");
                p.encode_batch_into(&records[..3], &mut used);
                assert_eq!(
                    used,
                    p.encode_batch(&records[..3]),
                    "stream {stream}: a shorter batch after"
                );
            }
        }
    }

    #[test]
    fn stream_records_round_trip_and_share_a_context() {
        // One stream per group beats a frame per chunk.
        let (data, m) = texty();
        let framed = encode_all(&data, &m, 3);
        let streamed = stream_batch(&data, &m, 3);
        check(&streamed, &data, &m).unwrap();
        assert!(
            streamed.len() * 10 < framed.len() * 9,
            "streamed {} framed {}",
            streamed.len(),
            framed.len()
        );
        let recs = decode(&streamed, &m).unwrap();
        assert_eq!(recs[0].encoding, ENC_STREAM_START);
        assert!(recs.iter().any(|r| r.encoding == ENC_STREAM_CONT));
        assert_eq!(recs.last().unwrap().encoding, ENC_RAW);
        // A decoded stream record's bytes are used where they are: `raw` hands them over without
        // a copy into the scratch buffer (decisions §118: the copy was a second decoded batch
        // held until its write ended), and the restorer takes them from `bytes_here`.
        for r in &recs {
            let c = &m.chunks[r.index as usize];
            let want = &data[c.offset as usize..c.end() as usize];
            assert_eq!(r.bytes_here(), Some(want), "chunk {}", r.index);
            assert!(!r.needs_buffer());
            let mut buf = Vec::new();
            let got = r.raw(&mut buf).unwrap();
            assert!(
                std::ptr::eq(got, r.bytes_here().unwrap()),
                "chunk {}: its own bytes",
                r.index
            );
            assert_eq!(buf.capacity(), 0, "chunk {}: nothing copied", r.index);
        }
        // A chunk compressed on its own has no bytes until decompressed into a buffer.
        let framed_recs = decode(&framed, &m).unwrap();
        let z = framed_recs.iter().find(|r| r.encoding == ENC_ZSTD).unwrap();
        assert!(z.bytes_here().is_none() && z.needs_buffer());
        // Level 0 never streams; without the capability the old encodings only.
        assert_eq!(
            stream_batch(&data, &m, 0).len(),
            data.len() + RECORD_HEADER * m.chunks.len()
        );
        assert!(decode(&framed, &m).unwrap().iter().all(|r| r.encoding <= ENC_ZSTD));
    }

    #[test]
    fn from_one_group_level_a_batch_is_one_stream() {
        // On a pool of two threads (the test's own, whatever the machine): below ONE_GROUP_LEVEL
        // the batch is cut into a group per thread.
        let (data, m) = texty();
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        let starts = |level: i32| {
            pool.install(|| {
                let b = stream_batch(&data, &m, level);
                check(&b, &data, &m).unwrap();
                decode(&b, &m)
                    .unwrap()
                    .iter()
                    .filter(|r| r.encoding == ENC_STREAM_START)
                    .count()
            })
        };
        assert_eq!(starts(ONE_GROUP_LEVEL - 1), 2, "a group per thread");
        assert_eq!(starts(ONE_GROUP_LEVEL), 1, "one stream for the batch");
        assert_eq!(starts(19), 1, "one stream for the batch");
    }

    /// The chunks of `m` from `from` on, encoded as one batch whose stream starts with
    /// `prefix` as history.
    fn prefixed_batch(data: &[u8], m: &Manifest, from: usize, prefix: &[u8], level: i32) -> Vec<u8> {
        let p = CompressPolicy::with_stream(level, true);
        let records = &records_of(data, m)[from..];
        let mut slots: Vec<Vec<u8>> = records
            .iter()
            .map(|(_, raw)| [&[0u8; RECORD_HEADER][..], raw].concat())
            .collect();
        let mut group: Vec<GroupSlot<'_>> = slots
            .iter_mut()
            .zip(records)
            .map(|(s, (i, _))| (*i, &mut s[..], None))
            .collect();
        let lens = p.encode_groups(&mut group, Some(prefix));
        slots.iter().zip(lens).flat_map(|(s, n)| s[..n].to_vec()).collect()
    }

    #[test]
    fn a_batch_whose_stream_starts_with_the_previous_frame_round_trips_smaller() {
        // The "previous frame": the file's first chunks; the batch: the rest, which repeats
        // their phrases (as the next part of a JS bundle does).
        let (data, m) = texty();
        let split = 3;
        let previous = &data[..m.chunks[split].offset as usize];
        let alone = prefixed_batch(&data, &m, split, &[], ONE_GROUP_LEVEL);
        let after = prefixed_batch(&data, &m, split, previous, ONE_GROUP_LEVEL);
        let decoded = decode_after(&after, &m, || Ok(Some(previous.to_vec()))).unwrap();
        assert_eq!(decoded[0].encoding, ENC_PREFIX_STREAM_START);
        assert!(decoded.iter().any(|r| r.encoding == ENC_STREAM_CONT));
        let mut buf = Vec::new();
        for r in &decoded {
            let c = m.chunks[r.index as usize];
            assert!(r.raw(&mut buf).unwrap() == &data[c.offset as usize..c.end() as usize]);
        }
        assert_eq!(decode(&alone, &m).unwrap()[0].encoding, ENC_STREAM_START);
        assert!(
            after.len() * 100 < alone.len() * 99,
            "with the previous frame {} B, alone {} B",
            after.len(),
            alone.len()
        );
        // Without a previous frame, the batch is refused (a peer that lies about having sent
        // one); the history is not even asked for when no record refers to it.
        let e = decode(&after, &m).err().expect("no previous frame").to_string();
        assert!(e.contains("refers to the previous frame, and there is none"), "{e}");
        assert!(decode_after(&alone, &m, || panic!("asked for history it does not use")).is_ok());
        // Other history than the encoder's: an error or other bytes, never a panic, and the
        // chunk hash (checked by every caller) catches the latter.
        let mut other = previous.to_vec();
        other[previous.len() / 2] ^= 1;
        other.truncate(previous.len() - 7);
        let wrong = decode_after(&after, &m, || Ok(Some(other))).map(|recs| {
            recs.iter().all(|r| {
                let c = m.chunks[r.index as usize];
                r.raw(&mut buf)
                    .map(|b| b == &data[c.offset as usize..c.end() as usize])
                    .unwrap_or(false)
            })
        });
        assert!(!wrong.unwrap_or(false), "decoded right with the wrong history");
    }

    #[test]
    fn a_frames_history_is_its_fewest_last_chunks_covering_one_mib() {
        let data = pseudo_random(3_000_000, 11);
        let m = manifest_of_bytes(&data, None, &crate::chunker::InMemory);
        let all: Vec<u32> = (0..m.chunks.len() as u32).collect();
        let len = |ix: &[u32]| ix.iter().map(|&i| m.chunks[i as usize].len as usize).sum::<usize>();
        let h = history_chunks(&all, &m);
        assert!(h.len() < all.len() && h == &all[all.len() - h.len()..], "a suffix");
        assert!(len(h) >= HISTORY_BYTES && len(&h[1..]) < HISTORY_BYTES, "{} B", len(h));
        // A frame with less than that: all of it (the history never exceeds what was sent).
        let small = &all[..3];
        assert_eq!(history_chunks(small, &m), small);
        let bytes: Vec<u8> = small
            .iter()
            .flat_map(|&i| {
                let c = m.chunks[i as usize];
                data[c.offset as usize..c.end() as usize].to_vec()
            })
            .collect();
        assert_eq!(history(&bytes).len(), bytes.len().min(HISTORY_BYTES));
        assert_eq!(history(&data).len(), HISTORY_BYTES);
        assert!(history(&data) == &data[data.len() - HISTORY_BYTES..]);
    }

    #[test]
    fn hostile_stream_records_fail_bounded() {
        let (data, m) = texty();
        let streamed = stream_batch(&data, &m, 3);
        let recs = decode(&streamed, &m).unwrap();
        let k = recs
            .iter()
            .position(|r| r.encoding == ENC_STREAM_CONT)
            .expect("a continuation");
        let lens: Vec<usize> = recs.iter().map(|r| RECORD_HEADER + r.payload.len()).collect();
        let at = lens[..k].iter().sum::<usize>();
        // The continuation alone: no stream to continue.
        assert!(decode(&streamed[at..at + lens[k]], &m).is_err());
        // A bomb: a stream start whose payload inflates to 1 GiB of zeros, declared as chunk 0.
        let bomb = crate::testutil::zstd_zeros(b"", 1 << 30);
        let mut b = Vec::new();
        b.extend_from_slice(&0u32.to_le_bytes());
        b.push(ENC_STREAM_START);
        b.extend_from_slice(&m.chunks[0].len.to_le_bytes());
        b.extend_from_slice(&(bomb.len() as u32).to_le_bytes());
        b.extend_from_slice(&bomb);
        let t0 = std::time::Instant::now();
        let e = decode(&b, &m).err().expect("a bomb must fail").to_string();
        assert!(e.contains("more than its declared length"), "{e}");
        assert!(t0.elapsed() < std::time::Duration::from_secs(2));
        // Every bit flip: an error or the right bytes, never a panic.
        for i in (0..streamed.len()).step_by(97) {
            let mut evil = streamed.clone();
            evil[i] ^= 0x04;
            let _ = check(&evil, &data, &m);
        }
    }

    #[test]
    fn staged_deltas_share_the_stream_and_are_bounded() {
        let (data, m) = texty();
        let p = CompressPolicy::with_stream(3, true);
        // Chunk 0 as itself, chunk 1 as a "delta" (any bytes: decoding does not apply it).
        let (c0, c1) = (m.chunks[0], m.chunks[1]);
        let delta = data[c0.offset as usize..c0.offset as usize + 3000].to_vec();
        let mut s0 = vec![0u8; RECORD_HEADER + c0.len as usize];
        s0[RECORD_HEADER..].copy_from_slice(&data[c0.offset as usize..c0.end() as usize]);
        let mut s1 = vec![0u8; RECORD_HEADER + c1.len as usize];
        assert_eq!(p.stage_delta_in_slot(&delta, &mut s1), Some(3000));
        let lens = p.encode_groups(&mut [(0, &mut s0[..], None), (1, &mut s1[..], Some(3000))], None);
        let batch = [&s0[..lens[0]], &s1[..lens[1]]].concat();
        let recs = decode(&batch, &m).unwrap();
        assert_eq!(
            (recs[0].encoding, recs[1].encoding),
            (ENC_STREAM_START, ENC_DELTA_STREAM_CONT)
        );
        assert!(
            recs[1].payload.len() < 600,
            "the delta matched the chunk before it: {}",
            recs[1].payload.len()
        );
        let mut buf = Vec::new();
        assert_eq!(recs[1].delta(&mut buf).unwrap(), &delta[..]);
        assert!(recs[1].is_delta() && recs[1].raw(&mut buf).is_err());
        // A declared delta length over the bound is refused before anything is decoded.
        let mut evil = batch.clone();
        let at = lens[0] + RECORD_HEADER;
        evil[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode(&evil, &m).is_err());
        // Declared shorter than the stream's output: refused (no spill into the next record).
        let mut evil = batch.clone();
        evil[at..at + 4].copy_from_slice(&2000u32.to_le_bytes());
        assert!(decode(&evil, &m).is_err());
    }
}
