//! Tree sync: conversions and scheduling around `ffsync_core::tree::sync::TreeSync`.
//! Manifests, roots and file batches cross as Buffers; the plan's large transfers (a
//! few per tree, one object each) are the only per-entry objects.

use crate::progress::{ProgressFn, Ticker};
use crate::to_napi;
use ffsync_core::tree::chmod::ChmodRules;
use ffsync_core::tree::dir_merge::DirMerge;
use ffsync_core::tree::filter::Filter;
use ffsync_core::tree::open::{open_tree, TreeSettings};
use ffsync_core::tree::sync::{Outcome, TreeSync};
use ffsync_core::tree::triage::TriageOptions;
use napi::bindgen_prelude::*;
use napi_derive::napi;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, RwLock};

#[napi(object)]
pub struct WalkTreeOptions {
    /// Exclude patterns both peers apply (the sender's).
    pub excludes: Vec<String>,
    /// Receiver's own patterns: protected from deletion.
    pub protect: Option<Vec<String>>,
    /// Where the tree index lives; omit to neither read nor write one.
    pub state_dir: Option<String>,
    /// Ignore the index (`--checksum`); a fresh one is still written.
    pub ignore_index: Option<bool>,
    pub is_sender: bool,
    /// Do not enter directories on other filesystems (rsync's -x).
    pub one_file_system: Option<bool>,
    /// Leave symlinks out, each noted (`sync` without -l).
    pub skip_symlinks: Option<bool>,
    /// rsync's -L (sender): list what symlinks point to, and enter linked directories.
    pub copy_links: Option<bool>,
    /// rsync's --chmod rules for the modes this side lists (sender).
    pub chmod: Option<String>,
    /// rsync's -m: leave directories without files below them off the list (sender).
    pub prune_empty_dirs: Option<bool>,
    /// Per-directory merge files (rsync's -F, -C, `dir-merge`; sender).
    pub dir_merge: Option<Vec<DirMergeSpec>>,
    /// rsync's --files-from (sender): the list's lines, paths relative to the root.
    pub files_from: Option<Vec<String>>,
    /// With `files_from`: recurse into listed directories (an explicit -r).
    pub files_from_recursive: Option<bool>,
}

/// One kind of per-directory merge file (crates/ffsync_core/src/tree/dir_merge.rs).
#[napi(object)]
pub struct DirMergeSpec {
    /// The file name read in each directory, e.g. `.rsync-filter`.
    pub name: String,
    /// Rules also apply below the directory (rsync's default; false: the `n` modifier).
    pub inherit: bool,
    /// One pattern per whitespace-separated word (`w`).
    pub word_split: bool,
    /// Lines are bare patterns: `"-"` excludes, `"+"` includes; absent: `- pat` / `+ pat` rules.
    pub bare: Option<String>,
}

#[napi(object)]
pub struct TreeStats {
    pub entries: u32,
    pub files: u32,
    pub dirs: u32,
    pub symlinks: u32,
    pub bytes: f64,
    pub indexed_files: u32,
    pub problems: Vec<String>,
    /// Entries left out on purpose (special files; symlinks without -l), in rsync's words.
    pub notices: Vec<String>,
}

#[napi(object)]
pub struct PlanCounts {
    pub mkdirs: u32,
    pub local_copies: u32,
    pub small_transfers: u32,
    pub large_transfers: u32,
    pub transfer_bytes: f64,
    pub symlinks: u32,
    pub attrs_only: u32,
    pub deletes: u32,
    pub skipped: u32,
    pub unchanged_files: f64,
    pub decided_by_root: f64,
    pub kept_extraneous: f64,
    /// Files left alone because the receiver's copy is newer (-u).
    pub kept_newer: f64,
    /// Source files left alone by --max-size / --min-size.
    pub size_skipped: f64,
    /// Files and bytes of the sender's tree (after excludes).
    pub source_files: f64,
    pub source_bytes: f64,
    /// What the plan creates that the receiver lacks (rsync's "Number of created files").
    pub created_files: f64,
    pub created_dirs: f64,
    pub created_symlinks: f64,
}

impl From<ffsync_core::tree::plan_counts::PlanCounts> for PlanCounts {
    fn from(c: ffsync_core::tree::plan_counts::PlanCounts) -> Self {
        PlanCounts {
            mkdirs: c.mkdirs,
            local_copies: c.local_copies,
            small_transfers: c.small_transfers,
            large_transfers: c.large_transfers,
            transfer_bytes: c.transfer_bytes as f64,
            symlinks: c.symlinks,
            attrs_only: c.attrs_only,
            deletes: c.deletes,
            skipped: c.skipped,
            unchanged_files: c.unchanged_files as f64,
            decided_by_root: c.decided_by_root as f64,
            kept_extraneous: c.kept_extraneous as f64,
            kept_newer: c.kept_newer as f64,
            size_skipped: c.size_skipped as f64,
            source_files: c.source_files as f64,
            source_bytes: c.source_bytes as f64,
            created_files: c.created_files as f64,
            created_dirs: c.created_dirs as f64,
            created_symlinks: c.created_symlinks as f64,
        }
    }
}

#[napi(object)]
pub struct LargeTransferInfo {
    pub action: u32,
    /// Relative path bytes (may not be UTF-8).
    pub path: Buffer,
    pub size: f64,
    /// To set on commit; absent: leave it (sync without -t / -p, see TreeSync::metadata_for).
    pub mtime_ns: Option<BigInt>,
    pub mode: Option<u32>,
    pub delta: bool,
}

#[napi(object)]
pub struct StepOutcome {
    pub files: f64,
    pub bytes: f64,
    pub errors: Vec<String>,
    pub vanished: Vec<String>,
    pub warnings: Vec<String>,
    /// Deletions left undone by --max-delete.
    pub deletes_skipped: f64,
}

impl From<Outcome> for StepOutcome {
    fn from(o: Outcome) -> Self {
        StepOutcome {
            files: o.files as f64,
            bytes: o.bytes as f64,
            errors: o.errors,
            vanished: o.vanished,
            warnings: o.warnings,
            deletes_skipped: o.deletes_skipped as f64,
        }
    }
}

#[napi(object)]
pub struct SmallBatch {
    pub length: u32,
    /// Next cursor, or -1 when every small file was read.
    pub next: i32,
    pub raw_bytes: f64,
}

/// One peer's side of a tree sync.
#[napi]
pub struct NativeTreeSync {
    inner: Arc<RwLock<TreeSync>>,
}

pub struct WalkTask {
    root: PathBuf,
    o: WalkTreeOptions,
    progress: Option<ProgressFn>,
}

impl Task for WalkTask {
    type Output = TreeSync;
    type JsValue = NativeTreeSync;

    fn compute(&mut self) -> Result<TreeSync> {
        let o = &self.o;
        let settings = TreeSettings {
            excludes: o.excludes.clone(),
            protect: o.protect.clone().unwrap_or_default(),
            state_dir: o.state_dir.as_ref().map(PathBuf::from),
            ignore_index: o.ignore_index.unwrap_or(false),
            is_sender: o.is_sender,
            one_file_system: o.one_file_system.unwrap_or(false),
            skip_symlinks: o.skip_symlinks.unwrap_or(false),
            copy_links: o.copy_links.unwrap_or(false),
            chmod: o.chmod.clone(),
            prune_empty_dirs: o.prune_empty_dirs.unwrap_or(false),
            dir_merge: o
                .dir_merge
                .iter()
                .flatten()
                .map(|d| DirMerge {
                    name: d.name.clone(),
                    inherit: d.inherit,
                    word_split: d.word_split,
                    bare: d.bare.as_deref().map(|b| b == "-"),
                })
                .collect(),
            files_from: o.files_from.clone(),
            files_from_recursive: o.files_from_recursive.unwrap_or(false),
        };
        let counter = Arc::new(AtomicU64::new(0));
        let c = counter.clone();
        let mut ticker = Ticker::start(
            move || c.load(std::sync::atomic::Ordering::Relaxed),
            self.progress.take(),
        );
        let opened = open_tree(&self.root, &settings, &counter);
        ticker.stop();
        opened.map_err(to_napi)
    }

    fn resolve(&mut self, _env: Env, t: TreeSync) -> Result<NativeTreeSync> {
        Ok(NativeTreeSync {
            inner: Arc::new(RwLock::new(t)),
        })
    }
}

pub struct HashTask {
    t: Arc<RwLock<TreeSync>>,
    indices: Vec<u32>,
    progress: Option<ProgressFn>,
}

impl Task for HashTask {
    type Output = Vec<u8>;
    type JsValue = Buffer;
    fn compute(&mut self) -> Result<Vec<u8>> {
        let counter = Arc::new(AtomicU64::new(0));
        let c = counter.clone();
        let mut ticker = Ticker::start(
            move || c.load(std::sync::atomic::Ordering::Relaxed),
            self.progress.take(),
        );
        let out = self.t.write().unwrap().hash_entries(&self.indices, Some(&counter));
        ticker.stop();
        Ok(out)
    }
    fn resolve(&mut self, _env: Env, v: Vec<u8>) -> Result<Buffer> {
        Ok(v.into())
    }
}

/// Our manifest's wire form: encoding and compressing grow with the tree (~40 ms for
/// 100,000 entries), so they run on the pool, and in a local sync both peers' run at once.
pub struct ManifestTask {
    t: Arc<RwLock<TreeSync>>,
    compress: bool,
}

impl Task for ManifestTask {
    type Output = Vec<u8>;
    type JsValue = Buffer;
    fn compute(&mut self) -> Result<Vec<u8>> {
        // Taken under the lock (a shared reference, not a copy: several MB on a
        // 100,000-file tree), compressed without it: the peer's manifest parts, pushed from the JS thread
        // meanwhile, take the write lock.
        let manifest = self.t.read().unwrap().local.manifest.clone();
        Ok(ffsync_core::tree::manifest::wire_form(
            manifest.encoded(),
            self.compress,
        ))
    }
    fn resolve(&mut self, _env: Env, v: Vec<u8>) -> Result<Buffer> {
        Ok(v.into())
    }
}

/// Triage compares the two manifests entry by entry (~10–17 ms for 100,000 entries).
pub struct TriageTask {
    t: Arc<RwLock<TreeSync>>,
    options: Option<TriageOptions>,
}

impl Task for TriageTask {
    type Output = ffsync_core::tree::plan_counts::PlanCounts;
    type JsValue = PlanCounts;
    fn compute(&mut self) -> Result<Self::Output> {
        let mut t = self.t.write().unwrap();
        t.triage(self.options.take().expect("a task computes once"));
        Ok(t.plan_counts())
    }
    fn resolve(&mut self, _env: Env, c: Self::Output) -> Result<PlanCounts> {
        Ok(c.into())
    }
}

pub struct ReadSmallTask {
    t: Arc<RwLock<TreeSync>>,
    cursor: usize,
    out: Buffer,
    level: i32,
    shared: bool,
}

impl Task for ReadSmallTask {
    type Output = (usize, Option<usize>, u64);
    type JsValue = SmallBatch;
    fn compute(&mut self) -> Result<Self::Output> {
        // Safety: the caller does not touch `out` until the promise settles (documented).
        let out = unsafe { std::slice::from_raw_parts_mut(self.out.as_ptr() as *mut u8, self.out.len()) };
        self.t
            .read()
            .unwrap()
            .read_small(self.cursor, out, self.level, self.shared)
            .map_err(to_napi)
    }
    fn resolve(&mut self, _env: Env, (n, next, raw): Self::Output) -> Result<SmallBatch> {
        Ok(SmallBatch {
            length: n as u32,
            next: next.map_or(-1, |k| k as i32),
            raw_bytes: raw as f64,
        })
    }
}

pub struct CollectAttrsTask {
    t: Arc<RwLock<TreeSync>>,
    flags: u8,
}

impl Task for CollectAttrsTask {
    type Output = Vec<u8>;
    type JsValue = Buffer;
    fn compute(&mut self) -> Result<Vec<u8>> {
        Ok(self.t.read().unwrap().collect_attrs(self.flags))
    }
    fn resolve(&mut self, _env: Env, out: Vec<u8>) -> Result<Buffer> {
        Ok(out.into())
    }
}

/// Receiver steps that return an Outcome.
pub enum Step {
    Prepare,
    WriteSmall(Buffer),
    ApplyAttrs(Buffer),
    Finish(bool),
    FinishSender,
    RemoveSources,
}

pub struct StepTask {
    t: Arc<RwLock<TreeSync>>,
    step: Option<Step>,
}

impl Task for StepTask {
    type Output = Outcome;
    type JsValue = StepOutcome;
    fn compute(&mut self) -> Result<Outcome> {
        let t = self.t.read().unwrap();
        match self.step.take().unwrap() {
            Step::Prepare => t.prepare(),
            Step::WriteSmall(b) => t.write_small(&b),
            Step::ApplyAttrs(b) => t.apply_attrs(&b),
            Step::Finish(delete_ok) => t.finish_receiver(delete_ok),
            Step::FinishSender => {
                t.finish_sender();
                Ok(Outcome::default())
            }
            Step::RemoveSources => Ok(t.remove_sources()),
        }
        .map_err(to_napi)
    }
    fn resolve(&mut self, _env: Env, o: Outcome) -> Result<StepOutcome> {
        Ok(o.into())
    }
}

#[napi]
impl NativeTreeSync {
    /// Walk `root` (in parallel) and load its tree index; progress counts entries listed.
    #[napi(ts_return_type = "Promise<NativeTreeSync>")]
    pub fn walk(
        root: String,
        options: WalkTreeOptions,
        #[napi(ts_arg_type = "((doneBytes: number) => void) | undefined | null")] on_progress: Option<ProgressFn>,
    ) -> AsyncTask<WalkTask> {
        AsyncTask::new(WalkTask {
            root: root.into(),
            o: options,
            progress: on_progress,
        })
    }

    /// Receiver: `false` is `--no-fsync` (files are not made durable before the session
    /// reports success: no early writeback, no final syncfs). Default true. Call before
    /// `prepare`.
    #[napi]
    pub fn set_fsync(&self, fsync: bool) {
        self.inner.write().unwrap().set_fsync(fsync);
    }

    /// Sender: the rules of the per-directory merge files the walk read, re-anchored at the
    /// root, deepest directory first (they follow the command line's rules in FILTER).
    #[napi]
    pub fn merged_rules(&self) -> Vec<String> {
        self.inner.read().unwrap().local.merged_rules.clone()
    }

    /// Receiver: rsync's -b / --suffix / --backup-dir (`null`: no backups); `dir` is
    /// relative to the tree's root unless absolute. Call before `prepare`.
    #[napi]
    pub fn set_backup(&self, backup: Option<crate::reconstruction::BackupOptions>) -> Result<()> {
        let mut t = self.inner.write().unwrap();
        let b = match backup {
            Some(o) => Some(std::sync::Arc::new(
                ffsync_core::backup::Backup::new(
                    &t.local.root,
                    o.dir.as_deref().map(std::path::Path::new),
                    o.suffix.as_deref(),
                )
                .map_err(|e| to_napi(ffsync_core::CoreError::io(&t.local.root, e)))?,
            )),
            None => None,
        };
        t.set_backup(b);
        Ok(())
    }

    /// Receiver: rsync's --chown USER:GROUP (names as this machine knows them, or ids); an
    /// unknown name is a usage error. Call before `applyAttrs`.
    #[napi]
    pub fn set_chown(&self, spec: String) -> Result<()> {
        let chown = ffsync_core::tree::attrs::Chown::parse(&spec).map_err(to_napi)?;
        self.inner.write().unwrap().set_chown(chown);
        Ok(())
    }

    /// Receiver: rsync's --partial-dir (`null`: none); a file replaced whole by a batch has its
    /// partials there removed (see `TreeSync::set_partial_dir`). Call before the batches.
    #[napi]
    pub fn set_partial_dir(&self, dir: Option<String>) -> Result<()> {
        let d = match dir {
            Some(d) => Some(
                ffsync_core::restore::partial_dir::PartialDir::parse(&d)
                    .map_err(|e| to_napi(ffsync_core::CoreError::Usage(e.to_string())))?,
            ),
            None => None,
        };
        self.inner.write().unwrap().set_partial_dir(d);
        Ok(())
    }

    /// Receiver: rsync's --max-delete (`null`: no limit); see `TreeSync::set_max_delete`.
    /// Call before `finishReceiver`.
    #[napi]
    pub fn set_max_delete(&self, n: Option<u32>) {
        self.inner.write().unwrap().set_max_delete(n.map(u64::from));
    }

    /// Entries of our walk (cheap; `stats()` counts by kind).
    #[napi]
    pub fn entry_count(&self) -> u32 {
        self.inner.read().unwrap().local.manifest.len() as u32
    }

    /// Sender, before triage: the files it will probably hash, packed `{ len u32 LE, path }*`
    /// in plan order (see `TreeSync::scan_ahead_candidates`). One pass over the walk's entries.
    #[napi]
    pub fn scan_ahead_candidates(&self, max_size: f64, max_bytes: f64) -> Buffer {
        self.inner
            .read()
            .unwrap()
            .scan_ahead_candidates(max_size as u64, max_bytes as u64)
            .into()
    }

    /// Our manifest in wire form, encoded on the pool: zstd-compressed, or with `compress` false
    /// stored in a zstd frame uncompressed (a peer in this process: nothing crosses a wire) when
    /// that fits the wire's 1 GiB limit.
    #[napi(ts_return_type = "Promise<Buffer>")]
    pub fn manifest(&self, compress: Option<bool>) -> AsyncTask<ManifestTask> {
        AsyncTask::new(ManifestTask {
            t: self.inner.clone(),
            compress: compress.unwrap_or(true),
        })
    }

    #[napi]
    pub fn stats(&self) -> TreeStats {
        let t = self.inner.read().unwrap();
        let m = &t.local.manifest;
        let c = m.counts();
        TreeStats {
            entries: m.len() as u32,
            files: c.files,
            dirs: c.dirs,
            symlinks: c.symlinks,
            bytes: c.bytes as f64,
            indexed_files: t.local.indexed_files as u32,
            problems: t.problems().to_vec(),
            notices: t.notices().to_vec(),
        }
    }

    /// The session is over: close the directory handle the receiver resolves paths from.
    #[napi]
    pub fn release_handles(&self) {
        self.inner.read().unwrap().release_handles();
    }

    /// Feed one part of the peer's manifest (wire form) as it arrives.
    #[napi]
    pub fn push_peer_manifest_part(&self, part: Buffer) -> Result<()> {
        self.inner
            .write()
            .unwrap()
            .push_peer_manifest_part(&part)
            .map_err(to_napi)
    }

    /// All parts pushed: decode and validate the peer's manifest.
    #[napi]
    pub fn finish_peer_manifest(&self) -> Result<()> {
        self.inner.write().unwrap().finish_peer_manifest().map_err(to_napi)
    }

    /// Indices of our entries the protocol needs us to hash.
    #[napi]
    pub fn roots_to_supply(&self, checksum: bool) -> Uint32Array {
        Uint32Array::new(self.inner.read().unwrap().roots_to_supply(checksum))
    }

    /// Hash those entries on every core; resolves to the ROOTS payload.
    #[napi(ts_return_type = "Promise<Buffer>")]
    pub fn hash_entries(
        &self,
        indices: Uint32Array,
        #[napi(ts_arg_type = "((doneBytes: number) => void) | undefined | null")] on_progress: Option<ProgressFn>,
    ) -> AsyncTask<HashTask> {
        AsyncTask::new(HashTask {
            t: self.inner.clone(),
            indices: indices.to_vec(),
            progress: on_progress,
        })
    }

    #[napi]
    pub fn set_peer_roots(&self, roots: Buffer) -> Result<()> {
        self.inner.write().unwrap().set_peer_roots(&roots).map_err(to_napi)
    }

    /// Run triage (identical on both peers) on the pool and count what the plan does.
    #[napi(ts_return_type = "Promise<PlanCounts>")]
    pub fn triage(
        &self,
        checksum: bool,
        delete_extraneous: bool,
        update: Option<bool>,
        whole_file: Option<bool>,
        max_size: Option<f64>,
        min_size: Option<f64>,
        omit_times: Option<bool>,
        omit_perms: Option<bool>,
        size_only: Option<bool>,
        ignore_existing: Option<bool>,
        existing_only: Option<bool>,
        whole_small: Option<bool>,
    ) -> AsyncTask<TriageTask> {
        let options = TriageOptions {
            checksum,
            delete: delete_extraneous,
            update: update.unwrap_or(false),
            whole_file: whole_file.unwrap_or(false),
            max_size: max_size.map(|v| v as u64),
            min_size: min_size.map(|v| v as u64),
            omit_times: omit_times.unwrap_or(false),
            omit_perms: omit_perms.unwrap_or(false),
            size_only: size_only.unwrap_or(false),
            ignore_existing: ignore_existing.unwrap_or(false),
            existing_only: existing_only.unwrap_or(false),
            whole_small: whole_small.unwrap_or(false),
        };
        AsyncTask::new(TriageTask {
            t: self.inner.clone(),
            options: Some(options),
        })
    }

    #[napi]
    pub fn large_transfers(&self) -> Vec<LargeTransferInfo> {
        self.inner
            .read()
            .unwrap()
            .large_transfers()
            .into_iter()
            .map(|l| LargeTransferInfo {
                action: l.action,
                path: l.path.into(),
                size: l.size as f64,
                mtime_ns: l.mtime_ns.map(BigInt::from),
                mode: l.mode,
                delta: l.delta,
            })
            .collect()
    }

    /// What the plan does, one line per action (dry-run and verbose output).
    #[napi]
    pub fn describe(&self) -> String {
        self.inner.read().unwrap().describe()
    }

    /// rsync's `-i` lines for the plan; `direction` is `"sent"` (`<`, a push) or
    /// `"received"` (`>`, a local sync or a pull); `rootCreated`: the receiver made the root.
    #[napi]
    pub fn itemize(
        &self,
        #[napi(ts_arg_type = "'sent' | 'received'")] direction: String,
        root_created: bool,
    ) -> String {
        use ffsync_core::tree::itemize::Direction;
        let d = if direction == "sent" {
            Direction::Sent
        } else {
            Direction::Received
        };
        self.inner.read().unwrap().itemize(d, root_created)
    }

    /// Sender: encode the next batch of small files into `out` (not touched by the caller
    /// until the promise settles), starting at plan position `cursor` (0 at first).
    /// `shared`: the receiver has BATCH_STREAM, so the batch's files share zstd streams.
    #[napi(ts_return_type = "Promise<SmallBatch>")]
    pub fn read_small(
        &self,
        cursor: u32,
        out: Buffer,
        compress_level: i32,
        shared: Option<bool>,
    ) -> AsyncTask<ReadSmallTask> {
        AsyncTask::new(ReadSmallTask {
            t: self.inner.clone(),
            cursor: cursor as usize,
            out,
            level: compress_level,
            shared: shared.unwrap_or(false),
        })
    }

    /// Receiver: directories and local copies (renames), before any data arrives.
    #[napi(ts_return_type = "Promise<StepOutcome>")]
    pub fn prepare(&self) -> AsyncTask<StepTask> {
        self.step(Step::Prepare)
    }

    /// Receiver: verify and write one FILE_BATCH payload.
    #[napi(ts_return_type = "Promise<StepOutcome>")]
    pub fn write_small(&self, batch: Buffer) -> AsyncTask<StepTask> {
        self.step(Step::WriteSmall(batch))
    }

    /// Receiver: apply the sender's owner/group/xattr table (TREE_ATTRS parts concatenated).
    #[napi(ts_return_type = "Promise<StepOutcome>")]
    pub fn apply_attrs(&self, table: Buffer) -> AsyncTask<StepTask> {
        self.step(Step::ApplyAttrs(table))
    }

    /// Sender: the compressed owner/group/xattr table for `flags` (tree/attrs.rs).
    #[napi(ts_return_type = "Promise<Buffer>")]
    pub fn collect_attrs(&self, flags: u8) -> AsyncTask<CollectAttrsTask> {
        AsyncTask::new(CollectAttrsTask {
            t: self.inner.clone(),
            flags,
        })
    }

    /// Receiver: links, attributes, deletions (only if `deleteOk`), directory attributes,
    /// durability, tree index.
    #[napi(ts_return_type = "Promise<StepOutcome>")]
    pub fn finish_receiver(&self, delete_ok: bool) -> AsyncTask<StepTask> {
        self.step(Step::Finish(delete_ok))
    }

    /// Sender: store the tree index.
    #[napi(ts_return_type = "Promise<StepOutcome>")]
    pub fn finish_sender(&self) -> AsyncTask<StepTask> {
        self.step(Step::FinishSender)
    }

    /// Sender, after a session that synced every file (rsync's --remove-source-files):
    /// remove the synced source files and symlinks that did not change since the walk.
    #[napi(ts_return_type = "Promise<StepOutcome>")]
    pub fn remove_sources(&self) -> AsyncTask<StepTask> {
        self.step(Step::RemoveSources)
    }

    /// Receiver: before a large file is committed over a directory, remove the directory.
    #[napi]
    pub fn clear_for(&self, action: u32) -> Result<()> {
        self.inner.read().unwrap().clear_for(action as usize).map_err(to_napi)
    }

    /// Remember the content root of a large file just sent or written (64 hex digits; anything
    /// else is a caller's bug, refused rather than recorded as some other root).
    #[napi]
    pub fn claim_root(&self, action: u32, root_hex: String) -> Result<()> {
        let root = ffsync_core::manifest::parse_root_hex(&root_hex).ok_or_else(|| {
            napi::Error::from_reason(format!("EINVAL: claimRoot: {root_hex:?} is not a 64-digit hex root"))
        })?;
        self.inner
            .read()
            .unwrap()
            .claim_root(action as usize, root)
            .map_err(to_napi)
    }

    fn step(&self, step: Step) -> AsyncTask<StepTask> {
        AsyncTask::new(StepTask {
            t: self.inner.clone(),
            step: Some(step),
        })
    }
}

/// Throws `EUSAGE: ...` naming the first invalid exclude pattern.
#[napi]
pub fn validate_excludes(patterns: Vec<String>) -> Result<()> {
    Filter::new(&patterns).map(|_| ()).map_err(to_napi)
}

/// Throws a usage error when rsync's --chown USER:GROUP names a user or group this machine
/// does not know (checked before connecting, where the receiver is local).
#[napi]
pub fn validate_chown(spec: String) -> Result<()> {
    ffsync_core::tree::attrs::Chown::parse(&spec)
        .map(|_| ())
        .map_err(to_napi)
}

/// Patterns of an --exclude-from file (blank lines and `#` comments skipped).
#[napi]
pub fn excludes_from_text(text: String) -> Vec<String> {
    Filter::patterns_from_text(&text)
}

/// rsync's --chmod applied to one mode (a single file's OFFER); an `EUSAGE` error names a bad clause.
#[napi]
pub fn apply_chmod(rules: String, mode: u32, is_dir: bool) -> Result<u32> {
    Ok(ChmodRules::parse(&rules).map_err(to_napi)?.apply(mode, is_dir))
}
