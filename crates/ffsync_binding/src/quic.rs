//! QUIC for the shell: a listener, connections and their streams as classes whose
//! methods are promises on napi's tokio runtime. The shell wraps each stream in a Node
//! Duplex (ts/transport/quic.ts) so the framed protocol runs unchanged over it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ffsync_core::quic::{self, QuicConnection, QuicIdentity, QuicListener, QuicStream};
use napi::bindgen_prelude::Buffer;
use napi_derive::napi;

use crate::to_napi;

fn addr(host: &str, port: u32) -> napi::Result<SocketAddr> {
    let ip: std::net::IpAddr = host
        .parse()
        .map_err(|_| to_napi(ffsync_core::CoreError::Usage(format!("not an IP address: {host}"))))?;
    Ok(SocketAddr::new(ip, port as u16))
}

#[napi]
pub struct NativeQuicListener {
    inner: Arc<QuicListener>,
    local: SocketAddr,
}

#[napi]
impl NativeQuicListener {
    #[napi(getter)]
    pub fn port(&self) -> u32 {
        self.local.port() as u32
    }

    #[napi(getter)]
    pub fn address(&self) -> String {
        self.local.ip().to_string()
    }

    /// The next connection that completed its handshake; null once closed.
    #[napi]
    pub async fn accept(&self) -> napi::Result<Option<NativeQuicConnection>> {
        let inner = self.inner.clone();
        match inner.accept().await {
            None => Ok(None),
            Some(Ok(c)) => Ok(Some(NativeQuicConnection { inner: Arc::new(c) })),
            Some(Err(e)) => Err(to_napi(e)),
        }
    }

    /// Refuse further connections; accepted ones keep running.
    #[napi]
    pub fn stop_accepting(&self) {
        self.inner.stop_accepting();
    }

    /// Close the UDP endpoint and every connection still on it.
    #[napi]
    pub fn close(&self) {
        self.inner.close();
    }
}

/// Listen for QUIC on `host:port` (an IP address; port 0 picks a free one).
#[napi]
pub async fn quic_listen(
    host: String,
    port: u32,
    cert_pem: String,
    key_pem: String,
    idle_ms: u32,
) -> napi::Result<NativeQuicListener> {
    let id = QuicIdentity::from_pem(&cert_pem, &key_pem).map_err(to_napi)?;
    let listener =
        QuicListener::bind(addr(&host, port)?, &id, Duration::from_millis(idle_ms as u64)).map_err(to_napi)?;
    let local = listener.local_addr().map_err(to_napi)?;
    Ok(NativeQuicListener {
        inner: Arc::new(listener),
        local,
    })
}

/// Connect to `host:port` (an IP address); the handshake must finish within `timeout_ms`.
#[napi]
pub async fn quic_connect(
    host: String,
    port: u32,
    cert_pem: String,
    key_pem: String,
    timeout_ms: u32,
    idle_ms: u32,
) -> napi::Result<NativeQuicConnection> {
    let id = QuicIdentity::from_pem(&cert_pem, &key_pem).map_err(to_napi)?;
    let c = quic::connect(
        addr(&host, port)?,
        &id,
        Duration::from_millis(timeout_ms as u64),
        Duration::from_millis(idle_ms as u64),
    )
    .await
    .map_err(to_napi)?;
    Ok(NativeQuicConnection { inner: Arc::new(c) })
}

#[napi(object)]
pub struct QuicWireBytes {
    pub sent: f64,
    pub received: f64,
}

#[napi]
pub struct NativeQuicConnection {
    inner: Arc<QuicConnection>,
}

#[napi]
impl NativeQuicConnection {
    /// DER of the peer's certificate (its SHA-256 is the fingerprint that gets pinned).
    #[napi]
    pub fn peer_certificate(&self) -> Option<Buffer> {
        self.inner.peer_certificate().map(Buffer::from)
    }

    #[napi(getter)]
    pub fn remote_address(&self) -> String {
        self.inner.remote_address().ip().to_string()
    }

    #[napi(getter)]
    pub fn remote_port(&self) -> u32 {
        self.inner.remote_address().port() as u32
    }

    #[napi]
    pub fn wire_bytes(&self) -> QuicWireBytes {
        let (sent, received) = self.inner.wire_bytes();
        QuicWireBytes {
            sent: sent as f64,
            received: received as f64,
        }
    }

    #[napi]
    pub async fn open_stream(&self) -> napi::Result<NativeQuicStream> {
        let inner = self.inner.clone();
        let s = inner.open_stream().await.map_err(to_napi)?;
        Ok(NativeQuicStream { inner: Arc::new(s) })
    }

    /// The peer's next stream; null once the connection is closed.
    #[napi]
    pub async fn accept_stream(&self) -> napi::Result<Option<NativeQuicStream>> {
        let inner = self.inner.clone();
        Ok(inner
            .accept_stream()
            .await
            .map_err(to_napi)?
            .map(|s| NativeQuicStream { inner: Arc::new(s) }))
    }

    /// Close with an application code (0 = done); bounded wait for the peer to see it.
    #[napi]
    pub async fn close(&self, code: u32, reason: String) {
        let inner = self.inner.clone();
        inner.close(code, &reason).await;
    }
}

#[napi]
pub struct NativeQuicStream {
    inner: Arc<QuicStream>,
}

#[napi]
impl NativeQuicStream {
    /// Up to `max` bytes; null at the peer's end of the stream.
    #[napi]
    pub async fn read(&self, max: u32) -> napi::Result<Option<Buffer>> {
        let inner = self.inner.clone();
        Ok(inner
            .read(max as usize)
            .await
            .map_err(to_napi)?
            .map(|b| Buffer::from(b.to_vec())))
    }

    /// Write the buffers in order; resolves once QUIC flow control took them.
    #[napi]
    pub async fn write(&self, bufs: Vec<Buffer>) -> napi::Result<()> {
        let inner = self.inner.clone();
        let slices: Vec<&[u8]> = bufs.iter().map(|b| &b[..]).collect();
        inner.write_all(&slices).await.map_err(to_napi)
    }

    #[napi]
    pub async fn finish(&self) -> napi::Result<()> {
        let inner = self.inner.clone();
        inner.finish().await.map_err(to_napi)
    }

    #[napi]
    pub fn reset(&self) {
        self.inner.reset();
    }
}
