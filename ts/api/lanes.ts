// Extra connections ("lanes") of a parallel tree session (`send --parallel K`). Each lane
// is authenticated like the first connection: over TLS the peer must present the very
// fingerprint the first connection accepted; in every mode the sender proves it belongs
// to this session with the 16-byte token the receiver sent in LANES. A lane carries large
// file conversations (FILE_BEGIN ...) and ends with LANE_END.

import crypto from 'node:crypto';
import type { Duplex } from 'node:stream';
import { FramedConnection } from '../transport/connection.js';
import type { Listener } from '../transport/tcp.js';
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

/**
 * Receiver: accept lanes until the listener is closed, handing each joined one to
 * `onLane`. A connection that fails to authenticate is dropped (and reported), never
 * allowed to disturb the session; at most `maxAttempts` are looked at.
 */
export async function acceptLanes(
  listener: Listener,
  o: { token: Buffer; peerFingerprint?: string; timeoutMs: number; maxLanes: number; onLane: (c: FramedConnection) => void; onRefused: (why: string) => void },
): Promise<void> {
  let joined = 0;
  for (let attempts = 0; joined < o.maxLanes && attempts < 4 * o.maxLanes + 16; attempts++) {
    let sock: SecureStream;
    try {
      sock = await listener.accept();
    } catch {
      return; // listener closed: the session is past the point where lanes join
    }
    const conn = new FramedConnection(sock, o.timeoutMs);
    try {
      checkFingerprint(sock, o.peerFingerprint, `${sock.remoteAddress}:${sock.remotePort}`);
      await handshake(conn, Role.RECEIVER);
      const f = await expect(conn, FrameType.JOIN);
      if (f.payload.length !== LANE_TOKEN_BYTES || !crypto.timingSafeEqual(f.payload, o.token)) throw protocolError('lane presented a wrong session token');
      joined++;
      o.onLane(conn);
    } catch (e) {
      o.onRefused((e as Error).message);
      conn.destroy();
    }
  }
}
