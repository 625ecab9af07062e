use crate::to_napi;
use napi_derive::napi;

#[napi(object)]
pub struct GeneratedIdentity {
    pub cert_pem: String,
    pub key_pem: String,
}

/// A new self-signed TLS identity (ECDSA P-256, rcgen). The caller stores it.
#[napi]
pub fn generate_identity(label: String) -> napi::Result<GeneratedIdentity> {
    let id = ffsync_core::identity::generate(&label).map_err(to_napi)?;
    Ok(GeneratedIdentity {
        cert_pem: id.cert_pem,
        key_pem: id.key_pem,
    })
}
