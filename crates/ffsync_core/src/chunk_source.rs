//! The sender's side of a transfer: reads requested chunks of a source file (positional
//! reads, so resident memory is bounded by the batch, not the file) and encodes them into
//! batches, compressing in parallel.

use crate::chunk_batch::CompressPolicy;
use crate::error::{CoreError, Result};
use crate::file_identity::FileIdentity;
use crate::io::read_exact_at;
use crate::manifest::Manifest;
use rayon::prelude::*;
use std::fs::File;
use std::path::{Path, PathBuf};

pub struct ChunkSource {
    path: PathBuf,
    file: File,
    identity: FileIdentity,
    manifest: Manifest,
    policy: CompressPolicy,
}

impl ChunkSource {
    pub fn open(path: &Path, manifest: Manifest, identity: FileIdentity, compress_level: i32) -> Result<ChunkSource> {
        let file = File::open(path).map_err(|e| CoreError::io(path, e))?;
        Ok(ChunkSource { path: path.to_path_buf(), file, identity, manifest, policy: CompressPolicy::new(compress_level) })
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Encode the given chunks into one batch. Returns (batch, raw bytes covered).
    pub fn read_batch(&self, indices: &[u32]) -> Result<(Vec<u8>, u64)> {
        let records: Vec<Result<Vec<u8>>> = indices
            .par_iter()
            .map(|&i| {
                let c = self
                    .manifest
                    .chunks
                    .get(i as usize)
                    .ok_or_else(|| CoreError::malformed("chunk request", format!("chunk index {i} out of range")))?;
                let mut raw = vec![0u8; c.len as usize];
                read_exact_at(&self.file, &mut raw, c.offset).map_err(|e| CoreError::io(&self.path, e))?;
                let mut rec = Vec::new();
                self.policy.encode_record(i, &raw, &mut rec);
                Ok(rec)
            })
            .collect();
        let mut out = Vec::new();
        let mut raw_total = 0u64;
        for (r, &i) in records.into_iter().zip(indices) {
            out.extend_from_slice(&r?);
            raw_total += self.manifest.chunks[i as usize].len as u64;
        }
        Ok((out, raw_total))
    }

    /// True if the source still has the identity it had when it was scanned; a sender
    /// checks this after the transfer to report "source changed during the sync".
    pub fn unchanged(&self) -> bool {
        std::fs::metadata(&self.path).map(|m| FileIdentity::of(&m) == self.identity).unwrap_or(false)
    }
}
