// Fault injection: one seeded run = build a fixture (an old target and a new source, a
// single file or a tree), start a real receiver and sender (compiled CLI, --plaintext,
// loopback), inject one fault at a random point, then check the invariants a sync tool
// owes its user after any failure, and rerun without the fault to check convergence.
// Shared by __test__/faults.test.ts (short, seeded, inside `npm test`) and
// bench/faults.ts (the soak, which writes docs/reliability.md).
import { execFileSync } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { type Peer, type PeerResult, canMount, run, seeded, sha256, snapshotTree, tmpdir, writeAt } from './peers';

export const FAULT_KINDS = [
  'sender-kill',
  'receiver-kill',
  'connection-reset',
  'wire-corruption',
  'disk-full',
  'permission-file',
  'permission-dir',
  'source-changed',
  'old-file-changed',
  'source-vanished',
  'future-mtime',
] as const;
export type FaultKind = (typeof FAULT_KINDS)[number];
export type Shape = 'file' | 'tree';
export const SHAPES: Shape[] = ['file', 'tree'];

export interface RunOutcome {
  kind: FaultKind;
  shape: Shape;
  seed: number;
  /** Why the run could not inject its fault on this machine (then no invariant was checked). */
  skipped?: string;
  /** Exit codes of the faulted session (null: killed by the fault). */
  senderCode: number | null;
  receiverCode: number | null;
  /** A resumable partial survived the fault (the rerun had to reuse or remove it). */
  partialKept: boolean;
  /** Each broken invariant, in words. Must be empty. */
  violations: string[];
  ms: number;
}

const KiB = 1024;
const MiB = 1024 * KiB;
/** Far in the future (2100-01-01) and a bit later: mtimes a clock-skewed peer could produce. */
const FUTURE_S = 4_102_444_800;
const TEMP_RE = /\.ffsync-(part|journal)$/;

/** mulberry32: a small seeded PRNG, so a seed replays a run's random choices exactly. */
export function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** Documented exit codes (docs/cli.md "Exit codes") each fault may end with, besides 0 when it
 * landed too late to matter (then the result must be the new content). A killed peer's
 * survivor sees the connection reset (10) or closed early (12) — or, during the handshake,
 * a peer it cannot tell from an incompatible one (2, "connection closed during the handshake"
 * with a hint about versions and --plaintext); a flipped byte is caught as a
 * bad frame or chunk (12), as a written file that fails verification against the sender's
 * root (23: small files of a tree are verified after they are written, before their rename)
 * or, when it lengthened a frame, as silence (30). */
const EXPECTED: Record<FaultKind, { sender: number[]; receiver: number[] }> = {
  'sender-kill': { sender: [], receiver: [2, 10, 12] },
  'receiver-kill': { sender: [2, 10, 12], receiver: [] },
  'connection-reset': { sender: [2, 10, 12], receiver: [2, 10, 12] },
  'wire-corruption': { sender: [10, 12, 23, 30], receiver: [10, 12, 23, 30] },
  'disk-full': { sender: [11, 23], receiver: [11, 23] },
  // A file that cannot be replaced: exit 11 for a single file, 23 in a tree (the rest synced).
  'permission-file': { sender: [11, 23], receiver: [11, 23] },
  'permission-dir': { sender: [11, 23], receiver: [11, 23] },
  'source-changed': { sender: [24], receiver: [24] },
  'old-file-changed': { sender: [23], receiver: [23] },
  'source-vanished': { sender: [3, 24], receiver: [24] },
  'future-mtime': { sender: [], receiver: [] },
};

/** Stricter per shape where docs/cli.md is specific: a single file that cannot be written is
 * exit 11; in a tree, a path that cannot be written is 23 (the rest synced), while a full disk
 * ends the whole session with 11. */
const EXPECTED_BY_SHAPE: Partial<Record<FaultKind, Record<Shape, number[]>>> = {
  'disk-full': { file: [11], tree: [11] },
  'permission-file': { file: [11], tree: [23] },
  'permission-dir': { file: [11], tree: [23] },
};

/** What the message of each documented code must say (one line `ffsync-native: error: …`). */
const MESSAGE: Record<number, RegExp> = {
  2: /handshake|version|plaintext/i,
  3: /source|no such file/i,
  10: /connection|reset|closed|socket/i,
  11: /space|permission|not permitted|writable|read-only|denied/i,
  12: /peer|frame|hash|closed|malformed|protocol|verif|unexpected|corrupt|invalid|decompress/i,
  23: /partial|could not|changed|verif|failed|cannot/i,
  24: /changed|vanished/i,
  30: /silent|timeout|timed out|trickle/i,
};

interface Fixture {
  /** The path given to `send`. */
  source: string;
  /** The path given to `receive`. */
  target: string;
  /** The directory whose every entry belongs to the sync (the tree, or the file's directory). */
  root: string;
  /** Relative path in `root` -> its content (sha256) before the run, and what a user wrote
   * into it during the run (old-file-changed). */
  old: Map<string, Set<string>>;
  /** Relative path in `root` -> every content the sender may legitimately have had for it. */
  fresh: Map<string, Set<string>>;
  /** Relative path in `root` -> the new content's size (for the resend bound). */
  freshSize: Map<string, number>;
  /** Files only the receiver has (a tree sync deletes them only after every transfer succeeded). */
  receiverOnly: string[];
  /** Source files removed during the run (no longer owed to the target). */
  vanished: Set<string>;
}

interface Ctx {
  dir: string;
  rand: () => number;
  kind: FaultKind;
  shape: Shape;
  /** The peers speak TLS (else --plaintext). */
  tls: boolean;
  mount?: string;
  /** Takes the fault away before the rerun. */
  restore: (() => void)[];
  /** Final cleanup (unmount). */
  cleanup: (() => void)[];
}

function pick<T>(rand: () => number, xs: T[]): T {
  return xs[Math.floor(rand() * xs.length)];
}

function between(rand: () => number, lo: number, hi: number): number {
  return lo + Math.floor(rand() * (hi - lo + 1));
}

function shaOf(b: Buffer): string {
  return crypto.createHash('sha256').update(b).digest('hex');
}

/** Overwrite 64 KiB at a random offset in place (within [from, to) of the file, as fractions):
 * same size, new content, new mtime. Returns the new sha256. */
function scribble(file: string, rand: () => number, from = 0, to = 1): string | undefined {
  try {
    const size = fs.statSync(file).size;
    const span = Math.max(1, size * (to - from) - 64 * KiB);
    const at = Math.min(Math.max(0, size - 64 * KiB), Math.floor(size * from + rand() * span));
    const fd = fs.openSync(file, 'r+');
    try {
      // From the run's generator, so a seed replays the bytes as well as the offset.
      const bytes = Buffer.alloc(Math.min(64 * KiB, size));
      for (let i = 0; i < bytes.length; i++) bytes[i] = Math.floor(rand() * 256);
      fs.writeSync(fd, bytes, 0, bytes.length, at);
    } finally {
      fs.closeSync(fd);
    }
    return sha256(file);
  } catch {
    return undefined; // it vanished meanwhile: nothing scribbled
  }
}

/** A half-old, half-new large file: the receiver copies the first half locally and the
 * second half travels (so there is data on the wire to interrupt). */
function evolve(old: Buffer, seed: number): Buffer {
  const keep = Math.floor(old.length / 2);
  return Buffer.concat([old.subarray(0, keep), seeded(old.length - keep + 300 * KiB, seed)]);
}

function buildFixture(c: Ctx, seed: number): Fixture {
  const { dir, rand, kind } = c;
  const srcRoot = path.join(dir, 'src');
  fs.mkdirSync(srcRoot);
  const fixture: Fixture = { source: '', target: '', root: '', old: new Map(), fresh: new Map(), freshSize: new Map(), receiverOnly: [], vanished: new Set() };
  const mtime = kind === 'future-mtime' ? FUTURE_S + between(rand, 0, 1e6) + 0.5 : undefined;
  const oldMtime = kind === 'future-mtime' ? FUTURE_S + 2e6 : undefined;
  const addFresh = (rel: string, data: Buffer) => {
    fixture.fresh.set(rel, new Set([shaOf(data)]));
    fixture.freshSize.set(rel, data.length);
  };
  if (c.shape === 'file') {
    fixture.root = c.mount ?? path.join(dir, 'dst');
    fs.mkdirSync(fixture.root, { recursive: true });
    fixture.target = path.join(fixture.root, 'target.bin');
    fixture.source = path.join(srcRoot, 'new.bin');
    // disk-full: old (1.5-2 MiB) fits the 4 MiB filesystem, old + new does not.
    const oldSize = kind === 'disk-full' ? between(rand, 1536, 2048) * KiB : between(rand, 3 * 1024, 6 * 1024) * KiB;
    const oldData = seeded(oldSize, seed);
    const newData = kind === 'disk-full' ? seeded(between(rand, 5 * 1024, 7 * 1024) * KiB, seed + 1) : evolve(oldData, seed + 1);
    const hasOld = kind !== 'source-vanished' || rand() < 0.5;
    if (hasOld) {
      writeAt(fixture.root, 'target.bin', oldData, 0o644, oldMtime);
      fixture.old.set('target.bin', new Set([shaOf(oldData)]));
    }
    writeAt(srcRoot, 'new.bin', newData, 0o640, mtime);
    addFresh('target.bin', newData);
    return fixture;
  }
  // Tree: small files (batched), two or three large files (chunked, with deltas), a file only
  // the receiver has, a subdirectory with both.
  fixture.root = c.mount ? path.join(c.mount, 'tree') : path.join(dir, 'dst');
  fixture.target = fixture.root;
  fixture.source = srcRoot;
  const small = between(rand, 4, 12);
  for (let i = 0; i < small; i++) {
    const rel = `${i % 3 === 0 ? 'sub/' : ''}s${i}.txt`;
    const data = seeded(between(rand, 10, 20 * KiB), seed * 10 + i);
    writeAt(srcRoot, rel, data, 0o644, mtime);
    addFresh(rel, data);
    if (i % 2 === 0) {
      const o = seeded(data.length + 7, seed * 10 + i + 5000);
      writeAt(fixture.root, rel, o, 0o644, oldMtime);
      fixture.old.set(rel, new Set([shaOf(o)]));
    }
  }
  const large = kind === 'disk-full' ? ['big-a.bin', 'sub/big-b.bin'] : ['big-a.bin', 'sub/big-b.bin', 'z-big.bin'];
  large.forEach((rel, i) => {
    const oldData = seeded(between(rand, kind === 'disk-full' ? 1024 : 1536, 2560) * KiB, seed * 100 + i);
    const data = kind === 'disk-full' ? seeded(between(rand, 2048, 3072) * KiB, seed * 100 + i + 50) : evolve(oldData, seed * 100 + i + 50);
    writeAt(srcRoot, rel, data, 0o644, mtime);
    addFresh(rel, data);
    if (kind === 'disk-full' ? i === 0 : true) {
      writeAt(fixture.root, rel, oldData, 0o644, oldMtime);
      fixture.old.set(rel, new Set([shaOf(oldData)]));
    }
  });
  for (const rel of ['only-here.txt', 'sub/only-here-too.txt']) {
    const data = seeded(100, seed + rel.length);
    writeAt(fixture.root, rel, data);
    fixture.old.set(rel, new Set([shaOf(data)]));
    fixture.receiverOnly.push(rel);
  }
  return fixture;
}

/** Every regular file under `root` (relative path -> sha256), and temp files apart. */
function listFiles(root: string): { files: Map<string, string>; temps: string[] } {
  const files = new Map<string, string>();
  const temps: string[] = [];
  if (!fs.existsSync(root)) return { files, temps };
  for (const [rel, e] of Object.entries(snapshotTree(root, { root: false }))) {
    if (e.kind !== 'file') continue;
    if (TEMP_RE.test(rel)) temps.push(rel);
    else files.set(rel, e.sha256!);
  }
  return { files, temps };
}

/** A TCP relay from a fresh port to `targetPort` that can reset every connection or flip one
 * byte at a chosen offset of the sender -> receiver stream (plaintext: nothing else checks
 * integrity, so the engine's own checks must catch it). */
export interface FaultProxy {
  port: number;
  /** Resolves when the first connection arrived. */
  connected: Promise<void>;
  /** RST on every connection. */
  reset(): void;
  /** Flip one bit `offset` bytes further into the sender -> receiver stream. */
  corruptAt(offset: number): void;
  /** While on, the receiver -> sender direction is held back (delivered when turned off). */
  hold(on: boolean): void;
  /** Bytes relayed so far from the sender to the receiver. */
  upstreamBytes(): number;
  close(): void;
}

export async function faultProxy(targetPort: number): Promise<FaultProxy> {
  const sockets = new Set<net.Socket>();
  let holding = false;
  const held: (() => void)[] = [];
  let onConnect: () => void = () => undefined;
  const connected = new Promise<void>((r) => (onConnect = r));
  let flipAt = -1;
  let upstream = 0;
  const server = net.createServer({ noDelay: true }, (inbound) => {
    const outbound = net.connect({ port: targetPort, host: '127.0.0.1', noDelay: true });
    sockets.add(inbound).add(outbound);
    for (const s of [inbound, outbound]) s.on('error', () => undefined);
    onConnect();
    inbound.on('data', (b: Buffer) => {
      if (flipAt >= upstream && flipAt < upstream + b.length) {
        b = Buffer.from(b);
        b[flipAt - upstream] ^= 1 << (flipAt % 8);
        flipAt = -1;
      }
      upstream += b.length;
      if (!outbound.write(b)) {
        inbound.pause();
        outbound.once('drain', () => inbound.resume());
      }
    });
    outbound.on('data', (b: Buffer) => {
      if (holding) {
        outbound.pause();
        held.push(() => {
          inbound.write(b);
          outbound.resume();
        });
        return;
      }
      if (!inbound.write(b)) {
        outbound.pause();
        inbound.once('drain', () => outbound.resume());
      }
    });
    inbound.on('end', () => outbound.end());
    outbound.on('end', () => inbound.end());
    inbound.on('close', () => outbound.destroy());
    outbound.on('close', () => inbound.destroy());
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  return {
    port: (server.address() as net.AddressInfo).port,
    connected,
    // resetAndDestroy sends a TCP RST: what a dropped NAT entry or a crashed middlebox does.
    reset: () => {
      for (const s of sockets) if (!s.destroyed) s.resetAndDestroy();
    },
    corruptAt: (offset) => (flipAt = upstream + offset),
    hold: (on) => {
      holding = on;
      if (!on) for (const release of held.splice(0)) release();
    },
    upstreamBytes: () => upstream,
    close: () => {
      for (const s of sockets) s.destroy();
      server.close();
    },
  };
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/** A process still running after `ms` is killed (a hung peer is itself a violation). */
async function bounded(p: Peer, ms: number, hung: () => void): Promise<PeerResult> {
  let timer: NodeJS.Timeout | undefined;
  const t = new Promise<void>((r) => (timer = setTimeout(r, ms)));
  const first = await Promise.race([p.done, t.then(() => undefined)]);
  clearTimeout(timer);
  if (first) return first;
  hung();
  if (process.env.FFSYNC_FAULT_DEBUG) console.error(`hung: ${p.child.spawnargs.join(' ')}\nstderr: ${(await Promise.race([p.done, sleep(0)]))?.stderr ?? ''}`);
  p.child.kill('SIGKILL');
  return p.done;
}

function errorLines(stderr: string): string[] {
  return stderr.split('\n').filter((l) => l.startsWith('ffsync-native: error:'));
}

function chattr(flag: '+i' | '-i', p: string): boolean {
  try {
    execFileSync('chattr', [flag, p], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}

/** Bytes of `part` equal to `data` at the same offset, counted in whole 64 KiB blocks: what
 * a resumed run already has (the partial is pre-sized, so its length says nothing). */
function bytesPresent(part: string, data: Buffer): number {
  const got = fs.readFileSync(part);
  let n = 0;
  for (let at = 0; at + 64 * KiB <= Math.min(got.length, data.length); at += 64 * KiB) {
    if (got.subarray(at, at + 64 * KiB).equals(data.subarray(at, at + 64 * KiB))) n += 64 * KiB;
  }
  return n;
}

/** The file a partial `.<name>.<root>.ffsync-part` belongs to (relative path). */
function partialOwner(rel: string): string {
  const dir = path.posix.dirname(rel);
  const m = /^\.(.*)\.[0-9a-f]{16}\.ffsync-part$/.exec(path.posix.basename(rel));
  const name = m ? m[1] : path.posix.basename(rel);
  return dir === '.' ? name : `${dir}/${name}`;
}

export interface RunOptions {
  /** --timeout for both peers (seconds); a flipped length byte is only noticed this late. */
  timeoutS?: number;
  /** TLS with pinned peers instead of --plaintext, the sender remembering its receiver from a
   * session before the faulted one: the offers that go before the receiver's HELLO (decisions
   * §93: a file's always, a tree's to a remembered receiver) are in flight when the fault lands.
   * Not for wire-corruption (TLS rejects a flipped byte before the engine sees it). */
  tls?: boolean;
}

/** Both peers' state directories and how each reaches the other. */
interface Peers {
  sender: string;
  receiver: string;
  /** Transport arguments: --plaintext, or --trust with the other's fingerprint. */
  senderArgs: string[];
  receiverArgs: string[];
}

/** The peers of a run: plaintext, or TLS pinned both ways with the sender remembering its
 * receiver (a session of an empty tree before the faulted one). */
async function peers(dir: string, tls: boolean): Promise<Peers> {
  const states = { sender: path.join(dir, 'state-s'), receiver: path.join(dir, 'state-r') };
  if (!tls) return { ...states, senderArgs: ['--plaintext'], receiverArgs: ['--plaintext'] };
  const id = async (state: string) => (await run(['id', '--state-dir', state]).done).stdout.trim();
  const p: Peers = { ...states, senderArgs: ['--trust', await id(states.receiver)], receiverArgs: ['--trust', await id(states.sender)] };
  const empty = path.join(dir, 'warm-up');
  fs.mkdirSync(empty);
  const receiver = run(['receive', path.join(dir, 'warm-up-target'), '0', '--bind', '127.0.0.1', '--json', '--state-dir', p.receiver, ...p.receiverArgs]);
  const port = (await receiver.waitFor((e) => e.event === 'listening')).port;
  const s = await run(['send', empty, `127.0.0.1:${port}`, '--json', '--state-dir', p.sender, ...p.senderArgs]).done;
  const r = await receiver.done;
  if (s.code !== 0 || r.code !== 0) throw new Error(`TLS warm-up session failed: ${s.stderr} ${r.stderr}`);
  return p;
}

/** One fault-injected run and its rerun; never throws for a broken invariant (it is listed). */
export async function runFault(kind: FaultKind, shape: Shape, seed: number, o: RunOptions = {}): Promise<RunOutcome> {
  const t0 = Date.now();
  const outcome: RunOutcome = { kind, shape, seed, senderCode: null, receiverCode: null, partialKept: false, violations: [], ms: 0 };
  const v = (msg: string) => outcome.violations.push(msg);
  const dir = tmpdir('ffsync-fault-');
  const c: Ctx = { dir, rand: rng(seed), kind, shape, tls: Boolean(o.tls), restore: [], cleanup: [] };
  const timeoutS = o.timeoutS ?? 6;
  try {
    if (kind === 'disk-full') {
      if (!canMount()) return { ...outcome, skipped: 'needs root to mount a small tmpfs' };
      c.mount = path.join(dir, 'small');
      fs.mkdirSync(c.mount);
      execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=4m', 'tmpfs', c.mount]);
      c.cleanup.push(() => execFileSync('umount', ['-l', c.mount!]));
      c.restore.push(() => execFileSync('mount', ['-o', 'remount,size=64m', c.mount!]));
    }
    const fx = buildFixture(c, seed);
    // Something beside the target root that no run may touch.
    const outside = path.join(dir, 'outside');
    writeAt(outside, 'neighbour.bin', seeded(64 * KiB, seed + 7));
    writeAt(outside, 'target.bin', 'a same-named file outside the root\n');
    const outsideBefore = JSON.stringify(snapshotTree(outside));
    if (o.tls && kind === 'wire-corruption') return { ...outcome, skipped: 'TLS rejects a flipped byte before the engine sees it' };
    const states = await peers(dir, Boolean(o.tls));
    const skipped = makeImmutable(c, fx);
    if (skipped) return { ...outcome, skipped };

    const [sendRes, recvRes] = await session(c, fx, states, timeoutS, v);
    if (process.env.FFSYNC_FAULT_DEBUG) console.error(`sender ${sendRes.code}/${sendRes.signal}: ${sendRes.stderr}\nreceiver ${recvRes.code}/${recvRes.signal}: ${recvRes.stderr}`);
    outcome.senderCode = sendRes.signal ? null : sendRes.code;
    outcome.receiverCode = recvRes.signal ? null : recvRes.code;
    const after = checkFailedRun(c, fx, sendRes, recvRes, v);
    outcome.partialKept = after.temps.some((t) => t.endsWith('.ffsync-part'));
    if (JSON.stringify(snapshotTree(outside)) !== outsideBefore) v('something outside the target root changed');

    // Take the fault away, then rerun: it must converge, leave no temp state and send only
    // what is still missing. (A vanished single source has nothing to converge to; the
    // target must still be intact, which is checked above.)
    for (const u of c.restore.splice(0)) u();
    if (fs.existsSync(fx.source)) await checkRerun(c, fx, after, states, timeoutS, v);
  } catch (e) {
    v(`runner error: ${(e as Error).stack ?? e}`);
  } finally {
    for (const u of [...c.restore, ...c.cleanup]) {
      try {
        u();
      } catch {
        // best effort
      }
    }
    try {
      fs.rmSync(dir, { recursive: true, force: true });
    } catch {
      // a lazily unmounted tmpfs may still be busy for a moment
    }
  }
  outcome.ms = Date.now() - t0;
  return outcome;
}

type Violation = (msg: string) => void;

/** Faults that are a condition of the target, set before the run: an immutable file or
 * directory (even root cannot replace, rename over or create inside it; the tests run as
 * root, where mode bits would not deny anything). Returns why the run is skipped, if it is. */
function makeImmutable(c: Ctx, fx: Fixture): string | undefined {
  const { kind, shape } = c;
  if (kind !== 'permission-file' && kind !== 'permission-dir') return undefined;
  let victim: string;
  if (kind === 'permission-file') victim = shape === 'file' ? fx.target : path.join(fx.root, 'big-a.bin');
  else victim = shape === 'file' ? fx.root : path.join(fx.root, 'sub');
  if (!chattr('+i', victim)) return `chattr +i is not supported on ${path.dirname(victim)}`;
  c.restore.push(() => chattr('-i', victim));
  return undefined;
}

/** The faulted session: a receiver, a sender through the fault relay, and the fault injected
 * at a random point; each peer's result (a receiver that refused its target never listened,
 * and then no sender ran). */
async function session(c: Ctx, fx: Fixture, states: Peers, timeoutS: number, v: Violation): Promise<[PeerResult, PeerResult]> {
  const { kind, rand } = c;
  const receiver = run(['receive', fx.target, '0', ...states.receiverArgs, '--json', '--timeout', String(timeoutS), '--state-dir', states.receiver]);
  const listening = await receiver.waitFor((e) => e.event === 'listening').catch(() => undefined);
  if (!listening) return [{ code: null, signal: null, events: [], stdout: '', stderr: '', summary: undefined }, await receiver.done];
  // Every session goes through the relay: it tells when the sender has connected (the
  // receiver hashes its old file before that, and waits for a sender as long as it takes).
  const proxy = await faultProxy(listening.port);
  if (kind === 'wire-corruption') {
    // Past HELLO (so the flip tests the engine, not version negotiation), anywhere in the
    // first MiB of the sender's stream.
    proxy.corruptAt(between(rand, 64, MiB));
  }
  // A bandwidth cap spreads the transfer over ~1 s so a random point lands inside it.
  const sender = run(['send', fx.source, `127.0.0.1:${proxy.port}`, ...states.senderArgs, '--json', '--timeout', String(timeoutS), '--state-dir', states.sender, '--bwlimit', '2048']);
  const timed = kind === 'sender-kill' || kind === 'receiver-kill' || kind === 'connection-reset' || kind === 'source-changed' || kind === 'old-file-changed' || kind === 'source-vanished';
  let injected: Promise<void> = Promise.resolve();
  if (timed) {
    injected = (async () => {
      // A random point of the session: after the sender connected, up to 1.2 s later
      // (transfers take ~1 s at the cap). A changed old file matters while the receiver
      // copies from it, early on.
      const started = await Promise.race([proxy.connected.then(() => true), sender.done.then(() => false)]);
      if (!started) return;
      await sleep(between(rand, 0, kind === 'old-file-changed' ? 400 : 1200));
      inject(c, fx, { sender, receiver, proxy });
    })();
  }
  const hangMs = (timeoutS + 20) * 1000;
  const sent = bounded(sender, hangMs, () => v('sender hung'));
  if (kind === 'connection-reset' && c.tls) await keptWaiting(await sent, receiver, listening.port, fx, states, timeoutS, hangMs, v);
  const results = await Promise.all([sent, bounded(receiver, hangMs, () => v('receiver hung'))]);
  await injected;
  proxy.close();
  return results;
}

/** How long a receiver whose connection was reset takes to notice, at most. */
const NOTICE_MS = 1500;

/** A reset before the sender's first byte reached the receiver started no session there: a TLS
 * receive ignores a connection that closes before its first byte (a sender that stopped before
 * its session, decisions §110) and keeps waiting. The sender failed while connecting; the
 * receiver must then still be listening, and serve the next sender (sent straight to it). */
async function keptWaiting(sendRes: PeerResult, receiver: Peer, port: number, fx: Fixture, states: Peers, timeoutS: number, hangMs: number, v: Violation): Promise<void> {
  const exited = await Promise.race([receiver.done.then(() => true), sleep(NOTICE_MS).then(() => false)]);
  if (exited) return;
  if (sendRes.code !== 10 || !/^ffsync-native: error: connecting to /m.test(sendRes.stderr)) return; // then it hung (bounded says so)
  // It started nothing: it said nothing but where it listens, and the target is as it was (old
  // contents, no temp state, the receiver-only files there). The next session would hide it.
  const said = receiver.events.filter((e) => e.event !== 'listening').map((e) => String(e.event));
  if (said.length) v(`a receiver that kept waiting after a reset reported ${said.join(', ')} for the connection it ignored`);
  const now = listFiles(fx.root);
  for (const [rel, sha] of now.files) if (!fx.old.get(rel)?.has(sha)) v(`${rel} changed though the receiver started no session`);
  if (now.temps.length) v(`temp state ${now.temps.join(', ')} though the receiver started no session`);
  for (const rel of fx.receiverOnly) if (!now.files.has(rel)) v(`${rel} (receiver only) went though the receiver started no session`);
  const next = run(['send', fx.source, `127.0.0.1:${port}`, ...states.senderArgs, '--json', '--timeout', String(timeoutS), '--state-dir', states.sender]);
  const r = await bounded(next, hangMs, () => v('the next sender, to a receiver that kept waiting after a reset, hung'));
  if (process.env.FFSYNC_FAULT_DEBUG) console.error(`the receiver kept waiting after the reset; the next sender: ${r.code}`);
  if (r.code !== 0) v(`a receiver that kept waiting after a reset did not serve the next sender: exit ${r.code}: ${errorLines(r.stderr)[0] ?? ''}`);
}

/** The timed faults, at the moment the session reached. */
function inject(c: Ctx, fx: Fixture, p: { sender: Peer; receiver: Peer; proxy: FaultProxy }): void {
  const { kind, shape, rand } = c;
  const { sender, receiver, proxy } = p;
  switch (kind) {
    case 'sender-kill':
      sender.child.kill('SIGKILL');
      break;
    case 'receiver-kill':
      receiver.child.kill('SIGKILL');
      break;
    case 'connection-reset':
      proxy.reset();
      break;
    case 'source-changed': {
      const rel = shape === 'file' ? 'target.bin' : pick(rand, ['big-a.bin', 'sub/big-b.bin', 'z-big.bin']);
      const file = shape === 'file' ? fx.source : path.join(fx.source, rel);
      // The second half: the part that travels (the first is copied from the old file).
      const now = scribble(file, rand, 0.5, 1);
      if (now) fx.fresh.get(rel)!.add(now);
      break;
    }
    case 'old-file-changed': {
      const rel = shape === 'file' ? 'target.bin' : pick(rand, ['big-a.bin', 'sub/big-b.bin', 'z-big.bin']);
      // The first half: the part the receiver copies from its old file.
      const now = scribble(path.join(fx.root, rel), rand, 0, 0.5);
      // The changed old file is a legitimate "old" content too (the user wrote it).
      if (now) fx.old.get(rel)?.add(now);
      break;
    }
    case 'source-vanished':
      fs.rmSync(shape === 'file' ? fx.source : path.join(fx.source, 'z-big.bin'), { force: true });
      fx.vanished.add(shape === 'file' ? 'target.bin' : 'z-big.bin');
      break;
  }
}

/** The first (faulted) run's invariants: every file is its old content or exactly one of the
 * sender's versions, a failed session deleted nothing, only partials are left, and each exit
 * code is one documented for the fault, with one error line. Returns the target as it is. */
function checkFailedRun(c: Ctx, fx: Fixture, sendRes: PeerResult, recvRes: PeerResult, v: Violation): ReturnType<typeof listFiles> {
  const { kind, shape } = c;
  // Invariant: every file is its old content or exactly one of the sender's versions.
  const after = listFiles(fx.root);
  // Every file the sender still has arrived with one of its contents.
  const complete = [...fx.fresh].every(([rel, fresh]) => fx.vanished.has(rel) || fresh.has(after.files.get(rel) ?? ''));
  for (const [rel, sha] of after.files) {
    const ok = fx.old.get(rel)?.has(sha) || fx.fresh.get(rel)?.has(sha);
    if (!ok) v(`${rel} is neither its old content nor the sender's (a mix or a stray file)`);
  }
  // No deletion in a failed session: a receiver that reports an error deleted nothing; one
  // killed by the fault may have started deleting only after every transfer succeeded.
  const receiverFailed = recvRes.code !== null && recvRes.code !== 0;
  for (const rel of fx.receiverOnly) {
    if (after.files.has(rel)) continue;
    if (receiverFailed) v(`${rel} (receiver only) was deleted in a session that failed with exit ${recvRes.code}`);
    else if (!complete) v(`${rel} (receiver only) was deleted although the session did not transfer everything`);
  }
  for (const t of after.temps) {
    if (!t.endsWith('.ffsync-part')) v(`leftover temp state ${t}`);
  }

  // Invariant: exit codes are documented ones for this fault, with one error line each.
  const byShape = EXPECTED_BY_SHAPE[kind]?.[shape];
  const exp = byShape ? { sender: byShape, receiver: byShape } : EXPECTED[kind];
  const checkPeer = (who: 'sender' | 'receiver', r: PeerResult, allowed: number[]) => {
    if (r.signal) return; // killed by the fault itself
    if (r.code === null) return; // never started (the receiver refused first)
    if (r.code === 0) {
      if (!complete) v(`${who} exited 0 but the target is not the sender's content`);
      return;
    }
    if (!allowed.includes(r.code)) v(`${who} exit ${r.code} is not one documented for ${kind} (${allowed.join(', ') || 'success only'}): ${errorLines(r.stderr)[0] ?? r.stderr.trim().slice(-200)}`);
    const lines = errorLines(r.stderr);
    if (lines.length !== 1) v(`${who} printed ${lines.length} error lines, not 1: ${r.stderr.trim().slice(-300)}`);
    else if (MESSAGE[r.code] && !MESSAGE[r.code].test(lines[0])) v(`${who} message does not say what exit ${r.code} means: ${lines[0]}`);
    if (r.summary && r.summary.exitCode !== r.code) v(`${who} JSON summary says exit ${r.summary.exitCode}, the process ${r.code}`);
  };
  // A condition that cannot be worked around (no space, an immutable file or directory)
  // must fail the session, not be silently skipped.
  if ((kind === 'disk-full' || kind === 'permission-file' || kind === 'permission-dir') && recvRes.code === 0) v(`${kind} went unnoticed: the receiver exited 0`);
  checkPeer('sender', sendRes, exp.sender);
  checkPeer('receiver', recvRes, exp.receiver);
  if (fx.receiverOnly.length && recvRes.code !== 0 && recvRes.summary?.tree && recvRes.summary.tree.deleted !== 0) v(`a failed session (exit ${recvRes.code}) reports ${recvRes.summary.tree.deleted} deletions`);
  return after;
}

/** The rerun once the fault is gone: it converges (content, mtime, mode), leaves no temp
 * state, and sends only what was still missing, a kept partial reused. */
async function checkRerun(c: Ctx, fx: Fixture, after: ReturnType<typeof listFiles>, states: Peers, timeoutS: number, v: Violation): Promise<void> {
  const { kind, shape, rand } = c;
  // What the rerun still has to send: every source file whose current content is not
  // in the target yet (a source changed after its transfer is missing again).
  const sourceNow = (rel: string) => (shape === 'file' ? fx.source : path.join(fx.source, rel));
  const missing = [...fx.freshSize].reduce((sum, [rel]) => {
    if (!fs.existsSync(sourceNow(rel))) return sum;
    const now = sha256(sourceNow(rel));
    return sum + (after.files.get(rel) === now ? 0 : fs.statSync(sourceNow(rel)).size);
  }, 0);
  let present = 0;
  for (const t of after.temps.filter((t) => t.endsWith('.ffsync-part'))) {
    const owner = partialOwner(t);
    if (fs.existsSync(sourceNow(owner))) present += bytesPresent(path.join(fx.root, t), fs.readFileSync(sourceNow(owner)));
  }
  const r2 = await rerun(fx, states, timeoutS);
  if (r2.recv.code !== 0 || r2.send.code !== 0) v(`rerun failed: receiver ${r2.recv.code} sender ${r2.send.code}: ${errorLines(r2.recv.stderr + r2.send.stderr).join(' | ')}`);
  else {
    const srcSnap = shape === 'file' ? { 'target.bin': sha256(fx.source) } : Object.fromEntries(listFiles(fx.source).files);
    const got = Object.fromEntries(listFiles(fx.root).files);
    if (JSON.stringify(sortKeys(got)) !== JSON.stringify(sortKeys(srcSnap))) v('rerun did not converge: target differs from source');
    if (shape === 'tree') {
      const a = snapshotTree(fx.source, { root: false });
      const b = snapshotTree(fx.root, { root: false });
      for (const [rel, e] of Object.entries(a)) {
        if (e.kind === 'file' && (b[rel]?.mtimeNs !== e.mtimeNs || b[rel]?.mode !== e.mode)) v(`rerun: ${rel} has not the source's mtime and mode`);
      }
    } else if (fs.statSync(fx.target).mtimeMs !== fs.statSync(fx.source).mtimeMs) v("rerun: the target has not the source's mtime");
    const left = listFiles(fx.root).temps;
    if (left.length) v(`temp state left after the rerun: ${left.join(', ')}`);
    const literal = r2.recv.summary?.literalBytes ?? 0;
    // Only what is still missing: files that already landed cost nothing, a kept partial
    // is reused (slack: a max-size chunk at each end of every partial, plus headers).
    const bound = Math.max(0, missing - present) + after.temps.length * 512 * KiB + 64 * KiB;
    if (literal > bound) v(`rerun sent ${literal} literal bytes, more than what was missing (${missing} - ${present} in partials)`);
    if (kind === 'future-mtime') {
      // Also: a content change that keeps the size and the (future) mtime is still caught.
      const rel = shape === 'file' ? 'target.bin' : 'big-a.bin';
      const file = sourceNow(rel);
      const st = fs.statSync(file);
      scribble(file, rand);
      fs.utimesSync(file, st.atime, st.mtime);
      const r3 = await rerun(fx, states, timeoutS);
      if (r3.recv.code !== 0 || sha256(shape === 'file' ? fx.target : path.join(fx.root, rel)) !== sha256(file)) v('a same-size, same-future-mtime change was not synced');
      const r4 = await rerun(fx, states, timeoutS);
      if (r4.recv.code !== 0 || (r4.recv.summary?.literalBytes ?? 1) !== 0) v('a no-op rerun with future mtimes sent data');
    }
  }
}

function sortKeys(o: Record<string, string>): [string, string][] {
  return Object.entries(o).sort(([a], [b]) => (a < b ? -1 : 1));
}

async function rerun(fx: Fixture, states: Peers, timeoutS: number): Promise<{ send: PeerResult; recv: PeerResult }> {
  const receiver = run(['receive', fx.target, '0', ...states.receiverArgs, '--json', '--timeout', String(timeoutS), '--state-dir', states.receiver]);
  const ev = await receiver.waitFor((e) => e.event === 'listening').catch(() => undefined);
  if (!ev) {
    const recv = await receiver.done;
    return { recv, send: { code: null, signal: null, events: [], stdout: '', stderr: '', summary: undefined } };
  }
  const send = await run(['send', fx.source, `127.0.0.1:${ev.port}`, ...states.senderArgs, '--json', '--timeout', String(timeoutS), '--state-dir', states.sender]).done;
  return { send, recv: await receiver.done };
}

/** Runs `count` seeded runs cycling through every kind and shape. */
export function plan(masterSeed: number, count: number): { kind: FaultKind; shape: Shape; seed: number }[] {
  const out: { kind: FaultKind; shape: Shape; seed: number }[] = [];
  const r = rng(masterSeed);
  for (let i = 0; i < count; i++) {
    const k = FAULT_KINDS[i % FAULT_KINDS.length];
    const s = SHAPES[Math.floor(i / FAULT_KINDS.length) % 2];
    out.push({ kind: k, shape: s, seed: Math.floor(r() * 2 ** 31) });
  }
  return out;
}
