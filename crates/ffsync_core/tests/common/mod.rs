//! Helpers shared by the integration tests.

/// Deterministic pseudo-random bytes (xorshift64) for fixtures.
pub fn rand_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut s = seed | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s as u8
        })
        .collect()
}
