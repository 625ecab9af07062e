#!/usr/bin/env node
// Directory-tree benchmark: ffsync-native vs rsync -a (local, and over ssh to localhost), side by side
// in the same run, every result verified against its source tree.
//
//   npx tsx bench/tree.ts [--quick] [--no-ssh] [--install-sshd] [--only cold-10k,npm-trees] [--repeat N] [--dir DIR] ...
//   npm run bench:tree -- --quick
//
// Writes its section of bench/RESULTS.md between <!-- tree-bench:begin --> and <!-- tree-bench:end -->.
// See bench/README.md ("Directory trees") for what each scenario does and what each column means.
// Node built-ins only: no npm dependencies beyond tsx to run it.

import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as fsp from 'node:fs/promises';
import * as os from 'node:os';
import * as path from 'node:path';
import { performance } from 'node:perf_hooks';
import { type Sshd, SSHD, sshdUnavailable, startSshd as startTestSshd } from '../__test__/helpers/sshd';
import { benchArgs, orUsage, cleanUpOnSignals, CLI, CLI_SHOWN, failedRuns, KiB, MiB, pickList, REPO, RSYNC_BIN, commandLine, flushWorkFs, fmtBytes, fmtRatio, fmtRss, fmtS, killAll, machineInfo, markdown, maxOf, rmf, sh, tail, textTable, withTimeout, type Machine, runMain, intOption } from './common.js';
import { XorShift128, sha256Async } from '../__test__/helpers/data';
import { aggregate, runFfsyncPair, runRsync, type Aggregate, type TimedSample, type ToolRuns } from './runners.js';

const BEGIN_MARK = '<!-- tree-bench:begin -->';
const END_MARK = '<!-- tree-bench:end -->';
/** Fixture mtimes are pinned this far back, so an edit made during the run always changes the mtime (rsync compares seconds). */
const MTIME_PIN_S = 2 * 86_400;
const NPM_PKG = 'typescript';
const NPM_V1 = '5.6.2';
const NPM_V2 = '5.6.3';

// PRNG stream ids (one independent xorshift128 stream per purpose).
const STREAM_CONTENT = 10;
const STREAM_SIZES = 11;
const STREAM_PICK = 12;
const STREAM_EDIT = 13;

// ---------------------------------------------------------------------------------------------
// Scenarios and scale

const SCENARIO_NAMES = ['cold-10k', 'noop-100k', 'changed-1pct', 'big-100x16M', 'npm-trees'] as const;
type ScenarioName = (typeof SCENARIO_NAMES)[number];

/** ffsync: default options; ffsync-p1 / -p4: --parallel 1 / 4 (big files only). */
type ToolName = 'ffsync' | 'ffsync-p1' | 'ffsync-p4' | 'rsync' | 'rsync-ssh';

const TOOL_LABEL: Record<ToolName, string> = {
  ffsync: 'ffsync',
  'ffsync-p1': 'ffsync --parallel 1',
  'ffsync-p4': 'ffsync --parallel 4',
  rsync: 'rsync -a',
  'rsync-ssh': 'rsync -a ssh',
};

interface Scale {
  coldFiles: number;
  coldDirs: number;
  noopFiles: number;
  noopDirs: number;
  changedFiles: number;
  changedDirs: number;
  /** Files modified and files added in changed-1pct (1% each). */
  changedEdits: number;
  bigFiles: number;
  bigDirs: number;
  bigSize: number;
  /** Files edited in the big modified step (10%), each with BIG_EDITS overwrites of 64 KiB. */
  bigEdited: number;
}

const SMALL_SIZE = 4 * KiB;
const NOOP_MIN = 100;
const NOOP_MAX = 2000;
const BIG_EDITS = 3;
const BIG_EDIT_LEN = 64 * KiB;

function scaleFor(quick: boolean): Scale {
  const d = quick ? 10 : 1;
  return {
    coldFiles: 10_000 / d,
    coldDirs: 300 / d,
    noopFiles: 100_000 / d,
    noopDirs: 1_000 / d,
    changedFiles: 10_000 / d,
    changedDirs: 300 / d,
    changedEdits: 100 / d,
    bigFiles: 100 / d,
    bigDirs: 10 / d,
    bigSize: 16 * MiB,
    bigEdited: 10 / d,
  };
}

// ---------------------------------------------------------------------------------------------
// Options

interface Options {
  quick: boolean;
  only: ScenarioName[];
  repeat: number;
  ssh: boolean;
  installSshd: boolean;
  dir: string;
  out: string;
  seed: number;
  timeoutMs: number;
  keep: boolean;
  scale: Scale;
}

const HELP = `usage: npx tsx bench/tree.ts [options]      (or: npm run bench:tree -- [options])

  --quick              1 run per cell and 1/10 of the file counts (development check, not the targets' scale)
  --only a,b           subset of: ${SCENARIO_NAMES.join(', ')} (default: all)
  --repeat N           timed runs per tool and step; the median is reported (default 3, 1 with --quick)
  --no-ssh             do not try rsync over ssh to localhost
  --install-sshd       if ${SSHD} is missing: apt-get install -y openssh-server (Debian)
  --dir DIR            parent of the temporary work dir (default ${os.tmpdir()}); fixtures, targets and state dirs
                       all live in one directory, so they are on the same filesystem
  --out FILE           results file (default bench/RESULTS.md); only the tree-bench section is replaced
  --seed N             fixture seed, unsigned 32-bit (default 1)
  --timeout-s N        per tool run (its prep syncs, timed syncs and verification) in seconds (default 1800)
  --keep               keep the work dir afterwards
  -h, --help           this text
`;

function parseOptions(argv: string[]): Options {
  const values = benchArgs(
    argv,
    {
      quick: { type: 'boolean' },
      only: { type: 'string' },
      repeat: { type: 'string' },
      'no-ssh': { type: 'boolean' },
      'install-sshd': { type: 'boolean' },
      dir: { type: 'string' },
      out: { type: 'string' },
      seed: { type: 'string' },
      'timeout-s': { type: 'string' },
      keep: { type: 'boolean' },
    },
    HELP,
  );
  const only = pickList('only', values.only, SCENARIO_NAMES);
  const quick = Boolean(values.quick);
  return {
    quick,
    only,
    repeat: intOption('repeat', values.repeat, quick ? 1 : 3, 1, 100),
    ssh: !values['no-ssh'],
    installSshd: Boolean(values['install-sshd']),
    dir: path.resolve(values.dir ?? os.tmpdir()),
    out: path.resolve(values.out ?? path.join(REPO, 'bench', 'RESULTS.md')),
    seed: intOption('seed', values.seed, 1, 0, 0xffffffff),
    timeoutMs: intOption('timeout-s', values['timeout-s'], 1800, 1, 86400) * 1000,
    keep: Boolean(values.keep),
    scale: scaleFor(quick),
  };
}

// ---------------------------------------------------------------------------------------------
// Small helpers

/** Runs fn over items with at most n in flight. */
async function pool<T>(items: readonly T[], n: number, fn: (item: T, i: number) => Promise<void>): Promise<void> {
  let next = 0;
  const worker = async (): Promise<void> => {
    while (next < items.length) {
      const i = next++;
      await fn(items[i]!, i);
    }
  };
  await Promise.all(Array.from({ length: Math.min(n, items.length) }, worker));
}

/** Runs a command to completion (no timing); throws with its stderr on failure. */
function run(cmd: string, args: string[], what: string, timeoutMs = 600_000, cwd?: string): string {
  const r = spawnSync(cmd, args, { encoding: 'utf8', timeout: timeoutMs, cwd, maxBuffer: 64 * MiB });
  if (r.status !== 0) {
    const why = r.error?.message ?? (r.signal ? `signal ${r.signal}` : `exit code ${r.status}`);
    throw new Error(`${what}: ${[cmd, ...args].join(' ')} failed (${why}): ${tail(r.stderr ?? '', 800)}`);
  }
  return r.stdout;
}

function pad(n: number, width: number): string {
  return String(n).padStart(width, '0');
}

function plural(n: number, word: string): string {
  return `${n} ${word}${n === 1 ? '' : 's'}`;
}

function listSome(xs: string[], n = 5): string {
  return xs.length <= n ? xs.join(', ') : `${xs.slice(0, n).join(', ')}, … (+${xs.length - n})`;
}

// ---------------------------------------------------------------------------------------------
// Trees: manifests (relative path -> kind, size, mode, mtime, sha256, symlink target) and their comparison

interface Entry {
  kind: 'file' | 'dir' | 'symlink' | 'other';
  size: number;
  mode: number;
  mtimeMs: number;
  sha256?: string;
  link?: string;
}
type Manifest = Map<string, Entry>;

/**
 * Walks root (not following symlinks). Files are hashed unless hash is false; with reuse, a file whose
 * size and mtime match its entry in reuse (and whose path is not in rehash) takes that entry's hash.
 */
async function walk(root: string, how: { hash: boolean; reuse?: Manifest; rehash?: Set<string> }): Promise<Manifest> {
  const rels: string[] = [];
  let dirs = [''];
  while (dirs.length) {
    const found: string[][] = [];
    await pool(dirs, 16, async (rel, i) => {
      const ents = await fsp.readdir(path.join(root, rel), { withFileTypes: true });
      const sub: string[] = [];
      for (const e of ents) {
        const r = rel ? `${rel}/${e.name}` : e.name;
        rels.push(r);
        if (e.isDirectory()) sub.push(r);
      }
      found[i] = sub;
    });
    dirs = found.flat();
  }
  rels.sort();
  const m: Manifest = new Map();
  const entries: (Entry | undefined)[] = new Array(rels.length);
  await pool(rels, 32, async (rel, i) => {
    const p = path.join(root, rel);
    const st = await fsp.lstat(p);
    const e: Entry = {
      kind: st.isFile() ? 'file' : st.isDirectory() ? 'dir' : st.isSymbolicLink() ? 'symlink' : 'other',
      size: st.isFile() ? st.size : 0,
      mode: st.mode & 0o7777,
      mtimeMs: st.mtimeMs,
    };
    if (e.kind === 'symlink') e.link = await fsp.readlink(p);
    if (e.kind === 'file' && how.hash) {
      const old = how.reuse?.get(rel);
      e.sha256 =
        old?.sha256 && old.kind === 'file' && old.size === e.size && old.mtimeMs === e.mtimeMs && !how.rehash?.has(rel) ? old.sha256 : await sha256Async(p, e.size);
    }
    entries[i] = e;
  });
  rels.forEach((r, i) => m.set(r, entries[i]!));
  return m;
}

interface TreeDiff {
  missing: string[];
  extra: string[];
  kind: string[];
  content: string[];
  link: string[];
  /** Permission bits differ (reported, not a failure). */
  mode: string[];
}

function diffTrees(expect: Manifest, got: Manifest): TreeDiff {
  const d: TreeDiff = { missing: [], extra: [], kind: [], content: [], link: [], mode: [] };
  for (const [rel, e] of expect) {
    const g = got.get(rel);
    if (!g) d.missing.push(rel);
    else if (g.kind !== e.kind) d.kind.push(rel);
    else {
      if (e.kind === 'file' && (g.size !== e.size || g.sha256 !== e.sha256)) d.content.push(rel);
      if (e.kind === 'symlink' && g.link !== e.link) d.link.push(rel);
      if (e.kind !== 'symlink' && g.mode !== e.mode) d.mode.push(rel);
    }
  }
  for (const rel of got.keys()) if (!expect.has(rel)) d.extra.push(rel);
  return d;
}

function diffIsClean(d: TreeDiff): boolean {
  return !d.missing.length && !d.extra.length && !d.kind.length && !d.content.length && !d.link.length;
}

function describeDiff(d: TreeDiff): string {
  const parts: string[] = [];
  if (d.missing.length) parts.push(`${d.missing.length} missing (${listSome(d.missing)})`);
  if (d.extra.length) parts.push(`${d.extra.length} extra (${listSome(d.extra)})`);
  if (d.kind.length) parts.push(`${d.kind.length} of another kind (${listSome(d.kind)})`);
  if (d.content.length) parts.push(`${d.content.length} with other content (${listSome(d.content)})`);
  if (d.link.length) parts.push(`${d.link.length} symlinks with another target (${listSome(d.link)})`);
  return parts.join('; ') || 'identical';
}

/** Source check after a run: same entries with the same kinds, sizes and mtimes as before. */
function sourceChanged(before: Manifest, after: Manifest): string | undefined {
  const bad: string[] = [];
  for (const [rel, e] of before) {
    const a = after.get(rel);
    if (!a || a.kind !== e.kind || a.size !== e.size || (e.kind === 'file' && a.mtimeMs !== e.mtimeMs)) bad.push(rel);
  }
  for (const rel of after.keys()) if (!before.has(rel)) bad.push(rel);
  return bad.length ? `${bad.length} entries (${listSome(bad)})` : undefined;
}

function countKinds(m: Manifest): { files: number; dirs: number; symlinks: number; bytes: number } {
  let files = 0;
  let dirs = 0;
  let symlinks = 0;
  let bytes = 0;
  for (const e of m.values()) {
    if (e.kind === 'file') {
      files++;
      bytes += e.size;
    } else if (e.kind === 'dir') dirs++;
    else if (e.kind === 'symlink') symlinks++;
  }
  return { files, dirs, symlinks, bytes };
}

// ---------------------------------------------------------------------------------------------
// Fixtures: seeded random content (incompressible), files spread over two levels of directories

/** Relative paths of nFiles files spread round-robin over nDirs leaf dirs under ~sqrt(nDirs) top dirs. */
function layout(nFiles: number, nDirs: number, prefix = 'f'): string[] {
  const top = Math.max(1, Math.round(Math.sqrt(nDirs)));
  const leaf = (j: number) => `t${pad(j % top, 2)}/d${pad(j, 4)}`;
  return Array.from({ length: nFiles }, (_, k) => `${leaf(k % nDirs)}/${prefix}${pad(k, 6)}.bin`);
}

/** Writes files of the given sizes with seeded content, mtime pinned to `mtime`. Content is drawn in file order. */
async function writeFiles(root: string, rels: string[], sizes: number[], rng: XorShift128, mtime: Date): Promise<void> {
  const dirs = [...new Set(rels.map((r) => path.dirname(r)))];
  for (const d of dirs) await fsp.mkdir(path.join(root, d), { recursive: true });
  const block = Buffer.allocUnsafeSlow(MiB);
  const queue: Promise<void>[] = [];
  const inFlight = new Set<Promise<void>>();
  for (let i = 0; i < rels.length; i++) {
    const file = path.join(root, rels[i]!);
    const size = sizes[i]!;
    let p: Promise<void>;
    if (size <= 256 * KiB) {
      const buf = Buffer.allocUnsafe(size);
      rng.fill(buf);
      p = fsp.writeFile(file, buf).then(() => fsp.utimes(file, mtime, mtime));
    } else {
      // Large files: sequential 1 MiB blocks, never the whole file in memory.
      const fh = await fsp.open(file, 'w');
      try {
        for (let off = 0; off < size; off += block.length) {
          const part = block.subarray(0, Math.min(block.length, size - off));
          rng.fill(part);
          await fh.write(part, 0, part.length, off);
        }
      } finally {
        await fh.close();
      }
      p = fsp.utimes(file, mtime, mtime);
    }
    inFlight.add(p);
    void p.finally(() => inFlight.delete(p));
    queue.push(p);
    if (inFlight.size >= 64) await Promise.race(inFlight);
  }
  await Promise.all(queue);
}

/** Picks k distinct indexes in [0, n) with the given stream. */
function pick(n: number, k: number, rng: XorShift128): number[] {
  const s = new Set<number>();
  while (s.size < Math.min(k, n)) s.add(rng.below(n));
  return [...s].sort((a, b) => a - b);
}

interface FixtureTree {
  root: string;
  manifest: Manifest;
  rels: string[];
}

async function genTree(ctx: Ctx, name: string, rels: string[], sizes: number[]): Promise<FixtureTree> {
  const t0 = performance.now();
  const root = path.join(ctx.dirs.fixtures, name);
  await rmf(root);
  await fsp.mkdir(root, { recursive: true });
  const total = sizes.reduce((a, b) => a + b, 0);
  process.stderr.write(`  generating ${name}: ${rels.length} files, ${fmtBytes(total)} …`);
  await writeFiles(root, rels, sizes, new XorShift128(ctx.opts.seed, STREAM_CONTENT), ctx.pinned);
  const manifest = await walk(root, { hash: true });
  process.stderr.write(` ${fmtS(performance.now() - t0)} s\n`);
  return { root, manifest, rels };
}

/** A copy of a fixture tree (new inodes, same mtimes and modes) that a scenario may edit. */
async function copyTree(from: string, to: string): Promise<void> {
  await rmf(to);
  run('cp', ['-a', from, to], 'copy fixture');
}

// ---------------------------------------------------------------------------------------------
// Tool runs

interface TreeCounts {
  files: number;
  entries: number;
  written: number;
  unchanged: number;
  decidedByRoot: number;
  localCopies: number;
  deleted: number;
  indexed: string;
  lanes: number;
  errors: string[];
}

interface Sample extends TimedSample {
  tree?: TreeCounts;
  rsync?: { transferred?: number; literal?: number; matched?: number };
  /** npm-trees, rsync: files left with v1 content (same size, same mtime). */
  stale?: number;
  stalePaths?: string[];
}

interface TreeSummaryJson {
  entries: number;
  files: number;
  unchanged: number;
  decidedByRoot: number;
  localCopies: number;
  indexedFiles: number;
  lanes: number;
  written: number;
  deleted: number;
  errors: string[];
}

let rssSeq = 0;
function rssPath(ctx: Ctx, label: string): string {
  return path.join(ctx.dirs.tmp, `rss-${++rssSeq}-${label.replace(/[^a-z0-9-]+/gi, '_')}.txt`);
}

interface StateDirs {
  sr: string;
  ss: string;
}

async function ffsyncRun(ctx: Ctx, src: string, dst: string, state: StateDirs, label: string, sendArgs: string[]): Promise<Sample> {
  const rssFile = (peer: 'receiver' | 'sender') => rssPath(ctx, `${label}-${peer === 'receiver' ? 'recv' : 'send'}`);
  const r = await runFfsyncPair({ label, src, dst, stateR: state.sr, stateS: state.ss, sendArgs, rssFile });
  const st = r.sender.tree as TreeSummaryJson | undefined;
  const rt = r.receiver.tree as TreeSummaryJson | undefined;
  if (!st || !rt) throw new Error(`${label}: ffsync-native failed: ${st ? 'receiver' : 'sender'} summary has no tree section`);
  const notes = [...r.notes];
  const errors = [...st.errors, ...rt.errors];
  if (errors.length) notes.push(`summary errors: ${listSome(errors, 3)}`);
  return {
    wallMs: r.wallMs,
    senderToExitMs: r.senderToExitMs,
    wire: r.sender.bytesOnWire,
    rssKb: r.rssKb,
    summaryMs: { sender: r.sender.durationMs, receiver: r.receiver.durationMs },
    tree: {
      files: st.files,
      entries: st.entries,
      written: rt.written,
      unchanged: rt.unchanged,
      decidedByRoot: rt.decidedByRoot,
      localCopies: rt.localCopies,
      deleted: rt.deleted,
      indexed: `${st.indexedFiles}/${rt.indexedFiles}`,
      lanes: st.lanes,
      errors,
    },
    note: notes.length ? notes.join('; ') : undefined,
  };
}

async function rsyncRun(ctx: Ctx, ssh: boolean, src: string, dst: string, label: string, del: boolean): Promise<Sample> {
  const args = ['-a', '--no-whole-file'];
  if (del) args.push('--delete');
  if (ssh) {
    if (!ctx.ssh.server) throw new Error(`${label}: no sshd`);
    args.push('-e', ctx.ssh.server.rsh, `${src}/`, `127.0.0.1:${dst}/`);
  } else {
    args.push(`${src}/`, `${dst}/`);
  }
  const r = await runRsync(label, args, rssPath(ctx, label));
  const m = /Number of regular files transferred:\s*([\d,.]+)/.exec(r.out);
  return {
    wallMs: r.wallMs,
    wire: { sent: r.stats.sent, received: r.stats.received },
    rssKb: { all: r.rssKb },
    rsync: { transferred: m ? Number(m[1]!.replace(/[,.]/g, '')) : undefined, literal: r.stats.literal, matched: r.stats.matched },
  };
}

function syncWith(ctx: Ctx, tool: ToolName, src: string, dst: string, state: StateDirs, label: string, del: boolean): Promise<Sample> {
  switch (tool) {
    case 'ffsync':
      return ffsyncRun(ctx, src, dst, state, label, []);
    case 'ffsync-p1':
      return ffsyncRun(ctx, src, dst, state, label, ['--parallel', '1']);
    case 'ffsync-p4':
      return ffsyncRun(ctx, src, dst, state, label, ['--parallel', '4']);
    case 'rsync':
      return rsyncRun(ctx, false, src, dst, label, del);
    case 'rsync-ssh':
      return rsyncRun(ctx, true, src, dst, label, del);
  }
}

// ---------------------------------------------------------------------------------------------
// sshd on a free loopback port, as the current user, with throwaway keys (never the machine's own config)

interface SshState {
  server?: Sshd;
  note: string;
}

/** The tests' throwaway sshd (__test__/helpers/sshd.ts), plus the bench's own needs: an
 * optional apt-get install, and a remote that can run rsync. */
async function startSshd(opts: Options): Promise<SshState> {
  if (!opts.ssh) return { note: 'ssh: skipped (--no-ssh)' };
  if (!fs.existsSync(SSHD) && opts.installSshd) {
    process.stderr.write(`${SSHD} missing: apt-get install -y openssh-server …\n`);
    const env = { ...process.env, DEBIAN_FRONTEND: 'noninteractive' };
    const r = spawnSync('apt-get', ['install', '-y', 'openssh-server'], { stdio: ['ignore', 2, 2], env, timeout: 600_000 });
    if (r.status !== 0 || !fs.existsSync(SSHD)) {
      return { note: `ssh: n/a (apt-get install -y openssh-server failed: ${r.error?.message ?? `exit ${r.status}`}; try apt-get update first)` };
    }
  }
  const why = sshdUnavailable();
  if (why) return { note: `ssh: n/a (${why}${fs.existsSync(SSHD) ? '' : '; pass --install-sshd'})` };
  let server: Sshd;
  try {
    server = await startTestSshd();
  } catch (e) {
    return { note: `ssh: n/a (${e instanceof Error ? e.message : String(e)})` };
  }
  const version = (spawnSync('ssh', ['-V'], { encoding: 'utf8', timeout: 10_000 }).stderr ?? '').trim().split('\n')[0] ?? '';
  const r = spawnSync('ssh', [...server.rsh.split(' ').slice(1), '127.0.0.1', 'rsync --version'], { encoding: 'utf8', timeout: 15_000 });
  if (r.status !== 0) {
    await server.stop();
    return { note: `ssh: n/a (the remote cannot run rsync: ${tail(r.stderr || r.error?.message || `exit ${r.status}`, 300)})` };
  }
  const remote = (r.stdout.split('\n')[0] ?? '').trim();
  return { server, note: `ssh: rsync -a -e "${server.rsh}" to a throwaway sshd on 127.0.0.1:${server.port} (${version}; ed25519 keys generated for the run; remote: ${remote})` };
}

async function stopSshd(s: SshState): Promise<void> {
  const srv = s.server;
  if (!srv) return;
  s.server = undefined;
  await srv.stop();
}

// ---------------------------------------------------------------------------------------------
// Results

interface Cell extends ToolRuns<Sample> {
  tool: ToolName;
}

interface Row {
  scenario: ScenarioName;
  /** Row label: scenario plus step. */
  name: string;
  cells: Map<ToolName, Cell>;
}

class VerifyError extends Error {
  constructor(
    message: string,
    readonly stale?: number,
  ) {
    super(message);
  }
}

interface Dirs {
  root: string;
  fixtures: string;
  work: string;
  state: string;
  tmp: string;
}

interface Ctx {
  opts: Options;
  dirs: Dirs;
  ssh: SshState;
  tools: ToolName[];
  /** mtime given to every fixture file. */
  pinned: Date;
  rows: Row[];
  /** The row the step in progress belongs to (a failure is reported there). */
  current?: Row;
  /** Set when the run in progress timed out: no further step of it may start. */
  abort?: { aborted: boolean };
  extraLines: string[];
  /** noop-100k: entries of the tree and the RSS of a 1-file ffsync sync (node + ffsync baseline). */
  memory?: { entries: number; baseline?: { sender?: number; receiver?: number } };
}

function newRow(ctx: Ctx, scenario: ScenarioName, step: string, tools: ToolName[]): Row {
  const row: Row = { scenario, name: step ? `${scenario} ${step}` : scenario, cells: new Map(tools.map((t) => [t, { tool: t, samples: [] }])) };
  ctx.rows.push(row);
  return row;
}

function toolsFor(ctx: Ctx, ffsync: ToolName[]): ToolName[] {
  return [...ffsync, ...ctx.tools.filter((t) => !t.startsWith('ffsync'))];
}

/**
 * One timed (or prep) sync with verification: the target must equal `expect`; the source must not change.
 * With row set, the sample is recorded there; a verification failure throws VerifyError.
 */
async function step(
  ctx: Ctx,
  row: Row,
  tool: ToolName,
  label: string,
  io: { src: string; dst: string; state: StateDirs; expect: Manifest; del?: boolean },
  stale?: { v1: Manifest },
): Promise<Sample> {
  if (ctx.abort?.aborted || stopping) throw new Error(`${label}: not started, the run was abandoned`);
  ctx.current = row;
  const before = await walk(io.src, { hash: false });
  flushWorkFs(ctx.dirs.root);
  if (ctx.abort?.aborted) throw new Error(`${label}: not started, the run was abandoned`);
  const s = await syncWith(ctx, tool, io.src, io.dst, io.state, label, io.del ?? false);
  if (ctx.abort?.aborted) throw new Error(`${label}: abandoned`);
  const [got, after] = await Promise.all([walk(io.dst, { hash: true }), walk(io.src, { hash: false })]);
  const changed = sourceChanged(before, after);
  if (changed) throw new VerifyError(`${label}: SOURCE CHANGED during the run: ${changed}`);
  const d = diffTrees(io.expect, got);
  if (d.mode.length) s.note = [s.note, `${d.mode.length} entries with other permission bits (${listSome(d.mode, 3)})`].filter(Boolean).join('; ');
  if (!diffIsClean(d)) {
    // npm-trees: files whose v2 content differs from v1 but whose size and mtime are the same, left with v1's content.
    let staleN = 0;
    if (stale) {
      const onlyStale =
        !d.missing.length &&
        !d.extra.length &&
        !d.kind.length &&
        !d.link.length &&
        d.content.every((rel) => {
          const a = stale.v1.get(rel);
          const b = io.expect.get(rel);
          const g = got.get(rel);
          return a && b && g && a.size === b.size && a.mtimeMs === b.mtimeMs && g.sha256 === a.sha256;
        });
      staleN = d.content.filter((rel) => got.get(rel)?.sha256 === stale.v1.get(rel)?.sha256).length;
      if (onlyStale && tool.startsWith('rsync')) {
        s.stale = d.content.length;
        s.stalePaths = d.content;
        return s;
      }
    }
    throw new VerifyError(`${label}: VERIFICATION FAILED: target differs from the source: ${describeDiff(d)}${stale ? ` (${staleN} of them stale v1 content)` : ''}`, staleN || undefined);
  }
  if (stale) s.stale = 0;
  return s;
}

function record(row: Row, tool: ToolName, s: Sample, label: string): void {
  const c = row.cells.get(tool)!;
  if (c.error) return;
  c.samples.push(s);
  if (c.verified === undefined) c.verified = true;
  const extra = s.stale ? `  ${s.stale} STALE files (expected for rsync -a)` : '';
  process.stderr.write(`  ${label.padEnd(44)} ${fmtS(s.wallMs).padStart(8)} s  wire ${fmtBytes(s.wire.sent + s.wire.received).padStart(10)}  verified${extra}\n`);
}

/** Marks the failed step's row (and the scenario's later rows, which depend on it) for this tool. */
function fail(rows: Row[], at: Row | undefined, tool: ToolName, e: unknown, label: string): void {
  const msg = e instanceof Error ? e.message : String(e);
  const from = Math.max(0, at ? rows.indexOf(at) : 0);
  rows.slice(from).forEach((row, i) => {
    const c = row.cells.get(tool);
    if (!c || c.error) return;
    c.error = i === 0 ? msg : `not run: an earlier step failed (${label})`;
    if (i === 0 && e instanceof VerifyError) c.verified = false;
  });
  process.stderr.write(`\n!!!!! ${label} FAILED: ${msg}\n\n`);
}

async function freshState(ctx: Ctx, label: string): Promise<StateDirs> {
  const base = await fsp.mkdtemp(path.join(ctx.dirs.state, `${label.replace(/[^a-z0-9-]+/gi, '_')}-`));
  const sr = path.join(base, 'receiver');
  const ss = path.join(base, 'sender');
  await fsp.mkdir(sr, { recursive: true });
  await fsp.mkdir(ss, { recursive: true });
  return { sr, ss };
}

async function emptyDir(p: string): Promise<string> {
  await rmf(p);
  await fsp.mkdir(p, { recursive: true });
  return p;
}

/**
 * Runs every tool `repeat` times (reps outer, tools inner, so the tools interleave), each run under the
 * per-run timeout. A tool that fails once is not run again in this scenario.
 */
async function eachRun(
  ctx: Ctx,
  scenario: string,
  tools: ToolName[],
  rows: Row[],
  body: (tool: ToolName, rep: number, label: string, dir: string) => Promise<void>,
): Promise<void> {
  for (let rep = 0; rep < ctx.opts.repeat; rep++) {
    for (const tool of tools) {
      if (stopping) return;
      if (rows.some((r) => r.cells.get(tool)?.error)) continue;
      const label = `${scenario}/${tool}#${rep + 1}`;
      ctx.current = undefined;
      // Each run gets its own dir for source copies and targets: after a timeout, what is left of the
      // abandoned run cannot touch the next one's files.
      const dir = await fsp.mkdtemp(path.join(ctx.dirs.work, `${label.replace(/[^a-z0-9-]+/gi, '_')}-`));
      const abort = { aborted: false };
      ctx.abort = abort;
      const p = body(tool, rep, label, dir);
      let timer: NodeJS.Timeout | undefined;
      try {
        await Promise.race([
          p,
          new Promise<never>((_, reject) => {
            timer = setTimeout(() => {
              abort.aborted = true;
              killAll();
              reject(new Error(`${label}: timed out after ${ctx.opts.timeoutMs / 1000} s (children killed)`));
            }, ctx.opts.timeoutMs);
          }),
        ]);
      } catch (e) {
        // On a timeout, wait for the abandoned run to unwind (its children are dead and it may start no
        // further step) so that nothing of it overlaps the next run.
        abort.aborted = true;
        killAll();
        fail(rows, ctx.current, tool, e, label);
        await p.catch(() => undefined);
      } finally {
        clearTimeout(timer);
        await rmf(dir);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Scenarios

async function cold10k(ctx: Ctx): Promise<void> {
  const sc = ctx.opts.scale;
  const fx = await genTree(ctx, 'cold', layout(sc.coldFiles, sc.coldDirs), Array<number>(sc.coldFiles).fill(SMALL_SIZE));
  const k = countKinds(fx.manifest);
  ctx.extraLines.push(`- cold-10k: ${k.files} files × 4 KiB in ${k.dirs} dirs (${fmtBytes(k.bytes)}), empty target`);
  const tools = toolsFor(ctx, ['ffsync']);
  const row = newRow(ctx, 'cold-10k', '', tools);
  await eachRun(ctx, 'cold-10k', tools, [row], async (tool, _rep, label, dir) => {
    const dst = await emptyDir(path.join(dir, 'dst'));
    const state = await freshState(ctx, label);
    record(row, tool, await step(ctx, row, tool, label, { src: fx.root, dst, state, expect: fx.manifest }), label);
    await rmf(path.dirname(state.sr));
  });
  await rmf(fx.root);
}

async function noop100k(ctx: Ctx): Promise<void> {
  const sc = ctx.opts.scale;
  const rng = new XorShift128(ctx.opts.seed, STREAM_SIZES);
  const sizes = Array.from({ length: sc.noopFiles }, () => NOOP_MIN + rng.below(NOOP_MAX - NOOP_MIN + 1));
  const fx = await genTree(ctx, 'noop', layout(sc.noopFiles, sc.noopDirs), sizes);
  const k = countKinds(fx.manifest);
  ctx.extraLines.push(
    `- noop-100k: ${k.files} files of ${NOOP_MIN}–${NOOP_MAX} bytes in ${k.dirs} dirs (${fmtBytes(k.bytes)}); each tool first syncs it into an empty target (untimed, verified; ffsync builds both indexes), then the unchanged re-sync is timed ${ctx.opts.repeat}× on that same target`,
  );
  ctx.memory = { entries: fx.manifest.size };

  // Baseline RSS of an ffsync peer (node + addon) on a 1-file tree, so memory per path can be given net of it.
  try {
    const bsrc = path.join(ctx.dirs.work, 'baseline-src');
    await emptyDir(bsrc);
    await fsp.writeFile(path.join(bsrc, 'one'), 'x');
    const bdst = await emptyDir(path.join(ctx.dirs.work, 'baseline-dst'));
    const s = await withTimeout(120_000, 'baseline', async () => ffsyncRun(ctx, bsrc, bdst, await freshState(ctx, 'baseline'), 'noop-100k baseline', []));
    ctx.memory.baseline = { sender: s.rssKb.sender, receiver: s.rssKb.receiver };
    await rmf(bsrc);
    await rmf(bdst);
  } catch (e) {
    process.stderr.write(`  (baseline RSS not measured: ${e instanceof Error ? e.message : String(e)})\n`);
  }

  const tools = toolsFor(ctx, ['ffsync']);
  const row = newRow(ctx, 'noop-100k', '', tools);
  const prepared = new Map<ToolName, { dst: string; state: StateDirs }>();
  await eachRun(ctx, 'noop-100k', tools, [row], async (tool, _rep, label) => {
    let p = prepared.get(tool);
    if (!p) {
      const dst = await emptyDir(path.join(ctx.dirs.work, `dst-${tool}`));
      p = { dst, state: await freshState(ctx, `noop-${tool}`) };
      const t0 = performance.now();
      await step(ctx, row, tool, `${label} prep`, { src: fx.root, dst, state: p.state, expect: fx.manifest });
      process.stderr.write(`  ${`${label} prep`.padEnd(44)} ${fmtS(performance.now() - t0).padStart(8)} s  (untimed, verified)\n`);
      prepared.set(tool, p);
    }
    record(row, tool, await step(ctx, row, tool, label, { src: fx.root, dst: p.dst, state: p.state, expect: fx.manifest }), label);
  });
  for (const [tool, p] of prepared) {
    await rmf(p.dst);
    await rmf(path.dirname(p.state.sr));
    prepared.delete(tool);
  }
  await rmf(fx.root);
}

async function changed1pct(ctx: Ctx): Promise<void> {
  const sc = ctx.opts.scale;
  const rels = layout(sc.changedFiles, sc.changedDirs);
  const fx = await genTree(ctx, 'changed-base', rels, Array<number>(sc.changedFiles).fill(SMALL_SIZE));
  const k = countKinds(fx.manifest);
  const pickRng = new XorShift128(ctx.opts.seed, STREAM_PICK);
  const modified = pick(rels.length, sc.changedEdits, pickRng).map((i) => rels[i]!);
  const added = layout(sc.changedEdits, sc.changedDirs, 'new').map((r, i) => r.replace(/\/new\d+\.bin$/, `/new${pad(i, 6)}.bin`));
  ctx.extraLines.push(
    `- changed-1pct: ${k.files} files × 4 KiB in ${k.dirs} dirs synced first (untimed, verified), then ${modified.length} files rewritten in place (new content, same size, new mtime) and ${added.length} new 4 KiB files; the re-sync is timed`,
  );
  const tools = toolsFor(ctx, ['ffsync']);
  const row = newRow(ctx, 'changed-1pct', '', tools);
  await eachRun(ctx, 'changed-1pct', tools, [row], async (tool, _rep, label, dir) => {
    const src = path.join(dir, 'src');
    await copyTree(fx.root, src);
    const dst = await emptyDir(path.join(dir, 'dst'));
    const state = await freshState(ctx, label);
    await step(ctx, row, tool, `${label} prep`, { src, dst, state, expect: fx.manifest });
    // The edit: the same content for every tool and run.
    const edit = new XorShift128(ctx.opts.seed, STREAM_EDIT);
    const buf = Buffer.allocUnsafe(SMALL_SIZE);
    for (const rel of modified) {
      edit.fill(buf);
      const fh = await fsp.open(path.join(src, rel), 'r+');
      try {
        await fh.write(buf, 0, buf.length, 0);
      } finally {
        await fh.close();
      }
    }
    for (const rel of added) {
      edit.fill(buf);
      await fsp.writeFile(path.join(src, rel), buf);
    }
    const expect = await walk(src, { hash: true, reuse: fx.manifest, rehash: new Set(modified) });
    record(row, tool, await step(ctx, row, tool, label, { src, dst, state, expect }), label);
    await rmf(path.dirname(state.sr));
  });
  await rmf(fx.root);
}

async function big(ctx: Ctx): Promise<void> {
  const sc = ctx.opts.scale;
  const rels = layout(sc.bigFiles, sc.bigDirs);
  const fx = await genTree(ctx, 'big', rels, Array<number>(sc.bigFiles).fill(sc.bigSize));
  const edited = pick(rels.length, sc.bigEdited, new XorShift128(ctx.opts.seed, STREAM_PICK)).map((i) => rels[i]!);
  const k = countKinds(fx.manifest);
  ctx.extraLines.push(
    `- big-100x16M: ${k.files} files × ${fmtBytes(sc.bigSize)} in ${k.dirs} dirs (${fmtBytes(k.bytes)}); cold = a fresh copy of it into an empty target; modified = then ${edited.length} of the files get ${BIG_EDITS} overwrites of 64 KiB each in place (seeded offsets, same size, new mtime) and the same source is re-synced`,
  );
  const tools = toolsFor(ctx, ['ffsync-p1', 'ffsync-p4']);
  const cold = newRow(ctx, 'big-100x16M', 'cold', tools);
  const mod = newRow(ctx, 'big-100x16M', 'modified', tools);
  await eachRun(ctx, 'big-100x16M', tools, [cold, mod], async (tool, _rep, label, dir) => {
    const src = path.join(dir, 'src');
    await copyTree(fx.root, src);
    const dst = await emptyDir(path.join(dir, 'dst'));
    const state = await freshState(ctx, label);
    record(cold, tool, await step(ctx, cold, tool, `${label} cold`, { src, dst, state, expect: fx.manifest }), `${label} cold`);
    ctx.current = mod;
    const rng = new XorShift128(ctx.opts.seed, STREAM_EDIT);
    const buf = Buffer.allocUnsafe(BIG_EDIT_LEN);
    const third = Math.floor(sc.bigSize / BIG_EDITS);
    for (const rel of edited) {
      const fh = await fsp.open(path.join(src, rel), 'r+');
      try {
        for (let e = 0; e < BIG_EDITS; e++) {
          const off = e * third + rng.below(third - BIG_EDIT_LEN + 1);
          rng.fill(buf);
          await fh.write(buf, 0, buf.length, off);
        }
      } finally {
        await fh.close();
      }
    }
    const expect = await walk(src, { hash: true, reuse: fx.manifest, rehash: new Set(edited) });
    record(mod, tool, await step(ctx, mod, tool, `${label} modified`, { src, dst, state, expect }), `${label} modified`);
    await rmf(path.dirname(state.sr));
  });
  await rmf(fx.root);
}

async function npmTrees(ctx: Ctx): Promise<void> {
  const npmDir = path.join(ctx.dirs.fixtures, 'npm');
  await fsp.mkdir(npmDir, { recursive: true });
  const tarballs: string[] = [];
  for (const v of [NPM_V1, NPM_V2]) {
    process.stderr.write(`  npm pack ${NPM_PKG}@${v} …\n`);
    const out = run('npm', ['pack', `${NPM_PKG}@${v}`, '--json', '--pack-destination', npmDir], `npm pack ${NPM_PKG}@${v}`, 300_000, npmDir);
    let file: string | undefined;
    try {
      const j = JSON.parse(out) as { filename?: string }[];
      file = j[0]?.filename;
    } catch {
      file = out.trim().split('\n').pop();
    }
    if (!file) throw new Error(`npm pack ${NPM_PKG}@${v}: no tarball name in its output`);
    tarballs.push(path.join(npmDir, path.basename(file)));
  }
  /** A fresh extraction of a tarball's package/ dir at dir (tar keeps the tarball's mtimes and modes). */
  const extract = async (tgz: string, dir: string) => {
    await emptyDir(dir);
    run('tar', ['-xzf', tgz, '-C', dir, '--strip-components=1', '--no-same-owner'], `extract ${path.basename(tgz)}`);
  };
  const v1Dir = path.join(npmDir, 'v1');
  const v2Dir = path.join(npmDir, 'v2');
  await extract(tarballs[0]!, v1Dir);
  await extract(tarballs[1]!, v2Dir);
  const v1 = await walk(v1Dir, { hash: true });
  const v2 = await walk(v2Dir, { hash: true });
  // What changed between the releases, and how much of it rsync's quick check (size + mtime) cannot see.
  let changed = 0;
  let trap = 0;
  let added = 0;
  let removed = 0;
  for (const [rel, b] of v2) {
    const a = v1.get(rel);
    if (b.kind !== 'file') continue;
    if (!a) added++;
    else if (a.kind === 'file' && a.sha256 !== b.sha256) {
      changed++;
      if (a.size === b.size && a.mtimeMs === b.mtimeMs) trap++;
    }
  }
  for (const [rel, a] of v1) if (a.kind === 'file' && !v2.has(rel)) removed++;
  const k1 = countKinds(v1);
  const k2 = countKinds(v2);
  const mt = [...new Set([...v2.values()].filter((e) => e.kind === 'file').map((e) => new Date(e.mtimeMs).toISOString()))];
  const desc =
    `- npm-trees: \`npm pack ${NPM_PKG}@${NPM_V1}\` and \`@${NPM_V2}\`, extracted with tar (mtimes from the tarball: ${listSome(mt, 2)}). ` +
    `v1: ${k1.files} files, ${k1.dirs} dirs, ${fmtBytes(k1.bytes)}; v2: ${k2.files} files, ${fmtBytes(k2.bytes)}. ` +
    `v1→v2: ${changed} files changed content, ${trap} of them with the same size and mtime (rsync -a's quick check cannot see those), ${added} added, ${removed} removed. ` +
    `Each run: a fresh extraction of v1 into an empty target (timed), then the source dir is replaced by a fresh extraction of v2 at the same path and re-synced (timed). rsync runs with --delete here`;
  ctx.extraLines.push(desc);
  const tools = toolsFor(ctx, ['ffsync']);
  const r1 = newRow(ctx, 'npm-trees', `v1 (cold)`, tools);
  const r2 = newRow(ctx, 'npm-trees', `v1→v2`, tools);
  await eachRun(ctx, 'npm-trees', tools, [r1, r2], async (tool, _rep, label, dir) => {
    const src = path.join(dir, 'src');
    await extract(tarballs[0]!, src);
    const dst = await emptyDir(path.join(dir, 'dst'));
    const state = await freshState(ctx, label);
    const io = { src, dst, state, del: true };
    record(r1, tool, await step(ctx, r1, tool, `${label} v1`, { ...io, expect: v1 }), `${label} v1`);
    ctx.current = r2;
    await extract(tarballs[1]!, src);
    record(r2, tool, await step(ctx, r2, tool, `${label} v1→v2`, { ...io, expect: v2 }, { v1 }), `${label} v1→v2`);
    await rmf(path.dirname(state.sr));
  });
  await rmf(npmDir);
}

const RUNNERS: Record<ScenarioName, (ctx: Ctx) => Promise<void>> = {
  'cold-10k': cold10k,
  'noop-100k': noop100k,
  'changed-1pct': changed1pct,
  'big-100x16M': big,
  'npm-trees': npmTrees,
};

/** Rough bytes of disk a scenario needs at its peak (fixture + copy + targets, 4 KiB blocks). */
function spaceFor(name: ScenarioName, sc: Scale, tools: number): number {
  switch (name) {
    case 'cold-10k':
      return sc.coldFiles * 4 * KiB * 2;
    case 'noop-100k':
      return sc.noopFiles * 4 * KiB * (1 + tools);
    case 'changed-1pct':
      return sc.changedFiles * 4 * KiB * 3;
    case 'big-100x16M':
      return sc.bigFiles * sc.bigSize * 3;
    case 'npm-trees':
      return 400 * MiB;
  }
}

// ---------------------------------------------------------------------------------------------
// Tables

type Agg = Aggregate<Sample>;
const agg = (c: Cell | undefined): Agg => aggregate(c);

function timeCell(ctx: Ctx, row: Row, tool: ToolName): string {
  const c = row.cells.get(tool);
  if (!c) return tool === 'rsync-ssh' && !ctx.ssh.server ? 'n/a' : '—';
  const a = agg(c);
  if (!a.ok) return c.verified === false ? 'FAILED (mismatch)' : 'FAILED';
  const stale = a.sample?.stale;
  return stale ? `${fmtS(a.wallMs)} (${plural(stale, 'stale file')})` : fmtS(a.wallMs);
}

function verifiedCell(row: Row): string {
  const parts: string[] = [];
  let good = 0;
  for (const c of row.cells.values()) {
    if (c.error) parts.push(`${TOOL_LABEL[c.tool]} ${c.verified === false ? 'MISMATCH' : 'FAILED'}`);
    else if (c.samples.some((s) => s.stale)) parts.push(`${TOOL_LABEL[c.tool]}: ${plural(maxOf(c.samples.map((s) => s.stale))!, 'stale file')}`);
    else good++;
  }
  const total = row.cells.size;
  if (parts.length === 0) return `yes (${good}/${total})`;
  return `${good}/${total} exact; ${parts.join(', ')}`;
}

function planCell(s: Sample | undefined): string {
  const t = s?.tree;
  if (!t) return '—';
  return `${t.written} written, ${t.unchanged} unchanged, ${t.decidedByRoot} by root, ${t.localCopies} local, ${t.deleted} deleted, indexed ${t.indexed}${t.lanes > 1 ? `, ${t.lanes} lanes` : ''}`;
}

function mainTable(ctx: Ctx): { head: string[]; rows: string[][] } {
  const ssh = Boolean(ctx.ssh.server) || ctx.rows.some((r) => r.cells.has('rsync-ssh'));
  const head = ['scenario', 'ffsync variant', 'ffsync s', 'rsync s', 'rsync ssh s', 'rsync/ffsync', 'rsync ssh/ffsync', 'ffsync wire', 'rsync wire', 'rsync ssh wire', 'ffsync RSS snd/rcv MiB', 'rsync RSS MiB', 'ffsync plan', 'verified'];
  const rows: string[][] = [];
  for (const row of ctx.rows) {
    const r = agg(row.cells.get('rsync'));
    const rs = agg(row.cells.get('rsync-ssh'));
    for (const ft of [...row.cells.keys()].filter((t) => t.startsWith('ffsync'))) {
      const f = agg(row.cells.get(ft));
      rows.push([
        row.name,
        TOOL_LABEL[ft],
        timeCell(ctx, row, ft),
        timeCell(ctx, row, 'rsync'),
        ssh ? timeCell(ctx, row, 'rsync-ssh') : 'n/a',
        fmtRatio(r.wallMs, f.wallMs),
        ssh ? fmtRatio(rs.wallMs, f.wallMs) : 'n/a',
        fmtBytes(f.wire),
        fmtBytes(r.wire),
        ssh ? fmtBytes(rs.wire) : 'n/a',
        f.ok ? `${fmtRss(f.rssSender)} / ${fmtRss(f.rssReceiver)}` : '—',
        fmtRss(r.rssAll),
        planCell(f.sample),
        verifiedCell(row),
      ]);
    }
  }
  return { head, rows };
}

function targetsTable(ctx: Ctx): { head: string[]; rows: string[][] } | undefined {
  const head = ['target (issue)', 'measured', 'status'];
  const rows: string[][] = [];
  const scaleNote = ctx.opts.quick ? ' (quick: 1/10 scale)' : '';
  const ratio = (row: Row | undefined, other: ToolName): number | undefined => {
    if (!row) return undefined;
    const f = agg(row.cells.get('ffsync'));
    const o = agg(row.cells.get(other));
    return f.ok && o.ok && f.wallMs! > 0 ? o.wallMs! / f.wallMs! : undefined;
  };
  const status = (row: Row | undefined, other: ToolName, v: number | undefined, pass: (x: number) => boolean): string => {
    if (!row) return 'not run';
    if (!row.cells.has(other)) return 'n/a';
    if (!agg(row.cells.get('ffsync')).ok) return 'FAILED (ffsync)';
    if (!agg(row.cells.get(other)).ok) return `FAILED (${TOOL_LABEL[other]})`;
    return v !== undefined && pass(v) ? 'PASS' : 'MISS';
  };
  const cold = ctx.rows.find((r) => r.scenario === 'cold-10k');
  const noop = ctx.rows.find((r) => r.scenario === 'noop-100k');
  if (!cold && !noop) return undefined;
  const c1 = ratio(cold, 'rsync-ssh');
  rows.push([`cold-10k: ≥ 5x faster than rsync over ssh${scaleNote}`, c1 !== undefined ? `${c1.toFixed(2)}x` : cold && !cold.cells.has('rsync-ssh') ? 'n/a (no sshd)' : '—', status(cold, 'rsync-ssh', c1, (x) => x >= 5)]);
  const c2 = ratio(cold, 'rsync');
  rows.push([`cold-10k: no slower than rsync locally (≥ 1x)${scaleNote}`, c2 === undefined ? '—' : `${c2.toFixed(2)}x`, status(cold, 'rsync', c2, (x) => x >= 1)]);
  const n1 = ratio(noop, 'rsync');
  rows.push([`noop-100k: faster than rsync's local no-op (> 1x)${scaleNote}`, n1 === undefined ? '—' : `${n1.toFixed(2)}x`, status(noop, 'rsync', n1, (x) => x > 1)]);
  return { head, rows };
}

function memoryTable(ctx: Ctx): { head: string[]; rows: string[][] } | undefined {
  const row = ctx.rows.find((r) => r.scenario === 'noop-100k');
  if (!row || !ctx.memory) return undefined;
  const n = ctx.memory.entries;
  const head = ['peer', 'peak RSS MiB', 'entries', 'bytes per path', 'baseline MiB (1-file tree)', 'bytes per path above baseline'];
  const per = (kb: number | undefined, base?: number) => (kb === undefined ? '—' : String(Math.round(((kb - (base ?? 0)) * 1024) / n)));
  const f = agg(row.cells.get('ffsync'));
  const b = ctx.memory.baseline;
  const rows: string[][] = [
    ['ffsync sender', fmtRss(f.rssSender), String(n), per(f.rssSender), fmtRss(b?.sender), b?.sender === undefined ? '—' : per(f.rssSender, b.sender)],
    ['ffsync receiver', fmtRss(f.rssReceiver), String(n), per(f.rssReceiver), fmtRss(b?.receiver), b?.receiver === undefined ? '—' : per(f.rssReceiver, b.receiver)],
  ];
  for (const t of ['rsync', 'rsync-ssh'] as const) {
    if (!row.cells.has(t)) continue;
    const a = agg(row.cells.get(t));
    rows.push([`${TOOL_LABEL[t]} (largest local process)`, fmtRss(a.rssAll), String(n), per(a.rssAll), '—', '—']);
  }
  return { head, rows };
}

function detailTable(ctx: Ctx): { head: string[]; rows: string[][] } {
  const head = ['scenario', 'tool', 'wall s (each run)', 'sender→exit s', 'summary ms snd/rcv', 'wire sent', 'wire received', 'peak RSS KiB', 'plan / transfers', 'notes'];
  const rows: string[][] = [];
  for (const row of ctx.rows) {
    for (const c of row.cells.values()) {
      const s = c.samples[c.samples.length - 1];
      const rss = s ? (c.tool.startsWith('ffsync') ? `snd ${s.rssKb.sender ?? '?'} / rcv ${s.rssKb.receiver ?? '?'}` : `${s.rssKb.all ?? '?'} (max proc)`) : '—';
      const plan = s?.tree
        ? planCell(s)
        : s?.rsync
          ? `${s.rsync.transferred ?? '?'} files transferred, literal ${s.rsync.literal ?? '?'}, matched ${s.rsync.matched ?? '?'}`
          : '—';
      const notes = [c.error ? `**${c.verified === false ? 'MISMATCH' : 'FAILED'}**: ${c.error}` : '', s?.stale ? `${plural(s.stale, 'stale file')} (v1 content, same size and mtime): ${listSome(s.stalePaths ?? [], 5)}` : '', s?.note ?? '']
        .filter(Boolean)
        .join('; ');
      rows.push([
        row.name,
        TOOL_LABEL[c.tool],
        c.samples.map((x) => fmtS(x.wallMs)).join(', ') || '—',
        c.samples.map((x) => fmtS(x.senderToExitMs)).join(', ') || '—',
        s?.summaryMs ? `${s.summaryMs.sender} / ${s.summaryMs.receiver}` : '—',
        s ? String(s.wire.sent) : '—',
        s ? String(s.wire.received) : '—',
        rss,
        plan,
        notes,
      ]);
    }
  }
  return { head, rows };
}

// ---------------------------------------------------------------------------------------------
// Output

function treeCommandLine(): string {
  // Under `npx tsx`, execArgv holds tsx's loader internals: show the command as typed.
  if (process.execArgv.some((a) => a.includes('tsx/dist/'))) {
    const q = (s: string) => (/^[\w@%+=:,./-]+$/.test(s) ? s : `'${s.replace(/'/g, `'\\''`)}'`);
    const script = path.relative(process.cwd(), process.argv[1] ?? 'bench/tree.ts') || 'bench/tree.ts';
    return ['npx', 'tsx', script, ...process.argv.slice(2)].map(q).join(' ');
  }
  return commandLine();
}

function section(ctx: Ctx, m: Machine): string {
  const o = ctx.opts;
  const t = mainTable(ctx);
  const targets = targetsTable(ctx);
  const mem = memoryTable(ctx);
  const lines = [
    BEGIN_MARK,
    '',
    '## ffsync-native vs rsync -a — directory trees',
    '',
    `Command: \`${treeCommandLine()}\`  (cwd ${process.cwd()})`,
    '',
    `- date: ${m.date}`,
    `- machine: ${m.nproc} cores (${m.cpu}), ${m.memory} RAM, kernel ${m.kernel}, load average at start ${m.load}`,
    `- bench dir: ${ctx.dirs.root} on ${m.fs}`,
    `- rsync: ${m.rsync} (${RSYNC_BIN}); node ${m.node}; ffsync-native ${m.ffsync} (${CLI_SHOWN}), commit ${m.commit}`,
    `- peak RSS measured with ${m.rssMethod}, one wrapper per ffsync peer; for rsync the largest of its local processes`,
    `- ${ctx.ssh.note}`,
    `- ${o.repeat} timed run(s) per tool and step (median shown), seed ${o.seed}${o.quick ? '; **--quick: 1/10 of the file counts, not the scale of the targets**' : ''}`,
    ...ctx.extraLines,
    '',
    'How to read: times are wall clock seconds (ffsync: from spawning the receiver until both peers exited, node start-up included); ' +
      'rsync/ffsync = rsync time / ffsync time, **> 1 means ffsync-native is faster**; wire = ffsync `bytesOnWire` sent + received (plaintext TCP payload) vs rsync `--stats` total bytes sent + received (rsync protocol bytes, without ssh overhead). ' +
      'Every result is compared with its source (paths, kinds, sizes, SHA-256, symlink targets): FAILED means an error or a mismatch; "N stale files" (npm-trees, rsync -a only) counts files left with the old content because size and mtime did not change. ' +
      'ffsync plan: the receiver\'s written / unchanged / decided by content root / served from local copies / deleted, and indexed files sender/receiver. Compare ratios, not absolute times. See bench/README.md.',
    '',
    markdown(t),
    '',
  ];
  if (targets) lines.push('### Targets (issue)', '', markdown(targets), '');
  if (mem) {
    lines.push(
      '### Memory per path (noop-100k)',
      '',
      'Peak RSS of the timed no-op re-sync divided by the number of entries (files + dirs) of the tree. The baseline is an ffsync peer syncing a 1-file tree (node + addon).',
      '',
      markdown(mem),
      '',
    );
  }
  lines.push('### Details', '', markdown(detailTable(ctx)), '', END_MARK);
  return lines.join('\n');
}

/** Replaces the text between the markers (inclusive) in file, or appends the section; the rest stays untouched. */
async function writeSection(file: string, text: string): Promise<void> {
  let cur = '';
  try {
    cur = await fsp.readFile(file, 'utf8');
  } catch {
    /* new file */
  }
  const b = cur.indexOf(BEGIN_MARK);
  const e = b >= 0 ? cur.indexOf(END_MARK, b) : -1;
  let next: string;
  if (b >= 0 && e >= 0) next = cur.slice(0, b) + text + cur.slice(e + END_MARK.length);
  else next = (cur === '' ? '' : cur.endsWith('\n') ? `${cur}\n` : `${cur}\n\n`) + text + '\n';
  await fsp.mkdir(path.dirname(file), { recursive: true });
  await fsp.writeFile(file, next);
}

// ---------------------------------------------------------------------------------------------
// Main

let cleanupCtx: { root?: string; keep: boolean; ssh?: SshState } = { keep: false };
/** Set on SIGINT/SIGTERM: no further run or step starts. */
let stopping = false;

async function cleanup(): Promise<void> {
  killAll();
  if (cleanupCtx.ssh) await stopSshd(cleanupCtx.ssh);
  if (cleanupCtx.root && !cleanupCtx.keep) {
    // A second try: on a signal, the interrupted run may still be unwinding while the first one runs.
    await rmf(cleanupCtx.root).catch(() => new Promise((res) => setTimeout(res, 500)));
    await rmf(cleanupCtx.root).catch((e: unknown) => process.stderr.write(`could not remove ${cleanupCtx.root}: ${String(e)}\n`));
    cleanupCtx.root = undefined;
  }
}

async function main(): Promise<number> {
  const opts = orUsage(HELP, () => parseOptions(process.argv.slice(2)));
  if (!fs.existsSync(CLI)) throw new Error(`${CLI} not found: build first (npm run build)`);
  if (!sh(RSYNC_BIN, ['--version'])) throw new Error('rsync not found');
  await fsp.mkdir(opts.dir, { recursive: true });
  const root = await fsp.mkdtemp(path.join(opts.dir, 'ffsync-tree-bench-'));
  cleanupCtx = { root, keep: opts.keep };
  const dirs: Dirs = { root, fixtures: path.join(root, 'fixtures'), work: path.join(root, 'work'), state: path.join(root, 'state'), tmp: path.join(root, 'tmp') };
  for (const p of [dirs.fixtures, dirs.work, dirs.state, dirs.tmp]) await fsp.mkdir(p, { recursive: true });
  const m = machineInfo(root);
  process.stderr.write(`work dir ${root} (${m.fs})\n`);

  const ssh = await startSshd(opts);
  cleanupCtx.ssh = ssh;
  process.stderr.write(`${ssh.note}\n`);
  const tools: ToolName[] = ['ffsync', 'rsync'];
  if (ssh.server) tools.push('rsync-ssh');
  const pinned = new Date(Math.floor(Date.now() / 1000 - MTIME_PIN_S) * 1000);
  const ctx: Ctx = { opts, dirs, ssh, tools, pinned, rows: [], extraLines: [] };

  for (const name of opts.only) {
    if (stopping) break;
    process.stderr.write(`${name}:\n`);
    try {
      const need = spaceFor(name, opts.scale, tools.length) + 64 * MiB;
      const st = await fsp.statfs(root);
      if (st.bavail * st.bsize < need) throw new Error(`not enough free space in ${root}: ${fmtBytes(st.bavail * st.bsize)} free, about ${fmtBytes(need)} needed`);
      await RUNNERS[name](ctx);
    } catch (e) {
      // Setup failure (fixtures, npm pack, …): the scenario gets a FAILED row, the others still run.
      const msg = e instanceof Error ? e.message : String(e);
      process.stderr.write(`\n!!!!! ${name}: setup FAILED: ${msg}\n\n`);
      killAll();
      const row = ctx.rows.find((r) => r.scenario === name) ?? newRow(ctx, name, '(setup)', toolsFor(ctx, ['ffsync']));
      for (const c of row.cells.values()) if (!c.error && c.samples.length === 0) c.error = `setup failed: ${msg}`;
    }
    if (stopping) break;
    await rmf(dirs.work);
    await fsp.mkdir(dirs.work, { recursive: true });
  }
  await stopSshd(ssh);
  if (stopping) return 130; // interrupted: leave the results file as it was

  const t = mainTable(ctx);
  process.stdout.write(`\n${textTable(t)}\n`);
  const targets = targetsTable(ctx);
  if (targets) process.stdout.write(`\n${textTable(targets)}\n`);
  const mem = memoryTable(ctx);
  if (mem) process.stdout.write(`\nmemory per path (noop-100k)\n${textTable(mem)}\n`);
  process.stdout.write(`\n${ssh.note}\n`);
  await writeSection(opts.out, section(ctx, m));
  process.stdout.write(`\nwrote the tree-bench section of ${path.relative(process.cwd(), opts.out) || opts.out}\n`);
  if (opts.keep) process.stderr.write(`kept work dir ${root}\n`);

  return failedRuns(
    ctx.rows.flatMap((r) => [...r.cells.values()].filter((c) => c.error).map((c) => `${r.name}/${c.tool}`)),
    'cell(s)',
  );
}

cleanUpOnSignals(cleanup, () => (stopping = true));

runMain('bench/tree.ts', main, cleanup);
