// A sender's TCP connection opened while the program loads, handed to the connect that asks for
// the same address (decisions §110).
//
// A `send` spends its first ~30 ms after Node's own start loading the CLI's bundle and the addon,
// and only then connects: the TCP handshake's round trip (tens of milliseconds across regions)
// came after all of it. The executable (ts/cli/main.ts) recognises the plain `send` cases from
// argv alone (ts/cli/early-connect.ts) and opens the connection first; the program's first
// connect to that host and port takes it here (ts/transport/tls.ts) and goes on from
// there: TLS. This module is in both bundles (main.js and entry.js): what they
// share lives on `process` under a registered symbol, not in module state, which each bundle has
// its own copy of (as ts/native/early-walks.ts).
//
// The socket is unreferenced until taken, so a program that never connects still exits; one that
// failed (refused, unreachable) is not handed out: the program connects itself and reports what it
// finds, in its own words.
import type net from 'node:net';

interface Offered {
  host: string;
  port: number;
  socket: net.Socket;
  failed: boolean;
}

interface Registry {
  offered?: Offered;
  /** Connections taken (tests read it at exit). */
  taken: number;
}

const KEY = Symbol.for('ffsync-native.early-connect');

function registry(create: boolean): Registry | undefined {
  const holder = process as unknown as Record<symbol, Registry | undefined>;
  if (!holder[KEY] && create) holder[KEY] = { taken: 0 };
  return holder[KEY];
}

/** Offer `socket`, connecting to `host`:`port`, to the program's first connect there. */
export function offerEarlyConnection(host: string, port: number, socket: net.Socket): void {
  const entry: Offered = { host, port, socket, failed: false };
  // Nobody may take it: its error must not be an uncaught one.
  socket.on('error', () => (entry.failed = true));
  socket.unref();
  registry(true)!.offered = entry;
}

/** The connection offered to exactly this host and port, once, unless it failed or closed
 * (then it is discarded and the caller connects as usual). Referenced again: the program owns it. */
export function takeEarlyConnection(host: string, port: number): net.Socket | undefined {
  const r = registry(false);
  const entry = r?.offered;
  if (!r || !entry || entry.host !== host || entry.port !== port) return undefined;
  r.offered = undefined;
  if (entry.failed || entry.socket.destroyed) {
    entry.socket.destroy();
    return undefined;
  }
  r.taken++;
  entry.socket.removeAllListeners('error');
  entry.socket.ref();
  return entry.socket;
}

/** Connections offered and taken so far, and whether one is left (tests). */
export function earlyConnectionCounts(): { taken: number; left: boolean } {
  const r = registry(false);
  return { taken: r?.taken ?? 0, left: Boolean(r?.offered) };
}
