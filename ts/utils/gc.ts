// Socket reads arrive in fresh 64 KiB buffers that become garbage as soon as their bytes
// are copied into a pooled frame. V8 frees them only when a GC runs, and it schedules
// GCs by heap pressure, not by the external memory those buffers hold — so a 1 GiB
// transfer could keep ~100 MiB of dead socket buffers resident. A minor GC (a scavenge of
// the young generation, ~1 ms) every STEP bytes keeps that bounded. If the runtime
// refuses to expose gc, we simply do without.
type Gc = (options?: { type?: 'minor' | 'major'; execution?: 'sync' | 'async' }) => void;

let gc: Gc | undefined | null = null;

/** Loaded at the first STEP, not at start-up: a small sync never needs it (bench/startup.ts). */
function load(): Gc | undefined {
  try {
    /* eslint-disable @typescript-eslint/no-require-imports */
    const v8 = require('node:v8') as typeof import('node:v8');
    const vm = require('node:vm') as typeof import('node:vm');
    /* eslint-enable @typescript-eslint/no-require-imports */
    v8.setFlagsFromString('--expose-gc');
    return vm.runInNewContext('gc') as Gc;
  } catch {
    return undefined;
  }
}

export const RELIEF_STEP = 4 * 1024 * 1024;
/** Resident size above which dead buffers are collected at once: a peer's budget is 100 MiB. */
const RSS_BUDGET = 80 * 1024 * 1024;
const MAJOR_STEP = 32 * 1024 * 1024;

let since = 0;
let majors = 0;
let minors = 0;

/** Minor GCs relieveGarbage asked for so far, and the bytes counted towards the next (tests). */
export function garbageRelief(): { runs: number; pending: number } {
  return { runs: minors, pending: since };
}

/** Call with each socket read's byte count; runs a minor GC every RELIEF_STEP bytes. One count
 * for the process, not one per connection: the dead reads of every connection share one heap,
 * so a count per lane would let four lanes hold four times as many (decisions §71). */
export function relieveGarbage(bytes: number): void {
  since += bytes;
  if (since < RELIEF_STEP) return;
  // The read that crossed the step carries its excess into the next one, so the steps fall
  // every RELIEF_STEP bytes however the reads are cut.
  since %= RELIEF_STEP;
  minors++;
  if (gc === null) gc = load();
  gc?.({ type: 'minor' });
  // Buffers that survive two scavenges are promoted to the old generation, which only a
  // full GC frees. Past the memory budget, an incremental one starts every MAJOR_STEP bytes;
  // below it, as in most sessions, nothing extra runs. Few reads live that long, because
  // large frames are copied together as their reads arrive (FrameDecoder, decisions §69).
  if ((majors += RELIEF_STEP) >= MAJOR_STEP) {
    majors = 0;
    if (gc && process.memoryUsage.rss() > RSS_BUDGET) gc({ type: 'major', execution: 'async' });
  }
}

/** Resident size above which reads into a static buffer still pace the collections (see
 * `relieveNearBudget`): 12 MiB under a peer's 100 MiB, more than four lanes' reads between two
 * steps and the frames they queue. */
export const NEAR_BUDGET = 88 * 1024 * 1024;
let sinceStatic = 0;

/** Call with each read's byte count where reads leave no buffer behind (a socket reading into a
 * static buffer, decisions §94). The session's other garbage — small objects, and the native
 * memory some of them hold until they are collected — still grows with the bytes moved, but
 * slowly enough that V8's own schedule keeps it small, except near the budget: there, every
 * RELIEF_STEP bytes take relieveGarbage's step (a minor GC, past the budget a major one every
 * MAJOR_STEP). Below it nothing runs: 400 scavenges and 50 major GCs per 1.6 GiB cost a
 * receiver 0.5–0.7 s of its JS thread. One RSS reading per step (4 MiB; `rss`: tests). */
export function relieveNearBudget(bytes: number, rss: () => number = process.memoryUsage.rss): void {
  sinceStatic += bytes;
  if (sinceStatic < RELIEF_STEP) return;
  sinceStatic %= RELIEF_STEP;
  if (rss() > NEAR_BUDGET) relieveGarbage(RELIEF_STEP);
}

/** Large buffers just became garbage all at once (a big tree's manifests and roots, exchanged):
 * collect them now. V8 schedules GCs by heap pressure, and a session of few objects may not reach
 * the next one before it ends, keeping them resident for good (decisions §87). Incremental, so
 * the JS thread is not stopped for it. */
export function collectGarbage(): void {
  if (gc === null) gc = load();
  gc?.({ type: 'major', execution: 'async' });
}
