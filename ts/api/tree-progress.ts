// A tree session reports the tree's phases: the walk, the roots' hashing, and one transfer
// phase (sending or receiving) over every file it moves. Each large file's conversation has
// phases of its own (hashing, diffing, sending or receiving, verifying) for when it is the
// whole session; inside a tree they printed two or three unnamed lines per large file on each
// peer's log (100 files: ~200 and ~300 lines), so the tree folds the file's transfer progress
// into its own phase and keeps the rest to itself.

import type { SyncEvents } from './events.js';

/** What one file's conversation reports to, and how it ends. */
export interface FileProgress {
  events: SyncEvents;
  /** The file is done: `bytes` of it count from now on (its size when it was synced), in place
   * of the progress it reported; a file that failed (0) keeps what it reported, so the tree's
   * count never goes back. */
  end(bytes: number): void;
}

export class TreeTransferProgress {
  /** Bytes of files that ended, small ones included. */
  private ended = 0;
  /** Of the files still moving, what each has reported so far (the most it reported). */
  private readonly moving = new Map<object, number>();
  private movingTotal = 0;
  private t0 = 0;
  private total = 0;
  /** The count last reported. */
  private shown = 0;

  constructor(
    private readonly events: SyncEvents | undefined,
    private readonly phase: 'sending' | 'receiving',
  ) {}

  /** The tree's transfer phase starts, over `total` bytes (the plan's transfer size). */
  start(total: number): void {
    this.t0 = Date.now();
    this.total = total;
    this.events?.phaseStart?.(this.phase, total);
  }

  /** The phase ended: every file was sent or received (a session that fails says so instead). */
  end(): void {
    this.events?.phaseEnd?.(this.phase, this.total > 0 ? this.total : this.ended, Date.now() - this.t0);
  }

  /** Files that moved whole (a batch of small ones). */
  add(bytes: number): void {
    this.ended += bytes;
    this.emit();
  }

  /** A large file starts. Its info lines reach the session's handlers; its phases do not; its
   * progress in the tree's phase (bytes of it sent or received) counts until it ends. */
  file(): FileProgress {
    const key = {};
    const events = this.events;
    const progress = (phase: string, n: number): void => {
      if (phase !== this.phase) return;
      const before = this.moving.get(key);
      // A file's conversation may report the same phase twice (early DATA, then the rest):
      // the tree's count never goes back.
      if (before !== undefined && n <= before) return;
      this.moving.set(key, n);
      this.movingTotal += n - (before ?? 0);
      this.emit();
    };
    let done = false;
    return {
      events: {
        info: events?.info ? (m) => events.info!(m) : undefined,
        notice: events?.notice ? (m) => events.notice!(m) : undefined,
        change: events?.change ? (line, dryRun) => events.change!(line, dryRun) : undefined,
        progress: (phase, n) => {
          if (!done) progress(phase, n);
        },
      },
      end: (bytes) => {
        if (done) return;
        done = true;
        const reported = this.moving.get(key) ?? 0;
        this.movingTotal -= reported;
        this.moving.delete(key);
        this.add(Math.max(bytes, reported));
      },
    };
  }

  private emit(): void {
    const n = this.ended + this.movingTotal;
    if (!this.t0 || n === this.shown) return;
    this.shown = n;
    this.events?.progress?.(this.phase, n);
  }
}
