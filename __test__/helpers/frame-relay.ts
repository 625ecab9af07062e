import type net from 'node:net';

/**
 * Frames from `from` to `to` (each `length u32 LE | type u8 | payload`), whole and in order, for
 * the plaintext relays of the tests: `each` sees every frame and says whether it goes on now
 * (one it keeps back, it writes later itself). `beforeEnd` runs when `from` ends, before `to` is
 * ended (a relay flushes what it kept). Errors on either side close the other.
 */
export function relayFrames(from: net.Socket, to: net.Socket, each: (frame: Buffer) => boolean, beforeEnd?: () => void): void {
  let buf = Buffer.alloc(0);
  from.on('end', () => {
    beforeEnd?.();
    to.end();
  });
  from.on('error', () => to.destroy());
  to.on('error', () => from.destroy());
  from.on('data', (d: Buffer) => {
    buf = Buffer.concat([buf, d]);
    while (buf.length >= 4 && buf.length >= 4 + buf.readUInt32LE(0)) {
      const frame = Buffer.from(buf.subarray(0, 4 + buf.readUInt32LE(0)));
      buf = buf.subarray(frame.length);
      if (each(frame)) to.write(frame);
    }
  });
}

/**
 * A plaintext relay on a port of its own to `targetPort` on loopback, each connection's frames
 * relayed both ways (`relayFrames`): `onFrame` sees every frame (`fromSender`: the connecting
 * side's) and may change it in place before it goes on.
 */
export async function frameRelay(targetPort: number, onFrame: (frame: Buffer, fromSender: boolean) => void): Promise<{ port: number; close: () => void }> {
  const { createServer, connect } = await import('node:net');
  const server = createServer((down) => {
    const up = connect(targetPort, '127.0.0.1');
    relayFrames(down, up, (frame) => (onFrame(frame, true), true));
    relayFrames(up, down, (frame) => (onFrame(frame, false), true));
  });
  return new Promise((resolve) => {
    server.listen(0, '127.0.0.1', () => resolve({ port: (server.address() as net.AddressInfo).port, close: () => server.close() }));
  });
}
