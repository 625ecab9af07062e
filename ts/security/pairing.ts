// First contact by a one-time code (docs/security.md "Pairing", docs/protocol.md §1.0.1).
// The receiver offers a code; the sender types it (`send … --pair CODE`). Inside the TLS
// channel both run SPAKE2 with the code as password (ffsync_core::pairing) and confirm
// the key over the TLS exporter value and both certificates, so a man in the middle can
// neither learn the code nor use it. On success each side pins the other's fingerprint.
import crypto from 'node:crypto';
import os from 'node:os';
import type * as tls from 'node:tls';
import type { FramedConnection } from '../transport/connection.js';
import { FrameType, protocolError } from '../protocol/frames.js';
import { decodeError, encodeError } from '../protocol/messages.js';
import { normalizePairingCode, pairingCode, startPairing } from '../native/binding.js';
import { ExitCode, FfsyncError } from '../utils/errors.js';
import { addPin } from './pins.js';

/** PAIR frame steps (first payload byte). */
export const PairStep = { MESSAGE: 1, CONFIRM: 2 } as const;
const MESSAGE_LEN = 33;
const CONFIRM_LEN = 32;
/** TLS exporter label (RFC 8446 §7.5); 32 bytes, empty context. */
export const EXPORTER_LABEL = 'EXPORTER-ffsync-native-pair';
/** A receive run offers at most this many codes: each failed attempt burns one. */
export const MAX_CODES_PER_RUN = 5;

export { normalizePairingCode };

/** The receiver's offer: the current code (undefined once used or after the last one). */
export class PairingOffer {
  code: string | undefined;
  private issued = 0;
  /** The last attempt spent a code (a refused connection that took none changes nothing). */
  private spent = false;

  constructor(private readonly announce: (code: string) => void, private readonly exhausted: () => void) {}

  /** A new code (after a failed attempt burnt the last), or none once MAX_CODES_PER_RUN are spent. */
  issue(): void {
    if (this.issued >= MAX_CODES_PER_RUN) {
      this.code = undefined;
      this.exhausted();
      return;
    }
    this.issued++;
    this.code = pairingCode();
    this.announce(this.code);
  }

  /** Take the code for one attempt: it is spent whatever the attempt's outcome. */
  take(): string | undefined {
    const c = this.code;
    this.code = undefined;
    this.spent = c !== undefined;
    return c;
  }

  /** After a failed attempt: a new code if that attempt spent one. */
  replaceSpent(): void {
    if (!this.spent) return;
    this.spent = false;
    this.issue();
  }
}

/** The line the receiver prints for the sender to run. */
export function pairCommand(code: string, host: string, port: number, target: string): string {
  const shown = host === '0.0.0.0' || host === '::' ? reachableAddress() : host;
  const name = target.replace(/[/\\]+$/, '').split(/[/\\]/).pop() || 'PATH';
  const h = shown.includes(':') ? `[${shown}]` : shown;
  return `ffsync-native send ./${/^[\w.@+-]+$/.test(name) ? name : 'PATH'} ${h}:${port} --pair ${code}`;
}

/** An address a sender elsewhere can dial: the first external IPv4, else loopback. */
function reachableAddress(): string {
  for (const list of Object.values(os.networkInterfaces())) {
    for (const a of list ?? []) if (a.family === 'IPv4' && !a.internal) return a.address;
  }
  return '127.0.0.1';
}

function rawFingerprint(fp: string): Buffer {
  return Buffer.from(fp.replace(/-/g, ''), 'hex');
}

/** The values both sides bind their confirmations to: exporter, sender's and receiver's certificate. */
function channel(sock: tls.TLSSocket, peerFp: string, role: 'sender' | 'receiver'): { exporter: Buffer; sender: Buffer; receiver: Buffer } {
  if (typeof sock.exportKeyingMaterial !== 'function' || typeof sock.getCertificate !== 'function') {
    throw new FfsyncError('EUSAGE', ExitCode.USAGE, 'pairing needs a TLS connection (not --plaintext, not --quic); pair once over TLS, later sessions may use --quic');
  }
  const exporter = sock.exportKeyingMaterial(32, EXPORTER_LABEL, Buffer.alloc(0));
  const own = (sock.getCertificate() as { raw?: Buffer } | null)?.raw;
  if (!own) throw new FfsyncError('EPAIR', ExitCode.UNTRUSTED, 'pairing: our own certificate is not available on this connection');
  const ours = crypto.createHash('sha256').update(own).digest();
  const theirs = rawFingerprint(peerFp);
  return role === 'sender' ? { exporter, sender: ours, receiver: theirs } : { exporter, sender: theirs, receiver: ours };
}

function pairFrame(step: number, body: Buffer): Buffer {
  return Buffer.concat([Buffer.from([step]), body]);
}

/** The next PAIR frame of `step`, with its exact length; the peer's ERROR becomes its error. */
async function expectPair(conn: FramedConnection, step: number, len: number): Promise<Buffer> {
  const f = await conn.recv();
  if (f.type === FrameType.ERROR) throw decodeError(f.payload);
  if (f.type !== FrameType.PAIR) throw protocolError(`expected PAIR during pairing, got frame type 0x${f.type.toString(16)}`);
  if (f.payload.length !== 1 + len || f.payload[0] !== step) throw protocolError(`malformed PAIR frame (step ${f.payload[0]}, ${f.payload.length} bytes)`);
  return f.payload.subarray(1);
}

function pairingFailed(message: string): FfsyncError {
  return new FfsyncError('EPAIR', ExitCode.UNTRUSTED, message);
}

/** Sender side of `--pair CODE`: runs the exchange, pins the receiver; returns nothing on success. */
export async function pairAsSender(conn: FramedConnection, sock: tls.TLSSocket, code: string, o: { stateDir: string; peerFingerprint: string; peerLabel: string }): Promise<void> {
  const c = channel(sock, o.peerFingerprint, 'sender');
  const pake = startPairing('sender', code, c.exporter, c.sender, c.receiver);
  await conn.send(FrameType.PAIR, pairFrame(PairStep.MESSAGE, pake.message()));
  const theirs = await expectPair(conn, PairStep.MESSAGE, MESSAGE_LEN);
  await conn.send(FrameType.PAIR, pairFrame(PairStep.CONFIRM, pake.finish(theirs)));
  const confirm = await expectPair(conn, PairStep.CONFIRM, CONFIRM_LEN);
  if (!pake.verify(confirm)) {
    const err = pairingFailed(`pairing with ${o.peerLabel} failed: the receiver could not prove it holds the code over this connection (someone may be in between); nothing was sent or pinned`);
    await conn.send(FrameType.ERROR, encodeError(err.exitCode, err.code, 'pairing failed: your confirmation did not match this connection')).catch(() => undefined);
    conn.errorSent = true;
    throw err;
  }
  addPin(o.stateDir, o.peerFingerprint, `paired ${o.peerLabel} ${new Date().toISOString().slice(0, 10)}`);
}

/**
 * Receiver side: if the sender's first frame is PAIR, run the exchange with the offered
 * code (spent by this attempt), pin the sender and return true. Any other first frame is
 * put back for the handshake and the answer is false (trust is decided as usual).
 */
export async function pairAsReceiver(conn: FramedConnection, sock: tls.TLSSocket, offer: PairingOffer, o: { stateDir: string; peerFingerprint: string; peerLabel: string }): Promise<boolean> {
  // Whoever this is has not been authenticated yet: whatever it does here (nothing, junk, a
  // half exchange) is a refused connection, and a waiting receive goes on waiting.
  try {
    const first = await withDeadline(conn.recv(), FIRST_FRAME_MS, `sent nothing within ${FIRST_FRAME_MS / 1000} s`);
    if (first.type !== FrameType.PAIR) {
      conn.unshift(first);
      return false;
    }
    if (first.payload.length !== 1 + MESSAGE_LEN || first.payload[0] !== PairStep.MESSAGE) throw protocolError(`malformed PAIR frame (step ${first.payload[0]}, ${first.payload.length} bytes)`);
    const code = offer.take();
    if (!code) {
      throw pairingFailed('the sender asked to pair, but this receiver has no pairing code to offer (start it with --pair, or pin the sender with trust)');
    }
    const c = channel(sock, o.peerFingerprint, 'receiver');
    const pake = startPairing('receiver', code, c.exporter, c.sender, c.receiver);
    await conn.send(FrameType.PAIR, pairFrame(PairStep.MESSAGE, pake.message()));
    const ours = pake.finish(first.payload.subarray(1));
    const confirm = await expectPair(conn, PairStep.CONFIRM, CONFIRM_LEN);
    // Ours goes out only after theirs verified: a wrong guess learns nothing more.
    if (!pake.verify(confirm)) throw pairingFailed('pairing failed: the code did not match (mistyped, or already used), or someone is in between; that code is spent');
    await conn.send(FrameType.PAIR, pairFrame(PairStep.CONFIRM, ours));
  } catch (e) {
    if (e instanceof FfsyncError && e.code === 'EPAIR') throw e;
    throw pairingFailed(`pairing failed: ${(e as Error).message}`);
  }
  addPin(o.stateDir, o.peerFingerprint, `paired ${o.peerLabel} ${new Date().toISOString().slice(0, 10)}`);
  return true;
}

/** How long a receiver offering a code waits for an unauthenticated peer's first frame. */
const FIRST_FRAME_MS = 15_000;

function withDeadline<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new FfsyncError('ETIMEDOUT', ExitCode.TIMEOUT, `the peer ${what}`)), ms);
  });
  return Promise.race([p, late]).finally(() => clearTimeout(timer));
}
