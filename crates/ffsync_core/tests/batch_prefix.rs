#![cfg(unix)]
//! Capability BATCH_PREFIX end to end, without a transport: from `PREFIX_FROM_LEVEL` a DATA
//! batch's stream starts with the previous batch's chunks as history; the sender reads them
//! again from its source, the receiver reads them back from its temp file (checked against
//! the manifest) and writes the frames in the order they arrived.

use ffsync_core::chunk_batch::{refers_to_previous, PREFIX_FROM_LEVEL, RECORD_HEADER};
use ffsync_core::chunk_source::ChunkSource;
use ffsync_core::restore::{partial_path, Reconstruction};
use ffsync_core::scan::{scan_file, ScanOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

mod common;
use common::rand_bytes;

/// Text that repeats a vocabulary of phrases all through the file, as a JS bundle does.
fn texty(len: usize) -> Vec<u8> {
    let words: Vec<Vec<u8>> = (0..3000).map(|i| rand_bytes(10 + i % 23, i as u64 + 1)).collect();
    let mut out = Vec::with_capacity(len + 64);
    let mut x = 7u64;
    while out.len() < len {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        out.extend_from_slice(&words[(x >> 33) as usize % words.len()]);
    }
    out.truncate(len);
    out
}

/// A directory holding `src`, `len` bytes of [`texty`] (returned too), and the path `dst`.
fn source_file(len: usize) -> (tempfile::TempDir, PathBuf, PathBuf, Vec<u8>) {
    let d = tempfile::tempdir().unwrap();
    let (src, dst) = (d.path().join("src"), d.path().join("dst"));
    let data = texty(len);
    std::fs::write(&src, &data).unwrap();
    (d, src, dst, data)
}

/// The needed chunks cut into batches of at most 2 MiB, as the sender cuts them.
fn batches(r: &Reconstruction, source: &ChunkSource) -> Vec<Vec<u32>> {
    let mut out: Vec<Vec<u32>> = Vec::new();
    let mut raw = 0u64;
    for i in r.needed() {
        let len = source.manifest().chunks[i as usize].len as u64;
        if out.is_empty() || raw + len > 2 << 20 {
            out.push(Vec::new());
            raw = 0;
        }
        out.last_mut().unwrap().push(i);
        raw += len;
    }
    out
}

fn begin(src: &Path, dst: &Path, level: i32) -> (Reconstruction, ChunkSource) {
    let s = scan_file(src, &ScanOptions::default()).unwrap();
    let r = Reconstruction::begin(dst, s.manifest.clone(), Vec::new()).unwrap();
    let source = ChunkSource::open(src, s.manifest, s.identity, level, true).unwrap();
    (r, source)
}

/// True if a record of the batch refers to the previous frame, from its record headers alone
/// (encoding at byte 4, payload length at byte 9 of each 13-byte header).
fn refers(batch: &[u8]) -> bool {
    let mut at = 0usize;
    let mut found = false;
    while at < batch.len() {
        found |= refers_to_previous(batch[at + 4]);
        at += RECORD_HEADER + u32::from_le_bytes(batch[at + 9..at + 13].try_into().unwrap()) as usize;
    }
    assert_eq!(at, batch.len(), "records end with the batch");
    found
}

#[test]
fn each_batch_after_the_first_compresses_against_the_one_before_and_the_file_is_exact() {
    let (_d, src, dst, data) = source_file(7_000_000);
    for level in [PREFIX_FROM_LEVEL - 1, PREFIX_FROM_LEVEL, 12] {
        let _ = std::fs::remove_file(&dst);
        let (r, source) = begin(&src, &dst, level);
        let cut = batches(&r, &source);
        assert!(cut.len() >= 3, "{} batches", cut.len());
        let (mut chained, mut alone) = (0usize, 0usize);
        for (k, b) in cut.iter().enumerate() {
            let previous = if k > 0 { &cut[k - 1][..] } else { &[][..] };
            let (batch, _) = source.read_batch_vec_after(previous, b).unwrap();
            alone += source.read_batch(b).unwrap().0.len();
            chained += batch.len();
            // Below PREFIX_FROM_LEVEL (or for the first batch) nothing refers to a previous frame.
            assert_eq!(
                refers(&batch),
                k > 0 && level >= PREFIX_FROM_LEVEL,
                "level {level} batch {k}"
            );
            r.write_batch(&batch).unwrap();
        }
        r.finish(None, Some(0o644), None).unwrap();
        assert!(std::fs::read(&dst).unwrap() == data, "level {level}: result differs");
        if level >= PREFIX_FROM_LEVEL {
            assert!(
                chained * 100 < alone * 99,
                "level {level}: chained {chained} B, alone {alone} B"
            );
        } else {
            assert_eq!(chained, alone, "level {level}");
        }
    }
}

#[test]
fn a_frame_that_refers_to_a_frame_not_sent_or_not_written_or_changed_is_refused() {
    let (_d, src, dst, data) = source_file(5_000_000);
    let (r, source) = begin(&src, &dst, PREFIX_FROM_LEVEL);
    let cut = batches(&r, &source);
    let b0 = source.read_batch_vec_after(&[], &cut[0]).unwrap().0;
    let b1 = source.read_batch_vec_after(&cut[0], &cut[1]).unwrap().0;
    let b2 = source.read_batch_vec_after(&cut[1], &cut[2]).unwrap().0;
    assert!(refers(&b1) && refers(&b2));

    // A peer whose first frame refers to one before it: refused before anything is claimed.
    let e = r.write_batch(&b1).unwrap_err();
    assert_eq!(e.code(), "EMALFORMED", "{e}");
    assert!(e.to_string().contains("there is none"), "{e}");
    r.abort(false);

    // Frames are numbered as they arrive; one decoded before the frame it refers to was
    // written is refused (the shell waits for the earlier writes), and is fine once it was.
    let (r, _) = begin(&src, &dst, PREFIX_FROM_LEVEL);
    let (t0, t1) = (r.ticket(), r.ticket());
    let e = r.write_frame(&b1, t1).unwrap_err();
    assert!(e.to_string().contains("which is not written"), "{e}");
    r.write_frame(&b0, t0).unwrap();
    r.write_frame(&b1, t1).unwrap();
    r.write_batch(&b2).unwrap();
    for b in &cut[3..] {
        r.write_batch(&source.read_batch(b).unwrap().0).unwrap();
    }
    r.finish(None, Some(0o644), None).unwrap();
    assert!(std::fs::read(&dst).unwrap() == data);

    // Its history changed in the temp file (someone else's write): the check of the history
    // against the manifest reports the file changing, not the peer's data as corrupt.
    std::fs::remove_file(&dst).unwrap();
    let (r, _) = begin(&src, &dst, PREFIX_FROM_LEVEL);
    r.write_batch(&b0).unwrap();
    let c = source.manifest().chunks[*cut[0].last().unwrap() as usize];
    let temp = std::fs::OpenOptions::new()
        .write(true)
        .open(partial_path(&dst, &source.manifest().root))
        .unwrap();
    temp.write_all_at(b"planted", c.offset + 10).unwrap();
    let e = r.write_batch(&b1).unwrap_err();
    assert_eq!(e.code(), "EVERIFY", "{e}");
    assert!(e.to_string().contains("changed during the sync"), "{e}");
    r.abort(false);
}
