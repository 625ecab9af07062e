// Sub-chunk refinement end to end: two real processes, every result verified, wire bytes
// compared with rsync's on the same data in the same run, and a hostile receiver's table.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { describe, it } from 'node:test';
import { run, seeded, sha256, sync, tmpdir } from './helpers/peers';
import { encodeFrame, FrameDecoder, FrameType } from '../ts/protocol/frames';
import { Capability, Decision, encodeDecision, encodeHello, encodeNeedEnd, Role } from '../ts/protocol/messages';

const MiB = 1024 * 1024;
const KiB = 1024;
const haveRsync = spawnSync('rsync', ['--version']).status === 0;

/** `count` seeded overwrites of `size` bytes, plus 4 KiB insertions and 8 KiB deletions. */
function smallEdits(old: Buffer, seed: number, count: number, size: number, inserts: number, deletes: number): Buffer {
  let b = Buffer.from(old);
  const rnd = seeded(4 * 256, seed);
  let k = 0;
  const pos = (limit: number) => rnd.readUInt32LE((k++ % 256) * 4) % limit;
  for (let i = 0; i < count; i++) seeded(size, seed * 100 + i).copy(b, pos(b.length - size));
  for (let i = 0; i < inserts; i++) {
    const at = pos(b.length);
    b = Buffer.concat([b.subarray(0, at), seeded(4 * KiB, seed * 200 + i), b.subarray(at)]);
  }
  for (let i = 0; i < deletes; i++) {
    const at = pos(b.length - 8 * KiB);
    b = Buffer.concat([b.subarray(0, at), b.subarray(at + 8 * KiB)]);
  }
  return b;
}

function rsyncSent(src: string, old: Buffer, dir: string): number {
  const dst = path.join(dir, 'rsync-target');
  fs.writeFileSync(dst, old);
  const r = spawnSync('rsync', ['--no-whole-file', '--stats', src, dst], { encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  assert.equal(sha256(dst), sha256(src));
  return Number(/Total bytes sent: ([\d,]+)/.exec(r.stdout)![1].replace(/,/g, ''));
}

function setup(old: Buffer, neu: Buffer) {
  const dir = tmpdir();
  const src = path.join(dir, 'source.bin');
  const dst = path.join(dir, 'target.bin');
  fs.writeFileSync(dst, old);
  fs.writeFileSync(src, neu);
  return { dir, src, dst, stateS: path.join(dir, 'state-s'), stateR: path.join(dir, 'state-r') };
}

describe('sub-chunk refinement', () => {
  it('scattered 4 KiB edits in a 24 MiB file cost about their size, not whole 256 KiB chunks', async () => {
    const old = seeded(24 * MiB, 61);
    const neu = smallEdits(old, 5, 12, 4 * KiB, 3, 3);
    const t = setup(old, neu);
    const res = await sync(t.src, t.dst, t);
    assert.equal(res.send.code, 0, res.send.stderr);
    assert.equal(res.recv.code, 0, res.recv.stderr);
    assert.equal(sha256(t.dst), sha256(t.src));
    const wire = res.send.summary!.bytesOnWire;
    // 15 × 4 KiB of new bytes; whole chunks would be ~15 × 256 KiB = 3.75 MiB.
    assert.ok(wire.sent < 200 * KiB, `sent ${wire.sent}`);
    assert.ok(wire.received < 100 * KiB, `received ${wire.received}`);
    // rsync's "literal data": what crossed as bytes, not the refined chunks' full size.
    const literal = res.recv.summary!.literalBytes;
    assert.ok(literal >= 15 * 4 * KiB && literal < 160 * KiB, `literal ${literal}`);
    assert.equal(res.recv.summary!.matchedBytes + literal, neu.length);
    assert.equal(res.send.summary!.literalBytes, literal);
  });

  it('the modified scenario at 32 MiB sends no more than rsync does (bytes, same data, same run)', { skip: !haveRsync && 'rsync not installed' }, async () => {
    const old = seeded(32 * MiB, 62);
    const neu = smallEdits(old, 7, 20, 64 * KiB, 5, 5);
    const t = setup(old, neu);
    const res = await sync(t.src, t.dst, t);
    assert.equal(res.send.code, 0, res.send.stderr);
    assert.equal(sha256(t.dst), sha256(t.src));
    const wire = res.send.summary!.bytesOnWire;
    const rsync = rsyncSent(t.src, old, t.dir);
    assert.ok(wire.sent + wire.received <= rsync, `ffsync ${wire.sent} + ${wire.received} vs rsync sent ${rsync}`);
  });

  it('a tree: a large file inside it is refined too, over TLS with compression', async () => {
    const dir = tmpdir();
    const src = path.join(dir, 'src');
    const dst = path.join(dir, 'dst');
    for (const d of [src, dst]) fs.mkdirSync(path.join(d, 'sub'), { recursive: true });
    const old = seeded(20 * MiB, 63);
    fs.writeFileSync(path.join(dst, 'sub', 'big.bin'), old);
    fs.writeFileSync(path.join(src, 'sub', 'big.bin'), smallEdits(old, 9, 4, 2 * KiB, 1, 1));
    fs.writeFileSync(path.join(src, 'small.txt'), 'hello\n');
    const sS = path.join(dir, 'ss');
    const sR = path.join(dir, 'sr');
    const id = (state: string) => run(['id', '--state-dir', state]).done.then((r) => r.stdout.trim().split(/\s+/).pop()!);
    const [fpS, fpR] = [await id(sS), await id(sR)];
    const recv = run(['receive', dst, '0', '--json', '--state-dir', sR, '--trust', fpS, '--timeout', '20']);
    const port = (await recv.waitFor((e) => e.event === 'listening')).port;
    const send = await run(['send', `${src}/`, `127.0.0.1:${port}`, '--json', '--state-dir', sS, '--trust', fpR]).done;
    const r = await recv.done;
    assert.equal(send.code, 0, send.stderr);
    assert.equal(r.code, 0, r.stderr);
    assert.equal(sha256(path.join(dst, 'sub', 'big.bin')), sha256(path.join(src, 'sub', 'big.bin')));
    assert.equal(fs.readFileSync(path.join(dst, 'small.txt'), 'utf8'), 'hello\n');
    const sent = send.summary!.bytesOnWire.sent;
    assert.ok(sent < 96 * KiB, `tree sent ${sent} bytes (TLS included)`);
  });

  /** A table of one run (chunk 0) whose signature is `sig` and whose length field says `sigLen`. */
  function refineTable(sig: Buffer, sigLen = sig.length): Buffer {
    const head = Buffer.alloc(12);
    head.writeUInt32LE(0, 0);
    head.writeUInt32LE(1, 4);
    head.writeUInt32LE(sigLen, 8);
    return Buffer.concat([head, sig]);
  }
  /** A librsync signature header (magic, block size, hash length) and one block record. */
  function signature(magic: number): Buffer {
    const sig = Buffer.alloc(12 + 8);
    sig.writeUInt32BE(magic, 0);
    sig.writeUInt32BE(512, 4);
    sig.writeUInt32BE(4, 8);
    return sig;
  }
  const hostileTables: [string, Buffer][] = [
    ['a signature of absurd length', refineTable(Buffer.alloc(12), 0xffff)],
    // fast_rsync's parser accepts librsync's BLAKE2 magic; the sender's block match is MD4's
    // (decisions §104: a build that indexed it after decoding panicked here).
    ['a BLAKE2 signature', refineTable(signature(0x72730137))],
  ];
  for (const [what, table] of hostileTables)
  it(`a hostile receiver sending a refinement table with ${what}: the sender stops with exit 12`, async () => {
    const dir = tmpdir();
    const src = path.join(dir, 'source.bin');
    fs.writeFileSync(src, seeded(3 * MiB, 64));
    const server = net.createServer();
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    const port = (server.address() as net.AddressInfo).port;
    const conversation = new Promise<void>((resolve) => {
      server.once('connection', (sock) => {
        sock.on('error', () => undefined);
        const dec = new FrameDecoder();
        let manifestSeen = false;
        sock.write(encodeFrame(FrameType.HELLO, encodeHello({ minVersion: 1, maxVersion: 1, capabilities: Capability.ZSTD | Capability.REFINE, role: Role.RECEIVER, software: 'hostile' })));
        sock.on('data', (d) => {
          for (const f of dec.push(d)) {
            if (f.type === FrameType.OFFER) sock.write(encodeFrame(FrameType.DECISION, encodeDecision(Decision.SEND_MANIFEST)));
            if (f.type === FrameType.MANIFEST && !manifestSeen) {
              manifestSeen = true;
              // Need chunk 0, then the hostile table.
              const need = Buffer.alloc(5);
              need[4] = 1;
              sock.write(encodeFrame(FrameType.NEED, need));
              sock.write(encodeFrame(FrameType.REFINE, table));
              sock.write(encodeFrame(FrameType.NEED_END, encodeNeedEnd({ wireChunks: 1, identical: false })));
            }
            if (f.type === FrameType.ERROR || f.type === FrameType.DATA) resolve();
          }
        });
        sock.on('close', () => resolve());
      });
    });
    const res = await run(['send', src, `127.0.0.1:${port}`, '--plaintext', '--json', '--state-dir', path.join(dir, 's'), '--timeout', '10']).done;
    await conversation;
    server.close();
    assert.equal(res.code, 12, `exit ${res.code}: ${res.stderr}`);
    assert.match(res.summary?.error ?? res.stderr, /refinement table/);
  });
});

describe('sparse files', { skip: process.platform !== 'linux' && 'SEEK_HOLE and hole punching are tested on Linux' }, () => {
  /** 48 MiB with data at three places; holes elsewhere. */
  function sparseFile(file: string): void {
    const fd = fs.openSync(file, 'w');
    fs.ftruncateSync(fd, 48 * MiB);
    for (const [k, at] of [0, 17 * MiB, 47 * MiB].entries()) fs.writeSync(fd, seeded(200 * KiB, 70 + k), 0, 200 * KiB, at);
    fs.closeSync(fd);
  }
  const allocated = (file: string) => fs.statSync(file).blocks * 512;

  it('send/receive: holes are not sent and the result is sparse too', async (t) => {
    const dir = tmpdir();
    const src = path.join(dir, 'disk.img');
    sparseFile(src);
    if (allocated(src) > 8 * MiB) return t.skip('this filesystem does not keep holes');
    const dst = path.join(dir, 'out.img');
    const res = await sync(src, dst, { stateS: path.join(dir, 's'), stateR: path.join(dir, 'r') });
    assert.equal(res.send.code, 0, res.send.stderr);
    assert.equal(sha256(dst), sha256(src));
    assert.ok(res.send.summary!.bytesOnWire.sent < 2 * MiB, `sent ${res.send.summary!.bytesOnWire.sent}`);
    assert.ok(allocated(dst) < 8 * MiB, `result allocates ${allocated(dst)} bytes`);
  });

  it('sync -S (local tree): a sparse file stays sparse', async (t) => {
    const dir = tmpdir();
    fs.mkdirSync(path.join(dir, 'src'));
    sparseFile(path.join(dir, 'src', 'vm.img'));
    if (allocated(path.join(dir, 'src', 'vm.img')) > 8 * MiB) return t.skip('this filesystem does not keep holes');
    const r = await run(['sync', '-aS', '--state-dir', path.join(dir, 'state'), `${path.join(dir, 'src')}/`, path.join(dir, 'dst')]).done;
    assert.equal(r.code, 0, r.stderr);
    const out = path.join(dir, 'dst', 'vm.img');
    assert.equal(sha256(out), sha256(path.join(dir, 'src', 'vm.img')));
    assert.ok(allocated(out) < 8 * MiB, `result allocates ${allocated(out)} bytes`);
  });
});

describe('--inplace', () => {
  function edited(old: Buffer): Buffer {
    const neu = Buffer.from(old);
    for (const at of [2 * MiB, 11 * MiB, 19 * MiB]) seeded(8 * KiB, at).copy(neu, at);
    return neu;
  }

  it('receive --inplace: changed ranges are written into the same file; nothing left behind', async () => {
    const old = seeded(24 * MiB, 81);
    const neu = edited(old);
    const t = setup(old, neu);
    const ino = fs.statSync(t.dst).ino;
    const res = await sync(t.src, t.dst, { ...t, recvArgs: ['--inplace'] });
    assert.equal(res.recv.code, 0, res.recv.stderr);
    assert.equal(sha256(t.dst), sha256(t.src));
    assert.equal(fs.statSync(t.dst).ino, ino, 'updated in place, not replaced');
    assert.deepEqual(fs.readdirSync(t.dir).filter((n) => n.includes('.ffsync-')), []);
  });

  it('a receiver killed in the middle of an in-place commit: the next run completes it and says so', async () => {
    const old = seeded(24 * MiB, 82);
    const neu = edited(old);
    const t = setup(old, neu);
    // Test hook: the receiver aborts (SIGABRT, like a kill) after writing one range of three.
    const crashed = await sync(t.src, t.dst, { ...t, recvArgs: ['--inplace'], recvEnv: { FFSYNC_TEST_INPLACE_CRASH_AFTER: '1' } });
    assert.notEqual(crashed.recv.code, 0);
    assert.ok(fs.readdirSync(t.dir).some((n) => n.endsWith('.ffsync-journal')), 'the journal survives the crash');
    assert.notEqual(sha256(t.dst), sha256(t.src), 'the target is half-written until recovery');
    const res = await sync(t.src, t.dst, { ...t, recvArgs: ['--inplace'] });
    assert.equal(res.recv.code, 0, res.recv.stderr);
    assert.match(res.recv.stderr, /completed an interrupted --inplace sync/);
    assert.equal(sha256(t.dst), sha256(t.src));
    assert.deepEqual(fs.readdirSync(t.dir).filter((n) => n.includes('.ffsync-')), []);
  });
});
