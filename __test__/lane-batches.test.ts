// A session on many lanes sends smaller DATA batches, and the receiver's frame pool has buffers
// of that size (decisions §120): the receiver assembles one frame on every lane at once, so its
// memory grows with lanes × batch size. Checked by the rule, the pool's two sizes, the MUX
// frames' cut, and on the wire by a relay reading every frame the sender's connections carry.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import { BATCH_BYTES, batchBuffer, FULL_BATCH_LANES, LANE_BATCH_BYTES, READ_AHEAD, readAheadFor, sessionBatchBytes } from '../ts/api/content-send';
import { encodeFrame, FRAME_POOL_BUFFER, FRAME_POOL_KEPT, FRAME_POOL_SMALL_BUFFER, FramePool, FrameType } from '../ts/protocol/frames';
import { MUX_FRAME_DATA, muxFrameData, muxGroups } from '../ts/transport/mux';
import { frameRelay } from './helpers/frame-relay';
import { assertSameTree, seeded, sender, startReceiver, tmpdir } from './helpers/peers';

const MiB = 1024 * 1024;

describe('DATA batches on many lanes', () => {
  it('full batches on up to four connections, 1 MiB batches beyond; each fits a buffer of the pool', () => {
    for (let n = 1; n <= FULL_BATCH_LANES; n++) assert.equal(sessionBatchBytes(n), BATCH_BYTES, `${n} connections`);
    for (const n of [5, 8, 16]) assert.equal(sessionBatchBytes(n), LANE_BATCH_BYTES, `${n} connections`);
    assert.equal(LANE_BATCH_BYTES, MiB);
    // A batch's buffer, and the MUX frame carrying it, fit the receiver's buffers of each size.
    assert.equal(batchBuffer(BATCH_BYTES), FRAME_POOL_BUFFER);
    assert.equal(batchBuffer(LANE_BATCH_BYTES), FRAME_POOL_SMALL_BUFFER);
    assert.equal(muxFrameData(FRAME_POOL_BUFFER), MUX_FRAME_DATA);
    // The sender encodes the same bytes ahead of its socket either way.
    assert.equal(readAheadFor(BATCH_BYTES), READ_AHEAD);
    assert.equal(readAheadFor(LANE_BATCH_BYTES) * LANE_BATCH_BYTES, READ_AHEAD * BATCH_BYTES);
  });

  it('the frame pool: a frame up to the small size takes a small buffer, or an idle large one; each size is kept and dropped', () => {
    const pool = new FramePool(FRAME_POOL_BUFFER, FRAME_POOL_KEPT);
    pool.join();
    const a = pool.take(MiB);
    assert.equal(a.length, FRAME_POOL_SMALL_BUFFER, 'a 1 MiB frame takes a buffer of the small size');
    const b = pool.take(2 * MiB);
    assert.equal(b.length, FRAME_POOL_BUFFER, 'a 2 MiB frame takes one of the large size');
    assert.equal(pool.allocated, 2);
    assert.equal(pool.idleFits(MiB), false);
    pool.release(b);
    assert.equal(pool.idle, 1);
    assert.equal(pool.idleFits(MiB), true, 'an idle large buffer takes a small frame');
    assert.equal(pool.idleFits(3 * MiB), false);
    // No small one idle: the idle large one serves the small frame (it is resident already).
    const c = pool.take(MiB);
    assert.equal(c, b, 'the idle large buffer, not a new small one');
    assert.equal(pool.allocated, 2, 'nothing made');
    pool.release(a);
    pool.release(c);
    assert.equal(pool.idle, 2, 'each size kept idle');
    // A small idle one is preferred for a small frame; a large frame never takes a small one.
    assert.equal(pool.take(MiB), a);
    assert.equal(pool.take(1.5 * MiB), b);
    const d = pool.take(1.5 * MiB);
    assert.equal(d.length, FRAME_POOL_BUFFER, 'a frame over the small size makes a large buffer');
    pool.release(a);
    pool.release(b);
    pool.release(d);
    assert.equal(pool.idle, 3);
    pool.leave();
    assert.equal(pool.idle, 0, 'its last user gone, the pool keeps nothing of either size');
  });

  it('a stream writer handing over several 1 MiB frames: MUX frames cut at the lanes batch size, not two batches in one', () => {
    const parts = [0, 1, 2].flatMap((k) => {
      const f = encodeFrame(FrameType.DATA, Buffer.alloc(MiB - 64, k));
      return [f.subarray(0, 5), f.subarray(5)];
    });
    assert.equal(muxGroups(parts).length, 2, 'the default cut carries two batches in a frame');
    const cut = muxGroups(parts, muxFrameData(batchBuffer(LANE_BATCH_BYTES)));
    assert.equal(cut.length, 3, 'one batch per MUX frame');
    for (const g of cut) assert.ok(g.reduce((n, p) => n + p.length, 0) <= muxFrameData(FRAME_POOL_SMALL_BUFFER));
  });

  /** Sends `src` to a fresh target through a relay over `--parallel lanes`; the largest frame any
   * of the sender's connections carried, and the lanes the session had. */
  async function largestFrame(work: string, src: string, lanes: number): Promise<{ largest: number; lanes: number }> {
    const dst = path.join(work, `dst-${lanes}`);
    const { peer, port } = await startReceiver(dst, ['--state-dir', path.join(work, `state-r-${lanes}`)]);
    let largest = 0;
    const relay = await frameRelay(port, (frame, fromSender) => {
      if (fromSender) largest = Math.max(largest, frame.length);
    });
    try {
      const s = await sender(src, relay.port, ['--state-dir', path.join(work, `state-s-${lanes}`), '--parallel', String(lanes)]).done;
      const r = await peer.done;
      assert.equal(s.code, 0, s.stderr);
      assert.equal(r.code, 0, r.stderr);
      assertSameTree(dst, src);
      return { largest, lanes: s.summary!.tree.lanes as number };
    } finally {
      relay.close();
    }
  }

  it('on the wire: eight lanes carry frames of at most a 1 MiB batch, four lanes full batches; every file verified', async () => {
    const work = tmpdir('ffsync-lane-batches-');
    try {
      const src = path.join(work, 'src');
      fs.mkdirSync(src);
      for (let i = 0; i < 12; i++) fs.writeFileSync(path.join(src, `big${i}.bin`), seeded(3 * MiB, 1200 + i));
      const eight = await largestFrame(work, src, 8);
      assert.equal(eight.lanes, 8);
      assert.ok(eight.largest <= FRAME_POOL_SMALL_BUFFER, `largest frame on eight lanes: ${eight.largest} bytes`);
      assert.ok(eight.largest > MiB - 256 * 1024, `full 1 MiB batches: ${eight.largest} bytes`);
      const four = await largestFrame(work, src, 4);
      assert.equal(four.lanes, 4);
      assert.ok(four.largest > FRAME_POOL_SMALL_BUFFER && four.largest <= FRAME_POOL_BUFFER, `largest frame on four lanes: ${four.largest} bytes`);
    } finally {
      fs.rmSync(work, { recursive: true, force: true });
    }
  });
});
