//! One index per tree in the state directory (never inside the user's tree): for each
//! file, its stat identity when it was hashed and its content root. A later walk that
//! finds the same identity takes the root for the price of the stat it already made, so
//! peers compare content, not size and mtime, without reading anything.
//!
//! Layout: `"FFTX"`, version u8 = 1, 3 zero bytes, indexed-at ns i64, tree path length
//! u32 + path, entry count u32, entries in tree order { path_len u16, path, identity (40
//! bytes), root [32] }, BLAKE3 of all of it. A torn or foreign file is ignored and removed.

use super::path::cmp_tree_path;
use crate::error::Result;
use crate::file_identity::FileIdentity;
use crate::index::{now_ns, trusted_at, write_atomically};
use crate::manifest::hex;
use std::cmp::Ordering;
use std::fs;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 4] = b"FFTX";

pub fn tree_index_path(state_dir: &Path, tree: &Path) -> PathBuf {
    let key = blake3::hash(tree.to_string_lossy().as_bytes());
    state_dir
        .join("trees")
        .join(format!("{}.tidx", &hex(key.as_bytes())[..32]))
}

/// A content root someone established for a file in its current state.
#[derive(Clone, Debug)]
pub struct Claim {
    pub path: Vec<u8>,
    pub identity: FileIdentity,
    pub root: [u8; 32],
}

/// A verified index file, read entry by entry (never held in memory as a whole: on a
/// 100,000-file tree it is ~10 MB that the walk needs only as a sorted stream).
pub struct TreeIndex {
    file: PathBuf,
    entries_at: u64,
    entries_len: u64,
    count: u32,
    indexed_at_ns: i64,
}

impl TreeIndex {
    pub fn len(&self) -> usize {
        self.count as usize
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// A lookup cursor for paths visited in tree order (a merge over the file, not a hash
    /// table: constant memory, nothing per lookup beyond a compare).
    pub fn cursor(&self) -> IndexCursor<'_> {
        let reader = fs::File::open(&self.file).ok().and_then(|mut f| {
            f.seek(SeekFrom::Start(self.entries_at)).ok()?;
            Some(BufReader::with_capacity(64 * 1024, f.take(self.entries_len)))
        });
        IndexCursor {
            index: self,
            reader,
            left: self.count,
            current: None,
            prev: Vec::new(),
        }
    }
}

struct Entry {
    path: Vec<u8>,
    identity: FileIdentity,
    root: [u8; 32],
}

pub struct IndexCursor<'a> {
    index: &'a TreeIndex,
    reader: Option<BufReader<std::io::Take<fs::File>>>,
    left: u32,
    current: Option<Entry>,
    prev: Vec<u8>,
}

impl IndexCursor<'_> {
    /// Next entry, or None at the end or on anything inconsistent (a file that changed
    /// under us, or entries out of order): lookups then simply miss.
    fn advance(&mut self) -> Option<Entry> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let r = self.reader.as_mut()?;
        let mut len = [0u8; 2];
        r.read_exact(&mut len).ok()?;
        let mut path = vec![0u8; u16::from_le_bytes(len) as usize];
        r.read_exact(&mut path).ok()?;
        let mut id = [0u8; 40];
        r.read_exact(&mut id).ok()?;
        let mut root = [0u8; 32];
        r.read_exact(&mut root).ok()?;
        if !self.prev.is_empty() && cmp_tree_path(&self.prev, &path) != Ordering::Less {
            self.left = 0;
            return None;
        }
        self.prev.clear();
        self.prev.extend_from_slice(&path);
        Some(Entry {
            path,
            identity: FileIdentity::from_bytes(&id),
            root,
        })
    }

    /// The recorded root for `path` if the file still has exactly `current` identity and
    /// was not racily clean when indexed. Paths must be asked in tree order.
    pub fn root_for(&mut self, path: &[u8], current: &FileIdentity) -> Option<[u8; 32]> {
        loop {
            if self.current.is_none() {
                self.current = Some(self.advance()?);
            }
            let e = self.current.as_ref().unwrap();
            match cmp_tree_path(&e.path, path) {
                Ordering::Less => self.current = None,
                Ordering::Greater => return None,
                Ordering::Equal => {
                    let e = self.current.take().unwrap();
                    let trusted = e.identity == *current && trusted_at(self.index.indexed_at_ns, current);
                    return trusted.then_some(e.root);
                }
            }
        }
    }
}

/// Check the header and the checksum (streaming), and locate the entries.
fn open_verified(p: &Path, tree: &Path) -> Option<TreeIndex> {
    let f = fs::File::open(p).ok()?;
    let total = f.metadata().ok()?.len();
    if total < 4 + 4 + 8 + 4 + 4 + 32 {
        return None;
    }
    let mut r = BufReader::with_capacity(64 * 1024, f);
    let mut hasher = blake3::Hasher::new();
    let mut left = total - 32;
    let mut head = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    while left > 0 {
        let n = (left as usize).min(buf.len());
        r.read_exact(&mut buf[..n]).ok()?;
        hasher.update(&buf[..n]);
        if head.len() < 4096 {
            head.extend_from_slice(&buf[..n.min(4096 - head.len())]);
        }
        left -= n as u64;
    }
    let mut sum = [0u8; 32];
    r.read_exact(&mut sum).ok()?;
    if hasher.finalize().as_bytes() != &sum || &head[0..4] != MAGIC || head[4..8] != [1, 0, 0, 0] {
        return None;
    }
    let indexed_at_ns = i64::from_le_bytes(head[8..16].try_into().unwrap());
    let tlen = u32::from_le_bytes(head[16..20].try_into().unwrap()) as usize;
    let name = tree.to_string_lossy();
    if head.len() < 24 + tlen || head[20..20 + tlen] != *name.as_bytes() {
        return None;
    }
    let count = u32::from_le_bytes(head[20 + tlen..24 + tlen].try_into().unwrap());
    let entries_at = 24 + tlen as u64;
    Some(TreeIndex {
        file: p.to_path_buf(),
        entries_at,
        entries_len: total - 32 - entries_at,
        count,
        indexed_at_ns,
    })
}

/// The intact index of `tree`, if any (a corrupt one is removed).
pub fn load(state_dir: &Path, tree: &Path) -> Option<TreeIndex> {
    let p = tree_index_path(state_dir, tree);
    if !p.exists() {
        return None;
    }
    let idx = open_verified(&p, tree);
    if idx.is_none() {
        let _ = fs::remove_file(&p);
    }
    idx
}

/// Replace the index of `tree` with `claims` (any order; for a repeated path the last
/// claim wins). Written to a temp file and renamed: a crash never leaves a torn index.
pub fn store(state_dir: &Path, tree: &Path, mut claims: Vec<Claim>) -> Result<()> {
    // Stable sort keeps claim order among equal paths; then keep the last of each run.
    claims.sort_by(|a, b| cmp_tree_path(&a.path, &b.path));
    let mut kept: Vec<&Claim> = Vec::with_capacity(claims.len());
    for c in &claims {
        match kept.last_mut() {
            Some(last) if last.path == c.path => *last = c,
            _ => kept.push(c),
        }
    }
    let name = tree.to_string_lossy();
    let mut out = Vec::with_capacity(64 + name.len() + kept.iter().map(|c| 74 + c.path.len()).sum::<usize>());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[1, 0, 0, 0]);
    out.extend_from_slice(&now_ns().to_le_bytes());
    out.extend_from_slice(&(name.len() as u32).to_le_bytes());
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(&(kept.len() as u32).to_le_bytes());
    for c in kept {
        out.extend_from_slice(&(c.path.len() as u16).to_le_bytes());
        out.extend_from_slice(&c.path);
        out.extend_from_slice(&c.identity.to_bytes());
        out.extend_from_slice(&c.root);
    }
    let sum = blake3::hash(&out);
    out.extend_from_slice(sum.as_bytes());
    write_atomically(&tree_index_path(state_dir, tree), &out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(size: u64, mtime: i64) -> FileIdentity {
        FileIdentity {
            size,
            mtime_ns: mtime,
            ctime_ns: 3,
            inode: 4,
            dev: 5,
        }
    }

    #[test]
    fn stores_in_tree_order_and_trusts_only_the_same_identity() {
        let dir = tempfile::tempdir().unwrap();
        let tree = Path::new("/some/tree");
        let claims = vec![
            Claim {
                path: b"b".to_vec(),
                identity: id(1, 10),
                root: [1; 32],
            },
            Claim {
                path: b"a/x".to_vec(),
                identity: id(2, 10),
                root: [2; 32],
            },
            Claim {
                path: b"a-b".to_vec(),
                identity: id(3, 10),
                root: [3; 32],
            },
            Claim {
                path: b"b".to_vec(),
                identity: id(9, 10),
                root: [9; 32],
            },
        ];
        store(dir.path(), tree, claims).unwrap();
        let idx = load(dir.path(), tree).unwrap();
        assert_eq!(idx.len(), 3);
        let mut c = idx.cursor();
        assert_eq!(c.root_for(b"a", &id(0, 0)), None);
        assert_eq!(c.root_for(b"a/x", &id(2, 10)), Some([2; 32]));
        assert_eq!(c.root_for(b"a-b", &id(3, 11)), None, "other mtime: not trusted");
        assert_eq!(c.root_for(b"b", &id(9, 10)), Some([9; 32]), "last claim wins");
        assert!(load(dir.path(), Path::new("/other")).is_none());
    }

    #[test]
    fn racily_clean_and_corrupt_indexes_are_not_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let tree = Path::new("/t");
        let fresh = now_ns();
        store(
            dir.path(),
            tree,
            vec![Claim {
                path: b"f".to_vec(),
                identity: id(1, fresh),
                root: [1; 32],
            }],
        )
        .unwrap();
        assert_eq!(
            load(dir.path(), tree).unwrap().cursor().root_for(b"f", &id(1, fresh)),
            None
        );
        let p = tree_index_path(dir.path(), tree);
        let mut b = fs::read(&p).unwrap();
        let n = b.len();
        b[n - 40] ^= 1;
        fs::write(&p, b).unwrap();
        assert!(load(dir.path(), tree).is_none());
        assert!(!p.exists(), "a corrupt index is removed");
    }
}
