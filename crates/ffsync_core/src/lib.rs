//! ffsync-native engine. No N-API here: everything is testable with `cargo test`.
//!
//! - [`chunker`]: FastCDC + BLAKE3, parallel with boundary re-synchronisation
//! - [`manifest`]: chunk list, root, packed codec
//! - [`scan`] / [`index`]: scanning files, persistent chunk index
//! - [`chunk_source`] / [`chunk_batch`]: the sender's chunk reader and DATA payload codec
//! - [`early_data`]: the sender's early DATA pipeline (windows of entries, then their chunks)
//! - [`restore`]: the restorer (temp files, local copies, positional writes, verify, rename),
//!   early placement, `--inplace` commits and their recovery, `--partial-dir`
//! - [`refine`]: sub-chunk refinement (rsync block signatures and deltas for missing chunks)
//! - [`sparse`]: sparse files, holes found with SEEK_HOLE/SEEK_DATA and punched on the receiver
//! - [`io`]: positional and in-kernel copy primitives
//! - [`beneath`]: filesystem access confined beneath a directory handle (no link followed)
//! - [`identity`]: this peer's self-signed TLS identity (rcgen)

pub mod background;
pub mod backup;
pub mod beneath;
pub mod block_match;
pub mod chunk_batch;
pub mod chunk_source;
pub mod chunker;
pub mod early_data;
pub mod error;
pub mod file_identity;
pub mod fuzzing;
pub mod identity;
pub mod idle;
pub mod index;
pub mod io;
pub mod manifest;
pub mod memory;
pub mod pairing;
pub mod params;
pub mod quic;
pub mod refine;
pub mod restore;
pub mod rsync_delta;
pub mod scan;
pub mod sparse;
pub mod tcp_rtt;
#[cfg(test)]
mod testutil;
pub mod tree;
pub mod zstream;

pub use error::{CoreError, Result};
