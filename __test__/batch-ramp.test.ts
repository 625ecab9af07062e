// The first DATA of a session goes in small batches that double up to BATCH_BYTES (decisions
// §109, ts/utils/batch-ramp.ts): the link need not wait for a whole 2 MiB batch to be encoded
// before its first frame. Cut by batchByBytes, claimed once per session by BatchRamp, and seen
// on the wire by a relay that sums each DATA frame's raw chunk lengths.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import { BATCH_BYTES } from '../ts/api/content-send';
import { FrameType } from '../ts/protocol/frames';
import { BatchRamp, RAMP_FIRST_BYTES } from '../ts/utils/batch-ramp';
import { batchByBytes } from '../ts/utils/manifest';
import { frameRelay } from './helpers/frame-relay';
import { run, seeded, startReceiver, tmpdir } from './helpers/peers';

const KiB = 1024;

/** A manifest whose chunks have these lengths (only what batchByBytes reads). */
function manifestOf(lengths: number[]): Buffer {
  const m = Buffer.alloc(64 + 36 * lengths.length);
  lengths.forEach((len, i) => m.writeUInt32LE(len, 64 + i * 36));
  return m;
}

const rawOf = (m: Buffer, batches: Uint32Array[]) => batches.map((b) => [...b].reduce((a, i) => a + m.readUInt32LE(64 + i * 36), 0));

describe('batch ramp', () => {
  it('batchByBytes with a first limit: the limit doubles batch by batch up to the full size, every chunk once, in order', () => {
    const lengths = Array.from({ length: 200 }, (_, i) => 32 * KiB + ((i * 7919) % 48) * KiB);
    const m = manifestOf(lengths);
    const all = Uint32Array.from(lengths.keys());
    const batches = batchByBytes(m, all, BATCH_BYTES, RAMP_FIRST_BYTES);
    assert.deepEqual(batches.flatMap((b) => [...b]), [...all], 'every chunk once, in order');
    const raw = rawOf(m, batches);
    let limit = RAMP_FIRST_BYTES;
    for (const r of raw) {
      assert.ok(r <= limit, `a batch of ${r} bytes over its limit ${limit}`);
      limit = Math.min(limit * 2, BATCH_BYTES);
    }
    assert.ok(raw[0]! > RAMP_FIRST_BYTES / 2 && raw[1]! > raw[0]! && raw[2]! > raw[1]! && raw[3]! > raw[2]!, `ramps: ${raw.slice(0, 5).join(', ')}`);
    assert.ok(raw.slice(4, -1).every((r) => r > BATCH_BYTES - 80 * KiB), 'full batches from the fifth on');
    // Without a first limit: full batches from the start (what every file but the first gets).
    assert.ok(rawOf(m, batchByBytes(m, all, BATCH_BYTES))[0]! > BATCH_BYTES - 80 * KiB);
    // A chunk larger than the first limit still goes, alone.
    const big = manifestOf([512 * KiB, 16 * KiB]);
    assert.deepEqual(batchByBytes(big, Uint32Array.from([0, 1]), BATCH_BYTES, RAMP_FIRST_BYTES).map((b) => [...b]), [[0], [1]]);
  });

  it('BatchRamp: pending until claimed; claimed once per session', () => {
    const ramp = new BatchRamp();
    assert.equal(ramp.pending, true);
    assert.equal(ramp.claim(), true, 'the first file to take its turn gets it');
    assert.equal(ramp.pending, false);
    assert.equal(ramp.claim(), false, 'every later file sends full batches');
  });

  /** The raw bytes of each DATA frame the sender sends (single-file session, plaintext). */
  const dataRelay = (targetPort: number, raws: number[]) =>
    frameRelay(targetPort, (frame, fromSender) => {
      if (!fromSender || frame[4] !== FrameType.DATA) return;
      const payload = frame.subarray(5);
      let raw = 0;
      for (let at = 0; at < payload.length; at += 13 + payload.readUInt32LE(at + 9)) raw += payload.readUInt32LE(at + 5);
      raws.push(raw);
    });

  it('on the wire: a session starts with small DATA frames that grow to full batches; the file arrives whole', async () => {
    const work = tmpdir('ffsync-ramp-');
    try {
      const data = seeded(12 * 1024 * KiB, 109);
      fs.writeFileSync(path.join(work, 'big.bin'), data);
      const dst = path.join(work, 'out.bin');
      const { peer, port } = await startReceiver(dst, ['--plaintext', '--state-dir', path.join(work, 'state-r')]);
      const raws: number[] = [];
      const relay = await dataRelay(port, raws);
      try {
        const send = await run(['send', path.join(work, 'big.bin'), `127.0.0.1:${relay.port}`, '--plaintext', '--json', '--timeout', '30', '--state-dir', path.join(work, 'state-s')]).done;
        const recv = await peer.done;
        assert.equal(send.code, 0, send.stderr);
        assert.equal(recv.code, 0, recv.stderr);
      } finally {
        relay.close();
      }
      assert.ok(fs.readFileSync(dst).equals(data), 'the file arrived whole');
      assert.equal(raws.reduce((a, b) => a + b, 0), data.length, 'every byte in DATA once');
      // Chunks of a 12 MiB file are at most 256 KiB: the first frame holds at most one more
      // than its 128 KiB limit allows, and the frames grow to full batches.
      assert.ok(raws[0]! <= RAMP_FIRST_BYTES + 256 * KiB, `first DATA frame ${raws[0]} bytes`);
      assert.ok(raws[0]! < BATCH_BYTES / 4 && raws[1]! < BATCH_BYTES / 2, `frames: ${raws.slice(0, 6).join(', ')}`);
      assert.ok(Math.max(...raws) > BATCH_BYTES - 300 * KiB, `full batches later: ${raws.join(', ')}`);
    } finally {
      fs.rmSync(work, { recursive: true, force: true });
    }
  });
});
