// The receiver's DATA batches being verified and written natively, counted for a whole session:
// each file has at most WRITES_IN_FLIGHT of its own, and without a bound across files a session
// whose DATA arrives for five files at once (on lanes) held ten 2 MiB batches in native writes,
// where two cores finish no more than four at a time (decisions §82). Per session, not per
// process: in `serve`, a session writing to a hung mount holds its own slots, never another's.

import { type Frame, FrameType } from '../protocol/frames.js';
import { type FramedConnection, PeerClosedError } from '../transport/connection.js';
import { SharedUnits } from '../utils/data-turns.js';

/** Batches one session writes at once. Two cores run two natively at once; the third is queued
 * behind them, so a core never waits for the JS thread to hand it the next. Four (two files'
 * worth, WRITES_IN_FLIGHT each) measured no faster, and once a session's lanes stopped reading as
 * soon as its window was full, the fourth was one more 2 MiB frame held in a busy receiver
 * (decisions §116; §85 measured no gain from fewer while the lanes read on past the window). */
export const WRITE_SLOTS = 3;

/** A session's write slots (tree-receive.ts makes one per session). */
export function writeSlots(): SharedUnits {
  return new SharedUnits(WRITE_SLOTS);
}

/** A frame taken with a write slot when it is DATA: `done` gives the slot back (once; a no-op
 * for other frames). Call it when the batch's write has finished, failed or was dropped. */
export interface SlottedFrame {
  frame: Frame;
  done: () => void;
}

const none = (): void => undefined;

/**
 * The next frame from `take` (a receive on `conn`), holding one of `slots` if it is DATA. The slot
 * is held only while a batch is in hand, never while waiting for the peer: when none is free the
 * frame goes back to the front of `conn`'s queue, where it still counts against the connection's
 * window (so the connection stops reading, as it would behind a slow disk), and is taken again
 * once a slot is free. Slots are held by writes in progress, which finish without the network, so
 * waiting for one never waits on a peer; the frame is marked (`parkForSlot`) so that the session
 * knows its bytes drain by local work alone (mux.ts, SessionWindow; decisions §119). The wait ends with `conn`: a connection that fails or
 * closes meanwhile rejects, and the slot, when it comes, goes straight back.
 */
export async function takeWithSlot(conn: FramedConnection, take: () => Promise<Frame>, slots: SharedUnits): Promise<SlottedFrame> {
  const first = await take();
  if (first.type !== FrameType.DATA) return { frame: first, done: none };
  if (!slots.tryAcquire(1)) {
    conn.parkForSlot(first);
    let granted = false;
    const grant = slots.acquire(1).then(() => {
      granted = true;
    });
    try {
      await conn.orFailure(grant);
    } finally {
      conn.unpark();
    }
    if (!granted) {
      void grant.then(() => slots.release(1));
      first.release?.();
      throw conn.failedWith ?? new PeerClosedError('while a batch waited to be written');
    }
    let again: Frame;
    try {
      again = await take();
    } catch (e) {
      slots.release(1);
      throw e;
    }
    // Only this conversation takes from `conn`, and the queue's front is kept: anything else
    // would be a batch skipped, surfacing later as the sender's fault in DATA_END.
    if (again !== first) {
      slots.release(1);
      throw new Error('internal: the batch put back for a write slot was not the one taken again');
    }
  }
  let held = true;
  return {
    frame: first,
    done: () => {
      if (!held) return;
      held = false;
      slots.release(1);
    },
  };
}
