//! First contact by a one-time code (docs/security.md, "Pairing"; docs/protocol.md §4.0).
//!
//! The receiver shows a short code (`7-amber-orbit`); the user types it on the sender.
//! Both run SPAKE2 (a password-authenticated key exchange) with the code as the password,
//! then prove to each other that they hold the resulting key *and* see the same TLS
//! channel: each side MACs the TLS exporter value and both certificate fingerprints under
//! the PAKE key. So:
//! - an eavesdropper learns nothing about the code (SPAKE2 messages are uniformly random);
//! - an active attacker gets exactly one online guess per code (≈ 2^-26), and the receiver
//!   burns a code after one failed attempt;
//! - a man in the middle who relays the PAKE unchanged still fails, because the two TLS
//!   sessions it terminates have different exporter values and certificates.
//!
//! Only then does each side pin the other's fingerprint; later sessions need no code.

mod words;

use crate::error::CoreError;
use spake2::{Ed25519Group, Identity, Password, Spake2};
pub use words::WORDS;

/// Largest number in a code (the first field): 1..=999, about 10 bits.
pub const CODE_NUMBER_MAX: u32 = 999;
/// Bytes of the TLS exporter value and of each certificate fingerprint (SHA-256).
pub const BINDING_LEN: usize = 32;
/// A SPAKE2 message on the wire (one side byte + one Ed25519 point).
pub const MESSAGE_LEN: usize = 33;
/// A key confirmation on the wire.
pub const CONFIRM_LEN: usize = 32;

const ID_SENDER: &[u8] = b"ffsync-native pairing v1 sender";
const ID_RECEIVER: &[u8] = b"ffsync-native pairing v1 receiver";

/// Which end of the session this side is. The sender starts the exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PairRole {
    Sender,
    Receiver,
}

/// A fresh code: `<1..=999>-<word>-<word>`, from the operating system's random source.
/// About 26 bits: plenty for a PAKE, where each guess costs an attacker a live attempt
/// that burns the code.
pub fn generate_code() -> Result<String, CoreError> {
    let mut r = [0u8; 6];
    getrandom::getrandom(&mut r).map_err(|e| CoreError::Usage(format!("no random source for a pairing code: {e}")))?;
    // Rejection-free and unbiased enough: 32 bits reduced modulo 999 is off by < 2^-22.
    let n = u32::from_le_bytes([r[0], r[1], r[2], r[3]]) % CODE_NUMBER_MAX + 1;
    Ok(format!("{n}-{}-{}", WORDS[r[4] as usize], WORDS[r[5] as usize]))
}

/// The canonical form of a code a human typed: case, spaces, dashes and a stray `--pair=`
/// are forgiven; an unknown word or a number out of range is an error naming it (so a
/// typo is caught before it burns the receiver's code).
pub fn normalize_code(input: &str) -> Result<String, CoreError> {
    let bad = |why: String| {
        CoreError::Usage(format!(
            "pairing code '{}': {why}; type it as the receiver printed it, e.g. 7-amber-orbit",
            input.trim()
        ))
    };
    let parts: Vec<String> = input
        .split(['-', ' ', '_', '.'])
        .filter(|p| !p.is_empty())
        .map(|p| p.to_ascii_lowercase())
        .collect();
    if parts.len() != 3 {
        return Err(bad(format!(
            "expected a number and two words, got {} part{}",
            parts.len(),
            if parts.len() == 1 { "" } else { "s" }
        )));
    }
    let n: u32 = parts[0]
        .parse()
        .ok()
        .filter(|n| (1..=CODE_NUMBER_MAX).contains(n))
        .ok_or_else(|| bad(format!("'{}' is not a number from 1 to {CODE_NUMBER_MAX}", parts[0])))?;
    for w in &parts[1..] {
        if !WORDS.contains(&w.as_str()) {
            return Err(bad(format!("'{w}' is not one of the pairing words")));
        }
    }
    Ok(format!("{n}-{}-{}", parts[1], parts[2]))
}

/// What both sides bind their confirmations to: the TLS channel and the two certificates.
#[derive(Debug, Clone)]
pub struct ChannelBinding {
    /// RFC 5705/8446 exporter output (label `EXPORTER-ffsync-native-pair`, 32 bytes).
    pub exporter: [u8; BINDING_LEN],
    /// SHA-256 of the sender's certificate (DER).
    pub sender_fingerprint: [u8; BINDING_LEN],
    /// SHA-256 of the receiver's certificate (DER).
    pub receiver_fingerprint: [u8; BINDING_LEN],
}

impl ChannelBinding {
    pub fn from_slices(
        exporter: &[u8],
        sender_fingerprint: &[u8],
        receiver_fingerprint: &[u8],
    ) -> Result<Self, CoreError> {
        let fixed = |b: &[u8], what: &'static str| -> Result<[u8; BINDING_LEN], CoreError> {
            b.try_into()
                .map_err(|_| CoreError::malformed(what, format!("{} bytes, expected {BINDING_LEN}", b.len())))
        };
        Ok(ChannelBinding {
            exporter: fixed(exporter, "TLS exporter value")?,
            sender_fingerprint: fixed(sender_fingerprint, "sender fingerprint")?,
            receiver_fingerprint: fixed(receiver_fingerprint, "receiver fingerprint")?,
        })
    }
}

/// One side of a pairing exchange: `start` gives the message to send; `finish` takes the
/// peer's and gives our confirmation; `verify` checks the peer's confirmation.
pub struct Pairing {
    role: PairRole,
    binding: ChannelBinding,
    state: Option<Spake2<Ed25519Group>>,
    key: Option<Vec<u8>>,
}

impl std::fmt::Debug for Pairing {
    // Never prints the key or the PAKE state.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pairing")
            .field("role", &self.role)
            .field("finished", &self.key.is_some())
            .finish()
    }
}

impl Pairing {
    /// `code` must already be normalized (`normalize_code`): both sides hash the same text.
    pub fn start(role: PairRole, code: &str, binding: ChannelBinding) -> Result<(Pairing, Vec<u8>), CoreError> {
        let code = normalize_code(code)?;
        let password = Password::new(code.as_bytes());
        let (state, message) = match role {
            PairRole::Sender => {
                Spake2::<Ed25519Group>::start_a(&password, &Identity::new(ID_SENDER), &Identity::new(ID_RECEIVER))
            }
            PairRole::Receiver => {
                Spake2::<Ed25519Group>::start_b(&password, &Identity::new(ID_SENDER), &Identity::new(ID_RECEIVER))
            }
        };
        Ok((
            Pairing {
                role,
                binding,
                state: Some(state),
                key: None,
            },
            message,
        ))
    }

    /// Takes the peer's SPAKE2 message; returns our key confirmation to send.
    pub fn finish(&mut self, peer_message: &[u8]) -> Result<[u8; CONFIRM_LEN], CoreError> {
        let state = self
            .state
            .take()
            .ok_or_else(|| CoreError::malformed("pairing exchange", "finished twice"))?;
        if peer_message.len() != MESSAGE_LEN {
            return Err(CoreError::malformed(
                "pairing message",
                format!("{} bytes, expected {MESSAGE_LEN}", peer_message.len()),
            ));
        }
        // spake2 checks the side byte (a reflected message of our own side is refused) and
        // that the point decodes.
        let key = state
            .finish(peer_message)
            .map_err(|e| CoreError::malformed("pairing message", format!("{e:?}")))?;
        self.key = Some(key);
        Ok(self.confirmation(self.role))
    }

    /// Whether `peer_confirm` proves the peer derived the same key over the same channel.
    /// Constant-time comparison (blake3::Hash equality).
    pub fn verify(&self, peer_confirm: &[u8]) -> bool {
        if self.key.is_none() || peer_confirm.len() != CONFIRM_LEN {
            return false;
        }
        let peer = match self.role {
            PairRole::Sender => PairRole::Receiver,
            PairRole::Receiver => PairRole::Sender,
        };
        let expected = self.confirmation_hash(peer);
        let got: [u8; CONFIRM_LEN] = peer_confirm.try_into().expect("length checked");
        expected == got
    }

    fn confirmation(&self, of: PairRole) -> [u8; CONFIRM_LEN] {
        *self.confirmation_hash(of).as_bytes()
    }

    fn confirmation_hash(&self, of: PairRole) -> blake3::Hash {
        let key = self.key.as_ref().expect("finished");
        // The SPAKE2 key is a SHA-256 output (32 bytes); derive the MAC key from it so the
        // raw key is used for nothing else.
        let mac_key = blake3::derive_key("ffsync-native pairing v1 confirmation key", key);
        let mut h = blake3::Hasher::new_keyed(&mac_key);
        h.update(match of {
            PairRole::Sender => b"sender  ",
            PairRole::Receiver => b"receiver",
        });
        h.update(&self.binding.exporter);
        h.update(&self.binding.sender_fingerprint);
        h.update(&self.binding.receiver_fingerprint);
        h.finalize()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binding(seed: u8) -> ChannelBinding {
        ChannelBinding {
            exporter: [seed; 32],
            sender_fingerprint: [1; 32],
            receiver_fingerprint: [2; 32],
        }
    }

    /// Runs the whole exchange; returns (receiver accepts sender, sender accepts receiver).
    fn exchange(sender_code: &str, receiver_code: &str, sb: ChannelBinding, rb: ChannelBinding) -> (bool, bool) {
        let (mut s, ms) = Pairing::start(PairRole::Sender, sender_code, sb).unwrap();
        let (mut r, mr) = Pairing::start(PairRole::Receiver, receiver_code, rb).unwrap();
        let cs = s.finish(&mr).unwrap();
        let cr = r.finish(&ms).unwrap();
        (r.verify(&cs), s.verify(&cr))
    }

    #[test]
    fn same_code_same_channel_pairs() {
        assert_eq!(
            exchange("7-amber-orbit", "7-amber-orbit", binding(9), binding(9)),
            (true, true)
        );
    }

    #[test]
    fn a_wrong_code_fails_both_ways() {
        assert_eq!(
            exchange("7-amber-orbit", "8-amber-orbit", binding(9), binding(9)),
            (false, false)
        );
        assert_eq!(
            exchange("7-amber-orbit", "7-orbit-amber", binding(9), binding(9)),
            (false, false)
        );
    }

    #[test]
    fn a_relayed_exchange_over_two_channels_fails() {
        // A man in the middle terminates two TLS sessions (different exporters) and relays
        // the PAKE messages unchanged: both ends derive the same key, yet neither accepts.
        assert_eq!(
            exchange("7-amber-orbit", "7-amber-orbit", binding(9), binding(10)),
            (false, false)
        );
        let mut other = binding(9);
        other.receiver_fingerprint = [3; 32];
        assert_eq!(
            exchange("7-amber-orbit", "7-amber-orbit", binding(9), other),
            (false, false)
        );
    }

    #[test]
    fn confirmations_are_directional() {
        // The receiver's confirmation is not the sender's: a peer cannot echo ours back.
        let (mut s, ms) = Pairing::start(PairRole::Sender, "5-bird-boat", binding(1)).unwrap();
        let (mut r, mr) = Pairing::start(PairRole::Receiver, "5-bird-boat", binding(1)).unwrap();
        let cs = s.finish(&mr).unwrap();
        let cr = r.finish(&ms).unwrap();
        assert_ne!(cs, cr);
        assert!(!s.verify(&cs), "our own confirmation echoed back must not verify");
        assert!(!r.verify(&cr));
        assert!(s.verify(&cr) && r.verify(&cs));
    }

    #[test]
    fn reflected_or_malformed_messages_are_refused() {
        let (mut s, ms) = Pairing::start(PairRole::Sender, "5-bird-boat", binding(1)).unwrap();
        // Our own message reflected back (same side byte) is refused by spake2.
        assert!(s.finish(&ms).is_err());
        let (mut s, _) = Pairing::start(PairRole::Sender, "5-bird-boat", binding(1)).unwrap();
        assert!(s.finish(&[0x42; 10]).is_err(), "short message");
        let (mut s, _) = Pairing::start(PairRole::Sender, "5-bird-boat", binding(1)).unwrap();
        let mut junk = vec![b'B'];
        junk.extend([0xffu8; 32]);
        // Not necessarily undecodable, but never verifies against an honest confirmation.
        if let Ok(c) = s.finish(&junk) {
            assert!(!s.verify(&c));
            assert!(!s.verify(&[0u8; 32]));
        }
        let unfinished = Pairing::start(PairRole::Receiver, "5-bird-boat", binding(1)).unwrap().0;
        assert!(!unfinished.verify(&[0u8; 32]), "no key yet: nothing verifies");
    }

    #[test]
    fn codes_are_well_formed_and_vary() {
        let mut seen = std::collections::HashSet::new();
        for _ in 0..200 {
            let c = generate_code().unwrap();
            assert_eq!(normalize_code(&c).unwrap(), c);
            let parts: Vec<&str> = c.split('-').collect();
            let n: u32 = parts[0].parse().unwrap();
            assert!((1..=CODE_NUMBER_MAX).contains(&n));
            seen.insert(c);
        }
        assert!(
            seen.len() > 190,
            "codes repeat far too often: {} distinct of 200",
            seen.len()
        );
    }

    #[test]
    fn normalizing_forgives_layout_not_content() {
        assert_eq!(normalize_code(" 7 Amber ORBIT ").unwrap(), "7-amber-orbit");
        assert_eq!(normalize_code("007-amber-orbit").unwrap(), "7-amber-orbit");
        assert_eq!(normalize_code("7--amber_orbit").unwrap(), "7-amber-orbit");
        for bad in [
            "",
            "7-amber",
            "7-amber-orbit-x",
            "0-amber-orbit",
            "1000-amber-orbit",
            "x-amber-orbit",
            "7-ambre-orbit",
        ] {
            let e = normalize_code(bad).unwrap_err();
            assert_eq!(e.code(), "EUSAGE", "{bad}");
        }
        assert!(normalize_code("7-ambre-orbit")
            .unwrap_err()
            .to_string()
            .contains("'ambre' is not one of the pairing words"));
    }

    #[test]
    fn the_word_list_is_unambiguous() {
        let set: std::collections::HashSet<&str> = WORDS.iter().copied().collect();
        assert_eq!(set.len(), 256);
        let prefixes: std::collections::HashSet<&str> = WORDS.iter().map(|w| &w[..4.min(w.len())]).collect();
        assert_eq!(prefixes.len(), 256, "two words share their first four letters");
        assert!(WORDS
            .iter()
            .all(|w| (4..=6).contains(&w.len()) && w.bytes().all(|b| b.is_ascii_lowercase())));
        assert!(WORDS.windows(2).all(|p| p[0] < p[1]), "kept sorted");
    }
}
