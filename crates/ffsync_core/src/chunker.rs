//! Content-defined chunking (FastCDC 2020) fused with per-chunk BLAKE3.
//!
//! Large inputs are split into segments that are chunked in parallel. Each segment is
//! chunked speculatively from its own start; when stitching segments together we walk
//! from the true (sequential) cut position until it lands on one of the segment's
//! speculative cut points. From there on both agree, because a FastCDC cut depends only
//! on the bytes in `[start, start + max)`. The result is therefore identical to a
//! sequential scan, whatever the data (on pathological data such as all zeros the
//! re-synchronisation may never happen and the stitcher simply chunks sequentially).

use crate::params::ChunkParams;
use fastcdc::v2020::{self, Normalization};
use rayon::prelude::*;

pub type Hash = [u8; 32];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk {
    pub offset: u64,
    pub len: u32,
    pub hash: Hash,
}

impl Chunk {
    pub fn end(&self) -> u64 {
        self.offset + self.len as u64
    }
}

/// Segment length for parallel chunking. Large enough that the stitching cost (a few
/// chunks per segment) is negligible, small enough to balance work across cores.
pub const SEGMENT_LEN: usize = 8 * 1024 * 1024;

struct Cutter {
    p: ChunkParams,
    mask_s: u64,
    mask_l: u64,
}

impl Cutter {
    fn new(p: ChunkParams) -> Self {
        let (mask_s, mask_l) = v2020::select_masks(p.avg as usize, Normalization::Level1);
        Cutter { p, mask_s, mask_l }
    }

    /// Length of the chunk starting at `pos` (depends only on `data[pos..pos+max]`).
    #[inline]
    fn next_len(&self, data: &[u8], pos: usize) -> usize {
        let end = data.len().min(pos + self.p.max as usize);
        let (_, len) = v2020::cut(
            &data[pos..end],
            self.p.min as usize,
            self.p.avg as usize,
            self.p.max as usize,
            self.mask_s,
            self.mask_l,
            self.mask_s << 1,
            self.mask_l << 1,
        );
        len
    }

    fn chunk_at(&self, data: &[u8], pos: usize) -> Chunk {
        let len = self.next_len(data, pos);
        Chunk {
            offset: pos as u64,
            len: len as u32,
            hash: *blake3::hash(&data[pos..pos + len]).as_bytes(),
        }
    }

    /// Chunks whose start lies in `[from, until)`; the last one may extend past `until`.
    /// The input is prepared RESIDENT_STEP ahead of the cut being searched and released
    /// behind it as the scan moves on (the caller releases whatever is left at the end).
    fn chunk_range(
        &self,
        data: &[u8],
        from: usize,
        until: usize,
        progress: &dyn Fn(u64),
        mem: &dyn Residency,
    ) -> Vec<Chunk> {
        let mut out = Vec::with_capacity((until - from) / self.p.avg as usize + 2);
        let mut pos = from;
        let mut ready = from;
        let mut kept = from;
        while pos < until {
            // A cut reads at most `max` bytes from its start: have those ready, and the next
            // step's worth with them (one populate call per step, not a fault per page). Not
            // past `until`: the few bytes the last chunk reads beyond it fault in on demand
            // (populated, they would stay resident when the next segment is already done).
            let need = data.len().min(pos + self.p.max as usize);
            if need > ready {
                let to = until.min(need.max(pos + RESIDENT_STEP)).max(ready);
                if to > ready {
                    mem.prepare(ready, to);
                }
                ready = need.max(to);
            }
            let c = self.chunk_at(data, pos);
            pos += c.len as usize;
            progress(c.len as u64);
            out.push(c);
            if pos - kept >= RESIDENT_STEP {
                mem.release_behind(kept, pos);
                kept = pos;
            }
        }
        out
    }
}

/// How far the chunker prepares its input ahead, and how much it reads before releasing
/// what lies behind: a scanning thread keeps about this plus one chunk (and the large
/// folio it ends in) resident, not its whole segment (decisions §84).
pub const RESIDENT_STEP: usize = 1024 * 1024;

/// Sequential reference implementation.
pub fn chunk_sequential(data: &[u8], params: ChunkParams) -> Vec<Chunk> {
    Cutter::new(params).chunk_range(data, 0, data.len(), &|_| {}, &InMemory)
}

/// How the chunker tells its caller which bytes it is about to read and which it is done
/// with, so a memory-mapped input can be populated ahead and dropped behind (keeping
/// resident memory at about threads x RESIDENT_STEP however large the file is).
pub trait Residency: Sync {
    fn prepare(&self, _from: usize, _to: usize) {}
    /// Done with `[from, to)` and with everything before it that was released already.
    fn release(&self, _from: usize, _to: usize) {}
    /// Done with `[from, to)` while reading on from `to`: unlike `release`, what shares a
    /// page (or a large folio) with the bytes at `to` stays.
    fn release_behind(&self, from: usize, to: usize) {
        self.release(from, to)
    }
}

/// For plain in-memory inputs.
pub struct InMemory;
impl Residency for InMemory {}

/// Chunks from a speculative start `pos` until landing on a cut of `spec` (returns the
/// index in `spec` where they joined) or passing `until`.
fn bridge(cutter: &Cutter, data: &[u8], mut pos: usize, spec: &[Chunk], until: usize) -> (Vec<Chunk>, Option<usize>) {
    let mut out = Vec::new();
    while pos < until {
        if let Ok(k) = spec.binary_search_by_key(&(pos as u64), |c| c.offset) {
            return (out, Some(k));
        }
        let c = cutter.chunk_at(data, pos);
        pos += c.len as usize;
        out.push(c);
    }
    (out, None)
}

/// Parallel chunking; output is identical to [`chunk_sequential`].
///
/// Phase 1 chunks every segment from its own start, in parallel. Phase 2 (also parallel)
/// computes for each segment the "bridge" from where the previous segment's speculative
/// chunks end to the first cut shared with this segment. Phase 3 stitches sequentially,
/// using a bridge only if it starts exactly at the true position; otherwise (pathological
/// data) it chunks sequentially from the true position, so correctness never depends on
/// the speculation. `progress` receives byte counts, possibly from several threads.
pub fn chunk_parallel(
    data: &[u8],
    params: ChunkParams,
    segment_len: usize,
    progress: &(dyn Fn(u64) + Sync),
    mem: &dyn Residency,
) -> Vec<Chunk> {
    let cutter = Cutter::new(params);
    if data.len() <= segment_len {
        let out = cutter.chunk_range(data, 0, data.len(), progress, mem);
        mem.release(0, data.len());
        return out;
    }
    let bounds: Vec<(usize, usize)> = (0..data.len())
        .step_by(segment_len)
        .map(|s| (s, (s + segment_len).min(data.len())))
        .collect();
    let spec: Vec<Vec<Chunk>> = bounds
        .par_iter()
        .map(|&(s, e)| {
            let v = cutter.chunk_range(data, s, e, progress, mem);
            mem.release(s, v.last().map_or(e, |c| c.end() as usize));
            v
        })
        .collect();
    let bridges: Vec<(usize, Vec<Chunk>, Option<usize>)> = (1..bounds.len())
        .into_par_iter()
        .map(|k| {
            let from = spec[k - 1].last().map_or(bounds[k].0, |c| c.end() as usize);
            let (b, join) = bridge(&cutter, data, from, &spec[k], bounds[k].1);
            mem.release(from, b.last().map_or(from, |c| c.end() as usize));
            (from, b, join)
        })
        .collect();

    let mut out: Vec<Chunk> = Vec::with_capacity(data.len() / params.avg as usize + 16);
    out.extend_from_slice(&spec[0]);
    let mut pos = spec[0].last().map_or(0, |c| c.end() as usize);
    for k in 1..bounds.len() {
        let (from, ref b, join) = bridges[k - 1];
        let (chunks, join) = if from == pos {
            (b.clone(), join)
        } else {
            bridge(&cutter, data, pos, &spec[k], bounds[k].1)
        };
        pos = chunks.last().map_or(pos, |c| c.end() as usize);
        out.extend_from_slice(&chunks);
        if let Some(j) = join {
            out.extend_from_slice(&spec[k][j..]);
            pos = spec[k].last().map_or(pos, |c| c.end() as usize);
        }
    }
    out
}

/// Presents a window of a larger input to [`chunk_parallel`] with window-relative offsets,
/// forwarding residency hints at the window's absolute position.
struct Shifted<'a> {
    base: usize,
    inner: &'a dyn Residency,
}

impl Residency for Shifted<'_> {
    fn prepare(&self, from: usize, to: usize) {
        self.inner.prepare(self.base + from, self.base + to)
    }
    fn release(&self, from: usize, to: usize) {
        self.inner.release(self.base + from, self.base + to)
    }
}

/// Parallel chunking that hands out its result window by window, in order, while it runs
/// (the streamed manifest of docs/protocol.md §4.15). Output is identical to
/// [`chunk_sequential`]: each window is chunked in parallel, and only the chunks that start
/// at least `max` bytes before the window's end are final (a cut depends only on the `max`
/// bytes after the chunk's start); the next window starts where the first non-final chunk
/// did. `emit` receives each window's final chunks (returning false stops the scan early:
/// the result is then a prefix); `progress` the bytes they cover.
pub fn chunk_windows(
    data: &[u8],
    params: ChunkParams,
    window: usize,
    progress: &(dyn Fn(u64) + Sync),
    mem: &dyn Residency,
    emit: &mut dyn FnMut(&[Chunk]) -> bool,
) -> Vec<Chunk> {
    // A window must hold several whole chunks, or no chunk would ever be final.
    let window = window.max(4 * params.max as usize);
    let mut out: Vec<Chunk> = Vec::with_capacity(data.len() / params.avg as usize + 16);
    let mut pos = 0usize;
    while pos < data.len() {
        let end = data.len().min(pos + window);
        let last = end == data.len();
        let shifted = Shifted { base: pos, inner: mem };
        let mut chunks = chunk_parallel(&data[pos..end], params, SEGMENT_LEN, &|_| {}, &shifted);
        if !last {
            let keep = chunks
                .iter()
                .take_while(|c| c.offset as usize + params.max as usize <= end - pos)
                .count();
            chunks.truncate(keep);
        }
        for c in chunks.iter_mut() {
            c.offset += pos as u64;
        }
        let next = chunks.last().map_or(end, |c| c.end() as usize);
        progress((next - pos) as u64);
        out.extend_from_slice(&chunks);
        pos = next;
        if !emit(&chunks) {
            break;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::{LARGE, SMALL};
    use crate::testutil::{pseudo_random, repetitive};

    fn assert_partition(chunks: &[Chunk], len: usize, p: ChunkParams) {
        let mut pos = 0u64;
        for (i, c) in chunks.iter().enumerate() {
            assert_eq!(c.offset, pos);
            assert!(c.len <= p.max);
            if i + 1 < chunks.len() {
                assert!(c.len >= p.min);
            }
            pos += c.len as u64;
        }
        assert_eq!(pos, len as u64);
    }

    #[test]
    fn deterministic_and_partitions_input() {
        let data = pseudo_random(3_000_000, 7);
        let a = chunk_sequential(&data, SMALL);
        let b = chunk_sequential(&data, SMALL);
        assert_eq!(a, b);
        assert_partition(&a, data.len(), SMALL);
        let avg = data.len() / a.len();
        assert!(avg > 32 * 1024 && avg < 128 * 1024, "average chunk {avg}");
    }

    #[test]
    fn parallel_equals_sequential_on_random_data() {
        let data = pseudo_random(9_000_000 + 12345, 1);
        for seg in [1 << 20, 1_500_000, 4 << 20] {
            for p in [SMALL, LARGE] {
                assert_eq!(
                    chunk_parallel(&data, p, seg, &|_| {}, &InMemory),
                    chunk_sequential(&data, p),
                    "seg {seg}"
                );
            }
        }
    }

    #[test]
    fn parallel_equals_sequential_on_repetitive_data() {
        let zeros = vec![0u8; 7_000_001];
        let rep = repetitive(6_000_000, 4096);
        for data in [&zeros, &rep] {
            for seg in [1 << 20, 3_000_001] {
                for p in [SMALL, LARGE] {
                    let par = chunk_parallel(data, p, seg, &|_| {}, &InMemory);
                    assert_eq!(par, chunk_sequential(data, p));
                    assert_partition(&par, data.len(), p);
                }
            }
        }
    }

    #[test]
    fn local_edit_changes_few_chunks() {
        let a = pseudo_random(4_000_000, 3);
        let mut b = a.clone();
        b.splice(2_000_000..2_000_000, [1u8, 2, 3, 4, 5].iter().copied());
        let ca = chunk_sequential(&a, SMALL);
        let cb = chunk_sequential(&b, SMALL);
        let set: std::collections::HashSet<Hash> = ca.iter().map(|c| c.hash).collect();
        let new = cb.iter().filter(|c| !set.contains(&c.hash)).count();
        assert!(new <= 3, "an insertion invalidated {new} chunks");
    }

    #[test]
    fn empty_and_tiny_inputs() {
        assert!(chunk_sequential(&[], SMALL).is_empty());
        let one = chunk_sequential(&[42], SMALL);
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].len, 1);
        assert_eq!(chunk_parallel(&[9u8; 100], SMALL, 10, &|_| {}, &InMemory).len(), 1);
    }

    #[test]
    fn windows_equal_sequential_and_come_in_order() {
        let rand = pseudo_random(9_000_000 + 4321, 5);
        let zeros = vec![0u8; 5_000_003];
        let rep = repetitive(6_000_000, 4096);
        for data in [&rand, &zeros, &rep] {
            for p in [SMALL, LARGE] {
                for window in [1usize, 2_000_000, 3 << 20, 64 << 20] {
                    let mut parts: Vec<Vec<Chunk>> = Vec::new();
                    let all = chunk_windows(data, p, window, &|_| {}, &InMemory, &mut |c| {
                        parts.push(c.to_vec());
                        true
                    });
                    let seq = chunk_sequential(data, p);
                    assert_eq!(all, seq, "window {window}");
                    assert_eq!(parts.concat(), seq, "emitted parts, window {window}");
                    if window >= data.len() {
                        assert_eq!(parts.len(), 1);
                    } else if window > 4 * p.max as usize {
                        assert!(parts.len() > 1, "window {window} gave one part");
                    }
                }
            }
        }
        let mut calls = 0;
        assert!(chunk_windows(&[], SMALL, 1 << 20, &|_| {}, &InMemory, &mut |_| {
            calls += 1;
            true
        })
        .is_empty());
        assert_eq!(calls, 0);
    }

    /// Replays what a chunker asked of its `Residency`, page by page (per thread: each
    /// thread's scan is bounded on its own), and keeps the most any one thread held.
    struct Recorder {
        len: usize,
        held: std::sync::Mutex<std::collections::HashMap<std::thread::ThreadId, (Vec<bool>, usize)>>,
        prepared: std::sync::Mutex<Vec<bool>>,
    }

    const PAGE: usize = 4096;

    impl Recorder {
        fn new(len: usize) -> Self {
            let pages = len.div_ceil(PAGE);
            Recorder {
                len,
                held: Default::default(),
                prepared: std::sync::Mutex::new(vec![false; pages]),
            }
        }
        fn mark(&self, from: usize, to: usize, on: bool) {
            assert!(from <= to && to <= self.len, "range {from}..{to} of {}", self.len);
            let mut held = self.held.lock().unwrap();
            let (pages, peak) = held
                .entry(std::thread::current().id())
                .or_insert_with(|| (vec![false; self.len.div_ceil(PAGE)], 0));
            // Whole pages: prepared outward, released inward (a page is dropped only when all of it is done).
            let (a, b) = if on {
                (from / PAGE, to.div_ceil(PAGE))
            } else {
                (from.div_ceil(PAGE), to / PAGE)
            };
            let range = a..b.max(a);
            pages[range.clone()].fill(on);
            if on {
                self.prepared.lock().unwrap()[range].fill(true);
            }
            *peak = (*peak).max(pages.iter().filter(|&&x| x).count() * PAGE);
        }
        fn peak(&self) -> usize {
            self.held.lock().unwrap().values().map(|v| v.1).max().unwrap_or(0)
        }
        fn all_prepared(&self) -> bool {
            self.prepared.lock().unwrap().iter().all(|&x| x)
        }
    }

    impl Residency for Recorder {
        fn prepare(&self, from: usize, to: usize) {
            self.mark(from, to, true)
        }
        fn release(&self, from: usize, to: usize) {
            self.mark(from, to, false)
        }
    }

    #[test]
    fn a_scanning_thread_holds_a_step_ahead_and_behind_not_its_segment() {
        // Decisions §84: a whole segment (8 MiB) used to be populated before its first cut.
        let data = pseudo_random(3 * SEGMENT_LEN + 12345, 41);
        for p in [SMALL, LARGE] {
            let bound = 2 * RESIDENT_STEP + 2 * p.max as usize;
            assert!(bound <= SEGMENT_LEN / 2);
            // One segment (the sequential path), then several on rayon's threads.
            for len in [SEGMENT_LEN - 1, data.len()] {
                let rec = Recorder::new(len);
                let chunks = chunk_parallel(&data[..len], p, SEGMENT_LEN, &|_| {}, &rec);
                assert_eq!(chunks, chunk_sequential(&data[..len], p));
                assert!(
                    rec.peak() <= bound,
                    "{len} bytes, max {}: a thread held {} bytes, bound {bound}",
                    p.max,
                    rec.peak()
                );
                assert!(rec.peak() >= RESIDENT_STEP, "nothing was prepared ahead");
                // Every page was populated ahead of the cut that read it, bar the few bytes a
                // segment's last chunk reads past its end (faulted in on demand).
                if len < SEGMENT_LEN {
                    assert!(rec.all_prepared());
                }
            }
        }
    }
}
