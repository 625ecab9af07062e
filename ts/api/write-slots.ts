// The receiver's DATA batches being verified and written natively, counted for the whole
// process: each file has at most WRITES_IN_FLIGHT of its own, and without a bound across files a
// session whose DATA arrives for five files at once (on lanes) held ten 2 MiB batches in native
// writes, where two cores finish no more than four at a time (decisions §82).

import { type Frame, FrameType } from '../protocol/frames.js';
import type { FramedConnection } from '../transport/connection.js';
import { SharedUnits } from '../utils/data-turns.js';

/** Batches being written at once in this process: two files' worth (WRITES_IN_FLIGHT each), what
 * one connection's session reaches. */
export const WRITE_SLOTS = 4;

const processSlots = new SharedUnits(WRITE_SLOTS);

/** A frame taken with a write slot when it is DATA: `done` gives the slot back (once; a no-op
 * for other frames). Call it when the batch's write has finished, failed or was dropped. */
export interface SlottedFrame {
  frame: Frame;
  done: () => void;
}

/**
 * The next frame from `take` (a receive on `conn`), holding a write slot if it is DATA. The slot
 * is held only while a batch is in hand, never while waiting for the peer: when none is free the
 * frame goes back to the front of `conn`'s queue, where it still counts against the connection's
 * window (so the connection stops reading, as it would behind a slow disk), and is taken again
 * once a slot is free. Slots are held only by writes in progress, which finish without the
 * network, so waiting for one cannot wait on another connection's peer.
 */
export async function takeWithSlot(conn: FramedConnection, take: () => Promise<Frame>, slots: SharedUnits = processSlots): Promise<SlottedFrame> {
  let frame = await take();
  if (frame.type !== FrameType.DATA) return { frame, done: () => undefined };
  if (!slots.tryAcquire(1)) {
    conn.unshift(frame);
    await slots.acquire(1);
    try {
      // The same frame: only this conversation takes from `conn`, and the queue's front is kept.
      frame = await take();
    } catch (e) {
      slots.release(1);
      throw e;
    }
    if (frame.type !== FrameType.DATA) {
      slots.release(1);
      return { frame, done: () => undefined };
    }
  }
  let held = true;
  return {
    frame,
    done: () => {
      if (!held) return;
      held = false;
      slots.release(1);
    },
  };
}

/** Write slots free now (tests). */
export function freeWriteSlots(): number {
  return processSlots.available;
}
