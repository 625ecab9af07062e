// A socket that reads into one buffer of its own, again and again, instead of a fresh buffer
// per read. Node reads every TCP read (64 KiB) and every TLS record (16 KiB) into a new
// ArrayBuffer that is garbage as soon as the frame decoder copied it: 65,536 of them per GiB
// over TLS, whose allocation and collection cost the receiver's JS thread 0.5–0.9 s per GiB
// (decisions §86, §94). Node has the mechanism (the `onread` option: one buffer, a callback
// per read), but offers it only to sockets it creates itself — `net.connect` and
// `tls.connect` without a `socket` — not to sockets a server accepts, which is where a
// receiver's data arrives. So it is switched on here for a socket that already exists.
import type * as Net from 'node:net';
import type { Readable } from 'node:stream';
import { netModule } from './net-module.js';

/** The two properties under which a socket keeps its `onread` buffer and callback. */
interface OnreadKeys {
  buffer: symbol;
  callback: symbol;
}

let keys: OnreadKeys | null | undefined;

/** Node keeps the option under private symbols; a throwaway socket made with it shows which
 * ones, by the values they hold (not by their names, which a Node release may change). */
function onreadKeys(): OnreadKeys | null {
  if (keys !== undefined) return keys;
  keys = null;
  try {
    const buffer = Buffer.alloc(1);
    const callback = (): boolean => true;
    // (The option is documented for `net.Socket`; older type definitions lack it.)
    const probe = new (netModule().Socket)({ onread: { buffer, callback } } as Net.SocketConstructorOpts);
    const own = probe as unknown as Record<symbol, unknown>;
    const symbols = Object.getOwnPropertySymbols(probe);
    const b = symbols.find((k) => own[k] === buffer);
    const c = symbols.find((k) => own[k] === callback);
    probe.destroy();
    if (b && c) keys = { buffer: b, callback: c };
  } catch {
    // No such option in this runtime: sockets read as before.
  }
  return keys;
}

/** A stream that reads a socket of its own (ssh's pipes joined into one stream,
 * stream-pair.ts) and can hand that socket's reads over as `readIntoStaticBuffer` does. */
export interface StaticReadable {
  readIntoStaticBuffer(onRead: (chunk: Buffer) => void): boolean;
}

/** Bytes a socket reads at once into its buffer: libuv's own read size for TCP and pipes
 * (a TLS socket hands over one record, at most 16 KiB, per read). */
const STATIC_READ_SIZE = 64 * 1024;

/**
 * From now on, `stream`'s reads arrive in `onRead`, each a view of one buffer that the next
 * read overwrites: `onRead` must copy what it keeps before it returns. Reads taken before
 * this call, still buffered in the stream, keep arriving as 'data' events (they come first:
 * they are emitted before any new read is taken). `pause()`/`resume()`, 'end', 'close' and
 * 'error' behave as before. A stream joined of a socket's reads and another's writes (ssh's
 * pipes) switches its socket. Returns false, changing nothing, for a stream that is no socket
 * with a native handle (a multiplexed stream, an in-process pair, stdin read from a file) or a
 * runtime without the mechanism; the caller then reads 'data' events as before.
 */
export function readIntoStaticBuffer(stream: Readable, onRead: (chunk: Buffer) => void): boolean {
  const joined = (stream as Partial<StaticReadable>).readIntoStaticBuffer;
  if (typeof joined === 'function') return joined.call(stream, onRead);
  // A native handle first (no socket without one): a stream without loads no `net`.
  const handle = (stream as unknown as { _handle?: { useUserBuffer?: (b: Uint8Array) => void } })._handle;
  if (typeof handle?.useUserBuffer !== 'function') return false;
  if (!(stream instanceof netModule().Socket) || stream.destroyed || stream.connecting) return false;
  const k = onreadKeys();
  if (!k) return false;
  const buffer = Buffer.allocUnsafeSlow(STATIC_READ_SIZE);
  const own = stream as unknown as Record<symbol, unknown>;
  // Both before the handle switches: its next read calls back through them.
  own[k.buffer] = buffer;
  own[k.callback] = (n: number, b: Buffer): boolean => {
    onRead(b.subarray(0, n));
    return true;
  };
  handle.useUserBuffer(buffer);
  return true;
}
