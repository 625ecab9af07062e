//! The restorer: builds the sender's version of a file beside the target, out of place.
//!
//! 1. `begin` creates (or, to resume, reopens) a pre-sized temp file
//!    `.<name>.<root prefix>.ffsync-part` in the target's directory and plans where each of
//!    the sender's chunks comes from: already in place in a resumed partial, copied from a
//!    local file that has it (the old target, `--from` files), or over the wire.
//! 2. `copy_local` copies local chunks with in-kernel range copies; `write_batch` checks
//!    each received chunk's BLAKE3 against the sender's manifest and writes it positionally.
//!    Each copied run is re-read from the temp file and hashed right after the copy.
//! 3. `finish` checks that every chunk was proven (copied runs after copying, received
//!    chunks from the very buffers that were written, resumed chunks when they were found):
//!    every chunk of the result then matches the sender's manifest, whose root equals the
//!    sender's root.
//!    Only then is the temp file fsynced and renamed over the target, and the directory
//!    fsynced. Any failure leaves the target untouched. Writeback of the temp file starts
//!    while data lands ([`crate::io::writeback`]), so that fsync finds little left. Without
//!    `fsync` (`--no-fsync`) the verified file is renamed straight from the page cache.

use super::durable::*;
use super::local_source::{LocalSource, MAX_RUN};
use super::prefill::Prefilled;
use super::staging::*;
use crate::beneath::Target;
use crate::chunker::Hash;
use crate::error::{CoreError, Result};
use crate::file_identity::FileIdentity;
use crate::io::{copy_range_in_turn, hash_range, PositionalWriter};
use crate::manifest::Manifest;
use crate::refine::{self, RefineRun};
use crate::sparse::Hole;
use crate::{chunk_batch, index};
use rayon::prelude::*;
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// Decompression buffers kept for reuse (each up to one chunk, 1 MiB).
const SCRATCH_POOL: usize = 64;

/// Options of [`Reconstruction::begin_with`].
pub struct BeginOptions {
    /// The sender's holes (validated with [`crate::sparse::decode`]): chunks inside them
    /// are not requested, and the holes are punched into the result before it is verified
    /// and committed.
    pub holes: Vec<Hole>,
    /// Write into the target itself (changed ranges only) through a redo journal, instead of
    /// renaming a full copy over it. Ignored when the target is not an existing regular file.
    pub inplace: bool,
    /// Chunks placed early while the manifest streamed in ([`crate::prefill`]): adopted
    /// when they describe this very manifest (and no resumable partial exists), else dropped.
    pub prefill: Option<Prefilled>,
    /// Make the result durable before it is renamed into place (fsync the temp file, then
    /// the directory), starting writeback while data lands. `false` (`--no-fsync`): the
    /// verified result is renamed with its data still in the page cache (rsync's default
    /// trade-off). `--inplace` keeps its journal's fsyncs either way.
    pub fsync: bool,
    /// rsync's -b: the file the result replaces is moved to its backup name just before the
    /// rename, with its path relative to the destination root (for --backup-dir). Not with
    /// `inplace` (the shell refuses the combination).
    pub backup: Option<(std::sync::Arc<crate::backup::Backup>, Vec<u8>)>,
    /// The sender's own file, readable here (a local sync: both peers in one process). The
    /// chunks the plan would ask for are copied from it first (see [`PeerCopy`]).
    pub peer_copy: Option<PeerCopy>,
}

/// The file the sender scanned, on this machine (a local sync, decisions §111): the manifest
/// describes it, so each chunk the plan would ask for sits at its own offset there. `begin`
/// copies those chunks from it in the kernel and proves each by its hash where it landed;
/// a chunk that does not match (the file changed after the sender hashed it) or cannot be
/// read stays on the wire, so the sender's own checks decide what happens to a file that
/// changed, exactly as without the copy. (`begin` reports no progress while it copies: the
/// transfer's ticker starts when it returns.)
#[derive(Clone, Debug)]
pub struct PeerCopy {
    /// The sender's root (a tree) under which `path` is resolved without following any link;
    /// None: `path` is the file the user named, opened as named (links followed, as the sender
    /// reads it).
    pub root: Option<PathBuf>,
    pub path: PathBuf,
    /// The modification time the sender listed for it (when its manifest carries one: not
    /// without `-t`): a file with another is not used.
    pub mtime_ns: Option<i64>,
}

impl Default for BeginOptions {
    fn default() -> Self {
        BeginOptions {
            holes: Vec::new(),
            inplace: false,
            prefill: None,
            fsync: true,
            backup: None,
            peer_copy: None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Origin {
    Wire,
    Copy {
        source: usize,
        offset: u64,
    },
    InPlace,
    /// Inside one of the sender's holes and all zeros: punched, never sent or written.
    Hole,
    /// `--inplace`: already at its offset in the target itself (proven by hash).
    InTarget,
    /// Placed early, while the manifest streamed in (proven by hash where it landed),
    /// from `source` at `offset` (None: that file is not among our sources now).
    Placed {
        anchor: Option<(usize, u64)>,
    },
    /// Copied from the sender's own file in `begin` and proven by hash where it landed
    /// ([`PeerCopy`]).
    PeerCopy,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PlanSummary {
    pub chunks: u32,
    pub wire_chunks: u32,
    pub wire_bytes: u64,
    pub copy_bytes: u64,
    /// Of `copy_bytes`, those placed early, while the manifest streamed in (already written).
    pub placed_bytes: u64,
    pub in_place_bytes: u64,
    /// Chunks inside the sender's holes: recreated as holes, never sent.
    pub hole_bytes: u64,
    /// The temp file is a reflink clone of the old target: `in_place_bytes` includes the
    /// unchanged ranges it shares, which are never written.
    pub cloned: bool,
    /// `--inplace`: the temp file only stages what changed; `in_place_bytes` stay in the
    /// target untouched.
    pub inplace: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Open,
    Finished,
    Aborted,
}

pub struct Reconstruction {
    /// Where the result goes: a directory handle resolved without following links, and a name.
    target: Target,
    /// The partial, a sibling of the target in the same directory handle.
    temp: Target,
    file: File,
    manifest: Manifest,
    sources: Vec<(PathBuf, File)>,
    /// Each source's stat identity when it was opened: a delta chunk that fails its hash
    /// is blamed on the old file if that changed meanwhile (see `write_claimed`).
    opened_as: Vec<Option<FileIdentity>>,
    /// Read-only maps of the sources, made when refinement needs their old bytes.
    maps: Vec<OnceLock<Option<memmap2::Mmap>>>,
    /// Runs described to the sender by `refinement` (chunks that may arrive as deltas).
    refined: OnceLock<Vec<RefineRun>>,
    /// The temp file started as a copy-on-write clone of the old target.
    cloned: bool,
    /// The sender's holes, punched into the result in `finish`.
    holes: Vec<Hole>,
    /// `--inplace`: `temp` stages the changed chunks; `finish` commits them into the target
    /// through a redo journal ([`crate::inplace`]).
    inplace: bool,
    origins: Vec<Origin>,
    received: Mutex<Vec<bool>>,
    writer: PositionalWriter,
    /// One writer at a time into `file`, copies and received batches alike
    /// (crate::io::write_turn).
    write_turn: crate::io::WriteTurn,
    /// Space reserved just ahead of the data written (crate::io::reserve).
    reservation: crate::io::reserve::Reservation,
    /// Fsync before the rename (see [`BeginOptions::fsync`]).
    fsync: bool,
    /// See [`BeginOptions::backup`].
    backup: Option<(std::sync::Arc<crate::backup::Backup>, Vec<u8>)>,
    /// Writeback started as data lands (crate::io::writeback).
    writeback: crate::io::Writeback,
    /// Decompression buffers reused across batches.
    scratch: Mutex<Vec<Vec<u8>>>,
    state: Mutex<State>,
    /// Bytes placed in the temp file so far (copied or received), for progress.
    pub written: AtomicU64,
    /// Of the received chunks' bytes, those that crossed as literals (a delta's copies
    /// from the old bytes are not literal): rsync's "literal data".
    literal: AtomicU64,
    /// Copied chunks whose bytes in the temp file were hashed and matched.
    copied_ok: AtomicU64,
    /// Set when a batch or a copy failed after claiming its chunks: the temp file may hold
    /// unverified bytes, so `finish` must refuse.
    poisoned: std::sync::atomic::AtomicBool,
    /// Batches and copies running right now; `finish` refuses while any is in flight.
    in_flight: std::sync::atomic::AtomicUsize,
    /// Tickets handed out to DATA frames in the order they arrived (see [`Self::ticket`]).
    tickets: AtomicU64,
    /// The last DATA frame written whole: its ticket (0: none yet) and its chunks in its
    /// records' order, the history a frame that refers to it decodes with (`BATCH_PREFIX`).
    last_frame: Mutex<(u64, Vec<u32>)>,
}

fn range(m: &Manifest, i: usize) -> (u64, usize) {
    let c = &m.chunks[i];
    (c.offset, c.len as usize)
}

thread_local! {
    static DELTA_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Reconstruction {
    /// Whatever is at `target` now (nothing, a file, or — in a tree session — a directory
    /// or link that the commit will replace) is not touched until `finish`.
    pub fn begin(target: &Path, manifest: Manifest, local: Vec<LocalSource>) -> Result<Reconstruction> {
        Self::begin_with(target, manifest, local, BeginOptions::default())
    }

    /// As `begin`, with the sender's holes and/or `--inplace` (see [`BeginOptions`]). An
    /// interrupted in-place commit of `target` is completed (or reported) first.
    pub fn begin_with(
        target: &Path,
        manifest: Manifest,
        local: Vec<LocalSource>,
        opts: BeginOptions,
    ) -> Result<Reconstruction> {
        let target = Target::from_user_path(target).map_err(|e| CoreError::io(target, e))?;
        Self::begin_at(target, manifest, local, opts)
    }

    /// As `begin_with`, for a target whose directory was resolved beneath a handle (a
    /// tree's root): every file operation of the reconstruction stays in that directory.
    pub fn begin_at(
        target: Target,
        manifest: Manifest,
        local: Vec<LocalSource>,
        opts: BeginOptions,
    ) -> Result<Reconstruction> {
        crate::restore::inplace::recover_at(&target)?;
        let BeginOptions {
            holes,
            inplace,
            prefill,
            fsync,
            backup,
            peer_copy,
        } = opts;
        let temp = partial_of(&target, &manifest.root);
        let exists = |t: &Target| t.lstat().ok().flatten().is_some();
        // Early placement is adopted only for this very manifest, and never over a partial
        // that a resume should use (dropping it removes its file).
        let mut prefill = prefill.filter(|p| p.matches(&manifest) && !inplace);
        if exists(&temp) {
            prefill = None;
        }
        let adopted = match prefill.as_mut().and_then(|p| p.take_file()) {
            Some(f) => {
                let from = &prefill.as_ref().unwrap().temp;
                from.rename_to(&temp).map_err(|e| {
                    let _ = from.unlink();
                    CoreError::io(temp.shown(), e)
                })?;
                Some(f)
            }
            None => None,
        };
        if adopted.is_none() && prefill.is_none() && !exists(&temp) {
            // What an interrupted streamed attempt placed (kept as `.streaming`) is resumed
            // like a partial of this version: every chunk in it is re-verified below.
            let kept = streaming_of(&target);
            if kept.lstat().ok().flatten().is_some_and(|m| m.is_file()) {
                let _ = kept.rename_to(&temp);
            }
        }
        remove_stale_partials(&target, &temp);

        let mut origins = vec![Origin::Wire; manifest.chunks.len()];
        let mut temp = temp;
        let resumed = match adopted {
            Some(_) => None,
            None => open_resumable(&mut temp, manifest.size)?,
        };
        let resumed = match resumed {
            Some(file) => {
                // Resume: chunks already present in the partial stay where they are.
                let present: Vec<bool> = (0..manifest.chunks.len())
                    .into_par_iter()
                    .map(|i| {
                        let (off, len) = range(&manifest, i);
                        hash_range(&file, off, len)
                            .map(|h| h == manifest.chunks[i].hash)
                            .unwrap_or(false)
                    })
                    .collect();
                for (o, p) in origins.iter_mut().zip(present) {
                    if p {
                        *o = Origin::InPlace;
                    }
                }
                Some(file)
            }
            None => None,
        };

        let mut sources = Vec::new();
        let mut have: HashMap<Hash, (usize, u64)> = HashMap::new();
        let target_path = target.shown();
        let mut first_is_target = false;
        for src in local {
            // The old target is opened through the directory handle, never through a link;
            // other local sources (`--from` files) are the local user's own paths.
            let is_target = src.path == target_path;
            let opened = if is_target {
                target.open_read()
            } else {
                File::open(&src.path)
            };
            let Ok(f) = opened else {
                continue;
            };
            if sources.is_empty() {
                first_is_target = is_target;
            }
            let id = sources.len();
            for c in &src.manifest.chunks {
                have.entry(c.hash).or_insert((id, c.offset));
            }
            sources.push((src.path, f));
        }
        if let (Some(p), Some(_)) = (&prefill, &adopted) {
            for (o, placed) in origins.iter_mut().zip(&p.placed) {
                match *placed {
                    crate::restore::prefill::Placed::Copied((k, offset)) => {
                        // The anchor names a position in the local list; ours skips files
                        // that could not be opened.
                        let path = &p.source_paths[k];
                        let source = sources.iter().position(|(sp, _)| sp == path);
                        *o = Origin::Placed {
                            anchor: source.map(|s| (s, offset)),
                        };
                    }
                    crate::restore::prefill::Placed::Received => *o = Origin::Placed { anchor: None },
                    crate::restore::prefill::Placed::No => {}
                }
            }
        }
        for (o, c) in origins.iter_mut().zip(&manifest.chunks) {
            if *o == Origin::Wire {
                if let Some(&(source, offset)) = have.get(&c.hash) {
                    *o = Origin::Copy { source, offset };
                }
            }
        }
        // In place only over a regular file that is our first source (the old target).
        // The old target itself, when it is our first local source (clone and in-place need it).
        let old_target = sources.first().filter(|_| first_is_target).map(|(_, f)| f);
        let inplace = inplace && old_target.is_some() && target.lstat().ok().flatten().is_some_and(|m| m.is_file());
        let holes = if inplace { Vec::new() } else { holes };
        mark_holes(&manifest, &holes, &mut origins);
        let prefill_cloned = prefill.as_ref().is_some_and(|p| p.cloned);
        // Early DATA counts as literal data of this transfer (only if adopted).
        let early_literal = match (&prefill, &adopted) {
            (Some(p), Some(_)) => p.literal,
            _ => 0,
        };
        let (file, cloned) = match (resumed, adopted) {
            (_, Some(f)) => (f, prefill_cloned),
            (Some(f), None) => (f, false),
            (None, None) if inplace => (create_staging(&temp, manifest.size)?, false),
            (None, None) => match old_target
                .map(|old| clone_old_target(old, &temp, manifest.size))
                .transpose()?
                .flatten()
            {
                Some(f) => (f, true),
                None => (create_temp(&temp, manifest.size)?, false),
            },
        };
        if let Some(old) = old_target.filter(|_| inplace) {
            // Chunks already at their offset in the target stay there, untouched.
            prove_unmoved(&manifest, &mut origins, old, Origin::InTarget);
        }
        if cloned {
            // The temp file already holds the old target: chunks that sit at the same offset
            // in both versions need no write at all, once their bytes are proven.
            prove_unmoved(&manifest, &mut origins, &file, Origin::InPlace);
        }
        let n = manifest.chunks.len();
        let maps = sources.iter().map(|_| OnceLock::new()).collect();
        let opened_as = sources
            .iter()
            .map(|(_, f)| f.metadata().ok().map(|m| FileIdentity::of(&m)))
            .collect();
        let size = manifest.size;
        let mut rec = Reconstruction {
            target,
            temp,
            file,
            manifest,
            sources,
            opened_as,
            maps,
            refined: OnceLock::new(),
            cloned,
            holes,
            inplace,
            origins,
            received: Mutex::new(vec![false; n]),
            writer: PositionalWriter::new(),
            write_turn: crate::io::WriteTurn::new(),
            reservation: crate::io::reserve::Reservation::new(size),
            fsync,
            backup,
            writeback: crate::io::Writeback::new(fsync),
            scratch: Mutex::new(Vec::new()),
            state: Mutex::new(State::Open),
            written: AtomicU64::new(0),
            literal: AtomicU64::new(early_literal),
            copied_ok: AtomicU64::new(0),
            poisoned: std::sync::atomic::AtomicBool::new(false),
            in_flight: std::sync::atomic::AtomicUsize::new(0),
            tickets: AtomicU64::new(0),
            last_frame: Mutex::new((0, Vec::new())),
        };
        if let Some(pc) = peer_copy {
            rec.take_from_peer_copy(&pc);
        }
        Ok(rec)
    }

    /// Copy the chunks still to come over the wire from the sender's own file ([`PeerCopy`]),
    /// in runs of adjacent chunks, each chunk then hashed where it landed. A chunk proven so is
    /// no longer asked for; any other stays on the wire (its bytes in the temp file are written
    /// again when it arrives, and only those are trusted). Nothing here fails the transfer: the
    /// wire is always there to fall back on.
    fn take_from_peer_copy(&mut self, pc: &PeerCopy) {
        // Beneath a tree's root no link is followed; a single file is opened as the user named it,
        // links and all, as the sender itself reads it.
        let opened = match &pc.root {
            Some(root) => Target::resolve(Some(root), &pc.path).and_then(|t| t.open_read()),
            None => File::open(&pc.path),
        };
        let Ok(file) = opened else {
            return;
        };
        let Ok(meta) = file.metadata() else {
            return;
        };
        let id = FileIdentity::of(&meta);
        if !meta.is_file() || id.size != self.manifest.size || pc.mtime_ns.is_some_and(|m| m != id.mtime_ns) {
            return;
        }
        // (first chunk, chunk count, offset, length): chunks of a manifest are contiguous, so
        // adjacent wire chunks are one range, at the same offset in both files.
        let mut runs: Vec<(usize, usize, u64, u64)> = Vec::new();
        for (i, (o, c)) in self.origins.iter().zip(&self.manifest.chunks).enumerate() {
            if *o != Origin::Wire {
                continue;
            }
            match runs.last_mut() {
                Some(r) if r.0 + r.1 == i && r.3 < MAX_RUN => {
                    r.1 += 1;
                    r.3 += c.len as u64;
                }
                _ => runs.push((i, 1, c.offset, c.len as u64)),
            }
        }
        // A copy that fails (a full disk, a read error) ends the attempt: what is left crosses, and
        // the wire's writes report what they meet.
        let failed = AtomicBool::new(false);
        let proven: Vec<Vec<usize>> = runs
            .par_iter()
            .map(|&(first, count, off, len)| {
                if failed.load(Ordering::Relaxed) {
                    return Vec::new();
                }
                if copy_range_in_turn(&file, off, &self.file, off, len, &self.write_turn).is_err() {
                    failed.store(true, Ordering::Relaxed);
                    return Vec::new();
                }
                self.writeback.wrote(&self.file, off, len);
                let ok: Vec<usize> = (first..first + count)
                    .filter(|&i| {
                        let (o, l) = range(&self.manifest, i);
                        hash_range(&self.file, o, l).is_ok_and(|h| h == self.manifest.chunks[i].hash)
                    })
                    .collect();
                let bytes: u64 = ok.iter().map(|&i| self.manifest.chunks[i].len as u64).sum();
                self.written.fetch_add(bytes, Ordering::Relaxed);
                // The sender's data, not the receiver's old bytes: literal, as if it had
                // crossed (rsync counts a local whole-file copy so too).
                self.literal.fetch_add(bytes, Ordering::Relaxed);
                ok
            })
            .collect();
        for i in proven.into_iter().flatten() {
            self.origins[i] = Origin::PeerCopy;
        }
    }

    /// Bytes of received chunks that crossed as literal data (see `literal`).
    pub fn literal_bytes(&self) -> u64 {
        self.literal.load(Ordering::Relaxed)
    }

    /// Bytes whose writeback was started while data landed (0 without fsync, and off Linux).
    pub fn writeback_started(&self) -> u64 {
        self.writeback.covered()
    }

    pub fn temp_path(&self) -> PathBuf {
        self.temp.shown()
    }

    pub fn writer_backend(&self) -> &'static str {
        self.writer.backend()
    }

    pub fn summary(&self) -> PlanSummary {
        let mut s = PlanSummary {
            chunks: self.origins.len() as u32,
            cloned: self.cloned,
            inplace: self.inplace,
            ..Default::default()
        };
        for (o, c) in self.origins.iter().zip(&self.manifest.chunks) {
            match o {
                Origin::Wire => {
                    s.wire_chunks += 1;
                    s.wire_bytes += c.len as u64;
                }
                Origin::Copy { .. } | Origin::PeerCopy => s.copy_bytes += c.len as u64,
                Origin::Placed { .. } => {
                    s.copy_bytes += c.len as u64;
                    s.placed_bytes += c.len as u64;
                }
                Origin::InPlace => s.in_place_bytes += c.len as u64,
                Origin::Hole => s.hole_bytes += c.len as u64,
                Origin::InTarget => s.in_place_bytes += c.len as u64,
            }
        }
        s
    }

    /// Indices of the chunks that must come over the wire, ascending.
    pub fn needed(&self) -> Vec<u32> {
        self.origins
            .iter()
            .enumerate()
            .filter(|(_, o)| **o == Origin::Wire)
            .map(|(i, _)| i as u32)
            .collect()
    }

    /// Source `k` mapped read-only (None if it cannot be mapped: then it is not refined against).
    fn map_of(&self, k: usize) -> Option<&[u8]> {
        self.maps[k]
            .get_or_init(|| {
                // Safety: read-only map of a file we only read; if another process
                // truncates it meanwhile, reads fault — the same exposure the scanner has,
                // and any changed byte fails the chunk's hash check.
                unsafe { memmap2::Mmap::map(&self.sources[k].1) }.ok()
            })
            .as_deref()
    }

    /// Sub-chunk refinement (see [`crate::refine`]): signatures of the old bytes each run
    /// of missing chunks replaced, as the wire table for REFINE frames. Call once, after
    /// `begin`; chunks in the described runs may then arrive as deltas.
    pub fn refinement(&self) -> Result<Vec<u8>> {
        self.check_open()?;
        let wire: Vec<bool> = self.origins.iter().map(|o| *o == Origin::Wire).collect();
        let anchor: Vec<Option<(usize, u64)>> = self
            .origins
            .iter()
            .zip(&self.manifest.chunks)
            .map(|(o, c)| match *o {
                Origin::Copy { source, offset } => Some((source, offset)),
                Origin::Placed { anchor } => anchor,
                // Unmoved chunks of the old target: in the target itself (`--inplace`) or in
                // its clone (every in-place chunk of a cloned temp file came from there).
                Origin::InTarget => Some((0, c.offset)),
                Origin::InPlace if self.cloned => Some((0, c.offset)),
                _ => None,
            })
            .collect();
        let lens: Vec<u64> = self
            .sources
            .iter()
            .map(|(_, f)| f.metadata().map(|m| m.len()).unwrap_or(0))
            .collect();
        let runs = refine::plan_runs(&self.manifest, &wire, &anchor, &lens);
        let (table, kept) = refine::encode_table(&runs, self.manifest.params.avg, |r| self.region(r));
        // The signatures are made: the old bytes need not stay resident (a 30 MB binary's
        // would otherwise count in this process's RSS to the end). Deltas fault back in just
        // the runs they rebuild from.
        for map in self.maps.iter().filter_map(|m| m.get()).flatten() {
            crate::scan::release_mapped(map, 0, map.len());
        }
        self.refined
            .set(kept)
            .map_err(|_| CoreError::Usage("refinement already computed".into()))?;
        Ok(table)
    }

    fn region(&self, r: &RefineRun) -> Option<&[u8]> {
        let map = self.map_of(r.source)?;
        map.get(r.offset as usize..(r.offset + r.len) as usize)
    }

    /// Rebuild a delta record's chunk into `out` from the old bytes of its run. Returns how
    /// many of its bytes came as literals.
    fn apply_delta(&self, r: &chunk_batch::Record, out: &mut Vec<u8>) -> Result<u64> {
        let run = self.refined_run(r.index).ok_or_else(|| {
            CoreError::malformed(
                "chunk batch",
                format!("chunk {} is a delta but was not refined", r.index),
            )
        })?;
        let base = self.region(run).ok_or_else(|| {
            CoreError::VerifyFailed(format!(
                "{} changed during the sync",
                self.sources[run.source].0.display()
            ))
        })?;
        let applied = DELTA_BUF.with(|d| {
            let mut d = d.borrow_mut();
            let delta = r.delta(&mut d)?;
            refine::apply_into(base, delta, r.raw_len as usize, out)?;
            Ok(crate::rsync_delta::literal_len(delta)
                .unwrap_or(r.raw_len as u64)
                .min(r.raw_len as u64))
        });
        // The run's last chunk: its old bytes are done with (an earlier chunk arriving later
        // only faults its pages back in).
        if r.index + 1 == run.first + run.count {
            if let Some(Some(map)) = self.maps[run.source].get() {
                crate::scan::release_mapped(map, run.offset as usize, (run.offset + run.len) as usize);
            }
        }
        applied
    }

    /// The refined run (described old bytes) that chunk `index` belongs to.
    fn refined_run(&self, index: u32) -> Option<&RefineRun> {
        let runs = self.refined.get().map(|v| &v[..]).unwrap_or(&[]);
        let k = runs.partition_point(|run| run.first <= index);
        k.checked_sub(1)
            .map(|k| &runs[k])
            .filter(|run| index < run.first + run.count)
    }

    /// The old file a delta chunk was rebuilt from, if it changed since it was opened (its
    /// stat identity, through the open descriptor). A write within the same timestamp tick
    /// goes unseen; the chunk then still fails, as "received from the peer".
    fn changed_delta_base(&self, index: u32) -> Option<&Path> {
        let run = self.refined_run(index)?;
        let (path, f) = &self.sources[run.source];
        let now = f.metadata().ok().map(|m| FileIdentity::of(&m));
        (now != self.opened_as[run.source]).then_some(path.as_path())
    }

    fn check_open(&self) -> Result<()> {
        match *self.state.lock().unwrap() {
            State::Open => Ok(()),
            s => Err(CoreError::Usage(format!("reconstruction already {s:?}"))),
        }
    }

    /// Copy every locally available chunk into place. Adjacent chunks are merged into
    /// runs (a mostly unchanged file costs a handful of in-kernel copies); each run is
    /// verified right after it is copied, by hashing its chunks as they now sit in the temp
    /// file (hot in cache), and handed to writeback early so the final fsync has less to do.
    pub fn copy_local(&self) -> Result<u64> {
        self.check_open()?;
        let _guard = InFlight::enter(&self.in_flight);
        let out = self.copy_local_inner();
        if out.is_err() {
            self.poisoned.store(true, Ordering::SeqCst);
        }
        out
    }

    fn copy_local_inner(&self) -> Result<u64> {
        // (source, src_off, first chunk, chunk count, len)
        let mut runs: Vec<(usize, u64, usize, usize, u64)> = Vec::new();
        for (i, (o, c)) in self.origins.iter().zip(&self.manifest.chunks).enumerate() {
            if let Origin::Copy { source, offset } = *o {
                match runs.last_mut() {
                    Some(r) if r.0 == source && r.1 + r.4 == offset && r.2 + r.3 == i && r.4 < MAX_RUN => {
                        r.3 += 1;
                        r.4 += c.len as u64;
                    }
                    _ => runs.push((source, offset, i, 1, c.len as u64)),
                }
            }
        }
        runs.par_iter().try_for_each(|&(source, so, first, count, len)| {
            let (path, f) = &self.sources[source];
            let doff = self.manifest.chunks[first].offset;
            // Copied one at a time, verified side by side (crate::io::write_turn).
            let copied = copy_range_in_turn(f, so, &self.file, doff, len, &self.write_turn);
            copied.map_err(|e| {
                if e.kind() == std::io::ErrorKind::UnexpectedEof {
                    CoreError::VerifyFailed(format!("{} changed during the sync", path.display()))
                } else {
                    CoreError::io(self.temp.shown(), e)
                }
            })?;
            for i in first..first + count {
                let (off, clen) = range(&self.manifest, i);
                let h = hash_range(&self.file, off, clen).map_err(|e| CoreError::io(self.temp.shown(), e))?;
                if h != self.manifest.chunks[i].hash {
                    return Err(CoreError::VerifyFailed(format!(
                        "chunk {i} copied from {} does not match (was it modified during the sync?)",
                        path.display()
                    )));
                }
            }
            self.writeback.wrote(&self.file, doff, len);
            self.copied_ok.fetch_add(count as u64, Ordering::Relaxed);
            self.written.fetch_add(len, Ordering::Relaxed);
            Ok(())
        })?;
        Ok(runs.iter().map(|r| r.4).sum())
    }

    /// Verify and write one batch of received chunks. Returns raw bytes written.
    pub fn write_batch(&self, batch: &[u8]) -> Result<u64> {
        self.write_frame(batch, self.ticket())
    }

    /// The next DATA frame's place in the transfer, taken when the frame arrives (on the
    /// thread that reads the connection, so tickets follow the wire's order even when the
    /// frames are then written side by side).
    pub fn ticket(&self) -> u64 {
        self.tickets.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// [`Self::write_batch`] for the frame that drew `ticket`. A frame whose records refer
    /// to the previous frame (`BATCH_PREFIX`) is written only after that one was written
    /// whole (the caller waits for it): its history is read back from the temp file.
    pub fn write_frame(&self, batch: &[u8], ticket: u64) -> Result<u64> {
        self.check_open()?;
        let _guard = InFlight::enter(&self.in_flight);
        // A batch refused before it claims anything leaves the reconstruction usable.
        let records = chunk_batch::decode_after(batch, &self.manifest, || self.previous_frame(ticket))?;
        self.claim(&records)?;
        let out = self.write_claimed(&records);
        match &out {
            Ok(_) => {
                let mut last = self.last_frame.lock().unwrap();
                if ticket > last.0 {
                    *last = (ticket, records.iter().map(|r| r.index).collect());
                }
            }
            // Chunks were claimed and may be missing or half-written (a delta that does
            // not apply, a chunk that fails its hash, a write error): nothing may be
            // committed now.
            Err(_) => self.poisoned.store(true, Ordering::SeqCst),
        }
        out
    }

    /// The raw bytes of the frame before `ticket`'s (those of its history chunks), read back
    /// from the temp file and checked against the manifest again (the file is ours, but it is
    /// on a disk others can write). None when `ticket` is the first frame.
    fn previous_frame(&self, ticket: u64) -> Result<Option<Vec<u8>>> {
        let (last, indices) = self.last_frame.lock().unwrap().clone();
        if ticket <= 1 {
            return Ok(None);
        }
        if last != ticket - 1 {
            return Err(CoreError::malformed(
                "chunk batch",
                format!("frame {ticket} refers to frame {}, which is not written", ticket - 1),
            ));
        }
        let (bytes, chunks) = chunk_batch::read_history_chunks(&self.file, &self.manifest, &indices)
            .map_err(|e| CoreError::io(self.temp.shown(), e))?;
        let mut at = 0usize;
        for &i in chunks {
            let len = self.manifest.chunks[i as usize].len as usize;
            if blake3::hash(&bytes[at..at + len]).as_bytes() != &self.manifest.chunks[i as usize].hash {
                return Err(CoreError::VerifyFailed(format!(
                    "{} changed during the sync",
                    self.temp.shown().display()
                )));
            }
            at += len;
        }
        Ok(Some(bytes))
    }

    fn claim(&self, records: &[chunk_batch::Record]) -> Result<()> {
        {
            // Claim the chunks now, so the same chunk in two batches in flight is refused.
            // A refused batch releases its claims; any later failure poisons the
            // reconstruction (see `write_batch`), so a claimed chunk is never trusted unverified.
            let mut received = self.received.lock().unwrap();
            for (k, r) in records.iter().enumerate() {
                let i = r.index as usize;
                if self.origins[i] != Origin::Wire || received[i] {
                    for done in &records[..k] {
                        received[done.index as usize] = false;
                    }
                    return Err(CoreError::malformed(
                        "chunk batch",
                        format!("chunk {i} was not requested"),
                    ));
                }
                received[i] = true;
            }
        }
        Ok(())
    }

    fn write_claimed(&self, records: &[chunk_batch::Record]) -> Result<u64> {
        // Raw chunks are hashed and written straight from the frame, a batch's stream records
        // from their decoded bytes; the rest (zstd of their own, deltas) are decompressed or
        // rebuilt into buffers recycled across batches.
        let mut bufs: Vec<Vec<u8>> = {
            let mut pool = self.scratch.lock().unwrap();
            records
                .iter()
                .map(|r| {
                    if r.needs_buffer() {
                        pool.pop().unwrap_or_default()
                    } else {
                        Vec::new()
                    }
                })
                .collect()
        };
        // Each record's literal bytes (all of them, unless it is a delta).
        let checked: Result<Vec<u64>> = records
            .par_iter()
            .zip(bufs.par_iter_mut())
            .map(|(r, buf)| {
                let (data, literal) = if r.is_delta() {
                    let literal = self.apply_delta(r, buf)?;
                    (&buf[..], literal)
                } else {
                    (r.raw(buf)?, r.raw_len as u64)
                };
                if blake3::hash(data).as_bytes() == &self.manifest.chunks[r.index as usize].hash {
                    Ok(literal)
                } else if let Some(path) = r.is_delta().then(|| self.changed_delta_base(r.index)).flatten() {
                    // The delta was applied to old bytes that changed under us: that is the
                    // documented "old file changed during the sync" (exit 23), not a corrupt
                    // chunk from the peer (exit 12).
                    Err(CoreError::VerifyFailed(format!(
                        "{} changed during the sync",
                        path.display()
                    )))
                } else {
                    Err(CoreError::ChunkCorrupt {
                        index: r.index,
                        origin: "received from the peer",
                    })
                }
            })
            .collect();
        let result = checked.and_then(|literal| {
            let writes: Vec<(u64, &[u8])> = records
                .iter()
                .zip(&bufs)
                .map(|(r, b)| {
                    (
                        self.manifest.chunks[r.index as usize].offset,
                        r.bytes_here().unwrap_or(&b[..]),
                    )
                })
                .collect();
            if let (Some(first), Some(last)) = (
                writes.iter().map(|w| w.0).min(),
                writes.iter().map(|w| w.0 + w.1.len() as u64).max(),
            ) {
                // Reserving takes the inode lock as a write does: in turn too.
                self.write_turn
                    .with(|| self.reservation.before_write(&self.file, first, last))
                    .map_err(|e| CoreError::io(self.temp.shown(), e))?;
            }
            self.write_turn
                .with(|| self.writer.write_batch(&self.file, &writes))
                .map_err(|e| CoreError::io(self.temp.shown(), e))?;
            for (off, data) in &writes {
                self.writeback.wrote(&self.file, *off, data.len() as u64);
            }
            Ok(literal.iter().sum::<u64>())
        });
        {
            let mut pool = self.scratch.lock().unwrap();
            let room = SCRATCH_POOL.saturating_sub(pool.len());
            pool.extend(bufs.drain(..).filter(|b| b.capacity() > 0).take(room));
        }
        let literal = result?;
        let bytes: u64 = records.iter().map(|r| r.raw_len as u64).sum();
        self.written.fetch_add(bytes, Ordering::Relaxed);
        self.literal.fetch_add(literal, Ordering::Relaxed);
        Ok(bytes)
    }

    /// `--inplace` commit: staged ranges are durable, then the journal decides the commit,
    /// then the ranges go into the target, which is re-verified where they landed.
    fn commit_in_place(
        &self,
        mtime_ns: Option<i64>,
        mode: Option<u32>,
        state_dir: Option<&Path>,
    ) -> Result<FileIdentity> {
        let mut ranges: Vec<(u64, u64)> = Vec::new();
        for (o, c) in self.origins.iter().zip(&self.manifest.chunks) {
            if *o == Origin::InTarget {
                continue;
            }
            match ranges.last_mut() {
                Some(r) if r.0 + r.1 == c.offset => r.1 += c.len as u64,
                _ => ranges.push((c.offset, c.len as u64)),
            }
        }
        self.file.sync_all().map_err(|e| CoreError::io(self.temp.shown(), e))?;
        let journal = crate::restore::inplace::Journal {
            manifest: self.manifest.clone(),
            mtime_ns,
            mode,
            staged_name: self.temp.name_bytes(),
            ranges,
        };
        crate::restore::inplace::write_journal_at(&self.target, &journal)?;
        *self.state.lock().unwrap() = State::Finished;
        let t = crate::restore::inplace::apply_at(&self.target, &self.file, &journal)?;
        let written: Vec<usize> = (0..self.origins.len())
            .filter(|&i| self.origins[i] != Origin::InTarget)
            .collect();
        written.par_iter().try_for_each(|&i| {
            let (off, len) = range(&self.manifest, i);
            let h = hash_range(&t, off, len).map_err(|e| CoreError::io(self.target.shown(), e))?;
            if h == self.manifest.chunks[i].hash {
                Ok(())
            } else {
                Err(CoreError::VerifyFailed(format!(
                    "chunk {i} of {} does not match after the in-place commit (was the file changed meanwhile?); the next run completes or reports it",
                    self.target.shown().display()
                )))
            }
        })?;
        crate::restore::inplace::finish_at(&self.target, &self.temp);
        let identity = FileIdentity::of(&t.metadata().map_err(|e| CoreError::io(self.target.shown(), e))?);
        if let Some(dir) = state_dir {
            let _ = index::store(
                dir,
                &crate::scan::index_key(&self.target.shown()),
                &identity,
                &self.manifest,
            );
        }
        Ok(identity)
    }

    /// Punch the sender's holes, then re-verify every chunk a hole touches: a hole list
    /// that does not match the content (a hostile sender, a source changed meanwhile) fails
    /// here instead of zeroing real data.
    fn punch_holes(&self) -> Result<()> {
        if self.holes.is_empty() {
            return Ok(());
        }
        for h in &self.holes {
            crate::sparse::punch(&self.file, h.offset, h.len).map_err(|e| CoreError::io(self.temp.shown(), e))?;
        }
        let touched: Vec<usize> = (0..self.manifest.chunks.len())
            .filter(|&i| {
                let c = &self.manifest.chunks[i];
                let k = self.holes.partition_point(|h| h.end() <= c.offset);
                self.holes.get(k).is_some_and(|h| h.offset < c.end())
            })
            .collect();
        touched.par_iter().try_for_each(|&i| {
            let (off, len) = range(&self.manifest, i);
            let h = hash_range(&self.file, off, len).map_err(|e| CoreError::io(self.temp.shown(), e))?;
            if h == self.manifest.chunks[i].hash {
                Ok(())
            } else {
                Err(CoreError::VerifyFailed(format!(
                    "chunk {i} does not match after punching the sender's holes (hole list and content disagree)"
                )))
            }
        })
    }

    /// Flush the temp file's data (tests measure what it allocated before the commit).
    pub fn temp_file_sync(&self) -> Result<()> {
        self.file.sync_data().map_err(|e| CoreError::io(self.temp.shown(), e))
    }

    /// Verify, commit and rename over the target. `mtime_ns`/`mode` are the sender's.
    pub fn finish(&self, mtime_ns: Option<i64>, mode: Option<u32>, state_dir: Option<&Path>) -> Result<FileIdentity> {
        self.check_open()?;
        if self.in_flight.load(Ordering::SeqCst) > 0 {
            return Err(CoreError::Usage(
                "finish called while chunks are still being written".into(),
            ));
        }
        if self.poisoned.load(Ordering::SeqCst) {
            return Err(CoreError::VerifyFailed(
                "an earlier batch or copy failed; nothing will be committed".into(),
            ));
        }
        {
            let received = self.received.lock().unwrap();
            let missing = self
                .origins
                .iter()
                .zip(received.iter())
                .filter(|(o, r)| **o == Origin::Wire && !**r)
                .count();
            if missing > 0 {
                return Err(CoreError::malformed(
                    "transfer",
                    format!("{missing} chunks were never received"),
                ));
            }
        }
        let copies = self.origins.iter().filter(|o| matches!(o, Origin::Copy { .. })).count() as u64;
        if self.copied_ok.load(Ordering::Relaxed) != copies {
            return Err(CoreError::VerifyFailed(
                "local chunks were not all copied and verified".into(),
            ));
        }
        if self.inplace {
            return self.commit_in_place(mtime_ns, mode, state_dir);
        }
        self.punch_holes()?;
        apply_metadata(&self.file, &self.temp.shown(), mtime_ns, mode)?;
        if self.fsync {
            // On macOS `sync_all` is F_FULLFSYNC (through the drive's cache), as it must be
            // for "durable before the rename" to hold there.
            self.file.sync_all().map_err(|e| CoreError::io(self.temp.shown(), e))?;
        }
        if let Some((b, rel)) = &self.backup {
            b.save(&self.target, rel).map_err(|e| {
                CoreError::io(
                    self.target.shown(),
                    std::io::Error::other(format!("cannot make its backup: {e}")),
                )
            })?;
        }
        // A directory at the target (a tree entry that changed kind) is the caller's to
        // clear first; a link there is replaced itself, never followed.
        self.temp
            .rename_to(&self.target)
            .map_err(|e| CoreError::io(self.target.shown(), e))?;
        *self.state.lock().unwrap() = State::Finished;
        if self.fsync {
            // The verified file is in place; a failure here is that its name may not survive
            // a crash, and the caller must hear it (the data itself was made durable above).
            self.target.dir.sync_entries().map_err(|e| {
                CoreError::io(
                    self.target.shown(),
                    std::io::Error::new(
                        e.kind(),
                        format!("renamed into place, but its directory could not be made durable: {e}"),
                    ),
                )
            })?;
        }
        let identity = FileIdentity::of(
            &self
                .file
                .metadata()
                .map_err(|e| CoreError::io(self.target.shown(), e))?,
        );
        if let Some(dir) = state_dir {
            let _ = index::store(
                dir,
                &crate::scan::index_key(&self.target.shown()),
                &identity,
                &self.manifest,
            );
        }
        Ok(identity)
    }

    /// Give up. The partial is kept (for a resume) only when asked, e.g. after a dropped
    /// connection; on verification failure or a full disk it is removed.
    pub fn abort(&self, keep_partial: bool) {
        let mut st = self.state.lock().unwrap();
        if *st != State::Open {
            return;
        }
        *st = State::Aborted;
        if !keep_partial {
            let _ = self.temp.unlink();
        }
    }
}

impl Drop for Reconstruction {
    fn drop(&mut self) {
        // A reconstruction dropped while open (caller bug or process teardown) removes its
        // temp file rather than leaving an unexplained file beside the target.
        if *self.state.lock().unwrap() == State::Open {
            let _ = self.temp.unlink();
        }
    }
}

/// Chunks the old target (source 0) has at the very offset the new version needs them,
/// whose bytes in `file` (the clone, or the target itself) hash right, become `mark`.
fn prove_unmoved(manifest: &Manifest, origins: &mut [Origin], file: &File, mark: Origin) {
    let same: Vec<usize> = (0..origins.len())
        .filter(|&i| {
            origins[i]
                == Origin::Copy {
                    source: 0,
                    offset: manifest.chunks[i].offset,
                }
        })
        .collect();
    let proven: Vec<bool> = same
        .par_iter()
        .map(|&i| {
            let (off, len) = range(manifest, i);
            hash_range(file, off, len)
                .map(|h| h == manifest.chunks[i].hash)
                .unwrap_or(false)
        })
        .collect();
    for (&i, ok) in same.iter().zip(proven) {
        if ok {
            origins[i] = mark;
        }
    }
}

/// Chunks that lie wholly inside a hole and whose hash is that of zeros need nothing: mark
/// them (a hole list that lies about a chunk's content just does not mark it).
fn mark_holes(manifest: &Manifest, holes: &[Hole], origins: &mut [Origin]) {
    if holes.is_empty() {
        return;
    }
    let mut zero_hash: HashMap<u32, Hash> = HashMap::new();
    for (i, c) in manifest.chunks.iter().enumerate() {
        let k = holes.partition_point(|h| h.end() <= c.offset);
        let inside = holes.get(k).is_some_and(|h| h.offset <= c.offset && c.end() <= h.end());
        if inside && matches!(origins[i], Origin::Wire | Origin::Copy { .. }) {
            let z = *zero_hash
                .entry(c.len)
                .or_insert_with(|| *blake3::hash(&vec![0u8; c.len as usize]).as_bytes());
            if z == c.hash {
                origins[i] = Origin::Hole;
            }
        }
    }
}

/// Counts an operation in flight for as long as the guard lives.
struct InFlight<'a>(&'a std::sync::atomic::AtomicUsize);

impl<'a> InFlight<'a> {
    fn enter(n: &'a std::sync::atomic::AtomicUsize) -> Self {
        n.fetch_add(1, Ordering::SeqCst);
        InFlight(n)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
