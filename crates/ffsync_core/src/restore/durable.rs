//! What a finished file carries besides its bytes: the sender's modification time and
//! permission bits, applied through the open descriptor (never through a name that could be
//! swapped for a link).

use crate::beneath::Target;
use crate::error::{CoreError, Result};
use crate::file_identity::FileIdentity;
use std::fs::{self, File};
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub fn system_time_from_ns(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

/// Apply the sender's mtime and permission bits (setuid/setgid arrive but are never applied).
pub fn apply_metadata(file: &File, path: &Path, mtime_ns: Option<i64>, mode: Option<u32>) -> Result<()> {
    if let Some(ns) = mtime_ns {
        file.set_times(fs::FileTimes::new().set_modified(system_time_from_ns(ns)))
            .map_err(|e| CoreError::io(path, e))?;
    }
    #[cfg(unix)]
    if let Some(mode) = mode {
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(fs::Permissions::from_mode(mode & 0o1777))
            .map_err(|e| CoreError::io(path, e))?;
    }
    #[cfg(not(unix))]
    let _ = mode;
    Ok(())
}

/// Update an up-to-date target's metadata in place (identical content, other mtime/mode),
/// never through a link at the target's name.
pub fn touch_up_to_date_at(target: &Target, mtime_ns: Option<i64>, mode: Option<u32>) -> Result<FileIdentity> {
    let shown = target.shown();
    let f = target.open_read().map_err(|e| CoreError::io(&shown, e))?;
    apply_metadata(&f, &shown, mtime_ns, mode)?;
    Ok(FileIdentity::of(&f.metadata().map_err(|e| CoreError::io(&shown, e))?))
}
