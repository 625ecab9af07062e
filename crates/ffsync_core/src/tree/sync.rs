//! One peer's side of a tree sync: its walked tree, the peer's manifest, the roots each
//! supplied, the shared plan, and the receiver's execution of that plan (directories,
//! local copies, small-file batches, links, metadata, deferred deletes, index update).
//! The TypeScript shell only moves frames between two of these.

use super::attrs::{self, AttrTable};
use super::claims::{Claim, ClaimPaths, ClaimedEntry};
use super::file_batch::{self, FileStatus};
use super::index;
use super::manifest::{flags, CompressedManifestReader, EntryRef, Kind, TreeManifest};
use super::path::{display, join};
use super::triage::{self, action_flags, Action, ExtraRoots, Op, Plan, TriageOptions};
use super::walk::LocalTree;
use crate::backup::Backup;
use crate::beneath::{Dir, Target};
use crate::error::{CoreError, Result};
use crate::file_identity::FileIdentity;
use crate::restore::{apply_metadata, create_exclusive, partial_of};
use crate::scan::MappedFile;
use rayon::prelude::*;
use std::fs;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Largest decompressed tree manifest accepted from a peer.
pub const MAX_TREE_MANIFEST: usize = 2 << 30;

/// What a step did: files handled, bytes, and per-path problems (each is exit 23, or 24
/// for files that vanished on the sender).
#[derive(Debug, Default)]
pub struct Outcome {
    pub files: u64,
    pub bytes: u64,
    pub errors: Vec<String>,
    pub vanished: Vec<String>,
    /// Not failures (exit 0), but worth telling: names that differ only in case on a
    /// filesystem that folds case.
    pub warnings: Vec<String>,
    /// Receiver: deletions left undone by rsync's --max-delete (exit 25).
    pub deletes_skipped: u64,
}

impl Outcome {
    fn merge(&mut self, o: Outcome) {
        self.files += o.files;
        self.bytes += o.bytes;
        self.errors.extend(o.errors);
        self.vanished.extend(o.vanished);
        self.warnings.extend(o.warnings);
        self.deletes_skipped += o.deletes_skipped;
    }
}

/// A large file that needs a chunk-level conversation.
pub struct LargeTransfer {
    pub action: u32,
    pub path: Vec<u8>,
    pub size: u64,
    /// What the receiver sets when it commits (see `TreeSync::metadata_for`): `None` leaves it.
    pub mtime_ns: Option<i64>,
    pub mode: Option<u32>,
    /// The receiver's old file at the same path is the delta basis.
    pub delta: bool,
}

/// Counts of [`TreeSync::created`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Created {
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
}

pub struct TreeSync {
    pub local: LocalTree,
    pub is_sender: bool,
    state_dir: Option<PathBuf>,
    peer: Option<TreeManifest>,
    peer_in: Option<CompressedManifestReader>,
    my_extra: ExtraRoots,
    peer_extra: ExtraRoots,
    plan: Option<Plan>,
    /// Per action: already executed (a peer may not make us write a path twice).
    done: Vec<AtomicBool>,
    /// Roots learned during this session, for the tree index.
    claims: Mutex<Vec<Claim>>,
    /// The plan may delete (no --no-delete): also governs emptying a replaced directory.
    delete_allowed: AtomicBool,
    /// What triage was told (the attribute table leaves out what it left alone).
    options: TriageOptions,
    /// Receiver: the target root, opened once. Every path the peer names is resolved
    /// beneath it without following links (crate::beneath), never joined into a string.
    root_dir: Mutex<Option<Arc<Dir>>>,
    /// Receiver: make what it writes durable before reporting success (see `sync_tree`);
    /// false is `--no-fsync`. Large files carry their own flag (`BeginOptions::fsync`).
    fsync: bool,
    /// Bytes of small files written since the last batch flush (`flush_file`).
    unflushed: AtomicU64,
    /// A batch flush is running in the background.
    flushing: Arc<AtomicBool>,
    /// Receiver: apply_attrs changed an owner, group or xattr (the tree needs a sync).
    attrs_changed: AtomicBool,
    /// Receiver: rsync's --max-delete (at most this many deletions; `None`: no limit).
    max_delete: Option<u64>,
    /// Receiver: rsync's -b: what a file or symlink replaces or a deletion removes is moved
    /// to its backup name first.
    backup: Option<Arc<Backup>>,
    /// Receiver: rsync's --chown (ids resolved here), applied with the attribute table.
    chown: attrs::Chown,
    /// Receiver: rsync's --partial-dir, where a file replaced whole may have a partial waiting.
    partial_dir: Option<crate::restore::partial_dir::PartialDir>,
    /// Receiver with a shared (absolute) --partial-dir: the names of the plan's chunk-level
    /// transfers, whose partials there a batch leaves (made at the first batch, once).
    chunked_names: std::sync::OnceLock<std::collections::HashSet<Vec<u8>>>,
    /// Receiver: the attribute table's entries for symlinks, which `finish_receiver` creates
    /// after the table was applied to everything else.
    link_attrs: Mutex<Option<AttrTable>>,
}

/// Small files written between two background flushes of the tree's filesystem.
const FLUSH_BATCH: u64 = 64 << 20;

fn is_fatal(e: &CoreError) -> bool {
    matches!(
        e,
        CoreError::DiskFull { .. }
            | CoreError::VerifyFailed(_)
            | CoreError::Malformed { .. }
            | CoreError::ChunkCorrupt { .. }
    )
}

/// The status of a small file the sender could not read: gone or changed since the walk
/// (NotFound, exit 24 at the receiver), or unreadable (exit 23).
fn read_failure(err: &CoreError) -> FileStatus {
    match err {
        CoreError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => FileStatus::Vanished,
        _ => FileStatus::Unreadable,
    }
}

/// A file that is no longer what the walk saw (reported like one that vanished).
fn changed_during_sync(p: &std::path::Path) -> CoreError {
    CoreError::io(
        p,
        std::io::Error::new(std::io::ErrorKind::NotFound, "changed during the sync"),
    )
}

/// Sender reads of its own tree: a link at a file's name is never followed.
#[cfg(unix)]
fn nofollow(o: &mut fs::OpenOptions) -> &mut fs::OpenOptions {
    use std::os::unix::fs::OpenOptionsExt;
    o.custom_flags(libc::O_NOFOLLOW)
}

/// This process's file mode creation mask (rsync's rule for new entries without -p).
/// Read from /proc on Linux, so no thread ever sees it changed; elsewhere set and restored
/// once (the first caller runs before any tree is written).
fn umask() -> u32 {
    static MASK: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *MASK.get_or_init(|| {
        #[cfg(target_os = "linux")]
        if let Some(m) = fs::read_to_string("/proc/self/status").ok().and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Umask:"))
                .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
        }) {
            return m;
        }
        #[cfg(unix)]
        {
            // SAFETY: umask has no memory effects; it is restored at once.
            let m = unsafe { libc::umask(0o022) };
            unsafe { libc::umask(m) };
            m as u32
        }
        #[cfg(not(unix))]
        0o022
    })
}

#[cfg(not(unix))]
fn nofollow(o: &mut fs::OpenOptions) -> &mut fs::OpenOptions {
    o
}

fn set_dir_meta(d: &Dir, mtime_ns: Option<i64>, mode: Option<u32>) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let d = d.as_file()?;
        if let Some(mode) = mode {
            d.set_permissions(fs::Permissions::from_mode(mode & 0o1777))?;
        }
        if let Some(mtime_ns) = mtime_ns {
            d.set_times(fs::FileTimes::new().set_modified(crate::restore::system_time_from_ns(mtime_ns)))?;
        }
        Ok(())
    }
    #[cfg(not(unix))]
    {
        let _ = (d, mtime_ns, mode);
        Ok(())
    }
}

impl TreeSync {
    pub fn new(local: LocalTree, is_sender: bool, state_dir: Option<PathBuf>) -> TreeSync {
        TreeSync {
            local,
            is_sender,
            state_dir,
            peer: None,
            peer_in: None,
            my_extra: ExtraRoots::new(),
            peer_extra: ExtraRoots::new(),
            plan: None,
            done: Vec::new(),
            claims: Mutex::new(Vec::new()),
            delete_allowed: AtomicBool::new(false),
            options: TriageOptions::default(),
            root_dir: Mutex::new(None),
            fsync: true,
            unflushed: AtomicU64::new(0),
            flushing: Arc::new(AtomicBool::new(false)),
            attrs_changed: AtomicBool::new(false),
            max_delete: None,
            backup: None,
            chown: attrs::Chown::default(),
            partial_dir: None,
            chunked_names: Default::default(),
            link_attrs: Mutex::new(None),
        }
    }

    /// Receiver: rsync's --partial-dir. Partials of earlier chunk-level attempts wait there; a
    /// file this tree's batches replace whole has its partials there removed. Call before
    /// the batches arrive.
    pub fn set_partial_dir(&mut self, dir: Option<crate::restore::partial_dir::PartialDir>) {
        self.partial_dir = dir;
    }

    /// Receiver: rsync's --chown USER:GROUP (see `attrs::Chown::parse`). Call before
    /// `apply_attrs`; the sender must carry owners and/or groups (-o/-g, which --chown implies).
    pub fn set_chown(&mut self, chown: attrs::Chown) {
        self.chown = chown;
    }

    /// Receiver: rsync's -b/--backup (with --suffix, --backup-dir). Call before `prepare`.
    pub fn set_backup(&mut self, backup: Option<Arc<Backup>>) {
        self.backup = backup;
    }

    /// Receiver, with -b: move what is at the sender entry's path (a file or symlink about to
    /// be replaced) to its backup name.
    fn back_up(&self, a: &Action, target: &Target) -> std::io::Result<()> {
        match &self.backup {
            Some(b) => b
                .save(target, self.sender_manifest().entry(a.sender_entry as usize).path)
                .map(|_| ()),
            None => Ok(()),
        }
    }

    /// Receiver: rsync's --max-delete. Deletions run deepest first; once `n` were attempted,
    /// the rest are left (a directory whose contents were left stays too) and counted in
    /// `Outcome::deletes_skipped`. `Some(0)` deletes nothing and counts every deletion.
    pub fn set_max_delete(&mut self, n: Option<u64>) {
        self.max_delete = n;
    }

    /// Receiver: `false` (`--no-fsync`) writes files without starting their writeback or
    /// syncing the filesystem at the end; they are durable when the kernel writes them.
    pub fn set_fsync(&mut self, fsync: bool) {
        self.fsync = fsync;
    }

    /// The receiver's target root, opened on first use (the shell creates it first).
    pub fn root_dir(&self) -> std::io::Result<Arc<Dir>> {
        let mut g = self.root_dir.lock().unwrap();
        if let Some(d) = &*g {
            return Ok(d.clone());
        }
        let d = Arc::new(Dir::open_root(&self.local.root)?);
        *g = Some(d.clone());
        Ok(d)
    }

    /// Close the root handle (the session is over; a later call opens it again). A long-
    /// lived process must not keep one descriptor per finished session until GC.
    pub fn release_handles(&self) {
        self.root_dir.lock().unwrap().take();
    }

    /// Where `rel` lives on our side: its directory resolved beneath the root handle
    /// (a link or a non-directory on the way is an error), and its name.
    pub fn place(&self, rel: &[u8]) -> std::io::Result<Target> {
        let root = self.root_dir()?;
        Target::beneath(&root, rel)
    }

    pub fn set_peer_manifest(&mut self, wire: &[u8]) -> Result<()> {
        self.peer = Some(TreeManifest::decode_compressed(wire, MAX_TREE_MANIFEST)?);
        Ok(())
    }

    /// Feed the peer's manifest (wire form) part by part as frames arrive: it is
    /// decompressed as it comes, so the compressed form is never held whole.
    pub fn push_peer_manifest_part(&mut self, part: &[u8]) -> Result<()> {
        self.peer_in
            .get_or_insert_with(|| CompressedManifestReader::new(MAX_TREE_MANIFEST))
            .push(part)
    }

    /// The last part was pushed: validate and keep the peer's manifest.
    pub fn finish_peer_manifest(&mut self) -> Result<()> {
        let reader = self
            .peer_in
            .take()
            .ok_or_else(|| CoreError::malformed("tree manifest", "no parts"))?;
        self.peer = Some(reader.finish()?);
        Ok(())
    }

    fn peer(&self) -> &TreeManifest {
        self.peer.as_ref().expect("peer manifest set before triage")
    }

    /// The sending side's tree manifest (ours on the sender, the peer's on the receiver).
    fn sender_manifest(&self) -> &TreeManifest {
        if self.is_sender {
            &self.local.manifest
        } else {
            self.peer()
        }
    }

    /// The receiving side's tree manifest (the peer's on the sender, ours on the receiver).
    fn receiver_manifest(&self) -> &TreeManifest {
        if self.is_sender {
            self.peer()
        } else {
            &self.local.manifest
        }
    }

    pub fn plan(&self) -> &Plan {
        self.plan.as_ref().expect("triage ran")
    }

    /// Indices of our entries we must hash before triage.
    pub fn roots_to_supply(&self, checksum: bool) -> Vec<u32> {
        let (s, r) = triage::roots_to_supply(self.sender_manifest(), self.receiver_manifest(), checksum);
        if self.is_sender {
            s
        } else {
            r
        }
    }

    fn open_checked(&self, i: usize) -> Result<MappedFile> {
        let e = self.local.manifest.entry(i);
        let p = join(&self.local.root, e.path);
        let f = if self.is_sender {
            // -L: the walk listed what links point to; the identity check below still holds.
            if self.local.follows_links {
                MappedFile::open(&p)?
            } else {
                MappedFile::open_nofollow(&p)?
            }
        } else {
            let file = self
                .place(e.path)
                .and_then(|t| t.open_read())
                .map_err(|err| CoreError::io(&p, err))?;
            MappedFile::from_open(&p, file)?
        };
        if f.identity != self.local.identity(i) {
            return Err(changed_during_sync(&p));
        }
        Ok(f)
    }

    /// Hash our entries `idx` on every core; those that cannot be read are left out (the
    /// plan then sends them, or reports them). Encoded as count u32 + { index u32, root }.
    pub fn hash_entries(&mut self, idx: &[u32], progress: Option<&AtomicU64>) -> Vec<u8> {
        let results: Vec<(u32, [u8; 32])> = idx
            .par_iter()
            .filter_map(|&i| {
                let f = self.open_checked(i as usize).ok()?;
                let manifest = f.manifest(None);
                if let Some(p) = progress {
                    p.fetch_add(f.identity.size, Ordering::Relaxed);
                }
                self.index_if_it_travels(i as usize, &f, &manifest);
                Some((i, manifest.root))
            })
            .collect();
        let mut claims = self.claims.lock().unwrap();
        let mut out = (results.len() as u32).to_le_bytes().to_vec();
        for (i, root) in results {
            out.extend_from_slice(&i.to_le_bytes());
            out.extend_from_slice(&root);
            claims.push(Claim {
                entry: ClaimedEntry::Own(i),
                identity: self.local.identity(i as usize),
                root,
            });
            self.my_extra.insert(i, root);
        }
        out
    }

    /// A file hashed for its root whose peer has another root at its path is about to be
    /// transferred chunk by chunk (a delta's new version on the sender, its old version on the
    /// receiver): its conversation would hash it again, unless the per-file index has its
    /// manifest. Stored as a scan stores it, only while the file is still as hashed
    /// (decisions §103). A file the plan sends whole in a batch does not need it, nor does one
    /// hashed under `--checksum` with no root on the peer (its conversation ignores the index).
    fn index_if_it_travels(&self, i: usize, f: &MappedFile, manifest: &crate::manifest::Manifest) {
        let Some(state_dir) = &self.state_dir else { return };
        if manifest.size <= triage::SMALL_FILE_MAX {
            return;
        }
        let e = self.local.manifest.entry(i);
        let peer = self.peer();
        let travels = match peer.find(e.path).map(|j| peer.entry(j)) {
            // Hashed because the peer has a root: it differs, a delta follows.
            Some(pe) if pe.is_file() => pe.root.is_some_and(|r| r != &manifest.root),
            // New at its path (a rename census): chunk by chunk only over the batch limit, and
            // only if no file of the peer's has its root (then it is a local copy; not known yet).
            _ => manifest.size > triage::NEW_FILE_BATCH_MAX,
        };
        if !travels || !f.unchanged() {
            return;
        }
        let key = crate::scan::index_key(&join(&self.local.root, e.path));
        // A cache: a failed store costs the conversation its hash, nothing else.
        let _ = crate::index::store(state_dir, &key, &f.identity, manifest);
    }

    /// Roots the peer supplied: indices must name files of its manifest.
    pub fn set_peer_roots(&mut self, buf: &[u8]) -> Result<()> {
        let bad = |r: String| CoreError::malformed("roots", r);
        if buf.len() < 4 {
            return Err(bad("too short".into()));
        }
        let n = u32::from_le_bytes(buf[0..4].try_into().unwrap()) as usize;
        if buf.len() != 4 + n * 36 {
            return Err(bad(format!("{n} roots do not fit {} bytes", buf.len())));
        }
        let peer = self.peer();
        let mut extra = ExtraRoots::with_capacity(n);
        for k in 0..n {
            let o = 4 + k * 36;
            let i = u32::from_le_bytes(buf[o..o + 4].try_into().unwrap());
            if i as usize >= peer.len() || !peer.entry(i as usize).is_file() {
                return Err(bad(format!("root for entry {i}, which is not a file")));
            }
            extra.insert(i, buf[o + 4..o + 36].try_into().unwrap());
        }
        self.peer_extra = extra;
        Ok(())
    }

    pub fn triage(&mut self, o: TriageOptions) -> &Plan {
        let (s_extra, r_extra) = if self.is_sender {
            (&self.my_extra, &self.peer_extra)
        } else {
            (&self.peer_extra, &self.my_extra)
        };
        let plan = triage::triage(self.sender_manifest(), self.receiver_manifest(), s_extra, r_extra, o);
        self.delete_allowed.store(o.delete, Ordering::Relaxed);
        self.options = o;
        self.done = (0..plan.actions.len()).map(|_| AtomicBool::new(false)).collect();
        self.plan = Some(plan);
        self.plan()
    }

    /// The modification time and mode the receiver gives the entry an action writes, as
    /// rsync's -t and -p decide: the sender's when kept; without -t none (the time of the
    /// write); without -p an existing entry keeps its mode and a new one gets the sender's
    /// masked by this process's umask.
    pub fn metadata_for(&self, a: &Action) -> (Option<i64>, Option<u32>) {
        let e = self.sender_manifest().entry(a.sender_entry as usize);
        let mtime = (!self.options.omit_times).then_some(e.mtime_ns);
        if !self.options.omit_perms {
            return (mtime, Some(e.mode));
        }
        let existing = (a.receiver_entry != triage::NONE && a.flags & action_flags::REPLACE == 0)
            .then(|| self.receiver_manifest().entry(a.receiver_entry as usize))
            .filter(|re| re.kind == e.kind);
        let mode = match existing {
            // A rebuilt file replaces the old one: it must carry the old mode over.
            Some(re) if e.kind == Kind::File => Some(re.mode),
            // A directory stays where it is: nothing to change.
            Some(_) => None,
            None => Some(e.mode & !umask()),
        };
        (mtime, mode)
    }

    fn action(&self, k: usize) -> Result<&Action> {
        self.plan()
            .actions
            .get(k)
            .ok_or_else(|| CoreError::malformed("file batch", format!("no action {k}")))
    }

    fn claim_once(&self, k: usize) -> Result<()> {
        if self.done[k].swap(true, Ordering::SeqCst) {
            return Err(CoreError::malformed(
                "file batch",
                format!("action {k} delivered twice"),
            ));
        }
        Ok(())
    }

    fn sender_root_of(&self, a: &Action) -> Option<[u8; 32]> {
        let e = self.sender_manifest().entry(a.sender_entry as usize);
        let extra = if self.is_sender {
            &self.my_extra
        } else {
            &self.peer_extra
        };
        e.root.copied().or_else(|| extra.get(&a.sender_entry).copied())
    }

    /// Sender, before triage: the files this session will probably hash, packed for the
    /// binding as `{ len u32 LE, path bytes }*` in walk order (the plan's order). Regular files
    /// over [`triage::SMALL_FILE_MAX`] (smaller ones travel whole in batches, hashed as they
    /// are read) and at most `max_size` bytes, whose root the tree index did not supply, until
    /// `max_bytes` of them are listed. The shell scans them while it waits for the receiver's
    /// manifest, so the per-file conversations find their manifests in the index (decisions
    /// §95). Which of them triage keeps is not known yet: the list is a guess, and bounded.
    pub fn scan_ahead_candidates(&self, max_size: u64, max_bytes: u64) -> Vec<u8> {
        let mut out = Vec::new();
        let mut listed = 0u64;
        for e in self.local.manifest.iter() {
            if listed >= max_bytes {
                break;
            }
            if !e.is_file() || e.root.is_some() || e.size <= triage::SMALL_FILE_MAX || e.size > max_size {
                continue;
            }
            listed += e.size;
            out.extend_from_slice(&(e.path.len() as u32).to_le_bytes());
            out.extend_from_slice(e.path);
        }
        out
    }

    pub fn large_transfers(&self) -> Vec<LargeTransfer> {
        let s = self.sender_manifest();
        self.plan()
            .actions
            .iter()
            .enumerate()
            .filter(|(_, a)| a.op == Op::Transfer && a.flags & action_flags::SMALL == 0)
            .map(|(k, a)| {
                let e = s.entry(a.sender_entry as usize);
                let (mtime_ns, mode) = self.metadata_for(a);
                LargeTransfer {
                    action: k as u32,
                    path: e.path.to_vec(),
                    size: e.size,
                    mtime_ns,
                    mode,
                    delta: a.flags & action_flags::DELTA != 0,
                }
            })
            .collect()
    }

    /// Files and bytes in the sender's tree.
    pub fn source_totals(&self) -> (u64, u64) {
        self.sender_manifest()
            .iter()
            .filter(|e| e.is_file())
            .fold((0, 0), |(n, b), e| (n + 1, b + e.size))
    }

    /// Bytes of the files that travel whole in batches.
    pub fn small_bytes(&self) -> u64 {
        let s = self.sender_manifest();
        self.plan()
            .actions
            .iter()
            .filter(|a| a.op == Op::Transfer && a.flags & action_flags::SMALL != 0)
            .map(|a| s.entry(a.sender_entry as usize).size)
            .sum()
    }

    // ---- sender ----

    /// Fill `out` with records of small files starting at action `cursor`; returns
    /// (bytes written, next cursor or None when done, raw bytes read). `shared`: the peer
    /// decodes stream records (capability BATCH_STREAM), so the batch's files share a
    /// compression context.
    pub fn read_small(
        &self,
        cursor: usize,
        out: &mut [u8],
        level: i32,
        shared: bool,
    ) -> Result<(usize, Option<usize>, u64)> {
        let plan = self.plan();
        let s = &self.local.manifest;
        let mut picked = Vec::new();
        let mut budget = 0usize;
        let mut k = cursor;
        while k < plan.actions.len() {
            let a = &plan.actions[k];
            if a.op == Op::Transfer && a.flags & action_flags::SMALL != 0 {
                let need = s.entry(a.sender_entry as usize).size as usize + file_batch::RECORD_HEADER + 64;
                if !picked.is_empty() && budget + need > out.len() {
                    break;
                }
                budget += need;
                picked.push(k);
            }
            k += 1;
        }
        if level == 0 {
            return self
                .read_small_raw(&picked, out)
                .map(|(n, raw)| (n, (k < plan.actions.len()).then_some(k), raw));
        }
        let files: Vec<(file_batch::BatchFile, Option<Claim>)> = picked
            .par_iter()
            .map(|&k| {
                let a = &plan.actions[k];
                let i = a.sender_entry as usize;
                match self.read_whole(i) {
                    Ok(data) => {
                        let claim = Claim {
                            entry: ClaimedEntry::Own(i as u32),
                            identity: self.local.identity(i),
                            root: [0; 32],
                        };
                        let f = file_batch::BatchFile {
                            action: k as u32,
                            status: FileStatus::Ok,
                            data,
                        };
                        (f, Some(claim))
                    }
                    Err(err) => {
                        let f = file_batch::BatchFile {
                            action: k as u32,
                            status: read_failure(&err),
                            data: Vec::new(),
                        };
                        (f, None)
                    }
                }
            })
            .collect();
        let (files, claims_of): (Vec<_>, Vec<_>) = files.into_iter().unzip();
        let encoded = file_batch::encode_batch(&files, level, shared);
        let records: Vec<(Vec<u8>, u64, Option<Claim>)> = encoded
            .into_iter()
            .zip(files.iter().zip(claims_of))
            .map(|(rec, (f, claim))| {
                let claim = claim.map(|mut c| {
                    c.root = rec[14..46].try_into().unwrap();
                    c
                });
                (rec, f.data.len() as u64, claim)
            })
            .collect();
        let mut n = 0;
        let mut raw = 0;
        let mut claims = self.claims.lock().unwrap();
        for (rec, len, claim) in records {
            if n + rec.len() > out.len() {
                return Err(CoreError::Usage("file batch buffer too small".into()));
            }
            out[n..n + rec.len()].copy_from_slice(&rec);
            n += rec.len();
            raw += len;
            claims.extend(claim);
        }
        Ok((n, (k < plan.actions.len()).then_some(k), raw))
    }

    /// `read_small` without compression: each file is read straight into its record's place
    /// in `out` and its root computed there (no copy into a record of its own, then into
    /// `out`: two passes over fresh memory per byte, decisions §102). Records of files that
    /// could not be read are shorter than the place kept for them: the records after them
    /// move up. Returns (bytes written, raw bytes read).
    fn read_small_raw(&self, picked: &[usize], out: &mut [u8]) -> Result<(usize, u64)> {
        let plan = self.plan();
        let s = &self.local.manifest;
        let mut places = Vec::with_capacity(picked.len());
        let mut rest = &mut out[..];
        for &k in picked {
            let size = s.entry(plan.actions[k].sender_entry as usize).size as usize;
            if rest.len() < file_batch::RECORD_HEADER + size {
                return Err(CoreError::Usage("file batch buffer too small".into()));
            }
            let (place, after) = std::mem::take(&mut rest).split_at_mut(file_batch::RECORD_HEADER + size);
            places.push((k, place));
            rest = after;
        }
        let filled: Vec<(usize, usize, u64, Option<Claim>)> = places
            .into_par_iter()
            .map(|(k, place)| {
                let i = plan.actions[k].sender_entry as usize;
                let (head, data) = place.split_at_mut(file_batch::RECORD_HEADER);
                let (status, root) = match self.read_whole_into(i, data) {
                    Ok(()) => (FileStatus::Ok, file_batch::root_of_bytes(data)),
                    Err(err) => (read_failure(&err), [0; 32]),
                };
                let ok = status == FileStatus::Ok;
                let len = if ok { data.len() } else { 0 };
                head.copy_from_slice(&file_batch::record_header(
                    k as u32,
                    status,
                    file_batch::ENC_RAW,
                    len,
                    &root,
                    len,
                ));
                let claim = ok.then(|| Claim {
                    entry: ClaimedEntry::Own(i as u32),
                    identity: self.local.identity(i),
                    root,
                });
                (
                    file_batch::RECORD_HEADER + data.len(),
                    file_batch::RECORD_HEADER + len,
                    len as u64,
                    claim,
                )
            })
            .collect();
        let (mut from, mut n, mut raw) = (0, 0, 0);
        let mut claims = self.claims.lock().unwrap();
        for (place, used, len, claim) in filled {
            if from != n {
                out.copy_within(from..from + used, n);
            }
            from += place;
            n += used;
            raw += len;
            claims.extend(claim);
        }
        Ok((n, raw))
    }

    /// A small file's bytes, if it still is what the walk saw (else NotFound: vanished).
    fn read_whole(&self, i: usize) -> Result<Vec<u8>> {
        let mut data = vec![0u8; self.local.manifest.entry(i).size as usize];
        self.read_whole_into(i, &mut data)?;
        Ok(data)
    }

    /// `read_whole` into `data`, which has the length the walk saw.
    fn read_whole_into(&self, i: usize, data: &mut [u8]) -> Result<()> {
        let (mut f, p) = self.open_whole(i)?;
        match f.read_exact(data) {
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Err(changed_during_sync(&p)),
            r => r.map_err(|e| CoreError::io(&p, e))?,
        }
        // Grown since the walk: one byte more is enough to tell.
        let mut more = Vec::new();
        if (&mut f)
            .take(1)
            .read_to_end(&mut more)
            .map_err(|e| CoreError::io(&p, e))?
            != 0
        {
            return Err(changed_during_sync(&p));
        }
        Ok(())
    }

    /// A small file opened for reading, if it still is what the walk saw.
    fn open_whole(&self, i: usize) -> Result<(fs::File, PathBuf)> {
        let e = self.local.manifest.entry(i);
        let p = join(&self.local.root, e.path);
        let mut o = fs::OpenOptions::new();
        o.read(true);
        if !self.local.follows_links {
            nofollow(&mut o);
        }
        let f = o.open(&p).map_err(|e| CoreError::io(&p, e))?;
        let m = f.metadata().map_err(|e| CoreError::io(&p, e))?;
        if FileIdentity::of(&m) != self.local.identity(i) {
            return Err(changed_during_sync(&p));
        }
        Ok((f, p))
    }

    /// After a large file was sent: remember its root for the tree index. An action the plan
    /// does not have is the caller's bug, refused. A file that cannot be looked at now (gone,
    /// or changed on the sender) is not recorded: the index is a cache, and such a file is
    /// hashed again by the next sync.
    pub fn claim_root(&self, action: usize, root: [u8; 32]) -> Result<()> {
        let a = self.action(action)?;
        // Only a large transfer's root is learnt this way (small files' roots come with their
        // batch); any other action has no file of the sender's to claim, a Delete not even an
        // entry.
        if a.op != Op::Transfer || a.flags & action_flags::SMALL != 0 {
            return Err(CoreError::malformed(
                "root claim",
                format!("action {action} is not a large transfer"),
            ));
        }
        let (m, idx) = if self.is_sender {
            (&*self.local.manifest, a.sender_entry)
        } else {
            (self.sender_manifest(), a.sender_entry)
        };
        let rel = m.entry(idx as usize).path.to_vec();
        let meta = if self.is_sender {
            fs::symlink_metadata(join(&self.local.root, &rel))
        } else {
            self.place(&rel).and_then(|t| t.open_read()).and_then(|f| f.metadata())
        };
        let Ok(meta) = meta else { return Ok(()) };
        let identity = FileIdentity::of(&meta);
        if self.is_sender && identity != self.local.identity(idx as usize) {
            return Ok(()); // changed since the walk: the root may be of another version
        }
        self.claims.lock().unwrap().push(Claim {
            entry: if self.is_sender {
                ClaimedEntry::Own(idx)
            } else {
                ClaimedEntry::Senders(idx)
            },
            identity,
            root,
        });
        Ok(())
    }

    // ---- receiver ----

    /// Clear the receiver's entry at an action's path so something of another kind can take
    /// its place. A directory goes only with what our walk listed inside it, deepest first,
    /// never its protected entries; whatever remains (protected, excluded, appeared since)
    /// makes the final rmdir fail, and the replacement is reported instead (exit 23).
    /// Emptying a non-empty directory is a deletion: refused under --no-delete.
    fn clear_receiver_entry(&self, a: &Action) -> std::io::Result<()> {
        if a.receiver_entry == triage::NONE {
            return Ok(());
        }
        let r = self.receiver_manifest();
        let j = a.receiver_entry as usize;
        let e = r.entry(j);
        let p = self.place(e.path)?;
        if !e.is_dir() {
            return match p.unlink() {
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(()),
                res => res,
            };
        }
        let inside: Vec<usize> = (j + 1..r.len())
            .take_while(|&k| super::path::is_under(r.entry(k).path, e.path))
            .collect();
        if !inside.is_empty() && !self.delete_allowed.load(Ordering::Relaxed) {
            return Err(std::io::Error::other(
                "replacing a non-empty directory is a deletion (refused with --no-delete)",
            ));
        }
        if inside.iter().any(|&k| r.entry(k).has(flags::PROTECTED)) {
            return Err(std::io::Error::other(
                "the directory in the way holds protected entries; not replaced",
            ));
        }
        for &k in inside.iter().rev() {
            let c = r.entry(k);
            let cp = self.place(c.path)?;
            let res = if c.is_dir() {
                cp.dir.rmdir(&cp.name)
            } else {
                cp.unlink()
            };
            match res {
                Err(err)
                    if matches!(
                        err.kind(),
                        std::io::ErrorKind::NotFound | std::io::ErrorKind::DirectoryNotEmpty
                    ) => {}
                other => other?,
            }
        }
        p.dir.rmdir(&p.name).map_err(|err| {
            if err.kind() == std::io::ErrorKind::DirectoryNotEmpty {
                std::io::Error::other("the directory in the way holds protected or excluded entries; not replaced")
            } else {
                err
            }
        })
    }

    /// The sender's path of an action, resolved on our side (see `place`).
    fn target(&self, a: &Action) -> std::io::Result<Target> {
        self.place(self.sender_manifest().entry(a.sender_entry as usize).path)
    }

    /// For messages: the action's path as a string under our root.
    fn shown(&self, a: &Action) -> PathBuf {
        join(
            &self.local.root,
            self.sender_manifest().entry(a.sender_entry as usize).path,
        )
    }

    /// Directories first (replacing anything of another kind in the way), then renames
    /// served from our own disk, each verified against the sender's root. Counts the copies.
    pub fn prepare(&self) -> Result<Outcome> {
        let mut out = Outcome::default();
        let plan = self.plan();
        let mut failed_dirs: Vec<Vec<u8>> = Vec::new();
        for a in plan.actions.iter().filter(|a| a.op == Op::Mkdir) {
            let e = self.sender_manifest().entry(a.sender_entry as usize);
            if failed_dirs.iter().any(|d| super::path::is_under(e.path, d)) {
                continue;
            }
            let p = self.shown(a);
            let r = (|| {
                if a.flags & action_flags::REPLACE != 0 {
                    self.clear_receiver_entry(a)?;
                }
                let t = self.target(a)?;
                match t.dir.mkdir(&t.name, 0o777) {
                    // Only a real directory may stand where the sender has one: a link (even
                    // one our walk never saw, hidden by an exclude) or a file is never
                    // written through, and everything under it fails per path.
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => match t.lstat()? {
                        Some(st) if st.is_dir() => Ok(()),
                        _ => Err(std::io::Error::new(
                            std::io::ErrorKind::AlreadyExists,
                            "something that is not a directory is in the way (not replaced, nothing written through it)",
                        )),
                    },
                    r => r,
                }
            })();
            if let Err(err) = r {
                let err = CoreError::io(&p, err);
                if is_fatal(&err) {
                    return Err(err);
                }
                out.errors
                    .push(format!("cannot create directory {}: {err}", display(e.path)));
                failed_dirs.push(e.path.to_vec());
            }
        }
        // Copies go to temp files first and are renamed after all of them are made: a
        // copy's source may be another copy's destination (two files swapped names).
        let copies: Vec<(usize, &Action)> = plan
            .actions
            .iter()
            .enumerate()
            .filter(|(_, a)| a.op == Op::LocalCopy)
            .collect();
        let flush = self.batch_flush()?;
        let made: Vec<(usize, Result<Target>)> = copies.par_iter().map(|&(k, a)| (k, self.copy_local(a))).collect();
        // Durable before any is renamed (see `BatchFlush`).
        if let Err(e) = self.flushed(flush, made.iter().any(|(_, r)| r.is_ok())) {
            for (_, r) in &made {
                if let Ok(tmp) = r {
                    let _ = tmp.unlink();
                }
            }
            return Err(e);
        }
        for (k, r) in made {
            let a = &plan.actions[k];
            let rel = self.sender_manifest().entry(a.sender_entry as usize).path;
            match r.and_then(|tmp| self.commit(a, &tmp)) {
                Ok(size) => {
                    self.done[k].store(true, Ordering::SeqCst);
                    out.files += 1;
                    out.bytes += size;
                }
                Err(e) if is_fatal(&e) => return Err(e),
                Err(e) => out.errors.push(format!("cannot copy {} locally: {e}", display(rel))),
            }
        }
        Ok(out)
    }

    fn copy_local(&self, a: &Action) -> Result<Target> {
        let root = self
            .sender_root_of(a)
            .ok_or_else(|| CoreError::Usage("local copy without a root".into()))?;
        let src = self.open_checked(a.basis as usize)?;
        let shown = self.shown(a);
        let target = self.target(a).map_err(|e| CoreError::io(&shown, e))?;
        let (tmp, dst) = create_exclusive(partial_of(&target, &root)).map_err(|e| CoreError::io(&shown, e))?;
        let size = src.identity.size;
        crate::io::copy::copy_range(&src.file, 0, &dst, 0, size).map_err(|e| {
            let _ = tmp.unlink();
            CoreError::io(tmp.shown(), e)
        })?;
        let check = dst
            .try_clone()
            .map_err(|e| CoreError::io(tmp.shown(), e))
            .and_then(|f| MappedFile::from_open(&tmp.shown(), f))
            .map(|m| m.manifest(None).root);
        if check.as_ref().ok() != Some(&root) {
            let _ = tmp.unlink();
            return Err(CoreError::io(
                &shown,
                std::io::Error::other("local copy did not match the sender's root"),
            ));
        }
        let (mtime_ns, mode) = self.metadata_for(a);
        apply_metadata(&dst, &tmp.shown(), mtime_ns, mode)?;
        self.flush_file(&dst, size).map_err(|e| {
            let _ = tmp.unlink();
            CoreError::io(tmp.shown(), e)
        })?;
        Ok(tmp)
    }

    /// Rename a verified temp file into place (clearing another kind in the way first)
    /// and record its root for the index.
    fn commit(&self, a: &Action, tmp: &Target) -> Result<u64> {
        let root = self.sender_root_of(a).unwrap_or([0; 32]);
        self.commit_with_root(a, tmp, root)
    }

    fn commit_with_root(&self, a: &Action, tmp: &Target, root: [u8; 32]) -> Result<u64> {
        let shown = self.shown(a);
        let target = match self.target(a) {
            Ok(t) => t,
            Err(e) => {
                let _ = tmp.unlink();
                return Err(CoreError::io(&shown, e));
            }
        };
        if let Err(e) = self.back_up(a, &target) {
            let _ = tmp.unlink();
            return Err(CoreError::io(
                &shown,
                std::io::Error::other(format!("cannot make its backup: {e}")),
            ));
        }
        if a.flags & action_flags::REPLACE != 0 {
            if let Err(e) = self.clear_receiver_entry(a) {
                let _ = tmp.unlink();
                return Err(CoreError::io(&shown, e));
            }
        }
        tmp.rename_to(&target).map_err(|e| {
            let _ = tmp.unlink();
            CoreError::io(&shown, e)
        })?;
        let meta = target
            .open_read()
            .and_then(|f| f.metadata())
            .map_err(|e| CoreError::io(&shown, e))?;
        if root != [0; 32] {
            self.claims.lock().unwrap().push(Claim {
                entry: ClaimedEntry::Senders(a.sender_entry),
                identity: FileIdentity::of(&meta),
                root,
            });
        }
        Ok(meta.len())
    }

    /// Before a large file's rebuilt temp is renamed over a directory: remove it.
    pub fn clear_for(&self, action: usize) -> Result<()> {
        let a = self.action(action)?;
        if a.flags & action_flags::REPLACE != 0 {
            self.clear_receiver_entry(a)
                .map_err(|e| CoreError::io(self.shown(a), e))?;
        }
        Ok(())
    }

    /// Verify and write one batch of small files (in parallel).
    pub fn write_small(&self, batch: &[u8]) -> Result<Outcome> {
        let mut records = file_batch::decode(batch)?;
        let s = self.sender_manifest();
        for r in &records {
            let k = r.action as usize;
            let a = self.action(k)?;
            if a.op != Op::Transfer || a.flags & action_flags::SMALL == 0 {
                return Err(CoreError::malformed(
                    "file batch",
                    format!("action {k} is not a small-file transfer"),
                ));
            }
            if r.status == FileStatus::Ok && r.raw_len as u64 != s.entry(a.sender_entry as usize).size {
                return Err(CoreError::malformed(
                    "file batch",
                    format!(
                        "action {k} has {} bytes, the manifest said {}",
                        r.raw_len,
                        s.entry(a.sender_entry as usize).size
                    ),
                ));
            }
            self.claim_once(k)?;
        }
        file_batch::inflate_streams(&mut records)?;
        // Temps first, all of them, then one flush, then the renames: nothing is renamed into
        // place before the device has its data (see `BatchFlush`).
        let flush = self.batch_flush()?;
        let written: Vec<Result<(Outcome, Option<Written>)>> = records
            .par_iter()
            .map(|r| {
                let a = &self.plan().actions[r.action as usize];
                let rel = display(s.entry(a.sender_entry as usize).path);
                let mut o = Outcome::default();
                let mut made = None;
                match r.status {
                    FileStatus::Vanished => o.vanished.push(format!("{rel} vanished or changed on the sender")),
                    FileStatus::Unreadable => o.errors.push(format!("{rel}: the sender could not read it")),
                    FileStatus::Ok => {
                        let data = r.content()?;
                        match self.write_temp(a, &data, &r.root) {
                            Ok(tmp) => made = Some((r.action as usize, tmp, r.root, data.len() as u64)),
                            Err(e) if is_fatal(&e) => return Err(e),
                            Err(e) => o.errors.push(format!("cannot write {rel}: {e}")),
                        }
                    }
                }
                Ok((o, made))
            })
            .collect();
        let mut out = Outcome::default();
        let mut temps = Vec::new();
        let mut failed = None;
        for w in written {
            match w {
                Ok((o, made)) => {
                    out.merge(o);
                    temps.extend(made);
                }
                Err(e) => failed = failed.or(Some(e)),
            }
        }
        if let Some(e) = failed.or_else(|| self.flushed(flush, !temps.is_empty()).err()) {
            for (_, tmp, _, _) in &temps {
                let _ = tmp.unlink();
            }
            return Err(e);
        }
        let committed: Vec<(Result<u64>, u64, String)> = temps
            .par_iter()
            .map(|(k, tmp, root, len)| {
                let a = &self.plan().actions[*k];
                let rel = display(s.entry(a.sender_entry as usize).path);
                (self.commit_with_root(a, tmp, *root), *len, rel)
            })
            .collect();
        let mut replaced = Vec::new();
        for ((c, len, rel), w) in committed.into_iter().zip(&temps) {
            match c {
                Ok(_) => {
                    out.files += 1;
                    out.bytes += len;
                    replaced.push(w);
                }
                Err(e) if is_fatal(&e) => return Err(e),
                Err(e) => out.errors.push(format!("cannot write {rel}: {e}")),
            }
        }
        self.remove_replaced_partials(&replaced);
        Ok(out)
    }

    /// After a batch: a file over [`triage::SMALL_FILE_MAX`] that replaced the receiver's file
    /// whole may have a partial beside it from an earlier chunk-level attempt (interrupted, or
    /// by a build or a `--no-whole-file` sync that sent it as a delta; a local sync sends such
    /// files whole since decisions §107), which nothing would resume or remove any more. One
    /// listing per directory of the batch, through the temp's directory handle (the target's:
    /// nothing is resolved again). With `--partial-dir`, the partials kept there for every file
    /// of the batch go too, new and small ones included (a file may have been larger when its
    /// attempt was interrupted), as rsync removes a finished file's partial (decisions §108):
    /// a look for the directory per directory of the batch, or one listing of a shared
    /// (absolute) one for the whole batch, which leaves the partials of names that the plan
    /// still sends chunk by chunk (a same-named file elsewhere, whose partial it may be).
    fn remove_replaced_partials(&self, written: &[&Written]) {
        let s = self.sender_manifest();
        let name_of = |path: &[u8]| super::path::name_bytes(&super::path::os_name(super::path::name_of(path)));
        // Per directory: the temp (its handle), the names whose partials beside them go, and
        // every name (for the partial directory).
        type Names = Vec<Vec<u8>>;
        let mut by_dir: std::collections::BTreeMap<&[u8], (&Target, Names, Names)> = Default::default();
        for (k, tmp, _, _) in written {
            let a = &self.plan().actions[*k];
            let e = s.entry(a.sender_entry as usize);
            let beside = a.receiver_entry != triage::NONE && e.size > triage::SMALL_FILE_MAX;
            if !beside && self.partial_dir.is_none() {
                continue;
            }
            // The target's name as `place` makes it (a sibling of the temp).
            let name = name_of(e.path);
            let d = by_dir
                .entry(super::path::parent_of(e.path))
                .or_insert((tmp, Vec::new(), Vec::new()));
            if beside {
                d.1.push(name.clone());
            }
            d.2.push(name);
        }
        for (sibling, beside, _) in by_dir.values() {
            if !beside.is_empty() {
                crate::restore::staging::remove_partials_of(sibling, beside);
            }
        }
        let Some(pd) = &self.partial_dir else { return };
        if !pd.is_shared() {
            for (sibling, _, all) in by_dir.values() {
                pd.remove_partials_of(&sibling.dir, all);
            }
            return;
        }
        let chunked = self.chunked_names.get_or_init(|| {
            self.plan()
                .actions
                .iter()
                .filter(|a| a.op == Op::Transfer && a.flags & action_flags::SMALL == 0)
                .map(|a| name_of(s.entry(a.sender_entry as usize).path))
                .collect()
        });
        let names: Names = by_dir
            .values()
            .flat_map(|d| d.2.iter())
            .filter(|n| !chunked.contains(*n))
            .cloned()
            .collect();
        if let Some((sibling, _, _)) = by_dir.values().next().filter(|_| !names.is_empty()) {
            pd.remove_partials_of(&sibling.dir, &names);
        }
    }

    /// A small file's content in a temp beside its target (metadata set), not yet renamed.
    fn write_temp(&self, a: &Action, data: &[u8], root: &[u8; 32]) -> Result<Target> {
        let (mtime_ns, mode) = self.metadata_for(a);
        let shown = self.shown(a);
        let target = self.target(a).map_err(|err| CoreError::io(&shown, err))?;
        let (tmp, mut f) = create_exclusive(partial_of(&target, root)).map_err(|err| CoreError::io(&shown, err))?;
        let mut write = || -> std::io::Result<()> {
            f.write_all(data)?;
            apply_metadata(&f, &tmp.shown(), mtime_ns, mode).map_err(|e| std::io::Error::other(e.to_string()))?;
            self.flush_file(&f, data.len() as u64)
        };
        write().map_err(|err| {
            let _ = tmp.unlink();
            CoreError::io(&shown, err)
        })?;
        Ok(tmp)
    }

    /// Taken before a batch of files is written whole (small files, local copies): see
    /// `BatchFlush`. None where there is nothing to watch (`--no-fsync`; elsewhere than Linux,
    /// where each file is fsynced before its rename by `flush_file`).
    fn batch_flush(&self) -> Result<Option<BatchFlush>> {
        #[cfg(target_os = "linux")]
        if self.fsync {
            let root = self.root_dir().map_err(|e| CoreError::io(&self.local.root, e))?;
            return BatchFlush::watch(&root)
                .map(Some)
                .map_err(|e| CoreError::io(&self.local.root, e));
        }
        Ok(None)
    }

    /// The batch's files are on the device (when any were written), or the error that says
    /// they may not be.
    fn flushed(&self, flush: Option<BatchFlush>, wrote: bool) -> Result<()> {
        match flush {
            Some(f) if wrote => f.sync().map_err(|e| {
                CoreError::io(
                    &self.local.root,
                    std::io::Error::new(e.kind(), format!("written files could not be made durable: {e}")),
                )
            }),
            _ => Ok(()),
        }
    }

    /// A file of this session was just written whole (a small file, a local copy). On Linux
    /// a file of a writeback window or more starts its writeback now; small files are
    /// flushed in batches: every `FLUSH_BATCH` bytes of them, one `syncfs` runs in the
    /// background (the writer does not wait), so the final syncfs finds little left. A
    /// writeback call per small file costs more than it saves (measured: 5000 files of
    /// 4 KiB, 0.27 s of `sync_file_range` against a final syncfs of under 1 ms). Elsewhere
    /// each file is fsynced before its rename. With `--no-fsync`, only a file of a window or
    /// more has its writeback started (ext4 would start it in the rename over an old version,
    /// which then waits for it: decisions §115); nothing is flushed.
    fn flush_file(&self, f: &fs::File, len: u64) -> std::io::Result<()> {
        #[cfg(target_os = "linux")]
        {
            if len >= crate::io::writeback::KICK {
                crate::io::writeback::start(f, 0, len, self.fsync);
            } else if self.fsync && self.unflushed.fetch_add(len, Ordering::Relaxed) + len >= FLUSH_BATCH {
                self.unflushed.store(0, Ordering::Relaxed);
                self.flush_in_background();
            }
            Ok(())
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = len;
            if self.fsync {
                f.sync_all()
            } else {
                Ok(())
            }
        }
    }

    /// One `syncfs` of the tree's filesystem on its own thread, unless one is running.
    #[cfg(target_os = "linux")]
    fn flush_in_background(&self) {
        // Its own open file description: a syncfs consumes the writeback errors it reports for
        // the description it was called on, and this one's result is not looked at (§85).
        let Ok(watch) = self.root_dir().and_then(|root| BatchFlush::watch(&root)) else {
            return;
        };
        if self.flushing.swap(true, Ordering::SeqCst) {
            return;
        }
        let flushing = self.flushing.clone();
        let spawned = std::thread::Builder::new().name("ffsync-flush".into()).spawn(move || {
            // Early writeback only: each batch's own flush, and the session's last
            // (finish_receiver), report errors.
            let _ = watch.sync();
            flushing.store(false, Ordering::SeqCst);
        });
        if spawned.is_err() {
            self.flushing.store(false, Ordering::SeqCst);
        }
    }

    /// Everything after the data: links, metadata of unchanged files, deletions (only when
    /// `delete_ok`: every transfer succeeded), directory metadata, durability, index.
    /// Sender (`-o`, `-g`, `-X`): the attribute side table of every entry the plan does not
    /// leave alone, zstd-compressed for TREE_ATTRS (see tree/attrs.rs).
    pub fn collect_attrs(&self, flags: u8) -> Vec<u8> {
        let m = &self.local.manifest;
        let o = self.options;
        let table = attrs::collect(
            &self.local.root,
            m,
            flags,
            |i| {
                let e = m.entry(i);
                let left_alone = e.has(flags::UNREADABLE) || (e.is_file() && o.size_excluded(e.size));
                !left_alone
            },
            |i| self.local.owner(i),
        );
        zstd::bulk::compress(&table.encode(), 3).expect("zstd compress")
    }

    /// Receiver: apply the sender's attribute table (after every file is in place, before
    /// finish_receiver sets directory times). Failures are per path (exit 23).
    pub fn apply_attrs(&self, compressed: &[u8]) -> Result<Outcome> {
        // Decoded as it decompresses: a bomb stops at its first bad field.
        let s = self.sender_manifest();
        let table = AttrTable::decode_compressed(compressed, s.len())?;
        let root = self.root_dir().map_err(|e| CoreError::io(&self.local.root, e))?;
        // Our walk's owner of each sender entry's path, where this session has not replaced
        // the entry since (a created or rewritten one is looked at again).
        let (r, plan) = (self.receiver_manifest(), self.plan());
        let mut rewritten = vec![false; s.len()];
        for a in &plan.actions {
            if matches!(a.op, Op::Mkdir | Op::LocalCopy | Op::Transfer | Op::Symlink) {
                rewritten[a.sender_entry as usize] = true;
            }
        }
        let mut walked: Vec<Option<(u32, u32)>> = vec![None; s.len()];
        triage::merge(s, r, |i, j| {
            if let (Some(i), Some(j)) = (i, j) {
                if !rewritten[i] && s.entry(i).kind == r.entry(j).kind {
                    walked[i] = Some(self.local.owner(j));
                }
            }
        });
        let applied = attrs::apply(&root, s, &table, |i| walked.get(i).copied().flatten(), self.chown);
        // Symlinks the plan creates do not exist yet: their owners are set once they do.
        let links: std::collections::HashSet<u32> = plan
            .actions
            .iter()
            .filter(|a| a.op == Op::Symlink)
            .map(|a| a.sender_entry)
            .collect();
        if !links.is_empty() {
            *self.link_attrs.lock().unwrap() = Some(AttrTable {
                flags: table.flags,
                users: table.users.clone(),
                groups: table.groups.clone(),
                entries: table
                    .entries
                    .iter()
                    .filter(|(i, _)| links.contains(i))
                    .cloned()
                    .collect(),
            });
        }
        if applied.changed {
            self.attrs_changed.store(true, Ordering::Relaxed);
        }
        Ok(Outcome {
            errors: applied.problems,
            warnings: applied.warnings,
            ..Default::default()
        })
    }

    pub fn finish_receiver(&self, delete_ok: bool) -> Result<Outcome> {
        let mut out = Outcome::default();
        let plan = self.plan();
        let (s, r) = (self.sender_manifest(), self.receiver_manifest());
        let mut deletes_tried = 0u64;
        // Paths --max-delete left; deletions run deepest first, so a directory comes after
        // everything under it.
        let mut left: Vec<&[u8]> = Vec::new();
        for (k, a) in plan.actions.iter().enumerate() {
            if a.op == Op::Delete && delete_ok && self.max_delete.is_some() {
                let e = r.entry(a.receiver_entry as usize);
                if e.is_dir() && left.iter().any(|p| super::path::is_under(p, e.path)) {
                    // Not empty, so not deletable: as rsync, not counted as skipped either.
                    continue;
                }
                if self.max_delete.is_some_and(|m| deletes_tried >= m) {
                    out.deletes_skipped += 1;
                    left.push(e.path);
                    continue;
                }
                deletes_tried += 1;
            }
            let res: std::io::Result<()> = match a.op {
                Op::Symlink => self.make_link(a, &s.entry(a.sender_entry as usize)),
                Op::FileMeta => {
                    let p = self.shown(a);
                    (|| {
                        let f = self.target(a)?.open_read()?;
                        let (mtime_ns, mode) = self.metadata_for(a);
                        apply_metadata(&f, &p, mtime_ns, mode).map_err(|e| std::io::Error::other(e.to_string()))?;
                        if let Some(root) = self.sender_root_of(a) {
                            let identity = FileIdentity::of(&f.metadata()?);
                            self.claims.lock().unwrap().push(Claim {
                                entry: ClaimedEntry::Senders(a.sender_entry),
                                identity,
                                root,
                            });
                        }
                        Ok(())
                    })()
                }
                Op::Delete if delete_ok => (|| {
                    let rel = r.entry(a.receiver_entry as usize).path;
                    let p = self.place(rel)?;
                    if let Some(b) = &self.backup {
                        if b.save(&p, rel)? {
                            return Ok(());
                        }
                    }
                    match p.lstat()? {
                        Some(m) if m.is_dir() => match p.dir.rmdir(&p.name) {
                            // Something we may not delete is inside (protected or excluded).
                            Err(e) if e.kind() == std::io::ErrorKind::DirectoryNotEmpty => Ok(()),
                            r => r,
                        },
                        Some(_) => p.unlink(),
                        None => Ok(()),
                    }
                })(),
                _ => continue,
            };
            match res {
                Ok(()) => {
                    self.done[k].store(true, Ordering::SeqCst);
                    out.files += 1;
                }
                Err(e) => {
                    let rel = if a.op == Op::Delete {
                        r.entry(a.receiver_entry as usize).path
                    } else {
                        s.entry(a.sender_entry as usize).path
                    };
                    out.errors.push(format!("{} {}: {e}", op_verb(a.op), display(rel)));
                }
            }
        }
        if let Some(table) = self.link_attrs.lock().unwrap().take() {
            if let Ok(root) = self.root_dir() {
                let applied = attrs::apply(&root, s, &table, |_| None, self.chown);
                out.errors.extend(applied.problems);
                if applied.changed {
                    self.attrs_changed.store(true, Ordering::Relaxed);
                }
            }
        }
        for a in plan.actions.iter().filter(|a| a.op == Op::DirMeta) {
            let e = s.entry(a.sender_entry as usize);
            let dir = if e.path.is_empty() {
                self.root_dir().and_then(|d| d.try_clone())
            } else {
                self.root_dir().and_then(|d| d.open_beneath(e.path))
            };
            let (mtime_ns, mode) = self.metadata_for(a);
            if let Err(err) = dir.and_then(|d| set_dir_meta(&d, mtime_ns, mode)) {
                if err.kind() != std::io::ErrorKind::NotFound {
                    out.errors
                        .push(format!("cannot set attributes of {}/: {err}", display(e.path)));
                }
            }
        }
        // Names differing only in case can only have collided if this session created entries.
        let created = plan
            .actions
            .iter()
            .any(|a| matches!(a.op, Op::Mkdir | Op::LocalCopy | Op::Transfer | Op::Symlink));
        for (a, b) in if created { self.case_collisions() } else { Vec::new() } {
            let st = |i: usize| self.place(s.entry(i).path).and_then(|t| t.lstat()).ok().flatten();
            if let (Some(ma), Some(mb)) = (st(a), st(b)) {
                if ma.ino == mb.ino && ma.dev == mb.dev && ma.ino != 0 {
                    out.warnings.push(format!(
                        "{} and {} differ only in case; this filesystem folds case, so they are one entry here (the last one written won)",
                        display(s.entry(a).path),
                        display(s.entry(b).path)
                    ));
                }
            }
        }
        // A session that changed nothing (a no-op) makes nothing durable: a syncfs would
        // only wait for other writers' dirty data on the same filesystem. `--no-fsync`: nothing.
        if self.fsync && self.changed_anything() {
            let root = self.root_dir().map_err(|e| CoreError::io(&self.local.root, e))?;
            sync_tree(&root).map_err(|e| {
                CoreError::io(
                    &self.local.root,
                    std::io::Error::new(e.kind(), format!("the synced tree could not be made durable: {e}")),
                )
            })?;
        }
        self.store_index();
        Ok(out)
    }

    /// Receiver: this session changes something on disk (an action of the plan, or an
    /// owner, group or xattr apply_attrs set). Only then is the tree made durable.
    pub fn changed_anything(&self) -> bool {
        self.plan().actions.iter().any(|a| a.op != Op::Skip) || self.attrs_changed.load(Ordering::Relaxed)
    }

    fn make_link(&self, a: &Action, e: &EntryRef) -> std::io::Result<()> {
        let target = self.target(a)?;
        #[cfg(unix)]
        {
            let tmp = partial_of(&target, blake3::hash(e.link).as_bytes());
            // A stale temp link of ours may be removed; anything else at the name is kept.
            if tmp.lstat()?.is_some_and(|st| st.is_symlink()) {
                let _ = tmp.unlink();
            }
            tmp.dir.symlink(e.link, &tmp.name)?;
            let placed = (|| {
                self.back_up(a, &target)?;
                if a.flags & action_flags::REPLACE != 0 {
                    self.clear_receiver_entry(a)?;
                }
                tmp.rename_to(&target)
            })();
            if placed.is_err() {
                let _ = tmp.unlink();
            }
            placed
        }
        #[cfg(not(unix))]
        {
            let _ = (target, e);
            Err(std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                "symlinks are not synced on this platform",
            ))
        }
    }

    /// Sender side end: remember what we hashed for next time.
    pub fn finish_sender(&self) {
        self.store_index();
    }

    fn store_index(&self) {
        let Some(state_dir) = &self.state_dir else { return };
        let new = std::mem::take(&mut *self.claims.lock().unwrap());
        let known = self.local.indexed_files;
        if new.is_empty() && known == 0 {
            return;
        }
        let plan_touches_nothing = self
            .plan
            .as_ref()
            .is_some_and(|p| p.actions.iter().all(|a| matches!(a.op, Op::DirMeta | Op::Skip)));
        if new.is_empty() && plan_touches_nothing {
            return; // nothing learned, nothing changed: the stored index is still right
        }
        let paths = ClaimPaths {
            own: &self.local.manifest,
            senders: self.sender_manifest(),
        };
        let order = paths.tree_order(&new);
        let _ = index::store(
            state_dir,
            &self.local.root,
            || self.local.claim_refs(),
            || paths.refs(&new, &order),
        );
    }

    /// What the plan creates that the receiver does not have: regular files, directories and
    /// symlinks (rsync's "Number of created files"), the root directory included when the
    /// receiver's tree does not exist yet.
    pub fn created(&self) -> Created {
        let mut c = Created {
            dirs: self.receiver_manifest().is_empty() as u64,
            ..Created::default()
        };
        for a in self.plan().actions.iter().filter(|a| a.receiver_entry == triage::NONE) {
            match a.op {
                Op::Transfer | Op::LocalCopy => c.files += 1,
                Op::Mkdir => c.dirs += 1,
                Op::Symlink => c.symlinks += 1,
                _ => {}
            }
        }
        c
    }

    /// rsync's `-i` lines for the plan (see tree/itemize.rs).
    pub fn itemize(&self, direction: super::itemize::Direction, root_created: bool) -> String {
        super::itemize::itemize(
            self.plan(),
            self.sender_manifest(),
            self.receiver_manifest(),
            direction,
            root_created,
        )
    }

    /// Human-readable list of what the plan does (for --dry-run and -v).
    pub fn describe(&self) -> String {
        let (s, r) = (self.sender_manifest(), self.receiver_manifest());
        let mut out = String::new();
        for a in &self.plan().actions {
            let sp = |a: &Action| display(s.entry(a.sender_entry as usize).path);
            let line = match a.op {
                Op::Mkdir => format!("mkdir   {}/", sp(a)),
                Op::LocalCopy => format!(
                    "copy    {} (from {}, no data sent)",
                    sp(a),
                    display(r.entry(a.basis as usize).path)
                ),
                Op::Transfer => format!(
                    "send    {} ({} bytes{})",
                    sp(a),
                    s.entry(a.sender_entry as usize).size,
                    if a.flags & action_flags::DELTA != 0 {
                        ", delta"
                    } else {
                        ""
                    }
                ),
                Op::Symlink => format!(
                    "link    {} -> {}",
                    sp(a),
                    display(s.entry(a.sender_entry as usize).link)
                ),
                Op::FileMeta => format!("attrs   {}", sp(a)),
                Op::Delete => format!(
                    "delete  {}{}",
                    display(r.entry(a.receiver_entry as usize).path),
                    if r.entry(a.receiver_entry as usize).kind == Kind::Dir {
                        "/"
                    } else {
                        ""
                    }
                ),
                Op::DirMeta => continue,
                Op::Skip => format!("skip    {} (unreadable on the sender)", sp(a)),
            };
            out.push_str(&line);
            out.push('\n');
        }
        out
    }

    /// Pairs of sender entries (same directory) whose names differ only in case. Two
    /// passes keep memory small: only names that have an upper-case letter are remembered.
    pub fn case_collisions(&self) -> Vec<(usize, usize)> {
        let s = self.sender_manifest();
        let key = |i: usize| {
            let p = s.entry(i).path;
            (
                super::path::parent_of(p).to_vec(),
                String::from_utf8_lossy(super::path::name_of(p)).to_lowercase(),
            )
        };
        let mut folded: std::collections::HashMap<(Vec<u8>, String), Vec<usize>> = std::collections::HashMap::new();
        for i in 1..s.len() {
            let name = String::from_utf8_lossy(super::path::name_of(s.entry(i).path));
            if name.chars().any(|c| c.is_uppercase()) {
                folded.entry(key(i)).or_default().push(i);
            }
        }
        if folded.is_empty() {
            return Vec::new();
        }
        let mut out = Vec::new();
        for i in 1..s.len() {
            let name = String::from_utf8_lossy(super::path::name_of(s.entry(i).path));
            if name.chars().any(|c| c.is_uppercase()) {
                continue; // pairs among upper-case names are found below
            }
            if let Some(others) = folded.get(&key(i)) {
                out.extend(others.iter().map(|&j| (i, j)));
            }
        }
        for others in folded.values() {
            for w in others.windows(2) {
                out.push((w[0], w[1]));
            }
        }
        out
    }

    /// Sender entries flagged unreadable and directories the walk could not list.
    pub fn problems(&self) -> &[String] {
        &self.local.problems
    }

    pub fn notices(&self) -> &[String] {
        &self.local.notices
    }
}

fn op_verb(op: Op) -> &'static str {
    match op {
        Op::Symlink => "cannot create link",
        Op::FileMeta => "cannot set attributes of",
        Op::Delete => "cannot delete",
        _ => "cannot handle",
    }
}

/// A small file written to its temp: its action, the temp, its root, its length.
type Written = (usize, Target, [u8; 32], u64);

/// A flush of the files a batch wrote whole (small files, local copies) before any of them is
/// renamed into place (decisions §85). A rename may reach the disk before the data it names
/// whatever the filesystem promises about ordering: ext4 ignores a failed data write in
/// ordered mode by default (`data_err=ignore`) and commits the rename over blocks that were never
/// written, so a device that fails writeback turned old files into zeros. One `syncfs` per batch
/// makes the batch durable (a per-file fsync costs a journal commit per file). The descriptor is
/// a directory description of its own, opened before the batch is written: `syncfs` then
/// reports every writeback error on the filesystem since (Linux ≥ 5.8), which a description the
/// background flush or another batch also syncs through could have consumed first. An error
/// from another writer's file fails the batch too: nothing is replaced on a device that fails.
#[cfg(target_os = "linux")]
struct BatchFlush(fs::File);

#[cfg(target_os = "linux")]
impl BatchFlush {
    fn watch(root: &Dir) -> std::io::Result<BatchFlush> {
        use std::os::fd::FromRawFd;
        // Safety: a valid directory fd; "." opens a new description of the same directory.
        let fd = unsafe {
            libc::openat(
                root.raw_fd(),
                c".".as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // Safety: we own the descriptor just opened.
        Ok(BatchFlush(unsafe { fs::File::from_raw_fd(fd) }))
    }

    fn sync(&self) -> std::io::Result<()> {
        use std::os::fd::AsRawFd;
        syncfs(self.0.as_raw_fd())
    }
}

/// `syncfs` through `fd`: its errors are the writeback errors of the filesystem since `fd`'s
/// open file description was opened or last synced.
#[cfg(target_os = "linux")]
fn syncfs(fd: std::os::fd::RawFd) -> std::io::Result<()> {
    // Safety: a valid fd owned by the caller.
    if unsafe { libc::syncfs(fd) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Elsewhere each file written whole is fsynced before its rename (`flush_file`): there is
/// never a batch flush.
#[cfg(not(target_os = "linux"))]
enum BatchFlush {}

#[cfg(not(target_os = "linux"))]
impl BatchFlush {
    fn sync(&self) -> std::io::Result<()> {
        match *self {}
    }
}

/// Make everything written durable before we report success: one syncfs on Linux (files
/// were not fsync'ed one by one; large ones started their writeback when written, small
/// ones were flushed in batches meanwhile, so it finds little left), a directory fsync
/// elsewhere (files were). Skipped with `--no-fsync`.
fn sync_tree(root: &Dir) -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        syncfs(root.raw_fd())
    }
    #[cfg(not(target_os = "linux"))]
    root.sync_entries()
}
