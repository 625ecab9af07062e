// What the link really carries, from the receiver's DELIVERED reports (docs/protocol.md §4.16):
// the rate at which the peer reads our bytes, and how long the bytes we wrote but it has not
// yet read would take to drain at that rate. The kernel's socket buffers and the path's queues
// take the first megabytes of any session at memory speed, so the sender's own waits cannot
// tell a slow link from a fast one until they are full; the receiver's count can, within a
// few reports. One meter spans a session's connections (its lanes too).

import type { FramedConnection } from './connection.js';

/** The rate is taken over the reports of this last span (ms)... */
const RATE_SPAN_MS = 1000;
/** ...and needs at least this span of them before it says anything. */
const MIN_SPAN_MS = 100;
/** Fewer bytes in flight than this never make a queue (a few packets, a report's lag). */
const MIN_QUEUE_BYTES = 256 * 1024;

export interface LinkSample {
  /** Bytes per second the peer has been reading (over the last RATE_SPAN_MS of reports). */
  rate: number;
  /** Milliseconds the bytes in flight (sent, not yet reported read) take to drain at `rate`. */
  queueMs: number;
  /** Milliseconds of reports the rate was taken over (≤ RATE_SPAN_MS, a little more at most). */
  spanMs: number;
}

/** The link as the governor sees it; `sample` is undefined until the reports say something. */
export interface LinkSignal {
  sample(): LinkSample | undefined;
}

export class DeliveryMeter implements LinkSignal {
  private readonly conns: FramedConnection[] = [];
  /** (arrival time, bytes read in all) at each report, oldest first. */
  private readonly times: number[] = [];
  private readonly totals: number[] = [];
  private head = 0;
  private total = 0;

  /** Count `conn`'s reports too (the first connection, then each lane as it joins). */
  add(conn: FramedConnection): void {
    this.conns.push(conn);
    conn.onDeliveryReport((delta, at) => this.record(delta, at));
  }

  /** One report of `delta` more bytes read, arrived at `at` (exported for tests). */
  record(delta: number, at: number): void {
    this.total += delta;
    this.times.push(at);
    this.totals.push(this.total);
    // Keep the span the rate needs; drop older entries in bulk (O(1) amortized).
    while (this.head < this.times.length - 2 && at - this.times[this.head + 1] >= RATE_SPAN_MS) this.head++;
    if (this.head > 512) {
      this.times.splice(0, this.head);
      this.totals.splice(0, this.head);
      this.head = 0;
    }
  }

  /** Bytes written on the session's connections (frame headers included, as the peer counts). */
  private sent(): number {
    let n = 0;
    for (const c of this.conns) n += c.bytesSent;
    return n;
  }

  sample(): LinkSample | undefined {
    return linkSample(this.times, this.totals, this.head, this.sent(), this.total);
  }
}

/** The rate over the reports from `head` on, and the drain time of `sent − read` at it. */
export function linkSample(times: readonly number[], totals: readonly number[], head: number, sent: number, read: number): LinkSample | undefined {
  const last = times.length - 1;
  if (last - head < 1) return undefined;
  const span = times[last] - times[head];
  if (span < MIN_SPAN_MS) return undefined;
  const rate = ((totals[last] - totals[head]) / span) * 1000;
  const inFlight = Math.max(0, sent - read);
  const queueMs = inFlight < MIN_QUEUE_BYTES ? 0 : rate > 0 ? (inFlight / rate) * 1000 : Infinity;
  return { rate, queueMs, spanMs: span };
}
