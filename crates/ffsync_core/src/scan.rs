//! Scanner: turns a file into its manifest, from the index when the file is unchanged,
//! otherwise by memory-mapping it and chunking + hashing on every core.

use crate::chunker::{chunk_parallel, chunk_windows, Chunk, InMemory, Residency, SEGMENT_LEN};
use crate::error::{CoreError, Result};
use crate::file_identity::FileIdentity;
use crate::index;
use crate::manifest::Manifest;
use crate::params::ChunkParams;
use memmap2::Mmap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Default)]
pub struct ScanOptions<'a> {
    /// Where indexes live; `None` disables both lookup and store.
    pub state_dir: Option<&'a Path>,
    /// Ignore any index (a fresh index is still written): `--checksum`.
    pub ignore_index: bool,
    /// Incremented with bytes hashed, read by a progress ticker.
    pub progress: Option<&'a AtomicU64>,
}

pub struct ScanOutcome {
    pub manifest: Manifest,
    pub identity: FileIdentity,
    pub from_index: bool,
}

/// An open, memory-mapped regular file (empty files have no mapping).
pub struct MappedFile {
    pub path: PathBuf,
    pub file: File,
    pub map: Option<Mmap>,
    pub identity: FileIdentity,
}

impl MappedFile {
    pub fn open(path: &Path) -> Result<MappedFile> {
        let file = File::open(path).map_err(|e| CoreError::io(path, e))?;
        Self::from_file(path, file)
    }

    /// Like `open`, but a symlink at `path` is an error, never followed (tree entries).
    pub fn open_nofollow(path: &Path) -> Result<MappedFile> {
        let mut o = std::fs::OpenOptions::new();
        o.read(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::custom_flags(&mut o, libc::O_NOFOLLOW);
        let file = o.open(path).map_err(|e| CoreError::io(path, e))?;
        Self::from_file(path, file)
    }

    /// Map a file the caller opened (e.g. through a directory handle); `path` is for messages.
    pub fn from_open(path: &Path, file: File) -> Result<MappedFile> {
        Self::from_file(path, file)
    }

    fn from_file(path: &Path, file: File) -> Result<MappedFile> {
        let meta = file.metadata().map_err(|e| CoreError::io(path, e))?;
        if !meta.is_file() {
            return Err(CoreError::NotAFile {
                path: path.to_path_buf(),
            });
        }
        let identity = FileIdentity::of(&meta);
        // Safety: the mapping is read-only; a concurrent writer can change the bytes under
        // us, which every consumer tolerates because results are verified by hash.
        let map = if meta.len() == 0 {
            None
        } else {
            Some(unsafe { Mmap::map(&file) }.map_err(|e| CoreError::io(path, e))?)
        };
        Ok(MappedFile {
            path: path.to_path_buf(),
            file,
            map,
            identity,
        })
    }

    pub fn bytes(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }

    /// Re-stat by handle; true if size/mtime/ctime still match what we opened.
    pub fn unchanged(&self) -> bool {
        self.file
            .metadata()
            .map(|m| FileIdentity::of(&m) == self.identity)
            .unwrap_or(false)
    }
}

pub fn manifest_of_bytes(data: &[u8], progress: Option<&AtomicU64>, mem: &dyn Residency) -> Manifest {
    manifest_with_params(data, ChunkParams::for_file_size(data.len() as u64), progress, mem)
}

pub fn manifest_with_params(
    data: &[u8],
    params: ChunkParams,
    progress: Option<&AtomicU64>,
    mem: &dyn Residency,
) -> Manifest {
    let tick = |n: u64| {
        if let Some(p) = progress {
            p.fetch_add(n, Ordering::Relaxed);
        }
    };
    Manifest::from_chunks(
        data.len() as u64,
        params,
        chunk_parallel(data, params, SEGMENT_LEN, &tick, mem),
    )
}

/// The largest folio the page cache may hold a file's pages in (a PMD on x86-64 and arm64).
#[cfg(unix)]
const FOLIO: usize = 2 << 20;

/// Populates page tables ahead of the chunker (one system call instead of a fault per
/// page) and drops consumed ranges from this process's mapping; the pages stay in the
/// page cache, so resident memory stays flat however large the file is.
struct MapResidency<'a>(&'a Mmap);

impl Residency for MapResidency<'_> {
    #[cfg(target_os = "linux")]
    fn prepare(&self, from: usize, to: usize) {
        let (a, b) = page_range(from, to);
        if b > a {
            let _ = self.0.advise_range(memmap2::Advice::PopulateRead, a, b - a);
        }
    }

    #[cfg(unix)]
    fn release(&self, from: usize, to: usize) {
        // Widen to 2 MiB: the page cache may hold the file in large folios, which stay
        // mapped (and resident) unless the whole folio is dropped. Dropping a neighbour's
        // pages too is harmless: a read-only shared mapping simply faults them back in.
        let a = from / FOLIO * FOLIO;
        let b = to.div_ceil(FOLIO).saturating_mul(FOLIO).min(self.0.len());
        if b > a {
            // Safety: read-only shared file mapping; DONTNEED only drops our page table
            // entries, and a later access faults the same bytes back in.
            let _ = unsafe {
                self.0
                    .unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, a, b - a)
            };
        }
    }

    #[cfg(unix)]
    fn release_behind(&self, from: usize, to: usize) {
        // The folio holding `to` is being read: only whole folios before it go.
        let end = to / FOLIO * FOLIO;
        if end > from {
            self.release(from, end);
        }
    }
}

#[cfg(target_os = "linux")]
fn page_range(from: usize, to: usize) -> (usize, usize) {
    const PAGE: usize = 4096;
    (from / PAGE * PAGE, to / PAGE * PAGE)
}

/// Done with `[from, to)` of a read-only file map held elsewhere (the restorer's refinement
/// maps): drop this process's page-table entries for it, as the scanner does.
pub(crate) fn release_mapped(map: &Mmap, from: usize, to: usize) {
    MapResidency(map).release(from, to.min(map.len()));
}

impl MappedFile {
    /// Done with `[from, to)`: drop this process's page-table entries for it (the pages stay
    /// in the page cache), so reading a whole file through the map keeps resident memory flat.
    pub fn release_range(&self, from: usize, to: usize) {
        if let Some(m) = &self.map {
            MapResidency(m).release(from, to.min(m.len()));
        }
    }

    /// Chunk and hash the whole file on every core.
    pub fn manifest(&self, progress: Option<&AtomicU64>) -> Manifest {
        self.manifest_with(ChunkParams::for_file_size(self.identity.size), progress)
    }

    pub fn manifest_with(&self, params: ChunkParams, progress: Option<&AtomicU64>) -> Manifest {
        match &self.map {
            Some(m) => manifest_with_params(m, params, progress, &MapResidency(m)),
            None => manifest_with_params(&[], params, progress, &InMemory),
        }
    }
}

/// Absolute, normalized path used as the index key.
pub fn index_key(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// A file the index covers (its manifest, no read), or the file mapped for chunking.
enum Lookup {
    Indexed(ScanOutcome),
    Scan(PathBuf, MappedFile),
}

/// The index lookup shared by both scans: a regular file, and its cached manifest when the
/// index entry's identity is the file's current one.
fn lookup(path: &Path, opts: &ScanOptions) -> Result<Lookup> {
    let key = index_key(path);
    let meta = std::fs::metadata(path).map_err(|e| CoreError::io(path, e))?;
    if !meta.is_file() {
        return Err(CoreError::NotAFile {
            path: path.to_path_buf(),
        });
    }
    if let (Some(dir), false) = (opts.state_dir, opts.ignore_index) {
        let id = FileIdentity::of(&meta);
        if let Some(manifest) = index::load(dir, &key, &id) {
            if let Some(p) = opts.progress {
                p.fetch_add(id.size, Ordering::Relaxed);
            }
            return Ok(Lookup::Indexed(ScanOutcome {
                manifest,
                identity: id,
                from_index: true,
            }));
        }
    }
    Ok(Lookup::Scan(key, MappedFile::open(path)?))
}

/// Index what was just chunked. If the file changed while we read it the manifest may
/// describe a mix of versions; it is still usable as a hint (everything is verified by
/// hash), but never cached.
fn indexed(opts: &ScanOptions, key: &Path, mapped: MappedFile, manifest: Manifest) -> Result<ScanOutcome> {
    if let Some(dir) = opts.state_dir {
        if mapped.unchanged() {
            index::store(dir, key, &mapped.identity, &manifest)?;
        } else {
            index::remove(dir, key);
        }
    }
    Ok(ScanOutcome {
        manifest,
        identity: mapped.identity,
        from_index: false,
    })
}

pub fn scan_file(path: &Path, opts: &ScanOptions) -> Result<ScanOutcome> {
    match lookup(path, opts)? {
        Lookup::Indexed(outcome) => Ok(outcome),
        Lookup::Scan(key, mapped) => {
            let manifest = mapped.manifest(opts.progress);
            indexed(opts, &key, mapped, manifest)
        }
    }
}

/// [`scan_file`] that hands out the manifest's chunks window by window while it scans
/// (`emit` sees them in order; together they are the whole list), so a peer can start on
/// the first parts of a large file before the last is hashed. A file the index covers is
/// emitted at once. The result is exactly `scan_file`'s, and is indexed the same way.
/// `emit` gets each window's chunks; returning false cancels the scan (an error, nothing
/// indexed).
pub fn scan_file_streaming(
    path: &Path,
    opts: &ScanOptions,
    window: usize,
    emit: &mut dyn FnMut(&[Chunk]) -> bool,
) -> Result<ScanOutcome> {
    let (key, mapped) = match lookup(path, opts)? {
        Lookup::Indexed(outcome) => {
            if !emit(&outcome.manifest.chunks) {
                return Err(CoreError::Usage("scan cancelled".into()));
            }
            return Ok(outcome);
        }
        Lookup::Scan(key, mapped) => (key, mapped),
    };
    let params = ChunkParams::for_file_size(mapped.identity.size);
    let tick = |n: u64| {
        if let Some(p) = opts.progress {
            p.fetch_add(n, Ordering::Relaxed);
        }
    };
    let mut cancelled = false;
    let chunks = match &mapped.map {
        Some(m) => chunk_windows(m, params, window, &tick, &MapResidency(m), &mut |c| {
            cancelled = !emit(c);
            !cancelled
        }),
        None => Vec::new(),
    };
    if cancelled {
        return Err(CoreError::Usage("scan cancelled".into()));
    }
    let manifest = Manifest::from_chunks(mapped.identity.size, params, chunks);
    indexed(opts, &key, mapped, manifest)
}

/// Chunk a local file with another size's parameters (never indexed). When a file grows
/// or shrinks across the 16 MiB parameter threshold, the receiver rechunks its old copy
/// with the sender's parameters so unchanged regions still match.
pub fn scan_file_with_params(path: &Path, params: ChunkParams, progress: Option<&AtomicU64>) -> Result<ScanOutcome> {
    let mapped = MappedFile::open(path)?;
    let manifest = mapped.manifest_with(params, progress);
    Ok(ScanOutcome {
        manifest,
        identity: mapped.identity,
        from_index: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::pseudo_random;

    /// A file of `len` seeded bytes whose mtime is a minute old, so an index entry for it is
    /// trusted (not "racily clean").
    fn backdated_file(dir: &Path, len: usize, seed: u64) -> PathBuf {
        let f = dir.join("data.bin");
        std::fs::write(&f, pseudo_random(len, seed)).unwrap();
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(60);
        File::options().write(true).open(&f).unwrap().set_modified(old).unwrap();
        f
    }

    #[test]
    fn second_scan_of_unchanged_file_comes_from_index_and_edit_invalidates_it() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let f = backdated_file(dir.path(), 500_000, 2);
        let opts = ScanOptions {
            state_dir: Some(&state),
            ..Default::default()
        };
        let a = scan_file(&f, &opts).unwrap();
        assert!(!a.from_index);
        let b = scan_file(&f, &opts).unwrap();
        assert!(b.from_index);
        assert_eq!(a.manifest, b.manifest);
        let forced = scan_file(
            &f,
            &ScanOptions {
                ignore_index: true,
                ..ScanOptions {
                    state_dir: Some(&state),
                    ..Default::default()
                }
            },
        )
        .unwrap();
        assert!(!forced.from_index);

        // Same size and mtime as before the rewrite: only the ctime tells.
        let old = std::fs::metadata(&f).unwrap().modified().unwrap();
        std::fs::write(&f, pseudo_random(500_000, 3)).unwrap();
        File::options().write(true).open(&f).unwrap().set_modified(old).unwrap();
        let c = scan_file(&f, &opts).unwrap();
        assert!(!c.from_index, "ctime changed: index must not be trusted");
        assert_ne!(c.manifest.root, a.manifest.root);
    }

    #[test]
    fn directory_is_rejected() {
        let dir = tempfile::tempdir().unwrap();
        let err = scan_file(dir.path(), &ScanOptions::default()).err().unwrap();
        assert_eq!(err.code(), "ENOTFILE");
    }

    #[test]
    fn streaming_scan_emits_the_same_manifest_in_parts_and_indexes_it() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let f = backdated_file(dir.path(), 20_000_000, 9);
        let opts = ScanOptions {
            state_dir: Some(&state),
            ..Default::default()
        };
        let mut parts = Vec::new();
        let a = scan_file_streaming(&f, &opts, 5 << 20, &mut |c| {
            parts.push(c.len());
            true
        })
        .unwrap();
        assert!(!a.from_index);
        assert!(parts.len() >= 3, "{parts:?}");
        assert_eq!(parts.iter().sum::<usize>(), a.manifest.chunks.len());
        let plain = scan_file(&f, &ScanOptions::default()).unwrap();
        assert_eq!(a.manifest, plain.manifest);
        let mut again = Vec::new();
        let b = scan_file_streaming(&f, &opts, 5 << 20, &mut |c| {
            again.extend_from_slice(c);
            true
        })
        .unwrap();
        assert!(b.from_index);
        assert_eq!(again, plain.manifest.chunks);
    }
}
