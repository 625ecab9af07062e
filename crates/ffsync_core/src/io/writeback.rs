//! Writeback that overlaps the transfer, so a durable commit does not pay for the disk twice.
//!
//! A receiver that only fsyncs at the end leaves the disk idle while data arrives, then
//! waits for all of it at once. Instead, every `KICK` bytes written, the range written since
//! the last kick is handed to the kernel to start writing back (`sync_file_range` with
//! `SYNC_FILE_RANGE_WRITE`: it queues the I/O and returns). Ranges kicked more than `BEHIND`
//! bytes ago are then waited for (`WAIT_BEFORE | WRITE | WAIT_AFTER`), which bounds the dirty
//! pages one transfer holds: on a disk slower than the wire the writer slows to disk speed
//! instead of filling the page cache, and the final `fdatasync` finds at most about
//! `BEHIND + KICK` bytes left. Neither call makes anything durable on its own (no metadata,
//! no disk cache flush): the fsync before the rename still does that.
//!
//! One kick per window rather than per chunk: a system call per 1 MiB chunk costs CPU on the
//! receiver's critical path, and small ranges make the filesystem allocate (delayed
//! allocation) in small extents.
//!
//! Elsewhere than Linux nothing is started early: macOS and Windows have no equivalent
//! that only starts writeback; the final `F_FULLFSYNC` / `FlushFileBuffers` does it all.
//!
//! Without durability (`--no-fsync`) nothing is kicked either: the data stays in the page
//! cache for the kernel to write when it chooses, as rsync does by default.

use std::collections::VecDeque;
use std::fs::File;
use std::sync::Mutex;

/// Start writeback once this many bytes were written since the last kick.
pub const KICK: u64 = 8 << 20;
/// Wait for ranges kicked this many bytes ago: bounds the dirty pages of one file.
pub const BEHIND: u64 = 64 << 20;

#[derive(Default)]
struct State {
    /// Span written since the last kick, and how many bytes were written into it.
    lo: u64,
    hi: u64,
    pending: u64,
    /// Kicked ranges not waited for yet, oldest first, with their byte total.
    kicked: VecDeque<(u64, u64)>,
    in_flight: u64,
    /// Bytes covered by kicked ranges so far (tests check that the windows cover the file).
    covered: u64,
}

/// Tracks what one file's writes left dirty and starts its writeback in windows.
pub struct Writeback {
    on: bool,
    kick: u64,
    behind: u64,
    state: Mutex<State>,
}

impl Writeback {
    /// `durable`: the file is fsynced before it is committed (writeback is worth starting).
    pub fn new(durable: bool) -> Writeback {
        Self::with_windows(durable, KICK, BEHIND)
    }

    /// As `new`, with other window sizes (tests).
    pub fn with_windows(durable: bool, kick: u64, behind: u64) -> Writeback {
        Writeback {
            on: durable && cfg!(target_os = "linux"),
            kick: kick.max(1),
            behind,
            state: Mutex::new(State::default()),
        }
    }

    /// Writeback is started early for this file.
    pub fn active(&self) -> bool {
        self.on
    }

    /// `[offset, offset + len)` of `file` was just written (or copied into). Cheap unless a
    /// window filled up; then it starts writeback, and may wait for an old window.
    pub fn wrote(&self, file: &File, offset: u64, len: u64) {
        if !self.on || len == 0 {
            return;
        }
        let (kick, wait) = {
            let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
            let end = offset.saturating_add(len);
            if s.pending == 0 {
                s.lo = offset;
                s.hi = end;
            } else {
                s.lo = s.lo.min(offset);
                s.hi = s.hi.max(end);
            }
            s.pending += len;
            if s.pending < self.kick {
                return;
            }
            let range = (s.lo, s.hi - s.lo);
            s.covered += s.pending;
            s.in_flight += s.pending;
            s.kicked.push_back((range.0, range.1));
            s.pending = 0;
            let mut wait = Vec::new();
            while s.in_flight > self.behind && s.kicked.len() > 1 {
                let old = s.kicked.pop_front().unwrap();
                s.in_flight = s.in_flight.saturating_sub(old.1);
                wait.push(old);
            }
            (range, wait)
        };
        range_write(file, kick.0, kick.1, false);
        for (off, len) in wait {
            range_write(file, off, len, true);
        }
    }

    /// Bytes handed to writeback early so far.
    pub fn covered(&self) -> u64 {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).covered
    }
}

/// Start writing `[offset, offset + len)` back (Linux); with `wait`, also wait for what
/// was in flight there before and for this write to finish.
fn range_write(file: &File, offset: u64, len: u64, wait: bool) {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::io::AsRawFd;
        let flags = if wait {
            libc::SYNC_FILE_RANGE_WAIT_BEFORE | libc::SYNC_FILE_RANGE_WRITE | libc::SYNC_FILE_RANGE_WAIT_AFTER
        } else {
            libc::SYNC_FILE_RANGE_WRITE
        };
        // Safety: valid fd. A failure only means the final fsync has more to do.
        unsafe {
            libc::sync_file_range(file.as_raw_fd(), offset as i64, len as i64, flags);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (file, offset, len, wait);
}

/// Start writeback of a whole range now (a small file just written, a local copy just
/// made), when the file will be made durable: one call, no window bookkeeping.
pub fn start(file: &File, offset: u64, len: u64) {
    if len > 0 {
        range_write(file, offset, len, false);
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    fn file() -> (tempfile::TempDir, File) {
        let dir = tempfile::tempdir().unwrap();
        let f = crate::testutil::create_rw(&dir.path().join("f"));
        (dir, f)
    }

    #[test]
    fn windows_cover_every_write_but_the_tail() {
        let (_d, f) = file();
        let wb = Writeback::with_windows(true, 4 << 20, 16 << 20);
        // 1 MiB writes in a shuffled order (parallel batches land out of order).
        let n = 37u64;
        let mut order: Vec<u64> = (0..n).collect();
        order.reverse();
        order.swap(3, 20);
        for k in order {
            std::os::unix::fs::FileExt::write_at(&f, &vec![7u8; 1 << 20], k << 20).unwrap();
            wb.wrote(&f, k << 20, 1 << 20);
        }
        if !cfg!(target_os = "linux") {
            assert_eq!(wb.covered(), 0);
            return;
        }
        // Everything but the last incomplete window was handed over early.
        assert_eq!(wb.covered(), 36 << 20);
        let s = wb.state.lock().unwrap();
        assert_eq!(s.pending, 1 << 20);
        // Dirty pages stay bounded: ranges older than `behind` were waited for.
        assert!(s.in_flight <= (16 << 20) + (4 << 20), "{}", s.in_flight);
    }

    #[test]
    fn not_durable_starts_nothing() {
        let (_d, f) = file();
        let wb = Writeback::with_windows(false, 1, 1);
        wb.wrote(&f, 0, 10 << 20);
        assert!(!wb.active());
        assert_eq!(wb.covered(), 0);
    }
}
