//! io_uring submission of write batches (Linux only). Short writes and per-entry errors
//! are finished with plain pwrite so semantics match the portable path exactly.
//!
//! A kernel may accept writes and never complete them: seen in CI on this project's kernel,
//! 17 writes submitted, none completed, no io-wq worker ever started, and the receiver waited
//! forever (it did not even end on SIGTERM). So the wait has a watchdog: when nothing completes
//! for `STALL` while writes are pending, this ring is given up (and io_uring with it, for the
//! rest of the process), and the writes not known to have completed are done again with
//! pwrite. The kernel may still carry out the abandoned ones later, so the bytes they point to
//! are copies that are never freed (their content is what pwrite wrote at the same offsets, so
//! a late write changes nothing), and completions are tagged per batch so a late one is never
//! mistaken for a later batch's.
//!
//! The copies of a group live in one staging buffer the ring keeps from group to group: a
//! fresh allocation per group costs a page fault per 4 KiB touched (chunks above glibc's
//! mmap threshold are mapped anew each time), which made io_uring slower than pwrite.

use io_uring::{opcode, types, IoUring};
use std::fs::File;
use std::io;
use std::os::unix::io::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const ENTRIES: u32 = 64;
/// No completion for this long, with writes pending: the ring is stuck (a slow disk completes
/// some write of a group of 64 well within it).
const STALL: Duration = Duration::from_secs(5);
/// A staging buffer grown past this (a group of huge writes) is not kept for the next group.
const STAGE_KEPT: usize = 8 * 1024 * 1024;
/// Once one ring stalled, no new one is made in this process.
static STALLED: AtomicBool = AtomicBool::new(false);

pub struct Ring {
    ring: IoUring,
    /// Tags completions with the batch they belong to (upper 32 bits of user_data).
    generation: u32,
    stall: Duration,
    broken: bool,
    /// What the kernel reads for the group in flight (copies of the caller's buffers, end to
    /// end); kept for the next group, so its pages are touched once, not per group.
    stage: Vec<u8>,
}

impl Ring {
    /// A new ring whose wait gives up after `stall` without a completion (`STALL`; tests: less),
    /// whether or not a ring stalled before (`RingPool::take` checks that).
    pub fn with_stall(stall: Duration) -> io::Result<Ring> {
        let ring = IoUring::new(ENTRIES)?;
        // The watchdog needs waits with a timeout (kernel 5.11+).
        if !ring.params().is_feature_ext_arg() {
            return Err(io::Error::other("io_uring without timed waits"));
        }
        // Probe: some sandboxes allow setup but reject submissions.
        let r = Ring {
            ring,
            generation: 0,
            stall,
            broken: false,
            stage: Vec::new(),
        };
        r.ring.submit()?;
        Ok(r)
    }

    /// False once this ring stalled: the caller writes with pwrite from then on.
    pub fn usable(&self) -> bool {
        !self.broken
    }

    pub fn write_batch(&mut self, file: &File, writes: &[(u64, &[u8])]) -> io::Result<()> {
        let fd = types::Fd(file.as_raw_fd());
        for group in writes.chunks(ENTRIES as usize) {
            if self.broken {
                for (off, buf) in group {
                    super::offset_io::write_at(file, buf, *off)?;
                }
                continue;
            }
            self.generation = self.generation.wrapping_add(1);
            let tag = (self.generation as u64) << 32;
            // The kernel reads the stage, not the caller's buffers: an abandoned write must not
            // read memory its owner has freed.
            let total: usize = group.iter().map(|(_, b)| b.len()).sum();
            let mut stage = std::mem::take(&mut self.stage);
            stage.clear();
            stage.reserve(total);
            for (_, b) in group {
                stage.extend_from_slice(b);
            }
            let queued = {
                let mut sq = self.ring.submission();
                let mut at = 0usize;
                let mut queued = true;
                for (i, (off, buf)) in group.iter().enumerate() {
                    let len = buf.len().min(u32::MAX as usize) as u32;
                    let e = opcode::Write::new(fd, stage[at..].as_ptr(), len)
                        .offset(*off)
                        .build()
                        .user_data(tag | i as u64);
                    at += buf.len();
                    // Safety: `stage` outlives every write (kept below, or leaked if abandoned)
                    // and is not touched until the group completed; the queue has room for a
                    // group (ENTRIES, and nothing else is queued).
                    if unsafe { sq.push(&e) }.is_err() {
                        queued = false;
                        break;
                    }
                }
                queued
            };
            if !queued {
                // Cannot happen (a group fits the queue), but if it did, the entries already
                // queued point into `stage`: the ring is given up (never pooled for another
                // writer, whose submit would run them) and the group written with pwrite.
                self.abandon(stage);
                return self.finish_with_pwrite(file, group, &vec![None; group.len()]);
            }
            // Wait until every entry of this group has completed: the kernel may submit
            // fewer entries than queued, and a signal may end the wait early.
            let mut done = vec![None; group.len()];
            let mut got = 0;
            let mut progress = Instant::now();
            let tick = types::Timespec::new().nsec(200_000_000);
            let args = types::SubmitArgs::new().timespec(&tick);
            while got < group.len() {
                match self.ring.submitter().submit_with_args(1, &args) {
                    Ok(_) => {}
                    Err(e) if e.raw_os_error() == Some(libc::ETIME) => {}
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) if e.raw_os_error() == Some(libc::EBUSY) || e.raw_os_error() == Some(libc::EAGAIN) => {}
                    Err(_) => {
                        self.abandon(stage);
                        return self.finish_with_pwrite(file, group, &done);
                    }
                }
                for cqe in self.ring.completion() {
                    let (t, k) = (cqe.user_data() & !0xffff_ffff, (cqe.user_data() & 0xffff_ffff) as usize);
                    if t == tag && k < done.len() && done[k].is_none() {
                        done[k] = Some(cqe.result());
                        got += 1;
                        progress = Instant::now();
                    }
                }
                if got < group.len() && progress.elapsed() >= self.stall {
                    self.abandon(stage);
                    return self.finish_with_pwrite(file, group, &done);
                }
            }
            if stage.capacity() <= STAGE_KEPT {
                self.stage = stage;
            }
            for (i, res) in done.into_iter().enumerate() {
                let (off, buf) = group[i];
                match res {
                    Some(n) if n >= 0 && n as usize == buf.len() => {}
                    Some(n) if n >= 0 => super::offset_io::write_at(file, &buf[n as usize..], off + n as u64)?,
                    Some(n) => return Err(io::Error::from_raw_os_error(-n)),
                    None => unreachable!("every entry completed above"),
                }
            }
        }
        Ok(())
    }

    /// Give this ring (and io_uring, for new writers) up; the kernel may still read `stage`.
    fn abandon(&mut self, stage: Vec<u8>) {
        self.broken = true;
        STALLED.store(true, Ordering::Relaxed);
        std::mem::forget(stage);
    }

    /// The rest of a group whose writes were abandoned: what did not complete in full, with
    /// pwrite (`done[i]`: the completion seen for entry i, if any). Later groups of the
    /// batch go through pwrite too (`broken`).
    fn finish_with_pwrite(&self, file: &File, group: &[(u64, &[u8])], done: &[Option<i32>]) -> io::Result<()> {
        for (i, (off, buf)) in group.iter().enumerate() {
            match done[i] {
                Some(n) if n >= 0 && n as usize == buf.len() => {}
                _ => super::offset_io::write_at(file, buf, *off)?,
            }
        }
        Ok(())
    }
}

/// Rings kept between the files of a process. A ring is made for a writer when none is idle
/// and given back when its writer is done; reconstructing a tree of many files then sets up a
/// few rings, not one per file (each: `io_uring_setup`, three mappings, the kernel's teardown
/// work when it closes, and a staging buffer mapped and faulted in anew) — decisions §99.
pub struct RingPool {
    idle: std::sync::Mutex<Vec<Ring>>,
    max_idle: usize,
    /// Set once a ring stalled (the process's `STALLED`; a test's own): no ring is given out
    /// after that, idle or new.
    stalled: &'static AtomicBool,
    /// Set once a ring could not be made (no io_uring in this kernel or sandbox, no timed
    /// waits, submissions refused, or no resources): writers use pwrite for the rest of the
    /// process instead of trying again at every batch.
    unavailable: AtomicBool,
    /// A ring was made here at least once.
    made: AtomicBool,
}

impl RingPool {
    pub const fn new(max_idle: usize) -> RingPool {
        Self::with_stall_flag(max_idle, &STALLED)
    }

    const fn with_stall_flag(max_idle: usize, stalled: &'static AtomicBool) -> RingPool {
        RingPool {
            idle: std::sync::Mutex::new(Vec::new()),
            max_idle,
            stalled,
            unavailable: AtomicBool::new(false),
            made: AtomicBool::new(false),
        }
    }

    /// An idle ring, or a new one (made outside the pool's lock); none once a ring stalled or
    /// one could not be made.
    pub fn take(&self) -> io::Result<Ring> {
        {
            let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            if self.stalled.load(Ordering::Relaxed) {
                idle.clear();
                return Err(io::Error::other("io_uring stalled earlier in this process"));
            }
            if self.unavailable.load(Ordering::Relaxed) {
                return Err(io::Error::other("io_uring is not available here"));
            }
            if let Some(ring) = idle.pop() {
                return Ok(ring);
            }
        }
        match Ring::with_stall(STALL) {
            Ok(ring) => {
                self.made.store(true, Ordering::Relaxed);
                Ok(ring)
            }
            Err(e) => {
                self.unavailable.store(true, Ordering::Relaxed);
                Err(e)
            }
        }
    }

    /// Whether writes go through io_uring: `Some(false)` once a ring stalled or could not be
    /// made, `Some(true)` once one was made, `None` before either (nothing tried yet).
    pub fn available(&self) -> Option<bool> {
        if self.stalled.load(Ordering::Relaxed) || self.unavailable.load(Ordering::Relaxed) {
            Some(false)
        } else if self.made.load(Ordering::Relaxed) {
            Some(true)
        } else {
            None
        }
    }

    /// Close the idle rings (a writer that takes one later makes a new one).
    pub fn drop_idle(&self) {
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    /// Keep `ring` for the next writer, unless it was given up after a stall (its abandoned
    /// writes may still complete) or `max_idle` rings are idle already. Every write of a
    /// usable ring has completed when `write_batch` returns, so nothing of this writer's is in
    /// flight for the next.
    pub fn give(&self, ring: Ring) {
        if !ring.usable() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < self.max_idle {
            idle.push(ring);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::io::AsRawFd;

    #[test]
    fn a_pool_gives_the_ring_it_kept_to_the_next_writer_and_keeps_no_broken_or_extra_ring() {
        static STALLED_HERE: AtomicBool = AtomicBool::new(false);
        let t = tempfile::tempdir().unwrap();
        let pool = RingPool::with_stall_flag(2, &STALLED_HERE);
        let Ok(ring) = pool.take() else { return }; // no io_uring here: nothing to test
        let fd = ring.ring.as_raw_fd();
        pool.give(ring);
        // The next file's writer gets that ring back, and it writes that file's bytes.
        let mut ring = pool.take().unwrap();
        assert_eq!(ring.ring.as_raw_fd(), fd, "the idle ring is reused, not a new one made");
        for (i, name) in ["a", "b"].iter().enumerate() {
            let p = t.path().join(name);
            let f = std::fs::OpenOptions::new()
                .create_new(true)
                .read(true)
                .write(true)
                .open(&p)
                .unwrap();
            let bytes = vec![i as u8 + 1; 8192];
            ring.write_batch(&f, &[(4096, &bytes[4096..]), (0, &bytes[..4096])])
                .unwrap();
            assert_eq!(std::fs::read(&p).unwrap(), bytes, "{name}");
        }
        // At most max_idle rings are kept.
        let (a, b) = (pool.take().unwrap(), pool.take().unwrap());
        pool.give(ring);
        pool.give(a);
        pool.give(b);
        assert_eq!(pool.idle.lock().unwrap().len(), 2);
        // Idle rings can all be let go.
        pool.drop_idle();
        assert_eq!(pool.idle.lock().unwrap().len(), 0);
        for r in [pool.take().unwrap(), pool.take().unwrap()] {
            pool.give(r);
        }
        // A ring given up after a stall is closed, not kept.
        let mut broken = pool.take().unwrap();
        broken.broken = true;
        let before = pool.idle.lock().unwrap().len();
        pool.give(broken);
        assert_eq!(pool.idle.lock().unwrap().len(), before);
        assert_eq!(pool.available(), Some(true));
        // Once a ring stalled, none is given out, idle or new, and the idle ones are closed.
        assert!(before > 0);
        STALLED_HERE.store(true, Ordering::Relaxed);
        assert!(pool.take().is_err());
        assert_eq!(pool.idle.lock().unwrap().len(), 0);
        assert_eq!(pool.available(), Some(false));
    }

    #[test]
    fn a_pool_that_could_not_make_a_ring_stops_trying() {
        static NEVER: AtomicBool = AtomicBool::new(false);
        let pool = RingPool::with_stall_flag(2, &NEVER);
        assert_eq!(pool.available(), None, "nothing tried yet");
        // As if this kernel had refused io_uring_setup: the next writers go to pwrite at once.
        pool.unavailable.store(true, Ordering::Relaxed);
        assert!(pool.take().is_err());
        assert_eq!(pool.available(), Some(false));
        assert!(
            !pool.made.load(Ordering::Relaxed),
            "no ring was made for the refused take"
        );
    }

    #[test]
    fn writes_land_and_completions_of_other_batches_are_not_counted() {
        let t = tempfile::tempdir().unwrap();
        let f = std::fs::OpenOptions::new()
            .create_new(true)
            .read(true)
            .write(true)
            .open(t.path().join("f"))
            .unwrap();
        let Ok(mut ring) = Ring::with_stall(STALL) else { return }; // no io_uring here: nothing to test
        let a = vec![1u8; 100_000];
        let b = vec![2u8; 4096];
        let writes: Vec<(u64, &[u8])> = (0..150u64)
            .map(|i| (i * 4096, if i % 2 == 0 { &a[..4096] } else { &b[..] }))
            .collect();
        ring.write_batch(&f, &writes).unwrap();
        ring.write_batch(&f, &[(150 * 4096, &a[..])]).unwrap();
        let mut got = Vec::new();
        (&f).read_to_end(&mut got).unwrap();
        assert_eq!(got.len(), 150 * 4096 + 100_000);
        for i in 0..150 {
            assert!(got[i * 4096..(i + 1) * 4096]
                .iter()
                .all(|&x| x == if i % 2 == 0 { 1 } else { 2 }));
        }
        assert!(ring.usable());
    }

    #[test]
    fn the_staging_buffer_is_reused_from_group_to_group() {
        // A fresh copy per group faulted in every page it touched: io_uring was 0.6 s per GiB
        // slower than pwrite. The stage keeps its memory, unless a group made it huge.
        let t = tempfile::tempdir().unwrap();
        let f = crate::testutil::create_rw(&t.path().join("f"));
        let Ok(mut ring) = Ring::with_stall(STALL) else { return };
        let a = vec![7u8; 300_000];
        ring.write_batch(&f, &[(0, &a[..]), (300_000, &a[..])]).unwrap();
        let (ptr, cap) = (ring.stage.as_ptr(), ring.stage.capacity());
        assert!(cap >= 600_000);
        for i in 1..20u64 {
            ring.write_batch(&f, &[(i * 600_000, &a[..]), (i * 600_000 + 300_000, &a[..])])
                .unwrap();
            assert_eq!(
                (ring.stage.as_ptr(), ring.stage.capacity()),
                (ptr, cap),
                "group {i} allocated anew"
            );
        }
        let huge = vec![1u8; STAGE_KEPT + 1];
        ring.write_batch(&f, &[(0, &huge[..])]).unwrap();
        assert!(ring.stage.capacity() <= STAGE_KEPT, "a huge stage is not kept");
        assert_eq!(
            std::fs::metadata(t.path().join("f")).unwrap().len(),
            (STAGE_KEPT + 1).max(20 * 600_000) as u64
        );
    }

    #[test]
    fn a_write_that_never_completes_is_abandoned_after_the_stall_and_done_with_pwrite() {
        // A pipe nobody reads, filled up: a write to it blocks forever, as the stuck writes
        // did. pwrite to a pipe fails at once (ESPIPE), so the fallback's error is what comes
        // back, in about the stall time, instead of a wait without end.
        let (mut rx, tx) = std::io::pipe().unwrap();
        let tx: File = std::os::fd::OwnedFd::from(tx).into();
        // SAFETY: valid fd; O_NONBLOCK only while filling.
        unsafe { libc::fcntl(tx.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) };
        let chunk = [0u8; 4096];
        while std::io::Write::write(&mut &tx, &chunk).is_ok() {}
        unsafe { libc::fcntl(tx.as_raw_fd(), libc::F_SETFL, 0) };
        let Ok(mut ring) = Ring::with_stall(Duration::from_millis(300)) else {
            return;
        };
        let t0 = Instant::now();
        let r = ring.write_batch(&tx, &[(0, &chunk[..])]);
        let took = t0.elapsed();
        assert!(took < Duration::from_secs(5), "returned after {took:?}");
        assert!(!ring.usable(), "the ring is given up");
        assert!(r.is_err(), "pwrite to a pipe fails: {r:?}");
        assert!(
            RingPool::new(4).take().is_err(),
            "no ring, idle or new, in this process"
        );
        // Unblock the kernel's write before the pipe closes.
        let mut sink = vec![0u8; 1 << 20];
        let _ = rx.read(&mut sink);
    }
}
