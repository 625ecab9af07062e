//! The restorer's temp files. A partial is `.<name>.<16 hex of the sender's root>.ffsync-part`
//! beside its target (so a rerun against the same source finds and resumes it, and another
//! version's partial is recognisably stale); early placement's provisional file is
//! `.<name>.streaming.ffsync-part` until the root is known. Everything here works beneath a
//! directory handle and never follows a link at a name it creates, reuses or removes; only
//! our own files (regular, one link, owned by us) are reused or removed.

use crate::beneath::{Dir, Target};
use crate::chunker::Hash;
use crate::error::{CoreError, Result};
use crate::tree::path::os_name;
use std::fs::File;
use std::path::{Path, PathBuf};

pub const PARTIAL_SUFFIX: &str = ".ffsync-part";

/// Longest file name most filesystems accept (ext4, xfs, btrfs, APFS: 255 bytes).
pub(crate) const NAME_MAX: usize = 255;

/// `.<name>` — or, for a name too long to carry our suffix within NAME_MAX, a prefix of it
/// plus a hash of the whole name (still unique per target name).
pub(crate) fn partial_stem(target: &Path) -> Vec<u8> {
    partial_stem_of(&crate::tree::path::name_bytes(target.file_name().unwrap_or_default()))
}

pub(crate) fn partial_stem_of(name: &[u8]) -> Vec<u8> {
    let name = name.to_vec();
    let room = NAME_MAX - 1 - 1 - 16 - PARTIAL_SUFFIX.len();
    let mut stem = vec![b'.'];
    if name.len() <= room {
        stem.extend_from_slice(&name);
    } else {
        let mut cut = room - 17;
        // Keep the prefix valid UTF-8 where the name is, so it stays printable.
        while cut > 0 && std::str::from_utf8(&name[..cut]).is_err() && std::str::from_utf8(&name).is_ok() {
            cut -= 1;
        }
        stem.extend_from_slice(&name[..cut]);
        stem.push(b'~');
        stem.extend_from_slice(crate::manifest::hex(&blake3::hash(&name).as_bytes()[..8]).as_bytes());
    }
    stem
}

pub fn partial_path(target: &Path, root: &Hash) -> PathBuf {
    let name = crate::tree::path::name_bytes(target.file_name().unwrap_or_default());
    target.with_file_name(partial_name(&name, root))
}

/// The partial's name for target name `name` and the sender's root.
pub fn partial_name(name: &[u8], root: &Hash) -> std::ffi::OsString {
    // Built from the name's own bytes: two names that differ only in bytes that are not
    // UTF-8 must not share a temp file.
    let mut name = partial_stem_of(name);
    name.extend_from_slice(format!(".{}{PARTIAL_SUFFIX}", crate::manifest::hex(&root[..8])).as_bytes());
    os_name(&name)
}

/// What lies between `.<name>.` and `.ffsync-part` in `candidate`, if it has that shape.
pub(crate) fn partial_middle<'a>(name: &[u8], candidate: &'a [u8]) -> Option<&'a [u8]> {
    let mut prefix = partial_stem_of(name);
    prefix.push(b'.');
    candidate
        .strip_prefix(&prefix[..])
        .and_then(|r| r.strip_suffix(PARTIAL_SUFFIX.as_bytes()))
}

pub(crate) fn is_version(mid: &[u8]) -> bool {
    mid.len() == 16 && mid.iter().all(u8::is_ascii_hexdigit)
}

/// `candidate` names a partial of a file named `name`: a version's (`.<name>.<16 hex>.ffsync-part`)
/// or early placement's provisional one (`.<name>.streaming.ffsync-part`), compared as bytes.
pub(crate) fn is_partial_name(name: &[u8], candidate: &[u8]) -> bool {
    partial_middle(name, candidate).is_some_and(|mid| mid == b"streaming" || is_version(mid))
}

/// The partial of `target` for the sender's root: a sibling in the same directory handle.
pub fn partial_of(target: &Target, root: &Hash) -> Target {
    target.sibling(partial_name(&target.name_bytes(), root))
}

/// The provisional temp file of early placement (its root is not known yet):
/// `.<name>.streaming.ffsync-part`. Adopted by renaming it to `partial_path`; kept after a
/// dropped connection, and then resumed like a partial by the next attempt (`begin_with`).
pub fn streaming_path(target: &Path) -> PathBuf {
    let name = crate::tree::path::name_bytes(target.file_name().unwrap_or_default());
    target.with_file_name(streaming_name(&name))
}

pub(crate) fn streaming_name(name: &[u8]) -> std::ffi::OsString {
    let mut name = partial_stem_of(name);
    name.extend_from_slice(format!(".streaming{PARTIAL_SUFFIX}").as_bytes());
    os_name(&name)
}

/// The provisional early-placement file of `target`, a sibling in its directory handle.
pub fn streaming_of(target: &Target) -> Target {
    target.sibling(streaming_name(&target.name_bytes()))
}

/// A partial of an earlier attempt at `target` exists (any version): a resume may use it.
pub fn has_resumable_partial(target: &Path) -> bool {
    Target::from_user_path(target).is_ok_and(|t| has_resumable_partial_at(&t))
}

/// As [`has_resumable_partial`], for a target resolved beneath a directory handle.
pub fn has_resumable_partial_at(target: &Target) -> bool {
    let mut found = streaming_of(target).lstat().ok().flatten().is_some_and(|m| m.is_file());
    for_each_partial(target, |_| found = true);
    found
}

/// Calls `f` with each partial of `target` (`.<name>.<16 hex>.ffsync-part`, compared as bytes).
pub(crate) fn for_each_partial(target: &Target, mut f: impl FnMut(Target)) {
    let name = target.name_bytes();
    let Ok(names) = target.dir.names() else { return };
    for n in names {
        if partial_middle(&name, &crate::tree::path::name_bytes(&n)).is_some_and(is_version) {
            f(target.sibling(n));
        }
    }
}

/// Our partials of the files named `names` in `sibling`'s directory, removed, with one listing
/// of it for all of them: each of these files was just renamed into place whole, so an earlier
/// chunk-level attempt's partial of any version (or early placement's) is never resumed. Only
/// private regular files of ours go, as in [`remove_stale_partials`].
pub(crate) fn remove_partials_of(sibling: &Target, names: &[Vec<u8>]) {
    let Ok(listing) = sibling.dir.names() else { return };
    for n in listing {
        let candidate = crate::tree::path::name_bytes(&n);
        if names.iter().any(|name| is_partial_name(name, &candidate)) {
            unlink_if_ours(&sibling.sibling(n));
        }
    }
}

/// Only our own files go: a name planted by someone else (a hard link to a file elsewhere,
/// another user's file) is not ours to remove or reuse.
fn unlink_if_ours(p: &Target) {
    if p.open_read().is_ok_and(|f| crate::beneath::is_private_regular(&f)) {
        let _ = p.unlink();
    }
}

pub(crate) fn remove_stale_partials(target: &Target, keep: &Target) {
    for_each_partial(target, |p| {
        if p.name != keep.name {
            unlink_if_ours(&p);
        }
    });
    // A provisional file of early placement that was not adopted (a receiver killed
    // mid-stream) is never resumable.
    unlink_if_ours(&streaming_of(target));
}

/// Reopen an existing partial for resuming: only a regular file with one link, owned by
/// us (opened without following a link, then checked through the open descriptor). A
/// name held by anything else is left alone and the partial gets a fresh name.
pub(crate) fn open_resumable(temp: &mut Target, size: u64) -> Result<Option<File>> {
    match temp.lstat() {
        Ok(Some(_)) => {
            let ours = temp.open_rw().ok().filter(crate::beneath::is_private_regular);
            let Some(f) = ours else {
                *temp = fresh_sibling(temp)?;
                return Ok(None);
            };
            let len = f.metadata().map_err(|e| CoreError::io(temp.shown(), e))?.len();
            if len != size {
                f.set_len(size).map_err(|e| CoreError::io(temp.shown(), e))?;
            }
            Ok(Some(f))
        }
        _ => Ok(None),
    }
}

/// Create a fresh temp file at `temp` (`O_EXCL`, never through a link). A stale file of
/// ours at the name (a regular file with one link, owned by us: an earlier run killed
/// mid-write) is replaced; anything else there is left alone and a fresh name is used.
pub fn create_exclusive(temp: Target) -> std::io::Result<(Target, File)> {
    match temp.create_new(0o600) {
        Ok(f) => return Ok((temp, f)),
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e),
        Err(_) => {}
    }
    if temp.open_read().is_ok_and(|f| crate::beneath::is_private_regular(&f)) {
        temp.unlink()?;
        return temp.create_new(0o600).map(|f| (temp, f));
    }
    let fresh = fresh_sibling(&temp).map_err(|e| std::io::Error::other(e.to_string()))?;
    let f = fresh.create_new(0o600)?;
    Ok((fresh, f))
}

/// A free name beside `taken` (`<taken>.<n>`), for when a planted entry holds the name.
pub(crate) fn fresh_sibling(taken: &Target) -> Result<Target> {
    for n in 1..1000u32 {
        let mut name = taken.name_bytes();
        name.extend_from_slice(format!(".{n}").as_bytes());
        let t = taken.sibling(os_name(&name));
        if t.lstat().map_err(|e| CoreError::io(t.shown(), e))?.is_none() {
            return Ok(t);
        }
    }
    Err(CoreError::io(
        taken.shown(),
        std::io::Error::new(std::io::ErrorKind::AlreadyExists, "no free temp name beside it"),
    ))
}

/// Start the temp file as a reflink clone of the old target (source 0 when it is the target
/// itself), sized to the new length. None where the filesystem cannot clone.
pub(crate) fn clone_old_target(old: &File, temp: &Target, size: u64) -> Result<Option<File>> {
    let Some(f) = crate::io::clone_to_new_at(old, &temp.dir, &temp.name).map_err(|e| CoreError::io(temp.shown(), e))?
    else {
        return Ok(None);
    };
    if let Err(e) = f.set_len(size) {
        let _ = temp.unlink();
        return Err(CoreError::io(temp.shown(), e));
    }
    Ok(Some(f))
}

/// `--inplace` staging file: sparse (only the changed chunks are ever written to it).
pub(crate) fn create_staging(temp: &Target, size: u64) -> Result<File> {
    let f = temp.create_new(0o600).map_err(|e| CoreError::io(temp.shown(), e))?;
    if let Err(e) = f.set_len(size) {
        let _ = temp.unlink();
        return Err(CoreError::io(temp.shown(), e));
    }
    Ok(f)
}

/// The temp file, sized but not allocated: space is committed only as verified data is
/// written into it, never on the peer's word (an offer of 1 TiB followed by a disconnect
/// must not leave 1 TiB allocated). A disk that cannot hold the result still fails before
/// any byte crosses the wire: the free space is checked against the size first.
pub(crate) fn create_temp(temp: &Target, size: u64) -> Result<File> {
    check_free_space(&temp.dir, size).map_err(|e| CoreError::io(temp.shown(), e))?;
    let f = temp.create_new(0o600).map_err(|e| CoreError::io(temp.shown(), e))?;
    if let Err(e) = f.set_len(size) {
        let _ = temp.unlink();
        return Err(CoreError::io(temp.shown(), e));
    }
    Ok(f)
}

/// ENOSPC now, when the filesystem of `dir` has fewer than `size` bytes available.
pub(crate) fn check_free_space(dir: &Dir, size: u64) -> std::io::Result<()> {
    #[cfg(unix)]
    if size > 0 {
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // Safety: valid fd, st is writable.
        if unsafe { libc::fstatvfs(dir.raw_fd(), &mut st) } == 0 {
            let avail = (st.f_bavail as u64).saturating_mul(st.f_frsize as u64);
            if avail < size {
                return Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
            }
        }
    }
    #[cfg(not(unix))]
    let _ = (dir, size);
    Ok(())
}
