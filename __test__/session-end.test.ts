// The end of a multiplexed tree session (protocol version 2) costs half a round trip after the
// receiver's last file, not two and a half: the sender ends each stream (LANE_END) and the tree
// (TREE_END) as soon as its files are sent, and reads their RESULTs afterwards (decisions §91).
// A sender that waited for every RESULT before TREE_END paid at least a round trip per session
// for nothing (the 100-file latency scenario over 30 ms RTT: 0.71 -> 0.63 s). The relay below withholds every
// stream's RESULTs from the sender until TREE_END has passed it: a sender that waits for a
// RESULT before TREE_END can never pass that barrier, and the relay lets go after HOLD_MS.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { describe, it } from 'node:test';
import { FrameType } from '../ts/protocol/frames';
import { assertSameTree, partials, type PeerResult, run, seeded, startReceiver, tmpdir } from './helpers/peers';
import { relayFrames } from './helpers/frame-relay';

const KiB = 1024;
/** Longer than an honest session of this size takes on loopback, short enough for CI. */
const HOLD_MS = 8000;

interface Barrier {
  port: number;
  /** RESULTs the receiver sent (each a large file's conversation ending). */
  results: number;
  /** MUX frames from the receiver held back (a RESULT and what followed it on its stream). */
  held: number;
  /** What ended the hold: TREE_END passing towards the receiver, or the timer. */
  releasedBy: 'TREE_END' | 'timeout' | undefined;
  close(): void;
}

/**
 * A plaintext relay. From the receiver, a MUX frame that carries a RESULT (our peers write an
 * inner frame whole in one MUX frame: `stream id u32 | length u32 | type u8 | …`) marks its
 * stream: it and every later frame of that stream wait, in order, until the sender's TREE_END
 * passes the other way (or HOLD_MS). Everything else passes at once, so NEEDs, DELIVERED and
 * the other streams keep moving.
 */
async function barrier(targetPort: number, needs?: NeedGate, corrupt?: { stream: number; done: boolean }): Promise<Barrier> {
  // Resolved in a microtask, before any further socket read: no frame slips between.
  let needsOpen = false;
  const state: Barrier = { port: 0, results: 0, held: 0, releasedBy: undefined, close: () => undefined };
  const server = net.createServer((down) => {
    const up = net.connect(targetPort, '127.0.0.1');
    const heldStreams = new Set<number>();
    const queue: Buffer[] = [];
    let timer: NodeJS.Timeout | undefined;
    const release = (why: 'TREE_END' | 'timeout') => {
      if (state.releasedBy) return;
      state.releasedBy = why;
      clearTimeout(timer);
      for (const f of queue.splice(0)) down.write(f);
    };
    // The corrupted stream's frames, from the corrupted one on, wait until TREE_END has passed
    // towards the receiver: the chunk fails after TREE_END went, whichever peer is faster (the
    // receiver that rejects it at once must not stop the sender before its TREE_END).
    const corruptedHeld: Buffer[] = [];
    let treeEndPassed = false;
    relayFrames(down, up, (frame) => {
      if (frame[4] === FrameType.TREE_END) {
        setImmediate(() => release('TREE_END'));
        treeEndPassed = true;
        up.write(frame);
        for (const f of corruptedHeld.splice(0)) up.write(f);
        return false;
      }
      const ofCorrupted = corrupt && frame[4] === FrameType.MUX && frame.length >= 9 && frame.readUInt32LE(5) === corrupt.stream;
      // One byte of the stream's first DATA frame, in its last record's bytes. A MUX frame may
      // carry several of the stream's frames (writes that queued behind a pending one): the
      // DATA frame is found among them, never a length field of another hit.
      if (ofCorrupted && !corrupt.done) {
        for (let at = 9; at + 5 <= frame.length; ) {
          const end = at + 4 + frame.readUInt32LE(at);
          if (end > frame.length) break;
          if (frame[at + 4] === FrameType.DATA && end - at > 64) {
            frame[end - 20] ^= 0xff;
            corrupt.done = true;
            break;
          }
          at = end;
        }
      }
      if (ofCorrupted && corrupt.done && !treeEndPassed) {
        corruptedHeld.push(frame);
        return false;
      }
      return true;
    });
    const needsHeld: Buffer[] = [];
    void needs?.open.then(() => {
      needsOpen = true;
      for (const f of needsHeld.splice(0)) down.write(f);
    });
    relayFrames(up, down, (frame) => {
      if (frame[4] !== FrameType.MUX || frame.length < 14) return true;
      if (needs && !needsOpen) {
        // Everything from the receiver's first NEED on waits for the gate, in order.
        if (frame[13] === FrameType.NEED || needsHeld.length > 0) {
          needsHeld.push(frame);
          needs.seen();
          return false;
        }
      }
      const id = frame.readUInt32LE(5);
      const result = frame[13] === FrameType.RESULT && frame.readUInt32LE(9) === frame.length - 13;
      if (result) state.results++;
      if (state.releasedBy) return true;
      if (result && !heldStreams.has(id)) {
        heldStreams.add(id);
        timer ??= setTimeout(() => release('timeout'), HOLD_MS);
      }
      if (!heldStreams.has(id)) return true;
      queue.push(frame);
      state.held++;
      return false;
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  state.port = (server.address() as net.AddressInfo).port;
  state.close = () => server.close();
  return state;
}

/** Holds the receiver's stream frames from its first NEED on, until `open` resolves. */
interface NeedGate {
  open: Promise<void>;
  seen: () => void;
}

/** Six files over 64 KiB and a small one. The receiver has older versions of three (with older
 * mtimes: written in the same tick as the source, the quick check would call them unchanged), so
 * three conversations run, each on a stream of its own; files new to the receiver (up to 1 MiB)
 * go whole in a FILE_BATCH. */
function fixture(dir: string): { src: string; dst: string } {
  const [src, dst] = ['src', 'dst'].map((d) => path.join(dir, d));
  fs.mkdirSync(src);
  fs.mkdirSync(dst);
  for (let i = 0; i < 6; i++) {
    const body = seeded(256 * KiB, 300 + i);
    fs.writeFileSync(path.join(src, `f${i}.bin`), body);
    if (i % 2 === 0) {
      body.fill(7, 1000, 5000);
      fs.writeFileSync(path.join(dst, `f${i}.bin`), body);
      fs.utimesSync(path.join(dst, `f${i}.bin`), new Date(2020, 0, 1), new Date(2020, 0, 1));
    }
  }
  fs.writeFileSync(path.join(src, 'small.txt'), 'small\n');
  return { src, dst };
}

/** `body` with a fresh fixture in a temporary directory, removed afterwards. */
async function withFixture(body: (t: { dir: string; src: string; dst: string }) => Promise<void>): Promise<void> {
  const dir = tmpdir();
  try {
    await body({ dir, ...fixture(dir) });
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

/** One `send` of `src` to a receiver of `dst` through a barrier relay; `during` runs while the
 * session does (the peers' results wait for it too). */
async function throughBarrier(
  dir: string,
  src: string,
  dst: string,
  o: { needs?: NeedGate; corrupt?: { stream: number; done: boolean }; sendArgs?: string[]; during?: () => Promise<void> } = {},
): Promise<{ send: PeerResult; recv: PeerResult; relay: Barrier; ms: number; both: string }> {
  const { peer, port } = await startReceiver(dst, ['--state-dir', path.join(dir, 'state-r')]);
  const relay = await barrier(port, o.needs, o.corrupt);
  try {
    const t0 = Date.now();
    const sending = run(['send', src, `127.0.0.1:${relay.port}`, '--plaintext', '--json', '--timeout', '30', '--state-dir', path.join(dir, 'state-s'), ...(o.sendArgs ?? [])]).done;
    await o.during?.();
    const [send, recv] = await Promise.all([sending, peer.done]);
    const both = `sender exit ${send.code}: ${send.stderr}\nreceiver exit ${recv.code}: ${recv.stderr}`;
    return { send, recv, relay, ms: Date.now() - t0, both };
  } finally {
    relay.close();
  }
}

describe('the end of a multiplexed tree session', () => {
  it('TREE_END goes out once the files are sent, before any of their RESULTs is read; the tree arrives whole', async () => {
    await withFixture(async ({ dir, src, dst }) => {
      const { send, recv, relay, ms, both } = await throughBarrier(dir, src, dst);
      assert.equal(send.code, 0, both);
      assert.equal(recv.code, 0, both);
      // The three delta conversations each ended with a RESULT the relay recognised (a
      // change in how MUX frames are cut would otherwise leave nothing to hold).
      assert.equal(relay.results, 3, 'RESULTs seen in MUX frames from the receiver');
      assert.equal(relay.releasedBy, 'TREE_END', `the sender waited for a RESULT before TREE_END: the relay held ${relay.held} frames and let them go after ${HOLD_MS} ms (session ${ms} ms)`);
      assert.equal(send.summary?.tree?.written, 7, 'every file was written, as TREE_RESULT reports');
      assertSameTree(dst, src);
    });
  });

  it('a file whose source changes while its needs travel fails alone (its ERROR, then its stream\'s LANE_END): exit 24, the rest synced', async () => {
    await withFixture(async ({ dir, src, dst }) => {
      const oldF0 = fs.readFileSync(path.join(dst, 'f0.bin'));
      // The receiver's NEEDs wait while f0 changes on the sender, which sees it before its DATA
      // (its identity, ctime included, is checked again) and ends that file with an ERROR on its
      // stream; LANE_END follows on the same stream, and TREE_END once the other files are sent.
      let openGate!: () => void;
      let seen!: () => void;
      const needSeen = new Promise<void>((resolve) => (seen = resolve));
      const needs: NeedGate = { open: new Promise<void>((resolve) => (openGate = resolve)), seen };
      const during = async () => {
        await needSeen;
        const fd = fs.openSync(path.join(src, 'f0.bin'), 'r+');
        fs.writeSync(fd, Buffer.alloc(4000, 9), 0, 4000, 1000);
        fs.closeSync(fd);
        openGate();
      };
      const { send, recv, relay, both } = await throughBarrier(dir, src, dst, { needs, during });
      assert.equal(send.code, 24, both);
      assert.equal(recv.code, 24, both);
      assert.match(recv.stderr, /f0\.bin changed or vanished on the sender during the sync/, both);
      assert.equal(relay.releasedBy, 'TREE_END', `the sender waited for a RESULT before TREE_END (${relay.held} frames held)`);
      assert.deepEqual(fs.readFileSync(path.join(dst, 'f0.bin')), oldF0, 'the failed file is left as it was');
      for (const name of ['f1.bin', 'f2.bin', 'f3.bin', 'f4.bin', 'f5.bin', 'small.txt']) {
        assert.deepEqual(fs.readFileSync(path.join(dst, name)), fs.readFileSync(path.join(src, name)), `${name} synced`);
      }
    });
  });

  it('a chunk that fails its hash after the stream ended and TREE_END went (the source unchanged: a bad wire): exit 12 on both sides, the old file kept, nothing deleted', async () => {
    await withFixture(async ({ dir, src, dst }) => {
      fs.writeFileSync(path.join(dst, 'extra.txt'), 'receiver only\n');
      const oldF0 = fs.readFileSync(path.join(dst, 'f0.bin'));
      const corrupt = { stream: 1, done: false };
      // Uncompressed: the flipped byte reaches the hash check.
      const { send, recv, relay, both } = await throughBarrier(dir, src, dst, { corrupt, sendArgs: ['--no-compress'] });
      assert.ok(corrupt.done, 'the relay flipped a byte of a DATA frame');
      assert.equal(send.code, 12, both);
      assert.equal(recv.code, 12, both);
      assert.equal(relay.releasedBy, 'TREE_END', `the sender waited for a RESULT before TREE_END (${relay.held} frames held)\n${both}`);
      assert.equal(fs.readFileSync(path.join(dst, 'extra.txt'), 'utf8'), 'receiver only\n', 'nothing deleted');
      assert.deepEqual(partials(dst), [], 'no partial file left behind');
      assert.deepEqual(fs.readFileSync(path.join(dst, 'f0.bin')), oldF0, 'the file whose chunk failed is left as it was');
    });
  });
});
