//! Small files travel whole, many per DATA-sized frame, so 10,000 files of 4 KiB cost a
//! handful of frames and no per-file round trip. The sender reads, hashes and compresses
//! them in parallel; the receiver verifies each against the root the sender computed,
//! writes it beside its target and renames it into place.
//!
//! Record (little endian; docs/protocol.md, "FILE_BATCH"):
//! `action u32, status u8, encoding u8, raw_len u32, payload_len u32, root [32], payload`.
//! status 0 = ok, 1 = vanished or changed while read (exit 24), 2 = unreadable (exit 23);
//! encoding 0 = raw, 1 = zstd.

use crate::error::{CoreError, Result};
use crate::manifest::Manifest;
use crate::params::ChunkParams;

pub const RECORD_HEADER: usize = 46;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum FileStatus {
    Ok = 0,
    Vanished = 1,
    Unreadable = 2,
}

pub struct FileRecord<'a> {
    pub action: u32,
    pub status: FileStatus,
    pub zstd: bool,
    pub raw_len: u32,
    pub root: [u8; 32],
    pub payload: &'a [u8],
}

/// The content root of whole bytes in memory (the same definition as a scanned file's).
pub fn root_of_bytes(data: &[u8]) -> [u8; 32] {
    let params = ChunkParams::for_file_size(data.len() as u64);
    let chunks = crate::chunker::chunk_sequential(data, params);
    Manifest::from_chunks(data.len() as u64, params, chunks).root
}

/// Encoded record of one file's bytes (compressed when it pays).
pub fn encode_record(action: u32, status: FileStatus, data: &[u8], level: i32, out: &mut Vec<u8>) {
    let root = if status == FileStatus::Ok {
        root_of_bytes(data)
    } else {
        [0; 32]
    };
    let compressed = if level > 0 && data.len() >= 64 && status == FileStatus::Ok {
        zstd::bulk::compress(data, level).ok().filter(|c| c.len() < data.len())
    } else {
        None
    };
    let payload: &[u8] = match (&compressed, status) {
        (_, FileStatus::Vanished | FileStatus::Unreadable) => &[],
        (Some(c), _) => c,
        (None, _) => data,
    };
    out.extend_from_slice(&action.to_le_bytes());
    out.push(status as u8);
    out.push(compressed.is_some() as u8);
    out.extend_from_slice(&(if status == FileStatus::Ok { data.len() as u32 } else { 0 }).to_le_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&root);
    out.extend_from_slice(payload);
}

pub fn decode(batch: &[u8]) -> Result<Vec<FileRecord<'_>>> {
    let bad = |r: String| CoreError::malformed("file batch", r);
    let mut out = Vec::new();
    let mut o = 0;
    while o < batch.len() {
        if batch.len() - o < RECORD_HEADER {
            return Err(bad(format!("truncated record header at {o}")));
        }
        let u = |at: usize| u32::from_le_bytes(batch[at..at + 4].try_into().unwrap());
        let status = match batch[o + 4] {
            0 => FileStatus::Ok,
            1 => FileStatus::Vanished,
            2 => FileStatus::Unreadable,
            s => return Err(bad(format!("unknown status {s}"))),
        };
        let zstd = match batch[o + 5] {
            0 => false,
            1 => true,
            e => return Err(bad(format!("unknown encoding {e}"))),
        };
        let (raw_len, plen) = (u(o + 6), u(o + 10) as usize);
        let start = o + RECORD_HEADER;
        if batch.len() - start < plen {
            return Err(bad(format!("payload of {plen} bytes overruns the batch")));
        }
        if !zstd && status == FileStatus::Ok && plen != raw_len as usize {
            return Err(bad("raw payload length differs from the file length".into()));
        }
        // Decompression is sized by raw_len: never more than a small file can be (the
        // receiver also requires the manifest's length), and nothing for a skipped file.
        if status == FileStatus::Ok && raw_len as u64 > crate::tree::triage::NEW_FILE_BATCH_MAX {
            return Err(bad(format!("record of {raw_len} bytes is larger than any small file")));
        }
        if status != FileStatus::Ok && (raw_len != 0 || plen != 0 || zstd) {
            return Err(bad("a skipped file's record carries data".into()));
        }
        out.push(FileRecord {
            action: u(o),
            status,
            zstd,
            raw_len,
            root: batch[o + 14..o + 46].try_into().unwrap(),
            payload: &batch[start..start + plen],
        });
        o = start + plen;
    }
    Ok(out)
}

impl FileRecord<'_> {
    /// The file's bytes, checked against the root the sender computed from them.
    pub fn content(&self) -> Result<Vec<u8>> {
        let data = if self.zstd {
            let mut v = vec![0u8; self.raw_len as usize];
            crate::chunk_batch::decompress_exact(self.payload, &mut v)
                .map_err(|e| CoreError::malformed("file batch", format!("file record {}: {e}", self.action)))?;
            v
        } else {
            self.payload.to_vec()
        };
        if root_of_bytes(&data) != self.root {
            return Err(CoreError::VerifyFailed(format!(
                "file record {} does not match the root the sender computed",
                self.action
            )));
        }
        Ok(data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_are_verified() {
        let mut b = Vec::new();
        encode_record(3, FileStatus::Ok, &[7u8; 5000], 1, &mut b);
        encode_record(4, FileStatus::Ok, b"", 1, &mut b);
        encode_record(5, FileStatus::Vanished, b"ignored", 1, &mut b);
        let r = decode(&b).unwrap();
        assert_eq!(r.len(), 3);
        assert!(r[0].zstd);
        assert_eq!(r[0].content().unwrap(), vec![7u8; 5000]);
        assert_eq!(r[1].content().unwrap(), Vec::<u8>::new());
        assert_eq!(r[2].status, FileStatus::Vanished);
        // A flipped payload byte fails verification or decompression, never passes.
        let mut evil = b.clone();
        evil[RECORD_HEADER + 3] ^= 0x40;
        assert!(decode(&evil).map(|r| r[0].content().is_err()).unwrap_or(true));
        for cut in 1..b.len() {
            if let Ok(rs) = decode(&b[..cut]) {
                assert!(rs.len() < 3);
            }
        }
    }

    #[test]
    fn declared_lengths_are_bounded_before_anything_is_decompressed() {
        let header = |status: u8, enc: u8, raw_len: u32, plen: u32| {
            let mut b = Vec::new();
            b.extend_from_slice(&1u32.to_le_bytes());
            b.extend_from_slice(&[status, enc]);
            b.extend_from_slice(&raw_len.to_le_bytes());
            b.extend_from_slice(&plen.to_le_bytes());
            b.extend_from_slice(&[0; 32]);
            b.extend(std::iter::repeat_n(0u8, plen as usize));
            b
        };
        // A zstd record claiming 4 GiB of output: refused at its header.
        assert!(decode(&header(0, 1, u32::MAX, 16)).is_err());
        assert!(decode(&header(0, 1, (1 << 20) + 1, 16)).is_err());
        assert!(decode(&header(0, 1, 1 << 20, 16)).is_ok());
        // A vanished or unreadable file carries nothing.
        assert!(decode(&header(1, 0, 0, 0)).is_ok());
        assert!(decode(&header(1, 1, 1 << 20, 16)).is_err());
        assert!(decode(&header(2, 0, 0, 4)).is_err());
    }
}
