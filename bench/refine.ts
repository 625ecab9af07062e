// Precision deltas (issue #6): wire bytes and time of single-file delta transfers,
// ffsync-native side by side with rsync in the same run, every result verified.
//
//   npm run bench:refine                      # = node --import tsx bench/refine.ts
//   npx tsx bench/refine.ts --only synthetic-32,esbuild --repeat 1
//
// Scenarios (each: the receiver holds the old version, the sender pushes the new one):
//   synthetic-32, synthetic-1024  N MiB of seeded random bytes, then 20 x 64 KiB overwrites,
//                                 5 x 4 KiB insertions, 5 x 8 KiB deletions (bench/run.ts's "modified")
//   esbuild         the native binary bin/esbuild of @esbuild/linux-x64 0.24.0 -> 0.24.1
//   typescript-js   lib/typescript.js of typescript 5.6.2 -> 5.6.3
//   typescript-tgz  the npm tarballs typescript-5.6.2.tgz -> typescript-5.6.3.tgz
//   inplace-1024    1 GiB, 20 x 64 KiB overwrites only: `receive --inplace` vs `rsync --inplace`
// ffsync: `receive` + `send` over loopback TCP (--plaintext), fresh state dirs (no index), so
// both peers scan. rsync: `rsync --no-whole-file --stats` locally (its sender and receiver
// talk over a pipe; "Total bytes sent" is what its sender wrote). Wire = ffsync bytesOnWire
// sent + received vs rsync's total bytes sent (the target) and sent + received.
// Writes its section of bench/RESULTS.md between <!-- refine-bench:begin --> and <!-- refine-bench:end -->.

import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as fsp from 'node:fs/promises';
import * as os from 'node:os';
import * as path from 'node:path';
import { benchArgs, intOption, KiB, MiB, pickList, REPO, commandLine, flushWorkFs, fmtBytes, fmtRatio, fmtRss, machineInfo, markdown, median, rmf, tail, textTable, withTimeout, writeResultsSection, runMain } from './common.js';
import { XorShift128, sha256 } from '../__test__/helpers/data';
import { runFfsyncPair, runRsync } from './runners.js';

const BEGIN_MARK = '<!-- refine-bench:begin -->';
const END_MARK = '<!-- refine-bench:end -->';
const ALL = ['synthetic-32', 'synthetic-1024', 'esbuild', 'typescript-js', 'typescript-tgz', 'inplace-1024'] as const;

const HELP = `Usage: node --import tsx bench/refine.ts [--only ${ALL.join(',')}] [--repeat N] [--dir DIR] [--no-write]
The scenarios and what each measures: the comment at the top of bench/refine.ts.
`;
const values = benchArgs(
  process.argv.slice(2),
  {
    only: { type: 'string' },
    repeat: { type: 'string' },
    dir: { type: 'string' },
    'no-write': { type: 'boolean' },
  },
  HELP,
);
const repeat = intOption('repeat', values.repeat, 2, 1, 100);
const only = pickList('only', values.only, ALL);
const work = values.dir ?? fs.mkdtempSync(path.join(os.tmpdir(), 'ffsync-bench-refine-'));

interface Run {
  ms: number;
  sent: number;
  received: number;
  rssKb?: number[];
}
interface Row {
  scenario: string;
  detail: string;
  size: number;
  ffsync: Run[];
  rsync: Run[];
  literal?: number;
}

/** Old and new version of the synthetic file (the recipe of bench/run.ts's "modified"). */
function synthetic(dir: string, mib: number, overwritesOnly = false): { old: string; neu: string; detail: string } {
  const rng = new XorShift128(1, 0);
  const size = mib * MiB;
  const old = Buffer.allocUnsafe(size);
  for (let i = 0; i < size; i += 4) old.writeUInt32LE(rng.next(), i);
  const rand = (n: number) => {
    const b = Buffer.allocUnsafe(n);
    for (let i = 0; i < n; i += 4) b.writeUInt32LE(rng.next(), i);
    return b;
  };
  const edits: { at: number; kind: 'overwrite' | 'insert' | 'delete' }[] = [];
  for (let k = 0; k < 20; k++) edits.push({ at: rng.below(size - 64 * KiB), kind: 'overwrite' });
  for (let k = 0; k < (overwritesOnly ? 0 : 5); k++) edits.push({ at: rng.below(size - 8 * KiB), kind: 'insert' });
  for (let k = 0; k < (overwritesOnly ? 0 : 5); k++) edits.push({ at: rng.below(size - 8 * KiB), kind: 'delete' });
  const neu = Buffer.from(old);
  for (const e of edits.filter((x) => x.kind === 'overwrite')) rand(64 * KiB).copy(neu, e.at);
  // Insertions and deletions by offset in the old file, applied back to front.
  const parts: Buffer[] = [];
  let end = size;
  for (const e of edits.filter((x) => x.kind !== 'overwrite').sort((a, b) => b.at - a.at)) {
    if (e.at + 8 * KiB > end) continue;
    if (e.kind === 'insert') {
      parts.unshift(neu.subarray(e.at, end));
      parts.unshift(rand(4 * KiB));
      end = e.at;
    } else {
      parts.unshift(neu.subarray(e.at + 8 * KiB, end));
      end = e.at;
    }
  }
  parts.unshift(neu.subarray(0, end));
  const o = path.join(dir, `synthetic-${mib}.old`);
  const n = path.join(dir, `synthetic-${mib}.new`);
  fs.writeFileSync(o, old);
  fs.writeFileSync(n, Buffer.concat(parts));
  const what = overwritesOnly ? '20 × 64 KiB overwrites (offsets kept); ffsync `receive --inplace` vs `rsync --inplace`' : '20 × 64 KiB overwrites, 5 × 4 KiB insertions, 5 × 8 KiB deletions';
  return { old: o, neu: n, detail: `${mib} MiB seeded random; ${what}` };
}

/** `npm pack NAME@VERSION` into the cache dir (once), returns the tarball path. */
function npmPack(dir: string, spec: string): string {
  const cached = fs.readdirSync(dir).find((f) => f === `${spec.replace(/^@/, '').replace('/', '-').replace('@', '-')}.tgz`);
  if (cached) return path.join(dir, cached);
  const r = spawnSync('npm', ['pack', spec, '--json', '--pack-destination', dir], { cwd: dir, encoding: 'utf8', timeout: 300_000 });
  if (r.status !== 0) throw new Error(`npm pack ${spec} failed: ${tail(r.stderr ?? '')}`);
  const file = (JSON.parse(r.stdout) as { filename: string }[])[0]?.filename;
  if (!file) throw new Error(`npm pack ${spec}: no tarball name`);
  return path.join(dir, path.basename(file.replace(/^@/, '').replace('/', '-')));
}

function extract(tgz: string, member: string, out: string): string {
  const dir = `${out}.x`;
  fs.mkdirSync(dir, { recursive: true });
  const r = spawnSync('tar', ['-xzf', tgz, '-C', dir, member], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`tar ${tgz} ${member}: ${r.stderr}`);
  fs.renameSync(path.join(dir, member), out);
  return out;
}

function realData(dir: string, scenario: string): { old: string; neu: string; detail: string } {
  const cache = path.join(REPO, 'bench', 'work', 'npm-cache');
  fs.mkdirSync(cache, { recursive: true });
  const pair = (a: string, b: string, member: string | undefined, detail: string) => {
    const ta = npmPack(cache, a);
    const tb = npmPack(cache, b);
    if (!member) {
      fs.copyFileSync(ta, path.join(dir, `${scenario}.old`));
      fs.copyFileSync(tb, path.join(dir, `${scenario}.new`));
    } else {
      extract(ta, member, path.join(dir, `${scenario}.old`));
      extract(tb, member, path.join(dir, `${scenario}.new`));
    }
    return { old: path.join(dir, `${scenario}.old`), neu: path.join(dir, `${scenario}.new`), detail };
  };
  switch (scenario) {
    case 'esbuild':
      return pair('@esbuild/linux-x64@0.24.0', '@esbuild/linux-x64@0.24.1', 'package/bin/esbuild', 'native binary `bin/esbuild` of @esbuild/linux-x64 0.24.0 → 0.24.1');
    case 'typescript-js':
      return pair('typescript@5.6.2', 'typescript@5.6.3', 'package/lib/typescript.js', '`lib/typescript.js` of typescript 5.6.2 → 5.6.3');
    default:
      return pair('typescript@5.6.2', 'typescript@5.6.3', undefined, 'npm tarballs typescript-5.6.2.tgz → typescript-5.6.3.tgz');
  }
}

async function ffsyncOnce(label: string, src: string, dst: string, recvArgs: string[] = []): Promise<{ run: Run; literal: number }> {
  const sr = await fsp.mkdtemp(path.join(work, 'state-r-'));
  const ss = await fsp.mkdtemp(path.join(work, 'state-s-'));
  try {
    const rssFile = (peer: 'receiver' | 'sender') => path.join(work, `rss-${label}-${peer[0]}.txt`);
    const r = await runFfsyncPair({ label, src, dst, stateR: sr, stateS: ss, recvArgs, rssFile });
    const wire = r.sender.bytesOnWire;
    return { run: { ms: r.wallMs, sent: wire.sent, received: wire.received, rssKb: [r.rssKb.sender ?? 0, r.rssKb.receiver ?? 0] }, literal: r.sender.literalBytes ?? 0 };
  } finally {
    await rmf(sr);
    await rmf(ss);
  }
}

async function rsyncOnce(label: string, src: string, dst: string, extra: string[] = []): Promise<Run> {
  const r = await runRsync(`${label} rsync`, ['--no-whole-file', ...extra, src, dst], path.join(work, `rss-${label}-rsync.txt`));
  return { ms: r.wallMs, sent: r.stats.sent, received: r.stats.received, rssKb: [r.rssKb ?? 0] };
}

async function scenario(name: string): Promise<Row> {
  const dir = path.join(work, name);
  await fsp.mkdir(dir, { recursive: true });
  const inplace = name.startsWith('inplace-');
  const f = name.startsWith('synthetic-') || inplace ? synthetic(dir, Number(name.split('-')[1]), inplace) : realData(dir, name);
  const mode = inplace ? ['--inplace'] : [];
  const want = sha256(f.neu);
  const size = fs.statSync(f.neu).size;
  const row: Row = { scenario: name, detail: f.detail, size, ffsync: [], rsync: [] };
  for (let k = 0; k < repeat; k++) {
    for (const tool of ['ffsync', 'rsync'] as const) {
      const dst = path.join(dir, `${tool}.target`);
      await fsp.copyFile(f.old, dst);
      flushWorkFs(dir);
      const label = `${name}-${tool}-${k}`;
      process.stderr.write(`  ${label} …\n`);
      if (tool === 'ffsync') {
        const r = await withTimeout(600_000, label, () => ffsyncOnce(label, f.neu, dst, mode));
        row.ffsync.push(r.run);
        row.literal = r.literal;
      } else {
        row.rsync.push(await withTimeout(600_000, label, () => rsyncOnce(label, f.neu, dst, mode)));
      }
      if (sha256(dst) !== want) throw new Error(`${label}: result differs from the source (sha256)`);
      await rmf(dst);
    }
  }
  await rmf(dir);
  return row;
}

async function main(): Promise<void> {
  const rows: Row[] = [];
  for (const s of only) {
    process.stderr.write(`${s}\n`);
    rows.push(await scenario(s));
  }
  const med = (runs: Run[], f: (r: Run) => number) => median(runs.map(f))!;
  const t = {
    head: ['scenario', 'size', 'ffsync s', 'rsync s', 'rsync/ffsync time', 'ffsync wire (sent+recv)', 'rsync sent', 'rsync sent+recv', 'ffsync ≤ rsync sent', 'ffsync RSS snd/rcv', 'rsync RSS', 'verified'],
    rows: rows.map((r) => {
      const fw = med(r.ffsync, (x) => x.sent + x.received);
      const rs = med(r.rsync, (x) => x.sent);
      return [
        r.scenario,
        fmtBytes(r.size),
        (med(r.ffsync, (x) => x.ms) / 1000).toFixed(3),
        (med(r.rsync, (x) => x.ms) / 1000).toFixed(3),
        fmtRatio(med(r.rsync, (x) => x.ms), med(r.ffsync, (x) => x.ms)),
        fmtBytes(fw),
        fmtBytes(rs),
        fmtBytes(med(r.rsync, (x) => x.sent + x.received)),
        fw <= rs ? 'yes' : `no (${fmtRatio(fw, rs)})`,
        `${fmtRss(Math.max(...r.ffsync.map((x) => x.rssKb?.[0] ?? 0)))} / ${fmtRss(Math.max(...r.ffsync.map((x) => x.rssKb?.[1] ?? 0)))}`,
        fmtRss(Math.max(...r.rsync.map((x) => x.rssKb?.[0] ?? 0))),
        `yes (${r.ffsync.length + r.rsync.length}/${r.ffsync.length + r.rsync.length})`,
      ];
    }),
  };
  process.stdout.write(`${textTable(t)}\n`);
  const m = machineInfo(work);
  const section = [
    BEGIN_MARK,
    '',
    '# Precision deltas: single-file deltas vs rsync (`bench/refine.ts`)',
    '',
    `Command: \`${commandLine()}\` — date ${m.date}, ${m.nproc} CPUs, ${m.kernel}, fs ${m.fs}, ${m.rsync}, commit ${m.commit}, ${repeat} run(s) per tool (median shown)`,
    '',
    ...rows.map((r) => `- ${r.scenario}: ${r.detail}`),
    '',
    'ffsync: `receive` + `send` over loopback TCP (`--plaintext`), no index (both peers scan), sub-chunk refinement on (negotiated). ' +
      'rsync: `rsync --no-whole-file --stats` locally. "ffsync wire" counts both directions (manifest, NEED/REFINE, DATA, control frames); ' +
      'the issue\'s target is that it stays at or under rsync\'s *total bytes sent* (one direction). Times are wall clock (ffsync: both node processes ' +
      'from spawn to exit); rsync/ffsync > 1 means ffsync-native is faster. Every result is checked with SHA-256.',
    '',
    markdown(t),
    '',
    END_MARK,
  ].join('\n');
  if (!values['no-write']) {
    const file = writeResultsSection(BEGIN_MARK, END_MARK, section);
    process.stderr.write(`wrote ${path.relative(process.cwd(), file)}\n`);
  }
  if (!values.dir) await rmf(work);
}

runMain('bench/refine.ts', main);
