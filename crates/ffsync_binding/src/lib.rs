//! N-API binding for ffsync-native. Only conversions and scheduling live here: every
//! operation calls into `ffsync_core` on a libuv worker thread (AsyncTask), big results
//! cross as one Buffer, and progress reaches JavaScript through a throttled threadsafe
//! callback driven by a ticker (not per chunk).

mod blocking;
mod identity;
mod net;
mod pairing;
mod progress;
mod quic;
mod reconstruction;
mod scan;
mod source;
mod tree;

use ffsync_core::CoreError;

/// Runs when Node loads the addon: allocator tunables for the whole process (see
/// ffsync_core::memory), before any session allocates.
#[napi_derive::module_init]
fn init() {
    ffsync_core::memory::tune_allocator();
}

/// Drop `value` on a background thread, not the JavaScript one: closing a reconstruction's
/// files can make the kernel free the blocks of the target it replaced (~2 ms for a 1 MiB
/// file here, most of a second for a large one), and a tree session releases one per file.
/// One long-lived thread takes them in order; if it cannot be started, `value` drops here.
pub(crate) fn drop_in_background<T: Send + 'static>(value: T) {
    use std::sync::mpsc::{channel, Sender};
    use std::sync::OnceLock;
    type Garbage = Box<dyn Send>;
    static DROPPER: OnceLock<Option<Sender<Garbage>>> = OnceLock::new();
    let tx = DROPPER.get_or_init(|| {
        let (tx, rx) = channel::<Garbage>();
        std::thread::Builder::new()
            .name("ffsync-dropper".into())
            .spawn(move || {
                for garbage in rx {
                    drop(garbage)
                }
            })
            .ok()
            .map(|_| tx)
    });
    // A send that fails hands the value back inside its error, which drops it here.
    if let Some(tx) = tx {
        let _ = tx.send(Box::new(value));
    }
}

/// Errors cross as `CODE: message`; ts/utils/errors.ts turns the prefix into `err.code`.
pub(crate) fn to_napi(e: CoreError) -> napi::Error {
    napi::Error::new(napi::Status::GenericFailure, format!("{}: {}", e.code(), e))
}

/// A path from JavaScript: a string, or a Buffer of raw bytes (tree entries whose names
/// are not UTF-8 keep their exact bytes on Unix).
pub(crate) type PathArg = napi::Either<String, napi::bindgen_prelude::Buffer>;

pub(crate) fn path_arg(p: PathArg) -> std::path::PathBuf {
    match p {
        napi::Either::A(s) => s.into(),
        napi::Either::B(b) => bytes_path(&b),
    }
}

pub(crate) fn bytes_path(b: &[u8]) -> std::path::PathBuf {
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        std::ffi::OsStr::from_bytes(b).into()
    }
    #[cfg(not(unix))]
    {
        String::from_utf8_lossy(b).into_owned().into()
    }
}

/// A BigInt that must fit an i64 (a time in ns since 1970: ±292 years). One that does not is
/// refused, not wrapped into some other time.
pub(crate) fn bigint_to_i64(v: &napi::bindgen_prelude::BigInt) -> napi::Result<i64> {
    let (n, lossless) = v.get_i64();
    if lossless {
        Ok(n)
    } else {
        Err(napi::Error::from_reason(
            "EINVAL: a time outside the i64 nanosecond range",
        ))
    }
}

/// The wire and error constants the TypeScript shell mirrors (ts/utils/manifest.ts,
/// ts/api/early-placement.ts, ts/utils/errors.ts, ts/api/scan-ahead.ts), from their one definition in the core;
/// `__test__/native-constants.test.ts` compares them.
#[napi_derive::napi(object)]
pub struct NativeConstants {
    pub manifest_header: u32,
    pub manifest_entry: u32,
    pub record_header: u32,
    /// Chunk record encodings whose stream starts with the previous DATA frame (BATCH_PREFIX).
    pub prefix_encodings: Vec<u32>,
    /// Largest REFINE table a receiver sends (bytes).
    pub refine_table_max: u32,
    /// TREE_OPTIONS' attribute bits: owner, group, xattrs, numeric ids.
    pub attr_flags: Vec<u32>,
    /// Triage's small-file limit: files up to this size travel whole in batches (bytes).
    pub small_file_max: u32,
    pub error_codes: Vec<String>,
}

#[napi_derive::napi]
pub fn native_constants() -> NativeConstants {
    NativeConstants {
        manifest_header: ffsync_core::manifest::HEADER_LEN as u32,
        manifest_entry: ffsync_core::manifest::ENTRY_LEN as u32,
        record_header: ffsync_core::chunk_batch::RECORD_HEADER as u32,
        prefix_encodings: (0..=u8::MAX)
            .filter(|&e| ffsync_core::chunk_batch::refers_to_previous(e))
            .map(u32::from)
            .collect(),
        refine_table_max: ffsync_core::refine::MAX_TABLE_BYTES as u32,
        attr_flags: {
            use ffsync_core::tree::attrs::attr_flags::*;
            [OWNER, GROUP, XATTRS, NUMERIC_IDS].map(u32::from).to_vec()
        },
        small_file_max: ffsync_core::tree::triage::SMALL_FILE_MAX as u32,
        error_codes: ffsync_core::error::ERROR_CODES.iter().map(|c| c.to_string()).collect(),
    }
}
