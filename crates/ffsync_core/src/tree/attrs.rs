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
        let bad = |r: &str| CoreError::malformed("attribute table", r.to_string());
        let mut c = Cursor { b, at: 0 };
        if c.take(4).ok_or_else(|| bad("short"))? != MAGIC {
            return Err(bad("bad magic"));
        }
        let flags = c.u8().ok_or_else(|| bad("short"))?;
        if flags & !attr_flags::ALL != 0 {
            return Err(bad("unknown flags"));
        }
        let names = |c: &mut Cursor| -> Result<Vec<(u32, Vec<u8>)>> {
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
        let users = names(&mut c)?;
        let groups = names(&mut c)?;
        let n = c.u32().ok_or_else(|| bad("short"))? as usize;
        if n > entries {
            return Err(bad("more entries than the manifest"));
        }
        let mut out = Vec::with_capacity(n);
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
        if c.at != b.len() {
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

struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.b.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }
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

/// Sender: the attributes of the entries `want` selects (by index), per `flags`.
#[cfg(unix)]
pub fn collect(
    root: &std::path::Path,
    manifest: &TreeManifest,
    flags: u8,
    want: impl Fn(usize) -> bool + Sync,
) -> AttrTable {
    use rayon::prelude::*;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::MetadataExt;
    let root_user = is_root();
    let entries: Vec<(u32, EntryAttrs)> = (0..manifest.len())
        .into_par_iter()
        .filter(|&i| want(i))
        .filter_map(|i| {
            let p = crate::tree::path::join(root, manifest.entry(i).path);
            let m = std::fs::symlink_metadata(&p).ok()?; // vanished: nothing to carry
            let mut a = EntryAttrs {
                uid: m.uid(),
                gid: m.gid(),
                xattrs: Vec::new(),
            };
            if flags & attr_flags::XATTRS != 0 && !m.file_type().is_symlink() {
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
            Some((i as u32, a))
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
) -> AttrTable {
    AttrTable {
        flags,
        ..Default::default()
    }
}

/// Receiver: apply `table` to the entries of the sender's `manifest` under `root`. Returns
/// problems (paths whose attributes could not be set) and warnings.
#[cfg(unix)]
pub fn apply(root: &std::path::Path, manifest: &TreeManifest, table: &AttrTable) -> (Vec<String>, Vec<String>) {
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
    for (i, a) in &table.entries {
        let rel = manifest.entry(*i as usize).path;
        let p = crate::tree::path::join(root, rel);
        let Ok(m) = std::fs::symlink_metadata(&p) else {
            continue; // not there (skipped, vanished, failed): nothing to adjust
        };
        let show = || crate::tree::path::display(if rel.is_empty() { b"." } else { rel });
        // The id to set, if asked for and different: the sender's, mapped by name.
        let target = |want: bool, id: u32, by_name: &HashMap<u32, u32>, now: u32| {
            let id = if numeric { id } else { *by_name.get(&id).unwrap_or(&id) };
            (want && id != now).then_some(id)
        };
        let uid = target(want_owner, a.uid, &users, m.uid());
        let gid = target(want_group, a.gid, &groups, m.gid());
        if uid.is_some() || gid.is_some() {
            if let Err(e) = std::os::unix::fs::lchown(&p, uid, gid) {
                // A group the (non-root) user does not belong to: rsync leaves it too.
                if e.kind() != std::io::ErrorKind::PermissionDenied || root_user {
                    problems.push(format!("cannot change owner of {}: {e}", show()));
                }
            }
        }
        if table.flags & attr_flags::XATTRS != 0 && !xattrs_unsupported && !m.file_type().is_symlink() {
            if let Err(e) = sync_xattrs(&p, &a.xattrs, root_user) {
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
    (problems, warnings)
}

/// Make `p`'s copyable xattrs exactly `want`: set what differs, remove what the sender lacks.
#[cfg(unix)]
fn sync_xattrs(p: &std::path::Path, want: &[(Vec<u8>, Vec<u8>)], root_user: bool) -> std::io::Result<()> {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    for n in xattr::list(p)? {
        let nb = n.as_bytes();
        if copyable(nb, root_user) && !want.iter().any(|(w, _)| w == nb) {
            xattr::remove(p, &n)?;
        }
    }
    for (n, v) in want {
        let name = OsStr::from_bytes(n);
        if xattr::get(p, name)?.as_deref() != Some(v.as_slice()) {
            xattr::set(p, name, v)?;
        }
    }
    Ok(())
}

#[cfg(not(unix))]
pub fn apply(_root: &std::path::Path, _manifest: &TreeManifest, _table: &AttrTable) -> (Vec<String>, Vec<String>) {
    (
        Vec::new(),
        vec!["owners, groups and extended attributes are not applied on this platform".into()],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

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
