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

/** The level the session starts at, from the configured one and the connection's handshake
 * time (undefined: not measured, e.g. an ssh channel). Never below `base`; 0 stays 0. */
export function startLevel(base: number, handshakeMs: number | undefined): number {
  if (base <= 0 || handshakeMs === undefined || handshakeMs < REMOTE_HANDSHAKE_MS) return base;
  return Math.max(base, handshakeMs >= WAN_HANDSHAKE_MS ? WAN_START_LEVEL : REMOTE_START_LEVEL);
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

  /** `base`: the configured level (0 = no compression, never adapted), the floor; `adapt`
   * false pins it; `start`: where an adapting session begins (`startLevel`); `now`: the
   * clock (tests drive it). */
  constructor(
    readonly base: number,
    readonly adapt = true,
    start = base,
    private readonly now: () => number = () => performance.now(),
  ) {
    this.cur = adapt && base > 0 ? Math.min(MAX_ADAPT_LEVEL, Math.max(base, start)) : base;
    this.start = this.cur;
    this.since = now();
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
    const rate = (this.bytes / span) * 1000;
    if (++this.calm >= CEILING_WINDOWS) {
      this.calm = 0;
      this.ceiling = Math.min(MAX_ADAPT_LEVEL, this.ceiling + 1);
    }
    const warming = !this.warm;
    this.warm = true;
    const slow = this.encMs > 0.35 * span && this.encMs > this.sendMs;
    const confirmed = slow && this.slowBefore;
    this.slowBefore = slow && !warming;
    if (slow) {
      // Compression is the bottleneck: the pipeline waits for it more than for the socket
      // (whose buffer hides short waits, so only a large share counts). Back off once a
      // second window in a row says so, faster when it stalls the pipe badly.
      if (confirmed) {
        const floor = this.pushedBack || this.sentBytes >= BUFFER_GRACE_BYTES ? this.base : this.start;
        if (this.cur > floor) this.ceiling = this.cur - 1;
        this.calm = 0;
        this.cur = Math.max(floor, this.cur - (this.encMs > 0.7 * span ? 2 : 1));
        this.slowBefore = false;
      }
    } else if (this.sendMs > 0.5 * span && this.encMs < 0.25 * this.sendMs && rate < LEVEL_FAST_LINK) {
      this.pushedBack = true;
      // The socket is the bottleneck and the encoder mostly idles: spend its time on ratio.
      const step = this.encMs < 0.05 * this.sendMs && this.cur < 6 ? 2 : 1;
      const cap = rate < SLOW_LINK ? this.ceiling : Math.min(this.ceiling, FAST_CAP_LEVEL);
      this.cur = Math.max(this.cur, Math.min(cap, this.cur + step));
    }
    this.restartWindow();
  }
}
