// CI benchmark gate (`npm run bench:gate`): small seeded scenarios of CI artifact sync, ffsync-native
// (send/receive over loopback, both Node peers' start-up included) and rsync -a --no-whole-file (the
// delta algorithm it uses over a network) side by side in the same run. Every result is verified
// byte-identical; each tool's time is the median of --repeat runs; ratio = rsync / ffsync. The process
// exits 1 if any gated ratio is below 1 or anything failed. Ratios, not absolute times, so the speed
// of the CI machine cancels out. Scenarios and why: bench/README.md ("CI gate"), docs/decisions.md.
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as fsp from 'node:fs/promises';
import * as os from 'node:os';
import * as path from 'node:path';
import { performance } from 'node:perf_hooks';
import { benchArgs, intOption, orUsage, pickList, CLI, KiB, MiB, REPO, RSYNC_BIN, flushWorkFs, fmtBytes, killAll, markdown, median, rmf, textTable, withTimeout, runMain } from './common.js';
import { XorShift128 } from '../__test__/helpers/data';
import { runFfsyncPair, runRsync } from './runners';

interface Options {
  repeat: number;
  sizeMib: number;
  files: number;
  seed: number;
  only?: Set<string>;
  all: boolean;
  keep: boolean;
  workDir: string;
}

type Tool = 'ffsync' | 'rsync';

interface Sample {
  ms: number;
  wire: number;
}

interface Scenario {
  name: string;
  what: string;
  /** false: measured and reported (with --all or --only), never fails the build. */
  gated: boolean;
  kind: 'file' | 'tree';
  /** Writes the initial source under `src` (a file path or a directory). */
  init(src: string, o: Options): Promise<void>;
  /** What a CI rebuild does to the source before timed run `rep` (1-based). */
  mutate(src: string, rep: number, o: Options): Promise<void>;
}

// ---------------------------------------------------------------------------------------------
// Fixtures (seeded: same seed, same bytes)

function seededBytes(len: number, seed: number, stream: number): Buffer {
  const b = Buffer.allocUnsafe(len);
  new XorShift128(seed, stream).fill(b);
  return b;
}

/** `base` with 20 × 64 KiB overwrites and 5 × 4 KiB insertions at seeded, sorted offsets. */
function edited(base: Buffer, seed: number): Buffer {
  const rng = new XorShift128(seed, 101);
  const slots = 25;
  const slot = Math.floor(base.length / slots);
  const parts: Buffer[] = [];
  let at = 0;
  for (let i = 0; i < slots; i++) {
    const off = i * slot + rng.below(slot - 64 * KiB);
    parts.push(base.subarray(at, off));
    if (i % 5 === 4) {
      parts.push(seededBytes(4 * KiB, seed, 200 + i));
      at = off;
    } else {
      parts.push(seededBytes(64 * KiB, seed, 200 + i));
      at = off + 64 * KiB;
    }
  }
  parts.push(base.subarray(at));
  return Buffer.concat(parts);
}

/** Version 0 (seeded bytes) or 1 (version 0 edited) of the large artifact, made once, on first use. */
const fileVersions: Buffer[] = [];
function fileVersion(o: Options, v: 0 | 1): Buffer {
  fileVersions[0] ??= seededBytes(o.sizeMib * MiB, o.seed, 1);
  if (v === 1) fileVersions[1] ??= edited(fileVersions[0], o.seed);
  return fileVersions[v]!;
}

function treeRel(i: number): string {
  return path.join(`d${String(i % 100).padStart(2, '0')}`, `f${String(i).padStart(5, '0')}.bin`);
}

let clock = Date.now() / 1000 - 30 * 86_400;
/** A new, strictly increasing mtime per rebuild (whole seconds, as a build would stamp). */
function nextMtime(): number {
  clock += 10;
  return Math.floor(clock);
}

const SCENARIOS: Scenario[] = [
  {
    name: 'file-rebuilt-identical',
    what: 'a single large artifact rebuilt with identical content (new mtime, e.g. a reproducible build)',
    gated: true,
    kind: 'file',
    init: async (src, o) => fsp.writeFile(src, fileVersion(o, 0)),
    mutate: async (src) => {
      const t = nextMtime();
      await fsp.utimes(src, t, t);
    },
  },
  {
    name: 'file-rebuilt-modified',
    what:
      'a single large artifact rebuilt with 20 × 64 KiB overwrites and 5 × 4 KiB insertions (alternating between two versions); ' +
      'not gated: ffsync-native rebuilds out of place and fsyncs before the rename, rsync does not fsync; measured 0.43x-0.73x at 256-512 MiB, 1.20x at 1 GiB (bench/README.md)',
    gated: false,
    kind: 'file',
    init: async (src, o) => fsp.writeFile(src, fileVersion(o, 0)),
    mutate: async (src, rep, o) => {
      await fsp.writeFile(src, fileVersion(o, (rep % 2) as 0 | 1));
      const t = nextMtime();
      await fsp.utimes(src, t, t);
    },
  },
  {
    name: 'tree-rebuilt-1pct',
    what: 'a tree of small files rebuilt: every mtime new, 1% of the files with new content (same size)',
    gated: true,
    kind: 'tree',
    init: async (src, o) => writeTree(src, o),
    mutate: async (src, rep, o) => {
      const rng = new XorShift128(o.seed, 1000 + rep);
      const changed = new Set<number>();
      while (changed.size < Math.max(1, Math.floor(o.files / 100))) changed.add(rng.below(o.files));
      for (const i of changed) await fsp.writeFile(path.join(src, treeRel(i)), seededBytes(4 * KiB, o.seed, 10_000 + rep * o.files + i));
      const t = nextMtime();
      for (let i = 0; i < o.files; i++) await fsp.utimes(path.join(src, treeRel(i)), t, t);
    },
  },
  {
    name: 'tree-noop',
    what: 'the same tree, nothing changed (rsync -a decides by size+mtime in milliseconds; ffsync pays two Node start-ups)',
    gated: false,
    kind: 'tree',
    init: async (src, o) => writeTree(src, o),
    mutate: async () => undefined,
  },
  {
    name: 'file-noop',
    what: 'the large artifact, untouched (both tools decide from size+mtime / the index)',
    gated: false,
    kind: 'file',
    init: async (src, o) => fsp.writeFile(src, fileVersion(o, 0)),
    mutate: async () => undefined,
  },
];

async function writeTree(root: string, o: Options): Promise<void> {
  for (let d = 0; d < Math.min(100, o.files); d++) await fsp.mkdir(path.join(root, `d${String(d).padStart(2, '0')}`), { recursive: true });
  for (let i = 0; i < o.files; i++) await fsp.writeFile(path.join(root, treeRel(i)), seededBytes(4 * KiB, o.seed, 10_000 + i));
}

// ---------------------------------------------------------------------------------------------
// Tools

async function ffsyncRun(src: string, dst: string, sr: string, ss: string, label: string): Promise<Sample> {
  const r = await runFfsyncPair({ label, src, dst, stateR: sr, stateS: ss });
  const wire = r.sender.bytesOnWire;
  return { ms: r.wallMs, wire: wire.sent + wire.received };
}

async function rsyncRun(src: string, dst: string, kind: 'file' | 'tree', label: string): Promise<Sample> {
  const r = await runRsync(label, ['-a', '--no-whole-file', ...(kind === 'tree' ? ['--delete', `${src}/`, `${dst}/`] : [src, dst])]);
  return { ms: r.wallMs, wire: r.stats.sent + r.stats.received };
}

// ---------------------------------------------------------------------------------------------
// Verification: byte-identical

async function sameFile(a: string, b: string): Promise<boolean> {
  const [ha, hb] = await Promise.all([fsp.open(a), fsp.open(b)]);
  try {
    const size = (await ha.stat()).size;
    if (size !== (await hb.stat()).size) return false;
    const n = Math.max(1, Math.min(size, 16 * MiB));
    const x = Buffer.allocUnsafe(n);
    const y = Buffer.allocUnsafe(n);
    for (let pos = 0; ; ) {
      const [rx, ry] = await Promise.all([ha.read(x, 0, x.length, pos), hb.read(y, 0, y.length, pos)]);
      if (rx.bytesRead !== ry.bytesRead || !x.subarray(0, rx.bytesRead).equals(y.subarray(0, ry.bytesRead))) return false;
      if (rx.bytesRead === 0) return true;
      pos += rx.bytesRead;
    }
  } finally {
    await Promise.all([ha.close(), hb.close()]);
  }
}

async function verify(kind: 'file' | 'tree', src: string, dst: string, o: Options): Promise<string | undefined> {
  if (kind === 'file') return (await sameFile(src, dst)) ? undefined : 'content differs';
  const count = (await fsp.readdir(dst, { recursive: true })).length;
  const expected = o.files + Math.min(100, o.files);
  if (count !== expected) return `${count} entries, expected ${expected}`;
  for (let i = 0; i < o.files; i++) if (!(await sameFile(path.join(src, treeRel(i)), path.join(dst, treeRel(i))))) return `${treeRel(i)} differs`;
  return undefined;
}

// ---------------------------------------------------------------------------------------------

interface Result {
  scn: Scenario;
  samples: Record<Tool, Sample[]>;
  error?: string;
}

async function runScenario(scn: Scenario, o: Options, work: string): Promise<Result> {
  const res: Result = { scn, samples: { ffsync: [], rsync: [] } };
  const dir = path.join(work, scn.name);
  await rmf(dir);
  await fsp.mkdir(dir, { recursive: true });
  const src = path.join(dir, scn.kind === 'file' ? 'artifact.bin' : 'dist');
  const dst: Record<Tool, string> = { ffsync: path.join(dir, 'dst-ffsync'), rsync: path.join(dir, 'dst-rsync') };
  const sr = path.join(dir, 'state-recv');
  const ss = path.join(dir, 'state-send');
  const sync = (tool: Tool, label: string) => (tool === 'ffsync' ? ffsyncRun(src, dst.ffsync, sr, ss, label) : rsyncRun(src, dst.rsync, scn.kind, label));
  try {
    await scn.init(src, o);
    // The previous CI run: each tool's target holds the last artifact (untimed, verified); ffsync's indexes are warm.
    for (const tool of ['ffsync', 'rsync'] as const) {
      if (scn.kind === 'tree') await fsp.mkdir(dst[tool]);
      await sync(tool, `${scn.name} prep ${tool}`);
      const bad = await verify(scn.kind, src, dst[tool], o);
      if (bad) throw new Error(`${scn.name} prep ${tool}: MISMATCH: ${bad}`);
    }
    for (let rep = 1; rep <= o.repeat; rep++) {
      await scn.mutate(src, rep, o);
      flushWorkFs(dir);
      // Alternate who goes first, so neither tool always inherits the other's page cache.
      const order: Tool[] = rep % 2 ? ['ffsync', 'rsync'] : ['rsync', 'ffsync'];
      for (const tool of order) {
        const s = await sync(tool, `${scn.name} #${rep} ${tool}`);
        const bad = await verify(scn.kind, src, dst[tool], o);
        if (bad) throw new Error(`${scn.name} #${rep} ${tool}: MISMATCH: ${bad}`);
        res.samples[tool].push(s);
        flushWorkFs(dir);
      }
    }
  } catch (e) {
    res.error = e instanceof Error ? e.message : String(e);
  } finally {
    if (!o.keep) await rmf(dir);
  }
  return res;
}

const HELP = `Usage: node --import tsx bench/gate.ts [--repeat N] [--size-mib N] [--files N] [--seed N]
         [--only NAME,...] [--all] [--keep] [--work-dir DIR]
  --repeat N       timed runs per tool and scenario; the median counts (default 3)
  --size-mib N     the single-file scenarios' size (default 1024)
  --files N        the tree scenarios' file count, 4 KiB each (default 10000)
  --seed N         fixture seed, unsigned 32-bit (default 1)
  --only a,b       these scenarios (gated or not)
  --all            every scenario, the ungated ones too (reported, never failing the run)
  --keep           keep the work directory afterwards
  --work-dir DIR   where fixtures go (default bench/work)
  -h, --help       this text
`;

function parseOptions(argv: string[]): Options {
  const values = benchArgs(
    argv,
    {
      repeat: { type: 'string' },
      'size-mib': { type: 'string' },
      files: { type: 'string' },
      seed: { type: 'string' },
      only: { type: 'string' },
      all: { type: 'boolean' },
      keep: { type: 'boolean' },
      'work-dir': { type: 'string' },
    },
    HELP,
  );
  const names = SCENARIOS.map((s) => s.name);
  return {
    repeat: intOption('repeat', values.repeat, 3, 1, 100),
    sizeMib: intOption('size-mib', values['size-mib'], 1024, 1, 1 << 20),
    files: intOption('files', values.files, 10_000, 1, 10_000_000),
    seed: intOption('seed', values.seed, 1, 0, 0xffffffff),
    only: values.only === undefined ? undefined : new Set(pickList('only', values.only, names)),
    all: Boolean(values.all),
    keep: Boolean(values.keep),
    workDir: path.resolve(values['work-dir'] ?? path.join(REPO, 'bench', 'work')),
  };
}

/** The run's work directory, removed on SIGINT/SIGTERM too (unless --keep). */
let workRoot: string | undefined;
let keepWork = false;

async function main(): Promise<number> {
  const o = orUsage(HELP, () => parseOptions(process.argv.slice(2)));
  if (spawnSync(RSYNC_BIN, ['--version']).status !== 0) throw new Error(`rsync not found (${RSYNC_BIN}): the gate compares against it`);
  if (!fs.existsSync(CLI)) throw new Error(`${CLI} missing: run npm run build first`);
  const chosen = SCENARIOS.filter((s) => (o.only ? o.only.has(s.name) : o.all || s.gated));
  await fsp.mkdir(o.workDir, { recursive: true });
  const work = await fsp.mkdtemp(path.join(o.workDir, 'gate-'));
  workRoot = work;
  keepWork = o.keep;
  console.log(`bench gate: ${chosen.map((s) => s.name).join(', ')}; file ${o.sizeMib} MiB, tree ${o.files} × 4 KiB; median of ${o.repeat}; seed ${o.seed}`);
  console.log(`ffsync-native: send/receive --plaintext over 127.0.0.1 (two Node processes); rsync: ${RSYNC_BIN} -a --no-whole-file (--delete for trees)`);
  const results: Result[] = [];
  try {
    for (const scn of chosen) {
      const t = performance.now();
      results.push(await withTimeout(20 * 60_000, scn.name, () => runScenario(scn, o, work)));
      console.log(`  ${scn.name}: ${((performance.now() - t) / 1000).toFixed(1)} s`);
    }
  } finally {
    if (!o.keep) await rmf(work);
  }
  let failed = false;
  const rows = results.map((r) => {
    const f = median(r.samples.ffsync.map((s) => s.ms));
    const g = median(r.samples.rsync.map((s) => s.ms));
    const ratio = r.error || f === undefined || g === undefined ? undefined : g / f;
    const verdict = r.error ? 'FAILED' : !r.scn.gated ? 'info (not gated)' : ratio! >= 1 ? 'PASS' : 'FAIL';
    if (r.error || (r.scn.gated && ratio! < 1)) failed = true;
    const secs = (xs: Sample[]) => xs.map((s) => (s.ms / 1000).toFixed(3)).join(', ');
    return [
      r.scn.name,
      f === undefined ? '—' : (f / 1000).toFixed(3),
      g === undefined ? '—' : (g / 1000).toFixed(3),
      ratio === undefined ? '—' : `${ratio.toFixed(2)}x`,
      fmtBytes(median(r.samples.ffsync.map((s) => s.wire))),
      fmtBytes(median(r.samples.rsync.map((s) => s.wire))),
      `${secs(r.samples.ffsync)} / ${secs(r.samples.rsync)}`,
      verdict,
    ];
  });
  const table = { head: ['scenario', 'ffsync s', 'rsync s', 'rsync/ffsync', 'ffsync wire', 'rsync wire', 'runs ffsync / rsync (s)', 'gate'], rows };
  console.log(`\n${textTable(table)}\n`);
  for (const r of results) if (r.error) console.log(`!!!!! ${r.scn.name}: ${r.error}`);
  for (const r of results) console.log(`- ${r.scn.name}: ${r.scn.what}`);
  if (process.env.GITHUB_STEP_SUMMARY) {
    fs.appendFileSync(process.env.GITHUB_STEP_SUMMARY, `## Benchmark gate (rsync time / ffsync-native time, > 1: faster)\n\n${markdown(table)}\n\n${os.EOL}`);
  }
  console.log(failed ? '\nbench gate: FAILED (a gated ratio below 1, or a run failed)' : '\nbench gate: passed (ffsync-native at least as fast as rsync on every gated scenario)');
  return failed ? 1 : 0;
}

for (const sig of ['SIGINT', 'SIGTERM'] as const) {
  process.on(sig, () => {
    killAll();
    if (workRoot && !keepWork) fs.rmSync(workRoot, { recursive: true, force: true });
    process.exit(sig === 'SIGINT' ? 130 : 143);
  });
}

runMain('bench gate', main);

