// One way to run a child process, for the tests and the benchmarks alike: its stdout as lines
// (and the JSON events among them), its stderr, its exit, its peak memory and CPU time read
// from /proc, and a kill that reaches its whole process group when it has one of its own.
import { type ChildProcess, spawn } from 'node:child_process';
import fs from 'node:fs';

export interface ProcessExit {
  code: number | null;
  signal: NodeJS.Signals | null;
  /** performance.now() at the 'exit' event. */
  at: number;
  /** Milliseconds from the spawn to the exit. */
  ms: number;
}

export interface ProcessOptions {
  /** The child's whole environment (default: this process's). */
  env?: NodeJS.ProcessEnv;
  cwd?: string;
  /** Its own process group, so that kill() also reaches what it started (GNU time, ssh). */
  detached?: boolean;
  /** Read VmHWM and CPU time from /proc this often, in ms (0: never). */
  sampleMs?: number;
  /** Keep only the last this many characters of stderr (default: all of it). */
  stderrLimit?: number;
}

type Json = Record<string, any>;

export class ChildRun {
  readonly child: ChildProcess;
  /** Complete stdout lines so far (the last, unterminated one joins at exit). */
  readonly lines: string[] = [];
  /** The lines that are JSON, parsed, in order (live). */
  readonly events: Json[] = [];
  stdout = '';
  stderr = '';
  /** Set once it exited. */
  exit: ProcessExit | undefined;
  readonly exited: Promise<ProcessExit>;
  /** Sampled with `sampleMs`: peak resident set (VmHWM) in KiB, CPU time (user + system) in ms. */
  peakKiB = 0;
  cpuMs = 0;
  private partial = '';
  private readonly lineListeners = new Set<(line: string) => void>();
  private readonly t0 = performance.now();

  constructor(
    readonly label: string,
    argv: string[],
    private readonly opts: ProcessOptions = {},
  ) {
    const [cmd, ...args] = argv;
    this.child = spawn(cmd!, args, { cwd: opts.cwd, env: opts.env ?? process.env, detached: opts.detached, stdio: ['ignore', 'pipe', 'pipe'] });
    this.child.stdout!.setEncoding('utf8').on('data', (d: string) => {
      this.stdout += d;
      const parts = (this.partial + d).split('\n');
      this.partial = parts.pop() ?? '';
      for (const l of parts) this.pushLine(l);
    });
    this.child.stderr!.setEncoding('utf8').on('data', (d: string) => {
      this.stderr += d;
      const limit = opts.stderrLimit;
      if (limit !== undefined && this.stderr.length > 2 * limit) this.stderr = this.stderr.slice(-limit);
    });
    const sampler = opts.sampleMs ? setInterval(() => this.sample(), opts.sampleMs) : undefined;
    let exitAt = 0;
    this.child.once('exit', () => {
      exitAt = performance.now();
      this.sample();
    });
    this.exited = new Promise<ProcessExit>((resolve) => {
      const finish = (code: number | null, signal: NodeJS.Signals | null) => {
        clearInterval(sampler);
        const at = exitAt || performance.now();
        this.exit = { code, signal, at, ms: at - this.t0 };
        resolve(this.exit);
      };
      this.child.once('error', (err) => {
        this.stderr += `\nspawn error: ${err.message}`;
        finish(null, null);
      });
      this.child.once('close', (code, signal) => {
        if (this.partial) this.pushLine(this.partial);
        this.partial = '';
        finish(code, signal);
      });
    });
  }

  get pid(): number | undefined {
    return this.child.pid;
  }

  /** Calls `f` with each line from now on; returns the unsubscribe. */
  onLine(f: (line: string) => void): () => void {
    this.lineListeners.add(f);
    return () => this.lineListeners.delete(f);
  }

  /** The first line (so far or to come) satisfying `pred`; rejects if it exits first or after `timeoutMs`. */
  waitForLine(pred: (line: string) => boolean, timeoutMs = Infinity): Promise<string> {
    return this.waitFor(this.lines, pred, timeoutMs);
  }

  /** The first JSON event (so far or to come) satisfying `pred`: the very object in `events`. */
  waitForEvent(pred: (e: Json) => boolean, timeoutMs = Infinity): Promise<Json> {
    return this.waitFor(this.events, pred, timeoutMs);
  }

  /** The first item of `list` (lines or events, which grow as stdout arrives) satisfying `pred`. */
  private waitFor<T>(list: T[], pred: (x: T) => boolean, timeoutMs: number): Promise<T> {
    const found = list.find(pred);
    if (found !== undefined) return Promise.resolve(found);
    return new Promise<T>((resolve, reject) => {
      let seen = list.length;
      const done = (err: Error | undefined, x?: T) => {
        clearTimeout(timer);
        off();
        if (err) reject(err);
        else resolve(x!);
      };
      const off = this.onLine(() => {
        for (; seen < list.length; seen++) if (pred(list[seen]!)) return done(undefined, list[seen]);
      });
      const timer = Number.isFinite(timeoutMs) ? setTimeout(() => done(new Error(`${this.label}: no expected output within ${timeoutMs} ms; stderr: ${tail(this.stderr)}`)), timeoutMs) : undefined;
      void this.exited.then((e) => done(new Error(`${this.label}: exited (${describeExit(e)}) before the expected output; stderr: ${tail(this.stderr)}`)));
    });
  }

  /** The port of its `listening` event (`receive` and `serve` with --json). */
  async listeningPort(timeoutMs = Infinity): Promise<number> {
    return Number((await this.waitForEvent((e) => e.event === 'listening', timeoutMs)).port);
  }

  /** SIGKILL (or `signal`) to its process group when it has its own (which may outlive it),
   * else to it while it runs. */
  kill(signal: NodeJS.Signals = 'SIGKILL'): void {
    const pid = this.child.pid;
    if (pid === undefined || (this.exit && !this.opts.detached)) return;
    try {
      if (this.opts.detached) process.kill(-pid, signal);
      else this.child.kill(signal);
    } catch {
      try {
        this.child.kill(signal);
      } catch {
        // already gone
      }
    }
  }

  private sample(): void {
    const pid = this.child.pid;
    if (pid === undefined) return;
    this.peakKiB = Math.max(this.peakKiB, procStatusKiB(pid, 'VmHWM'));
    const cpu = procCpuMs(pid);
    if (!Number.isNaN(cpu)) this.cpuMs = cpu;
  }

  private pushLine(l: string): void {
    this.lines.push(l);
    const e = parseJson(l);
    if (e !== undefined) this.events.push(e);
    for (const f of this.lineListeners) f(l);
  }
}

/** A line's JSON object, or undefined when it is not one (human-mode output). */
export function parseJson(l: string): Json | undefined {
  const t = l.trim();
  if (!t.startsWith('{')) return undefined;
  try {
    const v: unknown = JSON.parse(t);
    return v && typeof v === 'object' ? (v as Json) : undefined;
  } catch {
    return undefined;
  }
}

/** A field of /proc/PID/status in KiB (VmHWM, VmRSS…); 0 once the process is gone. */
export function procStatusKiB(pid: number, field: string): number {
  try {
    const m = new RegExp(`${field}:\\s+(\\d+) kB`).exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) : 0;
  } catch {
    return 0;
  }
}

/** User + system CPU time of a process in ms (/proc/PID/stat, clock ticks of 10 ms); NaN once it is gone. */
export function procCpuMs(pid: number): number {
  try {
    const f = fs.readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
    return ((Number(f[11]) + Number(f[12])) * 1000) / 100;
  } catch {
    return NaN;
  }
}

/** The end of a long output, for an error message. */
export function tail(s: string, n = 1500): string {
  const t = s.trim();
  return t.length > n ? '…' + t.slice(-n) : t || '(empty)';
}

export function describeExit(e: { code: number | null; signal: NodeJS.Signals | null }): string {
  return e.signal ? `signal ${e.signal}` : `exit code ${e.code}`;
}
