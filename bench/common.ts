// Helpers shared by the benchmark harnesses (bench/run.ts, bench/tree.ts, bench/sync.ts,
// bench/net.ts): constants, child processes with peak-RSS measurement and timeouts, a timed
// tool runner, rsync --stats parsing, delay relays, machine info and table formatting. The
// seeded data and the verification the tests share are in __test__/helpers/data.ts.

import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import * as fs from 'node:fs';
import * as fsp from 'node:fs/promises';
import * as os from 'node:os';
import * as path from 'node:path';
import { performance } from 'node:perf_hooks';
import { udpDelayProxy } from '../__test__/helpers/delay-proxy';

export const KiB = 1024;
export const MiB = 1024 * KiB;
/** The repository root (this file lives in bench/). */
export const REPO = path.resolve(__dirname, '..');
export const CLI = path.join(REPO, 'dist', 'cli', 'main.js');
export const TIME_BIN = '/usr/bin/time';
export const RSYNC_BIN = fs.existsSync('/usr/bin/rsync') ? '/usr/bin/rsync' : 'rsync';

export class UsageError extends Error {}

// ---------------------------------------------------------------------------------------------
// Child processes: each in its own process group so a failure can kill the whole tree.

export interface Exit {
  code: number | null;
  signal: NodeJS.Signals | null;
  /** performance.now() at the 'exit' event. */
  at: number;
}

const live = new Set<Proc>();
export const haveTime = fs.existsSync(TIME_BIN);

export class Proc {
  readonly child: ChildProcess;
  readonly lines: string[] = [];
  stderr = '';
  readonly exited: Promise<Exit>;
  exit: Exit | undefined;
  private partial = '';
  private readonly lineListeners = new Set<(line: string) => void>();
  private readonly rssFile: string | undefined;
  private pollPeakKb = 0;
  private readonly poller: NodeJS.Timeout | undefined;

  constructor(
    readonly label: string,
    argv: string[],
    opts: { rssFile?: string; cwd?: string } = {},
  ) {
    const [cmd, ...args] = opts.rssFile && haveTime ? [TIME_BIN, '-f', '%M', '-o', opts.rssFile, ...argv] : argv;
    this.rssFile = opts.rssFile && haveTime ? opts.rssFile : undefined;
    const env = { ...process.env };
    delete env.FFSYNC_STATE_DIR;
    this.child = spawn(cmd!, args, { cwd: opts.cwd ?? REPO, env, detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
    live.add(this);
    this.child.stdout!.setEncoding('utf8').on('data', (d: string) => {
      const parts = (this.partial + d).split('\n');
      this.partial = parts.pop() ?? '';
      for (const l of parts) this.pushLine(l);
    });
    this.child.stderr!.setEncoding('utf8').on('data', (d: string) => {
      this.stderr += d;
      if (this.stderr.length > 1 << 20) this.stderr = this.stderr.slice(-(1 << 19));
    });
    if (opts.rssFile && !haveTime) {
      // Fallback: poll VmHWM of the direct child (misses descendants and the last few ms).
      this.poller = setInterval(() => {
        const kb = readVmHwmKb(this.child.pid);
        if (kb > this.pollPeakKb) this.pollPeakKb = kb;
      }, 20);
    }
    let exitAt = 0;
    this.child.once('exit', () => {
      exitAt = performance.now();
    });
    this.exited = new Promise<Exit>((resolve) => {
      this.child.once('error', (err) => {
        this.stderr += `\nspawn error: ${err.message}`;
        this.finish({ code: null, signal: null, at: performance.now() }, resolve);
      });
      this.child.once('close', (code, signal) => {
        if (this.partial) this.pushLine(this.partial);
        this.partial = '';
        this.finish({ code, signal, at: exitAt || performance.now() }, resolve);
      });
    });
  }

  private finish(e: Exit, resolve: (e: Exit) => void): void {
    if (this.poller) clearInterval(this.poller);
    live.delete(this);
    this.exit = e;
    resolve(e);
  }

  private pushLine(l: string): void {
    this.lines.push(l);
    for (const f of this.lineListeners) f(l);
  }

  waitForLine(pred: (line: string) => boolean, timeoutMs: number): Promise<string> {
    return new Promise<string>((resolve, reject) => {
      const found = this.lines.find(pred);
      if (found !== undefined) return resolve(found);
      const done = (err: Error | undefined, line?: string) => {
        clearTimeout(timer);
        this.lineListeners.delete(listener);
        if (err) reject(err);
        else resolve(line!);
      };
      const listener = (l: string) => {
        if (pred(l)) done(undefined, l);
      };
      const timer = setTimeout(() => done(new Error(`${this.label}: no expected output within ${timeoutMs} ms; stderr: ${tail(this.stderr)}`)), timeoutMs);
      this.lineListeners.add(listener);
      void this.exited.then((e) => done(new Error(`${this.label}: exited (${describeExit(e)}) before the expected output; stderr: ${tail(this.stderr)}`)));
    });
  }

  /** Peak RSS in KiB: GNU time's %M (ru_maxrss of the child and its waited-for descendants), else polled VmHWM. */
  async peakRssKb(): Promise<number | undefined> {
    if (this.rssFile) {
      try {
        const txt = await fsp.readFile(this.rssFile, 'utf8');
        const nums = txt.split('\n').map((s) => s.trim()).filter((s) => /^\d+$/.test(s));
        return nums.length ? Number(nums[nums.length - 1]) : undefined;
      } catch {
        return undefined;
      }
    }
    return this.pollPeakKb || undefined;
  }

  kill(): void {
    const pid = this.child.pid;
    if (pid === undefined) return;
    try {
      process.kill(-pid, 'SIGKILL');
    } catch {
      try {
        this.child.kill('SIGKILL');
      } catch {
        /* already gone */
      }
    }
  }
}

export function readVmHwmKb(pid: number | undefined): number {
  if (pid === undefined) return 0;
  try {
    const m = /VmHWM:\s+(\d+)\s+kB/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) : 0;
  } catch {
    return 0;
  }
}

export function killAll(): void {
  for (const p of [...live]) p.kill();
}

/** An integer option's value (`--name`): `def` when absent, a UsageError outside [min, max]. */
export function intOption(name: string, v: string | undefined, def: number, min: number, max: number): number {
  if (v === undefined) return def;
  const n = Number(v);
  if (!Number.isInteger(n) || n < min || n > max) throw new UsageError(`--${name}: expected an integer from ${min} to ${max}, got ${JSON.stringify(v)}`);
  return n;
}

/** Runs a benchmark's `main` and exits with its code (0 if none). On a throw: every child is
 * killed, the stack is printed under the benchmark's name, and the exit code is 1. `cleanup`
 * runs before either exit. */
export function runMain(name: string, main: () => Promise<number | void>, cleanup: () => Promise<void> | void = () => undefined): void {
  main().then(
    async (code) => {
      await cleanup();
      process.exit(code ?? 0);
    },
    async (e: unknown) => {
      killAll();
      process.stderr.write(`\n${name} failed: ${e instanceof Error ? (e.stack ?? e.message) : String(e)}\n`);
      await cleanup();
      process.exit(1);
    },
  );
}

export function tail(s: string, n = 1500): string {
  const t = s.trim();
  return t.length > n ? '…' + t.slice(-n) : t || '(empty)';
}

export function describeExit(e: Exit): string {
  return e.signal ? `signal ${e.signal}` : `exit code ${e.code}`;
}

/** Runs body with a deadline; on expiry kills every live child and rejects. */
export async function withTimeout<T>(ms: number, label: string, body: () => Promise<T>): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const p = body();
  p.catch(() => undefined); // may reject after the deadline already fired
  try {
    return await Promise.race([
      p,
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => {
          killAll();
          reject(new Error(`${label}: timed out after ${ms / 1000} s (children killed)`));
        }, ms);
      }),
    ]);
  } finally {
    clearTimeout(timer);
  }
}

// ---------------------------------------------------------------------------------------------
// Tool output and the file system

export function parseJsonLine(l: string): Record<string, unknown> | undefined {
  const t = l.trim();
  if (!t.startsWith('{')) return undefined;
  try {
    const v: unknown = JSON.parse(t);
    return v && typeof v === 'object' ? (v as Record<string, unknown>) : undefined;
  } catch {
    return undefined;
  }
}

export function parseRsyncStats(out: string): { sent: number; received: number; literal?: number; matched?: number } {
  const num = (re: RegExp): number | undefined => {
    const m = re.exec(out);
    return m ? Number(m[1]!.replace(/[,.]/g, '')) : undefined;
  };
  const sent = num(/Total bytes sent:\s*([\d,.]+)/);
  const received = num(/Total bytes received:\s*([\d,.]+)/);
  if (sent === undefined || received === undefined) throw new Error(`could not parse rsync --stats output: ${tail(out)}`);
  return { sent, received, literal: num(/Literal data:\s*([\d,.]+)/), matched: num(/Matched data:\s*([\d,.]+)/) };
}

export async function rmf(p: string): Promise<void> {
  await fsp.rm(p, { recursive: true, force: true });
}

/** Flush dirty pages of the work filesystem so a previous step's writeback does not land in the next timing. */
export function flushWorkFs(dir: string): void {
  const r = spawnSync('sync', ['-f', dir], { stdio: 'ignore', timeout: 120_000 });
  if (r.status !== 0) spawnSync('sync', [], { stdio: 'ignore', timeout: 120_000 });
}

// ---------------------------------------------------------------------------------------------
// Environment

export function sh(cmd: string, args: string[], timeoutMs = 10_000, env?: NodeJS.ProcessEnv): string {
  const r = spawnSync(cmd, args, { encoding: 'utf8', timeout: timeoutMs, env: env ?? process.env });
  return r.status === 0 ? r.stdout.trim() : '';
}

export interface Machine {
  date: string;
  nproc: string;
  cpu: string;
  memory: string;
  kernel: string;
  fs: string;
  load: string;
  rsync: string;
  node: string;
  ffsync: string;
  commit: string;
  rssMethod: string;
}

export function machineInfo(workDir: string): Machine {
  const df = sh('df', ['-T', workDir]).split('\n')[1]?.split(/\s+/) ?? [];
  const commit = sh('git', ['-C', REPO, 'rev-parse', '--short', 'HEAD']);
  // Read-only status (GIT_OPTIONAL_LOCKS=0: do not take the index lock while others work in the tree).
  const dirty = sh('git', ['-C', REPO, 'status', '--porcelain', '--untracked-files=no'], 10_000, { ...process.env, GIT_OPTIONAL_LOCKS: '0' });
  return {
    date: new Date().toISOString(),
    nproc: sh('nproc', []) || String(os.availableParallelism()),
    cpu: os.cpus()[0]?.model ?? 'unknown',
    memory: `${(os.totalmem() / 1024 ** 3).toFixed(1)} GiB`,
    kernel: sh('uname', ['-srm']) || `${os.type()} ${os.release()}`,
    fs: df.length >= 2 ? `${df[1]} (${df[0]}, mounted on ${df[6] ?? '?'})` : 'unknown',
    load: os.loadavg().map((x) => x.toFixed(2)).join(' '),
    rsync: sh(RSYNC_BIN, ['--version']).split('\n')[0] ?? 'unknown',
    node: process.version,
    ffsync: sh(process.execPath, [CLI, '--version']) || 'unknown',
    commit: commit ? `${commit}${dirty ? ' (working tree has uncommitted changes)' : ''}` : 'unknown',
    rssMethod: haveTime ? `${TIME_BIN} -f %M (ru_maxrss, KiB)` : '/proc/PID/status VmHWM polled every 20 ms (no /usr/bin/time)',
  };
}

// ---------------------------------------------------------------------------------------------
// Formatting

export function fmtS(ms: number | undefined): string {
  return ms === undefined ? '—' : (ms / 1000).toFixed(3);
}

export function fmtBytes(n: number | undefined): string {
  if (n === undefined) return '—';
  if (n < 10 * KiB) return `${n} B`;
  if (n < 10 * MiB) return `${(n / KiB).toFixed(1)} KiB`;
  if (n < 10 * 1024 * MiB) return `${(n / MiB).toFixed(2)} MiB`;
  return `${(n / 1024 / MiB).toFixed(2)} GiB`;
}

export function fmtRss(kb: number | undefined): string {
  return kb === undefined ? '—' : (kb / 1024).toFixed(1);
}

export function fmtRatio(num: number | undefined, den: number | undefined): string {
  if (num === undefined || den === undefined || den <= 0) return '—';
  return `${(num / den).toFixed(2)}x`;
}

export function median(xs: number[]): number | undefined {
  if (xs.length === 0) return undefined;
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1]! + s[m]!) / 2;
}

export function maxOf(xs: (number | undefined)[]): number | undefined {
  const v = xs.filter((x): x is number => x !== undefined);
  return v.length ? Math.max(...v) : undefined;
}

export function markdown(t: { head: string[]; rows: string[][] }): string {
  const esc = (s: string) => s.replace(/\|/g, '\\|').replace(/\s*\n\s*/g, ' ');
  return [
    `| ${t.head.map(esc).join(' | ')} |`,
    `|${t.head.map((_, i) => (i === 0 ? '---' : '---:')).join('|')}|`,
    ...t.rows.map((r) => `| ${r.map(esc).join(' | ')} |`),
  ].join('\n');
}

export function textTable(t: { head: string[]; rows: string[][] }): string {
  const all = [t.head, ...t.rows];
  const w = t.head.map((_, i) => Math.max(...all.map((r) => (r[i] ?? '').length)));
  const line = (r: string[]) => r.map((c, i) => (i === 0 ? c.padEnd(w[i]!) : c.padStart(w[i]!))).join('  ');
  return [line(t.head), w.map((n) => '-'.repeat(n)).join('  '), ...t.rows.map(line)].join('\n');
}

export function commandLine(): string {
  const q = (s: string) => (/^[\w@%+=:,./-]+$/.test(s) ? s : `'${s.replace(/'/g, `'\\''`)}'`);
  const script = path.relative(process.cwd(), process.argv[1] ?? 'bench/run.ts') || 'bench/run.ts';
  return ['node', ...process.execArgv, script, ...process.argv.slice(2)].map(q).join(' ');
}

/** Replace this bench's section of bench/RESULTS.md (between `begin` and `end`, inclusive),
 * or append it; the rest of the file stays untouched. Returns the file's path. */
export function writeResultsSection(begin: string, end: string, section: string): string {
  const file = path.join(REPO, 'bench', 'RESULTS.md');
  const old = fs.existsSync(file) ? fs.readFileSync(file, 'utf8') : '';
  const i = old.indexOf(begin);
  const j = i >= 0 ? old.indexOf(end, i) : -1;
  const next = i >= 0 && j > i ? old.slice(0, i) + section + old.slice(j + end.length) : `${old.trimEnd()}\n\n${section}\n`;
  fs.writeFileSync(file, next);
  return file;
}

// ---------------------------------------------------------------------------------------------
// Running one tool: a timed child with peak RSS and its exit checked (bench/sync.ts, bench/net.ts).

export interface ToolRun {
  /** From spawn to the 'exit' event. */
  ms: number;
  lines: string[];
  stderr: string;
  rssKb?: number;
}

/** Runs argv to completion under a peak-RSS probe (rssFile: where /usr/bin/time writes it);
 * throws with the tail of stderr unless it exits 0. */
export async function runTool(label: string, argv: string[], rssFile?: string): Promise<ToolRun> {
  const t0 = performance.now();
  const p = new Proc(label, argv, { rssFile });
  const exit = await p.exited;
  if (exit.code !== 0) throw new Error(`${label}: ${describeExit(exit)}: ${tail(p.stderr)}`);
  return { ms: exit.at - t0, lines: p.lines, stderr: p.stderr, rssKb: await p.peakRssKb() };
}

/** Wire bytes from ffsync's `--json` summary event (the last one), if any. */
export function ffsyncWire(lines: string[]): { sent: number; received: number } | undefined {
  const s = lines.map(parseJsonLine).filter((e) => e?.event === 'summary').pop() as { bytesOnWire?: { sent: number; received: number } } | undefined;
  return s?.bytesOnWire;
}

/** Peak RSS (KiB) that `/usr/bin/time -f %M -o file` left in file, e.g. for a peer started by ssh. */
export function readRssFile(file: string): number | undefined {
  try {
    const nums = fs.readFileSync(file, 'utf8').split('\n').map((s) => s.trim()).filter((s) => /^\d+$/.test(s));
    return nums.length ? Number(nums[nums.length - 1]) : undefined;
  } catch {
    return undefined;
  }
}

/** `/usr/bin/time -f %M -o file` as a command prefix (empty without GNU time). */
export function rssPrefix(file: string): string[] {
  return haveTime ? [TIME_BIN, '-f', '%M', '-o', file] : [];
}

// ---------------------------------------------------------------------------------------------
// Delay relays (RTT on top of a link that has none)

/** The native UDP relay (crates/ffsync_core/examples/udp_delay_relay.rs): the JavaScript one
 * drops datagrams above ~20 MB/s, which would measure the relay instead of QUIC. Built once;
 * undefined (and the JavaScript relay used) if cargo is unavailable. */
let nativeRelay: string | undefined | null = null;
export function relayBinary(): string | undefined {
  if (nativeRelay !== null) return nativeRelay;
  const r = spawnSync('cargo', ['build', '--release', '-q', '-p', 'ffsync_core', '--example', 'udp_delay_relay'], { cwd: REPO, stdio: 'inherit' });
  const bin = path.join(REPO, 'target', 'release', 'examples', 'udp_delay_relay');
  nativeRelay = r.status === 0 && fs.existsSync(bin) ? bin : undefined;
  return nativeRelay;
}

export interface Relay {
  port: number;
  close(): Promise<void>;
}

/** A UDP relay listening on 127.0.0.1 that delays each datagram `oneWayMs` each way toward
 * targetHost:targetPort. `wrap` prefixes the command (e.g. `ip netns exec NS`): the native relay
 * then runs in that namespace. The JavaScript fallback (loopback only) runs in this process. */
export async function udpRelay(targetPort: number, oneWayMs: number, opts: { targetHost?: string; wrap?: string[] } = {}): Promise<Relay> {
  const bin = relayBinary();
  if (!bin) {
    if (opts.wrap?.length || (opts.targetHost && opts.targetHost !== '127.0.0.1')) throw new Error('the UDP relay across namespaces needs the native relay (cargo build --release -p ffsync_core --example udp_delay_relay)');
    return udpDelayProxy(targetPort, oneWayMs);
  }
  const p = new Proc('udp relay', [...(opts.wrap ?? []), bin, String(targetPort), String(oneWayMs), ...(opts.targetHost ? [opts.targetHost] : [])]);
  const port = Number(await p.waitForLine((l) => /^\d+$/.test(l.trim()), 10_000));
  return {
    port,
    close: async () => {
      p.kill();
      await p.exited;
    },
  };
}
