// Overlapped phases (capability STREAM, docs/protocol.md §4.15): a sender still hashing a
// large file streams its manifest; the receiver copies what it already has into place
// meanwhile and adopts it once the whole manifest has checked out. Real processes over
// loopback, every result compared byte for byte; hostile streams end in exit 12 with the
// target untouched and no provisional file left behind.
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { describe, it } from 'node:test';
import { makeImmutable, modify, partials, seeded, sender, sha256, snapshot, startReceiver, sync, tmpdir, undoImmutable } from './helpers/peers';
import { encodeFrame, FrameType } from '../ts/protocol/frames';
import { Capability, Decision, decodeDecision, encodeBasis, encodeError, encodeHello, encodeOffer, manifestFrames, OfferKind, Role, STREAM_WINDOW } from '../ts/protocol/messages';
import { openScanStream, scanFile } from '../ts/native/binding';
import { MANIFEST_HEADER } from '../ts/utils/manifest';
import { receive, send } from '../ts/api/index';
import { sendFileContent } from '../ts/api/content-send';
import { FramedConnection } from '../ts/transport/connection';
import { ExitCode, FfsyncError } from '../ts/utils/errors';

const BIG = STREAM_WINDOW * 2 + 12_345_678; // three windows
const MiB = 1024 * 1024;

function large(seed: number) {
  const dir = tmpdir();
  const old = seeded(BIG, seed);
  const target = path.join(dir, 'target.bin');
  fs.writeFileSync(target, old);
  const source = path.join(tmpdir(), 'source.bin');
  return { dir, old, target, source, stateS: path.join(tmpdir(), 'ss'), stateR: path.join(tmpdir(), 'sr') };
}

/** No temp, partial or provisional (`.streaming.ffsync-part`) file is left beside the target. */
function noLeftovers(dir: string) {
  assert.deepEqual(partials(dir), []);
  assert.deepEqual(
    fs.readdirSync(dir).filter((n) => n.includes('ffsync-part')),
    [],
  );
}

describe('overlapped phases: streamed manifest, early placement', () => {
  it('a large modified file: matched chunks are placed while the sender hashes; result identical', async () => {
    const f = large(61);
    const next = modify(f.old, 62);
    fs.writeFileSync(f.source, next);
    const { send, recv } = await sync(f.source, f.target, f);
    assert.equal(send.code, 0, send.stderr);
    assert.equal(recv.code, 0, recv.stderr);
    assert.equal(sha256(f.target), sha256(f.source));
    const s = recv.summary!;
    assert.equal(s.decidedBy, 'transfer');
    assert.ok(s.placedEarlyBytes > 0, `nothing placed early: ${JSON.stringify(s)}`);
    assert.ok(s.placedEarlyBytes <= s.matchedBytes, 'placed bytes are part of the matched bytes');
    // The old content is still almost all there: nearly all of it was placed early.
    assert.ok(s.placedEarlyBytes > 0.9 * s.matchedBytes, `${s.placedEarlyBytes} of ${s.matchedBytes} placed early`);
    noLeftovers(f.dir);
  });

  it('--no-overlap: the same result, nothing placed early', async () => {
    const f = large(63);
    const next = modify(f.old, 64);
    fs.writeFileSync(f.source, next);
    const { send, recv } = await sync(f.source, f.target, { ...f, sendArgs: ['--no-overlap'] });
    assert.equal(send.code, 0, send.stderr);
    assert.equal(recv.code, 0, recv.stderr);
    assert.equal(sha256(f.target), sha256(f.source));
    assert.equal(recv.summary!.placedEarlyBytes, 0);
    noLeftovers(f.dir);
  });

  it('same content, new mtime, no index: up to date, and nothing was copied for nothing', async () => {
    const f = large(65);
    fs.writeFileSync(f.source, f.old);
    fs.utimesSync(f.source, new Date(), new Date(Date.now() + 5000));
    const before = fs.statSync(f.target).ino;
    const { send, recv } = await sync(f.source, f.target, f);
    assert.equal(send.code, 0, send.stderr);
    assert.equal(recv.code, 0, recv.stderr);
    assert.equal(recv.summary!.decidedBy, 'scan-root');
    assert.equal(recv.summary!.placedEarlyBytes, 0, 'no chunk was copied into a provisional file');
    assert.equal(fs.statSync(f.target).ino, before, 'the target was kept, not rewritten');
    noLeftovers(f.dir);
  });

  it('nothing local (fresh target): every chunk arrives as early DATA while the sender hashes', async () => {
    const f = large(68);
    fs.rmSync(f.target);
    fs.writeFileSync(f.source, f.old);
    const { send, recv } = await sync(f.source, f.target, f);
    assert.equal(send.code, 0, send.stderr);
    assert.equal(recv.code, 0, recv.stderr);
    assert.equal(sha256(f.target), sha256(f.source));
    const s = recv.summary!;
    assert.equal(s.placedEarlyBytes, BIG, 'the whole file was placed before the manifest was complete');
    assert.equal(s.literalBytes, BIG);
    assert.equal(send.summary!.literalBytes, BIG);
    noLeftovers(f.dir);
  });

  it('a fresh streamed send of 5 windows: the sender\'s resident memory stays bounded, not the size of the file', { skip: process.platform !== 'linux' && 'reads /proc' }, async () => {
    const dir = tmpdir();
    const source = path.join(tmpdir(), 'source.bin');
    const size = 5 * STREAM_WINDOW;
    const fd = fs.openSync(source, 'w');
    for (let at = 0; at < size; at += 8 * MiB) fs.writeSync(fd, crypto.randomBytes(8 * MiB));
    fs.closeSync(fd);
    const target = path.join(dir, 'target.bin');
    const { peer, port } = await startReceiver(target, ['--state-dir', path.join(tmpdir(), 'sr')]);
    const s = sender(source, port, ['--state-dir', path.join(tmpdir(), 'ss')]);
    // VmHWM only grows: the last value read before the process exits is its peak so far.
    let peakKb = 0;
    const poll = setInterval(() => {
      try {
        const m = /VmHWM:\s+(\d+) kB/.exec(fs.readFileSync(`/proc/${s.child.pid}/status`, 'utf8'));
        if (m) peakKb = Math.max(peakKb, Number(m[1]));
      } catch {
        // exited between two polls
      }
    }, 25);
    const [sr, rr] = await Promise.all([s.done, peer.done]).finally(() => clearInterval(poll));
    assert.equal(sr.code, 0, sr.stderr);
    assert.equal(rr.code, 0, rr.stderr);
    assert.equal(rr.summary!.placedEarlyBytes, size, 'all of it went as early DATA');
    assert.equal(sha256(target), sha256(source));
    // Measured ~100 MiB here (Node itself ~65 MiB); mapped pages kept resident would make it
    // at least the file's 320 MiB.
    assert.ok(peakKb > 0, 'the sender\'s memory could not be read');
    assert.ok(peakKb < 200 * 1024, `sender peak RSS ${(peakKb / 1024).toFixed(0)} MiB for a ${size / MiB} MiB file`);
    fs.rmSync(source);
    noLeftovers(dir);
  });

  it('a fresh streamed transfer killed mid-way keeps what arrived; the rerun sends only the rest', async () => {
    const f = large(69);
    fs.rmSync(f.target);
    fs.writeFileSync(f.source, f.old);
    const { peer: recv, port } = await startReceiver(f.target, ['--state-dir', f.stateR]);
    // 48 MiB/s: about 3 s in all; kill the sender once 40 MiB arrived as early DATA.
    const s = sender(f.source, port, ['--state-dir', f.stateS, '--bwlimit', String(48 * 1024)]);
    await recv.waitFor((e) => e.event === 'progress' && e.phase === 'receiving' && e.doneBytes >= 40 * MiB);
    s.child.kill('SIGKILL');
    const r1 = await recv.done;
    assert.notEqual(r1.code, 0);
    assert.match(r1.stderr, /partial file kept/);
    assert.ok(!fs.existsSync(f.target), 'no target before a verified commit');
    assert.deepEqual(
      fs.readdirSync(f.dir).filter((n) => n.endsWith('.ffsync-part')),
      ['.target.bin.streaming.ffsync-part'],
    );
    const res = await sync(f.source, f.target, f);
    assert.equal(res.recv.code, 0, res.recv.stderr);
    assert.equal(sha256(f.target), sha256(f.source));
    const second = res.recv.summary!.literalBytes as number;
    assert.ok(second <= BIG - 40 * MiB + 8 * MiB, `second run sent ${second} of ${BIG}`);
    noLeftovers(f.dir);
  });

  it('a tree: a new large file into a directory it cannot write is refused (exit 23), its early DATA dropped, the rest synced', async (t) => {
    const dir = tmpdir();
    const [src, dst] = ['src', 'dst'].map((d) => path.join(dir, d));
    fs.mkdirSync(path.join(src, 'locked'), { recursive: true });
    fs.mkdirSync(path.join(dst, 'locked'), { recursive: true });
    fs.writeFileSync(path.join(src, 'locked', 'big.bin'), seeded(BIG, 70));
    fs.writeFileSync(path.join(src, 'z.bin'), seeded(3 * MiB, 71));
    const locked = path.join(dst, 'locked');
    if (!makeImmutable(locked)) return t.skip('needs chattr +i (root, a filesystem with inode flags)');
    try {
      const res = await sync(src, dst, { stateS: path.join(dir, 'ss'), stateR: path.join(dir, 'sr') });
      assert.equal(res.recv.code, 23, res.recv.stderr);
      assert.match(res.recv.stderr, /big\.bin/);
      assert.equal(sha256(path.join(dst, 'z.bin')), sha256(path.join(src, 'z.bin')));
      assert.deepEqual(fs.readdirSync(locked), []);
      assert.deepEqual(fs.readdirSync(dst).filter((n) => n.includes('ffsync-part')), []);
    } finally {
      undoImmutable(locked);
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  it('-W (whole file) over an existing target: no basis, so all early DATA; the old file is replaced', async () => {
    const f = large(77);
    const next = modify(f.old, 78);
    fs.writeFileSync(f.source, next);
    let port = 0;
    let listening!: () => void;
    const ready = new Promise<void>((r) => (listening = r));
    const received = receive({ path: f.target, port: 0, plaintext: true, stateDir: f.stateR, events: { listening: (_h, p) => ((port = p), listening()) } });
    await ready;
    const [s, r] = await Promise.all([send({ path: f.source, host: '127.0.0.1', port, plaintext: true, stateDir: f.stateS, wholeFile: true }), received]);
    assert.equal(s.ok && r.ok, true);
    assert.equal(sha256(f.target), sha256(f.source));
    assert.equal(r.literalBytes, next.length, 'whole file: every byte crossed');
    assert.equal(r.placedEarlyBytes, next.length);
    noLeftovers(f.dir);
  });

  it('a grown file (old content first, a new window appended): rebuilt, the old part placed early', async () => {
    const f = large(66);
    const next = Buffer.concat([f.old.subarray(0, STREAM_WINDOW + 5_000_000), seeded(3_000_000, 67), f.old.subarray(STREAM_WINDOW + 5_000_000)]);
    fs.writeFileSync(f.source, next);
    const { send, recv } = await sync(f.source, f.target, f);
    assert.equal(send.code, 0, send.stderr);
    assert.equal(recv.code, 0, recv.stderr);
    assert.equal(sha256(f.target), sha256(f.source));
    assert.ok(recv.summary!.placedEarlyBytes > 0);
    noLeftovers(f.dir);
  });
});

/** A sender that speaks the protocol with capability STREAM and then misbehaves. */
async function streamingHostile(port: number, size: number, script: (write: (type: number, p: Buffer) => void, next: () => Promise<{ type: number; payload: Buffer }>) => Promise<void> | void) {
  const sock = net.connect({ host: '127.0.0.1', port });
  await new Promise((r) => sock.once('connect', r));
  sock.on('error', () => undefined);
  let buf = Buffer.alloc(0);
  const frames: { type: number; payload: Buffer }[] = [];
  let wake: (() => void) | undefined;
  sock.on('data', (d) => {
    buf = Buffer.concat([buf, d]);
    while (buf.length >= 5 && buf.length >= 4 + buf.readUInt32LE(0)) {
      const len = buf.readUInt32LE(0);
      frames.push({ type: buf[4], payload: buf.subarray(5, 4 + len) });
      buf = buf.subarray(4 + len);
    }
    wake?.();
  });
  const next = async () => {
    while (!frames.length) await new Promise<void>((r) => (wake = r));
    return frames.shift()!;
  };
  const write = (type: number, p: Buffer) => void sock.write(encodeFrame(type as never, p));
  write(FrameType.HELLO, encodeHello({ minVersion: 1, maxVersion: 1, capabilities: Capability.ZSTD | Capability.STREAM, role: Role.SENDER, software: 'hostile' }));
  write(FrameType.OFFER, encodeOffer({ kind: OfferKind.FILE, size: BigInt(size), mtimeNs: 1n, mode: 0o644, flags: 0 }));
  await next(); // HELLO
  assert.equal(decodeDecision((await next()).payload).decision, Decision.SEND_MANIFEST);
  await script(write, next);
  await new Promise((r) => setTimeout(r, 300));
  sock.end();
}

describe('hostile streamed manifests', () => {
  async function victim(data: Buffer) {
    const dir = tmpdir();
    const target = path.join(dir, 'target.bin');
    fs.writeFileSync(target, data);
    const { peer, port } = await startReceiver(target, ['--state-dir', path.join(tmpdir(), 'state')]);
    return { dir, peer, port, before: snapshot(dir) };
  }

  /** A receiver with nothing at its target (BASIS "empty": early DATA expected). */
  async function freshVictim() {
    const dir = tmpdir();
    const { peer, port } = await startReceiver(path.join(dir, 'target.bin'), ['--state-dir', path.join(tmpdir(), 'state')]);
    return { dir, peer, port };
  }

  /** One raw chunk record (§4.7) of chunk `index`. */
  function rawRecord(index: number, bytes: Buffer): Buffer {
    const record = Buffer.alloc(13 + bytes.length);
    record.writeUInt32LE(index, 0);
    record[4] = 0; // raw
    record.writeUInt32LE(bytes.length, 5);
    record.writeUInt32LE(bytes.length, 9);
    bytes.copy(record, 13);
    return record;
  }

  async function manifestOf(data: Buffer) {
    const f = path.join(tmpdir(), 'src');
    fs.writeFileSync(f, data);
    return (await scanFile(f, {})).manifest;
  }

  /** A file of just over one window, its first streamed entry, and that chunk's raw record
   * with one byte flipped (it fails the streamed hash). */
  async function badFirstChunk(seed: number) {
    const data = seeded(STREAM_WINDOW + 4_000_000, seed);
    const entry = (await manifestOf(data)).subarray(MANIFEST_HEADER, MANIFEST_HEADER + 36);
    const record = rawRecord(0, data.subarray(0, entry.readUInt32LE(0)));
    record[13 + 7] ^= 1;
    return { data, entry, record };
  }

  it('entries describing more bytes than offered: exit 12, target untouched', async () => {
    const old = seeded(3_000_000, 71);
    const v = await victim(old);
    const m = await manifestOf(old);
    await streamingHostile(v.port, 1_000_000, (write) => write(FrameType.MANIFEST_STREAM, m.subarray(MANIFEST_HEADER)));
    const r = await v.peer.done;
    assert.equal(r.code, 12, r.stderr);
    assert.match(r.stderr, /more than the offered file/);
    assert.deepEqual(snapshot(v.dir), v.before);
  });

  it('a whole manifest after streamed entries (not the header alone): exit 12', async () => {
    const old = seeded(3_000_000, 72);
    const v = await victim(old);
    const m = await manifestOf(old);
    await streamingHostile(v.port, old.length, (write) => {
      write(FrameType.MANIFEST_STREAM, m.subarray(MANIFEST_HEADER, MANIFEST_HEADER + 36));
      for (const p of manifestFrames(m)) write(FrameType.MANIFEST, p);
    });
    const r = await v.peer.done;
    assert.equal(r.code, 12, r.stderr);
    assert.match(r.stderr, /header alone/);
    assert.deepEqual(snapshot(v.dir), v.before);
  });

  it('streamed entries that the final root does not cover: exit 12, provisional file removed', async () => {
    const old = seeded(3_000_000, 73);
    const v = await victim(old);
    const m = await manifestOf(old);
    // The old file's own entries (so the receiver starts placing them: only the first
    // differs), closed by a header whose root is another file's.
    const entries = Buffer.from(m.subarray(MANIFEST_HEADER));
    entries[4] ^= 0xff;
    const header = Buffer.from(m.subarray(0, MANIFEST_HEADER));
    await streamingHostile(v.port, old.length, (write) => {
      write(FrameType.MANIFEST_STREAM, entries);
      for (const p of manifestFrames(header)) write(FrameType.MANIFEST, p);
    });
    const r = await v.peer.done;
    assert.equal(r.code, 12, r.stderr);
    assert.match(r.stderr, /root does not match/);
    assert.deepEqual(snapshot(v.dir), v.before);
  });

  it('early DATA to a receiver that has an old file (BASIS not empty): exit 12', async () => {
    const old = seeded(1_000_000, 75);
    const v = await victim(old);
    await streamingHostile(v.port, STREAM_WINDOW + 1, (write) => write(FrameType.DATA, Buffer.alloc(13)));
    const r = await v.peer.done;
    assert.equal(r.code, 12, r.stderr);
    assert.match(r.stderr, /did not ask for early DATA/);
    assert.deepEqual(snapshot(v.dir), v.before);
  });

  it('early DATA whose bytes fail the streamed hash (fresh target): exit 12, nothing left behind', async () => {
    const { dir, peer, port } = await freshVictim();
    const { data, entry, record } = await badFirstChunk(76);
    await streamingHostile(port, data.length, (write) => {
      write(FrameType.MANIFEST_STREAM, entry);
      write(FrameType.DATA, record);
    });
    const r = await peer.done;
    assert.equal(r.code, 12, r.stderr);
    assert.match(r.stderr, /failed its hash check|bad early DATA/);
    assert.deepEqual(fs.readdirSync(dir), [], 'no target, no provisional file');
  });

  it('early DATA that fails its hash, then the sender says its source changed (ERROR 24): the receiver exits 24, nothing left behind', async () => {
    const { dir, peer, port } = await freshVictim();
    // A flipped byte: what a sender reads after its file changed under it.
    const { data, entry, record } = await badFirstChunk(78);
    await streamingHostile(port, data.length, async (write, next) => {
      write(FrameType.MANIFEST_STREAM, entry);
      write(FrameType.DATA, record);
      // Nothing more is sent: the receiver must notice the bad batch by itself (not at the
      // next frame), report it, then wait for our verdict.
      let f = await next();
      while (f.type !== FrameType.ERROR) f = await next();
      assert.equal(f.payload.readUInt16LE(0), ExitCode.PROTOCOL_STREAM);
      write(FrameType.ERROR, encodeError(ExitCode.VANISHED, 'EVANISHED', 'source /src changed during the sync; rerun to send the new version'));
    });
    const r = await peer.done;
    assert.equal(r.code, 24, r.stderr);
    assert.match(r.stderr, /ffsync-native: error: peer: source \/src changed during the sync/);
    assert.deepEqual(fs.readdirSync(dir), [], 'no target, no provisional file');
  });

  it('a torn entry (not a multiple of 36 bytes): exit 12', async () => {
    const old = seeded(1_000_000, 74);
    const v = await victim(old);
    await streamingHostile(v.port, old.length, (write) => write(FrameType.MANIFEST_STREAM, Buffer.alloc(35)));
    const r = await v.peer.done;
    assert.equal(r.code, 12, r.stderr);
    assert.match(r.stderr, /not whole entries/);
    assert.deepEqual(snapshot(v.dir), v.before);
  });

  it('early DATA before any streamed entry (fresh target): exit 12, nothing left behind', async () => {
    const { dir, peer, port } = await freshVictim();
    const data = seeded(STREAM_WINDOW + 4_000_000, 77);
    await streamingHostile(port, data.length, (write) => write(FrameType.DATA, rawRecord(0, data.subarray(0, 100))));
    const r = await peer.done;
    assert.equal(r.code, 12, r.stderr);
    assert.match(r.stderr, /before any MANIFEST_STREAM entry/);
    assert.deepEqual(fs.readdirSync(dir), [], 'no target, no provisional file');
  });
});

describe('scan streams and the libuv pool', () => {
  it('streams waiting for their next window do not hold the libuv workers: fs calls go on meanwhile', async () => {
    const file = path.join(tmpdir(), 'big.bin');
    const fd = fs.openSync(file, 'w');
    for (let at = 0; at < STREAM_WINDOW + 8 * MiB; at += 8 * MiB) fs.writeSync(fd, crypto.randomBytes(8 * MiB));
    fs.closeSync(fd);
    // More streams than libuv has workers (4 unless UV_THREADPOOL_SIZE says otherwise), each
    // hashing a whole 64 MiB window before its first step.
    const workers = Number(process.env.UV_THREADPOOL_SIZE ?? 4);
    const streams = await Promise.all(Array.from({ length: workers + 1 }, () => openScanStream(file, STREAM_WINDOW, { stateDir: path.join(tmpdir(), 's') })));
    try {
      const order: string[] = [];
      const steps = streams.map((st) => st.next().then(() => order.push('step')));
      await fs.promises.stat(file).then(() => order.push('stat'));
      await Promise.all(steps);
      assert.equal(order[0], 'stat', `a stat waited for a whole window to be hashed: ${order.join(', ')}`);
    } finally {
      for (const st of streams) st.release();
    }
  });
});

describe('a sender whose file grew after its offer', () => {
  it('stops before streaming entries past the offered size: exit 24 (source changed), not the receiver\'s exit 12', async () => {
    const source = path.join(tmpdir(), 'source.bin');
    fs.writeFileSync(source, seeded(STREAM_WINDOW * 2 + 1_000_000, 78));
    // The offer's view of the file: one window and a bit (it "grew" by most of a window since).
    const st = { ...fs.statSync(source, { bigint: true }), size: BigInt(STREAM_WINDOW + 4_000_000) } as fs.BigIntStats;
    const srv = net.createServer();
    await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
    const accepted = new Promise<net.Socket>((r) => srv.once('connection', r));
    const c = net.connect((srv.address() as net.AddressInfo).port, '127.0.0.1');
    const a = new FramedConnection(c, 20_000);
    const b = new FramedConnection(await accepted, 20_000);
    try {
      // The receiver's side: BASIS "not empty" (no early DATA), then whatever comes.
      await b.send(FrameType.BASIS, encodeBasis({ empty: false }));
      let described = 0;
      const reading = (async () => {
        for (;;) {
          const f = await b.recv();
          if (f.type !== FrameType.MANIFEST_STREAM) return f.type;
          for (let at = 0; at < f.payload.length; at += 36) described += f.payload.readUInt32LE(at);
          f.release?.();
        }
      })();
      reading.catch(() => undefined);
      await assert.rejects(
        sendFileContent(a, { path: source, st, scan: null, level: 0, label: 'source.bin', stream: true, stateDir: path.join(tmpdir(), 'ss') }),
        (e: FfsyncError) => e.code === 'EVANISHED' && e.exitCode === ExitCode.VANISHED && /grew while it was being scanned/.test(e.message),
      );
      c.destroy();
      await reading.catch(() => undefined);
      assert.ok(described > 0, 'the first window went out');
      assert.ok(described <= Number(st.size), `entries for ${described} bytes streamed, more than the ${st.size} offered`);
    } finally {
      c.destroy();
      srv.close();
    }
  });
});
