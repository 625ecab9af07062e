//! A tree manifest: every entry of a directory tree as (relative path, kind, mode, size,
//! mtime ns, optional content root, symlink target), packed in one buffer in tree order.
//! Both peers build one, exchange them, and triage from the pair.
//!
//! Layout (little endian; docs/protocol.md, "Tree manifest"):
//! ```text
//! header: "FFT1", version u8 = 1, 3 reserved bytes, entry count u32
//! entry:  path_len u16, path, kind u8, flags u8, mode u32, size u64, mtime_ns i64,
//!         [root 32 bytes if flags & HAS_ROOT], [link_len u16, link if kind == symlink]
//! ```
//! Entry 0 is the tree root itself (empty path, a directory). Paths are strictly increasing
//! in tree order and every entry's parent is an earlier directory entry; `decode` checks
//! all of it, so triage can rely on it whatever the peer sent.

use super::path::{cmp_tree_path, is_valid_rel, parent_of, MAX_REL_PATH};
use crate::error::{CoreError, Result};
use std::cmp::Ordering;

pub const MAGIC: &[u8; 4] = b"FFT1";
const HEADER_LEN: usize = 12;
/// Upper bound on entries a peer may announce (memory is checked against the buffer too).
pub const MAX_ENTRIES: u32 = 50_000_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    File = 1,
    Dir = 2,
    Symlink = 3,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Kind> {
        match v {
            1 => Some(Kind::File),
            2 => Some(Kind::Dir),
            3 => Some(Kind::Symlink),
            _ => None,
        }
    }
}

/// Entry flags.
pub mod flags {
    /// A content root follows (the peer's index covers the file).
    pub const HAS_ROOT: u8 = 1;
    /// Receiver only: matched by the receiver's own exclude rules, never deleted.
    pub const PROTECTED: u8 = 2;
    /// Sender only: a directory that could not be read (its contents are unknown, so
    /// nothing below it is deleted) or a file that could not be opened.
    pub const UNREADABLE: u8 = 4;
    pub const KNOWN: u8 = HAS_ROOT | PROTECTED | UNREADABLE;
}

#[derive(Clone, Copy, Debug)]
pub struct EntryRef<'a> {
    pub path: &'a [u8],
    pub kind: Kind,
    pub flags: u8,
    pub mode: u32,
    pub size: u64,
    pub mtime_ns: i64,
    pub root: Option<&'a [u8; 32]>,
    pub link: &'a [u8],
}

impl EntryRef<'_> {
    pub fn is_file(&self) -> bool {
        self.kind == Kind::File
    }
    pub fn is_dir(&self) -> bool {
        self.kind == Kind::Dir
    }
    pub fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }
}

/// An entry being added to a [`TreeBuilder`].
pub struct NewEntry<'a> {
    pub path: &'a [u8],
    pub kind: Kind,
    pub flags: u8,
    pub mode: u32,
    pub size: u64,
    pub mtime_ns: i64,
    pub root: Option<[u8; 32]>,
    pub link: &'a [u8],
}

#[derive(Clone, Debug, Default)]
pub struct TreeManifest {
    buf: Vec<u8>,
    offsets: Vec<u32>,
}

pub struct TreeBuilder {
    m: TreeManifest,
}

impl Default for TreeBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl TreeBuilder {
    pub fn new() -> TreeBuilder {
        let mut buf = Vec::with_capacity(64 * 1024);
        buf.extend_from_slice(MAGIC);
        buf.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0, 0]);
        TreeBuilder {
            m: TreeManifest {
                buf,
                offsets: Vec::new(),
            },
        }
    }

    /// Append an entry; callers add them in tree order (the walk does).
    pub fn push(&mut self, e: &NewEntry) {
        let b = &mut self.m.buf;
        self.m.offsets.push(b.len() as u32);
        b.extend_from_slice(&(e.path.len() as u16).to_le_bytes());
        b.extend_from_slice(e.path);
        b.push(e.kind as u8);
        let f = (e.flags & !flags::HAS_ROOT) | if e.root.is_some() { flags::HAS_ROOT } else { 0 };
        b.push(f);
        b.extend_from_slice(&e.mode.to_le_bytes());
        b.extend_from_slice(&e.size.to_le_bytes());
        b.extend_from_slice(&e.mtime_ns.to_le_bytes());
        if let Some(r) = &e.root {
            b.extend_from_slice(r);
        }
        if e.kind == Kind::Symlink {
            b.extend_from_slice(&(e.link.len() as u16).to_le_bytes());
            b.extend_from_slice(e.link);
        }
    }

    pub fn finish(mut self) -> TreeManifest {
        let n = self.m.offsets.len() as u32;
        self.m.buf[8..12].copy_from_slice(&n.to_le_bytes());
        self.m.buf.shrink_to_fit();
        self.m.offsets.shrink_to_fit();
        self.m
    }
}

fn u16_at(b: &[u8], o: usize) -> usize {
    u16::from_le_bytes([b[o], b[o + 1]]) as usize
}

impl TreeManifest {
    pub fn len(&self) -> usize {
        self.offsets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.offsets.is_empty()
    }

    pub fn encoded(&self) -> &[u8] {
        &self.buf
    }

    pub fn entry(&self, i: usize) -> EntryRef<'_> {
        parse_entry(&self.buf, self.offsets[i] as usize)
            .expect("validated entry")
            .0
    }

    pub fn iter(&self) -> impl Iterator<Item = EntryRef<'_>> + '_ {
        (0..self.len()).map(|i| self.entry(i))
    }

    /// Binary search by path (entries are in tree order).
    pub fn find(&self, path: &[u8]) -> Option<usize> {
        let (mut lo, mut hi) = (0usize, self.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            match cmp_tree_path(self.entry(mid).path, path) {
                Ordering::Less => lo = mid + 1,
                Ordering::Greater => hi = mid,
                Ordering::Equal => return Some(mid),
            }
        }
        None
    }

    /// Decode and validate a manifest from a peer (or our own, after the wire).
    pub fn decode(buf: Vec<u8>) -> Result<TreeManifest> {
        let bad = |r: String| CoreError::malformed("tree manifest", r);
        if buf.len() < HEADER_LEN || &buf[0..4] != MAGIC || buf[4] != 1 {
            return Err(bad("unknown format".into()));
        }
        let count = u32::from_le_bytes(buf[8..12].try_into().unwrap());
        // The smallest entry is 24 bytes: a count the buffer cannot hold is a lie.
        if count > MAX_ENTRIES || count as usize > (buf.len() - HEADER_LEN) / 24 + 1 || count == 0 {
            return Err(bad(format!("entry count {count} does not fit the buffer")));
        }
        let mut offsets = Vec::with_capacity(count as usize);
        let mut o = HEADER_LEN;
        // Directories that are ancestors of the current position (pre-order stack).
        let mut dirs: Vec<(usize, usize)> = Vec::new(); // (offset of path, len)
        let mut prev: Option<(usize, usize)> = None;
        for i in 0..count as usize {
            let (e, next) = parse_entry(&buf, o).ok_or_else(|| bad(format!("entry {i} is truncated or invalid")))?;
            let path_at = o + 2;
            if i == 0 {
                if !e.path.is_empty() || e.kind != Kind::Dir {
                    return Err(bad("entry 0 must be the tree root directory".into()));
                }
            } else {
                if !is_valid_rel(e.path) {
                    return Err(bad(format!(
                        "entry {i} has an unsafe path {:?}",
                        super::path::display(e.path)
                    )));
                }
                if let Some((po, pl)) = prev {
                    if cmp_tree_path(&buf[po..po + pl], e.path) != Ordering::Less {
                        return Err(bad(format!("entry {i} is out of order")));
                    }
                }
                let parent = parent_of(e.path);
                while let Some(&(d, l)) = dirs.last() {
                    if buf[d..d + l] == *parent {
                        break;
                    }
                    dirs.pop();
                }
                if dirs.is_empty() && !parent.is_empty() {
                    return Err(bad(format!("entry {i} has no parent directory entry")));
                }
            }
            if e.kind == Kind::Dir {
                dirs.push((path_at, e.path.len()));
            }
            prev = Some((path_at, e.path.len()));
            offsets.push(o as u32);
            o = next;
        }
        if o != buf.len() {
            return Err(bad(format!("{} trailing bytes", buf.len() - o)));
        }
        Ok(TreeManifest { buf, offsets })
    }

    /// Wire form: zstd-compressed (paths compress well), prefixed by the raw length.
    pub fn encode_compressed(&self) -> Vec<u8> {
        let mut out = (self.buf.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(&zstd::bulk::compress(&self.buf, 1).expect("zstd compress"));
        out
    }

    /// Inverse of [`encode_compressed`], refusing to inflate beyond `max_len` bytes.
    pub fn decode_compressed(wire: &[u8], max_len: usize) -> Result<TreeManifest> {
        let mut r = CompressedManifestReader::new(max_len);
        r.push(wire)?;
        r.finish()
    }
}

/// Decodes the wire form ([`TreeManifest::encode_compressed`]) from parts as they arrive,
/// decompressing as it goes: the compressed form is never assembled whole. Refuses a
/// declared size above `max_len` and any output beyond the declared size.
pub struct CompressedManifestReader {
    max_len: usize,
    header: Vec<u8>,
    raw_len: usize,
    decoder: Option<zstd::stream::write::Decoder<'static, Vec<u8>>>,
}

impl CompressedManifestReader {
    pub fn new(max_len: usize) -> Self {
        CompressedManifestReader {
            max_len,
            header: Vec::with_capacity(8),
            raw_len: 0,
            decoder: None,
        }
    }

    pub fn push(&mut self, mut part: &[u8]) -> Result<()> {
        use std::io::Write;
        let bad = |r: String| CoreError::malformed("tree manifest", r);
        if self.header.len() < 8 {
            let n = (8 - self.header.len()).min(part.len());
            self.header.extend_from_slice(&part[..n]);
            part = &part[n..];
            if self.header.len() == 8 {
                let raw = u64::from_le_bytes(self.header[..8].try_into().unwrap());
                if raw > self.max_len as u64 || raw < HEADER_LEN as u64 {
                    return Err(bad(format!("declared size {raw} out of range")));
                }
                self.raw_len = raw as usize;
                let mut out = Vec::new();
                out.reserve_exact(self.raw_len);
                self.decoder = Some(zstd::stream::write::Decoder::new(out).map_err(|e| bad(e.to_string()))?);
            }
        }
        if let Some(d) = self.decoder.as_mut() {
            d.write_all(part).map_err(|e| bad(e.to_string()))?;
            if d.get_ref().len() > self.raw_len {
                return Err(bad("decompresses beyond its declared size".into()));
            }
        }
        Ok(())
    }

    pub fn finish(self) -> Result<TreeManifest> {
        use std::io::Write;
        let bad = |r: String| CoreError::malformed("tree manifest", r);
        let mut d = self.decoder.ok_or_else(|| bad("too short".into()))?;
        d.flush().map_err(|e| bad(e.to_string()))?;
        let out = d.into_inner();
        if out.len() != self.raw_len {
            return Err(bad(format!(
                "decompressed to {} bytes, declared {}",
                out.len(),
                self.raw_len
            )));
        }
        TreeManifest::decode(out)
    }
}

fn parse_entry(b: &[u8], o: usize) -> Option<(EntryRef<'_>, usize)> {
    if b.len() < o.checked_add(2)? {
        return None;
    }
    let plen = u16_at(b, o);
    if plen > MAX_REL_PATH {
        return None;
    }
    let p0 = o + 2;
    let fixed = p0.checked_add(plen)?;
    if b.len() < fixed + 22 {
        return None;
    }
    let path = &b[p0..fixed];
    let kind = Kind::from_u8(b[fixed])?;
    let fl = b[fixed + 1];
    if fl & !flags::KNOWN != 0 {
        return None;
    }
    let mode = u32::from_le_bytes(b[fixed + 2..fixed + 6].try_into().ok()?);
    let size = u64::from_le_bytes(b[fixed + 6..fixed + 14].try_into().ok()?);
    let mtime_ns = i64::from_le_bytes(b[fixed + 14..fixed + 22].try_into().ok()?);
    let mut next = fixed + 22;
    let root = if fl & flags::HAS_ROOT != 0 {
        if kind != Kind::File || b.len() < next + 32 {
            return None;
        }
        let r: &[u8; 32] = b[next..next + 32].try_into().ok()?;
        next += 32;
        Some(r)
    } else {
        None
    };
    let link = if kind == Kind::Symlink {
        if b.len() < next + 2 {
            return None;
        }
        let l = u16_at(b, next);
        next += 2;
        if b.len() < next + l || l == 0 || b[next..next + l].contains(&0) {
            return None;
        }
        next += l;
        &b[next - l..next]
    } else {
        &[][..]
    };
    if kind == Kind::Dir && size != 0 {
        return None;
    }
    Some((
        EntryRef {
            path,
            kind,
            flags: fl,
            mode: mode & 0o7777,
            size,
            mtime_ns,
            root,
            link,
        },
        next,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry<'a>(path: &'a [u8], kind: Kind, size: u64) -> NewEntry<'a> {
        NewEntry {
            path,
            kind,
            flags: 0,
            mode: 0o644,
            size,
            mtime_ns: 7,
            root: None,
            link: if kind == Kind::Symlink { b"target" } else { b"" },
        }
    }

    fn sample() -> TreeManifest {
        let mut b = TreeBuilder::new();
        b.push(&entry(b"", Kind::Dir, 0));
        b.push(&entry(b"a", Kind::Dir, 0));
        b.push(&NewEntry {
            root: Some([9; 32]),
            ..entry(b"a/f", Kind::File, 5)
        });
        b.push(&entry(b"a-b", Kind::Symlink, 6));
        b.push(&entry(b"\xff", Kind::File, 0));
        b.finish()
    }

    #[test]
    fn round_trips_through_the_wire_form() {
        let m = sample();
        let back = TreeManifest::decode_compressed(&m.encode_compressed(), 1 << 20).unwrap();
        assert_eq!(back.len(), 5);
        let f = back.entry(2);
        assert_eq!((f.path, f.size, f.root), (&b"a/f"[..], 5, Some(&[9u8; 32])));
        assert_eq!(back.entry(3).link, b"target");
        assert_eq!(back.find(b"\xff"), Some(4));
        assert_eq!(back.find(b"zz"), None);
    }

    #[test]
    fn rejects_disorder_orphans_escapes_and_garbage() {
        let bad_sets: Vec<Vec<NewEntry>> = vec![
            vec![
                entry(b"", Kind::Dir, 0),
                entry(b"b", Kind::File, 1),
                entry(b"a", Kind::File, 1),
            ],
            vec![entry(b"", Kind::Dir, 0), entry(b"x/y", Kind::File, 1)],
            vec![
                entry(b"", Kind::Dir, 0),
                entry(b"f", Kind::File, 1),
                entry(b"f/y", Kind::File, 1),
            ],
            vec![entry(b"", Kind::Dir, 0), entry(b"..", Kind::Dir, 0)],
            vec![
                entry(b"", Kind::Dir, 0),
                entry(b"a", Kind::File, 1),
                entry(b"a", Kind::File, 1),
            ],
            vec![entry(b"x", Kind::Dir, 0)],
        ];
        for set in bad_sets {
            let mut b = TreeBuilder::new();
            for e in &set {
                b.push(e);
            }
            assert!(TreeManifest::decode(b.finish().encoded().to_vec()).is_err());
        }
        let good = sample().encoded().to_vec();
        for cut in 0..good.len() {
            assert!(TreeManifest::decode(good[..cut].to_vec()).is_err());
        }
        assert!(TreeManifest::decode_compressed(&[0xff; 40], 1 << 20).is_err());
    }
}
