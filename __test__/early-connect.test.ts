// A plain `send` opens its TCP connection before the program loads (ts/cli/early-connect.ts,
// decisions §110), and the program's first connect to that address takes it
// (ts/transport/early-connect.ts). What can go wrong: a guess from argv that stops matching what
// the program connects to costs the round trip without any other sign; a connection opened and
// never used ends a waiting `receive` (its first connection is its session). So the CLI runs here
// with a --require hook that reports at exit whether the connection was taken, for each argument
// form the reader accepts, and the reader is checked to start nothing wherever the program might
// not connect.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import net from 'node:net';
import tls from 'node:tls';
import path from 'node:path';
import { describe, it } from 'node:test';
import { planEarlyConnect } from '../ts/cli/early-connect';
import { handshakeMs } from '../ts/transport/handshake-time';
import { tlsConnect } from '../ts/transport/tls';
import { loadOrCreateIdentity } from '../ts/security/identity';
import { earlyConnectionCounts, offerEarlyConnection, takeEarlyConnection } from '../ts/transport/early-connect';
import { hashTree } from './helpers/data';
import { run, tmpdir, unusedPort } from './helpers/peers';

/** `receive` and `send` over TLS (the helpers in ./helpers/peers add --plaintext, over which no
 * early connection is made). */
async function tlsReceiver(target: string, args: string[]): Promise<{ peer: ReturnType<typeof run>; port: number }> {
  const peer = run(['receive', target, '0', '--json', '--timeout', '20', ...args]);
  const ev = await peer.waitFor((e) => e.event === 'listening');
  return { peer, port: ev.port as number };
}
const tlsSender = (source: string, port: number, args: string[], env: NodeJS.ProcessEnv = {}) => run(['send', source, `127.0.0.1:${port}`, '--timeout', '20', ...args], env);

const HOOK = `
const fs = require('node:fs');
process.once('exit', () => {
  const r = process[Symbol.for('ffsync-native.early-connect')];
  fs.writeFileSync(process.env.FFSYNC_TEST_EARLY, JSON.stringify(r ? { taken: r.taken, left: Boolean(r.offered) } : null));
});
`;

const argv = (...a: string[]) => ['node', 'main.js', ...a];
const FP = 'AB'.repeat(32);

function hooked(dir: string): { env: NodeJS.ProcessEnv; early: () => { taken: number; left: boolean } | null } {
  const hook = path.join(dir, 'hook.cjs');
  fs.writeFileSync(hook, HOOK);
  const out = path.join(dir, 'early.json');
  fs.rmSync(out, { force: true });
  return { env: { NODE_OPTIONS: `--require ${hook}`, FFSYNC_TEST_EARLY: out }, early: () => JSON.parse(fs.readFileSync(out, 'utf8')) };
}

describe('early connection of a send', { skip: process.platform !== 'linux' && 'the kernel tells the round trip on Linux only' }, () => {
  it('the program takes the connection started from argv (a file and a tree); the result is whole', async () => {
    const dir = tmpdir();
    const src = path.join(dir, 'src');
    fs.mkdirSync(path.join(src, 'sub'), { recursive: true });
    for (let i = 0; i < 12; i++) fs.writeFileSync(path.join(src, i % 2 ? 'sub' : '', `f${i}.txt`), `file ${i}\n`.repeat(200 * (i + 1)));
    const fps = { s: path.join(dir, 'state-s'), r: path.join(dir, 'state-r') };
    const id = (state: string) => run(['id', '--state-dir', state]).done.then((r) => r.stdout.trim().split(/\s+/).pop()!);
    const [fpS, fpR] = [await id(fps.s), await id(fps.r)];
    const forms: { name: string; src: string; recv: string[]; send: string[] }[] = [
      { name: 'TLS tree', src: `${src}/`, recv: ['--trust', fpS], send: ['--trust', fpR, '-q'] },
      { name: 'TLS tree, --json, --timeout=30', src, recv: ['--trust', fpS], send: ['--trust', fpR, '--json', '--timeout=30'] },
      { name: 'plaintext tree (no early connection)', src, recv: ['--plaintext'], send: ['--plaintext', '-q'] },
      { name: 'TLS file, -qc', src: path.join(src, 'f0.txt'), recv: ['--trust', fpS], send: ['-qc', '--trust', fpR, '--compress-level', '3'] },
    ];
    for (const f of forms) {
      const dst = path.join(dir, `dst-${forms.indexOf(f)}`);
      const { peer, port } = await tlsReceiver(dst, ['--state-dir', fps.r, ...f.recv]);
      const h = hooked(dir);
      const s = await tlsSender(f.src, port, ['--state-dir', fps.s, ...f.send], h.env).done;
      const r = await peer.done;
      assert.equal(s.code, 0, `${f.name}: ${s.stderr}`);
      assert.equal(r.code, 0, `${f.name}: ${r.stderr}`);
      assert.deepEqual(h.early(), f.recv.includes('--plaintext') ? null : { taken: 1, left: false }, `${f.name}: the early connection was the session's`);
      if (f.src.endsWith('.txt')) assert.ok(fs.readFileSync(dst).equals(fs.readFileSync(f.src)));
      else assert.deepEqual(hashTree(dst), hashTree(src));
    }
  });

  it('a TLS receive ignores a connection that closes before its first byte (an early one a sender gave up), and serves the next', async () => {
    const dir = tmpdir();
    fs.writeFileSync(path.join(dir, 'f'), 'payload\n'.repeat(1000));
    const st = { s: path.join(dir, 'state-s'), r: path.join(dir, 'state-r') };
    const id = (state: string) => run(['id', '--state-dir', state]).done.then((r) => r.stdout.trim().split(/\s+/).pop()!);
    const [fpS, fpR] = [await id(st.s), await id(st.r)];
    const dst = path.join(dir, 'out');
    const { peer, port } = await tlsReceiver(dst, ['--state-dir', st.r, '--trust', fpS]);
    for (const close of ['end', 'destroy'] as const) {
      const probe = net.connect({ host: '127.0.0.1', port });
      await new Promise<void>((r) => probe.once('connect', () => r()));
      await new Promise<void>((r) => {
        probe.once('close', () => r());
        probe[close]();
      });
    }
    await new Promise((r) => setTimeout(r, 100));
    const s = await tlsSender(path.join(dir, 'f'), port, ['--state-dir', st.s, '--trust', fpR]).done;
    const r = await peer.done;
    assert.equal(s.code, 0, s.stderr);
    assert.equal(r.code, 0, r.stderr);
    assert.ok(fs.readFileSync(dst).equals(fs.readFileSync(path.join(dir, 'f'))));
  });

  it('a send to nobody: the early connection fails, the program connects itself and says so (exit 10), and exits', async () => {
    const dir = tmpdir();
    fs.writeFileSync(path.join(dir, 'f'), 'x');
    const port = await unusedPort();
    const h = hooked(dir);
    const s = await run(['send', path.join(dir, 'f'), `127.0.0.1:${port}`, '--state-dir', path.join(dir, 'st')], h.env).done;
    assert.equal(s.code, 10, s.stderr);
    assert.match(s.stderr, new RegExp(`connecting to 127\\.0\\.0\\.1:${port}.*(refused|ECONNREFUSED)`, 'i'));
    // Taken while still connecting, or found failed: either way the program's own connect reported it.
    assert.equal(h.early()?.left, false);
  });
});

describe('planEarlyConnect', () => {
  const dir = tmpdir();
  const file = path.join(dir, 'f');
  fs.writeFileSync(file, 'x');

  it('names the address for the forms the program connects with, whatever options it takes without a check', () => {
    const yes = [
      argv('send', file, '127.0.0.1:7788'),
      argv('send', file, '10.0.0.5:7788/some/path', '--trust', FP, '--state-dir', dir, '-q'),
      argv('send', '--json', file, 'example.com:7788', '--timeout', '30', '--bwlimit=100', '--parallel', '4', '-cnv'),
      argv('send', dir, '[::1]:7788', '--no-compress', '--no-delete', '--no-overlap', '--stats', '--progress-interval', '2', '--compress-level', '19'),
    ];
    const want = [
      ['127.0.0.1', 7788],
      ['10.0.0.5', 7788],
      ['example.com', 7788],
      ['::1', 7788],
    ];
    yes.forEach((a, i) => assert.deepEqual(planEarlyConnect(a, 'linux'), { host: want[i]![0], port: want[i]![1] }, a.slice(2).join(' ')));
  });

  it('starts nothing where the program might not connect, or over plaintext: other commands, --pair, --quic, --plaintext, unknown options, bad values, a missing source, other platforms', () => {
    const none = [
      argv('receive', dir, '7788'),
      argv('sync', file, 'host:dst'),
      argv('send', file, '127.0.0.1:7788', '--pair', '7-amber-orbit'),
      argv('send', file, '127.0.0.1:7788', '--quic'),
      argv('send', file, '127.0.0.1:7788', '--plaintext'),
      argv('send', file, '127.0.0.1:7788', '--exclude-from', 'list'),
      argv('send', file, '127.0.0.1:7788', '--exclude', '*.o'),
      argv('send', file, '127.0.0.1:7788', '--max-size', '1M'),
      argv('send', file, '127.0.0.1:7788', '--timeout', '0'),
      argv('send', file, '127.0.0.1:7788', '--timeout', 'soon'),
      argv('send', file, '127.0.0.1:7788', '--trust', 'not-a-fingerprint'),
      argv('send', file, '127.0.0.1:7788', '--parallel', '17'),
      argv('send', file, '127.0.0.1:7788', '--state-dir'),
      argv('send', file, '127.0.0.1:7788', '-x'),
      argv('send', file, '127.0.0.1:7788', '--json=1'),
      argv('send', file, '127.0.0.1:7788', '--', 'extra'),
      argv('send', file, '127.0.0.1:0'),
      argv('send', file, '127.0.0.1'),
      argv('send', file),
      argv('send', path.join(dir, 'none'), '127.0.0.1:7788'),
      argv('send', '--help'),
    ];
    for (const a of none) assert.equal(planEarlyConnect(a, 'linux'), undefined, a.slice(2).join(' '));
    assert.equal(planEarlyConnect(argv('send', file, '127.0.0.1:7788'), 'darwin'), undefined, 'no kernel RTT: no early connection');
  });
});

describe('the hand-over', () => {
  it('goes to the first connect to exactly that address, once; its handshake time is the kernel round trip', async () => {
    // The program's TLS connect takes it (a plaintext send makes none): TLS starts on that socket.
    const id = loadOrCreateIdentity(tmpdir());
    const server = tls.createServer({ key: id.keyPem, cert: id.certPem, minVersion: 'TLSv1.3' }, (s) => s.on('error', () => undefined));
    let connections = 0;
    server.on('connection', () => connections++);
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    const port = (server.address() as net.AddressInfo).port;
    try {
      const before = earlyConnectionCounts().taken;
      const early = net.connect({ host: '127.0.0.1', port });
      offerEarlyConnection('127.0.0.1', port, early);
      assert.equal(takeEarlyConnection('127.0.0.1', port + 1), undefined, 'another port: not this connection');
      assert.equal(takeEarlyConnection('localhost', port), undefined, 'another host string: not this connection');
      // The program takes it well after its TCP handshake (it was loading meanwhile).
      await new Promise((r) => setTimeout(r, 150));
      const sock = await tlsConnect('127.0.0.1', port, id);
      assert.equal(connections, 1, "the program's connect took it: no second connection");
      assert.equal(earlyConnectionCounts().taken, before + 1);
      assert.equal(earlyConnectionCounts().left, false);
      const ms = handshakeMs(sock);
      assert.ok(ms !== undefined && ms >= 0 && ms < 50, `loopback handshake ${ms} ms: the kernel's RTT and TLS's own time, not the 150 ms wait for the program`);
      const again = await tlsConnect('127.0.0.1', port, id);
      assert.equal(connections, 2, 'taken once: the next connect dials');
      sock.destroy();
      again.destroy();
    } finally {
      server.close();
    }
  });

  it('a connection that failed before it was taken is not handed out, and its error is no uncaught one', async () => {
    const port = await unusedPort();
    offerEarlyConnection('127.0.0.1', port, net.connect({ host: '127.0.0.1', port }));
    await new Promise((r) => setTimeout(r, 50));
    assert.equal(takeEarlyConnection('127.0.0.1', port), undefined);
    assert.equal(earlyConnectionCounts().left, false);
  });
});
