// Recycled large buffers. Touching fresh memory costs a page fault per 4 KiB, which on
// some machines is slower than the work done with the bytes (measured: ~1.6 s per GiB on
// our CI VM); batches and frames therefore reuse a few buffers instead of allocating.

export class BufferPool {
  private readonly free: Buffer[] = [];
  private readonly waiters: ((b: Buffer) => void)[] = [];
  private created = 0;

  constructor(
    readonly size: number,
    /** Buffers `acquire` may create before it waits for a release. */
    readonly max: number,
  ) {}

  /** A buffer of `size` bytes; waits for a release once `max` are out. */
  acquire(): Promise<Buffer> {
    const b = this.free.pop();
    if (b) return Promise.resolve(b);
    if (this.created < this.max) {
      this.created++;
      return Promise.resolve(Buffer.allocUnsafeSlow(this.size));
    }
    return new Promise((resolve) => this.waiters.push(resolve));
  }

  /** A buffer of at least `n` bytes, now (allocating if none is free). */
  take(n: number): Buffer {
    const k = this.free.findIndex((b) => b.length >= n);
    if (k >= 0) return this.free.splice(k, 1)[0];
    this.created++;
    return Buffer.allocUnsafeSlow(Math.max(n, this.size));
  }

  release(b: Buffer): void {
    const w = this.waiters.shift();
    if (w) w(b);
    // A larger buffer `take` made for an odd request is not kept: what stays idle is then
    // at most `max` buffers of `size`, whatever sizes were asked for.
    else if (this.free.length < this.max && b.length === this.size) this.free.push(b);
  }

  /** Buffers made so far (`take` and `acquire`), reused ones not counted again. */
  get allocated(): number {
    return this.created;
  }

  /** Buffers kept for reuse now. */
  get idle(): number {
    return this.free.length;
  }

  /** Drop the buffers kept for reuse. */
  dropIdle(): void {
    this.free.length = 0;
  }
}

/** A copy of `chunk` in a buffer of its own, not zero-filled first: `Buffer.from` of a large
 * buffer allocates it zeroed and then copies, two passes over every byte a local sync moves
 * (79 ms of a 70 MB tree's 378 ms of CPU, decisions §83). */
export function copyOf(chunk: Uint8Array): Buffer {
  const b = Buffer.allocUnsafe(chunk.length);
  b.set(chunk);
  return b;
}
