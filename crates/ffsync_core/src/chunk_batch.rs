//! Chunk batches: the payload of a DATA frame. Several chunks per frame keep per-frame
//! overhead (and N-API crossings) low. Each record:
//! ```text
//! index u32 | encoding u8 (0 raw, 1 zstd) | raw_len u32 | payload_len u32 | payload
//! ```
//! zstd is used only where it pays: a chunk that does not shrink by at least 1/32 is sent
//! raw, and after a run of incompressible chunks only every 16th chunk is tried, so random
//! data costs almost no compression CPU.

use crate::error::{CoreError, Result};
use crate::manifest::u32_at;
use crate::manifest::Manifest;
use std::sync::atomic::{AtomicU32, Ordering};

pub const RECORD_HEADER: usize = 13;
pub const ENC_RAW: u8 = 0;
pub const ENC_ZSTD: u8 = 1;
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
        CompressPolicy { level, misses: AtomicU32::new(0) }
    }

    pub fn encode_record(&self, index: u32, raw: &[u8], out: &mut Vec<u8>) {
        let try_it = self.level != 0 && (self.misses.load(Ordering::Relaxed) < GIVE_UP_AFTER || index % RETRY_EVERY == 0);
        let compressed = if try_it { zstd::bulk::compress(raw, self.level).ok() } else { None };
        let (enc, payload): (u8, &[u8]) = match &compressed {
            Some(c) if c.len() < raw.len() - raw.len() / 32 => {
                self.misses.store(0, Ordering::Relaxed);
                (ENC_ZSTD, c)
            }
            _ => {
                if try_it {
                    self.misses.fetch_add(1, Ordering::Relaxed);
                }
                (ENC_RAW, raw)
            }
        };
        out.reserve(RECORD_HEADER + payload.len());
        out.extend_from_slice(&index.to_le_bytes());
        out.push(enc);
        out.extend_from_slice(&(raw.len() as u32).to_le_bytes());
        out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        out.extend_from_slice(payload);
    }
}

/// One decoded record: the chunk index and its raw bytes (borrowed when sent raw).
pub struct Record<'a> {
    pub index: u32,
    pub data: std::borrow::Cow<'a, [u8]>,
}

/// Split and decode a batch from an untrusted peer. Indices must exist in `manifest`,
/// lengths must equal the manifest's, and decompression is bounded by that length.
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
            return Err(bad(format!("chunk {index} has length {raw_len}, expected {}", chunk.len)));
        }
        if plen > batch.len() - at {
            return Err(bad(format!("chunk {index} payload runs past the frame")));
        }
        let payload = &batch[at..at + plen];
        at += plen;
        let data = match enc {
            ENC_RAW if plen == raw_len as usize => std::borrow::Cow::Borrowed(payload),
            ENC_RAW => return Err(bad(format!("raw chunk {index} has payload length {plen}"))),
            ENC_ZSTD => {
                let mut buf = vec![0u8; raw_len as usize];
                let n = zstd::bulk::decompress_to_buffer(payload, &mut buf[..])
                    .map_err(|e| bad(format!("chunk {index} does not decompress: {e}")))?;
                if n != raw_len as usize {
                    return Err(bad(format!("chunk {index} decompressed to {n} bytes, expected {raw_len}")));
                }
                std::borrow::Cow::Owned(buf)
            }
            other => return Err(bad(format!("unknown chunk encoding {other}"))),
        };
        out.push(Record { index, data });
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
            for r in recs {
                let c = m.chunks[r.index as usize];
                assert_eq!(&r.data[..], &data[c.offset as usize..c.end() as usize]);
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
        for (name, b) in [("index", wrong_index), ("len", wrong_len), ("payload", huge_payload), ("enc", bad_enc)] {
            assert!(decode(&b, &m).is_err(), "{name}");
        }
        assert!(decode(&good[..good.len() - 1], &m).is_err());
        assert!(decode(&good[..5], &m).is_err());
    }
}
