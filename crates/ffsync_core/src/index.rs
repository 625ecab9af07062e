//! Persistent per-file chunk index in the state directory: lets an unchanged file skip
//! its scan. An entry is trusted only if its checksum is intact, it names the same path,
//! the file's stat identity (size, mtime ns, ctime ns, inode, device) is unchanged, and the
//! chunk parameters are the ones the engine would pick today. Anything else is dropped.
//!
//! File layout: `"FFX1"`, version u8 = 1, 3 zero bytes, indexed-at ns i64, identity (40
//! bytes), path length u32 + UTF-8 path, manifest (see manifest.rs), BLAKE3 of all of it.

use crate::error::{CoreError, Result};
use crate::file_identity::FileIdentity;
use crate::manifest::{hex, u32_at, Manifest};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

const MAGIC: &[u8; 4] = b"FFX1";
/// A file whose mtime is this close to the moment it was indexed may have been written
/// again within the same timestamp tick ("racily clean", as git calls it): don't trust it.
/// Shared by the tree index (tree/index.rs).
pub(crate) const RACY_WINDOW_NS: i64 = 20_000_000;

/// Whether an entry indexed at `indexed_at_ns` may vouch for a file with identity `id` (the
/// identity itself is compared by the caller). A write stamps the file with the current time,
/// so a file whose mtime is within the racy window *before* the indexing moment may have been
/// written again within the same tick, unseen. An mtime *after* the indexing moment (a future
/// mtime: an archive, `touch -d`, a peer whose clock is ahead, whose mtime we adopted) was not
/// stamped by a write at that moment: a later write stamps "now" and changes the identity,
/// just as for an old mtime, so such an entry is trusted like any other (distrusted, the file
/// would be left to size and mtime alone, which miss a same-size change under an unchanged
/// future mtime): the file's ctime, which only the kernel's clock sets, must then not be in
/// the future too
/// (a filesystem whose clock runs ahead of ours, e.g. a skewed NFS server, stays distrusted).
pub(crate) fn trusted_at(indexed_at_ns: i64, id: &FileIdentity) -> bool {
    let since_mtime = indexed_at_ns.saturating_sub(id.mtime_ns);
    if since_mtime > RACY_WINDOW_NS {
        return true;
    }
    // Windows records the creation time as ctime: it says nothing about the last write.
    cfg!(unix) && since_mtime < -RACY_WINDOW_NS && id.ctime_ns <= indexed_at_ns
}

pub fn index_path(state_dir: &Path, file: &Path) -> PathBuf {
    let key = blake3::hash(file.to_string_lossy().as_bytes());
    state_dir
        .join("index")
        .join(format!("{}.idx", &hex(key.as_bytes())[..32]))
}

pub(crate) fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

pub fn encode(file: &Path, id: &FileIdentity, manifest: &Manifest, indexed_at_ns: i64) -> Vec<u8> {
    let path = file.to_string_lossy();
    let mut out = Vec::with_capacity(64 + path.len() + manifest.encoded_len() + 32);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[1, 0, 0, 0]);
    out.extend_from_slice(&indexed_at_ns.to_le_bytes());
    out.extend_from_slice(&id.to_bytes());
    out.extend_from_slice(&(path.len() as u32).to_le_bytes());
    out.extend_from_slice(path.as_bytes());
    out.extend_from_slice(&manifest.encode());
    let sum = blake3::hash(&out);
    out.extend_from_slice(sum.as_bytes());
    out
}

pub struct IndexEntry {
    pub path: String,
    pub identity: FileIdentity,
    pub indexed_at_ns: i64,
    pub manifest: Manifest,
}

/// Decode an index file; any inconsistency is an error (callers drop the entry).
pub fn decode(buf: &[u8]) -> Result<IndexEntry> {
    let bad = |r: &str| CoreError::malformed("index", r);
    if buf.len() < 4 + 4 + 8 + 40 + 4 + 32 {
        return Err(bad("too short"));
    }
    let (body, sum) = buf.split_at(buf.len() - 32);
    if blake3::hash(body).as_bytes() != sum {
        return Err(bad("checksum mismatch"));
    }
    if &body[0..4] != MAGIC || body[4..8] != [1, 0, 0, 0] {
        return Err(bad("unknown format"));
    }
    let indexed_at_ns = i64::from_le_bytes(body[8..16].try_into().unwrap());
    let identity = FileIdentity::from_bytes(body[16..56].try_into().unwrap());
    let plen = u32_at(body, 56) as usize;
    let rest = &body[60..];
    if plen > rest.len() {
        return Err(bad("path length out of range"));
    }
    let path = std::str::from_utf8(&rest[..plen])
        .map_err(|_| bad("path is not UTF-8"))?
        .to_string();
    let manifest = Manifest::decode(&rest[plen..])?;
    if manifest.size != identity.size {
        return Err(bad("manifest size differs from recorded size"));
    }
    Ok(IndexEntry {
        path,
        identity,
        indexed_at_ns,
        manifest,
    })
}

/// The cached manifest for `file`, if an intact entry matches its current identity.
pub fn load(state_dir: &Path, file: &Path, current: &FileIdentity) -> Option<Manifest> {
    let p = index_path(state_dir, file);
    let buf = fs::read(&p).ok()?;
    match decode(&buf) {
        Ok(e)
            if e.path == file.to_string_lossy()
                && e.identity == *current
                && trusted_at(e.indexed_at_ns, current)
                && e.manifest.params.is_canonical_for(current.size) =>
        {
            Some(e.manifest)
        }
        Ok(_) => None, // stale: the next store replaces it
        Err(_) => {
            let _ = fs::remove_file(&p); // corrupt: never trusted, removed
            None
        }
    }
}

/// Store atomically (temp file + rename) so a crash never leaves a torn entry.
pub fn store(state_dir: &Path, file: &Path, id: &FileIdentity, manifest: &Manifest) -> Result<()> {
    write_atomically(&index_path(state_dir, file), &encode(file, id, manifest, now_ns()))
}

/// Write `bytes` to `p` through a temp file and a rename (creating its directory), so a
/// crash never leaves a torn index (the per-file index; the tree index writes its entries
/// as it merges them, through `write_atomically_with`).
pub(crate) fn write_atomically(p: &Path, bytes: &[u8]) -> Result<()> {
    write_atomically_with(p, |w| w.write_all(bytes))
}

/// `write_atomically` for a file produced piece by piece (through a buffer of its own), so a
/// large one is never held in memory whole.
pub(crate) fn write_atomically_with(p: &Path, fill: impl FnOnce(&mut dyn Write) -> std::io::Result<()>) -> Result<()> {
    let dir = p.parent().unwrap();
    // Unique per write, not only per process: two threads may index the same file at once
    // (a scan ahead and the conversation that did not wait for it, decisions §95; two sessions
    // of one daemon), and each must rename a whole file of its own.
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = p.with_extension(format!("tmp{}-{n}", std::process::id()));
    // The directory is made only when the temp file cannot be created without it: it exists
    // for every write but a state directory's first, and `create_dir_all` on each write cost a
    // `mkdir` that fails and a `stat` per file of a tree, on both peers (decisions §106).
    let create = || match fs::File::create(&tmp) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            fs::create_dir_all(dir)?;
            fs::File::create(&tmp)
        }
        r => r,
    };
    let write = || -> std::io::Result<()> {
        let mut f = std::io::BufWriter::with_capacity(64 * 1024, create()?);
        fill(&mut f)?;
        f.flush()?;
        drop(f);
        fs::rename(&tmp, p)
    };
    write().map_err(|e| {
        let _ = fs::remove_file(&tmp);
        CoreError::io(p, e)
    })
}

pub fn remove(state_dir: &Path, file: &Path) {
    let _ = fs::remove_file(index_path(state_dir, file));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunker::chunk_sequential;
    use crate::params::ChunkParams;
    use crate::testutil::pseudo_random;

    fn entry() -> (FileIdentity, Manifest) {
        let data = pseudo_random(300_000, 11);
        let p = ChunkParams::for_file_size(data.len() as u64);
        let m = Manifest::from_chunks(data.len() as u64, p, chunk_sequential(&data, p));
        let id = FileIdentity {
            size: data.len() as u64,
            mtime_ns: 1_000,
            ctime_ns: 2_000,
            inode: 3,
            dev: 4,
        };
        (id, m)
    }

    #[test]
    fn codec_round_trip() {
        let (id, m) = entry();
        let enc = encode(Path::new("/a/b"), &id, &m, 5_000_000_000);
        let e = decode(&enc).unwrap();
        assert_eq!(e.path, "/a/b");
        assert_eq!(e.identity, id);
        assert_eq!(e.indexed_at_ns, 5_000_000_000);
        assert_eq!(e.manifest, m);
    }

    #[test]
    fn codec_rejects_any_flipped_byte_and_truncation() {
        let (id, m) = entry();
        let enc = encode(Path::new("/a/b"), &id, &m, 5);
        for at in (0..enc.len()).step_by(97).chain([enc.len() - 1]) {
            let mut bad = enc.clone();
            bad[at] ^= 1;
            assert!(decode(&bad).is_err(), "flip at {at} accepted");
        }
        for cut in [0, 10, enc.len() / 2, enc.len() - 1] {
            assert!(decode(&enc[..cut]).is_err());
        }
    }

    #[test]
    fn load_trusts_only_matching_identity_and_drops_corrupt_files() {
        let dir = tempfile::tempdir().unwrap();
        let (id, m) = entry();
        let file = Path::new("/data/file.bin");
        store(dir.path(), file, &id, &m).unwrap();
        assert_eq!(load(dir.path(), file, &id), Some(m.clone()));
        assert_eq!(load(dir.path(), Path::new("/data/other"), &id), None);
        for changed in [
            FileIdentity { mtime_ns: 1_001, ..id },
            FileIdentity { ctime_ns: 7, ..id },
            FileIdentity { inode: 9, ..id },
            FileIdentity { size: 1, ..id },
        ] {
            assert_eq!(load(dir.path(), file, &changed), None);
        }
        let p = index_path(dir.path(), file);
        let mut bytes = fs::read(&p).unwrap();
        bytes[70] ^= 0xff;
        fs::write(&p, bytes).unwrap();
        assert_eq!(load(dir.path(), file, &id), None);
        assert!(!p.exists(), "corrupt index must be removed");
    }

    #[test]
    fn store_makes_the_directory_when_missing_and_writes_into_it_when_present() {
        let state = tempfile::tempdir().unwrap();
        let nested = state.path().join("not").join("yet");
        let (id, m) = entry();
        store(&nested, Path::new("/data/one"), &id, &m).unwrap();
        store(&nested, Path::new("/data/two"), &id, &m).unwrap();
        assert_eq!(load(&nested, Path::new("/data/one"), &id), Some(m.clone()));
        assert_eq!(load(&nested, Path::new("/data/two"), &id), Some(m.clone()));
        let names: Vec<_> = fs::read_dir(nested.join("index"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 2, "two entries and no temp file left: {names:?}");
        // A state path that is not a directory fails with an error, nothing written.
        let file = state.path().join("plain");
        fs::write(&file, b"x").unwrap();
        assert!(store(&file, Path::new("/data/one"), &id, &m).is_err());
    }

    #[test]
    fn threads_indexing_one_file_at_once_each_write_a_whole_entry() {
        // Decisions §95: a scan ahead and a conversation may index the same file together.
        let dir = tempfile::tempdir().unwrap();
        let (id, m) = entry();
        let file = Path::new("/data/shared.bin");
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..50 {
                        store(dir.path(), file, &id, &m).unwrap();
                    }
                });
            }
        });
        assert_eq!(load(dir.path(), file, &id), Some(m));
        let left: Vec<_> = fs::read_dir(index_path(dir.path(), file).parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left.len(), 1, "temporary files left: {left:?}");
    }

    #[test]
    fn racily_clean_entry_is_not_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let (mut id, m) = entry();
        id.mtime_ns = now_ns();
        let file = Path::new("/data/fresh.bin");
        store(dir.path(), file, &id, &m).unwrap();
        assert_eq!(load(dir.path(), file, &id), None);
    }

    #[cfg(unix)]
    #[test]
    fn future_mtime_entry_is_trusted_once_indexed_after_its_last_change() {
        // An mtime after the indexing moment must not leave the entry racy forever: a same-size
        // change under that mtime would go unnoticed (docs/reliability.md, future-mtime).
        let dir = tempfile::tempdir().unwrap();
        let (mut id, m) = entry();
        let now = now_ns();
        id.mtime_ns = now + 80 * 365 * 24 * 3600 * 1_000_000_000; // 2100-ish
        id.ctime_ns = now - 1_000_000_000;
        let file = Path::new("/data/future.bin");
        store(dir.path(), file, &id, &m).unwrap();
        assert_eq!(load(dir.path(), file, &id), Some(m.clone()));
        // A ctime ahead of our clock (a filesystem whose clock runs ahead): not trusted.
        let ahead = FileIdentity {
            ctime_ns: now + 3_600_000_000_000,
            ..id
        };
        store(dir.path(), file, &ahead, &m).unwrap();
        assert_eq!(load(dir.path(), file, &ahead), None);
        // An mtime just ahead of the indexing moment is within the racy window: not trusted.
        let near = FileIdentity {
            mtime_ns: now_ns() + 5_000_000,
            ..id
        };
        store(dir.path(), file, &near, &m).unwrap();
        assert_eq!(load(dir.path(), file, &near), None);
    }
}
