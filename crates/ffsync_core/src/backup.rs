//! rsync's `-b/--backup`, `--suffix` and `--backup-dir`, on the receiver: a file or symlink
//! that is about to be replaced or deleted is first moved to its backup name, `name~` beside
//! it (or `name` + the suffix), or the same relative path under the backup directory. A
//! directory is never moved itself (its deleted files are). Only the receiver's own entries
//! at paths the session resolved beneath its root handle are moved, and the move is one
//! `renameat` between directory handles, so a link planted at the backup name or on the way
//! into the backup directory is replaced or refused, never followed.

use crate::beneath::{ensure_dir, Dir, Kind, Target};
use crate::tree::path::name_bytes;
use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};

#[derive(Debug)]
pub struct Backup {
    suffix: OsString,
    /// rsync's --backup-dir, as an absolute path (opened per move: it is the local user's
    /// choice, so links on the way to it are followed, as for any command-line path).
    dir: Option<PathBuf>,
}

impl Backup {
    /// `dir` relative to `dest_root` (rsync's --backup-dir is relative to the destination
    /// directory), created when missing. The suffix defaults to `~` without a directory and
    /// to nothing with one; without a directory it must not be empty (the backup would be
    /// the file itself).
    pub fn new(dest_root: &Path, dir: Option<&Path>, suffix: Option<&str>) -> io::Result<Backup> {
        let suffix = OsString::from(suffix.unwrap_or(if dir.is_some() { "" } else { "~" }));
        if dir.is_none() && suffix.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "--suffix cannot be empty without --backup-dir",
            ));
        }
        let dir = match dir {
            Some(d) => {
                let abs = dest_root.join(d);
                std::fs::create_dir_all(&abs)?;
                Some(abs)
            }
            None => None,
        };
        Ok(Backup { suffix, dir })
    }

    /// For one file at `target`: a relative path under `beneath` (a tree's root), or a
    /// path the user named (its directory is then the destination root). Returns the
    /// backup and the file's path relative to that root.
    pub fn for_file(
        target: &Path,
        beneath: Option<&Path>,
        dir: Option<&Path>,
        suffix: Option<&str>,
    ) -> io::Result<(Backup, Vec<u8>)> {
        let (root, rel) = match beneath {
            Some(root) => (root.to_path_buf(), name_bytes(target.as_os_str())),
            None => (
                target
                    .parent()
                    .filter(|p| !p.as_os_str().is_empty())
                    .map_or_else(|| PathBuf::from("."), Path::to_path_buf),
                name_bytes(target.file_name().unwrap_or_default()),
            ),
        };
        Ok((Backup::new(&root, dir, suffix)?, rel))
    }

    fn backup_name(&self, name: &std::ffi::OsStr) -> OsString {
        let mut n = name.to_os_string();
        n.push(&self.suffix);
        n
    }

    /// Move what is at `at` (a file or a symlink) to its backup name; `rel` is its path
    /// relative to the destination root ('/'-separated). Nothing there, or a directory:
    /// nothing moved (`Ok(false)`). An older backup at that name is replaced.
    pub fn save(&self, at: &Target, rel: &[u8]) -> io::Result<bool> {
        match at.lstat()? {
            None => return Ok(false),
            Some(st) if st.kind == Kind::Dir => return Ok(false),
            Some(_) => {}
        }
        let to_name = self.backup_name(&at.name);
        match &self.dir {
            None => at.dir.rename(&at.name, &at.dir, &to_name)?,
            Some(root) => {
                let parent: &[u8] = match rel.iter().rposition(|b| *b == b'/') {
                    Some(i) => &rel[..i],
                    None => b"",
                };
                ensure_dir(root, parent, true)?;
                let into = Dir::open_root(root)?.open_beneath(parent)?;
                // A directory at the backup name (an older backup of a directory's path) is
                // not ours to replace: rename fails with a clear error rather than merging.
                at.dir.rename(&at.name, &into, &to_name).map_err(|e| {
                    if e.raw_os_error() == Some(libc_exdev()) {
                        io::Error::other(format!(
                            "cannot move it to the backup directory {}: it is on another filesystem",
                            root.display()
                        ))
                    } else {
                        e
                    }
                })?
            }
        }
        Ok(true)
    }
}

#[cfg(unix)]
fn libc_exdev() -> i32 {
    libc::EXDEV
}

#[cfg(not(unix))]
fn libc_exdev() -> i32 {
    17 // ERROR_NOT_SAME_DEVICE
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn moves_a_file_beside_itself_or_into_the_backup_dir_and_never_a_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("dest");
        fs::create_dir_all(root.join("sub/dir")).unwrap();
        fs::write(root.join("sub/f"), b"old").unwrap();
        fs::write(root.join("sub/f~"), b"older backup").unwrap();
        let rootdir = Dir::open_root(&root).unwrap();
        let beside = Backup::new(&root, None, None).unwrap();
        let t = Target::beneath(&rootdir, b"sub/f").unwrap();
        assert!(beside.save(&t, b"sub/f").unwrap());
        assert_eq!(
            fs::read(root.join("sub/f~")).unwrap(),
            b"old",
            "an older backup is replaced"
        );
        assert!(!root.join("sub/f").exists());
        assert!(!beside.save(&t, b"sub/f").unwrap(), "nothing there: nothing moved");
        let d = Target::beneath(&rootdir, b"sub/dir").unwrap();
        assert!(!beside.save(&d, b"sub/dir").unwrap(), "a directory is never moved");
        assert!(root.join("sub/dir").is_dir());

        fs::write(root.join("sub/g"), b"g").unwrap();
        let into = Backup::new(&root, Some(Path::new("../bak")), Some(".old")).unwrap();
        let g = Target::beneath(&rootdir, b"sub/g").unwrap();
        assert!(into.save(&g, b"sub/g").unwrap());
        assert_eq!(
            fs::read(tmp.path().join("bak/sub/g.old")).unwrap(),
            b"g",
            "same relative path, created"
        );
    }

    #[test]
    fn a_link_planted_in_the_backup_dir_is_not_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("dest");
        let outside = tmp.path().join("outside");
        fs::create_dir_all(root.join("sub")).unwrap();
        fs::create_dir_all(&outside).unwrap();
        fs::create_dir_all(tmp.path().join("bak")).unwrap();
        std::os::unix::fs::symlink(&outside, tmp.path().join("bak/sub")).unwrap();
        fs::write(root.join("sub/f"), b"old").unwrap();
        let rootdir = Dir::open_root(&root).unwrap();
        let b = Backup::new(&root, Some(Path::new("../bak")), None).unwrap();
        let t = Target::beneath(&rootdir, b"sub/f").unwrap();
        assert!(b.save(&t, b"sub/f").is_err());
        assert!(
            fs::read_dir(&outside).unwrap().next().is_none(),
            "nothing written through the link"
        );
        assert_eq!(
            fs::read(root.join("sub/f")).unwrap(),
            b"old",
            "the file stays when its backup cannot be made"
        );
    }

    #[test]
    fn an_empty_suffix_needs_a_backup_dir() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(Backup::new(tmp.path(), None, Some("")).is_err());
        assert!(Backup::new(tmp.path(), Some(Path::new("b")), Some("")).is_ok());
    }
}
