//! Disk space committed in step with verified data, not with a peer's claim.
//!
//! A temp file is sized to the offered length but left sparse: an offer of 1 TiB followed by
//! a disconnect must not leave 1 TiB allocated. Writing into a sparse file extent by extent is
//! slower than into space reserved in large runs, though (measured: a 1 GiB fresh receive
//! ~20 % slower without `fallocate`), so the space is reserved in windows that follow the
//! data: a write that starts inside the reserved prefix (or right at its end) extends the
//! prefix to `RESERVE_AHEAD` past the write. Space reserved is therefore at most one window
//! beyond the contiguous data actually verified and written; a write far past the prefix (a
//! chunk at the end of a huge offer) reserves nothing.

use std::fs::File;
use std::io;
use std::sync::Mutex;

/// How far ahead of the verified data the space is reserved.
pub const RESERVE_AHEAD: u64 = 64 << 20;

pub struct Reservation {
    /// End of the reserved prefix; `u64::MAX` once the filesystem said it cannot reserve.
    prefix: Mutex<u64>,
    size: u64,
}

impl Reservation {
    pub fn new(size: u64) -> Reservation {
        Reservation {
            prefix: Mutex::new(0),
            size,
        }
    }

    /// Call before writing verified bytes `[start, end)` of `file`. Fails only with the
    /// filesystem's own error when space is short (ENOSPC, reported as a full disk).
    pub fn before_write(&self, file: &File, start: u64, end: u64) -> io::Result<()> {
        let mut prefix = self.prefix.lock().unwrap();
        if start > *prefix || end + RESERVE_AHEAD / 2 <= *prefix {
            return Ok(()); // far ahead of the data (reserve nothing), or enough headroom
        }
        let target = self.size.min(end.saturating_add(RESERVE_AHEAD));
        if target <= *prefix {
            return Ok(());
        }
        match allocate(file, *prefix, target - *prefix) {
            Ok(true) => *prefix = target,
            Ok(false) => *prefix = u64::MAX, // not supported here: plain writes from now on
            Err(e) => return Err(e),
        }
        Ok(())
    }
}

/// Reserve `[offset, offset + len)` without changing the size. `Ok(false)`: not supported.
fn allocate(file: &File, offset: u64, len: u64) -> io::Result<bool> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::io::AsRawFd;
        // Safety: valid fd.
        let r = unsafe {
            libc::fallocate(
                file.as_raw_fd(),
                libc::FALLOC_FL_KEEP_SIZE,
                offset as libc::off_t,
                len as libc::off_t,
            )
        };
        if r == 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS)) {
            return Ok(false);
        }
        Err(e)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (file, offset, len);
        Ok(false)
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn allocated(f: &File) -> u64 {
        f.metadata().unwrap().blocks() * 512
    }

    #[test]
    fn space_follows_the_data_not_the_claim() {
        let dir = tempfile::tempdir().unwrap();
        let f = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join("t"))
            .unwrap();
        let size = 1 << 30;
        f.set_len(size).unwrap();
        let r = Reservation::new(size);
        // A write near the end of a huge claim reserves nothing.
        r.before_write(&f, size - 4096, size).unwrap();
        assert!(allocated(&f) < 1 << 20);
        // Data from the start: one window ahead of it, no more.
        r.before_write(&f, 0, 1 << 20).unwrap();
        let a = allocated(&f);
        if a == 0 {
            return; // this filesystem cannot reserve (tmpfs on old kernels): nothing to check
        }
        assert!(a <= (1 << 20) + RESERVE_AHEAD + (1 << 20), "{a}");
        assert_eq!(f.metadata().unwrap().len(), size, "the size is unchanged");
        // Sequential data keeps the window just ahead.
        for k in 1..100u64 {
            r.before_write(&f, k << 20, (k + 1) << 20).unwrap();
        }
        let a = allocated(&f);
        assert!(a <= (100 << 20) + RESERVE_AHEAD + (1 << 20), "{a}");
        assert!(a >= 100 << 20, "{a}");
    }
}
