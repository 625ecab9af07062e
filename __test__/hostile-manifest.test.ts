// Manifest bombs (issue 17 §4): a peer's TREE_MANIFEST declaring 2 GiB of raw length that
// is ~64 KiB on the wire (zstd RLE blocks of zeros). Both a one-shot receiver facing a
// hostile sender and a sender facing a hostile receiver must refuse it with exit 12,
// quickly, without their resident memory ever growing with the declared size.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import tls from 'node:tls';
import { describe, it } from 'node:test';
import { CLI, type Peer, run, seeded, snapshot, startReceiver, tmpdir } from './helpers/peers';
import { frameReader } from './helpers/raw-peer';
import { encodeFrame, FrameType } from '../ts/protocol/frames';
import { encodeHello, encodeOffer, encodeRequest, manifestFrames, OfferKind, RequestOp, Role } from '../ts/protocol/messages';

const GiB = 1024 * 1024 * 1024;
/** Peak resident memory allowed to a victim (Node itself is ~60-70 MiB). */
const PEAK_LIMIT_KIB = 150 * 1024;
const linuxOnly = { skip: process.platform !== 'linux' && 'reads /proc' };

/** One zstd frame (RFC 8878) whose content is `head` (a raw block) followed by `zeros` zero
 * bytes as RLE blocks of 128 KiB: 4 bytes on the wire per 128 KiB of output. */
export function zstdBomb(head: Buffer, zeros: number): Buffer {
  const parts: Buffer[] = [Buffer.from([0x28, 0xb5, 0x2f, 0xfd]), Buffer.from([0x00, 7 << 3])]; // magic; no size, no checksum; window 2^17
  const block = (last: boolean, type: number, size: number, body: Buffer) => {
    const h = (last ? 1 : 0) | (type << 1) | (size << 3);
    parts.push(Buffer.from([h & 0xff, (h >> 8) & 0xff, (h >> 16) & 0xff]), body);
  };
  const BLOCK = 128 * 1024;
  if (head.length) block(zeros === 0, 0, head.length, head);
  for (let left = zeros; left > 0; left -= BLOCK) block(left <= BLOCK, 1, Math.min(BLOCK, left), Buffer.from([0]));
  return Buffer.concat(parts);
}

/** The TREE_MANIFEST wire form: `raw length u64 | zstd`. */
function treeWire(rawLen: number, head: Buffer, zeros: number): Buffer {
  const b = Buffer.alloc(8);
  b.writeBigUInt64LE(BigInt(rawLen));
  return Buffer.concat([b, zstdBomb(head, zeros)]);
}

/** A header claiming 50 M entries, a valid root entry, then zeros: passes the first checks. */
function plausibleHead(): Buffer {
  const h = Buffer.alloc(12 + 24);
  h.write('FFT1', 0, 'latin1');
  h[4] = 1;
  h.writeUInt32LE(50_000_000, 8);
  // root: path_len 0, kind dir (2), flags 0, mode 0o755, size 0, mtime 0
  h[12 + 2] = 2;
  h.writeUInt32LE(0o755, 12 + 4);
  return h;
}

const BOMBS: { name: string; wire: () => Buffer }[] = [
  { name: '2 GiB of zeros', wire: () => treeWire(2 * GiB, Buffer.alloc(0), 2 * GiB) },
  { name: 'a plausible header and root, then 2 GiB of zeros', wire: () => treeWire(2 * GiB, plausibleHead(), 2 * GiB - 36) },
];


/** Polls the victim's VmHWM (it only grows, so the last read before exit is its peak). */
function statusKiB(pid: number, field: string): number {
  const m = new RegExp(`${field}:\\s+(\\d+) kB`).exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Number(m[1]) : 0;
}

function watchPeak(p: Peer): { stop: () => number } {
  let peak = 0;
  const read = () => {
    try {
      const m = /VmHWM:\s+(\d+) kB/.exec(fs.readFileSync(`/proc/${p.child.pid}/status`, 'utf8'));
      if (m) peak = Math.max(peak, Number(m[1]));
    } catch {
      // exited between two polls
    }
  };
  const t = setInterval(read, 5);
  return {
    stop: () => {
      clearInterval(t);
      return peak;
    },
  };
}

const hello = (role: number) => encodeFrame(FrameType.HELLO, encodeHello({ minVersion: 1, maxVersion: 1, capabilities: 1, role, software: 'hostile' }));

describe('tree manifest bombs', () => {
  for (const bomb of BOMBS) {
    it(`a hostile sender's ${bomb.name}: the receiver exits 12 quickly, its peak RSS bounded, nothing written`, linuxOnly, async () => {
      const dir = tmpdir();
      const target = path.join(dir, 'target');
      fs.mkdirSync(target);
      fs.writeFileSync(path.join(target, 'keep.bin'), seeded(10_000, 1));
      const before = snapshot(dir);
      const { peer, port } = await startReceiver(target, ['--state-dir', path.join(tmpdir(), 'state')]);
      const watch = watchPeak(peer);
      const t0 = Date.now();
      const wire = bomb.wire();
      assert.ok(wire.length < 80 * 1024, `the bomb is ${wire.length} bytes on the wire`);
      const sock = net.connect({ host: '127.0.0.1', port });
      sock.on('error', () => undefined);
      await new Promise((r) => sock.once('connect', r));
      const next = frameReader(sock);
      sock.write(hello(Role.SENDER));
      sock.write(encodeFrame(FrameType.OFFER, encodeOffer({ kind: OfferKind.TREE, size: 0n, mtimeNs: 1n, mode: 0o755, flags: 0 })));
      sock.write(encodeFrame(FrameType.FILTER, Buffer.alloc(0)));
      for (const p of manifestFrames(wire)) sock.write(encodeFrame(FrameType.TREE_MANIFEST, p));
      // Keep reading until the receiver hangs up (so it is not stopped by a closed socket).
      const got: number[] = [];
      await (async () => {
        for (;;) got.push((await next()).type);
      })().catch(() => undefined);
      const r = await peer.done;
      const ms = Date.now() - t0;
      const peak = watch.stop();
      sock.destroy();
      console.log(`# receiver, ${bomb.name}: exit ${r.code} in ${ms} ms, peak RSS ${(peak / 1024).toFixed(1)} MiB`);
      assert.equal(r.code, 12, r.stderr);
      assert.match(r.stderr, /malformed tree manifest/);
      assert.ok(got.includes(FrameType.ERROR), 'the receiver told the sender why');
      assert.ok(ms < 10_000, `took ${ms} ms`);
      assert.ok(peak > 0, 'the receiver\'s memory could not be read');
      assert.ok(peak < PEAK_LIMIT_KIB, `receiver peak RSS ${(peak / 1024).toFixed(0)} MiB`);
      assert.deepEqual(snapshot(dir), before);
    });
  }

  it('three hostile pushes to a serve daemon: each refused with an ERROR, the daemon\'s memory bounded during and after', linuxOnly, async () => {
    const dir = tmpdir();
    const root = path.join(dir, 'root');
    fs.mkdirSync(root);
    const client = path.join(dir, 'client');
    const daemonState = path.join(dir, 'daemon');
    const id = (state: string) => {
      const r = spawnSync(process.execPath, [CLI, 'id', '--state-dir', state], { encoding: 'utf8' });
      assert.equal(r.status, 0, r.stderr);
      return r.stdout.trim();
    };
    id(daemonState);
    fs.writeFileSync(path.join(daemonState, 'serve-clients.conf'), `${id(client)} push /\n`);
    const d = run(['serve', root, '0', '--bind', '127.0.0.1', '--state-dir', daemonState, '--json', '--quiet', '--timeout', '20']);
    const port = (await d.waitFor((e) => e.event === 'listening')).port as number;
    const pid = d.child.pid!;
    const baseline = statusKiB(pid, 'VmRSS');
    const watch = watchPeak(d);
    const wire = BOMBS[1].wire();
    const push = async (k: number) => {
      const sock = tls.connect({ host: '127.0.0.1', port, cert: fs.readFileSync(path.join(client, 'identity', 'cert.pem')), key: fs.readFileSync(path.join(client, 'identity', 'key.pem')), rejectUnauthorized: false, minVersion: 'TLSv1.3' });
      sock.on('error', () => undefined);
      await new Promise((r) => sock.once('secureConnect', r));
      const next = frameReader(sock);
      sock.write(hello(Role.SENDER));
      const got: number[] = [];
      await (async () => {
        for (;;) {
          const f = await next();
          got.push(f.type);
          if (f.type === FrameType.HELLO) sock.write(encodeFrame(FrameType.REQUEST, encodeRequest({ op: RequestOp.PUSH, path: `t${k}` })));
          if (f.type === FrameType.ACCEPT) {
            sock.write(encodeFrame(FrameType.OFFER, encodeOffer({ kind: OfferKind.TREE, size: 0n, mtimeNs: 1n, mode: 0o755, flags: 0 })));
            sock.write(encodeFrame(FrameType.FILTER, Buffer.alloc(0)));
            for (const p of manifestFrames(wire)) sock.write(encodeFrame(FrameType.TREE_MANIFEST, p));
          }
        }
      })().catch(() => undefined);
      sock.destroy();
      return got;
    };
    const t0 = Date.now();
    const sessions = await Promise.all([0, 1, 2].map(push));
    const ms = Date.now() - t0;
    await new Promise((r) => setTimeout(r, 500));
    const peak = watch.stop();
    const after = statusKiB(pid, 'VmRSS');
    d.child.kill('SIGTERM');
    await d.done;
    console.log(`# serve daemon, 3 bombs: refused in ${ms} ms, peak RSS ${(peak / 1024).toFixed(1)} MiB, RSS before ${(baseline / 1024).toFixed(1)} MiB, after ${(after / 1024).toFixed(1)} MiB`);
    for (const got of sessions) assert.ok(got.includes(FrameType.ERROR), `the daemon refused the session: ${got}`);
    assert.ok(ms < 10_000, `took ${ms} ms`);
    assert.ok(peak > 0 && peak < PEAK_LIMIT_KIB, `daemon peak RSS ${(peak / 1024).toFixed(0)} MiB`);
    assert.ok(after < PEAK_LIMIT_KIB, `daemon RSS after the sessions ${(after / 1024).toFixed(0)} MiB`);
  });

  it('a hostile receiver\'s 2 GiB of zeros: the sender exits 12 quickly, its peak RSS bounded', linuxOnly, async () => {
    const src = tmpdir();
    fs.writeFileSync(path.join(src, 'a.bin'), seeded(10_000, 2));
    const server = net.createServer();
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    const port = (server.address() as net.AddressInfo).port;
    const served = new Promise<number[]>((resolve) => {
      server.once('connection', (sock) => {
        sock.on('error', () => undefined);
        const next = frameReader(sock);
        const got: number[] = [];
        void (async () => {
          sock.write(hello(Role.RECEIVER));
          for (;;) {
            const f = await next();
            got.push(f.type);
            if (f.type === FrameType.FILTER) {
              for (const p of manifestFrames(BOMBS[0].wire())) sock.write(encodeFrame(FrameType.TREE_MANIFEST, p));
            }
          }
        })().catch(() => resolve(got));
      });
    });
    const t0 = Date.now();
    const s = run(['send', src, `127.0.0.1:${port}`, '--plaintext', '--json', '--timeout', '20', '--state-dir', path.join(tmpdir(), 'ss')]);
    const watch = watchPeak(s);
    const r = await s.done;
    const ms = Date.now() - t0;
    const peak = watch.stop();
    const got = await Promise.race([served, new Promise<number[]>((res) => setTimeout(() => res([]), 3000))]);
    server.close();
    console.log(`# sender, 2 GiB of zeros: exit ${r.code} in ${ms} ms, peak RSS ${(peak / 1024).toFixed(1)} MiB`);
    assert.equal(r.code, 12, r.stderr);
    assert.match(r.stderr, /malformed tree manifest/);
    assert.ok(got.includes(FrameType.ERROR), 'the sender told the receiver why');
    assert.ok(ms < 10_000, `took ${ms} ms`);
    assert.ok(peak > 0 && peak < PEAK_LIMIT_KIB, `sender peak RSS ${(peak / 1024).toFixed(0)} MiB`);
  });
});
