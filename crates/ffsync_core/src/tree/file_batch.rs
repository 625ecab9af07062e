//! Small files travel whole, many per DATA-sized frame, so 10,000 files of 4 KiB cost a
//! handful of frames and no per-file round trip. The sender reads, hashes and compresses
//! them in parallel; the receiver verifies each against the root the sender computed,
//! writes it beside its target and renames it into place.
//!
//! Record (little endian; docs/protocol.md, "FILE_BATCH"):
//! `action u32, status u8, encoding u8, raw_len u32, payload_len u32, root [32], payload`.
//! status 0 = ok, 1 = vanished or changed while read (exit 24), 2 = unreadable (exit 23);
//! encoding 0 = raw, 1 = zstd (a frame of its own), 2 = zstd stream start, 3 = zstd stream
//! continued (capability `BATCH_STREAM`).
//!
//! Encodings 2 and 3 let the files of a batch share one compression context: a batch is cut
//! into a few groups of consecutive files (one per core, so compression stays parallel); the
//! first file of a group opens a zstd stream (2) and each following file of the group
//! continues it (3). A record's payload is what the stream emitted for that file with a
//! flush after it, so it decodes to exactly that file's bytes given the records before it
//! in its group, and every file is still verified on its own. Many JS files of one package
//! (`x.js` beside `x.mjs`, locale tables) compress against each other this way.

use crate::error::{CoreError, Result};
use crate::manifest::Manifest;
use crate::params::ChunkParams;

pub const RECORD_HEADER: usize = 46;
pub const ENC_RAW: u8 = 0;
pub const ENC_ZSTD: u8 = 1;
pub const ENC_STREAM_START: u8 = 2;
pub const ENC_STREAM_CONT: u8 = 3;
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
    /// One of the ENC_* values.
    pub encoding: u8,
    pub raw_len: u32,
    pub root: [u8; 32],
    pub payload: &'a [u8],
    /// A stream record's bytes, once [`inflate_streams`] decoded its group.
    pub inflated: Option<Vec<u8>>,
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
    push_record(
        action,
        status,
        compressed.is_some() as u8,
        data.len(),
        &root,
        payload,
        out,
    );
}

fn push_record(
    action: u32,
    status: FileStatus,
    enc: u8,
    len: usize,
    root: &[u8; 32],
    payload: &[u8],
    out: &mut Vec<u8>,
) {
    out.extend_from_slice(&record_header(action, status, enc, len, root, payload.len()));
    out.extend_from_slice(payload);
}

/// A record's header: `len` is the file's length (0 unless `status` is Ok), `payload_len`
/// that of the payload that follows it.
pub fn record_header(
    action: u32,
    status: FileStatus,
    enc: u8,
    len: usize,
    root: &[u8; 32],
    payload_len: usize,
) -> [u8; RECORD_HEADER] {
    let mut h = [0u8; RECORD_HEADER];
    h[0..4].copy_from_slice(&action.to_le_bytes());
    h[4] = status as u8;
    h[5] = enc;
    h[6..10].copy_from_slice(&(if status == FileStatus::Ok { len as u32 } else { 0 }).to_le_bytes());
    h[10..14].copy_from_slice(&(payload_len as u32).to_le_bytes());
    h[14..46].copy_from_slice(root);
    h
}

/// One file of a batch to encode: its action, status, and bytes (empty unless Ok).
pub struct BatchFile {
    pub action: u32,
    pub status: FileStatus,
    pub data: Vec<u8>,
}

/// Encode the files of one batch, in order, into one record each. With `shared` (the peer
/// has `BATCH_STREAM`) and a level, files share a zstd stream per group of consecutive
/// files (groups run in parallel); otherwise each file is compressed on its own (as
/// [`encode_record`]). Returns the records, one per file, in order.
pub fn encode_batch(files: &[BatchFile], level: i32, shared: bool) -> Vec<Vec<u8>> {
    use rayon::prelude::*;
    if !shared || level == 0 {
        return files
            .par_iter()
            .map(|f| {
                let mut rec = Vec::with_capacity(f.data.len() + RECORD_HEADER);
                encode_record(f.action, f.status, &f.data, level, &mut rec);
                rec
            })
            .collect();
    }
    let roots: Vec<[u8; 32]> = files
        .par_iter()
        .map(|f| {
            if f.status == FileStatus::Ok {
                root_of_bytes(&f.data)
            } else {
                [0; 32]
            }
        })
        .collect();
    let sizes: Vec<u64> = files.iter().map(|f| f.data.len() as u64).collect();
    let ranges = crate::zstream::groups(&sizes);
    let encoded: Vec<Vec<Vec<u8>>> = ranges
        .par_iter()
        .map(|&(a, b)| encode_group(&files[a..b], &roots[a..b], level))
        .collect();
    encoded.into_iter().flatten().collect()
}

/// One group: the first non-empty Ok file opens the stream, the rest continue it. A file
/// whose flushed output is not smaller than itself still goes through the stream (the
/// stream's later files may match it); zstd stores such blocks raw (3 bytes a block).
fn encode_group(files: &[BatchFile], roots: &[[u8; 32]], level: i32) -> Vec<Vec<u8>> {
    let bytes: u64 = files
        .iter()
        .filter(|f| f.status == FileStatus::Ok)
        .map(|f| f.data.len() as u64)
        .sum();
    let mut enc = crate::zstream::GroupEncoder::new(level).sized(bytes);
    let mut out = Vec::with_capacity(files.len());
    let mut z: Vec<u8> = Vec::new();
    for (f, root) in files.iter().zip(roots) {
        let mut rec = Vec::with_capacity(f.data.len() / 2 + RECORD_HEADER + 64);
        if f.status != FileStatus::Ok || f.data.is_empty() {
            push_record(f.action, f.status, ENC_RAW, 0, root, &[], &mut rec);
            out.push(rec);
            continue;
        }
        z.clear();
        match enc.push(&f.data, &mut z, usize::MAX) {
            Some(start) => {
                let e = if start { ENC_STREAM_START } else { ENC_STREAM_CONT };
                push_record(f.action, f.status, e, f.data.len(), root, &z, &mut rec);
            }
            // A context that failed is dropped; the file goes raw and the next one starts over.
            None => push_record(f.action, f.status, ENC_RAW, f.data.len(), root, &f.data, &mut rec),
        }
        out.push(rec);
    }
    out
}

/// Decode every stream record (encodings 2 and 3) of a decoded batch into its `inflated`
/// bytes, group by group in order. Each record decodes into a buffer of exactly its
/// declared length: a payload that would produce more (or less), a continuation with no
/// stream open, or a frame asking for a window over 4 MiB is an error.
pub fn inflate_streams(records: &mut [FileRecord<'_>]) -> Result<()> {
    let mut dec = crate::zstream::GroupDecoder::default();
    for r in records.iter_mut() {
        if !matches!(r.encoding, ENC_STREAM_START | ENC_STREAM_CONT) {
            continue;
        }
        let mut data = vec![0u8; r.raw_len as usize];
        dec.next(r.encoding == ENC_STREAM_START, None, r.payload, &mut data)
            .map_err(|m| CoreError::malformed("file batch", format!("file record {}: {m}", r.action)))?;
        r.inflated = Some(data);
    }
    Ok(())
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
        let encoding = match batch[o + 5] {
            e @ (ENC_RAW | ENC_ZSTD | ENC_STREAM_START | ENC_STREAM_CONT) => e,
            e => return Err(bad(format!("unknown encoding {e}"))),
        };
        let zstd = encoding != ENC_RAW;
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
            encoding,
            raw_len,
            root: batch[o + 14..o + 46].try_into().unwrap(),
            payload: &batch[start..start + plen],
            inflated: None,
        });
        o = start + plen;
    }
    Ok(out)
}

impl FileRecord<'_> {
    /// The file's bytes, checked against the root the sender computed from them: the
    /// payload itself for a raw record, no copy. Stream records need [`inflate_streams`]
    /// over their batch first.
    pub fn content(&self) -> Result<std::borrow::Cow<'_, [u8]>> {
        use std::borrow::Cow;
        let data: Cow<'_, [u8]> = if let Some(d) = &self.inflated {
            Cow::Borrowed(d)
        } else if matches!(self.encoding, ENC_STREAM_START | ENC_STREAM_CONT) {
            return Err(CoreError::malformed(
                "file batch",
                format!("file record {}: its stream was not decoded", self.action),
            ));
        } else if self.encoding == ENC_ZSTD {
            let mut v = vec![0u8; self.raw_len as usize];
            crate::chunk_batch::decompress_exact(self.payload, &mut v)
                .map_err(|e| CoreError::malformed("file batch", format!("file record {}: {e}", self.action)))?;
            Cow::Owned(v)
        } else {
            Cow::Borrowed(self.payload)
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
        assert_eq!(r[0].encoding, ENC_ZSTD);
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

    fn batch_files(datas: Vec<Vec<u8>>) -> Vec<BatchFile> {
        datas
            .into_iter()
            .enumerate()
            .map(|(i, data)| BatchFile {
                action: i as u32,
                status: FileStatus::Ok,
                data,
            })
            .collect()
    }

    fn decode_all(b: &[u8]) -> Result<Vec<Vec<u8>>> {
        let mut r = decode(b)?;
        inflate_streams(&mut r)?;
        r.iter()
            .map(|r| {
                if r.status == FileStatus::Ok {
                    r.content().map(|c| c.into_owned())
                } else {
                    Ok(Vec::new())
                }
            })
            .collect()
    }

    #[test]
    fn streamed_batches_round_trip_and_share_a_context() {
        use crate::testutil::pseudo_random;
        // Two near-identical files (a.js beside a.mjs): the second costs its differences.
        let a = pseudo_random(40_000, 7);
        let mut b = a.clone();
        b[100..120].copy_from_slice(b"export default thing");
        let mut files = batch_files(vec![a.clone(), Vec::new(), b.clone(), b"tiny".to_vec()]);
        files.insert(
            2,
            BatchFile {
                action: 9,
                status: FileStatus::Vanished,
                data: Vec::new(),
            },
        );
        let alone: usize = encode_batch(&files, 3, false).iter().map(|r| r.len()).sum();
        let recs = encode_batch(&files, 3, true);
        let shared: usize = recs.iter().map(|r| r.len()).sum();
        assert!(shared < alone - 30_000, "shared {shared} vs alone {alone}");
        let encs: Vec<u8> = recs.iter().map(|r| r[5]).collect();
        assert_eq!(
            encs,
            vec![ENC_STREAM_START, ENC_RAW, ENC_RAW, ENC_STREAM_CONT, ENC_STREAM_CONT]
        );
        let batch = recs.concat();
        let got = decode_all(&batch).unwrap();
        assert_eq!(got, vec![a, Vec::new(), Vec::new(), b, b"tiny".to_vec()]);
        // Without inflate_streams a stream record is refused, not returned undecoded.
        assert!(decode(&batch).unwrap()[0].content().is_err());
        // Big batches are cut into groups that each open a stream of their own.
        let big = batch_files((0..8).map(|i| pseudo_random(200_000, i)).collect());
        let recs = encode_batch(&big, 1, true);
        let starts = recs.iter().filter(|r| r[5] == ENC_STREAM_START).count();
        assert_eq!(starts, rayon::current_num_threads().clamp(1, 6));
        assert_eq!(
            decode_all(&recs.concat()).unwrap(),
            big.into_iter().map(|f| f.data).collect::<Vec<_>>()
        );
    }

    #[test]
    fn hostile_streams_fail_bounded() {
        use crate::testutil::pseudo_random;
        let files = batch_files(vec![
            b"hello hello hello hello hello".repeat(50),
            pseudo_random(3000, 1),
        ]);
        let recs = encode_batch(&files, 3, true);
        // A continuation without a start: refused.
        let mut lone = recs[1].clone();
        assert_eq!(lone[5], ENC_STREAM_CONT);
        assert!(decode_all(&lone).is_err());
        lone[5] = ENC_STREAM_START;
        assert!(decode_all(&lone).is_err(), "a mid-stream payload is no frame start");
        // Reordered records (the context differs): an error or a root mismatch, never success.
        assert!(decode_all(&[recs[1].clone(), recs[0].clone()].concat()).is_err());
        // A bomb: a stream start declaring 1000 bytes whose payload inflates to 1 MiB of
        // zeros. Decoding stops at the declared length and fails.
        let bomb = crate::testutil::zstd_zeros(b"", 1 << 20);
        let mut b = Vec::new();
        push_record(1, FileStatus::Ok, ENC_STREAM_START, 1000, &[0; 32], &bomb, &mut b);
        let err = decode_all(&b).expect_err("a bomb must fail");
        assert!(err.to_string().contains("more than its declared length"), "{err}");
        // Declared longer than the payload inflates to: refused too.
        let mut b = Vec::new();
        push_record(
            1,
            FileStatus::Ok,
            ENC_STREAM_START,
            5000,
            &[0; 32],
            &crate::testutil::zstd_zeros(b"", 100),
            &mut b,
        );
        assert!(decode_all(&b).is_err());
        // A frame asking for a window over the limit is refused before anything is allocated.
        let mut c = zstd::stream::raw::Encoder::new(19).unwrap();
        use zstd::stream::raw::Operation;
        c.set_parameter(zstd::stream::raw::CParameter::WindowLog(27)).unwrap();
        let data = pseudo_random(200_000, 2);
        let mut out = vec![0u8; 300_000];
        let mut ib = zstd::stream::raw::InBuffer::around(&data[..]);
        let mut ob = zstd::stream::raw::OutBuffer::around(&mut out[..]);
        c.run(&mut ib, &mut ob).unwrap();
        c.flush(&mut ob).unwrap();
        let n = ob.pos();
        let mut b = Vec::new();
        push_record(
            1,
            FileStatus::Ok,
            ENC_STREAM_START,
            data.len(),
            &root_of_bytes(&data),
            &out[..n],
            &mut b,
        );
        assert!(decode_all(&b).is_err());
        // Every truncation and bit flip: an error or a verified file, never a panic.
        let batch = recs.concat();
        for cut in 1..batch.len() {
            if let Ok(got) = decode_all(&batch[..cut]) {
                assert!(got.len() < 2);
            }
        }
        for i in 0..batch.len() {
            let mut evil = batch.clone();
            evil[i] ^= 0x10;
            if let Ok(got) = decode_all(&evil) {
                assert_eq!(got, vec![files[0].data.clone(), files[1].data.clone()], "flip at {i}");
            }
        }
    }
}
