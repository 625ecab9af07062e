// DATA turns of a multiplexed tree session (tree-send.ts): files send DATA in turns, taken in
// plan order (the order they were started), so data flows in path order as in a sequential
// session, whatever order the peer's answers arrive in. A turn holds `units` of a fixed
// budget (the sender's batch buffers: a file whose delta fits one batch needs one, a big file
// its full read-ahead), so many small deltas go at once while big files take turns. A file
// that needs no data passes its turn.

export class DataTurns {
  /** The next turn to be given (files before it took theirs or passed). */
  private next = 0;
  private free: number;
  private readonly passed = new Set<number>();
  private readonly waiting = new Map<number, { units: number; go: () => void }>();

  constructor(private readonly budget: number) {
    this.free = budget;
  }

  /** The turn of the file started `seq`-th (0, 1, 2, … in plan order). */
  turn(seq: number): DataTurn {
    // 'holding' is set when the turn is granted (in `grant`), not when `take` resumes: a `done`
    // in between gives the units back instead of passing a turn that was already given.
    let state: 'idle' | 'asking' | 'holding' | 'done' = 'idle';
    let held = 0;
    return {
      take: async (units = this.budget) => {
        if (state !== 'idle') return;
        state = 'asking';
        held = Math.max(1, Math.min(this.budget, units));
        await new Promise<void>((resolve) => {
          this.waiting.set(seq, {
            units: held,
            go: () => {
              state = 'holding';
              resolve();
            },
          });
          this.grant();
        });
      },
      done: () => {
        if (state === 'done') return;
        const holding = state === 'holding';
        state = 'done';
        if (holding) this.free += held;
        else {
          // Not granted (asked or not): the turn is passed. A `take` still asking stays
          // pending: its file gave up.
          this.waiting.delete(seq);
          this.passed.add(seq);
        }
        this.grant();
      },
    };
  }

  private grant(): void {
    for (;;) {
      if (this.passed.delete(this.next)) {
        this.next++;
        continue;
      }
      const w = this.waiting.get(this.next);
      if (!w || this.free < w.units) return;
      this.waiting.delete(this.next);
      this.free -= w.units;
      this.next++;
      w.go();
    }
  }
}

/** One file's DATA turn: `take(units, bytes)` before its first DATA (units of the budget it will
 * hold, default all of it; `bytes`, when known, the DATA it will send); `done` once its DATA is
 * out, or when it needs none or stops early (then the turn is passed). Both may be called more
 * than once. */
export interface DataTurn {
  take(units?: number, bytes?: number): Promise<void>;
  done(): void;
}

/** Files one connection of a session with lanes holds before their DATA is out, beyond which it
 * takes no more while the DATA they are expected to send reaches LANE_AHEAD_BYTES: two, so that
 * the next file's round trips cross while one file's DATA flows. */
export const LANE_AHEAD_FILES = 2;
/** Expected DATA one connection of a session with lanes may hold before it sends it (a file
 * counts its size until its needs are known, then their bytes): about four times the bandwidth x
 * delay of 1 Gbit/s at 30 ms, so a connection never runs dry waiting for answers, and far less
 * than a tree's worth, so the files go to whichever connection sends them first instead of all to
 * the connection that happened to be open first (decisions §81). */
export const LANE_AHEAD_BYTES = 16 * 1024 * 1024;

/** Units of a budget, first come, first served; a request waits until enough are free, and
 * those behind it wait too: what several connections' DATA turns draw on (a session with lanes),
 * and, one unit at a time, WorkLimit. */
export class SharedUnits {
  private readonly waiting: { units: number; go: () => void }[] = [];

  constructor(private free: number) {}

  acquire(units: number): Promise<void> {
    if (!this.waiting.length && this.free >= units) {
      this.free -= units;
      return Promise.resolve();
    }
    return new Promise<void>((go) => this.waiting.push({ units, go }));
  }

  /** `acquire` if the units are free now and nobody waits before us; false otherwise. */
  tryAcquire(units: number): boolean {
    if (this.waiting.length || this.free < units) return false;
    this.free -= units;
    return true;
  }

  release(units: number): void {
    this.free += units;
    while (this.waiting.length && this.free >= this.waiting[0]!.units) {
      const w = this.waiting.shift()!;
      this.free -= w.units;
      w.go();
    }
  }

  /** Units free now (tests). */
  get available(): number {
    return this.free;
  }
}

/**
 * One connection's share of a multiplexed tree session's large files: its DATA turns (files on
 * it send in the order it took them, within its own budget and, with lanes, the session's
 * `shared` units), and, when the session has lanes, how far ahead of its DATA it may take files
 * (`hasRoom`). Without that bound the first connection's streams, open before any lane has
 * joined, take every file of a tree with fewer large files than streams, and the lanes carry
 * nothing.
 */
export class ConnectionShare {
  private readonly turns: DataTurns;
  private seq = 0;
  /** Files taken whose DATA is not out yet, and the DATA they are expected to send. */
  private files = 0;
  private ahead = 0;
  /** The first connection while its lanes are joining: one file at a time (`holdOne`). */
  private one = false;
  private waiting: (() => void)[] = [];

  /** `shared`: the session has lanes; a file sends once it has both its turn here and its units
   * there, and `hasRoom` bounds what this connection takes. Without it (one connection; QUIC
   * lanes, which share one connection's bandwidth; in-process lanes) one share serves the whole
   * session and `hasRoom` is always true. */
  constructor(
    private readonly budget: number,
    private readonly shared?: SharedUnits,
  ) {
    this.turns = new DataTurns(budget);
  }

  /** Whether this connection may take another file now. Take it in the same synchronous step
   * (`turn`): streams that all found room before any of them took a file would take them all. */
  hasRoom(): boolean {
    if (!this.shared) return true;
    if (this.one) return this.files === 0;
    return this.files < LANE_AHEAD_FILES || this.ahead < LANE_AHEAD_BYTES;
  }

  /** While `on`, take one file at a time whatever its size: the first connection, while its
   * lanes are still joining, so that a tree of a few big files does not go to it whole before
   * a lane can take one. */
  holdOne(on: boolean): void {
    this.one = on;
    this.wake();
  }

  /** Resolves when a file of this connection sent its DATA or learnt it needs less: ask
   * `hasRoom` again then. */
  changed(): Promise<void> {
    return new Promise<void>((go) => this.waiting.push(go));
  }

  /** Files taken and not yet out, and the DATA expected of them (tests, diagnostics). */
  get load(): { files: number; bytes: number } {
    return { files: this.files, bytes: this.ahead };
  }

  /** The DATA turn of the next file this connection takes, `size` bytes long: it counts toward
   * the connection's share until its DATA is out or it needs none. */
  turn(size: number): DataTurn {
    const inner = this.turns.turn(this.seq++);
    let expected = Math.max(0, size);
    let counted = true;
    // An object, so the checks after each await read what `done` may have set meanwhile.
    const state: { phase: 'waiting' | 'taking' | 'holding' | 'done'; held: number } = { phase: 'waiting', held: 0 };
    this.files++;
    this.ahead += expected;
    return {
      take: async (units = this.budget, bytes) => {
        if (counted && bytes !== undefined && bytes < expected) {
          this.ahead -= expected - bytes;
          expected = bytes;
          this.wake();
        }
        if (state.phase !== 'waiting') return;
        state.phase = 'taking';
        await inner.take(units);
        if (this.shared) {
          state.held = Math.max(1, Math.min(this.budget, units));
          await this.shared.acquire(state.held);
          // Passed while it waited (state.phase is read again: `done` may have run): the units
          // go straight back.
          if ((state.phase as string) === 'done') return this.shared.release(state.held);
        }
        if (state.phase === 'taking') state.phase = 'holding';
      },
      done: () => {
        if (counted) {
          counted = false;
          this.files--;
          this.ahead -= expected;
          this.wake();
        }
        if (state.phase === 'holding' && this.shared) this.shared.release(state.held);
        state.phase = 'done';
        inner.done();
      },
    };
  }

  private wake(): void {
    const w = this.waiting;
    this.waiting = [];
    for (const go of w) go();
  }
}

/** At most `n` of some work at once (first come, first served): the hashing of files whose
 * conversations run at once in a multiplexed session, so that 64 files in flight do not map
 * and hash 64 files at once (more than the cores gain nothing, and mapped pages count as
 * resident memory). */
export class WorkLimit extends SharedUnits {
  async run<T>(work: () => Promise<T>): Promise<T> {
    await this.acquire(1);
    try {
      return await work();
    } finally {
      this.release(1);
    }
  }
}
