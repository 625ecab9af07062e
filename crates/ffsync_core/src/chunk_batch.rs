//! Chunk batches: the payload of a DATA frame. Several chunks per frame keep per-frame
//! overhead (and N-API crossings) low. Each record:
//! ```text
//! index u32 | encoding u8 | raw_len u32 | payload_len u32 | payload
//! ```
//! Encodings: 0 raw, 1 zstd, 2 delta (a librsync delta against the receiver's old region,
//! see [`crate::refine`]), 3 zstd delta (`delta_len u32` + zstd of the delta).
//! zstd is used only where it pays: a chunk that does not shrink by at least 1/32 is sent
//! raw, and after a run of incompressible chunks only chunks whose index is a multiple of 16
//! are tried (the miss counter is shared by the threads encoding a source), so random data
//! costs almost no compression CPU.

use crate::error::{CoreError, Result};
use crate::manifest::u32_at;
use crate::manifest::Manifest;
use rayon::prelude::*;
use std::sync::atomic::{AtomicU32, Ordering};

pub const RECORD_HEADER: usize = 13;
pub const ENC_RAW: u8 = 0;
pub const ENC_ZSTD: u8 = 1;
pub const ENC_DELTA: u8 = 2;
pub const ENC_DELTA_ZSTD: u8 = 3;
/// A delta is never worth more than its chunk; bound what a peer can make us decompress.
fn max_delta_len(raw_len: u32) -> usize {
    raw_len as usize + raw_len as usize / 8 + 1024
}
const GIVE_UP_AFTER: u32 = 8;
const RETRY_EVERY: u32 = 16;

/// Decides per chunk whether compression is worth trying.
pub struct CompressPolicy {
    pub level: i32,
    misses: AtomicU32,
}

impl CompressPolicy {
    /// `level` 0 disables compression.
    pub fn new(level: i32) -> Self {
        CompressPolicy {
            level,
            misses: AtomicU32::new(0),
        }
    }

    /// Encode chunk `index` whose raw bytes already sit in `slot[RECORD_HEADER..]`
    /// (`slot` is exactly RECORD_HEADER + raw length long). Compresses in place when it
    /// pays. Returns the record's final length (a prefix of `slot`).
    pub fn encode_in_slot(&self, index: u32, slot: &mut [u8]) -> usize {
        let raw_len = slot.len() - RECORD_HEADER;
        let try_it =
            self.level != 0 && (self.misses.load(Ordering::Relaxed) < GIVE_UP_AFTER || index % RETRY_EVERY == 0);
        let mut enc = ENC_RAW;
        let mut payload_len = raw_len;
        if try_it {
            let compressed = with_scratch(raw_len, |scratch| {
                let n = compress_with_thread_context(self.level, &slot[RECORD_HEADER..], scratch)?;
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

    /// Encode chunk `index` as `delta` (a librsync delta of its raw bytes) into `slot`
    /// (RECORD_HEADER + raw length long) if that is smaller than the chunk (applying a
    /// delta is a copy, so any saving pays); the delta is zstd-compressed when that pays too. Returns None (slot untouched beyond
    /// the header area) when the chunk should be sent as itself.
    pub fn encode_delta_in_slot(&self, index: u32, delta: &[u8], slot: &mut [u8]) -> Option<usize> {
        let raw_len = slot.len() - RECORD_HEADER;
        let budget = raw_len.saturating_sub(8);
        let mut enc = ENC_DELTA;
        let mut payload_len = delta.len();
        if self.level != 0 && delta.len() > 256 {
            let z = with_scratch(delta.len(), |scratch| {
                let n = compress_with_thread_context(self.level, delta, scratch)?;
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
        let total: usize = records.iter().map(|(_, r)| RECORD_HEADER + r.len()).sum();
        let mut out = vec![0u8; total];
        let mut slots: Vec<&mut [u8]> = Vec::with_capacity(records.len());
        let mut rest = &mut out[..];
        for (_, raw) in records {
            let (slot, tail) = rest.split_at_mut(RECORD_HEADER + raw.len());
            slots.push(slot);
            rest = tail;
        }
        let used: Vec<usize> = slots
            .par_iter_mut()
            .zip(records.par_iter())
            .map(|(slot, &(index, raw))| {
                slot[RECORD_HEADER..].copy_from_slice(raw);
                self.encode_in_slot(index, slot)
            })
            .collect();
        let (mut write, mut read) = (0usize, 0usize);
        for (u, (_, raw)) in used.into_iter().zip(records) {
            out.copy_within(read..read + u, write);
            write += u;
            read += RECORD_HEADER + raw.len();
        }
        out.truncate(write);
        out
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
            *c = Some((level, zstd::bulk::Compressor::new(level).ok()?));
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
}

impl Record<'_> {
    /// True if the payload is (or decompresses to) the chunk's bytes; false for deltas.
    pub fn is_delta(&self) -> bool {
        matches!(self.encoding, ENC_DELTA | ENC_DELTA_ZSTD)
    }

    /// True if the payload is not the chunk's bytes themselves (needs a scratch buffer).
    pub fn needs_buffer(&self) -> bool {
        self.encoding != ENC_RAW
    }

    /// The chunk's raw bytes, decompressing into `buf` if needed (not for deltas).
    pub fn raw<'b>(&'b self, buf: &'b mut Vec<u8>) -> Result<&'b [u8]> {
        match self.encoding {
            ENC_RAW => Ok(self.payload),
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
/// lengths must equal the manifest's; decompression (later) is bounded by that length.
pub fn decode<'a>(batch: &'a [u8], manifest: &Manifest) -> Result<Vec<Record<'a>>> {
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
            other => return Err(bad(format!("unknown chunk encoding {other}"))),
        }
        out.push(Record {
            index,
            encoding: enc,
            payload,
            raw_len,
        });
    }
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
        bad_enc[4] = 9;
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
}
