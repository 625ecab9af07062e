//! Early placement: the receiver's half of overlapped phases (docs/protocol.md §4.15).
//!
//! A sender that streams its manifest (MANIFEST_STREAM frames, while it is still scanning)
//! lets the receiver start rebuilding before the manifest — and its root, which names the
//! temp file — is known. A `Prefill` takes the parts as they arrive, copies every chunk it
//! already has locally to its final offset in a provisional temp file, and proves each
//! copy by hashing it where it landed, exactly as [`Reconstruction::copy_local`] does.
//! When the whole manifest has arrived and checked out, [`Reconstruction::begin_with`]
//! adopts the file: placed chunks are neither copied again nor requested.
//!
//! A receiver with nothing local (no old file, no partial) also takes *early DATA*: chunk
//! records the sender sends right after each window's entries, since every chunk is then
//! proven missing. They are checked against the streamed entries (index, length, BLAKE3)
//! and written at their offsets, exactly like `Reconstruction::write_batch`.
//!
//! Nothing here is trusted for correctness: a part is checked only for being a well-formed
//! prefix of some manifest of the offered size; the adopting reconstruction compares the
//! placed chunks with the verified manifest and discards the whole prefill on any
//! difference. A copy that fails (a local file changed, a read error) just leaves its chunk
//! unplaced for the normal plan. The provisional file is removed unless adopted.
//!
//! [`Reconstruction::copy_local`]: crate::restore::Reconstruction::copy_local
//! [`Reconstruction::begin_with`]: crate::restore::Reconstruction::begin_with

use super::local_source::{LocalSource, MAX_RUN};
use super::staging::{clone_old_target, create_temp, has_resumable_partial_at, streaming_of};
use crate::beneath::Target;
use crate::chunk_batch;
use crate::chunker::{Chunk, Hash};
use crate::error::{CoreError, Result};
use crate::io::{copy_range_in_turn, hash_range, write_at};
use crate::manifest::{Manifest, ENTRY_LEN};
use crate::params::ChunkParams;
use rayon::prelude::*;
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

/// Where a placed chunk's bytes came from: (position in the local list, offset there).
pub type Anchor = (usize, u64);

/// What early placement did with one chunk of the streamed list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placed {
    No,
    /// Copied from a local file (or proven in place in a clone).
    Copied(Anchor),
    /// Received as early DATA.
    Received,
}

pub struct Prefill {
    temp: Target,
    /// Space reserved just ahead of the early DATA written (crate::io::reserve).
    reservation: crate::io::reserve::Reservation,
    /// Writeback started as data lands (crate::io::writeback), unless `--no-fsync`.
    writeback: crate::io::Writeback,
    /// One writer at a time into `file` (crate::io::write_turn).
    write_turn: crate::io::WriteTurn,
    file: Option<File>,
    size: u64,
    params: ChunkParams,
    /// Local files by their position in the list given to `new` (None: could not open).
    sources: Vec<Option<(PathBuf, File)>>,
    have: HashMap<Hash, (usize, u64, u32)>,
    /// The streamed entries so far (root unknown yet): what early DATA is checked against.
    view: Manifest,
    placed: Vec<Placed>,
    next_offset: u64,
    cloned: bool,
    placed_bytes: u64,
    /// Bytes of early DATA (all literal: early DATA never carries deltas).
    literal: u64,
}

/// A prefill handed over to the reconstruction (see module docs).
pub struct Prefilled {
    pub(crate) temp: Target,
    pub(crate) file: Option<File>,
    pub(crate) cloned: bool,
    pub(crate) chunks: Vec<Chunk>,
    pub(crate) placed: Vec<Placed>,
    pub(crate) source_paths: Vec<PathBuf>,
    /// Bytes of early DATA placed (literal data for RESULT).
    pub(crate) literal: u64,
}

impl Prefilled {
    /// The placed chunks describe exactly this manifest's chunk list.
    pub(crate) fn matches(&self, m: &Manifest) -> bool {
        self.chunks == m.chunks
    }

    /// Take the file for adoption (the caller renames it); the guard no longer removes it.
    pub(crate) fn take_file(&mut self) -> Option<File> {
        self.file.take()
    }
}

impl Drop for Prefilled {
    fn drop(&mut self) {
        if self.file.take().is_some() {
            let _ = self.temp.unlink();
        }
    }
}

impl Prefill {
    /// Start early placement into `target`'s provisional temp file for a file of `size`
    /// bytes (from `local`, and from early DATA). `None` when it could interfere: an empty
    /// file, or a partial of an earlier attempt that a resume should use instead.
    pub fn new(target: &Path, size: u64, local: Vec<LocalSource>) -> Result<Option<Prefill>> {
        let target = Target::from_user_path(target).map_err(|e| crate::CoreError::io(target, e))?;
        Self::new_at(&target, size, local, true)
    }

    /// As `new`, for a target resolved beneath a directory handle. `fsync`: the result will
    /// be made durable before it is committed (see [`crate::restore::BeginOptions::fsync`]),
    /// so writeback starts as data lands.
    pub fn new_at(target: &Target, size: u64, local: Vec<LocalSource>, fsync: bool) -> Result<Option<Prefill>> {
        if size == 0 {
            return Ok(None);
        }
        let temp = streaming_of(target);
        // A provisional file kept after a dropped connection (or any partial) is resumed by
        // the reconstruction instead (see `Reconstruction::begin_at`). Anything else at the
        // provisional name (a planted link) is left alone: no early placement then.
        if temp.lstat().ok().flatten().is_some() || has_resumable_partial_at(target) {
            return Ok(None);
        }
        let target_path = target.shown();
        let mut have = HashMap::new();
        let mut sources = Vec::new();
        for (k, src) in local.into_iter().enumerate() {
            // The old target through the directory handle (never a link); --from files by path.
            let opened = if src.path == target_path {
                target.open_read()
            } else {
                File::open(&src.path)
            };
            match opened {
                Ok(f) => {
                    for c in &src.manifest.chunks {
                        have.entry(c.hash).or_insert((k, c.offset, c.len));
                    }
                    sources.push(Some((src.path, f)));
                }
                Err(_) => sources.push(None),
            }
        }
        let old_target = match sources.first() {
            Some(Some((p, f))) if *p == target_path => Some(f),
            _ => None,
        };
        let (file, cloned) = match old_target
            .map(|f| clone_old_target(f, &temp, size))
            .transpose()?
            .flatten()
        {
            Some(f) => (f, true),
            None => (create_temp(&temp, size)?, false),
        };
        let params = ChunkParams::for_file_size(size);
        Ok(Some(Prefill {
            temp,
            reservation: crate::io::reserve::Reservation::new(size),
            writeback: crate::io::Writeback::new(fsync),
            write_turn: crate::io::WriteTurn::new(),
            file: Some(file),
            size,
            params,
            sources,
            have,
            view: Manifest {
                size,
                params,
                chunks: Vec::new(),
                root: [0; 32],
            },
            placed: Vec::new(),
            next_offset: 0,
            cloned,
            placed_bytes: 0,
            literal: 0,
        }))
    }

    /// Bytes placed so far (copied, or proven in place in a clone).
    pub fn placed_bytes(&self) -> u64 {
        self.placed_bytes
    }

    /// The next run of the sender's manifest entries (`len u32 | hash [32]` each, in
    /// order): places every chunk a local file has. Returns the bytes placed by this call.
    pub fn add_entries(&mut self, entries: &[u8]) -> Result<u64> {
        let bad = |r: String| CoreError::malformed("manifest part", r);
        if entries.len() % ENTRY_LEN != 0 {
            return Err(bad(format!("{} bytes is not a whole number of entries", entries.len())));
        }
        let first = self.view.chunks.len();
        let max_chunks = self.params.max_chunks(self.size);
        for e in entries.chunks_exact(ENTRY_LEN) {
            let len = u32::from_le_bytes(e[0..4].try_into().unwrap());
            if len == 0 || len > self.params.max {
                return Err(bad(format!("chunk length {len} is impossible")));
            }
            if self.next_offset + len as u64 > self.size || self.view.chunks.len() as u64 >= max_chunks {
                return Err(bad("the parts describe more than the offered file".into()));
            }
            let mut hash = [0u8; 32];
            hash.copy_from_slice(&e[4..]);
            self.view.chunks.push(Chunk {
                offset: self.next_offset,
                len,
                hash,
            });
            self.placed.push(Placed::No);
            self.next_offset += len as u64;
        }
        let Some(file) = self.file.as_ref() else {
            return Ok(0);
        };
        // Runs of chunks contiguous in both files, as in `copy_local`; in a clone, chunks
        // already at their offset in the old target only need proving.
        // (source, source offset, first chunk, count, bytes, prove only)
        let mut runs: Vec<(usize, u64, usize, usize, u64, bool)> = Vec::new();
        for i in first..self.view.chunks.len() {
            let c = self.view.chunks[i];
            let Some(&(source, offset, len)) = self.have.get(&c.hash) else {
                continue;
            };
            if len != c.len {
                continue;
            }
            let prove = self.cloned && source == 0 && offset == c.offset;
            match runs.last_mut() {
                Some(r) if r.0 == source && r.1 + r.4 == offset && r.2 + r.3 == i && r.4 < MAX_RUN && r.5 == prove => {
                    r.3 += 1;
                    r.4 += len as u64;
                }
                _ => runs.push((source, offset, i, 1, len as u64, prove)),
            }
        }
        let chunks = &self.view.chunks;
        let sources = &self.sources;
        let writeback = &self.writeback;
        let turn = &self.write_turn;
        let done: Vec<Vec<(usize, Anchor)>> = runs
            .par_iter()
            .map(|&(source, so, first, count, len, prove)| {
                let Some((_, src)) = sources[source].as_ref() else {
                    return Vec::new();
                };
                let doff = chunks[first].offset;
                // Copied one at a time, verified side by side (crate::io::write_turn).
                if !prove && copy_range_in_turn(src, so, file, doff, len, turn).is_err() {
                    return Vec::new();
                }
                let mut ok = Vec::with_capacity(count);
                let mut at = so;
                for (i, c) in chunks.iter().enumerate().skip(first).take(count) {
                    if hash_range(file, c.offset, c.len as usize).is_ok_and(|h| h == c.hash) {
                        ok.push((i, (source, at)));
                    }
                    at += c.len as u64;
                }
                if !prove {
                    writeback.wrote(file, doff, len);
                }
                ok
            })
            .collect();
        let mut bytes = 0;
        for (i, anchor) in done.into_iter().flatten() {
            self.placed[i] = Placed::Copied(anchor);
            bytes += self.view.chunks[i].len as u64;
        }
        self.placed_bytes += bytes;
        Ok(bytes)
    }

    /// Early DATA (a chunk batch, encodings raw or zstd, of chunks already streamed and not
    /// placed): each chunk is checked against its streamed BLAKE3 and written at its offset.
    /// Returns (chunks, raw bytes). Any bad record fails the whole batch (the sender's fault:
    /// exit 12); nothing of it is marked placed then.
    pub fn add_batch(&mut self, batch: &[u8]) -> Result<(u32, u64)> {
        let records = chunk_batch::decode(batch, &self.view)?;
        let mut seen = std::collections::HashSet::new();
        for r in &records {
            if r.is_delta() {
                return Err(CoreError::malformed(
                    "early DATA",
                    format!("chunk {} is a delta", r.index),
                ));
            }
            if self.placed[r.index as usize] != Placed::No || !seen.insert(r.index) {
                return Err(CoreError::malformed(
                    "early DATA",
                    format!("chunk {} was already placed", r.index),
                ));
            }
        }
        let file = self
            .file
            .as_ref()
            .ok_or_else(|| CoreError::Usage("early placement already handed over".into()))?;
        let view = &self.view;
        let writeback = &self.writeback;
        // Space just ahead of the data (crate::io::reserve): this batch's span. Reserving takes
        // the inode lock as a write does, so it waits for its turn too.
        let turn = &self.write_turn;
        let span = records.iter().map(|r| {
            let c = &view.chunks[r.index as usize];
            (c.offset, c.offset + c.len as u64)
        });
        if let (Some(first), Some(last)) = (span.clone().map(|s| s.0).min(), span.map(|s| s.1).max()) {
            turn.with(|| self.reservation.before_write(file, first, last))
                .map_err(|e| CoreError::io(self.temp.shown(), e))?;
        }
        // Hashed side by side, written one at a time (crate::io::write_turn).
        records.par_iter().try_for_each(|r| {
            let mut buf = Vec::new();
            let data = r.raw(&mut buf)?;
            let c = &view.chunks[r.index as usize];
            if blake3::hash(data).as_bytes() != &c.hash {
                return Err(CoreError::ChunkCorrupt {
                    index: r.index,
                    origin: "received from the peer",
                });
            }
            turn.with(|| write_at(file, data, c.offset))
                .map_err(|e| CoreError::io(self.temp.shown(), e))?;
            // Outside the turn: a full writeback window may wait for the disk here.
            writeback.wrote(file, c.offset, c.len as u64);
            Ok(())
        })?;
        let mut raw = 0;
        for r in &records {
            self.placed[r.index as usize] = Placed::Received;
            raw += r.raw_len as u64;
        }
        self.placed_bytes += raw;
        self.literal += raw;
        Ok((records.len() as u32, raw))
    }

    /// The connection dropped: keep the provisional file (what was placed stays placed) for
    /// the next attempt, which resumes from it once it knows the manifest.
    pub fn keep_for_resume(mut self) {
        if self.placed_bytes == 0 {
            return; // nothing worth keeping: Drop removes it
        }
        if let Some(f) = self.file.take() {
            // Best effort: the resume re-verifies every chunk it finds, so a lost write costs
            // that chunk again, never a wrong byte.
            let _ = f.sync_data();
        }
    }

    /// Hand the placed chunks to the reconstruction (which checks them against the final
    /// manifest before adopting anything).
    pub fn into_prefilled(mut self) -> Prefilled {
        Prefilled {
            temp: self.temp.clone(),
            file: self.file.take(),
            cloned: self.cloned,
            chunks: std::mem::take(&mut self.view.chunks),
            placed: std::mem::take(&mut self.placed),
            literal: self.literal,
            source_paths: self
                .sources
                .iter()
                .map(|s| s.as_ref().map(|(p, _)| p.clone()).unwrap_or_default())
                .collect(),
        }
    }
}

impl Drop for Prefill {
    fn drop(&mut self) {
        if self.file.take().is_some() {
            let _ = self.temp.unlink();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::restore::{streaming_path, BeginOptions, Reconstruction};
    use crate::scan::{scan_file, ScanOptions};
    use crate::testutil::pseudo_random;
    use std::fs;

    fn entries(m: &Manifest) -> Vec<u8> {
        m.encode()[crate::manifest::HEADER_LEN..].to_vec()
    }

    fn edited(old: &[u8]) -> Vec<u8> {
        let mut new = old.to_vec();
        new[3_000_000..3_065_536].copy_from_slice(&pseudo_random(65_536, 77));
        new.splice(9_000_000..9_000_000, pseudo_random(4096, 78));
        new.drain(14_000_000..14_008_192);
        new
    }

    #[test]
    fn placed_chunks_are_adopted_and_only_the_rest_is_requested() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("f.bin");
        let old = pseudo_random(20_000_000, 41);
        fs::write(&target, &old).unwrap();
        let new = edited(&old);
        let src = dir.path().join("new.bin");
        fs::write(&src, &new).unwrap();
        let sm = scan_file(&src, &ScanOptions::default()).unwrap().manifest;
        let lm = scan_file(&target, &ScanOptions::default()).unwrap().manifest;

        let local = || {
            vec![LocalSource {
                path: target.clone(),
                manifest: lm.clone(),
            }]
        };
        let mut pf = Prefill::new(&target, sm.size, local()).unwrap().unwrap();
        let all = entries(&sm);
        let cut = (sm.chunks.len() / 3) * ENTRY_LEN;
        let a = pf.add_entries(&all[..cut]).unwrap();
        let b = pf.add_entries(&all[cut..]).unwrap();
        assert!(a > 0 && b > 0);
        assert!(streaming_path(&target).exists());
        let placed = pf.placed_bytes();
        let r = Reconstruction::begin_with(
            &target,
            sm.clone(),
            local(),
            BeginOptions {
                prefill: Some(pf.into_prefilled()),
                ..Default::default()
            },
        )
        .unwrap();
        assert!(
            !streaming_path(&target).exists(),
            "the provisional file is adopted (renamed)"
        );
        let s = r.summary();
        assert_eq!(s.copy_bytes, placed, "everything local was placed early");
        assert_eq!(s.placed_bytes, placed);
        let wire: u64 = r.needed().iter().map(|&i| sm.chunks[i as usize].len as u64).sum();
        assert_eq!(wire + placed, sm.size);
        assert!(wire < 2_000_000, "only the edited chunks cross: {wire}");
        assert_eq!(r.copy_local().unwrap(), 0, "nothing left to copy");
        let policy = crate::chunk_batch::CompressPolicy::new(1);
        let mut batch = Vec::new();
        for i in r.needed() {
            let c = sm.chunks[i as usize];
            policy.encode_record(i, &new[c.offset as usize..c.end() as usize], &mut batch);
        }
        r.write_batch(&batch).unwrap();
        r.finish(None, None, None).unwrap();
        assert_eq!(fs::read(&target).unwrap(), new);
    }

    #[test]
    fn a_prefill_that_does_not_match_the_manifest_is_discarded() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("f.bin");
        let old = pseudo_random(6_000_000, 42);
        fs::write(&target, &old).unwrap();
        let new = edited(&pseudo_random(16_000_000, 42));
        let src = dir.path().join("new.bin");
        fs::write(&src, &new).unwrap();
        let sm = scan_file(&src, &ScanOptions::default()).unwrap().manifest;
        let lm = scan_file(&target, &ScanOptions::default()).unwrap().manifest;
        let local = vec![LocalSource {
            path: target.clone(),
            manifest: lm.clone(),
        }];
        // The parts announce the old file's chunks, the final manifest is another one.
        let mut pf = Prefill::new(&target, sm.size, local).unwrap().unwrap();
        pf.add_entries(&entries(&lm)).unwrap();
        let r = Reconstruction::begin_with(
            &target,
            sm.clone(),
            vec![LocalSource {
                path: target.clone(),
                manifest: lm,
            }],
            BeginOptions {
                prefill: Some(pf.into_prefilled()),
                ..Default::default()
            },
        )
        .unwrap();
        assert!(!streaming_path(&target).exists(), "a discarded prefill leaves no file");
        assert_eq!(r.summary().in_place_bytes, 0);
        r.abort(false);
    }

    #[test]
    fn parts_beyond_the_offered_size_or_malformed_are_refused_and_clean_up() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("f.bin");
        fs::write(&target, pseudo_random(3_000_000, 43)).unwrap();
        let lm = scan_file(&target, &ScanOptions::default()).unwrap().manifest;
        let local = || {
            vec![LocalSource {
                path: target.clone(),
                manifest: lm.clone(),
            }]
        };
        let mut pf = Prefill::new(&target, 1_000_000, local()).unwrap().unwrap();
        let e = pf.add_entries(&entries(&lm)).err().unwrap();
        assert_eq!(e.code(), "EMALFORMED", "{e}");
        // While a provisional file exists (this one, or one kept for a resume) no second
        // placement starts.
        assert!(Prefill::new(&target, 3_000_000, local()).unwrap().is_none());
        drop(pf);
        assert!(!streaming_path(&target).exists());
        let mut pf2 = Prefill::new(&target, 3_000_000, local()).unwrap().unwrap();
        assert!(pf2.add_entries(&[0u8; 35]).is_err());
        let mut zero = vec![0u8; ENTRY_LEN];
        zero[0..4].copy_from_slice(&0u32.to_le_bytes());
        assert!(pf2.add_entries(&zero).is_err());
        drop(pf2);
        assert!(!streaming_path(&target).exists());
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1, "only the target remains");
    }

    #[test]
    fn a_resumable_partial_wins_over_early_placement() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("f.bin");
        fs::write(&target, pseudo_random(3_000_000, 44)).unwrap();
        let lm = scan_file(&target, &ScanOptions::default()).unwrap().manifest;
        let partial = crate::restore::partial_path(&target, &[7u8; 32]);
        fs::write(&partial, b"earlier attempt").unwrap();
        let local = vec![LocalSource {
            path: target.clone(),
            manifest: lm,
        }];
        assert!(Prefill::new(&target, 3_000_000, local).unwrap().is_none());
        assert!(partial.exists());
    }

    #[test]
    fn early_data_with_nothing_local_is_verified_placed_and_adopted() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("f.bin");
        let data = pseudo_random(20_000_000, 45);
        let src = dir.path().join("src.bin");
        fs::write(&src, &data).unwrap();
        let m = scan_file(&src, &ScanOptions::default()).unwrap().manifest;
        let mut pf = Prefill::new(&target, m.size, Vec::new()).unwrap().unwrap();
        let half = m.chunks.len() / 2;
        pf.add_entries(&entries(&m)[..half * ENTRY_LEN]).unwrap();
        let policy = crate::chunk_batch::CompressPolicy::new(1);
        let recs: Vec<(u32, &[u8])> = (0..half)
            .map(|i| (i as u32, &data[m.chunks[i].offset as usize..m.chunks[i].end() as usize]))
            .collect();
        // A corrupted chunk fails the whole batch and places nothing.
        let mut bad = policy.encode_batch(&recs[..2]);
        let last = bad.len() - 1;
        bad[last] ^= 1;
        assert!(pf.add_batch(&bad).is_err());
        // A chunk not streamed yet is out of range.
        let c = m.chunks[half];
        let ahead = policy.encode_batch(&[(half as u32, &data[c.offset as usize..c.end() as usize])]);
        assert!(pf.add_batch(&ahead).is_err());
        let (n, raw) = pf.add_batch(&policy.encode_batch(&recs)).unwrap();
        assert_eq!(n as usize, half);
        assert_eq!(raw, m.chunks[half].offset);
        // The same chunk twice is refused.
        assert!(pf.add_batch(&policy.encode_batch(&recs[..1])).is_err());
        pf.add_entries(&entries(&m)[half * ENTRY_LEN..]).unwrap();
        let r = Reconstruction::begin_with(
            &target,
            m.clone(),
            Vec::new(),
            BeginOptions {
                prefill: Some(pf.into_prefilled()),
                ..Default::default()
            },
        )
        .unwrap();
        let needed = r.needed();
        assert_eq!(
            needed.len(),
            m.chunks.len() - half,
            "early chunks are not requested again"
        );
        assert_eq!(r.literal_bytes(), raw, "early DATA is literal data of the transfer");
        let mut batch = Vec::new();
        for i in needed {
            let c = m.chunks[i as usize];
            policy.encode_record(i, &data[c.offset as usize..c.end() as usize], &mut batch);
        }
        r.write_batch(&batch).unwrap();
        r.finish(None, None, None).unwrap();
        assert_eq!(fs::read(&target).unwrap(), data);
        assert_eq!(r.literal_bytes(), m.size);
    }
}
