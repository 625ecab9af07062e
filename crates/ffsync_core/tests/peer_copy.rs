//! A local sync's receiver takes chunks from the sender's own file (decisions §111): every
//! chunk it takes is proven by its hash where it landed, and anything else still crosses.

use ffsync_core::chunk_source::ChunkSource;
use ffsync_core::file_identity::FileIdentity;
use ffsync_core::restore::{BeginOptions, PeerCopy, Reconstruction};
use ffsync_core::scan::{scan_file, ScanOptions};
use std::fs;
use std::path::{Path, PathBuf};

mod common;
use common::rand_bytes;

fn mtime_of(p: &Path) -> i64 {
    FileIdentity::of(&fs::metadata(p).unwrap()).mtime_ns
}

fn begin(dst: &Path, manifest: ffsync_core::manifest::Manifest, pc: PeerCopy) -> Reconstruction {
    Reconstruction::begin_with(
        dst,
        manifest,
        vec![],
        BeginOptions {
            peer_copy: Some(pc),
            ..Default::default()
        },
    )
    .unwrap()
}

fn direct(path: &Path) -> PeerCopy {
    PeerCopy {
        root: None,
        path: path.to_path_buf(),
        mtime_ns: Some(mtime_of(path)),
    }
}

#[test]
fn every_chunk_comes_from_the_senders_file_and_counts_as_literal() {
    let d = tempfile::tempdir().unwrap();
    let (src, dst) = (d.path().join("src"), d.path().join("dst"));
    let data = rand_bytes(20_000_000, 41);
    fs::write(&src, &data).unwrap();
    let s = scan_file(&src, &ScanOptions::default()).unwrap();
    let r = begin(&dst, s.manifest.clone(), direct(&src));
    assert!(r.needed().is_empty(), "{} chunks still asked for", r.needed().len());
    let plan = r.summary();
    assert_eq!((plan.wire_chunks, plan.copy_bytes), (0, data.len() as u64));
    // The sender's bytes, moved without the wire: literal data, not matched.
    assert_eq!(r.literal_bytes(), data.len() as u64);
    assert!(!dst.exists(), "nothing at the target before finish");
    r.finish(None, None, None).unwrap();
    assert_eq!(fs::read(&dst).unwrap(), data);
}

#[test]
fn chunks_that_changed_after_the_scan_still_cross_and_the_result_is_the_scanned_version() {
    let d = tempfile::tempdir().unwrap();
    let (src, orig, dst) = (d.path().join("src"), d.path().join("orig"), d.path().join("dst"));
    let data = rand_bytes(12_000_000, 42);
    fs::write(&src, &data).unwrap();
    fs::write(&orig, &data).unwrap();
    let s = scan_file(&src, &ScanOptions::default()).unwrap();
    let scanned_mtime = mtime_of(&src);
    // Rewritten in place after the sender hashed it, its time put back: only the hashes can tell.
    let mut changed = data.clone();
    changed[5_000_000..5_000_100].fill(0xA5);
    fs::write(&src, &changed).unwrap();
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_nanos(scanned_mtime as u64);
    let f = fs::OpenOptions::new().write(true).open(&src).unwrap();
    f.set_times(fs::FileTimes::new().set_modified(t)).unwrap();
    drop(f);
    assert_eq!(mtime_of(&src), scanned_mtime);
    let r = begin(&dst, s.manifest.clone(), direct(&src));
    let need = r.needed();
    let touched: Vec<u32> = s
        .manifest
        .chunks
        .iter()
        .enumerate()
        .filter(|(_, c)| c.offset < 5_000_100 && c.offset + c.len as u64 > 5_000_000)
        .map(|(i, _)| i as u32)
        .collect();
    assert_eq!(need, touched, "exactly the chunks the change touched are asked for");
    // They cross (here from the version that was scanned), and the result is that version.
    let source = ChunkSource::open(&orig, s.manifest.clone(), s.identity, 1, true).unwrap();
    let (batch, _) = source.read_batch(&need).unwrap();
    r.write_batch(&batch).unwrap();
    r.finish(None, None, None).unwrap();
    assert_eq!(fs::read(&dst).unwrap(), data);
}

#[test]
fn a_file_with_another_time_or_size_is_not_used() {
    let d = tempfile::tempdir().unwrap();
    let (src, dst) = (d.path().join("src"), d.path().join("dst"));
    fs::write(&src, rand_bytes(3_000_000, 43)).unwrap();
    let s = scan_file(&src, &ScanOptions::default()).unwrap();
    let all = s.manifest.chunks.len();
    let mut pc = direct(&src);
    pc.mtime_ns = Some(pc.mtime_ns.unwrap() + 1);
    let r = begin(&dst, s.manifest.clone(), pc);
    assert_eq!(r.needed().len(), all);
    assert_eq!(r.literal_bytes(), 0);
    r.abort(false);
    // Another size: not the file that was scanned.
    fs::write(&src, rand_bytes(3_000_001, 43)).unwrap();
    let r = begin(
        &dst,
        s.manifest.clone(),
        PeerCopy {
            mtime_ns: None,
            ..direct(&src)
        },
    );
    assert_eq!(r.needed().len(), all);
    r.abort(false);
    // Missing: nothing taken, nothing fails.
    let r = begin(
        &dst,
        s.manifest.clone(),
        PeerCopy {
            path: PathBuf::from("/nonexistent/ffsync/peer"),
            ..direct(&src)
        },
    );
    assert_eq!(r.needed().len(), all);
    r.abort(false);
}

#[cfg(unix)]
#[test]
fn a_single_file_named_through_a_link_is_read_as_named() {
    // The user named the link; the sender reads through it, and so does the copy.
    let d = tempfile::tempdir().unwrap();
    let (real, link, dst) = (
        d.path().join("real.bin"),
        d.path().join("named.bin"),
        d.path().join("dst"),
    );
    let data = rand_bytes(2_000_000, 45);
    fs::write(&real, &data).unwrap();
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let s = scan_file(&link, &ScanOptions::default()).unwrap();
    let r = begin(&dst, s.manifest.clone(), direct(&link));
    assert!(r.needed().is_empty(), "{} chunks still asked for", r.needed().len());
    r.finish(None, None, None).unwrap();
    assert_eq!(fs::read(&dst).unwrap(), data);
}

#[cfg(unix)]
#[test]
fn beneath_its_root_a_link_is_never_followed() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("root");
    fs::create_dir_all(root.join("sub")).unwrap();
    let real = root.join("sub/f.bin");
    fs::write(&real, rand_bytes(2_500_000, 44)).unwrap();
    let s = scan_file(&real, &ScanOptions::default()).unwrap();
    let mtime = Some(mtime_of(&real));
    let under = |rel: &str| PeerCopy {
        root: Some(root.clone()),
        path: PathBuf::from(rel),
        mtime_ns: mtime,
    };
    // The file itself, beneath the root: taken.
    let r = begin(&d.path().join("a"), s.manifest.clone(), under("sub/f.bin"));
    assert!(r.needed().is_empty());
    r.abort(false);
    // A link to it as the file, and a linked directory on the way: neither followed.
    std::os::unix::fs::symlink(&real, root.join("link.bin")).unwrap();
    std::os::unix::fs::symlink(root.join("sub"), root.join("dirlink")).unwrap();
    for rel in ["link.bin", "dirlink/f.bin"] {
        let r = begin(&d.path().join("b"), s.manifest.clone(), under(rel));
        assert_eq!(r.needed().len(), s.manifest.chunks.len(), "{rel} was followed");
        r.abort(false);
    }
}
