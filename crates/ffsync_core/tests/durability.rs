//! Durable commits and `--no-fsync` (BeginOptions::fsync): writeback starts while data
//! lands either way (without it, ext4 starts all of it in the rename over an old version,
//! which then waits: decisions §115); only a durable commit waits for it and fsyncs; and
//! verification is the same either way.

use ffsync_core::restore::{BeginOptions, Reconstruction};
use std::fs;
use std::path::Path;

mod common;
use common::{begin, feed, leftovers, rand_bytes, rebuild};

fn opts(fsync: bool) -> BeginOptions {
    BeginOptions {
        fsync,
        ..Default::default()
    }
}

/// A fresh reconstruction of `src` at `dst` (nothing local), fed every chunk in batches.
fn fresh(src: &Path, dst: &Path, fsync: bool) -> Reconstruction {
    let (r, source) = begin(src, dst, false, opts(fsync));
    feed(&r, &source);
    r
}

#[test]
fn durable_writeback_starts_while_data_lands() {
    let dir = tempfile::tempdir().unwrap();
    let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
    let size = 40usize << 20;
    fs::write(&src, rand_bytes(size, 5)).unwrap();
    let r = fresh(&src, &dst, true);
    let started = r.writeback_started();
    if cfg!(target_os = "linux") {
        // Every full window was handed to the disk before the commit; at most one window
        // (the tail) is left for the fsync.
        let window = ffsync_core::io::writeback::KICK;
        assert!(started + window >= size as u64, "{started} of {size}");
        assert!(started <= size as u64);
    } else {
        assert_eq!(started, 0, "only Linux starts writeback early");
    }
    r.finish(None, None, None).unwrap();
    assert_eq!(fs::read(&dst).unwrap(), fs::read(&src).unwrap());
}

/// What `--no-fsync` started early, by the platform: every full window on Linux, else nothing.
fn started_early(started: u64, size: u64) {
    if cfg!(target_os = "linux") {
        let window = ffsync_core::io::writeback::KICK;
        assert!(started + window >= size && started <= size, "{started} of {size}");
    } else {
        assert_eq!(started, 0, "only Linux starts writeback early");
    }
}

#[test]
fn no_fsync_starts_writeback_too_and_still_commits_the_verified_file() {
    let dir = tempfile::tempdir().unwrap();
    let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
    fs::write(&src, rand_bytes(20 << 20, 6)).unwrap();
    let r = fresh(&src, &dst, false);
    started_early(r.writeback_started(), 20 << 20);
    r.finish(Some(1_700_000_000_000_000_000), Some(0o640), None).unwrap();
    assert_eq!(fs::read(&dst).unwrap(), fs::read(&src).unwrap());
    assert_eq!(leftovers(dir.path()), Vec::<String>::new());
}

#[test]
fn no_fsync_delta_rebuild_converges() {
    // Local copies (copy_local) and received chunks together, without fsync.
    let dir = tempfile::tempdir().unwrap();
    let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
    let mut data = rand_bytes(12 << 20, 7);
    fs::write(&dst, &data).unwrap();
    for b in &mut data[5 << 20..(5 << 20) + 100_000] {
        *b ^= 0x5a;
    }
    fs::write(&src, &data).unwrap();
    // The local copies and the received chunks are handed to writeback as they land.
    let plan = rebuild(&src, &dst, opts(false), |r| {
        started_early(r.writeback_started(), 12 << 20)
    });
    assert!(plan.copy_bytes > 0 && plan.wire_bytes > 0, "{plan:?}");
}

#[test]
fn no_fsync_still_refuses_a_bad_chunk_and_leaves_the_target_alone() {
    let dir = tempfile::tempdir().unwrap();
    let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
    let old = rand_bytes(3 << 20, 10);
    fs::write(&dst, &old).unwrap();
    fs::write(&src, rand_bytes(3 << 20, 12)).unwrap();
    let (r, source) = begin(&src, &dst, true, opts(false));
    let need = r.needed();
    let (mut batch, _) = source.read_batch(&need).unwrap();
    // Raw records: the last byte is the last chunk's payload.
    *batch.last_mut().unwrap() ^= 1;
    assert!(r.write_batch(&batch).is_err());
    assert!(r.finish(None, None, None).is_err());
    r.abort(false);
    assert_eq!(fs::read(&dst).unwrap(), old, "the target is untouched");
}
