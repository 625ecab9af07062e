#!/usr/bin/env node
// Benchmark harness: ffsync-native vs rsync, side by side, in the same run.
//
//   node --import tsx bench/run.ts [--size-mib N] [--scenarios a,b] [--out bench/RESULTS.md]
//                                  [--repeat N] [--seed N] [--rss-sizes 256,1024,4096] [--keep] ...
//
// See bench/README.md for what each scenario does and what each column means.
// Node built-ins only: no npm dependencies beyond tsx to run it.

import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import * as fs from 'node:fs';
import * as fsp from 'node:fs/promises';
import * as os from 'node:os';
import * as path from 'node:path';
import { performance } from 'node:perf_hooks';
import { benchArgs, orUsage, cleanUpOnSignals, CLI, CLI_SHOWN, failedRuns, KiB, MiB, pickList, Proc, REPO, RSYNC_BIN, UsageError, commandLine, describeExit, flushWorkFs, fmtBytes, fmtRatio, fmtRss, fmtS, killAll, machineInfo, markdown, rmf, sh, tail, textTable, withTimeout, type Machine, runMain, intOption } from './common.js';
import { XorShift128, sha256Async } from '../__test__/helpers/data';
import { aggregate, lastSummary, runFfsyncPair, runRsync, type Aggregate, type TimedSample, type ToolRuns } from './runners.js';

const BLOCK = MiB; // fixture I/O granularity: never hold a whole file in memory

const SSH_OPTS = ['-o', 'BatchMode=yes', '-o', 'StrictHostKeyChecking=no', '-o', 'ConnectTimeout=5'];

// Edits applied to produce the "modified" file (all at seeded positions in the old file).
const EDIT_OVERWRITES = 20;
const EDIT_OVERWRITE_LEN = 64 * KiB;
const EDIT_INSERTS = 5;
const EDIT_INSERT_LEN = 4 * KiB;
const EDIT_DELETES = 5;
const EDIT_DELETE_LEN = 8 * KiB;
const APPEND_LEN = 8 * MiB;
const MIN_SIZE_MIB = 4;

// PRNG stream ids (one independent xorshift128 stream per purpose).
const STREAM_BASE = 0;
const STREAM_EDIT_POS = 1;
const STREAM_EDIT_DATA = 2;
const STREAM_APPEND = 3;

// ---------------------------------------------------------------------------------------------
// Options

type ScenarioName = 'fresh' | 'identical' | 'modified' | 'appended' | 'identical-warm' | 'modified-warm' | 'appended-warm';
type FixtureKind = 'old' | 'mod' | 'app';

interface ScenarioDef {
  name: ScenarioName;
  /** Content the sender pushes in the timed run. */
  source: FixtureKind;
  /** What the target holds before the timed run ('none' = absent). */
  target: 'none' | 'old';
  /** Both peers keep state dirs from a previous successful sync of the old version. */
  warm: boolean;
}

const SCENARIOS: readonly ScenarioDef[] = [
  { name: 'fresh', source: 'old', target: 'none', warm: false },
  { name: 'identical', source: 'old', target: 'old', warm: false },
  { name: 'modified', source: 'mod', target: 'old', warm: false },
  { name: 'appended', source: 'app', target: 'old', warm: false },
  { name: 'identical-warm', source: 'old', target: 'old', warm: true },
  { name: 'modified-warm', source: 'mod', target: 'old', warm: true },
  { name: 'appended-warm', source: 'app', target: 'old', warm: true },
];
const DEFAULT_SCENARIOS: readonly ScenarioName[] = ['fresh', 'identical', 'modified', 'appended', 'identical-warm', 'modified-warm'];

interface Options {
  sizeMib: number;
  scenarios: ScenarioDef[];
  out: string;
  seed: number;
  repeat: number;
  rssSizes: number[] | undefined;
  timeoutMs: number;
  workDir: string;
  keep: boolean;
  scan: boolean;
  ssh: boolean;
  rsyncFsync: boolean;
  durability: boolean;
}

const HELP = `usage: node --import tsx bench/run.ts [options]

  --size-mib N         single-file size in MiB (default 1024, minimum ${MIN_SIZE_MIB})
  --scenarios a,b      subset of: ${SCENARIOS.map((s) => s.name).join(', ')}
                       (default: ${DEFAULT_SCENARIOS.join(',')})
  --out FILE           results file (default bench/RESULTS.md; bench/RESULTS-rss.md with --rss-sizes)
  --repeat N           timed runs per tool and scenario; the median is reported (default 1)
  --seed N             fixture seed, unsigned 32-bit (default 1)
  --rss-sizes a,b,c    RSS-flatness mode: only the fresh scenario at each size (MiB)
  --timeout-s N        per-run timeout in seconds, prep sync included (default 600)
  --work-dir DIR       where fixtures and targets live (default bench/work; gitignored)
  --keep               keep fixtures and targets afterwards
  --no-scan            skip the scan_throughput line (cargo run --release --example scan_throughput)
  --no-ssh             do not try rsync over ssh to localhost
  --no-rsync-fsync     skip the rsync --fsync baseline
  --durability         also time ffsync-native --no-fsync and \`cp && sync -f\` (the durable-write
                       floor), and add the durable-writes table (bench/README.md)
  -h, --help           this text
`;

function parseOptions(argv: string[]): Options {
  const values = benchArgs(
    argv,
    {
      'size-mib': { type: 'string' },
      scenarios: { type: 'string' },
      out: { type: 'string' },
      repeat: { type: 'string' },
      seed: { type: 'string' },
      'rss-sizes': { type: 'string' },
      'timeout-s': { type: 'string' },
      'work-dir': { type: 'string' },
      keep: { type: 'boolean' },
      'no-scan': { type: 'boolean' },
      'no-ssh': { type: 'boolean' },
      'no-rsync-fsync': { type: 'boolean' },
      durability: { type: 'boolean' },
    },
    HELP,
  );
  const sizeMib = intOption('size-mib', values['size-mib'], 1024, MIN_SIZE_MIB, 1 << 20);
  const names = pickList('scenarios', values.scenarios, SCENARIOS.map((s) => s.name), DEFAULT_SCENARIOS);
  const scenarios = SCENARIOS.filter((s) => names.includes(s.name));
  let rssSizes: number[] | undefined;
  if (values['rss-sizes'] !== undefined) {
    rssSizes = values['rss-sizes'].split(',').map((s) => intOption('rss-sizes', s.trim(), 0, MIN_SIZE_MIB, 1 << 20));
    if (rssSizes.length === 0) throw new UsageError('--rss-sizes: empty list');
  }
  const out = path.resolve(values.out ?? path.join(REPO, 'bench', rssSizes ? 'RESULTS-rss.md' : 'RESULTS.md'));
  return {
    sizeMib,
    scenarios,
    out,
    seed: intOption('seed', values.seed, 1, 0, 0xffffffff),
    repeat: intOption('repeat', values.repeat, 1, 1, 100),
    rssSizes,
    timeoutMs: intOption('timeout-s', values['timeout-s'], 600, 1, 86400) * 1000,
    workDir: path.resolve(values['work-dir'] ?? path.join(REPO, 'bench', 'work')),
    keep: Boolean(values.keep),
    scan: !values['no-scan'],
    ssh: !values['no-ssh'],
    rsyncFsync: !values['no-rsync-fsync'],
    durability: Boolean(values.durability),
  };
}

// ---------------------------------------------------------------------------------------------
// Fixtures

interface Fixture {
  kind: FixtureKind;
  path: string;
  size: number;
  sha256: string;
}

interface Edit {
  kind: 'overwrite' | 'insert' | 'delete';
  /** Offset in the old file. */
  offset: number;
  len: number;
}

/** Writes to a file handle and hashes what it writes. */
class HashingWriter {
  private readonly hash = createHash('sha256');
  written = 0;
  constructor(private readonly fh: fsp.FileHandle) {}

  async write(buf: Buffer, len = buf.length): Promise<void> {
    let off = 0;
    while (off < len) {
      const { bytesWritten } = await this.fh.write(buf, off, len - off, this.written);
      off += bytesWritten;
      this.written += bytesWritten;
    }
    this.hash.update(buf.subarray(0, len));
  }

  digest(): string {
    return this.hash.digest('hex');
  }
}

async function withWriter(file: string, body: (w: HashingWriter) => Promise<void>): Promise<{ size: number; sha256: string }> {
  const fh = await fsp.open(file, 'w');
  try {
    const w = new HashingWriter(fh);
    await body(w);
    await fh.sync();
    return { size: w.written, sha256: w.digest() };
  } finally {
    await fh.close();
  }
}

async function writeRandom(w: HashingWriter, rng: XorShift128, len: number, buf: Buffer): Promise<void> {
  let left = len;
  while (left > 0) {
    const n = Math.min(left, buf.length);
    const part = buf.subarray(0, n);
    rng.fill(part);
    await w.write(part);
    left -= n;
  }
}

/** Streams [start, end) of src into w through a block buffer. */
async function copyRange(src: fsp.FileHandle, start: number, end: number, w: HashingWriter, buf: Buffer): Promise<void> {
  let pos = start;
  while (pos < end) {
    const want = Math.min(buf.length, end - pos);
    const { bytesRead } = await src.read(buf, 0, want, pos);
    if (bytesRead <= 0) throw new Error(`unexpected end of file at ${pos} (wanted ${end})`);
    await w.write(buf, bytesRead);
    pos += bytesRead;
  }
}

async function genBase(file: string, size: number, seed: number): Promise<Fixture> {
  const rng = new XorShift128(seed, STREAM_BASE);
  const buf = Buffer.allocUnsafeSlow(BLOCK);
  const r = await withWriter(file, (w) => writeRandom(w, rng, size, buf));
  return { kind: 'old', path: file, ...r };
}

/** Seeded, non-overlapping edit positions: one edit per equal slot of the old file, kinds shuffled. */
function planEdits(oldSize: number, seed: number): Edit[] {
  const rng = new XorShift128(seed, STREAM_EDIT_POS);
  const kinds: Edit['kind'][] = [
    ...Array<Edit['kind']>(EDIT_OVERWRITES).fill('overwrite'),
    ...Array<Edit['kind']>(EDIT_INSERTS).fill('insert'),
    ...Array<Edit['kind']>(EDIT_DELETES).fill('delete'),
  ];
  for (let i = kinds.length - 1; i > 0; i--) {
    const j = rng.below(i + 1);
    [kinds[i], kinds[j]] = [kinds[j]!, kinds[i]!];
  }
  const slot = Math.floor(oldSize / kinds.length);
  return kinds.map((kind, i) => {
    const len = kind === 'overwrite' ? EDIT_OVERWRITE_LEN : kind === 'insert' ? EDIT_INSERT_LEN : EDIT_DELETE_LEN;
    const span = kind === 'insert' ? 0 : len; // bytes of the old file the edit consumes
    const offset = i * slot + rng.below(slot - span + 1);
    return { kind, offset, len };
  });
}

async function genModified(old: Fixture, file: string, seed: number): Promise<{ fixture: Fixture; edits: Edit[] }> {
  const edits = planEdits(old.size, seed);
  const data = new XorShift128(seed, STREAM_EDIT_DATA);
  const buf = Buffer.allocUnsafeSlow(BLOCK);
  const editBuf = Buffer.allocUnsafeSlow(EDIT_OVERWRITE_LEN);
  const src = await fsp.open(old.path, 'r');
  try {
    const r = await withWriter(file, async (w) => {
      let pos = 0; // next unread offset in the old file
      for (const e of edits) {
        await copyRange(src, pos, e.offset, w, buf);
        pos = e.offset;
        if (e.kind === 'overwrite') {
          await writeRandom(w, data, e.len, editBuf);
          pos += e.len;
        } else if (e.kind === 'insert') {
          await writeRandom(w, data, e.len, editBuf);
        } else {
          pos += e.len;
        }
      }
      await copyRange(src, pos, old.size, w, buf);
    });
    return { fixture: { kind: 'mod', path: file, ...r }, edits };
  } finally {
    await src.close();
  }
}

async function genAppended(old: Fixture, file: string, seed: number): Promise<Fixture> {
  const rng = new XorShift128(seed, STREAM_APPEND);
  const buf = Buffer.allocUnsafeSlow(BLOCK);
  const src = await fsp.open(old.path, 'r');
  try {
    const r = await withWriter(file, async (w) => {
      await copyRange(src, 0, old.size, w, buf);
      await writeRandom(w, rng, APPEND_LEN, buf);
    });
    return { kind: 'app', path: file, ...r };
  } finally {
    await src.close();
  }
}

// ---------------------------------------------------------------------------------------------
// One sync with each tool

type ToolName = 'ffsync' | 'ffsync-nofsync' | 'ffsync-local' | 'ffsync-local-nofsync' | 'rsync' | 'rsync-fsync' | 'rsync-ssh' | 'cp-sync';

interface Sample extends TimedSample {
  literal?: number;
  matched?: number;
  decidedBy?: string;
  upToDate?: boolean;
}

let rssSeq = 0;
function rssPath(ctx: RunCtx, label: string): string {
  return path.join(ctx.dirs.tmp, `rss-${++rssSeq}-${label.replace(/[^a-z0-9-]+/gi, '_')}.txt`);
}

async function ffsyncSync(ctx: RunCtx, src: string, dst: string, sr: string, ss: string, label: string, recvArgs: string[] = []): Promise<Sample> {
  const rssFile = (peer: 'receiver' | 'sender') => rssPath(ctx, `${label}-${peer === 'receiver' ? 'recv' : 'send'}`);
  const r = await runFfsyncPair({ label, src, dst, stateR: sr, stateS: ss, recvArgs, rssFile });
  return {
    wallMs: r.wallMs,
    senderToExitMs: r.senderToExitMs,
    wire: r.sender.bytesOnWire,
    literal: r.sender.literalBytes,
    matched: r.sender.matchedBytes,
    decidedBy: r.sender.decidedBy ?? r.receiver.decidedBy,
    upToDate: r.sender.upToDate ?? r.receiver.upToDate,
    summaryMs: { sender: r.sender.durationMs, receiver: r.receiver.durationMs },
    rssKb: r.rssKb,
    note: r.notes.length ? r.notes.join('; ') : undefined,
  };
}

/** `sync SRC DST` between two local paths, as a user copies a file on one machine: both peers in one
 * process (the file's data copied from the source in the kernel and verified, decisions §111). */
async function ffsyncLocal(ctx: RunCtx, src: string, dst: string, state: string, label: string, extra: string[]): Promise<Sample> {
  const t0 = performance.now();
  const p = new Proc(label, [process.execPath, CLI, 'sync', src, dst, '--json', '--state-dir', state, ...extra], { rssFile: rssPath(ctx, label) });
  try {
    const e = await p.exited;
    const s = lastSummary(p.lines);
    if (e.code !== 0 || !s) throw new Error(`${label}: sync ${describeExit(e)}; stderr: ${tail(p.stderr)}`);
    return {
      wallMs: e.at - t0,
      wire: s.bytesOnWire,
      literal: s.literalBytes,
      matched: s.matchedBytes,
      decidedBy: s.decidedBy,
      upToDate: s.upToDate,
      summaryMs: { sender: s.durationMs, receiver: s.durationMs },
      rssKb: { all: await p.peakRssKb() },
    };
  } catch (err) {
    p.kill();
    throw err;
  }
}

/** The durable-write floor: copy the whole new file and flush its filesystem (no hashing, no network). */
async function cpSync(ctx: RunCtx, src: string, dst: string, label: string): Promise<Sample> {
  const t0 = performance.now();
  const p = new Proc(label, ['sh', '-c', 'cp -- "$0" "$1" && sync -f "$1"', src, dst], { rssFile: rssPath(ctx, label) });
  try {
    const e = await p.exited;
    if (e.code !== 0) throw new Error(`${label}: cp && sync ${describeExit(e)}; stderr: ${tail(p.stderr)}`);
    return { wallMs: e.at - t0, wire: { sent: 0, received: 0 }, rssKb: { all: await p.peakRssKb() } };
  } catch (err) {
    p.kill();
    throw err;
  }
}

async function rsyncSync(ctx: RunCtx, tool: 'rsync' | 'rsync-fsync' | 'rsync-ssh', src: string, dst: string, label: string): Promise<Sample> {
  const args = ['--no-whole-file'];
  if (tool === 'rsync-fsync') args.push('--fsync');
  if (tool === 'rsync-ssh') args.push('-e', ['ssh', ...SSH_OPTS].join(' '), src, `localhost:${dst}`);
  else args.push(src, dst);
  const r = await runRsync(label, args, rssPath(ctx, label));
  return {
    wallMs: r.wallMs,
    wire: { sent: r.stats.sent, received: r.stats.received },
    literal: r.stats.literal,
    matched: r.stats.matched,
    rssKb: { all: r.rssKb },
  };
}

// ---------------------------------------------------------------------------------------------
// Scenarios

interface Dirs {
  root: string;
  fixtures: string;
  dst: string;
  src: string;
  state: string;
  tmp: string;
}

interface RunCtx {
  opts: Options;
  dirs: Dirs;
  fixtures: Partial<Record<FixtureKind, Fixture>>;
  tools: ToolName[];
}

interface ToolResult extends ToolRuns<Sample> {
  tool: ToolName;
}

interface ScenarioResult {
  scenario: ScenarioDef;
  sizeMib: number;
  tools: ToolResult[];
}

const MTIME_SHIFT_S = 86_400;

/** Copies from -> to as a new file (new inode), optionally with a given mtime. */
async function placeCopy(from: string, to: string, mtime?: Date): Promise<void> {
  await rmf(to);
  await fsp.copyFile(from, to);
  if (mtime) await fsp.utimes(to, mtime, mtime);
}

async function freshStateDirs(ctx: RunCtx, label: string): Promise<{ sr: string; ss: string }> {
  const base = await fsp.mkdtemp(path.join(ctx.dirs.state, `${label}-`));
  const sr = path.join(base, 'receiver');
  const ss = path.join(base, 'sender');
  await fsp.mkdir(sr, { recursive: true });
  await fsp.mkdir(ss, { recursive: true });
  return { sr, ss };
}

async function syncWith(ctx: RunCtx, tool: ToolName, src: string, dst: string, state: { sr: string; ss: string }, label: string): Promise<Sample> {
  if (tool === 'ffsync') return ffsyncSync(ctx, src, dst, state.sr, state.ss, label);
  if (tool === 'ffsync-nofsync') return ffsyncSync(ctx, src, dst, state.sr, state.ss, label, ['--no-fsync']);
  if (tool === 'ffsync-local') return ffsyncLocal(ctx, src, dst, state.ss, label, []);
  if (tool === 'ffsync-local-nofsync') return ffsyncLocal(ctx, src, dst, state.ss, label, ['--no-fsync']);
  if (tool === 'cp-sync') return cpSync(ctx, src, dst, label);
  return rsyncSync(ctx, tool, src, dst, label);
}

async function verify(label: string, src: string, dst: string, expected: string): Promise<void> {
  const [hs, hd] = await Promise.all([sha256Async(src), sha256Async(dst)]);
  if (hs !== expected) throw new VerifyError(`${label}: SOURCE CHANGED: sha256(${src}) = ${hs}, expected ${expected}`);
  if (hd !== hs) throw new VerifyError(`${label}: VERIFICATION FAILED: sha256(target) = ${hd} != sha256(source) = ${hs}`);
}

class VerifyError extends Error {}

/** One timed run of one tool in one scenario, with its own reset and (for warm) prep sync. */
async function runOnce(ctx: RunCtx, scn: ScenarioDef, tool: ToolName, rep: number): Promise<Sample> {
  const old = ctx.fixtures.old!;
  const srcFx = ctx.fixtures[scn.source]!;
  const label = `${scn.name}/${tool}#${rep + 1}`;
  const dst = path.join(ctx.dirs.dst, 'target.bin');
  const state = await freshStateDirs(ctx, `${scn.name}-${tool}-${rep}`);
  try {
    let src: string;
    await rmf(dst);
    if (!scn.warm) {
      src = srcFx.path;
      if (scn.target === 'old') {
        const srcMtime = (await fsp.stat(src)).mtime;
        await placeCopy(old.path, dst, new Date(srcMtime.getTime() - MTIME_SHIFT_S * 1000));
      }
    } else {
      // Previous successful sync of the old version with these same state dirs, then (maybe) edit the source.
      // The source's mtime is pinned a day back: rsync (no -t) stamps its output with the transfer time, so
      // without this its warm re-run would be a quick-check no-op or a full pass depending on the clock second.
      src = path.join(ctx.dirs.src, 'source.bin');
      await placeCopy(old.path, src, new Date(Date.now() - MTIME_SHIFT_S * 1000));
      flushWorkFs(ctx.dirs.root);
      await syncWith(ctx, tool, src, dst, state, `${label} prep`);
      await verify(`${label} prep`, src, dst, old.sha256);
      if (scn.source !== 'old') {
        await fsp.copyFile(srcFx.path, src); // rewrite the source in place (same path, same inode)
        const now = new Date();
        await fsp.utimes(src, now, now);
      }
    }
    flushWorkFs(ctx.dirs.root);
    const sample = await syncWith(ctx, tool, src, dst, state, label);
    await verify(label, src, dst, srcFx.sha256);
    return sample;
  } finally {
    await rmf(path.dirname(state.sr));
  }
}

/** `list` starting at position `by` (mod its length), wrapping around. */
function rotated<T>(list: T[], by: number): T[] {
  const k = list.length ? by % list.length : 0;
  return [...list.slice(k), ...list.slice(0, k)];
}

async function runScenario(ctx: RunCtx, scn: ScenarioDef, sizeMib: number): Promise<ScenarioResult> {
  const results: ToolResult[] = ctx.tools.map((tool) => ({ tool, samples: [] }));
  for (let rep = 0; rep < ctx.opts.repeat; rep++) {
    // Each round starts with the next tool: on this disk every tool runs slower for a while after
    // runs that wrote a gigabyte each (decisions §114), and a fixed order would hand that to the
    // same tool's runs every round.
    for (const r of rotated(results, rep)) {
      if (r.error) continue;
      const label = `${scn.name}/${r.tool}#${rep + 1}`;
      try {
        const s = await withTimeout(ctx.opts.timeoutMs, label, () => runOnce(ctx, scn, r.tool, rep));
        r.samples.push(s);
        r.verified = true;
        process.stderr.write(`  ${label.padEnd(28)} ${fmtS(s.wallMs).padStart(8)} s  wire ${fmtBytes(s.wire.sent + s.wire.received).padStart(10)}  verified\n`);
      } catch (e) {
        killAll();
        const msg = e instanceof Error ? e.message : String(e);
        r.error = msg;
        if (e instanceof VerifyError) r.verified = false;
        process.stderr.write(`\n!!!!! ${label} FAILED: ${msg}\n\n`);
      }
    }
  }
  return { scenario: scn, sizeMib, tools: results };
}

// ---------------------------------------------------------------------------------------------
// Environment

function sshStatus(enabled: boolean): { ok: boolean; note: string } {
  if (!enabled) return { ok: false, note: 'ssh: skipped (--no-ssh)' };
  const r = spawnSync('ssh', [...SSH_OPTS, 'localhost', 'true'], { encoding: 'utf8', timeout: 10_000 });
  if (r.status === 0) return { ok: true, note: 'ssh: rsync over ssh to localhost measured (-e "ssh -o BatchMode=yes")' };
  const why = (r.error?.message ?? r.stderr ?? '').trim().split('\n').pop() || `exit ${r.status}`;
  return { ok: false, note: `ssh: not available (${why})` };
}

async function runScan(file: string, timeoutMs: number): Promise<string> {
  const home = path.join(os.homedir(), '.cargo', 'bin', 'cargo');
  const cargo = sh('cargo', ['--version']) ? 'cargo' : fs.existsSync(home) ? home : undefined;
  if (!cargo) return 'not measured (cargo not found)';
  const argv = [cargo, 'run', '--release', '-q', '-p', 'ffsync_core', '--example', 'scan_throughput', '--', file];
  const p = new Proc('scan_throughput', argv);
  try {
    const e = await withTimeout(timeoutMs, 'scan_throughput', () => p.exited);
    const out = p.lines.join('\n').trim();
    if (e.code !== 0) return `failed (${describeExit(e)}): ${tail(p.stderr, 300)}`;
    const m = /([\d.]+)\s*GB\/s/.exec(out);
    return m ? `${m[1]} GB/s — \`${out.split('\n').pop()}\`` : `unparsed output: ${out}`;
  } catch (err) {
    p.kill();
    return `failed: ${err instanceof Error ? err.message : String(err)}`;
  }
}

// ---------------------------------------------------------------------------------------------
// Formatting

type Agg = Aggregate<Sample>;
const agg = (r: ToolResult | undefined): Agg => aggregate(r);

function cell(a: Agg, tr: ToolResult | undefined, v: string): string {
  if (!tr) return 'n/a';
  return a.ok ? v : tr.verified === false ? 'MISMATCH' : 'FAILED';
}

function verifiedCell(sr: ScenarioResult): string {
  const bad = sr.tools.filter((t) => t.verified !== true);
  if (bad.length === 0) return `yes (${sr.tools.length}/${sr.tools.length})`;
  return `NO: ${bad.map((t) => `${t.tool} ${t.verified === false ? 'mismatch' : 'failed'}`).join(', ')}`;
}

function mainTable(results: ScenarioResult[], tools: ToolName[]): { head: string[]; rows: string[][] } {
  const ssh = tools.includes('rsync-ssh');
  const fsyncCol = tools.includes('rsync-fsync');
  const head = ['scenario', 'ffsync s', 'rsync s'];
  if (fsyncCol) head.push('rsync --fsync s');
  if (ssh) head.push('rsync ssh s');
  head.push('speedup vs rsync');
  if (fsyncCol) head.push('speedup vs rsync --fsync');
  if (ssh) head.push('speedup vs rsync ssh');
  head.push('ffsync wire', 'rsync wire', 'wire ratio rsync/ffsync', 'ffsync literal', 'ffsync RSS sender MiB', 'ffsync RSS receiver MiB', 'rsync RSS MiB', 'ffsync decided by', 'verified');
  const rows = results.map((sr) => {
    const t = (n: ToolName) => sr.tools.find((x) => x.tool === n);
    const f = agg(t('ffsync'));
    const r = agg(t('rsync'));
    const rf = agg(t('rsync-fsync'));
    const rs = agg(t('rsync-ssh'));
    const row = [sr.scenario.name, cell(f, t('ffsync'), fmtS(f.wallMs)), cell(r, t('rsync'), fmtS(r.wallMs))];
    if (fsyncCol) row.push(cell(rf, t('rsync-fsync'), fmtS(rf.wallMs)));
    if (ssh) row.push(cell(rs, t('rsync-ssh'), fmtS(rs.wallMs)));
    row.push(fmtRatio(r.wallMs, f.wallMs));
    if (fsyncCol) row.push(fmtRatio(rf.wallMs, f.wallMs));
    if (ssh) row.push(fmtRatio(rs.wallMs, f.wallMs));
    const fs0 = f.sample;
    row.push(
      fmtBytes(f.wire),
      fmtBytes(r.wire),
      fmtRatio(r.wire, f.wire),
      fmtBytes(fs0?.literal),
      fmtRss(f.rssSender),
      fmtRss(f.rssReceiver),
      fmtRss(r.rssAll),
      fs0 ? `${fs0.decidedBy ?? '?'}${fs0.upToDate ? ' (up to date)' : ''}` : '—',
      verifiedCell(sr),
    );
    return row;
  });
  return { head, rows };
}

/** `--durability`: ffsync-native durable and --no-fsync beside rsync, rsync --fsync and the
 * `cp && sync -f` floor (issue 18's targets: durable <= 1.15x the floor and >= 1.3x faster
 * than rsync --fsync; --no-fsync >= 1x rsync), for `send`/`receive` (`durable`, `noFsync`:
 * 'ffsync', 'ffsync-nofsync') or for `sync` between two local paths (the local tools; the
 * rsync rows are local either way). `label` names the ffsync columns. */
function durabilityTable(
  results: ScenarioResult[],
  durable: ToolName = 'ffsync',
  noFsync: ToolName = 'ffsync-nofsync',
  label = 'ffsync',
): { head: string[]; rows: string[][] } {
  const head = ['scenario', `${label} s`, `${label} --no-fsync s`, 'rsync s', 'rsync --fsync s', 'cp && sync s', `${label} / cp && sync`, 'speedup vs rsync --fsync', '--no-fsync speedup vs rsync', 'verified'];
  const rows = results.map((sr) => {
    const t = (n: ToolName) => sr.tools.find((x) => x.tool === n);
    const [f, nf, r, rf, cp] = ([durable, noFsync, 'rsync', 'rsync-fsync', 'cp-sync'] as const).map((n) => agg(t(n)));
    const over = f!.ok && cp!.ok ? `${(f!.wallMs! / cp!.wallMs!).toFixed(2)}x` : '—';
    return [
      sr.scenario.name,
      cell(f!, t(durable), fmtS(f!.wallMs)),
      cell(nf!, t(noFsync), fmtS(nf!.wallMs)),
      cell(r!, t('rsync'), fmtS(r!.wallMs)),
      cell(rf!, t('rsync-fsync'), fmtS(rf!.wallMs)),
      cell(cp!, t('cp-sync'), fmtS(cp!.wallMs)),
      over,
      fmtRatio(rf!.wallMs, f!.wallMs),
      fmtRatio(r!.wallMs, nf!.wallMs),
      verifiedCell(sr),
    ];
  });
  return { head, rows };
}

function detailTable(results: ScenarioResult[]): { head: string[]; rows: string[][] } {
  const head = ['scenario', 'tool', 'wall s (each run)', 'sender→exit s', 'summary ms snd/rcv', 'wire sent', 'wire received', 'literal', 'matched', 'peak RSS KiB', 'notes'];
  const rows: string[][] = [];
  for (const sr of results) {
    for (const tr of sr.tools) {
      const s = tr.samples[tr.samples.length - 1];
      const rss = !s ? '—' : tr.tool.startsWith('ffsync-local') ? `${s.rssKb.all ?? '?'} (one process)` : tr.tool.startsWith('ffsync') ? `snd ${s.rssKb.sender ?? '?'} / rcv ${s.rssKb.receiver ?? '?'}` : `${s.rssKb.all ?? '?'} (max proc)`;
      const notes = [tr.error ? `**${tr.verified === false ? 'MISMATCH' : 'FAILED'}**: ${tr.error}` : '', s?.decidedBy ? `decidedBy=${s.decidedBy}, upToDate=${s.upToDate}` : '', s?.note ?? '']
        .filter(Boolean)
        .join('; ');
      rows.push([
        sr.scenario.name,
        tr.tool,
        tr.samples.map((x) => fmtS(x.wallMs)).join(', ') || '—',
        tr.samples.map((x) => fmtS(x.senderToExitMs)).join(', ') || '—',
        s?.summaryMs ? `${s.summaryMs.sender} / ${s.summaryMs.receiver}` : '—',
        s ? String(s.wire.sent) : '—',
        s ? String(s.wire.received) : '—',
        s?.literal !== undefined ? String(s.literal) : '—',
        s?.matched !== undefined ? String(s.matched) : '—',
        rss,
        notes || '',
      ]);
    }
  }
  return { head, rows };
}

function rssTable(results: ScenarioResult[]): { head: string[]; rows: string[][] } {
  const head = ['size MiB', 'ffsync s', 'rsync s', 'speedup vs rsync', 'ffsync RSS sender MiB', 'ffsync RSS receiver MiB', 'rsync RSS MiB', 'ffsync wire', 'rsync wire', 'verified'];
  const rows = results.map((sr) => {
    const t = (n: ToolName) => sr.tools.find((x) => x.tool === n);
    const f = agg(t('ffsync'));
    const r = agg(t('rsync'));
    return [
      String(sr.sizeMib),
      cell(f, t('ffsync'), fmtS(f.wallMs)),
      cell(r, t('rsync'), fmtS(r.wallMs)),
      fmtRatio(r.wallMs, f.wallMs),
      fmtRss(f.rssSender),
      fmtRss(f.rssReceiver),
      fmtRss(r.rssAll),
      fmtBytes(f.wire),
      fmtBytes(r.wire),
      verifiedCell(sr),
    ];
  });
  return { head, rows };
}

// ---------------------------------------------------------------------------------------------
// Main

let cleanupRoot: string | undefined;
let keepWork = false;

async function cleanup(): Promise<void> {
  killAll();
  if (cleanupRoot && !keepWork) {
    await rmf(cleanupRoot);
    cleanupRoot = undefined;
  }
}

function checkPrereqs(): void {
  if (!fs.existsSync(CLI)) throw new Error(`${CLI} not found: build first (npm run build)`);
  if (!sh(RSYNC_BIN, ['--version'])) throw new Error('rsync not found');
}

async function makeDirs(opts: Options): Promise<Dirs> {
  await fsp.mkdir(opts.workDir, { recursive: true });
  const root = await fsp.mkdtemp(path.join(opts.workDir, `run-${new Date().toISOString().replace(/[:.]/g, '-')}-`));
  cleanupRoot = root;
  const d: Dirs = {
    root,
    fixtures: path.join(root, 'fixtures'),
    dst: path.join(root, 'dst'),
    src: path.join(root, 'src'),
    state: path.join(root, 'state'),
    tmp: path.join(root, 'tmp'),
  };
  for (const p of [d.fixtures, d.dst, d.src, d.state, d.tmp]) await fsp.mkdir(p, { recursive: true });
  return d;
}

async function checkSpace(dir: string, needBytes: number): Promise<void> {
  try {
    const st = await fsp.statfs(dir);
    const free = st.bavail * st.bsize;
    if (free < needBytes) throw new Error(`not enough free space in ${dir}: ${fmtBytes(free)} free, about ${fmtBytes(needBytes)} needed`);
  } catch (e) {
    if (e instanceof Error && e.message.startsWith('not enough')) throw e;
  }
}

async function makeFixtures(ctx: RunCtx, sizeMib: number, kinds: Set<FixtureKind>): Promise<Edit[] | undefined> {
  const size = sizeMib * MiB;
  const t0 = performance.now();
  process.stderr.write(`generating fixtures (${sizeMib} MiB, seed ${ctx.opts.seed}) in ${ctx.dirs.fixtures} …\n`);
  const old = await genBase(path.join(ctx.dirs.fixtures, `old-${sizeMib}.bin`), size, ctx.opts.seed);
  ctx.fixtures = { old };
  let edits: Edit[] | undefined;
  if (kinds.has('mod')) {
    const m = await genModified(old, path.join(ctx.dirs.fixtures, `mod-${sizeMib}.bin`), ctx.opts.seed);
    ctx.fixtures.mod = m.fixture;
    edits = m.edits;
  }
  if (kinds.has('app')) ctx.fixtures.app = await genAppended(old, path.join(ctx.dirs.fixtures, `app-${sizeMib}.bin`), ctx.opts.seed);
  const list = Object.values(ctx.fixtures).map((f) => `${f.kind} ${f.size} B sha256 ${f.sha256.slice(0, 16)}…`);
  process.stderr.write(`  ${list.join('\n  ')}\n  (${fmtS(performance.now() - t0)} s)\n`);
  return edits;
}

function header(opts: Options, m: Machine, sshNote: string, extra: string[]): string {
  return [
    `Command: \`${commandLine()}\`  (cwd ${process.cwd()})`,
    '',
    `- date: ${m.date}`,
    `- machine: ${m.nproc} CPUs (${m.cpu}), ${m.memory} RAM, kernel ${m.kernel}, load average at start ${m.load}`,
    `- work dir: ${opts.workDir} on ${m.fs}`,
    `- rsync: ${m.rsync} (${RSYNC_BIN})`,
    `- node: ${m.node}; ffsync-native ${m.ffsync} (${CLI_SHOWN}), commit ${m.commit}`,
    `- peak RSS measured with ${m.rssMethod}`,
    `- ${sshNote}`,
    `- seed ${opts.seed}, ${opts.repeat} timed run(s) per tool and scenario (median shown)`,
    ...extra,
  ].join('\n');
}

async function main(): Promise<number> {
  const opts = orUsage(HELP, () => parseOptions(process.argv.slice(2)));
  keepWork = opts.keep;
  checkPrereqs();
  await fsp.mkdir(opts.workDir, { recursive: true }); // df -T needs it to exist
  const m = machineInfo(opts.workDir);
  const ssh = sshStatus(opts.ssh);
  process.stderr.write(`${ssh.note}\n`);
  const tools: ToolName[] = ['ffsync', 'rsync'];
  if (opts.rsyncFsync && !opts.rssSizes) tools.push('rsync-fsync');
  if (ssh.ok && !opts.rssSizes) tools.push('rsync-ssh');
  if (opts.durability && !opts.rssSizes) {
    tools.splice(1, 0, 'ffsync-nofsync', 'ffsync-local', 'ffsync-local-nofsync');
    tools.push('cp-sync');
  }

  const dirs = await makeDirs(opts);
  const ctx: RunCtx = { opts, dirs, fixtures: {}, tools };
  const results: ScenarioResult[] = [];
  let out: string;

  if (opts.rssSizes) {
    const fresh = SCENARIOS.find((s) => s.name === 'fresh')!;
    for (const size of opts.rssSizes) {
      await checkSpace(opts.workDir, size * MiB * 2 + 64 * MiB);
      await makeFixtures(ctx, size, new Set(['old']));
      process.stderr.write(`fresh at ${size} MiB:\n`);
      results.push(await runScenario(ctx, fresh, size));
      await rmf(path.join(dirs.dst, 'target.bin'));
      await rmf(ctx.fixtures.old!.path);
    }
    const t = rssTable(results);
    process.stdout.write(`\nRSS flatness (fresh scenario)\n${textTable(t)}\n`);
    out = [
      '# ffsync-native RSS flatness (fresh single file)',
      '',
      header(opts, m, ssh.note, [`- sizes: ${opts.rssSizes.join(', ')} MiB; tools: ${tools.join(', ')}`]),
      '',
      markdown(t),
      '',
      '## Details',
      '',
      markdown(detailTable(results)),
      '',
    ].join('\n');
  } else {
    const kinds = new Set<FixtureKind>(['old', ...opts.scenarios.map((s) => s.source)]);
    await checkSpace(opts.workDir, opts.sizeMib * MiB * (kinds.size + 3) + 64 * MiB);
    const edits = await makeFixtures(ctx, opts.sizeMib, kinds);
    for (const scn of opts.scenarios) {
      process.stderr.write(`${scn.name}:\n`);
      results.push(await runScenario(ctx, scn, opts.sizeMib));
    }
    let scan = 'skipped (--no-scan)';
    if (opts.scan) {
      process.stderr.write('scan: cargo run --release -q -p ffsync_core --example scan_throughput …\n');
      scan = await runScan(ctx.fixtures.old!.path, opts.timeoutMs);
    }
    const t = mainTable(results, tools);
    const dt = opts.durability ? durabilityTable(results) : undefined;
    const lt = opts.durability ? durabilityTable(results, 'ffsync-local', 'ffsync-local-nofsync', 'ffsync sync') : undefined;
    process.stdout.write(`\n${textTable(t)}\n${dt ? `\nDurable writes\n${textTable(dt)}\n` : ''}${lt ? `\nDurable writes, sync between local paths\n${textTable(lt)}\n` : ''}\nscan: ${scan}\n${ssh.note}\n`);
    const fx = ctx.fixtures;
    const fixtureLines = [
      `- file size: ${opts.sizeMib} MiB (${opts.sizeMib * MiB} bytes); old sha256 ${fx.old!.sha256.slice(0, 16)}…`,
      fx.mod ? `- modified: ${fx.mod.size} bytes; ${EDIT_OVERWRITES}×64 KiB overwrites, ${EDIT_INSERTS}×4 KiB insertions, ${EDIT_DELETES}×8 KiB deletions at seeded offsets` : '',
      fx.app ? `- appended: ${fx.app.size} bytes (old + ${APPEND_LEN / MiB} MiB)` : '',
      `- scan (\`cargo run --release -q -p ffsync_core --example scan_throughput -- old.bin\`): ${scan}`,
    ].filter(Boolean);
    out = [
      '# ffsync-native vs rsync — single file',
      '',
      header(opts, m, ssh.note, fixtureLines),
      '',
      'Times are wall clock in seconds; speedup = rsync time / ffsync time (> 1: ffsync faster); wire ratio = rsync wire bytes / ffsync wire bytes (> 1: ffsync sends less). ' +
        'ffsync time runs from spawning the receiver until both peers exited (node start-up of both included); the details table also has sender→exit. ' +
        'rsync runs without -t, so it stamps the target with the transfer time and its warm runs are full delta passes (ffsync-native keeps the source mtime). See bench/README.md.',
      '',
      markdown(t),
      '',
      ...(dt
        ? [
            '## Durable writes',
            '',
            'ffsync-native fsyncs each file before renaming it into place (writeback starts while data lands); `--no-fsync` renames it from the page cache, as rsync does by default. ' +
              '`cp && sync` = `cp SRC DST && sync -f DST`: the floor for writing the whole file durably, with no hashing and no network. Ratios are of medians in this run.',
            '',
            markdown(dt),
            '',
          ]
        : []),
      ...(lt
        ? [
            '## Durable writes, `sync` between local paths',
            '',
            'The same file with `ffsync-native sync SRC DST` (both peers in one process: the data is copied from the source in the kernel and each chunk verified, decisions §111), beside the same local rsync runs and floor. Time from spawn to exit.',
            '',
            markdown(lt),
            '',
          ]
        : []),
      '## Details',
      '',
      markdown(detailTable(results)),
      '',
      edits ? `Edit offsets in the old file: ${edits.map((e) => `${e.kind[0]}@${e.offset}`).join(' ')}` : '',
      '',
    ].join('\n');
  }

  await fsp.mkdir(path.dirname(opts.out), { recursive: true });
  // Other benches (tree, sync, refine) keep their sections below ours: carry them over.
  const previous = await fsp.readFile(opts.out, 'utf8').catch(() => '');
  const firstSection = previous.search(/<!-- [a-z]+-bench:begin -->/);
  await fsp.writeFile(opts.out, firstSection >= 0 ? `${out.trimEnd()}\n\n${previous.slice(firstSection)}` : out);
  process.stdout.write(`\nwrote ${path.relative(process.cwd(), opts.out) || opts.out}\n`);
  if (opts.keep) process.stderr.write(`kept work dir ${dirs.root}\n`);

  return failedRuns(
    results.flatMap((r) => r.tools.filter((t) => t.verified !== true).map((t) => `${r.scenario.name}@${r.sizeMib}MiB/${t.tool}`)),
    'run(s)',
  );
}

cleanUpOnSignals(cleanup);
runMain('bench/run.ts', main, cleanup);
