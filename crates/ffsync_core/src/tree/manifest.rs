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

/// A manifest's entries by kind ([`TreeManifest::counts`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub files: u32,
    pub dirs: u32,
    pub symlinks: u32,
    pub bytes: u64,
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

    /// How many entries of each kind, and the regular files' bytes (the root directory counts).
    pub fn counts(&self) -> Counts {
        let mut c = Counts::default();
        for e in self.iter() {
            match e.kind {
                Kind::File => {
                    c.files += 1;
                    c.bytes += e.size;
                }
                Kind::Dir => c.dirs += 1,
                Kind::Symlink => c.symlinks += 1,
            }
        }
        c
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
        let mut v = Validator::new(&buf, buf.len())?;
        v.advance(&buf)?;
        let offsets = v.finish(&buf)?;
        Ok(TreeManifest { buf, offsets })
    }

    /// Wire form: zstd-compressed (paths compress well), prefixed by the raw length.
    pub fn encode_compressed(&self) -> Vec<u8> {
        compress_encoded(&self.buf)
    }

    /// Inverse of [`encode_compressed`], refusing to inflate beyond `max_len` bytes.
    pub fn decode_compressed(wire: &[u8], max_len: usize) -> Result<TreeManifest> {
        let mut r = CompressedManifestReader::new(max_len);
        r.push(wire)?;
        r.finish()
    }
}

/// The wire form of an encoded manifest: its raw length (u64 LE), then the zstd frame.
pub fn compress_encoded(raw: &[u8]) -> Vec<u8> {
    // Compressed straight behind the length (the one-shot API would return a buffer of the
    // worst case's size to be copied behind it).
    use std::io::Write;
    let mut out = (raw.len() as u64).to_le_bytes().to_vec();
    let mut z = zstd::stream::Encoder::new(&mut out, 1).expect("zstd encoder");
    z.set_pledged_src_size(Some(raw.len() as u64))
        .expect("zstd pledged size");
    z.write_all(raw).expect("zstd into memory");
    z.finish().expect("zstd into memory");
    out
}

/// The wire form of an encoded manifest without compressing it: its raw length (u64 LE), then a
/// zstd frame of raw (stored) blocks (RFC 8878 §3.1.1.2), which every zstd decoder reads. For
/// a peer in the same process, where compressing and decompressing both manifests is only time
/// on the session's critical path (~2 ms each for 10,000 entries); zstd's API has no level that
/// stores, so the frame is written here (decisions §101). Receivers need no change.
pub fn store_encoded(raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(stored_len(raw.len()));
    out.extend_from_slice(&(raw.len() as u64).to_le_bytes());
    out.extend_from_slice(&0xFD2F_B528u32.to_le_bytes()); // magic
                                                          // Frame_Header_Descriptor: no content size, not single-segment, no checksum, no dictionary;
                                                          // then the Window_Descriptor (a 128 KiB window: exactly one block).
    out.extend_from_slice(&[0x00, 7 << 3]);
    let mut chunks = raw.chunks(STORED_BLOCK).peekable();
    if chunks.peek().is_none() {
        out.extend_from_slice(&[1, 0, 0]); // one last raw block of no bytes
    }
    while let Some(c) = chunks.next() {
        let last = u32::from(chunks.peek().is_none());
        // Block_Header, 3 bytes LE: Last_Block (bit 0), Block_Type 0 = Raw (bits 1-2), Block_Size.
        let h = last | ((c.len() as u32) << 3);
        out.extend_from_slice(&h.to_le_bytes()[..3]);
        out.extend_from_slice(c);
    }
    out
}

/// TREE_MANIFEST's largest total on the wire (protocol §9; `MAX_TREE_WIRE_BYTES` in
/// ts/protocol/messages.ts), which a stored manifest must fit as a compressed one does.
pub const MAX_WIRE_LEN: usize = 1 << 30;

/// A stored frame's blocks: Block_Maximum_Size, and the window it declares (Window_Descriptor:
/// exponent 7 = 2^17).
const STORED_BLOCK: usize = 128 * 1024;

/// Bytes `store_encoded` makes of `raw_len` raw bytes: the length, the frame header (magic,
/// descriptor, window), a 3-byte header per block.
pub fn stored_len(raw_len: usize) -> usize {
    8 + 6 + 3 * raw_len.div_ceil(STORED_BLOCK).max(1) + raw_len
}

/// The wire form to send: stored when `compress` is false and the stored frame fits
/// `MAX_WIRE_LEN` (a raw manifest may be up to 2 GiB; compressed, it fits), else compressed.
pub fn wire_form(raw: &[u8], compress: bool) -> Vec<u8> {
    if !compress && stored_len(raw.len()) <= MAX_WIRE_LEN {
        store_encoded(raw)
    } else {
        compress_encoded(raw)
    }
}

/// Smallest encoded entry: path_len, an empty path (only the root's) and the fixed fields.
pub const MIN_ENTRY_LEN: usize = 24;
/// Largest encoded entry: the longest path and the longest symlink target (a root is
/// only for files, a target only for symlinks).
pub const MAX_ENTRY_LEN: usize = 2 + MAX_REL_PATH + 22 + 2 + u16::MAX as usize;
/// Decompressed bytes produced per step of the streaming decoder: what may sit beyond the
/// last validated entry is at most this plus one entry.
const STEP: usize = 64 * 1024;

/// What the entry count in a header allows the raw length to be. A declared length outside
/// `[12 + 24 × count, 12 + MAX_ENTRY_LEN × count]` cannot be a manifest of `count` entries.
fn check_count(count: u32, raw_len: usize) -> std::result::Result<(), String> {
    let n = count as u64;
    let (lo, hi) = (
        HEADER_LEN as u64 + MIN_ENTRY_LEN as u64 * n,
        HEADER_LEN as u64 + MAX_ENTRY_LEN as u64 * n,
    );
    if count == 0 || count > MAX_ENTRIES || (raw_len as u64) < lo || raw_len as u64 > hi {
        return Err(format!(
            "entry count {count} does not fit the buffer of {raw_len} bytes"
        ));
    }
    Ok(())
}

/// Where the entry at `o` ends, once enough of it is there to tell (None: need more bytes).
/// Err for an entry no later byte can make valid.
fn entry_end(b: &[u8], o: usize) -> std::result::Result<Option<usize>, ()> {
    if b.len() < o + 2 {
        return Ok(None);
    }
    let plen = u16_at(b, o);
    if plen > MAX_REL_PATH {
        return Err(());
    }
    let fixed = o + 2 + plen;
    if b.len() < fixed + 22 {
        return Ok(None);
    }
    let kind = Kind::from_u8(b[fixed]).ok_or(())?;
    let fl = b[fixed + 1];
    if fl & !flags::KNOWN != 0 {
        return Err(());
    }
    let mut next = fixed + 22;
    if fl & flags::HAS_ROOT != 0 {
        next += 32;
    }
    if kind == Kind::Symlink {
        if b.len() < next + 2 {
            return Ok(None);
        }
        next += 2 + u16_at(b, next);
    }
    Ok((b.len() >= next).then_some(next))
}

/// Validates entries as they become complete, so a peer's manifest is checked while it
/// is still arriving: the first entry that breaks a rule stops the decoding.
struct Validator {
    count: u32,
    at: usize,
    offsets: Vec<u32>,
    /// Directories that are ancestors of the current position (pre-order stack):
    /// (offset of path, len).
    dirs: Vec<(usize, usize)>,
    prev: Option<(usize, usize)>,
}

impl Validator {
    /// `b` holds at least the header; `raw_len` is the whole manifest's length.
    fn new(b: &[u8], raw_len: usize) -> Result<Validator> {
        let bad = |r: String| CoreError::malformed("tree manifest", r);
        if b.len() < HEADER_LEN || &b[0..4] != MAGIC || b[4] != 1 {
            return Err(bad("unknown format".into()));
        }
        let count = u32::from_le_bytes(b[8..12].try_into().unwrap());
        check_count(count, raw_len).map_err(bad)?;
        Ok(Validator {
            count,
            at: HEADER_LEN,
            // Grows with validated entries only, never with the count a peer declares.
            offsets: Vec::new(),
            dirs: Vec::new(),
            prev: None,
        })
    }

    /// Validate every complete entry from where the last call stopped.
    fn advance(&mut self, buf: &[u8]) -> Result<()> {
        let bad = |r: String| CoreError::malformed("tree manifest", r);
        while self.at < buf.len() {
            let i = self.offsets.len();
            if i == self.count as usize {
                return Err(bad(format!("bytes after the {} entries it declares", self.count)));
            }
            let o = self.at;
            let next = match entry_end(buf, o) {
                Ok(Some(n)) => n,
                Ok(None) => return Ok(()),
                Err(()) => return Err(bad(format!("entry {i} is truncated or invalid"))),
            };
            let (e, end) =
                parse_entry(&buf[..next], o).ok_or_else(|| bad(format!("entry {i} is truncated or invalid")))?;
            debug_assert_eq!(end, next);
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
                if let Some((po, pl)) = self.prev {
                    if cmp_tree_path(&buf[po..po + pl], e.path) != Ordering::Less {
                        return Err(bad(format!("entry {i} is out of order")));
                    }
                }
                let parent = parent_of(e.path);
                while let Some(&(d, l)) = self.dirs.last() {
                    if buf[d..d + l] == *parent {
                        break;
                    }
                    self.dirs.pop();
                }
                if self.dirs.is_empty() && !parent.is_empty() {
                    return Err(bad(format!("entry {i} has no parent directory entry")));
                }
            }
            if e.kind == Kind::Dir {
                self.dirs.push((path_at, e.path.len()));
            }
            self.prev = Some((path_at, e.path.len()));
            self.offsets.push(o as u32);
            self.at = next;
        }
        Ok(())
    }

    fn finish(self, buf: &[u8]) -> Result<Vec<u32>> {
        let bad = |r: String| CoreError::malformed("tree manifest", r);
        if self.offsets.len() != self.count as usize || self.at != buf.len() {
            return Err(bad(format!(
                "{} of {} entries complete, {} bytes left over",
                self.offsets.len(),
                self.count,
                buf.len() - self.at
            )));
        }
        let mut offsets = self.offsets;
        offsets.shrink_to_fit();
        Ok(offsets)
    }
}

/// Decodes the wire form ([`TreeManifest::encode_compressed`]) from parts as they arrive.
/// Nothing is sized from what the peer declares: the compressed form is never assembled,
/// decompression runs in steps of [`STEP`] bytes, each step's entries are validated before
/// the next, and decoding stops at the first entry that breaks a rule. So memory grows
/// only with validated entries (plus one step), whatever the declared length or count,
/// and a compression bomb is refused after its first few bytes. The declared length must
/// be in `[36, max_len]` and fit the header's entry count ([`check_count`]); the output
/// may not run past it. After any error the reader holds nothing.
pub struct CompressedManifestReader {
    max_len: usize,
    header: Vec<u8>,
    raw_len: usize,
    decoder: Option<zstd::stream::raw::Decoder<'static>>,
    buf: Vec<u8>,
    v: Option<Validator>,
    frame_done: bool,
    failed: bool,
    /// Most bytes ever held decoded (kept after an error, for tests and diagnostics).
    high_water: usize,
}

impl CompressedManifestReader {
    pub fn new(max_len: usize) -> Self {
        CompressedManifestReader {
            max_len,
            header: Vec::with_capacity(8),
            raw_len: 0,
            decoder: None,
            buf: Vec::new(),
            v: None,
            frame_done: false,
            failed: false,
            high_water: 0,
        }
    }

    /// Most decompressed bytes this reader ever held at once.
    pub fn high_water(&self) -> usize {
        self.high_water
    }

    /// Bytes decoded so far (each one inside a validated entry or the current step).
    pub fn decoded_len(&self) -> usize {
        self.buf.len()
    }

    pub fn push(&mut self, part: &[u8]) -> Result<()> {
        if self.failed {
            return Err(CoreError::malformed("tree manifest", "refused earlier"));
        }
        let r = self.push_inner(part);
        if r.is_err() {
            // Give everything back now, not when the owner is collected.
            self.failed = true;
            self.decoder = None;
            self.buf = Vec::new();
            self.v = None;
        }
        r
    }

    fn push_inner(&mut self, mut part: &[u8]) -> Result<()> {
        use zstd::stream::raw::{DParameter, InBuffer, Operation, OutBuffer};
        let bad = |r: String| CoreError::malformed("tree manifest", r);
        if self.header.len() < 8 {
            let n = (8 - self.header.len()).min(part.len());
            self.header.extend_from_slice(&part[..n]);
            part = &part[n..];
            if self.header.len() < 8 {
                return Ok(());
            }
            let raw = u64::from_le_bytes(self.header[..8].try_into().unwrap());
            if raw > self.max_len as u64 || raw < (HEADER_LEN + MIN_ENTRY_LEN) as u64 {
                return Err(bad(format!("declared size {raw} out of range")));
            }
            self.raw_len = raw as usize;
            let mut d = zstd::stream::raw::Decoder::new().map_err(|e| bad(e.to_string()))?;
            // No window beyond the declared output (our encoder writes one frame of exactly
            // that size), but at least 1 MiB for encoders that declare a default window.
            // zstd's window buffer is only touched as output is produced.
            let log = (usize::BITS - (self.raw_len - 1).leading_zeros()).clamp(20, 31);
            d.set_parameter(DParameter::WindowLogMax(log))
                .map_err(|e| bad(e.to_string()))?;
            self.decoder = Some(d);
        }
        let Some(d) = self.decoder.as_mut() else {
            return Ok(());
        };
        let mut input = InBuffer::around(part);
        let mut step = [0u8; 16 * 1024];
        loop {
            if input.pos() == input.src.len() && self.frame_done {
                return Ok(());
            }
            if self.frame_done {
                return Err(bad("data after the end of the compressed manifest".into()));
            }
            // One step: decompress up to STEP bytes (never more than one past the declared
            // length), then validate what became complete.
            let room = (self.raw_len + 1 - self.buf.len()).min(STEP);
            let mut produced = 0;
            let mut starved = false;
            while produced < room {
                let want = (room - produced).min(step.len());
                let mut out = OutBuffer::around(&mut step[..want]);
                let hint = d
                    .run(&mut input, &mut out)
                    .map_err(|e| bad(format!("does not decompress: {e}")))?;
                let n = out.pos();
                if self.buf.capacity() - self.buf.len() < n {
                    // Double what validated so far, but never past the declared length: a
                    // legitimate manifest ends with capacity ≈ its size, not twice it.
                    let grow = self.buf.len().max(STEP).min(self.raw_len + 1 - self.buf.len()).max(n);
                    self.buf.reserve_exact(grow);
                }
                self.buf.extend_from_slice(&step[..n]);
                produced += n;
                if hint == 0 {
                    self.frame_done = true;
                    break;
                }
                if n < want && input.pos() == input.src.len() {
                    starved = true;
                    break;
                }
            }
            self.high_water = self.high_water.max(self.buf.capacity());
            if self.buf.len() > self.raw_len {
                return Err(bad(format!("decompresses beyond its declared size {}", self.raw_len)));
            }
            if self.v.is_none() && self.buf.len() >= HEADER_LEN {
                self.v = Some(Validator::new(&self.buf, self.raw_len)?);
            }
            if let Some(v) = self.v.as_mut() {
                v.advance(&self.buf)?;
            }
            if starved {
                return Ok(());
            }
        }
    }

    pub fn finish(self) -> Result<TreeManifest> {
        let bad = |r: String| CoreError::malformed("tree manifest", r);
        if self.failed {
            return Err(bad("refused earlier".into()));
        }
        if self.decoder.is_none() {
            return Err(bad("too short".into()));
        }
        if !self.frame_done {
            return Err(bad(format!(
                "compressed data ends early ({} of {} bytes decompressed)",
                self.buf.len(),
                self.raw_len
            )));
        }
        if self.buf.len() != self.raw_len {
            return Err(bad(format!(
                "decompressed to {} bytes, declared {}",
                self.buf.len(),
                self.raw_len
            )));
        }
        let v = self.v.ok_or_else(|| bad("unknown format".into()))?;
        let mut buf = self.buf;
        let offsets = v.finish(&buf)?;
        buf.shrink_to_fit();
        Ok(TreeManifest { buf, offsets })
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
    fn a_stored_manifest_is_a_zstd_frame_every_decoder_reads() {
        // Over one 128 KiB block and not a multiple of it: three blocks, the last one short.
        let mut b = TreeBuilder::new();
        b.push(&entry(b"", Kind::Dir, 0));
        let names: Vec<Vec<u8>> = (0..9000).map(|i| format!("f{i:06}").into_bytes()).collect();
        for n in &names {
            b.push(&entry(n, Kind::File, 1));
        }
        let m = b.finish();
        let raw = m.encoded();
        assert!(
            raw.len() > 2 * 128 * 1024 && raw.len() % (128 * 1024) != 0,
            "{}",
            raw.len()
        );
        let wire = store_encoded(raw);
        assert_eq!(u64::from_le_bytes(wire[..8].try_into().unwrap()), raw.len() as u64);
        assert_eq!(wire.len(), stored_len(raw.len()));
        // zstd's own decoder, and ours fed in 5-byte parts: each 3-byte block header (at 14, then
        // every 3 + 128 KiB: all ≡ 4 mod 5) is split across two parts.
        assert_eq!(zstd::decode_all(&wire[8..]).unwrap(), raw);
        for k in 0..3 {
            let at = 14 + k * (3 + STORED_BLOCK);
            assert_eq!(wire[at] & 0b110, 0, "a raw block's header at {at}");
            assert_eq!(wire[at] & 1, u8::from(k == 2), "only the third block is the last");
        }
        let mut r = CompressedManifestReader::new(1 << 24);
        for part in wire.chunks(5) {
            r.push(part).unwrap();
        }
        let back = r.finish().unwrap();
        assert_eq!(back.len(), 9001);
        assert_eq!(back.find(b"f008999"), Some(9000));
        // A small manifest: one block.
        let small = sample();
        let back = TreeManifest::decode_compressed(&store_encoded(small.encoded()), 1 << 20).unwrap();
        assert_eq!(back.len(), 5);
        assert_eq!(zstd::decode_all(&store_encoded(b"")[8..]).unwrap(), b"");
        assert_eq!(store_encoded(b"").len(), stored_len(0));
        // Stored only when asked and when it fits the wire's limit.
        assert_eq!(wire_form(small.encoded(), false), store_encoded(small.encoded()));
        assert_eq!(wire_form(small.encoded(), true), compress_encoded(small.encoded()));
        assert!(stored_len(MAX_WIRE_LEN - 30_000) <= MAX_WIRE_LEN); // 8,192 block headers
        assert!(stored_len(MAX_WIRE_LEN - 10) > MAX_WIRE_LEN);
    }

    #[test]
    fn counts_entries_by_kind_and_file_bytes() {
        let c = sample().counts();
        assert_eq!(
            c,
            Counts {
                files: 2,
                dirs: 2,
                symlinks: 1,
                bytes: 5
            },
            "a symlink's size is its target's length, not file bytes"
        );
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

    /// `raw_len` prefix + one zstd frame of `head` followed by `zeros` zero bytes,
    /// compressed as a stream (the frame is a few KiB per GiB).
    fn bomb(raw_len: u64, head: &[u8], zeros: u64) -> Vec<u8> {
        let mut out = raw_len.to_le_bytes().to_vec();
        out.extend(crate::testutil::zstd_zeros(head, zeros));
        out
    }

    fn header(count: u32) -> Vec<u8> {
        let mut h = MAGIC.to_vec();
        h.extend_from_slice(&[1, 0, 0, 0]);
        h.extend_from_slice(&count.to_le_bytes());
        h
    }

    /// Feed `wire` in 64 KiB parts; the error and the most bytes the reader ever held.
    fn feed(wire: &[u8], max_len: usize) -> (Result<TreeManifest>, usize, usize) {
        let mut r = CompressedManifestReader::new(max_len);
        let mut fed = 0;
        for part in wire.chunks(64 * 1024) {
            fed += part.len();
            if let Err(e) = r.push(part) {
                let hw = r.high_water();
                assert_eq!(r.decoded_len(), 0, "nothing kept after an error");
                return (Err(e), hw, fed);
            }
        }
        let hw = r.high_water();
        (r.finish(), hw, fed)
    }

    const TWO_GIB: u64 = 2 << 30;
    /// What a refused bomb may have made the reader hold: one step plus one entry.
    const BOUND: usize = 2 * (STEP + MAX_ENTRY_LEN);

    #[test]
    fn a_zero_bomb_declaring_2_gib_is_refused_at_its_first_bytes() {
        let wire = bomb(TWO_GIB, b"", TWO_GIB);
        assert!(
            wire.len() < 1 << 20,
            "the bomb is tiny on the wire ({} bytes)",
            wire.len()
        );
        let (r, hw, _) = feed(&wire, TWO_GIB as usize);
        let e = r.expect_err("refused").to_string();
        assert!(e.contains("unknown format"), "{e}");
        assert!(hw <= BOUND, "held {hw} bytes");
    }

    #[test]
    fn a_bomb_behind_a_valid_header_and_root_is_refused_at_the_first_bad_entry() {
        let mut b = TreeBuilder::new();
        b.push(&entry(b"", Kind::Dir, 0));
        let root_only = b.finish().encoded()[HEADER_LEN..].to_vec();
        // Header claims 50 M entries (which 2 GiB could hold), then the root, then zeros.
        let mut head = header(MAX_ENTRIES);
        head.extend_from_slice(&root_only);
        let zeros = TWO_GIB - head.len() as u64;
        let (r, hw, fed) = feed(&bomb(TWO_GIB, &head, zeros), TWO_GIB as usize);
        let e = r.expect_err("refused").to_string();
        assert!(e.contains("entry 1"), "{e}");
        assert!(hw <= BOUND, "held {hw} bytes");
        assert!(fed <= 128 * 1024, "refused after {fed} wire bytes");
        // A path of 4096 zero bytes: complete, invalid (NUL), refused once it is whole.
        let mut head = header(MAX_ENTRIES);
        head.extend_from_slice(&root_only);
        head.extend_from_slice(&4096u16.to_le_bytes());
        let (r, hw, _) = feed(&bomb(TWO_GIB, &head, TWO_GIB - head.len() as u64), TWO_GIB as usize);
        assert!(r.is_err());
        assert!(hw <= BOUND, "held {hw} bytes");
    }

    #[test]
    fn declared_lengths_and_counts_must_fit_each_other() {
        let ok = sample();
        let n = ok.len() as u32;
        let body = ok.encoded()[HEADER_LEN..].to_vec();
        let wire_of = |count: u32, raw_len: u64| {
            let mut raw = header(count);
            raw.extend_from_slice(&body);
            let mut w = raw_len.to_le_bytes().to_vec();
            w.extend_from_slice(&zstd::bulk::compress(&raw, 1).unwrap());
            w
        };
        let real = (HEADER_LEN + body.len()) as u64;
        assert!(feed(&wire_of(n, real), 1 << 20).0.is_ok());
        for (count, raw_len, why) in [
            (u32::MAX, real, "count beyond MAX_ENTRIES"),
            (MAX_ENTRIES + 1, TWO_GIB, "count beyond MAX_ENTRIES"),
            (MAX_ENTRIES, real, "50 M entries cannot fit a few hundred bytes"),
            (0, real, "no root"),
            (1, TWO_GIB, "one entry cannot justify 2 GiB"),
            (n, real + 1, "length one past the data"),
            (n, real - 1, "data runs past the declared length"),
            (n, TWO_GIB + 1, "beyond the hard cap"),
            (n, 35, "shorter than a header and a root"),
        ] {
            let (r, hw, _) = feed(&wire_of(count, raw_len), TWO_GIB as usize);
            assert!(r.is_err(), "{why}");
            assert!(hw <= BOUND, "{why}: held {hw}");
        }
        // Plain decode checks the same fit without allocating for the claimed count.
        let mut raw = header(MAX_ENTRIES);
        raw.extend_from_slice(&body);
        assert!(TreeManifest::decode(raw).is_err());
    }

    #[test]
    fn nested_lengths_cannot_reach_past_their_entry() {
        let mut b = TreeBuilder::new();
        b.push(&entry(b"", Kind::Dir, 0));
        b.push(&entry(b"l", Kind::Symlink, 6));
        let good = b.finish().encoded().to_vec();
        let link_len_at = good.len() - 6 - 2;
        assert_eq!(&good[link_len_at + 2..], b"target");
        // The symlink target claims 65535 bytes, the manifest ends after 6: never accepted.
        let mut long = good.clone();
        long[link_len_at..link_len_at + 2].copy_from_slice(&u16::MAX.to_le_bytes());
        assert!(TreeManifest::decode(long.clone()).is_err());
        let mut w = (long.len() as u64).to_le_bytes().to_vec();
        w.extend_from_slice(&zstd::bulk::compress(&long, 1).unwrap());
        assert!(feed(&w, 1 << 20).0.is_err());
        // A path length over 4096 is refused as soon as its two bytes are there.
        let mut r = CompressedManifestReader::new(TWO_GIB as usize);
        let mut head = header(2);
        head.extend_from_slice(&good[HEADER_LEN..HEADER_LEN + 24]);
        head.extend_from_slice(&5000u16.to_le_bytes());
        let mut w = TWO_GIB.to_le_bytes().to_vec();
        w.extend_from_slice(&zstd::bulk::compress(&head, 1).unwrap());
        assert!(r.push(&w).is_err(), "refused before the rest arrives");
    }

    #[test]
    fn trailing_frames_and_truncation_are_refused() {
        let wire = sample().encode_compressed();
        let mut two = wire.clone();
        two.extend_from_slice(&zstd::bulk::compress(b"more", 1).unwrap());
        assert!(feed(&two, 1 << 20).0.is_err());
        for cut in [9, wire.len() / 2, wire.len() - 1] {
            assert!(feed(&wire[..cut], 1 << 20).0.is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn large_manifests_decode_from_parts_of_any_size() {
        let mut b = TreeBuilder::new();
        b.push(&entry(b"", Kind::Dir, 0));
        let names: Vec<Vec<u8>> = (0..60_000u32)
            .map(|i| format!("d{:03}/f{i:08}", i % 7).into_bytes())
            .collect();
        let mut sorted = names.clone();
        sorted.sort_by(|a, b| cmp_tree_path(a, b));
        let mut dirs: Vec<Vec<u8>> = (0..7).map(|d| format!("d{d:03}").into_bytes()).collect();
        dirs.sort_by(|a, b| cmp_tree_path(a, b));
        for d in &dirs {
            b.push(&entry(d, Kind::Dir, 0));
            for n in sorted.iter().filter(|n| n.starts_with(d) && n[d.len()] == b'/') {
                b.push(&entry(n, Kind::File, 10));
            }
        }
        let m = b.finish();
        let wire = m.encode_compressed();
        for part in [1usize, 7, 4096, 1 << 20] {
            if part == 1 && wire.len() > 300_000 {
                continue;
            }
            let mut r = CompressedManifestReader::new(TWO_GIB as usize);
            for p in wire.chunks(part) {
                r.push(p).unwrap();
            }
            assert!(
                r.high_water() <= m.encoded().len() + 1,
                "held {} for {}",
                r.high_water(),
                m.encoded().len()
            );
            let back = r.finish().unwrap();
            assert_eq!(back.len(), m.len());
            assert_eq!(back.encoded(), m.encoded());
        }
    }
}
