// The receiver's write slots (decisions §82): DATA batches being written natively are bounded for
// a whole session, and a batch waiting for a slot stays in its connection's queue, where flow
// control counts it, instead of in the hands of its conversation.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { FrameType } from '../ts/protocol/frames';
import { FramedConnection } from '../ts/transport/connection';
import { pipePair } from '../ts/transport/stream-pair';
import { SharedUnits } from '../ts/utils/data-turns';
import { takeWithSlot, WRITE_SLOTS, writeSlots } from '../ts/api/write-slots';

function pair(): { out: FramedConnection; inn: FramedConnection; close: () => void } {
  const [a, b] = pipePair();
  return {
    out: new FramedConnection(a, 0),
    inn: new FramedConnection(b, 0),
    close: () => {
      a.destroy();
      b.destroy();
    },
  };
}

const tick = () => new Promise((r) => setTimeout(r, 50));

describe('write slots', () => {
  it('a session has three: two writing on two cores and one queued behind them (decisions §116)', () => {
    assert.equal(WRITE_SLOTS, 3);
    assert.equal(writeSlots().available, 3);
  });

  it('a DATA batch waits for a slot in its connection’s queue, counted there, and is the batch taken once one is free', async () => {
    const { out, inn, close } = pair();
    const slots = new SharedUnits(1);
    try {
      await slots.acquire(1); // another file's write holds the only slot
      await out.send(FrameType.DATA, Buffer.alloc(100_000, 7));
      await out.send(FrameType.DATA_END, Buffer.alloc(3));
      let taken: Awaited<ReturnType<typeof takeWithSlot>> | undefined;
      const waiting = takeWithSlot(inn, () => inn.recv(), slots).then((t) => (taken = t));
      await tick();
      assert.equal(taken, undefined, 'no slot, no batch');
      // Both frames are in the queue: the batch went back to its front, where the window counts it.
      assert.equal(inn.pendingBytes, 100_000 + 3);
      slots.release(1);
      await waiting;
      assert.equal(taken!.frame.type, FrameType.DATA);
      assert.equal(taken!.frame.payload[0], 7, 'the same batch, first in order');
      assert.equal(slots.available, 0, 'the batch holds the slot');
      taken!.done();
      taken!.done();
      assert.equal(slots.available, 1, 'given back once, however often done is called');
      // A frame that is no batch takes no slot.
      const end = await takeWithSlot(inn, () => inn.recv(), slots);
      assert.equal(end.frame.type, FrameType.DATA_END);
      assert.equal(slots.available, 1);
    } finally {
      close();
    }
  });

  it('slots are given in the order batches asked for them, across connections', async () => {
    const slots = new SharedUnits(1);
    const conns = [pair(), pair(), pair()];
    try {
      for (const [i, c] of conns.entries()) await c.out.send(FrameType.DATA, Buffer.alloc(10, i));
      const first = await takeWithSlot(conns[0]!.inn, () => conns[0]!.inn.recv(), slots);
      const order: number[] = [];
      const later = [1, 2].map((i) => takeWithSlot(conns[i]!.inn, () => conns[i]!.inn.recv(), slots).then((t) => (order.push(t.frame.payload[0]!), t)));
      await tick();
      assert.deepEqual(order, []);
      first.done();
      const second = await later[0]!;
      assert.deepEqual(order, [1]);
      second.done();
      (await later[1]!).done();
      assert.deepEqual(order, [1, 2]);
      assert.equal(slots.available, 1);
    } finally {
      for (const c of conns) c.close();
    }
  });

  it('a connection that fails while its batch waits for a slot ends the wait; the slot, when it comes, goes straight back', async () => {
    const { out, inn, close } = pair();
    const slots = new SharedUnits(1);
    try {
      await slots.acquire(1); // another file's write holds the only slot
      await out.send(FrameType.DATA, Buffer.alloc(10));
      const waiting = takeWithSlot(inn, () => inn.recv(), slots);
      waiting.catch(() => undefined);
      await tick();
      inn.failWith(new Error('connection lost'));
      await assert.rejects(waiting, /connection lost/);
      assert.equal(slots.available, 0);
      slots.release(1); // the write finishes: its slot goes to the abandoned wait, which gives it back
      await tick();
      assert.equal(slots.available, 1, 'no slot kept by a conversation that is gone');
    } finally {
      close();
    }
  });

  it('a re-take that fails after the grant gives the slot back', async () => {
    const { out, inn, close } = pair();
    const slots = new SharedUnits(1);
    try {
      await slots.acquire(1);
      await out.send(FrameType.DATA, Buffer.alloc(10));
      let calls = 0;
      const take = () => (++calls === 1 ? inn.recv() : Promise.reject(new Error('receive failed')));
      const waiting = takeWithSlot(inn, take, slots);
      await tick();
      slots.release(1);
      await assert.rejects(waiting, /receive failed/);
      assert.equal(slots.available, 1, 'the slot went back with the failure');
    } finally {
      close();
    }
  });
});
