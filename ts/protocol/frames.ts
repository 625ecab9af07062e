// Wire framing: every frame is `u32 LE body length | u8 type | payload`, where body
// length counts the type byte. Lengths are checked against MAX_FRAME_BODY before any
// buffer is allocated. See docs/protocol.md.

import { ExitCode, FfsyncError } from '../utils/errors.js';
import { BufferPool, copyOf } from '../utils/buffer-pool.js';

export const FrameType = {
  HELLO: 0x01,
  OFFER: 0x02,
  DECISION: 0x03,
  MANIFEST: 0x04,
  NEED: 0x05,
  NEED_END: 0x06,
  DATA: 0x07,
  DATA_END: 0x08,
  RESULT: 0x09,
  KEEPALIVE: 0x0a,
  FILTER: 0x0b,
  TREE_MANIFEST: 0x0c,
  ROOTS: 0x0d,
  FILE_BATCH: 0x0e,
  FILE_BEGIN: 0x0f,
  TREE_END: 0x10,
  TREE_RESULT: 0x11,
  LANES: 0x12,
  JOIN: 0x13,
  LANE_END: 0x14,
  QUIC_OFFER: 0x15,
  QUIC_READY: 0x16,
  TREE_OPTIONS: 0x17,
  TREE_ATTRS: 0x18,
  REFINE: 0x19,
  HOLES: 0x1a,
  REQUEST: 0x1b,
  ACCEPT: 0x1c,
  MANIFEST_STREAM: 0x1d,
  BASIS: 0x1e,
  MUX: 0x1f,
  PAIR: 0x20,
  DELIVERED: 0x21,
  ERROR: 0x7f,
} as const;
export type FrameType = (typeof FrameType)[keyof typeof FrameType];

const KNOWN_TYPES = new Set<number>(Object.values(FrameType));
export const FRAME_HEADER = 5;
/** Largest body (type byte + payload) a peer may send: a 2 MiB DATA batch fits easily. */
export const MAX_FRAME_BODY = 16 * 1024 * 1024 + 1;

export function frameName(type: number): string {
  return Object.entries(FrameType).find(([, v]) => v === type)?.[0] ?? `0x${type.toString(16)}`;
}

export interface Frame {
  type: FrameType;
  payload: Buffer;
  /** Present on large frames assembled in a pooled buffer: call once done with payload. */
  release?: () => void;
}

export function protocolError(message: string): FfsyncError {
  return new FfsyncError('EPROTO', ExitCode.PROTOCOL_STREAM, message);
}

export function encodeFrameHeader(type: FrameType, payloadLength: number): Buffer {
  if (payloadLength + 1 > MAX_FRAME_BODY) throw new Error(`frame too large: ${payloadLength}`);
  const h = Buffer.allocUnsafe(FRAME_HEADER);
  h.writeUInt32LE(payloadLength + 1, 0);
  h.writeUInt8(type, 4);
  return h;
}

export function encodeFrame(type: FrameType, payload: Uint8Array = Buffer.alloc(0)): Buffer {
  return Buffer.concat([encodeFrameHeader(type, payload.length), payload]);
}

/** Whether `chunk` is a run of whole frames (by their length fields alone; the decoder checks
 * the rest). */
export function wholeFrames(chunk: Buffer): boolean {
  let at = 0;
  while (at + 4 <= chunk.length) {
    const bodyLen = chunk.readUInt32LE(at);
    if (bodyLen < 1 || bodyLen > MAX_FRAME_BODY) return false;
    at += 4 + bodyLen;
  }
  return at === chunk.length;
}

/** Buffers kept for reuse by every connection in the process, for frames of POOLED_MIN or more:
 * as many as a receiving session has in flight at once (the session's three write slots, and on
 * each busy lane one frame being assembled and one queued; one connection reaches seven). With
 * fewer, every frame beyond them allocates a fresh 2 MiB buffer and drops one, promoted to the old
 * generation before it dies, where dead buffers wait for a major GC (decisions §45, §82). A cap,
 * not a reserve: buffers are made only as frames need them. One pool for the process, not one per
 * connection: a pool per lane would keep buffers idle on one lane while another allocates
 * (decisions §71). */
export const FRAME_POOL_KEPT = 12;
/** One DATA batch (content-send.ts, BATCH_BUFFER) and the frame headers around it. */
export const FRAME_POOL_BUFFER = 2 * 1024 * 1024 + 64 * 1024;
/** One DATA batch of a session on many lanes (content-send.ts, LANE_BATCH_BYTES, 1 MiB) and the
 * frame headers around it: frames up to this size take buffers of this size (decisions §120). */
export const FRAME_POOL_SMALL_BUFFER = 1024 * 1024 + 64 * 1024;

/** The frame pool, and the decoders using it. Buffers are taken only when frames that large
 * span reads, and the idle ones go when the last decoder using the pool is disposed (its
 * connection closed): an idle or finished `serve` holds none. Two sizes: a frame of up to
 * `small.size` bytes takes a buffer of that size, so a session whose sender cuts 1 MiB batches
 * (eight lanes, each assembling a frame at once) holds half as much as with 2 MiB buffers; an
 * idle buffer of the larger size still serves it when no small one is idle (it is resident). */
export class FramePool extends BufferPool {
  private users = 0;
  /** Buffers for frames of up to FRAME_POOL_SMALL_BUFFER bytes. */
  readonly small: BufferPool;

  constructor(size: number, max: number, smallSize = Math.min(size, FRAME_POOL_SMALL_BUFFER)) {
    super(size, max);
    this.small = new BufferPool(smallSize, max);
  }

  join(): void {
    this.users++;
  }

  leave(): void {
    if (--this.users === 0) this.dropIdle();
  }

  /** A buffer for a frame of `n` bytes: the smaller size if it fits (an idle one of either size
   * first), else the pool's size (BufferPool.take). */
  override take(n: number): Buffer {
    if (n > this.small.size || this.small.size === this.size) return super.take(n);
    if (this.small.idle === 0 && super.idle > 0) return super.take(n);
    return this.small.take(n);
  }

  /** Whether an idle buffer can take a frame of `n` bytes now. */
  idleFits(n: number): boolean {
    return (n <= this.small.size && this.small.idle > 0) || (n <= this.size && super.idle > 0);
  }

  /** A frame released after its connection closed, the last to use the pool: not kept. Idle
   * buffers of both sizes together are at most `max`: a receiver whose frames are of both sizes
   * (compressed batches under 1 MiB, incompressible ones of 2 MiB) keeps no more than before. */
  override release(b: Buffer): void {
    if (this.idle >= this.max) {
      if (this.users === 0) this.dropIdle();
      return;
    }
    if (b.length === this.small.size && this.small.size !== this.size) this.small.release(b);
    else super.release(b);
    if (this.users === 0) this.dropIdle();
  }

  override get idle(): number {
    return super.idle + this.small.idle;
  }

  override get allocated(): number {
    return super.allocated + this.small.allocated;
  }

  override dropIdle(): void {
    super.dropIdle();
    this.small.dropIdle();
  }
}

const processFramePool = new FramePool(FRAME_POOL_BUFFER, FRAME_POOL_KEPT);

/** Let the process's idle frame buffers go (they are made again as frames need them): after a
 * burst of large frames that will not come again, such as a big tree's manifests and roots.
 * Returns how many were dropped. */
export function dropIdleFrameBuffers(): number {
  const n = processFramePool.idle;
  processFramePool.dropIdle();
  return n;
}

/** A decoder collected without dispose() (its stream never closed) still leaves its pool:
 * otherwise the pool would count a user forever and keep its idle buffers for good. */
const leaveOnCollect = new FinalizationRegistry<FramePool>((pool) => pool.leave());

/**
 * A user of the process's frame pool other than a decoder: an in-memory pipe joins each write
 * into one of its buffers and lends it to the reading connection (ts/transport/stream-pair.ts).
 * Counted among the pool's users from its first `take` until `dispose` (or until it is
 * collected), so the pool keeps idle buffers for it as it does for a decoder.
 */
export class FramePoolUser {
  private joined = false;

  constructor(private readonly pool: FramePool = processFramePool) {}

  /** The pool's buffer size: `take` of more makes a buffer the pool will not keep. */
  get size(): number {
    return this.pool.size;
  }

  take(n: number): Buffer {
    if (!this.joined) {
      this.joined = true;
      this.pool.join();
      leaveOnCollect.register(this, this.pool, this);
    }
    return this.pool.take(n);
  }

  /** Give a buffer from `take` back (once), whether or not this user was disposed since. */
  release(b: Buffer): void {
    this.pool.release(b);
  }

  dispose(): void {
    if (!this.joined) return;
    this.joined = false;
    leaveOnCollect.unregister(this);
    this.pool.leave();
  }
}

/**
 * Incremental decoder: feed it bytes as they arrive, take out whole frames. Throws a
 * protocol error (exit 12) on an oversized or zero length or an unknown frame type.
 */
export class FrameDecoder {
  /** Buffered reads, consumed from `head` (no Array.shift: O(1) per frame however many are buffered). */
  private parts: Buffer[] = [];
  private head = 0;
  private buffered = 0;
  /** A valid frame header arrived: from then on a bad one is the peer's framing error. */
  private sawFrame = false;

  /**
   * The very first bytes are no frame but a TLS record (ClientHello: `16 03 0x`): the peer runs
   * without --plaintext. Asked only when the header is no valid frame, never before: a frame whose
   * body is 790 or 66,326 bytes starts with those same three bytes (found by the property test).
   * A ClientHello of our peers' TLS stacks never parses as a valid header (its length's high
   * byte puts the body over MAX_FRAME_BODY, or its low byte is no frame type), so this is said at
   * the fifth byte rather than after a wait for a frame that never ends.
   */
  private notTls(head: Buffer): void {
    if (head[0] === 0x16 && head[1] === 0x03 && head[2]! <= 0x04) {
      throw new FfsyncError('ETLSPEER', ExitCode.PROTOCOL_INCOMPATIBLE, 'the peer is speaking TLS but we run with --plaintext; use --plaintext on both sides or on neither');
    }
  }

  /**
   * The very first bytes are no frame. If they are text (an ssh banner, an HTTP answer, an SMTP
   * greeting), the far end is some other program: say so with what it said, as exit 2
   * (incompatible), instead of a frame length out of bounds. Binary garbage stays a framing
   * error (exit 12), whoever sent it.
   */
  private notAPeer(): void {
    const first = this.peek(Math.min(this.buffered, 64));
    if (!first.every((b) => (b >= 0x20 && b < 0x7f) || b === 0x09 || b === 0x0a || b === 0x0d)) return;
    const said = first.toString('latin1').split(/\r?\n/)[0]!.slice(0, 48);
    const hint = /^SSH-/.test(said) ? ' (an ssh server: for ssh use `ffsync-native sync SRC host:path`)' : /^HTTP\//.test(said) ? ' (a web server)' : '';
    throw new FfsyncError('ENOTPEER', ExitCode.PROTOCOL_INCOMPATIBLE, `the far end is not an ffsync-native peer: it said "${said}"${hint}`);
  }
  /** Small reads are copied into this accumulator instead of being kept as separate
   * buffers: a peer dribbling a frame in 1-byte TLS records must not cost ~100 bytes of
   * Buffer object per byte it sent. `tailEnd`: bytes of it in use. */
  private tail: Buffer | undefined;
  private tailEnd = 0;
  private readonly scratch = Buffer.alloc(8);
  /** Frames larger than this that span several reads are assembled in pooled buffers. */
  static readonly POOLED_MIN = 256 * 1024;
  /** A paused frame's bytes copied out of its pooled buffer at most (`yieldAssembly`): a read's
   * worth or a few, never a large copy for each pause. */
  static readonly YIELD_MAX = 256 * 1024;
  /** Reads shorter than this are coalesced into accumulators (4 KiB, doubling up to 64 KiB). */
  static readonly SMALL_READ = 4096;
  /** Accumulators grow from FIRST_TAIL to TAIL_SIZE, doubling: a multiplexed stream's decoder
   * (64 per connection) that only ever sees a few small frames holds 4 KiB, not 64 (decisions §82:
   * 64 streams' first accumulators were 4 MiB of each peer's peak). */
  private static readonly FIRST_TAIL = 4 * 1024;
  private static readonly TAIL_SIZE = 64 * 1024;
  private nextTail = FrameDecoder.FIRST_TAIL;
  /** A large frame being assembled in a pooled buffer as its reads arrive, once at least half
   * of it has (`assemble`). Each read is copied in and dropped at once, so socket buffers die
   * young: kept until their frame was whole, they outlived scavenges and only a full GC freed
   * them (decisions §69). `filled`: bytes of `frame` (header included) received so far. */
  private assembly: { frame: Buffer; pooled: Buffer; filled: number } | undefined;
  /** Whether this decoder counts among its pool's users (it took a buffer). */
  private pooling = false;
  /** The reads pushed are the caller's to reuse once `push` returns (a socket reading into one
   * static buffer, ts/transport/static-reads.ts): whatever the decoder or a frame keeps of them
   * is copied first, never kept by reference (decisions §94). */
  copyReads = false;
  /** Bytes of fresh memory the decoder allocated for reads it kept (accumulators, frames taken
   * from several reads, copies of lent chunks): the garbage its reads leave once their frames
   * are done, where the reads themselves leave none (`copyReads`, lent chunks). */
  allocated = 0;

  /** `framePool`: the process's, unless a test gives one of its own. */
  constructor(private readonly framePool: FramePool = processFramePool) {}

  /** The connection closed: drop partial input and leave the frame pool (frames already
   * decoded stay valid; their release() gives their buffers back to it). */
  dispose(): void {
    this.dropInput();
    if (this.pooling) {
      this.pooling = false;
      leaveOnCollect.unregister(this);
      this.framePool.leave();
    }
  }

  /** Forget partial input: reads kept, the frame being assembled, the accumulator. */
  private dropInput(): void {
    this.assembly = undefined;
    this.parts = [];
    this.head = 0;
    this.buffered = 0;
    this.tail = undefined;
    this.tailEnd = 0;
  }

  /** A pooled buffer of at least `n` bytes from the process's frame pool. */
  private takePooled(n: number): Buffer {
    if (!this.pooling) {
      this.pooling = true;
      this.framePool.join();
      leaveOnCollect.register(this, this.framePool, this);
    }
    return this.framePool.take(n);
  }

  /**
   * The connection stops reading for a while (its multiplexer's window is full): a frame begun in
   * a pooled buffer with little of it here gives the buffer back, its bytes kept in one of their
   * own, and is assembled again as the rest comes. The read that completed a lane's last frame
   * often began its next one, which took a 2 MiB buffer at once (`assemble`) for a few KiB; four
   * lanes paused behind their batches waiting for write slots held four such buffers, which the
   * lane that reads next could have used (decisions §116). Returns whether it gave one back.
   */
  yieldAssembly(): boolean {
    const a = this.assembly;
    if (!a || a.filled > FrameDecoder.YIELD_MAX || a.filled * 2 >= a.frame.length) return false;
    const own = copyOf(a.frame.subarray(0, a.filled));
    this.allocated += own.length;
    this.assembly = undefined;
    this.parts = [own];
    this.head = 0;
    this.framePool.release(a.pooled);
    return true;
  }

  get bufferedBytes(): number {
    return this.buffered;
  }

  /** Reads kept by reference until their frame is whole (not yet copied anywhere). */
  get heldReads(): number {
    return this.parts.length - this.head;
  }

  /** Bytes of pooled buffer set aside for the frame being assembled (0: none). */
  get assemblingBytes(): number {
    return this.assembly?.frame.length ?? 0;
  }

  /**
   * Add bytes; whole frames are appended to `out`. On a framing violation the frames
   * decoded before it are still in `out` when the error is thrown.
   */
  push(chunk: Buffer, out: Frame[] = [], lent?: () => void): Frame[] {
    if (lent) return this.pushLent(chunk, out, lent);
    const a = this.assembly;
    if (a) {
      const k = Math.min(chunk.length, a.frame.length - a.filled);
      chunk.copy(a.frame, a.filled, 0, k);
      a.filled += k;
      this.buffered += k;
      if (a.filled < a.frame.length) return out;
      this.assembly = undefined;
      this.buffered -= a.frame.length;
      this.emit(a.frame, a.pooled, out);
      if (k === chunk.length) return out;
      chunk = chunk.subarray(k);
    }
    this.append(chunk);
    for (;;) {
      if (this.buffered < FRAME_HEADER) break;
      const head = this.peek(FRAME_HEADER);
      const bodyLen = head.readUInt32LE(0);
      const type = head.readUInt8(4);
      if (bodyLen < 1 || bodyLen > MAX_FRAME_BODY || !KNOWN_TYPES.has(type)) {
        if (!this.sawFrame) {
          this.notTls(head);
          this.notAPeer();
        }
        if (bodyLen < 1 || bodyLen > MAX_FRAME_BODY) throw protocolError(`frame length ${bodyLen} out of bounds`);
        throw protocolError(`unknown frame type 0x${type.toString(16)}`);
      }
      this.sawFrame = true;
      if (this.buffered < 4 + bodyLen) {
        this.assemble(4 + bodyLen);
        break;
      }
      const { whole, pooled } = this.take(4 + bodyLen);
      this.emit(whole, pooled, out);
    }
    if (this.head === this.parts.length) {
      this.parts = [];
      this.head = 0;
    } else if (this.head > 64 && this.head * 2 > this.parts.length) {
      this.parts = this.parts.slice(this.head);
      this.head = 0;
    }
    return out;
  }

  /** A chunk lent by its owner (a stream's share of a pooled MUX frame): `lent` gives it back.
   * A chunk of whole frames, arriving with nothing buffered, is decoded in place: its large
   * frames are handed out without a copy and the last of them to be released gives the chunk
   * back; its small frames get copies of their own (control frames are seldom released). A
   * chunk the decoder would keep part of is copied first and given back at once. Either way,
   * whatever the decoder or a frame holds on to is its own (decisions §39, §70). */
  private pushLent(chunk: Buffer, out: Frame[], lent: () => void): Frame[] {
    if (this.assembly || this.buffered > 0 || !wholeFrames(chunk)) {
      const own = copyOf(chunk);
      this.allocated += own.length;
      lent();
      return this.push(own, out);
    }
    const before = out.length;
    let failure: unknown;
    try {
      this.push(chunk, out);
    } catch (e) {
      failure = e;
    }
    let holders = 0;
    for (let i = before; i < out.length; i++) {
      const f = out[i]!;
      if (f.release || f.payload.buffer !== chunk.buffer) continue;
      // Frames decoded before a violation are still delivered, after the chunk went back.
      if (failure !== undefined || f.payload.length < FrameDecoder.POOLED_MIN) {
        out[i] = { type: f.type, payload: Buffer.from(f.payload) };
        this.allocated += f.payload.length;
        continue;
      }
      holders++;
      let released = false;
      f.release = () => {
        if (released) return;
        released = true;
        if (--holders === 0) lent();
      };
    }
    // What the decoder kept of the chunk (the bytes after the bad header) must not outlive it:
    // the input ends here, the connection fails.
    if (failure !== undefined) this.dropInput();
    if (holders === 0) lent();
    if (failure !== undefined) throw failure;
    return out;
  }

  private emit(whole: Buffer, pooled: Buffer | undefined, out: Frame[]): void {
    const frame: Frame = { type: whole.readUInt8(4) as FrameType, payload: whole.subarray(FRAME_HEADER) };
    if (pooled) {
      // Once: the pool is the process's, so a second release could hand the buffer to two
      // connections at once.
      let released = false;
      frame.release = () => {
        if (released) return;
        released = true;
        this.framePool.release(pooled);
      };
    }
    out.push(frame);
  }

  /** A frame of `n` bytes is incomplete: once half of it is here, move what is buffered into
   * a pooled buffer and copy the rest in as it arrives. Not before, if that needs a new buffer:
   * what is allocated is then never more than twice what the peer actually sent (a header alone
   * claims nothing). An idle buffer of the pool is taken at once: it is resident already, and
   * reads kept until half the frame is here outlive the scavenges when several connections read
   * at once — four lanes each reading their first megabyte while 4 MiB arrive for the process —
   * and wait for a full GC as dead memory (decisions §82). */
  private assemble(n: number): void {
    if (n < FrameDecoder.POOLED_MIN) return;
    if (this.buffered * 2 < n && !this.framePool.idleFits(n)) return;
    const filled = this.buffered;
    const pooled = this.takePooled(n);
    const frame = pooled.subarray(0, n);
    let at = 0;
    for (let i = this.head; i < this.parts.length; i++) {
      this.parts[i].copy(frame, at);
      at += this.parts[i].length;
    }
    this.parts = [];
    this.head = 0;
    this.assembly = { frame, pooled, filled };
  }

  private append(chunk: Buffer): void {
    this.buffered += chunk.length;
    if (chunk.length >= FrameDecoder.SMALL_READ && !this.copyReads) {
      // The accumulator stays for the small reads after it: dropped here, a connection whose
      // reads alternate large and small made a fresh 64 KiB one for nearly every small read
      // (307 in a 100 × 16 MiB session on four lanes, 71 when kept; decisions §82).
      this.parts.push(chunk);
      return;
    }
    const t = this.tail;
    if (t && this.tailEnd + chunk.length <= t.length) {
      // Bytes before tailEnd may belong to frames already handed out: only write past it.
      chunk.copy(t, this.tailEnd);
      const last = this.head < this.parts.length ? this.parts[this.parts.length - 1] : undefined;
      if (last && last.buffer === t.buffer && last.byteOffset + last.length === t.byteOffset + this.tailEnd) {
        this.parts[this.parts.length - 1] = t.subarray(last.byteOffset - t.byteOffset, this.tailEnd + chunk.length);
      } else {
        this.parts.push(t.subarray(this.tailEnd, this.tailEnd + chunk.length));
      }
      this.tailEnd += chunk.length;
      return;
    }
    // (A read larger than the accumulator, kept by copy, gets one of its own size.)
    const fresh = Buffer.allocUnsafeSlow(Math.max(this.nextTail, chunk.length));
    this.allocated += fresh.length;
    this.nextTail = Math.min(2 * this.nextTail, FrameDecoder.TAIL_SIZE);
    chunk.copy(fresh, 0);
    this.tail = fresh;
    this.tailEnd = chunk.length;
    this.parts.push(fresh.subarray(0, chunk.length));
  }

  /** The first `n` (≤ 8) buffered bytes, copied across reads if they span several (never
   * merging everything buffered: that was O(buffered) per call). */
  private peek(n: number): Buffer {
    const first = this.parts[this.head];
    if (first.length >= n) return first;
    let filled = 0;
    for (let i = this.head; filled < n; i++) {
      const p = this.parts[i];
      const k = Math.min(p.length, n - filled);
      p.copy(this.scratch, filled, 0, k);
      filled += k;
    }
    return this.scratch;
  }

  private take(n: number): { whole: Buffer; pooled?: Buffer } {
    const first = this.parts[this.head];
    let out: Buffer;
    let pooled: Buffer | undefined;
    if (first.length >= n) {
      out = first.subarray(0, n);
      if (first.length === n) this.head++;
      else this.parts[this.head] = first.subarray(n);
    } else {
      if (n >= FrameDecoder.POOLED_MIN) {
        pooled = this.takePooled(n);
        out = pooled.subarray(0, n);
      } else {
        out = Buffer.allocUnsafe(n);
        this.allocated += n;
      }
      let filled = 0;
      while (filled < n) {
        const p = this.parts[this.head];
        const k = Math.min(p.length, n - filled);
        p.copy(out, filled, 0, k);
        filled += k;
        if (k === p.length) this.head++;
        else this.parts[this.head] = p.subarray(k);
      }
    }
    this.buffered -= n;
    return { whole: out, pooled };
  }
}

/**
 * Frames that cannot move a session forward, whatever state it is in: a peer sending them
 * is flooding (docs/protocol.md §8). Returns why, or undefined. O(payload) at most.
 */
export function pointlessFrame(type: number, payload: Buffer): string | undefined {
  switch (type) {
    case FrameType.DATA:
    case FrameType.REFINE:
    case FrameType.MANIFEST_STREAM:
    case FrameType.FILE_BATCH:
      return payload.length === 0 ? `an empty ${frameName(type)} frame` : undefined;
    case FrameType.NEED: {
      if (payload.length < 5) return undefined; // malformed: the NEED decoder says so
      for (let i = 4; i < payload.length; i++) if (payload[i] !== 0) return undefined;
      return 'a NEED frame that asks for nothing';
    }
    default:
      return undefined;
  }
}
