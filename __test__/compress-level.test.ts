// The adaptive zstd level (ts/api/compress-level.ts), driven by a fake clock: where a session
// starts from its handshake time, that it climbs while the socket holds the sender back and
// the encoder idles, that it comes down when compression stalls the pipe (but not on a
// pipeline still filling, nor on one noisy window), that it never leaves [base, cap], and
// that a pinned or disabled level never moves. The end-to-end effect on the wire is measured
// by bench/net.ts (bench/RESULTS-net.md).
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { BUFFER_GRACE_BYTES, FAST_CAP_LEVEL, LevelGovernor, LINK_QUEUE_MS, MAX_ADAPT_LEVEL, REMOTE_HANDSHAKE_MS, REMOTE_START_LEVEL, SLOW_LINK, WAN_HANDSHAKE_MS, WAN_START_LEVEL, startLevel } from '../ts/api/compress-level';
import { handshakeMs } from '../ts/transport/handshake-time';
import type { LinkSample } from '../ts/transport/delivery';
import { connect, listenOnce } from '../ts/transport/tcp';
import { tlsConnect, tlsListenOnce } from '../ts/transport/tls';
import { loadOrCreateIdentity } from '../ts/security/identity';
import { tcpDelayProxy } from './helpers/delay-proxy';

/** A governor on a clock the test moves; `window` reports one window of two batches. With
 * `link`, the receiver's delivery reports say what `link.now` holds (undefined: none yet). */
function driven(base: number, start = base, adapt = true, link?: { now: LinkSample | undefined }) {
  let now = 0;
  const gov = new LevelGovernor(base, adapt, start, { now: () => now, link: link && { sample: () => link.now } });
  /** One window of `spanMs`: two batches that waited `encMs` / `sendMs` in total and moved
   * `bytes` (default: a 100 Mbit/s link's worth). */
  const window = (spanMs: number, encMs: number, sendMs: number, bytes = (12.5e6 * spanMs) / 1000) => {
    now += spanMs / 2;
    gov.observe(encMs / 2, sendMs / 2, bytes / 2);
    now += spanMs / 2;
    gov.observe(encMs / 2, sendMs / 2, bytes / 2);
    return gov.level;
  };
  return { gov, window };
}

it('starts at the configured level on loopback/LAN handshakes, at zstd’s default on a remote link, never below the configured level', () => {
  assert.equal(startLevel(1, undefined), 1, 'not measured (ssh): the configured level');
  assert.equal(startLevel(1, 0.4), 1, 'loopback');
  assert.equal(startLevel(1, REMOTE_HANDSHAKE_MS - 0.1), 1, 'just under the threshold');
  assert.equal(startLevel(1, REMOTE_HANDSHAKE_MS), REMOTE_START_LEVEL, 'beyond the LAN');
  assert.equal(startLevel(1, WAN_HANDSHAKE_MS - 0.1), REMOTE_START_LEVEL);
  assert.equal(startLevel(1, WAN_HANDSHAKE_MS), WAN_START_LEVEL, 'a wide-area round trip');
  assert.equal(startLevel(1, 120), WAN_START_LEVEL);
  assert.equal(startLevel(9, 120), 9, 'a higher configured level is kept');
  assert.equal(startLevel(0, 120), 0, 'no compression stays off');
  const { gov } = driven(1, startLevel(1, 60));
  assert.equal(gov.level, WAN_START_LEVEL, 'the governor begins where startLevel says');
});

it('climbs while the socket is the bottleneck and the encoder idles, up to the fast-link cap', () => {
  const { window } = driven(1, 3);
  const seen = [3];
  for (let i = 0; i < 20; i++) seen.push(window(80, 0, 200));
  assert.ok(
    seen.every((l, i) => i === 0 || l >= seen[i - 1]),
    `never goes down while the encoder idles: ${seen.join(' ')}`,
  );
  assert.equal(seen[1], 5, 'two levels at a time while far below 6 and the encoder is idle');
  assert.equal(seen.at(-1), FAST_CAP_LEVEL, `a 100 Mbit/s link stops at level ${FAST_CAP_LEVEL}: ${seen.join(' ')}`);
});

it('on a slow link (under SLOW_LINK bytes/s) it may go past the fast-link cap, never past the maximum', () => {
  const { window } = driven(1, 3);
  let level = 3;
  for (let i = 0; i < 200; i++) level = window(100, 0, 300, (SLOW_LINK / 2) * 0.1);
  assert.equal(level, MAX_ADAPT_LEVEL);
});

it('comes down when compression stalls the pipe for two windows in a row, never below the configured level', () => {
  const { window } = driven(2, 8);
  assert.equal(window(50, 48, 1, BUFFER_GRACE_BYTES), 8, 'the first window fills the pipeline: no verdict');
  assert.equal(window(50, 40, 2), 8, 'one stalled window alone is not enough');
  assert.equal(window(50, 40, 2), 6, 'the second in a row is: a stall over 70% of the window drops two levels');
  assert.equal(window(50, 20, 2), 6, 'a new verdict needs two windows again');
  assert.equal(window(50, 20, 2), 5, 'a stall under 70% drops one level');
  let level = 5;
  for (let i = 0; i < 20; i++) level = window(50, 45, 1);
  assert.equal(level, 2, 'the configured level is the floor');
});

it('while the socket buffers fill (no push-back yet, under BUFFER_GRACE_BYTES) it does not go below where it started', () => {
  const small = 256 * 1024;
  const { window } = driven(1, 6);
  window(50, 48, 1, small);
  for (let i = 0; i < 6; i++) assert.equal(window(50, 48, 1, small), 6, 'still inside the grace: the start level holds');
  // Past the grace without ever being pushed back: the link is faster than the encoder.
  let level = 6;
  for (let i = 0; i < 10; i++) level = window(50, 48, 1, small * 4);
  assert.equal(level, 1, 'then it comes down to the configured level');
  // Pushed back once, early: from then on the encoder's stalls count at once.
  const b = driven(1, 6);
  b.window(80, 0, 200, small);
  assert.equal(b.gov.level, 7, 'pushed back: climbs');
  b.window(50, 45, 1, small);
  assert.equal(b.window(50, 45, 1, small), 5, 'after a push-back the grace is over: down two');
});

it('does not count the encoder as the bottleneck when the pipe waited longer on the socket', () => {
  // Small-file batches and large files' streams wait at once, so waits add up beyond the
  // window: the comparison between the two says which side holds the pipe back.
  const { window } = driven(1, 6);
  window(80, 0, 200);
  for (let i = 0; i < 5; i++) assert.ok(window(80, 60, 250) >= 6, 'encoder waits under the socket waits: no back-off');
});

it('after backing off it does not climb straight back past the level that stalled', () => {
  const { window } = driven(1, 9);
  window(50, 0, 1, BUFFER_GRACE_BYTES); // warm-up, past the buffers' grace
  window(50, 45, 1);
  assert.equal(window(50, 45, 1), 7, 'stalled at 9: down two');
  const after = [window(80, 0, 200), window(80, 0, 200), window(80, 0, 200)];
  assert.ok(
    after.every((l) => l <= 8),
    `the ceiling holds below the stalling level for a while: ${after.join(' ')}`,
  );
});

describe('with the receiver’s delivery reports (DELIVERED, §4.16)', () => {
  const MB = 1e6;
  const slowLink = (queueMs: number): LinkSample => ({ rate: 12.5 * MB, queueMs, spanMs: 600 });

  it('a queue in front of a slow link: the encoder’s stalls never lower the level, and it climbs while the encoder outpaces the link', () => {
    // 100 Mbit/s behind socket buffers that take the first megabytes at memory speed: the
    // sender sees only its encoder waiting (the pattern that used to drop 6 to 1).
    const link = { now: undefined as LinkSample | undefined };
    const { window } = driven(1, 6, true, link);
    const seen = [window(50, 48, 1, 2 * MB)];
    for (let i = 0; i < 3; i++) seen.push(window(50, 48, 1, 2 * MB));
    assert.deepEqual(seen, [6, 6, 6, 6], 'no reports yet: the start holds (they are due)');
    link.now = slowLink(800);
    for (let i = 0; i < 20; i++) seen.push(window(50, 48, 1, 2 * MB)); // out 40 MB/s > 1.25 × 12.5
    assert.ok(seen.every((l, i) => i === 0 || l >= seen[i - 1]), `never down while the link is the bottleneck: ${seen.join(' ')}`);
    assert.equal(seen.at(-1), FAST_CAP_LEVEL, `up to the fast-link cap: ${seen.join(' ')}`);
  });

  it('a link that keeps pace (no queue): the encoder’s stalls lower the level at once, start and grace or not', () => {
    // 1 Gbit/s: a held start level would make compression the bottleneck.
    const link = { now: { rate: 60 * MB, queueMs: 40, spanMs: 200 } as LinkSample | undefined };
    const { window } = driven(1, 6, true, link);
    window(50, 48, 1, 256 * 1024);
    const seen = [6];
    for (let i = 0; i < 6; i++) seen.push(window(50, 48, 1, 256 * 1024));
    assert.equal(seen.at(-1), 1, `down to the configured level within the first MiB or two: ${seen.join(' ')}`);
  });

  it('the queue decides: just under LINK_QUEUE_MS the link keeps pace, just over it is the bottleneck', () => {
    for (const [queueMs, expectDown] of [
      [LINK_QUEUE_MS - 1, true],
      [LINK_QUEUE_MS + 1, false],
    ] as const) {
      const link = { now: { rate: 12.5 * MB, queueMs, spanMs: 600 } as LinkSample | undefined };
      const { window } = driven(1, 6, true, link);
      let level = 6;
      for (let i = 0; i < 4; i++) level = window(50, 48, 1, 0.6 * MB);
      assert.equal(level < 6, expectDown, `queue ${queueMs} ms: level ${level}`);
    }
  });

  it('on a slow delivery rate it goes past the fast-link cap only with half a second of reports behind the rate', () => {
    const link = { now: { rate: SLOW_LINK / 4, queueMs: 2000, spanMs: 200 } as LinkSample | undefined };
    const { window } = driven(1, 6, true, link);
    let level = 6;
    for (let i = 0; i < 30; i++) level = window(100, 0, 300, 0.5 * MB);
    assert.equal(level, FAST_CAP_LEVEL, 'early reports (TCP slow start): capped');
    link.now = { rate: SLOW_LINK / 4, queueMs: 2000, spanMs: 800 };
    for (let i = 0; i < 200; i++) level = window(100, 0, 300, 0.5 * MB);
    assert.equal(level, MAX_ADAPT_LEVEL);
  });

  it('a peer that negotiated reports but sends none: the sender’s own signals take over after 16 MiB', () => {
    const link = { now: undefined as LinkSample | undefined };
    const { window } = driven(1, 6, true, link);
    let level = 6;
    for (let i = 0; i < 8; i++) level = window(50, 48, 1, 2 * MB);
    assert.equal(level, 6, 'past BUFFER_GRACE_BYTES, still waiting for reports');
    for (let i = 0; i < 10; i++) level = window(50, 48, 1, 2 * MB);
    assert.equal(level, 1);
  });
});

it('a pinned level (--compress-level) and no compression never move', () => {
  for (const [base, adapt] of [
    [3, false],
    [0, true],
  ] as const) {
    const { window, gov } = driven(base, 6, adapt);
    assert.equal(gov.level, base);
    for (let i = 0; i < 10; i++) window(80, 0, 200);
    for (let i = 0; i < 10; i++) window(50, 45, 1);
    assert.equal(gov.level, base);
  }
});

it('a connection records how long it took to come up: at least the round trips its handshake needs', async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ffsync-level-'));
  try {
    const id = loadOrCreateIdentity(dir);
    const oneWay = 15;
    // TLS 1.3 needs one round trip through the relay (the relay answers TCP itself).
    const tls = await tlsListenOnce('127.0.0.1', 0, id);
    const tlsRelay = await tcpDelayProxy(tls.port, oneWay);
    const accepted = tls.accept();
    const client = await tlsConnect('127.0.0.1', tlsRelay.port, id);
    const ms = handshakeMs(client);
    assert.ok(ms !== undefined && ms >= 2 * oneWay - 1, `TLS through a ${2 * oneWay} ms RTT relay came up in ${ms} ms`);
    assert.ok(startLevel(1, ms) >= REMOTE_START_LEVEL, 'such a link starts above the configured level');
    (await accepted).destroy();
    client.destroy();
    tls.close();
    await tlsRelay.close();
    // Plain TCP, straight: measured too (a loopback connect takes well under the threshold
    // on an idle machine; only its presence is asserted, CI machines are noisy).
    const plain = await listenOnce('127.0.0.1', 0);
    const got = plain.accept();
    const sock = await connect('127.0.0.1', plain.port);
    assert.equal(typeof handshakeMs(sock), 'number');
    (await got).destroy();
    sock.destroy();
    plain.close();
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
