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
use ffsync_core::restore::{BeginOptions, LocalSource, PlanSummary, Reconstruction};
use ffsync_core::scan::{scan_file, ScanOptions};
use std::path::Path;

/// A reconstruction of `src` at `dst` with `opts` (the old `dst` as its local source when
/// `from_old`), and a chunk source reading `src` (level 0) to feed it.
pub fn begin(src: &Path, dst: &Path, from_old: bool, opts: BeginOptions) -> (Reconstruction, ChunkSource) {
    let s = scan_file(src, &ScanOptions::default()).unwrap();
    let local = if from_old {
        vec![LocalSource {
            path: dst.to_path_buf(),
            manifest: scan_file(dst, &ScanOptions::default()).unwrap().manifest,
        }]
    } else {
        Vec::new()
    };
    let r = Reconstruction::begin_with(dst, s.manifest.clone(), local, opts).unwrap();
    let source = ChunkSource::open(src, s.manifest, s.identity, 0, false).unwrap();
    (r, source)
}

/// Write every chunk the plan needs, read from `source` in batches of 8, as a transfer would.
pub fn feed(r: &Reconstruction, source: &ChunkSource) {
    for group in r.needed().chunks(8) {
        let (batch, _) = source.read_batch(group).unwrap();
        r.write_batch(&batch).unwrap();
    }
}

/// Names in `dir` of our temp files (partials, staging, journals).
pub fn leftovers(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".ffsync-"))
        .collect()
}

/// Rebuild `dst` from `src` with the old `dst` as the local source, as a transfer would.
/// `before_finish` runs right before the commit. Returns the plan as `begin` made it.
pub fn rebuild(src: &Path, dst: &Path, opts: BeginOptions, before_finish: impl FnOnce(&Reconstruction)) -> PlanSummary {
    let (r, source) = begin(src, dst, true, opts);
    let plan = r.summary();
    r.copy_local().unwrap();
    feed(&r, &source);
    before_finish(&r);
    r.finish(Some(1_700_000_000_000_000_000), Some(0o640), None).unwrap();
    assert_eq!(std::fs::read(dst).unwrap(), std::fs::read(src).unwrap());
    plan
}
