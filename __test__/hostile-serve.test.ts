// Hostile clients against a `serve` daemon (issue 17 §2, §3): connections that never
// authenticate cannot take its session slots, must finish TLS + HELLO + REQUEST within the
// handshake deadline, may not send KEEPALIVE before HELLO, and an authorized client that
// only sends KEEPALIVEs loses its path's write lock after the stall limit.
// FFSYNC_TEST_CLI=<path to another dist/cli/main.js> runs the same tests against another build.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import tls from 'node:tls';
import { describe, test } from 'node:test';
import { CLI, type Peer, type PeerResult, run, seeded, sha256, tmpdir } from './helpers/peers.js';
import { frameReaderOrEnd } from './helpers/raw-peer.js';
import { encodeFrame, FrameType } from '../ts/protocol/frames.js';
import { encodeHello, encodeRequest, OUR_CAPABILITIES, RequestOp, Role } from '../ts/protocol/messages.js';

const cli = process.env.FFSYNC_TEST_CLI ?? CLI;

/** The CLI under test: this build, or another one (FFSYNC_TEST_CLI, to show a test fails there). */
function runCli(args: string[]): Peer {
  return run(args, {}, cli);
}

function id(state: string): string {
  const r = spawnSync(process.execPath, [cli, 'id', '--state-dir', state], { encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  return r.stdout.trim();
}

function identity(state: string): { key: Buffer; cert: Buffer } {
  return { key: fs.readFileSync(path.join(state, 'identity', 'key.pem')), cert: fs.readFileSync(path.join(state, 'identity', 'cert.pem')) };
}

interface Daemon {
  peer: Peer;
  port: number;
  fp: string;
  root: string;
  dir: string;
  /** An authorized client's state directory (push, pull on everything). */
  client: string;
  /** A state directory whose certificate the daemon does not know. */
  stranger: string;
}

async function startDaemon(args: string[] = []): Promise<Daemon> {
  const dir = tmpdir();
  const root = path.join(dir, 'root');
  fs.mkdirSync(root);
  const state = path.join(dir, 'd');
  const fp = id(state);
  const client = path.join(dir, 'a');
  const stranger = path.join(dir, 'x');
  id(stranger);
  fs.writeFileSync(path.join(state, 'serve-clients.conf'), `${id(client)} push,pull /\n`);
  const peer = runCli(['serve', root, '0', '--bind', '127.0.0.1', '--state-dir', state, '--json', '--quiet', '--timeout', '20', ...args]);
  const ev = await peer.waitFor((e) => e.event === 'listening');
  return { peer, port: ev.port, fp, root, dir, client, stranger };
}

async function stop(d: Daemon): Promise<void> {
  d.peer.child.kill('SIGKILL');
  await d.peer.done;
}

function push(d: Daemon, src: string, remote: string): Promise<PeerResult> {
  return runCli(['send', src, `127.0.0.1:${d.port}/${remote}`, '--state-dir', d.client, '--trust', d.fp, '--json', '--timeout', '20']).done;
}

/** A raw TLS client speaking frames by hand. */
interface Raw {
  sock: tls.TLSSocket;
  /** Next frame; undefined once the daemon closed the connection. */
  next(ms?: number): Promise<{ type: number; payload: Buffer } | undefined>;
  closed: Promise<void>;
}

async function rawTls(port: number, who: { key: Buffer; cert: Buffer }, localAddress?: string): Promise<Raw> {
  // localAddress reaches net.connect (the typings of tls.connect leave it out).
  const opts = { host: '127.0.0.1', port, localAddress, ...who, rejectUnauthorized: false, minVersion: 'TLSv1.3' as const, checkServerIdentity: () => undefined };
  const sock = tls.connect(opts as tls.ConnectionOptions);
  sock.on('error', () => undefined);
  const closed = new Promise<void>((r) => sock.once('close', () => r()));
  await new Promise<void>((resolve, reject) => {
    sock.once('secureConnect', () => resolve());
    sock.once('close', () => reject(new Error('closed before the TLS handshake completed')));
  });
  const next = frameReaderOrEnd(sock);
  return { sock, next, closed };
}

const hello = (role: number) => encodeFrame(FrameType.HELLO, encodeHello({ minVersion: 1, maxVersion: 1, capabilities: OUR_CAPABILITIES, role, software: 'hostile' }));
const keepAlive = encodeFrame(FrameType.KEEPALIVE);

function within<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let t: NodeJS.Timeout;
  return Promise.race([p, new Promise<T>((_, reject) => (t = setTimeout(() => reject(new Error(`${what}: not within ${ms} ms`)), ms)))]).finally(() => clearTimeout(t));
}

describe('serve: unauthenticated connections', { timeout: 120_000 }, () => {
  test('70 unauthenticated TLS connections (no HELLO, KEEPALIVE every 500 ms) and 100 bare TCP ones do not keep an authorized client out', async () => {
    const d = await startDaemon(['--max-sessions', '8']);
    const src = path.join(d.dir, 'f.bin');
    fs.writeFileSync(src, seeded(200_000, 1));
    const strangers: Raw[] = [];
    const bare: net.Socket[] = [];
    let ticker: NodeJS.Timeout | undefined;
    try {
      const who = identity(d.stranger);
      // From other loopback addresses than the client's, as an attacker's would be.
      for (let i = 0; i < 70; i++) {
        const r = await rawTls(d.port, who, `127.0.0.${2 + (i % 8)}`).catch(() => undefined);
        if (r) strangers.push(r);
      }
      ticker = setInterval(() => strangers.forEach((s) => s.sock.writable && s.sock.write(keepAlive)), 500);
      for (let i = 0; i < 100; i++) {
        const s = net.connect({ host: '127.0.0.1', port: d.port, localAddress: `127.0.0.${10 + (i % 10)}` });
        s.on('error', () => undefined);
        bare.push(s);
      }
      await new Promise((r) => setTimeout(r, 1000));
      assert.ok(strangers.length >= 64, `only ${strangers.length} of 70 TLS connections were accepted`);
      const t0 = Date.now();
      const r = await within(push(d, src, 'in/f.bin'), 15_000, 'the authorized push');
      assert.equal(r.code, 0, `an authorized client was kept out by unauthenticated connections: ${r.stderr}`);
      assert.ok(Date.now() - t0 < 5000, `served after ${Date.now() - t0} ms`);
      assert.equal(sha256(path.join(d.root, 'in/f.bin')), sha256(src));
    } finally {
      clearInterval(ticker);
      strangers.forEach((s) => s.sock.destroy());
      bare.forEach((s) => s.destroy());
      await stop(d);
    }
  });

  test('KEEPALIVE before HELLO is a protocol error (ERROR EPROTO, logged with exit 12)', async () => {
    const d = await startDaemon();
    try {
      const r = await rawTls(d.port, identity(d.client));
      r.sock.write(keepAlive);
      const f = await r.next(3000);
      assert.ok(f, 'the daemon closed without a word');
      assert.equal(f.type, FrameType.ERROR);
      assert.match(f.payload.toString('latin1'), /EPROTO.*KEEPALIVE before the peer's HELLO/);
      await within(r.closed, 3000, 'the daemon hanging up');
      const line = await within(
        d.peer.waitFor((e) => e.event === 'session' && e.exitCode === 12),
        3000,
        'the session line',
      );
      assert.match(line.error, /KEEPALIVE before/);
    } finally {
      await stop(d);
    }
  });

  test('handshake deadline: a TLS client that never sends HELLO, one that stops after HELLO, and a TCP connection that never starts TLS are all dropped within the deadline (default 5 s)', async () => {
    const d = await startDaemon();
    try {
      const t0 = Date.now();
      const silent = await rawTls(d.port, identity(d.client));
      const halfway = await rawTls(d.port, identity(d.client));
      halfway.sock.write(hello(Role.SENDER));
      assert.equal((await halfway.next(3000))?.type, FrameType.HELLO);
      // HELLO done, no REQUEST: KEEPALIVE (allowed now) does not extend the deadline.
      const ticker = setInterval(() => halfway.sock.writable && halfway.sock.write(keepAlive), 300);
      const tcp = net.connect({ host: '127.0.0.1', port: d.port });
      tcp.on('error', () => undefined);
      const tcpClosed = new Promise<void>((r) => tcp.once('close', () => r()));
      try {
        const f = await silent.next(9000);
        assert.equal(f?.type, FrameType.ERROR, 'a TLS client told why');
        assert.match(f!.payload.toString('latin1'), /ETIMEDOUT.*handshake not completed within 5 s/);
        await within(Promise.all([silent.closed, halfway.closed, tcpClosed]), 9000 - (Date.now() - t0), 'all three dropped');
        const took = Date.now() - t0;
        assert.ok(took >= 4000 && took < 8500, `dropped after ${took} ms`);
      } finally {
        clearInterval(ticker);
        tcp.destroy();
      }
    } finally {
      await stop(d);
    }
  });
});

describe('serve: KEEPALIVE is not progress', { timeout: 120_000 }, () => {
  test('an authorized client that only sends KEEPALIVEs after ACCEPT loses the write lock after the stall limit (4 × --timeout)', async () => {
    const d = await startDaemon(['--timeout', '1']);
    const src = path.join(d.dir, 'f.bin');
    fs.writeFileSync(src, seeded(300_000, 2));
    try {
      const h = await rawTls(d.port, identity(d.client));
      h.sock.write(hello(Role.SENDER));
      assert.equal((await h.next())?.type, FrameType.HELLO);
      h.sock.write(encodeFrame(FrameType.REQUEST, encodeRequest({ op: RequestOp.PUSH, path: 'locked/f.bin' })));
      assert.equal((await h.next())?.type, FrameType.ACCEPT);
      const t0 = Date.now();
      const ticker = setInterval(() => h.sock.writable && h.sock.write(keepAlive), 200);
      try {
        // A real client for the same path waits for the lock, then is served.
        const r = await within(push(d, src, 'locked/f.bin'), 15_000, 'the waiting push');
        assert.equal(r.code, 0, r.stderr);
        const took = Date.now() - t0;
        assert.ok(took >= 3500 && took < 9000, `lock released after ${took} ms (stall limit 4 s)`);
        assert.equal(sha256(path.join(d.root, 'locked/f.bin')), sha256(src));
        const line = await d.peer.waitFor((e) => e.event === 'session' && e.exitCode === 30);
        assert.match(line.error, /no progress/);
      } finally {
        clearInterval(ticker);
        h.sock.destroy();
      }
    } finally {
      await stop(d);
    }
  });
});

describe('serve: waiting for a lock', { timeout: 60_000 }, () => {
  test('a client that hangs up while waiting for a path lock withdraws its request at once (slot and queue place freed)', async () => {
    const d = await startDaemon(['--timeout', '2']);
    const who = identity(d.client);
    const request = async () => {
      const r = await rawTls(d.port, who);
      r.sock.write(hello(Role.SENDER));
      assert.equal((await r.next())?.type, FrameType.HELLO);
      r.sock.write(encodeFrame(FrameType.REQUEST, encodeRequest({ op: RequestOp.PUSH, path: 'busy/f.bin' })));
      return r;
    };
    try {
      const holder = await request();
      assert.equal((await holder.next())?.type, FrameType.ACCEPT);
      const ticker = setInterval(() => holder.sock.writable && holder.sock.write(keepAlive), 200);
      try {
        const waiter = await request();
        await new Promise((r) => setTimeout(r, 500));
        const t0 = Date.now();
        waiter.sock.destroy();
        const line = await within(
          d.peer.waitFor((e) => e.event === 'session' && e.path === 'busy/f.bin' && e.exitCode !== 30),
          3000,
          'the waiter logged as gone',
        );
        assert.match(line.error, /closed|lock/);
        assert.ok(Date.now() - t0 < 3000);
      } finally {
        clearInterval(ticker);
        holder.sock.destroy();
      }
    } finally {
      await stop(d);
    }
  });
});
