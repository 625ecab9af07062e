// The zstd level of each batch, adapted to the link during the session (as `zstd --adapt`
// does): the sender's pipeline encodes batches ahead while earlier ones go to the socket, so
// time spent waiting says which side is the bottleneck. When the socket holds the sender back
// (the encoder idles) on a link slower than LEVEL_FAST_LINK, compressing harder costs nothing
// and saves wire bytes: the level goes up. When the sender waits for encoded batches, the
// level goes down (never below the configured one). Loopback and fast links stay at the
// configured level, so compression never becomes their bottleneck.

/** Highest level the governor reaches (zstd's slowest levels, on a slow link only). */
export const MAX_ADAPT_LEVEL = 19;
/** Above this wire rate (bytes/s, ~320 Mbit/s) the level never rises: zstd's fast levels
 * already keep up and CPU time is worth more than the bytes. */
export const LEVEL_FAST_LINK = 40e6;
/** A verdict needs this many batches and milliseconds of evidence. */
const WINDOW_BATCHES = 2;
const WINDOW_MS = 20;
const CEILING_WINDOWS = 8;

export class LevelGovernor {
  private cur: number;
  private encMs = 0;
  private sendMs = 0;
  private bytes = 0;
  private batches = 0;
  private since = performance.now();
  /** The level just below the last one that stalled the pipe: not exceeded for a while
   * (rises by one every CEILING_WINDOWS windows), so the level settles instead of swinging. */
  private ceiling = MAX_ADAPT_LEVEL;
  private calm = 0;

  /** `base`: the configured level (0 = no compression, never adapted); `adapt` false pins it. */
  constructor(
    readonly base: number,
    readonly adapt = true,
  ) {
    this.cur = base;
  }

  /** The level for the next batch to encode. */
  get level(): number {
    return this.cur;
  }

  /** Start of a phase whose waits are not the pipeline's (a new file's manifest exchange). */
  restartWindow(): void {
    this.encMs = this.sendMs = this.bytes = this.batches = 0;
    this.since = performance.now();
  }

  /** One batch went out: `encodeWaitMs` waited for its encoding, `sendWaitMs` for the socket
   * (and --bwlimit) to take it; `wireBytes` its size. */
  observe(encodeWaitMs: number, sendWaitMs: number, wireBytes: number): void {
    if (!this.adapt || this.base <= 0) return;
    this.encMs += encodeWaitMs;
    this.sendMs += sendWaitMs;
    this.bytes += wireBytes;
    this.batches++;
    const span = performance.now() - this.since;
    if (this.batches < WINDOW_BATCHES || span < WINDOW_MS) return;
    const rate = (this.bytes / span) * 1000;
    if (++this.calm >= CEILING_WINDOWS) {
      this.calm = 0;
      this.ceiling = Math.min(MAX_ADAPT_LEVEL, this.ceiling + 1);
    }
    if (this.encMs > 0.35 * span) {
      // Compression is the bottleneck (the kernel's socket buffer hides short waits, so
      // only a large share counts): back off, faster when it stalls the pipe badly.
      if (this.cur > this.base) this.ceiling = this.cur - 1;
      this.calm = 0;
      this.cur = Math.max(this.base, this.cur - (this.encMs > 0.7 * span ? 2 : 1));
    } else if (this.sendMs > 0.5 * span && this.encMs < 0.1 * span && rate < LEVEL_FAST_LINK) {
      // The socket is the bottleneck and the encoder idles: spend its time on ratio.
      const step = this.encMs < 0.02 * span && this.cur < 6 ? 2 : 1;
      this.cur = Math.max(this.cur, Math.min(this.ceiling, this.cur + step));
    }
    this.restartWindow();
  }
}
