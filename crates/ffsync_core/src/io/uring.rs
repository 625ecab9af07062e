//! io_uring submission of write batches (Linux only). Short writes and per-entry errors
//! are finished with plain pwrite so semantics match the portable path exactly.

use io_uring::{opcode, types, IoUring};
use std::fs::File;
use std::io;
use std::os::unix::io::AsRawFd;

const ENTRIES: u32 = 64;

pub struct Ring {
    ring: IoUring,
}

impl Ring {
    pub fn new() -> io::Result<Ring> {
        let ring = IoUring::new(ENTRIES)?;
        // Probe: some sandboxes allow setup but reject submissions.
        let r = Ring { ring };
        r.ring.submit()?;
        Ok(r)
    }

    pub fn write_batch(&mut self, file: &File, writes: &[(u64, &[u8])]) -> io::Result<()> {
        let fd = types::Fd(file.as_raw_fd());
        for group in writes.chunks(ENTRIES as usize) {
            {
                let mut sq = self.ring.submission();
                for (i, (off, buf)) in group.iter().enumerate() {
                    let len = buf.len().min(u32::MAX as usize) as u32;
                    let e = opcode::Write::new(fd, buf.as_ptr(), len)
                        .offset(*off)
                        .build()
                        .user_data(i as u64);
                    // Safety: the buffers outlive the wait below; the queue has room for a group.
                    unsafe { sq.push(&e).map_err(|_| io::Error::other("io_uring queue full"))? };
                }
            }
            // Wait until every entry of this group has completed: the kernel may submit
            // fewer entries than queued, and a signal may end the wait early. Buffers must
            // not be released while the kernel can still read them.
            let mut done = vec![None; group.len()];
            let mut got = 0;
            while got < group.len() {
                match self.ring.submit_and_wait(1) {
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) if e.raw_os_error() == Some(libc::EBUSY) || e.raw_os_error() == Some(libc::EAGAIN) => {}
                    Err(e) => return Err(e),
                }
                for cqe in self.ring.completion() {
                    let k = cqe.user_data() as usize;
                    if k < done.len() && done[k].is_none() {
                        done[k] = Some(cqe.result());
                        got += 1;
                    }
                }
            }
            for (i, res) in done.into_iter().enumerate() {
                let (off, buf) = group[i];
                match res {
                    Some(n) if n >= 0 && n as usize == buf.len() => {}
                    Some(n) if n >= 0 => super::write_at(file, &buf[n as usize..], off + n as u64)?,
                    Some(n) => return Err(io::Error::from_raw_os_error(-n)),
                    None => unreachable!("every entry completed above"),
                }
            }
        }
        Ok(())
    }
}
