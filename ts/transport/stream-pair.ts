// Byte streams for transports Node does not give us as one socket: an in-memory pipe pair
// (a local `sync`, its lanes) and a readable/writable pair joined into one Duplex (ssh's
// stdio on both ends). Both honour the transport ownership rule (docs/decisions.md §39):
//
//   A write's callback fires only once the transport no longer references the written
//   bytes: the writer may then reuse the buffer (the send paths release pooled batch
//   buffers there). A chunk a reader receives is the reader's: nothing writes into it later
//   (a chunk lent by an in-memory pipe, until the reader gives it back: `takeLent`).
//
// TCP, TLS and QUIC honour it already: net.Socket calls back after libuv wrote the bytes
// (the request keeps the buffer until then); TLSSocket after SSL_write copied the
// cleartext (or parked it in its own copy) and the records were written; QuicStreamDuplex
// after quinn copied the bytes into its send buffer (write_all resolved). Their reads
// return a fresh buffer each time. `Duplex.from({ readable, writable })` does NOT: it
// calls back as soon as the inner `write()` returns true, while the chunk may still sit,
// uncopied, in the inner stream's write queue.

import { FramePoolUser } from '../protocol/frames.js';
import { Duplex, finished, type Readable, type Writable } from 'node:stream';
import { readIntoStaticBuffer, type StaticReadable } from './static-reads.js';

type Callback = (e?: Error | null) => void;

function epipe(): Error {
  return Object.assign(new Error('write to a pipe whose reading end is closed'), { code: 'EPIPE' });
}

/** Writes of at least this many bytes (and at most one pool buffer) go through the frame pool
 * and are lent to the reader. Half a pool buffer: a lent write holds a whole one until its
 * frames are released, so smaller ones would hold many times their bytes; and its decoder hands
 * frames this large out in place (FrameDecoder.POOLED_MIN is lower). */
const LEND_MIN = 1024 * 1024;

/** One end of `pipePair()`: what it writes is copied into the other end's read buffer. */
class PipeEnd extends Duplex {
  peer!: PipeEnd;
  /** Our last write's callback, held while the peer's read buffer is full (its bytes are
   * already copied: holding it is backpressure, not ownership). */
  private held: Callback | undefined;
  /** End of stream was pushed to our readable (the peer finished or went away). */
  private eof = false;
  /** Chunks the peer lent us, each with what gives its buffer back: our reader takes it with
   * the chunk (`takeLent`, as from a multiplexed stream: FramedConnection.onData). */
  private readonly lent = new WeakMap<Buffer, () => void>();
  /** Where our large writes' buffers come from. */
  private readonly pool = new FramePoolUser();

  constructor(highWaterMark: number) {
    super({ readableHighWaterMark: highWaterMark });
  }

  // A write (a frame's header and payload parts, corked together by FramedConnection: one
  // `_writev`) is copied once, joined. A large one is joined into a buffer of the process's
  // frame pool and lent to the reader: its decoder finds whole frames and hands them out
  // without a copy of its own, and the buffer goes back to the pool with the last of them
  // released. Written part by part into fresh buffers, as before, each frame cost two copies
  // into fresh memory (the pipe's, then the decoder's joining header and payload), each
  // page-faulting: ~25 ms of the JS thread for a 22 MB tree (decisions §102). A large joined
  // copy is not left to the garbage collector (a 1 GiB local sync's frames, kept until their
  // data was written, outlived the minor GCs and piled up in the old generation: 1.1 GB
  // resident): the pool takes it back. Writes too small to lend, or larger than a pool buffer,
  // are copied into fresh memory and paced as garbage by their reader, as a socket's reads.
  override _write(chunk: Buffer, _enc: BufferEncoding, cb: Callback): void {
    this.deliver([chunk], cb);
  }

  override _writev(chunks: { chunk: Buffer }[], cb: Callback): void {
    this.deliver(
      chunks.map((c) => c.chunk),
      cb,
    );
  }

  private deliver(parts: Buffer[], cb: Callback): void {
    const peer = this.peer;
    if (peer.destroyed || peer.eof) return cb(epipe());
    let ok = true;
    // Writes queued behind a held callback reach us together, several frames in one `_writev`:
    // cut into runs of whole writes that fit one pool buffer, each lent (or, small, copied).
    const size = this.pool.size;
    for (let i = 0; i < parts.length; ) {
      let j = i;
      let n = 0;
      while (j < parts.length && (j === i || n + parts[j]!.length <= size)) n += parts[j++]!.length;
      // (Buffer.concat copies into allocUnsafe memory: no zero-fill first, §83.)
      ok = peer.push(n >= LEND_MIN && n <= size ? this.lend(parts, i, j, n) : Buffer.concat(parts.slice(i, j), n));
      i = j;
    }
    if (ok) cb();
    else this.held = cb; // released by the peer's next _read
  }

  /** `parts[i..j)` (`n` bytes) joined into a pool buffer, registered with the peer as lent. */
  private lend(parts: Buffer[], i: number, j: number, n: number): Buffer {
    const pool = this.pool;
    const b = pool.take(n);
    for (let k = i, at = 0; k < j; at += parts[k]!.length, k++) b.set(parts[k]!, at);
    const view = b.subarray(0, n);
    let given = false;
    this.peer.lent.set(view, () => {
      if (given) return;
      given = true;
      pool.release(b);
    });
    return view;
  }

  /** The reader's side: what gives `chunk`'s buffer back, if it was lent (once). */
  takeLent(chunk: Buffer): (() => void) | undefined {
    const r = this.lent.get(chunk);
    if (r) this.lent.delete(chunk);
    return r;
  }

  override _read(): void {
    const cb = this.peer.held;
    if (cb) {
      this.peer.held = undefined;
      cb();
    }
  }

  override _final(cb: Callback): void {
    this.peer.end_();
    cb();
  }

  /** The peer will write no more: end of stream on our readable (once). */
  private end_(): void {
    if (this.eof || this.destroyed) return;
    this.eof = true;
    this.push(null);
  }

  override _destroy(err: Error | null, cb: Callback): void {
    // Like a socket's close: the peer reads what we already sent, then end of stream; its
    // later writes fail (EPIPE). Callbacks held for backpressure are released.
    this.pool.dispose();
    const mine = this.held;
    this.held = undefined;
    mine?.();
    this.peer.end_();
    const theirs = this.peer.held;
    this.peer.held = undefined;
    theirs?.();
    cb(err);
  }
}

/**
 * Two connected in-memory Duplex ends: bytes written to one are read from the other.
 * Each write is copied once, synchronously, so its callback (fired then, or when the
 * reader drained its buffer below `highWaterMark`) leaves the writer's buffer free; a large
 * one into a pooled buffer lent to the reader.
 */
export function pipePair(highWaterMark = 4 * 1024 * 1024): [Duplex, Duplex] {
  const a = new PipeEnd(highWaterMark);
  const b = new PipeEnd(highWaterMark);
  a.peer = b;
  b.peer = a;
  return [a, b];
}

/** `readable` and `writable` (a child's stdout and stdin, our own stdin and stdout) as one
 * Duplex whose write callbacks are the inner writable's own (fired once the bytes left). */
class JoinedStreams extends Duplex implements StaticReadable {
  private finalCb: Callback | undefined;
  /** The readable side reads into a static buffer and its reads go straight to their reader,
   * not through this stream's buffer: pause() and resume() act on it directly. */
  private direct = false;

  constructor(
    private readonly r: Readable,
    private readonly w: Writable,
  ) {
    super();
    r.on('data', (chunk: Buffer) => {
      if (!this.push(chunk)) r.pause();
    });
    r.on('end', () => this.push(null));
    finished(r, (err) => {
      if (err) this.destroy(err);
    });
    finished(w, { readable: false }, (err) => {
      const cb = this.finalCb;
      this.finalCb = undefined;
      if (cb) cb(err);
      else if (err) this.destroy(err);
    });
  }

  override _read(): void {
    this.r.resume();
  }

  readIntoStaticBuffer(onRead: (chunk: Buffer) => void): boolean {
    if (!readIntoStaticBuffer(this.r, onRead)) return false;
    this.direct = true;
    return true;
  }

  override pause(): this {
    if (this.direct) this.r.pause();
    return super.pause();
  }

  override resume(): this {
    if (this.direct) this.r.resume();
    return super.resume();
  }

  override _write(chunk: Buffer, enc: BufferEncoding, cb: Callback): void {
    this.w.write(chunk, enc, cb);
  }

  override _writev(chunks: { chunk: Buffer; encoding: BufferEncoding }[], cb: Callback): void {
    // Callbacks fire in write order: the last one means every chunk left.
    this.w.cork();
    chunks.forEach((c, i) => this.w.write(c.chunk, c.encoding, i === chunks.length - 1 ? cb : undefined));
    this.w.uncork();
  }

  override _final(cb: Callback): void {
    if (this.w.writableFinished) return cb();
    this.finalCb = cb;
    this.w.end();
  }

  override _destroy(err: Error | null, cb: Callback): void {
    this.r.destroy();
    this.w.destroy();
    this.finalCb = undefined;
    cb(err);
  }
}

/** One Duplex over a separate readable and writable; unlike `Duplex.from({ readable,
 * writable })`, a write calls back only once the inner writable is done with the bytes. */
export function joinStreams(readable: Readable, writable: Writable): Duplex {
  return new JoinedStreams(readable, writable);
}
