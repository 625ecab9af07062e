//! The sender's rsync block match for refinement (docs/protocol.md §4.12): a chunk the
//! receiver lacks, encoded as a librsync delta against the block signatures of the old bytes
//! it replaced. The same match `fast_rsync::diff` computes, written for speed (decisions §104).
//!
//! Where no block matches, the match slides one byte at a time, and that is where the time
//! goes: on a release whose binaries were rebuilt almost no offset matches. `fast_rsync::diff`
//! probes two hash maps at every offset (its collision map, then the signature's), ~10 ns a
//! byte; rsync's own sender (match.c) first tests a 16-bit tag of the rolling checksum in a
//! table and searches only on a hit. So does this: a bitmap holds a tag of every block's
//! rolling checksum (about 32 bits per block, at least 2^16), one load rejects most offsets,
//! and only a hit looks in the checksum's bucket of the sorted checksums and computes an MD4.
//!
//! What it writes is what `fast_rsync::diff` writes (same commands, same merging of adjacent
//! copies; tests compare the bytes), so the receiver's `fast_rsync::apply_limited` is
//! unchanged. One difference, where the old region repeats a block (runs of zeros in a
//! binary): of the equal blocks it copies the one after the previous copy when that is one of
//! them, as rsync does, so the copies merge into one command; otherwise the first.

use crate::refine::{push_copy, push_literal};
use md4::{Digest, Md4};
use std::collections::HashMap;

/// librsync's rolling checksum offset (`RS_CHAR_OFFSET`).
const CRC_MAGIC: u16 = 31;
/// A rolling checksum whose MD4 prefix failed this often is not tried again in this diff: a
/// signature whose checksums collide with the sender's data everywhere (a hostile receiver's,
/// or a long run of one byte) must not cost an MD4 per byte. `fast_rsync::diff`'s bound.
const MAX_CRC_COLLISIONS: u32 = 1024;
/// librsync's signature (MD4) and delta magic numbers.
const SIG_MAGIC: [u8; 4] = 0x7273_0136u32.to_be_bytes();
const DELTA_MAGIC: [u8; 4] = 0x7273_0236u32.to_be_bytes();
const SIG_HEADER: usize = 12;
/// Tag bitmap sizes, in bits (log2): about 32 bits per block, from 2^16 (8 KiB) to 2^26 (8 MiB,
/// for the largest table a receiver may send).
const MIN_TAG_BITS: u32 = 16;
const MAX_TAG_BITS: u32 = 26;

/// The rolling checksum of a window: librsync's (`fast_rsync`'s `Crc`), in its two halves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct RollSum {
    s1: u16,
    s2: u16,
}

impl RollSum {
    /// The checksum of `buf`, as librsync computes it for a signature block.
    fn of(buf: &[u8]) -> RollSum {
        let len = buf.len() as u32;
        let (mut s1, mut s2) = (0u16, 0u16);
        for (i, &b) in buf.iter().enumerate() {
            s1 = s1.wrapping_add(b as u16);
            s2 = s2.wrapping_add((b as u16).wrapping_mul((len as u16).wrapping_sub(i as u16)));
        }
        s1 = s1.wrapping_add((len as u16).wrapping_mul(CRC_MAGIC));
        s2 = s2.wrapping_add(((len.wrapping_mul(len.wrapping_add(1)) / 2) as u16).wrapping_mul(CRC_MAGIC));
        RollSum { s1, s2 }
    }

    /// Slide a window of `len` bytes by one: `old` leaves it, `new` enters.
    #[inline(always)]
    fn roll(&mut self, len: u16, old: u8, new: u8) {
        self.s1 = self.s1.wrapping_add(new as u16).wrapping_sub(old as u16);
        self.s2 = self
            .s2
            .wrapping_add(self.s1)
            .wrapping_sub(len.wrapping_mul((old as u16).wrapping_add(CRC_MAGIC)));
    }

    /// As stored in a signature: `s1` low, `s2` high.
    #[inline(always)]
    fn value(self) -> u32 {
        self.s1 as u32 | (self.s2 as u32) << 16
    }
}

/// A run's signature (fast_rsync's serialized MD4 format, as `RefineTable::decode` checked it)
/// indexed for matching.
pub struct BlockIndex<'a> {
    block: usize,
    hash_len: usize,
    /// The signature's block records (`crc u32 BE | md4 prefix`), in block order.
    records: &'a [u8],
    /// (mixed checksum, block number) of every block, sorted: a checksum's blocks are
    /// adjacent, in block order.
    sorted: Vec<(u32, u32)>,
    /// Where each bucket (the top `bucket_bits` of a mixed checksum) starts in `sorted`.
    starts: Vec<u32>,
    bucket_shift: u32,
    /// One bit per top `tag_bits` of a mixed checksum present: about 32 bits per block, so a
    /// window that matches nothing passes only ~3% of the time.
    tags: Vec<u64>,
    tag_shift: u32,
}

impl<'a> BlockIndex<'a> {
    /// Index a serialized signature. `None` if it is not one (the caller has validated it, so
    /// this is not expected).
    pub fn new(signature: &'a [u8]) -> Option<BlockIndex<'a>> {
        if signature.len() < SIG_HEADER || signature[..4] != SIG_MAGIC {
            return None;
        }
        let block = u32::from_be_bytes(signature[4..8].try_into().ok()?) as usize;
        let hash_len = u32::from_be_bytes(signature[8..12].try_into().ok()?) as usize;
        let records = &signature[SIG_HEADER..];
        let rec = 4 + hash_len;
        if block == 0 || !(1..=16).contains(&hash_len) || records.len() % rec != 0 {
            return None;
        }
        let n = records.len() / rec;
        let mut sorted: Vec<(u32, u32)> = (0..n)
            .map(|i| {
                let r = &records[i * rec..];
                (mix(u32::from_be_bytes(r[..4].try_into().unwrap())), i as u32)
            })
            .collect();
        sorted.sort_unstable();
        let log_n = usize::BITS - n.max(1).leading_zeros(); // ≥ log2(n), ≤ log2(n) + 1
        let tag_bits = (log_n + 5).clamp(MIN_TAG_BITS, MAX_TAG_BITS);
        let bucket_bits = log_n.clamp(1, 24);
        let (tag_shift, bucket_shift) = (32 - tag_bits, 32 - bucket_bits);
        let mut tags = vec![0u64; 1 << (tag_bits - 6)];
        let mut starts = vec![0u32; (1 << bucket_bits) + 1];
        for &(h, _) in &sorted {
            let t = (h >> tag_shift) as usize;
            tags[t >> 6] |= 1 << (t & 63);
            starts[(h >> bucket_shift) as usize + 1] += 1;
        }
        for k in 1..starts.len() {
            starts[k] += starts[k - 1];
        }
        Some(BlockIndex {
            block,
            hash_len,
            records,
            sorted,
            starts,
            bucket_shift,
            tags,
            tag_shift,
        })
    }

    pub fn block_size(&self) -> usize {
        self.block
    }

    #[inline(always)]
    fn tagged(&self, h: u32) -> bool {
        let t = (h >> self.tag_shift) as usize;
        self.tags[t >> 6] & (1 << (t & 63)) != 0
    }

    /// A block whose (mixed) checksum is `h` and whose MD4 prefix is the window's: `prefer` if
    /// it is one, else the first.
    fn find(&self, h: u32, window: &[u8], prefer: Option<u32>, collisions: &mut HashMap<u32, u32>) -> Option<u32> {
        let b = (h >> self.bucket_shift) as usize;
        let bucket = &self.sorted[self.starts[b] as usize..self.starts[b + 1] as usize];
        let lo = bucket.partition_point(|&(c, _)| c < h);
        if bucket.get(lo).is_none_or(|&(c, _)| c != h) {
            return None; // a tag shared with another checksum
        }
        if collisions.get(&h).is_some_and(|&n| n >= MAX_CRC_COLLISIONS) {
            return None;
        }
        let digest = Md4::digest(window);
        let rec = 4 + self.hash_len;
        let mut first = None;
        for &(_, i) in bucket[lo..].iter().take_while(|&&(c, _)| c == h) {
            let at = i as usize * rec + 4;
            if self.records[at..at + self.hash_len] == digest[..self.hash_len] {
                if prefer.is_none_or(|p| p == i) {
                    return Some(i);
                }
                first = first.or(Some(i));
            }
        }
        if first.is_none() {
            *collisions.entry(h).or_insert(0) += 1;
        }
        first
    }

    /// Append to `out` the delta of `data` against the signature's old bytes (librsync
    /// format: magic, commands, END).
    pub fn diff(&self, data: &[u8], out: &mut Vec<u8>) {
        out.extend_from_slice(&DELTA_MAGIC);
        let b = self.block;
        let mut state = Output {
            emitted: 0,
            queued: None,
        };
        let mut collisions = HashMap::new();
        let mut here = 0usize;
        while data.len() - here >= b {
            let mut sum = RollSum::of(&data[here..here + b]);
            loop {
                let h = mix(sum.value());
                if self.tagged(h) {
                    let prefer = state.next_block(here, b as u64);
                    if let Some(i) = self.find(h, &data[here..here + b], prefer, &mut collisions) {
                        state.copy(i as u64 * b as u64, b as u64, here, data, out);
                        here += b;
                        break;
                    }
                }
                here += 1;
                if here + b > data.len() {
                    break;
                }
                sum.roll(b as u16, data[here - 1], data[here + b - 1]);
            }
        }
        state.emit(data.len(), data, out);
        out.push(0); // END
    }
}

/// A rolling checksum mixed so that its top bits spread (its two halves are sums of the same
/// bytes and cluster); odd multiplication is a bijection, so equal mixes are equal checksums.
#[inline(always)]
fn mix(crc: u32) -> u32 {
    crc.wrapping_mul(0x9E37_79B1)
}

/// Commands written so far: `emitted` bytes of the new data are described, and a copy may
/// wait to be extended by the next block (adjacent in both the new data and the old region).
struct Output {
    emitted: usize,
    queued: Option<(u64, u64)>,
}

impl Output {
    /// The old block that would extend the waiting copy if the window at `here` matched it.
    #[inline]
    fn next_block(&self, here: usize, block: u64) -> Option<u32> {
        let (offset, len) = self.queued?;
        (self.emitted as u64 + len == here as u64).then(|| ((offset + len) / block) as u32)
    }

    fn emit(&mut self, until: usize, data: &[u8], out: &mut Vec<u8>) {
        if self.emitted == until {
            return;
        }
        if let Some((offset, len)) = self.queued {
            push_copy(out, offset, len);
            self.emitted += len as usize;
        }
        if self.emitted < until {
            push_literal(out, &data[self.emitted..until]);
            self.emitted = until;
        }
    }

    fn copy(&mut self, offset: u64, len: u64, here: usize, data: &[u8], out: &mut Vec<u8>) {
        if let Some((q_offset, q_len)) = self.queued {
            if self.emitted as u64 + q_len == here as u64 && q_offset + q_len == offset {
                self.queued = Some((q_offset, q_len + len));
                return;
            }
        }
        self.emit(here, data, out);
        self.queued = Some((offset, len));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::pseudo_random;
    use fast_rsync::{Signature, SignatureOptions};

    fn signature(old: &[u8], block: u32) -> Signature {
        Signature::calculate(
            old,
            SignatureOptions {
                block_size: block,
                crypto_hash_size: 4,
            },
        )
    }

    fn edited(old: &[u8], seed: u64) -> Vec<u8> {
        let mut new = old.to_vec();
        let noise = pseudo_random(64 * 1024, seed);
        let n = new.len();
        // An overwrite, an insertion, a deletion, a run of one byte.
        new[n / 7..n / 7 + 3000].copy_from_slice(&noise[..3000]);
        new.splice(n / 3..n / 3, noise[5000..5000 + 777].iter().copied());
        new.drain(n / 2..n / 2 + 1234);
        let m = new.len();
        new[m - m / 5..m - m / 5 + 9000].fill(0);
        new
    }

    #[test]
    fn rolling_checksums_are_librsyncs() {
        let data = pseudo_random(300_000, 41);
        for block in [512u32, 2048, 8192, 65536, 131072] {
            let sig = signature(&data, block);
            let rec = &sig.serialized()[SIG_HEADER..];
            for (k, b) in data.chunks(block as usize).enumerate() {
                let want = u32::from_be_bytes(rec[k * 8..k * 8 + 4].try_into().unwrap());
                assert_eq!(RollSum::of(b).value(), want, "block {block} #{k}");
            }
            // Rolled across the data, the sum equals the window's own, offset by offset.
            let b = block as usize;
            let mut sum = RollSum::of(&data[..b]);
            for here in 1..(data.len() - b).min(5000) {
                sum.roll(b as u16, data[here - 1], data[here + b - 1]);
                assert_eq!(sum, RollSum::of(&data[here..here + b]), "block {block} at {here}");
            }
        }
    }

    #[test]
    fn deltas_are_fast_rsyncs_byte_for_byte() {
        for (len, block, seed) in [
            (200_000, 512u32, 1u64),
            (1 << 20, 2048, 2),
            (3 << 20, 8192, 3),
            (100, 512, 4),
        ] {
            let old = pseudo_random(len, seed);
            let sig = signature(&old, block);
            let ours = BlockIndex::new(sig.serialized()).unwrap();
            let changed = if len > 100_000 {
                edited(&old, seed + 10)
            } else {
                old[50..].to_vec()
            };
            for new in [changed, old.clone(), pseudo_random(len / 2 + 1, seed + 20)] {
                let mut theirs = Vec::new();
                fast_rsync::diff(&sig.index(), &new, &mut theirs).unwrap();
                let mut mine = Vec::new();
                ours.diff(&new, &mut mine);
                assert_eq!(mine, theirs, "len {len} block {block}");
                let mut back = Vec::new();
                fast_rsync::apply(&old, &mine, &mut back).unwrap();
                assert_eq!(back, new);
            }
        }
    }

    #[test]
    fn repeated_blocks_and_long_literals_still_rebuild_the_data() {
        // Old data of repeated blocks (duplicate checksums and digests), new data with
        // literals of every length class.
        let mut old = vec![7u8; 64 * 1024];
        old.extend_from_slice(&pseudo_random(64 * 1024, 9));
        old.extend_from_slice(&vec![7u8; 64 * 1024]);
        let sig = signature(&old, 1024);
        let ours = BlockIndex::new(sig.serialized()).unwrap();
        for extra in [1usize, 64, 65, 255, 256, 70_000] {
            let mut new = pseudo_random(extra, 11);
            new.extend_from_slice(&old[10_000..150_000]);
            new.extend_from_slice(&pseudo_random(extra, 12));
            let mut delta = Vec::new();
            ours.diff(&new, &mut delta);
            let mut back = Vec::new();
            fast_rsync::apply(&old, &delta, &mut back).unwrap();
            assert_eq!(back, new, "literal of {extra}");
            let literal = crate::refine::literal_len(&delta).unwrap() as usize;
            assert!(literal < 2 * extra + 2 * 1024, "{literal} literal bytes");
            // The equal blocks of zeros are copied in sequence, so each stretch is one command.
            assert!(
                delta.len() < literal + 80,
                "{} bytes of commands",
                delta.len() - literal
            );
        }
    }

    #[test]
    fn colliding_checksums_cost_a_bounded_number_of_digests() {
        // A signature of one block of zeros whose MD4 prefix is wrong: every offset of a long
        // run of zeros hits its checksum. After MAX_CRC_COLLISIONS misses the checksum is
        // not tried again, so the diff ends quickly and sends the run as literal bytes.
        let mut sig = signature(&[0u8; 512], 512).into_serialized();
        let last = sig.len() - 1;
        sig[last] ^= 0xff;
        let ours = BlockIndex::new(&sig).unwrap();
        let data = vec![0u8; 8 << 20];
        let t = std::time::Instant::now();
        let mut delta = Vec::new();
        ours.diff(&data, &mut delta);
        assert_eq!(crate::refine::literal_len(&delta), Some(data.len() as u64));
        // 8 Mi MD4s of 512 bytes would take seconds; the bound makes it ~a scan.
        assert!(t.elapsed() < std::time::Duration::from_secs(2), "{:?}", t.elapsed());
    }

    #[test]
    fn not_a_signature_is_refused() {
        assert!(BlockIndex::new(&[]).is_none());
        assert!(BlockIndex::new(&[0x72, 0x73, 0x01, 0x37, 0, 0, 2, 0, 0, 0, 0, 4]).is_none());
        let mut sig = signature(&[1u8; 5000], 512).into_serialized();
        sig.pop();
        assert!(BlockIndex::new(&sig).is_none());
    }
}
