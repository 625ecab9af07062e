//! Copy-on-write clones: a new file that shares every extent of an existing one, made in
//! constant time on filesystems with reflinks (Linux: btrfs, XFS, bcachefs, … through the
//! FICLONE ioctl; macOS: APFS through fclonefileat). The restorer starts its temp file as
//! a clone of the old target, so only the ranges that changed are ever written.
//! Elsewhere `clone_to_new` reports "not supported" and the caller builds the file as usual.

use std::fs::File;
use std::io;
use std::path::Path;

/// Create `dst` (which must not exist; mode 0600 on Unix) as a clone of `src`. `Ok(None)`
/// when the filesystem (or OS) cannot clone: nothing is left behind then.
pub fn clone_to_new(src: &File, dst: &Path) -> io::Result<Option<File>> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::OpenOptionsExt;
        use std::os::unix::io::AsRawFd;
        let f = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(dst)?;
        // Safety: both descriptors are valid for the duration of the call.
        let r = unsafe { libc::ioctl(f.as_raw_fd(), libc::FICLONE, src.as_raw_fd()) };
        if r == 0 {
            return Ok(Some(f));
        }
        let e = io::Error::last_os_error();
        drop(f);
        let _ = std::fs::remove_file(dst);
        return if unsupported(&e) { Ok(None) } else { Err(e) };
    }
    #[cfg(target_os = "macos")]
    {
        use std::os::unix::ffi::OsStrExt;
        use std::os::unix::fs::PermissionsExt;
        use std::os::unix::io::AsRawFd;
        let c = std::ffi::CString::new(dst.as_os_str().as_bytes())
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // Safety: valid descriptor and NUL-terminated path. CLONE_NOFOLLOW = 1: never
        // follow a link squatting on the temp name.
        let r = unsafe { libc::fclonefileat(src.as_raw_fd(), libc::AT_FDCWD, c.as_ptr(), 0x0001) };
        if r != 0 {
            let e = io::Error::last_os_error();
            return if unsupported(&e) { Ok(None) } else { Err(e) };
        }
        let f = File::options().read(true).write(true).open(dst)?;
        f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        return Ok(Some(f));
    }
    #[allow(unreachable_code)]
    {
        let _ = (src, dst);
        Ok(None)
    }
}

/// As [`clone_to_new`], for `name` in the directory handle `dir` (never through a link).
pub fn clone_to_new_at(src: &File, dir: &crate::beneath::Dir, name: &std::ffi::OsStr) -> io::Result<Option<File>> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::io::AsRawFd;
        let f = dir.create_new(name, 0o600)?;
        // Safety: both descriptors are valid for the duration of the call.
        let r = unsafe { libc::ioctl(f.as_raw_fd(), libc::FICLONE, src.as_raw_fd()) };
        if r == 0 {
            return Ok(Some(f));
        }
        let e = io::Error::last_os_error();
        drop(f);
        let _ = dir.unlink(name);
        return if unsupported(&e) { Ok(None) } else { Err(e) };
    }
    #[cfg(target_os = "macos")]
    {
        use std::os::unix::ffi::OsStrExt;
        use std::os::unix::fs::PermissionsExt;
        use std::os::unix::io::AsRawFd;
        let c = std::ffi::CString::new(name.as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // Safety: valid descriptors and NUL-terminated name. CLONE_NOFOLLOW = 1.
        let r = unsafe { libc::fclonefileat(src.as_raw_fd(), dir.raw_fd(), c.as_ptr(), 0x0001) };
        if r != 0 {
            let e = io::Error::last_os_error();
            return if unsupported(&e) { Ok(None) } else { Err(e) };
        }
        let f = dir.open_rw(name)?;
        f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        return Ok(Some(f));
    }
    #[allow(unreachable_code)]
    {
        let _ = (src, dir, name);
        Ok(None)
    }
}

#[cfg(unix)]
fn unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EOPNOTSUPP)
            | Some(libc::EXDEV)
            | Some(libc::EINVAL)
            | Some(libc::ENOTTY)
            | Some(libc::ENOSYS)
            | Some(libc::EPERM)
    ) || e.raw_os_error() == Some(libc::ENOTSUP)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clones_where_supported_and_leaves_nothing_where_not() {
        let dir = tempfile::tempdir().unwrap();
        let src_path = dir.path().join("src");
        std::fs::write(&src_path, b"some bytes to share").unwrap();
        let src = File::open(&src_path).unwrap();
        let dst = dir.path().join("dst");
        match clone_to_new(&src, &dst).unwrap() {
            Some(_) => assert_eq!(std::fs::read(&dst).unwrap(), b"some bytes to share"),
            None => assert!(!dst.exists(), "a failed clone left {dst:?} behind"),
        }
    }
}
