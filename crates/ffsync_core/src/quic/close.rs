//! How a QUIC connection ends, and the errors it reports: the application close codes and
//! the network errors the shell maps to exit codes.

use quinn::VarInt;

use crate::error::CoreError;

/// Application close codes (visible to the peer in its error).
pub const CLOSE_DONE: u32 = 0;
pub const CLOSE_ABORTED: u32 = 1;
pub const CLOSE_BUSY: u32 = 2;

/// A network failure with the code the shell maps to an exit code.
pub fn net_error(code: &'static str, message: impl Into<String>) -> CoreError {
    debug_assert!(
        crate::error::ERROR_CODES.contains(&code),
        "{code} is not in ERROR_CODES"
    );
    CoreError::Network {
        code,
        message: message.into(),
    }
}

pub(super) fn io_net_error(e: std::io::Error, context: &str) -> CoreError {
    let code = match e.kind() {
        std::io::ErrorKind::AddrInUse => "EADDRINUSE",
        std::io::ErrorKind::AddrNotAvailable => "EADDRNOTAVAIL",
        std::io::ErrorKind::PermissionDenied => "EACCES",
        _ => "ESOCKET",
    };
    net_error(code, format!("{context}: {e}"))
}

/// Describe a connection-level failure; `CLOSE_*` codes from our peer read as words.
pub fn connection_error(e: &quinn::ConnectionError) -> CoreError {
    use quinn::ConnectionError as C;
    match e {
        C::TimedOut => net_error("ETIMEDOUT", "QUIC connection timed out (no packets from the peer)"),
        C::ApplicationClosed(c) if c.error_code == VarInt::from_u32(CLOSE_DONE) => {
            net_error("ECLOSED", "QUIC connection closed by the peer")
        }
        C::ApplicationClosed(c) => net_error(
            "ECONNRESET",
            format!(
                "QUIC connection closed by the peer ({})",
                String::from_utf8_lossy(&c.reason)
            ),
        ),
        C::LocallyClosed => net_error("ECLOSED", "QUIC connection closed"),
        C::Reset => net_error("ECONNRESET", "QUIC connection reset by the peer"),
        C::ConnectionClosed(c) => net_error("ECONNRESET", format!("QUIC connection closed by the peer: {c}")),
        C::TransportError(t) => net_error("ETLS", format!("QUIC handshake or transport error: {t}")),
        other => net_error("ESOCKET", format!("QUIC connection failed: {other}")),
    }
}
