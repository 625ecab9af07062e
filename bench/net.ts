#!/usr/bin/env node
// Network model (issue #18, item 5): ffsync-native and rsync side by side over a shaped link
// between two network namespaces on this machine, every result verified file by file.
//
//   npm run bench:net -- [--cli dist/cli/main.js] [--links 100mbit/30,1gbit/30,100mbit/0,1gbit/0]
//                        [--scenarios artifact,files,big] [--tools tls,parallel,quic,ssh,rsync,rsync-z]
//                        [--files 200] [--size-mib 1024] [--repeat 3] [--timeout-s 900] [--dir DIR]
//                        [--basis index|copy] [--keep] [--no-write] [--out bench/RESULTS-net.md]
//                        [--timeline DIR]
//
// Needs Linux, root (ip netns, tc), sshd and rsync. The link: a veth pair between namespace S
// (sender side) and R (receiver side), `tc tbf` at the given rate on both ends (netem is not in
// every kernel; tbf is). RATE/RTT: RTT > 0 adds a user-space delay relay inside S that listens
// on 127.0.0.1 and forwards across the veth with RTT/2 each way (TCP: __test__/helpers/
// delay-proxy.ts, in a child Node process; UDP: the native relay, for QUIC). RTT 0 connects
// straight across the veth.
//
// Scenarios
//   artifact  consecutive releases of npm packages with native binaries and big JS bundles
//             (__test__/helpers/npm-fixtures.ts: esbuild, typescript, prettier, biome, semver):
//             cold (empty target) and release A -> release B.
//   files     N files of 1-8 MiB (seeded): cold (empty target, incompressible: the link's rate and
//             the peers' read-ahead decide), then each with a 4 KiB overwrite and every 4th also a
//             1 KiB insertion, the receiver holding the old version.
//   big       one file (default 1 GiB) with scattered 64 KiB overwrites, one per 16 MiB.
// Delta targets: rsync's is a `cp -a` of the old version; ffsync-native's (--basis index, the
// default) the old version written by an untimed local `ffsync-native sync` with the receiver's
// state dir, so its index covers it — a target synced before; --basis copy: a `cp -a` for all.
// Tools: ffsync `send`/`receive` over TLS (one connection; pinned with --trust), the same with
// --parallel 8, with --quic, `ffsync-native sync` over ssh, rsync -a and rsync -az over ssh.
// Wire bytes are the veth's counters (both directions, every tool alike); the floor is the
// busier direction's bytes at the link rate. Writes bench/RESULTS-net.md.
// --timeline DIR: where each run's time goes on the link. The sending end's byte counters are read
// about every 5 ms from inside namespace S (a bash loop of builtin reads: a process per sample
// would load the machine it measures) into DIR/<rate>.<rtt>.<scenario>.<step>.<tool>.<run>.tsv (ms
// since the sending command started, bytes sent and received since then), and each run's line
// gets when the first 64 KiB, the first MiB, and all but the last 64 KiB of what the run sent had
// crossed S→R (not its last packet: a session's teardown sends a few, which would mark its end)
// (decisions §105).

import { spawn, spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { performance } from 'node:perf_hooks';
import { tcpDelayProxy } from '../__test__/helpers/delay-proxy';
import { releaseTrees } from '../__test__/helpers/npm-fixtures';
import { type Sshd, sshdUnavailable, startSshd } from '../__test__/helpers/sshd';
import { benchArgs, intOption, resetPeerStates, orUsage, pickList, CLI, KiB, MiB, Proc, REPO, RSYNC_BIN, type Relay, commandLine, describeExit, flushWorkFs, fmtBytes, fmtRatio, fmtRss, fmtS, killAll, machineInfo, markdown, maxOf, median, parseJsonLine, readRssFile, rssPrefix, sh, tail, textTable, udpRelay, runMain, UsageError } from './common.js';
import { XorShift128, diffHashes, hashTree, modifyScattered, writeSeededFile } from '../__test__/helpers/data';

const HELP = `Usage: npm run bench:net -- [--cli dist/cli/main.js] [--links 100mbit/30,1gbit/30,100mbit/0,1gbit/0]
         [--scenarios artifact,files,big] [--tools tls,parallel,quic,ssh,rsync,rsync-z] [--files 200]
         [--size-mib 1024] [--repeat 3] [--timeout-s 900] [--dir DIR] [--basis index|copy] [--keep]
         [--no-write] [--out bench/RESULTS-net.md] [--timeline DIR]
The link, the scenarios and the tools: the comment at the top of bench/net.ts.
`;
const values = benchArgs(
  process.argv.slice(2),
  {
    cli: { type: 'string' },
    links: { type: 'string' },
    scenarios: { type: 'string' },
    tools: { type: 'string' },
    files: { type: 'string' },
    'size-mib': { type: 'string' },
    repeat: { type: 'string' },
    'timeout-s': { type: 'string' },
    dir: { type: 'string' },
    keep: { type: 'boolean' },
    'no-write': { type: 'boolean' },
    out: { type: 'string' },
    timeline: { type: 'string' },
    basis: { type: 'string' },
    // Internal: the TCP delay relay, started by this script inside namespace S.
    'relay-tcp': { type: 'string' },
    'relay-delay': { type: 'string' },
    'relay-buffer': { type: 'string' },
  },
  HELP,
);

// ---------------------------------------------------------------------------------------------
// Options

const TOOLS = ['tls', 'parallel', 'quic', 'ssh', 'rsync', 'rsync-z'] as const;
type Tool = (typeof TOOLS)[number];
const TOOL_LABEL: Record<Tool, string> = {
  tls: 'ffsync send (TLS, 1 connection)',
  parallel: 'ffsync send --parallel 8',
  quic: 'ffsync send --quic',
  ssh: 'ffsync sync over ssh',
  rsync: 'rsync -a over ssh',
  'rsync-z': 'rsync -az over ssh',
};
const FFSYNC_TOOLS = new Set<Tool>(['tls', 'parallel', 'quic', 'ssh']);

interface Link {
  name: string;
  rate: string;
  rateBits: number;
  rttMs: number;
}

function parseLink(s: string): Link {
  const m = /^(\d+(?:\.\d+)?)(k|m|g)bit\/(\d+)$/i.exec(s.trim());
  if (!m) throw new UsageError(`--links: "${s}" is not RATE/RTT_MS (e.g. 100mbit/30)`);
  const rateBits = Number(m[1]) * { k: 1e3, m: 1e6, g: 1e9 }[m[2]!.toLowerCase() as 'k' | 'm' | 'g'];
  return { name: `${m[1]}${m[2]}bit/s${Number(m[3]) ? `, ${m[3]} ms RTT` : ', no added delay'}`, rate: `${m[1]}${m[2]!.toLowerCase()}bit`, rateBits, rttMs: Number(m[3]) };
}

const cli = path.resolve(values.cli ?? CLI);
const links = orUsage(HELP, () => (values.links ?? '100mbit/30,1gbit/30,100mbit/0,1gbit/0').split(',').map(parseLink));
const scenarios = new Set(orUsage(HELP, () => pickList('scenarios', values.scenarios, ['artifact', 'files', 'big'])));
const tools = orUsage(HELP, () => pickList('tools', values.tools, TOOLS));
const nFiles = orUsage(HELP, () => intOption('files', values.files, 200, 1, 1_000_000));
const sizeMiB = orUsage(HELP, () => intOption('size-mib', values['size-mib'], 1024, 1, 1 << 20));
const repeat = orUsage(HELP, () => intOption('repeat', values.repeat, 3, 1, 100));
const timeoutMs = orUsage(HELP, () => intOption('timeout-s', values['timeout-s'], 900, 1, 86400)) * 1000;
const basisMode = orUsage(HELP, () => pickList('basis', values.basis, ['index', 'copy'], ['index']))[0]!;
const outFile = path.resolve(values.out ?? path.join(REPO, 'bench', 'RESULTS-net.md'));
const timelineDir = values.timeline ? path.resolve(values.timeline) : undefined;
let work = '';

// ---------------------------------------------------------------------------------------------
// The link: namespaces, veth, tbf

const NS_S = `ffnet-s-${process.pid}`;
const NS_R = `ffnet-r-${process.pid}`;
const IF_S = `ffs${process.pid}`.slice(0, 15);
const IF_R = `ffr${process.pid}`.slice(0, 15);
const IP_S = '10.213.0.1';
const IP_R = '10.213.0.2';
const RECV_PORT = 7001;
const SSH_PORT = 2222;
let netUp = false;

const inNs = (ns: string, argv: string[]): string[] => ['ip', 'netns', 'exec', ns, ...argv];

function run(cmd: string, args: string[]): string {
  const r = spawnSync(cmd, args, { encoding: 'utf8', timeout: 30_000 });
  if (r.status !== 0) throw new Error(`${cmd} ${args.join(' ')}: ${r.stderr || r.error?.message || `exit ${r.status}`}`);
  return r.stdout;
}

function netSetup(): void {
  netUp = true;
  run('ip', ['netns', 'add', NS_S]);
  run('ip', ['netns', 'add', NS_R]);
  run('ip', ['link', 'add', IF_S, 'netns', NS_S, 'type', 'veth', 'peer', 'name', IF_R, 'netns', NS_R]);
  for (const [ns, dev, ip] of [[NS_S, IF_S, IP_S], [NS_R, IF_R, IP_R]] as const) {
    run('ip', ['-n', ns, 'addr', 'add', `${ip}/24`, 'dev', dev]);
    run('ip', ['-n', ns, 'link', 'set', dev, 'up']);
    run('ip', ['-n', ns, 'link', 'set', 'lo', 'up']);
  }
}

/** tbf on both ends: burst of 1 ms at the rate (at least 64 KiB, so GSO packets pass whole), a
 * queue of 50 ms. And TCP buffers in the sending namespace sized as a real path of this rate and
 * RTT would autotune them (twice the bandwidth x delay, 1 MiB to 4 MiB, the kernel's default
 * send maximum): the relay terminates TCP on loopback, where autotuning would otherwise grow
 * its receive buffer toward tcp_rmem's 32 MiB, and a sender would see no backpressure for the
 * first tens of MB of any transfer, which no real path does. Same for every tool. */
function shape(link: Link): void {
  const tcpMax = Math.min(4 << 20, Math.max(1 << 20, 2 * bandwidthDelay(link, link.rttMs)));
  run('ip', ['netns', 'exec', NS_S, 'sysctl', '-qw', `net.ipv4.tcp_wmem=4096 16384 ${tcpMax}`, `net.ipv4.tcp_rmem=4096 131072 ${tcpMax}`]);
  const burst = Math.max(64 * KiB, Math.round(link.rateBits / 8 / 1000));
  for (const [ns, dev] of [[NS_S, IF_S], [NS_R, IF_R]] as const) {
    run('tc', ['-n', ns, 'qdisc', 'replace', 'dev', dev, 'root', 'tbf', 'rate', link.rate, 'burst', String(burst), 'latency', '50ms']);
  }
}

/** Bytes through S's end of the veth: tx = toward the receiver, rx = back. */
function counters(): { tx: number; rx: number } {
  const j = JSON.parse(run('ip', ['-n', NS_S, '-s', '-j', 'link', 'show', 'dev', IF_S])) as { stats64: { tx: { bytes: number }; rx: { bytes: number } } }[];
  return { tx: j[0]!.stats64.tx.bytes, rx: j[0]!.stats64.rx.bytes };
}

let sshd: Sshd | undefined;
let cleaned = false;

/** Kills every process left in our two namespaces (all started by this run), deletes them (and so
 * the veth pair), and the work directory unless asked to keep it. Idempotent; synchronous so it
 * also runs from 'exit' and signal handlers. */
function cleanupSync(): void {
  if (cleaned) return;
  cleaned = true;
  killAll();
  if (netUp) {
    for (const ns of [NS_S, NS_R]) {
      const pids = spawnSync('ip', ['netns', 'pids', ns], { encoding: 'utf8' }).stdout ?? '';
      for (const pid of pids.split(/\s+/).filter((p) => /^\d+$/.test(p))) {
        try {
          process.kill(Number(pid), 'SIGKILL');
        } catch {
          /* gone */
        }
      }
      spawnSync('ip', ['netns', 'del', ns]);
    }
  }
  if (sshd) fs.rmSync(sshd.dir, { recursive: true, force: true });
  if (work && !values.keep && !values.dir) fs.rmSync(work, { recursive: true, force: true });
}


// ---------------------------------------------------------------------------------------------
// Endpoints for one link: direct across the veth, or through delay relays inside S.

interface Endpoints {
  tls: string;
  sshHost: string;
  rsh: string;
  /** The QUIC address, through a fresh relay per session (the relay's client is the first peer
   * that sends), and what closes that relay. */
  quic(): Promise<{ addr: string; close(): Promise<void> }>;
  close(): Promise<void>;
}

/** The relay's queue: twice the link's one-way bandwidth x delay (at least 256 KiB), what a
 * path's queues hold, not more (see tcpDelayProxy). */
function relayBuffer(link: Link): number {
  return Math.max(256 * KiB, 2 * bandwidthDelay(link, link.rttMs / 2));
}

/** Bytes the link carries in `ms`. */
function bandwidthDelay(link: Link, ms: number): number {
  return Math.round((link.rateBits / 8) * (ms / 1000));
}

async function endpoints(link: Link, ssh: Sshd): Promise<Endpoints> {
  const direct = `${IP_R}:${RECV_PORT}`;
  if (link.rttMs === 0) return { tls: direct, sshHost: IP_R, rsh: ssh.rsh, quic: async () => ({ addr: direct, close: async () => undefined }), close: async () => undefined };
  const oneWay = link.rttMs / 2;
  const tcp = new Proc('tcp relay', inNs(NS_S, [process.execPath, '--import', 'tsx', __filename, '--relay-tcp', `${direct},${IP_R}:${SSH_PORT}`, '--relay-delay', String(oneWay), '--relay-buffer', String(relayBuffer(link))]));
  const line = await tcp.waitForLine((l) => parseJsonLine(l)?.event === 'relay', 30_000);
  const [tlsPort, sshPort] = (parseJsonLine(line) as { ports: number[] }).ports;
  return {
    tls: `127.0.0.1:${tlsPort}`,
    sshHost: '127.0.0.1',
    rsh: ssh.rsh.replace(`-p ${SSH_PORT}`, `-p ${sshPort}`),
    quic: async () => {
      const udp: Relay = await udpRelay(RECV_PORT, oneWay, { targetHost: IP_R, wrap: inNs(NS_S, []) });
      return { addr: `127.0.0.1:${udp.port}`, close: () => udp.close() };
    },
    close: async () => {
      tcp.kill();
      await tcp.exited;
    },
  };
}

// ---------------------------------------------------------------------------------------------
// Fixtures

interface Step {
  scenario: string;
  step: string;
  /** A directory (tree) or a file. */
  src: string;
  tree: boolean;
  /** Copied (cp -a) into the target before every run; undefined: the target starts empty. */
  basis?: string;
  want: Map<string, string>;
  describe: string;
}

function cpA(from: string, to: string): void {
  run('cp', ['-a', from, to]);
}

function artifactSteps(): Step[] {
  const t = releaseTrees(path.join(work, 'fixtures'));
  const want = hashTree(t.b);
  const describe = `${t.describe}${t.fallback ? ` (registry unavailable: ${t.fallback})` : ''}`;
  return [
    { scenario: 'artifact release', step: 'cold (empty target)', src: t.b, tree: true, want, describe },
    { scenario: 'artifact release', step: 'release A → B', src: t.b, tree: true, basis: t.a, want, describe },
  ];
}

/** N files of 1–8 MiB; the new version has a 4 KiB overwrite in each and a 1 KiB insertion in every
 * 4th, and a newer mtime (so rsync's quick check sees every file as changed). Sent cold first (random
 * data, incompressible: the link's rate and the peers' read-ahead decide), then over the old version. */
function filesSteps(): Step[] {
  const oldDir = path.join(work, 'files-old');
  const newDir = path.join(work, 'files-new');
  const rng = new XorShift128(1800, 5);
  let bytes = 0;
  const t0 = new Date('2026-01-01T00:00:00Z');
  const t1 = new Date('2026-01-02T00:00:00Z');
  for (let i = 0; i < nFiles; i++) {
    const rel = path.join(`d${String(Math.floor(i / 50)).padStart(3, '0')}`, `f${String(i).padStart(4, '0')}.bin`);
    const size = MiB + rng.below(7 * MiB + 1);
    const old = Buffer.allocUnsafe(size);
    rng.fill(old);
    const edited = Buffer.from(old);
    const at = rng.below(size - 4 * KiB);
    rng.fill(edited.subarray(at, at + 4 * KiB));
    let next = edited;
    if (i % 4 === 0) {
      const ins = Buffer.allocUnsafe(KiB);
      rng.fill(ins);
      const p = rng.below(size);
      next = Buffer.concat([edited.subarray(0, p), ins, edited.subarray(p)]);
    }
    for (const [root, data, mtime] of [[oldDir, old, t0], [newDir, next, t1]] as const) {
      const f = path.join(root, rel);
      fs.mkdirSync(path.dirname(f), { recursive: true });
      fs.writeFileSync(f, data);
      fs.utimesSync(f, mtime, mtime);
    }
    bytes += next.length;
  }
  const scenario = `${nFiles} files of 1–8 MiB`;
  const want = hashTree(newDir);
  const describe = `${nFiles} files, ${fmtBytes(bytes)}`;
  return [
    { scenario, step: 'cold (empty target)', src: newDir, tree: true, want, describe },
    { scenario, step: 'small edits', src: newDir, tree: true, basis: oldDir, want, describe },
  ];
}

function bigStep(): Step {
  const base = path.join(work, 'big-base.bin');
  const mod = path.join(work, 'big-mod.bin');
  writeSeededFile(base, sizeMiB * MiB, 1801);
  cpA(base, mod);
  modifyScattered(mod, 1802);
  // Distinct mtimes whole seconds apart: rsync's quick check must see the file as changed.
  fs.utimesSync(base, new Date('2026-01-01T00:00:00Z'), new Date('2026-01-01T00:00:00Z'));
  fs.utimesSync(mod, new Date('2026-01-02T00:00:00Z'), new Date('2026-01-02T00:00:00Z'));
  return { scenario: `one ${sizeMiB >= 1024 ? `${sizeMiB / 1024} GiB` : `${sizeMiB} MiB`} file`, step: 'modified (64 KiB per 16 MiB)', src: mod, tree: false, basis: base, want: hashTree(mod), describe: `${fmtBytes(sizeMiB * MiB)}` };
}

// ---------------------------------------------------------------------------------------------
// One run of one tool

interface Sample {
  ms: number;
  tx: number;
  rx: number;
  rssS?: number;
  rssR?: number;
  /** Files left different from the source (changed, missing or extra). */
  stale: string[];
  /** --timeline: ms from the start until 64 KiB, 1 MiB, and all but the last 64 KiB of what
   * the run sent S→R, had crossed. */
  timeline?: { first64k?: number; first1m?: number; allBut64k?: number };
}

interface States {
  s: string;
  r: string;
  fpS: string;
  fpR: string;
}

const node = process.execPath;

async function fingerprint(state: string): Promise<string> {
  const r = spawnSync(node, [cli, 'id', '--state-dir', state], { encoding: 'utf8', timeout: 60_000 });
  if (r.status !== 0) throw new Error(`ffsync id: ${r.stderr}`);
  return r.stdout.trim();
}

/** Indexes go; identity, pins and remembered receivers stay (resetPeerStates). */
function resetState(st: States): void {
  resetPeerStates([st.s, st.r]);
}

/** Waits for every proc, killing them all (only them) if the run takes longer than timeoutMs. */
async function waitAll(label: string, procs: Proc[]): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  const timedOut = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      for (const p of procs) p.kill();
      reject(new Error(`${label}: timed out after ${timeoutMs / 1000} s (its processes killed)`));
    }, timeoutMs);
  });
  // One peer failing (e.g. the sender giving up) must not leave the others waiting for it.
  for (const p of procs) void p.exited.then((e) => e.code !== 0 && procs.forEach((q) => q !== p && q.kill()));
  try {
    await Promise.race([Promise.all(procs.map((p) => p.exited)), timedOut]);
  } finally {
    clearTimeout(timer);
  }
  // Every failed peer's own words, first failure first (the others may only have been killed).
  const failed = procs.filter((p) => p.exit!.code !== 0).sort((a, b) => a.exit!.at - b.exit!.at);
  if (failed.length) throw new Error(failed.map((p) => `${p.label}: ${describeExit(p.exit!)}: ${tail(p.stderr, 600)}`).join(' | '));
}

/** The target before a run: empty, a copy of the basis (`cp -a`), or — for ffsync-native with
 * `--basis index` — the basis as ffsync-native leaves it: written by an untimed local sync with the
 * receiver's state dir, so the receiver's index covers every file. Indexes of earlier runs go. */
function prepareTarget(tool: Tool, st: Step, dst: string, states: States): void {
  fs.rmSync(dst, { recursive: true, force: true });
  resetState(states);
  if (st.basis && basisMode === 'index' && FFSYNC_TOOLS.has(tool)) run(node, [cli, 'sync', '-a', '-q', '--state-dir', states.r, st.tree ? `${st.basis}/` : st.basis, dst]);
  else if (st.basis) cpA(st.basis, dst);
  flushWorkFs(work);
}

interface Session {
  procs: Proc[];
  t0: number;
  before: { tx: number; rx: number };
  closeRelay?: () => Promise<void>;
}

/** Starts one sync; `session.procs` holds every peer started so far, even if this throws. */
async function startSession(tool: Tool, st: Step, dst: string, ep: Endpoints, states: States, rss: { s: string; r: string }, session: Session): Promise<void> {
  if (tool === 'tls' || tool === 'parallel' || tool === 'quic') {
    const quic = tool === 'quic' ? ['--quic'] : [];
    const recv = new Proc('receive', inNs(NS_R, [node, cli, 'receive', dst, String(RECV_PORT), '--bind', IP_R, '--json', '--state-dir', states.r, '--trust', states.fpS, ...quic]), { rssFile: rss.r });
    session.procs.push(recv);
    await recv.waitForLine((l) => parseJsonLine(l)?.event === 'listening', 30_000);
    const q = tool === 'quic' ? await ep.quic() : undefined;
    session.closeRelay = q?.close;
    const lanes = tool === 'parallel' ? ['--parallel', '8'] : [];
    session.before = counters();
    session.t0 = performance.now();
    session.procs.unshift(new Proc('send', inNs(NS_S, [node, cli, 'send', st.src, q ? q.addr : ep.tls, '--json', '--state-dir', states.s, '--trust', states.fpR, ...quic, ...lanes]), { rssFile: rss.s }));
    return;
  }
  const srcArg = st.tree ? `${st.src}/` : st.src;
  const dstArg = `${ep.sshHost}:${dst}${st.tree ? '/' : ''}`;
  const del = st.tree ? ['--delete'] : [];
  const argv =
    tool === 'ssh'
      ? [node, cli, 'sync', '-a', ...del, '--json', '--state-dir', states.s, '-e', ep.rsh, '--remote-cmd', [...rssPrefix(rss.r), 'env', `FFSYNC_STATE_DIR=${states.r}`, node, cli].join(' '), srcArg, dstArg]
      : [RSYNC_BIN, tool === 'rsync-z' ? '-az' : '-a', ...del, '--stats', '-e', ep.rsh, '--rsync-path', [...rssPrefix(rss.r), 'rsync'].join(' '), srcArg, dstArg];
  session.before = counters();
  session.t0 = performance.now();
  session.procs.push(new Proc(tool, inNs(NS_S, argv), { rssFile: rss.s }));
}

/** --timeline: the sending end's byte counters about every 5 ms, sampled from inside namespace S by
 * a bash loop of builtin reads (its wait is a `read` with a timeout on a FIFO nobody writes), each
 * line `seconds.micros tx rx` into `raw` (its errors into `raw.err`). Resolves once a sample that
 * parses is in; otherwise the sampler is stopped and the error says why. */
async function startTimeline(raw: string): Promise<{ stop: () => Promise<void> }> {
  const fifo = path.join(work, 'timeline.fifo');
  const dev = `/sys/class/net/${IF_S}/statistics`;
  // Paths as arguments (never spliced into the script); LC_ALL=C keeps $EPOCHREALTIME's point a point.
  const script = 'rm -f "$1" && mkfifo "$1" && exec 9<>"$1" && while :; do read tx < "$2/tx_bytes"; read rx < "$2/rx_bytes"; echo "$EPOCHREALTIME $tx $rx"; read -t 0.005 -u 9; done';
  const out = fs.openSync(raw, 'w');
  const err = fs.openSync(`${raw}.err`, 'w');
  const child = spawn('ip', ['netns', 'exec', NS_S, 'env', 'LC_ALL=C', 'bash', '-c', script, 'timeline', fifo, dev], { stdio: ['ignore', out, err] });
  fs.closeSync(out);
  fs.closeSync(err);
  const exited = new Promise<void>((resolve) => {
    child.once('exit', () => resolve());
    child.once('error', () => resolve());
  });
  const stop = async () => {
    child.kill('SIGKILL');
    await exited;
    fs.rmSync(fifo, { force: true });
    fs.rmSync(`${raw}.err`, { force: true });
  };
  let sampled = false;
  for (let i = 0; i < 100 && !(sampled = timelineRows(raw).length > 0); i++) await new Promise((r) => setTimeout(r, 10));
  if (!sampled) {
    const why = fs.readFileSync(`${raw}.err`, 'utf8').trim();
    await stop();
    fs.rmSync(raw, { force: true });
    throw new Error(`--timeline: the counter sampler gave no sample in 1 s (bash 5 with $EPOCHREALTIME is needed)${why ? `: ${why}` : ''}`);
  }
  return { stop };
}

/** The sampler's lines that parse: [seconds, tx, rx]. */
function timelineRows(raw: string): number[][] {
  return fs
    .readFileSync(raw, 'utf8')
    .split('\n')
    .map((l) => l.trim().split(/\s+/).map(Number))
    .filter((r) => r.length === 3 && r.every(Number.isFinite));
}

/** A run's samples as `ms tx rx` since the sending command started (`t0`, performance clock), up
 * to its end (`endMs`), written to `tsv`; and when 64 KiB, 1 MiB, and all but the last 64 KiB of
 * what it sent S→R had crossed. */
function writeTimeline(raw: string, tsv: string, t0: number, endMs: number): NonNullable<Sample['timeline']> {
  const startEpochMs = performance.timeOrigin + t0;
  const samples = timelineRows(raw);
  fs.rmSync(raw, { force: true });
  const base = samples.filter((r) => r[0]! * 1000 <= startEpochMs).at(-1) ?? samples[0];
  const t: NonNullable<Sample['timeline']> = {};
  if (!base) {
    process.stderr.write(`  --timeline: no samples for ${path.basename(tsv)}\n`);
    return t;
  }
  const points = samples
    .map((r) => ({ ms: r[0]! * 1000 - startEpochMs, tx: r[1]! - base[1]!, rx: r[2]! - base[2]! }))
    .filter((p) => p.ms >= 0 && p.ms <= endMs + 5);
  fs.writeFileSync(tsv, ['ms\ttx\trx', ...points.map((p) => `${p.ms.toFixed(1)}\t${p.tx}\t${p.rx}`)].join('\n') + '\n');
  const total = points.at(-1)?.tx ?? 0;
  t.first64k = points.find((p) => p.tx >= 64 * KiB)?.ms;
  t.first1m = points.find((p) => p.tx >= MiB)?.ms;
  t.allBut64k = total > 64 * KiB ? points.find((p) => p.tx >= total - 64 * KiB)?.ms : undefined;
  return t;
}

const fmtMs = (ms: number | undefined): string => (ms === undefined ? '—' : `${Math.round(ms)} ms`);

async function runOnce(tool: Tool, st: Step, ep: Endpoints, states: States, timelineFile?: string): Promise<Sample> {
  const dst = path.join(work, st.tree ? 'target' : 'target.bin');
  prepareTarget(tool, st, dst, states);
  const rss = { s: path.join(work, 'rss-sender'), r: path.join(work, 'rss-receiver') };
  for (const f of [rss.s, rss.r]) fs.rmSync(f, { force: true });
  const session: Session = { procs: [], t0: 0, before: { tx: 0, rx: 0 } };
  const raw = timelineFile && `${timelineFile}.raw`;
  const sampler = raw ? await startTimeline(raw) : undefined;
  let ran = false;
  try {
    await startSession(tool, st, dst, ep, states, rss, session);
    await waitAll(`${TOOL_LABEL[tool]}, ${st.scenario}: ${st.step}`, session.procs);
    ran = true;
  } catch (e) {
    // Nothing of a failed run may linger (a receiver would hold the port for the next one).
    for (const p of session.procs) p.kill();
    throw e;
  } finally {
    try {
      await session.closeRelay?.();
    } finally {
      await sampler?.stop();
      // A failed run's samples are not kept (its row says FAILED).
      if (raw && !ran) fs.rmSync(raw, { force: true });
    }
  }
  const ms = Math.max(...session.procs.map((p) => p.exit!.at)) - session.t0;
  const timeline = raw ? writeTimeline(raw, timelineFile!, session.t0, ms) : undefined;
  const after = counters();
  const d = diffHashes(st.want, hashTree(dst));
  const [sender, receiver] = session.procs;
  return {
    ms,
    tx: after.tx - session.before.tx,
    rx: after.rx - session.before.rx,
    rssS: await sender!.peakRssKb(),
    rssR: receiver ? await receiver.peakRssKb() : readRssFile(rss.r),
    stale: [...d.changed, ...d.missing.map((f) => `${f} (missing)`), ...d.extra.map((f) => `${f} (extra)`)],
    timeline,
  };
}

// ---------------------------------------------------------------------------------------------
// Results

interface Row {
  link: Link;
  step: Step;
  tool: Tool;
  samples: Sample[];
  error?: string;
}

const rows: Row[] = [];

function medianOf(r: Row | undefined, f: (s: Sample) => number): number | undefined {
  return r && !r.error ? median(r.samples.map(f)) : undefined;
}

/** Must this run reproduce the source exactly? ffsync-native must, unless `--basis copy` left it a
 * target without an index (then size + mtime decide, as for rsync, and stale files are reported). */
function strict(tool: Tool, st: Step): boolean {
  return FFSYNC_TOOLS.has(tool) && (basisMode === 'index' || !st.basis);
}

function resultCell(r: Row): string {
  if (r.error) return `FAILED: ${r.error.split('\n')[0]!.slice(0, 160)}`;
  const worst = Math.max(...r.samples.map((s) => s.stale.length));
  if (worst === 0) return 'verified';
  return strict(r.tool, r.step) ? `MISMATCH: ${worst} files differ` : `${worst} stale`;
}

function table(): { head: string[]; rows: string[][] } {
  const find = (r: Row, tool: Tool) => rows.find((x) => x.link === r.link && x.step === r.step && x.tool === tool);
  return {
    head: ['link', 'scenario', 'tool', 'median s', 'runs (s)', 'vs rsync -a', 'vs rsync -az', 'wire S→R', 'wire R→S', 'floor s', 'RSS sender MiB', 'RSS receiver MiB', 'result'],
    rows: rows.map((r) => {
      const ms = medianOf(r, (s) => s.ms);
      const tx = medianOf(r, (s) => s.tx);
      const rx = medianOf(r, (s) => s.rx);
      const floor = tx === undefined || rx === undefined ? undefined : (Math.max(tx, rx) * 8 * 1000) / r.link.rateBits;
      return [
        r.link.name,
        `${r.step.scenario}: ${r.step.step}`,
        TOOL_LABEL[r.tool],
        fmtS(ms),
        r.samples.map((s) => fmtS(s.ms)).join(', '),
        fmtRatio(medianOf(find(r, 'rsync'), (s) => s.ms), ms),
        fmtRatio(medianOf(find(r, 'rsync-z'), (s) => s.ms), ms),
        fmtBytes(tx),
        fmtBytes(rx),
        fmtS(floor),
        fmtRss(maxOf(r.samples.map((s) => s.rssS))),
        fmtRss(maxOf(r.samples.map((s) => s.rssR))),
        resultCell(r),
      ];
    }),
  };
}

/** Which files were left different from the source, grouped: the same set usually recurs on
 * every link and for both rsync variants. */
function staleList(): string[] {
  const groups = new Map<string, string[]>();
  for (const r of rows) {
    const s = r.samples.find((x) => x.stale.length);
    if (!s) continue;
    const key = `${r.step.scenario}: ${r.step.step} — ${s.stale.length} files: ${s.stale.slice(0, 12).join(', ')}${s.stale.length > 12 ? ', …' : ''}`;
    groups.set(key, [...(groups.get(key) ?? []), `${TOOL_LABEL[r.tool]} (${r.link.name})`]);
  }
  return [...groups].map(([k, who]) => `- ${k}; left by: ${who.join('; ')}`);
}

/** --timeline: per row, the medians of when 64 KiB, 1 MiB, and all but the last 64 KiB had crossed
 * the link (S→R, ms from the sending command's start): the start of a session against its data
 * phase. */
function timelineTable(): { head: string[]; rows: string[][] } | undefined {
  const timed = rows.filter((r) => !r.error && r.samples.some((s) => s.timeline));
  if (!timed.length) return undefined;
  const med = (r: Row, f: (t: NonNullable<Sample['timeline']>) => number | undefined) => {
    const v = r.samples.map((s) => (s.timeline ? f(s.timeline) : undefined)).filter((x): x is number => x !== undefined);
    return v.length ? fmtMs(median(v)) : '—';
  };
  return {
    head: ['link', 'scenario', 'tool', '64 KiB crossed', '1 MiB crossed', 'all but the last 64 KiB crossed', 'session ends'],
    rows: timed.map((r) => [r.link.name, `${r.step.scenario}: ${r.step.step}`, TOOL_LABEL[r.tool], med(r, (t) => t.first64k), med(r, (t) => t.first1m), med(r, (t) => t.allBut64k), fmtMs(median(r.samples.map((s) => s.ms)))]),
  };
}

function report(machine: ReturnType<typeof machineInfo>, describe: string[]): string {
  const timeline = timelineTable();
  return [
    '# Network model: ffsync-native vs rsync over a shaped link (`npm run bench:net`)',
    '',
    `Command: \`${commandLine()}\` — ${machine.date}, ${machine.nproc} cores (${machine.cpu}), ${machine.memory}, ${machine.kernel}, ${machine.fs}, ${machine.rsync}, node ${machine.node}, ffsync-native ${machine.ffsync} (${path.relative(REPO, cli) || cli}, commit ${machine.commit}). Medians of ${repeat}; every run verified (SHA-256 of every file against the source).`,
    '',
    `- Link: two network namespaces joined by a veth pair, \`tc tbf\` at the rate on both ends (burst 1 ms of the rate, at least 64 KiB; 50 ms queue). RTT: a user-space delay relay inside the sending namespace (RTT/2 each way; TCP relay __test__/helpers/delay-proxy.ts, UDP relay crates/ffsync_core/examples/udp_delay_relay.rs for QUIC; the relay queues at most twice the link's bandwidth x delay and the sending namespace's TCP buffers are capped at twice that, 1–4 MiB, as a real path autotunes them). "no added delay": straight across the veth.`,
    '- Caveat: the TCP relay terminates TCP, so TCP\'s congestion control (TLS, ssh, rsync) runs over legs without the added delay (optimistic for TCP on cold, bandwidth-bound rows); QUIC datagrams carry the delay end to end. Round-trip-bound rows compare fairly.',
    '- Wire: bytes through the veth in each direction (kernel counters of the sending end: Ethernet frames, IP/TCP/UDP headers, ACKs, ssh/TLS/QUIC framing; GSO super-packets count one header) — one method for every tool. Floor: the busier direction\'s wire bytes at the link rate.',
    '- Time: from the sending command\'s start to the exit of every peer (send/receive: the receiver is already listening; ssh: includes ssh login and the remote start). Peak RSS: /usr/bin/time %M of each peer (sender: the local command incl. its ssh client; receiver: `receive`, or the peer started by sshd).',
    `- Delta rows: ${basisMode === 'index' ? "rsync's target is a copy of the old version (`cp -a`); ffsync-native's is the old version as ffsync-native leaves it (written by an untimed local `ffsync-native sync` with the receiver's state dir, so its index covers every file: the case of a target synced before). Sender indexes are always empty (a fresh build). `--basis copy` gives ffsync-native the plain copy too (no index: size + mtime decide, like rsync's quick check)" : "every tool's target is a copy of the old version (`cp -a`), no index on either side: ffsync-native's size + mtime quick check decides like rsync's (so it can leave the same stale files)"}.`,
    `- Stale: files left different from the source. npm tarballs stamp every file with the same mtime, so \`rsync -a\` skips changed files of the same size; ffsync-native compares content where an index covers the file${basisMode === 'copy' ? ' (none does with --basis copy: it may leave the same files stale)' : ''}. MISMATCH (a failure, exit status 1): ffsync-native left a file different although it must not.`,
    ...describe.map((d) => `- Fixture: ${d}`),
    '',
    markdown(table()),
    '',
    ...(staleList().length ? ['Files left different from the source (the first run of each row that left any):', '', ...staleList(), ''] : []),
    ...(timeline ? ['Where the time goes on the link (`--timeline`; medians, ms from the sending command\'s start; each run\'s samples are in the timeline directory):', '', markdown(timeline), ''] : []),
  ].join('\n');
}

// ---------------------------------------------------------------------------------------------

function prerequisites(): string {
  if (process.platform !== 'linux') return 'needs Linux (network namespaces)';
  if (process.getuid?.() !== 0) return 'needs root (ip netns, tc)';
  for (const [cmd, args] of [['ip', ['-V']], ['tc', ['-V']], [RSYNC_BIN, ['--version']]] as const) {
    if (spawnSync(cmd, [...args]).status !== 0) return `${cmd} is not available`;
  }
  if (!fs.existsSync(cli)) return `${cli} does not exist (npm run build:ts)`;
  return sshdUnavailable();
}

async function main(): Promise<number> {
  const why = prerequisites();
  if (why) {
    process.stderr.write(`bench/net.ts: ${why}\n`);
    return 2;
  }
  work = path.resolve(values.dir ?? fs.mkdtempSync(path.join(os.tmpdir(), 'ffsync-bench-net-')));
  fs.mkdirSync(work, { recursive: true });
  const machine = machineInfo(work);
  machine.ffsync = sh(node, [cli, '--version']) || 'unknown';
  const cliRepo = path.resolve(path.dirname(cli), '..', '..');
  if (cliRepo !== REPO) machine.commit = `${sh('git', ['-C', cliRepo, 'rev-parse', '--short', 'HEAD']) || '?'} of ${cliRepo}`;

  process.stderr.write(`work dir ${work}; building fixtures…\n`);
  const steps: Step[] = [];
  if (scenarios.has('artifact')) steps.push(...artifactSteps());
  if (scenarios.has('files')) steps.push(...filesSteps());
  if (scenarios.has('big')) steps.push(bigStep());
  const describe = [...new Set(steps.map((s) => `${s.scenario}: ${s.describe}`))];

  netSetup();
  sshd = await startSshd({ listen: IP_R, port: SSH_PORT, netns: NS_R, clientNetns: NS_S });
  const states: States = { s: path.join(work, 'state-s'), r: path.join(work, 'state-r'), fpS: '', fpR: '' };
  states.fpS = await fingerprint(states.s);
  states.fpR = await fingerprint(states.r);
  if (timelineDir) fs.mkdirSync(timelineDir, { recursive: true });

  let failed = false;
  for (const link of links) {
    shape(link);
    const ep = await endpoints(link, sshd);
    try {
      for (const st of steps) {
        const mine = tools.map((tool) => {
          const r: Row = { link, step: st, tool, samples: [] };
          rows.push(r);
          return r;
        });
        // Repetitions interleave the tools, so drift on a shared machine spreads over all of them.
        for (let rep = 0; rep < repeat; rep++) {
          for (const r of mine) {
            if (r.error) continue;
            try {
              const name = timelineDir && path.join(timelineDir, [link.rate, link.rttMs, st.scenario, st.step, r.tool, rep + 1].map((x) => String(x).replace(/[^A-Za-z0-9-]+/g, '_')).join('.') + '.tsv');
              const s = await runOnce(r.tool, st, ep, states, name);
              r.samples.push(s);
              if (s.stale.length && strict(r.tool, st)) failed = true;
              const tl = s.timeline && ` | link: 64 KiB at ${fmtMs(s.timeline.first64k)}, 1 MiB at ${fmtMs(s.timeline.first1m)}, all but 64 KiB at ${fmtMs(s.timeline.allBut64k)} (${path.basename(name!)})`;
              process.stderr.write(`  ${link.name} | ${st.scenario}: ${st.step} | ${TOOL_LABEL[r.tool]}: ${fmtS(s.ms)} s, wire ${fmtBytes(s.tx)} / ${fmtBytes(s.rx)}${s.stale.length ? `, ${s.stale.length} files differ` : ''}${tl ?? ''}\n`);
            } catch (e) {
              r.error = (e as Error).message;
              failed = true;
              process.stderr.write(`!!!!! ${link.name} | ${st.scenario}: ${st.step} | ${TOOL_LABEL[r.tool]}: ${r.error}\n`);
            }
          }
        }
      }
    } finally {
      await ep.close();
    }
  }
  await sshd.stop();
  sshd = undefined;

  const section = report(machine, describe);
  process.stdout.write(`\n${textTable(table())}\n`);
  const tl = timelineTable();
  if (tl) process.stdout.write(`\nWhere the time goes on the link (--timeline, medians, ms from the start):\n${textTable(tl)}\n`);
  if (!values['no-write']) {
    fs.writeFileSync(outFile, `${section}\n`);
    process.stderr.write(`wrote ${path.relative(process.cwd(), outFile)}\n`);
  }
  return failed ? 1 : 0;
}

// ---------------------------------------------------------------------------------------------
// Entry: the benchmark, or (started by it inside namespace S) the TCP delay relay:
// `net.ts --relay-tcp host:port[,host:port] --relay-delay MS` prints its listening ports.

if (values['relay-tcp']) {
  void (async () => {
    const ports: number[] = [];
    for (const t of values['relay-tcp']!.split(',')) {
      const i = t.lastIndexOf(':');
      ports.push((await tcpDelayProxy(Number(t.slice(i + 1)), Number(values['relay-delay'] ?? 0), { targetHost: t.slice(0, i), maxQueuedBytes: values['relay-buffer'] ? Number(values['relay-buffer']) : undefined })).port);
    }
    process.stdout.write(`${JSON.stringify({ event: 'relay', ports })}\n`);
  })();
} else {
  process.on('exit', cleanupSync);
  for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) {
    process.on(sig, () => {
      process.stderr.write(`\nbench/net.ts: ${sig}: cleaning up namespaces and processes\n`);
      cleanupSync();
      process.exit(130);
    });
  }
  runMain('bench/net.ts', main, cleanupSync);
}
