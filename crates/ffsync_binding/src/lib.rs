//! N-API binding for ffsync-native. Only conversions and scheduling live here: every
//! operation calls into `ffsync_core` on a libuv worker thread (AsyncTask), big results
//! cross as one Buffer, and progress reaches JavaScript through a throttled threadsafe
//! callback driven by a ticker (not per chunk).

mod identity;
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

pub(crate) fn bigint_to_i64(v: &napi::bindgen_prelude::BigInt) -> i64 {
    let (v, _lossless) = v.get_i64();
    v
}
