use super::offset_io::{read_exact_at, write_at};
use std::fs::File;
use std::io;

/// Writes batches of (offset, bytes). On Linux an io_uring instance submits a whole batch
/// with one system call; where io_uring is unavailable (old kernel, seccomp, containers,
/// `FFSYNC_NO_IO_URING=1`) and on other systems, it falls back to positional writes.
pub struct PositionalWriter {
    #[cfg(target_os = "linux")]
    uring: Option<std::sync::Mutex<super::uring::Ring>>,
}

impl PositionalWriter {
    pub fn new() -> PositionalWriter {
        #[cfg(target_os = "linux")]
        {
            let disabled = std::env::var_os("FFSYNC_NO_IO_URING").is_some_and(|v| v != "0");
            let uring = if disabled {
                None
            } else {
                super::uring::Ring::new().ok().map(std::sync::Mutex::new)
            };
            PositionalWriter { uring }
        }
        #[cfg(not(target_os = "linux"))]
        PositionalWriter {}
    }

    pub fn backend(&self) -> &'static str {
        #[cfg(target_os = "linux")]
        if let Some(ring) = &self.uring {
            // A ring given up after a stall (uring.rs) writes with pwrite.
            if ring.lock().unwrap_or_else(|p| p.into_inner()).usable() {
                return "io_uring";
            }
            return "pwrite";
        }
        if cfg!(windows) {
            "seek_write"
        } else {
            "pwrite"
        }
    }

    pub fn write_batch(&self, file: &File, writes: &[(u64, &[u8])]) -> io::Result<()> {
        #[cfg(target_os = "linux")]
        if let Some(ring) = &self.uring {
            return ring.lock().unwrap_or_else(|p| p.into_inner()).write_batch(file, writes);
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
