// Reading frames from a raw socket, for tests that play a hostile peer byte by byte
// (hostile-*.test.ts): one decoder of `u32 LE body length | u8 type | payload`, with no
// checks of its own, so the test sees exactly what the real peer sent.
import net from 'node:net';
import type tls from 'node:tls';
import { encodeFrame, FrameType } from '../../ts/protocol/frames';
import { decodeFilter, encodeFilter } from '../../ts/protocol/messages';

export interface RawFrame {
  type: number;
  payload: Buffer;
}

/** Whole frames as they arrive on `sock`; `take(ms)` resolves to the next one, to
 * `undefined` once the socket closed with no whole frame left, and rejects after `ms`. */
function reader(sock: net.Socket | tls.TLSSocket): (ms: number) => Promise<RawFrame | undefined> {
  let buf = Buffer.alloc(0);
  let ended = false;
  const waiters: (() => void)[] = [];
  const wake = () => waiters.splice(0).forEach((w) => w());
  sock.on('data', (d: Buffer) => {
    buf = Buffer.concat([buf, d]);
    wake();
  });
  sock.once('close', () => {
    ended = true;
    wake();
  });
  return async (ms) => {
    const deadline = Date.now() + ms;
    for (;;) {
      if (buf.length >= 5 && buf.length >= 4 + buf.readUInt32LE(0)) {
        const len = buf.readUInt32LE(0);
        const f = { type: buf[4], payload: buf.subarray(5, 4 + len) };
        buf = buf.subarray(4 + len);
        return f;
      }
      if (ended || sock.destroyed) return undefined;
      const left = deadline - Date.now();
      if (left <= 0) throw new Error(`no frame within ${ms} ms`);
      await new Promise<void>((r) => {
        const t = setTimeout(r, left);
        waiters.push(() => (clearTimeout(t), r()));
      });
    }
  };
}

/** The next frame; rejects with "closed" when the peer closed first (or after `ms`). */
export function frameReader(sock: net.Socket | tls.TLSSocket, ms = 60_000): () => Promise<RawFrame> {
  const take = reader(sock);
  return async () => {
    const f = await take(ms);
    if (!f) throw new Error('closed');
    return f;
  };
}

/** The next frame, or `undefined` once the peer closed; rejects after `ms` (default 10 s). */
export function frameReaderOrEnd(sock: net.Socket | tls.TLSSocket): (ms?: number) => Promise<RawFrame | undefined> {
  const take = reader(sock);
  return (ms = 10_000) => take(ms);
}

/** A hostile peer's reader: the next frame, or `undefined` once the victim closed; socket
 * errors (a reset from the victim) are an end like any other, and it waits up to 10 minutes. */
export function framesUntilClose(sock: net.Socket | tls.TLSSocket): () => Promise<RawFrame | undefined> {
  sock.on('error', () => undefined);
  const take = reader(sock);
  return () => take(600_000);
}

/** `n` copies of `frame` in one buffer: a flood written in one call. */
export function repeated(frame: Buffer, n: number): Buffer {
  const b = Buffer.allocUnsafe(frame.length * n);
  for (let i = 0; i < n; i++) frame.copy(b, i * frame.length);
  return b;
}

/**
 * A man in the middle's relay: frames from `from` go to `to` unchanged, except that every
 * FILTER frame also excludes `extra`. The receiver's walk then never looks at those paths,
 * while the (honest) sender still lists what it has under them: what a hostile sender can
 * do on its own. Without `extra`, bytes are piped as they are.
 */
export function relayAddingExcludes(from: net.Socket, to: net.Socket, extra?: string[]): void {
  from.on('end', () => to.end());
  if (!extra) {
    from.on('data', (d: Buffer) => to.write(d));
    return;
  }
  let buf = Buffer.alloc(0);
  from.on('data', (d: Buffer) => {
    buf = Buffer.concat([buf, d]);
    while (buf.length >= 5 && buf.length >= 4 + buf.readUInt32LE(0)) {
      const len = buf.readUInt32LE(0);
      const type = buf[4];
      let payload: Buffer = buf.subarray(5, 4 + len);
      buf = buf.subarray(4 + len);
      if (type === FrameType.FILTER) payload = encodeFilter([...decodeFilter(payload), ...extra]);
      to.write(encodeFrame(type as FrameType, payload));
    }
  });
}

/**
 * A relay that passes whole frames from `from` to `to` through `rewrite`, which returns the
 * frames to forward instead (none: dropped). For the multiplexed-session tests that lie about
 * stream ids or lose a stream on the way (plaintext peers).
 */
export function relayRewriting(from: net.Socket, to: net.Socket, rewrite: (f: RawFrame) => RawFrame[]): void {
  from.on('end', () => to.end());
  let buf = Buffer.alloc(0);
  from.on('data', (d: Buffer) => {
    buf = Buffer.concat([buf, d]);
    while (buf.length >= 5 && buf.length >= 4 + buf.readUInt32LE(0)) {
      const len = buf.readUInt32LE(0);
      const f = { type: buf[4], payload: Buffer.from(buf.subarray(5, 4 + len)) };
      buf = buf.subarray(4 + len);
      for (const out of rewrite(f)) to.write(encodeFrame(out.type as FrameType, out.payload));
    }
  });
}

/** A plaintext TCP relay in front of `port` whose two directions pass through the rewriters. */
export async function rewritingProxy(port: number, toReceiver: (f: RawFrame) => RawFrame[], toSender: (f: RawFrame) => RawFrame[] = (f) => [f]): Promise<{ port: number; close: () => void }> {
  const server = net.createServer((client) => {
    const upstream = net.connect(port, '127.0.0.1');
    client.on('error', () => upstream.destroy());
    upstream.on('error', () => client.destroy());
    client.on('close', () => upstream.destroy());
    upstream.on('close', () => client.destroy());
    relayRewriting(client, upstream, toReceiver);
    relayRewriting(upstream, client, toSender);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return { port: (server.address() as { port: number }).port, close: () => server.close() };
}
