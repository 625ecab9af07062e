//! Owners, groups and extended attributes of a tree (`sync -o`, `-g`, `-X`), carried in a
//! side table next to the tree manifest rather than inside it: most sessions do not ask
//! for them, and the manifest codec stays one format.
//!
//! The sender `collect`s, per entry of its manifest, uid/gid and the copyable xattrs, with
//! the user and group *names* of those ids; the receiver `apply`s them after every file is
//! in place, mapping names to its own ids as rsync does (unless numeric ids are asked for).
//! As in rsync, owners change only when the receiver runs as root; a group changes where
//! the system allows it. Xattrs: `user.*` always, `trusted.*` as root (Linux); `system.*`
//! (ACLs) and `security.*` (labels, capabilities) are never copied. Elsewhere than Unix:
//! nothing is collected or applied.

use crate::error::{CoreError, Result};
use crate::tree::manifest::TreeManifest;

/// Which attributes a session carries (bits of TREE_OPTIONS' attribute byte).
pub mod attr_flags {
    pub const OWNER: u8 = 1;
    pub const GROUP: u8 = 2;
    pub const XATTRS: u8 = 4;
    /// Apply ids as numbers (rsync's --numeric-ids) instead of mapping names.
    pub const NUMERIC_IDS: u8 = 8;
    pub const ALL: u8 = OWNER | GROUP | XATTRS | NUMERIC_IDS;
}

const MAGIC: &[u8; 4] = b"FFA1";
pub const MAX_XATTRS_PER_ENTRY: usize = 1024;
pub const MAX_XATTR_VALUE: usize = 64 * 1024;
/// Decompressed size bound of a table a peer may send.
pub const MAX_TABLE: usize = 256 << 20;

/// One entry's attributes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EntryAttrs {
    pub uid: u32,
    pub gid: u32,
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

/// The decoded side table: attributes by index in the sender's manifest.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct AttrTable {
    pub flags: u8,
    pub users: Vec<(u32, Vec<u8>)>,
    pub groups: Vec<(u32, Vec<u8>)>,
    pub entries: Vec<(u32, EntryAttrs)>,
}

fn put_names(out: &mut Vec<u8>, names: &[(u32, Vec<u8>)]) {
    out.extend_from_slice(&(names.len() as u32).to_le_bytes());
    for (id, n) in names {
        out.extend_from_slice(&id.to_le_bytes());
        out.push(n.len() as u8);
        out.extend_from_slice(n);
    }
}

impl AttrTable {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.push(self.flags);
        put_names(&mut out, &self.users);
        put_names(&mut out, &self.groups);
        out.extend_from_slice(&(self.entries.len() as u32).to_le_bytes());
        for (i, a) in &self.entries {
            out.extend_from_slice(&i.to_le_bytes());
            if self.flags & attr_flags::OWNER != 0 {
                out.extend_from_slice(&a.uid.to_le_bytes());
            }
            if self.flags & attr_flags::GROUP != 0 {
                out.extend_from_slice(&a.gid.to_le_bytes());
            }
            if self.flags & attr_flags::XATTRS != 0 {
                out.extend_from_slice(&(a.xattrs.len() as u16).to_le_bytes());
                for (n, v) in &a.xattrs {
                    out.push(n.len() as u8);
                    out.extend_from_slice(n);
                    out.extend_from_slice(&(v.len() as u32).to_le_bytes());
                    out.extend_from_slice(v);
                }
            }
        }
        out
    }

    /// Validates everything against `entries` (the sender's manifest length): indices
    /// ascending and in range, names and values bounded.
    pub fn decode(b: &[u8], entries: usize) -> Result<Self> {
        Self::decode_from(&mut Cursor { b, at: 0 }, entries)
    }

    /// The TREE_ATTRS wire form (one zstd frame of the table), decoded as it decompresses:
    /// every field is checked as soon as its bytes are out, so output that breaks a rule
    /// (a bomb of zeros, say) stops the decompression there. Nothing is sized from a
    /// declared length beyond one bounded field (a name ≤ 255 B, a value ≤ 64 KiB); memory
    /// grows with validated entries only, and the whole table may not exceed [`MAX_TABLE`].
    pub fn decode_compressed(compressed: &[u8], entries: usize) -> Result<Self> {
        let bad = |r: String| CoreError::malformed("attribute table", r);
        let mut d = zstd::stream::read::Decoder::with_buffer(compressed)
            .map_err(|e| bad(e.to_string()))?
            .single_frame();
        // The window is never larger than the table (allocated lazily by zstd as it fills).
        d.window_log_max(MAX_TABLE.trailing_zeros())
            .map_err(|e| bad(e.to_string()))?;
        let mut src = Stream {
            r: d,
            buf: Vec::new(),
            read: 0,
            error: None,
        };
        let r = Self::decode_from(&mut src, entries);
        if let Some(e) = src.error {
            return Err(bad(e));
        }
        let table = r?;
        // One frame, nothing after it.
        if !src.r.finish().is_empty() {
            return Err(bad("data after the table's zstd frame".into()));
        }
        Ok(table)
    }

    fn decode_from<S: Src>(c: &mut S, entries: usize) -> Result<Self> {
        let bad = |r: &str| CoreError::malformed("attribute table", r.to_string());
        if c.take(4).ok_or_else(|| bad("short"))? != MAGIC {
            return Err(bad("bad magic"));
        }
        let flags = c.u8().ok_or_else(|| bad("short"))?;
        if flags & !attr_flags::ALL != 0 {
            return Err(bad("unknown flags"));
        }
        let names = |c: &mut S| -> Result<Vec<(u32, Vec<u8>)>> {
            let n = c.u32().ok_or_else(|| bad("short"))? as usize;
            if n > entries.max(1) * 2 + 64 {
                return Err(bad("too many names"));
            }
            let mut v = Vec::with_capacity(n.min(4096));
            for _ in 0..n {
                let id = c.u32().ok_or_else(|| bad("short"))?;
                let len = c.u8().ok_or_else(|| bad("short"))? as usize;
                let name = c.take(len).ok_or_else(|| bad("short"))?;
                if name.is_empty() || name.contains(&0) {
                    return Err(bad("bad name"));
                }
                v.push((id, name.to_vec()));
            }
            Ok(v)
        };
        let users = names(c)?;
        let groups = names(c)?;
        let n = c.u32().ok_or_else(|| bad("short"))? as usize;
        if n > entries {
            return Err(bad("more entries than the manifest"));
        }
        // Sized by validated entries as they come, not by the count (at most the manifest's).
        let mut out = Vec::with_capacity(n.min(4096));
        let mut last: Option<u32> = None;
        for _ in 0..n {
            let i = c.u32().ok_or_else(|| bad("short"))?;
            if i as usize >= entries || last.is_some_and(|l| i <= l) {
                return Err(bad("entry index out of order or range"));
            }
            last = Some(i);
            let mut a = EntryAttrs::default();
            if flags & attr_flags::OWNER != 0 {
                a.uid = c.u32().ok_or_else(|| bad("short"))?;
            }
            if flags & attr_flags::GROUP != 0 {
                a.gid = c.u32().ok_or_else(|| bad("short"))?;
            }
            if flags & attr_flags::XATTRS != 0 {
                let k = c.u16().ok_or_else(|| bad("short"))? as usize;
                if k > MAX_XATTRS_PER_ENTRY {
                    return Err(bad("too many xattrs"));
                }
                for _ in 0..k {
                    let nl = c.u8().ok_or_else(|| bad("short"))? as usize;
                    let name = c.take(nl).ok_or_else(|| bad("short"))?.to_vec();
                    let vl = c.u32().ok_or_else(|| bad("short"))? as usize;
                    if vl > MAX_XATTR_VALUE || name.is_empty() || name.contains(&0) || !copyable(&name, true) {
                        return Err(bad("xattr name or value not acceptable"));
                    }
                    a.xattrs.push((name, c.take(vl).ok_or_else(|| bad("short"))?.to_vec()));
                }
            }
            out.push((i, a));
        }
        if !c.at_end() {
            return Err(bad("trailing bytes"));
        }
        Ok(Self {
            flags,
            users,
            groups,
            entries: out,
        })
    }
}

/// Where a table is decoded from: a buffer, or a decompressing stream.
trait Src {
    /// The next `n` bytes (None: there are fewer).
    fn take(&mut self, n: usize) -> Option<&[u8]>;
    /// Nothing follows.
    fn at_end(&mut self) -> bool;
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|s| s[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|s| u16::from_le_bytes(s.try_into().unwrap()))
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4).map(|s| u32::from_le_bytes(s.try_into().unwrap()))
    }
}

struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl Src for Cursor<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let s = self.b.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }
    fn at_end(&mut self) -> bool {
        self.at == self.b.len()
    }
}

/// Decompressed bytes pulled field by field; one field's bytes are held at a time.
struct Stream<R: std::io::Read> {
    r: R,
    buf: Vec<u8>,
    read: usize,
    /// Why the stream failed (not decompressible, over MAX_TABLE), reported over "short".
    error: Option<String>,
}

impl<R: std::io::Read> Src for Stream<R> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        if self.read.checked_add(n)? > MAX_TABLE {
            self.error = Some(format!("decompresses beyond {MAX_TABLE} bytes"));
            return None;
        }
        // `n` is a field length decode has already bounded (≤ 64 KiB).
        self.buf.resize(n, 0);
        if let Err(e) = self.r.read_exact(&mut self.buf) {
            if e.kind() != std::io::ErrorKind::UnexpectedEof {
                self.error = Some(format!("does not decompress: {e}"));
            }
            return None;
        }
        self.read += n;
        Some(&self.buf)
    }
    fn at_end(&mut self) -> bool {
        let mut one = [0u8; 1];
        match self.r.read(&mut one) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => {
                self.error = Some(format!("does not decompress: {e}"));
                false
            }
        }
    }
}

/// Xattr names worth copying (see the module comment). `as_root`: the process may set
/// privileged namespaces.
pub fn copyable(name: &[u8], as_root: bool) -> bool {
    if cfg!(target_os = "linux") {
        name.starts_with(b"user.") || (as_root && name.starts_with(b"trusted."))
    } else {
        true
    }
}

#[cfg(unix)]
fn is_root() -> bool {
    uzers::get_effective_uid() == 0
}

/// Sender: the attributes of the entries `want` selects (by index), per `flags`. Owners
/// and groups are the ones the walk's lstat saw (`owner`), as rsync's file list carries
/// them: no second stat per entry. Xattrs are read now.
#[cfg(unix)]
pub fn collect(
    root: &std::path::Path,
    manifest: &TreeManifest,
    flags: u8,
    want: impl Fn(usize) -> bool + Sync,
    owner: impl Fn(usize) -> (u32, u32) + Sync,
) -> AttrTable {
    use rayon::prelude::*;
    use std::os::unix::ffi::OsStrExt;
    let root_user = is_root();
    let entries: Vec<(u32, EntryAttrs)> = (0..manifest.len())
        .into_par_iter()
        .filter(|&i| want(i))
        .map(|i| {
            let e = manifest.entry(i);
            let (uid, gid) = owner(i);
            let mut a = EntryAttrs {
                uid,
                gid,
                xattrs: Vec::new(),
            };
            if flags & attr_flags::XATTRS != 0 && e.kind != crate::tree::manifest::Kind::Symlink {
                let p = crate::tree::path::join(root, e.path);
                if let Ok(names) = xattr::list(&p) {
                    for n in names {
                        let nb = n.as_bytes();
                        if nb.len() > 255 || !copyable(nb, root_user) || a.xattrs.len() >= MAX_XATTRS_PER_ENTRY {
                            continue;
                        }
                        if let Ok(Some(v)) = xattr::get(&p, &n) {
                            if v.len() <= MAX_XATTR_VALUE {
                                a.xattrs.push((nb.to_vec(), v));
                            }
                        }
                    }
                    a.xattrs.sort();
                }
            }
            (i as u32, a)
        })
        .collect();
    let mut users: Vec<(u32, Vec<u8>)> = Vec::new();
    let mut groups: Vec<(u32, Vec<u8>)> = Vec::new();
    if flags & attr_flags::NUMERIC_IDS == 0 {
        let mut uids: Vec<u32> = entries.iter().map(|(_, a)| a.uid).collect();
        let mut gids: Vec<u32> = entries.iter().map(|(_, a)| a.gid).collect();
        uids.sort_unstable();
        uids.dedup();
        gids.sort_unstable();
        gids.dedup();
        if flags & attr_flags::OWNER != 0 {
            users = uids
                .into_iter()
                .filter_map(|u| uzers::get_user_by_uid(u).map(|x| (u, x.name().as_bytes().to_vec())))
                .filter(|(_, n)| !n.is_empty() && n.len() <= 255)
                .collect();
        }
        if flags & attr_flags::GROUP != 0 {
            groups = gids
                .into_iter()
                .filter_map(|g| uzers::get_group_by_gid(g).map(|x| (g, x.name().as_bytes().to_vec())))
                .filter(|(_, n)| !n.is_empty() && n.len() <= 255)
                .collect();
        }
    }
    AttrTable {
        flags,
        users,
        groups,
        entries,
    }
}

#[cfg(not(unix))]
pub fn collect(
    _root: &std::path::Path,
    _manifest: &TreeManifest,
    flags: u8,
    _want: impl Fn(usize) -> bool + Sync,
    _owner: impl Fn(usize) -> (u32, u32) + Sync,
) -> AttrTable {
    AttrTable {
        flags,
        ..Default::default()
    }
}

/// rsync's --chown USER:GROUP on the receiver: ids resolved here, either part optional.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Chown {
    pub uid: Option<u32>,
    pub gid: Option<u32>,
}

impl Chown {
    /// `USER:GROUP`, `USER`, `:GROUP` (names as this machine knows them, or numeric ids).
    /// An unknown name is a usage error.
    pub fn parse(spec: &str) -> crate::Result<Chown> {
        let (user, group) = match spec.split_once(':') {
            Some((u, g)) => (u, g),
            None => (spec, ""),
        };
        let unknown = |what: &str, name: &str| crate::CoreError::Usage(format!("--chown: unknown {what} {name:?}"));
        let uid = match user {
            "" => None,
            u => Some(match u.parse::<u32>() {
                Ok(id) => id,
                Err(_) => lookup_user(u).ok_or_else(|| unknown("user", u))?,
            }),
        };
        let gid = match group {
            "" => None,
            g => Some(match g.parse::<u32>() {
                Ok(id) => id,
                Err(_) => lookup_group(g).ok_or_else(|| unknown("group", g))?,
            }),
        };
        Ok(Chown { uid, gid })
    }
}

#[cfg(unix)]
fn lookup_user(name: &str) -> Option<u32> {
    uzers::get_user_by_name(name).map(|u| u.uid())
}

#[cfg(unix)]
fn lookup_group(name: &str) -> Option<u32> {
    uzers::get_group_by_name(name).map(|g| g.gid())
}

#[cfg(not(unix))]
fn lookup_user(_name: &str) -> Option<u32> {
    None
}

#[cfg(not(unix))]
fn lookup_group(_name: &str) -> Option<u32> {
    None
}

/// What `apply` did: per-path problems, warnings, and whether it changed anything.
#[derive(Debug, Default)]
pub struct Applied {
    pub problems: Vec<String>,
    pub warnings: Vec<String>,
    pub changed: bool,
}

/// Receiver: apply `table` to the entries of the sender's `manifest` under `root`.
/// `walked(i)`: the owner and group our walk saw at sender entry `i`'s path, if the session
/// has not replaced that entry since (None: unknown, look). An entry whose owner and group
/// already match, with no xattrs to carry, is left alone without a syscall, so an unchanged
/// tree costs nothing here (rsync's generator decides from its one stat the same way).
/// Every path is resolved beneath the `root` handle without following links; owners are
/// changed with `fchownat(AT_SYMLINK_NOFOLLOW)` and xattrs through descriptors we opened.
/// `chown` (rsync's --chown, resolved here): this user and/or group for every entry,
/// whatever the sender's table says.
#[cfg(unix)]
pub fn apply(
    root: &crate::beneath::Dir,
    manifest: &TreeManifest,
    table: &AttrTable,
    walked: impl Fn(usize) -> Option<(u32, u32)>,
    chown: Chown,
) -> Applied {
    use std::collections::HashMap;
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::MetadataExt;
    let (mut problems, mut warnings) = (Vec::new(), Vec::new());
    let numeric = table.flags & attr_flags::NUMERIC_IDS != 0;
    // Sender id -> our id: by name where the name exists here (rsync's default mapping).
    let users: HashMap<u32, u32> = table
        .users
        .iter()
        .filter_map(|(id, n)| uzers::get_user_by_name(OsStr::from_bytes(n)).map(|u| (*id, u.uid())))
        .collect();
    let groups: HashMap<u32, u32> = table
        .groups
        .iter()
        .filter_map(|(id, n)| uzers::get_group_by_name(OsStr::from_bytes(n)).map(|g| (*id, g.gid())))
        .collect();
    let root_user = is_root();
    let (want_owner, want_group) = (
        table.flags & attr_flags::OWNER != 0 && root_user,
        table.flags & attr_flags::GROUP != 0,
    );
    let mut xattrs_unsupported = false;
    let mut changed = false;
    let with_xattrs = table.flags & attr_flags::XATTRS != 0;
    // The id to set, if asked for and different: --chown's, else the sender's mapped by name.
    let target = |want: bool, id: u32, by_name: &HashMap<u32, u32>, now: u32, forced: Option<u32>| {
        let id = forced.unwrap_or(if numeric { id } else { *by_name.get(&id).unwrap_or(&id) });
        (want && id != now).then_some(id)
    };
    for (i, a) in &table.entries {
        if let (false, Some((now_uid, now_gid))) = (with_xattrs, walked(*i as usize)) {
            if target(want_owner, a.uid, &users, now_uid, chown.uid).is_none()
                && target(want_group, a.gid, &groups, now_gid, chown.gid).is_none()
            {
                continue;
            }
        }
        let rel = manifest.entry(*i as usize).path;
        // The root itself is adjusted through its handle; anything else through its
        // parent's handle (`place`), never through a link.
        let place = if rel.is_empty() {
            None
        } else {
            match crate::beneath::Target::beneath(root, rel) {
                Ok(t) => Some(t),
                Err(_) => continue, // a link or non-directory on the way: nothing to adjust
            }
        };
        let (now_uid, now_gid, is_link) = match &place {
            None => match root.as_file().and_then(|f| f.metadata()) {
                Ok(m) => (m.uid(), m.gid(), false),
                Err(_) => continue,
            },
            Some(t) => match t.lstat() {
                Ok(Some(st)) => (st.uid, st.gid, st.is_symlink()),
                _ => continue, // not there (skipped, vanished, failed): nothing to adjust
            },
        };
        let show = || crate::tree::path::display(if rel.is_empty() { b"." } else { rel });
        let uid = target(want_owner, a.uid, &users, now_uid, chown.uid);
        let gid = target(want_group, a.gid, &groups, now_gid, chown.gid);
        if uid.is_some() || gid.is_some() {
            let (u, g) = (uid.unwrap_or(u32::MAX), gid.unwrap_or(u32::MAX));
            let res = match &place {
                Some(t) => t.dir.lchown(&t.name, u, g),
                None => root.as_file().and_then(|f| std::os::unix::fs::fchown(&f, uid, gid)),
            };
            match res {
                Ok(()) => changed = true,
                // A group the (non-root) user does not belong to: rsync leaves it too.
                Err(e) if e.kind() != std::io::ErrorKind::PermissionDenied || root_user => {
                    problems.push(format!("cannot change owner of {}: {e}", show()));
                }
                Err(_) => {}
            }
        }
        if table.flags & attr_flags::XATTRS != 0 && !xattrs_unsupported && !is_link {
            // Through a descriptor of the entry itself (a file, or a directory opened
            // beneath its parent without following a link).
            let handle = match &place {
                None => root.as_file(),
                Some(t) => t
                    .open_read()
                    .or_else(|_| t.dir.open_dir(&t.name).and_then(|d| d.as_file())),
            };
            match handle.and_then(|f| sync_xattrs(&f, &a.xattrs, root_user)) {
                Ok(set) => changed |= set,
                Err(e) => {
                    if e.raw_os_error() == Some(libc::ENOTSUP) || e.raw_os_error() == Some(libc::EOPNOTSUPP) {
                        warnings.push(format!(
                            "the target filesystem does not support extended attributes ({})",
                            show()
                        ));
                        xattrs_unsupported = true;
                    } else {
                        problems.push(format!("cannot set extended attributes of {}: {e}", show()));
                    }
                }
            }
        }
    }
    Applied {
        problems,
        warnings,
        changed,
    }
}

/// Make `p`'s copyable xattrs exactly `want`: set what differs, remove what the sender
/// lacks. True if it changed anything.
#[cfg(unix)]
fn sync_xattrs(f: &std::fs::File, want: &[(Vec<u8>, Vec<u8>)], root_user: bool) -> std::io::Result<bool> {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    use xattr::FileExt;
    let mut changed = false;
    for n in f.list_xattr()? {
        let nb = n.as_bytes();
        if copyable(nb, root_user) && !want.iter().any(|(w, _)| w == nb) {
            f.remove_xattr(&n)?;
            changed = true;
        }
    }
    for (n, v) in want {
        let name = OsStr::from_bytes(n);
        if f.get_xattr(name)?.as_deref() != Some(v.as_slice()) {
            f.set_xattr(name, v)?;
            changed = true;
        }
    }
    Ok(changed)
}

#[cfg(not(unix))]
pub fn apply(
    _root: &crate::beneath::Dir,
    _manifest: &TreeManifest,
    _table: &AttrTable,
    _walked: impl Fn(usize) -> Option<(u32, u32)>,
    _chown: Chown,
) -> Applied {
    Applied {
        warnings: vec!["owners, groups and extended attributes are not applied on this platform".into()],
        ..Applied::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testutil::zstd_zeros as zstd_of;

    #[test]
    fn compressed_tables_decode_as_they_decompress_and_bombs_stop_early() {
        let t = AttrTable {
            flags: attr_flags::OWNER | attr_flags::XATTRS,
            users: vec![(1000, b"alice".to_vec())],
            groups: vec![],
            entries: vec![(
                1,
                EntryAttrs {
                    uid: 1000,
                    gid: 0,
                    xattrs: vec![(b"user.k".to_vec(), vec![7; 70_000 / 2])],
                },
            )],
        };
        let wire = zstd::bulk::compress(&t.encode(), 3).unwrap();
        assert_eq!(AttrTable::decode_compressed(&wire, 2).unwrap(), t);
        assert!(AttrTable::decode_compressed(&wire, 1).is_err());
        // Two frames, or garbage: refused.
        let mut two = wire.clone();
        two.extend_from_slice(&wire);
        assert!(AttrTable::decode_compressed(&two, 2).is_err());
        assert!(AttrTable::decode_compressed(&[0x28, 0xb5, 0x2f, 0xfd, 1, 2, 3], 2).is_err());
        // Bombs of 1 GiB (a few KiB compressed each), made before the clock starts: making
        // them compresses 3 GiB, which a loaded CI machine once took 2.3 s for (the decodes
        // are what is timed).
        // 1 GiB of zeros: refused at the magic.
        let zeros = zstd_of(b"", 1 << 30);
        // A valid empty table followed by zeros: refused at the first trailing byte.
        let mut head = MAGIC.to_vec();
        head.push(attr_flags::XATTRS);
        head.extend_from_slice(&[0; 12]);
        let trailing = zstd_of(&head, 1 << 30);
        // An entry count the manifest cannot have: refused before any entry.
        let mut head = MAGIC.to_vec();
        head.push(attr_flags::OWNER);
        head.extend_from_slice(&[0; 8]);
        head.extend_from_slice(&u32::MAX.to_le_bytes());
        let counted = zstd_of(&head, 1 << 30);
        let t0 = std::time::Instant::now();
        for (bomb, why) in [
            (&zeros, "bad magic"),
            (&trailing, "trailing"),
            (&counted, "more entries"),
        ] {
            let e = AttrTable::decode_compressed(bomb, 2).unwrap_err().to_string();
            assert!(e.contains(why), "{e}");
        }
        // Stopping early takes moments; inflating any one of them whole would take seconds.
        assert!(t0.elapsed() < std::time::Duration::from_secs(2), "{:?}", t0.elapsed());
    }

    #[test]
    fn table_round_trips_and_hostile_tables_are_refused() {
        let t = AttrTable {
            flags: attr_flags::OWNER | attr_flags::GROUP | attr_flags::XATTRS,
            users: vec![(1000, b"alice".to_vec())],
            groups: vec![(100, b"users".to_vec())],
            entries: vec![
                (0, EntryAttrs::default()),
                (
                    3,
                    EntryAttrs {
                        uid: 1000,
                        gid: 100,
                        xattrs: vec![(b"user.k".to_vec(), b"v".to_vec())],
                    },
                ),
            ],
        };
        let b = t.encode();
        assert_eq!(AttrTable::decode(&b, 4).unwrap(), t);
        // Index 3 does not exist in a 3-entry manifest.
        assert!(AttrTable::decode(&b, 3).is_err());
        // Every truncation and a trailing byte are refused.
        for n in 0..b.len() {
            assert!(AttrTable::decode(&b[..n], 4).is_err(), "truncated at {n}");
        }
        let mut long = b.clone();
        long.push(0);
        assert!(AttrTable::decode(&long, 4).is_err());
        // A privileged namespace from the wire is refused on Linux.
        let mut evil = t;
        evil.entries[1].1.xattrs[0].0 = b"security.capability".to_vec();
        if cfg!(target_os = "linux") {
            assert!(AttrTable::decode(&evil.encode(), 4).is_err());
        }
    }
}
