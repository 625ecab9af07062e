//! Copy a byte range from one file to another at given offsets. On Linux this is
//! copy_file_range (in-kernel, and a reflink on filesystems that share extents); where it
//! is unavailable it falls back to positional reads and writes through a bounded buffer
//! (never a memory map: a source truncated underneath us must be an error, not SIGBUS).

use super::offset_io::{read_exact_at, write_at};
use std::fs::File;
use std::io;

pub fn copy_range(src: &File, src_off: u64, dst: &File, dst_off: u64, len: u64) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::io::AsRawFd;
        let (mut so, mut dof) = (src_off as i64, dst_off as i64);
        let mut left = len as usize;
        while left > 0 {
            // Safety: valid fds and offset pointers for the duration of the call.
            let n = unsafe { libc::copy_file_range(src.as_raw_fd(), &mut so, dst.as_raw_fd(), &mut dof, left, 0) };
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
        return copy_buffered(src, src_off + done, dst, dst_off + done, left as u64);
    }
    #[allow(unreachable_code)]
    {
        copy_buffered(src, src_off, dst, dst_off, len)
    }
}

fn copy_buffered(src: &File, mut src_off: u64, dst: &File, mut dst_off: u64, mut len: u64) -> io::Result<()> {
    let mut buf = vec![0u8; len.min(1 << 20) as usize];
    while len > 0 {
        let n = len.min(buf.len() as u64) as usize;
        read_exact_at(src, &mut buf[..n], src_off)?;
        write_at(dst, &buf[..n], dst_off)?;
        src_off += n as u64;
        dst_off += n as u64;
        len -= n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_ranges_between_files() {
        let dir = tempfile::tempdir().unwrap();
        let sp = dir.path().join("s");
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&sp, &data).unwrap();
        let src = File::open(&sp).unwrap();
        let dst = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join("d"))
            .unwrap();
        dst.set_len(50_000).unwrap();
        copy_range(&src, 60_000, &dst, 10_000, 30_000).unwrap();
        let got = std::fs::read(dir.path().join("d")).unwrap();
        assert_eq!(&got[10_000..40_000], &data[60_000..90_000]);
        assert!(copy_range(&src, 90_000, &dst, 0, 20_000).is_err());
    }
}
