// The multiplexed tree session (protocol version 2, docs/protocol.md §9.9) against a peer that
// lies about stream ids, loses a stream, opens streams it may not, or floods streams: each
// fails the session (exit 12, or 30 for a stream that never answers), nothing is deleted and
// no partial file is left. A relay between two honest peers does the lying: it sees the real
// frames and changes only what the test names. A session that lost its connection resumes.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import { FrameType } from '../ts/protocol/frames';
import { MUX_MAX_STREAMS } from '../ts/transport/mux';
import { type RawFrame, rewritingProxy } from './helpers/raw-peer';
import { olderVersionsTree, partials, seeded, sender, sha256, startReceiver, tmpdir } from './helpers/peers';

const MiB = 1024 * 1024;

/** A source with `n` large files (delta conversations: the target holds older versions),
 * a small file, and a receiver-only file that a failed session must not delete. */
function scene(n = 6) {
  const s = olderVersionsTree(n, 100, 700_000);
  fs.writeFileSync(path.join(s.dst, 'extra.txt'), 'receiver only\n');
  return s;
}

/** The stream id of a MUX frame. */
const streamOf = (f: RawFrame) => f.payload.readUInt32LE(0);

/** The type of a MUX frame's first inner frame (our peers cut MUX frames between a stream's
 * frames, so each starts with one; writes that queued behind a pending one may follow it). */
function innerType(f: RawFrame): number | undefined {
  return f.type === FrameType.MUX && f.payload.length >= 9 ? f.payload[8] : undefined;
}

async function session(s: ReturnType<typeof scene>, toReceiver: (f: RawFrame) => RawFrame[], toSender?: (f: RawFrame) => RawFrame[], timeout = '20') {
  const { peer, port } = await startReceiver(s.dst, ['--state-dir', path.join(s.dir, 'state-r'), '--timeout', timeout]);
  const proxy = await rewritingProxy(port, toReceiver, toSender);
  try {
    const snd = sender(s.src, proxy.port, ['--state-dir', path.join(s.dir, 'state-s'), '--timeout', timeout]);
    const [sr, rr] = await Promise.all([snd.done, peer.done]);
    return { sr, rr };
  } finally {
    proxy.close();
  }
}

/** After a session that lost its connection (partial files are kept for a resume): an
 * honest rerun completes, every file right, no partial left. */
async function assertResumes(s: ReturnType<typeof scene>) {
  const { peer, port } = await startReceiver(s.dst, ['--state-dir', path.join(s.dir, 'state-r')]);
  const [sr, rr] = await Promise.all([sender(s.src, port, ['--state-dir', path.join(s.dir, 'state-s')]).done, peer.done]);
  assert.equal(sr.code, 0, sr.stderr);
  assert.equal(rr.code, 0, rr.stderr);
  for (const n of fs.readdirSync(s.src)) assert.equal(sha256(path.join(s.dst, n)), sha256(path.join(s.src, n)), n);
  assert.deepEqual(partials(s.dst), [], 'the rerun used or removed every partial');
}

function assertNothingLost(s: ReturnType<typeof scene>, why = '') {
  assert.equal(fs.readFileSync(path.join(s.dst, 'extra.txt'), 'utf8'), 'receiver only\n', 'nothing deleted');
  assert.deepEqual(partials(s.dst), [], `no partial file left${why}`);
}

describe('hostile multiplexed sessions', () => {
  it('an honest multiplexed session through the relay syncs everything (the relay itself is faithful)', async () => {
    const s = scene();
    let mux = 0;
    const { sr, rr } = await session(s, (f) => {
      if (f.type === FrameType.MUX) mux++;
      return [f];
    });
    const both = `sender: ${sr.stderr}\nreceiver (exit ${rr.code}): ${rr.stderr}`;
    assert.equal(sr.code, 0, both);
    assert.equal(rr.code, 0, both);
    assert.ok(mux > 0, 'the session was multiplexed');
    for (let i = 0; i < 6; i++) assert.equal(sha256(path.join(s.dst, `f${i}.bin`)), sha256(path.join(s.src, `f${i}.bin`)));
    assert.ok(!fs.existsSync(path.join(s.dst, 'extra.txt')), 'the honest session deletes the extraneous file');
  });

  it('a stream id outside the allowed range: exit 12, nothing deleted', async () => {
    const s = scene();
    const { sr, rr } = await session(s, (f) => {
      if (f.type === FrameType.MUX && streamOf(f) === 1) f.payload.writeUInt32LE(1_000_000, 0);
      return [f];
    });
    assert.equal(rr.code, 12, rr.stderr);
    assert.match(rr.stderr, /MUX frame opens stream 1000000/);
    // The sender learns it from our ERROR (12) or, mid-write, from the closed socket (10).
    assert.ok(sr.code === 12 || sr.code === 10, `sender exit ${sr.code}: ${sr.stderr}`);
    assertNothingLost(s);
  });

  it('a lying file id (two streams claim the same file): exit 12, nothing deleted', async () => {
    const s = scene();
    let firstAction: Buffer | undefined;
    const { sr, rr } = await session(s, (f) => {
      if (innerType(f) === FrameType.FILE_BEGIN) {
        // inner frame: id u32 | body length u32 | type u8 | action u32 | status u8
        if (!firstAction) firstAction = Buffer.from(f.payload.subarray(9, 13));
        else firstAction.copy(f.payload, 9);
      }
      return [f];
    });
    assert.equal(rr.code, 12, rr.stderr);
    assert.match(rr.stderr, /FILE_BEGIN for action \d+, which is not an outstanding large transfer/);
    assert.notEqual(sr.code, 0, sr.stderr);
    assertNothingLost(s);
  });

  it('a lost stream (every frame of one stream dropped on the way): the session times out (exit 30), nothing deleted', async () => {
    const s = scene();
    const { sr, rr } = await session(s, (f) => (f.type === FrameType.MUX && streamOf(f) === 2 ? [] : [f]), undefined, '3');
    assert.equal(rr.code, 30, rr.stderr);
    assert.equal(sr.code, 30, sr.stderr);
    assert.equal(fs.readFileSync(path.join(s.dst, 'extra.txt'), 'utf8'), 'receiver only\n', 'nothing deleted');
    // A timeout is a lost connection: files in flight keep their partials for the rerun.
    await assertResumes(s);
  });

  it('the receiver opening a stream of its own: the sender refuses it, exit 12', async () => {
    const s = scene();
    let injected = false;
    const { sr, rr } = await session(
      s,
      (f) => [f],
      (f) => {
        if (f.type !== FrameType.MUX || injected) return [f];
        injected = true;
        const bogus = Buffer.alloc(5);
        bogus.writeUInt32LE(777, 0);
        return [{ type: FrameType.MUX, payload: bogus }, f];
      },
    );
    assert.equal(sr.code, 12, `${sr.stderr}\n---\n${rr.stderr}`);
    assert.match(sr.stderr, /stream 777, which this side never opened/);
    assert.notEqual(rr.code, 0, rr.stderr);
    assert.equal(fs.readFileSync(path.join(s.dst, 'extra.txt'), 'utf8'), 'receiver only\n', 'nothing deleted');
    // The sender cut the connection: to the honest receiver that is a lost connection.
    await assertResumes(s);
  });

  it(`a flood of streams (more than ${MUX_MAX_STREAMS} while none was spent): exit 12, nothing deleted`, async () => {
    const s = scene();
    let injected = false;
    const { sr, rr } = await session(s, (f) => {
      if (f.type !== FrameType.MUX || injected) return [f];
      injected = true;
      // Streams 7.. each get one byte (they stay open: no FIN), beside the sender's own 1..6.
      // No stream was spent, so ids above MUX_MAX_STREAMS are refused: the 65th stream.
      const flood: RawFrame[] = [];
      for (let id = 7; id <= MUX_MAX_STREAMS + 6; id++) {
        const p = Buffer.alloc(5);
        p.writeUInt32LE(id, 0);
        flood.push({ type: FrameType.MUX, payload: p });
      }
      return [f, ...flood];
    });
    assert.equal(rr.code, 12, rr.stderr);
    assert.match(rr.stderr, new RegExp(`MUX frame opens stream ${MUX_MAX_STREAMS + 1}; ids run from 1 to ${MUX_MAX_STREAMS} \\(${MUX_MAX_STREAMS} \\+ 0 spent\\)`));
    assert.notEqual(sr.code, 0, sr.stderr);
    assertNothingLost(s);
  });

  it('MUX frames in a version 1 session are refused (exit 12)', async () => {
    const s = scene(2);
    let injected = false;
    const { peer, port } = await startReceiver(s.dst, ['--state-dir', path.join(s.dir, 'state-r')], { FFSYNC_PROTOCOL_MAX: '1' });
    const proxy = await rewritingProxy(port, (f) => {
      if (f.type !== FrameType.FILTER || injected) return [f];
      injected = true;
      const p = Buffer.alloc(5);
      p.writeUInt32LE(1, 0);
      return [f, { type: FrameType.MUX, payload: p }];
    });
    try {
      const [sr, rr] = await Promise.all([sender(s.src, proxy.port, ['--state-dir', path.join(s.dir, 'state-s')]).done, peer.done]);
      assert.equal(rr.code, 12, rr.stderr);
      assert.match(rr.stderr, /MUX frame outside a multiplexed tree session/);
      assert.notEqual(sr.code, 0, sr.stderr);
      assertNothingLost(s);
    } finally {
      proxy.close();
    }
  });
});

describe('a killed multiplexed session', () => {
  it('the sender killed mid-transfer: the receiver keeps what it verified, the rerun resumes and moves less', async () => {
    const dir = tmpdir();
    const src = path.join(dir, 'src');
    const dst = path.join(dir, 'dst');
    fs.mkdirSync(src);
    // Four fresh 12 MiB files (new on the receiver: large files, no basis), slowed down so
    // the kill lands while the first ones are on the wire.
    for (let i = 0; i < 4; i++) fs.writeFileSync(path.join(src, `f${i}.bin`), seeded(12 * MiB, 500 + i));
    const total = 48 * MiB;
    const { peer, port } = await startReceiver(dst, ['--state-dir', path.join(dir, 'state-r')]);
    const s = sender(src, port, ['--state-dir', path.join(dir, 'state-s'), '--bwlimit', '8192']);
    await peer.waitFor((e) => e.event === 'progress' && e.phase === 'receiving' && e.doneBytes > 10 * MiB);
    s.child.kill('SIGKILL');
    const rr = await peer.done;
    assert.notEqual(rr.code, 0, 'the receiver reports the lost connection');
    assert.ok(partials(dst).length > 0, `partial files kept for the rerun: ${rr.stderr}`);
    const again = await startReceiver(dst, ['--state-dir', path.join(dir, 'state-r')]);
    const [sr2, rr2] = await Promise.all([sender(src, again.port, ['--state-dir', path.join(dir, 'state-s')]).done, again.peer.done]);
    assert.equal(sr2.code, 0, sr2.stderr);
    assert.equal(rr2.code, 0, rr2.stderr);
    for (let i = 0; i < 4; i++) assert.equal(sha256(path.join(dst, `f${i}.bin`)), sha256(path.join(src, `f${i}.bin`)));
    assert.deepEqual(partials(dst), []);
    const moved = rr2.summary!.literalBytes as number;
    assert.ok(moved < total - 8 * MiB, `the rerun moved ${moved} of ${total} bytes: what the killed session verified was reused`);
  });
});
