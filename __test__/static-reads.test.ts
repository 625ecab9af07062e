// A socket that reads into one buffer of its own (ts/transport/static-reads.ts, decisions §94).
// The class of failure this guards against: bytes read into a buffer that the next read
// overwrites, kept by reference somewhere (the decoder's pending reads, a frame's payload), so a
// frame changes after it was decoded. And the point of it: the receiving side's reads leave no
// fresh buffer per read behind (Node's 'data' events are one new buffer each).
import assert from 'node:assert/strict';
import net from 'node:net';
import tls from 'node:tls';
import { describe, it } from 'node:test';
import { readIntoStaticBuffer } from '../ts/transport/static-reads';
import { FramedConnection } from '../ts/transport/connection';
import { encodeFrame, FrameDecoder, FramePool, FrameType, type Frame } from '../ts/protocol/frames';
import { loadOrCreateIdentity } from '../ts/security/identity';
import { PassThrough } from 'node:stream';
import { spawn } from 'node:child_process';
import { joinStreams } from '../ts/transport/stream-pair';
import { garbageRelief, NEAR_BUDGET, RELIEF_STEP, relieveNearBudget } from '../ts/utils/gc';
import { seeded, tmpdir } from './helpers/peers';
import { rng } from './helpers/faults';
import { tcpPair, tlsPair } from './helpers/socket-pairs';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const SCRIBBLE = 0xee;
/** A whole number in [0, n) from a seeded generator. */
const below = (r: () => number, n: number) => Math.floor(r() * n);

async function tlsPairOwnId(): Promise<[tls.TLSSocket, tls.TLSSocket]> {
  return tlsPair(loadOrCreateIdentity(tmpdir('ffsync-static-')));
}

const PAIRS: [string, () => Promise<[net.Socket, net.Socket]>][] = [
  ['TCP', tcpPair],
  ['TLS 1.3', tlsPairOwnId],
];

describe('readIntoStaticBuffer', () => {
  for (const [name, pair] of PAIRS) {
    it(`${name}: an accepted socket's reads are views of one buffer, in order, after the reads it held; pause() stops them; end comes`, async () => {
      const [client, accepted] = await pair();
      const sent = seeded(6 * 1024 * 1024 + 123, 7);
      // Bytes read before the switch stay in the stream: they must come first, as 'data'.
      client.write(sent.subarray(0, 10_000));
      await sleep(100);
      const got: Buffer[] = [];
      const buffers = new Set<ArrayBufferLike>();
      let reads = 0;
      let pausedAt = 0;
      let bytesWhilePaused = 0;
      let readsLateInPause = 0;
      accepted.on('data', (d: Buffer) => got.push(Buffer.from(d)));
      const switched = readIntoStaticBuffer(accepted, (chunk) => {
        reads++;
        if (pausedAt > 0) {
          // A TLS socket still hands over the records it had already taken off the TCP
          // socket (as it pushes them into a paused stream's buffer otherwise); then nothing.
          bytesWhilePaused += chunk.length;
          if (Date.now() - pausedAt > 50) readsLateInPause++;
        }
        buffers.add(chunk.buffer);
        got.push(Buffer.from(chunk)); // the view is only valid until this returns
        if (reads === 20) {
          pausedAt = Date.now();
          accepted.pause();
          setTimeout(() => {
            pausedAt = 0;
            accepted.resume();
          }, 200);
        }
      });
      assert.equal(switched, true);
      accepted.resume();
      const ended = new Promise<void>((r) => accepted.once('end', () => r()));
      const r = rng(5);
      for (let at = 10_000; at < sent.length; ) {
        const n = Math.min(sent.length - at, 1 + below(r, 300_000));
        if (!client.write(sent.subarray(at, at + n))) await new Promise((r) => client.once('drain', r));
        at += n;
      }
      client.end();
      await ended;
      assert.ok(Buffer.concat(got).equals(sent), 'every byte, in order');
      assert.ok(reads > 20, `reads through the callback: ${reads}`);
      assert.equal(buffers.size, 1, 'every read lands in the same buffer');
      assert.equal(readsLateInPause, 0, 'reads stop while paused');
      assert.ok(bytesWhilePaused <= 256 * 1024, `bytes read after pause(): ${bytesWhilePaused}`);
      accepted.destroy();
      client.destroy();
    });
  }

  it('changes nothing for a stream that is no socket, or a destroyed socket', async () => {
    assert.equal(
      readIntoStaticBuffer(new PassThrough(), () => assert.fail('no read expected')),
      false,
    );
    const [client, accepted] = await tcpPair();
    accepted.destroy();
    assert.equal(
      readIntoStaticBuffer(accepted, () => assert.fail('no read expected')),
      false,
    );
    client.destroy();
  });
});

describe('FrameDecoder.copyReads: reads pushed from a buffer that is reused at once', () => {
  /** Frames of every size class the decoder treats apart: small (copied into accumulators),
   * medium, and large (assembled in pooled buffers), with payloads that name their frame. */
  function frames(count: number, seed: number): Buffer[] {
    const r = rng(seed);
    const out: Buffer[] = [];
    for (let i = 0; i < count; i++) {
      const kind = below(r, 4);
      const n = kind === 0 ? 1 + below(r, 200) : kind === 1 ? 4096 + below(r, 60_000) : kind === 2 ? 300_000 + below(r, 1_800_000) : 1 + below(r, 9000);
      const p = Buffer.alloc(Math.max(n, 4), 1 + (i % 250));
      p.writeUInt32LE(i, 0);
      out.push(encodeFrame(FrameType.DATA, p));
    }
    return out;
  }

  /** Pushes `stream` through one reused buffer in reads of random sizes (TLS: ≤ 16 KiB; TCP:
   * ≤ 64 KiB), scribbling the buffer after every push; holds every frame until the end. */
  function decodeThroughOneBuffer(stream: Buffer, copyReads: boolean, maxRead: number, seed: number): Frame[] {
    const r = rng(seed);
    const d = new FrameDecoder(new FramePool(2 * 1024 * 1024 + 64, 2));
    d.copyReads = copyReads;
    const reused = Buffer.alloc(maxRead);
    const out: Frame[] = [];
    for (let at = 0; at < stream.length; ) {
      const n = Math.min(stream.length - at, 1 + below(r, maxRead));
      stream.copy(reused, 0, at, at + n);
      d.push(reused.subarray(0, n), out);
      reused.fill(SCRIBBLE);
      at += n;
    }
    assert.equal(d.bufferedBytes, 0);
    return out;
  }

  for (const [label, maxRead] of [
    ['TLS-sized reads', 16 * 1024],
    ['TCP-sized reads', 64 * 1024],
  ] as const) {
    it(`${label}: every frame intact however long it is held; without copyReads the same run corrupts frames`, () => {
      const sent = frames(120, maxRead);
      const stream = Buffer.concat(sent);
      const got = decodeThroughOneBuffer(stream, true, maxRead, 11);
      assert.equal(got.length, sent.length);
      got.forEach((f, i) => assert.ok(f.payload.equals(sent[i]!.subarray(5)), `frame ${i} (${f.payload.length} B) changed after it was decoded`));
      for (const f of got) f.release?.();
      // The control: a decoder that keeps reads by reference (as it may for reads it owns)
      // hands out frames that the reused buffer's next contents overwrite, or reads a frame
      // header that is no longer there.
      let damaged: number;
      try {
        const careless = decodeThroughOneBuffer(stream, false, maxRead, 11);
        damaged = careless.filter((f, i) => !f.payload.equals(sent[i]!.subarray(5))).length;
        for (const f of careless) f.release?.();
      } catch {
        damaged = Infinity;
      }
      assert.ok(damaged > 0, 'the control run shows the failure this mode prevents');
    });
  }

  it('counts what it allocates to keep reads: small frames, not the large ones assembled in the pool', () => {
    const d = new FrameDecoder(new FramePool(2 * 1024 * 1024 + 64, 2));
    d.copyReads = true;
    const big = encodeFrame(FrameType.DATA, seeded(2 * 1024 * 1024, 1));
    const out: Frame[] = [];
    for (let at = 0; at < big.length; at += 16 * 1024) d.push(big.subarray(at, at + 16 * 1024), out);
    assert.equal(out.length, 1);
    // Until half of it is here, its reads are copied into accumulators (at most 1 MiB and one
    // accumulator's worth); after that, straight into the pooled frame.
    assert.ok(d.allocated <= 1024 * 1024 + 64 * 1024, `allocated ${d.allocated}`);
    out[0]!.release?.();
    const before = d.allocated;
    d.push(encodeFrame(FrameType.RESULT, Buffer.alloc(9, 1)), out);
    assert.ok(d.allocated - before <= 64 * 1024);
  });
});

/** Sends `payloads` as DATA frames on `tx` without waiting; `whileQueued` runs once they have had
 * `waitMs` to queue up (held while the next reads arrive); then every frame is received on `rx`
 * and checked. */
/** `wait`: ms to let the frames queue, or a condition to wait for (up to 10 s) that says they
 * have (a child process's start on a loaded machine takes no fixed time). */
async function exchangeHeld(tx: FramedConnection, rx: FramedConnection, payloads: Buffer[], wait: number | (() => boolean), whileQueued?: () => void): Promise<void> {
  const sending = (async () => {
    for (const p of payloads) await tx.send(FrameType.DATA, p);
  })();
  if (typeof wait === 'number') await sleep(wait);
  else {
    for (const deadline = Date.now() + 10_000; !wait() && Date.now() < deadline; ) await sleep(20);
    // And a while longer: reads that went on after the queue filled would show by then.
    await sleep(300);
  }
  whileQueued?.();
  for (let i = 0; i < payloads.length; i++) {
    const f = await rx.recv();
    assert.ok(f.payload.equals(payloads[i]!), `frame ${i}`);
    f.release?.();
  }
  await sending;
}

describe('FramedConnection reads a socket into one buffer', () => {
  for (const [name, pair] of PAIRS) {
    it(`${name}: no 'data' event (a fresh buffer each) for what arrives once the connection listens; frames intact`, async () => {
      const [client, accepted] = await pair();
      const tx = new FramedConnection(client, 30_000);
      const rx = new FramedConnection(accepted, 30_000);
      let dataEvents = 0;
      accepted.on('data', () => dataEvents++);
      const payloads = Array.from({ length: 40 }, (_, i) => seeded(i % 5 === 0 ? 2 * 1024 * 1024 : 100 + i * 700, i));
      await exchangeHeld(tx, rx, payloads, 100);
      assert.equal(dataEvents, 0, `'data' events on the receiving socket: ${dataEvents}`);
      await Promise.all([tx.close(), rx.close()]);
    });
  }
});

describe('a child process stdio joined into one stream (ssh) reads its pipe into one buffer', () => {
  it("no 'data' event on the joined stream once the connection listens; frames intact both ways; pause holds the pipe", async () => {
    // The child echoes what it reads: the frames come back through its stdout pipe.
    const child = spawn(process.execPath, ['-e', 'process.stdin.pipe(process.stdout)'], { stdio: ['pipe', 'pipe', 'inherit'] });
    const joined = joinStreams(child.stdout!, child.stdin!);
    const conn = new FramedConnection(joined, 30_000);
    let dataEvents = 0;
    joined.on('data', () => dataEvents++);
    try {
      const payloads = Array.from({ length: 30 }, (_, i) => seeded(i % 6 === 0 ? 2 * 1024 * 1024 : 50 + i * 900, 100 + i));
      // The echo fills our queue: the connection pauses the pipe. Its reads bypass the joined
      // stream's buffer, so pausing that stream must reach the pipe: otherwise every byte echoed
      // (10.4 MiB) would be read in while nobody takes a frame.
      await exchangeHeld(conn, conn, payloads, () => child.stdout!.isPaused(), () => {
        assert.equal(child.stdout!.isPaused(), true, 'the pipe is paused');
        assert.ok(conn.bytesReceived < 8 * 1024 * 1024, `read while the queue was full: ${conn.bytesReceived} bytes`);
      });
      assert.equal(dataEvents, 0, `'data' events on the joined stream: ${dataEvents}`);
    } finally {
      await conn.close(1000);
      child.kill();
    }
  });
});

describe('relieveNearBudget: reads that leave no buffer pace the collections only near the budget', () => {
  it('below NEAR_BUDGET no collection is asked for; above it one per RELIEF_STEP bytes', () => {
    const before = garbageRelief().runs;
    for (let i = 0; i < 64; i++) relieveNearBudget(1024 * 1024, () => NEAR_BUDGET - 1);
    assert.equal(garbageRelief().runs, before, 'nothing below the budget');
    for (let i = 0; i < 64; i++) relieveNearBudget(1024 * 1024, () => NEAR_BUDGET + 1);
    assert.equal(garbageRelief().runs - before, (64 * 1024 * 1024) / RELIEF_STEP, 'one minor GC per step near the budget');
  });
});
