//! Triage: from the sender's and the receiver's tree manifests, decide what each path
//! needs. Both peers run this same function on the same inputs (the two manifests and
//! the roots each supplied), so they agree on the plan without sending it.
//!
//! "Unchanged" is decided by content roots wherever either peer's index covers a file
//! (the other peer hashes just that file, see [`roots_to_supply`]); by size and mtime
//! only where no index covers it; by roots everywhere with `--checksum`.

use super::manifest::{flags, EntryRef, Kind, TreeManifest};
use super::path::{cmp_tree_path, is_under, parent_of};
use std::cmp::Ordering;
use std::collections::{HashMap, HashSet};

pub const NONE: u32 = u32::MAX;
/// Files up to this size travel whole in batches (a delta of a file this small saves less
/// than the round trip it costs).
pub const SMALL_FILE_MAX: u64 = 64 * 1024;
/// New files (no basis on the receiver) up to this size also travel whole in batches.
pub const NEW_FILE_BATCH_MAX: u64 = 1024 * 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum Op {
    /// Create a directory (flag REPLACE: a non-directory is in the way).
    Mkdir = 1,
    /// Copy a file the receiver already has elsewhere (`basis`): a rename, zero bytes sent.
    LocalCopy = 2,
    /// Send a file (SMALL: whole, in a batch; otherwise a chunk-level conversation, with
    /// the receiver's old file as basis when flag DELTA).
    Transfer = 3,
    /// Create or replace a symlink.
    Symlink = 4,
    /// Same content: only the mtime and/or mode differ.
    FileMeta = 5,
    /// Remove a path only the receiver has (after everything else succeeded).
    Delete = 6,
    /// Set a directory's mode and mtime (last: creating entries changes a dir's mtime).
    DirMeta = 7,
    /// The sender could not read this file: reported, the receiver's copy is kept.
    Skip = 8,
}

pub mod action_flags {
    /// Something of another kind is at the path on the receiver: it is removed first.
    pub const REPLACE: u8 = 1;
    /// The receiver's old file at the same path is the basis for a chunk-level delta.
    pub const DELTA: u8 = 2;
    /// Whole file, in a batch with others.
    pub const SMALL: u8 = 4;
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Action {
    pub op: Op,
    pub flags: u8,
    /// Index in the sender's manifest (NONE for deletes).
    pub sender_entry: u32,
    /// Index in the receiver's manifest of the entry at the same path (NONE if absent).
    pub receiver_entry: u32,
    /// LocalCopy: index in the receiver's manifest of the file to copy.
    pub basis: u32,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct TriageOptions {
    pub checksum: bool,
    pub delete: bool,
    /// rsync's -u: a file whose receiver copy is newer than the sender's is left alone.
    pub update: bool,
    /// rsync's -W: changed files travel whole (no delta against the old version).
    pub whole_file: bool,
    /// rsync's --max-size / --min-size: source files outside [min, max] bytes are left
    /// alone (not sent, and the receiver's copy at that path is neither replaced nor
    /// deleted). `None`: no bound.
    pub max_size: Option<u64>,
    pub min_size: Option<u64>,
    /// `sync` without -t (rsync): modification times are not kept, so a difference in
    /// them alone changes nothing, and directories are not restamped.
    pub omit_times: bool,
    /// `sync` without -p (rsync): existing files and directories keep their permissions;
    /// new ones get the sender's masked by the receiver's umask. A difference alone changes
    /// nothing.
    pub omit_perms: bool,
    /// rsync's --size-only: a file whose size matches is the same file (content is not
    /// compared); its time and mode are still brought over as usual.
    pub size_only: bool,
    /// rsync's --ignore-existing: whatever the receiver has at a path stays untouched (a
    /// directory is still entered); only new paths are created.
    pub ignore_existing: bool,
    /// rsync's --existing: nothing new is created; only what the receiver has is updated.
    pub existing_only: bool,
    /// A changed file up to [`NEW_FILE_BATCH_MAX`] travels whole in a batch, as a new one
    /// does, not chunk by chunk against the receiver's old version: a local sync's default
    /// (rsync's `-W` is the default for local copies), where no link makes a delta pay for
    /// its conversation and for hashing the old file (decisions §107).
    pub whole_small: bool,
}

impl TriageOptions {
    pub fn size_excluded(&self, size: u64) -> bool {
        self.max_size.is_some_and(|m| size > m) || self.min_size.is_some_and(|m| size < m)
    }
}

/// Content roots supplied after the manifests were exchanged, by manifest index.
pub type ExtraRoots = HashMap<u32, [u8; 32]>;

#[derive(Debug, Default)]
pub struct Plan {
    /// In execution order: Mkdir, LocalCopy, Transfer (small first), Symlink, FileMeta,
    /// Delete (deepest first), DirMeta, Skip.
    pub actions: Vec<Action>,
    pub unchanged_files: u64,
    /// Files whose "unchanged" verdict came from content roots.
    pub decided_by_root: u64,
    /// Receiver-only paths kept because of --no-delete, a protect rule, or an unreadable
    /// sender directory above them.
    pub kept_extraneous: u64,
    /// Files left alone because the receiver's copy is newer (-u).
    pub kept_newer: u64,
    /// Source files left alone by --max-size / --min-size.
    pub size_skipped: u64,
    /// Sender entries (by manifest index) that the options left alone on purpose
    /// (--ignore-existing, --existing, --max-size/--min-size, -u): they were not synced, so
    /// --remove-source-files keeps them, as rsync does.
    pub left_alone: Vec<u32>,
}

fn root_of<'a>(e: &EntryRef<'a>, i: usize, extra: &'a ExtraRoots) -> Option<&'a [u8; 32]> {
    e.root.or_else(|| extra.get(&(i as u32)))
}

/// Walk both manifests in tree order, pairing entries with the same path.
pub(crate) fn merge(s: &TreeManifest, r: &TreeManifest, mut f: impl FnMut(Option<usize>, Option<usize>)) {
    let (mut i, mut j) = (0, 0);
    while i < s.len() || j < r.len() {
        let o = match (i < s.len(), j < r.len()) {
            (true, true) => cmp_tree_path(s.entry(i).path, r.entry(j).path),
            (true, false) => Ordering::Less,
            _ => Ordering::Greater,
        };
        match o {
            Ordering::Less => {
                f(Some(i), None);
                i += 1;
            }
            Ordering::Greater => {
                f(None, Some(j));
                j += 1;
            }
            Ordering::Equal => {
                f(Some(i), Some(j));
                i += 1;
                j += 1;
            }
        }
    }
}

fn sized_rooted_files(r: &TreeManifest) -> HashSet<u64> {
    r.iter()
        .filter(|e| e.is_file() && e.root.is_some())
        .map(|e| e.size)
        .collect()
}

/// Which entries each peer must hash before triage, as (sender indices, receiver indices):
/// - same-size files at the same path where exactly one peer's index gives a root (the
///   other must hash, or a same-size-and-mtime content change would go unnoticed);
///   with `checksum`, every same-size pair, on whichever side lacks a root;
/// - sender files new at their path when the receiver has an indexed file of that size
///   (the rename census: a moved file is then copied locally instead of sent).
pub fn roots_to_supply(s: &TreeManifest, r: &TreeManifest, checksum: bool) -> (Vec<u32>, Vec<u32>) {
    let mut from_s = Vec::new();
    let mut from_r = Vec::new();
    let mut census: Option<HashSet<u64>> = None;
    merge(s, r, |a, b| match (a, b) {
        (Some(i), Some(j)) => {
            let (se, re) = (s.entry(i), r.entry(j));
            if se.has(flags::UNREADABLE) {
                return;
            }
            if se.is_file() && re.is_file() {
                if se.size != re.size || se.size == 0 {
                    return;
                }
                let (sr, rr) = (se.root.is_some(), re.root.is_some());
                if (checksum || rr) && !sr {
                    from_s.push(i as u32);
                }
                if (checksum || sr) && !rr {
                    from_r.push(j as u32);
                }
            } else if se.is_file() && se.root.is_none() && se.size > 0 {
                let sizes = census.get_or_insert_with(|| sized_rooted_files(r));
                if sizes.contains(&se.size) {
                    from_s.push(i as u32);
                }
            }
        }
        (Some(i), None) => {
            let se = s.entry(i);
            if se.is_file() && se.root.is_none() && se.size > 0 && !se.has(flags::UNREADABLE) {
                let sizes = census.get_or_insert_with(|| sized_rooted_files(r));
                if sizes.contains(&se.size) {
                    from_s.push(i as u32);
                }
            }
        }
        _ => {}
    });
    (from_s, from_r)
}

/// The plan. `s_extra`/`r_extra` are the roots each side supplied after the exchange.
pub fn triage(
    s: &TreeManifest,
    r: &TreeManifest,
    s_extra: &ExtraRoots,
    r_extra: &ExtraRoots,
    o: TriageOptions,
) -> Plan {
    let mut plan = Plan::default();
    let mut mkdir = Vec::new();
    let mut copies = Vec::new();
    let mut small = Vec::new();
    let mut large = Vec::new();
    let mut links = Vec::new();
    let mut metas = Vec::new();
    let mut deletes = Vec::new();
    let mut skips = Vec::new();
    // Receiver paths being replaced by another kind (their contents go with them), and
    // sender directories that could not be read (nothing below them is deleted).
    let mut replaced: Vec<&[u8]> = Vec::new();
    let mut unreadable: Vec<&[u8]> = Vec::new();
    let mut census: Option<HashMap<(u64, [u8; 32]), u32>> = None;
    let act = |op, flags, s: usize, r: Option<usize>, basis: u32| Action {
        op,
        flags,
        sender_entry: s as u32,
        receiver_entry: r.map_or(NONE, |j| j as u32),
        basis,
    };

    merge(s, r, |a, b| {
        if let Some(j) = b {
            let rp = r.entry(j).path;
            while replaced.last().is_some_and(|p| !is_under(rp, p)) {
                replaced.pop();
            }
        }
        if let Some(i) = a {
            let sp = s.entry(i).path;
            while unreadable.last().is_some_and(|p| !is_under(sp, p) && *p != sp) {
                unreadable.pop();
            }
        }
        match (a, b) {
            (None, Some(j)) => {
                let re = r.entry(j);
                let p = re.path;
                if !replaced.is_empty() {
                    return; // removed together with the path it is under
                }
                if !o.delete || re.has(flags::PROTECTED) || unreadable.last().is_some_and(|u| is_under(p, u)) {
                    plan.kept_extraneous += 1;
                    return;
                }
                deletes.push(Action {
                    op: Op::Delete,
                    flags: 0,
                    sender_entry: NONE,
                    receiver_entry: j as u32,
                    basis: NONE,
                });
            }
            (Some(i), b) => {
                let se = s.entry(i);
                let re = b.map(|j| r.entry(j));
                let other_kind = re.is_some_and(|re| re.kind != se.kind);
                let replace = if other_kind { action_flags::REPLACE } else { 0 };
                if other_kind && re.is_some_and(|re| re.is_dir()) {
                    // Its entries are not extraneous: they go with it, or stay with it.
                    replaced.push(re.unwrap().path);
                }
                // --ignore-existing: a path the receiver has stays as it is (directories are
                // still entered, as rsync does); --existing: a path it lacks is not created.
                if o.ignore_existing && re.is_some_and(|re| !(se.is_dir() && re.is_dir())) {
                    if let Some(re) = re.filter(|re| re.is_dir()) {
                        replaced.push(re.path); // its entries stay with it
                    }
                    plan.left_alone.push(i as u32);
                    return;
                }
                if o.existing_only && re.is_none() {
                    plan.left_alone.push(i as u32);
                    return;
                }
                if se.kind == Kind::File && o.size_excluded(se.size) {
                    // As rsync: not transferred, and whatever the receiver has at this path
                    // stays (it is on the sender's list, so it is not extraneous either).
                    plan.size_skipped += 1;
                    plan.left_alone.push(i as u32);
                    return;
                }
                match se.kind {
                    Kind::Dir => {
                        if se.has(flags::UNREADABLE) {
                            unreadable.push(se.path);
                        }
                        if re.is_none() || other_kind {
                            mkdir.push(act(Op::Mkdir, replace, i, b, NONE));
                        }
                    }
                    Kind::Symlink => {
                        if re.is_none_or(|re| other_kind || re.link != se.link) {
                            links.push(act(Op::Symlink, replace, i, b, NONE));
                        }
                    }
                    Kind::File => {
                        if se.has(flags::UNREADABLE) {
                            skips.push(act(Op::Skip, 0, i, b, NONE));
                            return;
                        }
                        let sroot = root_of(&se, i, s_extra);
                        if let (Some(re), false) = (re, other_kind) {
                            let j = b.unwrap();
                            let rroot = root_of(&re, j, r_extra);
                            let same = if se.size != re.size {
                                false
                            } else if se.size == 0 || o.size_only {
                                true
                            } else {
                                match (sroot, rroot) {
                                    (Some(x), Some(y)) => {
                                        plan.decided_by_root += (x == y) as u64;
                                        x == y
                                    }
                                    // Nobody's index covers it: rsync's quick check.
                                    (None, None) if !o.checksum => se.mtime_ns == re.mtime_ns,
                                    // A root is missing where one was due (hashing failed): send.
                                    _ => false,
                                }
                            };
                            if !same && o.update && re.mtime_ns > se.mtime_ns {
                                plan.kept_newer += 1;
                                plan.left_alone.push(i as u32);
                                return;
                            }
                            if same {
                                plan.unchanged_files += 1;
                                if (!o.omit_times && se.mtime_ns != re.mtime_ns)
                                    || (!o.omit_perms && applied(se.mode) != applied(re.mode))
                                {
                                    metas.push(act(Op::FileMeta, 0, i, b, NONE));
                                }
                                return;
                            }
                            if se.size <= SMALL_FILE_MAX
                                || re.size == 0
                                || o.whole_file
                                || (o.whole_small && se.size <= NEW_FILE_BATCH_MAX)
                            {
                                small_or_large(&mut small, &mut large, act(Op::Transfer, 0, i, b, NONE), se.size);
                            } else {
                                large.push(act(Op::Transfer, action_flags::DELTA, i, b, NONE));
                            }
                            return;
                        }
                        // New at this path (or replacing another kind): a rename?
                        if let (Some(root), true) = (sroot, se.size > 0) {
                            let c = census.get_or_insert_with(|| {
                                let mut m = HashMap::new();
                                for (j, e) in r.iter().enumerate() {
                                    // Not a file the plan replaces by a directory first.
                                    let replaced = || s.find(e.path).is_some_and(|i| s.entry(i).is_dir());
                                    if e.is_file() {
                                        if replaced() {
                                            continue;
                                        }
                                        if let Some(rt) = root_of(&e, j, r_extra) {
                                            m.entry((e.size, *rt)).or_insert(j as u32);
                                        }
                                    }
                                }
                                m
                            });
                            if let Some(&src) = c.get(&(se.size, *root)) {
                                copies.push(act(Op::LocalCopy, replace, i, b, src));
                                return;
                            }
                        }
                        small_or_large(&mut small, &mut large, act(Op::Transfer, replace, i, b, NONE), se.size);
                    }
                }
            }
            (None, None) => unreachable!(),
        }
    });

    // Directories whose entries change get their mtime (and mode) set last; so do
    // directories whose own metadata differs.
    let mut touched: HashSet<&[u8]> = HashSet::new();
    for a in mkdir.iter().chain(&copies).chain(&small).chain(&large).chain(&links) {
        touched.insert(parent_of(s.entry(a.sender_entry as usize).path));
    }
    for a in &deletes {
        touched.insert(parent_of(r.entry(a.receiver_entry as usize).path));
    }
    let mut dirmeta = Vec::new();
    merge(s, r, |a, b| {
        if let Some(i) = a {
            let se = s.entry(i);
            if !se.is_dir() {
                return;
            }
            if o.existing_only && b.is_none() {
                return; // not created, so nothing to stamp
            }
            let differs = match b.map(|j| r.entry(j)) {
                Some(re) if re.is_dir() => {
                    (!o.omit_perms && applied(re.mode) != applied(se.mode))
                        || (!o.omit_times && re.mtime_ns != se.mtime_ns)
                }
                _ => true,
            };
            if differs || (!o.omit_times && touched.contains(se.path)) {
                dirmeta.push(act(Op::DirMeta, 0, i, b, NONE));
            }
        }
    });
    deletes.reverse(); // contents before their directory
    plan.actions = [mkdir, copies, small, large, links, metas, deletes, dirmeta, skips].concat();
    plan
}

/// The permission bits a receiver applies (setuid/setgid are never applied, so they must
/// not make a file look different forever).
fn applied(mode: u32) -> u32 {
    mode & 0o1777
}

fn small_or_large(small: &mut Vec<Action>, large: &mut Vec<Action>, mut a: Action, size: u64) {
    if size <= NEW_FILE_BATCH_MAX && a.flags & action_flags::DELTA == 0 {
        a.flags |= action_flags::SMALL;
        small.push(a);
    } else {
        large.push(a);
    }
}

/// Packed form for the binding: 16 bytes per action { op u8, flags u8, 0 u16, s u32, r u32, basis u32 }.
pub fn encode_actions(actions: &[Action]) -> Vec<u8> {
    let mut out = Vec::with_capacity(actions.len() * 16);
    for a in actions {
        out.extend_from_slice(&[a.op as u8, a.flags, 0, 0]);
        out.extend_from_slice(&a.sender_entry.to_le_bytes());
        out.extend_from_slice(&a.receiver_entry.to_le_bytes());
        out.extend_from_slice(&a.basis.to_le_bytes());
    }
    out
}
