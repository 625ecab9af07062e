//! Helpers shared by the integration tests.
#![allow(dead_code)]

/// Deterministic pseudo-random bytes (xorshift64) for fixtures.
pub fn rand_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut s = seed | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s as u8
        })
        .collect()
}

use ffsync_core::chunk_source::ChunkSource;
use ffsync_core::reconstruct::{BeginOptions, LocalSource, PlanSummary, Reconstruction};
use ffsync_core::scan::{scan_file, ScanOptions};
use std::path::Path;

/// Rebuild `dst` from `src` with the old `dst` as the local source, as a transfer would
/// (chunks the plan needs are read from `src` in batches of 8). `before_finish` runs right
/// before the commit. Returns the plan as `begin` made it.
#[allow(dead_code)]
pub fn rebuild(src: &Path, dst: &Path, opts: BeginOptions, before_finish: impl FnOnce(&Reconstruction)) -> PlanSummary {
    let s = scan_file(src, &ScanOptions::default()).unwrap();
    let old = scan_file(dst, &ScanOptions::default()).unwrap();
    let local = vec![LocalSource {
        path: dst.to_path_buf(),
        manifest: old.manifest,
    }];
    let r = Reconstruction::begin_with(dst, s.manifest.clone(), local, opts).unwrap();
    let plan = r.summary();
    let source = ChunkSource::open(src, s.manifest.clone(), s.identity, 0, false).unwrap();
    r.copy_local().unwrap();
    for group in r.needed().chunks(8) {
        let (batch, _) = source.read_batch(group).unwrap();
        r.write_batch(&batch).unwrap();
    }
    before_finish(&r);
    r.finish(Some(1_700_000_000_000_000_000), Some(0o640), None).unwrap();
    assert_eq!(std::fs::read(dst).unwrap(), std::fs::read(src).unwrap());
    plan
}
