// Pieces both roles share: the HELLO exchange and typed receives that surface a peer's
// ERROR frame as that peer's error.

import { FramedConnection, PeerClosedError } from '../transport/connection.js';
import { type Frame, FrameType } from '../protocol/frames.js';
import {
  Capability,
  decodeError,
  encodeRequest,
  Role,
  decodeHello,
  encodeError,
  encodeHello,
  expectType,
  type Hello,
  negotiateVersion,
  OUR_CAPABILITIES,
  offeredProtocolMax,
  PROTOCOL_MIN,
} from '../protocol/messages.js';
import { ExitCode, FfsyncError } from '../utils/errors.js';
import { peerFingerprint, type SecureStream } from '../transport/peer-identity.js';
import { VERSION } from '../utils/version.js';

export interface Negotiated {
  version: number;
  capabilities: number;
  peerSoftware: string;
  /** The peer's own set, before the AND (SERVE marks a daemon). */
  peerCapabilities: number;
  /** The peer's HELLO as it came (remembered for the next session: utils/remembered-hello.ts). */
  peerHello: Hello;
}

export async function handshake(conn: FramedConnection, role: number, authenticated = false): Promise<Negotiated> {
  // Our HELLO goes out first on both sides so neither waits on the other.
  const sent = conn.send(FrameType.HELLO, encodeHello({ minVersion: PROTOCOL_MIN, maxVersion: offeredProtocolMax(), capabilities: OUR_CAPABILITIES, role, software: `ffsync-native/${VERSION}` }));
  // If the peer's reply (or its absence) fails first, this rejection must not go unhandled.
  sent.catch(() => undefined);
  conn.requireHello();
  const peer = await peerHello(conn, authenticated);
  await sent;
  if (peer.role === role) {
    throw new FfsyncError('EPROTOROLE', ExitCode.PROTOCOL_INCOMPATIBLE, `both peers are ${role === 1 ? 'senders' : 'receivers'}`);
  }
  return reportDeliveries(conn, role, negotiate(peer));
}

/** The side that receives data tells a sender that asked for it how much it has read (§4.16). */
function reportDeliveries<T extends Negotiated>(conn: FramedConnection, role: number, n: T): T {
  if (role === Role.RECEIVER && n.capabilities & Capability.DELIVERY) conn.startDeliveryReports();
  return n;
}

/** The peer's HELLO (its ERROR frame, if it sent one instead, becomes its error). */
async function peerHello(conn: FramedConnection, authenticated: boolean): Promise<Hello> {
  const f = await recvRaw(conn, authenticated);
  if (f.type === FrameType.ERROR) throw decodeError(f.payload);
  if (f.type === FrameType.PAIR) {
    // A sender with --pair, and a receiver that offers no code (it trusts the sender already).
    throw new FfsyncError('EPAIR', ExitCode.UNTRUSTED, 'the sender asked to pair, but this receiver has no pairing code to offer (start it with --pair to offer one)');
  }
  expectType(f.type, FrameType.HELLO);
  return decodeHello(f.payload);
}

/** What this build and a peer that sent `peer` speak (throws when no version fits). */
export function negotiate(peer: Hello): Negotiated {
  const version = negotiateVersion({ min: PROTOCOL_MIN, max: offeredProtocolMax() }, peer);
  return { version, capabilities: peer.capabilities & OUR_CAPABILITIES, peerSoftware: peer.software, peerCapabilities: peer.capabilities, peerHello: peer };
}

/**
 * The `serve` daemon's side of HELLO: it learns the client's role first and takes the
 * other one (a push makes the daemon the receiver, a pull its sender), and marks itself
 * with Capability.SERVE. The client's HELLO always goes first, so nobody waits on anybody.
 */
export async function daemonHandshake(conn: FramedConnection): Promise<Negotiated & { role: number }> {
  conn.requireHello();
  const peer = await peerHello(conn, false);
  const role = peer.role === Role.SENDER ? Role.RECEIVER : Role.SENDER;
  await conn.send(FrameType.HELLO, encodeHello({ minVersion: PROTOCOL_MIN, maxVersion: offeredProtocolMax(), capabilities: OUR_CAPABILITIES | Capability.SERVE, role, software: `ffsync-native/${VERSION}` }));
  return reportDeliveries(conn, role, { ...negotiate(peer), role });
}

/**
 * The client's side of addressing a daemon (`send x host:port/path`, `pull`): REQUEST,
 * then ACCEPT or the daemon's refusal as an ERROR (its reason becomes our message).
 * Without a path, a daemon is told nothing and refuses the OFFER that follows; with a
 * path, a one-session `receive` is refused here, before any work.
 */
export async function requestPath(conn: FramedConnection, negotiated: Negotiated, op: number, remotePath: string | undefined, peerLabel: string): Promise<void> {
  const daemon = (negotiated.peerCapabilities & Capability.SERVE) !== 0;
  if (remotePath === undefined) {
    if (daemon) {
      throw new FfsyncError('EUSAGE', ExitCode.USAGE, `${peerLabel} is a serve daemon: address a path under its root, e.g. ${peerLabel}/some/path`);
    }
    return;
  }
  if (!daemon) {
    throw new FfsyncError('EUSAGE', ExitCode.USAGE, `${peerLabel} is a one-session receive, not a serve daemon: it takes no path (drop '/${remotePath}')`);
  }
  await conn.send(FrameType.REQUEST, encodeRequest({ op, path: remotePath }));
  await expect(conn, FrameType.ACCEPT);
}

async function recvRaw(conn: FramedConnection, authenticated: boolean): Promise<Frame> {
  try {
    return await conn.recv();
  } catch (e) {
    if (e instanceof PeerClosedError && authenticated) {
      // Over TLS, its certificate checked against our pins: the far end is a peer of ours, and
      // neither a --plaintext mismatch (TLS would have failed) nor another version (it answers
      // with its HELLO and an ERROR) ends a connection without a word. A reset right after the
      // handshake did (decisions §112): that is the connection, exit 10, not exit 2.
      throw new FfsyncError('EPEERCLOSED', ExitCode.SOCKET_IO, "connection closed before the peer's HELLO: the connection was lost, or the peer stopped (see its output)");
    }
    if (e instanceof PeerClosedError) {
      throw new FfsyncError(
        'EPEERCLOSED',
        ExitCode.PROTOCOL_INCOMPATIBLE,
        'connection closed during the handshake (is the peer an ffsync-native of a compatible version, with the same --plaintext setting?)',
      );
    }
    throw e;
  }
}

/** Receive one frame of the expected types; a peer ERROR frame becomes its error. */
export async function expect(conn: FramedConnection, ...types: FrameType[]): Promise<Frame> {
  const f = await conn.recv();
  if (f.type === FrameType.ERROR) throw decodeError(f.payload);
  expectType(f.type, ...types);
  return f;
}

/** Best effort, for at most `waitMs`: tell the peer why we stop (unless the error came from the peer). */
export async function reportError(conn: FramedConnection, e: FfsyncError, waitMs = 1000): Promise<void> {
  if (conn.errorSent || conn.isClosed || e.origin === 'peer' || e instanceof PeerClosedError || e.exitCode === ExitCode.SOCKET_IO) return;
  let timer: NodeJS.Timeout | undefined;
  try {
    conn.errorSent = true;
    await Promise.race([conn.send(FrameType.ERROR, encodeError(e.exitCode, e.code, e.message)), new Promise((r) => (timer = setTimeout(r, waitMs)))]);
  } catch {
    // the connection is already gone
  } finally {
    clearTimeout(timer);
  }
}

/** How long a receiver waits for the sender's verdict on a chunk that failed its hash check. */
const VERDICT_MS = 3000;

/**
 * A chunk from the peer failed our hash check: either the wire or the peer is bad (exit
 * 12), or the sender's source changed after it was hashed (exit 24, "rerun"). Only the
 * sender can tell: it answers our ERROR with its own, and says 24 when its source changed.
 * Call after `reportError`; returns the error to exit with.
 */
export async function senderVerdict(conn: FramedConnection, err: FfsyncError): Promise<FfsyncError> {
  if (err.code !== 'ECHUNK' || conn.isClosed) return err;
  const verdict = await conn.awaitPeerError(VERDICT_MS);
  return verdict?.exitCode === ExitCode.VANISHED ? verdict : err;
}

/** `expect`, unless `failed` (a local failure of the same session) rejects first; then the
 * abandoned read is left to settle quietly. */
export function expectUnless(conn: FramedConnection, failed: Promise<never>, ...types: FrameType[]): Promise<Frame> {
  const next = expect(conn, ...types);
  next.catch(() => undefined);
  return Promise.race([next, failed]);
}

/** What an interrupted session (Ctrl-C, SIGTERM, a library caller's AbortSignal) ends with, on
 * this side and, through an ERROR frame, on the peer's: exit 20 in words, never a closed
 * connection or a frame name. */
export function interruptedError(cause?: unknown): FfsyncError {
  return new FfsyncError('ESIGNAL', ExitCode.SIGNAL, 'interrupted', cause === undefined ? undefined : { cause });
}

/**
 * Close `conn` when `signal` aborts, first telling the peer (an ERROR frame, exit 20, for at
 * most half a second: a stalled peer must not hold up a Ctrl-C). Returns the remover.
 */
export function closeOnAbort(conn: FramedConnection, signal: AbortSignal | undefined): () => void {
  if (!signal) return () => undefined;
  const onAbort = () => void reportError(conn, interruptedError(), 500).finally(() => conn.destroy());
  signal.addEventListener('abort', onAbort, { once: true });
  return () => signal.removeEventListener('abort', onAbort);
}

/** Reject with a signal error when `signal` aborts first (and run `onAbort`). */
export function abortable<T>(p: Promise<T>, signal: AbortSignal | undefined, onAbort: () => void): Promise<T> {
  if (!signal) return p;
  return new Promise<T>((resolve, reject) => {
    const stop = () => {
      onAbort();
      reject(interruptedError());
    };
    if (signal.aborted) return stop();
    signal.addEventListener('abort', stop, { once: true });
    p.then(resolve, reject).finally(() => signal.removeEventListener('abort', stop));
  });
}

/**
 * TLS and QUIC sessions: decide whether the peer's certificate is trusted before any
 * protocol byte. A refusal is told to the peer in an ERROR frame (exit 5 on both sides).
 * `expect` is a fingerprint vouched for by an already-authenticated channel (`sync
 * --quic` learns it over ssh): it must match, and nothing is pinned.
 */
export async function authenticatePeer(
  conn: FramedConnection,
  sock: SecureStream,
  o: {
    stateDir: string;
    trust?: string;
    expect?: string;
    interactive?: boolean;
    peerLabel: string;
    events?: import('./events.js').SyncEvents;
    /** Sender: `--pair CODE` (normalized). Receiver: the code it offers, if any. */
    pair?: { code: string } | { offer: import('../security/pairing.js').PairingOffer };
  },
): Promise<string> {
  // Only TLS and QUIC sessions get here. `require`, not `import()`: in this CommonJS build
  // `import()` boots Node's ESM loader first (about 7 ms on Node 20).
  /* eslint-disable @typescript-eslint/no-require-imports */
  const { verifyPeer } = require('../security/trust.js') as typeof import('../security/trust.js');
  const { isPinned } = require('../security/pins.js') as typeof import('../security/pins.js');
  /* eslint-enable @typescript-eslint/no-require-imports */
  const fp = peerFingerprint(sock);
  const known = o.expect === fp || isPinned(o.stateDir, fp);
  o.events?.peer?.(o.peerLabel, fp, known);
  if (o.pair) {
    const pairing = require('../security/pairing.js') as typeof import('../security/pairing.js'); // eslint-disable-line @typescript-eslint/no-require-imports
    const p = { stateDir: o.stateDir, peerFingerprint: fp, peerLabel: o.peerLabel };
    const paired =
      'code' in o.pair ? (await pairing.pairAsSender(conn, sock as import('node:tls').TLSSocket, o.pair.code, p), true) : await pairing.pairAsReceiver(conn, sock as import('node:tls').TLSSocket, o.pair.offer, p);
    if (paired) {
      o.events?.info?.(`paired with ${o.peerLabel}: its fingerprint ${fp} is pinned; later sessions need no code`);
      return fp;
    }
  }
  try {
    await verifyPeer(fp, { stateDir: o.stateDir, trust: o.trust, expect: o.expect, interactive: o.interactive, peerLabel: o.peerLabel });
  } catch (e) {
    const err = e as FfsyncError;
    try {
      const why = err.code === 'EFINGERPRINT' ? 'it expected another fingerprint (--trust)' : 'it has not pinned it';
      // The refusing side knows its own state directory: the hint carries it.
      const { stateDirOption } = require('../utils/state-dir.js') as typeof import('../utils/state-dir.js'); // eslint-disable-line @typescript-eslint/no-require-imports
      const msg = `refused: the other side does not trust our fingerprint ${fp} (${why}); there, run 'ffsync-native trust ${fp}${stateDirOption(o.stateDir)}' or pass --trust ${fp}, or pair with a code ('receive --pair' prints one)`;
      await conn.send(FrameType.ERROR, encodeError(err.exitCode, err.code, msg));
      conn.errorSent = true;
    } catch {
      // gone already
    }
    throw err;
  }
  return fp;
}

/** Bytes moved over a session's extra lanes (parallel trees), added to its summary. */
const laneBytes = new WeakMap<object, { sent: number; received: number }>();

export function countLaneBytes(summary: object, lane: FramedConnection): void {
  const b = laneBytes.get(summary) ?? { sent: 0, received: 0 };
  b.sent += lane.bytesSent;
  b.received += lane.bytesReceived;
  laneBytes.set(summary, b);
}

/** Common end of a session: final wire counters and duration, then close the connection. The
 * sender ends first (protocol §7.2): the receiver, its verdict or its ERROR sent, waits for the
 * sender's end before its own; a sender does not wait for the receiver's, unless it wrote an
 * ERROR itself (the receiver must be able to read it before our socket goes). */
export async function endSession(conn: FramedConnection, summary: import('./events.js').SyncSummary, startedAt: number, role: 'sender' | 'receiver'): Promise<void> {
  const lanes = laneBytes.get(summary) ?? { sent: 0, received: 0 };
  summary.bytesOnWire = { sent: conn.bytesSent + lanes.sent, received: conn.bytesReceived + lanes.received };
  summary.durationMs = Date.now() - startedAt;
  await conn.close(undefined, role === 'receiver' ? 'after-peer' : conn.wroteError ? 'both' : 'first');
}
