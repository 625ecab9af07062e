//! N-API binding for ffsync-native. Only conversions and scheduling live here: every
//! operation calls into `ffsync_core` on a libuv worker thread (AsyncTask), big results
//! cross as one Buffer, and progress reaches JavaScript through a throttled threadsafe
//! callback driven by a ticker (not per chunk).

mod identity;
mod progress;
mod reconstruction;
mod scan;
mod source;

use ffsync_core::CoreError;

/// Errors cross as `CODE: message`; ts/utils/errors.ts turns the prefix into `err.code`.
pub(crate) fn to_napi(e: CoreError) -> napi::Error {
    napi::Error::new(napi::Status::GenericFailure, format!("{}: {}", e.code(), e))
}

pub(crate) fn bigint_to_i64(v: &napi::bindgen_prelude::BigInt) -> i64 {
    let (v, _lossless) = v.get_i64();
    v
}
