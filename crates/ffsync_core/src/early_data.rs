//! The sender's early DATA pipeline (capability STREAM, docs/protocol.md §4.15): a large file
//! is scanned in windows, each window's manifest entries are handed out as soon as they are
//! hashed, and, to a receiver with an empty basis, the window's chunks follow as encoded
//! batches. The batches are encoded on a thread of their own, from a map of their own that
//! releases each range once encoded, so hashing the next window goes on while this one is
//! sent and resident memory stays flat however large the file.

use crate::chunk_batch::CompressPolicy;
use crate::chunker::Chunk;
use crate::error::{CoreError, Result};
use crate::idle::Idle;
use crate::manifest::ENTRY_LEN;
use crate::scan::{scan_file_streaming, MappedFile, ScanOptions, ScanOutcome};
use std::path::Path;
use std::sync::mpsc::sync_channel;

/// One step of the stream, in the order the receiver must get them (a window's entries
/// before its chunks; batches of one window in order).
pub enum StreamStep {
    /// A window's manifest entries (`len u32 | hash [32]` each).
    Part(Vec<u8>),
    /// Encoded chunk records of that window: the batch, its chunk count, its raw bytes.
    Batch(Vec<u8>, u32, u64),
}

/// Early DATA: how batches are encoded, how many raw bytes each holds at most, and where
/// spent batch buffers come back to.
pub struct EarlyData<'a> {
    pub policy: &'a CompressPolicy,
    pub batch_bytes: u64,
    pub buffers: &'a BatchBuffers,
}

/// Batch buffers the consumer is done with, for the encoder to write the next batches into.
/// A fresh buffer per batch is fresh pages: the kernel zeroes and maps each one, and frees
/// it again when the buffer is dropped, about a tenth of the sender's CPU on a fresh 1 GiB
/// file (512 batches of 2 MiB; decisions §68). `give` a batch back once its
/// bytes have been used; the encoder `take`s one per batch.
pub type BatchBuffers = Idle<Vec<u8>>;

/// Spent batch buffers kept: the queues between the encoder and the consumer bound how many
/// batches are out at once, so more would never be taken again.
pub const BATCH_BUFFERS_KEPT: usize = 4;

/// A list of spent batch buffers for one scan stream.
pub fn batch_buffers() -> BatchBuffers {
    Idle::new(BATCH_BUFFERS_KEPT)
}

/// Windows whose chunks wait for the encoder (the scan runs at most this far ahead of it).
const ENCODE_QUEUE: usize = 2;

/// Scan `path` in windows of `window` bytes, calling `emit` with each step (from the scan's
/// thread and the encoder's; never two at once for the same kind of step). `emit` returns
/// false once nobody listens: the scan then stops with an `Interrupted` error. A file that
/// cannot be read for its early DATA (or that shrank meanwhile) fails the scan with that file
/// I/O error.
pub fn scan_with_early_data(
    path: &Path,
    opts: &ScanOptions,
    window: usize,
    early: Option<&EarlyData>,
    emit: &(dyn Fn(StreamStep) -> bool + Sync),
) -> Result<ScanOutcome> {
    let cancelled = || {
        CoreError::io(
            path,
            std::io::Error::new(std::io::ErrorKind::Interrupted, "the scan was cancelled"),
        )
    };
    let (out, encoded) = std::thread::scope(|s| {
        let (work_tx, work_rx) = sync_channel::<(u32, Vec<Chunk>)>(ENCODE_QUEUE);
        let encoder = early.map(|e| s.spawn(move || encode_batches(path, e, work_rx, emit)));
        let work_tx = encoder.as_ref().map(|_| work_tx);
        let mut next_index = 0u32;
        let out = scan_file_streaming(path, opts, window, &mut |chunks| {
            let mut part = Vec::with_capacity(chunks.len() * ENTRY_LEN);
            for c in chunks {
                part.extend_from_slice(&c.len.to_le_bytes());
                part.extend_from_slice(&c.hash);
            }
            if !emit(StreamStep::Part(part)) {
                return false;
            }
            let first = next_index;
            next_index += chunks.len() as u32;
            match &work_tx {
                Some(w) => w.send((first, chunks.to_vec())).is_ok(),
                None => true,
            }
        });
        drop(work_tx);
        let encoded = encoder.map_or(Ok(true), |h| {
            h.join().unwrap_or_else(|_| {
                Err(CoreError::io(
                    path,
                    std::io::Error::other("the early DATA thread failed"),
                ))
            })
        });
        (out, encoded)
    });
    // The early DATA's own failure is the scan's: a read error is a file I/O error naming the
    // file, never a usage error.
    match (out, encoded) {
        (Ok(_), Err(e)) => Err(e),
        (Ok(_), Ok(false)) => Err(cancelled()),
        (other, _) => other,
    }
}

/// The encoder thread: each window's chunks into batches of at most `batch_bytes` raw bytes.
/// Ok(false): `emit` said nobody listens.
fn encode_batches(
    path: &Path,
    early: &EarlyData,
    work: std::sync::mpsc::Receiver<(u32, Vec<Chunk>)>,
    emit: &(dyn Fn(StreamStep) -> bool + Sync),
) -> Result<bool> {
    let mapped = MappedFile::open(path)?;
    let data = mapped.bytes();
    for (first, chunks) in work {
        let mut k = 0;
        while k < chunks.len() {
            let from = chunks[k].offset as usize;
            let mut records = Vec::new();
            let mut raw = 0u64;
            while k < chunks.len() && (records.is_empty() || raw + chunks[k].len as u64 <= early.batch_bytes) {
                let c = &chunks[k];
                let Some(bytes) = data.get(c.offset as usize..c.end() as usize) else {
                    return Err(CoreError::io(
                        path,
                        std::io::Error::new(
                            std::io::ErrorKind::UnexpectedEof,
                            "it shrank while its early DATA was read",
                        ),
                    ));
                };
                records.push((first + k as u32, bytes));
                raw += c.len as u64;
                k += 1;
            }
            let mut batch = early.buffers.take();
            early.policy.encode_batch_into(&records, &mut batch);
            // Resident memory stays flat however large the file (the scan's own map does
            // the same behind the chunker).
            mapped.release_range(from, chunks[k - 1].end() as usize);
            if !emit(StreamStep::Batch(batch, records.len() as u32, raw)) {
                return Ok(false);
            }
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::pseudo_random;
    use std::sync::Mutex;

    fn run(
        path: &Path,
        early: Option<&EarlyData>,
        stop_after: Option<usize>,
    ) -> (Result<ScanOutcome>, Vec<StreamStep>) {
        let steps = Mutex::new(Vec::new());
        let emit = |s: StreamStep| {
            let mut v = steps.lock().unwrap();
            if stop_after.is_some_and(|n| v.len() >= n) {
                return false;
            }
            v.push(s);
            true
        };
        let out = scan_with_early_data(path, &ScanOptions::default(), 1 << 20, early, &emit);
        (out, steps.into_inner().unwrap())
    }

    #[test]
    fn entries_then_every_chunk_once_in_order_and_matching_the_manifest() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("big.bin");
        let data = pseudo_random(5 << 20, 9);
        std::fs::write(&path, &data).unwrap();
        let policy = CompressPolicy::new(1);
        let early = EarlyData {
            policy: &policy,
            batch_bytes: 512 * 1024,
            buffers: &batch_buffers(),
        };
        let (out, steps) = run(&path, Some(&early), None);
        let m = out.unwrap().manifest;
        let mut entries = Vec::new();
        let mut next = 0u32;
        let mut described = 0usize;
        for s in &steps {
            match s {
                StreamStep::Part(p) => {
                    entries.extend_from_slice(p);
                    described = entries.len() / ENTRY_LEN;
                }
                StreamStep::Batch(b, n, raw) => {
                    let recs = crate::chunk_batch::decode(b, &m).unwrap();
                    assert_eq!(recs.len() as u32, *n);
                    let mut sum = 0u64;
                    for r in recs {
                        assert_eq!(r.index, next, "in order, each chunk once");
                        assert!(
                            (r.index as usize) < described,
                            "a chunk never before its window's entries"
                        );
                        let c = &m.chunks[r.index as usize];
                        let mut buf = Vec::new();
                        let bytes = r.raw(&mut buf).unwrap().to_vec();
                        assert_eq!(*blake3::hash(&bytes).as_bytes(), c.hash);
                        assert_eq!(&data[c.offset as usize..c.end() as usize], &bytes[..]);
                        sum += bytes.len() as u64;
                        next += 1;
                    }
                    assert_eq!(sum, *raw);
                    assert!(sum <= 512 * 1024 || *n == 1, "batches hold at most batch_bytes");
                }
            }
        }
        assert_eq!(next as usize, m.chunks.len(), "every chunk went");
        assert_eq!(
            entries,
            m.encode()[crate::manifest::HEADER_LEN..].to_vec(),
            "the entries are the manifest's"
        );
    }

    #[test]
    fn without_early_data_only_entries_and_a_listener_gone_cancels() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("f.bin");
        std::fs::write(&path, pseudo_random(4 << 20, 3)).unwrap();
        let (out, steps) = run(&path, None, None);
        assert!(out.is_ok());
        assert!(steps.iter().all(|s| matches!(s, StreamStep::Part(_))));
        let policy = CompressPolicy::new(0);
        let early = EarlyData {
            policy: &policy,
            batch_bytes: 256 * 1024,
            buffers: &batch_buffers(),
        };
        let (out, steps) = run(&path, Some(&early), Some(1));
        assert_eq!(steps.len(), 1);
        let err = out.err().expect("cancelled").to_string();
        assert!(err.contains("cancelled"), "{err}");
    }

    #[test]
    fn an_unreadable_file_is_a_file_error_not_a_usage_error() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("gone.bin");
        let policy = CompressPolicy::new(1);
        let early = EarlyData {
            policy: &policy,
            batch_bytes: 1 << 20,
            buffers: &batch_buffers(),
        };
        let (out, _) = run(&path, Some(&early), None);
        let e = out.err().expect("no such file");
        assert_eq!(e.code(), "ENOENT", "{e}");
    }

    #[test]
    fn recycled_batch_buffers_carry_the_same_bytes_and_are_reused() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("mixed.bin");
        // Compressible and incompressible stretches, so records of every size and encoding
        // land in buffers that held longer or shorter records before.
        let mut data = Vec::new();
        for i in 0..6u64 {
            if i % 2 == 0 {
                data.extend(pseudo_random(700 << 10, i));
            } else {
                data.extend((0..(900u32 << 10)).map(|k| b"the quick brown fox "[(k % 20) as usize] ^ (k / 4096) as u8));
            }
        }
        std::fs::write(&path, &data).unwrap();
        for stream in [false, true] {
            let policy = CompressPolicy::with_stream(3, stream);
            let fresh = EarlyData {
                policy: &policy,
                batch_bytes: 256 * 1024,
                buffers: &batch_buffers(),
            };
            let (_, steps) = run(&path, Some(&fresh), None);
            let expected: Vec<Vec<u8>> = steps
                .into_iter()
                .filter_map(|s| match s {
                    StreamStep::Batch(b, _, _) => Some(b),
                    _ => None,
                })
                .collect();
            assert!(expected.len() > 8, "enough batches to recycle: {}", expected.len());

            let buffers = batch_buffers();
            let recycled = EarlyData {
                policy: &policy,
                batch_bytes: 256 * 1024,
                buffers: &buffers,
            };
            let got = Mutex::new((Vec::new(), std::collections::HashSet::new()));
            let emit = |s: StreamStep| {
                if let StreamStep::Batch(b, _, _) = s {
                    let mut g = got.lock().unwrap();
                    g.0.push(b.clone());
                    g.1.insert(b.as_ptr() as usize);
                    buffers.give(b);
                }
                true
            };
            scan_with_early_data(&path, &ScanOptions::default(), 1 << 20, Some(&recycled), &emit).unwrap();
            let (batches, distinct) = got.into_inner().unwrap();
            assert_eq!(
                batches, expected,
                "stream {stream}: a recycled buffer encodes byte for byte as a new one"
            );
            assert!(
                distinct.len() <= BATCH_BUFFERS_KEPT,
                "stream {stream}: {} buffers for {} batches",
                distinct.len(),
                batches.len()
            );
            // The encoder took each spent buffer back: only the last one given is left over
            // (an encoder that never took one would leave BATCH_BUFFERS_KEPT of them).
            assert_eq!(buffers.kept(), 1, "stream {stream}");
        }
    }
}
