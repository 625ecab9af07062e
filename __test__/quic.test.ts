// `--quic`: one QUIC connection (quinn in the Rust core) instead of TCP/TLS. Same
// identities and pins as TLS; a tree's lanes are streams of the one connection. Real
// processes over loopback, with a UDP proxy that can silently drop the path.
import assert from 'node:assert/strict';
import dgram from 'node:dgram';
import fs from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import { assertSameTree, mostBlocksInPartials, partials, run, seeded, sha256, snapshotTree, T0, tmpdir, writeAt } from './helpers/peers';
import { udpDelayProxy } from './helpers/delay-proxy';

const MiB = 1024 * 1024;

async function id(stateDir: string): Promise<string> {
  const r = await run(['id', '--state-dir', stateDir]).done;
  assert.equal(r.code, 0, r.stderr);
  return r.stdout.trim();
}

function receiver(dst: string, state: string, args: string[] = []) {
  return run(['receive', dst, '0', '--quic', '--json', '--bind', '127.0.0.1', '--timeout', '10', '--state-dir', state, ...args]);
}

function sender(src: string, port: number, state: string, args: string[] = []) {
  return run(['send', src, `127.0.0.1:${port}`, '--quic', '--json', '--timeout', '10', '--state-dir', state, ...args]);
}

async function quicSync(src: string, dst: string, s: { state: string; args?: string[] }, r: { state: string; args?: string[] }) {
  const recv = receiver(dst, r.state, r.args);
  const l = await recv.waitFor((e) => e.event === 'listening');
  const send = await sender(src, l.port, s.state, s.args).done;
  // A sender that never connected (usage error) must not leave the receiver waiting.
  const stop = setTimeout(() => recv.child.kill(), 15_000);
  try {
    return { send, recv: await recv.done };
  } finally {
    clearTimeout(stop);
  }
}

/** Six 3 MiB files (lanes), small files, a symlink, an empty dir. */
function buildTree(src: string) {
  for (let i = 0; i < 6; i++) writeAt(src, `big/b${i}.bin`, seeded(3 * MiB, 500 + i), 0o644, T0 + i);
  for (let i = 0; i < 20; i++) writeAt(src, `small/s${i}.txt`, `small ${i}\n`, 0o640, T0 + 10 + i);
  fs.mkdirSync(path.join(src, 'empty'));
  fs.symlinkSync('big/b0.bin', path.join(src, 'link'));
}

describe('QUIC transport', { skip: process.platform === 'win32' && 'symlinks in the fixture' }, () => {
  it('a tree over QUIC: pinned identities as over TLS, lanes are streams, rerun is a no-op', async () => {
    const dir = tmpdir();
    const src = path.join(dir, 'src');
    buildTree(src);
    const [stateS, stateR] = [path.join(dir, 's'), path.join(dir, 'r')];
    const [fpS, fpR] = [await id(stateS), await id(stateR)];
    const dst = path.join(dir, 'dst');
    const first = await quicSync(src, dst, { state: stateS, args: ['--trust', fpR] }, { state: stateR, args: ['--trust', fpS] });
    assert.equal(first.send.code, 0, first.send.stderr);
    assert.equal(first.recv.code, 0, first.recv.stderr);
    assertSameTree(dst, src, 'QUIC tree');
    assert.equal(first.send.summary!.peerFingerprint, fpR);
    assert.equal(first.recv.summary!.peerFingerprint, fpS);
    // QUIC defaults to 8 lanes; six large files use six streams.
    assert.equal(first.send.summary!.tree.lanes, 6, 'large files spread over QUIC streams');
    // bytesOnWire is what QUIC put on the wire (UDP payloads): at least the data, not wildly more.
    const sent = first.send.summary!.bytesOnWire.sent;
    assert.ok(sent > 18 * MiB && sent < 18 * MiB * 1.15, `QUIC wire bytes ${sent} for 18 MiB of incompressible data`);
    // Pins were recorded by --trust, as over TLS: the rerun needs no --trust.
    const again = await quicSync(src, dst, { state: stateS }, { state: stateR });
    assert.equal(again.send.code, 0, again.send.stderr);
    assert.equal(again.send.summary!.tree.written, 0);
    assert.ok(again.send.summary!.bytesOnWire.sent < 64 * 1024, `no-op rerun sent ${again.send.summary!.bytesOnWire.sent} bytes`);
    fs.rmSync(dir, { recursive: true, force: true });
  });

  it('a single file over QUIC, and a modified version moves only the difference', async () => {
    const dir = tmpdir();
    const [stateS, stateR] = [path.join(dir, 's'), path.join(dir, 'r')];
    const [fpS, fpR] = [await id(stateS), await id(stateR)];
    const data = seeded(8 * MiB, 77);
    writeAt(dir, 'a.bin', data);
    const dst = path.join(dir, 'b.bin');
    const r1 = await quicSync(path.join(dir, 'a.bin'), dst, { state: stateS, args: ['--trust', fpR] }, { state: stateR, args: ['--trust', fpS] });
    assert.equal(r1.send.code, 0, r1.send.stderr);
    assert.equal(sha256(dst), sha256(path.join(dir, 'a.bin')));
    data.fill(7, 3 * MiB, 3 * MiB + 100);
    writeAt(dir, 'a.bin', data);
    const r2 = await quicSync(path.join(dir, 'a.bin'), dst, { state: stateS }, { state: stateR });
    assert.equal(r2.send.code, 0, r2.send.stderr);
    assert.equal(sha256(dst), sha256(path.join(dir, 'a.bin')));
    assert.ok(r2.send.summary!.literalBytes < 2 * MiB, `literal ${r2.send.summary!.literalBytes}`);
  });

  it('an unknown peer is refused on both sides (exit 5), nothing written', async () => {
    const dir = tmpdir();
    const src = path.join(dir, 'src');
    writeAt(src, 'x.txt', 'x\n');
    const dst = path.join(dir, 'dst');
    const r = await quicSync(src, dst, { state: path.join(dir, 's') }, { state: path.join(dir, 'r') });
    assert.equal(r.recv.code, 5, r.recv.stderr);
    assert.equal(r.send.code, 5, r.send.stderr);
    assert.match(r.recv.stderr, /unknown peer/);
    assert.ok(!fs.existsSync(dst));
  });

  it('--plaintext with --quic is refused (exit 1) on both commands', async () => {
    const dir = tmpdir();
    writeAt(dir, 'x.txt', 'x\n');
    const s = await run(['send', path.join(dir, 'x.txt'), '127.0.0.1:9', '--quic', '--plaintext', '--state-dir', dir]).done;
    assert.equal(s.code, 1, s.stderr);
    assert.match(s.stderr, /--quic is always encrypted/);
    const r = await run(['receive', path.join(dir, 'y'), '0', '--quic', '--plaintext', '--state-dir', dir]).done;
    assert.equal(r.code, 1, r.stderr);
  });

  it('UDP blocked: the handshake times out with a hint to use TCP (exit 30)', async () => {
    const dir = tmpdir();
    writeAt(dir, 'x.txt', 'x\n');
    // A bound UDP port that never answers: what a firewall dropping UDP looks like.
    const sink = dgram.createSocket('udp4');
    await new Promise<void>((r) => sink.bind(0, '127.0.0.1', () => r()));
    try {
      const t = Date.now();
      const s = await run(['send', path.join(dir, 'x.txt'), `127.0.0.1:${sink.address().port}`, '--quic', '--timeout', '2', '--state-dir', dir]).done;
      assert.equal(s.code, 30, s.stderr);
      assert.match(s.stderr, /no QUIC answer/);
      assert.match(s.stderr, /UDP may be blocked.*retry without --quic/);
      assert.ok(Date.now() - t < 10_000);
    } finally {
      sink.close();
    }
  });

  it('the path drops mid-transfer: both sides time out, nothing deleted, a rerun resumes', async () => {
    const dir = tmpdir();
    const src = path.join(dir, 'src');
    const data = seeded(24 * MiB, 91);
    writeAt(src, 'big.bin', data, 0o644, T0);
    writeAt(src, 'note.txt', 'note\n', 0o644, T0);
    const dst = path.join(dir, 'dst');
    writeAt(dst, 'receiver-only.txt', 'keep unless the sync succeeds\n');
    const [stateS, stateR] = [path.join(dir, 's'), path.join(dir, 'r')];
    const [fpS, fpR] = [await id(stateS), await id(stateR)];

    const recv = receiver(dst, stateR, ['--trust', fpS, '--timeout', '3']);
    const l = await recv.waitFor((e) => e.event === 'listening');
    const proxy = await udpDelayProxy(l.port, 0);
    const send = sender(src, proxy.port, stateS, ['--trust', fpR, '--timeout', '3', '--bwlimit', '4096']);
    // Wait until the receiver's partial holds >= 4 MiB of the data (it is pre-sized, so
    // its size says nothing), then cut the path.
    const deadline = Date.now() + 30_000;
    let present = 0;
    while (Date.now() < deadline && send.child.exitCode === null) {
      if ((present = mostBlocksInPartials(dst, data)) >= 4) break;
      await new Promise((r) => setTimeout(r, 50));
    }
    assert.ok(present >= 4, `no partial with 4 MiB of data appeared (sender exited ${send.child.exitCode})`);
    proxy.blackhole(true);
    const [s, r] = await Promise.all([send.done, recv.done]);
    await proxy.close();
    for (const [who, res] of [['sender', s], ['receiver', r]] as const) {
      assert.ok(res.code === 30 || res.code === 10, `${who}: exit ${res.code} (timeout or socket error expected): ${res.stderr}`);
    }
    assert.ok(fs.existsSync(path.join(dst, 'receiver-only.txt')), 'no deletion in a failed session');
    assert.ok(!fs.existsSync(path.join(dst, 'big.bin')), 'the target is not in place');
    assert.equal(partials(dst).length, 1, 'the partial is kept for resuming');

    const again = await quicSync(src, dst, { state: stateS }, { state: stateR });
    assert.equal(again.send.code, 0, again.send.stderr);
    assert.equal(again.recv.code, 0, again.recv.stderr);
    assertSameTree(dst, src, 'rerun converges');
    assert.ok(again.send.summary!.matchedBytes >= 3 * MiB, `rerun reused only ${again.send.summary!.matchedBytes} bytes of the partial`);
    assert.deepEqual(Object.keys(snapshotTree(dst, { root: false })).sort(), ['big.bin', 'note.txt']);
    fs.rmSync(dir, { recursive: true, force: true });
  });
});
