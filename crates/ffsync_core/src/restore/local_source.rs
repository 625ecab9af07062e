//! The local files a reconstruction may take chunks from (the old target, `--from` files, a
//! partial), shared by the restorer and early placement below it.

use crate::manifest::Manifest;
use std::path::PathBuf;

/// Longest single local copy: bounds work per task so copies spread over all cores and
/// writeback starts early.
pub(crate) const MAX_RUN: u64 = 16 << 20;

/// A local file whose chunks may be reused, with its (scanned or indexed) manifest.
pub struct LocalSource {
    pub path: PathBuf,
    pub manifest: Manifest,
}
