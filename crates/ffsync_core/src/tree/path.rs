//! Relative paths inside a tree: '/'-separated bytes (names are bytes on Linux, so they
//! round-trip even when they are not UTF-8), their canonical order, and validation of
//! paths that arrive from a peer.

use std::cmp::Ordering;
use std::path::{Path, PathBuf};

/// Longest relative path accepted from a peer (Linux PATH_MAX is 4096 for a whole path).
pub const MAX_REL_PATH: usize = 4096;

/// Tree order: component by component, each compared as bytes. It is the order of a
/// depth-first walk that visits each directory's entries sorted by name, so both peers
/// produce it without sorting whole trees, and a parent always precedes its contents.
/// Equivalent to comparing bytes with '/' ranked below every other byte.
pub fn cmp_tree_path(a: &[u8], b: &[u8]) -> Ordering {
    let key = |c: u8| if c == b'/' { 0u16 } else { c as u16 + 1 };
    for (x, y) in a.iter().zip(b.iter()) {
        let o = key(*x).cmp(&key(*y));
        if o != Ordering::Equal {
            return o;
        }
    }
    a.len().cmp(&b.len())
}

/// A relative path a peer may name: non-empty components, no `.`/`..`, no NUL, no leading
/// or trailing '/', and (on Windows) no drive letters or backslashes. Nothing a peer sends
/// can address a file outside the tree root.
pub fn is_valid_rel(p: &[u8]) -> bool {
    if p.is_empty() || p.len() > MAX_REL_PATH {
        return false;
    }
    p.split(|c| *c == b'/').all(|c| {
        !c.is_empty()
            && c != b"."
            && c != b".."
            && !c.contains(&0)
            && (cfg!(unix) || !c.iter().any(|b| b"\\:".contains(b)))
    })
}

/// The directory part of a relative path (`b""` for top-level entries).
pub fn parent_of(p: &[u8]) -> &[u8] {
    match p.iter().rposition(|c| *c == b'/') {
        Some(i) => &p[..i],
        None => b"",
    }
}

/// The last component.
pub fn name_of(p: &[u8]) -> &[u8] {
    match p.iter().rposition(|c| *c == b'/') {
        Some(i) => &p[i + 1..],
        None => p,
    }
}

/// True when `p` lies strictly below directory `dir` (`dir` = `b""` is the root).
pub fn is_under(p: &[u8], dir: &[u8]) -> bool {
    dir.is_empty() && !p.is_empty() || p.len() > dir.len() && p.starts_with(dir) && p[dir.len()] == b'/'
}

/// `root` joined with a relative path (empty = the root itself).
pub fn join(root: &Path, rel: &[u8]) -> PathBuf {
    if rel.is_empty() {
        return root.to_path_buf();
    }
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        root.join(std::ffi::OsStr::from_bytes(rel))
    }
    #[cfg(not(unix))]
    {
        root.join(String::from_utf8_lossy(rel).replace('/', "\\"))
    }
}

/// The bytes of a file name as they travel (UTF-8 where the OS has no byte names).
pub fn name_bytes(name: &std::ffi::OsStr) -> Vec<u8> {
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        name.as_bytes().to_vec()
    }
    #[cfg(not(unix))]
    {
        name.to_string_lossy().into_owned().into_bytes()
    }
}

/// A file name from its bytes as they travel (the inverse of [`name_bytes`]).
pub fn os_name(bytes: &[u8]) -> std::ffi::OsString {
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        std::ffi::OsStr::from_bytes(bytes).to_os_string()
    }
    #[cfg(not(unix))]
    {
        String::from_utf8_lossy(bytes).into_owned().into()
    }
}

/// Printable form for messages (invalid UTF-8 shown with replacement characters).
pub fn display(p: &[u8]) -> String {
    String::from_utf8_lossy(p).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_order_puts_contents_right_after_their_directory() {
        let mut v: Vec<&[u8]> = vec![b"a-b", b"a/x", b"a", b"b", b"a/x/y", b"a0"];
        v.sort_by(|a, b| cmp_tree_path(a, b));
        assert_eq!(v, vec![&b"a"[..], b"a/x", b"a/x/y", b"a-b", b"a0", b"b"]);
    }

    #[test]
    fn peer_paths_cannot_escape() {
        for bad in [&b""[..], b"/etc", b"a/../b", b"..", b".", b"a//b", b"a/", b"a\0b"] {
            assert!(!is_valid_rel(bad), "{:?}", display(bad));
        }
        for good in [&b"a"[..], b"a/b/c", b".hidden", b"..x", b"\xff\xfe"] {
            assert!(is_valid_rel(good));
        }
    }

    #[test]
    fn parents_and_names() {
        assert_eq!(parent_of(b"a/b/c"), b"a/b");
        assert_eq!(parent_of(b"a"), b"");
        assert_eq!(name_of(b"a/b/c"), b"c");
        assert!(is_under(b"a/b", b"a"));
        assert!(!is_under(b"ab", b"a"));
        assert!(!is_under(b"a", b"a"));
        assert!(is_under(b"a", b""));
    }
}
