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
//! Handing pages to the device is not enough where the device has a volatile write cache
//! (a VM's virtual disk backed by the host's page cache, most SSDs): the fsync at the end
//! then flushes that cache, and the flush costs about as much as the data written since the
//! last one (measured on this project's VM: 1 GiB written and waited for with
//! `sync_file_range`, then `fdatasync` took 0.8-1.3 s, the same as after a plain `cp`). So
//! every `FLUSH` bytes handed to writeback, across all files of the process, one
//! `fdatasync` runs on its own thread ([`DeviceFlush`]), unless one is running: the device
//! empties its cache while the transfer goes on, and the last fsync pays for one window.
//!
//! Elsewhere than Linux nothing is started early: macOS and Windows have no equivalent
//! that only starts writeback; the final `F_FULLFSYNC` / `FlushFileBuffers` does it all.
//!
//! Without durability (`--no-fsync`) writeback is still started as data lands, but nothing
//! waits for it and the device's cache is not flushed: the process never waits for the disk.
//! Leaving the data dirty for the kernel to write when it chooses (rsync's default) costs more
//! on ext4: a file renamed over an existing one has its delayed allocation done and its
//! writeback started by the rename itself (`auto_da_alloc`), so the commit of a 1 GiB file
//! waited 0.6 s in `renameat` (decisions §115).

use std::collections::VecDeque;
use std::fs::File;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// Start writeback once this many bytes were written since the last kick. 2 MiB, not the 8 MiB
/// of before: a file of a few MiB (a JS bundle, a native binary) was kicked never or once, so its
/// fsync waited for nearly all of it; local `sync` of an npm release over the one before (two
/// files of 6 and 9 MB rebuilt), 31 rounds alternating: 92.7 → 88.2 ms (1 MiB: 92.5 ms, the
/// kicks' own cost); 1 GiB fresh over loopback within the spread (decisions §101).
pub const KICK: u64 = 2 << 20;
/// Wait for ranges kicked this many bytes ago: bounds the dirty pages of one file.
pub const BEHIND: u64 = 64 << 20;
/// Flush the device's cache in the background every this many bytes handed to writeback.
/// Measured (1 GiB written at 490 MB/s, `fdatasync` on a second thread): 64 MiB 2.59 s,
/// 128 MiB 2.35-2.54 s, 256 MiB 2.68 s, no flush until the end 2.33-3.18 s; each flush also commits the
/// filesystem's journal, so smaller windows cost more flushes for no gain.
pub const FLUSH: u64 = 128 << 20;

/// Flushes of the device's write cache while data is still arriving: one at a time, on
/// their own thread, each an `fdatasync` of the file whose writeback crossed the window
/// (the device flush it issues covers every write that already reached the device, from
/// any file). Early work only: errors are left to the fsync before the commit, which
/// reports them.
pub struct DeviceFlush {
    every: u64,
    since: AtomicU64,
    running: AtomicBool,
    done: AtomicU64,
}

/// The process's device flusher: sessions share it, as they share the disks.
pub static DEVICE_FLUSH: DeviceFlush = DeviceFlush::new(FLUSH);

impl DeviceFlush {
    /// A flusher that flushes every `every` bytes handed to writeback.
    pub const fn new(every: u64) -> DeviceFlush {
        DeviceFlush {
            every,
            since: AtomicU64::new(0),
            running: AtomicBool::new(false),
            done: AtomicU64::new(0),
        }
    }

    /// `bytes` of `file` were just handed to writeback: start a flush when a window filled
    /// and none is running (a window that fills meanwhile waits for the next hand-over).
    pub fn handed(&'static self, file: &File, bytes: u64) {
        if self.since.fetch_add(bytes, Ordering::Relaxed) + bytes < self.every {
            return;
        }
        if self.running.swap(true, Ordering::AcqRel) {
            return;
        }
        let _ = self.since.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
            Some(n.saturating_sub(self.every))
        });
        // Its own open file description, not a `dup` (see `own_description`); the thread may
        // outlive the caller's handle (a file renamed into place and closed, a failed temp file
        // unlinked: flushing them is harmless).
        let Some(file) = own_description(file) else {
            self.running.store(false, Ordering::Release);
            return;
        };
        let spawned = std::thread::Builder::new()
            .name("ffsync-device-flush".into())
            .spawn(move || {
                let _ = file.sync_data();
                self.done.fetch_add(1, Ordering::Relaxed);
                self.running.store(false, Ordering::Release);
            });
        if spawned.is_err() {
            self.running.store(false, Ordering::Release);
        }
    }

    /// Flushes finished so far.
    pub fn flushes(&self) -> u64 {
        self.done.load(Ordering::Relaxed)
    }

    /// A flush is running now.
    pub fn running(&self) -> bool {
        self.running.load(Ordering::Acquire)
    }
}

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
    /// Writeback is started as data lands (Linux).
    on: bool,
    /// The file is fsynced before its commit: kicked windows are also waited for (bounding its
    /// dirty pages) and the device's cache is flushed in the background. Without, kicks only.
    durable: bool,
    kick: u64,
    behind: u64,
    device: &'static DeviceFlush,
    /// The file's own read-only description for the waits (`own_description`), opened at the
    /// first wait; `None` inside: none could be opened, so nothing waits.
    waiter: OnceLock<Option<File>>,
    state: Mutex<State>,
}

impl Writeback {
    /// `durable`: the file is fsynced before it is committed (old windows are waited for and
    /// the device flushed); writeback is started either way.
    pub fn new(durable: bool) -> Writeback {
        Self::with_windows(durable, KICK, BEHIND)
    }

    /// As `new`, with other window sizes (tests).
    pub fn with_windows(durable: bool, kick: u64, behind: u64) -> Writeback {
        Self::with_device(durable, kick, behind, &DEVICE_FLUSH)
    }

    /// As `with_windows`, flushing the device through `device` (tests count its flushes).
    pub fn with_device(durable: bool, kick: u64, behind: u64, device: &'static DeviceFlush) -> Writeback {
        Writeback {
            on: cfg!(target_os = "linux"),
            durable,
            kick: kick.max(1),
            behind,
            device,
            waiter: OnceLock::new(),
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
        let (kick, wait, kicked) = {
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
            let kicked = s.pending;
            s.covered += kicked;
            s.pending = 0;
            let mut wait = Vec::new();
            // Only a durable commit waits for old windows (bounding what its fsync finds).
            if self.durable {
                s.in_flight += kicked;
                s.kicked.push_back(range);
                while s.in_flight > self.behind && s.kicked.len() > 1 {
                    let old = s.kicked.pop_front().unwrap();
                    s.in_flight = s.in_flight.saturating_sub(old.1);
                    wait.push(old);
                }
            }
            (range, wait, kicked)
        };
        range_write(file, kick.0, kick.1, false);
        if !wait.is_empty() {
            // Waits consume writeback errors: on a description of their own (see
            // `own_description`), never on the writer's.
            if let Some(waiter) = self.waiter.get_or_init(|| own_description(file)) {
                for (off, len) in wait {
                    range_write(waiter, off, len, true);
                }
            }
        }
        if self.durable {
            self.device.handed(file, kicked);
        }
    }

    /// Bytes handed to writeback early so far.
    pub fn covered(&self) -> u64 {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).covered
    }
}

/// A second open file description of `file`, read-only, for the calls that wait for its
/// writeback (`sync_file_range` with `WAIT_AFTER`, the background `fdatasync`). Not a `dup`:
/// Linux reports a writeback error (EIO, ENOSPC) once per open file description, and a call
/// that waits consumes the report. On the writer's own description (or a `dup` of it, which
/// shares it) an early wait that met an error would leave the fsync before the commit to
/// return success over lost pages; on a description of its own, the writer's fsync still
/// sees the error. Read-only, so it does not keep the file open for writing (`ETXTBSY` for a
/// program run right after the sync). `None` where `/proc` is not mounted (or the file is not
/// readable): the waits are skipped, and the final fsync does all the work.
#[cfg(target_os = "linux")]
pub(crate) fn own_description(file: &File) -> Option<File> {
    use std::os::unix::io::AsRawFd;
    File::open(format!("/proc/self/fd/{}", file.as_raw_fd())).ok()
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn own_description(_file: &File) -> Option<File> {
    None
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

/// Start writeback of a whole range now (a file just written whole, a local copy just made):
/// one call, no window bookkeeping. `durable`: the file will be fsynced before its commit, so
/// the range also counts towards the device's next background flush.
pub fn start(file: &File, offset: u64, len: u64, durable: bool) {
    if len > 0 {
        range_write(file, offset, len, false);
        #[cfg(target_os = "linux")]
        if durable {
            DEVICE_FLUSH.handed(file, len);
        }
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

    /// The waits and the background flush run on a description of their own, not on the
    /// writer's (a `dup` would share it, and the writeback error a wait consumes would be lost
    /// to the fsync before the commit): read-only where the writer's is read-write.
    #[cfg(target_os = "linux")]
    #[test]
    fn waits_use_a_description_of_their_own() {
        use std::os::unix::io::AsRawFd;
        let (_d, f) = file();
        let flags = |fd: i32| unsafe { libc::fcntl(fd, libc::F_GETFL) } & libc::O_ACCMODE;
        assert_eq!(flags(f.as_raw_fd()), libc::O_RDWR);
        let own = own_description(&f).expect("/proc/self/fd is there");
        assert_eq!(
            flags(own.as_raw_fd()),
            libc::O_RDONLY,
            "a new open file description, not a dup"
        );
        let dup = f.try_clone().unwrap();
        assert_eq!(flags(dup.as_raw_fd()), libc::O_RDWR, "(a dup shares the writer's)");
        // The windowed waits open theirs on first use, once.
        let wb = Writeback::with_device(true, 1 << 20, 2 << 20, Box::leak(Box::new(DeviceFlush::new(u64::MAX))));
        for k in 0..6u64 {
            std::os::unix::fs::FileExt::write_at(&f, &vec![1u8; 1 << 20], k << 20).unwrap();
            wb.wrote(&f, k << 20, 1 << 20);
        }
        let waiter = wb.waiter.get().expect("a wait happened").as_ref().expect("opened");
        assert_eq!(flags(waiter.as_raw_fd()), libc::O_RDONLY);
    }

    /// `--no-fsync`: writeback is started as data lands (so a rename over an existing file does
    /// not start it all at once), but nothing waits for it and the device is never flushed.
    #[test]
    fn not_durable_starts_writeback_and_never_waits() {
        let (_d, f) = file();
        let device: &'static DeviceFlush = Box::leak(Box::new(DeviceFlush::new(1)));
        let wb = Writeback::with_device(false, 1 << 20, 2 << 20, device);
        for k in 0..10u64 {
            std::os::unix::fs::FileExt::write_at(&f, &[5u8; 4096], k << 20).unwrap();
            wb.wrote(&f, k << 20, 1 << 20);
        }
        assert!(!device.running());
        assert_eq!(device.flushes(), 0, "no device flush without durability");
        assert!(wb.waiter.get().is_none(), "no window was waited for");
        if cfg!(target_os = "linux") {
            assert!(wb.active());
            assert_eq!(wb.covered(), 10 << 20, "every window was handed to writeback");
            assert_eq!(wb.state.lock().unwrap().in_flight, 0, "nothing kept to wait for");
        } else {
            assert_eq!(wb.covered(), 0);
        }
    }

    /// Waits for the flusher's thread (a flush of a few MiB in a temp dir).
    fn settle(device: &DeviceFlush) {
        let t = std::time::Instant::now();
        while device.running() {
            assert!(t.elapsed() < std::time::Duration::from_secs(60), "flush never finished");
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }

    #[test]
    fn the_device_is_flushed_while_data_arrives() {
        let (_d, f) = file();
        let (_d2, g) = file();
        let device: &'static DeviceFlush = Box::leak(Box::new(DeviceFlush::new(8 << 20)));
        // Two files share one flusher: their hand-overs add up to its window.
        let a = Writeback::with_device(true, 1 << 20, 4 << 20, device);
        let b = Writeback::with_device(true, 1 << 20, 4 << 20, device);
        let block = vec![3u8; 1 << 20];
        for k in 0..5u64 {
            for (w, file) in [(&a, &f), (&b, &g)] {
                std::os::unix::fs::FileExt::write_at(file, &block, k << 20).unwrap();
                w.wrote(file, k << 20, 1 << 20);
            }
        }
        settle(device);
        if !cfg!(target_os = "linux") {
            assert_eq!(device.flushes(), 0);
            return;
        }
        // 10 MiB handed over: one window of 8 filled, one flush ran; the next 2 MiB wait.
        assert_eq!(device.flushes(), 1);
        assert_eq!(device.since.load(Ordering::Relaxed), 2 << 20);
        // A window that fills while a flush runs does not start a second one.
        device.running.store(true, Ordering::Release);
        for k in 5..20u64 {
            std::os::unix::fs::FileExt::write_at(&f, &block, k << 20).unwrap();
            a.wrote(&f, k << 20, 1 << 20);
        }
        assert_eq!(device.flushes(), 1);
        device.running.store(false, Ordering::Release);
        std::os::unix::fs::FileExt::write_at(&f, &block, 20 << 20).unwrap();
        a.wrote(&f, 20 << 20, 1 << 20);
        settle(device);
        assert_eq!(device.flushes(), 2);
    }
}
