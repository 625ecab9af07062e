// The first DATA of a session goes out in small batches that grow (decisions §109).
//
// A DATA batch is encoded whole (read, delta-encoded, compressed) before its frame can go, and
// at a session's start nothing is on the wire yet: while the first 2 MiB batch is compressed
// (20-40 ms at the levels a 100 Mbit/s link gets, both peers sharing two cores) the link sits
// idle, a cost every session pays once. Later batches are encoded while earlier ones cross
// (READ_AHEAD), so only the first is exposed. Starting at 128 KiB and doubling, the first frame
// is ready in a few milliseconds and each next one while the one before is on the wire; from
// the fifth batch on they are full size, so the framing and compression contexts of the rest
// are unchanged.

/** The first batch of a session's DATA, in raw bytes; each next one doubles, up to the usual
 * batch size. */
export const RAMP_FIRST_BYTES = 128 * 1024;

/** One per session (a sender's, shared by its files): the first file to send DATA gets the
 * ramp, every later one full batches. */
export class BatchRamp {
  private claimed = false;

  /** No file has sent DATA yet: a file about to take its DATA turn plans ramped batches (and
   * holds the turn's units for them), then `claim`s the ramp once the turn is its own. */
  get pending(): boolean {
    return !this.claimed;
  }

  /** True for the first file to call it (its DATA goes first: it took the first turn), false
   * for every later one, which sends full batches: theirs are encoded while earlier data is
   * still crossing. */
  claim(): boolean {
    if (this.claimed) return false;
    this.claimed = true;
    return true;
  }
}
