//! Pairing codes and the PAKE exchange (ffsync_core::pairing), converted for JavaScript.
//! Each call is a few scalar multiplications (well under a millisecond): it runs on the JS
//! thread, like identity generation.

use crate::to_napi;
use ffsync_core::pairing::{self, ChannelBinding, PairRole, Pairing};
use napi::bindgen_prelude::Buffer;
use napi::{Error, Result, Status};
use napi_derive::napi;

/// A fresh one-time code, e.g. `7-amber-orbit`.
#[napi]
pub fn pairing_code() -> Result<String> {
    pairing::generate_code().map_err(to_napi)
}

/// The canonical form of a typed code, or an `EUSAGE` error naming what is wrong.
#[napi]
pub fn normalize_pairing_code(code: String) -> Result<String> {
    pairing::normalize_code(&code).map_err(to_napi)
}

#[napi]
pub struct NativePairing {
    inner: Pairing,
    message: Vec<u8>,
}

#[napi]
impl NativePairing {
    /// `role` is `"sender"` or `"receiver"`; `exporter` and the fingerprints are 32 bytes each.
    #[napi(constructor)]
    pub fn new(
        role: String,
        code: String,
        exporter: Buffer,
        sender_fingerprint: Buffer,
        receiver_fingerprint: Buffer,
    ) -> Result<Self> {
        let role = match role.as_str() {
            "sender" => PairRole::Sender,
            "receiver" => PairRole::Receiver,
            other => {
                return Err(Error::new(
                    Status::InvalidArg,
                    format!("EUSAGE: unknown pairing role {other}"),
                ))
            }
        };
        let binding =
            ChannelBinding::from_slices(&exporter, &sender_fingerprint, &receiver_fingerprint).map_err(to_napi)?;
        let (inner, message) = Pairing::start(role, &code, binding).map_err(to_napi)?;
        Ok(NativePairing { inner, message })
    }

    /// Our SPAKE2 message (33 bytes), to send in a PAIR frame.
    #[napi]
    pub fn message(&self) -> Buffer {
        self.message.clone().into()
    }

    /// Takes the peer's SPAKE2 message; returns our key confirmation (32 bytes).
    #[napi]
    pub fn finish(&mut self, peer_message: Buffer) -> Result<Buffer> {
        self.inner
            .finish(&peer_message)
            .map(|c| c.to_vec().into())
            .map_err(to_napi)
    }

    /// Whether the peer's confirmation proves the same code over the same TLS channel.
    #[napi]
    pub fn verify(&self, peer_confirmation: Buffer) -> bool {
        self.inner.verify(&peer_confirmation)
    }
}
