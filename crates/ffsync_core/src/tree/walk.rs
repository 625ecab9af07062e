//! The tree walk: parallel (directories are read on every core by jwalk's rayon workers,
//! each child lstat'ed there) and streaming (entries arrive in tree order and are packed
//! straight into the manifest, never held as one object per path). Symlinks are recorded,
//! never followed; exclude rules prune whole directories before they are read.

use super::dir_merge::{rebase, DirMerge};
use super::filter::Filter;
use super::index::{ClaimRef, TreeIndex};
use super::manifest::{flags, Kind, NewEntry, TreeBuilder, TreeManifest};
use super::path::{display, is_under, name_bytes};
use super::selection::Selection;
use crate::error::{CoreError, Result};
use crate::file_identity::FileIdentity;
use jwalk::{ClientState, Parallelism, WalkDirGeneric};
use std::fs::Metadata;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub struct WalkOptions<'a> {
    /// Rules both peers apply (the sender's, sent over the wire): matches are invisible.
    pub filter: &'a Filter,
    /// Receiver's own rules: matches (and everything below a matched directory) are
    /// listed but flagged PROTECTED, so they are never deleted.
    pub protect: Option<&'a Filter>,
    /// Roots recorded by an earlier session, trusted when the stat identity matches.
    pub index: Option<&'a TreeIndex>,
    /// Incremented per entry listed.
    pub progress: Option<&'a AtomicU64>,
    /// rsync's -x: a directory on another filesystem than the root is listed but not entered.
    pub one_file_system: bool,
    /// `sync` without -l (rsync): symlinks are not part of the tree; each is noted as
    /// rsync notes it (`skipping non-regular file "name"`).
    pub skip_symlinks: bool,
    /// rsync's --chmod (sender): the modes listed are the rules applied to the real ones.
    pub chmod: Option<&'a super::chmod::ChmodRules>,
    /// rsync's -m/--prune-empty-dirs (sender): directories with no file or symlink anywhere
    /// below them (after the excludes) are left off the list.
    pub prune_empty_dirs: bool,
    /// rsync's -L/--copy-links (sender): a symlink is listed as what it points to (a file, or
    /// a directory that is entered); a dangling one is a problem (exit 23), as is a loop.
    pub copy_links: bool,
    /// Per-directory merge files (rsync's `-F`, `-C`, `dir-merge`; sender): each directory's
    /// file adds rules for it (and below), checked after `filter` (tree/dir_merge.rs).
    pub dir_merge: &'a [DirMerge],
    /// rsync's --files-from (sender): only these paths, the directories on the way, and with
    /// -r what is below a listed directory (tree/selection.rs). A listed path that does not
    /// exist is a problem (exit 23).
    pub select: Option<&'a Selection>,
}

/// A walked local tree: its manifest plus what only this machine needs.
pub struct LocalTree {
    pub root: PathBuf,
    /// Shared, so the encoder of the wire copy reads it without holding the session's lock or copying it.
    pub manifest: std::sync::Arc<TreeManifest>,
    /// The part of each entry's stat identity the manifest does not hold (size and mtime
    /// are in the entry), and its owner: 32 bytes per path instead of 48.
    stat_rest: Vec<StatRest>,
    /// Directories that could not be read: each makes the sync partial (exit 23).
    pub problems: Vec<String>,
    /// Entries left out on purpose, as rsync says it (`skipping non-regular file "d/fifo"`):
    /// special files, and symlinks without -l. Reported; not failures.
    pub notices: Vec<String>,
    /// Files whose root came from the index.
    pub indexed_files: u64,
    /// Walked with -L: entries may be reached through symlinks, so reading them follows links.
    pub follows_links: bool,
    /// The rules of every merge file read (`dir_merge`), re-anchored at the root, deepest
    /// directory first: appended to the FILTER rules, they hide on the receiver what they hid here.
    pub merged_rules: Vec<String>,
}

#[derive(Debug, Default)]
struct Walk;

#[derive(Clone, Copy, Debug, Default)]
struct StatRest {
    ctime_ns: i64,
    inode: u64,
    dev: u64,
    /// Owner and group as the walk's lstat saw them (0 where there are none): `-o`/`-g`
    /// read them here instead of a second stat per entry (tree/attrs.rs).
    uid: u32,
    gid: u32,
}

impl StatRest {
    fn of(id: &FileIdentity, (uid, gid): (u32, u32)) -> StatRest {
        StatRest {
            ctime_ns: id.ctime_ns,
            inode: id.inode,
            dev: id.dev,
            uid,
            gid,
        }
    }
}

#[cfg(unix)]
fn owner_of(m: &Metadata) -> (u32, u32) {
    use std::os::unix::fs::MetadataExt;
    (m.uid(), m.gid())
}

#[cfg(not(unix))]
fn owner_of(_m: &Metadata) -> (u32, u32) {
    (0, 0)
}

/// Per child, computed on the worker thread that read its directory.
#[derive(Debug, Default)]
struct ChildInfo {
    rel: Vec<u8>,
    stat: Option<StatInfo>,
    excluded: bool,
}

#[derive(Debug)]
struct StatInfo {
    kind: Kind,
    mode: u32,
    mtime_ns: i64,
    identity: FileIdentity,
    owner: (u32, u32),
    link: Vec<u8>,
}

/// Per-directory merge files read during a walk: the rules of those the sender also sends
/// (re-anchored at the root), and what could not be honoured.
#[derive(Debug, Default)]
struct MergeFiles {
    sent: Vec<MergedFile>,
    notes: Vec<String>,
}

#[derive(Debug)]
struct MergedFile {
    depth: usize,
    dir: Vec<u8>,
    rules: Vec<String>,
}

/// Read `spec`'s file in `dir` (at `rel_dir` under the root): its rules join `state`, the
/// stack in force for this directory and below, and, when the file itself is sent (not
/// excluded by the rules so far, as `-FF` excludes it), the list the receiver gets; rsync's
/// receiver likewise reads the merge files it received.
fn read_merge_file(
    spec: &DirMerge,
    dir: &Path,
    rel_dir: &[u8],
    depth: usize,
    filter: &Filter,
    state: &mut MergeStack,
    merged: &Mutex<MergeFiles>,
) {
    let sep: &[u8] = if rel_dir.is_empty() { b"" } else { b"/" };
    let rel_file = [rel_dir, sep, spec.name.as_bytes()].concat();
    let mut m = merged.lock().unwrap();
    let text = match std::fs::read(dir.join(&spec.name)) {
        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
        Err(e) => return m.notes.push(format!("cannot read {}: {e}", display(&rel_file))),
    };
    let (patterns, notes) = spec.parse(&text);
    m.notes
        .extend(notes.into_iter().map(|n| format!("{}: {n}", display(&rel_file))));
    let rebased: Vec<String> = patterns.iter().map(|p| rebase(rel_dir, p, spec.inherit)).collect();
    let f = match Filter::new(&rebased) {
        Ok(f) => f,
        Err(e) => {
            return m
                .notes
                .push(format!("{}: {e}; its rules are not applied", display(&rel_file)))
        }
    };
    let mut stack = state.0.as_ref().clone();
    stack.push(Arc::new(f));
    let sent = !filter
        .decide(&rel_file, false)
        .or_else(|| stack.iter().rev().find_map(|f| f.decide(&rel_file, false)))
        .unwrap_or(false);
    state.0 = Arc::new(stack);
    if sent {
        m.sent.push(MergedFile {
            depth,
            dir: rel_dir.to_vec(),
            rules: rebased,
        });
    }
}

/// The merge-file rules in force in a directory, deepest last (cloned into each child
/// directory's read by jwalk).
#[derive(Clone, Debug, Default)]
struct MergeStack(Arc<Vec<Arc<Filter>>>);

impl ClientState for Walk {
    type ReadDirState = MergeStack;
    type DirEntryState = ChildInfo;
}

fn stat_info(m: &Metadata, path: &Path) -> Option<StatInfo> {
    let ft = m.file_type();
    let kind = if ft.is_symlink() {
        Kind::Symlink
    } else if ft.is_dir() {
        Kind::Dir
    } else if ft.is_file() {
        Kind::File
    } else {
        return None; // fifo, socket, device: not synced (as rsync without --specials)
    };
    let identity = FileIdentity::of(m);
    let link = if kind == Kind::Symlink {
        std::fs::read_link(path).ok().map(|t| name_bytes(t.as_os_str()))?
    } else {
        Vec::new()
    };
    Some(StatInfo {
        kind,
        mode: mode_of(m),
        mtime_ns: identity.mtime_ns,
        identity,
        owner: owner_of(m),
        link,
    })
}

#[cfg(unix)]
fn mode_of(m: &Metadata) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    m.permissions().mode() & 0o7777
}

#[cfg(not(unix))]
fn mode_of(m: &Metadata) -> u32 {
    match (m.is_dir(), m.permissions().readonly()) {
        (true, _) => 0o755,
        (false, true) => 0o444,
        (false, false) => 0o644,
    }
}

/// lstat of a directory's children. On Unix relative to an open handle of the directory
/// (`fstatat`): the kernel resolves one name instead of the whole path, which is most of
/// the cost of a walk over many small files.
struct StatAt {
    #[cfg(unix)]
    dir: Option<std::fs::File>,
}

impl StatAt {
    fn open(dir: &Path) -> StatAt {
        #[cfg(unix)]
        {
            StatAt {
                dir: std::fs::File::open(dir).ok(),
            }
        }
        #[cfg(not(unix))]
        {
            let _ = dir;
            StatAt {}
        }
    }

    /// `lstat` of `name` in `dir`, or its target's `stat` with `follow` (-L).
    fn stat(&self, dir: &Path, name: &std::ffi::OsStr, follow: bool) -> Option<StatInfo> {
        #[cfg(unix)]
        if let Some(d) = &self.dir {
            use std::os::unix::ffi::OsStrExt;
            use std::os::unix::io::AsRawFd;
            let c = std::ffi::CString::new(name.as_bytes()).ok()?;
            let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
            let flags = if follow { 0 } else { libc::AT_SYMLINK_NOFOLLOW };
            // Safety: valid dir fd, NUL-terminated name, `st` written by the call on success.
            let rc = unsafe { libc::fstatat(d.as_raw_fd(), c.as_ptr(), st.as_mut_ptr(), flags) };
            if rc != 0 {
                return None;
            }
            // Safety: fstatat succeeded.
            let st = unsafe { st.assume_init() };
            return stat_info_raw(&st, dir, name);
        }
        let full = dir.join(name);
        let m = if follow {
            std::fs::metadata(&full)
        } else {
            std::fs::symlink_metadata(&full)
        };
        m.ok().and_then(|m| stat_info(&m, &full))
    }
}

#[cfg(unix)]
#[allow(clippy::unnecessary_cast)] // mode_t is u16 on macOS, u32 on Linux
fn stat_info_raw(st: &libc::stat, dir: &Path, name: &std::ffi::OsStr) -> Option<StatInfo> {
    let fmt = st.st_mode as u32 & libc::S_IFMT as u32;
    let kind = if fmt == libc::S_IFLNK as u32 {
        Kind::Symlink
    } else if fmt == libc::S_IFDIR as u32 {
        Kind::Dir
    } else if fmt == libc::S_IFREG as u32 {
        Kind::File
    } else {
        return None;
    };
    let identity = FileIdentity {
        size: st.st_size as u64,
        mtime_ns: st.st_mtime as i64 * 1_000_000_000 + st.st_mtime_nsec as i64,
        ctime_ns: st.st_ctime as i64 * 1_000_000_000 + st.st_ctime_nsec as i64,
        inode: st.st_ino as u64,
        dev: st.st_dev as u64,
    };
    let link = if kind == Kind::Symlink {
        std::fs::read_link(dir.join(name))
            .ok()
            .map(|t| name_bytes(t.as_os_str()))?
    } else {
        Vec::new()
    };
    Some(StatInfo {
        kind,
        mode: st.st_mode as u32 & 0o7777,
        mtime_ns: identity.mtime_ns,
        identity,
        owner: (st.st_uid, st.st_gid),
        link,
    })
}

fn rel_bytes(root: &Path, p: &Path) -> Vec<u8> {
    let rel = p.strip_prefix(root).unwrap_or(Path::new(""));
    let mut out = Vec::new();
    for c in rel.components() {
        if !out.is_empty() {
            out.push(b'/');
        }
        out.extend_from_slice(&name_bytes(c.as_os_str()));
    }
    out
}

fn walk_parallelism() -> Parallelism {
    match std::env::var("FFSYNC_WALK_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    {
        Some(0) | Some(1) => Parallelism::Serial,
        Some(n) => Parallelism::RayonNewPool(n),
        None => Parallelism::RayonDefaultPool {
            busy_timeout: Duration::from_secs(30),
        },
    }
}

/// Walk `root` (a directory; a symlink to one is followed for the root only, since the
/// user named it). Errors below the root are recorded, not fatal.
pub fn walk(root: &Path, o: &WalkOptions) -> Result<LocalTree> {
    let meta = std::fs::metadata(root).map_err(|e| CoreError::io(root, e))?;
    if !meta.is_dir() {
        return Err(CoreError::Usage(format!("{} is not a directory", root.display())));
    }
    let root_buf = root.to_path_buf();
    let filter = Arc::new(o.filter.clone());
    let root_dev = o.one_file_system.then(|| FileIdentity::of(&meta).dev);
    // Merge files read so far: (depth, rebased rules), and what could not be honoured.
    let merged: Arc<Mutex<MergeFiles>> = Arc::default();
    let walker = WalkDirGeneric::<Walk>::new(root)
        .skip_hidden(false)
        // -L: jwalk follows links, and refuses a loop (an ancestor reached again).
        .follow_links(o.copy_links)
        .sort(true)
        .parallelism(walk_parallelism())
        .process_read_dir({
            let root = root_buf.clone();
            let filter = filter.clone();
            let follow = o.copy_links;
            let specs: Vec<DirMerge> = o.dir_merge.to_vec();
            let select = o.select.cloned().map(Arc::new);
            let merged = merged.clone();
            move |depth, dir, state, children| {
                // jwalk first calls this for the root's parent, with the root itself as the
                // only child (depth None). The root is never filtered: a pattern matching its
                // own name (`*`, or `src` for `src/`) must not empty the whole tree.
                if depth.is_none() {
                    return;
                }
                let rel_dir = rel_bytes(&root, dir);
                let stat_at = StatAt::open(dir);
                // This directory's merge files join the rules in force for it and below.
                for spec in &specs {
                    let present = children
                        .iter()
                        .flatten()
                        .any(|c| c.file_type.is_file() && c.file_name.as_os_str() == std::ffi::OsStr::new(&spec.name));
                    if present {
                        read_merge_file(spec, dir, &rel_dir, depth.unwrap_or(0), &filter, state, &merged);
                    }
                }
                let stack = state.0.clone();
                let everything = select.as_ref().is_none_or(|s| s.all_of(&rel_dir));
                for child in children.iter_mut().flatten() {
                    let mut rel = rel_dir.clone();
                    if !rel.is_empty() {
                        rel.push(b'/');
                    }
                    rel.extend_from_slice(&name_bytes(&child.file_name));
                    let is_dir = child.file_type.is_dir();
                    // The command line's rules first, then the merge files', deepest first.
                    let verdict = filter
                        .decide(&rel, is_dir)
                        .or_else(|| stack.iter().rev().find_map(|f| f.decide(&rel, is_dir)));
                    let unlisted = !everything && select.as_ref().is_some_and(|s| !s.keeps(&rel, false));
                    if unlisted || verdict.unwrap_or(false) {
                        child.client_state.excluded = true;
                        child.read_children_path = None;
                        continue;
                    }
                    child.client_state.stat = stat_at.stat(dir, &child.file_name, follow);
                    let enter = child
                        .client_state
                        .stat
                        .as_ref()
                        .is_some_and(|s| s.kind == Kind::Dir && root_dev.is_none_or(|d| s.identity.dev == d));
                    if !enter {
                        child.read_children_path = None;
                    }
                    child.client_state.rel = rel;
                }
                children.retain(|c| c.as_ref().map_or(true, |c| !c.client_state.excluded));
            }
        });

    let mut b = TreeBuilder::new();
    let mut stat_rest = Vec::new();
    let mut problems = Vec::new();
    let mut notices = Vec::new();
    let mut cursor = o.index.map(|i| i.cursor());
    let mut indexed_files = 0;
    let mut protected_dir: Option<Vec<u8>> = None;
    for item in walker {
        let entry = match item {
            Ok(e) => e,
            Err(e) => {
                // -L: a link to nothing is rsync's "symlink has no referent".
                let dangling = o.copy_links
                    && e.path().is_some_and(|p| {
                        std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_symlink())
                            && std::fs::metadata(p).is_err()
                    });
                match e.path().filter(|_| dangling) {
                    Some(p) => problems.push(format!("symlink has no referent: \"{}\"", p.display())),
                    None => problems.push(format!("cannot read: {e}")),
                }
                continue;
            }
        };
        let mut fl = 0;
        if entry.read_children_error.is_some() {
            fl |= flags::UNREADABLE;
            problems.push(format!(
                "cannot read directory {}: permission denied or vanished",
                entry.path().display()
            ));
        }
        if entry.depth == 0 {
            let id = FileIdentity::of(&meta);
            b.push(&NewEntry {
                path: b"",
                kind: Kind::Dir,
                flags: fl,
                mode: o.chmod.map_or(mode_of(&meta), |c| c.apply(mode_of(&meta), true)),
                size: 0,
                mtime_ns: id.mtime_ns,
                root: None,
                link: b"",
            });
            stat_rest.push(StatRest {
                uid: owner_of(&meta).0,
                gid: owner_of(&meta).1,
                ..StatRest::default()
            });
            continue;
        }
        let info = entry.client_state;
        let Some(st) = info.stat else {
            // Vanished between listing and stat, or a special file: not part of the tree.
            if entry.file_type.is_file() || entry.file_type.is_dir() || entry.file_type.is_symlink() {
                continue;
            }
            notices.push(format!("skipping non-regular file \"{}\"", display(&info.rel)));
            continue;
        };
        if st.kind == Kind::Symlink && o.skip_symlinks {
            notices.push(format!("skipping non-regular file \"{}\"", display(&info.rel)));
            continue;
        }
        if let Some(p) = o.protect {
            if protected_dir.as_ref().is_some_and(|d| !is_under(&info.rel, d)) {
                protected_dir = None;
            }
            if protected_dir.is_some() || p.excluded(&info.rel, st.kind == Kind::Dir) {
                fl |= flags::PROTECTED;
                if st.kind == Kind::Dir && protected_dir.is_none() {
                    protected_dir = Some(info.rel.clone());
                }
            }
        }
        let root = match (&mut cursor, st.kind) {
            (Some(c), Kind::File) => c.root_for(&info.rel, &st.identity),
            _ => None,
        };
        indexed_files += root.is_some() as u64;
        b.push(&NewEntry {
            path: &info.rel,
            kind: st.kind,
            flags: fl,
            mode: match (o.chmod, st.kind) {
                (Some(c), Kind::Dir | Kind::File) => c.apply(st.mode, st.kind == Kind::Dir),
                _ => st.mode,
            },
            size: match st.kind {
                Kind::File => st.identity.size,
                Kind::Symlink => st.link.len() as u64,
                Kind::Dir => 0,
            },
            mtime_ns: st.mtime_ns,
            root,
            link: &st.link,
        });
        stat_rest.push(StatRest::of(&st.identity, st.owner));
        if let Some(p) = o.progress {
            p.fetch_add(1, Ordering::Relaxed);
        }
    }
    let mut tree = LocalTree {
        root: root_buf,
        manifest: b.finish().into(),
        stat_rest,
        problems,
        notices,
        indexed_files,
        follows_links: o.copy_links,
        merged_rules: Vec::new(),
    };
    if let Some(s) = o.select {
        for p in s.listed() {
            if !p.is_empty() && std::fs::symlink_metadata(super::path::join(root, p)).is_err() {
                tree.problems.push(format!(
                    "link_stat \"{}\" failed: No such file or directory",
                    display(p)
                ));
            }
        }
    }
    let MergeFiles { mut sent, notes } = std::mem::take(&mut *merged.lock().unwrap());
    tree.problems.extend(notes);
    // Deepest directory first (as in the walk), then in tree order for a stable list.
    sent.sort_by(|a, b| b.depth.cmp(&a.depth).then_with(|| a.dir.cmp(&b.dir)));
    tree.merged_rules = sent.into_iter().flat_map(|f| f.rules).collect();
    if o.prune_empty_dirs {
        tree.prune_empty_dirs();
    }
    Ok(tree)
}

impl LocalTree {
    /// Drop the directories that hold no file or symlink at any depth (rsync's `-m`); the
    /// root stays. The list keeps its tree order, and each entry its stat identity.
    fn prune_empty_dirs(&mut self) {
        let m = &self.manifest;
        let mut full: std::collections::HashSet<&[u8]> = std::collections::HashSet::new();
        for e in m.iter().filter(|e| !e.is_dir()) {
            let mut p = e.path;
            while let Some(cut) = p.iter().rposition(|&c| c == b'/') {
                p = &p[..cut];
                if !full.insert(p) {
                    break; // its ancestors are in already
                }
            }
        }
        let keep: Vec<bool> = m
            .iter()
            .map(|e| !e.is_dir() || e.path.is_empty() || full.contains(e.path))
            .collect();
        if keep.iter().all(|&k| k) {
            return;
        }
        let mut b = TreeBuilder::new();
        let mut rest = Vec::with_capacity(self.stat_rest.len());
        for (i, e) in m.iter().enumerate().filter(|(i, _)| keep[*i]) {
            b.push(&NewEntry {
                path: e.path,
                kind: e.kind,
                flags: e.flags,
                mode: e.mode,
                size: e.size,
                mtime_ns: e.mtime_ns,
                root: e.root.copied(),
                link: e.link,
            });
            rest.push(self.stat_rest[i]);
        }
        self.manifest = b.finish().into();
        self.stat_rest = rest;
    }

    /// The stat identity entry `i` had when it was walked.
    pub fn identity(&self, i: usize) -> FileIdentity {
        let e = self.manifest.entry(i);
        let r = self.stat_rest[i];
        FileIdentity {
            size: e.size,
            mtime_ns: e.mtime_ns,
            ctime_ns: r.ctime_ns,
            inode: r.inode,
            dev: r.dev,
        }
    }

    /// Owner and group of entry `i` when it was walked ((0, 0) where there are none).
    pub fn owner(&self, i: usize) -> (u32, u32) {
        let r = self.stat_rest[i];
        (r.uid, r.gid)
    }

    /// Index claims for every file whose root is known from the walk, in tree order, read
    /// in place from the manifest.
    pub fn claim_refs(&self) -> impl Iterator<Item = ClaimRef<'_>> + '_ {
        self.manifest.iter().enumerate().filter_map(|(i, e)| {
            e.root.map(|r| ClaimRef {
                path: e.path,
                identity: self.identity(i),
                root: *r,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    /// The tree under `root` with only `filter`, and its paths in manifest order.
    /// A sender's walk with `filter` and nothing else.
    fn plain(filter: &Filter) -> WalkOptions<'_> {
        WalkOptions {
            filter,
            protect: None,
            index: None,
            progress: None,
            one_file_system: false,
            skip_symlinks: false,
            copy_links: false,
            dir_merge: &[],
            select: None,
            chmod: None,
            prune_empty_dirs: false,
        }
    }

    fn walk_filtered(root: &Path, filter: &Filter) -> (LocalTree, Vec<String>) {
        let tree = walk(root, &plain(filter)).unwrap();
        let paths = tree
            .manifest
            .iter()
            .map(|e| String::from_utf8_lossy(e.path).into_owned())
            .collect();
        (tree, paths)
    }

    /// -F: each directory's `.rsync-filter` hides what it names there and below; its rules
    /// reach the receiver (re-anchored) only when the file itself is sent, not with -FF.
    #[test]
    fn per_directory_merge_files_hide_below_their_directory_and_travel_only_when_sent() {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        for f in [
            "a.o",
            "lib/b.o",
            "lib/c.c",
            "lib/gen/d.c",
            "lib/sub/gen/e.c",
            "other/gen/f.c",
        ] {
            fs::create_dir_all(r.join(f).parent().unwrap()).unwrap();
            fs::write(r.join(f), b"x").unwrap();
        }
        fs::write(r.join(".rsync-filter"), b"- *.o\n").unwrap();
        fs::write(r.join("lib/.rsync-filter"), b"- /gen/\n").unwrap();
        let specs = [DirMerge::rsync_filter()];
        let walked = |filter: &Filter| {
            let tree = walk(
                r,
                &WalkOptions {
                    dir_merge: &specs,
                    ..plain(filter)
                },
            )
            .unwrap();
            let paths: Vec<String> = tree
                .manifest
                .iter()
                .map(|e| String::from_utf8_lossy(e.path).into_owned())
                .collect();
            (paths, tree.merged_rules)
        };
        let (paths, rules) = walked(&Filter::empty());
        assert_eq!(
            paths,
            [
                "",
                ".rsync-filter",
                "lib",
                "lib/.rsync-filter",
                "lib/c.c",
                "lib/sub",
                "lib/sub/gen",
                "lib/sub/gen/e.c",
                "other",
                "other/gen",
                "other/gen/f.c"
            ]
        );
        assert_eq!(rules, ["/lib/gen/", "/**/*.o"], "deepest directory first, re-anchored");
        let (paths, rules) = walked(&Filter::new(&[".rsync-filter".to_string()]).unwrap());
        assert!(
            !paths.iter().any(|p| p.ends_with(".rsync-filter") || p.ends_with(".o")),
            "{paths:?}"
        );
        assert!(
            rules.is_empty(),
            "-FF: the files are not sent, so neither are their rules"
        );
    }

    #[test]
    fn prune_empty_dirs_drops_chains_without_files_and_keeps_identities_aligned() {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        for d in ["a/b/c", "d/e", "g", "i", "k/l"] {
            fs::create_dir_all(r.join(d)).unwrap();
        }
        fs::write(r.join("d/e/f.txt"), b"f").unwrap();
        fs::write(r.join("k/l/x.log"), b"x").unwrap();
        std::os::unix::fs::symlink("../d", r.join("i/link")).unwrap();
        fs::write(r.join("top"), b"t").unwrap();
        let filter = Filter::new(&["*.log".to_string()]).unwrap();
        let walked = |prune| {
            let o = WalkOptions {
                prune_empty_dirs: prune,
                ..plain(&filter)
            };
            walk(r, &o).unwrap()
        };
        let t = walked(true);
        let paths: Vec<String> = t
            .manifest
            .iter()
            .map(|e| String::from_utf8_lossy(e.path).into_owned())
            .collect();
        // k/l only held an excluded file: pruned too, as rsync prunes after the excludes.
        assert_eq!(paths, ["", "d", "d/e", "d/e/f.txt", "i", "i/link", "top"]);
        let full = walked(false);
        for (i, e) in t.manifest.iter().enumerate() {
            let j = full.manifest.find(e.path).unwrap();
            assert_eq!(t.identity(i), full.identity(j), "{}", String::from_utf8_lossy(e.path));
        }
    }

    #[test]
    fn a_pattern_matching_the_root_s_own_name_does_not_exclude_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        std::fs::create_dir_all(src.join("d")).unwrap();
        std::fs::write(src.join("a"), b"a").unwrap();
        std::fs::write(src.join("d/b"), b"b").unwrap();
        for (rules, want) in [
            (vec!["*"], vec![""]),
            (vec!["src"], vec!["", "a", "d", "d/b"]),
            (vec!["!a", "*"], vec!["", "a"]),
        ] {
            let filter = Filter::new(&rules.iter().map(|r| r.to_string()).collect::<Vec<_>>()).unwrap();
            let (tree, paths) = walk_filtered(&src, &filter);
            assert_eq!(paths, want, "rules {rules:?}");
            // A peer accepts it (a tree of only its root included).
            TreeManifest::decode(tree.manifest.encoded().to_vec()).unwrap();
        }
    }

    #[test]
    fn lists_in_tree_order_without_following_links_and_prunes_excludes() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        fs::create_dir_all(r.join("a/x")).unwrap();
        fs::write(r.join("a/x/f"), b"12345").unwrap();
        fs::write(r.join("a-b"), b"").unwrap();
        fs::create_dir(r.join("skip")).unwrap();
        fs::write(r.join("skip/inner"), b"z").unwrap();
        fs::write(r.join("k.log"), b"z").unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink(r.join("a"), r.join("link")).unwrap();
        let filter = Filter::new(&["skip/".to_string(), "*.log".to_string()]).unwrap();
        let (t, paths) = walk_filtered(r, &filter);
        #[cfg(unix)]
        assert_eq!(paths, vec!["", "a", "a/x", "a/x/f", "a-b", "link"]);
        let f = t.manifest.entry(3);
        assert_eq!((f.kind, f.size), (Kind::File, 5));
        #[cfg(unix)]
        assert_eq!(t.manifest.entry(5).kind, Kind::Symlink);
        // What we produce, a peer accepts.
        TreeManifest::decode(t.manifest.encoded().to_vec()).unwrap();
    }

    #[test]
    fn protect_rules_flag_a_directory_and_everything_below_it() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        fs::create_dir_all(r.join("keep/deep")).unwrap();
        fs::write(r.join("keep/deep/f"), b"1").unwrap();
        fs::write(r.join("other"), b"1").unwrap();
        let protect = Filter::new(&["keep/".to_string()]).unwrap();
        let empty = Filter::empty();
        let t = walk(
            r,
            &WalkOptions {
                protect: Some(&protect),
                ..plain(&empty)
            },
        )
        .unwrap();
        let flagged: Vec<bool> = t.manifest.iter().map(|e| e.has(flags::PROTECTED)).collect();
        assert_eq!(flagged, vec![false, true, true, true, false]);
    }
}
