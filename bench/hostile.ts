// Hostile peers, measured (issue 17 §2-§4): `node --import tsx bench/hostile.ts`.
//
// 1. Peak RSS (VmHWM, /proc) of a one-shot receiver under an empty-DATA flood, a KEEPALIVE-only
//    sender, a compressed tree-manifest bomb (zstd frame of 2 GiB of zeros) and a dribbled frame;
//    of a sender under a flood of small frames queued while it streams DATA. Target ≤ 150 MiB.
// 2. `serve` under 64 concurrent hostile (authorized) sessions: peak RSS ≤ 1 GiB, and RSS back
//    near idle within 10 s after they close.
// 3. An authorized client served within 2 s while 500 unauthenticated TLS connections are open
//    (opened once; and re-opened as fast as they are dropped).
// 4. CPU per queued small frame is O(1): CPU for 100k vs 400k frames through FramedConnection
//    (this build and, if present, the build in $FFSYNC_BENCH_OLD_DIST), ratio ≈ 4.
// Prints a markdown table. FFSYNC_BENCH_CLI=<dist/cli/main.js> measures another build's CLI.

import { execFileSync, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import tls from 'node:tls';
import { encodeFrame, FrameType } from '../ts/protocol/frames';
import {
  Decision,
  encodeDecision,
  encodeFilter,
  encodeHello,
  encodeNeedEnd,
  encodeOffer,
  encodeRequest,
  manifestFrames,
  needFrames,
  OfferKind,
  OUR_CAPABILITIES,
  RequestOp,
  Role,
} from '../ts/protocol/messages';
import { scanFile } from '../ts/native/binding';
import { manifestChunkCount } from '../ts/utils/manifest';
import { ChildRun, procCpuMs, procStatusKiB } from '../__test__/helpers/process';
import { framesUntilClose, repeated } from '../__test__/helpers/raw-peer';
import { CLI } from './common.js';

const work = fs.mkdtempSync(path.join(os.tmpdir(), 'ffsync-hostile-'));
process.once('exit', () => fs.rmSync(work, { recursive: true, force: true }));
const MiB = 1024 * 1024;
const rows: string[][] = [];
const row = (...cells: (string | number)[]) => {
  rows.push(cells.map(String));
  console.error(`  ${cells.join(' | ')}`);
};
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** A field of /proc/PID/status in bytes. */
const status = (pid: number, field: string) => procStatusKiB(pid, field) * 1024;

interface Proc {
  pid: number;
  port: Promise<number>;
  events: Record<string, unknown>[];
  done: Promise<{ code: number | null; stderr: string; ms: number; peak: number; cpuMs: number }>;
  kill(): void;
}

/** Runs the CLI, sampling its peak RSS and CPU time until it exits. */
function spawnCli(args: string[]): Proc {
  const p = new ChildRun('ffsync-native', [process.execPath, CLI, ...args], { sampleMs: 20 });
  const port = p.listeningPort();
  port.catch(() => undefined);
  const done = p.exited.then((e) => ({ code: e.code, stderr: p.stderr, ms: e.ms, peak: p.peakKiB * 1024, cpuMs: p.cpuMs }));
  return { pid: p.pid!, port, events: p.events, done, kill: () => p.kill() };
}

async function within<T>(p: Promise<T>, ms: number, onTimeout: () => void): Promise<T | 'timeout'> {
  let t: NodeJS.Timeout;
  const r = await Promise.race([p, new Promise<'timeout'>((res) => (t = setTimeout(() => res('timeout'), ms)))]);
  clearTimeout(t!);
  if (r === 'timeout') onTimeout();
  return r;
}

const hello = (role: number, caps = 0) => encodeFrame(FrameType.HELLO, encodeHello({ minVersion: 1, maxVersion: 1, capabilities: caps, role, software: 'hostile' }));
const keepAlive = encodeFrame(FrameType.KEEPALIVE);

async function source(len: number, name = 'src.bin') {
  const f = path.join(work, name);
  const b = Buffer.allocUnsafe(len);
  for (let i = 0; i < len; i += 4) b.writeUInt32LE((Math.imul(i, 2654435761) ^ (i >>> 7)) >>> 0, i);
  fs.writeFileSync(f, b);
  return { file: f, scan: await scanFile(f, {}) };
}

let seq = 0;
/** A plaintext one-shot receiver and a raw connection to it. */
async function receiver(timeoutS: number, target = path.join(work, `t${seq++}`)) {
  const p = spawnCli(['receive', target, '0', '--plaintext', '--json', '--timeout', String(timeoutS), '--state-dir', path.join(work, `s${seq++}`)]);
  const sock = net.connect({ host: '127.0.0.1', port: await p.port });
  await new Promise((r) => sock.once('connect', r));
  return { p, sock, next: framesUntilClose(sock) };
}

async function receiverAfterDecision(timeoutS: number) {
  const src = await source(1 << 20);
  const r = await receiver(timeoutS);
  r.sock.write(hello(Role.SENDER));
  r.sock.write(encodeFrame(FrameType.OFFER, encodeOffer({ kind: OfferKind.FILE, size: BigInt(1 << 20), mtimeNs: 1n, mode: 0o644, flags: 0 })));
  await r.next(); // HELLO
  await r.next(); // DECISION
  return { ...r, src };
}

const fmt = (b: number) => `${(b / MiB).toFixed(0)} MiB`;
const verdict = (ok: boolean) => (ok ? 'ok' : '**over**');

async function oneShot(): Promise<void> {
  console.error('one-shot receiver / sender under attack');
  {
    const r = await receiverAfterDecision(20);
    for (const p of manifestFrames(r.src.scan.manifest)) r.sock.write(encodeFrame(FrameType.MANIFEST, p));
    let f;
    while ((f = await r.next()) && f.type !== FrameType.NEED_END);
    r.sock.write(repeated(encodeFrame(FrameType.DATA), 8_000_000));
    const res = await within(r.p.done, 60_000, r.p.kill);
    r.sock.destroy();
    const x = res === 'timeout' ? await r.p.done : res;
    row('receiver: 8,000,000 empty DATA frames (40 MB)', fmt(x.peak), `exit ${x.code} after ${(x.ms / 1000).toFixed(1)} s${res === 'timeout' ? ' (killed at 60 s)' : ''}`, verdict(x.peak <= 150 * MiB));
  }
  {
    const r = await receiverAfterDecision(2);
    const t0 = Date.now();
    const tick = setInterval(() => r.sock.write(keepAlive), 200);
    const res = await within(r.p.done, 30_000, r.p.kill);
    clearInterval(tick);
    r.sock.destroy();
    const x = res === 'timeout' ? await r.p.done : res;
    row('receiver: KEEPALIVE-only sender (--timeout 2, stall limit 8 s)', fmt(x.peak), `exit ${x.code} after ${((Date.now() - t0) / 1000).toFixed(1)} s of keep-alives${res === 'timeout' ? ' (killed at 30 s)' : ''}`, verdict(x.peak <= 150 * MiB));
  }
  {
    // TREE_MANIFEST = raw length u64 | zstd; the zstd frame declares 2 GiB of zeros.
    const bombFile = path.join(work, 'bomb.zst');
    // A plausible header ("FFT1", version 1, 50 M entries), then zeros up to 2 GiB.
    const header = path.join(work, 'bomb.head');
    fs.writeFileSync(header, Buffer.from([0x46, 0x46, 0x54, 0x31, 1, 0, 0, 0, 0x80, 0xf0, 0xfa, 0x02]));
    execFileSync('sh', ['-c', `(cat ${header}; head -c ${2 ** 31 - 12} /dev/zero) | zstd -1 -q -c > ${bombFile}`]);
    const z = fs.readFileSync(bombFile);
    const whole = Buffer.concat([Buffer.alloc(8), z]);
    whole.writeBigUInt64LE(2n ** 31n, 0);
    const dir = path.join(work, `tree${seq++}`);
    fs.mkdirSync(dir);
    const r = await receiver(20, dir);
    r.sock.write(hello(Role.SENDER));
    r.sock.write(encodeFrame(FrameType.OFFER, encodeOffer({ kind: OfferKind.TREE, size: 0n, mtimeNs: 1n, mode: 0o755, flags: 0 })));
    r.sock.write(encodeFrame(FrameType.FILTER, encodeFilter([])));
    for (const p of manifestFrames(whole)) r.sock.write(encodeFrame(FrameType.TREE_MANIFEST, p));
    void (async () => {
      while (await r.next());
    })();
    const res = await within(r.p.done, 60_000, r.p.kill);
    r.sock.destroy();
    const x = res === 'timeout' ? await r.p.done : res;
    const why = /error: (.*)/.exec(x.stderr)?.[1]?.slice(0, 90) ?? '';
    row(`receiver: tree-manifest bomb (${(z.length / 1024).toFixed(0)} KiB of zstd declaring 2 GiB)`, fmt(x.peak), `exit ${x.code} after ${(x.ms / 1000).toFixed(1)} s: ${why}`, verdict(x.peak <= 150 * MiB));
  }
  {
    // A 1 MiB MANIFEST part dribbled in 1-byte writes (TCP_NODELAY: many tiny reads).
    const r = await receiverAfterDecision(20);
    r.sock.setNoDelay(true);
    const frame = encodeFrame(FrameType.MANIFEST, Buffer.alloc(1 << 20, 1));
    const t0 = Date.now();
    for (let i = 0; i < 200_000; i++) {
      if (!r.sock.write(frame.subarray(i, i + 1))) await new Promise((res) => r.sock.once('drain', res));
      if (i % 64 === 0) await new Promise((res) => setImmediate(res));
    }
    const peakMid = status(r.p.pid, 'VmHWM');
    r.sock.destroy();
    const x = await r.p.done;
    row('receiver: a frame dribbled in 200,000 one-byte writes', fmt(Math.max(peakMid, x.peak)), `exit ${x.code}; ${((Date.now() - t0) / 1000).toFixed(1)} s, receiver CPU ${(x.cpuMs / 1000).toFixed(1)} s`, verdict(x.peak <= 150 * MiB));
  }
  {
    // Sender streaming a 64 MiB file; the receiver floods 4M legal-looking NEED frames it will
    // only read after its DATA.
    const src = await source(64 << 20, 'big.bin');
    const server = net.createServer();
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    const accepted = new Promise<net.Socket>((r) => server.once('connection', r));
    const p = spawnCli(['send', src.file, `127.0.0.1:${(server.address() as net.AddressInfo).port}`, '--plaintext', '--json', '--timeout', '5', '--state-dir', path.join(work, `s${seq++}`)]);
    const sock = await accepted;
    server.close();
    const next = framesUntilClose(sock);
    sock.write(hello(Role.RECEIVER));
    await next();
    await next();
    sock.write(encodeFrame(FrameType.DECISION, encodeDecision(Decision.SEND_MANIFEST)));
    let got = 0;
    while (got < src.scan.manifest.length) got += (await next())!.payload.length - 4;
    const chunks = manifestChunkCount(src.scan.manifest);
    for (const part of needFrames(Uint32Array.from({ length: chunks }, (_, i) => i), chunks)) sock.write(encodeFrame(FrameType.NEED, part));
    sock.write(encodeFrame(FrameType.NEED_END, encodeNeedEnd({ wireChunks: chunks, identical: false })));
    sock.write(repeated(encodeFrame(FrameType.NEED, Buffer.from([0, 0, 0, 0, 1])), 4_000_000));
    void (async () => {
      while (await next());
    })();
    const res = await within(p.done, 60_000, p.kill);
    sock.destroy();
    const x = res === 'timeout' ? await p.done : res;
    row('sender: 4,000,000 small frames (40 MB) queued while it streams 64 MiB', fmt(x.peak), `exit ${x.code} after ${(x.ms / 1000).toFixed(1)} s`, verdict(x.peak <= 150 * MiB));
  }
}

function id(state: string): string {
  const r = spawnSync(process.execPath, [CLI, 'id', '--state-dir', state], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(r.stderr);
  return r.stdout.trim();
}
const identity = (state: string) => ({ key: fs.readFileSync(path.join(state, 'identity', 'key.pem')), cert: fs.readFileSync(path.join(state, 'identity', 'cert.pem')) });

async function rawTls(port: number, who: { key: Buffer; cert: Buffer }, localAddress?: string): Promise<tls.TLSSocket> {
  const sock = tls.connect({ host: '127.0.0.1', port, ...(localAddress ? { localAddress } : {}), ...who, rejectUnauthorized: false, minVersion: 'TLSv1.3', checkServerIdentity: () => undefined });
  sock.on('error', () => undefined);
  await new Promise<void>((resolve, reject) => {
    sock.once('secureConnect', () => resolve());
    sock.once('close', () => reject(new Error('closed during TLS')));
  });
  return sock;
}

async function serve(): Promise<void> {
  console.error('serve');
  const root = path.join(work, 'root');
  fs.mkdirSync(path.join(root, 'pub'), { recursive: true });
  await source(32 << 20, 'root/pub/big.bin');
  const small = (await source(1 << 20, 'small.bin')).file;
  const state = path.join(work, 'daemon');
  const fp = id(state);
  const client = path.join(work, 'client');
  const stranger = path.join(work, 'stranger');
  id(stranger);
  fs.writeFileSync(path.join(state, 'serve-clients.conf'), `${id(client)} push,pull /\n`);
  const d = spawnCli(['serve', root, '0', '--bind', '127.0.0.1', '--state-dir', state, '--json', '--quiet', '--timeout', '2']);
  const port = await d.port;
  const who = identity(client);
  await sleep(1000);
  const idle = status(d.pid, 'VmRSS');

  // 64 concurrent hostile sessions: 16 push + empty-DATA flood, 16 push + KEEPALIVE only,
  // 32 pull + 500,000 small frames queued while the daemon streams 32 MiB.
  const t0 = Date.now();
  let peak = 0;
  const sampler = setInterval(() => (peak = Math.max(peak, status(d.pid, 'VmRSS'))), 20);
  let started = 0;
  const sessions = Array.from({ length: 64 }, async (_, i) => {
    // From 16 addresses (4 each): one address may open at most 2 × 16 connections in a burst.
    const sock = await rawTls(port, who, `127.0.2.${1 + (i % 16)}`);
    const next = framesUntilClose(sock);
    const kind = i % 4 === 0 ? 'flood' : i % 4 === 1 ? 'keepalive' : 'pull';
    if (kind === 'pull') {
      sock.write(hello(Role.RECEIVER, 0));
      await next();
      sock.write(encodeFrame(FrameType.REQUEST, encodeRequest({ op: RequestOp.PULL, path: 'pub/big.bin' })));
      if ((await next())?.type !== FrameType.ACCEPT) return sock.destroy();
      started++;
      const offer = await next();
      if (offer?.type !== FrameType.OFFER) return sock.destroy();
      sock.write(encodeFrame(FrameType.DECISION, encodeDecision(Decision.SEND_MANIFEST)));
      const parts: Buffer[] = [];
      let total = -1;
      let got = 0;
      while (total < 0 || got < total) {
        const f = await next();
        if (!f || f.type !== FrameType.MANIFEST) return sock.destroy();
        total = f.payload.readUInt32LE(0);
        parts.push(f.payload.subarray(4));
        got += f.payload.length - 4;
      }
      const manifest = Buffer.concat(parts);
      const chunks = manifestChunkCount(manifest);
      for (const part of needFrames(Uint32Array.from({ length: chunks }, (_, k) => k), chunks)) sock.write(encodeFrame(FrameType.NEED, part));
      sock.write(encodeFrame(FrameType.NEED_END, encodeNeedEnd({ wireChunks: chunks, identical: false })));
      sock.write(repeated(encodeFrame(FrameType.NEED, Buffer.from([0, 0, 0, 0, 1])), 500_000));
      while (await next());
    } else {
      sock.write(hello(Role.SENDER, 0));
      await next();
      sock.write(encodeFrame(FrameType.REQUEST, encodeRequest({ op: RequestOp.PUSH, path: `in/${i}.bin` })));
      if ((await next())?.type !== FrameType.ACCEPT) return sock.destroy();
      started++;
      sock.write(encodeFrame(FrameType.OFFER, encodeOffer({ kind: OfferKind.FILE, size: BigInt(1 << 30), mtimeNs: 1n, mode: 0o644, flags: 0 })));
      await next(); // DECISION
      if (kind === 'flood') {
        sock.write(repeated(encodeFrame(FrameType.DATA), 2_000_000));
        while (await next());
      } else {
        const tick = setInterval(() => sock.writable && sock.write(keepAlive), 200);
        while (await next());
        clearInterval(tick);
      }
    }
    sock.destroy();
  });
  await Promise.allSettled(sessions);
  const allClosed = Date.now();
  let back = 0;
  let after = 0;
  for (;;) {
    await sleep(250);
    after = status(d.pid, 'VmRSS');
    if (after <= idle * 1.5 + 32 * MiB || Date.now() - allClosed > 10_000) break;
  }
  back = Date.now() - allClosed;
  clearInterval(sampler);
  const lines = d.events.filter((e) => e.event === 'session');
  console.error(`  daemon logged ${lines.length} sessions; RSS now ${fmt(status(d.pid, 'VmRSS'))}`);
  if (process.env.FFSYNC_BENCH_DEBUG) {
    const kinds = new Map<string, number>();
    for (const e of lines) kinds.set(`${e.op} ${e.exitCode} ${String(e.error).slice(0, 60)}`, (kinds.get(`${e.op} ${e.exitCode} ${String(e.error).slice(0, 60)}`) ?? 0) + 1);
    console.error(kinds);
    const ends = lines.map((e) => Date.parse(String(e.start)) + Number(e.durationMs) - allClosed).sort((a, b) => a - b);
    console.error(`  sessions ended, relative to the clients' close: first ${ends[0]} ms, last ${ends[ends.length - 1]} ms`);
    for (let k = 0; k < 20; k++) {
      await sleep(1000);
      console.error(`  +${k + 1} s: ${d.events.filter((e) => e.event === 'session').length} sessions logged, RSS ${fmt(status(d.pid, 'VmRSS'))}`);
    }
    console.error(`  20 s later: ${d.events.filter((e) => e.event === 'session').length} sessions logged, RSS ${fmt(status(d.pid, 'VmRSS'))}`);
  }
  row(`serve: 64 concurrent hostile sessions, ${started} accepted (16 empty-DATA floods, 16 KEEPALIVE-only, 32 pulls flooding 500k frames)`, `${fmt(peak)} peak (idle ${fmt(idle)})`, `all ended in ${((allClosed - t0) / 1000).toFixed(1)} s; RSS ${fmt(after)} ${back <= 10_000 ? `${(back / 1000).toFixed(1)} s` : 'still, 10 s'} after they closed`, verdict(peak <= 1024 * MiB && back <= 10_000));

  // 500 unauthenticated TLS connections (unknown certificate, never a HELLO), from 50 addresses.
  const strangerId = identity(stranger);
  const open = new Set<net.Socket>();
  let stop = false;
  let opened = 0;
  const attacker = async (k: number, reconnect: boolean) => {
    do {
      const s = net.connect({ host: '127.0.0.1', port, localAddress: `127.0.1.${1 + (k % 50)}` });
      s.on('error', () => undefined);
      await new Promise<void>((r) => {
        s.once('connect', () => r());
        s.once('close', () => r());
      });
      // Connected after the stop: the sockets to destroy were already destroyed.
      if (s.destroyed || stop) {
        s.destroy();
        continue;
      }
      const t = tls.connect({ socket: s, ...strangerId, rejectUnauthorized: false, minVersion: 'TLSv1.3', checkServerIdentity: () => undefined });
      t.on('error', () => undefined);
      // Flowing, so that the daemon's close is read: a paused TLS socket never sees the end of
      // its stream and would wait for 'close' forever.
      t.resume();
      opened++;
      open.add(t);
      await new Promise<void>((r) => t.once('close', () => r()));
      open.delete(t);
    } while (reconnect && !stop);
  };
  for (const reconnect of [false, true]) {
    stop = false;
    const attackers = Array.from({ length: 500 }, (_, k) => attacker(k, reconnect));
    await sleep(2000);
    const openNow = open.size;
    const times: number[] = [];
    for (let k = 0; k < 5; k++) {
      const s0 = Date.now();
      try {
        const sock = await rawTls(port, who);
        const next = framesUntilClose(sock);
        sock.write(hello(Role.RECEIVER, OUR_CAPABILITIES));
        await next();
        sock.write(encodeFrame(FrameType.REQUEST, encodeRequest({ op: RequestOp.PULL, path: 'pub/big.bin' })));
        const f = await next();
        times.push(f?.type === FrameType.ACCEPT ? Date.now() - s0 : Infinity);
        sock.destroy();
      } catch {
        times.push(Infinity);
      }
    }
    const c0 = Date.now();
    const push = spawnCli(['send', small, `127.0.0.1:${port}/in/ok.bin`, '--state-dir', client, '--trust', fp, '--json', '--timeout', '20']);
    const pr = await push.done;
    const cliMs = Date.now() - c0;
    stop = true;
    for (const s of open) s.destroy();
    await Promise.allSettled(attackers);
    const worst = Math.max(...times);
    row(
      `serve: authorized client while 500 unauthenticated TLS connections ${reconnect ? 'keep re-connecting' : 'were opened'} (${openNow} open at the time, ${opened} opened so far)`,
      `REQUEST→ACCEPT ${times.map((t) => (t === Infinity ? 'failed' : `${t} ms`)).join(', ')}`,
      `CLI push (process start to exit) exit ${pr.code} in ${cliMs} ms`,
      verdict(worst <= 2000 && pr.code === 0),
    );
  }
  d.kill();
  await d.done;
}

/** CPU of FramedConnection for `n` small queued frames (decode, queue, recv), in-process. */
async function perFrame(modPath: string, n: number): Promise<number> {
  const { FramedConnection } = await import(modPath);
  const srv = net.createServer();
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  const accepted = new Promise<net.Socket>((r) => srv.once('connection', r));
  const c = net.connect((srv.address() as net.AddressInfo).port, '127.0.0.1');
  const s = await accepted;
  const conn = new FramedConnection(s, 0);
  const frame = encodeFrame(FrameType.NEED, Buffer.from([0, 0, 0, 0, 1]));
  const hello0 = encodeFrame(FrameType.HELLO, Buffer.alloc(16));
  c.write(hello0);
  await conn.recv();
  const flood = repeated(frame, n);
  const t0 = process.cpuUsage();
  c.write(flood);
  for (let i = 0; i < n; i++) await conn.recv();
  const t = process.cpuUsage(t0);
  c.destroy();
  s.destroy();
  srv.close();
  return (t.user + t.system) / 1000;
}

async function cpu(): Promise<void> {
  console.error('CPU per frame');
  const builds: [string, string][] = [['this build', path.join(__dirname, '..', 'ts', 'transport', 'connection.ts')]];
  const old = process.env.FFSYNC_BENCH_OLD_DIST;
  if (old) builds.push(['previous build', path.join(old, 'transport', 'connection.js')]);
  for (const [name, mod] of builds) {
    await perFrame(mod, 50_000); // warm up
    const a = await perFrame(mod, 100_000);
    const b = await perFrame(mod, 400_000);
    row(`FramedConnection (${name}): 100k vs 400k small frames decoded, queued, received`, `${a.toFixed(0)} ms vs ${b.toFixed(0)} ms CPU`, `ratio ${(b / a).toFixed(2)}; ${((b * 1000) / 400_000).toFixed(2)} µs per frame`, verdict(b / a < 5.5));
  }
  const sizes = (process.env.FFSYNC_BENCH_FLOOD_N ?? '100000,400000').split(',').map(Number);
  for (const n of sizes) {
    const r = await receiverAfterDecision(20);
    for (const p of manifestFrames(r.src.scan.manifest)) r.sock.write(encodeFrame(FrameType.MANIFEST, p));
    let f;
    while ((f = await r.next()) && f.type !== FrameType.NEED_END);
    const before = procCpuMs(r.p.pid);
    r.sock.write(repeated(encodeFrame(FrameType.DATA), n));
    const res = await within(r.p.done, 120_000, r.p.kill);
    r.sock.destroy();
    const x = res === 'timeout' ? await r.p.done : res;
    row(`receiver: ${n / 1000}k empty DATA frames`, `CPU ${(x.cpuMs - before).toFixed(0)} ms after the flood began`, `exit ${x.code} after ${(x.ms / 1000).toFixed(1)} s`, '');
  }
}

void (async () => {
  const only = process.argv[2];
  if (!only || only === 'oneshot') await oneShot();
  if (!only || only === 'serve') await serve();
  if (!only || only === 'cpu') await cpu();
  console.log(`\nbench/hostile.ts, ${new Date().toISOString()}, ${os.cpus().length} cores, node ${process.version}, CLI ${path.relative(process.cwd(), CLI)}\n`);
  console.log('| Attack | Peak RSS / measure | Outcome | Target |');
  console.log('|---|---|---|---|');
  for (const r of rows) console.log(`| ${r.join(' | ')} |`);
  process.exit(0);
})();
