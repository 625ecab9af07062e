//! The sender's early DATA pipeline (capability STREAM, docs/protocol.md §4.15): a large file
//! is scanned in windows, each window's manifest entries are handed out as soon as they are
//! hashed, and, to a receiver with an empty basis, the window's chunks follow as encoded
//! batches. The batches are encoded on a thread of their own, from a map of their own that
//! releases each range once encoded, so hashing the next window goes on while this one is
//! sent and resident memory stays flat however large the file.

use crate::chunk_batch::CompressPolicy;
use crate::chunker::Chunk;
use crate::error::{CoreError, Result};
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

/// Early DATA: how batches are encoded and how many raw bytes each holds at most.
pub struct EarlyData<'a> {
    pub policy: &'a CompressPolicy,
    pub batch_bytes: u64,
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
            let batch = early.policy.encode_batch(&records);
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
        };
        let (out, _) = run(&path, Some(&early), None);
        let e = out.err().expect("no such file");
        assert_eq!(e.code(), "ENOENT", "{e}");
    }
}
