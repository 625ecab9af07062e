//! Sub-chunk refinement end to end without a transport: the receiver plans and describes
//! its old bytes, the sender encodes deltas, the receiver applies, verifies and commits.
//! Every result is compared byte for byte with the source.

use ffsync_core::chunk_batch::{ENC_DELTA, ENC_DELTA_ZSTD, RECORD_HEADER};
use ffsync_core::chunk_source::ChunkSource;
use ffsync_core::restore::{LocalSource, Reconstruction};
use ffsync_core::scan::{scan_file, ScanOptions};
use std::fs;
use std::path::Path;

mod common;
use common::rand_bytes;

struct Sent {
    /// Encoded batch bytes (what DATA frames carry) and refinement table bytes.
    batches: u64,
    table: u64,
    deltas: usize,
}

/// Sync `src` onto `dst` with refinement on; returns what crossed the "wire".
fn sync_refined(src: &Path, dst: &Path, level: i32) -> Sent {
    let s = scan_file(src, &ScanOptions::default()).unwrap();
    let old = scan_file(dst, &ScanOptions::default()).unwrap();
    let r = Reconstruction::begin(
        dst,
        s.manifest.clone(),
        vec![LocalSource {
            path: dst.to_path_buf(),
            manifest: old.manifest,
        }],
    )
    .unwrap();
    let table = r.refinement().unwrap();
    let need = r.needed();
    let source = ChunkSource::open(src, s.manifest.clone(), s.identity, level, level % 2 == 1).unwrap();
    source.set_refinement(&table).unwrap();
    r.copy_local().unwrap();
    let mut sent = Sent {
        batches: 0,
        table: table.len() as u64,
        deltas: 0,
    };
    for group in need.chunks(8) {
        let (batch, _) = source.read_batch(group).unwrap();
        sent.batches += batch.len() as u64;
        sent.deltas += count_deltas(&batch);
        r.write_batch(&batch).unwrap();
    }
    r.finish(None, None, None).unwrap();
    assert_eq!(
        fs::read(dst).unwrap(),
        fs::read(src).unwrap(),
        "result differs from the source"
    );
    sent
}

fn count_deltas(batch: &[u8]) -> usize {
    let mut at = 0;
    let mut n = 0;
    while at < batch.len() {
        let enc = batch[at + 4];
        let plen = u32::from_le_bytes(batch[at + 9..at + 13].try_into().unwrap()) as usize;
        if enc == ENC_DELTA || enc == ENC_DELTA_ZSTD {
            n += 1;
        }
        at += RECORD_HEADER + plen;
    }
    n
}

/// Seeded scattered edits: `overwrites` of `ow` bytes, 4 KiB insertions, 8 KiB deletions.
fn edit(data: &mut Vec<u8>, seed: u64, overwrites: usize, ow: usize, inserts: usize, deletes: usize) {
    let mut s = seed | 1;
    let mut next = |n: usize| {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s % n as u64) as usize
    };
    for k in 0..overwrites {
        let at = next(data.len() - ow);
        data[at..at + ow].copy_from_slice(&rand_bytes(ow, 100 + k as u64));
    }
    for k in 0..inserts {
        let at = next(data.len());
        data.splice(at..at, rand_bytes(4096, 200 + k as u64));
    }
    for _ in 0..deletes {
        let at = next(data.len() - 8192);
        data.drain(at..at + 8192);
    }
}

#[test]
fn scattered_small_edits_cost_about_their_size() {
    let d = tempfile::tempdir().unwrap();
    let (src, dst) = (d.path().join("src"), d.path().join("dst"));
    let old = rand_bytes(24 << 20, 11); // large chunk parameters (256 KiB average)
    fs::write(&dst, &old).unwrap();
    let mut new = old.clone();
    edit(&mut new, 5, 6, 4096, 3, 3);
    fs::write(&src, &new).unwrap();
    let sent = sync_refined(&src, &dst, 1);
    // 6 × 4 KiB + 3 × 4 KiB of new bytes; whole chunks would be ~12 × 256 KiB.
    let total = sent.batches + sent.table;
    assert!(sent.deltas >= 6, "only {} chunks went as deltas", sent.deltas);
    assert!(
        total < 160 * 1024,
        "refined transfer cost {total} bytes ({} table)",
        sent.table
    );
}

#[test]
fn repetitive_data_round_trips() {
    let d = tempfile::tempdir().unwrap();
    let (src, dst) = (d.path().join("src"), d.path().join("dst"));
    let block = rand_bytes(1000, 3);
    let old: Vec<u8> = block.iter().copied().cycle().take(6 << 20).collect();
    fs::write(&dst, &old).unwrap();
    let mut new = old.clone();
    edit(&mut new, 9, 4, 64 * 1024, 2, 2);
    fs::write(&src, &new).unwrap();
    sync_refined(&src, &dst, 1);
    sync_refined(&src, &dst, 0); // identical now: nothing to refine, still verified
}

#[test]
fn a_file_changed_everywhere_is_refined_against_the_whole_old_file() {
    let d = tempfile::tempdir().unwrap();
    let (src, dst) = (d.path().join("src"), d.path().join("dst"));
    let old = rand_bytes(4 << 20, 21);
    fs::write(&dst, &old).unwrap();
    // One byte changed every 40 KiB: every content-defined chunk differs, no anchors.
    let mut new = old.clone();
    for at in (0..new.len()).step_by(40 * 1024) {
        new[at] ^= 0x5a;
    }
    fs::write(&src, &new).unwrap();
    let sent = sync_refined(&src, &dst, 0);
    assert!(sent.deltas > 10);
    assert!(
        sent.batches + sent.table < (new.len() / 4) as u64,
        "sent {} of {}",
        sent.batches,
        new.len()
    );
}

#[test]
fn text_like_data_with_zstd_deltas() {
    let d = tempfile::tempdir().unwrap();
    let (src, dst) = (d.path().join("src"), d.path().join("dst"));
    let mut old = Vec::new();
    for i in 0..200_000u32 {
        old.extend_from_slice(format!("export function f{i}(a, b) {{ return a * {} + b; }}\n", i % 97).as_bytes());
    }
    fs::write(&dst, &old).unwrap();
    // An edit that shifts everything after it, and a renamed identifier in a few places.
    let mut new = old.clone();
    new.splice(1000..1000, b"// a new header line\n".iter().copied());
    let text = String::from_utf8(new)
        .unwrap()
        .replacen("f150000(", "g150000(", 1)
        .replacen("f9000(", "renamed9000(", 1);
    fs::write(&src, text.as_bytes()).unwrap();
    let sent = sync_refined(&src, &dst, 3);
    assert!(
        sent.batches + sent.table < 64 * 1024,
        "sent {} + table {}",
        sent.batches,
        sent.table
    );
}

#[test]
fn a_delta_for_a_chunk_that_was_not_refined_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let (src, dst) = (d.path().join("src"), d.path().join("dst"));
    let old = rand_bytes(2 << 20, 31);
    fs::write(&dst, &old).unwrap();
    let mut new = old.clone();
    new[100] ^= 1;
    fs::write(&src, &new).unwrap();
    let s = scan_file(&src, &ScanOptions::default()).unwrap();
    let manifest_old = scan_file(&dst, &ScanOptions::default()).unwrap().manifest;
    // The sender refines (as if asked), the receiver never described anything.
    let receiver_side = Reconstruction::begin(
        &dst,
        s.manifest.clone(),
        vec![LocalSource {
            path: dst.clone(),
            manifest: manifest_old.clone(),
        }],
    )
    .unwrap();
    let other = tempfile::tempdir().unwrap();
    let decoy = other.path().join("dst");
    fs::write(&decoy, &old).unwrap();
    let planner = Reconstruction::begin(
        &decoy,
        s.manifest.clone(),
        vec![LocalSource {
            path: decoy.clone(),
            manifest: manifest_old,
        }],
    )
    .unwrap();
    let table = planner.refinement().unwrap();
    let source = ChunkSource::open(&src, s.manifest.clone(), s.identity, 0, false).unwrap();
    source.set_refinement(&table).unwrap();
    let (batch, _) = source.read_batch(&receiver_side.needed()).unwrap();
    assert!(count_deltas(&batch) > 0);
    let err = receiver_side.write_batch(&batch).unwrap_err();
    assert_eq!(err.code(), "EMALFORMED", "{err}");
    assert_eq!(fs::read(&dst).unwrap(), old, "target touched");
    receiver_side.abort(false);
    planner.abort(false);
    // A table cannot be installed twice.
    assert!(source.set_refinement(&table).is_err());
}

/// A 2 MiB old file and a new one with 100 bytes changed, planned, described and copied:
/// returns the reconstruction and the one-delta batch the sender would send for it.
struct OneDelta {
    _dir: tempfile::TempDir,
    dst: std::path::PathBuf,
    old: Vec<u8>,
    r: Reconstruction,
    batch: Vec<u8>,
}

fn one_delta(seed: u64) -> OneDelta {
    let dir = tempfile::tempdir().unwrap();
    let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
    let old = rand_bytes(2 << 20, seed);
    fs::write(&dst, &old).unwrap();
    let mut new = old.clone();
    new[300_000..300_100].fill(9);
    fs::write(&src, &new).unwrap();
    let s = scan_file(&src, &ScanOptions::default()).unwrap();
    let r = Reconstruction::begin(
        &dst,
        s.manifest.clone(),
        vec![LocalSource {
            path: dst.clone(),
            manifest: scan_file(&dst, &ScanOptions::default()).unwrap().manifest,
        }],
    )
    .unwrap();
    let table = r.refinement().unwrap();
    let source = ChunkSource::open(&src, s.manifest.clone(), s.identity, 0, false).unwrap();
    source.set_refinement(&table).unwrap();
    r.copy_local().unwrap();
    let (batch, _) = source.read_batch(&r.needed()).unwrap();
    assert_eq!(count_deltas(&batch), 1);
    OneDelta {
        _dir: dir,
        dst,
        old,
        r,
        batch,
    }
}

#[test]
fn a_tampered_delta_fails_the_chunk_hash_and_commits_nothing() {
    // `_dir: _keep` binds the temp dir, so it lives to the end of the test.
    let OneDelta {
        _dir: _keep,
        dst,
        old,
        r,
        mut batch,
    } = one_delta(41);
    // Flip a literal byte near the end of the delta (before the end command).
    let n = batch.len();
    batch[n - 10] ^= 0xff;
    let err = r.write_batch(&batch).unwrap_err();
    assert!(matches!(err.code(), "ECHUNK" | "EMALFORMED"), "{err}");
    assert!(r.finish(None, None, None).is_err());
    assert_eq!(fs::read(&dst).unwrap(), old);
}

#[cfg(unix)]
#[test]
fn old_file_changed_under_a_delta_is_reported_as_changed_not_as_a_corrupt_chunk_from_the_peer() {
    // The receiver's old bytes change after it described them, so the delta rebuilds a wrong
    // chunk. That is "changed during the sync" (23), not "chunk N failed its hash check
    // (received from the peer)" (exit 12), which would blame the peer (fault suite, old-file-changed).
    let OneDelta {
        _dir: _keep,
        dst,
        old,
        r,
        batch,
    } = one_delta(43);
    // Another process rewrites the old file in place (same size; its mtime moves on, as
    // any write's would, past the timestamp tick of the open).
    let mut changed = old.clone();
    changed[200_000..400_000].fill(7);
    let f = fs::OpenOptions::new().write(true).open(&dst).unwrap();
    use std::os::unix::fs::FileExt;
    f.write_all_at(&changed, 0).unwrap();
    f.set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(5))
        .unwrap();
    let err = r.write_batch(&batch).unwrap_err();
    assert_eq!(err.code(), "EVERIFY", "{err}");
    assert!(err.to_string().contains("changed during the sync"), "{err}");
    assert!(r.finish(None, None, None).is_err(), "nothing may be committed");
    assert_eq!(fs::read(&dst).unwrap(), changed, "the target is the user's, untouched");
}
