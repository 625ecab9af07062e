// Streams multiplexed on one framed connection (protocol version 2, docs/protocol.md §9.9).
// A tree session's large files each need a short conversation (MANIFEST -> NEED -> DATA ->
// RESULT); run one after another, every file pays its round trips in turn. A multiplexed
// session runs up to MUX_MAX_STREAMS of them at once on the same connection, so a session
// costs a constant number of round trips whatever the number of files.
//
// Each stream is a byte stream (a Duplex) carried in MUX frames: `u32 stream id | bytes`.
// A FramedConnection runs on top of each stream exactly as it does on a TCP socket or a QUIC
// stream, so the per-file conversation code is the same on every transport. The opener (the
// tree's sender) opens ids 1, 2, 3, … in order; its first MUX frame on an id opens it. A MUX
// frame with no bytes after the id ends that direction (FIN). Streams close when both
// directions ended.

import { Duplex } from 'node:stream';
import { FramedConnection } from './connection.js';
import { FRAME_HEADER, FRAME_POOL_BUFFER, FrameType, protocolError } from '../protocol/frames.js';

/** Streams one connection carries at once, and ids the peer may open beyond those it spent. */
export const MUX_MAX_STREAMS = 64;
/** Bytes received for streams but not yet taken by their conversations: above this the
 * connection stops reading (every stream waits) until they drain below half of it. A session
 * on lanes divides it between its connections (`laneWindow`), never under STREAM_HIGH_WATER
 * each, so today each connection has 4 MiB. Two DATA batches beyond the two
 * each file has in its writes: bytes wait here only when the receiver's disk or CPU is slower
 * than the wire, where more read-ahead buys nothing, and the socket's own buffers keep the wire
 * busy while it drains (decisions §78: 16 MiB measured no faster on a 1 Gbit/s, 30 ms link and
 * held 8–16 MiB more in the receiver). */
export const MUX_HIGH_WATER = 4 * 1024 * 1024;
/** One stream's unread bytes (its reader paused) before the connection stops reading. */
const STREAM_HIGH_WATER = 4 * 1024 * 1024;
/** Bytes one stream may have written but not yet handed to the OS before its writer waits. */
const STREAM_WRITE_WATER = 4 * 1024 * 1024;
const ID_BYTES = 4;

class MuxStream extends Duplex {
  /** The peer ended its direction. */
  peerEnded = false;
  /** The conversation running on this stream (set right after construction). */
  conn!: FramedConnection;
  /** Chunks pushed as slices of the connection's pooled frame buffers, with what gives each
   * buffer back: the stream's reader takes it with the chunk (`takeLent`). */
  private readonly lent = new WeakMap<Buffer, () => void>();

  constructor(
    private readonly mux: Multiplexer,
    readonly id: number,
  ) {
    super({ readableHighWaterMark: STREAM_HIGH_WATER, writableHighWaterMark: STREAM_WRITE_WATER, allowHalfOpen: true });
  }

  override _read(): void {
    this.mux.maybeResume();
  }

  /** Push a slice of a pooled buffer; `giveBack` returns the buffer to its pool. */
  pushLent(bytes: Buffer, giveBack: () => void): void {
    this.lent.set(bytes, giveBack);
    this.push(bytes);
  }

  /** The reader's side: what gives `chunk`'s buffer back, if it was lent (once). */
  takeLent(chunk: Buffer): (() => void) | undefined {
    const r = this.lent.get(chunk);
    if (r) this.lent.delete(chunk);
    return r;
  }

  override _write(chunk: Buffer, _enc: BufferEncoding, cb: (e?: Error | null) => void): void {
    this.mux.write(this.id, [chunk], cb);
  }

  override _writev(chunks: { chunk: Buffer }[], cb: (e?: Error | null) => void): void {
    this.mux.write(
      this.id,
      chunks.map((c) => c.chunk),
      cb,
    );
  }

  override _final(cb: (e?: Error | null) => void): void {
    this.mux.write(this.id, [], cb);
  }

  override _destroy(err: Error | null, cb: (e?: Error | null) => void): void {
    this.mux.forget(this);
    cb(err);
  }
}

export interface MultiplexerOptions {
  /** The opener's side (the tree's sender) opens streams; the other side accepts them. */
  opener: boolean;
  /** Acceptor: a stream the peer opened, with its conversation ready to run. */
  onStream?: (c: FramedConnection) => void;
  /** Unread stream bytes above which the connection stops reading (default MUX_HIGH_WATER;
   * reading resumes below half of it). A session on lanes gives each a share (`laneWindow`). */
  window?: number;
  /** The window this connection's session shares with its other connections (lanes). */
  session?: SessionWindow;
  /** Stream bytes one MUX frame carries at most when a writer hands over several frames at
   * once (default MUX_FRAME_DATA): a sender cutting smaller DATA batches cuts its MUX frames to
   * match, so that the receiver assembles no frame larger than a batch (decisions §120). */
  frameData?: number;
}

/**
 * The unread stream bytes of one session's connections (a receiver's lanes), bounded together:
 * one connection's window each let four busy lanes hold four windows of DATA when the receiver
 * was the slower side (decisions §82). A connection stops reading when the session's unread
 * bytes exceed `bytes` and some of them are its own. One with nothing unread stops too, but only
 * while every stream holding unread bytes has a DATA batch at its front waiting for a write slot
 * (`waitingForSlot`): those drain by writes in progress, never by a peer, so stopping the idle
 * lanes then only delays them, and eight lanes no longer each read a batch to wait beside the
 * others (decisions §119). Otherwise it always reads: a conversation of its own may need its next
 * frame while the other lanes' bytes wait on something that is not local work (§82). (Within one
 * connection, as before §82, a stream's reader may wait behind another stream's unread bytes.)
 */
export class SessionWindow {
  readonly members = new Set<Multiplexer>();
  /** Members stopped while holding nothing unread: they read again as soon as the session holds
   * bytes that are not waiting for write slots, or is under half its window. */
  readonly idleStopped = new Set<Multiplexer>();

  constructor(readonly bytes: number = MUX_HIGH_WATER) {}

  /** Unread stream bytes of every connection of the session. */
  unread(): number {
    let total = 0;
    for (const m of this.members) total += m.unread;
    return total;
  }

  /** Whether every unread byte of the session waits behind a batch waiting for a write slot. */
  waitsOnlyForWrites(): boolean {
    for (const m of this.members) if (!m.waitsOnlyForWrites()) return false;
    return true;
  }

  /** Whether the session's window binds a connection holding `own` unread bytes. */
  binds(own: number, ratio = 1): boolean {
    if (this.members.size < 2 || this.unread() <= this.bytes * ratio) return false;
    return own > 0 || this.waitsOnlyForWrites();
  }

  /** A member received bytes: once the session is over its window, every other member holding
   * unread bytes of its own stops reading too, now rather than at its own next MUX frame. Each
   * member used to ask only when it delivered, so one that delivered while the session was under
   * the window read on while the others filled it: four busy lanes each assembled their next
   * DATA batch behind the one waiting for a write slot, fourteen 2 MiB frame buffers in one
   * receiver where the window allows eight (decisions §116). */
  filled(from: Multiplexer): void {
    if (this.members.size < 2 || this.unread() <= this.bytes) return;
    const idleToo = this.waitsOnlyForWrites();
    for (const m of this.members) if (m !== from) m.stopForSession(idleToo);
  }

  /** A member's reader put a batch back to wait for a write slot: if the session is over its
   * window and now waits only for writes, the members holding nothing stop as well. */
  parked(): void {
    if (this.members.size < 2 || this.unread() <= this.bytes || !this.waitsOnlyForWrites()) return;
    for (const m of this.members) m.stopForSession(true);
  }

  /** A member's reader took bytes: members paused by the session's window may read again. */
  drained(from: Multiplexer): void {
    for (const m of this.members) if (m !== from) m.maybeResume(true);
  }

  /** Bytes arrived for a stream that is not waiting for a write slot: the members stopped while
   * holding nothing read again (what they wait behind is no longer only local work). */
  arrivedUnparked(): void {
    for (const m of [...this.idleStopped]) m.maybeResume(true);
  }
}

/** Each connection's window when a session runs on `connections` of them: MUX_HIGH_WATER for
 * the session, never under one stream's high-water mark per connection. Each lane reads ahead
 * on its own, so four lanes with the whole window each could hold four times the data
 * (decisions §70). */
export function laneWindow(connections: number): number {
  return Math.max(STREAM_HIGH_WATER, Math.floor(MUX_HIGH_WATER / Math.max(1, connections)));
}

/** Bytes of stream data one MUX frame carries when a stream's writer hands over several frames
 * at once: one DATA batch and its headers (content-send.ts, BATCH_BUFFER), so the whole MUX
 * frame fits a buffer of the receiver's frame pool (FRAME_POOL_BUFFER). Two batches in one MUX
 * frame would save nothing and make the receiver allocate a buffer of some odd size up to 4 MiB,
 * which its pool cannot reuse (decisions §71). */
export const MUX_FRAME_DATA = muxFrameData(FRAME_POOL_BUFFER);

/** MUX_FRAME_DATA for a sender whose DATA batches fit buffers of `batchBuffer` bytes
 * (content-send.ts, `batchBuffer`): the whole MUX frame fits a receiver's frame buffer of that
 * size (frames.ts: FRAME_POOL_BUFFER, FRAME_POOL_SMALL_BUFFER). */
export function muxFrameData(batchBuffer: number): number {
  return batchBuffer - 32;
}

/** `parts` (one stream's pending writes, in order) grouped into MUX frames of at most `limit`
 * (MUX_FRAME_DATA, or MultiplexerOptions.frameData) bytes, cut only between the stream's own frames: a frame cut across MUX frames
 * costs the receiver a copy, where a whole one is decoded in the MUX frame's pooled buffer
 * (decisions §70). A frame is a FRAME_HEADER-byte part and the parts its length covers
 * (FramedConnection.sendParts writes them so); a frame larger than the limit goes alone. Parts
 * that do not parse as frames are still written in order: grouping only decides where MUX
 * frames are cut, never what the stream carries. No parts: one empty group (FIN). */
export function muxGroups(parts: Buffer[], limit = MUX_FRAME_DATA): Buffer[][] {
  const groups: Buffer[][] = [];
  let group: Buffer[] = [];
  let bytes = 0;
  for (let i = 0; i < parts.length; ) {
    let j = i + 1;
    let n = parts[i].length;
    if (n === FRAME_HEADER) {
      // The length counts the type byte, which the header part already holds.
      let body = parts[i].readUInt32LE(0) - (FRAME_HEADER - 4);
      for (; body > 0 && j < parts.length; j++) {
        body -= parts[j].length;
        n += parts[j].length;
      }
    }
    // An empty part never starts a MUX frame of its own: alone, that frame would read as FIN.
    if (group.length > 0 && n > 0 && bytes + n > limit) {
      groups.push(group);
      group = [];
      bytes = 0;
    }
    for (; i < j; i++) group.push(parts[i]);
    bytes += n;
  }
  groups.push(group);
  return groups;
}

/** The streams of one physical connection (TCP, TLS, ssh stdio, a QUIC stream, a pipe). */
export class Multiplexer {
  private readonly streams = new Map<number, MuxStream>();
  /** Opener: ids given out so far (1..opened). */
  private opened = 0;
  /** Acceptor: ids the peer opened so far (its streams' first frames may arrive in any order). */
  private readonly seen = new Set<number>();
  /** Streams this side dropped while the peer still had them open: a file that failed alone
   * spends its stream, and the opener replaces it with a fresh id. Each large file is begun
   * once, so this is bounded by the tree's large files. */
  private spent = 0;
  private over = false;
  /** See MultiplexerOptions.window. */
  private window: number;

  constructor(
    readonly parent: FramedConnection,
    private readonly o: MultiplexerOptions,
  ) {
    this.window = o.window ?? MUX_HIGH_WATER;
    o.session?.members.add(this);
    parent.attachMux({
      deliver: (payload, release) => this.deliver(payload, release),
      buffered: () => this.over,
      closeAll: (why) => this.closeAll(why),
    });
  }

  /** Change the window (a session learns how many lanes it has after its first connection). */
  setWindow(bytes: number): void {
    this.window = bytes;
    // Paused: resume if the new window allows (below half of it); else pause at the next read.
    if (this.over) this.maybeResume();
    else this.over = this.isOver();
  }

  /** Opener: a new stream and the conversation on it. */
  open(): FramedConnection {
    if (!this.o.opener) throw new Error('only the opener opens streams');
    if (this.streams.size >= MUX_MAX_STREAMS) throw new Error(`at most ${MUX_MAX_STREAMS} streams at once per connection`);
    return this.start(++this.opened);
  }

  private start(id: number): FramedConnection {
    const s = new MuxStream(this, id);
    this.streams.set(id, s);
    s.conn = new FramedConnection(s, 0, {
      parent: this.parent,
      onConsume: () => this.maybeResume(),
      // A batch put back may let the session stop its idle lanes; one taken or dropped, wake them.
      onPark: (parked) => (parked ? this.o.session?.parked() : this.maybeResume()),
    });
    return s.conn;
  }

  /** One MUX frame from the peer. Throws a protocol error for a frame no honest peer sends. */
  private deliver(payload: Buffer, release?: () => void): void {
    try {
      if (payload.length < ID_BYTES) throw protocolError(`MUX frame of ${payload.length} bytes has no stream id`);
      const id = payload.readUInt32LE(0);
      let s = this.streams.get(id);
      if (!s) {
        if (this.o.opener ? id >= 1 && id <= this.opened : this.seen.has(id)) return; // a stream already closed: late bytes are dropped
        if (this.o.opener) throw protocolError(`MUX frame for stream ${id}, which this side never opened`);
        // Ids beyond the window replace spent streams only; that also keeps the streams open at
        // once within the window (checked anyway).
        const maxIds = MUX_MAX_STREAMS + this.spent;
        if (id < 1 || id > maxIds) throw protocolError(`MUX frame opens stream ${id}; ids run from 1 to ${maxIds} (${MUX_MAX_STREAMS} + ${this.spent} spent)`);
        if (this.streams.size >= MUX_MAX_STREAMS) throw protocolError(`MUX frame opens stream ${id}; at most ${MUX_MAX_STREAMS} are open at once`);
        this.seen.add(id);
        const conn = this.start(id);
        s = this.streams.get(id)!;
        this.o.onStream?.(conn);
      }
      if (s.peerEnded) throw protocolError(`MUX frame on stream ${id} after the peer ended it`);
      if (payload.length === ID_BYTES) {
        s.peerEnded = true;
        s.push(null);
        return;
      }
      // A pooled frame buffer is lent to the stream: its reader gives it back to the
      // connection's pool with the frame it carries, or at once if it copies (FrameDecoder).
      const bytes = payload.subarray(ID_BYTES);
      if (release) {
        s.pushLent(bytes, release);
        release = undefined;
      } else {
        s.push(bytes);
      }
      if (!s.conn.waitingForSlot && this.o.session?.idleStopped.size) this.o.session.arrivedUnparked();
    } finally {
      release?.();
    }
    this.over = this.isOver();
    // Only a connection that is over can have taken the session over: one holding unread bytes
    // of its own stops at the session's window itself (`binds`), and one holding none added
    // nothing. So the session's bytes are counted again only then, not for every MUX frame.
    if (this.over) this.o.session?.filled(this);
  }

  /** The session is over its window (SessionWindow.filled, .parked): stop reading if some of
   * its unread bytes are ours, or, with `idleToo`, even if none are. The connection pauses at
   * once, not after its next read. */
  stopForSession(idleToo: boolean): void {
    if (this.over) return;
    if (this.unread === 0) {
      if (!idleToo) return;
      this.o.session?.idleStopped.add(this);
    }
    this.over = true;
    this.parent.pauseForMux();
  }

  /** Whether every stream of this connection holding unread bytes has a batch waiting for a
   * write slot at its front. */
  waitsOnlyForWrites(): boolean {
    for (const s of this.streams.values()) if (!s.conn.waitingForSlot && s.readableLength + s.conn.pendingBytes > 0) return false;
    return true;
  }

  /** Received stream bytes not yet taken by their conversations. */
  get unread(): number {
    let total = 0;
    for (const s of this.streams.values()) total += s.readableLength + s.conn.pendingBytes;
    return total;
  }

  private isOver(): boolean {
    let total = 0;
    for (const s of this.streams.values()) {
      const unread = s.readableLength + s.conn.pendingBytes;
      if (s.readableLength > STREAM_HIGH_WATER) return true;
      total += unread;
    }
    if (total > this.window) return true;
    if (this.o.session?.binds(total) !== true) return false;
    if (total === 0) this.o.session.idleStopped.add(this);
    return true;
  }

  /** A stream's reader took bytes: the connection may read again (below half of its window and,
   * holding unread bytes, of its session's). `fromSession`: asked by another connection of the
   * session, which does not pass the word on. */
  maybeResume(fromSession = false): void {
    if (this.over) {
      const own = this.unread;
      if (own < this.window / 2 && !this.o.session?.binds(own, 0.5)) {
        this.over = false;
        this.o.session?.idleStopped.delete(this);
        this.parent.maybeResume();
      } else if (own === 0) {
        // Stopped holding bytes, it holds none now: bytes arriving for a stream that does not
        // wait for a slot wake it at once, as they do a lane stopped holding none.
        this.o.session?.idleStopped.add(this);
      }
    }
    if (!fromSession) this.o.session?.drained(this);
  }

  /** Stream `id` writes `parts` (none: FIN); `cb` runs once the connection no longer
   * references them (docs/decisions.md §39: the writer may then reuse its buffers). */
  write(id: number, parts: Buffer[], cb: (e?: Error | null) => void): void {
    const head = Buffer.allocUnsafe(ID_BYTES);
    head.writeUInt32LE(id, 0);
    const groups = muxGroups(parts, this.o.frameData);
    let left = groups.length;
    let failed = false;
    const done = (e?: Error) => {
      if (failed) return;
      if (e) {
        failed = true;
        cb(e);
      } else if (--left === 0) cb();
    };
    // Not waiting for the connection's drain here: the stream's own writer waits until `cb`
    // (its high-water mark), which is the backpressure each stream needs.
    for (const g of groups) this.parent.sendParts(FrameType.MUX, [head, ...g], () => done(), false).catch((e: Error) => done(e));
  }

  forget(s: MuxStream): void {
    if (this.streams.get(s.id) !== s) return;
    this.streams.delete(s.id);
    if (!s.peerEnded) this.spent++;
    this.maybeResume();
  }

  /** The connection failed or closed: every stream's conversation ends with it. */
  private closeAll(why: Error): void {
    for (const s of [...this.streams.values()]) s.conn.failWith(why);
    // Its unread bytes no longer count against the session's other connections.
    this.o.session?.idleStopped.delete(this);
    if (this.o.session?.members.delete(this)) this.o.session.drained(this);
  }
}
