//! A file's manifest: its ordered chunk list and root, plus the packed binary form that
//! crosses the N-API boundary and the wire (one buffer, never one object per chunk).
//!
//! Layout (little endian), 64-byte header then 36 bytes per chunk:
//! ```text
//! 0   magic "FFM1"        4   format version (u8) = 1, 3 reserved bytes = 0
//! 8   min  u32            12  avg u32          16  max u32       20  chunk count u32
//! 24  file size u64       32  root [32]
//! 64  count x { len u32, blake3 [32] }
//! ```

use crate::chunker::{Chunk, Hash};
use crate::error::{CoreError, Result};
use crate::params::ChunkParams;

pub const MAGIC: &[u8; 4] = b"FFM1";
pub const HEADER_LEN: usize = 64;
pub const ENTRY_LEN: usize = 36;
const ROOT_CONTEXT: &str = "ffsync-native 2026-11 file root v1";

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    pub size: u64,
    pub params: ChunkParams,
    pub chunks: Vec<Chunk>,
    pub root: Hash,
}

/// Domain-separated BLAKE3 over the chunk count and each (length, hash) in order.
pub fn compute_root<'a>(chunks: impl ExactSizeIterator<Item = (u32, &'a Hash)>) -> Hash {
    let mut h = blake3::Hasher::new_derive_key(ROOT_CONTEXT);
    h.update(&(chunks.len() as u64).to_le_bytes());
    for (len, hash) in chunks {
        h.update(&(len as u64).to_le_bytes());
        h.update(hash);
    }
    *h.finalize().as_bytes()
}

impl Manifest {
    pub fn from_chunks(size: u64, params: ChunkParams, chunks: Vec<Chunk>) -> Manifest {
        let root = compute_root(chunks.iter().map(|c| (c.len, &c.hash)));
        Manifest {
            size,
            params,
            chunks,
            root,
        }
    }

    pub fn root_hex(&self) -> String {
        hex(&self.root)
    }

    pub fn encoded_len(&self) -> usize {
        HEADER_LEN + self.chunks.len() * ENTRY_LEN
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.encoded_len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&[1, 0, 0, 0]);
        out.extend_from_slice(&self.params.min.to_le_bytes());
        out.extend_from_slice(&self.params.avg.to_le_bytes());
        out.extend_from_slice(&self.params.max.to_le_bytes());
        out.extend_from_slice(&(self.chunks.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.size.to_le_bytes());
        out.extend_from_slice(&self.root);
        for c in &self.chunks {
            out.extend_from_slice(&c.len.to_le_bytes());
            out.extend_from_slice(&c.hash);
        }
        out
    }

    /// Decode and validate a manifest from an untrusted source. Every field is checked
    /// before it is used to size anything; the root is recomputed and must match.
    pub fn decode(buf: &[u8]) -> Result<Manifest> {
        Self::decode_checked(buf, true)
    }

    /// Like [`Manifest::decode`], but accepts any valid chunking parameters: for manifests
    /// of local files rechunked with a peer's parameters (see `scan::scan_file_with_params`).
    pub fn decode_local(buf: &[u8]) -> Result<Manifest> {
        Self::decode_checked(buf, false)
    }

    fn decode_checked(buf: &[u8], canonical: bool) -> Result<Manifest> {
        let bad = |r: &str| CoreError::malformed("manifest", r);
        if buf.len() < HEADER_LEN {
            return Err(bad("shorter than its header"));
        }
        if &buf[0..4] != MAGIC {
            return Err(bad("bad magic"));
        }
        if buf[4] != 1 || buf[5..8] != [0, 0, 0] {
            return Err(bad("unsupported format version"));
        }
        let params = ChunkParams {
            min: u32_at(buf, 8),
            avg: u32_at(buf, 12),
            max: u32_at(buf, 16),
        };
        let count = u32_at(buf, 20) as u64;
        let size = u64_at(buf, 24);
        if !params.is_valid() || (canonical && !params.is_canonical_for(size)) {
            return Err(bad("chunk parameters do not match the file size"));
        }
        if count > params.max_chunks(size) || (size > 0 && count == 0) {
            return Err(bad("chunk count impossible for the file size"));
        }
        let body = &buf[HEADER_LEN..];
        if body.len() as u64 != count * ENTRY_LEN as u64 {
            return Err(bad("length does not match the chunk count"));
        }
        let mut root = [0u8; 32];
        root.copy_from_slice(&buf[32..64]);
        let mut chunks = Vec::with_capacity(count as usize);
        let mut offset = 0u64;
        for (i, e) in body.chunks_exact(ENTRY_LEN).enumerate() {
            let len = u32_at(e, 0);
            let last = i as u64 + 1 == count;
            if len == 0 || len > params.max || (!last && len < params.min) {
                return Err(bad("chunk length out of range"));
            }
            let mut hash = [0u8; 32];
            hash.copy_from_slice(&e[4..36]);
            chunks.push(Chunk { offset, len, hash });
            offset += len as u64;
        }
        if offset != size {
            return Err(bad("chunk lengths do not add up to the file size"));
        }
        let m = Manifest::from_chunks(size, params, chunks);
        if m.root != root {
            return Err(bad("root does not match the chunk list"));
        }
        Ok(m)
    }
}

pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

pub(crate) fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

pub fn hex(bytes: &[u8]) -> String {
    const D: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(D[(b >> 4) as usize] as char);
        s.push(D[(b & 15) as usize] as char);
    }
    s
}

/// The 32 bytes a 64-digit hex root spells (either case); None for anything else.
pub fn parse_root_hex(s: &str) -> Option<crate::chunker::Hash> {
    let b = s.as_bytes();
    if b.len() != 64 {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut root = [0u8; 32];
    for (i, out) in root.iter_mut().enumerate() {
        *out = digit(b[2 * i])? << 4 | digit(b[2 * i + 1])?;
    }
    Some(root)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunker::chunk_sequential;
    use crate::testutil::pseudo_random;

    #[test]
    fn root_hex_round_trips_and_anything_else_is_refused() {
        let m = sample();
        assert_eq!(parse_root_hex(&m.root_hex()), Some(m.root));
        assert_eq!(parse_root_hex(&m.root_hex().to_uppercase()), Some(m.root));
        let mut bad = m.root_hex();
        bad.replace_range(10..11, "g");
        for s in [bad.as_str(), &m.root_hex()[..62], "", &format!("{}00", m.root_hex())] {
            assert_eq!(parse_root_hex(s), None, "{s:?}");
        }
        // A multi-byte character where a digit pair would be: refused, never sliced.
        let odd = format!("é{}", &m.root_hex()[2..]);
        assert_eq!(parse_root_hex(&odd), None);
    }

    fn sample() -> Manifest {
        let data = pseudo_random(700_000, 5);
        let p = ChunkParams::for_file_size(data.len() as u64);
        Manifest::from_chunks(data.len() as u64, p, chunk_sequential(&data, p))
    }

    #[test]
    fn round_trip() {
        let m = sample();
        let enc = m.encode();
        assert_eq!(enc.len(), m.encoded_len());
        assert_eq!(Manifest::decode(&enc).unwrap(), m);
    }

    #[test]
    fn empty_file_round_trip() {
        let m = Manifest::from_chunks(0, ChunkParams::for_file_size(0), vec![]);
        assert_eq!(Manifest::decode(&m.encode()).unwrap(), m);
    }

    #[test]
    fn root_depends_on_order_and_lengths() {
        let m = sample();
        let mut rev = m.chunks.clone();
        rev.reverse();
        assert_ne!(compute_root(rev.iter().map(|c| (c.len, &c.hash))), m.root);
    }

    #[test]
    fn rejects_every_single_byte_corruption_of_the_header_and_a_hash() {
        let enc = sample().encode();
        for at in (0..HEADER_LEN).chain([HEADER_LEN + 10, enc.len() - 1]) {
            let mut bad = enc.clone();
            bad[at] ^= 0x40;
            assert!(Manifest::decode(&bad).is_err(), "corruption at byte {at} accepted");
        }
    }

    #[test]
    fn rejects_truncation_and_trailing_garbage() {
        let enc = sample().encode();
        for cut in [0, 3, HEADER_LEN - 1, HEADER_LEN, enc.len() - 1] {
            assert!(Manifest::decode(&enc[..cut]).is_err());
        }
        let mut longer = enc.clone();
        longer.push(0);
        assert!(Manifest::decode(&longer).is_err());
    }

    #[test]
    fn local_manifests_may_use_another_sizes_parameters_but_wire_ones_may_not() {
        let data = pseudo_random(700_000, 5);
        let large = crate::params::LARGE;
        let m = Manifest::from_chunks(data.len() as u64, large, chunk_sequential(&data, large));
        assert!(Manifest::decode(&m.encode()).is_err());
        assert_eq!(Manifest::decode_local(&m.encode()).unwrap(), m);
        let mut bogus = m.encode();
        bogus[8..12].copy_from_slice(&3u32.to_le_bytes()); // odd, below FastCDC's minimum
        assert!(Manifest::decode_local(&bogus).is_err());
    }

    #[test]
    fn rejects_huge_claimed_count_without_allocating() {
        let mut enc = sample().encode();
        enc[20..24].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(Manifest::decode(&enc).is_err());
    }
}
