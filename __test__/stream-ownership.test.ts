// The transport ownership rule (ts/transport/stream-pair.ts, docs/decisions.md): a write's
// callback fires only once the transport no longer references the bytes, and a received
// chunk is the receiver's. The send paths release pooled batch buffers in that callback;
// a transport that calls back early delivers frames whose bytes changed after they were
// sent (issue §0: `sync` local to local failed at random on a real tree).
//
// Every stream kind a FramedConnection runs over is checked the same way: frames are sent
// from a small BufferPool, each buffer scribbled over the moment its write callback fires,
// to a receiver that stalls now and then (so every queue on the way fills up); the receiver
// must decode exactly the bytes that were sent.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import tls from 'node:tls';
import { describe, it } from 'node:test';
import type { Duplex } from 'node:stream';
import { FramedConnection, TLS_JOIN_MAX, TLS_PIECE_MAX } from '../ts/transport/connection';
import { joinStreams, pipePair } from '../ts/transport/stream-pair';
import { QuicListener, QuicSession } from '../ts/transport/quic';
import { loadOrCreateIdentity } from '../ts/security/identity';
import { FrameType } from '../ts/protocol/frames';
import { BufferPool } from '../ts/utils/buffer-pool';
import { tmpdir } from './helpers/peers';
import { tcpPair, tlsPair } from './helpers/socket-pairs';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const SCRIBBLE = 0xee;
const FRAMES = 240;

/** Frame i: large, then runs of small ones (below a socket's 16 KiB write high-water
 * mark: the size an early callback slips through with), then medium ones. */
function frameLength(i: number): number {
  if (i % 8 === 0) return (1 << 20) - 7 * i;
  if (i % 8 < 6) return 64 + ((i * 977) % 8000);
  return 64 * 1024 + ((i * 7919) % (192 * 1024));
}

/** Frame i's content: its index, then one fill byte that is never the scribble. */
function fillByte(i: number): number {
  return 1 + (i % 200);
}

function checkFrame(i: number, payload: Buffer): void {
  assert.equal(payload.length, frameLength(i), `frame ${i}: length`);
  assert.equal(payload.readUInt32LE(0), i, `frame ${i}: index`);
  const want = fillByte(i);
  for (let k = 4; k < payload.length; k++) {
    if (payload[k] !== want) assert.fail(`frame ${i}: byte ${k} of ${payload.length} is 0x${payload[k].toString(16)}, sent 0x${want.toString(16)} (the buffer was reused before the transport let go of it)`);
  }
}

/** Send FRAMES pooled frames on `tx`, receive and check them on `rx` (may be the same
 * connection: an echoing peer). */
async function exchange(tx: FramedConnection, rxReady: FramedConnection | Promise<FramedConnection>): Promise<void> {
  const pool = new BufferPool(1 << 20, 3);
  const sending = (async () => {
    for (let i = 0; i < FRAMES; i++) {
      const buf = await pool.acquire();
      const n = frameLength(i);
      buf.fill(fillByte(i), 0, n);
      buf.writeUInt32LE(i, 0);
      await tx.send(FrameType.DATA, buf.subarray(0, n), () => {
        buf.fill(SCRIBBLE);
        pool.release(buf);
      });
    }
  })();
  const receiving = (async () => {
    const rx = await rxReady;
    await sleep(150); // let every queue between us fill up
    for (let i = 0; i < FRAMES; i++) {
      const f = await rx.recv();
      assert.equal(f.type, FrameType.DATA);
      checkFrame(i, f.payload);
      f.release?.();
      if (i % 10 === 0) await sleep(10);
    }
  })();
  await Promise.all([sending, receiving]);
}

async function overPair(a: Duplex, b: Duplex): Promise<void> {
  const tx = new FramedConnection(a, 30_000);
  const rx = new FramedConnection(b, 30_000);
  await exchange(tx, rx);
  await Promise.all([tx.close(), rx.close()]);
}

describe('transport ownership: a write callback means the transport let go of the bytes', () => {
  const state = tmpdir('ffsync-own-');
  const id = loadOrCreateIdentity(state);

  it('in-memory pipe pair (local sync and its lanes)', async () => {
    const [a, b] = pipePair();
    await overPair(a, b);
  });

  it('a child process stdio joined with joinStreams (ssh, both ends)', async () => {
    // The child echoes every frame back, a little slowly (as ssh may): the pipe to it is
    // often full, so our writes queue in child.stdin.
    const echo = "process.stdin.on('data', (d) => { process.stdin.pause(); setTimeout(() => { process.stdout.write(d); process.stdin.resume(); }, 1); })";
    const child = spawn(process.execPath, ['-e', echo], { stdio: ['pipe', 'pipe', 'inherit'] });
    const conn = new FramedConnection(joinStreams(child.stdout!, child.stdin!), 30_000);
    try {
      await exchange(conn, conn);
    } finally {
      await conn.close(1000);
      child.kill();
    }
  });

  it('TCP', async () => {
    const [a, b] = await tcpPair();
    await overPair(a, b);
  });

  it('TLS 1.3', async () => {
    const [client, b] = await tlsPair(id);
    await overPair(client, b);
  });

  it('QUIC stream', async () => {
    const listener = await QuicListener.bind('127.0.0.1', 0, id, { idleMs: 30_000 });
    const accepting = listener.acceptSession();
    const client = await QuicSession.connect('127.0.0.1', listener.port, id, { timeoutMs: 10_000, idleMs: 30_000 });
    const server = await accepting;
    try {
      const a = await client.openStream();
      const tx = new FramedConnection(a, 30_000);
      // A QUIC stream is announced by its first bytes: the peer accepts it once they came.
      const rx = server.acceptStream().then((b) => new FramedConnection(b, 30_000));
      await exchange(tx, rx);
      await Promise.all([tx.close(), (await rx).close()]);
    } finally {
      await client.close(true);
      await server.close(true);
      listener.close();
    }
  });
});

describe('pipePair: a socket-like in-memory connection', () => {
  it('holds write callbacks while the reader is full, releases them as it reads', async () => {
    const [a, b] = pipePair(64 * 1024);
    b.pause();
    let called = 0;
    const chunk = Buffer.alloc(16 * 1024, 1);
    for (let i = 0; i < 16; i++) a.write(chunk, () => called++);
    await sleep(20);
    // 64 KiB fit in b's read buffer; the fifth write's callback waits for the reader.
    assert.ok(called >= 3 && called <= 5, `callbacks fired: ${called}`);
    let got = 0;
    b.on('data', (d: Buffer) => (got += d.length));
    b.resume();
    await sleep(20);
    assert.equal(called, 16);
    assert.equal(got, 16 * chunk.length);
  });

  it('a chunk received is a copy: the writer scribbling on its buffer changes nothing', async () => {
    // Small writes are copied; one large enough to be lent from the frame pool too, and a reader
    // that never gives it back (no FramedConnection) keeps it: nothing else is put in it.
    for (const size of [1000, 1536 * 1024]) {
      const [a, b] = pipePair();
      const got: Buffer[] = [];
      b.on('data', (d: Buffer) => got.push(d));
      const buf = Buffer.alloc(size, 7);
      await new Promise<void>((r) => a.write(buf, () => r()));
      buf.fill(SCRIBBLE);
      const [c, d] = pipePair();
      d.resume();
      await new Promise<void>((r) => c.write(Buffer.alloc(size, 9), () => r())); // another pipe's write
      assert.ok(Buffer.concat(got).equals(Buffer.alloc(size, 7)), `${size} bytes`);
    }
  });

  it('a large frame is copied once, into a pooled buffer the reader gives back: no fresh memory per frame', async () => {
    // Written part by part into fresh buffers, each frame was copied twice into fresh memory
    // (the pipe's copy, then the decoder joining header and payload): a local sync's JS thread
    // page-faulting through every byte it moved (decisions §102).
    const [a, b] = pipePair();
    const tx = new FramedConnection(a, 30_000);
    const rx = new FramedConnection(b, 30_000);
    const payload = Buffer.alloc(1 << 20, 5);
    const frames = 16;
    const slow = Buffer.allocUnsafeSlow;
    const fast = Buffer.allocUnsafe;
    let fresh = 0;
    Buffer.allocUnsafeSlow = (n: number) => ((fresh += n), slow(n));
    Buffer.allocUnsafe = (n: number) => ((fresh += n >= 64 * 1024 ? n : 0), fast(n));
    const buffers = new Set<ArrayBufferLike>();
    // Each frame is held while the next two are sent and received: a buffer given back to the
    // pool while a frame still pointed into it would show as the held frame's bytes changing.
    const held: { i: number; f: Awaited<ReturnType<FramedConnection['recv']>> }[] = [];
    const intact = (i: number, p: Buffer) => p.length === payload.length && p.readUInt32LE(0) === i && p.subarray(4).equals(payload.subarray(4));
    try {
      for (let i = 0; i < frames; i++) {
        payload.writeUInt32LE(i, 0);
        await tx.send(FrameType.DATA, payload);
        const f = await rx.recv();
        assert.ok(intact(i, f.payload), `frame ${i}: content`);
        buffers.add(f.payload.buffer);
        held.push({ i, f });
        if (held.length > 2) {
          const h = held.shift()!;
          assert.ok(intact(h.i, h.f.payload), `frame ${h.i}, held while two more arrived: content`);
          h.f.release?.();
        }
      }
    } finally {
      Buffer.allocUnsafeSlow = slow;
      Buffer.allocUnsafe = fast;
    }
    // The frames arrived in three buffers, reused in turn (kept by the process's frame pool).
    assert.ok(buffers.size <= 3, `frames arrived in ${buffers.size} buffers`);
    assert.ok(fresh < 8 * payload.length, `${(fresh / 1048576).toFixed(1)} MiB of fresh buffers for ${frames} MiB of frames`);
    await Promise.all([tx.close(), rx.close()]);
  });

  it('end: the reader gets the bytes, then end; destroy: the same, and writes to it fail with EPIPE', async () => {
    const [a, b] = pipePair();
    const chunks: Buffer[] = [];
    b.on('data', (d: Buffer) => chunks.push(d));
    const ended = new Promise<void>((r) => b.once('end', () => r()));
    a.write(Buffer.from('hello'));
    a.end();
    await ended;
    assert.equal(Buffer.concat(chunks).toString(), 'hello');
    a.resume();
    b.end();
    await new Promise<void>((r) => a.once('close', () => r()));

    const [c, d] = pipePair();
    const dEnded = new Promise<void>((r) => d.once('end', () => r()));
    d.resume();
    c.destroy();
    await dEnded;
    const err = await new Promise<NodeJS.ErrnoException>((r) => {
      d.once('error', r);
      d.write(Buffer.from('x'));
    });
    assert.equal(err.code, 'EPIPE');
  });
});

// Node's TLS socket copies every write of several buffers into one fresh buffer before it
// encrypts it, and writes queued behind a busy socket reach it together: written as header
// and payload (or queued behind another), every 2 MiB DATA frame cost a 2 MiB allocation, its
// page faults and a copy on the sender's JS thread (decisions §86). FramedConnection gives a
// TLS socket one buffer at a time: a large payload as it is, small chunks joined.
describe('FramedConnection over TLS: one buffer per socket write, a large payload never copied, never more than a piece at once', () => {
  const state = tmpdir('ffsync-tlsw-');
  const id = loadOrCreateIdentity(state);

  /** Record what the socket is handed: each `_write` chunk, and how many buffers each `_writev` got. */
  function spy(sock: tls.TLSSocket): { writes: Buffer[]; writevs: number[] } {
    const seen = { writes: [] as Buffer[], writevs: [] as number[] };
    const s = sock as unknown as { _write: (c: Buffer, e: string, cb: () => void) => void; _writev: (cs: { chunk: Buffer }[], cb: () => void) => void };
    const write = s._write.bind(sock);
    const writev = s._writev.bind(sock);
    s._write = (c, e, cb) => {
      seen.writes.push(c);
      write(c, e, cb);
    };
    s._writev = (cs, cb) => {
      seen.writevs.push(cs.length);
      writev(cs, cb);
    };
    return seen;
  }

  it('frames of every size, sent without waiting, from parts: in order, intact, each large part handed over by identity', async () => {
    const [a, b] = await tlsPair(id);
    const seen = spy(a);
    const tx = new FramedConnection(a, 30_000);
    const rx = new FramedConnection(b, 30_000);
    const large: Buffer[] = [];
    const sent: Buffer[] = [];
    let called = 0;
    for (let i = 0; i < 60; i++) {
      const n = i % 5 === 0 ? 2 * 1024 * 1024 + i : i % 5 === 1 ? 70 * 1024 + i : 10 + i * 37;
      const body = Buffer.alloc(n, 1 + (i % 200));
      body.writeUInt32LE(i, 0);
      sent.push(body);
      // Some frames in two parts (a record header and its bytes, as MUX frames are written).
      const parts = i % 3 === 0 && n > 100 ? [body.subarray(0, 8), body.subarray(8)] : [body];
      for (const p of parts) if (p.length >= TLS_JOIN_MAX) large.push(p);
      void tx.sendParts(FrameType.DATA, parts, () => called++, false);
    }
    for (let i = 0; i < sent.length; i++) {
      const f = await rx.recv();
      assert.ok(f.payload.equals(sent[i]), `frame ${i} arrived intact and in order`);
      f.release?.();
    }
    assert.equal(called, 60, 'every frame called back once');
    assert.deepEqual(seen.writevs, [], 'the socket was never given several buffers at once');
    // No write is larger than a piece: Node's TLS socket holds an encrypted copy of each write,
    // of the write's size, until the kernel took all of it (decisions §117).
    const longest = Math.max(...seen.writes.map((w) => w.length));
    assert.ok(longest <= TLS_PIECE_MAX, `the longest socket write was ${longest} bytes`);
    for (const p of large) {
      // A large part goes as it is, or as views of its own memory piece after piece: never copied.
      const views = seen.writes.filter((w) => w.buffer === p.buffer && w.byteOffset >= p.byteOffset && w.byteOffset + w.length <= p.byteOffset + p.length);
      let at = p.byteOffset;
      for (const w of views.sort((x, y) => x.byteOffset - y.byteOffset)) {
        assert.equal(w.byteOffset, at, `a ${p.length}-byte part: pieces follow each other`);
        at += w.length;
      }
      assert.equal(at, p.byteOffset + p.length, `a ${p.length}-byte part was handed to the socket whole, in ${views.length} views of its memory`);
      if (p.length > TLS_PIECE_MAX) assert.equal(views.length, Math.ceil(p.length / TLS_PIECE_MAX));
    }
    assert.ok(seen.writes.length < 60 * 3, `small chunks were joined: ${seen.writes.length} writes`);
    await Promise.all([tx.close(), rx.close()]);
  });

  it('small frames sent in one turn of the event loop go in one socket write, also when the socket was idle; the next turn writes again', async () => {
    const [a, b] = await tlsPair(id);
    const seen = spy(a);
    const tx = new FramedConnection(a, 30_000);
    const rx = new FramedConnection(b, 30_000);
    // Several awaits in one turn (a conversation's FILE_BEGIN, MANIFEST, HOLES): each send
    // resolves at once, so they all run before the turn ends.
    const turn = async (k: number) => {
      for (let i = 0; i < 5; i++) await tx.send(FrameType.NEED, Buffer.alloc(40 + i, k * 10 + i));
    };
    await turn(1);
    await new Promise((r) => setImmediate(r));
    await sleep(10); // the first write has called back: the socket is idle again
    await turn(2);
    for (let k = 1; k <= 2; k++) {
      for (let i = 0; i < 5; i++) {
        const f = await rx.recv();
        assert.ok(f.payload.equals(Buffer.alloc(40 + i, k * 10 + i)), `turn ${k}, frame ${i} intact and in order`);
      }
    }
    assert.equal(seen.writes.length, 2, `one socket write per turn, not one per frame (${seen.writes.length} writes)`);
    assert.deepEqual(seen.writevs, []);
    // A large frame on an idle socket is not held for the end of the turn.
    const big = Buffer.alloc(TLS_JOIN_MAX, 7);
    void tx.send(FrameType.DATA, big);
    assert.equal(seen.writes.length, 3, 'a large frame is handed to the idle socket at once');
    assert.ok((await rx.recv()).payload.equals(big));
    await Promise.all([tx.close(), rx.close()]);
  });

  it('destroyed in the turn it sent a small frame (an ERROR saying why): the frame is handed to the socket first', async () => {
    const [a, b] = await tlsPair(id);
    const seen = spy(a);
    const tx = new FramedConnection(a, 30_000);
    const rx = new FramedConnection(b, 30_000);
    void tx.send(FrameType.ERROR, Buffer.from('why')).catch(() => undefined);
    assert.equal(seen.writes.length, 0, 'held for the end of the turn');
    tx.destroy();
    assert.equal(seen.writes.length, 1, 'handed to the socket before it was destroyed');
    assert.ok(seen.writes[0]!.subarray(5).equals(Buffer.from('why')));
    b.destroy();
    rx.destroy();
  });

  it('close right after sending: the peer gets every queued frame, then the end', async () => {
    const [a, b] = await tlsPair(id);
    const tx = new FramedConnection(a, 30_000);
    const rx = new FramedConnection(b, 30_000);
    const big = Buffer.alloc(3 * 1024 * 1024, 9);
    for (let i = 0; i < 4; i++) void tx.send(FrameType.DATA, big).catch(() => undefined);
    const closing = tx.close(5000);
    for (let i = 0; i < 4; i++) {
      const f = await rx.recv();
      assert.ok(f.payload.equals(big), `frame ${i} whole`);
    }
    await assert.rejects(rx.recv(), /closed by peer/);
    await closing;
    await rx.close();
  });

  it('destroyed with writes still queued: each calls back once (its owner gets the buffer back), a later send rejects', async () => {
    const [a, b] = await tlsPair(id);
    b.pause(); // the peer reads nothing: our writes queue up
    const tx = new FramedConnection(a, 30_000);
    let called = 0;
    const big = Buffer.alloc(2 * 1024 * 1024, 3);
    for (let i = 0; i < 8; i++) void tx.send(FrameType.DATA, big, () => called++).catch(() => undefined);
    await sleep(50);
    assert.ok(called < 8, `writes were still queued when the connection was destroyed (${called} of 8 called back)`);
    tx.destroy();
    await new Promise<void>((r) => (a.destroyed && a.closed ? r() : a.once('close', () => r())));
    await sleep(20);
    assert.equal(called, 8);
    await assert.rejects(tx.send(FrameType.DATA, big), /closed/);
    b.destroy();
  });
});
