//! Deterministic test data (xorshift), shared by the unit tests.

pub fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        out.extend_from_slice(&s.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// A short random block repeated: worst case for content-defined chunking.
pub fn repetitive(len: usize, period: usize) -> Vec<u8> {
    let block = pseudo_random(period, 99);
    block.iter().copied().cycle().take(len).collect()
}

/// A new (or truncated) file opened for reading and writing.
pub fn create_rw(path: &std::path::Path) -> std::fs::File {
    std::fs::File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .unwrap()
}

/// One zstd frame of `head` followed by `zeros` zero bytes, compressed as a stream (a few
/// KiB per GiB): the decompression bombs of the decoder tests.
pub fn zstd_zeros(head: &[u8], zeros: u64) -> Vec<u8> {
    use std::io::Write;
    let mut e = zstd::stream::write::Encoder::new(Vec::new(), 1).unwrap();
    e.write_all(head).unwrap();
    let z = vec![0u8; 1 << 20];
    let mut left = zeros;
    while left > 0 {
        let n = left.min(z.len() as u64) as usize;
        e.write_all(&z[..n]).unwrap();
        left -= n as u64;
    }
    e.finish().unwrap()
}
