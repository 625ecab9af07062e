// TLS 1.3 transport, mutually authenticated by pinned certificate fingerprints (not by a
// CA or host names: every peer's certificate is self-signed, see ts/security/). Both
// sides present their identity; trust is decided after the handshake by ts/security/trust.
import { nowMs } from '../utils/clock.js';
import * as net from 'node:net';
import * as tls from 'node:tls';
import type { Identity } from '../security/identity.js';
import { recordPeerCertificate } from './peer-identity.js';
import { noteHandshake } from './handshake-time.js';
import { ExitCode, FfsyncError, fromSystemError } from '../utils/errors.js';
import { bind, connected, kernelRttMs, type Listener, SocketQueue } from './tcp.js';
import { takeEarlyConnection } from './early-connect.js';

const BASE: tls.SecureContextOptions & tls.CommonConnectionOptions = {
  minVersion: 'TLSv1.3',
  maxVersion: 'TLSv1.3',
  // Self-signed by design: the chain is not what we trust, the fingerprint is.
  rejectUnauthorized: false,
  // No certificate authorities either: without `ca`, Node builds its store of ~140 bundled
  // root certificates for the first context, 38 ms of the JS thread on this machine, on every
  // `send` and `receive`, for a chain nobody checks (decisions §90).
  ca: [],
};

function handshakeError(e: unknown, context: string): FfsyncError {
  const err = e as NodeJS.ErrnoException;
  if (['ECONNREFUSED', 'ECONNRESET', 'EADDRINUSE', 'EHOSTUNREACH', 'ENETUNREACH', 'ENOTFOUND', 'EAI_AGAIN'].includes(err?.code ?? '')) {
    return fromSystemError(e, context);
  }
  // OpenSSL's own text (`error:0A00010B:SSL routines:…`) means nothing to a user; what it
  // tells apart does: the far end answered, but not with TLS.
  const text = `${err?.message ?? ''} ${(err as { reason?: string })?.reason ?? ''}`;
  const notTls = /wrong version number|packet length too long|unknown protocol|record layer failure|http request/i.test(text);
  const closed = err?.code === 'ECONNRESET' || /socket hang up|disconnected before/i.test(text);
  const why = notTls
    ? 'the far end does not speak TLS: it is not an ffsync-native peer, or one started with --plaintext (then give --plaintext on both sides, or on neither)'
    : closed
      ? 'the far end closed the connection during the TLS handshake: it is not an ffsync-native peer, or it refused us (see its output)'
      : `the TLS handshake failed (${(err as { reason?: string })?.reason ?? err?.code ?? 'unknown reason'})`;
  return new FfsyncError('ETLS', ExitCode.PROTOCOL_INCOMPATIBLE, `${context}: ${why}`, { cause: e });
}

/** The TCP connection under `sock` closed before its peer sent a single byte (no ClientHello).
 * Node keeps that connection as the TLS socket's `_parent`; without it, false (as before). */
function sentNothing(sock: tls.TLSSocket): boolean {
  const raw = (sock as unknown as { _parent?: net.Socket })._parent;
  return raw !== undefined && raw.bytesRead === 0;
}

function capture(sock: tls.TLSSocket): void {
  recordPeerCertificate(sock, sock.getPeerCertificate(true)?.raw);
}

export async function tlsListenOnce(host: string, port: number, id: Identity): Promise<Listener> {
  let first = true;
  // A peer that fails the TLS handshake before any session started (e.g. --plaintext on
  // its side) ends the receive with a clear error instead of leaving us waiting. One that sent
  // nothing at all before it closed started nothing: a port probe, or a sender that opened its
  // connection early and stopped before its session (decisions §110); we keep waiting.
  return listenTls(host, port, id, 16, {
    onSecure: () => (first = false),
    onClientError: (e, _remote, fail, silent) => {
      if (first && !silent) fail(e);
    },
  });
}

/**
 * A listener for the `serve` daemon: every connection that completes the TLS handshake is
 * handed out; one that fails it is reported to `onClientError` and changes nothing else.
 * `onConnection` sees each TCP connection before its TLS handshake starts (the daemon's
 * pre-authentication budget admits, times or drops it); `handshakeTimeoutMs` bounds the TLS
 * handshake itself.
 */
export function tlsListen(
  host: string,
  port: number,
  id: Identity,
  onClientError: (e: FfsyncError, remote: string) => void,
  o: { handshakeTimeoutMs?: number; onConnection?: (raw: net.Socket) => void } = {},
): Promise<Listener> {
  return listenTls(host, port, id, Infinity, { onClientError: (e, remote) => onClientError(e, remote), onConnection: o.onConnection }, o.handshakeTimeoutMs);
}

async function listenTls(
  host: string,
  port: number,
  id: Identity,
  backlog: number,
  on: { onSecure?: () => void; onClientError: (e: FfsyncError, remote: string, fail: (e: Error) => void, silent: boolean) => void; onConnection?: (raw: net.Socket) => void },
  handshakeTimeoutMs?: number,
): Promise<Listener> {
  const server = tls.createServer({ ...BASE, key: id.keyPem, cert: id.certPem, requestCert: true, ...(handshakeTimeoutMs ? { handshakeTimeout: handshakeTimeoutMs } : {}) });
  if (on.onConnection) server.on('connection', on.onConnection);
  const queue = new SocketQueue<tls.TLSSocket>(backlog);
  server.on('secureConnection', (sock) => {
    on.onSecure?.();
    sock.setNoDelay(true);
    capture(sock);
    queue.push(sock);
  });
  server.on('tlsClientError', (e, sock) => on.onClientError(handshakeError(e, 'incoming connection'), `${sock.remoteAddress}:${sock.remotePort}`, (err) => queue.fail(err), sentNothing(sock)));
  const addr = await bind(server, host, port);
  return {
    host: addr.address,
    port: addr.port,
    accept: () => queue.next(),
    close: () => {
      server.close();
      queue.close();
    },
  };
}

export async function tlsConnect(host: string, port: number, id: Identity, timeoutMs = 15000): Promise<tls.TLSSocket> {
  // A connection opened while the program loaded (decisions §110): TLS starts on it; the
  // handshake time is its TCP round trip, which the kernel measured, plus TLS's own.
  const early = takeEarlyConnection(host, port);
  const socket = early && (await connected(early, host, port, timeoutMs).catch(() => undefined));
  const tcpMs = socket ? kernelRttMs(socket) : 0;
  return new Promise((resolve, reject) => {
    const started = nowMs();
    const options = { ...BASE, key: id.keyPem, cert: id.certPem, checkServerIdentity: () => undefined, servername: net.isIP(host) ? undefined : host };
    const sock = socket ? tls.connect({ ...options, socket }) : tls.connect({ ...options, host, port });
    const timer = setTimeout(() => {
      sock.destroy();
      reject(new FfsyncError('ETIMEDOUT', ExitCode.TIMEOUT, `connecting to ${host}:${port} timed out`));
    }, timeoutMs);
    sock.once('secureConnect', () => {
      clearTimeout(timer);
      const tlsMs = nowMs() - started;
      noteHandshake(sock, tcpMs === undefined ? tlsMs : tcpMs + tlsMs);
      sock.removeAllListeners('error');
      sock.setNoDelay(true);
      capture(sock);
      resolve(sock);
    });
    sock.once('error', (e) => {
      clearTimeout(timer);
      reject(handshakeError(e, `connecting to ${host}:${port}`));
    });
  });
}
