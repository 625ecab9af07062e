//! A peer's TLS identity: a self-signed ECDSA P-256 certificate made with rcgen (no
//! hand-written ASN.1). Peers authenticate each other by the SHA-256 fingerprint of this
//! certificate (pinning), not by names or a CA, so the subject is informational only.

use crate::error::{CoreError, Result};

pub struct Identity {
    pub cert_pem: String,
    pub key_pem: String,
}

/// Generate a fresh identity. `label` goes into the subject's common name.
pub fn generate(label: &str) -> Result<Identity> {
    let mut params = rcgen::CertificateParams::new(vec!["ffsync-native".to_string()])
        .map_err(|e| CoreError::Usage(format!("certificate parameters: {e}")))?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(rcgen::DnType::CommonName, label);
    // Long-lived: trust comes from the pinned fingerprint, and rotating is explicit.
    params.not_before = rcgen::date_time_ymd(2024, 1, 1);
    params.not_after = rcgen::date_time_ymd(4000, 1, 1);
    let key = rcgen::KeyPair::generate().map_err(|e| CoreError::Usage(format!("key generation failed: {e}")))?;
    let cert = params
        .self_signed(&key)
        .map_err(|e| CoreError::Usage(format!("self-signing failed: {e}")))?;
    Ok(Identity {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generates_distinct_pem_identities() {
        let a = generate("peer-a").unwrap();
        let b = generate("peer-b").unwrap();
        assert!(a.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(a.key_pem.contains("PRIVATE KEY"));
        assert_ne!(a.cert_pem, b.cert_pem);
        assert_ne!(a.key_pem, b.key_pem);
    }
}
