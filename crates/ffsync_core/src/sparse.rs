//! Sparse files: the sender finds its file's holes with SEEK_HOLE / SEEK_DATA, the
//! receiver never requests chunks that lie inside them and punches the same holes into its
//! rebuilt file before the commit, then re-verifies every chunk a hole touches. A 10 GiB
//! image with 9 GiB of holes costs 1 GiB on the wire and on the receiver's disk.
//!
//! Hole list (the HOLES frame, docs/protocol.md §4.13): `count u32`, then `count` ×
//! (`offset u64`, `len u64`), ascending, disjoint, non-empty, inside the file.

use crate::error::{CoreError, Result};
use crate::manifest::u32_at;
use std::fs::File;
use std::io;

/// A hole: `len` bytes of zeros at `offset` that occupy no disk blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hole {
    pub offset: u64,
    pub len: u64,
}

impl Hole {
    pub fn end(&self) -> u64 {
        self.offset + self.len
    }
}

/// The holes of `file` (of length `size`), as the filesystem reports them. Empty where the
/// OS or filesystem cannot tell (then every byte is data, which is always correct).
pub fn holes(file: &File, size: u64) -> io::Result<Vec<Hole>> {
    #[cfg(any(target_os = "linux", target_os = "macos", target_os = "freebsd"))]
    {
        use std::os::unix::io::AsRawFd;
        let fd = file.as_raw_fd();
        let seek = |offset: u64, whence: libc::c_int| -> io::Result<Option<u64>> {
            // Safety: valid fd; lseek has no memory effects.
            let r = unsafe { libc::lseek(fd, offset as libc::off_t, whence) };
            if r >= 0 {
                return Ok(Some(r as u64));
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::ENXIO) => Ok(None), // no more data (or holes) past `offset`
                _ => Err(e),
            }
        };
        let mut out = Vec::new();
        let mut at = 0u64;
        while at < size {
            let hole = match seek(at, libc::SEEK_HOLE) {
                Ok(Some(h)) => h.min(size),
                Ok(None) => break,
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return Ok(Vec::new()), // unsupported
                Err(e) => return Err(e),
            };
            if hole >= size {
                break;
            }
            let data = seek(hole, libc::SEEK_DATA)?.unwrap_or(size).min(size);
            if data > hole {
                out.push(Hole {
                    offset: hole,
                    len: data - hole,
                });
            }
            at = data;
        }
        Ok(out)
    }
    #[cfg(not(any(target_os = "linux", target_os = "macos", target_os = "freebsd")))]
    {
        let _ = (file, size);
        Ok(Vec::new())
    }
}

pub fn encode(holes: &[Hole]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + 16 * holes.len());
    out.extend_from_slice(&(holes.len() as u32).to_le_bytes());
    for h in holes {
        out.extend_from_slice(&h.offset.to_le_bytes());
        out.extend_from_slice(&h.len.to_le_bytes());
    }
    out
}

/// Decode a peer's hole list for a file of `size` bytes.
pub fn decode(buf: &[u8], size: u64) -> Result<Vec<Hole>> {
    let bad = |r: String| CoreError::malformed("hole list", r);
    if buf.len() < 4 {
        return Err(bad("shorter than its count".into()));
    }
    let n = u32_at(buf, 0) as usize;
    if buf.len() != 4 + 16 * n {
        return Err(bad(format!("{} bytes for {n} holes", buf.len())));
    }
    let mut out = Vec::with_capacity(n);
    let mut prev_end = 0u64;
    for k in 0..n {
        let at = 4 + 16 * k;
        let offset = u64::from_le_bytes(buf[at..at + 8].try_into().unwrap());
        let len = u64::from_le_bytes(buf[at + 8..at + 16].try_into().unwrap());
        let end = offset
            .checked_add(len)
            .ok_or_else(|| bad(format!("hole {k} overflows")))?;
        if len == 0 || offset < prev_end || (k > 0 && offset == prev_end) || end > size {
            return Err(bad(format!(
                "hole {k} ({offset}+{len}) is empty, out of order or outside the file"
            )));
        }
        prev_end = end;
        out.push(Hole { offset, len });
    }
    Ok(out)
}

/// Make `len` bytes at `offset` a hole (Linux: punch; elsewhere, or where the filesystem
/// cannot punch: write zeros, so the content is right either way).
pub fn punch(file: &File, offset: u64, len: u64) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::io::AsRawFd;
        // Safety: valid fd.
        let r = unsafe {
            libc::fallocate(
                file.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                offset as libc::off_t,
                len as libc::off_t,
            )
        };
        if r == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if !matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS)) {
            return Err(e);
        }
    }
    let zeros = vec![0u8; len.min(1 << 20) as usize];
    let mut at = offset;
    while at < offset + len {
        let n = (offset + len - at).min(zeros.len() as u64) as usize;
        crate::io::write_at(file, &zeros[..n], at)?;
        at += n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_holes_of_a_sparse_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sparse");
        let f = crate::testutil::create_rw(&p);
        f.set_len(8 << 20).unwrap();
        crate::io::write_at(&f, &[1u8; 4096], 1 << 20).unwrap();
        crate::io::write_at(&f, &[2u8; 4096], 5 << 20).unwrap();
        let h = holes(&f, 8 << 20).unwrap();
        if h.is_empty() {
            eprintln!("SKIPPED: this filesystem reports no holes");
            return;
        }
        assert_eq!(
            h[0],
            Hole {
                offset: 0,
                len: 1 << 20
            }
        );
        assert_eq!(h.last().unwrap().end(), 8 << 20);
        assert!(h.iter().all(|x| x.end() <= 1 << 20 || x.offset >= (1 << 20) + 4096));
        assert_eq!(decode(&encode(&h), 8 << 20).unwrap(), h);
        // Punching turns data into zeros that occupy nothing.
        punch(&f, 5 << 20, 4096).unwrap();
        let mut b = [9u8; 4096];
        crate::io::read_exact_at(&f, &mut b, 5 << 20).unwrap();
        assert!(b.iter().all(|&x| x == 0));
    }

    #[test]
    fn hostile_hole_lists_are_refused() {
        let h = |o, l| Hole { offset: o, len: l };
        assert!(decode(&encode(&[h(0, 10), h(20, 5)]), 100).is_ok());
        for bad in [
            vec![h(0, 0)],
            vec![h(10, 5), h(0, 5)],
            vec![h(0, 10), h(10, 5)],
            vec![h(90, 20)],
            vec![h(u64::MAX, 2)],
        ] {
            assert!(decode(&encode(&bad), 100).is_err(), "{bad:?}");
        }
        let good = encode(&[h(0, 10)]);
        assert!(decode(&good[..good.len() - 1], 100).is_err());
        assert!(decode(&[1, 0, 0], 100).is_err());
        assert!(decode(&[0, 0, 0, 0], 100).unwrap().is_empty());
    }
}
