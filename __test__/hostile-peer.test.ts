// A hostile sender speaking the real protocol over a real socket. Every attempt ends with
// the documented error and exit code, and a before/after snapshot proves nothing on disk
// changed (or, for symlinks, that nothing outside the target changed).
import assert from 'node:assert/strict';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { describe, it } from 'node:test';
import { bystanders, seeded, sender, snapshot, snapshotTree, startReceiver, sync, tmpdir } from './helpers/peers';
import { frameReader, relayAddingExcludes } from './helpers/raw-peer';
import { encodeFrame, FrameType } from '../ts/protocol/frames';
import { Decision, decodeDecision, encodeDataEnd, encodeHello, encodeOffer, manifestFrames, OfferKind, Role } from '../ts/protocol/messages';
import { scanFile, openChunkSource } from '../ts/native/binding';

const hello = () => encodeFrame(FrameType.HELLO, encodeHello({ minVersion: 1, maxVersion: 1, capabilities: 1, role: Role.SENDER, software: 'hostile' }));

/** Connect, then run `script` with a helper that reads frames from the receiver. */
async function hostile(port: number, script: (sock: net.Socket, next: () => Promise<{ type: number; payload: Buffer }>) => Promise<void>) {
  const sock = net.connect({ host: '127.0.0.1', port });
  await new Promise((r) => sock.once('connect', r));
  sock.on('error', () => undefined);
  await script(sock, frameReader(sock));
  sock.end();
}

async function victim() {
  const dir = tmpdir();
  const target = path.join(dir, 'target.bin');
  fs.writeFileSync(target, 'precious old content');
  const { peer, port } = await startReceiver(target, ['--state-dir', path.join(tmpdir(), 'state')]);
  return { dir, target, peer, port, before: snapshot(dir) };
}

async function offerFor(data: Buffer) {
  const d = tmpdir();
  const f = path.join(d, 'src');
  fs.writeFileSync(f, data);
  const scan = await scanFile(f, {});
  const offer = encodeFrame(FrameType.OFFER, encodeOffer({ kind: OfferKind.FILE, size: BigInt(data.length), mtimeNs: 1n, mode: 0o644, flags: 0 }));
  return { file: f, scan, offer };
}

describe('hostile sender', () => {
  it('frames out of order (OFFER before HELLO): exit 12, nothing changed', async () => {
    const v = await victim();
    const { offer } = await offerFor(seeded(1000, 1));
    await hostile(v.port, async (s) => void s.write(offer));
    const r = await v.peer.done;
    assert.equal(r.code, 12, r.stderr);
    assert.match(r.stderr, /unexpected frame/);
    assert.deepEqual(snapshot(v.dir), v.before);
  });

  it('DATA before the manifest: exit 12', async () => {
    const v = await victim();
    const { offer } = await offerFor(seeded(1000, 1));
    await hostile(v.port, async (s, next) => {
      s.write(hello());
      s.write(offer);
      await next(); // HELLO
      s.write(encodeFrame(FrameType.DATA, seeded(100, 2)));
    });
    assert.equal((await v.peer.done).code, 12);
    assert.deepEqual(snapshot(v.dir), v.before);
  });

  it('a truncated frame followed by a close: exit 12', async () => {
    const v = await victim();
    await hostile(v.port, async (s) => {
      s.write(hello());
      const f = encodeFrame(FrameType.OFFER, Buffer.alloc(54));
      s.write(f.subarray(0, 20));
    });
    assert.equal((await v.peer.done).code, 12);
    assert.deepEqual(snapshot(v.dir), v.before);
  });

  it('a manifest whose root does not match its chunk list: exit 12', async () => {
    const v = await victim();
    const data = seeded(200_000, 3);
    const { offer, scan } = await offerFor(data);
    const forged = Buffer.from(scan.manifest);
    forged[40] ^= 0xff; // inside the root
    await hostile(v.port, async (s, next) => {
      s.write(hello());
      s.write(offer);
      await next(); // HELLO
      assert.equal(decodeDecision((await next()).payload).decision, Decision.SEND_MANIFEST);
      for (const p of manifestFrames(forged)) s.write(encodeFrame(FrameType.MANIFEST, p));
    });
    const r = await v.peer.done;
    assert.equal(r.code, 12, r.stderr);
    assert.match(r.stderr, /root does not match/);
    assert.deepEqual(snapshot(v.dir), v.before);
  });

  it('chunk bytes that do not match the manifest: exit 12, temp file removed', async () => {
    const v = await victim();
    const data = seeded(200_000, 4);
    const { offer, scan, file } = await offerFor(data);
    const source = await openChunkSource(file, scan.manifest, 0);
    const buf = Buffer.alloc(300_000);
    const enc = await source.readBatch(Uint32Array.from([0]), buf);
    const batch = Buffer.from(buf.subarray(0, enc.length));
    batch[batch.length - 1] ^= 1;
    await hostile(v.port, async (s, next) => {
      s.write(hello());
      s.write(offer);
      await next();
      await next(); // DECISION
      for (const p of manifestFrames(scan.manifest)) s.write(encodeFrame(FrameType.MANIFEST, p));
      for (;;) if ((await next()).type === FrameType.NEED_END) break;
      s.write(encodeFrame(FrameType.DATA, batch));
      s.write(encodeFrame(FrameType.DATA_END, encodeDataEnd({ chunks: 1, rawBytes: BigInt(enc.rawBytes) })));
      await new Promise((r) => setTimeout(r, 300));
    });
    const r = await v.peer.done;
    assert.equal(r.code, 12, r.stderr);
    assert.match(r.stderr, /failed its hash check/);
    assert.deepEqual(snapshot(v.dir), v.before);
  });

  it('an offer claiming an absurd size cannot make the receiver allocate: manifest refused', async () => {
    const v = await victim();
    const offer = encodeFrame(FrameType.OFFER, encodeOffer({ kind: OfferKind.FILE, size: 1n << 60n, mtimeNs: 1n, mode: 0o644, flags: 0 }));
    await hostile(v.port, async (s, next) => {
      s.write(hello());
      s.write(offer);
      await next();
      await next();
      const part = Buffer.alloc(8);
      part.writeUInt32LE(0xffffffff, 0); // "4 GiB manifest follows"
      s.write(encodeFrame(FrameType.MANIFEST, part));
      await new Promise((r) => setTimeout(r, 200));
    });
    const r = await v.peer.done;
    assert.equal(r.code, 12, r.stderr);
    assert.match(r.stderr, /impossible for the offered file/, 'refused on the claimed length, before buffering');
    assert.deepEqual(snapshot(v.dir), v.before);
  });
});

describe('symlinks around the target', () => {
  it('a target that is a symlink to a file outside is replaced, the outside file untouched', async () => {
    const dir = tmpdir();
    const outside = path.join(tmpdir(), 'outside.bin');
    fs.writeFileSync(outside, 'do not touch');
    const inside = path.join(dir, 'in');
    fs.mkdirSync(inside);
    const target = path.join(inside, 'link.bin');
    fs.symlinkSync(outside, target);
    const src = path.join(dir, 'src.bin');
    fs.writeFileSync(src, seeded(100_000, 5));
    const res = await sync(src, target, { stateS: path.join(dir, 's'), stateR: path.join(dir, 'r') });
    assert.equal(res.recv.code, 0, res.recv.stderr);
    assert.equal(fs.readFileSync(outside, 'utf8'), 'do not touch');
    assert.ok(fs.lstatSync(target).isFile());
  });

  it('an identical target that is a symlink: the link is replaced, the file it points to keeps its mode and time', async () => {
    const dir = tmpdir();
    const data = seeded(100_000, 7);
    const outside = path.join(tmpdir(), 'outside.bin');
    fs.writeFileSync(outside, data);
    fs.chmodSync(outside, 0o600);
    const old = new Date('2001-01-01T00:00:00Z');
    fs.utimesSync(outside, old, old);
    const target = path.join(dir, 'link.bin');
    fs.symlinkSync(outside, target);
    const src = path.join(dir, 'src.bin');
    fs.writeFileSync(src, data);
    fs.chmodSync(src, 0o777);
    const res = await sync(src, target, { stateS: path.join(dir, 's'), stateR: path.join(dir, 'r') });
    assert.equal(res.recv.code, 0, res.recv.stderr);
    assert.ok(fs.lstatSync(target).isFile());
    assert.equal(fs.statSync(outside).mode & 0o777, 0o600);
    assert.equal(fs.statSync(outside).mtimeMs, old.getTime());
  });

  it('a symlink squatting on the partial file name is not followed', async () => {
    const dir = tmpdir();
    const outside = path.join(tmpdir(), 'victim.bin');
    fs.writeFileSync(outside, 'do not touch');
    const src = path.join(dir, 'src.bin');
    const data = seeded(100_000, 6);
    fs.writeFileSync(src, data);
    const root = (await scanFile(src, {})).root;
    const target = path.join(dir, 'target.bin');
    fs.symlinkSync(outside, path.join(dir, `.target.bin.${root.slice(0, 16)}.ffsync-part`));
    const res = await sync(src, target, { stateS: path.join(dir, 's'), stateR: path.join(dir, 'r') });
    assert.equal(res.recv.code, 0, res.recv.stderr);
    assert.equal(fs.readFileSync(outside, 'utf8'), 'do not touch');
    assert.deepEqual(fs.readFileSync(target), data);
  });
});

/** A man in the middle of a plaintext session that adds `extra` to the sender's FILTER. */
async function filterRewriter(receiverPort: number, extra: string[]): Promise<{ port: number; close: () => void }> {
  const server = net.createServer((client) => {
    const upstream = net.connect({ host: '127.0.0.1', port: receiverPort });
    client.on('error', () => undefined);
    upstream.on('error', () => undefined);
    relayAddingExcludes(client, upstream, extra);
    relayAddingExcludes(upstream, client);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return { port: (server.address() as net.AddressInfo).port, close: () => server.close() };
}

describe('writes never escape the target through links the receiver did not look at', () => {
  /** A receiver target holding `link -> <outside>`; the sender has a real `link/` tree
   * (small files, a deeper dir, a large file) and the receiver is told to exclude `link`. */
  async function attack(recvArgs: string[] = []) {
    const base = tmpdir();
    const { outside, sibling } = bystanders(base);
    fs.writeFileSync(path.join(outside, 'big.bin'), 'precious too');
    const target = path.join(base, 'target');
    fs.mkdirSync(target);
    fs.symlinkSync(outside, path.join(target, 'link'));
    const src = tmpdir();
    fs.writeFileSync(path.join(src, 'ok.txt'), 'fine');
    fs.mkdirSync(path.join(src, 'link', 'sub'), { recursive: true });
    fs.writeFileSync(path.join(src, 'link', 'victim.txt'), 'overwritten!');
    fs.writeFileSync(path.join(src, 'link', 'new.txt'), 'created outside');
    fs.writeFileSync(path.join(src, 'link', 'sub', 'deep.txt'), 'deeper');
    fs.writeFileSync(path.join(src, 'link', 'big.bin'), seeded(3 << 20, 9));
    const before = { outside: snapshotTree(outside), sibling: snapshotTree(sibling), parent: fs.readdirSync(base).sort() };
    const { peer, port } = await startReceiver(target, ['--state-dir', path.join(base, 'state-r'), ...recvArgs]);
    const mitm = await filterRewriter(port, ['link']);
    const send = await sender(src, mitm.port, ['--state-dir', path.join(base, 'state-s')]).done;
    const recv = await peer.done;
    mitm.close();
    return { base, outside, sibling, target, before, send, recv };
  }

  for (const variant of [{ name: 'out of place', args: [] }, { name: '--inplace', args: ['--inplace'] }]) {
    it(`FILE_BATCH files, a large file and a deeper directory under a hidden link (${variant.name}): per-path failures, nothing outside changed`, async () => {
      const a = await attack(variant.args);
      assert.deepEqual(snapshotTree(a.outside), a.before.outside, 'nothing outside the target changed');
      assert.deepEqual(snapshotTree(a.sibling), a.before.sibling, 'a sibling directory is untouched');
      assert.deepEqual(fs.readdirSync(a.base).filter((n) => !n.startsWith('state-')).sort(), a.before.parent.filter((n) => !n.startsWith('state-')).sort());
      assert.equal(a.recv.code, 23, a.recv.stderr);
      assert.match(a.recv.stderr, /link/);
      assert.equal(fs.readFileSync(path.join(a.target, 'ok.txt'), 'utf8'), 'fine', 'the rest of the tree synced');
      assert.ok(fs.lstatSync(path.join(a.target, 'link')).isSymbolicLink(), 'the link itself is left as it was');
      assert.deepEqual(fs.readdirSync(a.target).filter((n) => n.includes('ffsync-part')), [], 'no partial left behind');
    });
  }
});
