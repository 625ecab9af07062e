//! One index per tree in the state directory (never inside the user's tree): for each
//! file, its stat identity when it was hashed and its content root. A later walk that
//! finds the same identity takes the root for the price of the stat it already made, so
//! peers compare content, not size and mtime, without reading anything.
//!
//! Layout: `"FFTX"`, version u8 = 1, 3 zero bytes, indexed-at ns i64, tree path length
//! u32 + path, entry count u32, entries in tree order { path_len u16, path, identity (40
//! bytes), root [32] }, BLAKE3 of all of it. A torn or foreign file is ignored and removed.

use super::path::cmp_tree_path;
use crate::error::{CoreError, Result};
use crate::file_identity::FileIdentity;
use crate::manifest::hex;
use std::cmp::Ordering;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

const MAGIC: &[u8; 4] = b"FFTX";
/// Same rule as the per-file index: a file modified within this window of being indexed
/// may change again inside one timestamp tick, so its entry is not trusted.
const RACY_WINDOW_NS: i64 = 20_000_000;

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

pub struct TreeIndex {
    buf: Vec<u8>,
    offsets: Vec<u32>,
    indexed_at_ns: i64,
}

impl TreeIndex {
    pub fn len(&self) -> usize {
        self.offsets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.offsets.is_empty()
    }

    fn at(&self, i: usize) -> (&[u8], FileIdentity, &[u8; 32]) {
        let o = self.offsets[i] as usize;
        let l = u16::from_le_bytes([self.buf[o], self.buf[o + 1]]) as usize;
        let p = &self.buf[o + 2..o + 2 + l];
        let id = FileIdentity::from_bytes(self.buf[o + 2 + l..o + 42 + l].try_into().unwrap());
        let root = self.buf[o + 42 + l..o + 74 + l].try_into().unwrap();
        (p, id, root)
    }

    /// A lookup cursor for paths visited in tree order (a merge, not a hash table: the
    /// index costs its file size in memory and nothing per lookup beyond a compare).
    pub fn cursor(&self) -> IndexCursor<'_> {
        IndexCursor { index: self, pos: 0 }
    }
}

pub struct IndexCursor<'a> {
    index: &'a TreeIndex,
    pos: usize,
}

impl IndexCursor<'_> {
    /// The recorded root for `path` if the file still has exactly `current` identity and
    /// was not racily clean when indexed. Paths must be asked in tree order.
    pub fn root_for(&mut self, path: &[u8], current: &FileIdentity) -> Option<[u8; 32]> {
        while self.pos < self.index.len() {
            let (p, id, root) = self.index.at(self.pos);
            match cmp_tree_path(p, path) {
                Ordering::Less => self.pos += 1,
                Ordering::Greater => return None,
                Ordering::Equal => {
                    self.pos += 1;
                    let trusted = id == *current && self.index.indexed_at_ns - current.mtime_ns > RACY_WINDOW_NS;
                    return trusted.then_some(*root);
                }
            }
        }
        None
    }
}

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

fn decode(buf: Vec<u8>, tree: &Path) -> Option<TreeIndex> {
    if buf.len() < 4 + 4 + 8 + 4 + 4 + 32 {
        return None;
    }
    let (body, sum) = buf.split_at(buf.len() - 32);
    if blake3::hash(body).as_bytes() != sum || &body[0..4] != MAGIC || body[4..8] != [1, 0, 0, 0] {
        return None;
    }
    let indexed_at_ns = i64::from_le_bytes(body[8..16].try_into().unwrap());
    let tlen = u32::from_le_bytes(body[16..20].try_into().unwrap()) as usize;
    let name = tree.to_string_lossy();
    if body.len() < 24 + tlen || body[20..20 + tlen] != *name.as_bytes() {
        return None;
    }
    let count = u32::from_le_bytes(body[20 + tlen..24 + tlen].try_into().unwrap()) as usize;
    let mut o = 24 + tlen;
    let mut offsets = Vec::with_capacity(count.min(body.len() / 74));
    for _ in 0..count {
        if body.len() < o + 2 {
            return None;
        }
        let l = u16::from_le_bytes([body[o], body[o + 1]]) as usize;
        if body.len() < o + 74 + l {
            return None;
        }
        offsets.push(o as u32);
        o += 74 + l;
    }
    if o != body.len() {
        return None;
    }
    let mut buf = buf;
    buf.truncate(buf.len() - 32);
    let idx = TreeIndex {
        buf,
        offsets,
        indexed_at_ns,
    };
    // Order is what makes the merge lookup correct: refuse anything else.
    for i in 1..idx.len() {
        if cmp_tree_path(idx.at(i - 1).0, idx.at(i).0) != Ordering::Less {
            return None;
        }
    }
    Some(idx)
}

/// The intact index of `tree`, if any (a corrupt one is removed).
pub fn load(state_dir: &Path, tree: &Path) -> Option<TreeIndex> {
    let p = tree_index_path(state_dir, tree);
    let buf = fs::read(&p).ok()?;
    let idx = decode(buf, tree);
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
    let p = tree_index_path(state_dir, tree);
    let dir = p.parent().unwrap();
    fs::create_dir_all(dir).map_err(|e| CoreError::io(dir, e))?;
    let tmp = p.with_extension(format!("tmp{}", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(&out)?;
        fs::rename(&tmp, &p)
    };
    write().map_err(|e| {
        let _ = fs::remove_file(&tmp);
        CoreError::io(&p, e)
    })
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
