//! A loopback UDP relay that adds a fixed one-way delay, for bench/sync.ts's latency scenario
//! (`--quic` at 30 ms RTT). The JavaScript relay in __test__/helpers/delay-proxy.ts handles one
//! datagram per event-loop turn and drops packets above ~20 MB/s, which measures the relay,
//! not QUIC; this one keeps up. Not part of the product.
//!
//!   udp_delay_relay <target-port> <one-way-delay-ms> [target-host]
//!
//! Prints the port it listens on (127.0.0.1) as its first line; the first peer to send is
//! "the client", everything else goes to <target-host>:<target-port> (default 127.0.0.1;
//! bench/net.ts points it across a shaped veth link into another network namespace). Runs
//! until killed.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UdpSocket;
use tokio::sync::{mpsc, OnceCell};
use tokio::time::Instant;

type Packet = (Instant, Vec<u8>);

/// Sends each packet at its due time, in arrival order (a constant delay keeps FIFO order).
async fn delay_line(mut rx: mpsc::UnboundedReceiver<Packet>, out: Arc<UdpSocket>, to: Arc<OnceCell<SocketAddr>>) {
    while let Some((due, buf)) = rx.recv().await {
        tokio::time::sleep_until(due).await;
        if let Some(addr) = to.get() {
            let _ = out.send_to(&buf, addr).await;
        }
    }
}

fn big_buffers(s: &std::net::UdpSocket) {
    let s = socket2::SockRef::from(s);
    let _ = s.set_recv_buffer_size(8 << 20);
    let _ = s.set_send_buffer_size(8 << 20);
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 3 && args.len() != 4 {
        eprintln!("usage: udp_delay_relay <target-port> <one-way-delay-ms> [target-host]");
        std::process::exit(2);
    }
    let host = args.get(3).map_or("127.0.0.1", String::as_str);
    let target: SocketAddr = format!("{host}:{}", args[1]).parse().expect("target host and port");
    let delay = Duration::from_millis(args[2].parse().expect("delay in ms"));
    let front = std::net::UdpSocket::bind("127.0.0.1:0")?;
    // The back socket faces the target: bound to the unspecified address so the kernel picks
    // the interface (loopback, or the veth toward another namespace).
    let back = std::net::UdpSocket::bind(if target.ip().is_loopback() {
        "127.0.0.1:0"
    } else {
        "0.0.0.0:0"
    })?;
    for s in [&front, &back] {
        big_buffers(s);
        s.set_nonblocking(true)?;
    }
    println!("{}", front.local_addr()?.port());
    let front = Arc::new(UdpSocket::from_std(front)?);
    let back = Arc::new(UdpSocket::from_std(back)?);
    let client = Arc::new(OnceCell::new());
    let server = Arc::new(OnceCell::new_with(Some(target)));
    let (to_server, rx1) = mpsc::unbounded_channel();
    let (to_client, rx2) = mpsc::unbounded_channel();
    tokio::spawn(delay_line(rx1, back.clone(), server));
    tokio::spawn(delay_line(rx2, front.clone(), client.clone()));
    let (f, b) = (front.clone(), back.clone());
    let upstream = async move {
        let mut buf = vec![0u8; 65536];
        loop {
            let (n, from) = f.recv_from(&mut buf).await?;
            let _ = client.set(from);
            let _ = to_server.send((Instant::now() + delay, buf[..n].to_vec()));
        }
        #[allow(unreachable_code)]
        Ok::<(), std::io::Error>(())
    };
    let downstream = async move {
        let mut buf = vec![0u8; 65536];
        loop {
            let (n, _) = b.recv_from(&mut buf).await?;
            let _ = to_client.send((Instant::now() + delay, buf[..n].to_vec()));
        }
        #[allow(unreachable_code)]
        Ok::<(), std::io::Error>(())
    };
    tokio::try_join!(upstream, downstream)?;
    Ok(())
}
