use crate::blocking::Blocking;
use crate::to_napi;
use ffsync_core::chunk_source::ChunkSource;
use ffsync_core::file_identity::FileIdentity;
use ffsync_core::manifest::Manifest;
use napi::bindgen_prelude::*;
use napi_derive::napi;
use std::sync::{Arc, Mutex, OnceLock};

/// The sender's reader: encodes requested chunks into DATA batches.
#[napi]
pub struct NativeChunkSource {
    /// `None` once released (the `serve` daemon must not hold the file open until the JS
    /// object is collected).
    inner: Mutex<Option<Arc<ChunkSource>>>,
    /// `unchanged()` as it was at release, so the caller can still ask afterwards.
    unchanged_at_release: OnceLock<bool>,
}

#[napi(object)]
pub struct EncodedBatch {
    /// Bytes of `out` holding the batch.
    pub length: u32,
    /// Uncompressed bytes of the chunks it carries.
    pub raw_bytes: f64,
}

pub struct ReadTask {
    source: Arc<ChunkSource>,
    previous: Vec<u32>,
    indices: Vec<u32>,
    out: Buffer,
}

impl Task for ReadTask {
    type Output = (usize, u64);
    type JsValue = EncodedBatch;

    fn compute(&mut self) -> Result<(usize, u64)> {
        self.source
            .read_batch_after(&self.previous, &self.indices, &mut self.out)
            .map_err(to_napi)
    }

    fn resolve(&mut self, _env: Env, (n, raw): (usize, u64)) -> Result<EncodedBatch> {
        Ok(EncodedBatch {
            length: n as u32,
            raw_bytes: raw as f64,
        })
    }
}

pub struct SetRefinementTask {
    source: Arc<ChunkSource>,
    table: Buffer,
}

impl Task for SetRefinementTask {
    type Output = ();
    type JsValue = ();
    fn compute(&mut self) -> Result<()> {
        self.source.set_refinement(&self.table).map_err(to_napi)
    }
    fn resolve(&mut self, _env: Env, _: ()) -> Result<()> {
        Ok(())
    }
}

/// What a source was when it was scanned, as Node's `fs.stat(path, { bigint: true })` said.
#[napi(object)]
pub struct ScannedIdentity {
    pub size: BigInt,
    pub mtime_ns: BigInt,
    pub ctime_ns: BigInt,
    pub ino: BigInt,
    pub dev: BigInt,
}

/// `ScannedIdentity` in numbers; compared with the open file's identity.
struct Scanned {
    size: u64,
    mtime_ns: i64,
    ctime_ns: i64,
    ino: u64,
    dev: u64,
}

/// The low 64 bits of `b` in two's complement: the bits the core's identity holds. Node fills
/// bigint stats from a signed 64-bit array, so an inode or device number with its top bit set
/// (NFS, FUSE, overlayfs; a macOS device) arrives negative; and a time past 2262 is wider than
/// 64 bits, where the core's nanoseconds wrap (`FileIdentity::of`). Never fails.
fn low_bits(b: &BigInt) -> u64 {
    let low = b.words.first().copied().unwrap_or(0);
    if b.sign_bit {
        low.wrapping_neg()
    } else {
        low
    }
}

impl Scanned {
    fn of(s: &ScannedIdentity) -> Scanned {
        Scanned {
            size: low_bits(&s.size),
            mtime_ns: low_bits(&s.mtime_ns) as i64,
            ctime_ns: low_bits(&s.ctime_ns) as i64,
            ino: low_bits(&s.ino),
            dev: low_bits(&s.dev),
        }
    }

    /// Node's change time, inode and device are the file's on every platform; on Windows the
    /// core's identity holds the creation time and no file index, so size and mtime decide there.
    fn matches(&self, id: &FileIdentity) -> bool {
        let same = id.size == self.size && id.mtime_ns == self.mtime_ns;
        if cfg!(unix) {
            same && id.ctime_ns == self.ctime_ns && id.inode == self.ino && id.dev == self.dev
        } else {
            same
        }
    }
}

#[napi]
impl NativeChunkSource {
    /// `compressLevel` is a zstd level; 0 sends every chunk raw. Opened off the JS thread.
    /// With `scanned`, the file opened must still be that version (checked on the open file,
    /// in the same step): else the promise rejects with `ECHANGED` (the source vanished or
    /// changed since it was scanned: exit 24).
    #[napi(ts_return_type = "Promise<NativeChunkSource>")]
    pub fn open(
        #[napi(ts_arg_type = "string | Buffer")] path: crate::PathArg,
        manifest: Buffer,
        compress_level: i32,
        stream: Option<bool>,
        scanned: Option<ScannedIdentity>,
    ) -> AsyncTask<Blocking<NativeChunkSource>> {
        let path = crate::path_arg(path);
        let scanned = scanned.as_ref().map(Scanned::of);
        let stream = stream.unwrap_or(false);
        AsyncTask::new(Blocking::new(move || {
            let m = Manifest::decode(&manifest).map_err(to_napi)?;
            let src = match scanned {
                Some(scanned) => {
                    ChunkSource::open_as_scanned(&path, m, |id| scanned.matches(id), compress_level, stream)
                }
                None => std::fs::metadata(&path)
                    .map_err(|e| ffsync_core::CoreError::io(&path, e))
                    .and_then(|meta| ChunkSource::open(&path, m, FileIdentity::of(&meta), compress_level, stream)),
            }
            .map_err(to_napi)?;
            Ok(NativeChunkSource {
                inner: Mutex::new(Some(Arc::new(src))),
                unchanged_at_release: OnceLock::new(),
            })
        }))
    }

    /// Encode the chunks into `out` (a buffer the caller recycles; it must hold at least
    /// `batchCapacity(indices)` bytes and must not be touched until the promise settles).
    /// `previous`: the chunks of the DATA frame sent just before this one, when the receiver
    /// negotiated `BATCH_PREFIX` (on a slow link the batch compresses against them too).
    #[napi(ts_return_type = "Promise<EncodedBatch>")]
    pub fn read_batch(
        &self,
        indices: Uint32Array,
        out: Buffer,
        previous: Option<Uint32Array>,
    ) -> Result<AsyncTask<ReadTask>> {
        Ok(AsyncTask::new(ReadTask {
            source: self.get()?,
            previous: previous.map(|p| p.to_vec()).unwrap_or_default(),
            indices: indices.to_vec(),
            out,
        }))
    }

    /// Install the receiver's refinement table: chunks it describes go as deltas when
    /// smaller. Validated against the manifest (a bad table is a protocol error).
    #[napi(ts_return_type = "Promise<void>")]
    pub fn set_refinement(&self, table: Buffer) -> Result<AsyncTask<SetRefinementTask>> {
        Ok(AsyncTask::new(SetRefinementTask {
            source: self.get()?,
            table,
        }))
    }

    /// The zstd level for batches read from now on (the sender adapts it to the link).
    #[napi]
    pub fn set_level(&self, level: i32) -> Result<()> {
        self.get()?.set_level(level);
        Ok(())
    }

    #[napi]
    pub fn batch_capacity(&self, indices: Uint32Array) -> Result<u32> {
        self.get()?.batch_capacity(&indices).map(|n| n as u32).map_err(to_napi)
    }

    /// False if the source's size, mtime or ctime changed since it was opened (after
    /// `release`: as it was then).
    #[napi]
    pub fn unchanged(&self) -> bool {
        match self.inner.lock().unwrap().as_ref() {
            Some(s) => s.unchanged(),
            None => self.unchanged_at_release.get().copied().unwrap_or(true),
        }
    }

    /// Close the file once running reads end; later reads fail. Idempotent.
    #[napi]
    pub fn release(&self) {
        if let Some(s) = self.inner.lock().unwrap().take() {
            let _ = self.unchanged_at_release.set(s.unchanged());
        }
    }

    fn get(&self) -> Result<Arc<ChunkSource>> {
        self.inner
            .lock()
            .unwrap()
            .clone()
            .ok_or_else(|| napi::Error::from_reason("EUSAGE: the chunk source was already released"))
    }
}
