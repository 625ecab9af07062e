use napi_derive::napi;

/// The kernel's smoothed RTT of the connected TCP socket `fd` in microseconds, or null where the
/// platform does not say (ffsync_core::tcp_rtt). One getsockopt: brief, on the calling thread.
#[napi]
pub fn tcp_rtt_micros(fd: i32) -> Option<u32> {
    ffsync_core::tcp_rtt::tcp_rtt_micros(fd)
}
