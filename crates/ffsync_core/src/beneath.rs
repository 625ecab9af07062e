//! Filesystem access confined beneath a directory handle.
//!
//! Every write a peer can cause (tree entries, temp and partial files, renames, deletions,
//! attributes) goes through a [`Dir`]: a directory opened once, from which relative paths
//! are resolved component by component without following any symbolic link. A path is
//! never joined into a string and handed to a path API, so a link planted anywhere in
//! the target — by an earlier sync, by a local user, or hidden from our own walk by an
//! exclude pattern — cannot redirect a write outside it. What a manifest or a walk said
//! about a path is no proof of what is on disk at write time; the handle walk is.
//!
//! Linux resolves a whole relative path in one `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS)` where the kernel has it, else one `openat(O_NOFOLLOW |
//! O_DIRECTORY)` per component (other Unix systems always do the latter). The final
//! component is always opened with `O_NOFOLLOW`, created with `O_EXCL`, and stat'ed,
//! renamed, removed, chown'ed and timestamped with the `*at` calls that do not follow it.
//!
//! Windows has no `*at` family in std: there each component is checked with
//! `symlink_metadata` (links and junctions refused) before a path operation. That closes
//! links that exist before the operation but not a race with a concurrent local writer;
//! see docs/decisions.md.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What a name is, without following it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Other,
}

/// `lstat` of one name.
#[derive(Clone, Copy, Debug)]
pub struct Stat {
    pub kind: Kind,
    pub size: u64,
    /// Permission bits (and setuid/setgid/sticky).
    pub mode: u32,
    pub nlink: u64,
    pub uid: u32,
    pub gid: u32,
    pub dev: u64,
    pub ino: u64,
    /// Modification time, ns since the epoch.
    pub mtime_ns: i64,
}

impl Stat {
    pub fn is_file(&self) -> bool {
        self.kind == Kind::File
    }
    pub fn is_dir(&self) -> bool {
        self.kind == Kind::Dir
    }
    pub fn is_symlink(&self) -> bool {
        self.kind == Kind::Symlink
    }
}

/// The error for a path component that is a link or not a directory: we never go through it.
fn not_followed(shown: &Path) -> io::Error {
    io::Error::other(format!(
        "{} is a symbolic link or not a directory: not followed (nothing is written through it)",
        shown.display()
    ))
}

/// A name a peer may use as one path component: not empty, not `.`/`..`, no '/' or NUL.
fn check_component(name: &[u8]) -> io::Result<()> {
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') || name.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("invalid path component {:?}", String::from_utf8_lossy(name)),
        ));
    }
    #[cfg(not(unix))]
    if name.iter().any(|b| b"\\:".contains(b)) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "invalid path component"));
    }
    Ok(())
}

fn name_bytes(name: &OsStr) -> Vec<u8> {
    crate::tree::path::name_bytes(name)
}

/// An open directory. Cheap to share (`Arc<Dir>`); closed when the last user drops it.
pub struct Dir {
    #[cfg(unix)]
    fd: std::os::fd::OwnedFd,
    /// Where this directory was when it was opened (messages only; never opened again).
    shown: PathBuf,
}

impl std::fmt::Debug for Dir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Dir({})", self.shown.display())
    }
}

impl Dir {
    /// Open the root of a confined area. The root itself is the local user's choice (a
    /// command-line path), so links on the way to it are followed, as rsync does.
    pub fn open_root(path: &Path) -> io::Result<Dir> {
        imp::open_root(path)
    }

    /// The path this directory had when opened, for messages.
    pub fn shown(&self) -> &Path {
        &self.shown
    }

    /// `shown()/name`, for messages.
    pub fn shown_child(&self, name: &OsStr) -> PathBuf {
        self.shown.join(name)
    }

    /// The directory at `rel` ('/'-separated bytes, empty = this one), every component a
    /// real directory: a link or a non-directory anywhere on the way is an error.
    pub fn open_beneath(&self, rel: &[u8]) -> io::Result<Dir> {
        if rel.is_empty() {
            return self.try_clone();
        }
        for c in rel.split(|b| *b == b'/') {
            check_component(c)?;
        }
        imp::open_beneath(self, rel)
    }

    /// The parent directory of `rel` (resolved as in `open_beneath`) and its last name.
    pub fn parent_of(&self, rel: &[u8]) -> io::Result<(Dir, OsString)> {
        let (dir, name) = match rel.iter().rposition(|b| *b == b'/') {
            Some(i) => (&rel[..i], &rel[i + 1..]),
            None => (&rel[..0], rel),
        };
        check_component(name)?;
        Ok((self.open_beneath(dir)?, crate::tree::path::os_name(name)))
    }

    pub fn try_clone(&self) -> io::Result<Dir> {
        imp::try_clone(self)
    }

    /// `lstat(name)`; `Ok(None)` when nothing is there.
    pub fn lstat(&self, name: &OsStr) -> io::Result<Option<Stat>> {
        check_component(&name_bytes(name))?;
        imp::lstat(self, name)
    }

    /// Open an existing regular file for reading, never through a link.
    pub fn open_read(&self, name: &OsStr) -> io::Result<File> {
        check_component(&name_bytes(name))?;
        imp::open_file(self, name, false, false, 0)
    }

    /// Open an existing regular file for reading and writing, never through a link.
    pub fn open_rw(&self, name: &OsStr) -> io::Result<File> {
        check_component(&name_bytes(name))?;
        imp::open_file(self, name, true, false, 0)
    }

    /// Create a new file (`O_CREAT | O_EXCL | O_NOFOLLOW`): fails if anything, a dangling
    /// link included, is at `name`.
    pub fn create_new(&self, name: &OsStr, mode: u32) -> io::Result<File> {
        check_component(&name_bytes(name))?;
        imp::open_file(self, name, true, true, mode)
    }

    /// The subdirectory `name`, not through a link.
    pub fn open_dir(&self, name: &OsStr) -> io::Result<Dir> {
        check_component(&name_bytes(name))?;
        imp::open_beneath(self, &name_bytes(name))
    }

    pub fn mkdir(&self, name: &OsStr, mode: u32) -> io::Result<()> {
        check_component(&name_bytes(name))?;
        imp::mkdir(self, name, mode)
    }

    /// Remove a non-directory (a link itself, never its target).
    pub fn unlink(&self, name: &OsStr) -> io::Result<()> {
        check_component(&name_bytes(name))?;
        imp::unlink(self, name, false)
    }

    /// Remove an empty directory.
    pub fn rmdir(&self, name: &OsStr) -> io::Result<()> {
        check_component(&name_bytes(name))?;
        imp::unlink(self, name, true)
    }

    /// Rename `name` here to `to_name` in `to` (atomic replace of a non-directory).
    pub fn rename(&self, name: &OsStr, to: &Dir, to_name: &OsStr) -> io::Result<()> {
        check_component(&name_bytes(name))?;
        check_component(&name_bytes(to_name))?;
        imp::rename(self, name, to, to_name)
    }

    /// Create a symbolic link `name` whose content is `target` (never resolved by us).
    pub fn symlink(&self, target: &[u8], name: &OsStr) -> io::Result<()> {
        check_component(&name_bytes(name))?;
        imp::symlink(self, target, name)
    }

    /// Names in this directory (no `.`/`..`).
    pub fn names(&self) -> io::Result<Vec<OsString>> {
        imp::names(self)
    }

    /// fsync the directory (its entries are durable after this).
    pub fn sync(&self) -> io::Result<()> {
        imp::sync(self)
    }

    /// `sync`, to make a rename in this directory durable. A filesystem that cannot fsync a
    /// directory at all (EINVAL, ENOTSUP: some FUSE and network filesystems) has nothing more
    /// to make durable; any other error (EIO) means the rename may not survive a crash, and
    /// is returned.
    pub fn sync_entries(&self) -> io::Result<()> {
        match self.sync() {
            #[cfg(unix)]
            // (ENOTSUP and EOPNOTSUPP are one value on Linux, two on macOS.)
            Err(e)
                if e.raw_os_error()
                    .is_some_and(|c| c == libc::EINVAL || c == libc::ENOTSUP || c == libc::EOPNOTSUPP) =>
            {
                Ok(())
            }
            r => r,
        }
    }

    /// `lchown` of `name` (a link itself, never its target). `u32::MAX` leaves an id as is.
    pub fn lchown(&self, name: &OsStr, uid: u32, gid: u32) -> io::Result<()> {
        check_component(&name_bytes(name))?;
        imp::lchown(self, name, uid, gid)
    }

    /// The raw descriptor, for `*at` calls made elsewhere in the crate.
    #[cfg(unix)]
    pub(crate) fn raw_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.fd.as_raw_fd()
    }

    /// A handle to this directory as a `File` (for fchmod, futimens, fsetxattr).
    pub fn as_file(&self) -> io::Result<File> {
        imp::as_file(self)
    }
}

/// One file's place: the directory handle it lives in and its name there. Temp files,
/// partials and journals are siblings of a target (same directory handle).
#[derive(Clone, Debug)]
pub struct Target {
    pub dir: Arc<Dir>,
    pub name: OsString,
}

impl Target {
    /// `rel` beneath `root`: every directory on the way resolved without following links.
    pub fn beneath(root: &Dir, rel: &[u8]) -> io::Result<Target> {
        let (dir, name) = root.parent_of(rel)?;
        Ok(Target {
            dir: Arc::new(dir),
            name,
        })
    }

    /// A path the local user chose (a command-line target): its directory is opened as a
    /// root (links on the way followed), its last component never followed.
    pub fn from_user_path(path: &Path) -> io::Result<Target> {
        let name = path
            .file_name()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("{}: no file name", path.display())))?;
        let parent = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        Ok(Target {
            dir: Arc::new(Dir::open_root(parent)?),
            name: name.to_os_string(),
        })
    }

    /// `target` beneath the directory `root` when given (`target` is then a relative
    /// '/'-separated path), else as [`Target::from_user_path`].
    pub fn resolve(root: Option<&Path>, target: &Path) -> io::Result<Target> {
        match root {
            Some(root) => Target::beneath(&Dir::open_root(root)?, &name_bytes(target.as_os_str())),
            None => Target::from_user_path(target),
        }
    }

    /// Another name in the same directory.
    pub fn sibling(&self, name: impl Into<OsString>) -> Target {
        Target {
            dir: self.dir.clone(),
            name: name.into(),
        }
    }

    /// For messages only.
    pub fn shown(&self) -> PathBuf {
        self.dir.shown_child(&self.name)
    }

    pub fn name_bytes(&self) -> Vec<u8> {
        name_bytes(&self.name)
    }

    pub fn lstat(&self) -> io::Result<Option<Stat>> {
        self.dir.lstat(&self.name)
    }
    pub fn open_read(&self) -> io::Result<File> {
        self.dir.open_read(&self.name)
    }
    pub fn open_rw(&self) -> io::Result<File> {
        self.dir.open_rw(&self.name)
    }
    pub fn create_new(&self, mode: u32) -> io::Result<File> {
        self.dir.create_new(&self.name, mode)
    }
    pub fn unlink(&self) -> io::Result<()> {
        self.dir.unlink(&self.name)
    }
    /// Rename over `to` (both in their own directories).
    pub fn rename_to(&self, to: &Target) -> io::Result<()> {
        self.dir.rename(&self.name, &to.dir, &to.name)
    }
}

/// Make `rel` beneath the directory `root` a real directory, each component created when
/// missing (with `create`) and never followed when it is a link or not a directory.
pub fn ensure_dir(root: &Path, rel: &[u8], create: bool) -> io::Result<()> {
    let mut dir = Dir::open_root(root)?;
    if rel.is_empty() {
        return Ok(());
    }
    for comp in rel.split(|b| *b == b'/') {
        check_component(comp)?;
        let name = crate::tree::path::os_name(comp);
        if create {
            match dir.mkdir(&name, 0o777) {
                Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
                _ => {}
            }
        }
        dir = dir.open_dir(&name)?;
    }
    Ok(())
}

/// True when `f` (opened by us) is a regular file with one link, owned by us: only such a
/// file may be reused as a partial (a hard link planted at the partial's name would make
/// us write into its twin elsewhere; someone else's file is not ours to resume).
pub fn is_private_regular(f: &File) -> bool {
    let Ok(m) = f.metadata() else { return false };
    if !m.file_type().is_file() {
        return false;
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        // SAFETY: geteuid has no preconditions.
        m.nlink() == 1 && m.uid() == unsafe { libc::geteuid() }
    }
    #[cfg(not(unix))]
    {
        true
    }
}

#[cfg(unix)]
mod imp {
    use super::{not_followed, Dir, Kind, Stat};
    use std::ffi::{CString, OsStr, OsString};
    use std::fs::File;
    use std::io;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    use std::path::Path;

    fn cstr(b: &[u8]) -> io::Result<CString> {
        CString::new(b).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"))
    }

    fn check(r: libc::c_int) -> io::Result<libc::c_int> {
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(r)
        }
    }

    /// Retry a call interrupted by a signal.
    fn retry<F: FnMut() -> libc::c_int>(mut f: F) -> io::Result<libc::c_int> {
        loop {
            match check(f()) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                r => return r,
            }
        }
    }

    const DIR_FLAGS: libc::c_int = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC;

    pub fn open_root(path: &Path) -> io::Result<Dir> {
        let c = cstr(path.as_os_str().as_bytes())?;
        // SAFETY: c is a valid NUL-terminated string.
        let fd = retry(|| unsafe { libc::open(c.as_ptr(), DIR_FLAGS) })?;
        Ok(Dir {
            // SAFETY: fd was just opened and is owned by nobody else.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            shown: path.to_path_buf(),
        })
    }

    pub fn try_clone(d: &Dir) -> io::Result<Dir> {
        Ok(Dir {
            fd: d.fd.try_clone()?,
            shown: d.shown.clone(),
        })
    }

    fn symlinkish(e: &io::Error) -> bool {
        matches!(
            e.raw_os_error(),
            Some(libc::ELOOP) | Some(libc::ENOTDIR) | Some(libc::EXDEV)
        )
    }

    #[cfg(target_os = "linux")]
    fn openat2_beneath(d: &Dir, c: &CString) -> Option<io::Result<libc::c_int>> {
        use std::sync::atomic::{AtomicBool, Ordering};
        static UNSUPPORTED: AtomicBool = AtomicBool::new(false);
        if UNSUPPORTED.load(Ordering::Relaxed) {
            return None;
        }
        let mut how: libc::open_how = unsafe { std::mem::zeroed() };
        how.flags = (DIR_FLAGS | libc::O_NOFOLLOW) as u64;
        how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
        let r = retry(|| unsafe {
            libc::syscall(
                libc::SYS_openat2,
                d.fd.as_raw_fd(),
                c.as_ptr(),
                &how as *const libc::open_how,
                std::mem::size_of::<libc::open_how>(),
            ) as libc::c_int
        });
        match r {
            // Kernel without openat2 (< 5.6) or a sandbox that forbids it: walk instead.
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSYS) | Some(libc::EPERM)) => {
                UNSUPPORTED.store(true, Ordering::Relaxed);
                None
            }
            // EAGAIN: a concurrent rename raced the lookup; the walk decides.
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => None,
            r => Some(r),
        }
    }

    pub fn open_beneath(d: &Dir, rel: &[u8]) -> io::Result<Dir> {
        let shown = d.shown.join(OsStr::from_bytes(rel));
        #[cfg(target_os = "linux")]
        {
            let c = cstr(rel)?;
            if let Some(r) = openat2_beneath(d, &c) {
                return match r {
                    Ok(fd) => Ok(Dir {
                        // SAFETY: fd was just opened and is owned by nobody else.
                        fd: unsafe { OwnedFd::from_raw_fd(fd) },
                        shown,
                    }),
                    Err(e) if symlinkish(&e) => Err(not_followed(&shown)),
                    Err(e) => Err(e),
                };
            }
        }
        let mut cur: Option<OwnedFd> = None;
        for comp in rel.split(|b| *b == b'/') {
            let c = cstr(comp)?;
            let at = cur.as_ref().map_or(d.fd.as_raw_fd(), |f| f.as_raw_fd());
            // SAFETY: at is an open directory fd; c is NUL-terminated.
            let fd = match retry(|| unsafe { libc::openat(at, c.as_ptr(), DIR_FLAGS | libc::O_NOFOLLOW) }) {
                Ok(fd) => fd,
                Err(e) if symlinkish(&e) => return Err(not_followed(&shown)),
                Err(e) => return Err(e),
            };
            // SAFETY: fd was just opened and is owned by nobody else.
            cur = Some(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        Ok(Dir {
            fd: cur.expect("rel has at least one component"),
            shown,
        })
    }

    pub fn lstat(d: &Dir, name: &OsStr) -> io::Result<Option<Stat>> {
        let c = cstr(name.as_bytes())?;
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: valid fd, NUL-terminated name, st is writable.
        match retry(|| unsafe { libc::fstatat(d.fd.as_raw_fd(), c.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) }) {
            Ok(_) => Ok(Some(stat_of(&st))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    // The field types differ between Unix systems (mode_t is u16 on macOS): casts kept.
    #[allow(clippy::unnecessary_cast)]
    fn stat_of(st: &libc::stat) -> Stat {
        let fmt = st.st_mode as u32 & libc::S_IFMT as u32;
        let kind = if fmt == libc::S_IFREG as u32 {
            Kind::File
        } else if fmt == libc::S_IFDIR as u32 {
            Kind::Dir
        } else if fmt == libc::S_IFLNK as u32 {
            Kind::Symlink
        } else {
            Kind::Other
        };
        Stat {
            kind,
            size: st.st_size as u64,
            mode: st.st_mode as u32 & 0o7777,
            nlink: st.st_nlink as u64,
            uid: st.st_uid,
            gid: st.st_gid,
            dev: st.st_dev as u64,
            ino: st.st_ino as u64,
            mtime_ns: st.st_mtime as i64 * 1_000_000_000 + st.st_mtime_nsec as i64,
        }
    }

    pub fn open_file(d: &Dir, name: &OsStr, write: bool, create: bool, mode: u32) -> io::Result<File> {
        let c = cstr(name.as_bytes())?;
        let mut flags = libc::O_CLOEXEC | libc::O_NOFOLLOW | if write { libc::O_RDWR } else { libc::O_RDONLY };
        if create {
            flags |= libc::O_CREAT | libc::O_EXCL;
        } else {
            // Never block on a FIFO planted at the name; checked to be a file below.
            flags |= libc::O_NONBLOCK;
        }
        // SAFETY: valid fd, NUL-terminated name.
        let fd = retry(|| unsafe { libc::openat(d.fd.as_raw_fd(), c.as_ptr(), flags, mode as libc::c_uint) }).map_err(
            |e| {
                if e.raw_os_error() == Some(libc::ELOOP) {
                    not_followed(&d.shown.join(name))
                } else {
                    e
                }
            },
        )?;
        // SAFETY: fd was just opened and is owned by nobody else.
        let f = unsafe { File::from_raw_fd(fd) };
        if !create {
            if !f.metadata()?.file_type().is_file() {
                return Err(io::Error::other(format!(
                    "{}: not a regular file",
                    d.shown.join(name).display()
                )));
            }
            // Back to blocking I/O for the file we checked.
            // SAFETY: fd is open; F_SETFL with flags read from F_GETFL.
            unsafe {
                let fl = libc::fcntl(fd, libc::F_GETFL);
                if fl >= 0 {
                    libc::fcntl(fd, libc::F_SETFL, fl & !libc::O_NONBLOCK);
                }
            }
        }
        Ok(f)
    }

    pub fn mkdir(d: &Dir, name: &OsStr, mode: u32) -> io::Result<()> {
        let c = cstr(name.as_bytes())?;
        // SAFETY: valid fd, NUL-terminated name.
        retry(|| unsafe { libc::mkdirat(d.fd.as_raw_fd(), c.as_ptr(), mode as libc::mode_t) }).map(|_| ())
    }

    pub fn unlink(d: &Dir, name: &OsStr, dir: bool) -> io::Result<()> {
        let c = cstr(name.as_bytes())?;
        let flags = if dir { libc::AT_REMOVEDIR } else { 0 };
        // SAFETY: valid fd, NUL-terminated name.
        retry(|| unsafe { libc::unlinkat(d.fd.as_raw_fd(), c.as_ptr(), flags) }).map(|_| ())
    }

    pub fn rename(d: &Dir, name: &OsStr, to: &Dir, to_name: &OsStr) -> io::Result<()> {
        let a = cstr(name.as_bytes())?;
        let b = cstr(to_name.as_bytes())?;
        // SAFETY: valid fds, NUL-terminated names.
        retry(|| unsafe { libc::renameat(d.fd.as_raw_fd(), a.as_ptr(), to.fd.as_raw_fd(), b.as_ptr()) }).map(|_| ())
    }

    pub fn symlink(d: &Dir, target: &[u8], name: &OsStr) -> io::Result<()> {
        let t = cstr(target)?;
        let c = cstr(name.as_bytes())?;
        // SAFETY: valid fd, NUL-terminated strings.
        retry(|| unsafe { libc::symlinkat(t.as_ptr(), d.fd.as_raw_fd(), c.as_ptr()) }).map(|_| ())
    }

    pub fn names(d: &Dir) -> io::Result<Vec<OsString>> {
        let dot = cstr(b".")?;
        // A fresh descriptor for the stream: closedir closes it, and reading from a
        // duplicate would share (and move) this handle's offset.
        // SAFETY: valid fd, NUL-terminated name.
        let fd = retry(|| unsafe { libc::openat(d.fd.as_raw_fd(), dot.as_ptr(), DIR_FLAGS) })?;
        // SAFETY: fd is an open directory we own; fdopendir takes it over.
        let dirp = unsafe { libc::fdopendir(fd) };
        if dirp.is_null() {
            let e = io::Error::last_os_error();
            // SAFETY: fdopendir failed, so fd is still ours to close.
            unsafe { libc::close(fd) };
            return Err(e);
        }
        let mut out = Vec::new();
        loop {
            // SAFETY: dirp is a valid stream until closedir.
            let ent = unsafe { libc::readdir(dirp) };
            if ent.is_null() {
                break;
            }
            // SAFETY: d_name is NUL-terminated within the entry.
            let name = unsafe { std::ffi::CStr::from_ptr((*ent).d_name.as_ptr()) }.to_bytes();
            if name != b"." && name != b".." {
                out.push(OsString::from_vec(name.to_vec()));
            }
        }
        // SAFETY: dirp came from fdopendir and is closed once.
        unsafe { libc::closedir(dirp) };
        Ok(out)
    }

    pub fn sync(d: &Dir) -> io::Result<()> {
        // macOS: fsync leaves the rename in the drive's cache; F_FULLFSYNC flushes it (the
        // file itself was made durable the same way, by `File::sync_all`).
        #[cfg(target_vendor = "apple")]
        // SAFETY: valid fd.
        if retry(|| unsafe { libc::fcntl(d.fd.as_raw_fd(), libc::F_FULLFSYNC) }).is_ok() {
            return Ok(());
        }
        // SAFETY: valid fd.
        retry(|| unsafe { libc::fsync(d.fd.as_raw_fd()) }).map(|_| ())
    }

    pub fn lchown(d: &Dir, name: &OsStr, uid: u32, gid: u32) -> io::Result<()> {
        let c = cstr(name.as_bytes())?;
        // SAFETY: valid fd, NUL-terminated name.
        retry(|| unsafe {
            libc::fchownat(
                d.fd.as_raw_fd(),
                c.as_ptr(),
                uid as libc::uid_t,
                gid as libc::gid_t,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        })
        .map(|_| ())
    }

    pub fn as_file(d: &Dir) -> io::Result<File> {
        Ok(File::from(d.fd.try_clone()?))
    }
}

#[cfg(not(unix))]
mod imp {
    //! Path-based fallback: each component is checked not to be a link before use.
    use super::{not_followed, Dir, Kind, Stat};
    use std::ffi::{OsStr, OsString};
    use std::fs::{self, File};
    use std::io;
    use std::path::Path;

    pub fn open_root(path: &Path) -> io::Result<Dir> {
        if !fs::metadata(path)?.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::Other,
                format!("{}: not a directory", path.display()),
            ));
        }
        Ok(Dir {
            shown: path.to_path_buf(),
        })
    }

    pub fn try_clone(d: &Dir) -> io::Result<Dir> {
        Ok(Dir { shown: d.shown.clone() })
    }

    fn is_link(m: &fs::Metadata) -> bool {
        m.file_type().is_symlink() || {
            use std::os::windows::fs::MetadataExt;
            // FILE_ATTRIBUTE_REPARSE_POINT: junctions and other redirections.
            m.file_attributes() & 0x400 != 0
        }
    }

    pub fn open_beneath(d: &Dir, rel: &[u8]) -> io::Result<Dir> {
        let mut p = d.shown.clone();
        for comp in rel.split(|b| *b == b'/') {
            p.push(String::from_utf8_lossy(comp).as_ref());
            let m = fs::symlink_metadata(&p)?;
            if is_link(&m) || !m.is_dir() {
                return Err(not_followed(&p));
            }
        }
        Ok(Dir { shown: p })
    }

    pub fn lstat(d: &Dir, name: &OsStr) -> io::Result<Option<Stat>> {
        match fs::symlink_metadata(d.shown.join(name)) {
            Ok(m) => {
                let kind = if is_link(&m) {
                    Kind::Symlink
                } else if m.is_dir() {
                    Kind::Dir
                } else if m.is_file() {
                    Kind::File
                } else {
                    Kind::Other
                };
                Ok(Some(Stat {
                    kind,
                    size: m.len(),
                    mode: if m.permissions().readonly() { 0o444 } else { 0o644 },
                    nlink: 1,
                    uid: 0,
                    gid: 0,
                    dev: 0,
                    ino: 0,
                    mtime_ns: m
                        .modified()
                        .ok()
                        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                        .map_or(0, |d| d.as_nanos() as i64),
                }))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub fn open_file(d: &Dir, name: &OsStr, write: bool, create: bool, _mode: u32) -> io::Result<File> {
        let p = d.shown.join(name);
        if !create {
            if let Some(st) = lstat(d, name)? {
                if st.kind != Kind::File {
                    return Err(not_followed(&p));
                }
            }
        }
        let mut o = File::options();
        o.read(true).write(write);
        if create {
            o.create_new(true);
        }
        {
            use std::os::windows::fs::OpenOptionsExt;
            // FILE_FLAG_OPEN_REPARSE_POINT: open a link itself, never its target.
            o.custom_flags(0x0020_0000);
        }
        o.open(p)
    }

    pub fn mkdir(d: &Dir, name: &OsStr, _mode: u32) -> io::Result<()> {
        fs::create_dir(d.shown.join(name))
    }

    pub fn unlink(d: &Dir, name: &OsStr, dir: bool) -> io::Result<()> {
        if dir {
            fs::remove_dir(d.shown.join(name))
        } else {
            fs::remove_file(d.shown.join(name))
        }
    }

    pub fn rename(d: &Dir, name: &OsStr, to: &Dir, to_name: &OsStr) -> io::Result<()> {
        fs::rename(d.shown.join(name), to.shown.join(to_name))
    }

    pub fn symlink(d: &Dir, target: &[u8], name: &OsStr) -> io::Result<()> {
        std::os::windows::fs::symlink_file(String::from_utf8_lossy(target).as_ref(), d.shown.join(name))
    }

    pub fn names(d: &Dir) -> io::Result<Vec<OsString>> {
        fs::read_dir(&d.shown)?.map(|e| e.map(|e| e.file_name())).collect()
    }

    pub fn sync(_d: &Dir) -> io::Result<()> {
        Ok(())
    }

    pub fn lchown(_d: &Dir, _name: &OsStr, _uid: u32, _gid: u32) -> io::Result<()> {
        Ok(())
    }

    pub fn as_file(d: &Dir) -> io::Result<File> {
        use std::os::windows::fs::OpenOptionsExt;
        // FILE_FLAG_BACKUP_SEMANTICS opens a directory.
        File::options().read(true).custom_flags(0x0200_0000).open(&d.shown)
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn resolves_real_directories_and_refuses_links() {
        let t = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        fs::create_dir_all(root.join("a/b")).unwrap();
        std::os::unix::fs::symlink(outside.path(), root.join("link")).unwrap();
        std::os::unix::fs::symlink(outside.path(), root.join("a/inner")).unwrap();
        fs::write(root.join("file"), b"x").unwrap();
        let d = Dir::open_root(&root).unwrap();
        assert!(d.open_beneath(b"a/b").is_ok());
        for bad in [&b"link"[..], b"link/x", b"a/inner", b"a/inner/y", b"file", b"file/z"] {
            let e = d.open_beneath(bad).unwrap_err();
            assert!(e.to_string().contains("not followed"), "{bad:?}: {e}");
        }
        for bad in [&b"../x"[..], b"a/../b", b"/etc", b"a//b", b"."] {
            assert!(d.open_beneath(bad).is_err(), "{bad:?}");
        }
        // Writes through a link are refused at every entry point.
        assert!(Target::beneath(&d, b"link/new").is_err());
        assert!(d.create_new(OsStr::new("link"), 0o600).is_err());
        assert!(d.open_rw(OsStr::new("link")).is_err());
        assert!(d.open_read(OsStr::new("link")).is_err());
        assert_eq!(fs::read_dir(outside.path()).unwrap().count(), 0);
        // A link's own entry can be stat'ed, renamed and removed without touching its target.
        assert!(d.lstat(OsStr::new("link")).unwrap().unwrap().is_symlink());
        d.unlink(OsStr::new("link")).unwrap();
        assert!(outside.path().exists());
    }

    #[test]
    fn files_are_created_exclusively_and_renamed_in_place() {
        let t = tempfile::tempdir().unwrap();
        let d = Dir::open_root(t.path()).unwrap();
        let target = Target::beneath(&d, b"f").unwrap();
        let temp = target.sibling(".f.tmp");
        std::io::Write::write_all(&mut temp.create_new(0o600).unwrap(), b"new").unwrap();
        assert!(temp.create_new(0o600).is_err(), "O_EXCL");
        temp.rename_to(&target).unwrap();
        assert_eq!(fs::read(t.path().join("f")).unwrap(), b"new");
        let names = d.names().unwrap();
        assert_eq!(names, vec![OsString::from("f")]);
        // A hard link is not a private file.
        fs::hard_link(t.path().join("f"), t.path().join("g")).unwrap();
        assert!(!is_private_regular(&target.open_read().unwrap()));
        fs::remove_file(t.path().join("g")).unwrap();
        assert!(is_private_regular(&target.open_read().unwrap()));
    }

    #[test]
    fn a_fifo_is_not_opened_as_a_file() {
        let t = tempfile::tempdir().unwrap();
        let c = std::ffi::CString::new(t.path().join("p").as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: c is NUL-terminated.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let d = Dir::open_root(t.path()).unwrap();
        assert!(d.open_read(OsStr::new("p")).is_err());
    }
}
