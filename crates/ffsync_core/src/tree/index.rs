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
use crate::index::{now_ns, trusted_at, write_atomically_with};
use crate::manifest::hex;
use std::cmp::Ordering;
use std::fs;
use std::io::{BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 4] = b"FFTX";

pub fn tree_index_path(state_dir: &Path, tree: &Path) -> PathBuf {
    let key = blake3::hash(tree.to_string_lossy().as_bytes());
    state_dir
        .join("trees")
        .join(format!("{}.tidx", &hex(key.as_bytes())[..32]))
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

/// A file's content root at a stat identity, its path read in place from a manifest: the
/// index is rewritten from these without a copy of the tree.
#[derive(Clone, Copy)]
pub struct ClaimRef<'a> {
    pub path: &'a [u8],
    pub identity: FileIdentity,
    pub root: [u8; 32],
}

/// Replace the index of `tree` with the roots the walk already knew (`known`) and what this
/// session learnt (`learnt`), both in tree order: a learnt entry replaces a known one of its
/// path, and of learnt entries with the same path (next to each other) the last wins. The two
/// are merged as the file is written, never gathered into one list or one buffer: on a
/// 100,000-file tree that was ~20 MB more resident at the end of a session (decisions §87).
/// Each is called twice, to count the entries for the header and to write them. Written to a
/// temp file and renamed: a crash never leaves a torn index.
pub fn store<'a, I, J>(state_dir: &Path, tree: &Path, known: impl Fn() -> I, learnt: impl Fn() -> J) -> Result<()>
where
    I: Iterator<Item = ClaimRef<'a>>,
    J: Iterator<Item = ClaimRef<'a>>,
{
    let count = Merged::new(known(), learnt()).count();
    let name = tree.to_string_lossy();
    write_atomically_with(&tree_index_path(state_dir, tree), |w| {
        let mut w = Hashing {
            inner: w,
            hasher: blake3::Hasher::new(),
        };
        w.write_all(MAGIC)?;
        w.write_all(&[1, 0, 0, 0])?;
        w.write_all(&now_ns().to_le_bytes())?;
        w.write_all(&(name.len() as u32).to_le_bytes())?;
        w.write_all(name.as_bytes())?;
        w.write_all(&(count as u32).to_le_bytes())?;
        let mut written = 0;
        for c in Merged::new(known(), learnt()) {
            w.write_all(&(c.path.len() as u16).to_le_bytes())?;
            w.write_all(c.path)?;
            w.write_all(&c.identity.to_bytes())?;
            w.write_all(&c.root)?;
            written += 1;
        }
        if written != count {
            return Err(std::io::Error::other("the claims changed while the index was written"));
        }
        let sum = w.hasher.finalize();
        w.inner.write_all(sum.as_bytes())
    })
}

/// Two sequences in tree order merged into one; on equal paths the learnt entry (`b`) wins,
/// and of a run of learnt entries with one path, the last.
struct Merged<'a, I: Iterator<Item = ClaimRef<'a>>, J: Iterator<Item = ClaimRef<'a>>> {
    a: std::iter::Peekable<I>,
    b: std::iter::Peekable<J>,
}

impl<'a, I: Iterator<Item = ClaimRef<'a>>, J: Iterator<Item = ClaimRef<'a>>> Merged<'a, I, J> {
    fn new(a: I, b: J) -> Self {
        Merged {
            a: a.peekable(),
            b: b.peekable(),
        }
    }
}

impl<'a, I: Iterator<Item = ClaimRef<'a>>, J: Iterator<Item = ClaimRef<'a>>> Iterator for Merged<'a, I, J> {
    type Item = ClaimRef<'a>;
    fn next(&mut self) -> Option<ClaimRef<'a>> {
        let order = match (self.a.peek(), self.b.peek()) {
            (None, None) => return None,
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (Some(a), Some(b)) => cmp_tree_path(a.path, b.path),
        };
        if order != Ordering::Greater {
            let a = self.a.next();
            if order == Ordering::Less {
                return a;
            }
        }
        let mut b = self.b.next()?;
        while let Some(later) = self.b.next_if(|n| n.path == b.path) {
            b = later;
        }
        Some(b)
    }
}

/// A writer that hashes what passes through it (the index's checksum, computed as written).
struct Hashing<W> {
    inner: W,
    hasher: blake3::Hasher,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(b)?;
        self.hasher.update(&b[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Claim {
        path: Vec<u8>,
        identity: FileIdentity,
        root: [u8; 32],
    }

    fn refs(c: &[Claim]) -> impl Iterator<Item = ClaimRef<'_>> {
        c.iter().map(|c| ClaimRef {
            path: &c.path,
            identity: c.identity,
            root: c.root,
        })
    }

    /// `store` with `known` in tree order and `claims` in the order they were made (sorted
    /// here as a session sorts its own: stably, so the last of a path stays last).
    fn store_claims(dir: &Path, tree: &Path, known: &[Claim], mut claims: Vec<Claim>) -> Result<()> {
        claims.sort_by(|a, b| cmp_tree_path(&a.path, &b.path));
        store(dir, tree, || refs(known), || refs(&claims))
    }

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
        store_claims(dir.path(), tree, &[], claims).unwrap();
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
    fn known_entries_and_new_claims_merge_as_written() {
        let dir = tempfile::tempdir().unwrap();
        let tree = Path::new("/merged");
        let claim = |p: &[u8], size, root| Claim {
            path: p.to_vec(),
            identity: id(size, 10),
            root: [root; 32],
        };
        // What the walk knew, in tree order: "a/x" and "c" stay, "b" is replaced.
        let known = [claim(b"a/x", 2, 2), claim(b"b", 1, 1), claim(b"c", 4, 4)];
        let claims = vec![
            claim(b"b", 9, 9),
            claim(b"a-b", 3, 3),
            claim(b"b", 10, 10),
            claim(b"a", 5, 5),
        ];
        store_claims(dir.path(), tree, &known, claims).unwrap();
        let idx = load(dir.path(), tree).unwrap();
        assert_eq!(
            idx.len(),
            5,
            "a, a/x, a-b, b, c: the replaced entry and the repeated claim once each"
        );
        let mut c = idx.cursor();
        assert_eq!(c.root_for(b"a", &id(5, 10)), Some([5; 32]));
        assert_eq!(c.root_for(b"a/x", &id(2, 10)), Some([2; 32]), "known, kept");
        assert_eq!(c.root_for(b"a-b", &id(3, 10)), Some([3; 32]));
        assert_eq!(c.root_for(b"b", &id(1, 10)), None, "the walk's entry was replaced");
        let mut c = idx.cursor();
        assert_eq!(c.root_for(b"b", &id(10, 10)), Some([10; 32]), "the last claim wins");
        assert_eq!(c.root_for(b"c", &id(4, 10)), Some([4; 32]), "known, kept");
        // Only known entries (a no-op session that still rewrites its index) and nothing at all.
        store_claims(dir.path(), tree, &known, Vec::new()).unwrap();
        assert_eq!(load(dir.path(), tree).unwrap().len(), 3);
        store_claims(dir.path(), tree, &[], Vec::new()).unwrap();
        assert!(load(dir.path(), tree).unwrap().is_empty());
    }

    #[test]
    fn racily_clean_and_corrupt_indexes_are_not_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let tree = Path::new("/t");
        let fresh = now_ns();
        store_claims(
            dir.path(),
            tree,
            &[],
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
