//! Sparse files end to end without a transport: the sender's holes (SEEK_HOLE/SEEK_DATA)
//! are never requested, the result has the same holes, and a lying hole list cannot zero
//! real data.
#![cfg(unix)]

mod common;
use common::rand_bytes;
use ffsync_core::chunk_source::ChunkSource;
use ffsync_core::io::write_at;
use ffsync_core::restore::{BeginOptions, LocalSource, Reconstruction};
use ffsync_core::scan::{scan_file, ScanOptions};
use ffsync_core::sparse::{holes, Hole};
use std::fs::{self, File};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

const MIB: u64 = 1 << 20;

/// 64 MiB with data at three places and holes everywhere else.
fn sparse_source(path: &Path) -> Vec<Hole> {
    let f = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .unwrap();
    f.set_len(64 * MIB).unwrap();
    for (k, at) in [0, 20 * MIB, 63 * MIB].into_iter().enumerate() {
        write_at(&f, &rand_bytes(300_000, k as u64 + 1), at).unwrap();
    }
    f.sync_all().unwrap();
    holes(&f, 64 * MIB).unwrap()
}

fn rebuild(src: &Path, dst: &Path, hole_list: Vec<Hole>, local: bool) -> ffsync_core::Result<(u64, u32)> {
    let s = scan_file(src, &ScanOptions::default()).unwrap();
    let locals = if local {
        vec![LocalSource {
            path: dst.to_path_buf(),
            manifest: scan_file(dst, &ScanOptions::default()).unwrap().manifest,
        }]
    } else {
        vec![]
    };
    let r = Reconstruction::begin_with(
        dst,
        s.manifest.clone(),
        locals,
        BeginOptions {
            holes: hole_list,
            ..Default::default()
        },
    )?;
    let source = ChunkSource::open(src, s.manifest.clone(), s.identity, 0, false).unwrap();
    r.copy_local()?;
    let need = r.needed();
    for group in need.chunks(8) {
        let (batch, _) = source.read_batch(group).unwrap();
        r.write_batch(&batch)?;
    }
    let hole_bytes = r.summary().hole_bytes;
    match r.finish(None, None, None) {
        Ok(_) => Ok((hole_bytes, need.len() as u32)),
        Err(e) => {
            r.abort(false);
            Err(e)
        }
    }
}

/// The sender asks for holes only when a file's allocated blocks are fewer than its bytes
/// (ts/api/content-send.ts, `mayHaveHoles`): a file with holes always is such a file (so one
/// not asked has none); a file written whole has none.
#[test]
fn a_file_with_holes_has_fewer_blocks_than_bytes_and_a_dense_one_has_none() {
    let dir = tempfile::tempdir().unwrap();
    let sparse = dir.path().join("sparse.img");
    let found = sparse_source(&sparse);
    if found.is_empty() {
        return; // this filesystem reports no holes: nothing to check
    }
    let m = fs::metadata(&sparse).unwrap();
    assert!(
        m.blocks() * 512 < m.len(),
        "{} blocks of 512 for {} bytes",
        m.blocks(),
        m.len()
    );
    let dense = dir.path().join("dense.bin");
    fs::write(&dense, rand_bytes(3 * MIB as usize + 123, 9)).unwrap();
    let f = File::open(&dense).unwrap();
    f.sync_all().unwrap();
    let d = f.metadata().unwrap();
    // (On filesystems whose block counts lag behind writes, ZFS's, a dense file may show fewer:
    // then it is asked, which costs a query, never a wrong answer.)
    assert!(holes(&f, d.len()).unwrap().is_empty());
}

#[test]
fn holes_are_not_sent_and_are_recreated() {
    let d = tempfile::tempdir().unwrap();
    let (src, dst) = (d.path().join("src"), d.path().join("dst"));
    let h = sparse_source(&src);
    if h.is_empty() {
        eprintln!("SKIPPED sparse test: this filesystem reports no holes");
        return;
    }
    let (hole_bytes, needed) = rebuild(&src, &dst, h.clone(), false).unwrap();
    assert_eq!(fs::read(&dst).unwrap(), fs::read(&src).unwrap());
    assert!(hole_bytes > 50 * MIB, "only {hole_bytes} bytes recognised as holes");
    assert!(needed < 12, "{needed} chunks requested for ~1 MiB of data");
    let blocks = fs::metadata(&dst).unwrap().blocks() * 512;
    assert!(blocks < 8 * MIB, "result allocates {blocks} bytes of 64 MiB");
    assert_eq!(
        holes(&File::open(&dst).unwrap(), 64 * MIB).unwrap().len(),
        h.len(),
        "same number of holes"
    );

    // Again with the old (sparse) target as a local source: still sparse.
    let (_, needed) = rebuild(&src, &dst, h, true).unwrap();
    assert_eq!(needed, 0);
    assert!(fs::metadata(&dst).unwrap().blocks() * 512 < 8 * MIB);
}

#[test]
fn a_hole_list_that_covers_data_fails_verification_and_commits_nothing() {
    let d = tempfile::tempdir().unwrap();
    let (src, dst) = (d.path().join("src"), d.path().join("dst"));
    sparse_source(&src);
    fs::write(&dst, b"old").unwrap();
    // A "hole" over the data at 20 MiB: the chunks there are not all zeros, so they are
    // requested; punching would zero them, and the re-verification refuses the result.
    let lie = vec![Hole {
        offset: 19 * MIB,
        len: 2 * MIB,
    }];
    let err = rebuild(&src, &dst, lie, false).unwrap_err();
    assert_eq!(err.code(), "EVERIFY", "{err}");
    assert_eq!(fs::read(&dst).unwrap(), b"old");
    assert!(fs::read_dir(d.path()).unwrap().all(|e| !e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .ends_with(".ffsync-part")));
}
