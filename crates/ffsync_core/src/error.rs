//! One error type for the engine. Each variant maps to a stable string code that the
//! binding forwards to JavaScript (and the CLI maps to an rsync-style exit code).

use std::io;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum CoreError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path}: not a regular file")]
    NotAFile { path: PathBuf },
    /// A source opened to be read is gone, or is no longer the version that was scanned.
    #[error("{path} changed or vanished since it was scanned")]
    SourceChanged { path: PathBuf },
    #[error("malformed {what}: {reason}")]
    Malformed { what: &'static str, reason: String },
    #[error("verification failed: {0}")]
    VerifyFailed(String),
    #[error("chunk {index} failed its hash check ({origin})")]
    ChunkCorrupt { index: u32, origin: &'static str },
    #[error("no space left on device while writing {path}")]
    DiskFull { path: PathBuf },
    #[error("{0}")]
    Usage(String),
    /// A network failure (QUIC transport); `code` is a socket error code (ETIMEDOUT, …).
    #[error("{message}")]
    Network { code: &'static str, message: String },
}

impl CoreError {
    pub fn io(path: impl Into<PathBuf>, source: io::Error) -> Self {
        let path = path.into();
        if is_disk_full(&source) {
            return CoreError::DiskFull { path };
        }
        CoreError::Io { path, source }
    }

    pub fn malformed(what: &'static str, reason: impl Into<String>) -> Self {
        CoreError::Malformed {
            what,
            reason: reason.into(),
        }
    }

    /// Stable machine-readable code, one of [`ERROR_CODES`] (ts/utils/errors.ts maps each to
    /// an exit code; `__test__/native-constants.test.ts` checks that every one is mapped).
    pub fn code(&self) -> &'static str {
        match self {
            CoreError::Io { source, .. } => match source.kind() {
                io::ErrorKind::NotFound => "ENOENT",
                io::ErrorKind::PermissionDenied => "EACCES",
                _ => "EIO",
            },
            CoreError::NotAFile { .. } => "ENOTFILE",
            CoreError::SourceChanged { .. } => "ECHANGED",
            CoreError::Malformed { .. } => "EMALFORMED",
            CoreError::VerifyFailed(_) => "EVERIFY",
            CoreError::ChunkCorrupt { .. } => "ECHUNK",
            CoreError::DiskFull { .. } => "ENOSPC",
            CoreError::Usage(_) => "EUSAGE",
            CoreError::Network { code, .. } => code,
        }
    }
}

/// Every code [`CoreError::code`] can return: the local ones, then the network ones
/// ([`crate::quic::net_error`]).
pub const ERROR_CODES: &[&str] = &[
    "ENOENT",
    "EACCES",
    "EIO",
    "ENOTFILE",
    "ECHANGED",
    "EMALFORMED",
    "EVERIFY",
    "ECHUNK",
    "ENOSPC",
    "EUSAGE",
    "ETIMEDOUT",
    "ECONNRESET",
    "ECLOSED",
    "ESOCKET",
    "EADDRINUSE",
    "EADDRNOTAVAIL",
    "ETLS",
];

fn is_disk_full(e: &io::Error) -> bool {
    if e.kind() == io::ErrorKind::StorageFull || e.kind() == io::ErrorKind::QuotaExceeded {
        return true;
    }
    #[cfg(unix)]
    {
        matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
    }
    #[cfg(not(unix))]
    {
        // ERROR_DISK_FULL (112) and ERROR_HANDLE_DISK_FULL (39)
        matches!(e.raw_os_error(), Some(112) | Some(39))
    }
}

pub type Result<T> = std::result::Result<T, CoreError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_local_code_is_listed() {
        let p = std::path::Path::new("x");
        let errors = [
            CoreError::io(p, io::Error::from(io::ErrorKind::NotFound)),
            CoreError::io(p, io::Error::from(io::ErrorKind::PermissionDenied)),
            CoreError::io(p, io::Error::other("x")),
            CoreError::NotAFile { path: p.into() },
            CoreError::SourceChanged { path: p.into() },
            CoreError::malformed("x", "y"),
            CoreError::VerifyFailed("x".into()),
            CoreError::ChunkCorrupt { index: 0, origin: "x" },
            CoreError::DiskFull { path: p.into() },
            CoreError::Usage("x".into()),
        ];
        for e in errors {
            assert!(ERROR_CODES.contains(&e.code()), "{} is not in ERROR_CODES", e.code());
        }
    }
}
