// The `serve` load test (issue: server mode for fleets), shared by `npm run bench:serve`
// (full size) and __test__/serve.test.ts (a short version). Loopback only, bounded:
// N concurrent senders each push a tree of F files and B senders push one big file
// each, for R rounds with changes between rounds. After every round each pushed tree
// and file must be byte-identical to its source; the daemon's peak RSS is sampled from
// /proc, and its open file descriptors must return to the count it had before the first
// session.

import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { isDeepStrictEqual } from 'node:util';
import { sha256, snapshot } from '../__test__/helpers/peers';
import { seedOf, XorShift128 } from '../__test__/helpers/data';

const CLI = path.join(__dirname, '..', 'dist', 'cli', 'main.js');

export interface LoadParams {
  treeSenders: number;
  filesPerTree: number;
  bigSenders: number;
  bigBytes: number;
  rounds: number;
  seed: number;
  /** Distinct client identities the senders share (each authorized in the config). */
  identities?: number;
  /** Where fixtures live (removed afterwards unless keep). */
  workDir?: string;
  keep?: boolean;
  log?: (line: string) => void;
}

export interface RoundFigures {
  round: number;
  seconds: number;
  sessions: number;
  failures: string[];
  wireBytesSent: number;
  literalBytes: number;
  verified: number;
  mismatched: string[];
  /** The daemon's resident set when the round's sessions had all ended. */
  daemonRssAfterKiB: number;
}

export interface LoadFigures {
  params: LoadParams;
  rounds: RoundFigures[];
  daemonPeakRssKiB: number;
  daemonFdsBaseline: number;
  daemonFdsAfter: number;
  /** Descriptors open after the rounds that were not open before (kinds, not numbers). */
  daemonFdsExtra: string[];
  daemonExitCode: number | null;
  sessionLines: number;
  sessionLinesOk: number;
}

/** Deterministic bytes of a named seed. */
function seeded(len: number, seed: string): Buffer {
  const b = Buffer.allocUnsafe(len);
  new XorShift128(seedOf(seed), 0).fill(b);
  return b;
}

/** Deterministic numbers in [0, 1) of a named seed. */
function rng(seed: string): () => number {
  const x = new XorShift128(seedOf(seed), 1);
  return () => x.next() / 2 ** 32;
}

function makeTree(dir: string, files: number, seed: string): void {
  const r = rng(seed);
  for (let i = 0; i < files; i++) {
    const sub = path.join(dir, `d${i % 10}`);
    fs.mkdirSync(sub, { recursive: true });
    fs.writeFileSync(path.join(sub, `f${i}.bin`), seeded(512 + Math.floor(r() * 16 * 1024), `${seed}/${i}`));
  }
}

/** Between rounds: ~5% of files rewritten, one added, one removed. */
function changeTree(dir: string, round: number, seed: string): void {
  const r = rng(`${seed}/change/${round}`);
  const files = Object.keys(snapshot(dir)).sort();
  for (const f of files) if (r() < 0.05) fs.writeFileSync(path.join(dir, f), seeded(512 + Math.floor(r() * 16 * 1024), `${seed}/${f}/${round}`));
  fs.writeFileSync(path.join(dir, `d0`, `new-${round}.bin`), seeded(2048, `${seed}/new/${round}`));
  const victim = files[Math.floor(r() * files.length)];
  if (victim) fs.rmSync(path.join(dir, victim), { force: true });
}

/** Between rounds: a few 64 KiB overwrites at seeded places (in place, same size). */
function changeBig(file: string, round: number, seed: string): void {
  const r = rng(`${seed}/big/${round}`);
  const fd = fs.openSync(file, 'r+');
  try {
    const size = fs.fstatSync(fd).size;
    for (let k = 0; k < 8; k++) fs.writeSync(fd, seeded(65536, `${seed}/${round}/${k}`), 0, 65536, Math.floor(r() * Math.max(1, size - 65536)));
  } finally {
    fs.closeSync(fd);
  }
}

function cli(args: string[]): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    const c = spawn(process.execPath, [CLI, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    c.stdout.on('data', (d) => (stdout += d));
    c.stderr.on('data', (d) => (stderr += d));
    c.on('close', (code) => resolve({ code, stdout, stderr }));
  });
}

function procStatusKiB(pid: number, field: string): number {
  try {
    const m = new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) : 0;
  } catch {
    return 0;
  }
}

function fdCount(pid: number): number {
  return fdTargets(pid).length;
}

/** What each open descriptor points at (socket:[…], anon_inode:[…], a path). */
function fdTargets(pid: number): string[] {
  try {
    return fs.readdirSync(`/proc/${pid}/fd`).map((fd) => {
      try {
        return fs.readlinkSync(`/proc/${pid}/fd/${fd}`).replace(/\[\d+\]$/, '');
      } catch {
        return 'gone';
      }
    });
  } catch {
    return [];
  }
}

export async function runServeLoad(p: LoadParams): Promise<LoadFigures> {
  const log = p.log ?? (() => undefined);
  const work = p.workDir ?? fs.mkdtempSync(path.join(os.tmpdir(), 'ffsync-serve-load-'));
  const daemonState = path.join(work, 'daemon-state');
  const root = path.join(work, 'root');
  fs.mkdirSync(root, { recursive: true });
  const idCount = Math.max(1, p.identities ?? 4);
  const identities: { state: string; fp: string }[] = [];
  for (let i = 0; i < idCount; i++) {
    const state = path.join(work, `id${i}`);
    const r = await cli(['id', '--state-dir', state]);
    if (r.code !== 0) throw new Error(`id failed: ${r.stderr}`);
    identities.push({ state, fp: r.stdout.trim() });
  }
  const daemonFp = (await cli(['id', '--state-dir', daemonState])).stdout.trim();
  fs.writeFileSync(path.join(daemonState, 'serve-clients.conf'), identities.map((id, i) => `${id.fp} push,pull load # load client ${i}\n`).join(''));

  // Fixtures: each sender has its own state dir holding a copy of a shared identity.
  type Job = { name: string; source: string; remote: string; target: string; state: string; big: boolean };
  const jobs: Job[] = [];
  for (let i = 0; i < p.treeSenders + p.bigSenders; i++) {
    const big = i >= p.treeSenders;
    const name = big ? `big${i - p.treeSenders}` : `tree${i}`;
    const state = path.join(work, 'clients', name);
    fs.cpSync(path.join(identities[i % idCount].state, 'identity'), path.join(state, 'identity'), { recursive: true });
    const source = path.join(work, 'src', name + (big ? '.bin' : ''));
    fs.mkdirSync(path.dirname(source), { recursive: true });
    if (big) fs.writeFileSync(source, seeded(p.bigBytes, `${p.seed}/${name}`));
    else makeTree(source, p.filesPerTree, `${p.seed}/${name}`);
    jobs.push({ name, source, remote: `load/${name}${big ? '.bin' : ''}`, target: path.join(root, 'load', name + (big ? '.bin' : '')), state, big });
  }
  log(`fixtures: ${p.treeSenders} trees x ${p.filesPerTree} files, ${p.bigSenders} x ${(p.bigBytes / 2 ** 20).toFixed(0)} MiB; ${idCount} client identities`);

  const daemon = spawn(process.execPath, [CLI, 'serve', root, '0', '--bind', '127.0.0.1', '--state-dir', daemonState, '--json', '--quiet', '--max-sessions', String(jobs.length + 8)], { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  let daemonErr = '';
  daemon.stderr.on('data', (d) => (daemonErr += d));
  const exited = new Promise<number | null>((resolve) => daemon.on('close', (code) => resolve(code)));
  const port = await new Promise<number>((resolve, reject) => {
    daemon.stdout.on('data', (d) => {
      out += d;
      const m = /"event":"listening".*?"port":(\d+)/.exec(out);
      if (m) resolve(Number(m[1]));
    });
    void exited.then(() => reject(new Error(`daemon exited: ${daemonErr}`)));
  });
  const pid = daemon.pid!;
  const fdsBaseline = fdCount(pid);
  const baselineTargets = fdTargets(pid);
  let peakRss = 0;
  const sampler = setInterval(() => (peakRss = Math.max(peakRss, procStatusKiB(pid, 'VmRSS'))), 100);

  const rounds: RoundFigures[] = [];
  try {
    for (let round = 1; round <= p.rounds; round++) {
      if (round > 1) for (const j of jobs) (j.big ? changeBig : changeTree)(j.source, round, `${p.seed}/${j.name}`);
      const t0 = Date.now();
      const results = await Promise.all(
        jobs.map((j) => cli(['send', j.source, `127.0.0.1:${port}/${j.remote}`, '--state-dir', j.state, '--trust', daemonFp, '--json', '--timeout', '120'])),
      );
      const seconds = (Date.now() - t0) / 1000;
      const failures: string[] = [];
      let wire = 0;
      let literal = 0;
      results.forEach((r, k) => {
        const summary = r.stdout
          .split('\n')
          .filter(Boolean)
          .map((l) => JSON.parse(l))
          .find((e) => e.event === 'summary');
        if (r.code !== 0 || !summary?.ok) failures.push(`${jobs[k].name}: exit ${r.code} ${r.stderr.trim().split('\n').pop()}`);
        wire += summary?.bytesOnWire?.sent ?? 0;
        literal += summary?.literalBytes ?? 0;
      });
      const mismatched = jobs.filter((j) => (j.big ? !fs.existsSync(j.target) || sha256(j.target) !== sha256(j.source) : !fs.existsSync(j.target) || !isDeepStrictEqual(snapshot(j.source), snapshot(j.target)))).map((j) => j.name);
      rounds.push({ round, seconds, sessions: jobs.length, failures, wireBytesSent: wire, literalBytes: literal, verified: jobs.length - mismatched.length, mismatched, daemonRssAfterKiB: procStatusKiB(pid, 'VmRSS') });
      log(`round ${round}: ${seconds.toFixed(1)} s, ${jobs.length} sessions, ${failures.length} failed, ${mismatched.length} mismatched, wire ${(wire / 2 ** 20).toFixed(1)} MiB`);
    }
  } finally {
    clearInterval(sampler);
  }
  // Sockets of finished sessions close asynchronously: give them a moment.
  let fdsAfter = fdCount(pid);
  for (let i = 0; i < 50 && fdsAfter > fdsBaseline; i++) {
    await new Promise((r) => setTimeout(r, 100));
    fdsAfter = fdCount(pid);
  }
  peakRss = Math.max(peakRss, procStatusKiB(pid, 'VmHWM'));
  const extra = [...fdTargets(pid)];
  for (const t of baselineTargets) extra.splice(extra.indexOf(t), 1);
  daemon.kill('SIGTERM');
  const code = await exited;
  const lines = out
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l))
    .filter((e) => e.event === 'session');
  if (!p.keep && !p.workDir) fs.rmSync(work, { recursive: true, force: true });
  return {
    params: p,
    rounds,
    daemonPeakRssKiB: peakRss,
    daemonFdsBaseline: fdsBaseline,
    daemonFdsAfter: fdsAfter,
    daemonFdsExtra: extra,
    daemonExitCode: code,
    sessionLines: lines.length,
    sessionLinesOk: lines.filter((e) => e.ok).length,
  };
}
