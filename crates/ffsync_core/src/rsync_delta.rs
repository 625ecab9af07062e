//! The librsync delta format (docs/protocol.md §4.12, "Delta"): the commands a chunk's delta
//! is made of, written by the sender's block match (`block_match.rs`) and cut to a chunk by
//! refinement (`refine.rs`); the receiver applies deltas with `fast_rsync::apply_limited`.
//! Parsing here is for the sender's own deltas and for checks: it never runs on a peer's bytes
//! except to measure them.

/// Command bytes (integers after them are big endian).
pub(crate) const OP_END: u8 = 0;
const OP_LITERAL_64: u8 = 0x40;
const OP_LITERAL_N8: u8 = 0x44;
const OP_COPY_N1_N1: u8 = 0x45;
const OP_COPY_N8_N8: u8 = 0x54;

/// One command of a librsync delta.
pub(crate) enum Command {
    /// Literal bytes at `data` in the delta; the command itself starts at `start`.
    Literal {
        start: usize,
        data: std::ops::Range<usize>,
    },
    Copy {
        offset: u64,
        len: u64,
    },
}

/// The commands of a delta up to END, in order. Yields None (and stops) at anything this
/// parser does not understand or that runs past the buffer.
pub(crate) fn commands(delta: &[u8]) -> impl Iterator<Item = Option<Command>> + '_ {
    let mut at = 4;
    let mut done = false;
    let int = move |at: &mut usize, w: usize| -> Option<u64> {
        let mut b = [0u8; 8];
        b[8 - w..].copy_from_slice(delta.get(*at..*at + w)?);
        *at += w;
        Some(u64::from_be_bytes(b))
    };
    std::iter::from_fn(move || {
        if done {
            return None;
        }
        let start = at;
        let parsed = (|| {
            let op = *delta.get(at)?;
            at += 1;
            match op {
                OP_END => Some(None),
                1..=OP_LITERAL_N8 => {
                    let n = if op <= OP_LITERAL_64 {
                        op as usize
                    } else {
                        usize::try_from(int(&mut at, 1 << (op - 0x41))?).ok()?
                    };
                    let data = at..at.checked_add(n).filter(|&e| e <= delta.len())?;
                    at = data.end;
                    Some(Some(Command::Literal { start, data }))
                }
                OP_COPY_N1_N1..=OP_COPY_N8_N8 => {
                    let k = op - OP_COPY_N1_N1;
                    let offset = int(&mut at, 1 << (k / 4))?;
                    let len = int(&mut at, 1 << (k % 4))?;
                    Some(Some(Command::Copy { offset, len }))
                }
                _ => None,
            }
        })();
        match parsed {
            Some(Some(c)) => Some(Some(c)),
            Some(None) => {
                done = true;
                None
            }
            None => {
                done = true;
                Some(None)
            }
        }
    })
}

/// The commands of a delta as (copy offset, or None for literal bytes; length), in order;
/// an item is None where the delta is not understood (and the iteration stops).
pub fn delta_commands(delta: &[u8]) -> impl Iterator<Item = Option<(Option<u64>, u64)>> + '_ {
    commands(delta).map(|c| {
        Some(match c? {
            Command::Literal { data, .. } => (None, data.len() as u64),
            Command::Copy { offset, len } => (Some(offset), len),
        })
    })
}

/// Where the delta's last command starts and, if it is a literal, its bytes. None for a
/// delta this parser does not understand (left as is).
pub(crate) fn last_literal(delta: &[u8]) -> Option<(usize, std::ops::Range<usize>)> {
    let mut last = None;
    for c in commands(delta) {
        last = match c? {
            Command::Literal { start, data } => Some((start, data)),
            Command::Copy { .. } => None,
        };
    }
    last
}

/// Append a literal command for `bytes`.
pub(crate) fn push_literal(out: &mut Vec<u8>, bytes: &[u8]) {
    if bytes.is_empty() {
        return;
    }
    let n = bytes.len() as u64;
    if n <= OP_LITERAL_64 as u64 {
        out.push(n as u8);
    } else {
        let w = width(n);
        out.push(0x41 + w.trailing_zeros() as u8);
        out.extend_from_slice(&n.to_be_bytes()[8 - w..]);
    }
    out.extend_from_slice(bytes);
}

/// Append a copy command (offset and length in the narrowest widths that hold them).
pub(crate) fn push_copy(out: &mut Vec<u8>, offset: u64, len: u64) {
    let (wo, wl) = (width(offset), width(len));
    out.push(OP_COPY_N1_N1 + 4 * wo.trailing_zeros() as u8 + wl.trailing_zeros() as u8);
    out.extend_from_slice(&offset.to_be_bytes()[8 - wo..]);
    out.extend_from_slice(&len.to_be_bytes()[8 - wl..]);
}

fn width(n: u64) -> usize {
    match n {
        0..=0xff => 1,
        0x100..=0xffff => 2,
        0x1_0000..=0xffff_ffff => 4,
        _ => 8,
    }
}

/// Bytes a delta carries as literals (the rest of its output is copied from the receiver's
/// old bytes); None if the delta is not understood.
pub fn literal_len(delta: &[u8]) -> Option<u64> {
    let mut n = 0u64;
    for c in commands(delta) {
        if let Command::Literal { data, .. } = c? {
            n += data.len() as u64;
        }
    }
    Some(n)
}
