use super::offset_io::{read_exact_at, write_at};
use std::fs::File;
use std::io;

/// Writes batches of (offset, bytes). On Linux an io_uring instance submits a whole batch
/// with one system call; where io_uring is unavailable (old kernel, seccomp, containers,
/// `FFSYNC_NO_IO_URING=1`) and on other systems, it falls back to positional writes.
///
/// The rings are the process's, not the writer's: a batch takes an idle ring from a pool and
/// gives it back when written. A ring per writer (one per file) cost a tree of many files an
/// `io_uring_setup` per file, its mappings and the kernel's teardown work, and a staging buffer
/// mapped and faulted in per file, on the cores the transfer needs; and every file open at once
/// (a multiplexed session keeps several) held a ring and its staging buffer (decisions §99).
pub struct PositionalWriter {
    #[cfg(target_os = "linux")]
    uring: bool,
}

/// Idle rings kept: batches are written on libuv's thread pool, four threads unless
/// `UV_THREADPOOL_SIZE` says more (a session's write slots are four too), and an idle ring
/// keeps its staging buffer. Batches beyond four at once make a ring each, closed after.
#[cfg(target_os = "linux")]
static RINGS: super::uring::RingPool = super::uring::RingPool::new(4);

/// Writers alive. When the last one goes, so do the idle rings, as the frame pool's idle
/// buffers go with the last connection: an idle or finished `serve` holds no ring, no staging
/// buffer and no descriptor for them.
#[cfg(target_os = "linux")]
static WRITERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

impl PositionalWriter {
    pub fn new() -> PositionalWriter {
        #[cfg(target_os = "linux")]
        {
            let disabled = std::env::var_os("FFSYNC_NO_IO_URING").is_some_and(|v| v != "0");
            WRITERS.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            PositionalWriter { uring: !disabled }
        }
        #[cfg(not(target_os = "linux"))]
        PositionalWriter {}
    }

    pub fn backend(&self) -> &'static str {
        #[cfg(target_os = "linux")]
        if self.uring {
            // What the pool knows (a ring made, or none to be had: uring.rs); before any batch
            // of the process was written, a ring is made here to find out, once.
            let works = RINGS
                .available()
                .unwrap_or_else(|| RINGS.take().map(|r| RINGS.give(r)).is_ok());
            return if works { "io_uring" } else { "pwrite" };
        }
        if cfg!(windows) {
            "seek_write"
        } else {
            "pwrite"
        }
    }

    pub fn write_batch(&self, file: &File, writes: &[(u64, &[u8])]) -> io::Result<()> {
        #[cfg(target_os = "linux")]
        if self.uring {
            if let Ok(mut ring) = RINGS.take() {
                let written = ring.write_batch(file, writes);
                RINGS.give(ring);
                return written;
            }
        }
        for (off, buf) in writes {
            write_at(file, buf, *off)?;
        }
        Ok(())
    }
}

impl Default for PositionalWriter {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(target_os = "linux")]
impl Drop for PositionalWriter {
    fn drop(&mut self) {
        if WRITERS.fetch_sub(1, std::sync::atomic::Ordering::AcqRel) == 1 {
            RINGS.drop_idle();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_writes_land_at_their_offsets() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let f = crate::testutil::create_rw(&p);
        f.set_len(100).unwrap();
        let w = PositionalWriter::new();
        let a = vec![1u8; 10];
        let b = vec![2u8; 20];
        w.write_batch(&f, &[(90, &a), (0, &b)]).unwrap();
        let got = std::fs::read(&p).unwrap();
        assert_eq!(&got[0..20], &b[..]);
        assert_eq!(&got[20..90], &[0u8; 70][..]);
        assert_eq!(&got[90..], &a[..]);
        let mut back = [0u8; 10];
        read_exact_at(&f, &mut back, 90).unwrap();
        assert_eq!(back, [1u8; 10]);
    }
}

thread_local! {
    static READ_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Hash `len` bytes of `file` at `offset` (through a per-thread buffer: no fresh memory).
pub fn hash_range(file: &std::fs::File, offset: u64, len: usize) -> std::io::Result<crate::chunker::Hash> {
    READ_BUF.with(|b| {
        let mut b = b.borrow_mut();
        if b.len() < len {
            b.resize(len, 0);
        }
        read_exact_at(file, &mut b[..len], offset)?;
        Ok(*blake3::hash(&b[..len]).as_bytes())
    })
}
