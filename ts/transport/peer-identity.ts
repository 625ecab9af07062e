// The certificate a transport's peer presented, by stream: TLS sockets record it when the
// handshake completes, QUIC streams inherit their connection's. Trust decisions
// (ts/security/trust.ts) and lane checks read it from here, whatever the transport.
import type { Duplex } from 'node:stream';
import { fingerprintOfDer } from '../security/fingerprint.js';
import { ExitCode, FfsyncError } from '../utils/errors.js';

// Captured at handshake time: once the peer hangs up (for instance because it does not
// trust *us*), a TLS socket no longer reports the certificate it presented.
const presented = new WeakMap<object, string | undefined>();

export function recordPeerCertificate(stream: Duplex, der: Buffer | undefined | null): void {
  presented.set(stream, der && der.length ? fingerprintOfDer(der) : undefined);
}

/** The SHA-256 fingerprint of the certificate the peer presented on `stream`. */
export function peerFingerprint(stream: Duplex): string {
  const fp = presented.get(stream);
  if (!fp) throw new FfsyncError('EUNTRUSTED', ExitCode.UNTRUSTED, 'the peer presented no certificate');
  return fp;
}

/** A transport stream that authenticated its peer by certificate (TLS or QUIC). */
export type SecureStream = Duplex & { remoteAddress?: string; remotePort?: number };
