//! End-to-end engine round trips without any transport: sender manifest + chunk batches
//! into a Reconstruction, then verify the result byte for byte.

use ffsync_core::chunk_source::ChunkSource;
use ffsync_core::restore::{partial_path, LocalSource, Reconstruction};
use ffsync_core::scan::{scan_file, ScanOptions};
use std::fs;
use std::path::Path;

mod common;
use common::rand_bytes;

/// Run a sync of `src` onto `dst`; `limit` stops after that many batches (simulated drop).
fn sync(src: &Path, dst: &Path, limit: Option<usize>) -> Option<(u64, u64)> {
    let s = scan_file(src, &ScanOptions::default()).unwrap();
    let mut local = vec![];
    if dst.exists() {
        local.push(LocalSource {
            path: dst.to_path_buf(),
            manifest: scan_file(dst, &ScanOptions::default()).unwrap().manifest,
        });
    }
    let r = Reconstruction::begin(dst, s.manifest.clone(), local).unwrap();
    let need = r.needed();
    let source = ChunkSource::open(src, s.manifest.clone(), s.identity, 1, true).unwrap();
    r.copy_local().unwrap();
    let mut sent = 0u64;
    for (n, group) in need.chunks(4).enumerate() {
        if limit == Some(n) {
            r.abort(true);
            return None;
        }
        let (batch, raw) = source.read_batch(group).unwrap();
        sent += raw;
        r.write_batch(&batch).unwrap();
    }
    r.finish(Some(1_600_000_000_000_000_000), Some(0o644), None).unwrap();
    Some((sent, need.len() as u64))
}

#[test]
fn fresh_modified_and_identical() {
    let d = tempfile::tempdir().unwrap();
    let (src, dst) = (d.path().join("src"), d.path().join("dst"));
    let mut data = rand_bytes(20_000_000, 9);
    fs::write(&src, &data).unwrap();
    let (sent, _) = sync(&src, &dst, None).unwrap();
    assert_eq!(sent, data.len() as u64);
    assert_eq!(fs::read(&dst).unwrap(), data);

    data[5_000_000..5_000_100].fill(0);
    data.splice(12_000_000..12_000_000, rand_bytes(4096, 3));
    fs::write(&src, &data).unwrap();
    let (sent, _) = sync(&src, &dst, None).unwrap();
    assert_eq!(fs::read(&dst).unwrap(), data);
    assert!(sent < 4 << 20, "modified sync sent {sent} bytes");

    let (sent, need) = sync(&src, &dst, None).unwrap();
    assert_eq!((sent, need), (0, 0));
    let mtime = fs::metadata(&dst).unwrap().modified().unwrap();
    assert_eq!(
        mtime.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs(),
        1_600_000_000
    );
}

#[test]
fn interrupted_transfer_resumes_from_partial() {
    let d = tempfile::tempdir().unwrap();
    let (src, dst) = (d.path().join("src"), d.path().join("dst"));
    let data = rand_bytes(30_000_000, 5);
    fs::write(&src, &data).unwrap();
    assert!(sync(&src, &dst, Some(10)).is_none());
    assert!(!dst.exists(), "target must not exist after an aborted first sync");
    let root = scan_file(&src, &ScanOptions::default()).unwrap().manifest.root;
    assert!(partial_path(&dst, &root).exists());
    let (sent, _) = sync(&src, &dst, None).unwrap();
    assert!(sent < data.len() as u64 - 8_000_000, "resume re-sent {sent} bytes");
    assert_eq!(fs::read(&dst).unwrap(), data);
    assert!(!partial_path(&dst, &root).exists());
}

#[test]
fn corrupt_chunk_is_rejected_and_target_untouched() {
    let d = tempfile::tempdir().unwrap();
    let (src, dst) = (d.path().join("src"), d.path().join("dst"));
    fs::write(&src, rand_bytes(3_000_000, 1)).unwrap();
    fs::write(&dst, b"old content").unwrap();
    let s = scan_file(&src, &ScanOptions::default()).unwrap();
    let r = Reconstruction::begin(&dst, s.manifest.clone(), vec![]).unwrap();
    let source = ChunkSource::open(&src, s.manifest.clone(), s.identity, 0, false).unwrap();
    let (mut batch, _) = source.read_batch(&[0]).unwrap();
    let last = batch.len() - 1;
    batch[last] ^= 1;
    let err = r.write_batch(&batch).err().unwrap();
    assert_eq!(err.code(), "ECHUNK");
    assert!(
        r.finish(None, None, None).is_err(),
        "finish must refuse with chunks missing"
    );
    r.abort(false);
    assert_eq!(fs::read(&dst).unwrap(), b"old content");
    assert!(!r.temp_path().exists());
}

#[test]
fn old_file_changed_during_sync_fails_verification() {
    let d = tempfile::tempdir().unwrap();
    let (src, dst) = (d.path().join("src"), d.path().join("dst"));
    let data = rand_bytes(3_000_000, 2);
    fs::write(&src, &data).unwrap();
    let mut old = data.clone();
    old[2_000_000] ^= 1;
    fs::write(&dst, &old).unwrap();
    let s = scan_file(&src, &ScanOptions::default()).unwrap();
    let local = vec![LocalSource {
        path: dst.clone(),
        manifest: scan_file(&dst, &ScanOptions::default()).unwrap().manifest,
    }];
    let r = Reconstruction::begin(&dst, s.manifest.clone(), local).unwrap();
    // Someone rewrites the old file between planning and copying.
    let racing = rand_bytes(3_000_000, 77);
    fs::write(&dst, &racing).unwrap();
    let copy = r.copy_local();
    let source = ChunkSource::open(&src, s.manifest.clone(), s.identity, 0, false).unwrap();
    for i in r.needed() {
        r.write_batch(&source.read_batch(&[i]).unwrap().0).unwrap();
    }
    let res = copy.and_then(|_| r.finish(None, None, None).map(|_| ()));
    assert!(res.is_err(), "a racing local change must fail loudly");
    r.abort(false);
    assert_eq!(
        fs::read(&dst).unwrap(),
        racing,
        "the target is left as it was, not replaced"
    );
    assert!(!r.temp_path().exists());
}

#[test]
fn a_directory_at_the_target_is_never_overwritten_by_the_commit() {
    // Tree sessions begin a rebuild where a directory still stands (it is cleared only
    // right before the commit, by the caller); if nobody cleared it, the commit fails and
    // the directory and its contents stay as they were.
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    fs::write(&src, b"").unwrap();
    let target = d.path().join("t");
    fs::create_dir(&target).unwrap();
    fs::write(target.join("inner"), b"keep").unwrap();
    let s = scan_file(&src, &ScanOptions::default()).unwrap();
    let r = Reconstruction::begin(&target, s.manifest, vec![]).unwrap();
    assert!(r.finish(None, None, None).is_err());
    assert_eq!(fs::read(target.join("inner")).unwrap(), b"keep");
}

#[test]
fn duplicate_or_unrequested_chunks_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let (src, dst) = (d.path().join("src"), d.path().join("dst"));
    fs::write(&src, rand_bytes(2_000_000, 8)).unwrap();
    let s = scan_file(&src, &ScanOptions::default()).unwrap();
    let r = Reconstruction::begin(&dst, s.manifest.clone(), vec![]).unwrap();
    let source = ChunkSource::open(&src, s.manifest.clone(), s.identity, 0, false).unwrap();
    let (b0, _) = source.read_batch(&[0]).unwrap();
    r.write_batch(&b0).unwrap();
    assert_eq!(
        r.write_batch(&b0).err().unwrap().code(),
        "EMALFORMED",
        "same chunk twice"
    );
    let (b12, _) = source.read_batch(&[1, 1]).unwrap();
    assert_eq!(
        r.write_batch(&b12).err().unwrap().code(),
        "EMALFORMED",
        "same chunk twice in one batch"
    );
    // The refused batch did not claim chunk 1: it can still arrive.
    let (b1, _) = source.read_batch(&[1]).unwrap();
    r.write_batch(&b1).unwrap();
    r.abort(false);
}

#[test]
fn a_failed_batch_poisons_the_reconstruction() {
    let d = tempfile::tempdir().unwrap();
    let (src, dst) = (d.path().join("src"), d.path().join("dst"));
    fs::write(&src, rand_bytes(10_000, 9)).unwrap(); // below the minimum chunk: a single chunk
    fs::write(&dst, b"old").unwrap();
    let s = scan_file(&src, &ScanOptions::default()).unwrap();
    assert_eq!(s.manifest.chunks.len(), 1);
    let r = Reconstruction::begin(&dst, s.manifest.clone(), vec![]).unwrap();
    let source = ChunkSource::open(&src, s.manifest.clone(), s.identity, 0, false).unwrap();
    let (mut batch, _) = source.read_batch(&[0]).unwrap();
    let last = batch.len() - 1;
    batch[last] ^= 1;
    assert_eq!(r.write_batch(&batch).err().unwrap().code(), "ECHUNK");
    // The only chunk was claimed by the failed batch: finish must still refuse.
    assert_eq!(r.finish(None, None, None).err().unwrap().code(), "EVERIFY");
    r.abort(false);
    assert_eq!(fs::read(&dst).unwrap(), b"old");
}

#[test]
fn temp_names_fit_name_max_even_for_the_longest_names() {
    let d = tempfile::tempdir().unwrap();
    let long_a = d.path().join("a".repeat(255));
    let long_b = d.path().join(format!("{}b", "a".repeat(254)));
    let root = [7u8; 32];
    let (pa, pb) = (
        ffsync_core::restore::partial_path(&long_a, &root),
        ffsync_core::restore::partial_path(&long_b, &root),
    );
    for p in [&pa, &pb] {
        assert!(p.file_name().unwrap().len() <= 255, "{}", p.display());
        fs::write(p, b"x").unwrap();
    }
    assert_ne!(pa, pb, "names sharing a long prefix must not share a temp file");
}

/// A malformed record found after its chunk was claimed (zstd data that does not decompress)
/// poisons the reconstruction: left claimed and unpoisoned, a caller that went on to `finish`
/// would commit a chunk that was never written.
#[test]
fn a_chunk_that_does_not_decompress_poisons_the_reconstruction() {
    let d = tempfile::tempdir().unwrap();
    let (src, dst) = (d.path().join("src"), d.path().join("dst"));
    fs::write(&src, vec![7u8; 10_000]).unwrap(); // compressible, a single chunk
    fs::write(&dst, b"old").unwrap();
    let s = scan_file(&src, &ScanOptions::default()).unwrap();
    let r = Reconstruction::begin(&dst, s.manifest.clone(), vec![]).unwrap();
    let source = ChunkSource::open(&src, s.manifest.clone(), s.identity, 1, false).unwrap();
    let (mut batch, _) = source.read_batch(&[0]).unwrap();
    assert_eq!(batch[4], 1, "the chunk went compressed");
    for b in &mut batch[13..] {
        *b = 0xee; // no longer a zstd frame
    }
    assert_eq!(r.write_batch(&batch).err().unwrap().code(), "EMALFORMED");
    assert_eq!(r.finish(None, None, None).err().unwrap().code(), "EVERIFY");
    r.abort(false);
    assert_eq!(fs::read(&dst).unwrap(), b"old");
}

/// The sender opens its source only as the version it scanned (the identity of the handle it
/// opened, not of the path): an unchanged file opens and reads; one replaced by a rename or gone
/// since is refused with ECHANGED, which the sender reports as changed (exit 24).
#[test]
fn a_source_opens_only_as_the_version_that_was_scanned() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src.bin");
    fs::write(&src, rand_bytes(300_000, 41)).unwrap();
    let s = scan_file(&src, &ScanOptions::default()).unwrap();
    let same = |id: &ffsync_core::file_identity::FileIdentity| *id == s.identity;

    let opened = ChunkSource::open_as_scanned(&src, s.manifest.clone(), same, 0, false).expect("unchanged: opens");
    assert!(opened.unchanged());
    let all: Vec<u32> = (0..s.manifest.chunks.len() as u32).collect();
    let (batch, raw) = opened.read_batch(&all).unwrap();
    assert_eq!(raw, 300_000);
    assert!(!batch.is_empty());
    drop(opened);

    // Replaced by a rename (a new inode at the same path, same size).
    let other = dir.path().join("other.bin");
    fs::write(&other, rand_bytes(300_000, 42)).unwrap();
    fs::rename(&other, &src).unwrap();
    let replaced = ChunkSource::open_as_scanned(&src, s.manifest.clone(), same, 0, false)
        .err()
        .expect("replaced: refused");
    assert_eq!(replaced.code(), "ECHANGED");

    // Gone.
    fs::remove_file(&src).unwrap();
    let gone = ChunkSource::open_as_scanned(&src, s.manifest.clone(), same, 0, false)
        .err()
        .expect("gone: refused");
    assert_eq!(gone.code(), "ECHANGED");

    // A directory where the file was: it opens on some platforms, else fails; never as "changed"
    // when its identity is accepted.
    fs::create_dir(&src).unwrap();
    if let Err(e) = ChunkSource::open_as_scanned(&src, s.manifest.clone(), |_| true, 0, false) {
        assert_ne!(e.code(), "ECHANGED");
    }
}
