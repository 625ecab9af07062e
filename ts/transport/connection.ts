// A framed, flow-controlled connection over any byte stream (TCP today; TLS and SSH
// stdio plug in the same way). Counts bytes on the wire in both directions, applies an
// idle timeout, and pauses the stream when too many frames wait to be consumed.

import type { Duplex } from 'node:stream';
import { ExitCode, FfsyncError } from '../utils/errors.js';
import { createGarbageRelief } from '../utils/gc.js';
import { encodeFrameHeader, type Frame, FrameDecoder, FrameType, frameName } from '../protocol/frames.js';
import { decodeError } from '../protocol/messages.js';

const HIGH_WATER = 4 * 1024 * 1024;
const LOW_WATER = 1024 * 1024;
/** How often a peer busy with local work proves it is alive. */
export const KEEPALIVE_MS = 5000;

export class PeerClosedError extends FfsyncError {
  constructor(detail: string) {
    super('EPEERCLOSED', ExitCode.PROTOCOL_STREAM, `connection closed by peer ${detail}`);
  }
}

export class FramedConnection {
  bytesSent = 0;
  /** An ERROR frame already went out: the peer knows why we stop. */
  errorSent = false;
  bytesReceived = 0;
  private readonly decoder = new FrameDecoder();
  private readonly queue: Frame[] = [];
  private queuedBytes = 0;
  private waiter: { resolve: (f: Frame) => void; reject: (e: Error) => void } | undefined;
  private failure: Error | undefined;
  private ended = false;
  private closed = false;
  private lastActivity = Date.now();
  /** When the frame now being received started arriving (0: none in progress). */
  private partialSince = 0;
  private drainWaiters = 0;
  private readonly relieve = createGarbageRelief();
  private readonly keepAliveMs: number;
  private idleTimer: NodeJS.Timeout | undefined;
  /** Woken on every arrival, end, close or failure (see `nextChange`). */
  private readonly changeWaiters = new Set<() => void>();
  /** The peer's first ERROR, decoded, kept apart from the queue: a reader that gave up (an
   * `expect` abandoned in a race) may take the queued frame. */
  private peerFailure: FfsyncError | undefined;

  constructor(
    private readonly stream: Duplex,
    idleTimeoutMs: number,
  ) {
    this.keepAliveMs = idleTimeoutMs > 0 ? Math.min(KEEPALIVE_MS, Math.max(50, Math.floor(idleTimeoutMs / 3))) : KEEPALIVE_MS;
    stream.on('data', (chunk: Buffer) => this.onData(chunk));
    stream.on('end', () => {
      this.ended = true;
      this.wake();
      this.wakeChangeWaiters();
    });
    stream.on('close', () => {
      this.ended = true;
      this.closed = true;
      this.wake();
      this.wakeChangeWaiters();
    });
    stream.on('error', (e: NodeJS.ErrnoException) => {
      this.fail(new FfsyncError(e.code ?? 'ESOCKET', ExitCode.SOCKET_IO, `connection error: ${e.message}`, { cause: e }));
    });
    // Plain TCP sockets are accepted paused (pauseOnConnect) so no byte is lost before
    // this point, and an explicitly paused stream does not resume on a 'data' listener.
    stream.resume();
    if (idleTimeoutMs > 0) {
      // Idle means: we wait for the peer (a frame or a drain) and nothing moved for
      // idleTimeoutMs. Peers doing long local work send KEEPALIVE frames.
      this.idleTimer = setInterval(() => {
        const waiting = this.waiter !== undefined || this.drainWaiters > 0;
        const now = Date.now();
        if (now - this.lastActivity > idleTimeoutMs && waiting) {
          this.fail(new FfsyncError('ETIMEDOUT', ExitCode.TIMEOUT, `peer sent nothing for ${Math.round(idleTimeoutMs / 1000)} s`));
        } else if (this.partialSince > 0 && now - this.partialSince > idleTimeoutMs) {
          // Bytes keep trickling in but no frame completes: as good as silent.
          this.fail(new FfsyncError('ETIMEDOUT', ExitCode.TIMEOUT, `peer trickles data: no frame completed in ${Math.round(idleTimeoutMs / 1000)} s`));
        }
      }, Math.min(1000, idleTimeoutMs));
      this.idleTimer.unref();
    }
  }

  private onData(chunk: Buffer): void {
    this.bytesReceived += chunk.length;
    this.relieve(chunk.length);
    this.lastActivity = Date.now();
    const frames: Frame[] = [];
    let bad: Error | undefined;
    try {
      this.decoder.push(chunk, frames);
    } catch (e) {
      bad = e as Error;
    }
    for (const f of frames) {
      if (f.type === FrameType.KEEPALIVE) continue; // only refreshes lastActivity
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
    if (this.queuedBytes > HIGH_WATER) this.stream.pause();
    this.wake();
    this.wakeChangeWaiters();
  }

  private fail(e: Error): void {
    if (!this.failure) this.failure = e;
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
    while (!finished && !this.failure && !this.closed) await Promise.race([w, this.nextChange()]);
  }

  private wake(): void {
    const w = this.waiter;
    if (!w) return;
    if (this.queue.length) {
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
    const f = this.queue.shift()!;
    this.queuedBytes -= f.payload.length;
    if (this.queuedBytes < LOW_WATER && this.stream.isPaused()) this.stream.resume();
    return f;
  }

  /** Next frame; rejects on close, stream error, protocol error or idle timeout. */
  recv(): Promise<Frame> {
    if (this.queue.length) return Promise.resolve(this.shift());
    if (this.failure) return Promise.reject(this.failure);
    if (this.ended) return Promise.reject(new PeerClosedError('before the session finished'));
    this.lastActivity = Date.now();
    return new Promise((resolve, reject) => {
      this.waiter = { resolve, reject };
    });
  }

  /**
   * Write one frame; resolves once the stream can take more (backpressure).
   * `onWritten` runs when the payload has been handed to the OS (its buffer may be reused).
   */
  send(type: FrameType, payload: Uint8Array = Buffer.alloc(0), onWritten?: () => void): Promise<void> {
    // After a local failure only an ERROR frame may still go out (to tell the peer why).
    if (this.failure && type !== FrameType.ERROR) return Promise.reject(this.failure);
    if (this.closed || this.stream.destroyed || this.stream.writableEnded) {
      return Promise.reject(new PeerClosedError(`before we could send ${frameName(type)}`));
    }
    const header = encodeFrameHeader(type, payload.length);
    this.bytesSent += header.length + payload.length;
    this.stream.cork();
    this.stream.write(header);
    const ok = this.stream.write(payload, onWritten && (() => onWritten()));
    this.stream.uncork();
    this.lastActivity = Date.now();
    if (ok) return Promise.resolve();
    this.drainWaiters++;
    return new Promise((resolve, reject) => {
      const onDrain = () => {
        cleanup();
        this.lastActivity = Date.now();
        resolve();
      };
      const onClose = () => {
        cleanup();
        reject(this.failure ?? new PeerClosedError(`while we were sending ${frameName(type)}`));
      };
      const cleanup = () => {
        this.drainWaiters--;
        this.stream.off('drain', onDrain);
        this.stream.off('close', onClose);
        this.stream.off('ffsync-failed', onClose);
      };
      this.stream.on('drain', onDrain);
      this.stream.on('close', onClose);
      this.stream.on('ffsync-failed', onClose);
    });
  }

  /** Flush and half-close; resolves when the peer has closed too (or after a grace period). */
  async close(graceMs = 2000): Promise<void> {
    if (this.idleTimer) clearInterval(this.idleTimer);
    if (this.closed || this.stream.destroyed) return;
    await new Promise<void>((resolve) => {
      const t = setTimeout(() => {
        this.stream.destroy();
        resolve();
      }, graceMs);
      t.unref();
      this.stream.once('close', () => {
        clearTimeout(t);
        resolve();
      });
      this.stream.end();
      this.stream.resume();
    });
  }

  /**
   * Run long local work (hashing, fsync) while telling the peer we are alive: a
   * KEEPALIVE frame every KEEPALIVE_MS (or a third of our own idle timeout, if shorter),
   * so the peer's idle timeout measures the network, not our disk.
   */
  async keepAlive<T>(work: Promise<T>): Promise<T> {
    const timer = setInterval(() => {
      if (!this.isClosed && !this.failure) void this.send(FrameType.KEEPALIVE).catch(() => undefined);
    }, this.keepAliveMs);
    try {
      return await work;
    } finally {
      clearInterval(timer);
    }
  }

  /**
   * After we reported an error: wait up to `ms` for the peer's own ERROR frame (discarding
   * anything else it still sends), e.g. its verdict on a chunk that failed our hash check
   * (a sender whose source changed says so). Undefined when the peer closed or stayed silent.
   */
  async awaitPeerError(ms: number): Promise<FfsyncError | undefined> {
    const deadline = Date.now() + ms;
    for (;;) {
      if (this.peerFailure) return this.peerFailure;
      // Nothing else will be read: drop it, so a paused stream resumes and the ERROR can come.
      while (this.queue.length) this.shift().release?.();
      const left = deadline - Date.now();
      if (this.ended || this.closed || left <= 0) return undefined;
      await this.nextChange(left);
    }
  }

  /** An ERROR frame the peer sent that is still queued (read before reporting our own). */
  takePeerError(): Frame | undefined {
    const k = this.queue.findIndex((f) => f.type === FrameType.ERROR);
    if (k < 0) return undefined;
    const f = this.queue.splice(k, 1)[0];
    this.queuedBytes -= f.payload.length;
    return f;
  }

  /** True once the underlying stream is gone (nothing more can be sent). */
  get isClosed(): boolean {
    return this.closed || this.stream.destroyed;
  }

  destroy(): void {
    if (this.idleTimer) clearInterval(this.idleTimer);
    this.stream.destroy();
  }
}
