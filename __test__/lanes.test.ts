// Lanes of a parallel tree session open side by side. Each lane costs round trips to open
// (TCP, TLS, HELLO, JOIN); when the sender opened them one after another, or the receiver
// authenticated them one after another, `--parallel 8` over a 30 ms link started its files
// about half a second late and ended slower than one connection (bench/RESULTS.md, the
// latency rows). These tests hold a barrier that a one-at-a-time side can never pass: the
// peer they play answers no lane until every lane has reached the same step.
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import { describe, it } from 'node:test';
import { acceptLanes, LANE_TOKEN_BYTES, localLanes, openLanes } from '../ts/api/lanes';
import { expect, handshake } from '../ts/api/session';
import { FramedConnection } from '../ts/transport/connection';
import { FrameType } from '../ts/protocol/frames';
import { Role } from '../ts/protocol/messages';

const TIMEOUT_MS = 10_000;

/** `p`, or a failure naming what did not happen within TIMEOUT_MS. */
function within<T>(p: Promise<T>, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: not within ${TIMEOUT_MS} ms (lanes handled one at a time, or waiting for the slowest?)`)), TIMEOUT_MS);
  });
  return Promise.race([p, late]).finally(() => clearTimeout(timer));
}

/** acceptLanes on an in-process listener, as a receiver granting `maxLanes` lanes runs it. */
function receiving(maxLanes: number) {
  const { listener, dial } = localLanes();
  const token = crypto.randomBytes(LANE_TOKEN_BYTES);
  const joined: FramedConnection[] = [];
  const refused: string[] = [];
  const accepting = acceptLanes(listener, { token, timeoutMs: TIMEOUT_MS, maxLanes, onLane: (c) => joined.push(c), onRefused: (w) => refused.push(w) });
  return { listener, dial, token, joined, refused, accepting };
}

describe('lanes open side by side', () => {
  it('the receiver answers the HELLO of every lane before any has sent its JOIN', async () => {
    const { listener, dial, token, joined, refused, accepting } = receiving(4);
    const conns = await Promise.all(Array.from({ length: 4 }, async () => new FramedConnection(await dial(), TIMEOUT_MS)));
    // The barrier: all four handshakes complete before any JOIN goes out.
    await within(Promise.all(conns.map((c) => handshake(c, Role.SENDER))), 'the receiver answering four HELLOs');
    for (const c of conns) await c.send(FrameType.JOIN, token);
    await within(accepting, 'four lanes joining');
    assert.equal(joined.length, 4, 'every lane joined');
    assert.deepEqual(refused, []);
    listener.close();
    for (const c of [...conns, ...joined]) c.destroy();
  });

  it('a refused lane frees its place while the others authenticate', async () => {
    const { listener, dial, token, joined, refused, accepting } = receiving(2);
    const intruder = new FramedConnection(await dial(), TIMEOUT_MS);
    const honest = new FramedConnection(await dial(), TIMEOUT_MS);
    await within(Promise.all([handshake(intruder, Role.SENDER), handshake(honest, Role.SENDER)]), 'two HELLOs answered');
    await intruder.send(FrameType.JOIN, Buffer.alloc(LANE_TOKEN_BYTES));
    // The intruder's place is free again: a third connection is taken and joins.
    const late = new FramedConnection(await dial(), TIMEOUT_MS);
    await within(handshake(late, Role.SENDER), 'the third HELLO answered after the refusal');
    await honest.send(FrameType.JOIN, token);
    await late.send(FrameType.JOIN, token);
    await within(accepting, 'two lanes joining');
    assert.equal(joined.length, 2);
    assert.equal(refused.length, 1);
    assert.match(refused[0]!, /wrong session token/);
    listener.close();
    for (const c of [intruder, honest, late, ...joined]) c.destroy();
  });

  it('the sender dials every lane before any has been answered, and a lane works as soon as it joined', async () => {
    const { listener, dial } = localLanes();
    const token = crypto.randomBytes(LANE_TOKEN_BYTES);
    const working: FramedConnection[] = [];
    let firstAtWork!: () => void;
    const oneWorking = new Promise<void>((resolve) => (firstAtWork = resolve));
    const opening = openLanes(4, { dial, label: 'local', token, timeoutMs: TIMEOUT_MS }, async (lane) => {
      working.push(lane);
      firstAtWork();
    });
    // First barrier: the receiver we play answers nobody until all four connections are here.
    const socks = await within(Promise.all(Array.from({ length: 4 }, () => listener.accept())), 'four lanes dialled');
    const conns = socks.map((s) => new FramedConnection(s, TIMEOUT_MS));
    const join = async (c: FramedConnection) => {
      await handshake(c, Role.RECEIVER);
      return (await expect(c, FrameType.JOIN)).payload;
    };
    // Second barrier: one lane joins, and it must be at work before the others are answered.
    const tokens = [await join(conns[0]!)];
    await within(oneWorking, 'the first lane at work while the others wait');
    assert.equal(working.length, 1);
    tokens.push(...(await Promise.all(conns.slice(1).map(join))));
    await within(opening.settled, 'every lane opened');
    await opening.work;
    assert.equal(opening.lanes.length, 4);
    assert.equal(working.length, 4);
    for (const t of tokens) assert.ok(t.equals(token), 'each lane presents the session token');
    listener.close();
    for (const c of [...conns, ...opening.lanes]) c.destroy();
  });

  it('one lane failing to open fails the work of the lanes; the lanes that opened are listed for the caller to close', async () => {
    const { listener, dial } = localLanes();
    const token = crypto.randomBytes(LANE_TOKEN_BYTES);
    let calls = 0;
    const flaky = async () => {
      if (++calls === 2) throw new Error('connection refused (test)');
      return dial();
    };
    const serving = (async () => {
      const conns: FramedConnection[] = [];
      for (let i = 0; i < 2; i++) {
        const c = new FramedConnection(await listener.accept(), TIMEOUT_MS);
        conns.push(c);
        await handshake(c, Role.RECEIVER);
        await expect(c, FrameType.JOIN);
      }
      return conns;
    })();
    const opening = openLanes(3, { dial: flaky, label: 'local', token, timeoutMs: TIMEOUT_MS }, async () => undefined);
    await assert.rejects(within(opening.work, 'the work of the lanes settling'), /connection refused \(test\)/);
    await within(opening.settled, 'every open settled');
    assert.equal(opening.lanes.length, 2, 'the two lanes that opened are there to close');
    listener.close();
    for (const c of [...(await serving), ...opening.lanes]) c.destroy();
  });
});
