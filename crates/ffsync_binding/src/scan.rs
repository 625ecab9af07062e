use crate::progress::{ProgressFn, Ticker};
use crate::to_napi;
use ffsync_core::early_data::{batch_buffers, scan_with_early_data, BatchBuffers, StreamStep};
use ffsync_core::params::ChunkParams;
use ffsync_core::scan::{scan_file, scan_file_with_params, ScanOptions};
use napi::bindgen_prelude::*;
use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode};
use napi_derive::napi;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

#[napi(object)]
pub struct ScanFileOptions {
    /// State directory holding indexes; omit to neither read nor write an index.
    pub state_dir: Option<String>,
    /// Ignore an existing index (`--checksum`); a fresh one is still written.
    pub ignore_index: Option<bool>,
    /// Chunk with the parameters of a file of this size instead of this file's own
    /// (no index is read or written). Used when the peer's file straddles the threshold.
    pub params_for_size: Option<f64>,
}

#[napi(object)]
pub struct ScanResult {
    /// Packed manifest (see docs/protocol.md, "Manifest encoding").
    pub manifest: Buffer,
    pub root: String,
    pub size: f64,
    pub chunks: u32,
    pub from_index: bool,
}

pub struct ScanTask {
    path: PathBuf,
    state_dir: Option<PathBuf>,
    ignore_index: bool,
    params_for_size: Option<u64>,
    progress: Option<ProgressFn>,
}

pub struct Scanned {
    manifest: Vec<u8>,
    root: String,
    size: u64,
    chunks: u32,
    from_index: bool,
}

impl Task for ScanTask {
    type Output = Scanned;
    type JsValue = ScanResult;

    fn compute(&mut self) -> Result<Scanned> {
        let counter = Arc::new(AtomicU64::new(0));
        let c = counter.clone();
        let mut ticker = Ticker::start(
            move || c.load(std::sync::atomic::Ordering::Relaxed),
            self.progress.take(),
        );
        let out = match self.params_for_size {
            Some(size) => scan_file_with_params(&self.path, ChunkParams::for_file_size(size), Some(&counter)),
            None => scan_file(
                &self.path,
                &ScanOptions {
                    state_dir: self.state_dir.as_deref(),
                    ignore_index: self.ignore_index,
                    progress: Some(&counter),
                },
            ),
        }
        .map_err(to_napi);
        ticker.stop();
        let o = out?;
        Ok(Scanned {
            root: o.manifest.root_hex(),
            size: o.manifest.size,
            chunks: o.manifest.chunks.len() as u32,
            manifest: o.manifest.encode(),
            from_index: o.from_index,
        })
    }

    fn resolve(&mut self, _env: Env, o: Scanned) -> Result<ScanResult> {
        Ok(o.into())
    }
}

impl From<Scanned> for ScanResult {
    fn from(o: Scanned) -> ScanResult {
        ScanResult {
            manifest: o.manifest.into(),
            root: o.root,
            size: o.size as f64,
            chunks: o.chunks,
            from_index: o.from_index,
        }
    }
}

/// Chunk and hash a file on every core (or load its manifest from the index).
#[napi(ts_return_type = "Promise<ScanResult>")]
pub fn scan_file_native(
    #[napi(ts_arg_type = "string | Buffer")] path: crate::PathArg,
    options: Option<ScanFileOptions>,
    #[napi(ts_arg_type = "((doneBytes: number) => void) | undefined | null")] on_progress: Option<ProgressFn>,
) -> AsyncTask<ScanTask> {
    let o = options.unwrap_or(ScanFileOptions {
        state_dir: None,
        ignore_index: None,
        params_for_size: None,
    });
    AsyncTask::new(ScanTask {
        path: crate::path_arg(path),
        state_dir: o.state_dir.map(PathBuf::from),
        ignore_index: o.ignore_index.unwrap_or(false),
        params_for_size: o.params_for_size.map(|s| s as u64),
        progress: on_progress,
    })
}

/// Told whether a background scan hashed its file. Weak: a scan still pending (its thread runs
/// only when a core is idle, and a busy machine may leave it waiting) never keeps the process
/// alive; a library user's process exits when its own work is done.
pub type BackgroundDoneFn = ThreadsafeFunction<bool, (), bool, Status, false, true>;

/// Hash a file into the index at background priority (a scan ahead of the conversations,
/// decisions §95): on `ffsync_core::background`'s pool, which runs only when a core is otherwise
/// idle, never on libuv's pool (a session's own work waits there). `done` is told whether the
/// file was hashed; a failure is the conversation's to report, when it hashes the file itself.
#[napi]
pub fn scan_file_background(
    #[napi(ts_arg_type = "string | Buffer")] path: crate::PathArg,
    state_dir: String,
    #[napi(ts_arg_type = "(hashed: boolean) => void")] done: BackgroundDoneFn,
) {
    let path = crate::path_arg(path);
    ffsync_core::background::spawn(move || {
        let opts = ScanOptions {
            state_dir: Some(std::path::Path::new(&state_dir)),
            ignore_index: false,
            progress: None,
        };
        let hashed = scan_file(&path, &opts).is_ok();
        done.call(hashed, ThreadsafeFunctionCallMode::NonBlocking);
    });
}

#[napi(object)]
pub struct ManifestInfo {
    pub root: String,
    pub size: f64,
    pub chunks: u32,
}

/// Validate a packed manifest from an untrusted peer (bounds, lengths, root).
#[napi]
pub fn decode_manifest(manifest: Buffer) -> Result<ManifestInfo> {
    let m = ffsync_core::manifest::Manifest::decode(&manifest).map_err(to_napi)?;
    Ok(ManifestInfo {
        root: m.root_hex(),
        size: m.size as f64,
        chunks: m.chunks.len() as u32,
    })
}

pub struct LoadIndexTask {
    path: PathBuf,
    state_dir: PathBuf,
}

impl Task for LoadIndexTask {
    type Output = Option<Scanned>;
    type JsValue = Option<ScanResult>;

    fn compute(&mut self) -> Result<Option<Scanned>> {
        let Ok(meta) = std::fs::metadata(&self.path) else {
            return Ok(None);
        };
        if !meta.is_file() {
            return Ok(None);
        }
        let id = ffsync_core::file_identity::FileIdentity::of(&meta);
        let key = ffsync_core::scan::index_key(&self.path);
        Ok(ffsync_core::index::load(&self.state_dir, &key, &id).map(|m| Scanned {
            root: m.root_hex(),
            size: m.size,
            chunks: m.chunks.len() as u32,
            manifest: m.encode(),
            from_index: true,
        }))
    }

    fn resolve(&mut self, _env: Env, o: Option<Scanned>) -> Result<Option<ScanResult>> {
        Ok(o.map(ScanResult::from))
    }
}

/// The file's manifest if an index entry matches its current stat identity; no scan.
#[napi(ts_return_type = "Promise<ScanResult | null>")]
pub fn load_index(path: String, state_dir: String) -> AsyncTask<LoadIndexTask> {
    AsyncTask::new(LoadIndexTask {
        path: path.into(),
        state_dir: state_dir.into(),
    })
}

/// One step of a streamed scan: the next window's manifest entries, or the end.
#[napi(object)]
pub struct ScanStep {
    /// Packed entries (`len u32 | blake3 [32]` each) of the next window, in order.
    pub part: Option<Buffer>,
    /// Early DATA (when asked for): a chunk batch of the window just handed out, here only
    /// when it did not fit the buffer given to `next` (else it was copied there).
    pub batch: Option<Buffer>,
    /// Length of that batch (in the buffer given to `next`, or of `batch`).
    pub batch_len: Option<u32>,
    /// Chunks and raw bytes in `batch`.
    pub batch_chunks: Option<u32>,
    pub batch_raw: Option<f64>,
    /// Set on the last step: the whole scan (exactly what `scanFileNative` returns).
    pub result: Option<ScanResult>,
}

/// Early DATA: every window's chunks also come as chunk batches (the receiver has nothing).
#[napi(object)]
pub struct EarlyData {
    /// zstd level (0 = raw).
    pub level: i32,
    /// Raw bytes per batch (at most).
    pub batch_bytes: u32,
    /// The receiver decodes stream records (BATCH_STREAM).
    pub stream: Option<bool>,
}

/// What the scan thread hands over: the core's steps as they are, then the outcome.
enum StreamMsg {
    Step(StreamStep),
    Done(std::result::Result<Scanned, napi::Error>),
}

type StreamRx = Arc<std::sync::Mutex<Option<std::sync::mpsc::Receiver<StreamMsg>>>>;

/// A scan that hands out its manifest window by window while it runs, on its own thread
/// (see `ffsync_core::scan::scan_file_streaming`). Windows queue up to a small bound;
/// dropping or releasing the stream cancels the scan.
#[napi]
pub struct NativeScanStream {
    rx: StreamRx,
    cancel: Arc<AtomicBool>,
    policy: Option<Arc<ffsync_core::chunk_batch::CompressPolicy>>,
    /// Batch buffers copied out to JavaScript go back to the encoder.
    buffers: Arc<BatchBuffers>,
}

/// Queue `msg` unless the stream was cancelled or dropped (false then). Never blocks for
/// long: a reader that stopped reading without releasing must not pin the thread forever.
fn offer(tx: &std::sync::mpsc::SyncSender<StreamMsg>, mut msg: StreamMsg, cancel: &AtomicBool) -> bool {
    loop {
        if cancel.load(Ordering::Acquire) {
            return false;
        }
        match tx.try_send(msg) {
            Ok(()) => return true,
            Err(std::sync::mpsc::TrySendError::Full(m)) => {
                msg = m;
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            Err(std::sync::mpsc::TrySendError::Disconnected(_)) => return false,
        }
    }
}

/// Waits for the stream's next message (blocking: runs on tokio's blocking pool, never on
/// libuv's four workers, which a few streams waiting on whole windows would otherwise hold
/// while every other native call and `fs` operation queued behind them).
fn next_step(rx: &StreamRx, buffers: &BatchBuffers, mut into: Option<Buffer>) -> Result<ScanStep> {
    let guard = rx.lock().unwrap();
    let rx = guard
        .as_ref()
        .ok_or_else(|| napi::Error::from_reason("EUSAGE: the scan stream was released"))?;
    let empty = ScanStep {
        part: None,
        batch: None,
        batch_len: None,
        batch_chunks: None,
        batch_raw: None,
        result: None,
    };
    match rx.recv() {
        Ok(StreamMsg::Step(StreamStep::Part(p))) => Ok(ScanStep {
            part: Some(p.into()),
            ..empty
        }),
        Ok(StreamMsg::Step(StreamStep::Batch(b, n, raw))) => {
            let (batch_len, batch) = match into.as_mut() {
                // Into the caller's recycled buffer: no fresh 2 MiB JavaScript buffer per batch
                // waiting for the garbage collector.
                Some(into) if into.len() >= b.len() => {
                    into[..b.len()].copy_from_slice(&b);
                    let n = b.len();
                    buffers.give(b);
                    (n, None)
                }
                _ => (b.len(), Some(b.into())),
            };
            Ok(ScanStep {
                batch,
                batch_len: Some(batch_len as u32),
                batch_chunks: Some(n),
                batch_raw: Some(raw as f64),
                ..empty
            })
        }
        Ok(StreamMsg::Done(r)) => r.map(|o| ScanStep {
            result: Some(o.into()),
            ..empty
        }),
        Err(_) => Err(napi::Error::from_reason("EUSAGE: the scan stream already ended")),
    }
}

/// Steps (windows or batches) scanned ahead of the reader. Two keep the socket fed; more only
/// hold batches resident once the encoder outruns the socket (decisions §68).
const STREAM_QUEUE: usize = 2;

#[napi]
impl NativeScanStream {
    /// Start scanning `path` in windows of `window` bytes (index-aware, like `scanFileNative`).
    /// With `early`, each window's entries are followed by its chunks as chunk batches.
    #[napi(factory)]
    pub fn open(
        #[napi(ts_arg_type = "string | Buffer")] path: crate::PathArg,
        window: f64,
        options: Option<ScanFileOptions>,
        #[napi(ts_arg_type = "((doneBytes: number) => void) | undefined | null")] on_progress: Option<ProgressFn>,
        early: Option<EarlyData>,
    ) -> Result<NativeScanStream> {
        let early = early.map(|e| {
            (
                Arc::new(ffsync_core::chunk_batch::CompressPolicy::with_stream(
                    e.level,
                    e.stream.unwrap_or(false),
                )),
                (e.batch_bytes as u64).max(1),
            )
        });
        let policy = early.as_ref().map(|(p, _)| p.clone());
        let path = crate::path_arg(path);
        let state_dir = options.as_ref().and_then(|o| o.state_dir.clone()).map(PathBuf::from);
        let ignore_index = options.as_ref().and_then(|o| o.ignore_index).unwrap_or(false);
        let window = window.max(1.0) as usize;
        let (tx, rx) = std::sync::mpsc::sync_channel::<StreamMsg>(STREAM_QUEUE);
        let cancel = Arc::new(AtomicBool::new(false));
        let cancelled = cancel.clone();
        let buffers = Arc::new(batch_buffers());
        let spent = buffers.clone();
        std::thread::Builder::new()
            .name("ffsync-scan-stream".into())
            .spawn(move || {
                let counter = Arc::new(AtomicU64::new(0));
                let c = counter.clone();
                let mut ticker = Ticker::start(move || c.load(Ordering::Relaxed), on_progress);
                let early_data = early
                    .as_ref()
                    .map(|(policy, batch_bytes)| ffsync_core::early_data::EarlyData {
                        policy,
                        batch_bytes: *batch_bytes,
                        buffers: &spent,
                    });
                // A released or dropped stream cancels the scan.
                let emit = |step: StreamStep| offer(&tx, StreamMsg::Step(step), &cancelled);
                let out = scan_with_early_data(
                    &path,
                    &ScanOptions {
                        state_dir: state_dir.as_deref(),
                        ignore_index,
                        progress: Some(&counter),
                    },
                    window,
                    early_data.as_ref(),
                    &emit,
                );
                ticker.stop();
                let done = out.map_err(to_napi).map(|o| Scanned {
                    root: o.manifest.root_hex(),
                    size: o.manifest.size,
                    chunks: o.manifest.chunks.len() as u32,
                    manifest: o.manifest.encode(),
                    from_index: o.from_index,
                });
                offer(&tx, StreamMsg::Done(done), &cancelled);
            })
            .map_err(|e| napi::Error::from_reason(format!("EIO: cannot start a scan thread: {e}")))?;
        Ok(NativeScanStream {
            rx: Arc::new(std::sync::Mutex::new(Some(rx))),
            cancel,
            policy,
            buffers,
        })
    }

    /// The next window's entries, an early DATA batch (copied into `into` when it fits), or
    /// (last) the whole scan's result.
    #[napi]
    pub async fn next(&self, into: Option<Buffer>) -> Result<ScanStep> {
        let (rx, buffers) = (self.rx.clone(), self.buffers.clone());
        napi::tokio::task::spawn_blocking(move || next_step(&rx, &buffers, into))
            .await
            .map_err(|e| napi::Error::from_reason(format!("EIO: the scan stream's reader failed: {e}")))?
    }

    /// The zstd level for early DATA encoded from now on (the sender adapts it to the link).
    #[napi]
    pub fn set_level(&self, level: i32) {
        if let Some(p) = &self.policy {
            p.set_level(level);
        }
    }

    /// Stop the scan (if still running) and free its queue (never blocks: a `next` in
    /// flight ends with the scan).
    #[napi]
    pub fn release(&self) {
        self.cancel.store(true, Ordering::Release);
        if let Ok(mut rx) = self.rx.try_lock() {
            rx.take();
        }
    }
}
