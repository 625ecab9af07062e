//! rsync's `--partial-dir DIR`: a partial kept for a resume (after a dropped connection or an
//! interrupt) waits in DIR instead of beside its file, so between runs the destination holds
//! only finished files. The transfer itself still builds its temp file beside the target (the
//! commit must be a rename within one directory); only what outlives a failed attempt moves:
//! `stash` after it, `restore` before the next attempt looks for something to resume.
//!
//! A relative DIR is a directory beside each file (rsync's usual `.rsync-partial`): created
//! with mode 0700 when a partial needs it, opened through the file's own directory handle
//! without following a link (a link planted at DIR is refused, not followed), and removed once
//! empty. An absolute DIR is the local user's own path, shared by every file and kept; a
//! partial's name carries its file's name and the sender's root, so files of the same name in
//! different directories can only meet there as different versions of one name, and the
//! resume re-verifies every chunk in any case. A file a tree sends whole removes its name's
//! partials from DIR (`remove_partials_of`), except where a file of that name is still to come
//! chunk by chunk in the same session: with an absolute DIR that partial may be the other's.
//!
//! Only our own files move: regular, one link, owned by us (`is_private_regular`), opened
//! without following a link; a name already taken where one would go is left alone.

use crate::beneath::{Dir, Kind, Target};
use crate::restore::staging::is_partial_name;
use crate::tree::path::name_bytes;
use std::ffi::OsString;
use std::io;
use std::path::PathBuf;

#[derive(Debug, Clone)]
pub enum PartialDir {
    /// One directory name, beside each file.
    Relative(OsString),
    /// One directory for every file.
    Absolute(PathBuf),
}

impl PartialDir {
    /// rsync's spelling: an absolute path, or a relative one. A relative one must be a single
    /// directory name here (rsync creates only the last component of either kind too).
    pub fn parse(dir: &str) -> io::Result<PartialDir> {
        let bad = |why: &str| io::Error::new(io::ErrorKind::InvalidInput, format!("--partial-dir {dir:?}: {why}"));
        let trimmed = dir.trim_end_matches('/');
        if trimmed.is_empty() {
            return if dir.is_empty() {
                Err(bad("empty"))
            } else {
                Err(bad("the root directory cannot hold partials"))
            };
        }
        let path = std::path::Path::new(trimmed);
        if path.is_absolute() {
            return Ok(PartialDir::Absolute(path.to_path_buf()));
        }
        if trimmed.contains('/') || trimmed == "." || trimmed == ".." {
            return Err(bad(
                "a relative partial directory must be one directory name (e.g. .rsync-partial)",
            ));
        }
        Ok(PartialDir::Relative(OsString::from(trimmed)))
    }

    /// The relative name, for the filter rule that keeps it out of a tree's transfer and
    /// deletions (rsync adds `-p DIR/` after the user's rules).
    pub fn relative_name(&self) -> Option<&OsString> {
        match self {
            PartialDir::Relative(n) => Some(n),
            PartialDir::Absolute(_) => None,
        }
    }

    /// The directory for the partials of files in `dir` (beside them, or the absolute one); None
    /// if it does not exist and `create` is false. A relative directory that another file's
    /// clean-up removes meanwhile (an emptied one goes, see `remove_partials_of`) is "none"
    /// when looking, and made again when creating.
    fn open(&self, dir: &Dir, create: bool) -> io::Result<Option<Dir>> {
        match self {
            PartialDir::Relative(name) => match open_beside(dir, name, create) {
                // Removed between our mkdir and our open: made once more.
                Err(e) if create && e.kind() == io::ErrorKind::NotFound => open_beside(dir, name, create),
                r => r,
            },
            PartialDir::Absolute(path) => {
                if create {
                    match std::fs::create_dir(path) {
                        Ok(()) => {}
                        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                        Err(e) => return Err(e),
                    }
                }
                match Dir::open_root(path) {
                    Ok(d) => Ok(Some(d)),
                    Err(e) if e.kind() == io::ErrorKind::NotFound && !create => Ok(None),
                    Err(e) => Err(e),
                }
            }
        }
    }

    /// Move the partials of `target` found beside it into the partial directory; how many.
    pub fn stash(&self, target: &Target) -> io::Result<usize> {
        let names = partials_in(&target.dir, &[target.name_bytes()])?;
        if names.is_empty() {
            return Ok(0);
        }
        let Some(into) = self.open(&target.dir, true)? else {
            return Ok(0);
        };
        move_each(&target.dir, &into, names)
    }

    /// Move the partials of `target` waiting in the partial directory back beside it, where
    /// the next attempt looks for them; how many. A relative directory left empty goes.
    pub fn restore(&self, target: &Target) -> io::Result<usize> {
        let Some(from) = self.open(&target.dir, false)? else {
            return Ok(0);
        };
        let names = partials_in(&from, &[target.name_bytes()])?;
        let moved = move_each(&from, &target.dir, names)?;
        self.remove_if_empty(target);
        Ok(moved)
    }

    /// The partials kept for the files named `names` in `dir`, removed: each of these files was
    /// just replaced whole, so nothing will resume them (rsync removes a file's partial from its
    /// partial directory once the file is done). One listing of the partial directory for all
    /// of them; only our own files go. A relative directory emptied by this goes, as rsync
    /// removes its partial directory after taking a partial out of it; one that held nothing of
    /// these files' stays. For an absolute directory, shared by every directory's files, `dir`
    /// is not used: the caller passes the names of a whole batch at once, and leaves out the
    /// names of files still to come as chunk-level conversations, whose partials are theirs.
    /// Best effort.
    pub fn remove_partials_of(&self, dir: &Dir, names: &[Vec<u8>]) {
        let Ok(Some(pd)) = self.open(dir, false) else {
            return;
        };
        let Ok(ours) = partials_in(&pd, names) else { return };
        let mut removed = false;
        for n in ours {
            removed |= pd.unlink(&n).is_ok();
        }
        if let PartialDir::Relative(name) = self {
            if removed && dir.lstat(name).ok().flatten().is_some_and(|s| s.kind == Kind::Dir) {
                let _ = dir.rmdir(name);
            }
        }
    }

    /// One directory for every file (rsync's absolute DIR).
    pub fn is_shared(&self) -> bool {
        matches!(self, PartialDir::Absolute(_))
    }

    /// Remove a relative partial directory beside `target` if it is empty (as rsync does once
    /// its partials are used); an absolute one, or one with anything in it, stays.
    pub fn remove_if_empty(&self, target: &Target) {
        if let PartialDir::Relative(name) = self {
            if target
                .dir
                .lstat(name)
                .ok()
                .flatten()
                .is_some_and(|s| s.kind == Kind::Dir)
            {
                let _ = target.dir.rmdir(name);
            }
        }
    }
}

/// The relative partial directory `name` in `dir`, opened without following a link; with
/// `create`, made (0700) when missing. Looking (`create` false), a directory that is not there,
/// or not a directory, or gone before it could be opened, holds nothing: None.
fn open_beside(dir: &Dir, name: &OsString, create: bool) -> io::Result<Option<Dir>> {
    match dir.lstat(name)? {
        None if !create => return Ok(None),
        None => match dir.mkdir(name, 0o700) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        },
        // Looking for partials to take back: something else there holds none.
        Some(st) if st.kind != Kind::Dir && !create => return Ok(None),
        Some(st) if st.kind != Kind::Dir => {
            return Err(io::Error::other(format!(
                "{} is not a directory (a link or a file is never followed or replaced)",
                dir.shown_child(name).display()
            )))
        }
        Some(_) => {}
    }
    match dir.open_dir(name) {
        Err(e) if e.kind() == io::ErrorKind::NotFound && !create => Ok(None),
        r => r.map(Some),
    }
}

/// Names in `dir` that are partials of a file named one of `names` and are our own files.
fn partials_in(dir: &Dir, names: &[Vec<u8>]) -> io::Result<Vec<OsString>> {
    let mut found = Vec::new();
    for n in dir.names()? {
        let candidate = name_bytes(&n);
        if names.iter().any(|name| is_partial_name(name, &candidate))
            && dir.open_read(&n).is_ok_and(|f| crate::beneath::is_private_regular(&f))
        {
            found.push(n);
        }
    }
    Ok(found)
}

/// Rename each name from `from` to `to`, never over something already there.
fn move_each(from: &Dir, to: &Dir, names: Vec<OsString>) -> io::Result<usize> {
    let mut moved = 0;
    for n in names {
        if to.lstat(&n)?.is_some() {
            continue;
        }
        from.rename(&n, to, &n)?;
        moved += 1;
    }
    Ok(moved)
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use crate::restore::{partial_path, streaming_path};
    use std::fs;

    fn target(dir: &std::path::Path, name: &str) -> Target {
        Target::from_user_path(&dir.join(name)).unwrap()
    }

    #[test]
    fn parses_rsync_spellings() {
        assert!(
            matches!(PartialDir::parse(".rsync-partial").unwrap(), PartialDir::Relative(n) if n == ".rsync-partial")
        );
        assert!(matches!(
            PartialDir::parse(".rsync-partial/").unwrap(),
            PartialDir::Relative(_)
        ));
        assert!(
            matches!(PartialDir::parse("/var/tmp/p").unwrap(), PartialDir::Absolute(p) if p == std::path::Path::new("/var/tmp/p"))
        );
        for bad in ["", "/", "a/b", "..", "."] {
            assert!(PartialDir::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn stash_and_restore_move_only_this_files_partials_and_clean_up() {
        let t = tempfile::tempdir().unwrap();
        let file = t.path().join("big.bin");
        let partial = partial_path(&file, &[7u8; 32]);
        let streaming = streaming_path(&file);
        fs::write(&partial, b"half").unwrap();
        fs::write(&streaming, b"early").unwrap();
        let other = partial_path(&t.path().join("other.bin"), &[7u8; 32]);
        fs::write(&other, b"not this one").unwrap();
        fs::write(t.path().join(".big.bin.notes"), b"not a partial").unwrap();
        let pd = PartialDir::parse(".rsync-partial").unwrap();
        assert_eq!(pd.stash(&target(t.path(), "big.bin")).unwrap(), 2);
        let dir = t.path().join(".rsync-partial");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
        assert!(!partial.exists() && !streaming.exists());
        assert_eq!(fs::read(dir.join(partial.file_name().unwrap())).unwrap(), b"half");
        assert!(other.exists(), "another file's partial stays");
        assert!(t.path().join(".big.bin.notes").exists());
        assert_eq!(
            pd.restore(&target(t.path(), "other.bin")).unwrap(),
            0,
            "nothing of other.bin there"
        );
        assert!(dir.exists(), "not empty: kept");
        assert_eq!(pd.restore(&target(t.path(), "big.bin")).unwrap(), 2);
        assert_eq!(fs::read(&partial).unwrap(), b"half");
        assert!(streaming.exists());
        assert!(!dir.exists(), "emptied: removed");
        // Nothing to stash: no directory made.
        assert_eq!(pd.stash(&target(t.path(), "none.bin")).unwrap(), 0);
        assert!(!dir.exists());
    }

    #[test]
    fn a_link_planted_at_the_partial_dir_is_refused_and_foreign_files_stay() {
        let t = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let file = t.path().join("big.bin");
        let partial = partial_path(&file, &[1u8; 32]);
        fs::write(&partial, b"half").unwrap();
        std::os::unix::fs::symlink(outside.path(), t.path().join(".rsync-partial")).unwrap();
        let pd = PartialDir::parse(".rsync-partial").unwrap();
        let err = pd.stash(&target(t.path(), "big.bin")).unwrap_err();
        assert!(err.to_string().contains("is not a directory"), "{err}");
        assert_eq!(
            pd.restore(&target(t.path(), "big.bin")).unwrap(),
            0,
            "nothing to take back through it"
        );
        assert!(partial.exists(), "left where it was");
        assert_eq!(
            fs::read_dir(outside.path()).unwrap().count(),
            0,
            "nothing written through the link"
        );
        // A hard link at a partial's name is not ours: it does not move.
        fs::remove_file(t.path().join(".rsync-partial")).unwrap();
        let elsewhere = outside.path().join("victim");
        fs::write(&elsewhere, b"victim").unwrap();
        fs::remove_file(&partial).unwrap();
        fs::hard_link(&elsewhere, &partial).unwrap();
        assert_eq!(pd.stash(&target(t.path(), "big.bin")).unwrap(), 0);
        assert!(partial.exists());
    }

    #[test]
    fn an_absolute_dir_is_created_once_and_kept() {
        let t = tempfile::tempdir().unwrap();
        let keep = tempfile::tempdir().unwrap();
        let abs = keep.path().join("partials");
        let file = t.path().join("big.bin");
        let partial = partial_path(&file, &[3u8; 32]);
        fs::write(&partial, b"half").unwrap();
        let pd = PartialDir::parse(abs.to_str().unwrap()).unwrap();
        assert_eq!(pd.stash(&target(t.path(), "big.bin")).unwrap(), 1);
        assert!(abs.join(partial.file_name().unwrap()).exists());
        assert_eq!(pd.restore(&target(t.path(), "big.bin")).unwrap(), 1);
        assert!(partial.exists());
        assert!(abs.exists(), "an absolute directory stays");
    }
}
