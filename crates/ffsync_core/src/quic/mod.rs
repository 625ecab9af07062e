//! QUIC transport (`--quic`): one QUIC connection per session whose bidirectional
//! streams carry the same framed conversations as TCP/TLS connections do (the first
//! stream is the session, later ones are a tree's lanes). Built on quinn with rustls
//! (ring provider) and TLS 1.3 mutual authentication by the peers' usual self-signed
//! identities; trust is the shell's fingerprint pinning, exactly as for TLS over TCP.
//!
//! Everything here is async on tokio; the binding runs it on napi's tokio runtime.

mod close;
mod stream;
mod verify;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use quinn::{Endpoint, TransportConfig, VarInt};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

pub use close::{connection_error, net_error, CLOSE_ABORTED, CLOSE_BUSY, CLOSE_DONE};
pub use stream::QuicStream;

use close::io_net_error;

use crate::error::{CoreError, Result};

/// ALPN protocol id: a QUIC peer that is not ffsync-native fails the handshake cleanly.
pub const ALPN: &[u8] = b"ffsync/1";

/// A peer's certificate and key, as PEM (the same files the TLS transport uses).
#[derive(Clone)]
pub struct QuicIdentity {
    chain: Vec<CertificateDer<'static>>,
    key: Arc<PrivateKeyDer<'static>>,
}

impl QuicIdentity {
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self> {
        let chain = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| CoreError::Usage(format!("identity certificate: {e}")))?;
        if chain.is_empty() {
            return Err(CoreError::Usage("identity certificate: no certificate in PEM".into()));
        }
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
            .map_err(|e| CoreError::Usage(format!("identity key: {e}")))?;
        Ok(Self {
            chain,
            key: Arc::new(key),
        })
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Bytes a connection may have in flight towards this side, and one stream of it: what quinn
/// buffers for us when the shell reads slower than the link (a receiver writing to disk), so a
/// peer's resident memory. 16 MiB is four times the bandwidth-delay product of 1 Gbit/s at
/// 30 ms; the 64 MiB of before held a receiver at 145 MiB (docs/decisions.md §121).
pub const RECEIVE_WINDOW: u32 = 16 << 20;
pub const STREAM_RECEIVE_WINDOW: u32 = 8 << 20;
/// Bytes this side buffers to send (unacknowledged and not yet sent): on a link slower than the
/// disk the whole window fills, so it is resident too; 64 MiB held a 100 Mbit/s sender at 151 MiB.
pub const SEND_WINDOW: u64 = 16 << 20;

/// Windows sized for long fat links (four times 1 Gbit/s at 30 ms) without letting one stream
/// hog the connection or a slow reader pile up memory; keep-alives so a peer busy with local
/// work is not timed out.
fn transport(idle_timeout: Duration) -> Arc<TransportConfig> {
    let mut t = TransportConfig::default();
    t.stream_receive_window(VarInt::from_u32(STREAM_RECEIVE_WINDOW));
    t.receive_window(VarInt::from_u32(RECEIVE_WINDOW));
    t.send_window(SEND_WINDOW);
    t.max_concurrent_bidi_streams(VarInt::from_u32(64));
    t.max_concurrent_uni_streams(VarInt::from_u32(0));
    t.keep_alive_interval(Some(Duration::from_secs(2)));
    let idle = idle_timeout.max(Duration::from_secs(3));
    t.max_idle_timeout(Some(
        idle.try_into()
            .unwrap_or(quinn::IdleTimeout::from(VarInt::from_u32(60_000))),
    ));
    Arc::new(t)
}

fn tls_error(e: impl std::fmt::Display) -> CoreError {
    net_error("ETLS", format!("QUIC TLS configuration: {e}"))
}

fn server_config(id: &QuicIdentity, idle: Duration) -> Result<quinn::ServerConfig> {
    let p = provider();
    let verifier = Arc::new(verify::PinnedByShell::new(&p));
    let mut tls = rustls::ServerConfig::builder_with_provider(p)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls_error)?
        .with_client_cert_verifier(verifier)
        .with_single_cert(id.chain.clone(), id.key.clone_key())
        .map_err(tls_error)?;
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let crypto = QuicServerConfig::try_from(tls).map_err(tls_error)?;
    let mut cfg = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    cfg.transport_config(transport(idle));
    Ok(cfg)
}

fn client_config(id: &QuicIdentity, idle: Duration) -> Result<quinn::ClientConfig> {
    let p = provider();
    let verifier = Arc::new(verify::PinnedByShell::new(&p));
    let mut tls = rustls::ClientConfig::builder_with_provider(p)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls_error)?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_client_auth_cert(id.chain.clone(), id.key.clone_key())
        .map_err(tls_error)?;
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let crypto = QuicClientConfig::try_from(tls).map_err(tls_error)?;
    let mut cfg = quinn::ClientConfig::new(Arc::new(crypto));
    cfg.transport_config(transport(idle));
    Ok(cfg)
}

/// Socket buffers for the UDP socket. The kernel default (~200 KiB) overflows at a few
/// hundred MB/s, and every dropped datagram is a QUIC retransmission; the kernel caps
/// the request at its maximum (net.core.rmem_max), so asking is always safe.
const UDP_BUFFER: usize = 4 << 20;

fn endpoint(addr: SocketAddr, server: Option<quinn::ServerConfig>) -> std::io::Result<Endpoint> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if addr.is_ipv6() {
        // Accept IPv4 too on `::` (a receiver bound to `::` serves both).
        let _ = socket.set_only_v6(false);
    }
    let _ = socket.set_recv_buffer_size(UDP_BUFFER);
    let _ = socket.set_send_buffer_size(UDP_BUFFER);
    socket.bind(&addr.into())?;
    let runtime = quinn::default_runtime().ok_or_else(|| std::io::Error::other("no async runtime"))?;
    Endpoint::new(quinn::EndpointConfig::default(), server, socket.into(), runtime)
}

/// A UDP endpoint accepting QUIC connections (the receiving side of `--quic`).
pub struct QuicListener {
    endpoint: Endpoint,
}

impl QuicListener {
    /// Bind `addr` (port 0 = any free port). Must run inside a tokio runtime.
    pub fn bind(addr: SocketAddr, id: &QuicIdentity, idle: Duration) -> Result<Self> {
        let endpoint = endpoint(addr, Some(server_config(id, idle)?))
            .map_err(|e| io_net_error(e, &format!("cannot listen on UDP {addr}")))?;
        Ok(Self { endpoint })
    }

    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.endpoint
            .local_addr()
            .map_err(|e| io_net_error(e, "UDP socket address"))
    }

    /// The next connection that completes its handshake; `None` once closed. A handshake
    /// that fails (not ffsync, no certificate) is skipped, as a TLS listener would.
    pub async fn accept(&self) -> Option<Result<QuicConnection>> {
        loop {
            let incoming = self.endpoint.accept().await?;
            let connecting = match incoming.accept() {
                Ok(c) => c,
                Err(e) => return Some(Err(connection_error(&e))),
            };
            match connecting.await {
                Ok(conn) => return Some(Ok(QuicConnection { conn, endpoint: None })),
                Err(quinn::ConnectionError::TransportError(_)) | Err(quinn::ConnectionError::ConnectionClosed(_)) => {
                    continue
                }
                Err(e) => return Some(Err(connection_error(&e))),
            }
        }
    }

    /// Refuse new connections (the peer sees CONNECTION_REFUSED at once); connections
    /// already accepted keep running on this endpoint.
    pub fn stop_accepting(&self) {
        self.endpoint.set_server_config(None);
    }

    /// Close the endpoint: a pending accept() returns None, and every connection on it
    /// ends (`CLOSE_BUSY` if one is still open — close sessions first).
    pub fn close(&self) {
        self.endpoint.set_server_config(None);
        self.endpoint.close(VarInt::from_u32(CLOSE_BUSY), b"receiver closed");
    }
}

/// Connect to `addr`; the handshake must complete within `timeout` (a silent UDP path,
/// e.g. a firewall dropping UDP, surfaces as ETIMEDOUT).
pub async fn connect(addr: SocketAddr, id: &QuicIdentity, timeout: Duration, idle: Duration) -> Result<QuicConnection> {
    let local: SocketAddr = if addr.is_ipv6() {
        "[::]:0".parse().unwrap()
    } else {
        "0.0.0.0:0".parse().unwrap()
    };
    let mut endpoint = endpoint(local, None).map_err(|e| io_net_error(e, "cannot open a UDP socket"))?;
    endpoint.set_default_client_config(client_config(id, idle)?);
    let connecting = endpoint
        .connect(addr, "ffsync-native")
        .map_err(|e| net_error("ESOCKET", format!("cannot connect to {addr}: {e}")))?;
    match tokio::time::timeout(timeout, connecting).await {
        Ok(Ok(conn)) => Ok(QuicConnection {
            conn,
            endpoint: Some(endpoint),
        }),
        Ok(Err(e)) => {
            endpoint.close(VarInt::from_u32(CLOSE_ABORTED), b"handshake failed");
            Err(connection_error(&e))
        }
        Err(_) => {
            endpoint.close(VarInt::from_u32(CLOSE_ABORTED), b"handshake timed out");
            Err(net_error(
                "ETIMEDOUT",
                format!("no QUIC answer from {addr} within {} s", timeout.as_secs_f64().round()),
            ))
        }
    }
}

/// One established QUIC connection.
pub struct QuicConnection {
    conn: quinn::Connection,
    /// The client's own endpoint, closed with the connection.
    endpoint: Option<Endpoint>,
}

impl QuicConnection {
    /// DER of the certificate the peer presented (its fingerprint is what gets pinned).
    pub fn peer_certificate(&self) -> Option<Vec<u8>> {
        let any = self.conn.peer_identity()?;
        let chain = any.downcast::<Vec<CertificateDer<'static>>>().ok()?;
        chain.first().map(|c| c.as_ref().to_vec())
    }

    pub fn remote_address(&self) -> SocketAddr {
        self.conn.remote_address()
    }

    /// Open a stream (the opener speaks first: a stream is announced by its first byte).
    pub async fn open_stream(&self) -> Result<QuicStream> {
        let (send, recv) = self.conn.open_bi().await.map_err(|e| connection_error(&e))?;
        Ok(QuicStream::new(send, recv))
    }

    /// The peer's next stream; `None` once the connection is closed.
    pub async fn accept_stream(&self) -> Result<Option<QuicStream>> {
        match self.conn.accept_bi().await {
            Ok((send, recv)) => Ok(Some(QuicStream::new(send, recv))),
            Err(quinn::ConnectionError::LocallyClosed) | Err(quinn::ConnectionError::ApplicationClosed(_)) => Ok(None),
            Err(e) => Err(connection_error(&e)),
        }
    }

    /// Close now with `code`; data not yet acknowledged is abandoned, so a clean end
    /// first finishes the streams and waits for the peer (see the shell's session end).
    /// Waits (bounded) until the peer has seen the close.
    pub async fn close(&self, code: u32, reason: &str) {
        self.conn.close(VarInt::from_u32(code), reason.as_bytes());
        if let Some(endpoint) = &self.endpoint {
            let _ = tokio::time::timeout(Duration::from_secs(1), endpoint.wait_idle()).await;
        }
    }

    /// Resolves when the connection is closed, by either side.
    pub async fn closed(&self) -> CoreError {
        connection_error(&self.conn.closed().await)
    }

    /// Bytes sent and received on the wire (UDP payloads, including QUIC overhead).
    pub fn wire_bytes(&self) -> (u64, u64) {
        let s = self.conn.stats();
        (s.udp_tx.bytes, s.udp_rx.bytes)
    }
}
