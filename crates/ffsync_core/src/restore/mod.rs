//! Restoring a file: everything between "these are the sender's chunks" and "the verified
//! result is in place", in the style of restic's `internal/restorer`. Dependencies point one
//! way, top to bottom:
//!
//! - [`restorer`]: the reconstruction itself (plan, copy, receive, verify, commit).
//! - [`prefill`]: early placement while a streamed manifest arrives (overlapped phases).
//! - [`inplace`]: `--inplace` commits through a redo journal.
//! - [`partial_dir`]: rsync's `--partial-dir`, where kept partials wait between attempts.
//! - [`staging`]: the temp files: partial naming, creation (cloned or pre-sized), resume,
//!   stale clean-up.
//! - [`durable`]: what makes a result durable and correct on disk (times, modes).
//! - [`local_source`]: the local files a reconstruction may take chunks from.
//!
//! `restore::*` re-exports the restorer's types, so callers write `restore::Reconstruction`.

pub mod durable;
pub mod inplace;
pub mod local_source;
pub mod partial_dir;
pub mod prefill;
mod restorer;
pub mod staging;

pub use durable::{apply_metadata, system_time_from_ns, touch_up_to_date_at};
pub use local_source::LocalSource;
pub use restorer::{BeginOptions, PeerCopy, PlanSummary, Reconstruction};
pub use staging::{
    create_exclusive, has_resumable_partial, has_resumable_partial_at, partial_name, partial_of, partial_path,
    streaming_of, streaming_path, PARTIAL_SUFFIX,
};
