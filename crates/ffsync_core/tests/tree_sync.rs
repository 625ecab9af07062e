//! Tree sync end to end without a transport: two `TreeSync` peers (a sender over one temp
//! tree, a receiver over another, each with its own state dir) driven through the same
//! sequence the TypeScript shell uses: walk, exchange manifests, supply roots, triage on
//! both sides (the plans must agree), prepare, small-file batches, large files (emulated
//! by a direct copy + `claim_root`), finish.
#![cfg(unix)]

use ffsync_core::file_identity::FileIdentity;
use ffsync_core::restore::system_time_from_ns;
use ffsync_core::tree::file_batch::{self, FileStatus};
use ffsync_core::tree::filter::Filter;
use ffsync_core::tree::manifest::{Kind, NewEntry, TreeBuilder};
use ffsync_core::tree::path::join;
use ffsync_core::tree::sync::TreeSync;
use ffsync_core::tree::triage::{action_flags, Action, Op, TriageOptions};
use ffsync_core::tree::{index, walk};
use std::collections::BTreeMap;
use std::fs::{self, File, FileTimes, Permissions};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// A fixed mtime well in the past (so index entries are never "racily clean").
const T0: i64 = 1_600_000_000_123_456_789;

mod common;

fn bytes(len: usize, seed: u64) -> Vec<u8> {
    common::rand_bytes(len, seed.wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

/// One peer's directories: `base/tree` (synced) and `base/state` (its tree index).
struct Side {
    _tmp: tempfile::TempDir,
    base: PathBuf,
    tree: PathBuf,
    state: PathBuf,
}

impl Side {
    fn new() -> Side {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path().to_path_buf();
        let tree = base.join("tree");
        fs::create_dir(&tree).unwrap();
        Side {
            state: base.join("state"),
            tree,
            base,
            _tmp: tmp,
        }
    }
    fn p(&self, rel: &str) -> PathBuf {
        self.tree.join(rel)
    }
    fn put(&self, rel: &str, data: &[u8]) {
        put(&self.tree, rel, data, T0)
    }
    fn read(&self, rel: &str) -> Vec<u8> {
        fs::read(self.p(rel)).unwrap()
    }
    /// A fresh state dir: no index from earlier sessions.
    fn forget_index(&self) {
        let _ = fs::remove_dir_all(&self.state);
    }
}

fn put(root: &Path, rel: &str, data: &[u8], mtime_ns: i64) {
    let p = root.join(rel);
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(&p, data).unwrap();
    set_mtime(&p, mtime_ns);
}

fn set_mtime(p: &Path, ns: i64) {
    File::open(p)
        .unwrap()
        .set_times(FileTimes::new().set_modified(system_time_from_ns(ns)))
        .unwrap();
}

fn chmod(p: &Path, mode: u32) {
    fs::set_permissions(p, Permissions::from_mode(mode)).unwrap();
}

#[derive(Debug, PartialEq, Eq)]
enum Node {
    Dir { mode: u32, mtime: i64 },
    File { hash: String, mode: u32, mtime: i64 },
    Link(Vec<u8>),
}

/// Relative path (escaped bytes) -> what is there, never following links.
fn snapshot(root: &Path) -> BTreeMap<String, Node> {
    fn visit(root: &Path, rel: Vec<u8>, out: &mut BTreeMap<String, Node>) {
        let p = join(root, &rel);
        let m = fs::symlink_metadata(&p).unwrap();
        let (mode, mtime) = (m.mode() & 0o7777, m.mtime() * 1_000_000_000 + m.mtime_nsec());
        let node = if m.file_type().is_symlink() {
            Node::Link(fs::read_link(&p).unwrap().as_os_str().as_bytes().to_vec())
        } else if m.is_dir() {
            for e in fs::read_dir(&p).unwrap() {
                let mut child = rel.clone();
                if !child.is_empty() {
                    child.push(b'/');
                }
                child.extend_from_slice(e.unwrap().file_name().as_bytes());
                visit(root, child, out);
            }
            Node::Dir { mode, mtime }
        } else {
            Node::File {
                hash: blake3::hash(&fs::read(&p).unwrap()).to_hex().to_string(),
                mode,
                mtime,
            }
        };
        out.insert(rel.escape_ascii().to_string(), node);
    }
    let mut out = BTreeMap::new();
    visit(root, Vec::new(), &mut out);
    out
}

fn assert_same(src: &Side, dst: &Side) {
    assert_eq!(snapshot(&src.tree), snapshot(&dst.tree));
}

#[derive(Clone, Copy, Default)]
struct Opts {
    checksum: bool,
    delete: bool,
    /// Call `finish_receiver(false)` (a transfer failed: no deletions).
    no_delete_at_finish: bool,
    filter: &'static [&'static str],
    protect: &'static [&'static str],
    max_size: Option<u64>,
    min_size: Option<u64>,
    /// The receiver runs with `--no-fsync`.
    no_fsync: bool,
    /// `sync` without -t / -p.
    omit_times: bool,
    omit_perms: bool,
    /// rsync's --size-only, --ignore-existing, --existing.
    size_only: bool,
    ignore_existing: bool,
    existing_only: bool,
    /// A local sync's default: changed files up to 1 MiB travel whole.
    whole_small: bool,
    /// The receiver's rsync --partial-dir.
    partial_dir: Option<&'static str>,
}

struct Synced {
    plan: Vec<Action>,
    s: TreeSync,
    r: TreeSync,
    /// Action numbers of the small-file records the sender produced.
    records: Vec<u32>,
    errors: Vec<String>,
}

impl Synced {
    fn path(&self, a: &Action) -> String {
        let e = match a.op {
            Op::Delete => self.r.local.manifest.entry(a.receiver_entry as usize),
            _ => self.s.local.manifest.entry(a.sender_entry as usize),
        };
        e.path.escape_ascii().to_string()
    }
    fn ops(&self, op: Op) -> Vec<String> {
        self.plan.iter().filter(|a| a.op == op).map(|a| self.path(a)).collect()
    }
    fn find(&self, op: Op, path: &str) -> (usize, Action) {
        let k = self.plan.iter().position(|a| a.op == op && self.path(a) == path);
        let k = k.unwrap_or_else(|| panic!("no {op:?} for {path} in\n{}", self.s.describe()));
        (k, self.plan[k])
    }
    fn has_changes(&self) -> bool {
        self.plan
            .iter()
            .any(|a| matches!(a.op, Op::Transfer | Op::LocalCopy | Op::Delete | Op::Mkdir))
    }
}

/// The plan's chunk-level transfers, by path, each with whether it is a delta.
fn large_paths(t: &TreeSync) -> Vec<(String, bool)> {
    let mut large: Vec<(String, bool)> = t
        .large_transfers()
        .into_iter()
        .map(|l| (String::from_utf8(l.path).unwrap(), l.delta))
        .collect();
    large.sort();
    large
}

fn small_count(t: &TreeSync) -> usize {
    t.plan()
        .actions
        .iter()
        .filter(|a| a.op == Op::Transfer && a.flags & action_flags::SMALL != 0)
        .count()
}

fn patterns(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn open(side: &Side, filter: &Filter, protect: Option<&Filter>, sender: bool) -> TreeSync {
    let idx = index::load(&side.state, &side.tree);
    let o = walk::WalkOptions {
        filter,
        protect,
        index: idx.as_ref(),
        progress: None,
        one_file_system: false,
        skip_symlinks: false,
        copy_links: false,
        dir_merge: &[],
        select: None,
        chmod: None,
        prune_empty_dirs: false,
    };
    TreeSync::new(walk::walk(&side.tree, &o).unwrap(), sender, Some(side.state.clone()))
}

/// Steps 1-4: walk, exchange manifests, supply roots, triage on both sides.
fn negotiate(src: &Side, dst: &Side, o: Opts) -> (TreeSync, TreeSync) {
    let filter = Filter::new(&patterns(o.filter)).unwrap();
    let wire_filter = Filter::decode(&filter.encode()).unwrap();
    let protect = Filter::new(&patterns(o.protect)).unwrap();
    let mut s = open(src, &filter, None, true);
    let mut r = open(dst, &wire_filter, (!o.protect.is_empty()).then_some(&protect), false);
    r.set_fsync(!o.no_fsync);
    r.set_partial_dir(
        o.partial_dir
            .map(|d| ffsync_core::restore::partial_dir::PartialDir::parse(d).unwrap()),
    );
    let (sm, rm) = (
        s.local.manifest.encode_compressed(),
        r.local.manifest.encode_compressed(),
    );
    s.set_peer_manifest(&rm).unwrap();
    r.set_peer_manifest(&sm).unwrap();
    let (si, ri) = (s.roots_to_supply(o.checksum), r.roots_to_supply(o.checksum));
    let (sb, rb) = (s.hash_entries(&si, None), r.hash_entries(&ri, None));
    s.set_peer_roots(&rb).unwrap();
    r.set_peer_roots(&sb).unwrap();
    let t = TriageOptions {
        checksum: o.checksum,
        delete: o.delete,
        max_size: o.max_size,
        min_size: o.min_size,
        omit_times: o.omit_times,
        omit_perms: o.omit_perms,
        size_only: o.size_only,
        ignore_existing: o.ignore_existing,
        existing_only: o.existing_only,
        whole_small: o.whole_small,
        ..Default::default()
    };
    let sp = s.triage(t).actions.clone();
    assert_eq!(sp, r.triage(t).actions, "both peers must derive the same plan");
    (s, r)
}

/// Steps 5-6: prepare, small batches, large files (emulated), finish both sides.
/// Every small-file batch from `s` written by `r`: the actions of the records, and the
/// per-path errors (vanished ones included).
fn send_small(s: &TreeSync, r: &TreeSync) -> (Vec<u32>, Vec<String>) {
    let small = s
        .plan()
        .actions
        .iter()
        .filter(|a| a.op == Op::Transfer && a.flags & action_flags::SMALL != 0);
    let biggest = small
        .map(|a| s.local.manifest.entry(a.sender_entry as usize).size)
        .max()
        .unwrap_or(0);
    let mut buf = vec![0u8; (biggest as usize + 4096).max(48 * 1024)];
    let (mut cursor, mut records, mut errors) = (Some(0), Vec::new(), Vec::new());
    // Every encoding a batch may have, batch by batch in turn, starting where the test's number
    // of small files puts it (most tests send one batch): raw (level 0: read in place), files
    // sharing a stream, files compressed each on its own.
    let mut batch = small_count(r);
    while let Some(c) = cursor {
        batch += 1;
        let (level, shared) = match batch % 3 {
            0 => (0, false),
            1 => (1, true),
            _ => (1, false),
        };
        let (n, next, _) = s.read_small(c, &mut buf, level, shared).unwrap();
        records.extend(file_batch::decode(&buf[..n]).unwrap().iter().map(|rec| rec.action));
        let o = r.write_small(&buf[..n]).unwrap();
        errors.extend(o.errors.into_iter().chain(o.vanished));
        cursor = next;
    }
    (records, errors)
}

fn execute(src: &Side, dst: &Side, s: &TreeSync, r: &TreeSync, delete_ok: bool) -> (Vec<u32>, Vec<String>) {
    let mut errors = r.prepare().unwrap().errors;
    let (records, small_errors) = send_small(s, r);
    errors.extend(small_errors);
    let key = |v: Vec<ffsync_core::tree::sync::LargeTransfer>| {
        v.into_iter().map(|l| (l.action, l.path, l.delta)).collect::<Vec<_>>()
    };
    assert_eq!(key(s.large_transfers()), key(r.large_transfers()));
    for lt in r.large_transfers() {
        let k = lt.action as usize;
        r.clear_for(k).unwrap();
        let to = join(&dst.tree, &lt.path);
        fs::copy(join(&src.tree, &lt.path), &to).unwrap();
        let f = File::options().write(true).open(&to).unwrap();
        f.set_times(FileTimes::new().set_modified(system_time_from_ns(lt.mtime_ns.expect("times kept by default"))))
            .unwrap();
        f.set_permissions(Permissions::from_mode(lt.mode.expect("modes kept by default")))
            .unwrap();
        let root = file_batch::root_of_bytes(&fs::read(&to).unwrap());
        s.claim_root(k, root).unwrap();
        r.claim_root(k, root).unwrap();
    }
    // An action the plan does not have is refused, not silently ignored.
    let beyond = r.large_transfers().len() + 1_000_000;
    assert!(r.claim_root(beyond, [0; 32]).is_err());
    assert!(s.claim_root(beyond, [0; 32]).is_err());
    errors.extend(r.finish_receiver(delete_ok).unwrap().errors);
    s.finish_sender();
    (records, errors)
}

/// The whole dance; returns the plan (identical on both sides) and both peers.
fn sync(src: &Side, dst: &Side, o: Opts) -> Synced {
    let (s, r) = negotiate(src, dst, o);
    let (records, errors) = execute(src, dst, &s, &r, !o.no_delete_at_finish);
    Synced {
        plan: s.plan().actions.clone(),
        s,
        r,
        records,
        errors,
    }
}

fn sync_ok(src: &Side, dst: &Side, o: Opts) -> Synced {
    let out = sync(src, dst, o);
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    out
}

/// Files, nested and empty dirs, an empty file, links (relative, dangling, to a dir).
fn populate(src: &Side) {
    src.put("a.txt", b"hello");
    src.put("empty", b"");
    for i in 0..30u64 {
        src.put(&format!("many/f{i:02}"), &bytes(4000 + i as usize, i));
    }
    src.put("deep/er/still/x.bin", &bytes(70_000, 99));
    fs::create_dir_all(src.p("emptydir/nested")).unwrap();
    symlink("a.txt", src.p("link")).unwrap();
    symlink("nowhere/at/all", src.p("dangling")).unwrap();
    symlink("deep", src.p("dirlink")).unwrap();
    symlink("../../a.txt", src.p("deep/er/up")).unwrap();
    chmod(&src.p("a.txt"), 0o600);
    chmod(&src.p("many/f03"), 0o755);
    chmod(&src.p("deep/er"), 0o750);
    set_mtime(&src.p("emptydir/nested"), T0 - 5_000_000_000);
    set_mtime(&src.p("many"), T0 + 7);
}

#[test]
fn fresh_sync_into_an_empty_target_converges() {
    let (src, dst) = (Side::new(), Side::new());
    populate(&src);
    let out = sync_ok(
        &src,
        &dst,
        Opts {
            delete: true,
            ..Default::default()
        },
    );
    assert_same(&src, &dst);
    assert_eq!(out.records.len(), 33, "every file travels as a small record");
    assert_eq!(out.records.len(), small_count(&out.r));
    assert!(out.r.large_transfers().is_empty());
    for m in [&out.s.local.manifest, &out.r.local.manifest] {
        assert!(
            m.iter().all(|e| !e.path.starts_with(b"dirlink/")),
            "a link to a dir is not followed"
        );
    }
    let link = out.s.local.manifest.find(b"dirlink").unwrap();
    assert_eq!(out.s.local.manifest.entry(link).kind, Kind::Symlink);
    assert!(fs::symlink_metadata(dst.p("dirlink")).unwrap().file_type().is_symlink());
    assert!(fs::symlink_metadata(dst.p("dangling"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(out.ops(Op::Mkdir).contains(&"emptydir/nested".to_string()));
}

/// Files that vanished or changed between the walk and the read travel as records without
/// content (exit 24 at the receiver), whatever the level; the records after them are whole.
/// Raw batches are read in place (decisions §102): a record shorter than the place kept for
/// it must not leave a gap or a stale byte before the next.
#[test]
fn files_gone_or_changed_since_the_walk_leave_the_other_records_of_their_batch_whole() {
    for (level, shared) in [(0, false), (1, false), (3, false), (1, true)] {
        let (src, dst) = (Side::new(), Side::new());
        for i in 0..6u64 {
            src.put(&format!("f{i}"), &bytes(1000 + 700 * i as usize, i));
        }
        let (s, r) = negotiate(&src, &dst, Opts::default());
        r.prepare().unwrap();
        fs::remove_file(src.p("f1")).unwrap();
        put(&src.tree, "f3", &bytes(5000, 33), T0); // another size than the walk saw
        let mut f4 = File::options().append(true).open(src.p("f4")).unwrap();
        std::io::Write::write_all(&mut f4, b"more").unwrap(); // grew (its identity tells, before any read)
        drop(f4);
        let mut buf = vec![0xa5u8; 64 * 1024];
        let (n, next, raw) = s.read_small(0, &mut buf, level, shared).unwrap();
        assert_eq!(next, None, "one batch holds the six");
        let mut records = file_batch::decode(&buf[..n]).unwrap();
        file_batch::inflate_streams(&mut records).unwrap();
        let names: Vec<String> = records
            .iter()
            .map(|rec| {
                let a = &s.plan().actions[rec.action as usize];
                String::from_utf8(s.local.manifest.entry(a.sender_entry as usize).path.to_vec()).unwrap()
            })
            .collect();
        assert_eq!(
            names,
            ["f0", "f1", "f2", "f3", "f4", "f5"],
            "level {level} shared {shared}"
        );
        let statuses: Vec<FileStatus> = records.iter().map(|rec| rec.status).collect();
        use FileStatus::{Ok as Fine, Vanished as Gone};
        assert_eq!(
            statuses,
            [Fine, Gone, Fine, Gone, Gone, Fine],
            "level {level} shared {shared}"
        );
        for (rec, name) in records.iter().zip(&names) {
            if rec.status == FileStatus::Ok {
                assert_eq!(
                    &*rec.content().unwrap(),
                    &src.read(name)[..],
                    "level {level} shared {shared}: {name}"
                );
            } else {
                assert!(rec.payload.is_empty() && rec.raw_len == 0);
            }
        }
        assert_eq!(
            raw,
            (1000 + 2400 + 4500) as u64,
            "level {level} shared {shared}: bytes read of the files sent"
        );
        let o = r.write_small(&buf[..n]).unwrap();
        assert_eq!(o.files, 3, "level {level} shared {shared}");
        assert_eq!(o.vanished.len(), 3, "level {level} shared {shared}: {:?}", o.vanished);
        for name in ["f0", "f2", "f5"] {
            assert_eq!(dst.read(name), src.read(name), "level {level} shared {shared}: {name}");
        }
    }
}

#[test]
fn plan_counts_say_what_the_plan_does_on_both_peers() {
    let (src, dst) = (Side::new(), Side::new());
    populate(&src);
    sync_ok(&src, &dst, Opts::default());
    // Since then: one large file changed (same size), one file moved to a new directory, one
    // removed, one added; and the receiver has a file of its own.
    src.put("deep/er/still/x.bin", &bytes(70_000, 98));
    fs::create_dir(src.p("moved")).unwrap();
    fs::rename(src.p("many/f03"), src.p("moved/f03")).unwrap();
    fs::remove_file(src.p("a.txt")).unwrap();
    src.put("new.txt", b"new file");
    dst.put("old.txt", b"extraneous");
    let (s, r) = negotiate(
        &src,
        &dst,
        Opts {
            delete: true,
            ..Default::default()
        },
    );
    let c = s.plan_counts();
    assert_eq!(c, r.plan_counts(), "both peers count the same plan");
    assert_eq!(c.mkdirs, 1, "moved/");
    assert_eq!(c.local_copies, 1, "moved/f03, from many/f03 on the receiver");
    assert_eq!(
        c.large_transfers, 1,
        "x.bin: over 64 KiB, with an old version to delta against"
    );
    assert_eq!(c.small_transfers, 1, "new.txt");
    assert_eq!(c.symlinks, 0);
    assert_eq!(c.deletes, 3, "a.txt, many/f03 (moved away) and old.txt");
    assert_eq!(c.source_files, 33);
    assert_eq!(c.unchanged_files, 30, "all but x.bin, moved/f03 and new.txt");
    let file_bytes: u64 = 8 + (0..30u64).map(|i| 4000 + i).sum::<u64>() + 70_000;
    assert_eq!(c.source_bytes, file_bytes);
    assert_eq!(
        c.transfer_bytes,
        70_000 + 8,
        "x.bin and new.txt (a local copy moves no bytes)"
    );
    assert_eq!((c.created_files, c.created_dirs, c.created_symlinks), (2, 1, 0));
    let ops = |op: Op| s.plan().actions.iter().filter(|a| a.op == op).count() as u32;
    assert_eq!(
        (c.mkdirs, c.deletes, c.attrs_only),
        (ops(Op::Mkdir), ops(Op::Delete), ops(Op::FileMeta))
    );
}

#[test]
fn mtimes_and_modes_of_files_and_dirs_are_adopted() {
    let (src, dst) = (Side::new(), Side::new());
    populate(&src);
    sync_ok(&src, &dst, Opts::default());
    chmod(&src.p("a.txt"), 0o644);
    chmod(&src.p("deep/er/still"), 0o700);
    set_mtime(&src.p("emptydir"), T0 + 1_000);
    // Another mtime, same bytes: the receiver's index (from the first sync) has its root,
    // so the sender hashes its copy and the roots say "same": only attributes change.
    set_mtime(&src.p("many/f05"), T0 + 2_000);
    let out = sync_ok(&src, &dst, Opts::default());
    assert_eq!(out.ops(Op::FileMeta), ["a.txt", "many/f05"]);
    assert!(out.ops(Op::Transfer).is_empty() && out.r.plan().decided_by_root >= 1);
    let dirmeta = out.ops(Op::DirMeta);
    for d in ["deep/er/still", "emptydir"] {
        assert!(dirmeta.contains(&d.to_string()), "{d} in {dirmeta:?}");
    }
    assert!(out.ops(Op::Mkdir).is_empty() && out.ops(Op::Delete).is_empty());
    assert_same(&src, &dst);
    assert_eq!(fs::metadata(dst.p("deep/er/still")).unwrap().mode() & 0o7777, 0o700);
}

#[test]
fn without_times_and_perms_their_differences_change_nothing_and_existing_modes_stay() {
    let (src, dst) = (Side::new(), Side::new());
    populate(&src);
    sync_ok(&src, &dst, Opts::default());
    let omit = Opts {
        omit_times: true,
        omit_perms: true,
        ..Default::default()
    };
    // Attribute-only differences: nothing to do (rsync without -t and -p).
    chmod(&src.p("many/f04"), 0o640);
    set_mtime(&src.p("many/f05"), T0 + 2_000);
    chmod(&src.p("deep/er"), 0o700);
    set_mtime(&src.p("emptydir"), T0 + 3_000);
    let out = sync_ok(&src, &dst, omit);
    assert!(
        out.ops(Op::FileMeta).is_empty() && out.ops(Op::DirMeta).is_empty(),
        "{}",
        out.s.describe()
    );
    assert_eq!(fs::metadata(dst.p("deep/er")).unwrap().mode() & 0o7777, 0o750);
    // A changed file keeps the receiver's mode and gets the time of the write; a new one
    // gets the sender's mode minus the umask.
    chmod(&dst.p("a.txt"), 0o604);
    put(&src.tree, "a.txt", b"hello, changed", T0 + 9_000);
    put(&src.tree, "fresh.sh", b"#!/bin/sh", T0 + 9_000);
    chmod(&src.p("fresh.sh"), 0o777);
    let out = sync_ok(&src, &dst, omit);
    let (_, a) = out.find(Op::Transfer, "a.txt");
    assert_eq!(out.r.metadata_for(&a), (None, Some(0o604)));
    let a = fs::metadata(dst.p("a.txt")).unwrap();
    assert_eq!(fs::read(dst.p("a.txt")).unwrap(), b"hello, changed");
    assert_eq!(a.mode() & 0o7777, 0o604);
    assert_ne!(FileIdentity::of(&a).mtime_ns, T0 + 9_000);
    let umask = {
        let probe = dst.tree.join(".umask-probe");
        fs::create_dir(&probe).unwrap();
        let m = 0o777 & !(fs::metadata(&probe).unwrap().mode() & 0o777);
        fs::remove_dir(&probe).unwrap();
        m
    };
    assert_eq!(fs::metadata(dst.p("fresh.sh")).unwrap().mode() & 0o7777, 0o777 & !umask);
}

#[test]
fn size_only_ignore_existing_and_existing_choose_as_rsync() {
    let (src, dst) = (Side::new(), Side::new());
    populate(&src);
    sync_ok(&src, &dst, Opts::default());
    dst.forget_index(); // size-only must not lean on roots either
    put(&src.tree, "a.txt", b"HELLO", T0 + 50); // same size, other bytes, other time
    put(&src.tree, "many/f07", &bytes(9000, 7), T0 + 60); // another size
    put(&src.tree, "new/file", b"n", T0);
    let size_only = sync_ok(
        &src,
        &dst,
        Opts {
            size_only: true,
            ..Default::default()
        },
    );
    assert_eq!(size_only.ops(Op::FileMeta), ["a.txt"], "same size: attributes only");
    assert_eq!(fs::read(dst.p("a.txt")).unwrap(), b"hello");
    assert!(size_only.ops(Op::Transfer).contains(&"many/f07".to_string()));
    assert!(size_only.ops(Op::Transfer).contains(&"new/file".to_string()));

    put(&src.tree, "many/f08", &bytes(9100, 8), T0 + 70);
    put(&src.tree, "new2/file", b"m", T0);
    let ignore = sync_ok(
        &src,
        &dst,
        Opts {
            ignore_existing: true,
            ..Default::default()
        },
    );
    assert_eq!(ignore.ops(Op::Transfer), ["new2/file"], "{}", ignore.s.describe());
    assert_eq!(ignore.ops(Op::FileMeta), Vec::<String>::new());
    assert_eq!(ignore.ops(Op::Mkdir), ["new2"]);

    put(&src.tree, "new3/file", b"o", T0);
    let existing = sync_ok(
        &src,
        &dst,
        Opts {
            existing_only: true,
            ..Default::default()
        },
    );
    assert!(existing.ops(Op::Transfer).contains(&"many/f08".to_string()));
    assert!(existing.ops(Op::Mkdir).is_empty() && !dst.p("new3").exists());
    assert!(!existing.ops(Op::DirMeta).contains(&"new3".to_string()));
}

#[test]
fn second_sync_is_a_no_op() {
    let (src, dst) = (Side::new(), Side::new());
    populate(&src);
    sync_ok(
        &src,
        &dst,
        Opts {
            delete: true,
            ..Default::default()
        },
    );
    for checksum in [false, true] {
        let out = sync_ok(
            &src,
            &dst,
            Opts {
                delete: true,
                checksum,
                ..Default::default()
            },
        );
        assert!(
            out.plan.is_empty(),
            "checksum={checksum}:\n{}\n{:?}",
            out.s.describe(),
            out.plan
        );
        assert!(!out.has_changes() && out.records.is_empty());
        assert_same(&src, &dst);
    }
}

#[test]
fn same_size_same_mtime_change_needs_checksum_or_an_index() {
    let (src, dst) = (Side::new(), Side::new());
    src.put("same.txt", b"version one!");
    src.put("other.txt", b"untouched");
    sync_ok(&src, &dst, Opts::default());
    // Documented quick check: no index anywhere, no checksum -> size + mtime say "same".
    src.put("same.txt", b"version two!");
    src.forget_index();
    dst.forget_index();
    let out = sync_ok(&src, &dst, Opts::default());
    assert!(!out.has_changes(), "{}", out.s.describe());
    assert_eq!(dst.read("same.txt"), b"version one!");
    // --checksum compares roots (and leaves a receiver index behind).
    let out = sync_ok(
        &src,
        &dst,
        Opts {
            checksum: true,
            ..Default::default()
        },
    );
    assert_eq!(out.ops(Op::Transfer), ["same.txt"]);
    assert_eq!(dst.read("same.txt"), b"version two!");
    assert!(index::load(&dst.state, &dst.tree).is_some());
    // The receiver's index from that session catches the next such change, sender index-less.
    src.put("same.txt", b"version 3!!!");
    src.forget_index();
    let out = sync_ok(&src, &dst, Opts::default());
    assert_eq!(out.ops(Op::Transfer), ["same.txt"]);
    assert_same(&src, &dst);
}

#[test]
fn receiver_index_from_a_plain_previous_sync_catches_a_same_size_same_mtime_change() {
    let (src, dst) = (Side::new(), Side::new());
    src.put("same.txt", b"version one!");
    sync_ok(&src, &dst, Opts::default());
    assert!(
        index::load(&dst.state, &dst.tree).is_some_and(|i| i.len() == 1),
        "small files are indexed"
    );
    src.put("same.txt", b"version two!");
    src.forget_index();
    let out = sync_ok(&src, &dst, Opts::default());
    assert_eq!(out.ops(Op::Transfer), ["same.txt"]);
}

#[test]
fn a_moved_file_is_copied_locally_not_sent() {
    let (src, dst) = (Side::new(), Side::new());
    src.put("dir/a.bin", &bytes(20_000, 7));
    src.put("keep.txt", b"keep");
    sync_ok(&src, &dst, Opts::default());
    fs::create_dir(src.p("other")).unwrap();
    fs::rename(src.p("dir/a.bin"), src.p("other/moved.bin")).unwrap();
    let out = sync_ok(
        &src,
        &dst,
        Opts {
            delete: true,
            ..Default::default()
        },
    );
    let (k, a) = out.find(Op::LocalCopy, "other/moved.bin");
    assert_eq!(out.r.local.manifest.entry(a.basis as usize).path, b"dir/a.bin");
    assert!(
        !out.records.contains(&(k as u32)) && out.records.is_empty(),
        "no bytes sent"
    );
    assert_eq!(out.ops(Op::Delete), ["dir/a.bin"]);
    assert!(out
        .s
        .describe()
        .contains("copy    other/moved.bin (from dir/a.bin, no data sent)"));
    assert_same(&src, &dst);
}

/// Receiver-only paths next to a small shared tree.
fn extraneous(src: &Side, dst: &Side) {
    for s in [src, dst] {
        s.put("common.txt", b"common");
    }
    src.put("sub/x", b"x");
    for p in [
        "extra.txt",
        "extradir/y",
        "extradir/deeper/z",
        "sub/extra",
        "keep.me",
        "prot/a",
        "prot/sub/b",
        "mixed/gone",
        "mixed/keep.me",
        "ex/a.log",
        "ex/b",
    ] {
        dst.put(p, p.as_bytes());
    }
}

#[test]
fn receiver_only_paths_are_deleted_only_when_allowed_and_unprotected() {
    let (src, dst) = (Side::new(), Side::new());
    extraneous(&src, &dst);
    let all = [
        "extra.txt",
        "extradir/deeper/z",
        "sub/extra",
        "keep.me",
        "prot/sub/b",
        "mixed/gone",
        "mixed/keep.me",
        "ex/a.log",
        "ex/b",
    ];
    let base = Opts {
        protect: &["keep.*", "prot/"],
        filter: &["*.log"],
        ..Default::default()
    };
    // --no-delete: nothing planned, nothing removed.
    let out = sync_ok(&src, &dst, base);
    assert!(out.ops(Op::Delete).is_empty());
    assert!(out.r.plan().kept_extraneous >= all.len() as u64);
    assert!(all.iter().all(|p| dst.p(p).exists()));
    // Planned, but finish_receiver(false) (some transfer failed) deletes nothing.
    let out = sync_ok(
        &src,
        &dst,
        Opts {
            delete: true,
            no_delete_at_finish: true,
            ..base
        },
    );
    assert!(!out.ops(Op::Delete).is_empty());
    assert!(all.iter().all(|p| dst.p(p).exists()));
    // Deleted, except protected paths, everything below a protected dir, excluded files
    // (and the directories that still hold them).
    let out = sync_ok(&src, &dst, Opts { delete: true, ..base });
    let deletes = out.ops(Op::Delete);
    assert!(
        deletes
            .iter()
            .all(|d| !d.contains("keep") && !d.starts_with("prot") && !d.ends_with(".log")),
        "{deletes:?}"
    );
    for gone in ["extra.txt", "extradir", "sub/extra", "mixed/gone", "ex/b"] {
        assert!(!dst.p(gone).exists(), "{gone} should be deleted");
    }
    for kept in ["keep.me", "prot/a", "prot/sub/b", "mixed/keep.me", "ex/a.log"] {
        assert!(dst.p(kept).exists(), "{kept} should be kept");
    }
    assert_eq!(dst.read("sub/x"), b"x");
}

#[test]
fn kind_swaps_converge() {
    let (src, dst) = (Side::new(), Side::new());
    src.put("f2d", b"file");
    src.put("d2f/inner/deep", b"deep");
    symlink("x", src.p("l2f")).unwrap();
    src.put("f2l", b"file2");
    symlink("d2f", src.p("l2d")).unwrap();
    src.put("d2l/q", b"q");
    sync_ok(&src, &dst, Opts::default());
    assert_same(&src, &dst);
    fs::remove_file(src.p("f2d")).unwrap();
    src.put("f2d/n", b"now a dir");
    fs::remove_dir_all(src.p("d2f")).unwrap();
    src.put("d2f", b"now a file");
    fs::remove_file(src.p("l2f")).unwrap();
    src.put("l2f", b"was a link");
    fs::remove_file(src.p("f2l")).unwrap();
    symlink("f2d", src.p("f2l")).unwrap();
    fs::remove_file(src.p("l2d")).unwrap();
    src.put("l2d/z", b"was a link too");
    fs::remove_dir_all(src.p("d2l")).unwrap();
    symlink("elsewhere", src.p("d2l")).unwrap();
    let out = sync_ok(
        &src,
        &dst,
        Opts {
            delete: true,
            ..Default::default()
        },
    );
    for (op, p) in [
        (Op::Mkdir, "f2d"),
        (Op::Mkdir, "l2d"),
        (Op::Transfer, "d2f"),
        (Op::Transfer, "l2f"),
        (Op::Symlink, "f2l"),
        (Op::Symlink, "d2l"),
    ] {
        assert!(
            out.find(op, p).1.flags & action_flags::REPLACE != 0,
            "{op:?} {p} replaces"
        );
    }
    assert_same(&src, &dst);
}

#[test]
fn excluded_paths_are_invisible_on_both_sides() {
    let (src, dst) = (Side::new(), Side::new());
    src.put("a.log", b"sender log, longer");
    src.put("build/out.o", b"obj");
    src.put("src/main.rs", b"fn main() {}");
    src.put("nested/b.log", b"new");
    dst.put("a.log", b"receiver log");
    dst.put("build/old.o", b"old");
    dst.put("other.log", b"mine");
    dst.put("nested/b.log", b"old");
    dst.put("gone/x", b"x");
    dst.put("gone/y.log", b"y");
    let o = Opts {
        filter: &["*.log", "build/"],
        delete: true,
        ..Default::default()
    };
    let out = sync_ok(&src, &dst, o);
    for m in [&out.s.local.manifest, &out.r.local.manifest] {
        assert!(m
            .iter()
            .all(|e| !e.path.ends_with(b".log") && !e.path.starts_with(b"build")));
    }
    assert_eq!(dst.read("a.log"), b"receiver log");
    assert_eq!(dst.read("nested/b.log"), b"old");
    assert_eq!(dst.read("other.log"), b"mine");
    assert_eq!(dst.read("build/old.o"), b"old");
    assert!(!dst.p("build/out.o").exists() && !dst.p("gone/x").exists());
    assert_eq!(dst.read("gone/y.log"), b"y", "an excluded file keeps its directory");
    assert_eq!(dst.read("src/main.rs"), b"fn main() {}");
    assert_eq!(out.ops(Op::Delete), ["gone/x", "gone"]);
}

#[cfg(target_os = "linux")]
#[test]
fn non_utf8_names_round_trip() {
    use std::ffi::OsStr;
    let (src, dst) = (Side::new(), Side::new());
    let name = |b: &[u8]| src.tree.join(OsStr::from_bytes(b));
    fs::write(name(b"caf\xe9.txt"), b"latin-1 name").unwrap();
    fs::create_dir(name(b"\xff\xfe")).unwrap();
    fs::write(name(b"\xff\xfe/\x80"), b"inner").unwrap();
    symlink(OsStr::from_bytes(b"caf\xe9.txt"), name(b"l\xff")).unwrap();
    let out = sync_ok(&src, &dst, Opts::default());
    assert_eq!(out.records.len(), 2);
    assert_same(&src, &dst);
    assert_eq!(
        fs::read(dst.tree.join(OsStr::from_bytes(b"\xff\xfe/\x80"))).unwrap(),
        b"inner"
    );
    assert!(!sync_ok(&src, &dst, Opts::default()).has_changes());
}

#[test]
fn a_hostile_peer_cannot_make_the_receiver_write_elsewhere() {
    let (src, dst) = (Side::new(), Side::new());
    src.put("dir/one.txt", b"one");
    src.put("two.txt", b"two");
    src.put("three.txt", b"three");
    let (s, mut r) = negotiate(&src, &dst, Opts::default());
    let plan = s.plan().actions.clone();
    let path = |a: &Action| s.local.manifest.entry(a.sender_entry as usize).path.to_vec();
    let idx = |op: Op, p: &[u8]| plan.iter().position(|a| a.op == op && path(a) == p).unwrap() as u32;
    let (mkdir, two, three) = (
        idx(Op::Mkdir, b"dir"),
        idx(Op::Transfer, b"two.txt"),
        idx(Op::Transfer, b"three.txt"),
    );
    r.prepare().unwrap();
    let rec = |k: u32, data: &[u8]| {
        let mut b = Vec::new();
        file_batch::encode_record(k, FileStatus::Ok, data, 0, &mut b);
        b
    };
    assert!(r.write_small(&rec(mkdir, b"")).is_err(), "a record for a Mkdir");
    assert!(
        r.write_small(&rec(plan.len() as u32 + 3, b"two")).is_err(),
        "no such action"
    );
    assert!(
        r.write_small(&rec(two, b"longer than the manifest")).is_err(),
        "wrong size"
    );
    let mut wrong_root = rec(three, b"THREE");
    wrong_root[20] ^= 1;
    assert!(r.write_small(&wrong_root).is_err(), "root does not match the bytes");
    assert!(!dst.p("three.txt").exists());
    assert_eq!(r.write_small(&rec(two, b"two")).unwrap().files, 1);
    assert!(r.write_small(&rec(two, b"two")).is_err(), "delivered twice");
    let one = idx(Op::Transfer, b"dir/one.txt");
    assert!(
        r.write_small(&[rec(one, b"one"), rec(one, b"one")].concat()).is_err(),
        "twice in one batch"
    );
    // Roots for entries the peer does not have.
    let roots = |i: u32, n: u32| [n.to_le_bytes().to_vec(), i.to_le_bytes().to_vec(), vec![0; 32]].concat();
    assert!(r.set_peer_roots(&roots(999, 1)).is_err(), "index out of range");
    assert!(r.set_peer_roots(&roots(0, 1)).is_err(), "the root dir is not a file");
    assert!(r.set_peer_roots(&roots(1, 2)).is_err(), "count does not fit");
    // A manifest naming a path outside the tree is refused outright.
    let mut b = TreeBuilder::new();
    for (path, kind) in [(&b""[..], Kind::Dir), (b"../escape", Kind::File)] {
        b.push(&NewEntry {
            path,
            kind,
            flags: 0,
            mode: 0o644,
            size: 0,
            mtime_ns: 0,
            root: None,
            link: b"",
        });
    }
    assert!(r.set_peer_manifest(&b.finish().encode_compressed()).is_err());
    // Nothing outside the target; inside it, only what the plan allowed.
    let names = |d: &Path| {
        fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(names(&dst.base), ["tree"]);
    let mut inside = names(&dst.tree);
    inside.sort();
    assert_eq!(inside, ["dir", "two.txt"]);
    assert_eq!(names(&dst.p("dir")), Vec::<String>::new());
}

#[test]
fn large_files_are_listed_for_the_chunk_conversation() {
    const MIB: usize = 1 << 20;
    let (src, dst) = (Side::new(), Side::new());
    src.put("new_big.bin", &bytes(2 * MIB + 3, 1));
    src.put("grown.bin", &bytes(MIB + MIB / 2, 2));
    dst.put("grown.bin", &bytes(100 * 1024, 3));
    src.put("was_empty.bin", &bytes(MIB + 1, 4));
    dst.put("was_empty.bin", b"");
    src.put("new_mid.bin", &bytes(300 * 1024, 5)); // new and <= 1 MiB: still a batch
    src.put("small.txt", b"small");
    let (s, r) = negotiate(&src, &dst, Opts::default());
    let expect = [("grown.bin", true), ("new_big.bin", false), ("was_empty.bin", false)];
    assert_eq!(large_paths(&r), expect.map(|(p, d)| (p.to_string(), d)));
    assert_eq!(small_count(&r), 2);
    let (records, errors) = execute(&src, &dst, &s, &r, true);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(records.len(), 2);
    assert_same(&src, &dst);
    // claim_root fed the receiver's index: a moved large file is now a local copy.
    fs::rename(src.p("new_big.bin"), src.p("moved_big.bin")).unwrap();
    let out = sync_ok(
        &src,
        &dst,
        Opts {
            delete: true,
            ..Default::default()
        },
    );
    out.find(Op::LocalCopy, "moved_big.bin");
    assert!(out.r.large_transfers().is_empty());
    assert_same(&src, &dst);
}

#[test]
fn whole_small_sends_changed_files_up_to_a_mebibyte_whole_and_larger_ones_as_deltas() {
    const MIB: usize = 1 << 20;
    let (src, dst) = (Side::new(), Side::new());
    // Changed at the same path: 200 KiB and exactly 1 MiB (whole with whole_small), 1 MiB + 1
    // (a delta either way), 64 KiB (whole either way).
    for (name, len, seed) in [
        ("mid.bin", 200 * 1024, 1),
        ("mib.bin", MIB, 3),
        ("over.bin", MIB + 1, 5),
        ("edge.bin", 64 * 1024, 7),
    ] {
        let old = bytes(len, seed);
        let mut new = old.clone();
        new[len / 2] ^= 0xff;
        dst.put(name, &old);
        src.put(name, &new);
        set_mtime(&src.p(name), T0 + 1_000_000_000);
    }
    let plan_of = |whole_small: bool| {
        let (_, r) = negotiate(
            &src,
            &dst,
            Opts {
                whole_small,
                ..Default::default()
            },
        );
        (large_paths(&r), small_count(&r))
    };
    let delta = |names: &[&str]| names.iter().map(|n| (n.to_string(), true)).collect::<Vec<_>>();
    assert_eq!(plan_of(false), (delta(&["mib.bin", "mid.bin", "over.bin"]), 1));
    assert_eq!(plan_of(true), (delta(&["over.bin"]), 3));
    // An earlier chunk-level attempt at mid.bin left a partial of another version: the whole
    // copy leaves none behind. A name of that shape that is not ours (a hard link) stays.
    let stale = dst.p(&ffsync_core::restore::partial_name(b"mid.bin", &[7; 32]).to_string_lossy());
    fs::write(&stale, b"half of another version").unwrap();
    let foreign = dst.p(&ffsync_core::restore::partial_name(b"mib.bin", &[9; 32]).to_string_lossy());
    let elsewhere = dst.base.join("elsewhere");
    fs::write(&elsewhere, b"someone else's").unwrap();
    fs::hard_link(&elsewhere, &foreign).unwrap();
    // And the whole copies land, verified, as the deltas do.
    let out = sync_ok(
        &src,
        &dst,
        Opts {
            whole_small: true,
            ..Default::default()
        },
    );
    assert_eq!(out.records.len(), 3);
    assert!(!stale.exists(), "a stale partial of a file replaced whole");
    assert!(foreign.exists(), "a name not ours is left alone");
    let synced = fs::metadata(&dst.tree).unwrap();
    fs::remove_file(&foreign).unwrap();
    set_mtime(&dst.tree, synced.mtime() * 1_000_000_000 + synced.mtime_nsec());
    assert_same(&src, &dst);
}

/// rsync removes a file's partial from its --partial-dir once the file is done. A whole copy in a
/// batch is a file done: the partials kept there for it go (a replaced file's, a new one's, a
/// small one's, of any version), in a relative directory beside each file (removed once this
/// emptied it) and in an absolute one. Another file's partial, a file of ours by another name, a
/// name that is not ours and what a link planted at the relative directory points to stay; and in
/// a shared (absolute) directory, so do the partials of a name the same session still sends
/// chunk by chunk elsewhere (they may be that file's).
#[test]
fn whole_copies_remove_their_partials_from_the_partial_dir() {
    const KIB: usize = 1024;
    let absolute = tempfile::tempdir().unwrap();
    let abs: &'static str = Box::leak(
        absolute
            .path()
            .join("parts")
            .to_string_lossy()
            .into_owned()
            .into_boxed_str(),
    );
    for dir in [".rsync-partial", abs] {
        let shared = dir.starts_with('/');
        let (src, dst) = (Side::new(), Side::new());
        let old = bytes(300 * KIB, 1);
        let mut new = old.clone();
        new[1000] ^= 0xff;
        dst.put("sub/changed.bin", &old);
        src.put("sub/changed.bin", &new);
        set_mtime(&src.p("sub/changed.bin"), T0 + 1_000_000_000);
        // New here, and larger when their attempts were interrupted.
        src.put("sub/fresh.bin", &bytes(200 * KIB, 2));
        src.put("sub/tiny.bin", &bytes(10 * KIB, 4));
        src.put("sub/kept.bin", &bytes(150 * KIB, 3));
        dst.put("sub/kept.bin", &bytes(150 * KIB, 3));
        // A file named like a batch's file, elsewhere, that goes chunk by chunk (new, 2 MiB).
        src.put("other/fresh.bin", &bytes(2048 * KIB, 6));
        let pdir = if shared {
            PathBuf::from(dir)
        } else {
            dst.p("sub").join(dir)
        };
        fs::create_dir_all(&pdir).unwrap();
        let part = |name: &[u8], v: u8| pdir.join(ffsync_core::restore::partial_name(name, &[v; 32]));
        let mut gone = vec![part(b"changed.bin", 7), part(b"tiny.bin", 6)];
        // kept.bin is unchanged (no batch writes it); notes.txt is not a partial.
        let mut stay = vec![part(b"kept.bin", 9), pdir.join("notes.txt")];
        if shared { &mut stay } else { &mut gone }.push(part(b"fresh.bin", 8));
        for p in gone.iter().chain(&stay) {
            fs::write(p, b"half of an earlier attempt").unwrap();
        }
        let elsewhere = dst.base.join("elsewhere");
        fs::write(&elsewhere, b"someone else's").unwrap();
        let foreign = part(b"changed.bin", 5);
        fs::hard_link(&elsewhere, &foreign).unwrap();
        stay.push(foreign);
        let sync_with_partial_dir = || {
            let o = Opts {
                whole_small: true,
                partial_dir: Some(dir),
                ..Default::default()
            };
            sync_ok(&src, &dst, o)
        };
        let out = sync_with_partial_dir();
        let large: Vec<_> = out.r.large_transfers().into_iter().map(|l| l.path).collect();
        assert_eq!(large, [b"other/fresh.bin".to_vec()], "{dir}: the rest went in batches");
        for p in &gone {
            assert!(!p.exists(), "{dir}: {} removed", p.display());
        }
        for p in &stay {
            assert!(p.exists(), "{dir}: {} stays", p.display());
        }
        // A relative directory this emptied goes (rsync's rule); an absolute one stays, and so
        // does a relative one that held nothing of the batch's files.
        for p in &stay {
            fs::remove_file(p).unwrap();
        }
        fs::write(dst.p("sub/changed.bin"), b"x").unwrap();
        set_mtime(&dst.p("sub/changed.bin"), T0);
        fs::write(part(b"changed.bin", 7), b"half again").unwrap();
        // A batch's new file beside an empty directory of that name (the user's, say).
        src.put("lone/new.bin", &bytes(100 * KIB, 10));
        fs::create_dir_all(dst.p("lone/.rsync-partial")).unwrap();
        let again = sync_with_partial_dir();
        assert!(again.r.large_transfers().is_empty());
        assert!(!part(b"changed.bin", 7).exists());
        assert_eq!(pdir.exists(), shared, "{dir}: emptied");
        assert!(dst.p("lone/.rsync-partial").exists(), "{dir}: held nothing, stays");
        assert_eq!(fs::read(dst.p("sub/changed.bin")).unwrap(), new);
    }
    // A link planted where the relative directory goes is not followed: what it points to stays.
    let (src, dst) = (Side::new(), Side::new());
    src.put("f.bin", &bytes(100 * KIB, 9));
    let outside = tempfile::tempdir().unwrap();
    let planted = outside
        .path()
        .join(ffsync_core::restore::partial_name(b"f.bin", &[3; 32]));
    fs::write(&planted, b"not through a link").unwrap();
    symlink(outside.path(), dst.tree.join(".rsync-partial")).unwrap();
    let o = Opts {
        whole_small: true,
        partial_dir: Some(".rsync-partial"),
        ..Default::default()
    };
    sync_ok(&src, &dst, o);
    assert!(planted.exists());
    assert!(fs::symlink_metadata(dst.tree.join(".rsync-partial"))
        .unwrap()
        .file_type()
        .is_symlink());
}

#[test]
fn setuid_files_converge_to_a_no_op() {
    let (src, dst) = (Side::new(), Side::new());
    src.put("tool", b"#!/bin/sh\n");
    chmod(&src.p("tool"), 0o4755);
    sync_ok(&src, &dst, Opts::default());
    let out = sync_ok(&src, &dst, Opts::default());
    assert!(out.plan.is_empty(), "{}", out.s.describe());
}

#[test]
fn a_file_moved_into_a_directory_of_its_own_name_converges() {
    let (src, dst) = (Side::new(), Side::new());
    src.put("d", &bytes(10_000, 11));
    sync_ok(&src, &dst, Opts::default());
    fs::rename(src.p("d"), src.p("tmp")).unwrap();
    fs::create_dir(src.p("d")).unwrap();
    fs::rename(src.p("tmp"), src.p("d/f")).unwrap();
    let out = sync(
        &src,
        &dst,
        Opts {
            delete: true,
            ..Default::default()
        },
    );
    // The old file `d` is replaced by a directory before local copies run, so it cannot be
    // the copy's source: the file is sent instead.
    out.find(Op::Transfer, "d/f");
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    assert_same(&src, &dst);
}

#[test]
fn replacing_a_directory_keeps_protected_and_excluded_contents() {
    let (src, dst) = (Side::new(), Side::new());
    src.put("cfg", b"now a file");
    src.put("logs", b"now a file too");
    dst.put("cfg/local.conf", b"protected");
    dst.put("logs/today.log", b"excluded");
    let o = Opts {
        protect: &["*.conf"],
        filter: &["*.log"],
        ..Default::default()
    };
    let out = sync(&src, &dst, o);
    assert!(
        dst.p("cfg/local.conf").is_file(),
        "protected file removed with its directory"
    );
    assert!(
        dst.p("logs/today.log").is_file(),
        "excluded file removed with its directory"
    );
    assert_eq!(out.errors.len(), 2, "the replacement is refused and reported");
}

#[cfg(target_os = "linux")]
#[test]
fn local_copies_to_lossy_equal_names_do_not_collide() {
    use std::ffi::OsStr;
    let (src, dst) = (Side::new(), Side::new());
    let data = bytes(5_000, 21);
    src.put("orig", &data);
    sync_ok(&src, &dst, Opts::default());
    fs::create_dir(src.p("dir")).unwrap();
    for n in [&b"dir/\xff"[..], b"dir/\xfe"] {
        fs::write(src.tree.join(OsStr::from_bytes(n)), &data).unwrap();
        set_mtime(&src.tree.join(OsStr::from_bytes(n)), T0);
    }
    let out = sync(&src, &dst, Opts::default());
    assert_eq!(out.ops(Op::LocalCopy).len(), 2);
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    assert_same(&src, &dst);
}

#[test]
fn names_differing_only_in_case_are_detected_for_the_receivers_warning() {
    let (src, dst) = (Side::new(), Side::new());
    src.put("Readme.md", b"1");
    src.put("readme.md", b"2");
    src.put("dir/Makefile", b"3");
    src.put("dir/MAKEFILE", b"4");
    src.put("dir/other", b"5");
    src.put("other/readme.md", b"6");
    let out = sync_ok(&src, &dst, Opts::default());
    let m = &out.s.local.manifest;
    let mut pairs: Vec<(String, String)> = out
        .r
        .case_collisions()
        .into_iter()
        .map(|(a, b)| {
            let n = |i: usize| String::from_utf8_lossy(m.entry(i).path).into_owned();
            let (x, y) = (n(a), n(b));
            if x < y {
                (x, y)
            } else {
                (y, x)
            }
        })
        .collect();
    pairs.sort();
    assert_eq!(
        pairs,
        vec![
            ("Readme.md".to_string(), "readme.md".to_string()),
            ("dir/MAKEFILE".to_string(), "dir/Makefile".to_string())
        ]
    );
    // On this (case-sensitive) filesystem both are kept and nothing is reported.
    assert_same(&src, &dst);
}

#[test]
fn max_and_min_size_leave_files_alone_on_both_sides_and_delete_nothing_for_them() {
    let (src, dst) = (Side::new(), Side::new());
    src.put("tiny.txt", b"12");
    src.put("mid.bin", &bytes(5_000, 1));
    src.put("big.bin", &bytes(200_000, 2));
    src.put("big2", &bytes(150_000, 3));
    // The receiver: an old big.bin, and a directory where the sender has a too-big file.
    dst.put("big.bin", &bytes(200_000, 9));
    dst.put("big2/inside.txt", b"stays");
    let out = sync_ok(
        &src,
        &dst,
        Opts {
            delete: true,
            max_size: Some(100_000),
            min_size: Some(10),
            ..Default::default()
        },
    );
    assert_eq!(out.s.plan().size_skipped, 3, "tiny.txt, big.bin, big2");
    assert_eq!(out.r.plan().size_skipped, 3, "both peers skip the same files");
    assert_eq!(fs::read(dst.p("mid.bin")).unwrap(), bytes(5_000, 1));
    assert!(!dst.p("tiny.txt").exists(), "below --min-size: not sent");
    assert_eq!(
        fs::read(dst.p("big.bin")).unwrap(),
        bytes(200_000, 9),
        "above --max-size: the receiver's copy stays"
    );
    assert_eq!(
        fs::read(dst.p("big2/inside.txt")).unwrap(),
        b"stays",
        "neither replaced nor deleted"
    );
    assert!(out.ops(Op::Delete).is_empty(), "{:?}", out.ops(Op::Delete));
}

/// A no-op with owners and groups carried (`sync -a` as root) changes nothing, so the
/// receiver has nothing to make durable (no syncfs); an owner change alone is applied and
/// counts as a change.
#[cfg(unix)]
#[test]
fn an_unchanged_tree_with_owners_carried_changes_nothing() {
    use ffsync_core::tree::attrs::attr_flags;
    let (src, dst) = (Side::new(), Side::new());
    populate(&src);
    let root = unsafe { libc::geteuid() } == 0;
    if root {
        std::os::unix::fs::lchown(src.p("a.txt"), Some(65534), Some(65534)).unwrap();
        std::os::unix::fs::lchown(src.p("many"), Some(1), Some(1)).unwrap();
    }
    let flags = attr_flags::OWNER | attr_flags::GROUP | attr_flags::NUMERIC_IDS;
    let out = sync_ok(&src, &dst, Opts::default());
    assert!(out
        .r
        .apply_attrs(&out.s.collect_attrs(flags))
        .unwrap()
        .errors
        .is_empty());
    assert!(out.r.changed_anything());
    let owner = |p: &str| {
        let m = fs::symlink_metadata(dst.p(p)).unwrap();
        (m.uid(), m.gid())
    };
    if root {
        assert_eq!((owner("a.txt"), owner("many")), ((65534, 65534), (1, 1)));
    }
    let (s, r) = negotiate(&src, &dst, Opts::default());
    assert!(r.plan().actions.is_empty(), "{}", r.describe());
    let applied = r.apply_attrs(&s.collect_attrs(flags)).unwrap();
    assert!(applied.errors.is_empty(), "{:?}", applied.errors);
    assert!(!r.changed_anything(), "a no-op changed something");
    if root {
        std::os::unix::fs::lchown(src.p("many/f03"), Some(7), Some(8)).unwrap();
        let (s, r) = negotiate(&src, &dst, Opts::default());
        assert!(r.apply_attrs(&s.collect_attrs(flags)).unwrap().errors.is_empty());
        assert!(r.changed_anything(), "an owner change is a change");
        assert_eq!(owner("many/f03"), (7, 8));
        assert_eq!(owner("a.txt"), (65534, 65534));
    }
}

#[cfg(unix)]
#[test]
fn owners_groups_and_xattrs_travel_in_the_attribute_table() {
    use ffsync_core::tree::attrs::attr_flags;
    let (src, dst) = (Side::new(), Side::new());
    src.put("a.txt", b"hello");
    src.put("d/b.bin", &bytes(100_000, 4));
    let xattrs_here = xattr::set(src.p("a.txt"), "user.origin", b"ci-runner-7").is_ok();
    if xattrs_here {
        xattr::set(src.p("d"), "user.dir", b"yes").unwrap();
    }
    // A receiver-side xattr the sender lacks is removed (rsync -X).
    dst.put("a.txt", b"older");
    let _ = xattr::set(dst.p("a.txt"), "user.stale", b"x");
    let root = unsafe { libc::geteuid() } == 0;
    if root {
        std::os::unix::fs::chown(src.p("a.txt"), Some(65534), Some(65534)).unwrap();
        std::os::unix::fs::chown(src.p("d"), Some(1), Some(1)).unwrap();
    }
    let out = sync_ok(&src, &dst, Opts::default());
    let flags = attr_flags::OWNER | attr_flags::GROUP | attr_flags::XATTRS | attr_flags::NUMERIC_IDS;
    let table = out.s.collect_attrs(flags);
    let applied = out.r.apply_attrs(&table).unwrap();
    assert!(applied.errors.is_empty(), "{:?}", applied.errors);
    if xattrs_here {
        assert_eq!(
            xattr::get(dst.p("a.txt"), "user.origin").unwrap().as_deref(),
            Some(&b"ci-runner-7"[..])
        );
        assert_eq!(
            xattr::get(dst.p("a.txt"), "user.stale").unwrap(),
            None,
            "extra xattr removed"
        );
        assert_eq!(
            xattr::get(dst.p("d"), "user.dir").unwrap().as_deref(),
            Some(&b"yes"[..])
        );
    }
    if root {
        let m = fs::metadata(dst.p("a.txt")).unwrap();
        assert_eq!((m.uid(), m.gid()), (65534, 65534));
        let d = fs::metadata(dst.p("d")).unwrap();
        assert_eq!((d.uid(), d.gid()), (1, 1));
        // Without OWNER only the group moves.
        std::os::unix::fs::chown(src.p("a.txt"), Some(2), Some(2)).unwrap();
        let out = sync_ok(&src, &dst, Opts::default());
        out.r
            .apply_attrs(&out.s.collect_attrs(attr_flags::GROUP | attr_flags::NUMERIC_IDS))
            .unwrap();
        let m = fs::metadata(dst.p("a.txt")).unwrap();
        assert_eq!((m.uid(), m.gid()), (65534, 2));
    }
    // A table naming an entry beyond the sender's manifest is refused.
    let bogus = zstd::bulk::compress(
        &ffsync_core::tree::attrs::AttrTable {
            flags,
            entries: vec![(999, Default::default())],
            ..Default::default()
        }
        .encode(),
        1,
    )
    .unwrap();
    assert!(out.r.apply_attrs(&bogus).is_err());
}

/// Everything under `dir` (never following links), for before/after comparisons.
fn outside_snapshot(dir: &Path) -> BTreeMap<String, Node> {
    snapshot(dir)
}

/// A receiver-side link that its own walk never looked at (a FILTER pattern from the
/// sender hides it) meets a sender directory of the same name with small files, a deeper
/// directory, a large file, a local copy and attributes under it. Nothing may be written
/// through the link: every path under it fails on its own, the rest of the tree syncs.
#[test]
fn a_link_hidden_by_the_filter_is_never_written_through() {
    let (src, dst) = (Side::new(), Side::new());
    let outside = tempfile::tempdir().unwrap();
    fs::write(outside.path().join("victim.txt"), b"precious").unwrap();
    src.put("ok.txt", b"fine");
    src.put("link/victim.txt", b"overwritten!");
    src.put("link/new.txt", b"created outside");
    src.put("link/sub/deep.txt", b"deeper");
    src.put("link/big.bin", &bytes(3 << 20, 5));
    src.put("same.txt", b"same bytes");
    src.put("link/copy.txt", b"same bytes");
    symlink(outside.path(), dst.p("link")).unwrap();
    dst.put("same.txt", b"same bytes");
    let before = outside_snapshot(outside.path());
    // The hostile sender walks without the pattern but tells the receiver to exclude `link`.
    let no_filter = Filter::new(&[]).unwrap();
    let wire = Filter::new(&patterns(&["link"])).unwrap();
    let mut s = open(&src, &no_filter, None, true);
    let mut r = open(&dst, &wire, None, false);
    assert!(
        r.local.manifest.find(b"link").is_none(),
        "the receiver's walk never saw its link"
    );
    s.set_peer_manifest(&r.local.manifest.encode_compressed()).unwrap();
    r.set_peer_manifest(&s.local.manifest.encode_compressed()).unwrap();
    let (si, ri) = (s.roots_to_supply(false), r.roots_to_supply(false));
    let (sb, rb) = (s.hash_entries(&si, None), r.hash_entries(&ri, None));
    s.set_peer_roots(&rb).unwrap();
    r.set_peer_roots(&sb).unwrap();
    let t = TriageOptions::default();
    s.triage(t);
    r.triage(t);
    let mut errors = r.prepare().unwrap().errors;
    errors.extend(send_small(&s, &r).1);
    // The large file: its place cannot even be resolved, and the restorer refuses it.
    for lt in r.large_transfers() {
        assert!(r.place(&lt.path).is_err(), "{:?}", lt.path.escape_ascii().to_string());
        let m = ffsync_core::scan::scan_file(&src.p("link/big.bin"), &Default::default())
            .unwrap()
            .manifest;
        let root = ffsync_core::beneath::Dir::open_root(&dst.tree).unwrap();
        let placed = ffsync_core::beneath::Target::beneath(&root, &lt.path)
            .map_err(|e| ffsync_core::CoreError::io(dst.p("x"), e))
            .and_then(|t| ffsync_core::restore::Reconstruction::begin_at(t, m, Vec::new(), Default::default()));
        assert!(placed.is_err());
    }
    let table =
        s.collect_attrs(ffsync_core::tree::attrs::attr_flags::GROUP | ffsync_core::tree::attrs::attr_flags::XATTRS);
    errors.extend(r.apply_attrs(&table).unwrap().errors);
    errors.extend(r.finish_receiver(true).unwrap().errors);
    assert_eq!(
        outside_snapshot(outside.path()),
        before,
        "nothing outside the target changed"
    );
    assert_eq!(fs::read(dst.p("ok.txt")).unwrap(), b"fine");
    assert!(fs::symlink_metadata(dst.p("link")).unwrap().file_type().is_symlink());
    let joined = errors.join("\n");
    assert!(
        joined.contains("link"),
        "the paths under the link are reported: {joined}"
    );
    assert!(
        joined.contains("not followed") || joined.contains("not a directory"),
        "{joined}"
    );
}

/// The receiver's tree changes after its walk: a directory is swapped for a link to
/// another place (a local user, or a race). Writes, local copies, links, metadata and
/// deletions planned for paths under it all stay inside the target.
#[test]
fn a_directory_swapped_for_a_link_after_the_walk_is_never_written_through() {
    let (src, dst) = (Side::new(), Side::new());
    let outside = tempfile::tempdir().unwrap();
    for name in ["a.txt", "gone.txt", "moved.txt"] {
        fs::write(outside.path().join(name), b"precious").unwrap();
    }
    fs::create_dir(outside.path().join("sub")).unwrap();
    // A first sync leaves both indexes, so the second one serves a move from local disk.
    let moved = bytes(100_000, 31);
    src.put("elsewhere.bin", &moved);
    src.put("d/a.txt", b"old content");
    src.put("d/gone.txt", b"to delete");
    fs::create_dir(src.p("d/sub")).unwrap();
    sync_ok(&src, &dst, Opts::default());
    fs::rename(src.p("elsewhere.bin"), src.p("d/moved.bin")).unwrap();
    fs::remove_file(src.p("d/gone.txt")).unwrap();
    src.put("d/a.txt", b"new content, longer");
    src.put("d/sub/x.txt", b"x");
    symlink("a.txt", src.p("d/ln")).unwrap();
    let (s, r) = negotiate(
        &src,
        &dst,
        Opts {
            delete: true,
            ..Default::default()
        },
    );
    assert!(!s.plan().actions.is_empty());
    // After triage: `d` becomes a link to the outside directory.
    let aside = dst.base.join("d.real");
    fs::rename(dst.p("d"), &aside).unwrap();
    symlink(outside.path(), dst.p("d")).unwrap();
    let before = outside_snapshot(outside.path());
    let (_records, mut errors) = execute_inside(&s, &r);
    let ops = |op: Op| s.plan().actions.iter().filter(|a| a.op == op).count();
    assert!(
        ops(Op::LocalCopy) > 0 && ops(Op::Delete) > 0 && ops(Op::Symlink) > 0 && ops(Op::Transfer) > 0,
        "{}",
        s.describe()
    );
    use ffsync_core::tree::attrs::attr_flags;
    let table = s.collect_attrs(attr_flags::GROUP | attr_flags::XATTRS | attr_flags::NUMERIC_IDS);
    errors.extend(r.apply_attrs(&table).unwrap().errors);
    assert_eq!(
        outside_snapshot(outside.path()),
        before,
        "nothing outside the target changed"
    );
    assert!(!errors.is_empty(), "the paths under the swapped directory are reported");
}

/// As `execute`, with large files left out (none in these trees) and errors collected.
fn execute_inside(s: &TreeSync, r: &TreeSync) -> (Vec<u32>, Vec<String>) {
    let mut errors = r.prepare().unwrap().errors;
    let (records, small_errors) = send_small(s, r);
    errors.extend(small_errors);
    assert!(r.large_transfers().is_empty());
    errors.extend(r.finish_receiver(true).unwrap().errors);
    (records, errors)
}

/// Partials: a hard link or a symlink planted at the name the restorer will use for its
/// temp file never gets written through; the planted entry is left alone and a fresh name
/// is used; the result is still right.
#[test]
fn a_link_planted_at_the_partial_name_is_left_alone() {
    use ffsync_core::restore::{partial_path, Reconstruction};
    let t = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let twin = outside.path().join("twin");
    fs::write(&twin, b"precious twin").unwrap();
    let data = bytes(3 << 20, 77);
    let src = t.path().join("src.bin");
    fs::write(&src, &data).unwrap();
    let m = ffsync_core::scan::scan_file(&src, &Default::default())
        .unwrap()
        .manifest;
    for planted in ["hardlink", "symlink"] {
        let dst = t.path().join(format!("dst-{planted}.bin"));
        let partial = partial_path(&dst, &m.root);
        match planted {
            "hardlink" => fs::hard_link(&twin, &partial).unwrap(),
            _ => symlink(&twin, &partial).unwrap(),
        }
        let r = Reconstruction::begin(&dst, m.clone(), Vec::new()).unwrap();
        assert_ne!(r.temp_path(), partial, "{planted}: a fresh temp name");
        let need = r.needed();
        let id = ffsync_core::file_identity::FileIdentity::of(&fs::metadata(&src).unwrap());
        let cs = ffsync_core::chunk_source::ChunkSource::open(&src, m.clone(), id, 0, false).unwrap();
        let (batch, _) = cs.read_batch(&need).unwrap();
        r.write_batch(&batch).unwrap();
        r.finish(None, None, None).unwrap();
        assert_eq!(fs::read(&dst).unwrap(), data);
        assert_eq!(
            fs::read(&twin).unwrap(),
            b"precious twin",
            "{planted}: the twin is untouched"
        );
        assert!(
            fs::symlink_metadata(&partial).is_ok(),
            "{planted}: the planted entry is left alone"
        );
    }
}

/// Space is committed with verified data, not with the peer's claim: a temp file for a
/// large offer allocates (almost) nothing until chunks arrive.
#[test]
fn a_large_offer_allocates_nothing_before_data() {
    use ffsync_core::restore::Reconstruction;
    let t = tempfile::tempdir().unwrap();
    let data = bytes(64 << 20, 78);
    let src = t.path().join("src.bin");
    fs::write(&src, &data).unwrap();
    let m = ffsync_core::scan::scan_file(&src, &Default::default())
        .unwrap()
        .manifest;
    let dst = t.path().join("dst.bin");
    let r = Reconstruction::begin(&dst, m, Vec::new()).unwrap();
    r.temp_file_sync().unwrap();
    let st = fs::metadata(r.temp_path()).unwrap();
    assert_eq!(st.len(), 64 << 20, "sized to the offer");
    assert!(
        st.blocks() * 512 < 1 << 20,
        "but not allocated: {} bytes",
        st.blocks() * 512
    );
    r.abort(true);
}

#[test]
fn no_fsync_writes_and_verifies_the_same_tree() {
    // --no-fsync skips the writeback and the final syncfs, nothing else: small files,
    // verified local copies, links and metadata converge exactly as with fsync.
    let (src, dst) = (Side::new(), Side::new());
    populate(&src);
    src.put("dir/a.bin", &bytes(20_000, 7));
    let no_fsync = Opts {
        delete: true,
        no_fsync: true,
        ..Default::default()
    };
    sync_ok(&src, &dst, no_fsync);
    assert_same(&src, &dst);
    fs::create_dir(src.p("other")).unwrap();
    fs::rename(src.p("dir/a.bin"), src.p("other/moved.bin")).unwrap();
    let out = sync_ok(&src, &dst, no_fsync);
    out.find(Op::LocalCopy, "other/moved.bin");
    assert_same(&src, &dst);
}

/// rsync's --remove-source-files: after a sync, the sender's files and symlinks that the
/// receiver now holds (sent, or already the same there) are removed; directories stay, and
/// so do the entries the options left alone (--max-size, -u, --ignore-existing, --existing)
/// and an entry that changed after the walk listed it.
#[test]
fn remove_sources_removes_what_was_synced_and_keeps_what_was_left_alone_or_changed() {
    let (src, dst) = (Side::new(), Side::new());
    src.put("sent.txt", b"new content");
    src.put("same.txt", b"already there");
    src.put("d/nested.bin", &bytes(200_000, 4));
    src.put("big.bin", &bytes(300_000, 5));
    src.put("changed.txt", b"listed version");
    symlink("sent.txt", src.p("link")).unwrap();
    fs::create_dir_all(src.p("emptydir")).unwrap();
    // The receiver already has same.txt, byte for byte, with the same mtime.
    dst.put("same.txt", b"already there");
    set_mtime(&src.p("same.txt"), T0);
    set_mtime(&dst.p("same.txt"), T0);
    let out = sync_ok(
        &src,
        &dst,
        Opts {
            max_size: Some(250_000),
            ..Default::default()
        },
    );
    assert_eq!(out.s.plan().left_alone.len(), 1, "big.bin, above --max-size");
    // Rewritten after the walk listed it (a new size): kept, and named.
    fs::write(src.p("changed.txt"), b"written during the sync").unwrap();
    let removal = out.s.remove_sources();
    assert!(removal.errors.is_empty(), "{:?}", removal.errors);
    assert_eq!(
        removal.warnings,
        ["Skipping sender remove for changed file: changed.txt"]
    );
    assert_eq!(removal.files, 4, "sent.txt, same.txt, d/nested.bin, link");
    for gone in ["sent.txt", "same.txt", "d/nested.bin", "link"] {
        assert!(fs::symlink_metadata(src.p(gone)).is_err(), "{gone} should be removed");
    }
    for kept in ["big.bin", "changed.txt", "d", "emptydir"] {
        assert!(src.p(kept).exists(), "{kept} should stay");
    }
    assert_eq!(
        dst.read("d/nested.bin"),
        bytes(200_000, 4),
        "the receiver's copies are untouched"
    );
    assert_eq!(fs::read_link(dst.p("link")).unwrap(), Path::new("sent.txt"));
}

/// A directory of the source swapped for a link after the walk: removal never goes through it.
#[test]
fn remove_sources_never_follows_a_link_planted_after_the_walk() {
    let (src, dst) = (Side::new(), Side::new());
    src.put("sub/victim.txt", b"listed");
    let outside = Side::new();
    outside.put("victim.txt", b"listed");
    let out = sync_ok(&src, &dst, Opts::default());
    fs::rename(src.p("sub"), src.p("sub.moved")).unwrap();
    symlink(outside.p(""), src.p("sub")).unwrap();
    let removal = out.s.remove_sources();
    assert_eq!(removal.files, 0);
    assert_eq!(removal.errors.len(), 1, "{:?}", removal.errors);
    assert!(removal.errors[0].contains("sub/victim.txt"), "{:?}", removal.errors);
    assert_eq!(
        outside.read("victim.txt"),
        b"listed",
        "nothing removed through the link"
    );
    assert!(src.p("sub.moved/victim.txt").exists());
}

/// rsync's --max-delete: at most N deletions (deepest first), the rest left in place; 0
/// deletes nothing. Everything else in the plan still happens.
#[test]
fn max_delete_stops_deletions_at_the_limit() {
    for (limit, left) in [(Some(3u64), 5usize), (Some(0), 8), (None, 0)] {
        let (src, dst) = (Side::new(), Side::new());
        src.put("keep.txt", b"new");
        for i in 0..5 {
            dst.put(&format!("old{i}.txt"), b"x");
        }
        dst.put("olddir/a", b"a");
        dst.put("olddir/b", b"b");
        let (s, mut r) = negotiate(
            &src,
            &dst,
            Opts {
                delete: true,
                ..Default::default()
            },
        );
        r.set_max_delete(limit);
        let (_, errors) = execute(&src, &dst, &s, &r, true);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(dst.read("keep.txt"), b"new", "the transfer itself is not limited");
        let extraneous = snapshot(&dst.tree)
            .keys()
            .filter(|k| !["", "keep.txt"].contains(&k.as_str()))
            .count();
        assert_eq!(
            extraneous,
            left,
            "limit {limit:?}: {:?}",
            snapshot(&dst.tree).keys().collect::<Vec<_>>()
        );
    }
}

#[test]
fn a_root_claim_names_a_large_transfer_or_is_refused() {
    let (src, dst) = (Side::new(), Side::new());
    extraneous(&src, &dst);
    src.put("big.bin", &bytes(4 << 20, 7));
    src.put("fresh/a", b"a");
    let (s, r) = negotiate(
        &src,
        &dst,
        Opts {
            delete: true,
            ..Default::default()
        },
    );
    let actions = r.plan().actions.clone();
    let of = |op: Op| actions.iter().position(|a| a.op == op).unwrap();
    // A Delete has no sender entry at all (NONE): it must be refused, not looked up.
    let (delete, mkdir) = (of(Op::Delete), of(Op::Mkdir));
    let small = actions
        .iter()
        .position(|a| a.op == Op::Transfer && a.flags & action_flags::SMALL != 0)
        .unwrap();
    for k in [delete, mkdir, small] {
        assert!(
            r.claim_root(k, [0; 32]).is_err(),
            "receiver accepted a claim for {:?}",
            actions[k].op
        );
        assert!(
            s.claim_root(k, [0; 32]).is_err(),
            "sender accepted a claim for {:?}",
            actions[k].op
        );
    }
    let large = r.large_transfers()[0].action as usize;
    assert!(s.claim_root(large, [0; 32]).is_ok());
}

/// Decisions §95: the sender's guess at what it will hash (scanned while the receiver's
/// manifest is on its way) lists regular files over the small-file limit and within the
/// size given, in walk order, up to the byte budget, and none whose root the index knows.
#[test]
fn scan_ahead_candidates_are_the_unindexed_large_files_in_walk_order_within_budget() {
    fn listed(packed: &[u8]) -> Vec<String> {
        let (mut out, mut at) = (Vec::new(), 0);
        while at < packed.len() {
            let n = u32::from_le_bytes(packed[at..at + 4].try_into().unwrap()) as usize;
            out.push(String::from_utf8(packed[at + 4..at + 4 + n].to_vec()).unwrap());
            at += 4 + n;
        }
        out
    }
    let (src, dst) = (Side::new(), Side::new());
    populate(&src); // one file over 64 KiB: deep/er/still/x.bin (70,000 bytes)
    src.put("big/b.bin", &bytes(200_000, 1));
    src.put("big/a.bin", &bytes(100_000, 2));
    src.put("big/c.bin", &bytes(3_000_000, 3));
    src.put("edge64k", &bytes(64 * 1024, 4)); // at the small-file limit: batches hash it
    symlink("big/c.bin", src.p("to-c")).unwrap(); // a link is not read
    let s = open(&src, &Filter::new(&[]).unwrap(), None, true);
    let order = |names: &[&str]| names.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    assert_eq!(
        listed(&s.scan_ahead_candidates(u64::MAX, u64::MAX)),
        order(&["big/a.bin", "big/b.bin", "big/c.bin", "deep/er/still/x.bin"])
    );
    // Over the size given: left to the conversation (it streams its manifest while hashing).
    assert_eq!(
        listed(&s.scan_ahead_candidates(1_000_000, u64::MAX)),
        order(&["big/a.bin", "big/b.bin", "deep/er/still/x.bin"])
    );
    // The budget: the file that reaches it is the last listed.
    assert_eq!(
        listed(&s.scan_ahead_candidates(u64::MAX, 250_000)),
        order(&["big/a.bin", "big/b.bin"])
    );
    assert_eq!(listed(&s.scan_ahead_candidates(u64::MAX, 0)), Vec::<String>::new());
    drop(s);
    // After a sync the sender's index holds every root: nothing is left to guess, except
    // a file changed since.
    sync_ok(&src, &dst, Opts::default());
    src.put("big/b.bin", &bytes(200_001, 5));
    let s = open(&src, &Filter::new(&[]).unwrap(), None, true);
    assert_eq!(
        listed(&s.scan_ahead_candidates(u64::MAX, u64::MAX)),
        order(&["big/b.bin"])
    );
}

/// A file hashed for its root (the peer has a root, this side's index none) whose peer holds
/// other content at its path travels chunk by chunk next: its manifest goes into the per-file
/// index then, so the conversation does not hash it a second time (decisions §103). Files the
/// peer has as they are, and small ones (sent whole), are not stored.
#[test]
fn a_file_hashed_for_its_root_that_will_travel_is_indexed_for_its_conversation() {
    let (src, dst) = (Side::new(), Side::new());
    src.put("changed.bin", &bytes(300_000, 1));
    src.put("same.bin", &bytes(300_000, 2));
    src.put("small.bin", &bytes(60_000, 3));
    sync_ok(&src, &dst, Opts::default());
    // The receiver's copies change behind its index, keeping size and mtime: its walk has no
    // roots for them, the sender's index has, so the receiver hashes them.
    let mut changed = dst.read("changed.bin");
    changed[150_000] ^= 0xff;
    put(&dst.tree, "changed.bin", &changed, T0);
    put(&dst.tree, "same.bin", &src.read("same.bin"), T0);
    let mut small = dst.read("small.bin");
    small[10] ^= 0xff;
    put(&dst.tree, "small.bin", &small, T0);
    let per_file = |name: &str| {
        let p = ffsync_core::scan::index_key(&dst.p(name));
        let id = FileIdentity::of(&fs::metadata(&p).unwrap());
        ffsync_core::index::load(&dst.state, &p, &id)
    };
    for name in ["changed.bin", "same.bin", "small.bin"] {
        ffsync_core::index::remove(&dst.state, &ffsync_core::scan::index_key(&dst.p(name)));
    }
    negotiate(&src, &dst, Opts::default());
    let stored = per_file("changed.bin").expect("the delta's old version is indexed");
    assert_eq!(stored.root, file_batch::root_of_bytes(&changed));
    assert!(stored.chunks.len() > 1);
    assert!(
        per_file("same.bin").is_none(),
        "equal content: no conversation, nothing stored"
    );
    assert!(per_file("small.bin").is_none(), "a small file travels whole");
}
