//! The kernel's round-trip time of a connected TCP socket.
//!
//! A sender opens its TCP connection while the program loads (decisions §110), so no timer of
//! its own sees when the handshake completed: the event loop is busy loading the program then.
//! The kernel took the sample itself (the SYN to the SYN-ACK, smoothed by later ACKs), and the
//! sender picks its first compression level from it (ts/api/compress-level.ts `startLevel`).

/// `tcpi_state` of an established connection (linux/tcp_states.h; not in the libc crate).
#[cfg(target_os = "linux")]
const TCP_ESTABLISHED: u8 = 1;
/// Bytes of `tcp_info` up to and including `tcpi_rtt` (8 bytes of u8 fields, then 16 u32s): an
/// older kernel fills less of the struct, and then says nothing about the RTT.
#[cfg(target_os = "linux")]
const RTT_END: usize = 8 + 16 * 4;

/// The smoothed round-trip time of the connected TCP socket `fd`, in microseconds; `None` where
/// the platform does not say (not Linux) or the call fails (not a TCP socket, not connected).
#[cfg(target_os = "linux")]
pub fn tcp_rtt_micros(fd: i32) -> Option<u32> {
    // SAFETY: `info` is a plain C struct the kernel fills up to `len` bytes; a bad descriptor
    // makes getsockopt fail (EBADF, ENOTSOCK, ENOPROTOOPT), which is reported as None.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    if rc != 0 || (len as usize) < RTT_END || info.tcpi_state != TCP_ESTABLISHED {
        return None;
    }
    Some(info.tcpi_rtt)
}

#[cfg(not(target_os = "linux"))]
pub fn tcp_rtt_micros(_fd: i32) -> Option<u32> {
    None
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::tcp_rtt_micros;
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsRawFd;

    #[test]
    fn a_connected_loopback_socket_has_a_small_rtt_and_other_descriptors_none() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (_server, _) = listener.accept().unwrap();
        let rtt = tcp_rtt_micros(client.as_raw_fd()).expect("a connected TCP socket has an RTT");
        assert!(rtt > 0 && rtt < 1_000_000, "loopback RTT {rtt} µs");
        // A listening socket is no connection; a file is no socket; -1 is no descriptor.
        assert_eq!(tcp_rtt_micros(listener.as_raw_fd()), None);
        let file = std::fs::File::open("/proc/self/stat").unwrap();
        assert_eq!(tcp_rtt_micros(file.as_raw_fd()), None);
        assert_eq!(tcp_rtt_micros(-1), None);
    }
}
