// Hostile peers that keep a session "alive" without moving it, or flood it with frames
// that cost the victim more than they cost the attacker (issue 17 §3, §4): KEEPALIVE-only
// peers are cut off after the stall limit (exit 30), pointless frames are refused (exit 12),
// and a flood of small frames cannot grow the victim's memory (VmHWM, read from /proc).
// FFSYNC_TEST_CLI=<path to another dist/cli/main.js> runs the same tests against another build.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { describe, test } from 'node:test';
import { CLI, seeded, tmpdir } from './helpers/peers.js';
import { ChildRun } from './helpers/process.js';
import { framesUntilClose, repeated } from './helpers/raw-peer.js';
import { encodeFrame, type Frame, FrameType } from '../ts/protocol/frames.js';
import { Decision, encodeDecision, encodeHello, encodeNeedEnd, encodeOffer, manifestFrames, needFrames, OfferKind, Role } from '../ts/protocol/messages.js';
import { scanFile } from '../ts/native/binding.js';
import { manifestChunkCount } from '../ts/utils/manifest.js';

const cli = process.env.FFSYNC_TEST_CLI ?? CLI;

interface Victim {
  pid: number;
  /** Resolves once the process printed its `listening` line (receivers). */
  port: Promise<number>;
  done: Promise<{ code: number | null; stderr: string; ms: number; peakKiB: number }>;
  kill(): void;
}

/** Runs the CLI and samples its peak RSS (VmHWM) until it exits. */
function victim(args: string[]): Victim {
  const p = new ChildRun('victim', [process.execPath, cli, ...args], { sampleMs: 25 });
  const port = p.listeningPort();
  port.catch(() => undefined);
  const done = p.exited.then((e) => ({ code: e.code, stderr: p.stderr, ms: e.ms, peakKiB: p.peakKiB }));
  return { pid: p.pid!, port, done, kill: () => p.kill() };
}

/** Resolves with the result, or kills the victim and fails after `ms`. */
async function exitWithin(v: Victim, ms: number): Promise<{ code: number | null; stderr: string; ms: number; peakKiB: number }> {
  let t: NodeJS.Timeout;
  const timedOut = new Promise<'timeout'>((r) => (t = setTimeout(() => r('timeout'), ms)));
  const r = await Promise.race([v.done, timedOut]);
  clearTimeout(t!);
  if (r === 'timeout') {
    v.kill();
    const late = await v.done;
    assert.fail(`the victim was still running after ${ms} ms (peak RSS ${late.peakKiB >> 10} MiB); stderr: ${late.stderr}`);
  }
  return r;
}

const hello = (role: number) => encodeFrame(FrameType.HELLO, encodeHello({ minVersion: 1, maxVersion: 1, capabilities: 0, role, software: 'hostile' }));
const keepAlive = (counter?: bigint) => {
  if (counter === undefined) return encodeFrame(FrameType.KEEPALIVE);
  const p = Buffer.alloc(8);
  p.writeBigUInt64LE(counter);
  return encodeFrame(FrameType.KEEPALIVE, p);
};

const delivered = (n: number) => {
  const p = Buffer.alloc(8);
  p.writeBigUInt64LE(BigInt(n));
  return encodeFrame(FrameType.DELIVERED, p);
};

async function sourceFile(len: number, seed: number) {
  const f = path.join(tmpdir(), 'src.bin');
  fs.writeFileSync(f, seeded(len, seed));
  const scan = await scanFile(f, {});
  return { file: f, scan, offer: encodeFrame(FrameType.OFFER, encodeOffer({ kind: OfferKind.FILE, size: BigInt(len), mtimeNs: 1n, mode: 0o644, flags: 0 })) };
}

/** A one-shot receiver (plaintext) and a hostile sender that got as far as DECISION. */
async function receiverAfterDecision(timeoutS: number, len = 100_000) {
  const dir = tmpdir();
  const v = victim(['receive', path.join(dir, 'target.bin'), '0', '--plaintext', '--json', '--timeout', String(timeoutS), '--state-dir', path.join(dir, 'state')]);
  const port = await v.port;
  const src = await sourceFile(len, 5);
  const sock = net.connect({ host: '127.0.0.1', port });
  await new Promise((r) => sock.once('connect', r));
  const next = framesUntilClose(sock);
  sock.write(hello(Role.SENDER));
  sock.write(src.offer);
  assert.equal((await next())?.type, FrameType.HELLO);
  const d = await next();
  assert.equal(d?.type, FrameType.DECISION);
  assert.equal(d!.payload[0], Decision.SEND_MANIFEST);
  return { v, sock, next, src };
}

/** A plaintext `send` of a file to a hostile receiver that answered up to DECISION 1. */
async function senderAfterDecision(timeoutS: number, len = 100_000) {
  const server = net.createServer();
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const accepted = new Promise<net.Socket>((r) => server.once('connection', r));
  const src = await sourceFile(len, 6);
  const v = victim(['send', src.file, `127.0.0.1:${(server.address() as net.AddressInfo).port}`, '--plaintext', '--json', '--timeout', String(timeoutS), '--state-dir', path.join(tmpdir(), 'state')]);
  const sock = await accepted;
  server.close();
  const next = framesUntilClose(sock);
  sock.write(hello(Role.RECEIVER));
  assert.equal((await next())?.type, FrameType.HELLO);
  assert.equal((await next())?.type, FrameType.OFFER);
  sock.write(encodeFrame(FrameType.DECISION, encodeDecision(Decision.SEND_MANIFEST)));
  return { v, sock, next, src };
}

const MiB = 1024;

describe('KEEPALIVE is not progress', { timeout: 120_000 }, () => {
  test('a sender that only sends empty KEEPALIVEs: the receiver exits 30 within the stall limit (4 × --timeout 1)', async () => {
    const { v, sock } = await receiverAfterDecision(1);
    const t0 = Date.now();
    const ticker = setInterval(() => sock.write(keepAlive()), 200);
    try {
      const r = await exitWithin(v, 12_000);
      const took = Date.now() - t0;
      assert.equal(r.code, 30, r.stderr);
      assert.match(r.stderr, /no progress for \d+ s \(only keep-alives/);
      assert.ok(took >= 3500 && took < 7000, `cut off after ${took} ms`);
    } finally {
      clearInterval(ticker);
      sock.destroy();
    }
  });

  test('… and one whose KEEPALIVE work counter does not advance: exit 30 too', async () => {
    const { v, sock } = await receiverAfterDecision(1);
    const ticker = setInterval(() => sock.write(keepAlive(7n)), 200);
    try {
      const r = await exitWithin(v, 12_000);
      assert.equal(r.code, 30, r.stderr);
      assert.match(r.stderr, /no progress/);
    } finally {
      clearInterval(ticker);
      sock.destroy();
    }
  });

  test('a sender whose KEEPALIVE counter advances (it is hashing) is waited for past the stall limit, then finishes', async () => {
    const { v, sock, next, src } = await receiverAfterDecision(1);
    let work = 0n;
    const ticker = setInterval(() => sock.write(keepAlive((work += 1_000_000n))), 200);
    try {
      await new Promise((r) => setTimeout(r, 6000));
      clearInterval(ticker);
      for (const p of manifestFrames(src.scan.manifest)) sock.write(encodeFrame(FrameType.MANIFEST, p));
      let f;
      while ((f = await next()) && f.type !== FrameType.NEED_END);
      assert.equal(f?.type, FrameType.NEED_END, 'the receiver went on with the session');
      sock.destroy();
      const r = await exitWithin(v, 10_000);
      assert.equal(r.code, 12, r.stderr); // the hostile sender hung up mid-transfer
    } finally {
      clearInterval(ticker);
      sock.destroy();
    }
  });

  test('a receiver that only sends empty KEEPALIVEs: the sender exits 30 within the stall limit', async () => {
    const { v, sock, next } = await senderAfterDecision(1);
    const t0 = Date.now();
    void (async () => {
      while (await next()); // the manifest; then nothing comes
    })();
    const ticker = setInterval(() => sock.write(keepAlive()), 200);
    try {
      const r = await exitWithin(v, 12_000);
      const took = Date.now() - t0;
      assert.equal(r.code, 30, r.stderr);
      assert.match(r.stderr, /no progress/);
      assert.ok(took >= 3500 && took < 7000, `cut off after ${took} ms`);
    } finally {
      clearInterval(ticker);
      sock.destroy();
    }
  });
});

describe('pointless frames and floods', { timeout: 120_000 }, () => {
  test('2,000,000 empty DATA frames against a receiver: cut off at once (exit 12), memory bounded', async () => {
    const { v, sock, next, src } = await receiverAfterDecision(20);
    for (const p of manifestFrames(src.scan.manifest)) sock.write(encodeFrame(FrameType.MANIFEST, p));
    let f;
    while ((f = await next()) && f.type !== FrameType.NEED_END);
    const t0 = Date.now();
    const flood = repeated(encodeFrame(FrameType.DATA), 2_000_000);
    sock.write(flood);
    try {
      const r = await exitWithin(v, 15_000);
      assert.equal(r.code, 12, r.stderr);
      assert.match(r.stderr, /empty DATA frame: pointless frames are a flood/);
      assert.ok(Date.now() - t0 < 5000, `took ${Date.now() - t0} ms`);
      assert.ok(r.peakKiB < 150 * MiB, `peak RSS ${r.peakKiB >> 10} MiB`);
    } finally {
      sock.destroy();
    }
  });

  test('a KEEPALIVE flood (1,000,000 after HELLO) against a receiver: exit 12', async () => {
    const { v, sock } = await receiverAfterDecision(20);
    sock.write(repeated(keepAlive(), 1_000_000));
    try {
      const r = await exitWithin(v, 15_000);
      assert.equal(r.code, 12, r.stderr);
      assert.match(r.stderr, /KEEPALIVE flood/);
      assert.ok(r.peakKiB < 150 * MiB, `peak RSS ${r.peakKiB >> 10} MiB`);
    } finally {
      sock.destroy();
    }
  });

  test('DELIVERED reports that lie, go back or flood (§4.16) end a sender at once: exit 12', async () => {
    const cases: [string, (next: ReturnType<typeof framesUntilClose>) => Promise<Buffer>, RegExp][] = [
      ['more bytes read than were sent', async () => delivered(1e12), /DELIVERED claims 1000000000000 bytes read of the \d+ sent/],
      ['a count that does not advance', async () => Buffer.concat([delivered(10), delivered(10)]), /DELIVERED did not advance \(10 after 10\)/],
      ['a wrong payload length', async () => encodeFrame(FrameType.DELIVERED, Buffer.alloc(4)), /DELIVERED with a payload of 4 bytes/],
      [
        '1,000 honest-looking reports at once',
        async (next) => {
          await next(); // the manifest: more than 1,000 bytes sent by now
          return Buffer.concat(Array.from({ length: 1000 }, (_, i) => delivered(i + 1)));
        },
        /DELIVERED flood: more than 50 per second/,
      ],
    ];
    for (const [what, frames, message] of cases) {
      const { v, sock, next } = await senderAfterDecision(20);
      sock.write(await frames(next));
      try {
        const r = await exitWithin(v, 15_000);
        assert.equal(r.code, 12, `${what}: ${r.stderr}`);
        assert.match(r.stderr, message, what);
      } finally {
        sock.destroy();
      }
    }
  });

  test('1,000,000 NEED frames that ask for nothing against a sender: exit 12', async () => {
    const { v, sock, next, src } = await senderAfterDecision(20);
    const total = src.scan.manifest.length;
    let got = 0;
    while (got < total) {
      const f = await next();
      assert.equal(f?.type, FrameType.MANIFEST);
      got += f!.payload.length - 4;
    }
    sock.write(repeated(encodeFrame(FrameType.NEED, Buffer.alloc(5)), 1_000_000));
    try {
      const r = await exitWithin(v, 15_000);
      assert.equal(r.code, 12, r.stderr);
      assert.match(r.stderr, /NEED frame that asks for nothing/);
      assert.ok(r.peakKiB < 150 * MiB, `peak RSS ${r.peakKiB >> 10} MiB`);
    } finally {
      sock.destroy();
    }
  });

  test('3,000,000 small frames queued while a sender streams DATA: flow control counts frames, memory stays bounded', async () => {
    const { v, sock, next, src } = await senderAfterDecision(5, 48 << 20);
    const manifest = src.scan.manifest;
    let got = 0;
    while (got < manifest.length) got += (await next())!.payload.length - 4;
    const chunks = manifestChunkCount(manifest);
    const all = Uint32Array.from({ length: chunks }, (_, i) => i);
    for (const p of needFrames(all, chunks)) sock.write(encodeFrame(FrameType.NEED, p));
    sock.write(encodeFrame(FrameType.NEED_END, encodeNeedEnd({ wireChunks: chunks, identical: false })));
    // Legal-looking frames the sender will only read after its DATA: it must stop reading
    // (TCP back-pressure) instead of queueing millions of them.
    const small = encodeFrame(FrameType.NEED, Buffer.from([0, 0, 0, 0, 1]));
    sock.write(repeated(small, 3_000_000));
    void (async () => {
      while (await next()); // read and drop the DATA
    })();
    try {
      const r = await exitWithin(v, 30_000);
      assert.ok(r.code === 12 || r.code === 30, `exit ${r.code}: ${r.stderr}`);
      assert.ok(r.peakKiB < 150 * MiB, `peak RSS ${r.peakKiB >> 10} MiB`);
    } finally {
      sock.destroy();
    }
  });
});

describe('frame decoder', () => {
  test('a 128 KiB frame dribbled in 1-byte reads costs O(bytes): no per-read buffer kept, no O(n) work per read', async () => {
    // The build under test (FFSYNC_TEST_CLI points at another dist/cli/main.js).
    const mod = (process.env.FFSYNC_TEST_CLI ? await import(path.join(path.dirname(cli), '..', 'protocol', 'frames.js')) : await import('../ts/protocol/frames.js')) as typeof import('../ts/protocol/frames.js');
    const frame = mod.encodeFrame(FrameType.MANIFEST, Buffer.alloc(128 * 1024, 7));
    const d = new mod.FrameDecoder();
    const out: Frame[] = [];
    const h0 = process.memoryUsage().heapUsed;
    const t0 = process.cpuUsage();
    for (let i = 0; i < frame.length - 1; i++) d.push(Buffer.from([frame[i]]), out);
    const grown = process.memoryUsage().heapUsed - h0;
    d.push(Buffer.from([frame[frame.length - 1]]), out);
    const cpu = process.cpuUsage(t0);
    assert.equal(out.length, 1);
    assert.ok(grown < 4 << 20, `${(grown / 1048576).toFixed(1)} MiB of heap held for 128 KiB received`);
    assert.ok(cpu.user + cpu.system < 2_000_000, `${((cpu.user + cpu.system) / 1000).toFixed(0)} ms of CPU`);
  });
});
