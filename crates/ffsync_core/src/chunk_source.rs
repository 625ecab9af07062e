//! The sender's side of a transfer: reads requested chunks of a source file (positional
//! reads, so resident memory is bounded by the batch, not the file) and encodes them into
//! batches, compressing in parallel. Chunks the receiver described with a refinement
//! table ([`crate::refine`]) are sent as deltas against its old bytes when that is smaller.

use crate::chunk_batch::{history, read_history_chunks, CompressPolicy, GroupSlot, PREFIX_FROM_LEVEL, RECORD_HEADER};
use crate::chunker::Chunk;
use crate::error::{CoreError, Result};
use crate::file_identity::FileIdentity;
use crate::io::read_exact_at;
use crate::manifest::Manifest;
use crate::refine::RefineTable;
use rayon::prelude::*;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

thread_local! {
    /// (delta, the chunk padded with its neighbours' bytes), reused per thread.
    static DELTA_BUF: std::cell::RefCell<(Vec<u8>, Vec<u8>)> = const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// Markers in the first pass of a streamed batch: `usize::MAX` = chunk left raw in its slot,
/// `DELTA_STAGED - n` = a delta of n bytes staged in it (both encoded by group afterwards).
const DELTA_STAGED: usize = usize::MAX - 1;

pub struct ChunkSource {
    path: PathBuf,
    file: File,
    identity: FileIdentity,
    manifest: Manifest,
    policy: CompressPolicy,
    refine: OnceLock<RefineTable>,
}

impl ChunkSource {
    /// `stream`: the receiver decodes stream records (BATCH_STREAM).
    pub fn open(
        path: &Path,
        manifest: Manifest,
        identity: FileIdentity,
        compress_level: i32,
        stream: bool,
    ) -> Result<ChunkSource> {
        let file = File::open(path).map_err(|e| CoreError::io(path, e))?;
        Ok(Self::of_file(path, file, identity, manifest, compress_level, stream))
    }

    fn of_file(
        path: &Path,
        file: File,
        identity: FileIdentity,
        manifest: Manifest,
        compress_level: i32,
        stream: bool,
    ) -> ChunkSource {
        ChunkSource {
            path: path.to_path_buf(),
            file,
            identity,
            manifest,
            policy: CompressPolicy::with_stream(compress_level, stream),
            refine: OnceLock::new(),
        }
    }

    /// Open `path` only if the file opened is still the version that was scanned: the identity
    /// of the open handle (not of the path, which a rename could point elsewhere meanwhile)
    /// must satisfy `as_scanned`. A file gone or changed since fails with
    /// [`CoreError::SourceChanged`] (ECHANGED: the sender's exit 24); any other failure to
    /// open it is an I/O error.
    pub fn open_as_scanned(
        path: &Path,
        manifest: Manifest,
        as_scanned: impl FnOnce(&FileIdentity) -> bool,
        compress_level: i32,
        stream: bool,
    ) -> Result<ChunkSource> {
        let changed = || CoreError::SourceChanged {
            path: path.to_path_buf(),
        };
        let file = match File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(changed()),
            Err(e) => return Err(CoreError::io(path, e)),
        };
        let identity = FileIdentity::of(&file.metadata().map_err(|e| CoreError::io(path, e))?);
        if !as_scanned(&identity) {
            return Err(changed());
        }
        Ok(Self::of_file(path, file, identity, manifest, compress_level, stream))
    }

    /// Install the receiver's refinement table (validated against the manifest). Once only.
    pub fn set_refinement(&self, table: &[u8]) -> Result<()> {
        let t = RefineTable::decode(table, &self.manifest)?;
        self.refine
            .set(t)
            .map_err(|_| CoreError::Usage("refinement table already set".into()))
    }

    /// The zstd level for batches read from now on.
    pub fn set_level(&self, level: i32) {
        self.policy.set_level(level);
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Bytes a batch of these chunks can need at most (records never grow).
    pub fn batch_capacity(&self, indices: &[u32]) -> Result<usize> {
        let mut n = 0usize;
        for &i in indices {
            n += RECORD_HEADER + self.chunk(i)?.len as usize;
        }
        Ok(n)
    }

    fn chunk(&self, i: u32) -> Result<&Chunk> {
        self.manifest
            .chunks
            .get(i as usize)
            .ok_or_else(|| CoreError::malformed("chunk request", format!("chunk index {i} out of range")))
    }

    /// Encode the given chunks into `out` (reused across batches by the caller: fresh
    /// memory is expensive). Each chunk is read straight into its slot and compressed in
    /// place, in parallel; records are then packed together. Returns (bytes used, raw bytes).
    pub fn read_batch_into(&self, indices: &[u32], out: &mut [u8]) -> Result<(usize, u64)> {
        self.read_batch_after(&[], indices, out)
    }

    /// [`Self::read_batch_into`] for the DATA frame after one that carried the chunks
    /// `previous` (in its order; empty: none, or the receiver lacks `BATCH_PREFIX`). From
    /// [`PREFIX_FROM_LEVEL`], where the link is the bottleneck, the batch's stream starts with
    /// the last of their bytes as history (encodings 8 and 9,
    /// [`crate::chunk_batch::history`]): read again from the source, as the receiver reads
    /// them back from what it wrote.
    pub fn read_batch_after(&self, previous: &[u32], indices: &[u32], out: &mut [u8]) -> Result<(usize, u64)> {
        let need = self.batch_capacity(indices)?;
        if out.len() < need {
            return Err(CoreError::Usage(format!(
                "batch buffer of {} bytes is smaller than the {need} needed",
                out.len()
            )));
        }
        let mut slots: Vec<(u32, &mut [u8])> = Vec::with_capacity(indices.len());
        let mut rest = &mut out[..need];
        for &i in indices {
            let len = RECORD_HEADER + self.chunk(i)?.len as usize;
            let (slot, tail) = rest.split_at_mut(len);
            slots.push((i, slot));
            rest = tail;
        }
        let refine = self.refine.get();
        let streams = self.policy.streams();
        let mut used: Vec<Result<usize>> = slots
            .par_iter_mut()
            .map(|(i, slot)| {
                let c = &self.manifest.chunks[*i as usize];
                read_exact_at(&self.file, &mut slot[RECORD_HEADER..], c.offset)
                    .map_err(|e| CoreError::io(&self.path, e))?;
                let run = refine.and_then(|t| t.run_of(*i).map(|k| (t, k)));
                if let Some((t, k)) = run {
                    let encoded = DELTA_BUF.with(|d| -> Result<Option<usize>> {
                        let mut guard = d.borrow_mut();
                        let (d, padded) = &mut *guard;
                        d.clear();
                        // Two blocks of our own bytes on each side let the match run
                        // through the chunk's edges (see RefineTable::diff_chunk).
                        let ctx = 2 * t.block_size(k) as u64;
                        let before = ctx.min(c.offset);
                        let after = ctx.min(self.manifest.size - c.end());
                        padded.resize((before + c.len as u64 + after) as usize, 0);
                        let (head, rest) = padded.split_at_mut(before as usize);
                        let (mid, tail) = rest.split_at_mut(c.len as usize);
                        read_exact_at(&self.file, head, c.offset - before).map_err(|e| CoreError::io(&self.path, e))?;
                        mid.copy_from_slice(&slot[RECORD_HEADER..]);
                        read_exact_at(&self.file, tail, c.end()).map_err(|e| CoreError::io(&self.path, e))?;
                        t.diff_chunk(k, padded, before as usize, c.len as usize, d);
                        if streams {
                            // Staged: compressed below in its group's stream (the marker
                            // carries the delta's length).
                            return Ok(self.policy.stage_delta_in_slot(d, slot).map(|n| DELTA_STAGED - n));
                        }
                        Ok(self.policy.encode_delta_in_slot(*i, d, slot))
                    })?;
                    if let Some(n) = encoded {
                        return Ok(n);
                    }
                }
                if streams {
                    return Ok(usize::MAX); // encoded below, with its neighbours
                }
                Ok(self.policy.encode_in_slot(*i, slot))
            })
            .collect();
        if streams {
            let mut pending: Vec<(usize, GroupSlot<'_>)> = Vec::new();
            for (k, (i, slot)) in slots.iter_mut().enumerate() {
                match used[k] {
                    Ok(usize::MAX) => pending.push((k, (*i, &mut **slot, None))),
                    Ok(n) if n >= DELTA_STAGED - u32::MAX as usize && n <= DELTA_STAGED => {
                        pending.push((k, (*i, &mut **slot, Some(DELTA_STAGED - n))))
                    }
                    _ => {}
                }
            }
            let (ks, mut group): (Vec<usize>, Vec<GroupSlot<'_>>) = pending.into_iter().unzip();
            let prefix = if !previous.is_empty() && !group.is_empty() && self.policy.level() >= PREFIX_FROM_LEVEL {
                let (bytes, _) = read_history_chunks(&self.file, &self.manifest, previous)
                    .map_err(|e| CoreError::io(&self.path, e))?;
                Some(bytes)
            } else {
                None
            };
            let prefix = prefix.as_deref().map(history);
            for (k, n) in ks.into_iter().zip(self.policy.encode_groups(&mut group, prefix)) {
                used[k] = Ok(n);
            }
        }
        // Pack: move each record down to close the gaps left by compression.
        let mut write = 0usize;
        let mut read = 0usize;
        let mut raw = 0u64;
        for (k, u) in used.into_iter().enumerate() {
            let u = u?;
            let slot_len = RECORD_HEADER + self.manifest.chunks[indices[k] as usize].len as usize;
            out.copy_within(read..read + u, write);
            write += u;
            read += slot_len;
            raw += (slot_len - RECORD_HEADER) as u64;
        }
        Ok((write, raw))
    }

    /// Encode into a new buffer (tests and one-off callers).
    pub fn read_batch(&self, indices: &[u32]) -> Result<(Vec<u8>, u64)> {
        self.read_batch_vec_after(&[], indices)
    }

    /// [`Self::read_batch_after`] into a new buffer (tests).
    pub fn read_batch_vec_after(&self, previous: &[u32], indices: &[u32]) -> Result<(Vec<u8>, u64)> {
        let mut out = vec![0u8; self.batch_capacity(indices)?];
        let (n, raw) = self.read_batch_after(previous, indices, &mut out)?;
        out.truncate(n);
        Ok((out, raw))
    }

    /// True if the source still has the identity it had when it was scanned; a sender
    /// checks this after the transfer to report "source changed during the sync".
    pub fn unchanged(&self) -> bool {
        std::fs::metadata(&self.path)
            .map(|m| FileIdentity::of(&m) == self.identity)
            .unwrap_or(false)
    }
}
