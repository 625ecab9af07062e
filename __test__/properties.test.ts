// Property tests (fast-check) for the TypeScript decoders that face the network: whatever
// bytes arrive, in whatever pieces, they either decode to what was sent or fail with a
// protocol FfsyncError — never another exception, never a hang, never unbounded memory.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import { encodeFrame, FRAME_POOL_BUFFER, FRAME_POOL_KEPT, FrameDecoder, FramePool, FrameType, MAX_FRAME_BODY } from '../ts/protocol/frames';
import {
  decodeDataEnd,
  decodeDecision,
  decodeError,
  decodeHello,
  decodeNeedEnd,
  decodeOffer,
  decodeResult,
  ManifestAssembler,
  NeedCollector,
} from '../ts/protocol/messages';
import { parseFingerprint } from '../ts/security/fingerprint';
import { FfsyncError } from '../ts/utils/errors';

const RUNS = 300;
const types = Object.values(FrameType).filter((t) => t !== FrameType.KEEPALIVE);

/** Split `buf` at the given cut points (sorted, deduplicated). */
function split(buf: Buffer, cuts: number[]): Buffer[] {
  const points = [...new Set(cuts.map((c) => c % (buf.length + 1)))].sort((a, b) => a - b);
  const out: Buffer[] = [];
  let at = 0;
  for (const p of points) {
    out.push(buf.subarray(at, p));
    at = p;
  }
  out.push(buf.subarray(at));
  return out;
}

describe('frame decoder properties', () => {
  it('any sequence of valid frames, split anywhere, decodes to the same frames', () => {
    fc.assert(
      fc.property(
        fc.array(fc.record({ type: fc.constantFrom(...types), payload: fc.uint8Array({ maxLength: 3000 }) }), { maxLength: 12 }),
        fc.array(fc.nat(), { maxLength: 20 }),
        (frames, cuts) => {
          const stream = Buffer.concat(frames.map((f) => encodeFrame(f.type, f.payload)));
          const d = new FrameDecoder();
          const got: { type: number; payload: Buffer }[] = [];
          for (const piece of split(stream, cuts)) got.push(...d.push(piece));
          assert.equal(got.length, frames.length);
          got.forEach((g, i) => {
            assert.equal(g.type, frames[i].type);
            assert.deepEqual(new Uint8Array(g.payload), frames[i].payload);
          });
          assert.equal(d.bufferedBytes, 0);
        },
      ),
      { numRuns: RUNS },
    );
  });

  it('large frames, split anywhere and released as they are read, decode to the same frames', () => {
    // Frames above FrameDecoder.POOLED_MIN are assembled in pooled buffers while they arrive;
    // a released buffer is reused for a later frame, so each frame is checked as it comes.
    fc.assert(
      fc.property(
        fc.array(fc.record({ size: fc.oneof(fc.nat(3000), fc.integer({ min: 200_000, max: 2_200_000 })), seed: fc.nat(255) }), { minLength: 1, maxLength: 5 }),
        fc.array(fc.nat(), { maxLength: 40 }),
        (specs, cuts) => {
          const payloads = specs.map((s) => Buffer.alloc(Math.min(s.size, MAX_FRAME_BODY - 1), s.seed));
          payloads.forEach((p, i) => i < p.length && (p[i] = i)); // not all one byte
          const stream = Buffer.concat(payloads.map((p) => encodeFrame(FrameType.DATA, p)));
          const pool = new FramePool(FRAME_POOL_BUFFER, FRAME_POOL_KEPT);
          const d = new FrameDecoder(pool);
          // An idle buffer may be taken at once (decisions §82); a new one (of any size) only for a
          // frame at least half of which has arrived.
          const take = pool.take.bind(pool);
          pool.take = (size: number) => {
            const before = pool.allocated;
            const b = take(size);
            if (pool.allocated > before) assert.ok(size <= 2 * d.bufferedBytes, `a new ${size}-byte buffer with ${d.bufferedBytes} bytes arrived`);
            return b;
          };
          let n = 0;
          for (const piece of split(stream, cuts.map((c) => c * 997))) {
            for (const f of d.push(piece)) {
              assert.equal(f.type, FrameType.DATA);
              assert.ok(f.payload.equals(payloads[n++]), `frame ${n - 1}`);
              f.release?.();
            }
          }
          assert.equal(n, payloads.length);
          assert.equal(d.bufferedBytes, 0);
        },
      ),
      { numRuns: 60 },
    );
  });

  it('arbitrary bytes either decode or raise a protocol FfsyncError; no byte is lost or invented', () => {
    fc.assert(
      fc.property(fc.uint8Array({ maxLength: 5000 }), fc.array(fc.nat(), { maxLength: 10 }), (bytes, cuts) => {
        const d = new FrameDecoder();
        const frames: { type: number; payload: Buffer }[] = [];
        try {
          for (const piece of split(Buffer.from(bytes), cuts)) frames.push(...d.push(piece));
        } catch (e) {
          assert.ok(e instanceof FfsyncError, `unexpected ${e}`);
          assert.ok([2, 12].includes(e.exitCode));
          return;
        }
        // Conservation: decoded frames (header + payload) plus what is buffered is the input.
        const decoded = frames.reduce((a, f) => a + 5 + f.payload.length, 0);
        assert.equal(decoded + d.bufferedBytes, bytes.length);
        for (const f of frames) assert.ok(f.payload.length + 1 <= MAX_FRAME_BODY);
      }),
      { numRuns: RUNS * 3 },
    );
  });
});

describe('message decoder properties', () => {
  const decoders: [string, (p: Buffer) => unknown][] = [
    ['HELLO', decodeHello],
    ['OFFER', decodeOffer],
    ['DECISION', decodeDecision],
    ['NEED_END', decodeNeedEnd],
    ['DATA_END', decodeDataEnd],
    ['RESULT', decodeResult],
  ];
  for (const [name, decode] of decoders) {
    it(`${name}: arbitrary payloads decode or raise an FfsyncError`, () => {
      fc.assert(
        fc.property(fc.uint8Array({ maxLength: 80 }), (bytes) => {
          try {
            decode(Buffer.from(bytes));
          } catch (e) {
            assert.ok(e instanceof FfsyncError, `${name}: unexpected ${e}`);
          }
        }),
        { numRuns: RUNS },
      );
    });
  }

  it('ERROR frames never turn into success and never throw', () => {
    fc.assert(
      fc.property(fc.uint8Array({ maxLength: 200 }), (bytes) => {
        const e = decodeError(Buffer.from(bytes));
        assert.ok(e instanceof FfsyncError);
        assert.notEqual(e.exitCode, 0);
      }),
      { numRuns: RUNS },
    );
  });

  it('manifest assembly never exceeds its bound, whatever the parts claim', () => {
    fc.assert(
      fc.property(fc.array(fc.uint8Array({ minLength: 4, maxLength: 300 }), { maxLength: 8 }), fc.integer({ min: 64, max: 2000 }), (parts, max) => {
        const a = new ManifestAssembler(max);
        try {
          for (const p of parts) {
            const out = a.push(Buffer.from(p));
            if (out) assert.ok(out.length <= max);
          }
        } catch (e) {
          assert.ok(e instanceof FfsyncError);
        }
      }),
      { numRuns: RUNS },
    );
  });

  it('NEED frames never name a chunk outside the manifest', () => {
    fc.assert(
      fc.property(fc.uint8Array({ maxLength: 64 }), fc.integer({ min: 1, max: 500 }), (bytes, count) => {
        const c = new NeedCollector(count);
        const b = Buffer.from(bytes);
        let accepted = true;
        try {
          c.push(b);
        } catch (e) {
          assert.ok(e instanceof FfsyncError);
          accepted = false;
        }
        if (!accepted) return;
        // Accepted: every set bit names a chunk inside the manifest, and finish() agrees.
        const first = b.readUInt32LE(0);
        const named: number[] = [];
        for (let k = 0; k < (b.length - 4) * 8; k++) if (b[4 + (k >> 3)] & (1 << (k & 7))) named.push(first + k);
        assert.ok(named.every((i) => i < count));
        assert.deepEqual([...c.finish(named.length)], named);
      }),
      { numRuns: RUNS },
    );
  });
});

describe('fingerprint parsing', () => {
  it('accepts any case and separators of 64 hex digits, refuses everything else', () => {
    fc.assert(
      fc.property(fc.uint8Array({ minLength: 32, maxLength: 32 }), fc.constantFrom('', ':', '-', ' '), fc.boolean(), (raw, sep, lower) => {
        let hex = Buffer.from(raw).toString('hex');
        hex = lower ? hex : hex.toUpperCase();
        const input = hex.match(/.{2}/g)!.join(sep);
        assert.equal(parseFingerprint(input).replace(/-/g, ''), hex.toUpperCase());
      }),
      { numRuns: RUNS },
    );
    fc.assert(
      fc.property(fc.string({ maxLength: 80 }), (s) => {
        try {
          const fp = parseFingerprint(s);
          assert.match(fp, /^([0-9A-F]{4}-){15}[0-9A-F]{4}$/);
        } catch (e) {
          assert.ok(e instanceof FfsyncError && e.exitCode === 1);
        }
      }),
      { numRuns: RUNS },
    );
  });
});
