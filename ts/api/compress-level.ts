// The zstd level of each batch, adapted to the link during the session (as `zstd --adapt`
// does): the sender's pipeline encodes batches ahead while earlier ones go to the socket, so
// time spent waiting says which side is the bottleneck. When the socket holds the sender back
// (the encoder idles) on a link slower than LEVEL_FAST_LINK, compressing harder costs nothing
// and saves wire bytes: the level goes up. When the sender waits for encoded batches, the
// level goes down (never below the configured one). Loopback and fast links stay at the
// configured level, so compression never becomes their bottleneck.
//
// Where the session starts matters as much: the kernel's socket buffers (and any queue on
// the path) take the first megabytes at memory speed, so backpressure shows only after
// them, and on an artifact tree of 20 MB that is much of the session. The connection's
// handshake time bounds the RTT from above (every transport waits at least one round
// trip), and a link with a long round trip is beyond the host and its LAN: there the
// session starts at zstd's own default level or higher (`startLevel`), and the governor
// climbs from there, or lowers it within a few batches if that makes compression the
// bottleneck.
//
// A receiver that reports what it has read (DELIVERED, §4.16) removes the guesswork: bytes
// written but not yet read, over the rate it reads them, is the queue in front of the link.
// Once that says the link is the bottleneck, the encoder's own stalls do not lower the level
// (a faster encoder would only fill the queue sooner) and the level climbs while the encoder
// still produces faster than the link drains; once it says the link keeps pace, the start is
// no longer protected and the encoder's stalls lower the level at once (a 1 Gbit/s link).

import { nowMs } from '../utils/clock.js';
import type { FramedConnection } from '../transport/connection.js';
import { DeliveryMeter, type LinkSample, type LinkSignal } from '../transport/delivery.js';
import { Capability } from '../protocol/messages.js';

/** Highest level the governor reaches (zstd's slowest levels, on a slow link only). */
export const MAX_ADAPT_LEVEL = 19;
/** Above this wire rate (bytes/s, ~320 Mbit/s) the level never rises: zstd's fast levels
 * already keep up and CPU time is worth more than the bytes. */
export const LEVEL_FAST_LINK = 40e6;
/** A verdict needs this many batches and milliseconds of evidence. */
const WINDOW_BATCHES = 2;
const WINDOW_MS = 20;
const CEILING_WINDOWS = 8;
/** Handshake times (ms) that mean a link beyond the host and its LAN (there, TCP and TLS take
 * well under a millisecond of network, plus a few of CPU), and a wide-area one. */
export const REMOTE_HANDSHAKE_MS = 10;
export const WAN_HANDSHAKE_MS = 25;
/** The first level on such links: zstd's default (rsync -z's too), which compresses faster
 * than 1 Gbit/s on one core; and on a wide-area link, where one TCP connection rarely gets
 * more than a few hundred Mbit/s, a level whose ratio is worth ~10% fewer bytes on a
 * release tree. The governor lowers either within a few batches if compression turns out
 * to be the bottleneck (its downward signal, the encoder's own stalls, is immediate), and
 * climbs from them when the link is slower. */
export const REMOTE_START_LEVEL = 3;
export const WAN_START_LEVEL = 6;
/** Above this wire rate (bytes/s, ~32 Mbit/s) the level stays at or below FAST_CAP_LEVEL: the
 * slower levels (btlazy2 and up) compress under ~15 MB/s a core, and a batch already
 * encoding at such a level stalls the pipe when the link turns out faster. */
export const SLOW_LINK = 4e6;
export const FAST_CAP_LEVEL = 9;
/** Until the socket has pushed back once, its buffers (a few MiB in the kernel on each side,
 * plus the path's queues) take data at memory speed and every link looks faster than the
 * encoder: for this many wire bytes the level does not go below where the session started. */
export const BUFFER_GRACE_BYTES = 4 << 20;
/** With delivery reports: more queue than this (ms to drain at the delivery rate) means the
 * link is the bottleneck. Above a report's lag (≤ 50 ms + one way) and a busy receiver's
 * hiccups; far below the seconds of queue a slow link builds behind the socket buffers. */
export const LINK_QUEUE_MS = 250;
/** The level goes past FAST_CAP_LEVEL on a slow delivery rate only once the rate was taken over
 * this long (TCP's slow start makes the first reports look slower than the link). */
const SLOW_LINK_EVIDENCE_MS = 500;
/** A peer that negotiated reports but sent none by this many bytes: back to the sender's own
 * signals (BUFFER_GRACE_BYTES). */
const REPORT_WAIT_BYTES = 16 << 20;

/** The level the session starts at, from the configured one and the connection's handshake
 * time (undefined: not measured, e.g. an ssh channel). Never below `base`; 0 stays 0. */
export function startLevel(base: number, handshakeMs: number | undefined): number {
  if (base <= 0 || handshakeMs === undefined || handshakeMs < REMOTE_HANDSHAKE_MS) return base;
  return Math.max(base, handshakeMs >= WAN_HANDSHAKE_MS ? WAN_START_LEVEL : REMOTE_START_LEVEL);
}

export interface GovernorOptions {
  /** The clock (tests drive it). */
  now?: () => number;
  /** The receiver's delivery reports (absent: a peer without the DELIVERY capability). */
  link?: LinkSignal;
}

export class LevelGovernor {
  private cur: number;
  private encMs = 0;
  private sendMs = 0;
  private bytes = 0;
  private batches = 0;
  private since: number;
  /** The first window fills an empty pipeline: every batch waits for its encoding then,
   * whatever the link, so it says nothing against the level. */
  private warm = false;
  /** The previous window found compression the bottleneck: a second one in a row lowers
   * the level (one alone is often a pipeline still filling, or a burst of small files). */
  private slowBefore = false;
  private readonly start: number;
  private sentBytes = 0;
  private pushedBack = false;
  /** The level just below the last one that stalled the pipe: not exceeded for a while
   * (rises by one every CEILING_WINDOWS windows), so the level settles instead of swinging. */
  private ceiling = MAX_ADAPT_LEVEL;
  private calm = 0;

  private readonly now: () => number;
  private readonly link: LinkSignal | undefined;

  /** `base`: the configured level (0 = no compression, never adapted), the floor; `adapt`
   * false pins it; `start`: where an adapting session begins (`startLevel`). */
  constructor(
    readonly base: number,
    readonly adapt = true,
    start = base,
    o: GovernorOptions = {},
  ) {
    this.now = o.now ?? nowMs;
    this.link = o.link;
    this.cur = adapt && base > 0 ? Math.min(MAX_ADAPT_LEVEL, Math.max(base, start)) : base;
    this.start = this.cur;
    this.since = this.now();
  }

  /** The level for the next batch to encode. */
  get level(): number {
    return this.cur;
  }

  /** Start of a phase whose waits are not the pipeline's (a new file's manifest exchange). */
  restartWindow(): void {
    this.encMs = this.sendMs = this.bytes = this.batches = 0;
    this.since = this.now();
  }

  /** One batch went out: `encodeWaitMs` waited for its encoding, `sendWaitMs` for the socket
   * (and --bwlimit) to take it; `wireBytes` its size. Waits of batches in flight at once
   * (small-file batches beside large files' streams) add up, so they are compared with
   * each other, and with the window's span only to tell a real stall from noise. */
  observe(encodeWaitMs: number, sendWaitMs: number, wireBytes: number): void {
    if (!this.adapt || this.base <= 0) return;
    this.encMs += encodeWaitMs;
    this.sendMs += sendWaitMs;
    this.bytes += wireBytes;
    this.sentBytes += wireBytes;
    this.batches++;
    const span = this.now() - this.since;
    if (this.batches < WINDOW_BATCHES || span < WINDOW_MS) return;
    const out = (this.bytes / span) * 1000;
    const link = this.link?.sample();
    // The link's rate: what the receiver reads, when it says; else what the socket took.
    const rate = link ? link.rate : out;
    const linkBound = link !== undefined && link.queueMs > LINK_QUEUE_MS;
    if (++this.calm >= CEILING_WINDOWS) {
      this.calm = 0;
      this.ceiling = Math.min(MAX_ADAPT_LEVEL, this.ceiling + 1);
    }
    const warming = !this.warm;
    this.warm = true;
    const slow = !linkBound && this.encMs > 0.35 * span && this.encMs > this.sendMs;
    const confirmed = slow && this.slowBefore;
    this.slowBefore = slow && !warming;
    const socketBound = this.sendMs > 0.5 * span && this.encMs < 0.25 * this.sendMs;
    if (slow) {
      // Compression is the bottleneck: the pipeline waits for it more than for the socket
      // (whose buffer hides short waits, so only a large share counts). Back off once a
      // second window in a row says so, faster when it stalls the pipe badly.
      if (confirmed) {
        const floor = this.mayLeaveStart(link) ? this.base : this.start;
        if (this.cur > floor) this.ceiling = this.cur - 1;
        this.calm = 0;
        this.cur = Math.max(floor, this.cur - (this.encMs > 0.7 * span ? 2 : 1));
        this.slowBefore = false;
      }
    } else if (rate < LEVEL_FAST_LINK && (linkBound ? socketBound || out > 1.25 * link.rate : socketBound)) {
      this.pushedBack = true;
      // The link is the bottleneck and the encoder has time to spare: spend it on ratio.
      const idle = (socketBound && this.encMs < 0.05 * this.sendMs) || (linkBound && out > 2.5 * link.rate);
      const step = idle && this.cur < 6 ? 2 : 1;
      const slowLink = rate < SLOW_LINK && (!link || link.spanMs >= SLOW_LINK_EVIDENCE_MS);
      const cap = slowLink ? this.ceiling : Math.min(this.ceiling, FAST_CAP_LEVEL);
      this.cur = Math.max(this.cur, Math.min(cap, this.cur + step));
    }
    this.restartWindow();
  }

  /** May the level go below where the session started? Once the receiver's reports say the
   * link keeps pace (they are the evidence); without reports, once the socket pushed back or
   * the kernel's buffers must be full; while reports are due but not yet in, not. */
  private mayLeaveStart(link: LinkSample | undefined): boolean {
    if (link || this.pushedBack) return true;
    if (this.link && this.sentBytes < REPORT_WAIT_BYTES) return false;
    return this.sentBytes >= BUFFER_GRACE_BYTES;
  }
}

/** The session's delivery meter, if the receiver negotiated DELIVERY (it then reports). */
export function deliveryMeter(conn: FramedConnection, negotiated: { capabilities: number }): DeliveryMeter | undefined {
  if (!(negotiated.capabilities & Capability.DELIVERY)) return undefined;
  const meter = new DeliveryMeter();
  meter.add(conn);
  return meter;
}
