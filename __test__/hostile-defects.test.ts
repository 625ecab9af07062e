// Issue 17 §5: smaller defects found with hostile peers.
// - A sender facing a receiver that breaks the protocol (a NEED beyond the manifest) or
//   reports an ERROR names the reason, not "the session stalled".
// - DATA after the receiver said "identical" is refused before anything on disk changes.
// - docs/protocol.md's capability bits are this build's (pinned by parsing the doc).
import assert from 'node:assert/strict';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { describe, it } from 'node:test';
import { run, seeded, snapshot, startReceiver, tmpdir } from './helpers/peers';
import { frameReader } from './helpers/raw-peer';
import { encodeFrame, FrameType } from '../ts/protocol/frames';
import {
  Capability,
  Decision,
  decodeDecision,
  encodeDataEnd,
  encodeDecision,
  encodeError,
  encodeHello,
  encodeOffer,
  manifestFrames,
  OfferKind,
  OUR_CAPABILITIES,
  Role,
} from '../ts/protocol/messages';
import { scanFile } from '../ts/native/binding';

type Next = () => Promise<{ type: number; payload: Buffer }>;


const hello = (role: number) => encodeFrame(FrameType.HELLO, encodeHello({ minVersion: 1, maxVersion: 1, capabilities: Capability.ZSTD, role, software: 'hostile' }));

/** A one-connection hostile receiver; `script` runs once the sender's OFFER arrived. The
 * frames the sender sent afterwards are returned when it hangs up. */
async function hostileReceiver(script: (sock: net.Socket, next: Next) => Promise<void>): Promise<{ port: number; frames: Promise<number[]>; close: () => void }> {
  const server = net.createServer();
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const frames = new Promise<number[]>((resolve) => {
    server.once('connection', (sock) => {
      sock.on('error', () => undefined);
      const next = frameReader(sock);
      const got: number[] = [];
      const tracked: Next = async () => {
        const f = await next();
        got.push(f.type);
        return f;
      };
      void (async () => {
        sock.write(hello(Role.RECEIVER));
        while ((await tracked()).type !== FrameType.OFFER);
        await script(sock, tracked);
        for (;;) await tracked();
      })().catch(() => resolve(got));
    });
  });
  return { port: (server.address() as net.AddressInfo).port, frames, close: () => server.close() };
}

/** Read MANIFEST frames until the whole manifest is in. */
async function readManifest(next: Next): Promise<Buffer> {
  const parts: Buffer[] = [];
  let total = -1;
  let got = 0;
  for (;;) {
    const f = await next();
    if (f.type !== FrameType.MANIFEST) continue;
    total = f.payload.readUInt32LE(0);
    parts.push(f.payload.subarray(4));
    got += f.payload.length - 4;
    if (got >= total) return Buffer.concat(parts);
  }
}

describe('a sender facing a receiver that fails', () => {
  const source = () => {
    const f = path.join(tmpdir(), 'src.bin');
    fs.writeFileSync(f, seeded(300_000, 11));
    return f;
  };

  for (const close of ['keeps the connection open', 'closes right after', 'resets right after', 'sends its own ERROR and closes'] as const) it(`NEED naming a chunk beyond the manifest, and the receiver ${close}: the sender exits 12 and says so (not "stalled")`, async () => {
    const h = await hostileReceiver(async (sock, next) => {
      sock.write(encodeFrame(FrameType.DECISION, encodeDecision(Decision.SEND_MANIFEST)));
      const m = await readManifest(next);
      const chunks = m.readUInt32LE(20);
      // One bitmap byte past the last chunk, every bit set.
      const need = Buffer.alloc(4 + Math.ceil(chunks / 8) + 1, 0xff);
      need.writeUInt32LE(0, 0);
      sock.write(encodeFrame(FrameType.NEED, need));
      if (close === 'closes right after') sock.end();
      if (close === 'resets right after') sock.resetAndDestroy();
      if (close === 'sends its own ERROR and closes') {
        sock.write(encodeFrame(FrameType.ERROR, encodeError(12, 'EPROTO', 'the receiver gives up too')));
        sock.end();
      }
    });
    const s = await run(['send', source(), `127.0.0.1:${h.port}`, '--plaintext', '--json', '--timeout', '10', '--state-dir', path.join(tmpdir(), 'ss')]).done;
    const frames = await h.frames;
    h.close();
    assert.equal(s.code, 12, s.stderr);
    // Our own finding, or the receiver's when it explained itself too (§7.2: the peer's
    // ERROR, already queued, is preferred); never "the session stalled".
    assert.match(s.stderr, close === 'sends its own ERROR and closes' ? /NEED names a chunk beyond the manifest|peer: the receiver gives up too/ : /NEED names a chunk beyond the manifest/);
    assert.doesNotMatch(s.stderr, /stalled/);
    if (close === 'keeps the connection open') assert.ok(frames.includes(FrameType.ERROR), 'the sender told the receiver why');
  });

  it('an ERROR from the receiver while the sender waits for NEED: the sender shows the peer\'s reason and exit code', async () => {
    const h = await hostileReceiver(async (sock, next) => {
      sock.write(encodeFrame(FrameType.DECISION, encodeDecision(Decision.SEND_MANIFEST)));
      await readManifest(next);
      sock.write(encodeFrame(FrameType.ERROR, encodeError(12, 'EPROTO', 'NEED names a chunk beyond the manifest (the receiver\'s view)')));
    });
    const s = await run(['send', source(), `127.0.0.1:${h.port}`, '--plaintext', '--json', '--timeout', '10', '--state-dir', path.join(tmpdir(), 'ss')]).done;
    h.close();
    assert.equal(s.code, 12, s.stderr);
    assert.match(s.stderr, /peer: NEED names a chunk beyond the manifest \(the receiver's view\)/);
    assert.doesNotMatch(s.stderr, /stalled/);
  });
});

describe('a receiver that found the content identical', () => {
  it('DATA instead of DATA_END is refused (exit 12) and the target keeps its mtime and mode', async () => {
    const dir = tmpdir();
    const target = path.join(dir, 'target.bin');
    const data = seeded(200_000, 12);
    fs.writeFileSync(target, data);
    fs.chmodSync(target, 0o600);
    const old = new Date('2001-02-03T04:05:06Z');
    fs.utimesSync(target, old, old);
    const before = fs.statSync(target, { bigint: true });
    const snap = snapshot(dir);
    const src = path.join(tmpdir(), 'src.bin');
    fs.writeFileSync(src, data);
    const scan = await scanFile(src, {});
    const { peer, port } = await startReceiver(target, ['--state-dir', path.join(tmpdir(), 'state')]);
    const sock = net.connect({ host: '127.0.0.1', port });
    sock.on('error', () => undefined);
    await new Promise((r) => sock.once('connect', r));
    const next = frameReader(sock);
    sock.write(hello(Role.SENDER));
    // Same bytes, another mtime and mode: no index, so the receiver asks for the manifest.
    sock.write(encodeFrame(FrameType.OFFER, encodeOffer({ kind: OfferKind.FILE, size: BigInt(data.length), mtimeNs: 1_000_000_000n, mode: 0o755, flags: 0 })));
    const got: { type: number; payload: Buffer }[] = [];
    for (;;) {
      const f = await next();
      got.push(f);
      if (f.type === FrameType.DECISION) break;
    }
    assert.equal(decodeDecision(got[got.length - 1].payload).decision, Decision.SEND_MANIFEST);
    for (const p of manifestFrames(scan.manifest)) sock.write(encodeFrame(FrameType.MANIFEST, p));
    let needEnd: Buffer | undefined;
    for (;;) {
      const f = await next();
      if (f.type === FrameType.NEED_END) {
        needEnd = f.payload;
        break;
      }
    }
    assert.equal(needEnd[4], 1, 'the receiver says identical');
    // DATA where only DATA_END is legal; then the DATA_END it would have wanted.
    const len0 = scan.manifest.readUInt32LE(64);
    const record = Buffer.alloc(13);
    record.writeUInt32LE(0, 0);
    record.writeUInt32LE(len0, 5);
    record.writeUInt32LE(len0, 9);
    sock.write(encodeFrame(FrameType.DATA, Buffer.concat([record, data.subarray(0, len0)])));
    sock.write(encodeFrame(FrameType.DATA_END, encodeDataEnd({ chunks: 0, rawBytes: 0n })));
    const r = await peer.done;
    sock.destroy();
    assert.equal(r.code, 12, r.stderr);
    assert.match(r.stderr, /unexpected frame 0x7/);
    const after = fs.statSync(target, { bigint: true });
    assert.equal(after.mtimeNs, before.mtimeNs, 'mtime unchanged');
    assert.equal(after.mode, before.mode, 'mode unchanged');
    assert.deepEqual(snapshot(dir), snap);
  });
});

describe('docs/protocol.md and the build agree on capabilities', () => {
  it('§4.1 states OUR_CAPABILITIES, bit by bit, and §6.2 defines every bit it names', () => {
    const doc = fs.readFileSync(path.join(__dirname, '..', 'docs', 'protocol.md'), 'utf8');
    const row = /^\| 10 \| 4 \| u32 \| capability bits[^|\n]*this build: `0x([0-9a-f]{8})`(.*)\|$/m.exec(doc);
    assert.ok(row, 'the HELLO table row with "this build: `0x…`"');
    const value = parseInt(row[1], 16);
    assert.equal(value, OUR_CAPABILITIES, `docs say 0x${row[1]}, the build sends 0x${OUR_CAPABILITIES.toString(16)}`);
    // Each bit is listed by name, and the names add up to the value.
    const listed = [...row[2].matchAll(/`([A-Z_]+)` `0x([0-9a-f]+)`/g)].map((m) => ({ name: m[1], bit: parseInt(m[2], 16) }));
    const names = listed.map((l) => l.name);
    assert.ok(names.length > 0, 'bits listed by name');
    const caps = Capability as Record<string, number>;
    let sum = 0;
    for (const { name, bit } of listed) {
      assert.equal(caps[name], bit, `${name} is Capability bit 0x${bit.toString(16)}`);
      if (name !== 'SERVE') sum |= bit;
    }
    assert.ok(names.includes('SERVE'), 'the daemon-only bit is named too');
    assert.equal(sum, OUR_CAPABILITIES, `the named bits ${names.join(', ')}`);
    // §6.2 has a row for each set bit, with the same name and value.
    for (let bit = 0; bit < 32; bit++) {
      if (!(OUR_CAPABILITIES & (1 << bit))) continue;
      const name = Object.keys(caps).find((k) => caps[k] === 1 << bit)!;
      const def = new RegExp(`\\| ${bit} \\(\`0x${(1 << bit).toString(16)}\`\\) \\| \`${name}\` \\|`);
      assert.match(doc, def, `§6.2 defines bit ${bit} as ${name}`);
    }
  });
});
