// A framed, flow-controlled connection over any byte stream (TCP today; TLS and SSH
// stdio plug in the same way). Counts bytes on the wire in both directions, applies an
// idle timeout, and pauses the stream when too many frames wait to be consumed.

import type { Duplex } from 'node:stream';
import { ExitCode, FfsyncError } from '../utils/errors.js';
import { relieveGarbage, relieveNearBudget } from '../utils/gc.js';
import { readIntoStaticBuffer } from './static-reads.js';
import { encodeFrameHeader, type Frame, FrameDecoder, FrameType, frameName, pointlessFrame, protocolError } from '../protocol/frames.js';
import { decodeError } from '../protocol/messages.js';

/** What a connection carrying multiplexed streams hands MUX frames to (transport/mux.ts). */
export interface MuxHooks {
  /** One MUX frame; throws a protocol error for a frame no honest peer sends. */
  deliver(payload: Buffer, release?: () => void): void;
  /** Streams hold more unread bytes than allowed: stop reading the connection. */
  buffered(): boolean;
  /** The connection failed or closed: end every stream with it. */
  closeAll(why: Error): void;
}

export interface ConnectionOptions {
  /** A multiplexed stream's connection: the physical connection it travels on. It has no
   * idle timer of its own; its progress and waits count as the parent's (§7.4). */
  parent?: FramedConnection;
  /** Runs whenever a received frame is taken (a multiplexed stream's reader drained). */
  onConsume?: () => void;
  /** Runs when the reader puts a DATA batch back to wait for a write slot (`parkForSlot`,
   * `parked` true) and when it stops waiting (`unpark`, false). */
  onPark?: (parked: boolean) => void;
}

const HIGH_WATER = 4 * 1024 * 1024;
const LOW_WATER = 1024 * 1024;
/** Flow control counts frames too: a queue of millions of empty frames holds no payload
 * but ~150 bytes of bookkeeping each (docs/protocol.md §8). */
const HIGH_FRAMES = 1024;
const LOW_FRAMES = 256;
/** On a TLS socket, chunks shorter than this are joined with their neighbours (up to this much)
 * into one write; longer ones are written alone (see `writeTls`). */
export const TLS_JOIN_MAX = 64 * 1024;
/** The most a TLS socket is given in one write: a longer chunk goes in pieces of this, each
 * once the one before it called back. Node's TLS socket encrypts a write whole into a buffer
 * of the write's size, holds it until the kernel took all of it, and keeps the emptied buffer
 * for the next write: a 2 MiB DATA batch cost each connection 2–4 MiB of native memory, and a
 * sender's eight lanes and first connection ~27 MiB of its 110–120 MiB (decisions §117). */
export const TLS_PIECE_MAX = 256 * 1024;
/** How often a peer busy with local work proves it is alive. */
export const KEEPALIVE_MS = 5000;

/** How a connection's last close goes (see `FramedConnection.close`). */
export type CloseOrder = 'both' | 'first' | 'after-peer';
/** A peer that only proves it is alive (empty KEEPALIVE frames, or a work counter that does
 * not advance) is given this many idle timeouts in a row, then cut off (docs/protocol.md §7.4). */
export const STALL_FACTOR = 4;
/** KEEPALIVE frames a peer may send in a burst, and per second on average: ours send one
 * every ≥ 50 ms per connection; a flood is cut off (exit 12). */
const KEEPALIVE_BURST = 100;
const KEEPALIVE_PER_S = 25;
/** DELIVERED frames (§4.16): a data-receiving peer reports every DELIVERY_REPORT_MS, when it
 * read at least DELIVERY_REPORT_STEP bytes since its last report; the sender accepts at most
 * DELIVERED_BURST in a burst and DELIVERED_PER_S per second on average (ours: ≤ 20/s). */
export const DELIVERY_REPORT_MS = 50;
export const DELIVERY_REPORT_STEP = 64 * 1024;
const DELIVERED_BURST = 100;
const DELIVERED_PER_S = 50;
/** The work-proxy (keepAlive without a progress source) counts CPU time only in intervals
 * where the process used at least this share of one core (an idle process uses ~0). */
const CPU_BUSY_SHARE = 0.05;

/** A progress source for `keepAlive`: a monotonic count of local work (bytes hashed…). */
export interface WorkMeter {
  done: number;
  /** Wraps a progress callback (done bytes of one phase) so that it also feeds the meter. */
  tap(progress: (n: number) => void): (n: number) => void;
}

/** A meter fed by native progress callbacks (phases may restart at 0: deltas are added). */
export function workMeter(): WorkMeter {
  const m: WorkMeter = {
    done: 0,
    tap(progress) {
      let last = 0;
      return (n) => {
        if (n > last) m.done += n - last;
        last = n;
        progress(n);
      };
    },
  };
  return m;
}

/** Local work of this process when the caller has no byte counter: CPU time (µs, counted
 * only when busy) plus block I/O operations, read at `at` (ms). */
interface ProcessWork {
  at: number;
  cpuUs: number;
  io: number;
}

/** The last reading, reused by keepAlive() for up to PROCESS_WORK_REUSE_MS as the baseline it
 * starts from. getrusage sums every thread of the process; taken at each start (several per
 * file of a tree, on every multiplexed conversation) it would cost the JS thread about 0.7 ms
 * per file (decisions §67). Ticks take a fresh reading. */
let lastReading: ProcessWork | undefined;
const PROCESS_WORK_REUSE_MS = 25;

function processWork(): ProcessWork {
  const u = process.resourceUsage();
  lastReading = { at: Date.now(), cpuUs: u.userCPUTime + u.systemCPUTime, io: u.fsRead + u.fsWrite };
  return lastReading;
}

function recentProcessWork(): ProcessWork {
  return lastReading && Date.now() - lastReading.at <= PROCESS_WORK_REUSE_MS ? lastReading : processWork();
}

function keepAliveBeforeHello(): FfsyncError {
  return protocolError("KEEPALIVE before the peer's HELLO: a peer may only say it is alive once the session started");
}

/** A write waiting in a TLS connection's outbox; `done` once the socket no longer needs it.
 * `at`: bytes of a chunk longer than TLS_PIECE_MAX already handed over, piece by piece. */
interface OutboxEntry {
  chunk: Uint8Array;
  done: (() => void) | undefined;
  at?: number;
}

export class PeerClosedError extends FfsyncError {
  constructor(detail: string) {
    super('EPEERCLOSED', ExitCode.PROTOCOL_STREAM, `connection closed by peer ${detail}`);
  }
}

export class FramedConnection {
  bytesSent = 0;
  /** An ERROR frame already went out: the peer knows why we stop. */
  errorSent = false;
  /** We wrote an ERROR frame ourselves (`errorSent` also marks a failure the peer reported):
   * our end then waits for the peer's, so the peer can read it (decisions §113). */
  wroteError = false;
  bytesReceived = 0;
  private readonly decoder = new FrameDecoder();
  /** Received frames not yet taken, from `qHead` (no Array.shift: O(1) per frame). */
  private queue: Frame[] = [];
  private qHead = 0;
  private queuedBytes = 0;
  private waiter: { resolve: (f: Frame) => void; reject: (e: Error) => void } | undefined;
  private failure: Error | undefined;
  private ended = false;
  private closed = false;
  /** Last progress: a frame that moves the session forward arrived (anything but KEEPALIVE),
   * a KEEPALIVE whose work counter advanced, a frame we wrote, a drain, or the start of a wait. */
  private lastActivity = Date.now();
  /** Last byte received (liveness: an empty KEEPALIVE is only this). */
  private lastBytes = Date.now();
  /** The peer's KEEPALIVE work counter, as last seen. */
  private peerWork = -1n;
  /** Our own KEEPALIVE work counter (u64 on the wire). */
  private workSent = 0n;
  /** keepAlive() calls running now: their meter (none: the process-work proxy) and its last reading. */
  private readonly workSources = new Set<{ meter?: WorkMeter; last: number }>();
  private workTimer: NodeJS.Timeout | undefined;
  private lastProcessWork: ProcessWork = { at: Date.now(), cpuUs: 0, io: 0 };
  /** Token bucket for the peer's KEEPALIVE frames. */
  private keepAliveTokens = KEEPALIVE_BURST;
  private keepAliveRefilled = Date.now();
  /** DELIVERED frames: the bytes of ours the peer says it has read, the token bucket that
   * bounds them, who is told of each report, and our own reporting timer. */
  private peerDelivered = 0;
  private deliveredTokens = DELIVERED_BURST;
  private deliveredRefilled = Date.now();
  private deliveryListener: ((delta: number, now: number) => void) | undefined;
  private deliveryTimer: NodeJS.Timeout | undefined;
  /** The peer sent a frame other than KEEPALIVE (its HELLO comes first). */
  private peerSpoke = false;
  /** A KEEPALIVE came before any other frame; `requireHello` turns it into a protocol error. */
  private earlyKeepAlive = false;
  private helloRequired = false;
  /** The peer sent a frame that breaks the rules (flood, KEEPALIVE before HELLO): nothing it
   * sends after that is decoded (its ERROR neither: it is not waited for). */
  private flooded = false;
  /** When the frame now being received started arriving (0: none in progress). */
  private partialSince = 0;
  private drainWaiters = 0;
  private readonly keepAliveMs: number;
  private idleTimer: NodeJS.Timeout | undefined;
  /** Woken on every arrival, end, close or failure (see `nextChange`). */
  private readonly changeWaiters = new Set<() => void>();
  /** Streams multiplexed on this connection, if any (protocol version 2). */
  private mux: MuxHooks | undefined;
  /** MUX frames that arrived before the multiplexer attached, on a connection told to expect
   * one (`expectMux`): a lane's sender starts its streams right behind JOIN, so they can be
   * decoded in the same read as the JOIN the receiver has not yet checked. Held only behind a
   * JOIN (`joinSeen`); before it a MUX frame is refused as on any connection without streams. */
  private early: Frame[] | undefined;
  private joinSeen = false;
  /** The conversations running on those streams (their waits keep this one's timer armed). */
  private readonly children = new Set<FramedConnection>();
  private readonly parent: FramedConnection | undefined;
  private readonly onConsume: (() => void) | undefined;
  private readonly onPark: ((parked: boolean) => void) | undefined;
  private parkedForSlot = false;
  /** The peer's first ERROR, decoded, kept apart from the queue: a reader that gave up (an
   * `expect` abandoned in a race) may take the queued frame. */
  private peerFailure: FfsyncError | undefined;
  /** A TLS socket's writes not yet handed to it, in order (undefined: not a TLS socket).
   * Node's TLS socket copies every write of several buffers into one fresh buffer before it
   * encrypts it: a 2 MiB DATA frame written as header and payload cost a 2 MiB allocation, its
   * page faults and a copy, and writes queued behind a busy socket are written together, so
   * every DATA frame paid it. Here the socket is given one buffer at a time: a large chunk as
   * it is, small ones joined (decisions §86). */
  private readonly outbox: OutboxEntry[] | undefined;
  /** A kernel socket (TCP, TLS): what crosses relays and NATs, whose close has an order (§113). */
  private readonly overSocket: boolean;
  private outboxBytes = 0;
  /** A write handed to the TLS socket has not called back yet. */
  private tlsWriting = false;
  /** A write to an idle TLS socket is due at the end of this turn of the event loop. */
  private tlsFlushDue = false;
  /** `close` asked to end the stream while the outbox still held writes. */
  private endWhenWritten = false;
  /** Waiting for the outbox to empty (what 'drain' is for other streams). */
  private readonly outboxDrained = new Set<() => void>();

  constructor(
    private readonly stream: Duplex,
    idleTimeoutMs: number,
    options: ConnectionOptions = {},
  ) {
    this.parent = options.parent;
    this.onConsume = options.onConsume;
    this.onPark = options.onPark;
    this.outbox = (stream as { encrypted?: boolean }).encrypted === true ? [] : undefined;
    this.overSocket = typeof (stream as { setNoDelay?: unknown }).setNoDelay === 'function';
    this.keepAliveMs = this.parent
      ? this.parent.keepAliveMs
      : idleTimeoutMs > 0
        ? Math.min(KEEPALIVE_MS, Math.max(50, Math.floor(idleTimeoutMs / 3)))
        : KEEPALIVE_MS;
    if (this.parent) {
      this.peerSpoke = true; // the parent's peer said HELLO; a stream has none of its own
      this.parent.children.add(this);
      stream.once('close', () => this.parent!.children.delete(this));
    }
    this.listen(stream);
    // Plain TCP sockets are accepted paused (pauseOnConnect) so no byte is lost before
    // this point, and an explicitly paused stream does not resume on a 'data' listener.
    stream.resume();
    if (idleTimeoutMs > 0) {
      // Idle means: we wait for the peer (a frame or a drain) and nothing moved for
      // idleTimeoutMs. Peers doing long local work send KEEPALIVE frames.
      this.idleTimer = setInterval(() => this.checkIdle(idleTimeoutMs), Math.min(1000, idleTimeoutMs));
      this.idleTimer.unref();
    }
  }

  /** The idle timer's check: fails the connection when the peer went silent, made no progress
   * for STALL_FACTOR timeouts, or trickles bytes that never complete a frame. */
  private checkIdle(idleTimeoutMs: number): void {
    const waiting = this.isWaiting;
    const now = Date.now();
    const stalled = now - this.lastActivity;
    if (stalled > idleTimeoutMs && waiting && now - this.lastBytes > idleTimeoutMs) {
      this.fail(new FfsyncError('ETIMEDOUT', ExitCode.TIMEOUT, `peer sent nothing for ${Math.round(idleTimeoutMs / 1000)} s`));
    } else if (stalled > idleTimeoutMs * STALL_FACTOR && waiting) {
      // Alive (empty KEEPALIVEs, or a counter that does not move) but no progress: an old
      // peer gets STALL_FACTOR timeouts of grace, a hostile one no more than that.
      this.fail(
        new FfsyncError(
          'ETIMEDOUT',
          ExitCode.TIMEOUT,
          `peer made no progress for ${Math.round(stalled / 1000)} s (only keep-alives; the limit is ${STALL_FACTOR} × --timeout ${Math.round(idleTimeoutMs / 1000)} s)`,
        ),
      );
    } else if (this.partialSince > 0 && now - this.partialSince > idleTimeoutMs && !this.stream.isPaused()) {
      // (A frame half-read when we paused the stream ourselves, flow control, is not the
      // peer's trickle: the clock restarts when we resume.)
      // Bytes keep trickling in but no frame completes: as good as silent.
      this.fail(new FfsyncError('ETIMEDOUT', ExitCode.TIMEOUT, `peer trickles data: no frame completed in ${Math.round(idleTimeoutMs / 1000)} s`));
    }
  }

  /** What the stream says: data to decode, its end, its close, its errors. */
  private listen(stream: Duplex): void {
    stream.on('data', (chunk: Buffer) => this.onData(chunk));
    // A socket's reads from now on land in one buffer of its own, copied by the decoder as it
    // keeps them; the 'data' listener above still gets the reads the stream holds already.
    if (!this.parent && readIntoStaticBuffer(stream, (chunk) => this.onData(chunk, true))) this.decoder.copyReads = true;
    stream.on('end', () => {
      this.ended = true;
      this.mux?.closeAll(new PeerClosedError('before the session finished'));
      this.wake();
      this.wakeChangeWaiters();
    });
    stream.on('close', () => {
      this.ended = true;
      this.closed = true;
      this.dropOutbox();
      // Nothing more will arrive: partial input and the reassembly pool go now, not when
      // this object is collected (64 finished serve sessions held ~250 MiB for 10 s).
      this.decoder.dispose();
      this.mux?.closeAll(new PeerClosedError('before the session finished'));
      this.wake();
      this.wakeChangeWaiters();
    });
    stream.on('error', (e: NodeJS.ErrnoException) => {
      this.fail(new FfsyncError(e.code ?? 'ESOCKET', ExitCode.SOCKET_IO, `connection error: ${e.message}`, { cause: e }));
    });
  }

  /** `reused`: the chunk is a view of the socket's static read buffer (copied if kept). */
  private onData(chunk: Buffer, reused = false): void {
    this.bytesReceived += chunk.length;
    // A multiplexed stream's chunk may be a slice of the connection's pooled buffer (mux.ts).
    const lent = (this.stream as { takeLent?: (c: Buffer) => (() => void) | undefined }).takeLent?.(chunk);
    // A flooding peer is not listened to any more: its bytes are dropped undecoded.
    if (this.flooded) {
      lent?.();
      return;
    }
    // Reads into fresh buffers become garbage once decoded: a minor GC every RELIEF_STEP of them
    // (relieveGarbage). Reads into the static buffer leave none of their own: they pace the
    // collections only near the budget (relieveNearBudget), and what the decoder allocated to
    // keep them is counted after the push. A stream's chunks are slices of its connection's
    // frames, counted there.
    // A lent chunk (an in-memory pipe's pooled buffer, stream-pair.ts) goes back to its pool:
    // no garbage either.
    const allocatedBefore = this.decoder.allocated;
    const kept = reused || lent !== undefined;
    if (!this.parent) (kept ? relieveNearBudget : relieveGarbage)(chunk.length);
    const now = Date.now();
    this.lastBytes = now;
    const frames: Frame[] = [];
    let bad: Error | undefined;
    try {
      this.decoder.push(chunk, frames, lent);
    } catch (e) {
      bad = e as Error;
    }
    // (A multiplexed stream's reads are its connection's, which counts them only when they are
    // fresh buffers; what the stream's decoder copies of them is garbage of its own.)
    if ((kept || this.parent) && this.decoder.allocated > allocatedBefore) relieveGarbage(this.decoder.allocated - allocatedBefore);
    for (const f of frames) {
      const verdict = this.screen(f, now);
      if (verdict instanceof Error) {
        this.flooded = true;
        this.fail(verdict);
        break;
      }
      if (!verdict) continue;
      if (f.type === FrameType.ERROR) this.peerFailure ??= decodeError(f.payload);
      this.queue.push(f);
      this.queuedBytes += f.payload.length;
    }
    // An ERROR frame ends the session: stop sending at once (a sender busy writing DATA
    // would otherwise notice only when its next read or write fails, and the peer's reason
    // could be lost). Frames queued before it are still delivered in order, ERROR last.
    if (this.peerFailure) this.fail(this.peerFailure);
    if (bad) this.fail(bad);
    // Track how long a frame has been incomplete (see the idle timer).
    if (this.decoder.bufferedBytes === 0) this.partialSince = 0;
    else if (frames.length > 0 || this.partialSince === 0) this.partialSince = Date.now();
    if (this.queuedBytes > HIGH_WATER || this.waitingFrames > HIGH_FRAMES) this.stream.pause();
    else this.pauseForMux();
    this.wake();
    this.wakeChangeWaiters();
  }

  /** One decoded frame, checked: an Error ends the connection (a flood or a violation);
   * `true`: it joins the queue for the conversation; `false`: it was handled here (KEEPALIVE,
   * DELIVERED, or a stream's bytes in a MUX frame). */
  private screen(f: Frame, now: number): Error | boolean {
    switch (f.type) {
      case FrameType.KEEPALIVE:
        return this.onKeepAlive(f.payload, now) ?? false;
      case FrameType.DELIVERED:
        return this.onDelivered(f.payload, now) ?? false;
      case FrameType.MUX:
        // A stream's bytes: whether they move the session forward is the stream's to say
        // (its conversation touches this connection when they do; a KEEPALIVE does not).
        this.peerSpoke = true;
        try {
          if (!this.mux && this.early && this.joinSeen) {
            // Held (counted in bytes and frames, so flow control still pauses) until the
            // multiplexer attaches; dropped with the connection if its JOIN is refused.
            this.early.push(f);
            this.queuedBytes += f.payload.length;
            return false;
          }
          if (!this.mux) throw protocolError('MUX frame outside a multiplexed tree session');
          this.mux.deliver(f.payload, f.release);
        } catch (e) {
          return e as Error;
        }
        return false;
      default: {
        if (f.type === FrameType.JOIN) this.joinSeen = true;
        this.peerSpoke = true;
        this.touch(now);
        const pointless = f.type === FrameType.ERROR ? undefined : pointlessFrame(f.type, f.payload);
        return pointless ? protocolError(`the peer sent ${pointless}: pointless frames are a flood, not a session`) : true;
      }
    }
  }

  /** KEEPALIVE: liveness always; progress only when its work counter advanced (§4.11).
   * Returns a protocol error for a KEEPALIVE that is itself a violation. */
  private onKeepAlive(payload: Buffer, now: number): Error | undefined {
    if (!this.peerSpoke) {
      if (this.helloRequired) return keepAliveBeforeHello();
      this.earlyKeepAlive = true;
    }
    this.keepAliveTokens = Math.min(KEEPALIVE_BURST, this.keepAliveTokens + ((now - this.keepAliveRefilled) * KEEPALIVE_PER_S) / 1000);
    this.keepAliveRefilled = now;
    if (--this.keepAliveTokens < 0) return protocolError(`KEEPALIVE flood: more than ${KEEPALIVE_PER_S} per second`);
    if (payload.length === 0) return undefined; // an old peer: liveness only
    if (payload.length !== 8) return protocolError(`KEEPALIVE with a payload of ${payload.length} bytes (0 or 8 expected)`);
    const work = payload.readBigUInt64LE(0);
    if (work > this.peerWork) {
      this.peerWork = work;
      this.touch(now);
    }
    return undefined;
  }

  /** DELIVERED (§4.16): how many of the bytes we sent the peer has read. It can only say what
   * is true of this connection (more than before, no more than we sent), at a bounded rate;
   * a report that advanced is progress (our data is being taken). */
  private onDelivered(payload: Buffer, now: number): Error | undefined {
    if (!this.peerSpoke) return protocolError("DELIVERED before the peer's HELLO");
    this.deliveredTokens = Math.min(DELIVERED_BURST, this.deliveredTokens + ((now - this.deliveredRefilled) * DELIVERED_PER_S) / 1000);
    this.deliveredRefilled = now;
    if (--this.deliveredTokens < 0) return protocolError(`DELIVERED flood: more than ${DELIVERED_PER_S} per second`);
    if (payload.length !== 8) return protocolError(`DELIVERED with a payload of ${payload.length} bytes (8 expected)`);
    const n = Number(payload.readBigUInt64LE(0));
    if (n <= this.peerDelivered) return protocolError(`DELIVERED did not advance (${n} after ${this.peerDelivered})`);
    if (n > this.bytesSent) return protocolError(`DELIVERED claims ${n} bytes read of the ${this.bytesSent} sent`);
    const delta = n - this.peerDelivered;
    this.peerDelivered = n;
    this.touch(now);
    this.deliveryListener?.(delta, now);
    return undefined;
  }

  /** Bytes of ours the peer has reported read (DELIVERED), 0 before its first report. */
  get delivered(): number {
    return this.peerDelivered;
  }

  /** Tell `listener` of every DELIVERED report: the bytes it adds and when it arrived. */
  onDeliveryReport(listener: (delta: number, now: number) => void): void {
    this.deliveryListener = listener;
  }

  /** The data-receiving side of a session whose peer negotiated DELIVERY: report the bytes
   * read off this connection every DELIVERY_REPORT_MS while they advance by at least
   * DELIVERY_REPORT_STEP (an idle connection sends nothing), until it closes or fails. */
  startDeliveryReports(): void {
    if (this.deliveryTimer || this.parent) return;
    let reported = 0;
    this.deliveryTimer = setInterval(() => {
      if (this.closed || this.failure || this.stream.destroyed || this.stream.writableEnded) {
        clearInterval(this.deliveryTimer);
        return;
      }
      if (this.bytesReceived - reported < DELIVERY_REPORT_STEP) return;
      reported = this.bytesReceived;
      const payload = Buffer.allocUnsafe(8);
      payload.writeBigUInt64LE(BigInt(reported));
      void this.send(FrameType.DELIVERED, payload).catch(() => undefined);
    }, DELIVERY_REPORT_MS);
    this.deliveryTimer.unref();
  }

  /**
   * The peer's next frame must be its HELLO (or ERROR): a KEEPALIVE before it — already
   * received or still to come — is a protocol error, exit 12 (§4.1, §4.11).
   */
  requireHello(): void {
    this.helloRequired = true;
    if (this.earlyKeepAlive && !this.peerSpoke) {
      this.flooded = true;
      this.fail(keepAliveBeforeHello());
    }
  }

  private get queued(): number {
    return this.queue.length - this.qHead;
  }

  /** Frames received and not yet taken, the MUX frames held for a multiplexer included: what
   * flow control counts, as `queuedBytes` counts their bytes. */
  private get waitingFrames(): number {
    return this.queued + (this.early?.length ?? 0);
  }

  private fail(e: Error): void {
    if (!this.failure) this.failure = e;
    this.mux?.closeAll(e);
    this.wake();
    this.wakeChangeWaiters();
    this.stream.emit('ffsync-failed');
  }

  private wakeChangeWaiters(): void {
    for (const w of this.changeWaiters) w();
    this.changeWaiters.clear();
  }

  /** Resolves at the next arrival, end, close or failure, or after `ms` (if given). */
  private nextChange(ms?: number): Promise<void> {
    return new Promise<void>((resolve) => {
      const done = () => {
        clearTimeout(timer);
        this.changeWaiters.delete(done);
        resolve();
      };
      const timer = ms === undefined ? undefined : setTimeout(done, ms);
      this.changeWaiters.add(done);
    });
  }

  /**
   * Wait for `work` (a rate-limit pause, say), but no longer than the connection is
   * healthy: a peer's ERROR or a close ends the wait at once, so the next send reports it
   * (a sender pausing for --bwlimit must still answer a receiver's ERROR within its wait).
   */
  async orFailure(work: Promise<void>): Promise<void> {
    let finished = false;
    const w = work.then(() => (finished = true));
    // Left behind when the connection fails first: a later rejection of `work` is the
    // connection's failure again, already reported, not an unhandled one that ends the process.
    w.catch(() => undefined);
    while (!finished && !this.failure && !this.closed) await Promise.race([w, this.nextChange()]);
  }

  private wake(): void {
    const w = this.waiter;
    if (!w) return;
    if (this.queued) {
      this.waiter = undefined;
      w.resolve(this.shift());
    } else if (this.failure) {
      this.waiter = undefined;
      w.reject(this.failure);
    } else if (this.ended) {
      this.waiter = undefined;
      w.reject(new PeerClosedError('before the session finished'));
    }
  }

  private shift(): Frame {
    const f = this.queue[this.qHead];
    this.queue[this.qHead++] = undefined as unknown as Frame;
    if (this.qHead === this.queue.length) {
      this.queue = [];
      this.qHead = 0;
    } else if (this.qHead > 1024 && this.qHead * 2 > this.queue.length) {
      this.queue = this.queue.slice(this.qHead);
      this.qHead = 0;
    }
    this.queuedBytes -= f.payload.length;
    this.maybeResume();
    this.onConsume?.();
    return f;
  }

  /** Read again if flow control paused the stream and everything queued has drained. */
  maybeResume(): void {
    if (this.queuedBytes < LOW_WATER && this.waitingFrames < LOW_FRAMES && !this.mux?.buffered() && this.stream.isPaused()) {
      if (this.partialSince > 0) this.partialSince = Date.now();
      this.stream.resume();
    }
  }

  /** The multiplexer carried here is over its window (its session's, set by another connection's
   * bytes): stop reading now. `maybeResume` reads again once it is under. */
  pauseForMux(): void {
    if (!this.mux?.buffered()) return;
    this.stream.pause();
    // Another lane may need a frame buffer sooner than this one's next frame (frames.ts).
    this.decoder.yieldAssembly();
  }

  /** Carry multiplexed streams (transport/mux.ts): MUX frames go to `hooks`, not the queue. */
  attachMux(hooks: MuxHooks): void {
    if (this.mux) throw new Error('a connection carries one multiplexer');
    this.mux = hooks;
    const held = this.early;
    this.early = undefined;
    if (!held?.length) return;
    // Now, in order, before any later read can deliver behind them: as if the multiplexer had
    // been there when they arrived.
    let k = 0;
    try {
      for (; k < held.length; k++) {
        const f = held[k]!;
        this.queuedBytes -= f.payload.length;
        hooks.deliver(f.payload, f.release);
      }
    } catch (e) {
      for (const f of held.slice(k + 1)) {
        this.queuedBytes -= f.payload.length;
        f.release?.();
      }
      this.fail(e as Error); // closes the streams (this.mux is set)
      return;
    }
    // The connection failed or ended while they were held: what would have closed the streams
    // then closes them now, not their idle timers later.
    if (this.failure) hooks.closeAll(this.failure);
    else if (this.ended) hooks.closeAll(new PeerClosedError('before the session finished'));
    else this.maybeResume();
  }

  /** A multiplexer will attach once this connection's JOIN is checked (a lane of a version 2
   * session): hold the MUX frames that come behind the JOIN until then instead of refusing them. */
  expectMux(): void {
    if (!this.mux) this.early ??= [];
  }

  /** Received bytes not yet taken (a multiplexed stream's share of its parent's budget). */
  get pendingBytes(): number {
    return this.queuedBytes;
  }

  /** Progress: on this connection and, for a multiplexed stream, on the one carrying it. */
  private touch(now = Date.now()): void {
    this.lastActivity = now;
    this.parent?.touch(now);
  }

  /** Waiting for the peer: a receive, a drain, or (a connection carrying streams) any of
   * its streams' conversations waiting. */
  private get isWaiting(): boolean {
    if (this.waiter !== undefined || this.drainWaiters > 0) return true;
    for (const c of this.children) if (c.isWaiting) return true;
    return false;
  }

  /** Fail with `e` from outside (the connection carrying this stream failed, or the session
   * ends with `e`): receives in progress reject with it, not as "peer closed". */
  failWith(e: Error): void {
    this.fail(e);
  }

  /** Next frame; rejects on close, stream error, protocol error or idle timeout. */
  recv(): Promise<Frame> {
    if (this.queued) return Promise.resolve(this.shift());
    if (this.failure) return Promise.reject(this.failure);
    if (this.ended) return Promise.reject(new PeerClosedError('before the session finished'));
    this.touch();
    return new Promise((resolve, reject) => {
      this.waiter = { resolve, reject };
    });
  }

  /** Put a frame taken with `recv` back in front: the next `recv` returns it (a receiver
   * that looked at the first frame for PAIR hands a HELLO on to the handshake). */
  unshift(f: Frame): void {
    if (this.qHead > 0) this.queue[--this.qHead] = f;
    else this.queue.unshift(f);
    this.queuedBytes += f.payload.length;
  }

  /** `unshift` a DATA batch that waits for a write slot, marked `waitingForSlot` until the
   * reader `unpark`s it. */
  /** The frame at the queue's front is a DATA batch put back to wait for one of its session's
   * write slots (write-slots.ts), which writes in progress free without the network: what this
   * connection holds unread drains by local work alone (decisions §119). */
  get waitingForSlot(): boolean {
    return this.parkedForSlot;
  }

  parkForSlot(f: Frame): void {
    this.unshift(f);
    this.parkedForSlot = true;
    this.onPark?.(true);
  }

  /** The batch put back no longer waits for a slot (it got one, or the wait failed): what this
   * connection holds may wait on something else now, so the session is told (`onPark`). */
  unpark(): void {
    if (!this.parkedForSlot) return;
    this.parkedForSlot = false;
    this.onPark?.(false);
  }

  /**
   * Write one frame; resolves once the stream can take more (backpressure).
   * `onWritten` runs when the payload has been handed to the OS (its buffer may be reused).
   */
  send(type: FrameType, payload: Uint8Array = Buffer.alloc(0), onWritten?: () => void): Promise<void> {
    if (type === FrameType.ERROR) this.wroteError = true;
    return this.sendParts(type, [payload], onWritten);
  }

  /** `send` of a payload given in parts (at least one; written in order, never copied into one buffer).
   * With `wait` false it resolves at once: the caller waits on `onWritten` instead. */
  sendParts(type: FrameType, parts: Uint8Array[], onWritten?: () => void, wait = true): Promise<void> {
    // After a local failure only an ERROR frame may still go out (to tell the peer why).
    if (this.failure && type !== FrameType.ERROR) return Promise.reject(this.failure);
    if (this.closed || this.stream.destroyed || this.stream.writableEnded || this.endWhenWritten) {
      return Promise.reject(new PeerClosedError(`before we could send ${frameName(type)}`));
    }
    let length = 0;
    for (const p of parts) length += p.length;
    const header = encodeFrameHeader(type, length);
    this.bytesSent += header.length + length;
    let ok: boolean;
    if (this.outbox) ok = this.queueTls(header, parts, onWritten);
    else {
      this.stream.cork();
      ok = this.stream.write(header);
      for (let i = 0; i < parts.length; i++) {
        const last = i === parts.length - 1;
        ok = this.stream.write(parts[i], last && onWritten ? () => onWritten() : undefined);
      }
      this.stream.uncork();
    }
    // Our own KEEPALIVE is not the peer's progress, nor our DELIVERED (the peer's bytes, not
    // its progress); nor is a stream's frame (the stream's own conversation says whether it
    // was: a KEEPALIVE on a stream is not).
    if (type !== FrameType.KEEPALIVE && type !== FrameType.MUX && type !== FrameType.DELIVERED) this.touch();
    if (ok || !wait) return Promise.resolve();
    this.drainWaiters++;
    return new Promise((resolve, reject) => {
      const onDrain = () => {
        cleanup();
        this.touch();
        resolve();
      };
      const onClose = () => {
        cleanup();
        reject(this.failure ?? new PeerClosedError(`while we were sending ${frameName(type)}`));
      };
      const cleanup = () => {
        this.drainWaiters--;
        stopWaiting();
        this.stream.off('close', onClose);
        this.stream.off('ffsync-failed', onClose);
      };
      const stopWaiting = this.whenDrained(onDrain);
      this.stream.on('close', onClose);
      this.stream.on('ffsync-failed', onClose);
    });
  }

  /** Run `f` when the stream can take more (TLS: the outbox emptied); returns the undo. */
  private whenDrained(f: () => void): () => void {
    if (this.outbox) {
      this.outboxDrained.add(f);
      return () => this.outboxDrained.delete(f);
    }
    this.stream.on('drain', f);
    return () => this.stream.off('drain', f);
  }

  /** A frame for a TLS socket: queued, and the socket given the next write if it is idle.
   * True while the socket and the outbox together hold less than the socket's high-water mark
   * (what `write` returns on other streams). */
  private queueTls(header: Buffer, parts: Uint8Array[], onWritten?: () => void): boolean {
    const box = this.outbox!;
    box.push({ chunk: header, done: undefined });
    this.outboxBytes += header.length;
    for (let i = 0; i < parts.length; i++) {
      box.push({ chunk: parts[i], done: i === parts.length - 1 ? onWritten : undefined });
      this.outboxBytes += parts[i].length;
    }
    // An idle socket is written at the end of this turn of the event loop, not at once: the
    // frames a conversation sends in one turn (a file's FILE_BEGIN, MANIFEST and HOLES; NEED
    // and NEED_END; the next file's beginning behind a RESULT) then go as one TLS record and
    // one system call, and the peer decodes them from one read (decisions §106). A large
    // chunk is not held: it would be written alone anyway.
    if (!this.tlsWriting && !this.tlsFlushDue) {
      if (this.outboxBytes >= TLS_JOIN_MAX) this.writeTls();
      else {
        this.tlsFlushDue = true;
        setImmediate(() => this.flushTurn());
      }
    }
    return this.outboxBytes + this.stream.writableLength < this.stream.writableHighWaterMark;
  }

  /** Hand the TLS socket its next write, once the one before it called back: a chunk of
   * TLS_JOIN_MAX or more alone, or the small chunks in front joined into one buffer. With one
   * write at a time nothing queues inside the socket, so it never joins (copies) writes itself;
   * the only copies left are of small chunks (frame headers, control frames). */
  private writeTls(): void {
    const box = this.outbox!;
    if (this.tlsWriting || this.tlsFlushDue || this.stream.destroyed) return;
    if (box.length === 0) {
      if (this.endWhenWritten) {
        this.endWhenWritten = false;
        this.stream.end();
      }
      for (const f of [...this.outboxDrained]) f();
      return;
    }
    const head = box[0]!;
    if (head.chunk.length > TLS_PIECE_MAX) {
      // A view, not a copy: the entry stays in front until its last piece called back.
      const at = head.at ?? 0;
      const piece = head.chunk.subarray(at, at + TLS_PIECE_MAX);
      const last = at + piece.length === head.chunk.length;
      head.at = at + piece.length;
      this.outboxBytes -= piece.length;
      if (last) box.shift();
      this.tlsWriting = true;
      this.stream.write(piece, () => {
        this.tlsWriting = false;
        if (last) head.done?.();
        this.writeTls();
      });
      return;
    }
    // The outbox holds a few entries per frame in flight (a writer waits for its callbacks):
    // taking them off the front with splice is cheap.
    let n = 1;
    let bytes = head.chunk.length;
    if (bytes < TLS_JOIN_MAX) {
      while (n < box.length && box[n]!.chunk.length < TLS_JOIN_MAX && bytes + box[n]!.chunk.length <= TLS_JOIN_MAX) bytes += box[n++]!.chunk.length;
    }
    const taken = box.splice(0, n);
    const chunk = n === 1 ? taken[0]!.chunk : Buffer.concat(taken.map((e) => e.chunk), bytes);
    this.outboxBytes -= bytes;
    this.tlsWriting = true;
    this.stream.write(chunk, () => {
      this.tlsWriting = false;
      for (const e of taken) e.done?.();
      this.writeTls();
    });
  }

  /** The TLS socket closed: writes still queued will never go; their owners get their buffers
   * back (as a closed socket calls back the writes it still held). */
  private dropOutbox(): void {
    const box = this.outbox;
    if (!box) return;
    const left = box.splice(0);
    this.outboxBytes = 0;
    this.endWhenWritten = false;
    for (const e of left) e.done?.();
  }

  /** Half-close the stream, after the writes still in the outbox (TLS). */
  private endStream(): void {
    if (this.outbox && (this.tlsWriting || this.tlsFlushDue || this.outbox.length > 0)) this.endWhenWritten = true;
    else this.stream.end();
  }

  /**
   * Flush and half-close; resolves when the peer has closed too (or after a grace period).
   *
   * `order` is how a session over TCP or TLS ends (docs/protocol.md §7.2): the sender, the
   * receiver's verdict in hand, ends first (`'first'`: it resolves once its end is flushed, not a
   * round trip later when the receiver's end comes back); the receiver, its verdict or ERROR
   * sent, ends only after the sender's end (`'after-peer'`), reading and dropping what comes
   * before it. So nothing is written after the receiver's end: a path that turns one
   * side's FIN into a close of both (a relay or NAT without half-close) found the sender still
   * closing its streams, and its next write was reset (decisions §113).
   */
  async close(graceMs = 2000, order: CloseOrder = 'both'): Promise<void> {
    if (this.idleTimer) clearInterval(this.idleTimer);
    if (this.deliveryTimer) clearInterval(this.deliveryTimer);
    if (this.workTimer) clearInterval(this.workTimer);
    if (this.closed || this.stream.destroyed) return;
    // Only a kernel socket crosses relays and NATs; an ssh channel, QUIC and the in-process
    // pipe carry half-closes end to end and keep their close as it was.
    if (!this.overSocket) order = 'both';
    // (A connection that failed already, a peer's ERROR among the causes, is not waited for:
    // after its ERROR a peer writes nothing but its end.)
    const waited = order === 'after-peer' && !this.flooded && !this.failure && !this.ended;
    if (waited) await this.dropUntil(graceMs, () => this.failure !== undefined);
    // A peer that flooded us gets our ERROR, not our patience; one that has ended its side
    // already, or that we waited for already, leaves only our own end to flush.
    if (this.flooded) graceMs = Math.min(graceMs, 250);
    else if (this.ended || waited) graceMs = Math.min(graceMs, 500);
    if (this.closed || this.stream.destroyed) return;
    await new Promise<void>((resolve) => {
      // The grace timer holds the process: this wait is a session's last step, and a stream
      // that never says 'close' must not let the event loop drain with the session unfinished
      // (a TLS socket over a connection reset right after its handshake ended without closing,
      // and the sender reported "the session stalled" instead of the reset: decisions §112).
      const t = setTimeout(() => {
        this.stream.destroy();
        resolve();
      }, graceMs);
      this.stream.once('close', () => {
        clearTimeout(t);
        resolve();
      });
      if (order === 'first') {
        // Our end is in the kernel's hands once 'finish' comes; the peer's end and the close
        // follow without us (an unreferenced timer still closes a socket the peer never ends).
        this.stream.once('finish', () => {
          clearTimeout(t);
          setTimeout(() => this.stream.destroy(), graceMs).unref();
          resolve();
        });
      }
      this.endStream();
      this.stream.resume();
    });
  }

  /** For up to `ms`, until `stop()` or the peer's end or close: every frame the peer still sends
   * is dropped (nothing else will be read), so flow control never holds back what we wait for. */
  private async dropUntil(ms: number, stop: () => boolean): Promise<void> {
    const deadline = Date.now() + ms;
    for (;;) {
      if (stop()) return;
      while (this.queued) this.shift().release?.();
      const left = deadline - Date.now();
      if (this.ended || this.closed || left <= 0) return;
      this.maybeResume();
      await this.nextChange(left);
    }
  }

  /**
   * Run long local work (hashing, fsync) while telling the peer how far it got: a KEEPALIVE
   * frame every KEEPALIVE_MS (or a third of our own idle timeout, if shorter) carrying our
   * work counter (u64, monotonic), which advances by the bytes `meter` reports or, without
   * one, by this process's CPU time (when busy) and block I/O. The peer counts a KEEPALIVE
   * whose counter advanced as progress; one that did not as liveness only (§4.11, §7.4).
   * Overlapping calls share one timer.
   */
  async keepAlive<T>(work: Promise<T>, meter?: WorkMeter): Promise<T> {
    const entry = { meter, last: meter?.done ?? 0 };
    this.workSources.add(entry);
    if (!this.workTimer) {
      this.lastProcessWork = recentProcessWork();
      this.workTimer = setInterval(() => this.tickKeepAlive(), this.keepAliveMs);
    }
    try {
      return await work;
    } finally {
      this.workSources.delete(entry);
      if (this.workSources.size === 0 && this.workTimer) {
        clearInterval(this.workTimer);
        this.workTimer = undefined;
      }
    }
  }

  private tickKeepAlive(): void {
    if (this.isClosed || this.failure) return;
    let advanced = 0;
    let proxied = false;
    for (const src of this.workSources) {
      if (src.meter) {
        advanced += Math.max(0, src.meter.done - src.last);
        src.last = src.meter.done;
      } else proxied = true;
    }
    const pw = processWork();
    if (advanced === 0 && proxied) {
      const cpu = pw.cpuUs - this.lastProcessWork.cpuUs;
      const busy = cpu >= (pw.at - this.lastProcessWork.at) * 1000 * CPU_BUSY_SHARE;
      advanced = (busy ? cpu : 0) + Math.max(0, pw.io - this.lastProcessWork.io);
    }
    this.lastProcessWork = pw;
    this.workSent += BigInt(Math.max(0, Math.floor(advanced)));
    const payload = Buffer.allocUnsafe(8);
    payload.writeBigUInt64LE(this.workSent);
    void this.send(FrameType.KEEPALIVE, payload).catch(() => undefined);
  }

  /**
   * After we reported an error: wait up to `ms` for the peer's own ERROR frame (discarding
   * anything else it still sends), e.g. its verdict on a chunk that failed our hash check
   * (a sender whose source changed says so). Undefined when the peer closed or stayed silent.
   */
  async awaitPeerError(ms: number): Promise<FfsyncError | undefined> {
    await this.dropUntil(ms, () => this.peerFailure !== undefined);
    return this.peerFailure;
  }

  /** An ERROR frame the peer sent that is still queued (read before reporting our own). */
  takePeerError(): Frame | undefined {
    const k = this.queue.findIndex((f, i) => i >= this.qHead && f.type === FrameType.ERROR);
    if (k < 0) return undefined;
    const f = this.queue.splice(k, 1)[0];
    this.queuedBytes -= f.payload.length;
    return f;
  }

  /** The failure this connection recorded (peer ERROR, protocol violation, timeout), if any. */
  get failedWith(): Error | undefined {
    return this.failure;
  }

  /** True once the underlying stream is gone (nothing more can be sent). */
  get isClosed(): boolean {
    return this.closed || this.stream.destroyed;
  }

  destroy(): void {
    if (this.idleTimer) clearInterval(this.idleTimer);
    if (this.deliveryTimer) clearInterval(this.deliveryTimer);
    if (this.workTimer) clearInterval(this.workTimer);
    this.flushTurn();
    this.stream.destroy();
  }

  /** Hand a TLS socket what this turn's frames left in the outbox for the turn's end
   * (queueTls): at that end, or sooner when the connection is destroyed first (a frame sent just
   * before, an ERROR saying why, goes as far as the socket takes it); once either way. */
  private flushTurn(): void {
    if (this.tlsFlushDue) {
      this.tlsFlushDue = false;
      this.writeTls();
    }
  }
}
