#!/usr/bin/env node
// Fixed costs (issue 18, "small fixed costs"): start-up per command and small local syncs, with
// rsync side by side in the same run.
//
//   node --import tsx bench/startup.ts [--runs N] [--dir DIR] [--baseline OTHER_CLI] [--no-write]
//   npm run bench:startup
//
// Rounds: every case runs once per round, in the same order, so a burst of load from elsewhere
// on the machine hits every case alike; the table shows the median of the rounds. Cases:
// `node -e 0` (the floor every Node program pays), `--version`, `--help`, `id`, a whole TLS
// session for one 1 KiB file (`receive` and `send` on loopback, both pinned); local `sync -a`
// no-ops of a 10,000 × 4 KiB tree and of the npm tree bench/tree.ts uses (typescript@5.6.2,
// 121 files, 21 MiB), its cold copy and its v1 → v2 update, each against `rsync -a` (`--delete`
// on both for the update); 200 changed files of 128 KiB over their old versions, by default and
// with `--no-whole-file` on both (decisions §107). Every sync's result is compared with its source after the last round.
// `--baseline` times another build's CLI (e.g. one built from the previous commit) beside this one.
// When NODE_EXTRA_CA_CERTS is set (it is on our CI machines), Node reads and parses every certificate
// in that file before it runs any script, ~65 ms here, a cost of the environment that a plain
// `node -e 0` pays too and ffsync-native needs nothing from (peers are pinned by fingerprint):
// `node -e 0` and this CLI's rows are then run a second time with it unset, marked "no extra CAs".
// This CLI's rows run once more with NODE_DISABLE_COMPILE_CACHE=1 (V8's code cache of the CLI off:
// every run pays what a first run pays; decisions §98), marked "no code cache".
// Writes bench/RESULTS-startup.md. Node built-ins only.

import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { performance } from 'node:perf_hooks';
import { benchArgs, intOption, orUsage, CLI, KiB, REPO, RSYNC_BIN, commandLine, flushWorkFs, machineInfo, markdown, median, textTable, runMain } from './common.js';
import { XorShift128 } from '../__test__/helpers/data';

const NPM_PKG = 'typescript';
const NPM_V1 = '5.6.2';
const NPM_V2 = '5.6.3';
/** Where the tests and benches keep npm tarballs (git-ignored). */
const TARBALLS = path.join(REPO, 'node_modules', '.cache', 'ffsync-fixtures');

const HELP = 'usage: node --import tsx bench/startup.ts [--runs N (default 9, at least 5)] [--dir DIR] [--baseline OTHER_CLI [--baseline-note TEXT]] [--no-write]\n';
const opt = benchArgs(
  process.argv.slice(2),
  {
    runs: { type: 'string' },
    dir: { type: 'string' },
    baseline: { type: 'string' },
    'baseline-note': { type: 'string' },
    'no-write': { type: 'boolean' },
  },
  HELP,
);
const RUNS = orUsage(HELP, () => intOption('runs', opt.runs, 9, 5, 1000));
const DIR = opt.dir ?? os.tmpdir();

/**
 * One timed command: wall clock of spawn to exit, and its CPU time (user + system, all
 * threads: bash's `times` for its child, 1 ms resolution; less disturbed than wall clock
 * by other load on the machine). Every case runs under the same bash, so its own start-up
 * (a few ms) is in every figure alike. A failure stops the bench.
 */
function time(argv: string[], env: NodeJS.ProcessEnv = process.env): { wall: number; cpu: number } {
  const t0 = performance.now();
  const r = spawnSync('bash', ['-c', '"$@" >/dev/null 2>"$FFSYNC_BENCH_ERR"; rc=$?; times; exit $rc', 'bash', ...argv], {
    encoding: 'utf8',
    env: { ...env, FFSYNC_BENCH_ERR: errFile },
  });
  const wall = performance.now() - t0;
  if (r.status !== 0) throw new Error(`${argv.join(' ')}: exit ${r.status ?? r.signal}\n${fs.readFileSync(errFile, 'utf8').slice(-2000)}`);
  // `times`: the shell's user and system time, then its children's ("0m0.052s 0m0.012s").
  const m = /(\d+)m([\d.]+)s\s+(\d+)m([\d.]+)s\s*$/.exec(r.stdout.trim());
  const cpu = m ? (Number(m[1]) * 60 + Number(m[2]) + Number(m[3]) * 60 + Number(m[4])) * 1000 : NaN;
  return { wall, cpu };
}
let errFile = '';

/** bash: $1 node, $2 cli, $3 file, $4 target, $5/$6 sender/receiver state, $7/$8 their
 * fingerprints, $9 the receiver's output. The receiver's port is read from its first line. */
const TLS_SESSION = `"$1" "$2" receive "$4" 0 --bind 127.0.0.1 --state-dir "$6" --trust "$7" --no-fsync > "$9" 2>&1 &
for i in $(seq 2000); do grep -q listening "$9" && break; sleep 0.002; done
port=$(grep -o 'listening on [0-9.:]*' "$9" | sed 's/.*://')
"$1" "$2" send "$3" "127.0.0.1:$port" --state-dir "$5" --trust "$8" && wait $!`;

function must(argv: string[], what: string): string {
  const r = spawnSync(argv[0]!, argv.slice(1), { encoding: 'utf8', maxBuffer: 64 << 20 });
  if (r.status !== 0) throw new Error(`${what}: ${argv.join(' ')}: exit ${r.status ?? r.signal}\n${r.stderr}`);
  return r.stdout;
}

/** The npm tarball, from the shared cache, or fetched into it with `npm pack` once. */
function tarball(version: string): string {
  const file = path.join(TARBALLS, `${NPM_PKG}-${version}.tgz`);
  if (!fs.existsSync(file)) {
    fs.mkdirSync(TARBALLS, { recursive: true });
    must(['npm', 'pack', `${NPM_PKG}@${version}`, '--pack-destination', TARBALLS, '--silent'], 'fetch the npm fixture');
  }
  return file;
}

function extract(tgz: string, dir: string): void {
  fs.rmSync(dir, { recursive: true, force: true });
  fs.mkdirSync(dir, { recursive: true });
  must(['tar', '-xzf', tgz, '-C', dir, '--strip-components=1', '--no-same-owner'], 'extract');
}

/** 10,000 files of 4 KiB of seeded bytes in 300 directories (bench/tree.ts's cold-10k shape). */
function tree10k(root: string): void {
  const rng = new XorShift128(1, 10);
  const buf = Buffer.alloc(4 * KiB);
  for (let i = 0; i < 10_000; i++) {
    const d = path.join(root, `d${i % 300}`);
    if (i < 300) fs.mkdirSync(d, { recursive: true });
    rng.fill(buf);
    fs.writeFileSync(path.join(d, `f${i}`), buf);
  }
}

/** 200 files of 128 KiB in 10 directories, old and new: each new one has 1 KiB overwritten at
 * a seeded offset and an mtime a minute later (a build tree of mid-size files, rebuilt). */
function midTrees(oldRoot: string, newRoot: string): void {
  const rng = new XorShift128(1, 20);
  const buf = Buffer.alloc(128 * KiB);
  const edit = Buffer.alloc(KiB);
  const t = Date.now() / 1000 - 86_400;
  for (let i = 0; i < 200; i++) {
    const rel = path.join(`d${i % 10}`, `f${i}.bin`);
    if (i < 10) for (const r of [oldRoot, newRoot]) fs.mkdirSync(path.join(r, `d${i}`), { recursive: true });
    rng.fill(buf);
    fs.writeFileSync(path.join(oldRoot, rel), buf);
    fs.utimesSync(path.join(oldRoot, rel), t, t);
    rng.fill(edit);
    edit.copy(buf, rng.below(buf.length - KiB));
    fs.writeFileSync(path.join(newRoot, rel), buf);
    fs.utimesSync(path.join(newRoot, rel), t + 60, t + 60);
  }
}

/** Paths, kinds, modes, sizes, mtimes (seconds) and contents equal: '' or the first difference. */
function sameTree(a: string, b: string): string {
  const list = (root: string, rel = ''): string[] =>
    fs.readdirSync(path.join(root, rel), { withFileTypes: true }).flatMap((e) => {
      const r = path.join(rel, e.name);
      return e.isDirectory() ? [r + '/', ...list(root, r)] : [r];
    });
  const la = list(a).sort();
  const lb = list(b).sort();
  if (la.join('\n') !== lb.join('\n')) return `paths differ (${la.length} vs ${lb.length})`;
  for (const r of la) {
    const [sa, sb] = [fs.lstatSync(path.join(a, r)), fs.lstatSync(path.join(b, r))];
    if ((sa.mode & 0o7777) !== (sb.mode & 0o7777) || Math.floor(sa.mtimeMs / 1000) !== Math.floor(sb.mtimeMs / 1000)) return `${r}: mode or mtime differs`;
    if (sa.isFile() && !fs.readFileSync(path.join(a, r)).equals(fs.readFileSync(path.join(b, r)))) return `${r}: content differs`;
  }
  return '';
}

interface Case {
  name: string;
  /** Start-up of a command, or a sync (ffsync-native or rsync). */
  kind: 'start' | 'sync';
  /** Untimed, before each timed run. */
  before?: () => void;
  argv: string[];
  /** The environment it runs in (default: the bench's). */
  env?: NodeJS.ProcessEnv;
  /** Wall clock ms per round. */
  samples: number[];
  /** CPU ms per round. */
  cpu: number[];
  /** Untimed, after the last round: '' or what is wrong with the result. */
  check?: () => string;
}

async function main(): Promise<void> {
  fs.mkdirSync(DIR, { recursive: true });
  const work = fs.mkdtempSync(path.join(DIR, 'ffsync-startup-'));
  errFile = path.join(work, 'stderr.txt');
  const node = process.execPath;
  // The environment without NODE_EXTRA_CA_CERTS, when it has one (see the head of this file).
  const { NODE_EXTRA_CA_CERTS: extraCa, ...noExtraCa } = process.env;
  const bare = extraCa ? noExtraCa : undefined;
  const builds: [string, string][] = [['ffsync', CLI], ...(opt.baseline ? [['baseline', path.resolve(opt.baseline)] as [string, string]] : [])];
  // And this build without V8's code cache of the CLI (decisions §98): what a first run pays.
  // The others keep theirs where a user's is kept; a command's first run makes it (the no-ops'
  // untimed first syncs, the first round for the rest).
  const noCodeCache = { ...(bare ?? process.env), NODE_DISABLE_COMPILE_CACHE: '1' };
  const clis: [string, string, NodeJS.ProcessEnv?][] = builds.flatMap(([label, cli]): [string, string, NodeJS.ProcessEnv?][] => [
    [label, cli],
    ...(bare ? [[`${label}, no extra CAs`, cli, bare] as [string, string, NodeJS.ProcessEnv]] : []),
    ...(label === 'ffsync' ? [[`${label}${bare ? ', no extra CAs' : ''}, no code cache`, cli, noCodeCache] as [string, string, NodeJS.ProcessEnv]] : []),
  ]);
  const slug = (label: string) => label.replace(/\W+/g, '-');
  try {
    process.stderr.write(`fixtures in ${work} …\n`);
    const t10k = path.join(work, 't10k');
    tree10k(t10k);
    const v1 = path.join(work, 'npm-v1');
    const v2 = path.join(work, 'npm-v2');
    extract(tarball(NPM_V1), v1);
    extract(tarball(NPM_V2), v2);
    const [midOld, midNew] = [path.join(work, 'mid-old'), path.join(work, 'mid-new')];
    midTrees(midOld, midNew);
    const state = (label: string) => path.join(work, `state-${slug(label)}`);

    const cases: Case[] = [{ name: 'node -e 0', kind: 'start', argv: [node, '-e', '0'], samples: [], cpu: [] }];
    if (bare) cases.push({ name: 'node -e 0, no extra CAs', kind: 'start', argv: [node, '-e', '0'], env: bare, samples: [], cpu: [] });
    const one = path.join(work, 'one-kib');
    fs.writeFileSync(one, Buffer.alloc(1024, 7));
    for (const [label, cli, env] of clis) {
      // The identity exists before `id` is timed (its first call creates it).
      must([node, cli, 'id', '--state-dir', state(`${label}-id`)], 'id');
      cases.push(
        { name: `${label} --version`, kind: 'start', argv: [node, cli, '--version'], env, samples: [], cpu: [] },
        { name: `${label} --help`, kind: 'start', argv: [node, cli, '--help'], env, samples: [], cpu: [] },
        { name: `${label} id`, kind: 'start', argv: [node, cli, 'id', '--state-dir', state(`${label}-id`)], env, samples: [], cpu: [] },
      );
      // A whole TLS session for one 1 KiB file: `receive` started, `send` once it listens (both
      // peers pinned), until both exit: two Node start-ups, the handshake, the file.
      const [ss, sr] = [state(`${label}-tls-s`), state(`${label}-tls-r`)];
      const [fpS, fpR] = [must([node, cli, 'id', '--state-dir', ss], 'id').trim(), must([node, cli, 'id', '--state-dir', sr], 'id').trim()];
      const tlsDst = path.join(work, `tls-${slug(label)}`);
      cases.push({
        name: `${label} TLS send + receive, one 1 KiB file`,
        kind: 'start',
        before: () => fs.rmSync(tlsDst, { recursive: true, force: true }),
        argv: ['bash', '-c', TLS_SESSION, 'tls-session', node, cli, one, tlsDst, ss, sr, fpS, fpR, path.join(work, `tls-${slug(label)}.out`)],
        env,
        samples: [],
        cpu: [],
        check: () => (fs.readFileSync(tlsDst).equals(fs.readFileSync(one)) ? '' : 'received file differs'),
      });
    }
    // No-ops: each tool's target made by its own untimed first sync, then re-synced unchanged.
    for (const [tree, src] of [
      ['10k', t10k],
      ['npm', v1],
    ] as const) {
      for (const [label, cli, env] of clis) {
        const dst = path.join(work, `noop-${tree}-${slug(label)}`);
        must([node, cli, 'sync', '-a', `${src}/`, `${dst}/`, '--state-dir', state(`noop-${tree}-${label}`), '-q'], 'prep sync');
        cases.push({ name: `${label} sync no-op ${tree}`, kind: 'sync', argv: [node, cli, 'sync', '-a', `${src}/`, `${dst}/`, '--state-dir', state(`noop-${tree}-${label}`), '-q'], env, samples: [], cpu: [], check: () => sameTree(src, dst) });
      }
      const dst = path.join(work, `noop-${tree}-rsync`);
      must([RSYNC_BIN, '-a', `${src}/`, `${dst}/`], 'prep rsync');
      cases.push({ name: `rsync no-op ${tree}`, kind: 'sync', argv: [RSYNC_BIN, '-a', `${src}/`, `${dst}/`], samples: [], cpu: [], check: () => sameTree(src, dst) });
    }
    // The npm tree cold (empty target, fresh state), and v1 -> v2 (target and state of a v1 sync).
    type Tool = [string, (src: string, dst: string, st: string) => string[], NodeJS.ProcessEnv?];
    const npmTools: Tool[] = [
      ...clis.map(([label, cli, env]): Tool => [label, (src, dst, st) => [node, cli, 'sync', '-a', '--delete', `${src}/`, `${dst}/`, '--state-dir', st, '-q'], env]),
      ['rsync', (src, dst) => [RSYNC_BIN, '-a', '--delete', `${src}/`, `${dst}/`]],
    ];
    for (const [label, argv, env] of npmTools) {
      const dst = path.join(work, `cold-${slug(label)}`);
      const st = state(`cold-${label}`);
      cases.push({
        name: `${label === 'rsync' ? 'rsync' : `${label} sync`} npm cold`,
        kind: 'sync',
        before: () => {
          fs.rmSync(dst, { recursive: true, force: true });
          fs.rmSync(st, { recursive: true, force: true });
          flushWorkFs(work); // our own setup's writeback stays out of the timing
        },
        argv: argv(v1, dst, st),
        env,
        samples: [],
        cpu: [],
        check: () => sameTree(v1, dst),
      });
    }
    /** `tools` updating `from` to `to`: each run over a fresh target and state of an untimed
     * sync of `from`. (The check reports what differs, rsync's stale files included.) */
    const updates = (tools: Tool[], what: string, tag: string, from: string, to: string) => {
      for (const [label, argv, env] of tools) {
        const dst = path.join(work, `${tag}-${slug(label)}`);
        const st = state(`${tag}-${label}`);
        cases.push({
          name: `${label === 'rsync' ? 'rsync' : `${label} sync`} ${what}`,
          kind: 'sync',
          before: () => {
            fs.rmSync(dst, { recursive: true, force: true });
            fs.rmSync(st, { recursive: true, force: true });
            must(argv(from, dst, st), `prep ${what}`);
            flushWorkFs(work);
          },
          argv: argv(to, dst, st),
          env,
          samples: [],
          cpu: [],
          check: () => sameTree(to, dst),
        });
      }
    };
    // rsync's quick check leaves one v2 file with v1's content (same size and mtime): reported
    // as what it is, not as a failure of the bench.
    updates(npmTools, 'npm v1→v2', 'upd', v1, v2);

    // 200 mid-size files changed, over their old versions as a sync of them left them: by
    // default (whole up to 1 MiB, as rsync copies whole between local paths) and as deltas.
    for (const delta of [false, true]) {
      const flags = delta ? ['--no-whole-file'] : [];
      const midTools: Tool[] = [
        // (A baseline build may not know --no-whole-file: deltas are what its default does.)
        ...clis.filter(([label]) => !(delta && label.startsWith('baseline'))).map(([label, cli, env]): Tool => [label, (src, dst, st) => [node, cli, 'sync', '-a', ...flags, `${src}/`, `${dst}/`, '--state-dir', st, '-q'], env]),
        ['rsync', (src, dst) => [RSYNC_BIN, '-a', ...flags, `${src}/`, `${dst}/`]],
      ];
      updates(midTools, `200 × 128 KiB changed${delta ? ' --no-whole-file' : ''}`, delta ? 'mid-delta' : 'mid', midOld, midNew);
    }

    for (let round = 1; round <= RUNS; round++) {
      process.stderr.write(`round ${round}/${RUNS}\n`);
      for (const c of cases) {
        c.before?.();
        const t = time(c.argv, c.env);
        c.samples.push(t.wall);
        c.cpu.push(t.cpu);
      }
    }
    const med = new Map(cases.map((c) => [c.name, median(c.samples)!]));
    const cpu = new Map(cases.map((c) => [c.name, median(c.cpu)!]));
    const problems = new Map(cases.map((c) => [c.name, c.check?.() ?? '']));

    const floor = med.get('node -e 0')!;
    /** What a command's Node start-up is compared with: `node -e 0` in the same environment. */
    const floorOf = (c: Case) => med.get(bare && c.env && !c.env.NODE_EXTRA_CA_CERTS ? 'node -e 0, no extra CAs' : 'node -e 0')!;
    const ms = (x: number) => x.toFixed(1);
    const startRows = cases
      .filter((c) => c.kind === 'start')
      .map((c) => [
        c.name,
        ms(med.get(c.name)!),
        c.name.startsWith('node -e 0') ? '—' : `+${ms(med.get(c.name)! - floorOf(c))}`,
        `${ms(Math.min(...c.samples))} – ${ms(Math.max(...c.samples))}`,
        ms(cpu.get(c.name)!),
      ]);
    const syncRow = (tool: string, rsyncName: string) => {
      const t = med.get(tool)!;
      const r = med.get(rsyncName)!;
      const bad = problems.get(tool);
      const rbad = problems.get(rsyncName);
      return [tool, ms(t), ms(r), `${(r / t).toFixed(2)}x`, `${ms(cpu.get(tool)!)} / ${ms(cpu.get(rsyncName)!)}`, bad ? `MISMATCH: ${bad}` : 'yes', rbad ? `rsync: ${rbad}` : ''];
    };
    const syncRows: string[][] = [];
    for (const [label] of clis) {
      syncRows.push(syncRow(`${label} sync no-op 10k`, 'rsync no-op 10k'));
      syncRows.push(syncRow(`${label} sync no-op npm`, 'rsync no-op npm'));
      syncRows.push(syncRow(`${label} sync npm cold`, 'rsync npm cold'));
      syncRows.push(syncRow(`${label} sync npm v1→v2`, 'rsync npm v1→v2'));
      syncRows.push(syncRow(`${label} sync 200 × 128 KiB changed`, 'rsync 200 × 128 KiB changed'));
      if (!label.startsWith('baseline')) syncRows.push(syncRow(`${label} sync 200 × 128 KiB changed --no-whole-file`, 'rsync 200 × 128 KiB changed --no-whole-file'));
    }
    const startTable = { head: ['command', 'median ms', 'above node -e 0', 'min – max ms', 'CPU ms'], rows: startRows };
    const syncTable = { head: ['ffsync-native', 'median ms', 'rsync ms', 'rsync/ffsync', 'CPU ms ffsync / rsync', 'verified', 'note'], rows: syncRows };
    const verdict = (ok: boolean) => (ok ? 'PASS' : 'FAIL');
    const ratioCpu = (tool: string, rs: string) => `${(cpu.get(rs)! / cpu.get(tool)!).toFixed(2)}x`;
    const targetRows = (label: string, nodeFloor: string, note: string) => {
      const v = med.get(`${label} --version`)! - med.get(nodeFloor)!;
      const vCpu = cpu.get(`${label} --version`)! - cpu.get(nodeFloor)!;
      const n10k = med.get('rsync no-op 10k')! / med.get(`${label} sync no-op 10k`)!;
      const cold = med.get('rsync npm cold')! / med.get(`${label} sync npm cold`)!;
      const upd = med.get('rsync npm v1→v2')! / med.get(`${label} sync npm v1→v2`)!;
      return [
        [`\`--version\` ≤ 40 ms above \`node -e 0\`${note}`, `+${ms(v)} ms`, verdict(v <= 40), `+${ms(vCpu)} ms`],
        [`local 10k-file no-op ≥ 1x rsync${note}`, `${n10k.toFixed(2)}x`, verdict(n10k >= 1), ratioCpu(`${label} sync no-op 10k`, 'rsync no-op 10k')],
        [`npm tree (121 files) cold ≥ 0.8x rsync${note}`, `${cold.toFixed(2)}x`, verdict(cold >= 0.8), ratioCpu(`${label} sync npm cold`, 'rsync npm cold')],
        [`npm tree v1→v2 ≥ 0.8x rsync${note}`, `${upd.toFixed(2)}x`, verdict(upd >= 0.8), ratioCpu(`${label} sync npm v1→v2`, 'rsync npm v1→v2')],
      ];
    };
    const targets = {
      head: ['target (issue 18)', 'measured (wall, medians)', 'verdict', 'CPU time (medians)'],
      rows: [
        ...targetRows('ffsync', 'node -e 0', ''),
        ...(bare ? targetRows('ffsync, no extra CAs', 'node -e 0, no extra CAs', ' (NODE_EXTRA_CA_CERTS unset)') : []),
        ...(bare
          ? targetRows('ffsync, no extra CAs, no code cache', 'node -e 0, no extra CAs', ' (NODE_EXTRA_CA_CERTS unset, no code cache: every run a first run)')
          : targetRows('ffsync, no code cache', 'node -e 0', ' (no code cache: every run a first run)')),
      ],
    };
    process.stdout.write(`\n${textTable(startTable)}\n\n${textTable(syncTable)}\n\n${textTable(targets)}\n`);

    const m = machineInfo(work);
    const md = [
      '# Fixed costs: start-up and small local syncs',
      '',
      `Written by \`${commandLine()}\` (bench/startup.ts) on ${m.date}: ${RUNS} rounds, every case once per round in the same order; medians.`,
      ...(opt.baseline ? [`\`baseline\` rows: the CLI at ${opt['baseline-note'] ?? path.resolve(opt.baseline)}, timed in the same rounds.`] : []),
      ...(bare
        ? [
            `NODE_EXTRA_CA_CERTS is set in this environment (${extraCa}): every Node process reads and parses each certificate in it before running any script (\`node -e 0\` ${ms(floor)} ms, ${ms(med.get('node -e 0, no extra CAs')!)} ms without it). ffsync-native uses no CA certificates (peers are pinned by fingerprint); rows marked "no extra CAs" run the same commands with it unset, in the same rounds.`,
          ]
        : []),
      'V8\'s code cache of the CLI (decisions §98) is kept where a user\'s is, made by each command\'s first successful run (the no-ops\' untimed first syncs; the first round for the other commands): the rows marked "no code cache" run with `NODE_DISABLE_COMPILE_CACHE=1`, as every run would without it.',
      `Machine: ${m.nproc} cores (${m.cpu}), ${m.memory}, ${m.kernel}, ${m.fs}, load ${m.load} at the end; ${m.node}; ${m.rsync}; ffsync-native ${m.ffsync} at ${m.commit}.`,
      '',
      'Start-up (wall clock from spawn to exit, medians; CPU = user + system time of all threads, median; `id` with an existing identity):',
      '',
      markdown(startTable),
      '',
      `Local syncs, \`sync -a SRC/ DST/ -q\` against \`rsync -a SRC/ DST/\` (\`--delete\` on both for the npm cold and v1→v2 rows). No-op: the target and state of an untimed first sync, unchanged. npm cold: empty target and state dir, dirty pages flushed before each run (ffsync-native makes the tree durable with one syncfs; rsync does not). v1→v2: a fresh v1 sync's target and state, then \`${NPM_PKG}@${NPM_V2}\` (4 files changed, one with the same size and mtime, which rsync's quick check leaves stale). 200 × 128 KiB changed: 200 files of 128 KiB in 10 directories, each with 1 KiB overwritten and a later mtime, synced over the old versions as an untimed sync of them left them (target and state); by default (ffsync-native sends changed files up to 1 MiB whole between local paths, as rsync copies whole there) and with \`--no-whole-file\` on both (deltas). rsync/ffsync > 1 means ffsync-native is faster.`,
      '',
      markdown(syncTable),
      '',
      markdown(targets),
      '',
    ].join('\n');
    if (!opt['no-write']) {
      const out = path.join(REPO, 'bench', 'RESULTS-startup.md');
      fs.writeFileSync(out, md);
      process.stderr.write(`wrote ${path.relative(process.cwd(), out)}\n`);
    }
    const mismatched = [...problems].filter(([name, p]) => p && !name.startsWith('rsync'));
    if (mismatched.length) {
      process.stderr.write(`!!!!! ${mismatched.map(([n, p]) => `${n}: ${p}`).join('; ')}\n`);
      process.exitCode = 1;
    }
  } finally {
    fs.rmSync(work, { recursive: true, force: true });
  }
}

runMain('bench/startup.ts', main);
