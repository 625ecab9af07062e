//! The sender's rsync block match for refinement (docs/protocol.md §4.12): a chunk the
//! receiver lacks, encoded as a librsync delta against the block signatures of the old bytes
//! it replaced. The same match `fast_rsync::diff` computes, written for speed (decisions §104).
//!
//! Where no block matches, the match slides one byte at a time, and that is where the time
//! goes: on a release whose binaries were rebuilt almost no offset matches. `fast_rsync::diff`
//! probes two hash maps at every offset (its collision map, then the signature's), ~10 ns a
//! byte; rsync's own sender (match.c) first tests a 16-bit tag of the rolling checksum in a
//! table and searches only on a hit. So does this: a bitmap holds a tag of every block's
//! rolling checksum (32–64 bits per block, at least 2^16 bits, at most 2^26: ≥ 8 bits per block
//! in the largest table a receiver may send), one load rejects most offsets, and only a hit
//! looks in the checksum's bucket of the sorted blocks and computes an MD4.
//!
//! What it writes is what `fast_rsync::diff` writes (same commands, same merging of adjacent
//! copies; tests compare the bytes), so the receiver's `fast_rsync::apply_limited` is
//! unchanged. One difference, where the old region repeats a block (runs of zeros in a
//! binary): of the equal blocks it copies the one after the previous copy when that is one of
//! them, as rsync does, so the copies merge into one command; otherwise the first of them
//! (fast_rsync keeps the first of two and the last of three or more).
//!
//! The signature comes from the receiver, a peer that may lie. Blocks are sorted by checksum
//! and then by MD4 prefix, so a window costs one MD4 and two binary searches however many
//! blocks share its checksum; a checksum whose MD4 failed `MAX_CRC_COLLISIONS` times is not
//! tried again, and a diff stops looking once its failed MD4s have covered
//! `FAILED_DIGEST_FACTOR` times its data (the rest goes as literals): what a hostile table can
//! cost the sender is bounded by the sender's own bytes.

use crate::rsync_delta::{push_copy, push_literal};
use md4::{Digest, Md4};
use std::collections::HashMap;

/// librsync's rolling checksum offset (`RS_CHAR_OFFSET`).
const CRC_MAGIC: u16 = 31;
/// A rolling checksum whose MD4 prefix failed this often is not tried again in this diff
/// (`fast_rsync::diff`'s bound): a long run of one byte must not cost an MD4 per byte.
const MAX_CRC_COLLISIONS: u32 = 1024;
/// A diff stops looking for blocks once its failed MD4s have hashed this many times its data
/// (plus `FAILED_DIGEST_SLACK`): many distinct checksums that each fail up to the bound above
/// would otherwise cost an MD4 of a whole block per byte.
const FAILED_DIGEST_FACTOR: u64 = 4;
const FAILED_DIGEST_SLACK: u64 = 4 << 20;
/// librsync's signature (MD4) and delta magic numbers.
const SIG_MAGIC: [u8; 4] = 0x7273_0136u32.to_be_bytes();
const DELTA_MAGIC: [u8; 4] = 0x7273_0236u32.to_be_bytes();
const SIG_HEADER: usize = 12;
/// Tag bitmap sizes, in bits (log2): 2^(⌈log2 n⌉ + 5) for n blocks, within these bounds.
const MIN_TAG_BITS: u32 = 16;
const MAX_TAG_BITS: u32 = 26;
/// Bucket array sizes (log2): about one bucket per one or two blocks, at most 2^22 (16 MiB).
const MAX_BUCKET_BITS: u32 = 22;

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

/// A run's signature (librsync's MD4 format, as fast_rsync writes it) indexed for matching.
pub struct BlockIndex {
    /// The serialized signature: header, then `crc u32 BE | md4 prefix` per block.
    signature: Vec<u8>,
    block: usize,
    hash_len: usize,
    /// (mixed checksum, block number) of every block, sorted by mixed checksum, then MD4
    /// prefix, then block number.
    sorted: Vec<(u32, u32)>,
    /// Where each bucket (the top `32 - bucket_shift` bits of a mixed checksum) starts in
    /// `sorted`.
    starts: Vec<u32>,
    bucket_shift: u32,
    /// One bit per top `32 - tag_shift` bits of a mixed checksum present.
    tags: Vec<u64>,
    tag_shift: u32,
}

/// What a diff has spent: MD4s that found nothing (bounded), and its work on hits (counted for
/// the tests that bound what a hostile signature costs).
#[derive(Default)]
struct Spent {
    /// Failed MD4s per checksum (given up on at MAX_CRC_COLLISIONS).
    per_checksum: HashMap<u32, u32>,
    /// Bytes of the windows whose MD4 failed, and their bound for this diff.
    bytes: u64,
    budget: u64,
    /// MD4s computed, and digests compared, on tag hits.
    digests: u64,
    compared: u64,
}

impl BlockIndex {
    /// Index a serialized signature; `None` if it is not an MD4 signature of whole records.
    pub fn new(signature: Vec<u8>) -> Option<BlockIndex> {
        if signature.len() < SIG_HEADER || signature[..4] != SIG_MAGIC {
            return None;
        }
        let block = u32::from_be_bytes(signature[4..8].try_into().ok()?) as usize;
        let hash_len = u32::from_be_bytes(signature[8..12].try_into().ok()?) as usize;
        let rec = 4 + hash_len;
        let records = &signature[SIG_HEADER..];
        if block == 0 || !(1..=16).contains(&hash_len) || records.len() % rec != 0 {
            return None;
        }
        let n = records.len() / rec;
        if n > u32::MAX as usize {
            return None;
        }
        let digest = |i: u32| &records[i as usize * rec + 4..(i as usize + 1) * rec];
        let mut sorted: Vec<(u32, u32)> = (0..n)
            .map(|i| {
                let r = &records[i * rec..];
                (mix(u32::from_be_bytes(r[..4].try_into().unwrap())), i as u32)
            })
            .collect();
        sorted.sort_unstable_by(|a, b| {
            a.0.cmp(&b.0)
                .then_with(|| digest(a.1).cmp(digest(b.1)))
                .then(a.1.cmp(&b.1))
        });
        let log_n = usize::BITS - n.max(1).leading_zeros(); // ⌊log2 n⌋ + 1
        let tag_bits = (log_n + 5).clamp(MIN_TAG_BITS, MAX_TAG_BITS);
        let bucket_bits = log_n.clamp(1, MAX_BUCKET_BITS);
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
            signature,
            block,
            hash_len,
            sorted,
            starts,
            bucket_shift,
            tags,
            tag_shift,
        })
    }

    /// The signature as the receiver sent it.
    pub fn signature(&self) -> &[u8] {
        &self.signature
    }

    pub fn block_size(&self) -> usize {
        self.block
    }

    /// Blocks in the signature.
    pub fn blocks(&self) -> usize {
        self.sorted.len()
    }

    fn record(&self, i: u32) -> &[u8] {
        let rec = 4 + self.hash_len;
        &self.signature[SIG_HEADER + i as usize * rec..SIG_HEADER + (i as usize + 1) * rec]
    }

    /// Whether `window` is what block `i` describes: its checksum and MD4 prefix (what a copy
    /// of that block asserts; for checks of a delta).
    pub fn block_matches(&self, i: u32, window: &[u8]) -> bool {
        if i as usize >= self.blocks() {
            return false;
        }
        let r = self.record(i);
        r[..4] == RollSum::of(window).value().to_be_bytes() && r[4..] == Md4::digest(window)[..self.hash_len]
    }

    /// A block whose (mixed) checksum is `h` and whose MD4 prefix is the window's: `prefer` if
    /// it is one, else the first.
    fn find(&self, h: u32, window: &[u8], prefer: Option<u32>, spent: &mut Spent) -> Option<u32> {
        let b = (h >> self.bucket_shift) as usize;
        let bucket = &self.sorted[self.starts[b] as usize..self.starts[b + 1] as usize];
        let lo = bucket.partition_point(|&(c, _)| c < h);
        let same = &bucket[lo..lo + bucket[lo..].partition_point(|&(c, _)| c == h)];
        if same.is_empty() || spent.per_checksum.get(&h).is_some_and(|&n| n >= MAX_CRC_COLLISIONS) {
            return None; // a tag shared with another checksum, or a checksum given up on
        }
        let digest = Md4::digest(window);
        spent.digests += 1;
        let want = &digest[..self.hash_len];
        let mut compared = 0u64;
        let mut cmp = |i: u32| {
            compared += 1;
            self.record(i)[4..].cmp(want)
        };
        let first = same.partition_point(|&(_, i)| cmp(i).is_lt());
        let equal = &same[first..first + same[first..].partition_point(|&(_, i)| cmp(i).is_eq())];
        spent.compared += compared;
        let Some(&(_, i)) = equal.first() else {
            *spent.per_checksum.entry(h).or_insert(0) += 1;
            spent.bytes += window.len() as u64;
            return None;
        };
        // `equal` is in block order: the preferred block is found by bisection too.
        Some(
            prefer
                .filter(|p| equal.binary_search_by_key(p, |&(_, j)| j).is_ok())
                .unwrap_or(i),
        )
    }

    /// Append to `out` the delta of `data` against the signature's old bytes (librsync
    /// format: magic, commands, END).
    pub fn diff(&self, data: &[u8], out: &mut Vec<u8>) {
        self.diff_spending(data, out);
    }

    /// [`Self::diff`], returning what it spent: (MD4s computed, digests compared on hits).
    fn diff_spending(&self, data: &[u8], out: &mut Vec<u8>) -> (u64, u64) {
        out.extend_from_slice(&DELTA_MAGIC);
        let b = self.block;
        let mut state = Output {
            emitted: 0,
            queued: None,
        };
        let mut spent = Spent {
            budget: FAILED_DIGEST_FACTOR * data.len() as u64 + FAILED_DIGEST_SLACK,
            ..Spent::default()
        };
        let mut here = 0usize;
        let (tags, tag_shift) = (&self.tags[..], self.tag_shift);
        let tagged = |h: u32| {
            let t = h >> tag_shift;
            tags[(t >> 6) as usize] & (1 << (t & 63)) != 0
        };
        while data.len() - here >= b && spent.bytes < spent.budget {
            let mut sum = RollSum::of(&data[here..here + b]);
            // The bytes leaving and entering the window as it slides from `here` to the end.
            let mut slide = data[here..data.len() - b].iter().zip(&data[here + b..]);
            loop {
                let h = mix(sum.value());
                if tagged(h) && spent.bytes < spent.budget {
                    let prefer = state.next_block(here, b as u64);
                    if let Some(i) = self.find(h, &data[here..here + b], prefer, &mut spent) {
                        state.copy(i as u64 * b as u64, b as u64, here, data, out);
                        here += b;
                        break;
                    }
                }
                let Some((&old, &new)) = slide.next() else {
                    here += 1; // past the last window: the rest is literal
                    break;
                };
                here += 1;
                sum.roll(b as u16, old, new);
            }
        }
        state.emit(data.len(), data, out);
        out.push(0); // END
        (spent.digests, spent.compared)
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
        if let Some((offset, len)) = self.queued.take() {
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

    fn index(old: &[u8], block: u32) -> BlockIndex {
        BlockIndex::new(signature(old, block).into_serialized()).unwrap()
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

    /// A hand-made signature: a header and (checksum, MD4 prefix) records.
    fn raw_signature(block: u32, records: &[(u32, [u8; 4])]) -> Vec<u8> {
        let mut sig = SIG_MAGIC.to_vec();
        sig.extend_from_slice(&block.to_be_bytes());
        sig.extend_from_slice(&4u32.to_be_bytes());
        for (crc, digest) in records {
            sig.extend_from_slice(&crc.to_be_bytes());
            sig.extend_from_slice(digest);
        }
        sig
    }

    fn md4_prefix(window: &[u8]) -> [u8; 4] {
        Md4::digest(window)[..4].try_into().unwrap()
    }

    /// The delta's commands as (copy offset or None for a literal, length).
    fn commands(delta: &[u8]) -> Vec<(Option<u64>, u64)> {
        crate::rsync_delta::delta_commands(delta).map(|c| c.unwrap()).collect()
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
        let cases = [
            (200_000, 512u32, 1u64),
            (1 << 20, 2048, 2),
            (3 << 20, 8192, 3),
            (3 << 20, 65536, 5),
            (5 << 20, 131072, 6),
            (100, 512, 4),
        ];
        for (len, block, seed) in cases {
            let old = pseudo_random(len, seed);
            let sig = signature(&old, block);
            let ours = BlockIndex::new(sig.serialized().to_vec()).unwrap();
            let changed = if len > 100_000 {
                edited(&old, seed + 10)
            } else {
                old[50..].to_vec()
            };
            for new in [changed, old.clone(), pseudo_random(len / 2 + 1, seed + 20), Vec::new()] {
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
        // A signature of nothing: everything is literal.
        let empty = index(&[], 512);
        let mut delta = Vec::new();
        empty.diff(b"abc", &mut delta);
        assert_eq!(commands(&delta), vec![(None, 3)]);
    }

    #[test]
    fn repeated_blocks_are_copied_in_sequence() {
        // Old data of repeated blocks (duplicate checksums and digests), new data with
        // literals of every length class around a copy of most of it.
        let mut old = vec![7u8; 64 * 1024];
        old.extend_from_slice(&pseudo_random(64 * 1024, 9));
        old.extend_from_slice(&vec![7u8; 64 * 1024]);
        let ours = index(&old, 1024);
        for extra in [1usize, 64, 65, 255, 256, 70_000] {
            let mut new = pseudo_random(extra, 11);
            new.extend_from_slice(&old[10_000..150_000]);
            new.extend_from_slice(&pseudo_random(extra, 12));
            let mut delta = Vec::new();
            ours.diff(&new, &mut delta);
            let mut back = Vec::new();
            fast_rsync::apply(&old, &delta, &mut back).unwrap();
            assert_eq!(back, new, "literal of {extra}");
            let literal = crate::rsync_delta::literal_len(&delta).unwrap() as usize;
            assert!(literal < 2 * extra + 2 * 1024, "{literal} literal bytes");
            // The equal blocks of 7s are copied in sequence: each stretch is one command.
            let copies = commands(&delta).iter().filter(|c| c.0.is_some()).count();
            assert!(copies <= 3, "{copies} copy commands");
        }
    }

    #[test]
    fn a_checksum_shared_by_blocks_copies_the_one_whose_digest_matches() {
        let old = pseudo_random(4096, 21);
        let (a, b) = (&old[..1024], &old[1024..2048]);
        // Block 0 claims b's checksum with a wrong digest; block 1 is b.
        let sig = raw_signature(
            1024,
            &[
                (RollSum::of(b).value(), [9, 9, 9, 9]),
                (RollSum::of(b).value(), md4_prefix(b)),
                (RollSum::of(a).value(), md4_prefix(a)),
            ],
        );
        let ours = BlockIndex::new(sig).unwrap();
        let mut delta = Vec::new();
        ours.diff(b, &mut delta);
        assert_eq!(commands(&delta), vec![(Some(1024), 1024)]);
        assert!(ours.block_matches(1, b) && !ours.block_matches(0, b) && !ours.block_matches(7, b));
    }

    #[test]
    fn a_hostile_signature_costs_a_bounded_number_of_digests() {
        // 200,000 blocks that all claim the checksum of a block of zeros with wrong digests,
        // and the true one last: a window of zeros costs one MD4 and two bisections, not a
        // walk over the 200,000 (a walk compares ~3·10^9 digests here).
        let zeros = vec![0u8; 512];
        let crc = RollSum::of(&zeros).value();
        let mut records: Vec<(u32, [u8; 4])> = (0..200_000u32).map(|k| (crc, (k * 2 + 1).to_be_bytes())).collect();
        records.push((crc, md4_prefix(&zeros)));
        let ours = BlockIndex::new(raw_signature(512, &records)).unwrap();
        let data = vec![0u8; 8 << 20];
        let windows = (data.len() / 512) as u64;
        let mut delta = Vec::new();
        let (digests, compared) = ours.diff_spending(&data, &mut delta);
        assert_eq!(commands(&delta).iter().map(|c| c.1).sum::<u64>(), data.len() as u64);
        assert_eq!(crate::rsync_delta::literal_len(&delta), Some(0));
        assert_eq!(digests, windows);
        assert!(
            compared <= digests * 2 * (18 + 2),
            "{compared} digests compared for {digests} windows"
        );
        // A window of zeros whose digest is wrong everywhere: after MAX_CRC_COLLISIONS misses
        // the checksum is given up, and the run goes as literal bytes.
        records.pop();
        let wrong = BlockIndex::new(raw_signature(512, &records)).unwrap();
        let mut delta = Vec::new();
        let (digests, _) = wrong.diff_spending(&data, &mut delta);
        assert_eq!(crate::rsync_delta::literal_len(&delta), Some(data.len() as u64));
        assert_eq!(digests, MAX_CRC_COLLISIONS as u64);
        // Each of many distinct checksums found in the data, each with a wrong digest: the
        // diff gives up once its failed digests cover FAILED_DIGEST_FACTOR times its data.
        let noise = pseudo_random(1 << 20, 22);
        let many: Vec<(u32, [u8; 4])> = (0..noise.len() - 512)
            .step_by(7)
            .map(|at| (RollSum::of(&noise[at..at + 512]).value(), [1, 2, 3, 4]))
            .collect();
        let many = BlockIndex::new(raw_signature(512, &many)).unwrap();
        let mut delta = Vec::new();
        let (digests, _) = many.diff_spending(&noise, &mut delta);
        assert_eq!(crate::rsync_delta::literal_len(&delta), Some(noise.len() as u64));
        let budget = FAILED_DIGEST_FACTOR * noise.len() as u64 + FAILED_DIGEST_SLACK;
        assert!(digests * 512 <= budget + 512, "{digests} digests of 512 bytes");
    }

    #[test]
    fn not_a_signature_is_refused() {
        assert!(BlockIndex::new(Vec::new()).is_none());
        // librsync's BLAKE2 magic, which fast_rsync's parser accepts: not ours.
        let mut blake2 = signature(&[1u8; 5000], 512).into_serialized();
        blake2[3] = 0x37;
        assert!(BlockIndex::new(blake2).is_none());
        let mut cut = signature(&[1u8; 5000], 512).into_serialized();
        cut.pop();
        assert!(BlockIndex::new(cut).is_none());
    }
}
