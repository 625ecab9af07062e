//! Copy a byte range from one file to another at given offsets. On Linux this is
//! copy_file_range (in-kernel, and a reflink on filesystems that share extents); where it
//! is unavailable it falls back to positional reads and writes through a bounded buffer
//! (never a memory map: a source truncated underneath us must be an error, not SIGBUS).
//!
//! A destination written by several threads at once (a file under reconstruction) passes its
//! `WriteTurn`: each in-kernel copy and each buffered write runs under it, the buffered
//! fallback's reads do not, so reads of an uncached source still overlap (decisions §76).

use super::offset_io::{read_exact_at, write_at};
use super::write_turn::WriteTurn;
use std::fs::File;
use std::io;

/// Copy into a destination nobody else writes meanwhile.
pub fn copy_range(src: &File, src_off: u64, dst: &File, dst_off: u64, len: u64) -> io::Result<()> {
    copy_range_in_turn(src, src_off, dst, dst_off, len, &WriteTurn::new())
}

/// Copy into a destination other threads write too: every write into `dst` takes `turn`.
pub fn copy_range_in_turn(
    src: &File,
    src_off: u64,
    dst: &File,
    dst_off: u64,
    len: u64,
    turn: &WriteTurn,
) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::io::AsRawFd;
        let (mut so, mut dof) = (src_off as i64, dst_off as i64);
        let mut left = len as usize;
        while left > 0 {
            // Safety: valid fds and offset pointers for the duration of the call.
            let n = turn.with(|| unsafe {
                libc::copy_file_range(src.as_raw_fd(), &mut so, dst.as_raw_fd(), &mut dof, left, 0)
            });
            if n < 0 {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EXDEV)
                    | Some(libc::ENOSYS)
                    | Some(libc::EINVAL)
                    | Some(libc::EOPNOTSUPP)
                    | Some(libc::EPERM) => break,
                    Some(libc::EINTR) => continue,
                    _ => return Err(e),
                }
            }
            if n == 0 {
                break; // source shorter than expected: finish buffered (which reports it)
            }
            left -= n as usize;
        }
        let done = len - left as u64;
        return copy_buffered(src, src_off + done, dst, dst_off + done, left as u64, turn);
    }
    #[allow(unreachable_code)]
    {
        copy_buffered(src, src_off, dst, dst_off, len, turn)
    }
}

fn copy_buffered(
    src: &File,
    mut src_off: u64,
    dst: &File,
    mut dst_off: u64,
    mut len: u64,
    turn: &WriteTurn,
) -> io::Result<()> {
    let mut buf = vec![0u8; len.min(1 << 20) as usize];
    while len > 0 {
        let n = len.min(buf.len() as u64) as usize;
        read_exact_at(src, &mut buf[..n], src_off)?;
        turn.with(|| write_at(dst, &buf[..n], dst_off))?;
        src_off += n as u64;
        dst_off += n as u64;
        len -= n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A source file "s" of `len` patterned bytes and an empty target "d" in a fresh directory.
    fn source_and_empty_target(len: u32) -> (tempfile::TempDir, Vec<u8>, File, File) {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        std::fs::write(dir.path().join("s"), &data).unwrap();
        let src = File::open(dir.path().join("s")).unwrap();
        let dst = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join("d"))
            .unwrap();
        (dir, data, src, dst)
    }

    #[test]
    fn copies_ranges_between_files() {
        let (dir, data, src, dst) = source_and_empty_target(100_000);
        dst.set_len(50_000).unwrap();
        copy_range(&src, 60_000, &dst, 10_000, 30_000).unwrap();
        let got = std::fs::read(dir.path().join("d")).unwrap();
        assert_eq!(&got[10_000..40_000], &data[60_000..90_000]);
        assert!(copy_range(&src, 90_000, &dst, 0, 20_000).is_err());
    }

    /// Both ways of copying (in-kernel, and the buffered fallback used across filesystems)
    /// write into the destination only in their turn.
    #[test]
    fn writes_wait_for_the_turn() {
        type Copy = fn(&File, u64, &File, u64, u64, &WriteTurn) -> io::Result<()>;
        let ways: [(&str, Copy); 2] = [("in-kernel", copy_range_in_turn), ("buffered", copy_buffered)];
        for (way, copy) in ways {
            let (dir, data, src, dst) = source_and_empty_target(300_000);
            let turn = WriteTurn::new();
            let done = std::sync::atomic::AtomicBool::new(false);
            std::thread::scope(|s| {
                turn.with(|| {
                    s.spawn(|| {
                        copy(&src, 0, &dst, 0, data.len() as u64, &turn).unwrap();
                        done.store(true, std::sync::atomic::Ordering::SeqCst);
                    });
                    std::thread::sleep(std::time::Duration::from_millis(200));
                    // Another writer holds the turn: nothing may have been written yet.
                    assert!(!done.load(std::sync::atomic::Ordering::SeqCst), "{way}");
                    assert_eq!(dst.metadata().unwrap().len(), 0, "{way}");
                });
            });
            assert!(done.load(std::sync::atomic::Ordering::SeqCst), "{way}");
            assert_eq!(std::fs::read(dir.path().join("d")).unwrap(), data, "{way}");
        }
    }
}
