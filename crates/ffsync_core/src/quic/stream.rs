//! One bidirectional QUIC stream, shaped for a Node Duplex on the other side of the
//! binding: `read` returns the next piece (None at the peer's end), `write` completes
//! when flow control took the bytes, `finish` half-closes, `reset` aborts both halves.

use quinn::{RecvStream, SendStream, VarInt};
use tokio::sync::Mutex;

use super::close::{connection_error, net_error, CLOSE_ABORTED};
use crate::error::{CoreError, Result};

pub struct QuicStream {
    send: Mutex<SendStream>,
    recv: Mutex<RecvStream>,
}

fn write_error(e: quinn::WriteError) -> CoreError {
    match e {
        quinn::WriteError::ConnectionLost(c) => connection_error(&c),
        quinn::WriteError::Stopped(_) => net_error("ECONNRESET", "the peer stopped reading this QUIC stream"),
        other => net_error("ESOCKET", format!("QUIC stream write failed: {other}")),
    }
}

fn read_error(e: quinn::ReadError) -> CoreError {
    match e {
        quinn::ReadError::ConnectionLost(c) => connection_error(&c),
        quinn::ReadError::Reset(_) => net_error("ECONNRESET", "the peer reset this QUIC stream"),
        other => net_error("ESOCKET", format!("QUIC stream read failed: {other}")),
    }
}

impl QuicStream {
    pub(super) fn new(send: SendStream, recv: RecvStream) -> Self {
        Self {
            send: Mutex::new(send),
            recv: Mutex::new(recv),
        }
    }

    /// Up to `max` bytes in arrival order; `None` when the peer finished the stream.
    pub async fn read(&self, max: usize) -> Result<Option<bytes::Bytes>> {
        let mut r = self.recv.lock().await;
        match r.read_chunk(max, true).await {
            Ok(Some(chunk)) => Ok(Some(chunk.bytes)),
            Ok(None) => Ok(None),
            Err(e) => Err(read_error(e)),
        }
    }

    /// Write every buffer, in order.
    pub async fn write_all(&self, bufs: &[&[u8]]) -> Result<()> {
        let mut s = self.send.lock().await;
        for b in bufs {
            s.write_all(b).await.map_err(write_error)?;
        }
        Ok(())
    }

    /// Half-close: the peer reads to the end of what we wrote, then sees the end.
    pub async fn finish(&self) -> Result<()> {
        let mut s = self.send.lock().await;
        match s.finish() {
            Ok(()) => Ok(()),
            Err(_) => Ok(()), // already finished or reset: nothing more to flush
        }
    }

    /// Abort both directions (used when the local side fails or is destroyed).
    /// A half busy in a pending read or write is left to fail when the connection closes
    /// (waiting for its lock could wait forever on a silent peer).
    pub fn reset(&self) {
        if let Ok(mut s) = self.send.try_lock() {
            let _ = s.reset(VarInt::from_u32(CLOSE_ABORTED));
        }
        if let Ok(mut r) = self.recv.try_lock() {
            let _ = r.stop(VarInt::from_u32(CLOSE_ABORTED));
        }
    }
}
