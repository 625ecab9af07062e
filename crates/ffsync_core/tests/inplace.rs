//! `--inplace` end to end without a transport: changed ranges only, the target's inode
//! kept, the redo journal completing an interrupted commit, and an incomplete one reported.

mod common;
use common::{leftovers, rand_bytes};
use ffsync_core::restore::inplace::{journal_path, recover, write_journal, Journal};
use ffsync_core::restore::{BeginOptions, LocalSource, Reconstruction};
use ffsync_core::scan::{scan_file, ScanOptions};
use std::fs;
use std::path::Path;

fn sync_inplace(src: &Path, dst: &Path) -> ffsync_core::restore::PlanSummary {
    common::rebuild(
        src,
        dst,
        BeginOptions {
            inplace: true,
            ..Default::default()
        },
        |_| (),
    )
}

#[test]
fn only_changed_ranges_are_written_into_the_same_file() {
    let d = tempfile::tempdir().unwrap();
    let (src, dst) = (d.path().join("src"), d.path().join("dst"));
    let old = rand_bytes(40 << 20, 81);
    fs::write(&dst, &old).unwrap();
    let mut new = old.clone();
    for k in 0..3 {
        let at = (k * 13 + 5) << 20;
        new[at..at + 4096].copy_from_slice(&rand_bytes(4096, 200 + k as u64));
    }
    new.extend_from_slice(&rand_bytes(3 << 20, 9)); // grows
    fs::write(&src, &new).unwrap();
    #[cfg(unix)]
    let ino = std::os::unix::fs::MetadataExt::ino(&fs::metadata(&dst).unwrap());
    let plan = sync_inplace(&src, &dst);
    assert!(plan.inplace);
    assert!(
        plan.in_place_bytes > 35 << 20,
        "only {} bytes left in place",
        plan.in_place_bytes
    );
    assert_eq!(fs::read(&dst).unwrap(), new);
    #[cfg(unix)]
    assert_eq!(
        std::os::unix::fs::MetadataExt::ino(&fs::metadata(&dst).unwrap()),
        ino,
        "same file, updated in place"
    );
    assert!(leftovers(d.path()).is_empty(), "{:?}", leftovers(d.path()));
    // Shrinking works too.
    fs::write(&src, &old[..10 << 20]).unwrap();
    sync_inplace(&src, &dst);
    assert_eq!(fs::read(&dst).unwrap(), &old[..10 << 20]);
}

/// The state a crash leaves after step 1 of a commit: a staged file and a journal, with
/// the target partly written.
fn crash_state(d: &Path, old: &[u8], new: &[u8], applied: usize) -> (std::path::PathBuf, Journal) {
    let dst = d.join("dst");
    fs::write(&dst, old).unwrap();
    let staged = d.join(".dst.0123456789abcdef.ffsync-part");
    let f = fs::File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&staged)
        .unwrap();
    f.set_len(new.len() as u64).unwrap();
    let ranges: Vec<(u64, u64)> = (0..new.len() as u64)
        .step_by(1 << 20)
        .map(|o| (o, (1 << 20).min(new.len() as u64 - o)))
        .collect();
    for &(o, l) in &ranges {
        ffsync_core::io::write_at(&f, &new[o as usize..(o + l) as usize], o).unwrap();
    }
    let s = {
        let p = d.join("new-copy");
        fs::write(&p, new).unwrap();
        scan_file(&p, &ScanOptions::default()).unwrap()
    };
    let j = Journal {
        manifest: s.manifest,
        mtime_ns: None,
        mode: None,
        staged_name: b".dst.0123456789abcdef.ffsync-part".to_vec(),
        ranges: ranges.clone(),
    };
    write_journal(&dst, &j).unwrap();
    // "Killed" after `applied` ranges went into the target.
    let t = fs::File::options().write(true).open(&dst).unwrap();
    for &(o, l) in &ranges[..applied] {
        ffsync_core::io::write_at(&t, &new[o as usize..(o + l) as usize], o).unwrap();
    }
    (dst, j)
}

#[test]
fn an_interrupted_commit_is_completed_by_the_next_run() {
    let d = tempfile::tempdir().unwrap();
    let old = rand_bytes(6 << 20, 91);
    let mut new = rand_bytes(7 << 20, 92);
    new[..1 << 20].copy_from_slice(&old[..1 << 20]);
    let (dst, _) = crash_state(d.path(), &old, &new, 3);
    let msg = recover(&dst).unwrap().expect("a journal was there");
    assert!(msg.contains("completed an interrupted --inplace sync"), "{msg}");
    assert_eq!(fs::read(&dst).unwrap(), new);
    assert!(!journal_path(&dst).exists());
    assert_eq!(recover(&dst).unwrap(), None, "nothing left to do");

    // Any later reconstruction of the target recovers first as well.
    let (dst, _) = crash_state(d.path(), &old, &new, 1);
    let src = d.path().join("new-copy");
    sync_inplace(&src, &dst);
    assert_eq!(fs::read(&dst).unwrap(), new);
}

#[test]
fn a_commit_whose_staged_data_is_gone_is_reported_not_hidden() {
    let d = tempfile::tempdir().unwrap();
    let old = rand_bytes(3 << 20, 93);
    let new = rand_bytes(3 << 20, 94);
    let (dst, j) = crash_state(d.path(), &old, &new, 1);
    fs::remove_file(d.path().join(String::from_utf8(j.staged_name).unwrap())).unwrap();
    let err = recover(&dst).unwrap_err();
    assert_eq!(err.code(), "EVERIFY");
    assert!(err.to_string().contains("may be half-written"), "{err}");
    // Reported once; the journal is gone so a re-sync can repair the file.
    assert!(!journal_path(&dst).exists());
    // A damaged journal is reported the same way.
    let (dst, _) = crash_state(d.path(), &old, &new, 0);
    let jp = journal_path(&dst);
    let mut b = fs::read(&jp).unwrap();
    b[10] ^= 1;
    fs::write(&jp, b).unwrap();
    assert_eq!(recover(&dst).unwrap_err().code(), "EVERIFY");
}

/// With `--inplace` the unmoved chunks stay in the target and must still anchor sub-chunk
/// refinement; otherwise every run is described against the whole old file (a 1 GiB modified
/// sync would send 22.5 MB instead of 1.5 MB).
#[test]
fn inplace_refinement_still_anchors_on_the_unmoved_chunks() {
    let d = tempfile::tempdir().unwrap();
    let (src, dst) = (d.path().join("src"), d.path().join("dst"));
    let old = rand_bytes(40 << 20, 83);
    fs::write(&dst, &old).unwrap();
    let mut new = old.clone();
    new[20 << 20..(20 << 20) + 4096].copy_from_slice(&rand_bytes(4096, 5));
    fs::write(&src, &new).unwrap();
    let s = scan_file(&src, &ScanOptions::default()).unwrap();
    let local = || {
        vec![LocalSource {
            path: dst.clone(),
            manifest: scan_file(&dst, &ScanOptions::default()).unwrap().manifest,
        }]
    };
    for opts in [
        BeginOptions {
            inplace: true,
            ..Default::default()
        },
        BeginOptions::default(),
    ] {
        let r = Reconstruction::begin_with(&dst, s.manifest.clone(), local(), opts).unwrap();
        let table = r.refinement().unwrap();
        // One run of a chunk or two: a region of ~0.5 MiB at 1 KiB blocks, not 40 MiB.
        assert!(
            table.len() < 16 * 1024,
            "refinement table of {} bytes (inplace {})",
            table.len(),
            r.summary().inplace
        );
        r.abort(false);
    }
}
