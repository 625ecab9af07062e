// Helpers shared by the benchmark harnesses (bench/run.ts, bench/tree.ts, bench/sync.ts,
// bench/net.ts): constants, child processes with peak-RSS measurement and timeouts, a timed
// tool runner, rsync --stats parsing, delay relays, machine info and table formatting. The
// seeded data and the verification the tests share are in __test__/helpers/data.ts.

import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as fsp from 'node:fs/promises';
import * as os from 'node:os';
import * as path from 'node:path';
import { performance } from 'node:perf_hooks';
import { type ParseArgsConfig, parseArgs } from 'node:util';
import { udpDelayProxy } from '../__test__/helpers/delay-proxy';
import { ChildRun, describeExit, parseJson, type ProcessExit, tail } from '../__test__/helpers/process';

export { describeExit, tail };

export const KiB = 1024;
export const MiB = 1024 * KiB;
/** The repository root (this file lives in bench/). */
export const REPO = path.resolve(__dirname, '..');
/** The CLI every benchmark runs: this checkout's build, or another build's
 * (`FFSYNC_BENCH_CLI=<that checkout>/dist/cli/main.js`) for a before/after pair run side by side. */
export const CLI = process.env.FFSYNC_BENCH_CLI ? path.resolve(process.env.FFSYNC_BENCH_CLI) : path.join(REPO, 'dist', 'cli', 'main.js');
/** How a results file names the CLI it measured. */
export const CLI_SHOWN = path.relative(REPO, CLI);
export const TIME_BIN = '/usr/bin/time';
export const RSYNC_BIN = fs.existsSync('/usr/bin/rsync') ? '/usr/bin/rsync' : 'rsync';

export class UsageError extends Error {}

// ---------------------------------------------------------------------------------------------
// Child processes: each in its own process group so a failure can kill the whole tree.

export type Exit = ProcessExit;

const live = new Set<Proc>();
export const haveTime = fs.existsSync(TIME_BIN);

/** A benchmarked process: the shared runner (__test__/helpers/process.ts) in its own process
 * group, without FFSYNC_STATE_DIR, its peak RSS measured by GNU time (the child and the
 * descendants it waited for) or else sampled from /proc, and killed by killAll() on failure. */
export class Proc extends ChildRun {
  private readonly rssFile: string | undefined;

  constructor(label: string, argv: string[], opts: { rssFile?: string; cwd?: string; unsetEnv?: readonly string[] } = {}) {
    const timed = Boolean(opts.rssFile && haveTime);
    const env = { ...process.env };
    delete env.FFSYNC_STATE_DIR;
    for (const name of opts.unsetEnv ?? []) delete env[name];
    super(label, timed ? [TIME_BIN, '-f', '%M', '-o', opts.rssFile!, ...argv] : argv, {
      cwd: opts.cwd ?? REPO,
      env,
      detached: true,
      stderrLimit: 1 << 19,
      // Without GNU time: poll VmHWM of the direct child (misses descendants and the last few ms).
      sampleMs: opts.rssFile && !timed ? 20 : 0,
    });
    this.rssFile = timed ? opts.rssFile : undefined;
    live.add(this);
    void this.exited.then(() => live.delete(this));
  }

  /** Peak RSS in KiB: GNU time's %M, else the sampled VmHWM. */
  async peakRssKb(): Promise<number | undefined> {
    return this.rssFile ? readRssFile(this.rssFile) : this.peakKiB || undefined;
  }
}

export function killAll(): void {
  for (const p of [...live]) p.kill();
}

/** A benchmark's options (node:util's parseArgs: strict, no positionals); `-h`/`--help`
 * prints `help` and exits 0. */
export function benchArgs<T extends Record<string, OptionSpec>>(argv: string[], options: T, help: string): ParsedOptions<T> {
  const { values } = orUsage(help, () => parseArgs({ args: argv, strict: true, allowPositionals: false, options: { ...options, help: { type: 'boolean', short: 'h' } } }));
  if ((values as { help?: boolean }).help) {
    process.stdout.write(help);
    process.exit(0);
  }
  return values as ParsedOptions<T>;
}

/** parse()'s result; if it throws (an unknown option, a value out of range), the message and
 * `help` on stderr and exit 1, as a command-line tool answers a usage error. */
export function orUsage<T>(help: string, parse: () => T): T {
  try {
    return parse();
  } catch (e) {
    process.stderr.write(`${e instanceof Error ? e.message : String(e)}\n\n${help}`);
    process.exit(1);
  }
}

type OptionSpec = NonNullable<ParseArgsConfig['options']>[string];
type ParsedOptions<T extends Record<string, OptionSpec>> = { [K in keyof T]?: T[K]['type'] extends 'boolean' ? boolean : string };

/** A comma-separated list option (`--name a,b`) of names from `known`: `all` when absent, else
 * the names given, in `known`'s order; a UsageError for an unknown name or an empty list. */
export function pickList<T extends string>(name: string, v: string | undefined, known: readonly T[], all: readonly T[] = known): T[] {
  if (v === undefined) return [...all];
  const want = v.split(',').map((s) => s.trim()).filter(Boolean);
  for (const w of want) {
    if (!(known as readonly string[]).includes(w)) throw new UsageError(`--${name}: unknown name ${JSON.stringify(w)} (known: ${known.join(', ')})`);
  }
  if (want.length === 0) throw new UsageError(`--${name}: empty list`);
  return known.filter((n) => want.includes(n));
}

/** An integer option's value (`--name`): `def` when absent, a UsageError outside [min, max]. */
export function intOption(name: string, v: string | undefined, def: number, min: number, max: number): number {
  if (v === undefined) return def;
  const n = Number(v);
  if (!Number.isInteger(n) || n < min || n > max) throw new UsageError(`--${name}: expected an integer from ${min} to ${max}, got ${JSON.stringify(v)}`);
  return n;
}

/** A benchmark's exit code: 1, with one line naming each run that failed or did not verify,
 * or 0 when there is none. `what` names the runs (`run(s)`, `cell(s)`). */
export function failedRuns(failed: string[], what: string): number {
  if (failed.length === 0) return 0;
  process.stderr.write(`\n!!!!! ${failed.length} ${what} failed or did not verify: ${failed.join(', ')}\n`);
  return 1;
}

/** On SIGINT or SIGTERM: `first` (say, stop starting runs), then `cleanup`, then exit 130. */
export function cleanUpOnSignals(cleanup: () => Promise<void>, first: () => void = () => undefined): void {
  for (const sig of ['SIGINT', 'SIGTERM'] as const) {
    process.once(sig, () => {
      first();
      process.stderr.write(`\n${sig}: killing children and cleaning up\n`);
      void cleanup().finally(() => process.exit(130));
    });
  }
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

export const parseJsonLine = parseJson;

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

/** Replace this bench's section of `file` (bench/RESULTS.md unless named; between `begin` and
 * `end`, inclusive), or append it; the rest of the file stays untouched. Returns the file's path. */
export function writeResultsSection(begin: string, end: string, section: string, file = path.join(REPO, 'bench', 'RESULTS.md')): string {
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
export async function runTool(label: string, argv: string[], rssFile?: string, unsetEnv?: readonly string[]): Promise<ToolRun> {
  const t0 = performance.now();
  const p = new Proc(label, argv, { rssFile, unsetEnv });
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

/** What a peer's state directory keeps between a bench's runs: its identity, its pins and the
 * receivers it remembers (their last HELLO, decisions §93: a repeated push knows its receiver);
 * indexes go, so every run starts from the same state. */
const KEPT_STATE = new Set(['identity', 'pins.conf', 'hellos']);

export function resetPeerStates(dirs: string[]): void {
  for (const d of dirs) {
    fs.mkdirSync(d, { recursive: true });
    for (const n of fs.readdirSync(d)) if (!KEPT_STATE.has(n)) fs.rmSync(path.join(d, n), { recursive: true, force: true });
  }
}
