//! Sub-chunk refinement: rsync-grade wire bytes for chunks the receiver lacks.
//!
//! Content-defined chunks of 64–256 KiB keep scans parallel and manifests small, but a
//! 4 KiB edit costs a whole chunk on the wire. For every *run* of consecutive chunks the
//! receiver must fetch, it knows which bytes of its old file the run replaced: the gap
//! between the neighbouring chunks it does have (its "anchors"). It describes that old
//! region with rsync block signatures (rolling CRC + 4 bytes of MD4 per block, crate
//! `fast_rsync`), and the sender encodes each missing chunk of the run as a librsync delta
//! against that region (its block match: `block_match.rs`) when the delta is smaller than the chunk. The receiver applies the
//! delta to its old bytes and checks the chunk's BLAKE3 hash exactly like a chunk sent
//! whole, so a weak-hash collision can never produce wrong data (it fails the chunk).
//!
//! The number of round trips does not change: the signatures travel in REFINE frames
//! between the receiver's NEED frames and NEED_END (docs/protocol.md §4.12).
//!
//! Wire table (the concatenated REFINE payloads), one entry per run, ascending by `first`:
//! ```text
//! first u32 | count u32 | sig_len u32 | signature (fast_rsync MD4 format, sig_len bytes)
//! ```

use crate::block_match::BlockIndex;
use crate::error::{CoreError, Result};
use crate::manifest::{u32_at, Manifest};
use crate::rsync_delta::{commands, last_literal, push_copy, push_literal, Command, OP_END};
use fast_rsync::{Signature, SignatureOptions};

/// Bytes of MD4 kept per block: with the 32-bit rolling CRC, 64 bits per block decide a
/// match; a false match is caught by the chunk's BLAKE3 check. (rsync trims its strong sum
/// to the file, 2 bytes for a 4 MiB file, and re-sends a file whose whole-file checksum
/// fails; there is no retry pass here, so the margin stays fixed: docs/decisions.md 28.)
pub const HASH_BYTES: u32 = 4;
pub const MIN_BLOCK: u32 = 512;
pub const MAX_BLOCK: u32 = 128 * 1024;
/// Signature header (magic, block size, hash size) and per-block record sizes.
const SIG_HEADER: usize = 12;
const ENTRY_HEADER: usize = 12;
/// Most signature bytes one transfer may carry (a receiver stops refining past it; a
/// sender refuses a larger table).
pub const MAX_TABLE_BYTES: usize = 64 << 20;
/// A region between two anchors longer than this multiple of the run (plus a constant) is
/// treated as unrelated (content moved): only the first anchor is used.
const MAX_REGION_FACTOR: u64 = 4;
const REGION_EXTRA: u64 = 16 << 20;
/// With one anchor, the old region extends this far past the run's own length (room for
/// insertions that the new version removed).
fn slack(run_len: u64) -> u64 {
    run_len / 4 + 64 * 1024
}

/// Block size for an old region of `len` bytes refined for chunks of `avg_chunk` bytes on
/// average. Signature bytes grow as 8·len/B, the literal bytes lost around each edit and at
/// each chunk's edges as ~2·B; B ≈ √(4·len), rounded to the nearest power of two, balances
/// them (measured with `examples/refine_bytes.rs`, docs/decisions.md). At most 1/32 of an
/// average chunk: for a region as large as a whole rewritten file, finer blocks find more
/// of the little that still matches (measured: fewer total bytes than 1/16 or no cap).
pub fn block_size_for(len: u64, avg_chunk: u32) -> u32 {
    let ideal = ((4.0 * len as f64).sqrt() as u64).max(1);
    let nearest = ((ideal * 3 / 2).next_power_of_two() / 2).max(1);
    let cap = (avg_chunk as u64 / 32).clamp(MIN_BLOCK as u64, MAX_BLOCK as u64);
    nearest.clamp(MIN_BLOCK as u64, cap) as u32
}

/// One run of missing chunks and the receiver's old bytes it replaced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RefineRun {
    pub first: u32,
    pub count: u32,
    /// Index of the local source (0 = the old target) and the region in it.
    pub source: usize,
    pub offset: u64,
    pub len: u64,
}

/// Plan the runs to refine. `wire[i]`: chunk i must be fetched; `anchor[i]`: chunk i is
/// available locally at (source, offset); `source_lens`: each local source's length.
pub fn plan_runs(
    manifest: &Manifest,
    wire: &[bool],
    anchor: &[Option<(usize, u64)>],
    source_lens: &[u64],
) -> Vec<RefineRun> {
    let n = manifest.chunks.len();
    let mut runs = Vec::new();
    let mut i = 0;
    while i < n {
        if !wire[i] {
            i += 1;
            continue;
        }
        let mut j = i;
        while j + 1 < n && wire[j + 1] {
            j += 1;
        }
        let run_len: u64 = manifest.chunks[i..=j].iter().map(|c| c.len as u64).sum();
        let prev = if i > 0 {
            anchor[i - 1].map(|(s, o)| (s, o + manifest.chunks[i - 1].len as u64))
        } else {
            None
        };
        let next = if j + 1 < n { anchor[j + 1] } else { None };
        let clamp = |s: usize, a: u64, b: u64| -> Option<(usize, u64, u64)> {
            let end = b.min(*source_lens.get(s)?);
            (end > a).then_some((s, a, end - a))
        };
        let region = match (prev, next) {
            (Some((s, a)), Some((t, b))) if s == t && a <= b && b - a <= MAX_REGION_FACTOR * run_len + REGION_EXTRA => {
                clamp(s, a, b)
            }
            (Some((s, a)), _) => clamp(s, a, a + run_len + slack(run_len)),
            (None, Some((t, b))) => clamp(t, b.saturating_sub(run_len + slack(run_len)), b),
            // No anchor on either side: the run is the whole file, the region the whole
            // old target.
            (None, None) => source_lens.first().and_then(|&l| clamp(0, 0, l)),
        };
        if let Some((source, offset, len)) = region {
            runs.push(RefineRun {
                first: i as u32,
                count: (j - i + 1) as u32,
                source,
                offset,
                len,
            });
        }
        i = j + 1;
    }
    runs
}

/// The receiver's half: signatures of each run's old region, as the wire table. Runs past
/// the byte budget are dropped (returned list = the runs actually described).
pub fn encode_table<'a>(
    runs: &[RefineRun],
    avg_chunk: u32,
    region: impl Fn(&RefineRun) -> Option<&'a [u8]> + Sync,
) -> (Vec<u8>, Vec<RefineRun>) {
    use rayon::prelude::*;
    let sigs: Vec<Option<Signature>> = runs
        .par_iter()
        .map(|r| {
            let bytes = region(r)?;
            Some(Signature::calculate(
                bytes,
                SignatureOptions {
                    block_size: block_size_for(r.len, avg_chunk),
                    crypto_hash_size: HASH_BYTES,
                },
            ))
        })
        .collect();
    let mut out = Vec::new();
    let mut kept = Vec::new();
    for (r, sig) in runs.iter().zip(sigs) {
        let Some(sig) = sig else { continue };
        let s = sig.serialized();
        if out.len() + ENTRY_HEADER + s.len() > MAX_TABLE_BYTES {
            break;
        }
        out.extend_from_slice(&r.first.to_le_bytes());
        out.extend_from_slice(&r.count.to_le_bytes());
        out.extend_from_slice(&(s.len() as u32).to_le_bytes());
        out.extend_from_slice(s);
        kept.push(*r);
    }
    (out, kept)
}

/// The sender's half: the receiver's table, validated against the manifest, each run's
/// signature indexed once for the block match.
pub struct RefineTable {
    /// (first, count, signature), ascending and disjoint.
    runs: Vec<(u32, u32, BlockIndex)>,
}

impl RefineTable {
    pub fn decode(buf: &[u8], manifest: &Manifest) -> Result<RefineTable> {
        let bad = |r: String| CoreError::malformed("refinement table", r);
        if buf.len() > MAX_TABLE_BYTES {
            return Err(bad(format!(
                "{} bytes is over the {MAX_TABLE_BYTES} byte limit",
                buf.len()
            )));
        }
        let n = manifest.chunks.len() as u64;
        let mut runs = Vec::new();
        let mut at = 0usize;
        let mut next_free = 0u64;
        while at < buf.len() {
            if buf.len() - at < ENTRY_HEADER {
                return Err(bad("truncated entry header".into()));
            }
            let first = u32_at(buf, at);
            let count = u32_at(buf, at + 4);
            let sig_len = u32_at(buf, at + 8) as usize;
            at += ENTRY_HEADER;
            if count == 0 || (first as u64) < next_free || first as u64 + count as u64 > n {
                return Err(bad(format!("run {first}+{count} is out of order or out of range")));
            }
            next_free = first as u64 + count as u64;
            if sig_len > buf.len() - at || sig_len < SIG_HEADER {
                return Err(bad(format!("signature of run {first} has a bad length {sig_len}")));
            }
            let sig_bytes = &buf[at..at + sig_len];
            at += sig_len;
            // The block size and hash length are ours to bound (a zero block size would never
            // finish a diff); the index checks the magic (MD4 only) and the record size.
            let block = u32::from_be_bytes(sig_bytes[4..8].try_into().unwrap());
            let hash = u32::from_be_bytes(sig_bytes[8..12].try_into().unwrap());
            if !(MIN_BLOCK..=MAX_BLOCK).contains(&block) || !(4..=16).contains(&hash) {
                return Err(bad(format!(
                    "run {first}: block size {block} / hash length {hash} not allowed"
                )));
            }
            let sig = BlockIndex::new(sig_bytes.to_vec())
                .ok_or_else(|| bad(format!("run {first}: invalid or unsupported signature")))?;
            runs.push((first, count, sig));
        }
        Ok(RefineTable { runs })
    }

    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// Which run (position in the table) covers chunk `index`.
    pub fn run_of(&self, index: u32) -> Option<usize> {
        let k = self.runs.partition_point(|(first, _, _)| *first <= index);
        let k = k.checked_sub(1)?;
        let (first, count, _) = &self.runs[k];
        (index < first + count).then_some(k)
    }

    /// Run `run`'s signature, indexed for the sender's block match.
    pub fn block_index(&self, run: usize) -> &BlockIndex {
        &self.runs[run].2
    }
}

/// The commands of `delta` (which produces `context`-padded data) restricted to the output
/// bytes `from..from + len`, as a delta of its own (magic, commands, END). Copies and
/// literals that straddle the cut are split. None if `delta` is not understood.
fn slice_delta(delta: &[u8], from: usize, len: usize, out: &mut Vec<u8>) -> Option<()> {
    let end = from + len;
    out.extend_from_slice(&delta[..4]);
    let mut pos = 0usize; // output position of the current command
                          // A pending copy, merged with the next one when contiguous.
    let mut pending: Option<(u64, u64)> = None;
    for c in commands(delta) {
        let c = c?;
        let n = match &c {
            Command::Literal { data, .. } => data.len(),
            Command::Copy { len, .. } => usize::try_from(*len).ok()?,
        };
        let (a, b) = (pos.max(from), (pos + n).min(end));
        if a < b {
            match c {
                Command::Literal { data, .. } => {
                    if let Some((o, m)) = pending.take() {
                        push_copy(out, o, m);
                    }
                    push_literal(out, &delta[data][a - pos..b - pos]);
                }
                Command::Copy { offset, .. } => {
                    let (o, m) = (offset + (a - pos) as u64, (b - a) as u64);
                    pending = match pending {
                        Some((po, pn)) if po + pn == o => Some((po, pn + m)),
                        other => {
                            if let Some((po, pn)) = other {
                                push_copy(out, po, pn);
                            }
                            Some((o, m))
                        }
                    };
                }
            }
        }
        pos += n;
        if pos >= end {
            break;
        }
    }
    if let Some((o, m)) = pending {
        push_copy(out, o, m);
    }
    out.push(OP_END);
    Some(())
}

impl RefineTable {
    /// Block size of run `run`'s signature.
    pub fn block_size(&self, run: usize) -> u32 {
        self.runs[run].2.block_size() as u32
    }

    /// Delta of one chunk, `padded[from..from + len]`, where `padded` also holds up to two
    /// blocks of the sender's bytes on each side of the chunk: the rolling match runs
    /// through the chunk's edges instead of restarting there, so blocks that straddle them
    /// are found (and cut to the chunk) instead of being sent as literals. The receiver
    /// only ever sees the chunk's own commands.
    pub fn diff_chunk(&self, run: usize, padded: &[u8], from: usize, len: usize, out: &mut Vec<u8>) {
        let sig = self.block_index(run);
        let mut whole = Vec::with_capacity(padded.len() / 8 + 64);
        sig.diff(padded, &mut whole);
        let start = out.len();
        if slice_delta(&whole, from, len, out).is_none() {
            // Not expected (we parse what block_match writes): fall back to the plain diff.
            out.truncate(start);
            sig.diff(&padded[from..from + len], out);
        }
        self.trim_tail(run, out);
    }

    /// A run's old region rarely ends on a block boundary, and rsync matching only finds
    /// whole blocks, so the last bytes of a run (unchanged, right before the receiver's next
    /// anchor) would go as a literal. If the delta ends with a literal shorter than a block
    /// whose checksum and MD4 prefix are the region's short last block's, copy that block instead.
    pub fn trim_tail(&self, run: usize, delta: &mut Vec<u8>) {
        let sig = self.block_index(run);
        let Some((cmd, lit)) = last_literal(delta) else { return };
        let Some(last) = sig.blocks().checked_sub(1) else {
            return;
        };
        if lit.is_empty() || lit.len() >= sig.block_size() || !sig.block_matches(last as u32, &delta[lit.clone()]) {
            return;
        }
        let offset = last as u64 * sig.block_size() as u64;
        delta.truncate(cmd);
        push_copy(delta, offset, lit.len() as u64);
        delta.push(OP_END);
    }
}

/// Apply a delta from the peer to the old region `base`; the result must be exactly
/// `len` bytes (its hash is checked by the caller).
pub fn apply_into(base: &[u8], delta: &[u8], len: usize, out: &mut Vec<u8>) -> Result<()> {
    out.clear();
    fast_rsync::apply_limited(base, delta, out, len).map_err(|e| CoreError::malformed("chunk delta", e.to_string()))?;
    if out.len() != len {
        return Err(CoreError::malformed(
            "chunk delta",
            format!("delta produced {} bytes, expected {len}", out.len()),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunker::InMemory;
    use crate::rsync_delta::literal_len;
    use crate::scan::manifest_of_bytes;
    use crate::testutil::pseudo_random;

    /// `old` as one run covering every chunk of `new_manifest`, as the sender sees it.
    fn whole_file_table(old: &[u8], m: &Manifest, avg_chunk: u32) -> RefineTable {
        let run = RefineRun {
            first: 0,
            count: m.chunks.len() as u32,
            source: 0,
            offset: 0,
            len: old.len() as u64,
        };
        let (table, kept) = encode_table(&[run], avg_chunk, |_| Some(old));
        assert_eq!(kept, vec![run]);
        RefineTable::decode(&table, m).unwrap()
    }

    #[test]
    fn block_size_grows_with_the_region() {
        assert_eq!(block_size_for(0, 256 * 1024), MIN_BLOCK);
        assert_eq!(block_size_for(256 * 1024, 256 * 1024), 1024);
        assert_eq!(block_size_for(1 << 40, 256 * 1024), 8192);
        assert_eq!(block_size_for(1 << 40, 64 << 20), MAX_BLOCK);
    }

    fn anchors(m: &Manifest, wire: &[bool]) -> Vec<Option<(usize, u64)>> {
        m.chunks
            .iter()
            .zip(wire)
            .map(|(c, w)| (!w).then_some((0, c.offset)))
            .collect()
    }

    #[test]
    fn runs_cover_the_gap_between_anchors() {
        let data = pseudo_random(2 << 20, 3);
        let m = manifest_of_bytes(&data, None, &InMemory);
        assert!(m.chunks.len() > 6);
        let mut wire = vec![false; m.chunks.len()];
        wire[0] = true;
        wire[3] = true;
        wire[4] = true;
        let last = m.chunks.len() - 1;
        wire[last] = true;
        let runs = plan_runs(&m, &wire, &anchors(&m, &wire), &[data.len() as u64]);
        assert_eq!(runs.len(), 3);
        // Leading run: only a next anchor, region ends where chunk 1 sits.
        assert_eq!(runs[0].first, 0);
        assert_eq!(runs[0].offset + runs[0].len, m.chunks[1].offset);
        // Middle run: exactly the bytes between chunk 2 and chunk 5.
        assert_eq!((runs[1].first, runs[1].count), (3, 2));
        assert_eq!(runs[1].offset, m.chunks[3].offset);
        assert_eq!(runs[1].len, m.chunks[5].offset - m.chunks[3].offset);
        // Trailing run: clamped to the old file's end.
        assert_eq!(runs[2].offset + runs[2].len, data.len() as u64);
        // Nothing local at all: the whole old target is the region.
        let all = vec![true; m.chunks.len()];
        let runs = plan_runs(&m, &all, &vec![None; m.chunks.len()], &[1000]);
        assert_eq!(
            runs,
            vec![RefineRun {
                first: 0,
                count: m.chunks.len() as u32,
                source: 0,
                offset: 0,
                len: 1000
            }]
        );
        assert!(plan_runs(&m, &all, &vec![None; m.chunks.len()], &[]).is_empty());
    }

    #[test]
    fn table_round_trip_and_small_delta() {
        let old = pseudo_random(300_000, 5);
        let mut new = old.clone();
        new[100_000..104_096].copy_from_slice(&pseudo_random(4096, 6));
        let m = manifest_of_bytes(&new, None, &InMemory);
        let t = whole_file_table(&old, &m, 65536);
        let k = t.run_of(0).unwrap();
        let idx = t.block_index(k);
        let mut delta = Vec::new();
        idx.diff(&new, &mut delta);
        assert!(delta.len() < 4096 + 2 * 2048 + 512, "delta {} bytes", delta.len());
        let mut out = Vec::new();
        apply_into(&old, &delta, new.len(), &mut out).unwrap();
        assert_eq!(out, new);
        let lit = literal_len(&delta).unwrap();
        assert!((4096..4096 + 4 * 1024).contains(&lit), "{lit} literal bytes");
        assert!(apply_into(&old, &delta, new.len() - 1, &mut out).is_err());
        assert!(apply_into(&old[..1000], &delta, new.len(), &mut out).is_err());
    }

    #[test]
    fn the_short_last_block_of_a_region_is_copied_not_sent() {
        let old = pseudo_random(100_000, 8); // 512-byte blocks: a short last block of 160 bytes
        let mut new = old.clone();
        new[50_000..50_100].fill(1);
        let m = manifest_of_bytes(&new, None, &InMemory);
        let t = whole_file_table(&old, &m, 1 << 20);
        let mut delta = Vec::new();
        t.block_index(0).diff(&new, &mut delta);
        let before = delta.len();
        t.trim_tail(0, &mut delta);
        assert!(delta.len() + 140 <= before, "{before} -> {}", delta.len());
        let mut out = Vec::new();
        apply_into(&old, &delta, new.len(), &mut out).unwrap();
        assert_eq!(out, new);
        // A tail that is new content is left alone.
        new[99_990] ^= 1;
        let mut delta = Vec::new();
        t.block_index(0).diff(&new, &mut delta);
        let before = delta.clone();
        t.trim_tail(0, &mut delta);
        assert_eq!(delta, before);
        assert!(last_literal(&[0, 0, 0, 0, 0x41]).is_none());
    }

    #[test]
    fn chunk_deltas_with_context_lose_nothing_at_chunk_edges() {
        let old = pseudo_random(1 << 20, 12);
        let mut new = old.clone();
        new[400_000..400_050].fill(3);
        let m = manifest_of_bytes(&new, None, &InMemory);
        let t = whole_file_table(&old, &m, 1 << 20);
        let idx = t.block_index(0);
        let b = t.block_size(0) as usize;
        let (mut plain, mut padded_total) = (0, 0);
        for c in &m.chunks {
            let (s, e) = (c.offset as usize, c.end() as usize);
            let mut d = Vec::new();
            idx.diff(&new[s..e], &mut d);
            plain += d.len();
            let (ps, pe) = (s.saturating_sub(2 * b), (e + 2 * b).min(new.len()));
            let mut d = Vec::new();
            t.diff_chunk(0, &new[ps..pe], s - ps, e - s, &mut d);
            padded_total += d.len();
            let mut out = Vec::new();
            apply_into(&old, &d, e - s, &mut out).unwrap();
            assert_eq!(out, &new[s..e]);
        }
        // Only the edited block is literal (~1 block + 50 bytes), not a block per chunk edge.
        assert!(padded_total < plain, "{padded_total} vs {plain}");
        assert!(
            padded_total < 2 * b + 50 + 40 * m.chunks.len(),
            "{padded_total} bytes, block {b}"
        );
    }

    #[test]
    fn hostile_tables_are_refused() {
        let data = pseudo_random(600_000, 7);
        let m = manifest_of_bytes(&data, None, &InMemory);
        let run = |first, count| RefineRun {
            first,
            count,
            source: 0,
            offset: 0,
            len: 10_000,
        };
        let (good, _) = encode_table(&[run(0, 1), run(2, 1)], 65536, |_| Some(&data[..10_000]));
        assert!(RefineTable::decode(&good, &m).is_ok());
        for cut in [1, 5, 13, good.len() / 2 + 3] {
            assert!(RefineTable::decode(&good[..good.len() - cut], &m).is_err(), "cut {cut}");
        }
        let (overlap, _) = encode_table(&[run(0, 2), run(1, 1)], 65536, |_| Some(&data[..10_000]));
        assert!(RefineTable::decode(&overlap, &m).is_err());
        let (beyond, _) = encode_table(&[run(m.chunks.len() as u32, 1)], 65536, |_| Some(&data[..10_000]));
        assert!(RefineTable::decode(&beyond, &m).is_err());
        let mut zero_block = good.clone();
        zero_block[ENTRY_HEADER + 4..ENTRY_HEADER + 8].copy_from_slice(&0u32.to_be_bytes());
        assert!(RefineTable::decode(&zero_block, &m).is_err());
        let mut bad_magic = good.clone();
        bad_magic[ENTRY_HEADER] ^= 0xff;
        assert!(RefineTable::decode(&bad_magic, &m).is_err());
        // librsync's BLAKE2 signature magic (fast_rsync parses it; the block match is MD4's).
        let mut blake2 = good.clone();
        blake2[ENTRY_HEADER + 3] = 0x37;
        assert!(RefineTable::decode(&blake2, &m).is_err());
    }
}
