//! Shared compression contexts inside one batch (capability `BATCH_STREAM`): consecutive
//! records of a group are the flushed pieces of one zstd stream, so each record compresses
//! against the records before it in its group (the previous chunk of a JS bundle, the
//! `.js` twin of a `.mjs` file), yet still decodes to exactly its own bytes and is
//! verified on its own. A batch is cut into about one group per core, so compression
//! stays parallel.
//!
//! With capability `BATCH_PREFIX` a stream may also start with a *prefix*: the raw bytes of
//! the file's previous DATA frame, which both peers hold (the sender reads them again, the
//! receiver reads back what it wrote), referenced by zstd as history before the stream's
//! first byte, so a batch compresses against the one before it too (decisions §89).
//!
//! Decoding is bounded: a record decodes into a buffer of exactly its declared length
//! (more output is an error, nothing beyond it is written), nothing may stay pending in
//! the decoder after a record (it would spill into the next), and a frame asking for a
//! window over 2^WINDOW_LOG bytes is refused before anything is allocated.

use crate::idle::{Idle, Recyclable};

use zstd::zstd_safe::{
    get_error_name, zstd_sys::ZSTD_EndDirective::ZSTD_e_flush, CCtx, CParameter, DCtx, DParameter, InBuffer, OutBuffer,
    ResetDirective,
};

/// A group's window: every batch fits (2 MiB + 64 KiB) after a prefix of 1 MiB
/// (`chunk_batch::HISTORY_BYTES`), so a record can match any earlier record of its group
/// and any byte of the prefix.
pub const WINDOW_LOG: u32 = 22;
/// zstd's match tables above level 6 are sized for inputs far larger than a batch (level 9:
/// 8 MiB of hash and 4 MiB of chain per context, more at higher levels), and a sender keeps
/// a context per core and per stream (and one per thread for single chunks) while the
/// governor raises the level on a slow link (peak RSS went from 95 to 125 MiB). Above level
/// 6 they are capped at level 6's hash size, 2^19 entries: a group is at most one batch
/// (2 MiB), whose positions such a table still covers at one slot for four, and each level
/// keeps its own search strategy and depth, which is where its ratio comes from. Measured on
/// the artifact release over 100 Mbit/s (decisions §88): the sender of release A → B peaked
/// at 94–103 MiB with caps of 2^20 from level 9, at 88–90 with these, its bytes within their
/// spread.
pub const MAX_HASH_LOG: u32 = 19;
pub const MAX_CHAIN_LOG: u32 = 19;
/// The first level whose default tables are over the caps (level 7: hash 2^20).
pub const CAPPED_FROM_LEVEL: i32 = 7;

/// The table caps for `level` (none up to level 6, whose tables are at most these).
pub fn table_caps(level: i32) -> &'static [CParameter] {
    if level >= CAPPED_FROM_LEVEL {
        &[CParameter::HashLog(MAX_HASH_LOG), CParameter::ChainLog(MAX_CHAIN_LOG)]
    } else {
        &[]
    }
}

/// Groups smaller than this are not worth a core of their own.
pub const MIN_GROUP_BYTES: u64 = 256 * 1024;

/// Cut items of these sizes into about one contiguous group per core (by bytes).
pub fn groups(sizes: &[u64]) -> Vec<(usize, usize)> {
    let total: u64 = sizes.iter().sum();
    let n = (total / MIN_GROUP_BYTES).clamp(1, rayon::current_num_threads().max(1) as u64);
    let per = total.div_ceil(n).max(1);
    let mut bounds = vec![0usize];
    let mut acc = 0u64;
    for (i, s) in sizes.iter().enumerate() {
        if acc >= per * bounds.len() as u64 && bounds.last() != Some(&i) {
            bounds.push(i);
        }
        acc += s;
    }
    bounds.push(sizes.len());
    bounds.windows(2).map(|w| (w[0], w[1])).filter(|(a, b)| a < b).collect()
}

/// Contexts kept between streams. A context's memory (match tables, the window buffer) is
/// fresh anonymous memory: creating one per group and batch page-faulted all of it in and
/// unmapped it again, about 3 MiB per batch. On a tree of small deltas that was a quarter of
/// the sender's CPU (decisions §67). At most this many idle contexts of each kind are kept,
/// so a process holds no more than it used at once.
const IDLE_CONTEXTS: usize = 2;
static IDLE_CCTX: Idle<CCtx<'static>> = Idle::new(IDLE_CONTEXTS);
static IDLE_DCTX: Idle<DCtx<'static>> = Idle::new(IDLE_CONTEXTS);

/// Streams compressing at once in the process: the cores and one more. Each holds a context
/// of up to ~5 MiB at the levels a slow link gets (level 9, tables capped at 2^19 entries),
/// and a sender's batches come from libuv's four threads as well as rayon's: eight lanes at
/// 100 Mbit/s had four to six open at once, ~26 MiB of a sender's 100.5–100.9 MiB, on two
/// cores that can only run two (decisions §118). A group waits for a turn before its stream
/// opens and holds it until the stream ends; nothing waits for anything while holding one, so
/// turns always come back.
static STREAMS: Turns = Turns::new();

struct Turns {
    busy: std::sync::Mutex<usize>,
    freed: std::sync::Condvar,
    #[cfg(test)]
    most: std::sync::atomic::AtomicUsize,
}

/// A stream's turn (see STREAMS), given back when dropped.
struct Turn(&'static Turns);

impl Turns {
    const fn new() -> Self {
        Turns {
            busy: std::sync::Mutex::new(0),
            freed: std::sync::Condvar::new(),
            #[cfg(test)]
            most: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// The machine's cores and one: the same from every thread (rayon's own count is the
    /// calling pool's, and the background pool is narrower).
    fn at_once() -> usize {
        static AT_ONCE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
        *AT_ONCE.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()) + 1)
    }

    fn take(&'static self) -> Turn {
        let cap = Self::at_once();
        let mut busy = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        while *busy >= cap {
            busy = self.freed.wait(busy).unwrap_or_else(|e| e.into_inner());
        }
        *busy += 1;
        #[cfg(test)]
        self.most.fetch_max(*busy, std::sync::atomic::Ordering::Relaxed);
        Turn(self)
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        *self.0.busy.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
        self.0.freed.notify_one();
    }
}

#[cfg(test)]
thread_local! {
    /// Contexts this thread had to create (tests: recycling keeps it far below the streams).
    static CREATED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

impl Recyclable for CCtx<'static> {
    fn create() -> Self {
        #[cfg(test)]
        CREATED.with(|c| c.set(c.get() + 1));
        CCtx::create()
    }
    /// Session and parameters reset: the next stream can never reference this one's data.
    fn reset_for_reuse(&mut self) -> bool {
        self.reset(ResetDirective::SessionAndParameters).is_ok()
    }
}

impl Recyclable for DCtx<'static> {
    fn create() -> Self {
        #[cfg(test)]
        CREATED.with(|c| c.set(c.get() + 1));
        DCtx::create()
    }
    fn reset_for_reuse(&mut self) -> bool {
        self.reset(ResetDirective::SessionAndParameters).is_ok()
    }
}

/// Set `c` up for a group's stream at `level`: the group window, no checksum (every chunk
/// is verified by its BLAKE3), and the table caps.
fn configure(c: &mut CCtx<'static>, level: i32) -> Option<()> {
    c.set_parameter(CParameter::CompressionLevel(level)).ok()?;
    c.set_parameter(CParameter::WindowLog(WINDOW_LOG)).ok()?;
    c.set_parameter(CParameter::ChecksumFlag(false)).ok()?;
    for p in table_caps(level) {
        c.set_parameter(*p).ok()?;
    }
    Some(())
}

/// A prefix as the `'static` slice a recycled context's type asks for.
///
/// SAFETY (of the callers): a context given a prefix references it until the context is
/// reset, and the encoder and decoder below reset their context (`Idle::give` resets before it
/// keeps or drops one) before they, and so the borrow of the prefix they hold, go away: on
/// every path (a record that fails, `Drop`, a new stream in the same decoder).
unsafe fn as_static(prefix: &[u8]) -> &'static [u8] {
    std::slice::from_raw_parts(prefix.as_ptr(), prefix.len())
}

/// The compressing side of one group.
pub struct GroupEncoder<'p> {
    level: i32,
    cctx: Option<CCtx<'static>>,
    /// History every stream of this group starts with (see the module's comment).
    prefix: Option<&'p [u8]>,
    /// At most this many bytes are still to be pushed (`sized`): each stream pledges it.
    left: Option<u64>,
    /// The open stream's turn (STREAMS), dropped with its context.
    turn: Option<Turn>,
}

impl<'p> GroupEncoder<'p> {
    pub fn new(level: i32) -> Self {
        GroupEncoder {
            level,
            cctx: None,
            prefix: None,
            left: None,
            turn: None,
        }
    }

    /// An encoder whose every stream starts with `prefix` as history (the receiver must
    /// decode with the same bytes: [`GroupDecoder::next`]'s `prefix`).
    pub fn with_prefix(level: i32, prefix: &'p [u8]) -> Self {
        let mut e = Self::new(level);
        e.prefix = Some(prefix).filter(|p| !p.is_empty());
        e
    }

    /// The group's records push at most `bytes` in all. Each stream then declares what is
    /// left as its content size, and zstd sizes the window to it (with the prefix): a
    /// decoder's buffer is that, not the 4 MiB of WINDOW_LOG, and so are the encoder's.
    /// At the artifact release's peak a receiver's two decoders held 9.2 MiB for groups of
    /// ~1 MiB (decisions §118). The matches reach no further either way: a group and its
    /// prefix are all a stream ever refers to.
    pub fn sized(mut self, bytes: u64) -> Self {
        self.left = Some(bytes);
        self
    }

    /// True if this encoder's streams start with a prefix.
    pub fn has_prefix(&self) -> bool {
        self.prefix.is_some()
    }

    /// Compress `data` as the group's next record, appending the flushed bytes to `out`.
    /// Some(true) if this record starts a stream, Some(false) if it continues one; None
    /// if compression failed or the result is over `limit` bytes: the caller sends the
    /// record another way, and the next record starts a new stream (`out` is restored).
    pub fn push(&mut self, data: &[u8], out: &mut Vec<u8>, limit: usize) -> Option<bool> {
        let start = self.cctx.is_none();
        let left = self.left;
        // Counted whether or not it compresses: what is left stays an upper bound on what
        // later records push (each record is pushed once), so no stream pledges too little.
        self.left = left.map(|n| n.saturating_sub(data.len() as u64));
        if start {
            self.turn = Some(STREAMS.take());
            let mut c = IDLE_CCTX.take();
            let ready = configure(&mut c, self.level)
                .and_then(|_| match left {
                    Some(n) => c.set_pledged_src_size(Some(n)).ok().map(|_| ()),
                    None => Some(()),
                })
                .and_then(|_| match self.prefix {
                    // SAFETY: see `as_static`; `c` is given back (reset) before `self` is dropped.
                    Some(p) => c.ref_prefix(unsafe { as_static(p) }).ok().map(|_| ()),
                    None => Some(()),
                });
            if ready.is_none() {
                self.turn = None;
                give_back(c);
                return None;
            }
            self.cctx = Some(c);
        }
        let base = out.len();
        let ok = (|| {
            let c = self.cctx.as_mut()?;
            out.reserve(zstd::zstd_safe::compress_bound(data.len()) + 64);
            let mut input = InBuffer::around(data);
            loop {
                let pos = out.len();
                let mut output = OutBuffer::around_pos(out, pos);
                let left = c.compress_stream2(&mut output, &mut input, ZSTD_e_flush).ok()?;
                if left == 0 && input.pos() == data.len() {
                    return Some(());
                }
                out.reserve(left.max(4096));
            }
        })();
        if ok.is_none() || out.len() - base > limit {
            out.truncate(base);
            self.end_stream();
            return None;
        }
        Some(start)
    }

    /// The open stream ends: its turn first, then its context (kept or dropped, `give_back`).
    fn end_stream(&mut self) {
        self.turn = None;
        if let Some(c) = self.cctx.take() {
            give_back(c);
        }
    }
}

impl Drop for GroupEncoder<'_> {
    fn drop(&mut self) {
        self.end_stream();
    }
}

/// A compressing context whose stream ended: kept for the next stream while the contexts in
/// use and kept stay within STREAMS' turns, dropped otherwise. Idle ones beside three busy
/// ones were 6–10 MiB of a sender on eight lanes at level 9 that the next streams, waiting
/// for their turns anyway, did not need (decisions §118).
fn give_back(c: CCtx<'static>) {
    let busy = *STREAMS.busy.lock().unwrap_or_else(|e| e.into_inner());
    if busy + IDLE_CCTX.kept() < Turns::at_once() {
        IDLE_CCTX.give(c);
    }
}

/// The decoding side of one batch: records in order, each starting or continuing a stream.
/// `'p`: the prefixes its streams start with live at least as long as the decoder.
#[derive(Default)]
pub struct GroupDecoder<'p> {
    dctx: Option<DCtx<'static>>,
    prefix: std::marker::PhantomData<&'p [u8]>,
}

impl<'p> GroupDecoder<'p> {
    /// Decode one record into exactly `out` (its declared length). `start`: the record opens
    /// a stream, with `prefix` (if given) as its history: the bytes the encoder had
    /// ([`GroupEncoder::with_prefix`]); `prefix` is ignored for a record that continues one.
    pub fn next(
        &mut self,
        start: bool,
        prefix: Option<&'p [u8]>,
        payload: &[u8],
        out: &mut [u8],
    ) -> Result<(), String> {
        let err = |c| format!("does not decompress: {}", get_error_name(c));
        if start {
            // A new stream in the same batch reuses this decoder's context, reset (which also
            // drops its reference to the last stream's prefix).
            let reused = self
                .dctx
                .take()
                .and_then(|mut old| old.reset_for_reuse().then_some(old));
            let mut d = reused.unwrap_or_else(|| IDLE_DCTX.take());
            let set = d
                .set_parameter(DParameter::WindowLogMax(WINDOW_LOG))
                .and_then(|_| match prefix {
                    // SAFETY: see `as_static`; `d` is reset before this decoder, which borrows
                    // the prefix for 'p, goes away.
                    Some(p) if !p.is_empty() => d.ref_prefix(unsafe { as_static(p) }).map(|_| ()),
                    _ => Ok(()),
                });
            if let Err(c) = set {
                IDLE_DCTX.give(d);
                return Err(err(c));
            }
            self.dctx = Some(d);
        }
        let Some(d) = self.dctx.as_mut() else {
            return Err("continues a stream that was never started".into());
        };
        let want = out.len();
        let mut input = InBuffer::around(payload);
        let mut output = OutBuffer::around(out);
        loop {
            let (i0, o0) = (input.pos(), output.pos());
            d.decompress_stream(&mut output, &mut input).map_err(err)?;
            if input.pos() == payload.len() {
                break;
            }
            if input.pos() == i0 && output.pos() == o0 {
                return Err("decompresses to more than its declared length".into());
            }
        }
        if output.pos() != want {
            return Err(format!("decompresses to {} bytes, declared {want}", output.pos()));
        }
        let mut probe = [0u8; 1];
        let mut empty = InBuffer::around(&[]);
        let mut po = OutBuffer::around(&mut probe[..]);
        d.decompress_stream(&mut po, &mut empty).map_err(err)?;
        if po.pos() != 0 {
            return Err("decompresses to more than its declared length".into());
        }
        Ok(())
    }
}

impl Drop for GroupDecoder<'_> {
    fn drop(&mut self) {
        if let Some(d) = self.dctx.take() {
            IDLE_DCTX.give(d);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Text-like bytes that compress, from a fixed seed.
    fn sample(len: usize) -> Vec<u8> {
        let words: [&[u8]; 8] = [
            b"function ",
            b"return ",
            b"const ",
            b"export ",
            b"value",
            b"(a, b)",
            b" {\n",
            b"};\n",
        ];
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut out = Vec::with_capacity(len + 16);
        while out.len() < len {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            out.extend_from_slice(words[(x % 8) as usize]);
            out.extend_from_slice(&(x % 1000).to_string().into_bytes());
        }
        out.truncate(len);
        out
    }

    /// A context nobody used before, set up as a group's.
    fn fresh_context(level: i32) -> CCtx<'static> {
        let mut c = CCtx::create();
        configure(&mut c, level).unwrap();
        c
    }

    /// One record compressed by a context nobody used before.
    fn fresh_stream(level: i32, data: &[u8]) -> Vec<u8> {
        let mut c = fresh_context(level);
        let mut out = vec![0u8; zstd::zstd_safe::compress_bound(data.len()) + 64];
        let mut o = OutBuffer::around(&mut out[..]);
        let mut i = InBuffer::around(data);
        let left = c.compress_stream2(&mut o, &mut i, ZSTD_e_flush).unwrap();
        assert_eq!(left, 0);
        let n = o.pos();
        out.truncate(n);
        out
    }

    #[test]
    fn a_recycled_context_compresses_exactly_as_a_fresh_one_whatever_it_did_before() {
        let a = sample(300_000);
        let b = sample(200_000);
        // Level 19 then level 1 (parameters must not carry over), and streams whose data
        // matches the previous stream's (nothing of it may be referenced).
        for (first, second) in [(19, 1), (1, 19), (3, 3)] {
            for _ in 0..IDLE_CONTEXTS + 1 {
                let mut e = GroupEncoder::new(first);
                let mut z = Vec::new();
                assert_eq!(e.push(&a, &mut z, usize::MAX), Some(true));
                assert_eq!(e.push(&b, &mut z, usize::MAX), Some(false));
            }
            let mut e = GroupEncoder::new(second);
            let mut z = Vec::new();
            assert_eq!(e.push(&b, &mut z, usize::MAX), Some(true));
            assert!(
                z == fresh_stream(second, &b),
                "level {first} then {second}: differs from a fresh context"
            );
            let mut back = vec![0u8; b.len()];
            GroupDecoder::default().next(true, None, &z, &mut back).unwrap();
            assert!(back == b);
        }
        assert!(IDLE_CCTX.kept() <= IDLE_CONTEXTS);
    }

    #[test]
    fn batch_after_batch_reuses_contexts_instead_of_making_new_ones() {
        // One sender's and one receiver's batches, one after the other: without recycling, each
        // makes (and page-faults in) a context of several MiB, 400 on this thread. Other tests
        // share the idle lists, so the bound is loose.
        let data = sample(64 * 1024);
        let before = CREATED.with(|c| c.get());
        for _ in 0..200 {
            let mut z = Vec::new();
            assert_eq!(GroupEncoder::new(3).push(&data, &mut z, usize::MAX), Some(true));
            let mut back = vec![0u8; data.len()];
            GroupDecoder::default().next(true, None, &z, &mut back).unwrap();
            assert!(back == data);
        }
        let made = CREATED.with(|c| c.get()) - before;
        assert!(made <= 40, "{made} contexts created for 200 streams each way");
    }

    /// Records of a group, compressed by `e` in one stream, then decoded by one decoder (with
    /// `prefix` as the stream's history): each comes back exactly. Returns the decoder.
    fn round_trip<'p>(mut e: GroupEncoder<'_>, recs: &[Vec<u8>], prefix: Option<&'p [u8]>) -> GroupDecoder<'p> {
        let mut d = GroupDecoder::default();
        for (i, r) in recs.iter().enumerate() {
            let mut z = Vec::new();
            assert_eq!(e.push(r, &mut z, usize::MAX), Some(i == 0));
            let mut back = vec![0u8; r.len()];
            d.next(i == 0, prefix, &z, &mut back).unwrap();
            assert!(&back == r, "record {i}");
        }
        d
    }

    #[test]
    fn a_sized_group_declares_its_size_and_its_decoder_holds_that_not_the_whole_window() {
        // Decisions §118: an unsized stream declares a 4 MiB window, and a decoder allocates
        // it (and keeps it when recycled) however little the group holds.
        let recs = vec![sample(300_000), sample(250_000), sample(200_000)];
        let total: u64 = recs.iter().map(|r| r.len() as u64).sum();
        let prefix = sample(1 << 20);
        for pre in [None, Some(&prefix[..])] {
            let encoder = || match pre {
                Some(p) => GroupEncoder::with_prefix(3, p),
                None => GroupEncoder::new(3),
            };
            let open_ended = round_trip(encoder(), &recs, pre);
            let sized = round_trip(encoder().sized(total), &recs, pre);
            let (big, small) = (
                open_ended.dctx.as_ref().unwrap().sizeof(),
                sized.dctx.as_ref().unwrap().sizeof(),
            );
            assert!(big > 4 << 20, "open-ended: the decoder holds {big} bytes");
            assert!(
                small < (total as usize) + (512 << 10),
                "sized: the decoder holds {small} bytes for {total}"
            );
        }
    }

    #[test]
    fn no_more_streams_compress_at_once_than_the_cores_and_one() {
        // Twelve threads (as libuv's and rayon's together, and more) each compressing groups
        // of three records: never more than `at_once` streams open, every record comes back
        // intact, and all 72 groups finish (a turn not given back would leave threads waiting).
        let recs = [sample(120_000), sample(90_000), sample(60_000)];
        std::thread::scope(|s| {
            for t in 0..12 {
                let recs = &recs;
                s.spawn(move || {
                    for _ in 0..6 {
                        round_trip(GroupEncoder::new(if t % 2 == 0 { 3 } else { 9 }), recs, None);
                    }
                });
            }
        });
        let most = STREAMS.most.load(std::sync::atomic::Ordering::Relaxed);
        assert!(most >= 1 && most <= Turns::at_once(), "{most} streams at once");
    }

    #[test]
    fn a_sized_group_restarts_its_stream_after_a_record_that_went_another_way() {
        // The second record is over its limit: it goes raw, the next one opens a new stream,
        // which declares what is left (an upper bound: the record that went raw counted).
        let recs = [sample(200_000), sample(150_000), sample(120_000)];
        let total: u64 = recs.iter().map(|r| r.len() as u64).sum();
        let mut e = GroupEncoder::new(3).sized(total);
        let (mut z0, mut z1, mut z2) = (Vec::new(), Vec::new(), Vec::new());
        assert_eq!(e.push(&recs[0], &mut z0, usize::MAX), Some(true));
        assert_eq!(e.push(&recs[1], &mut z1, 10), None);
        assert!(z1.is_empty());
        assert_eq!(e.push(&recs[2], &mut z2, usize::MAX), Some(true));
        let mut d = GroupDecoder::default();
        for (z, r, start) in [(&z0, &recs[0], true), (&z2, &recs[2], true)] {
            let mut back = vec![0u8; r.len()];
            d.next(start, None, z, &mut back).unwrap();
            assert!(&back == r);
        }
        // A group that pushes more than it said (a caller's bug) cannot make a bad stream:
        // the record is refused and goes another way.
        let mut e = GroupEncoder::new(3).sized(1000);
        let mut z = Vec::new();
        assert_eq!(e.push(&recs[0], &mut z, usize::MAX), None);
        assert!(z.is_empty());
    }

    #[test]
    fn a_recycled_decoder_keeps_nothing_of_its_last_stream() {
        let a = sample(100_000);
        let mut e = GroupEncoder::new(3);
        let (mut za, mut zb) = (Vec::new(), Vec::new());
        assert_eq!(e.push(&a, &mut za, usize::MAX), Some(true));
        assert_eq!(e.push(&a, &mut zb, usize::MAX), Some(false));
        assert!(zb.len() < a.len() / 20, "the second record refers to the first");
        for _ in 0..IDLE_CONTEXTS + 1 {
            let mut d = GroupDecoder::default();
            let mut back = vec![0u8; a.len()];
            d.next(true, None, &za, &mut back).unwrap();
            d.next(false, None, &zb, &mut back).unwrap();
            assert!(back == a);
        }
        // A decoder whose context comes from the pool must not resolve the second record's
        // references into a stream it did not start.
        let mut back = vec![0u8; a.len()];
        assert!(GroupDecoder::default().next(true, None, &zb, &mut back).is_err() || back != a);
        assert!(GroupDecoder::default().next(false, None, &zb, &mut back).is_err());
        assert!(IDLE_DCTX.kept() <= IDLE_CONTEXTS);
    }

    #[test]
    fn high_levels_keep_their_context_small_and_still_round_trip() {
        let data = sample(2 << 20);
        for level in [1, 6, 7, 9, 12, 19] {
            let mut enc = GroupEncoder::new(level);
            let mut out = Vec::new();
            assert_eq!(enc.push(&data, &mut out, usize::MAX), Some(true));
            // A fresh context, not the encoder's: one recycled from another test's level-19
            // stream keeps that stream's workspace.
            let mut c = fresh_context(level);
            let mut scratch = vec![0u8; zstd::zstd_safe::compress_bound(data.len())];
            let mut o = OutBuffer::around(&mut scratch[..]);
            c.compress_stream2(&mut o, &mut InBuffer::around(&data[..]), ZSTD_e_flush)
                .unwrap();
            let size = c.sizeof();
            // Window 4 MiB + hash 2 MiB + chain 2 MiB + buffers: 7.2 MiB up to level 12 (9.7 with
            // the caps of 2^20 this replaced, or level 7's own tables), 9.5 MiB at level 19, whose
            // binary-tree chain takes 8 bytes an entry (13.5 with 2^20). Measured by `sizeof`.
            let bound = if level >= 13 { 10 << 20 } else { 8 << 20 };
            assert!(
                size < bound,
                "level {level}: context of {:.1} MiB",
                size as f64 / 1048576.0
            );
            let mut back = vec![0u8; data.len()];
            GroupDecoder::default().next(true, None, &out, &mut back).unwrap();
            assert!(back == data, "level {level} round trip");
        }
        // Without the caps, level 9's context is what they prevent.
        let mut c = CCtx::create();
        c.set_parameter(CParameter::CompressionLevel(9)).unwrap();
        c.set_parameter(CParameter::WindowLog(WINDOW_LOG)).unwrap();
        let mut out = vec![0u8; zstd::zstd_safe::compress_bound(data.len())];
        let mut o = OutBuffer::around(&mut out[..]);
        let mut i = InBuffer::around(&data[..]);
        c.compress_stream2(&mut o, &mut i, ZSTD_e_flush).unwrap();
        assert!(c.sizeof() > 14 << 20, "uncapped level 9: {} MiB", c.sizeof() >> 20);
    }
}
