// Unit tests of the TypeScript frame decoder and message codecs (no processes).
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { dropIdleFrameBuffers, encodeFrame, encodeFrameHeader, FRAME_POOL_BUFFER, FRAME_POOL_KEPT, FrameDecoder, FramePool, FrameType, MAX_FRAME_BODY, wholeFrames } from '../ts/protocol/frames';
import {
  Decision,
  DecisionReason,
  decodeDecision,
  decodeError,
  decodeHello,
  decodeNeedEnd,
  decodeOffer,
  encodeDecision,
  encodeError,
  encodeHello,
  encodeNeedEnd,
  encodeOffer,
  ManifestAssembler,
  manifestFrames,
  maxManifestLength,
  NeedCollector,
  needFrames,
  negotiateVersion,
  OfferKind,
  Role,
} from '../ts/protocol/messages';
import { batchByBytes } from '../ts/utils/manifest';
import net from 'node:net';
import v8 from 'node:v8';
import vm from 'node:vm';
import { FramedConnection } from '../ts/transport/connection';
import { laneWindow, Multiplexer, MUX_FRAME_DATA, MUX_HIGH_WATER, muxGroups, SessionWindow } from '../ts/transport/mux';
import { garbageRelief, RELIEF_STEP } from '../ts/utils/gc';
import { pipePair } from '../ts/transport/stream-pair';
import { seeded } from './helpers/peers';
import { rng } from './helpers/faults';
import { FfsyncError } from '../ts/utils/errors';
import { SharedUnits } from '../ts/utils/data-turns';
import { takeWithSlot } from '../ts/api/write-slots';

describe('frame decoder', () => {
  it('a first frame whose length bytes read 16 03 0x is a frame, not TLS; a TLS ClientHello is refused at its fifth byte', () => {
    // Bodies of 790, 66,326, ... bytes start with the bytes of a TLS record header; the decoder
    // once refused them as the first frame of a connection or of a multiplexed stream.
    for (let minor = 0; minor <= 4; minor++) {
      const body = 0x16 + 0x0300 + minor * 0x10000;
      const frame = encodeFrame(FrameType.DATA, seeded(body - 1, minor));
      assert.deepEqual([...frame.subarray(0, 3)], [0x16, 0x03, minor]);
      for (const cut of [3, 5, 6, frame.length]) {
        const d = new FrameDecoder();
        const got = [...d.push(frame.subarray(0, cut)), ...d.push(frame.subarray(cut))];
        assert.equal(got.length, 1, `body ${body}, cut at ${cut}`);
        assert.ok(got[0]!.payload.equals(frame.subarray(5)));
        got[0]!.release?.();
      }
    }
    // A TLS 1.2/1.3 ClientHello record of 517 bytes (Node's): 16 03 01 02 05 01 …
    const hello = Buffer.concat([Buffer.from([0x16, 0x03, 0x01, 0x02, 0x05, 0x01]), Buffer.alloc(20)]);
    const d = new FrameDecoder();
    assert.deepEqual(d.push(hello.subarray(0, 4)), [], 'four bytes decide nothing');
    assert.throws(() => d.push(hello.subarray(4, 5)), (e: FfsyncError) => e.code === 'ETLSPEER' && e.exitCode === 2);
    // One of 200 bytes (16 03 03 00 c8): the body would fit, but 0xc8 is no frame type.
    assert.throws(() => new FrameDecoder().push(Buffer.from([0x16, 0x03, 0x03, 0x00, 0xc8, 0x01])), (e: FfsyncError) => e.code === 'ETLSPEER');
  });

  it('reassembles frames split at every possible byte boundary', () => {
    const frames = [encodeFrame(FrameType.HELLO, Buffer.from('abc')), encodeFrame(FrameType.DATA, seeded(300_000, 1)), encodeFrame(FrameType.DATA_END, Buffer.alloc(12))];
    const stream = Buffer.concat(frames);
    for (const cut of [1, 2, 4, 5, 6, 7, 1000, 65536, 300_004, stream.length - 1]) {
      const d = new FrameDecoder();
      const got = [...d.push(stream.subarray(0, cut)), ...d.push(stream.subarray(cut))];
      assert.deepEqual(got.map((f) => f.type), [FrameType.HELLO, FrameType.DATA, FrameType.DATA_END], `cut at ${cut}`);
      assert.deepEqual(got[1].payload, frames[1].subarray(5));
      got[1].release?.();
      assert.equal(d.bufferedBytes, 0);
    }
  });

  it('a large frame is copied together as its reads arrive once half of it is here; before that a claim reserves nothing', () => {
    const payload = seeded(2 * 1024 * 1024, 3);
    const stream = Buffer.concat([encodeFrame(FrameType.DATA, payload), encodeFrame(FrameType.RESULT, Buffer.alloc(9, 1))]);
    // A pool of its own with no idle buffer: every buffer the frame gets is a new one.
    const d = new FrameDecoder(new FramePool(FRAME_POOL_BUFFER, FRAME_POOL_KEPT));
    const READ = 64 * 1024;
    const got = [];
    // A header alone, and the first reads: kept as they are, no 2 MiB buffer taken for a claim.
    got.push(...d.push(stream.subarray(0, 5)));
    assert.equal(d.assemblingBytes, 0, 'a header claims nothing');
    let at = 5;
    for (; at + READ <= stream.length / 2 - READ; at += READ) got.push(...d.push(stream.subarray(at, at + READ)));
    assert.equal(d.assemblingBytes, 0, `${at} bytes of ${payload.length + 5}: under half, nothing reserved`);
    assert.ok(d.heldReads > 1);
    // Past half: everything so far is in the frame's buffer and no read is held any more.
    for (; at < (stream.length * 5) / 8; at += READ) got.push(...d.push(stream.subarray(at, at + READ)));
    assert.equal(d.assemblingBytes, payload.length + 5);
    assert.ok(d.assemblingBytes <= 2 * d.bufferedBytes, 'never more than twice what arrived');
    assert.equal(d.heldReads, 0, 'each read is copied in and let go');
    // The rest arrives in one read that also carries the next frame.
    got.push(...d.push(stream.subarray(at)));
    assert.deepEqual(got.map((f) => f.type), [FrameType.DATA, FrameType.RESULT]);
    assert.ok(got[0].payload.equals(payload));
    assert.ok(got[1].payload.equals(Buffer.alloc(9, 1)));
    assert.equal(d.bufferedBytes, 0);
    assert.equal(d.assemblingBytes, 0);
    // Its pooled buffer goes back and serves the next large frame, which decodes intact.
    got[0].release?.();
    const next = seeded(1024 * 1024, 4);
    const again = encodeFrame(FrameType.DATA, next);
    const frames = [];
    for (let k = 0; k < again.length; k += 1000) frames.push(...d.push(again.subarray(k, k + 1000)));
    assert.equal(frames.length, 1);
    assert.ok(frames[0].payload.equals(next));
  });

  it('small reads between large ones share accumulators, not one each; the first is 4 KiB (decisions §82)', () => {
    // Frames of 3000 bytes, read alternately 8 KiB and 100 bytes at a time.
    const frames = Array.from({ length: 400 }, (_, i) => encodeFrame(FrameType.DATA, Buffer.alloc(2995, i)));
    const stream = Buffer.concat(frames);
    const d = new FrameDecoder();
    const slow = Buffer.allocUnsafeSlow;
    let accumulators = 0;
    const sizes: number[] = [];
    let smallReads = 0;
    Buffer.allocUnsafeSlow = (n: number) => {
      if (n >= 4096 && n <= 64 * 1024) {
        accumulators++;
        sizes.push(n);
      }
      return slow(n);
    };
    const got = [];
    try {
      for (let at = 0, k = 0; at < stream.length; k++) {
        const n = k % 2 === 0 ? 8192 : 100;
        if (n === 100) smallReads++;
        got.push(...d.push(Buffer.from(stream.subarray(at, at + n))));
        at += n;
      }
    } finally {
      Buffer.allocUnsafeSlow = slow;
    }
    assert.equal(got.length, frames.length);
    for (const [i, f] of got.entries()) assert.ok(f.payload.equals(Buffer.alloc(2995, i)), `frame ${i}`);
    // 100 bytes each, 14,400 in all: 4, 8 and 16 KiB accumulators hold them (before, one 64 KiB
    // accumulator per small read).
    assert.ok(smallReads > 100);
    assert.deepEqual(sizes, [4096, 8192, 16384], `${accumulators} accumulators for ${smallReads} small reads`);
  });

  it("the process pool's idle buffers can be let go after a burst of large frames (a big tree's manifests, decisions §87)", () => {
    dropIdleFrameBuffers();
    const d = new FrameDecoder(); // the process pool, as every connection uses
    const payload = seeded(2 * 1024 * 1024, 8);
    const stream = encodeFrame(FrameType.TREE_MANIFEST, payload);
    const got = [];
    for (let at = 0; at < stream.length; at += 64 * 1024) got.push(...d.push(stream.subarray(at, at + 64 * 1024)));
    assert.equal(got.length, 1);
    assert.ok(got[0].payload.equals(payload));
    got[0].release?.();
    // The decoder still uses the pool, so its buffer is kept for the next frame...
    assert.equal(dropIdleFrameBuffers(), 1, 'the released frame buffer was kept idle, and is dropped');
    assert.equal(dropIdleFrameBuffers(), 0, 'nothing is kept after the drop');
    // ...and a later large frame simply makes one again.
    const again = [];
    for (let at = 0; at < stream.length; at += 64 * 1024) again.push(...d.push(stream.subarray(at, at + 64 * 1024)));
    assert.ok(again[0].payload.equals(payload));
    again[0].release?.();
    d.dispose();
  });

  it('an idle pooled buffer is taken at the first read of a large frame: no read is held, nothing new is allocated (decisions §82)', () => {
    const pool = new FramePool(FRAME_POOL_BUFFER, FRAME_POOL_KEPT);
    pool.join(); // another connection uses the pool: its idle buffers are kept
    pool.release(pool.take(FRAME_POOL_BUFFER));
    assert.equal(pool.idle, 1);
    assert.equal(pool.allocated, 1);
    const d = new FrameDecoder(pool);
    const payload = seeded(2 * 1024 * 1024, 7);
    const stream = encodeFrame(FrameType.DATA, payload);
    const READ = 64 * 1024;
    // The header and a first read: the idle buffer holds them already (before §82 both reads
    // were kept until a megabyte had arrived, outliving scavenges when lanes read at once).
    assert.equal(d.push(stream.subarray(0, READ)).length, 0);
    assert.equal(d.assemblingBytes, stream.length);
    assert.equal(d.heldReads, 0);
    assert.equal(pool.idle, 0);
    const got = [];
    for (let at = READ; at < stream.length; at += READ) got.push(...d.push(stream.subarray(at, at + READ)));
    assert.equal(got.length, 1);
    assert.ok(got[0].payload.equals(payload));
    assert.equal(pool.allocated, 1, 'the idle buffer served; none was made');
    // With the pool empty (its buffer out), the next frame's claim reserves nothing until half is here.
    d.push(stream.subarray(0, READ));
    assert.equal(d.assemblingBytes, 0);
    assert.equal(pool.allocated, 1);
    got[0].release?.();
    d.dispose();
    pool.leave();
  });

  it("a paused connection's frame just begun gives its idle-taken buffer back, and is assembled again as the rest comes (decisions §116)", () => {
    const pool = new FramePool(FRAME_POOL_BUFFER, FRAME_POOL_KEPT);
    pool.join();
    pool.release(pool.take(FRAME_POOL_BUFFER));
    const d = new FrameDecoder(pool);
    const payload = seeded(2 * 1024 * 1024, 11);
    const stream = encodeFrame(FrameType.DATA, payload);
    const READ = 64 * 1024;
    d.push(stream.subarray(0, READ));
    assert.equal(d.assemblingBytes, stream.length, 'the idle buffer was taken at the first read');
    assert.equal(pool.idle, 0);
    // The connection pauses (its window is full): the buffer goes back for another lane.
    assert.equal(d.yieldAssembly(), true);
    assert.equal(d.assemblingBytes, 0);
    assert.equal(pool.idle, 1, 'the buffer is idle in the pool again');
    assert.equal(d.bufferedBytes, READ, 'its bytes are still here');
    // Another lane takes it meanwhile; the rest of this frame arrives: assembled anew (half is
    // here soon), intact.
    const other = pool.take(FRAME_POOL_BUFFER);
    const got = [];
    for (let at = READ; at < stream.length; at += READ) got.push(...d.push(stream.subarray(at, at + READ)));
    assert.equal(got.length, 1);
    assert.ok(got[0].payload.equals(payload), 'the frame is whole and unchanged');
    got[0].release?.();
    pool.release(other);
    // A frame with more than YIELD_MAX here keeps its buffer (no large copy for a pause), and
    // one half here or more was assembled by the half rule: kept too.
    d.push(stream.subarray(0, FrameDecoder.YIELD_MAX + READ));
    assert.equal(d.assemblingBytes, stream.length);
    assert.equal(d.yieldAssembly(), false);
    assert.equal(d.assemblingBytes, stream.length);
    const rest = d.push(stream.subarray(FrameDecoder.YIELD_MAX + READ));
    assert.ok(rest[0].payload.equals(payload));
    rest[0].release?.();
    assert.equal(d.yieldAssembly(), false, 'nothing begun: nothing to give back');
    d.dispose();
    pool.leave();
  });

  it('a lent chunk of whole frames is decoded in place: large frames keep it until the last is released, small ones get copies', () => {
    const big1 = seeded(300_000, 5);
    const big2 = seeded(400_000, 6);
    const chunk = Buffer.concat([encodeFrame(FrameType.DATA, big1), encodeFrame(FrameType.RESULT, Buffer.alloc(17, 3)), encodeFrame(FrameType.DATA, big2)]);
    let givenBack = 0;
    const d = new FrameDecoder();
    const got = d.push(chunk, [], () => givenBack++);
    assert.deepEqual(got.map((f) => f.type), [FrameType.DATA, FrameType.RESULT, FrameType.DATA]);
    assert.equal(got[0].payload.buffer, chunk.buffer, 'a large frame is a slice of the lent chunk, not a copy');
    assert.equal(got[2].payload.buffer, chunk.buffer);
    assert.notEqual(got[1].payload.buffer, chunk.buffer, 'a small frame gets a copy of its own');
    assert.equal(got[1].release, undefined);
    assert.ok(got[0].payload.equals(big1) && got[2].payload.equals(big2));
    got[0].release!();
    got[0].release!(); // twice: still one holder left
    assert.equal(givenBack, 0, 'given back only once every large frame was released');
    got[2].release!();
    assert.equal(givenBack, 1);
    assert.ok(got[1].payload.equals(Buffer.alloc(17, 3)));
  });

  it('a lent chunk the decoder would keep part of is copied and given back at once', () => {
    const payload = seeded(600_000, 7);
    const stream = encodeFrame(FrameType.DATA, payload);
    for (const [label, pieces] of [
      ['ends mid-frame', [stream.subarray(0, 400_000), stream.subarray(400_000)]],
      ['starts mid-frame', [stream.subarray(0, 100), stream.subarray(100)]],
    ] as const) {
      const d = new FrameDecoder();
      const out: ReturnType<FrameDecoder['push']> = [];
      let givenBack = 0;
      for (const piece of pieces) {
        const lent = Buffer.from(piece); // the lender's buffer
        d.push(lent, out, () => givenBack++);
        lent.fill(0xee); // the lender reuses it once given back
      }
      assert.equal(givenBack, 2, `${label}: each chunk given back at once`);
      assert.equal(out.length, 1, label);
      assert.ok(out[0].payload.equals(payload), `${label}: the frame is intact after the lender scribbled on its chunks`);
      out[0].release?.();
    }
    // A large frame decoded before a violation in the same lent chunk is still delivered: as a copy.
    {
      const big = seeded(300_000, 8);
      const bad = Buffer.alloc(10);
      bad.writeUInt32LE(6, 0);
      bad[4] = 0x55; // a valid length, an unknown type
      const lentChunk = Buffer.concat([encodeFrame(FrameType.DATA, big), bad]);
      const out: ReturnType<FrameDecoder['push']> = [];
      let back = 0;
      assert.throws(() => new FrameDecoder().push(lentChunk, out, () => back++), /unknown frame type/);
      assert.equal(back, 1, 'given back at once');
      assert.equal(out.length, 1);
      assert.notEqual(out[0].payload.buffer, lentChunk.buffer, 'the frame before the violation is a copy');
      lentChunk.fill(0);
      assert.ok(out[0].payload.equals(big));
    }
    // A lent chunk that is not frames at all is given back and fails as any input would.
    let givenBack = 0;
    assert.throws(() => new FrameDecoder().push(Buffer.from([0, 0, 0, 0, 1]), [], () => givenBack++), /out of bounds/);
    assert.equal(givenBack, 1);
  });

  it('the connections of a process share one frame pool: a buffer one releases serves the next; odd sizes and the last user leaving keep nothing', () => {
    const pool = new FramePool(FRAME_POOL_BUFFER, FRAME_POOL_KEPT);
    const lanes = [new FrameDecoder(pool), new FrameDecoder(pool)];
    // A frame that spans two reads is assembled in a pooled buffer.
    const split = (d: FrameDecoder, frame: Buffer) => {
      const half = Math.ceil(frame.length / 2);
      assert.equal(d.push(frame.subarray(0, half)).length, 0);
      const [f] = d.push(frame.subarray(half));
      assert.ok(f?.release, 'assembled in a pooled buffer');
      return f;
    };
    const big = encodeFrame(FrameType.DATA, Buffer.alloc(1536 * 1024, 7));
    const first = split(lanes[0], big);
    first.release!();
    assert.equal(pool.idle, 1);
    const second = split(lanes[1], big);
    assert.equal(second.payload.buffer, first.payload.buffer, 'the other connection reuses the buffer the first gave back');
    assert.ok(second.payload.equals(Buffer.alloc(1536 * 1024, 7)));
    assert.equal(pool.idle, 0);
    // A frame larger than the pool's buffers (a peer's 8 MiB DATA) gets a buffer of its own,
    // which is not kept: what stays idle is bounded by FRAME_POOL_KEPT buffers of one size.
    const odd = split(lanes[0], encodeFrame(FrameType.DATA, Buffer.alloc(8 * 1024 * 1024, 1)));
    odd.release!();
    assert.equal(pool.idle, 0, 'an odd-sized buffer is dropped');
    // More released than the pool keeps: the surplus is dropped.
    const held = Array.from({ length: FRAME_POOL_KEPT + 2 }, () => split(lanes[1], big));
    for (const f of held) f.release!();
    assert.equal(pool.idle, FRAME_POOL_KEPT);
    // The last connection using the pool closes: nothing stays idle (a finished serve holds
    // none), and a frame released after that is not kept either.
    const late = split(lanes[0], big);
    lanes[0].dispose();
    assert.equal(pool.idle, FRAME_POOL_KEPT - 1, 'another connection still uses the pool');
    lanes[1].dispose();
    assert.equal(pool.idle, 0);
    late.release!();
    assert.equal(pool.idle, 0);
    assert.ok(late.payload.equals(Buffer.alloc(1536 * 1024, 7)), 'a frame stays valid after its connection closed');
  });

  it('a decoder collected without dispose() (its stream never closed) still leaves the frame pool', async () => {
    const pool = new FramePool(FRAME_POOL_BUFFER, FRAME_POOL_KEPT);
    (() => {
      const d = new FrameDecoder(pool);
      const frame = encodeFrame(FrameType.DATA, Buffer.alloc(1536 * 1024, 3));
      d.push(frame.subarray(0, frame.length / 2));
      const [f] = d.push(frame.subarray(frame.length / 2));
      f!.release!();
    })();
    assert.equal(pool.idle, 1, 'the released buffer waits for the decoder, which still uses the pool');
    v8.setFlagsFromString('--expose-gc');
    const gc = vm.runInNewContext('gc') as () => void;
    for (let i = 0; i < 50 && pool.idle > 0; i++) {
      gc();
      await new Promise((r) => setTimeout(r, 10));
    }
    assert.equal(pool.idle, 0, 'its last user gone, the pool keeps nothing');
  });

  it('byte-at-a-time delivery yields the same frames', () => {
    const stream = Buffer.concat([encodeFrame(FrameType.NEED, Buffer.from([1, 2, 3, 4, 5])), encodeFrame(FrameType.RESULT, Buffer.alloc(17, 7))]);
    const d = new FrameDecoder();
    const got = [];
    for (const b of stream) got.push(...d.push(Buffer.from([b])));
    assert.equal(got.length, 2);
    assert.deepEqual(got[1].payload, Buffer.alloc(17, 7));
  });

  it('rejects zero, oversized lengths and unknown types before buffering the body', () => {
    const mk = (len: number, type: number) => {
      const b = Buffer.alloc(5);
      b.writeUInt32LE(len, 0);
      b.writeUInt8(type, 4);
      return b;
    };
    assert.throws(() => new FrameDecoder().push(mk(0, FrameType.DATA)), /out of bounds/);
    assert.throws(() => new FrameDecoder().push(mk(MAX_FRAME_BODY + 1, FrameType.DATA)), /out of bounds/);
    assert.throws(() => new FrameDecoder().push(mk(10, 0x55)), /unknown frame type/);
  });
});

describe('messages', () => {
  it('HELLO round trip and version negotiation', () => {
    const h = { minVersion: 1, maxVersion: 3, capabilities: 5, role: Role.SENDER, software: 'x/1' };
    assert.deepEqual(decodeHello(encodeHello(h)), h);
    assert.equal(negotiateVersion({ min: 1, max: 2 }, h), 2);
    assert.throws(() => negotiateVersion({ min: 4, max: 5 }, h), (e: any) => e.exitCode === 2 && /1\.\.3/.test(e.message));
    assert.throws(() => decodeHello(Buffer.from('GET / HTTP/1.1\r\n\r\n')), (e: any) => e.exitCode === 2);
  });

  it('OFFER round trip with and without a root; bad lengths refused', () => {
    const base = { kind: OfferKind.FILE, size: 123n, mtimeNs: -5n, mode: 0o644, flags: 0 };
    assert.deepEqual(decodeOffer(encodeOffer(base)), { ...base, root: undefined });
    const root = seeded(32, 4);
    assert.deepEqual(decodeOffer(encodeOffer({ ...base, root })).root, root);
    assert.throws(() => decodeOffer(Buffer.alloc(10)), /bad length/);
  });

  it('manifests split into parts reassemble; oversize totals are refused', () => {
    const m = seeded(64 + 36 * 70_000, 5);
    const asm = new ManifestAssembler(m.length);
    let out: Buffer | undefined;
    const parts = [...manifestFrames(m)];
    assert.ok(parts.length > 1);
    for (const p of parts) out = asm.push(p) ?? out;
    assert.deepEqual(out, m);
    assert.throws(() => new ManifestAssembler(100).push(parts[0]), /impossible/);
    assert.equal(maxManifestLength(0n), 64);
  });

  it('NEED bitmaps round trip and refuse out-of-range chunks', () => {
    const needed = Uint32Array.from([0, 7, 8, 1000, 600_000]);
    const c = new NeedCollector(700_000);
    for (const f of needFrames(needed, 700_000)) c.push(f);
    assert.deepEqual(c.finish(needed.length), needed);
    const small = new NeedCollector(10);
    const bad = Buffer.from([0, 0, 0, 0, 0, 0xff]);
    assert.throws(() => small.push(bad), /beyond/);
    assert.throws(() => new NeedCollector(10).finish(3), /announced 3/);
  });

  it('ERROR frames carry exit code and message; garbage ERROR frames are protocol errors', () => {
    const e = decodeError(encodeError(11, 'ENOSPC', 'disk full'));
    assert.equal(e.exitCode, 11);
    assert.equal(e.code, 'ENOSPC');
    assert.match(e.message, /disk full/);
    assert.equal(decodeError(Buffer.alloc(1)).exitCode, 12);
    assert.equal(decodeError(encodeError(999, 'X', 'y')).exitCode, 12, 'unknown exit codes are not trusted');
    assert.equal(decodeError(encodeError(0, 'X', 'y')).exitCode, 12, 'a peer error never becomes success');
  });

  it('batches never exceed the byte budget except for a single chunk', () => {
    const m = Buffer.alloc(64 + 36 * 5);
    [100, 200, 300, 5000, 50].forEach((len, i) => m.writeUInt32LE(len, 64 + i * 36));
    const b = batchByBytes(m, Uint32Array.from([0, 1, 2, 3, 4]), 400);
    assert.deepEqual(b.map((x) => [...x]), [[0, 1], [2], [3], [4]]);
  });
});

describe('strict decoding of small frames', () => {
  it('refuses unknown roles, unknown offer flags, inconsistent decisions and NEED_END', () => {
    const hello = encodeHello({ minVersion: 1, maxVersion: 1, capabilities: 0, role: Role.SENDER, software: '' });
    hello[14] = 9;
    assert.throws(() => decodeHello(hello), /unknown role/);
    const offer = encodeOffer({ kind: OfferKind.FILE, size: 1n, mtimeNs: 0n, mode: 0, flags: 0 });
    // Every flag bit is assigned now; tree-only flags on a file offer are refused.
    offer[21] |= 0x80;
    assert.throws(() => decodeOffer(offer), /tree flags/);
    const tree = encodeOffer({ kind: OfferKind.TREE, size: 0n, mtimeNs: 0n, mode: 0o755, flags: 0 });
    assert.equal(decodeOffer(tree).kind, OfferKind.TREE);
    tree.writeBigUInt64LE(3n, 1); // lanes without PARALLEL
    assert.throws(() => decodeOffer(tree), /lane count/);
    const badKind = Buffer.from(tree);
    badKind[0] = 9;
    assert.throws(() => decodeOffer(badKind), /unknown kind/);
    assert.deepEqual(decodeDecision(encodeDecision(Decision.UP_TO_DATE, DecisionReason.INDEX_ROOT)), { decision: 0, reason: 2 });
    assert.throws(() => decodeDecision(encodeDecision(Decision.UP_TO_DATE)), /reason/);
    assert.throws(() => decodeDecision(Buffer.from([1])), /bad DECISION/);
    assert.throws(() => decodeNeedEnd(encodeNeedEnd({ wireChunks: 3, identical: true })), /identical/);
  });
});

describe('framed connection', () => {
  async function pair(idleMs: number): Promise<[FramedConnection, FramedConnection, () => void]> {
    const srv = net.createServer();
    await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
    const accepted = new Promise<net.Socket>((r) => srv.once('connection', r));
    const c = net.connect((srv.address() as net.AddressInfo).port, '127.0.0.1');
    const s = await accepted;
    return [new FramedConnection(c, idleMs), new FramedConnection(s, idleMs), () => (c.destroy(), s.destroy(), srv.close())];
  }

  it('a peer busy with local work keeps the other side from timing out', async () => {
    const [a, b, close] = await pair(400);
    try {
      const busy = a.keepAlive(new Promise((r) => setTimeout(r, 1_500))).then(() => a.send(FrameType.RESULT, Buffer.alloc(17)));
      const f = await b.recv();
      assert.equal(f.type, FrameType.RESULT, 'KEEPALIVE frames are consumed silently');
      await busy;
    } finally {
      close();
    }
  });

  it('a silent peer times out with exit 30', async () => {
    const [, b, close] = await pair(300);
    try {
      await assert.rejects(b.recv(), (e: any) => e.exitCode === 30);
    } finally {
      close();
    }
  });

  it('orFailure on a connection that already failed returns at once, and the work failing afterwards is not an unhandled rejection', async () => {
    const [a, , close] = await pair(0);
    const unhandled: unknown[] = [];
    const onUnhandled = (e: unknown) => unhandled.push(e);
    process.on('unhandledRejection', onUnhandled);
    try {
      let failWork!: (e: Error) => void;
      const work = new Promise<void>((_, reject) => (failWork = reject));
      a.failWith(new Error('the peer said no'));
      await a.orFailure(work);
      // The work fails only now: a stream's LANE_END that its failed connection refused ended
      // the sender with exit 1 before decisions §91's fix.
      failWork(new Error('refused after the failure'));
      await new Promise((r) => setTimeout(r, 20));
      assert.deepEqual(unhandled, []);
    } finally {
      process.off('unhandledRejection', onUnhandled);
      close();
    }
  });

  it('frames decoded before a framing violation are still delivered', async () => {
    const [a, b, close] = await pair(0);
    try {
      const bad = Buffer.concat([encodeFrame(FrameType.NEED_END, Buffer.alloc(5)), Buffer.from([0, 0, 0, 0, 0])]);
      (a as any).stream.write(bad);
      assert.equal((await b.recv()).type, FrameType.NEED_END);
      await assert.rejects(b.recv(), /out of bounds/);
    } finally {
      close();
    }
  });
});

/** One lane of a multiplexed session over an in-memory pipe: the receiving side's multiplexer
 * joins `session` with a window of its own far above the session's; the sending side's stream
 * runs `send`. */
function sessionLane(session: SessionWindow, send: (out: FramedConnection) => Promise<void>) {
  const [a, b] = pipePair();
  const ca = new FramedConnection(a, 0);
  const cb = new FramedConnection(b, 0);
  const accepted = new Promise<FramedConnection>((resolve) => new Multiplexer(cb, { opener: false, onStream: resolve, window: 64 * 1024 * 1024, session }));
  const sending = send(new Multiplexer(ca, { opener: true }).open());
  sending.catch(() => undefined);
  return { a, b, accepted, sending };
}

/** A stream's bytes received and not yet taken by its reader. */
const unread = (c: FramedConnection) => c.pendingBytes + (c as unknown as { stream: { readableLength: number } }).stream.readableLength;

/** Polls `ok` until it holds; fails with `what` after 10 s. */
async function until(what: string, ok: () => boolean): Promise<void> {
  for (const t0 = Date.now(); !ok(); ) {
    assert.ok(Date.now() - t0 < 10_000, what);
    await new Promise((r) => setTimeout(r, 10));
  }
}

describe('multiplexed streams', () => {
  it('large frames reach a stream without a copy: the pooled buffers go back and are reused, and nothing held is overwritten', async () => {
    const [a, b] = pipePair();
    const ca = new FramedConnection(a, 0);
    const cb = new FramedConnection(b, 0);
    const accepted = new Promise<FramedConnection>((resolve) => new Multiplexer(cb, { opener: false, onStream: resolve }));
    const opener = new Multiplexer(ca, { opener: true });
    const out = opener.open();
    const N = 40;
    const payload = (k: number) => Buffer.alloc(1024 * 1024, k + 1);
    const sending = (async () => {
      for (let k = 0; k < N; k++) await out.send(FrameType.DATA, payload(k));
    })();
    const inn = await accepted;
    const buffers = new Set<ArrayBufferLike>();
    const held: { k: number; f: Awaited<ReturnType<FramedConnection['recv']>> }[] = [];
    try {
      for (let k = 0; k < N; k++) {
        const f = await inn.recv();
        assert.equal(f.type, FrameType.DATA);
        assert.ok(f.release, 'a pooled frame, released by its reader');
        buffers.add(f.payload.buffer);
        held.push({ k, f });
        // Three frames held at once while later ones arrive: none of them may change.
        if (held.length > 3) {
          const h = held.shift()!;
          assert.ok(h.f.payload.equals(payload(h.k)), `frame ${h.k} intact while later frames arrived`);
          h.f.release!();
        }
      }
      for (const h of held) assert.ok(h.f.payload.equals(payload(h.k)), `frame ${h.k} intact`);
      await sending;
      // A copy per frame would be 40 buffers; lent and given back, a few serve them all.
      assert.ok(buffers.size <= 12, `${buffers.size} buffers for ${N} frames`);
    } finally {
      a.destroy();
      b.destroy();
    }
  });

  it('frames written at once cross in MUX frames that fit one pooled buffer, cut only between frames', async () => {
    // Random frames, as a stream's writer hands them over: a header part, then the payload in
    // one or more parts; a few frames larger than one MUX frame may carry.
    const rnd = rng(71);
    for (let round = 0; round < 200; round++) {
      const parts: Buffer[] = [];
      const count = 1 + Math.floor(rnd() * 12);
      for (let k = 0; k < count; k++) {
        const r = rnd();
        const len = r < 0.4 ? 1 + Math.floor(rnd() * 64) : r < 0.95 ? Math.floor(rnd() * 2 * 1024 * 1024) : MUX_FRAME_DATA + Math.floor(rnd() * 1024 * 1024);
        const payload = Buffer.alloc(len, k);
        parts.push(encodeFrameHeader(FrameType.DATA, len));
        const cut = len > 1 && rnd() < 0.3 ? Math.floor(rnd() * len) : len;
        parts.push(payload.subarray(0, cut));
        if (cut < len) parts.push(payload.subarray(cut));
      }
      const groups = muxGroups(parts);
      assert.deepEqual(Buffer.concat(groups.flat()), Buffer.concat(parts), 'the same bytes in the same order');
      for (const g of groups) {
        const bytes = Buffer.concat(g);
        assert.ok(wholeFrames(bytes), `round ${round}: a MUX frame carries whole frames`);
        const frames = new FrameDecoder().push(bytes).length;
        assert.ok(bytes.length <= MUX_FRAME_DATA || frames === 1, `round ${round}: ${bytes.length} bytes in ${frames} frames`);
      }
      // Greedy: two neighbours could not have shared one MUX frame.
      for (let i = 1; i < groups.length; i++) {
        const firstOfNext = new FrameDecoder().push(Buffer.concat(groups[i]))[0]!;
        assert.ok(Buffer.concat(groups[i - 1]).length + 5 + firstOfNext.payload.length > MUX_FRAME_DATA, `round ${round}: group ${i} cut early`);
      }
    }
    assert.deepEqual(muxGroups([]), [[]], 'FIN: one empty MUX frame');
    // An empty part after an oversized frame stays with it: alone it would be a FIN.
    const big = Buffer.alloc(MUX_FRAME_DATA + 10);
    const withEmpty = muxGroups([encodeFrameHeader(FrameType.DATA, big.length), big, Buffer.alloc(0)]);
    assert.equal(withEmpty.length, 1);
    assert.ok(withEmpty.every((g) => g.some((p) => p.length > 0)), 'no MUX frame without bytes but the FIN');

    // Through a multiplexer pair: batches sent without waiting coalesce in the stream's writer;
    // each MUX frame still fits a pooled buffer and each batch reaches its reader uncopied (over
    // the in-memory pipe, which lends writes of 1 MiB or more: decisions §102).
    const [a, b] = pipePair();
    const ca = new FramedConnection(a, 0);
    const cb = new FramedConnection(b, 0);
    const muxSizes: number[] = [];
    const sendParts = ca.sendParts.bind(ca);
    ca.sendParts = (type, ps, onWritten, wait) => {
      if (type === FrameType.MUX) muxSizes.push(ps.reduce((n, p) => n + p.length, 0));
      return sendParts(type, ps, onWritten, wait);
    };
    const accepted = new Promise<FramedConnection>((resolve) => new Multiplexer(cb, { opener: false, onStream: resolve }));
    const out = new Multiplexer(ca, { opener: true }).open();
    const sizes = [1700, 1500, 2000, 1100, 1800, 1200].map((k) => k * 1024);
    const sending = Promise.all(sizes.map((n, k) => out.send(FrameType.DATA, Buffer.alloc(n, k + 1))));
    const inn = await accepted;
    try {
      for (let k = 0; k < sizes.length; k++) {
        const f = await inn.recv();
        assert.ok(f.payload.equals(Buffer.alloc(sizes[k], k + 1)));
        assert.ok(f.release, `batch ${k} lent from the MUX frame's pooled buffer, not copied`);
        f.release();
      }
      await sending;
      assert.ok(muxSizes.length >= sizes.length);
      for (const n of muxSizes) assert.ok(n <= MUX_FRAME_DATA + 4, `a MUX frame of ${n} bytes (id included)`);
      assert.ok(5 + MUX_FRAME_DATA + 4 <= FRAME_POOL_BUFFER, 'a whole MUX frame fits a pooled buffer');
    } finally {
      a.destroy();
      b.destroy();
    }
  });

  it('socket reads are counted once for the process: lanes share the scavenge step, streams are not counted again', async () => {
    const expected = (start: { runs: number; pending: number }, bytes: number) => start.runs + Math.floor((start.pending + bytes) / RELIEF_STEP);
    const pairs = [pipePair(), pipePair()];
    try {
      // 3 MiB on each of two connections: under the step each, over it together.
      const receivers = pairs.map(([, b]) => new FramedConnection(b, 0));
      const senders = pairs.map(([a]) => new FramedConnection(a, 0));
      const start = garbageRelief();
      for (const [i, s] of senders.entries()) {
        for (let k = 0; k < 3; k++) await s.send(FrameType.DATA, Buffer.alloc(1024 * 1024, k));
        for (let k = 0; k < 3; k++) (await receivers[i]!.recv()).release?.();
      }
      const read = receivers.reduce((n, r) => n + r.bytesReceived, 0);
      assert.ok(read > RELIEF_STEP && read / 2 < RELIEF_STEP);
      assert.equal(garbageRelief().runs, expected(start, read), 'both connections count towards one step');
      assert.ok(garbageRelief().runs > start.runs);
    } finally {
      for (const [a, b] of pairs) {
        a.destroy();
        b.destroy();
      }
    }
    // 8 MiB on a multiplexed stream: the connection's reads count, the stream's slices of them do not.
    const [a, b] = pipePair();
    try {
      const ca = new FramedConnection(a, 0);
      const cb = new FramedConnection(b, 0);
      const accepted = new Promise<FramedConnection>((resolve) => new Multiplexer(cb, { opener: false, onStream: resolve }));
      const out = new Multiplexer(ca, { opener: true }).open();
      const start = garbageRelief();
      const sending = (async () => {
        for (let k = 0; k < 8; k++) await out.send(FrameType.DATA, Buffer.alloc(1024 * 1024, k));
      })();
      const inn = await accepted;
      for (let k = 0; k < 8; k++) (await inn.recv()).release?.();
      await sending;
      assert.equal(garbageRelief().runs, expected(start, cb.bytesReceived), `${cb.bytesReceived} bytes read on the connection, counted once`);
    } finally {
      a.destroy();
      b.destroy();
    }
  });

  it('a lane\'s first MUX frames may come in the read that brings its JOIN: held until its multiplexer attaches', async () => {
    // What a lane's sender writes right behind JOIN: a MUX frame opening its first stream,
    // captured from a real opener (its bytes never reach a peer).
    const [x, y] = pipePair();
    const opener = new FramedConnection(x, 0);
    const muxFrames: Buffer[] = [];
    opener.sendParts = (type, ps, onWritten) => {
      if (type === FrameType.MUX) muxFrames.push(encodeFrame(FrameType.MUX, Buffer.concat(ps)));
      onWritten?.();
      return Promise.resolve();
    };
    await new Multiplexer(opener, { opener: true }).open().send(FrameType.DATA, Buffer.from('the first stream\'s bytes'));
    x.destroy();
    y.destroy();
    assert.ok(muxFrames.length >= 1, 'the opener wrote its stream');
    const joinAndStream = Buffer.concat([encodeFrame(FrameType.JOIN, Buffer.alloc(16, 7)), ...muxFrames]);
    /** A receiving lane fed `bytes` in one read (told to expect streams or not), then `check`ed. */
    const lane = async (bytes: Buffer, expecting: boolean, check: (c: FramedConnection) => Promise<void>) => {
      const [a, b] = pipePair();
      const c = new FramedConnection(b, 60_000);
      if (expecting) c.expectMux();
      a.write(bytes);
      try {
        await check(c);
      } finally {
        a.destroy();
        b.destroy();
      }
    };
    const accept = (c: FramedConnection) => new Promise<FramedConnection>((resolve) => new Multiplexer(c, { opener: false, onStream: resolve }));

    await lane(joinAndStream, true, async (c) => {
      assert.equal((await c.recv()).type, FrameType.JOIN);
      const f = await (await accept(c)).recv();
      assert.equal(f.type, FrameType.DATA);
      assert.equal(f.payload.toString(), 'the first stream\'s bytes');
      assert.equal(c.pendingBytes, 0, 'the held frame no longer counts against the connection');
    });
    // Without being told, the connection refuses a MUX frame it has no multiplexer for (the
    // defect this guards against: a lane failed with exit 12 when both came in one read).
    await lane(joinAndStream, false, async (c) => {
      assert.equal((await c.recv()).type, FrameType.JOIN, 'frames before the violation are delivered');
      await assert.rejects(c.recv(), /MUX frame outside a multiplexed tree session/);
    });
    // Held only behind a JOIN: a MUX frame before it is refused even on a lane that expects
    // streams (a peer that has shown no token cannot make the receiver hold frames for it).
    await lane(Buffer.concat([...muxFrames, encodeFrame(FrameType.JOIN, Buffer.alloc(16, 7))]), true, async (c) => {
      await assert.rejects(c.recv(), /MUX frame outside a multiplexed tree session/);
    });
    // The peer's ERROR came behind the held stream: once the multiplexer attaches, the stream
    // fails with the peer's error at once, as it would have live (not at an idle timer).
    await lane(Buffer.concat([joinAndStream, encodeFrame(FrameType.ERROR, encodeError(11, 'ENOSPC', 'disk full'))]), true, async (c) => {
      assert.equal((await c.recv()).type, FrameType.JOIN);
      const stream = await accept(c);
      const t0 = Date.now();
      await assert.rejects(
        (async () => {
          for (;;) await stream.recv(); // its bytes, if it still reads them, then the error
        })(),
        /disk full/,
      );
      assert.ok(Date.now() - t0 < 5_000, 'failed with its connection, not by a timer');
    });
  });

  it("a session's connections share one window of unread bytes; a connection with none unread still reads (decisions §82)", async () => {
    const MiB = 1024 * 1024;
    const session = new SessionWindow(4 * MiB);
    // Two lanes of one session, each with a window of its own far above the session's.
    const lanes = [0, 1].map(() =>
      sessionLane(session, async (out) => {
        for (let k = 0; k < 16; k++) await out.send(FrameType.DATA, Buffer.alloc(MiB, k));
      }),
    );
    try {
      const [first, second] = await Promise.all(lanes.map((l) => l.accepted));
      // Both stop with the session's window between them (each may land one frame past it).
      for (const t0 = Date.now(); !(lanes[0]!.b.isPaused() && lanes[1]!.b.isPaused()); ) {
        assert.ok(Date.now() - t0 < 10_000, `both connections stop reading: ${lanes.map((l) => l.b.isPaused()).join(', ')}`);
        await new Promise((r) => setTimeout(r, 20));
      }
      // And stay stopped (nothing more is read while nobody reads).
      await new Promise((r) => setTimeout(r, 200));
      assert.ok(lanes[0]!.b.isPaused() && lanes[1]!.b.isPaused(), 'both connections stopped reading');
      const both = unread(first!) + unread(second!);
      assert.ok(both <= 4 * MiB + 2 * 2 * MiB, `${both} bytes unread in the session`);
      // The second lane's reader takes everything it has; the first keeps its backlog. The second
      // reads on (it holds nothing unread), frame after frame, to its end.
      for (let k = 0; k < 16; k++) {
        const f = await second!.recv();
        assert.equal(f.payload[0], k, `lane 2 frame ${k}`);
        f.release?.();
      }
      await lanes[1]!.sending;
      assert.ok(lanes[0]!.b.isPaused(), "the first lane still waits for its own reader");
      const backlog = unread(first!);
      assert.ok(backlog > 0 && backlog <= 4 * MiB + 2 * MiB, `${backlog} bytes wait on the first lane`);
      for (let k = 0; k < 16; k++) {
        const f = await first!.recv();
        assert.equal(f.payload[0], k, `lane 1 frame ${k}`);
        f.release?.();
      }
      await lanes[0]!.sending;
    } finally {
      for (const l of lanes) {
        l.a.destroy();
        l.b.destroy();
      }
    }
  });

  it("a connection holding unread bytes stops reading as soon as the session's other connections fill the window, not at its own next frame (decisions §116)", async () => {
    const MiB = 1024 * 1024;
    const session = new SessionWindow(4 * MiB);
    let go!: () => void;
    const later = new Promise<void>((r) => (go = r));
    // Three lanes, each with a window of its own far above the session's. The first sends one
    // frame, then (once the others filled the session) eight more; the others send at once.
    const lanes = [0, 1, 2].map((i) =>
      sessionLane(session, async (out) => {
        await out.send(FrameType.DATA, Buffer.alloc(MiB, 0));
        if (i === 0) await later;
        for (let k = 1; k < 9; k++) await out.send(FrameType.DATA, Buffer.alloc(MiB, k));
      }),
    );
    try {
      const [first, ...others] = await Promise.all(lanes.map((l) => l.accepted));
      // The first lane read its frame while the session was under its window: it reads on.
      await until('the first lane holds its frame', () => unread(first!) >= MiB);
      await until('the other lanes stop reading', () => lanes[1]!.b.isPaused() && lanes[2]!.b.isPaused());
      assert.ok(others.reduce((n, c) => n + unread(c), 0) + unread(first!) > 4 * MiB, 'the session is over its window');
      // The others' bytes took the session over: the first lane, holding a frame of its own, has
      // stopped too (before §116 it read its next frame first, and the next lane's, and so on).
      assert.ok(lanes[0]!.b.isPaused(), 'the first lane stopped when the others filled the session');
      go();
      await new Promise((r) => setTimeout(r, 200));
      assert.equal(unread(first!), MiB, 'nothing more was read on the first lane');
      // Its reader takes its frame: holding nothing, it reads again, frame after frame.
      for (let k = 0; k < 9; k++) {
        const f = await first!.recv();
        assert.equal(f.payload[0], k, `lane 1 frame ${k}`);
        f.release?.();
      }
      await lanes[0]!.sending;
      for (const c of others) {
        for (let k = 0; k < 9; k++) (await c.recv()).release?.();
      }
      await Promise.all(lanes.map((l) => l.sending));
    } finally {
      for (const l of lanes) {
        l.a.destroy();
        l.b.destroy();
      }
    }
  });

  it("a connection holding nothing stops too while every unread byte of the session waits for a write slot, and reads again once some does not (decisions §119)", async () => {
    const MiB = 1024 * 1024;
    const session = new SessionWindow(4 * MiB);
    // No write slot free: each batch taken with one is put back to wait (write-slots.ts).
    const slots = new SharedUnits(0);
    const gate = () => {
      let open!: () => void;
      const opened = new Promise<void>((r) => (open = r));
      return { open, opened };
    };
    const secondGo = gate();
    const thirdGo = gate();
    // Two busy lanes send four 1 MiB batches each, the second once the first's are all here (so
    // the first holds all four: the session, at exactly its window, is not over it yet); the
    // third sends a small frame (its stream opens with it), then, once told, nine batches.
    const lanes = [0, 1, 2].map((i) =>
      sessionLane(session, async (out) => {
        if (i < 2) {
          if (i === 1) await secondGo.opened;
          for (let k = 0; k < 4; k++) await out.send(FrameType.DATA, Buffer.alloc(MiB, k));
          return;
        }
        await out.send(FrameType.DATA_END, Buffer.alloc(8));
        await thirdGo.opened;
        for (let k = 0; k < 9; k++) await out.send(FrameType.DATA, Buffer.alloc(MiB, k));
      }),
    );
    try {
      const [first, third] = await Promise.all([lanes[0]!.accepted, lanes[2]!.accepted]);
      (await third!.recv()).release?.();
      await until("the first lane holds its four batches", () => unread(first!) === 4 * MiB);
      secondGo.open();
      const second = await lanes[1]!.accepted;
      // The second lane's first batch takes the session over its window: both busy lanes stop.
      await until('the busy lanes stop reading with the session over its window', () => lanes[0]!.b.isPaused() && lanes[1]!.b.isPaused() && unread(second) >= MiB);
      // Their readers take a batch each and put it back to wait for a slot.
      const taking = [first!, second].map((c) => takeWithSlot(c, () => c.recv(), slots));
      await until('both batches wait for a slot', () => first!.waitingForSlot && second.waitingForSlot);
      thirdGo.open();
      await new Promise((r) => setTimeout(r, 200));
      // The third lane holds nothing, and everything the session holds drains by writes alone:
      // it stopped instead of reading a batch to wait beside them (before §119 it read one).
      assert.ok(lanes[2]!.b.isPaused(), 'the idle lane stopped reading');
      assert.equal(unread(third!), 0, 'nothing was read on the idle lane');
      // A slot comes: the first lane's batch is taken, and the batches behind it wait for a
      // reader, not for a slot. The idle lane reads again (§82: its conversation may need its
      // next frame while those wait on something that is not local work), all nine batches.
      slots.release(1);
      const behind = unread(first!) - MiB;
      assert.equal(behind, 3 * MiB, "three batches behind the first lane's parked one");
      const taken = await taking[0]!;
      assert.equal(taken.frame.payload[0], 0, 'the batch put back is the batch taken');
      assert.ok(!first!.waitingForSlot, 'the first lane no longer waits for a slot');
      for (let k = 0; k < 9; k++) {
        const f = await third!.recv();
        assert.equal(f.payload[0], k, `lane 3 batch ${k}`);
        f.release?.();
      }
      await lanes[2]!.sending;
      assert.ok(behind > 0 && unread(first!) === behind, "the first lane's batches behind the one taken still wait for its reader");
      taken.frame.release?.();
      taken.done();
      const last = await taking[1]!;
      last.frame.release?.();
      last.done();
      for (const c of [first!, second]) {
        for (let k = 1; k < 4; k++) {
          const f = await c.recv();
          assert.equal(f.payload[0], k, `a busy lane's batch ${k}`);
          f.release?.();
        }
      }
      await Promise.all(lanes.map((l) => l.sending));
    } finally {
      for (const l of lanes) {
        l.a.destroy();
        l.b.destroy();
      }
    }
  });

  it('a connection stops reading at its window of unread stream bytes; each lane has 4 MiB', async () => {
    // 4 MiB per connection (decisions §78): the session's window divided between lanes would be
    // under one stream's high-water mark, which is the floor, so each lane reads ahead 4 MiB.
    assert.equal(laneWindow(1), MUX_HIGH_WATER);
    assert.equal(MUX_HIGH_WATER, 4 * 1024 * 1024);
    for (const n of [2, 4, 16]) assert.equal(laneWindow(n), 4 * 1024 * 1024, `${n} lanes: 4 MiB each`);
    const [a, b] = pipePair();
    const ca = new FramedConnection(a, 0);
    const cb = new FramedConnection(b, 0);
    let mux!: Multiplexer;
    const accepted = new Promise<FramedConnection>((resolve) => (mux = new Multiplexer(cb, { opener: false, onStream: resolve, window: laneWindow(4) })));
    const out = new Multiplexer(ca, { opener: true }).open();
    // 24 frames of 1 MiB the receiving stream does not read yet.
    const sending = (async () => {
      for (let k = 0; k < 24; k++) await out.send(FrameType.DATA, Buffer.alloc(1024 * 1024, k));
    })();
    sending.catch(() => undefined);
    const inn = await accepted;
    const settle = () => new Promise((r) => setTimeout(r, 300));
    try {
      await settle();
      // What isOver counts: the stream's unread bytes and what its conversation has not taken.
      const read = () => inn.pendingBytes + (inn as unknown as { stream: { readableLength: number } }).stream.readableLength;
      const first = read();
      assert.ok(b.isPaused(), 'the connection stopped reading');
      // One 1 MiB frame (and its MUX frame) may land past the mark before the pause.
      assert.ok(first <= laneWindow(4) + 2 * 1024 * 1024, `${first} bytes read ahead with a window of ${laneWindow(4)}`);
      const wider = 4 * laneWindow(4);
      mux.setWindow(wider);
      await settle();
      assert.ok(read() > first, `a wider window reads on: ${first} then ${read()}, paused ${b.isPaused()}`);
      assert.ok(read() <= wider + 2 * 1024 * 1024);
      for (let k = 0; k < 24; k++) {
        const f = await inn.recv();
        assert.equal(f.payload[0], k);
        f.release?.();
      }
      await sending;
    } finally {
      a.destroy();
      b.destroy();
    }
  });
});
