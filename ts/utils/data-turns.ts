// DATA turns of a multiplexed tree session (tree-send.ts): at most `slots` files send DATA
// at once, and files take their turns in plan order (the order they were started), so data
// flows in path order as in a sequential session, whatever order the peer's answers arrive
// in. A file that needs no data passes its turn.

export class DataTurns {
  /** The next turn to be given (files before it took theirs or passed). */
  private next = 0;
  private free: number;
  private readonly passed = new Set<number>();
  private readonly waiting = new Map<number, () => void>();

  constructor(slots: number) {
    this.free = slots;
  }

  /** The turn of the file started `seq`-th (0, 1, 2, … in plan order). */
  turn(seq: number): DataTurn {
    let state: 'waiting' | 'holding' | 'done' = 'waiting';
    return {
      take: async () => {
        if (state !== 'waiting') return;
        await new Promise<void>((resolve) => {
          this.waiting.set(seq, resolve);
          this.grant();
        });
        state = 'holding';
      },
      done: () => {
        if (state === 'done') return;
        const held = state === 'holding';
        state = 'done';
        if (held) this.free++;
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
      if (!w || this.free === 0) return;
      this.waiting.delete(this.next);
      this.free--;
      this.next++;
      w();
    }
  }
}

/** One file's DATA turn: `take` before its first DATA; `done` once its DATA is out, or when
 * it needs none or stops early (then the turn is passed). Both may be called more than once. */
export interface DataTurn {
  take(): Promise<void>;
  done(): void;
}
