//! Chunking parameters: a pure function of the file size, so both peers (and every
//! release) derive the same boundaries for the same bytes without negotiating.

/// Files at or above this size use the large parameter set.
pub const LARGE_FILE_THRESHOLD: u64 = 16 * 1024 * 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkParams {
    pub min: u32,
    pub avg: u32,
    pub max: u32,
}

pub const SMALL: ChunkParams = ChunkParams {
    min: 16 * 1024,
    avg: 64 * 1024,
    max: 256 * 1024,
};
pub const LARGE: ChunkParams = ChunkParams {
    min: 64 * 1024,
    avg: 256 * 1024,
    max: 1024 * 1024,
};

impl ChunkParams {
    pub fn for_file_size(size: u64) -> ChunkParams {
        if size >= LARGE_FILE_THRESHOLD {
            LARGE
        } else {
            SMALL
        }
    }

    /// Upper bound on the number of chunks a file of `size` bytes can have: every chunk but
    /// the last is at least `min` long. Decoders use it to bound allocations.
    pub fn max_chunks(&self, size: u64) -> u64 {
        if size == 0 {
            0
        } else {
            size / self.min as u64 + 1
        }
    }

    /// Within what the FastCDC 2020 cutter supports (used for locally produced manifests
    /// chunked with another size's parameters).
    pub fn is_valid(&self) -> bool {
        let even = self.min % 2 == 0 && self.avg % 2 == 0 && self.max % 2 == 0;
        even && self.min >= 64 && self.min < self.avg && self.avg < self.max && self.max <= 16 * 1024 * 1024
    }

    /// True if these are the parameters the engine would choose for `size`
    /// (a manifest claiming anything else is rejected).
    pub fn is_canonical_for(&self, size: u64) -> bool {
        *self == Self::for_file_size(size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threshold_is_inclusive() {
        assert_eq!(ChunkParams::for_file_size(LARGE_FILE_THRESHOLD - 1), SMALL);
        assert_eq!(ChunkParams::for_file_size(LARGE_FILE_THRESHOLD), LARGE);
        assert_eq!(ChunkParams::for_file_size(0), SMALL);
    }

    #[test]
    fn max_chunks_bounds() {
        assert_eq!(SMALL.max_chunks(0), 0);
        assert_eq!(SMALL.max_chunks(1), 1);
        assert_eq!(SMALL.max_chunks(16 * 1024 * 3), 4);
    }
}
