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
    let state: 'waiting' | 'holding' | 'done' = 'waiting';
    let held = 0;
    return {
      take: async (units = this.budget) => {
        if (state !== 'waiting') return;
        held = Math.max(1, Math.min(this.budget, units));
        await new Promise<void>((go) => {
          this.waiting.set(seq, { units: held, go });
          this.grant();
        });
        state = 'holding';
      },
      done: () => {
        if (state === 'done') return;
        const holding = state === 'holding';
        state = 'done';
        if (holding) this.free += held;
        else {
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

/** One file's DATA turn: `take(units)` before its first DATA (units of the budget it will
 * hold, default all of it); `done` once its DATA is out, or when it needs none or stops early
 * (then the turn is passed). Both may be called more than once. */
export interface DataTurn {
  take(units?: number): Promise<void>;
  done(): void;
}

/** At most `n` of some work at once (first come, first served): the hashing of files whose
 * conversations run at once in a multiplexed session, so that 64 files in flight do not map
 * and hash 64 files at once (more than the cores gain nothing, and mapped pages count as
 * resident memory). */
export class WorkLimit {
  private readonly waiting: (() => void)[] = [];

  constructor(private free: number) {}

  async run<T>(work: () => Promise<T>): Promise<T> {
    if (this.free > 0) this.free--;
    else await new Promise<void>((go) => this.waiting.push(go));
    try {
      return await work();
    } finally {
      const next = this.waiting.shift();
      if (next) next();
      else this.free++;
    }
  }
}
