//! Local stat identity of a file: what must be unchanged for a cached chunk list to be
//! trusted. Where the OS lacks a field (inode/ctime on Windows) it is recorded as 0.

use std::fs::Metadata;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FileIdentity {
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    pub inode: u64,
    pub dev: u64,
}

impl FileIdentity {
    #[cfg(unix)]
    pub fn of(m: &Metadata) -> FileIdentity {
        use std::os::unix::fs::MetadataExt;
        FileIdentity {
            size: m.len(),
            // Wrapping: a time past 2262 keeps its low 64 bits, as the binding reads Node's
            // wider BigInt (a check of a source against its stat compares those bits).
            mtime_ns: m.mtime().wrapping_mul(1_000_000_000).wrapping_add(m.mtime_nsec()),
            ctime_ns: m.ctime().wrapping_mul(1_000_000_000).wrapping_add(m.ctime_nsec()),
            inode: m.ino(),
            dev: m.dev(),
        }
    }

    #[cfg(windows)]
    pub fn of(m: &Metadata) -> FileIdentity {
        use std::os::windows::fs::MetadataExt;
        // FILETIME: 100 ns ticks since 1601-01-01.
        const EPOCH_DIFF_100NS: i64 = 116_444_736_000_000_000;
        let to_unix_ns = |t: u64| (t as i64 - EPOCH_DIFF_100NS) * 100;
        FileIdentity {
            size: m.len(),
            mtime_ns: to_unix_ns(m.last_write_time()),
            ctime_ns: to_unix_ns(m.creation_time()),
            inode: 0,
            dev: 0,
        }
    }

    pub fn to_bytes(&self) -> [u8; 40] {
        let mut b = [0u8; 40];
        b[0..8].copy_from_slice(&self.size.to_le_bytes());
        b[8..16].copy_from_slice(&self.mtime_ns.to_le_bytes());
        b[16..24].copy_from_slice(&self.ctime_ns.to_le_bytes());
        b[24..32].copy_from_slice(&self.inode.to_le_bytes());
        b[32..40].copy_from_slice(&self.dev.to_le_bytes());
        b
    }

    pub fn from_bytes(b: &[u8; 40]) -> FileIdentity {
        let u = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        FileIdentity {
            size: u(0),
            mtime_ns: u(8) as i64,
            ctime_ns: u(16) as i64,
            inode: u(24),
            dev: u(32),
        }
    }
}
