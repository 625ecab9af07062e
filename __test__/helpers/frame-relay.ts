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
