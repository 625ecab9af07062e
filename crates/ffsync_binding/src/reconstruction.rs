use crate::blocking::Blocking;
use crate::progress::{ProgressFn, Ticker};
use crate::{bigint_to_i64, to_napi};
use ffsync_core::backup::Backup;
use ffsync_core::beneath::Target;
use ffsync_core::manifest::Manifest;
use ffsync_core::restore::{touch_up_to_date_at, BeginOptions, LocalSource, Reconstruction};
use napi::bindgen_prelude::*;
use napi_derive::napi;
use std::path::{Path, PathBuf};

/// The target of a receive: `target` itself (a path the local user chose), or with
/// `beneath` a relative path under that directory, resolved without following links.
fn resolve(target: &Path, beneath: Option<&Path>) -> Result<Target> {
    let shown = beneath.map_or_else(|| target.to_path_buf(), |r| r.join(target));
    Target::resolve(beneath, target).map_err(|e| to_napi(ffsync_core::CoreError::io(shown, e)))
}
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// rsync's -b / --suffix / --backup-dir (the receiver's options).
#[napi(object)]
#[derive(Clone)]
pub struct BackupOptions {
    /// --backup-dir, relative to the destination root (a tree's root, or a single file's
    /// directory) unless absolute.
    pub dir: Option<String>,
    /// --suffix; default `~`, or nothing with a directory.
    pub suffix: Option<String>,
}

fn backup_for(o: &BackupOptions, target: &Path, beneath: Option<&Path>) -> Result<(Arc<Backup>, Vec<u8>)> {
    let (b, rel) = Backup::for_file(target, beneath, o.dir.as_deref().map(Path::new), o.suffix.as_deref())
        .map_err(|e| to_napi(ffsync_core::CoreError::io(target, e)))?;
    Ok((Arc::new(b), rel))
}

#[napi(object)]
pub struct LocalFile {
    #[napi(ts_type = "string | Buffer")]
    pub path: crate::PathArg,
    /// Packed manifest of that file (from `scanFileNative`).
    pub manifest: Buffer,
}

/// The sender's own file on this machine (a local sync): the chunks the plan would ask for
/// are copied from it first, each proven by its hash (decisions §111).
#[napi(object)]
pub struct PeerCopyFile {
    #[napi(ts_type = "string | Buffer")]
    pub path: crate::PathArg,
    /// The sender's root: `path` is relative to it and resolved without following any link.
    pub beneath: Option<String>,
    /// Its modification time as the sender listed it (ns): a file with another is not used.
    pub mtime_ns: Option<BigInt>,
}

#[napi(object)]
pub struct PlanSummary {
    pub chunks: u32,
    pub wire_chunks: u32,
    pub wire_bytes: f64,
    pub copy_bytes: f64,
    /// Of `copy_bytes`, those placed early while the manifest streamed in.
    pub placed_bytes: f64,
    pub in_place_bytes: f64,
    /// Bytes inside the sender's holes (recreated as holes, never sent).
    pub hole_bytes: f64,
    /// The temp file started as a reflink clone of the old target.
    pub cloned: bool,
    /// `--inplace`: only changed chunks are staged, then written into the target.
    pub inplace: bool,
    pub writer: String,
}

/// The receiver's side of one file transfer (see crates/ffsync_core/src/restore/restorer.rs).
#[napi]
pub struct NativeReconstruction {
    /// `None` once released: a long-lived process (the `serve` daemon) must not keep the
    /// temp file, the old target and the io_uring open until the JS object is collected.
    inner: Mutex<Option<Arc<Reconstruction>>>,
    ticker: Mutex<Option<Ticker>>,
}

pub struct BeginTask {
    prefill: Option<ffsync_core::restore::prefill::Prefill>,
    target: PathBuf,
    beneath: Option<PathBuf>,
    manifest: Vec<u8>,
    locals: Vec<(PathBuf, Vec<u8>)>,
    holes: Option<Vec<u8>>,
    inplace: bool,
    fsync: bool,
    backup: Option<BackupOptions>,
    peer_copy: Option<ffsync_core::restore::PeerCopy>,
    progress: Option<ProgressFn>,
}

impl Task for BeginTask {
    type Output = Arc<Reconstruction>;
    type JsValue = NativeReconstruction;

    fn compute(&mut self) -> Result<Arc<Reconstruction>> {
        let m = Manifest::decode(&self.manifest).map_err(to_napi)?;
        let mut local = Vec::new();
        for (path, buf) in self.locals.drain(..) {
            local.push(LocalSource {
                path,
                manifest: Manifest::decode_local(&buf).map_err(to_napi)?,
            });
        }
        let holes = match &self.holes {
            Some(buf) => ffsync_core::sparse::decode(buf, m.size).map_err(to_napi)?,
            None => Vec::new(),
        };
        let backup = match &self.backup {
            Some(o) => Some(backup_for(o, &self.target, self.beneath.as_deref())?),
            None => None,
        };
        Ok(Arc::new(
            Reconstruction::begin_at(
                resolve(&self.target, self.beneath.as_deref())?,
                m,
                local,
                BeginOptions {
                    holes,
                    inplace: self.inplace,
                    prefill: self.prefill.take().map(|p| p.into_prefilled()),
                    fsync: self.fsync,
                    backup,
                    peer_copy: self.peer_copy.take(),
                },
            )
            .map_err(to_napi)?,
        ))
    }

    fn resolve(&mut self, _env: Env, r: Arc<Reconstruction>) -> Result<NativeReconstruction> {
        let ticker = self.progress.take().map(|cb| {
            let r2 = r.clone();
            Ticker::start(move || r2.written.load(Ordering::Relaxed), Some(cb))
        });
        Ok(NativeReconstruction {
            inner: Mutex::new(Some(r)),
            ticker: Mutex::new(ticker),
        })
    }
}

pub struct CopyTask(Arc<Reconstruction>);
impl Task for CopyTask {
    type Output = u64;
    type JsValue = f64;
    fn compute(&mut self) -> Result<u64> {
        self.0.copy_local().map_err(to_napi)
    }
    fn resolve(&mut self, _env: Env, n: u64) -> Result<f64> {
        Ok(n as f64)
    }
}

pub struct WriteTask {
    r: Arc<Reconstruction>,
    batch: Buffer,
    ticket: u64,
}
impl Task for WriteTask {
    type Output = u64;
    type JsValue = f64;
    fn compute(&mut self) -> Result<u64> {
        self.r.write_frame(&self.batch, self.ticket).map_err(to_napi)
    }
    fn resolve(&mut self, _env: Env, n: u64) -> Result<f64> {
        Ok(n as f64)
    }
}

pub struct RefinementTask(Arc<Reconstruction>);
impl Task for RefinementTask {
    type Output = Vec<u8>;
    type JsValue = Buffer;
    fn compute(&mut self) -> Result<Vec<u8>> {
        self.0.refinement().map_err(to_napi)
    }
    fn resolve(&mut self, _env: Env, table: Vec<u8>) -> Result<Buffer> {
        Ok(table.into())
    }
}

pub struct FinishTask {
    r: Arc<Reconstruction>,
    mtime_ns: Option<i64>,
    mode: Option<u32>,
    state_dir: Option<PathBuf>,
}
impl Task for FinishTask {
    type Output = ();
    type JsValue = ();
    fn compute(&mut self) -> Result<()> {
        self.r
            .finish(self.mtime_ns, self.mode, self.state_dir.as_deref())
            .map(|_| ())
            .map_err(to_napi)
    }
    fn resolve(&mut self, _env: Env, _: ()) -> Result<()> {
        Ok(())
    }
}

#[napi]
impl NativeReconstruction {
    /// Plan a reconstruction of `target` from the sender's manifest, reusing chunks of the
    /// given local files, of a partial left by an interrupted run, and of `prefill` (chunks
    /// placed while the manifest streamed in; adopted only if they match it). With
    /// `beneath`, `target` is a relative path under that directory (a tree's root),
    /// resolved without following any link. `fsync` (default true): the result is made
    /// durable before it is renamed into place; false is `--no-fsync`.
    #[napi(ts_return_type = "Promise<NativeReconstruction>")]
    #[allow(clippy::too_many_arguments)]
    pub fn begin(
        #[napi(ts_arg_type = "string | Buffer")] target: crate::PathArg,
        manifest: Buffer,
        locals: Vec<LocalFile>,
        #[napi(ts_arg_type = "((doneBytes: number) => void) | undefined | null")] on_progress: Option<ProgressFn>,
        holes: Option<Buffer>,
        inplace: Option<bool>,
        prefill: Option<&NativePrefill>,
        beneath: Option<String>,
        fsync: Option<bool>,
        backup: Option<BackupOptions>,
        peer_copy: Option<PeerCopyFile>,
    ) -> Result<AsyncTask<BeginTask>> {
        let peer_copy = match peer_copy {
            Some(p) => Some(ffsync_core::restore::PeerCopy {
                root: p.beneath.map(PathBuf::from),
                path: crate::path_arg(p.path),
                mtime_ns: p.mtime_ns.as_ref().map(crate::bigint_to_i64).transpose()?,
            }),
            None => None,
        };
        Ok(AsyncTask::new(BeginTask {
            prefill: prefill.and_then(|p| p.take()),
            target: crate::path_arg(target),
            beneath: beneath.map(PathBuf::from),
            manifest: manifest.to_vec(),
            locals: locals
                .into_iter()
                .map(|l| (crate::path_arg(l.path), l.manifest.to_vec()))
                .collect(),
            holes: holes.map(|b| b.to_vec()),
            inplace: inplace.unwrap_or(false),
            fsync: fsync.unwrap_or(true),
            backup,
            peer_copy,
            progress: on_progress,
        }))
    }

    /// Indices of chunks that must come over the wire, ascending.
    #[napi]
    pub fn needed(&self) -> Result<Uint32Array> {
        Ok(Uint32Array::new(self.get()?.needed()))
    }

    #[napi]
    pub fn summary(&self) -> Result<PlanSummary> {
        let r = self.get()?;
        let s = r.summary();
        Ok(PlanSummary {
            chunks: s.chunks,
            wire_chunks: s.wire_chunks,
            wire_bytes: s.wire_bytes as f64,
            copy_bytes: s.copy_bytes as f64,
            placed_bytes: s.placed_bytes as f64,
            in_place_bytes: s.in_place_bytes as f64,
            hole_bytes: s.hole_bytes as f64,
            cloned: s.cloned,
            inplace: s.inplace,
            writer: r.writer_backend().to_string(),
        })
    }

    /// Received bytes that crossed as literal data (deltas' copies excluded), for RESULT.
    #[napi]
    pub fn literal_bytes(&self) -> Result<f64> {
        Ok(self.get()?.literal_bytes() as f64)
    }

    #[napi]
    pub fn temp_path(&self) -> Result<String> {
        Ok(self.get()?.temp_path().to_string_lossy().into_owned())
    }

    /// Sub-chunk refinement table for the REFINE frames (signatures of the old bytes each
    /// run of missing chunks replaced). Once, after `begin`.
    #[napi(ts_return_type = "Promise<Buffer>")]
    pub fn refinement(&self) -> Result<AsyncTask<RefinementTask>> {
        Ok(AsyncTask::new(RefinementTask(self.get()?)))
    }

    #[napi(ts_return_type = "Promise<number>")]
    pub fn copy_local(&self) -> Result<AsyncTask<CopyTask>> {
        Ok(AsyncTask::new(CopyTask(self.get()?)))
    }

    /// Verify and write one DATA frame. Call in the order the frames arrived (the frame's
    /// place is taken here, on the JS thread); a frame that refers to the previous one
    /// (`refersToPrevious` in ts/protocol/chunk-records.ts) only once every earlier write has
    /// settled.
    #[napi(ts_return_type = "Promise<number>")]
    pub fn write_batch(&self, batch: Buffer) -> Result<AsyncTask<WriteTask>> {
        let r = self.get()?;
        let ticket = r.ticket();
        Ok(AsyncTask::new(WriteTask { r, batch, ticket }))
    }

    #[napi(ts_return_type = "Promise<void>")]
    pub fn finish(
        &self,
        mtime_ns: Option<BigInt>,
        mode: Option<u32>,
        state_dir: Option<String>,
    ) -> Result<AsyncTask<FinishTask>> {
        self.stop_ticker();
        Ok(AsyncTask::new(FinishTask {
            r: self.get()?,
            mtime_ns: mtime_ns.as_ref().map(bigint_to_i64).transpose()?,
            mode,
            state_dir: state_dir.map(PathBuf::from),
        }))
    }

    /// Abandon the reconstruction; keep the partial file only for a later resume.
    #[napi]
    pub fn abort(&self, keep_partial: bool) {
        self.stop_ticker();
        if let Some(r) = self.inner.lock().unwrap().as_ref() {
            r.abort(keep_partial);
        }
    }

    /// Drop this handle's share of the reconstruction: once tasks still running end, its
    /// files and writer are closed. Call after `finish` or `abort`; later calls on this
    /// object fail. (A reconstruction released while still open removes its temp file.)
    #[napi]
    pub fn release(&self) {
        self.stop_ticker();
        if let Some(r) = self.inner.lock().unwrap().take() {
            crate::drop_in_background(r);
        }
    }

    fn get(&self) -> Result<Arc<Reconstruction>> {
        self.inner
            .lock()
            .unwrap()
            .clone()
            .ok_or_else(|| napi::Error::from_reason("EUSAGE: the reconstruction was already released"))
    }

    fn stop_ticker(&self) {
        if let Some(mut t) = self.ticker.lock().unwrap().take() {
            t.stop();
        }
    }
}

pub struct TouchTask {
    target: PathBuf,
    beneath: Option<PathBuf>,
    mtime_ns: Option<i64>,
    mode: Option<u32>,
    state_dir: Option<PathBuf>,
    manifest: Vec<u8>,
}
impl Task for TouchTask {
    type Output = ();
    type JsValue = ();
    fn compute(&mut self) -> Result<()> {
        let t = resolve(&self.target, self.beneath.as_deref())?;
        let id = touch_up_to_date_at(&t, self.mtime_ns, self.mode).map_err(to_napi)?;
        if let Some(dir) = &self.state_dir {
            let m = Manifest::decode(&self.manifest).map_err(to_napi)?;
            let _ = ffsync_core::index::store(dir, &ffsync_core::scan::index_key(&t.shown()), &id, &m);
        }
        Ok(())
    }
    fn resolve(&mut self, _env: Env, _: ()) -> Result<()> {
        Ok(())
    }
}

/// The target already has the sender's content: apply mtime/mode and refresh its index.
#[napi(ts_return_type = "Promise<void>")]
pub fn mark_up_to_date(
    #[napi(ts_arg_type = "string | Buffer")] target: crate::PathArg,
    manifest: Buffer,
    mtime_ns: Option<BigInt>,
    mode: Option<u32>,
    state_dir: Option<String>,
    beneath: Option<String>,
) -> Result<AsyncTask<TouchTask>> {
    Ok(AsyncTask::new(TouchTask {
        target: crate::path_arg(target),
        beneath: beneath.map(PathBuf::from),
        mtime_ns: mtime_ns.as_ref().map(bigint_to_i64).transpose()?,
        mode,
        state_dir: state_dir.map(PathBuf::from),
        manifest: manifest.to_vec(),
    }))
}

pub struct HolesTask(PathBuf);
impl Task for HolesTask {
    type Output = Vec<u8>;
    type JsValue = Buffer;
    fn compute(&mut self) -> Result<Vec<u8>> {
        let f = std::fs::File::open(&self.0).map_err(|e| to_napi(ffsync_core::CoreError::io(&self.0, e)))?;
        let size = f
            .metadata()
            .map_err(|e| to_napi(ffsync_core::CoreError::io(&self.0, e)))?
            .len();
        let holes =
            ffsync_core::sparse::holes(&f, size).map_err(|e| to_napi(ffsync_core::CoreError::io(&self.0, e)))?;
        Ok(ffsync_core::sparse::encode(&holes))
    }
    fn resolve(&mut self, _env: Env, b: Vec<u8>) -> Result<Buffer> {
        Ok(b.into())
    }
}

/// The holes of a file (SEEK_HOLE / SEEK_DATA), encoded as a HOLES payload.
#[napi(ts_return_type = "Promise<Buffer>")]
pub fn file_holes(#[napi(ts_arg_type = "string | Buffer")] path: crate::PathArg) -> AsyncTask<HolesTask> {
    AsyncTask::new(HolesTask(crate::path_arg(path)))
}

pub struct RecoverTask(PathBuf, Option<PathBuf>);
impl Task for RecoverTask {
    type Output = Option<String>;
    type JsValue = Option<String>;
    fn compute(&mut self) -> Result<Option<String>> {
        ffsync_core::restore::inplace::recover_at(&resolve(&self.0, self.1.as_deref())?).map_err(to_napi)
    }
    fn resolve(&mut self, _env: Env, m: Option<String>) -> Result<Option<String>> {
        Ok(m)
    }
}

/// Complete an interrupted `--inplace` commit of `target` (redo journal), if any: resolves
/// to a message when one was completed, rejects (EVERIFY) when it could not be.
#[napi(ts_return_type = "Promise<string | null>")]
pub fn recover_inplace(
    #[napi(ts_arg_type = "string | Buffer")] target: crate::PathArg,
    beneath: Option<String>,
) -> AsyncTask<RecoverTask> {
    AsyncTask::new(RecoverTask(crate::path_arg(target), beneath.map(PathBuf::from)))
}

/// Early placement while a streamed manifest arrives (see crates/ffsync_core/src/restore/prefill.rs).
#[napi]
pub struct NativePrefill {
    inner: Arc<Mutex<Option<ffsync_core::restore::prefill::Prefill>>>,
}

impl NativePrefill {
    /// Hand the prefill over (to `NativeReconstruction.begin`); this object is then empty.
    fn take(&self) -> Option<ffsync_core::restore::prefill::Prefill> {
        self.inner.lock().unwrap().take()
    }
}

pub struct PrefillBeginTask {
    target: PathBuf,
    beneath: Option<PathBuf>,
    size: u64,
    locals: Vec<(PathBuf, Vec<u8>)>,
    fsync: bool,
}
impl Task for PrefillBeginTask {
    type Output = Option<ffsync_core::restore::prefill::Prefill>;
    type JsValue = NativePrefill;
    fn compute(&mut self) -> Result<Self::Output> {
        let mut local = Vec::new();
        for (path, buf) in self.locals.drain(..) {
            local.push(LocalSource {
                path,
                manifest: Manifest::decode_local(&buf).map_err(to_napi)?,
            });
        }
        let t = resolve(&self.target, self.beneath.as_deref())?;
        ffsync_core::restore::prefill::Prefill::new_at(&t, self.size, local, self.fsync).map_err(to_napi)
    }
    fn resolve(&mut self, _env: Env, p: Self::Output) -> Result<NativePrefill> {
        Ok(NativePrefill {
            inner: Arc::new(Mutex::new(p)),
        })
    }
}

pub struct PrefillBatchTask {
    inner: Arc<Mutex<Option<ffsync_core::restore::prefill::Prefill>>>,
    batch: Buffer,
}
impl Task for PrefillBatchTask {
    type Output = (u32, u64);
    type JsValue = EarlyBatch;
    fn compute(&mut self) -> Result<(u32, u64)> {
        match self.inner.lock().unwrap().as_mut() {
            Some(p) => p.add_batch(&self.batch).map_err(to_napi),
            None => Err(napi::Error::from_reason("EUSAGE: early placement is not running")),
        }
    }
    fn resolve(&mut self, _env: Env, (chunks, raw): (u32, u64)) -> Result<EarlyBatch> {
        Ok(EarlyBatch {
            chunks,
            raw_bytes: raw as f64,
        })
    }
}

#[napi(object)]
pub struct EarlyBatch {
    pub chunks: u32,
    pub raw_bytes: f64,
}

pub struct PrefillAddTask {
    inner: Arc<Mutex<Option<ffsync_core::restore::prefill::Prefill>>>,
    entries: Buffer,
}
impl Task for PrefillAddTask {
    type Output = u64;
    type JsValue = f64;
    fn compute(&mut self) -> Result<u64> {
        match self.inner.lock().unwrap().as_mut() {
            Some(p) => p.add_entries(&self.entries).map_err(to_napi),
            None => Ok(0),
        }
    }
    fn resolve(&mut self, _env: Env, n: u64) -> Result<f64> {
        Ok(n as f64)
    }
}

#[napi]
impl NativePrefill {
    /// Start early placement into `target`'s provisional temp file for a `size`-byte file,
    /// from the given local files. Inactive (every call a no-op) when it cannot help or a
    /// resumable partial exists. `fsync` (default true) as for `NativeReconstruction.begin`:
    /// writeback starts as data lands only when the result will be made durable.
    #[napi(ts_return_type = "Promise<NativePrefill>")]
    pub fn begin(
        #[napi(ts_arg_type = "string | Buffer")] target: crate::PathArg,
        size: f64,
        locals: Vec<LocalFile>,
        beneath: Option<String>,
        fsync: Option<bool>,
    ) -> AsyncTask<PrefillBeginTask> {
        AsyncTask::new(PrefillBeginTask {
            target: crate::path_arg(target),
            beneath: beneath.map(PathBuf::from),
            size: size as u64,
            locals: locals
                .into_iter()
                .map(|l| (crate::path_arg(l.path), l.manifest.to_vec()))
                .collect(),
            fsync: fsync.unwrap_or(true),
        })
    }

    /// Placement is running (not skipped, not handed over, not released).
    #[napi(getter)]
    pub fn active(&self) -> bool {
        self.inner.lock().unwrap().is_some()
    }

    /// The next run of the sender's manifest entries: copies and proves every chunk a
    /// local file has. Resolves to the bytes placed; rejects (EMALFORMED) on entries that
    /// cannot belong to the offered file.
    #[napi(ts_return_type = "Promise<number>")]
    pub fn add_entries(&self, entries: Buffer) -> AsyncTask<PrefillAddTask> {
        AsyncTask::new(PrefillAddTask {
            inner: self.inner.clone(),
            entries,
        })
    }

    /// Early DATA: verify a chunk batch against the streamed entries and write it in place.
    /// Rejects (EMALFORMED / ECHUNK) on anything the sender should not have sent.
    #[napi(ts_return_type = "Promise<EarlyBatch>")]
    pub fn add_batch(&self, batch: Buffer) -> AsyncTask<PrefillBatchTask> {
        AsyncTask::new(PrefillBatchTask {
            inner: self.inner.clone(),
            batch,
        })
    }

    /// End early placement: its provisional file is removed, or with `keep` (a dropped
    /// connection) kept for the next attempt to resume from.
    #[napi]
    pub fn release(&self, keep: Option<bool>) {
        if let Some(p) = self.inner.lock().unwrap().take() {
            if keep == Some(true) {
                p.keep_for_resume();
            }
        }
    }
}

/// A partial of an earlier attempt at `target` exists (a resume would use it).
#[napi(ts_return_type = "Promise<boolean>")]
pub fn has_partial(
    #[napi(ts_arg_type = "string | Buffer")] target: crate::PathArg,
    beneath: Option<String>,
) -> AsyncTask<Blocking<bool>> {
    let target = crate::path_arg(target);
    AsyncTask::new(Blocking::new(move || {
        Ok(resolve(&target, beneath.as_deref().map(Path::new))
            .is_ok_and(|t| ffsync_core::restore::has_resumable_partial_at(&t)))
    }))
}

/// Make sure `rel` (a '/'-separated relative path) is a real directory under `root`,
/// creating what is missing with `create`; any link or non-directory on the way is an
/// error (EIO with "not followed"), never followed. Used for the `serve` request paths and
/// a pull's local directory before anything is written there.
#[napi(ts_return_type = "Promise<void>")]
pub fn ensure_dir_beneath(
    root: String,
    #[napi(ts_arg_type = "string | Buffer")] rel: crate::PathArg,
    create: bool,
) -> AsyncTask<Blocking<()>> {
    let rel = crate::path_arg(rel);
    AsyncTask::new(Blocking::new(move || {
        let bytes = ffsync_core::tree::path::name_bytes(rel.as_os_str());
        let shown = Path::new(&root).join(&rel);
        ffsync_core::beneath::ensure_dir(Path::new(&root), &bytes, create)
            .map_err(|e| to_napi(ffsync_core::CoreError::io(shown, e)))
    }))
}

/// rsync's --partial-dir: `restore` moves `target`'s partials waiting in `dir` back beside it
/// (before an attempt looks for one to resume); otherwise they move from beside it into `dir`
/// (after an attempt that kept them). Resolves to how many moved.
#[napi(ts_return_type = "Promise<number>")]
pub fn move_partials(
    #[napi(ts_arg_type = "string | Buffer")] target: crate::PathArg,
    beneath: Option<String>,
    dir: String,
    restore: bool,
) -> AsyncTask<PartialsTask> {
    AsyncTask::new(PartialsTask {
        target: crate::path_arg(target),
        beneath: beneath.map(PathBuf::from),
        dir,
        restore,
    })
}

pub struct PartialsTask {
    target: PathBuf,
    beneath: Option<PathBuf>,
    dir: String,
    restore: bool,
}
impl Task for PartialsTask {
    type Output = u32;
    type JsValue = u32;
    fn compute(&mut self) -> Result<u32> {
        let io = |e: std::io::Error| to_napi(ffsync_core::CoreError::io(&self.target, e));
        let dir = ffsync_core::restore::partial_dir::PartialDir::parse(&self.dir).map_err(io)?;
        let target = resolve(&self.target, self.beneath.as_deref())?;
        let moved = if self.restore {
            dir.restore(&target)
        } else {
            dir.stash(&target)
        };
        moved.map(|n| n as u32).map_err(io)
    }
    fn resolve(&mut self, _env: Env, n: u32) -> Result<u32> {
        Ok(n)
    }
}

/// rsync's rule for a relative --partial-dir DIR: `DIR/` (added to both rule lists, so the
/// partial directories are neither sent nor deleted); null for an absolute DIR. A DIR this
/// version cannot use is a usage error. The core's parser is the only definition.
#[napi]
pub fn partial_dir_rule(dir: String) -> Result<Option<String>> {
    let d = ffsync_core::restore::partial_dir::PartialDir::parse(&dir)
        .map_err(|e| to_napi(ffsync_core::CoreError::Usage(e.to_string())))?;
    Ok(d.relative_name().map(|n| format!("{}/", n.to_string_lossy())))
}
