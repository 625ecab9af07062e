// Extra connections ("lanes") of a parallel tree session (`send --parallel K`). Each lane
// is authenticated like the first connection: over TLS the peer must present the very
// fingerprint the first connection accepted; in every mode the sender proves it belongs
// to this session with the 16-byte token the receiver sent in LANES. A lane carries large
// file conversations (FILE_BEGIN ...) and ends with LANE_END.

import crypto from 'node:crypto';
import type { Duplex } from 'node:stream';
import { FramedConnection } from '../transport/connection.js';
import { type Listener, SocketQueue } from '../transport/tcp.js';
import { pipePair } from '../transport/stream-pair.js';
import { peerFingerprint, type SecureStream } from '../transport/peer-identity.js';
import { FrameType, protocolError } from '../protocol/frames.js';
import { Role } from '../protocol/messages.js';
import { ExitCode, FfsyncError } from '../utils/errors.js';
import { expect, handshake } from './session.js';

export const LANE_TOKEN_BYTES = 16;

function checkFingerprint(sock: Duplex, expected: string | undefined, label: string): void {
  if (expected === undefined) return; // --plaintext: the token is the proof
  const fp = peerFingerprint(sock);
  if (fp !== expected) {
    throw new FfsyncError('EFINGERPRINT', ExitCode.UNTRUSTED, `lane from ${label} presented ${fp}, not the session's ${expected}; refused`);
  }
}

/** Sender: open one more connection (TCP/TLS) or stream (QUIC) and join the session. */
export async function openLane(o: { dial: () => Promise<Duplex>; label: string; peerFingerprint?: string; token: Buffer; timeoutMs: number }): Promise<FramedConnection> {
  const sock = await o.dial();
  const conn = new FramedConnection(sock, o.timeoutMs);
  try {
    checkFingerprint(sock, o.peerFingerprint, o.label);
    await handshake(conn, Role.SENDER);
    await conn.send(FrameType.JOIN, o.token);
    return conn;
  } catch (e) {
    conn.destroy();
    throw e;
  }
}

/** Lanes being opened by `openLanes`. */
export interface LaneOpening {
  /** The lanes that have joined so far (all of them once `settled`): the caller closes them. */
  readonly lanes: FramedConnection[];
  /** Every lane has joined or failed to. */
  readonly settled: Promise<void>;
  /** Each lane's work, begun as it joined; rejects with the first failure, an open's included. */
  readonly work: Promise<void>;
}

/** Sender: open `count` lanes at once and hand each to `use` as soon as it has joined. Each
 * costs round trips to open (TCP, TLS, HELLO, JOIN): one after another they would hold the
 * session back by `count` times that, and waiting for all before any works by the slowest. */
export function openLanes(count: number, o: Parameters<typeof openLane>[0], use: (lane: FramedConnection) => Promise<void>): LaneOpening {
  const lanes: FramedConnection[] = [];
  const opens = Array.from({ length: Math.max(0, count) }, () =>
    openLane(o).then((lane) => {
      lanes.push(lane);
      return lane;
    }),
  );
  const settled = Promise.allSettled(opens).then(() => undefined);
  const work = Promise.all(opens.map((p) => p.then(use))).then(() => undefined);
  work.catch(() => undefined); // the caller awaits it; a failure before that is not unhandled
  return { lanes, settled, work };
}

/** Lanes of a local tree sync: each one more in-memory pipe pair, so large files are
 * copied in parallel (`--jobs`, default LOCAL_LANES) with no socket anywhere. */
export function localLanes(): { listener: Listener; dial: () => Promise<Duplex> } {
  const queue = new SocketQueue<Duplex>();
  return {
    listener: { host: 'local', port: 0, accept: () => queue.next(), close: () => queue.close(), inProcess: true },
    dial: async () => {
      const [a, b] = pipePair();
      queue.push(b);
      return a;
    },
  };
}

/**
 * Receiver: accept lanes until the listener is closed, handing each joined one to
 * `onLane`. A connection that fails to authenticate is dropped (and reported), never
 * allowed to disturb the session; at most `maxAttempts` are looked at. Connections
 * authenticate side by side, since each waits a round trip for its peer's HELLO and JOIN
 * (one after another, K lanes cost K round trips before the last can work), but never more
 * at once than lanes still to join: a refused one frees its place. Resolves once the
 * accepting stopped and every connection taken has joined or been refused.
 */
export async function acceptLanes(
  listener: Listener,
  o: {
    token: Buffer;
    peerFingerprint?: string;
    timeoutMs: number;
    maxLanes: number;
    /** A version 2 session: the sender's streams start right behind its JOIN. */
    multiplexed?: boolean;
    onLane: (c: FramedConnection) => void;
    onRefused: (why: string) => void;
  },
): Promise<void> {
  let joined = 0;
  const pending = new Set<Promise<void>>();
  for (let attempts = 0; attempts < 4 * o.maxLanes + 16; attempts++) {
    while (pending.size > 0 && joined + pending.size >= o.maxLanes) await Promise.race(pending);
    if (joined >= o.maxLanes) break;
    let sock: SecureStream;
    try {
      sock = await listener.accept();
    } catch {
      break; // listener closed: the session is past the point where lanes join
    }
    const p: Promise<void> = joinLane(sock, { ...o, inProcess: listener.inProcess }).then(
      (conn) => {
        joined++;
        o.onLane(conn);
      },
      (e: Error) => o.onRefused(e.message),
    );
    const settled = p.finally(() => pending.delete(settled));
    pending.add(settled);
  }
  await Promise.all(pending);
}

/** One accepted connection: the session's fingerprint, the handshake, and its token. */
async function joinLane(sock: SecureStream, o: { token: Buffer; peerFingerprint?: string; timeoutMs: number; multiplexed?: boolean; inProcess?: boolean }): Promise<FramedConnection> {
  const conn = new FramedConnection(sock, o.timeoutMs);
  // Its first MUX frames may arrive in the very read that brings JOIN: held until onLane
  // attaches the multiplexer (dropped with the connection if JOIN is refused).
  if (o.multiplexed) conn.expectMux();
  try {
    checkFingerprint(sock, o.peerFingerprint, `${sock.remoteAddress}:${sock.remotePort}`);
    await handshake(conn, Role.RECEIVER);
    const f = await expect(conn, FrameType.JOIN);
    // In process there is no secret to time (the token is zeros): compared without loading
    // OpenSSL for it.
    const same = f.payload.length === LANE_TOKEN_BYTES && (o.inProcess ? f.payload.equals(o.token) : crypto.timingSafeEqual(f.payload, o.token));
    if (!same) throw protocolError('lane presented a wrong session token');
    return conn;
  } catch (e) {
    conn.destroy();
    throw e;
  }
}
