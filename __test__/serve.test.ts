// `serve`: authorization (allowed, wrong prefix, unknown, revoked, reload), start-up
// errors, pull, concurrent writers and readers on one path, graceful shutdown mid-transfer,
// hostile paths, and a short version of the load test (bench/serve-load.ts is the full one).
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { describe, test } from 'node:test';
import { isDeepStrictEqual } from 'node:util';
import { CLI, modify, type Peer, type PeerResult, run, seeded, sha256, snapshot, tmpdir } from './helpers/peers.js';
import { authorize, normalizeRequestPath, parseConfig } from '../ts/serve/authorization.js';
import { PathLocks } from '../ts/serve/path-locks.js';
import { parseRemote } from '../ts/transport/tcp.js';
import { decodeRequest, encodeRequest, RequestOp } from '../ts/protocol/messages.js';
import { runServeLoad } from '../bench/serve-load-runner.js';

function id(state: string): string {
  const r = spawnSync(process.execPath, [CLI, 'id', '--state-dir', state], { encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  return r.stdout.trim();
}

interface Daemon {
  peer: Peer;
  port: number;
  fp: string;
  state: string;
}

async function startDaemon(root: string, state: string, config: string, args: string[] = []): Promise<Daemon> {
  const fp = id(state);
  fs.writeFileSync(path.join(state, 'serve-clients.conf'), config);
  const peer = run(['serve', root, '0', '--bind', '127.0.0.1', '--state-dir', state, '--json', '--quiet', '--timeout', '20', ...args]);
  const ev = await peer.waitFor((e) => e.event === 'listening');
  return { peer, port: ev.port, fp, state };
}

/** Collects the daemon's JSON lines (run() keeps them on the result; this reads them live). */
async function sessionLine(d: Daemon, pred: (e: Record<string, any>) => boolean): Promise<Record<string, any>> {
  return d.peer.waitFor((e) => e.event === 'session' && pred(e));
}

/** A root, one client identity and a daemon whose config is `grants(clientFingerprint)`. */
async function oneClient(grants: (fp: string) => string, args: string[] = []): Promise<{ dir: string; root: string; sa: string; d: Daemon }> {
  const dir = tmpdir();
  const root = path.join(dir, 'root');
  fs.mkdirSync(root);
  const sa = path.join(dir, 'a');
  const d = await startDaemon(root, path.join(dir, 'd'), grants(id(sa)), args);
  return { dir, root, sa, d };
}

function client(d: Daemon, state: string, args: string[]): Peer {
  return run([...args, '--state-dir', state, '--trust', d.fp, '--json', '--timeout', '20']);
}

function push(d: Daemon, state: string, src: string, remote: string, extra: string[] = []): Promise<PeerResult> {
  return client(d, state, ['send', src, `127.0.0.1:${d.port}/${remote}`, ...extra]).done;
}

function pull(d: Daemon, state: string, remote: string, local: string, extra: string[] = []): Promise<PeerResult> {
  return client(d, state, ['pull', `127.0.0.1:${d.port}/${remote}`, local, ...extra]).done;
}

async function stop(d: Daemon): Promise<PeerResult> {
  d.peer.child.kill('SIGTERM');
  return d.peer.done;
}

function makeTree(dir: string, files: number, seed: number): void {
  for (let i = 0; i < files; i++) {
    fs.mkdirSync(path.join(dir, `d${i % 4}`), { recursive: true });
    fs.writeFileSync(path.join(dir, `d${i % 4}`, `f${i}`), seeded(1000 + ((i * 7919) % 20000), seed * 1000 + i));
  }
}

describe('serve: the authorization config', () => {
  const A = 'AA'.repeat(32);
  const B = 'BB'.repeat(32);
  const fpA = parseConfig(`${A} push x`, 'f').clients.keys().next().value!;

  test('grants by access and segment-wise prefix, and revocation wins over an entry', () => {
    const c = parseConfig(`# comment\n${A} push,pull builds/app releases  # runner\n${B} pull /\nrevoke ${B}\n`, 'serve-clients.conf');
    assert.equal(authorize(c, fpA, 'push', 'builds/app/x.tar').ok, true);
    assert.equal(authorize(c, fpA, 'push', 'builds/app').ok, true);
    assert.equal(authorize(c, fpA, 'pull', 'releases').ok, true);
    const sibling = authorize(c, fpA, 'push', 'builds/app2');
    assert.equal(sibling.ok, false);
    assert.match((sibling as any).reason, /outside the prefixes granted/);
    assert.equal(authorize(c, fpA, 'push', 'builds').ok, false, 'an ancestor of a granted prefix is not granted');
    const revoked = authorize(c, [...c.revoked.keys()][0], 'pull', 'anything');
    assert.deepEqual([revoked.ok, (revoked as any).code], [false, 'EREVOKED']);
    const unknown = authorize(c, 'CC'.repeat(32).match(/.{4}/g)!.join('-'), 'pull', 'releases');
    assert.deepEqual([unknown.ok, (unknown as any).code], [false, 'EUNKNOWNCLIENT']);
    assert.equal(c.clients.get(fpA)!.note, 'runner');
  });

  test('a malformed line is reported with file, line and reason', () => {
    const cases: [string, RegExp][] = [
      [`${A} push`, /f:1: expected '<fingerprint> <push\|pull/],
      [`\n${A} write x`, /f:2: unknown access 'write'/],
      [`nothex push x`, /f:1: 'nothex' is not a fingerprint/],
      [`${A} push ../x`, /f:1: prefix '\.\.\/x': .*'\.\.' segment/],
      [`${A} push x\n${A} pull y`, /f:2: .* already listed on line 1/],
      [`revoke`, /f:1: expected 'revoke <fingerprint>'/],
    ];
    for (const [text, re] of cases) assert.throws(() => parseConfig(text, 'f'), re, text);
  });

  test('request paths are normalized and can never leave the root', () => {
    assert.equal(normalizeRequestPath('/a//b/'), 'a/b');
    assert.equal(normalizeRequestPath(''), '');
    for (const bad of ['a/../b', '..', './a', 'a\\b', 'a\0b']) assert.throws(() => normalizeRequestPath(bad), /segment|backslash|NUL/, bad);
  });

  test('REQUEST frames round-trip and hostile ones are refused', () => {
    assert.deepEqual(decodeRequest(encodeRequest({ op: RequestOp.PULL, path: 'a/b' })), { op: RequestOp.PULL, path: 'a/b' });
    const good = encodeRequest({ op: RequestOp.PUSH, path: 'x' });
    assert.throws(() => decodeRequest(good.subarray(0, 3)), /too short/);
    assert.throws(() => decodeRequest(Buffer.concat([good, Buffer.from('y')])), /bad length/);
    const op = Buffer.from(good);
    op[0] = 9;
    assert.throws(() => decodeRequest(op), /unknown operation 9/);
    const flags = Buffer.from(good);
    flags[1] = 1;
    assert.throws(() => decodeRequest(flags), /unknown flags/);
    const utf = Buffer.from([1, 0, 2, 0, 0xff, 0xfe]);
    assert.throws(() => decodeRequest(utf), /not UTF-8/);
    assert.throws(() => encodeRequest({ op: RequestOp.PUSH, path: 'x'.repeat(5000) }), /longer than 4096/);
  });

  test('remote addresses: host:port, host:port/path, [v6]:port/path', () => {
    assert.deepEqual(parseRemote('h:7788'), { host: 'h', port: 7788, path: undefined });
    assert.deepEqual(parseRemote('h:7788/a/b'), { host: 'h', port: 7788, path: 'a/b' });
    assert.deepEqual(parseRemote('h:7788/'), { host: 'h', port: 7788, path: '' });
    assert.deepEqual(parseRemote('[::1]:9/x'), { host: '::1', port: 9, path: 'x' });
    assert.throws(() => parseRemote('h/x'), /expected host:port/);
  });

  test('path locks: writers exclude overlapping paths in arrival order, readers share', async () => {
    const locks = new PathLocks();
    const order: string[] = [];
    const w1 = await locks.acquire('a/b', 'write');
    const r1 = locks.acquire('a', 'read').then((rel) => (order.push('read a'), rel));
    const w2 = locks.acquire('a/b/c', 'write').then((rel) => (order.push('write a/b/c'), rel));
    const other = await locks.acquire('z', 'write'); // unrelated path: granted at once
    order.push('write z');
    await new Promise((r) => setTimeout(r, 20));
    assert.deepEqual(order, ['write z'], 'overlapping requests wait for the writer');
    w1();
    (await r1)();
    (await w2)();
    other();
    assert.deepEqual(order, ['write z', 'read a', 'write a/b/c']);
    const ra = await locks.acquire('a', 'read');
    const rb = await locks.acquire('a/b', 'read'); // readers share
    ra();
    rb();
    assert.equal(locks.pending, 0);
  });
});

describe('serve: sessions', { timeout: 300_000 }, () => {
  test('authorization end to end: allowed push and pull, wrong prefix, unknown client, push-only client; each refusal is told and logged', async () => {
    const dir = tmpdir();
    const root = path.join(dir, 'root');
    fs.mkdirSync(root);
    const [sa, sb, sc] = ['a', 'b', 'c'].map((n) => path.join(dir, n));
    const [fa, fb] = [id(sa), id(sb)];
    id(sc);
    const d = await startDaemon(root, path.join(dir, 'd'), `${fa} push,pull builds # runner-a\n${fb} pull builds\n`);
    const src = path.join(dir, 'app.bin');
    fs.writeFileSync(src, seeded(3 << 20, 1));
    try {
      const ok = await push(d, sa, src, 'builds/v1/app.bin');
      assert.equal(ok.code, 0, ok.stderr);
      assert.equal(sha256(path.join(root, 'builds/v1/app.bin')), sha256(src));
      const line = await sessionLine(d, (e) => e.path === 'builds/v1/app.bin');
      assert.equal(line.ok, true);
      assert.equal(line.client, fa);
      assert.equal(line.clientNote, 'runner-a');
      assert.equal(line.op, 'push');
      assert.equal(line.bytesWritten, 3 << 20);
      assert.ok(line.bytesOnWire.received > 3 << 20 && line.durationMs >= 0);

      const wrong = await push(d, sa, src, 'elsewhere/app.bin');
      assert.equal(wrong.code, 5);
      assert.match(wrong.stderr, /refused: 'elsewhere\/app.bin' is outside the prefixes granted/);
      assert.equal(fs.existsSync(path.join(root, 'elsewhere')), false);
      const wrongLine = await sessionLine(d, (e) => e.path === 'elsewhere/app.bin');
      assert.deepEqual([wrongLine.ok, wrongLine.exitCode], [false, 5]);
      assert.match(wrongLine.error, /outside the prefixes/);

      const unknown = await push(d, sc, src, 'builds/x.bin');
      assert.equal(unknown.code, 5);
      assert.match(unknown.stderr, /is not authorized on this server/);
      assert.match((await sessionLine(d, (e) => e.path === 'builds/x.bin')).error, /not authorized/);

      const pullOnly = await push(d, sb, src, 'builds/y.bin');
      assert.equal(pullOnly.code, 5);
      assert.match(pullOnly.stderr, /may not push \(it may pull\)/);

      const got = path.join(dir, 'got.bin');
      const p = await pull(d, sb, 'builds/v1/app.bin', got);
      assert.equal(p.code, 0, p.stderr);
      assert.equal(sha256(got), sha256(src));

      // No path: told to address one (exit 1) before anything is sent.
      const noPath = await client(d, sa, ['send', src, `127.0.0.1:${d.port}`]).done;
      assert.equal(noPath.code, 1);
      assert.match(noPath.stderr, /is a serve daemon: address a path under its root/);
    } finally {
      assert.equal((await stop(d)).code, 0);
    }
  });

  test('revocation and reload: SIGHUP applies an edited config, a malformed one is refused and the previous config stays', async () => {
    const { dir, root, sa, d } = await oneClient((fp) => `${fp} push one\n`);
    const fa = id(sa);
    const conf = path.join(d.state, 'serve-clients.conf');
    const src = path.join(dir, 'f');
    fs.writeFileSync(src, 'hello');
    const reloaded = async (ok: boolean) => {
      const before = d.peer.events.length;
      d.peer.child.kill('SIGHUP');
      return d.peer.waitFor((e) => e.event === 'notice' && e.reload === ok && d.peer.events.indexOf(e) >= before);
    };
    try {
      assert.equal((await push(d, sa, src, 'two/f')).code, 5);
      fs.writeFileSync(conf, `${fa} push one two\n`);
      assert.match((await reloaded(true)).message, /reloaded .*1 clients, 0 revoked/);
      assert.equal((await push(d, sa, src, 'two/f')).code, 0);

      fs.writeFileSync(conf, `${fa} push one two\nthis line is wrong\n`);
      const bad = await reloaded(false);
      assert.match(bad.message, /serve-clients\.conf:2: 'this' is not a fingerprint.*keeping the previous configuration/);
      assert.equal((await push(d, sa, src, 'two/g')).code, 0, 'the previous config still applies');

      fs.writeFileSync(conf, `${fa} push one two\nrevoke ${fa}\n`);
      await reloaded(true);
      const revoked = await push(d, sa, src, 'two/h');
      assert.equal(revoked.code, 5);
      assert.match(revoked.stderr, /has been revoked/);
      assert.match((await sessionLine(d, (e) => e.path === 'two/h')).error, /revoked/);
      assert.equal(fs.existsSync(path.join(root, 'two/h')), false);
    } finally {
      assert.equal((await stop(d)).code, 0);
    }
  });

  test('start-up errors: malformed or missing config, missing root, root that is a file, unwritable root', async () => {
    const dir = tmpdir();
    const state = path.join(dir, 'd');
    id(state);
    const root = path.join(dir, 'root');
    fs.mkdirSync(root);
    const serve = (r: string, extra: string[] = []) => run(['serve', r, '0', '--bind', '127.0.0.1', '--state-dir', state, ...extra]).done;

    let r = await serve(root);
    assert.equal(r.code, 1);
    assert.match(r.stderr, /no authorization config at .*serve-clients\.conf/);

    fs.writeFileSync(path.join(state, 'serve-clients.conf'), `# ok\n${'AB'.repeat(32)} push x\n${'AB'.repeat(32)} pushpull y\n`);
    r = await serve(root);
    assert.equal(r.code, 1);
    assert.match(r.stderr, /serve-clients\.conf:3: unknown access 'pushpull'/);

    fs.writeFileSync(path.join(state, 'serve-clients.conf'), `${'AB'.repeat(32)} push x\n`);
    r = await serve(path.join(dir, 'missing'));
    assert.equal(r.code, 11);
    assert.match(r.stderr, /serve root .*missing does not exist/);

    fs.writeFileSync(path.join(dir, 'file'), 'x');
    r = await serve(path.join(dir, 'file'));
    assert.equal(r.code, 11);
    assert.match(r.stderr, /is not a directory/);

    // Root ignores permission bits: make the root read-only by mounting it so.
    if (process.getuid?.() === 0) {
      const ro = path.join(dir, 'ro');
      fs.mkdirSync(ro);
      const m = spawnSync('mount', ['-t', 'tmpfs', '-o', 'ro,size=1m', 'tmpfs', ro]);
      if (m.status === 0) {
        try {
          r = await serve(ro);
          assert.equal(r.code, 11);
          assert.match(r.stderr, /is not writable \(EROFS\)/);
        } finally {
          spawnSync('umount', [ro]);
        }
      } else console.log('SKIPPED: the unwritable-root check (cannot mount a read-only tmpfs here)');
    } else {
      const ro = path.join(dir, 'ro');
      fs.mkdirSync(ro, { mode: 0o555 });
      r = await serve(ro);
      assert.equal(r.code, 11);
      assert.match(r.stderr, /is not writable/);
    }

    r = await serve(root, ['--plaintext']);
    assert.equal(r.code, 1);
    assert.match(r.stderr, /--plaintext is not available/);
  });

  test('pull: a file into a directory, a tree, and a re-pull after changes moves only the difference', async () => {
    const { dir, root, sa, d } = await oneClient((fp) => `${fp} pull rel\n`);
    fs.mkdirSync(path.join(root, 'rel/tree'), { recursive: true });
    const big = path.join(root, 'rel/big.bin');
    fs.writeFileSync(big, seeded(24 << 20, 7));
    makeTree(path.join(root, 'rel/tree'), 40, 3);
    try {
      const into = path.join(dir, 'downloads');
      fs.mkdirSync(into);
      let r = await pull(d, sa, 'rel/big.bin', into);
      assert.equal(r.code, 0, r.stderr);
      assert.equal(sha256(path.join(into, 'big.bin')), sha256(big));

      r = await pull(d, sa, 'rel/tree', path.join(dir, 'tree'));
      assert.equal(r.code, 0, r.stderr);
      assert.deepEqual(snapshot(path.join(dir, 'tree')), snapshot(path.join(root, 'rel/tree')));

      fs.writeFileSync(big, modify(fs.readFileSync(big), 9));
      r = await pull(d, sa, 'rel/big.bin', path.join(into, 'big.bin'));
      assert.equal(r.code, 0, r.stderr);
      assert.equal(sha256(path.join(into, 'big.bin')), sha256(big));
      assert.ok(r.summary!.bytesOnWire.received < 2 << 20, `a modified 24 MiB file re-pulled with ${r.summary!.bytesOnWire.received} bytes`);
      const line = await sessionLine(d, (e) => e.op === 'pull' && e.path === 'rel/big.bin' && e.bytesRead > 0 && e.bytesRead < 2 << 20);
      assert.equal(line.ok, true);

      const missing = await pull(d, sa, 'rel/nope', path.join(dir, 'nope'));
      assert.equal(missing.code, 3);
      assert.match(missing.stderr, /'rel\/nope' does not exist on the server/);
    } finally {
      assert.equal((await stop(d)).code, 0);
    }
  });

  test('concurrent writers to one path are serialized, and a reader sees one whole version, never a mix', async () => {
    const dir = tmpdir();
    const root = path.join(dir, 'root');
    fs.mkdirSync(root);
    const sa = path.join(dir, 'a');
    const sb = path.join(dir, 'b');
    const [fa, fb] = [id(sa), id(sb)];
    const d = await startDaemon(root, path.join(dir, 'd'), `${fa} push,pull site\n${fb} push,pull site\n`);
    const v1 = path.join(dir, 'v1');
    const v2 = path.join(dir, 'v2');
    const v3 = path.join(dir, 'v3');
    makeTree(v1, 60, 1);
    makeTree(v2, 60, 2);
    makeTree(v3, 60, 3);
    // --bwlimit paces chunk data (large files), so v2 carries one to make its push slow.
    fs.writeFileSync(path.join(v2, 'big.bin'), seeded(3 << 20, 4));
    try {
      assert.equal((await push(d, sa, v1, 'site')).code, 0);
      // A slow writer (bwlimit) holds the path; a second writer and a reader arrive meanwhile.
      const slowClient = client(d, sa, ['send', v2, `127.0.0.1:${d.port}/site`, '--bwlimit', '1024']);
      const slow = slowClient.done;
      await sessionLine(d, () => true); // v1's line
      // The slow writer's session runs and holds the path (a fixed wait assumed its start).
      await slowClient.waitFor((e) => e.event === 'phase' && e.phase === 'sending');
      await new Promise((r) => setTimeout(r, 300));
      const reader = pull(d, sb, 'site', path.join(dir, 'seen'));
      // Arrival order between the reader and the second writer: two CLI starts apart by more
      // than a loaded machine's start-up jitter, both well inside the slow writer's ~3 s.
      await new Promise((r) => setTimeout(r, 1000));
      const second = push(d, sb, v3, 'site');
      const [s1, rd, s2] = await Promise.all([slow, reader, second]);
      assert.equal(s1.code, 0, s1.stderr);
      assert.equal(rd.code, 0, rd.stderr);
      assert.equal(s2.code, 0, s2.stderr);
      const seen = snapshot(path.join(dir, 'seen'));
      const versions = [v1, v2, v3].map((v) => snapshot(v));
      assert.ok(
        versions.some((v) => isDeepStrictEqual(v, seen)),
        'the reader got exactly one version',
      );
      assert.deepEqual(snapshot(path.join(root, 'site')), versions[2], 'the last writer in arrival order wins');
      const lines = d.peer.waitFor((e) => e.event === 'session' && e.op === 'push' && e.client === fb);
      assert.ok((await lines).lockWaitMs > 200, 'the second writer waited for the first');
      const readLine = await sessionLine(d, (e) => e.op === 'pull');
      assert.ok(readLine.lockWaitMs > 200, 'the reader waited for the writer');
      assert.deepEqual(seen, versions[1], 'the reader saw the slow writer\'s complete version');
    } finally {
      assert.equal((await stop(d)).code, 0);
    }
  });

  test('--quic: the daemon also takes QUIC on the same port number; push and pull over it', async () => {
    const { dir, root, sa, d } = await oneClient((fp) => `${fp} push,pull q\n`, ['--quic']);
    const src = path.join(dir, 'f');
    fs.writeFileSync(src, seeded(5 << 20, 12));
    try {
      const up = await push(d, sa, src, 'q/f', ['--quic']);
      assert.equal(up.code, 0, up.stderr);
      assert.equal(sha256(path.join(root, 'q/f')), sha256(src));
      const down = await pull(d, sa, 'q/f', path.join(dir, 'back'), ['--quic']);
      assert.equal(down.code, 0, down.stderr);
      assert.equal(sha256(path.join(dir, 'back')), sha256(src));
      // The daemon logs a session once its QUIC connection has closed, which may come after
      // the client's exit: wait for the pull's line before reading them all.
      await sessionLine(d, (e) => e.op === 'pull' && e.ok);
      const lines = d.peer.events.filter((e) => e.event === 'session' && e.ok);
      assert.deepEqual(lines.map((e) => e.op), ['push', 'pull']);
    } finally {
      assert.equal((await stop(d)).code, 0);
    }
  });

  test('hostile paths: .. and symlinks under the root are refused; nothing outside the root is touched', async () => {
    const { dir, root, sa, d } = await oneClient((fp) => `${fp} push,pull /\n`);
    const outside = path.join(dir, 'outside');
    fs.mkdirSync(outside);
    fs.writeFileSync(path.join(outside, 'secret'), 'keep');
    fs.symlinkSync(outside, path.join(root, 'link'));
    const src = path.join(dir, 'f');
    fs.writeFileSync(src, 'payload');
    const before = snapshot(outside);
    try {
      let r = await push(d, sa, src, 'link/secret');
      assert.equal(r.code, 3);
      assert.match(r.stderr, /'link' is a symbolic link on the server/);
      r = await pull(d, sa, 'link/secret', path.join(dir, 'stolen'));
      assert.equal(r.code, 3);
      assert.equal(fs.existsSync(path.join(dir, 'stolen')), false);
      r = await push(d, sa, src, 'a/../../outside/secret');
      assert.equal(r.code, 3);
      assert.match(r.stderr, /'\.\.' segment/);
      r = await push(d, sa, src, '');
      assert.equal(r.code, 3);
      assert.match(r.stderr, /cannot replace the server root/);
      assert.deepEqual(snapshot(outside), before);
    } finally {
      assert.equal((await stop(d)).code, 0);
    }
  });

  test('SIGTERM: a session that ends within the grace period completes; one that does not is ended cleanly and the daemon exits 0', async () => {
    const dir = tmpdir();
    const root = path.join(dir, 'root');
    fs.mkdirSync(root);
    const sa = path.join(dir, 'a');
    const fa = id(sa);
    const small = path.join(dir, 'small');
    const large = path.join(dir, 'large');
    fs.writeFileSync(small, seeded(1 << 20, 5));
    fs.writeFileSync(large, seeded(16 << 20, 6));

    // Finishes within the grace period.
    let d = await startDaemon(root, path.join(dir, 'd'), `${fa} push up\n`, ['--grace', '30']);
    // SIGTERM once the session runs (the client is sending, and a moment more: its TLS side
    // completes before the daemon's), not after a fixed wait from the client's spawn: a client
    // slow to start on a loaded machine would find the daemon no longer listening.
    const flowing = async (c: Peer) => {
      await c.waitFor((e) => e.event === 'phase' && e.phase === 'sending');
      await new Promise((r) => setTimeout(r, 300));
    };
    let c = client(d, sa, ['send', small, `127.0.0.1:${d.port}/up/small`, '--bwlimit', '512']);
    let s = c.done;
    await flowing(c);
    d.peer.child.kill('SIGTERM');
    let [sr, dr] = await Promise.all([s, d.peer.done]);
    assert.equal(sr.code, 0, sr.stderr);
    assert.equal(dr.code, 0);
    assert.equal(sha256(path.join(root, 'up/small')), sha256(small));
    const stopped = dr.events.find((e) => e.event === 'notice' && e.stopped);
    assert.deepEqual([stopped?.finished, stopped?.aborted], [1, 0]);

    // The old version stays whole when a replacement is cut off by the shutdown.
    fs.writeFileSync(path.join(root, 'up/large'), 'old content');
    d = await startDaemon(root, path.join(dir, 'd'), `${fa} push up\n`, ['--grace', '1']);
    c = client(d, sa, ['send', large, `127.0.0.1:${d.port}/up/large`, '--bwlimit', '1024']);
    s = c.done;
    await flowing(c);
    const t0 = Date.now();
    d.peer.child.kill('SIGTERM');
    [sr, dr] = await Promise.all([s, d.peer.done]);
    assert.equal(dr.code, 0, dr.stderr);
    assert.ok(Date.now() - t0 < 8000, 'the grace period bounds the shutdown');
    assert.notEqual(sr.code, 0);
    assert.match(sr.stderr, /shutting down/);
    assert.equal(fs.readFileSync(path.join(root, 'up/large'), 'utf8'), 'old content');
    const line = dr.events.find((e) => e.event === 'session' && e.path === 'up/large');
    assert.equal(line?.ok, false);
    assert.match(line?.error, /shutting down/);
    const after = dr.events.find((e) => e.event === 'notice' && e.stopped);
    assert.deepEqual([after?.finished, after?.aborted], [0, 1]);
    // Only the resumable partial may remain beside the target; a rerun completes it.
    d = await startDaemon(root, path.join(dir, 'd'), `${fa} push up\n`);
    const again = await push(d, sa, large, 'up/large');
    assert.equal(again.code, 0, again.stderr);
    assert.equal(sha256(path.join(root, 'up/large')), sha256(large));
    assert.deepEqual(fs.readdirSync(path.join(root, 'up')).sort(), ['large', 'small']);
    assert.equal((await stop(d)).code, 0);
  });

  test('load (short): concurrent tree and big-file pushes over rounds stay identical, descriptors return to baseline, RSS bounded', async () => {
    const f = await runServeLoad({ treeSenders: 8, filesPerTree: 50, bigSenders: 1, bigBytes: 32 << 20, rounds: 2, seed: 11 });
    for (const r of f.rounds) {
      assert.deepEqual(r.failures, [], `round ${r.round}`);
      assert.deepEqual(r.mismatched, [], `round ${r.round}`);
      assert.equal(r.verified, 9);
    }
    assert.ok(f.rounds[1].wireBytesSent < f.rounds[0].wireBytesSent / 10, 'round 2 moves the changes, not the data');
    assert.equal(f.daemonFdsAfter, f.daemonFdsBaseline, `descriptors left open: ${f.daemonFdsExtra.join(', ')}`);
    assert.ok(f.daemonPeakRssKiB > 0 && f.daemonPeakRssKiB < 512 * 1024, `daemon peak RSS ${f.daemonPeakRssKiB} KiB`);
    assert.equal(f.daemonExitCode, 0);
    assert.equal(f.sessionLines, 18);
    assert.equal(f.sessionLinesOk, 18);
  });
});
