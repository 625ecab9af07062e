// QUIC transport (`--quic`): one QUIC connection per session (quinn in the Rust core,
// crates/ffsync_core/src/quic/), its bidirectional streams wrapped as Node Duplex streams
// so the framed protocol runs over them unchanged. The first stream is the session;
// a tree's lanes are further streams on the same connection instead of more TCP
// connections. Peers authenticate exactly as over TLS: self-signed certificates both
// ways, trusted by pinned fingerprint (ts/security/trust.ts).

import dns from 'node:dns/promises';
import net from 'node:net';
import { Duplex } from 'node:stream';
import { call, type NativeQuicConnection, type NativeQuicListener, type NativeQuicStream, quicConnectNative, quicListenNative } from '../native/binding.js';
import type { Identity } from '../security/identity.js';
import { ExitCode, FfsyncError, normalizeNativeError } from '../utils/errors.js';
import { recordPeerCertificate } from './peer-identity.js';
import type { Listener } from './tcp.js';

/** Application close codes, mirrored from crates/ffsync_core/src/quic/mod.rs. */
const CLOSE_DONE = 0;
const CLOSE_ABORTED = 1;
const READ_MAX = 256 * 1024;

/** One QUIC stream as a Duplex: reads pull from the native stream one piece at a time
 * (backpressure is QUIC flow control), writes resolve when QUIC took the bytes. */
export class QuicStreamDuplex extends Duplex {
  private reading = false;
  readonly remoteAddress: string;
  readonly remotePort: number;

  constructor(
    private readonly s: NativeQuicStream,
    conn: NativeQuicConnection,
  ) {
    // Not half-open, like a TCP socket: when the peer ends its side we end ours, so a
    // lane or session closes as promptly as over TCP.
    super({ allowHalfOpen: false, highWaterMark: 1024 * 1024 });
    this.remoteAddress = conn.remoteAddress;
    this.remotePort = conn.remotePort;
    recordPeerCertificate(this, conn.peerCertificate());
  }

  override _read(): void {
    if (this.reading) return;
    this.reading = true;
    this.s.read(READ_MAX).then(
      (b) => {
        this.reading = false;
        this.push(b ?? null);
      },
      (e) => {
        this.reading = false;
        this.destroy(normalizeNativeError(e));
      },
    );
  }

  override _write(chunk: Buffer, _enc: BufferEncoding, cb: (e?: Error | null) => void): void {
    this.s.write([chunk]).then(() => cb(), (e) => cb(normalizeNativeError(e)));
  }

  // A frame header and its payload arrive corked together: one native call for both.
  override _writev(chunks: { chunk: Buffer }[], cb: (e?: Error | null) => void): void {
    this.s.write(chunks.map((c) => c.chunk)).then(() => cb(), (e) => cb(normalizeNativeError(e)));
  }

  override _final(cb: (e?: Error | null) => void): void {
    this.s.finish().then(() => cb(), (e) => cb(normalizeNativeError(e)));
  }

  override _destroy(err: Error | null, cb: (e?: Error | null) => void): void {
    // Destroyed before both halves ended cleanly: tell the peer at once (a reset), so it
    // does not wait for its idle timeout.
    if (err || !this.writableFinished || !this.readableEnded) this.s.reset();
    cb(err);
  }
}

/** The handshake timed out: most often a firewall dropping UDP. */
function quicConnectError(e: unknown, label: string): FfsyncError {
  const err = normalizeNativeError(e);
  if (err.code === 'ETIMEDOUT') {
    return new FfsyncError('ETIMEDOUT', ExitCode.TIMEOUT, `${err.message} (${label}): UDP may be blocked between the peers, or the receiver does not run --quic; retry without --quic to use TCP`, { cause: e });
  }
  if (err.code === 'ETLS') return new FfsyncError('ETLS', ExitCode.PROTOCOL_INCOMPATIBLE, `${label}: ${err.message}`, { cause: e });
  return new FfsyncError(err.code, ExitCode.SOCKET_IO, `${label}: ${err.message}`, { cause: e });
}

/** An IP address for `host` (DNS unless it is one already); exit 10 if it does not resolve. */
export async function resolveHost(host: string): Promise<string> {
  if (net.isIP(host)) return host;
  try {
    return (await dns.lookup(host)).address;
  } catch (e) {
    throw new FfsyncError('ENOTFOUND', ExitCode.SOCKET_IO, `cannot resolve ${host}: ${(e as Error).message}`, { cause: e });
  }
}

/** Resolves never; rejects once `close()` ran (ends waits the native side cannot cancel). */
class Closer {
  closed = false;
  private fire!: (e: Error) => void;
  readonly promise = new Promise<never>((_, reject) => (this.fire = reject));
  constructor() {
    this.promise.catch(() => undefined);
  }
  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.fire(new FfsyncError('ECLOSED', ExitCode.SOCKET_IO, 'listener closed'));
  }
}

/**
 * One QUIC connection, whichever side dialled: streams open and arrive both ways (the
 * first stream is the session, later ones are lanes). Ending it drops unacknowledged
 * data, so the streams end first (FramedConnection.close) and the connection after.
 */
export class QuicSession {
  private ended = false;
  constructor(
    readonly conn: NativeQuicConnection,
    readonly label: string,
  ) {}

  static async connect(host: string, port: number, id: Identity, o: { timeoutMs: number; idleMs: number }): Promise<QuicSession> {
    const label = `${host}:${port}`;
    const ip = await resolveHost(host);
    try {
      const conn = await quicConnectNative(ip, port, id.certPem, id.keyPem, o.timeoutMs, o.idleMs);
      return new QuicSession(conn, label);
    } catch (e) {
      throw quicConnectError(e, `QUIC to ${label}`);
    }
  }

  /** A new stream (the session's first, or a lane). */
  async openStream(): Promise<QuicStreamDuplex> {
    const s = await call(this.conn.openStream());
    return new QuicStreamDuplex(s, this.conn);
  }

  /** The peer's next stream. */
  async acceptStream(): Promise<QuicStreamDuplex> {
    const s = await call(this.conn.acceptStream());
    if (!s) throw new FfsyncError('ECLOSED', ExitCode.SOCKET_IO, `QUIC connection to ${this.label} closed before the session started`);
    return new QuicStreamDuplex(s, this.conn);
  }

  /** The peer's further streams as a Listener (a tree's lanes join through it). */
  lanes(): Listener {
    const closer = new Closer();
    return {
      host: this.conn.remoteAddress,
      port: this.conn.remotePort,
      accept: async () => {
        if (closer.closed) return closer.promise;
        const s = await Promise.race([call(this.conn.acceptStream()), closer.promise]);
        if (!s || closer.closed) {
          s?.reset();
          throw new FfsyncError('ECLOSED', ExitCode.SOCKET_IO, 'listener closed');
        }
        return new QuicStreamDuplex(s, this.conn);
      },
      close: () => closer.close(),
    };
  }

  /** UDP payload bytes so far: what QUIC really put on the wire (headers, ACKs, retransmits). */
  wireBytes(): { sent: number; received: number } {
    return this.conn.wireBytes();
  }

  async close(ok: boolean): Promise<void> {
    if (this.ended) return;
    this.ended = true;
    await this.conn.close(ok ? CLOSE_DONE : CLOSE_ABORTED, ok ? 'done' : 'aborted');
  }
}

/** A UDP endpoint that takes exactly one QUIC session (later ones are refused). */
export class QuicListener {
  private readonly closer = new Closer();
  private constructor(private readonly native: NativeQuicListener) {}

  static async bind(host: string, port: number, id: Identity, o: { idleMs: number }): Promise<QuicListener> {
    try {
      return new QuicListener(await quicListenNative(host, port, id.certPem, id.keyPem, o.idleMs));
    } catch (e) {
      const err = normalizeNativeError(e);
      throw new FfsyncError(err.code, ExitCode.SOCKET_IO, `cannot listen on UDP ${host}:${port}: ${err.message}`, { cause: e });
    }
  }

  get host(): string {
    return this.native.address;
  }

  get port(): number {
    return this.native.port;
  }

  /** The first connection to complete its handshake; nobody else gets in afterwards. */
  async acceptSession(): Promise<QuicSession> {
    const c = await Promise.race([call(this.native.accept()), this.closer.promise]);
    if (!c) throw new FfsyncError('ECLOSED', ExitCode.SOCKET_IO, 'listener closed');
    this.native.stopAccepting();
    return new QuicSession(c, `${c.remoteAddress}:${c.remotePort}`);
  }

  /** The next connection to complete its handshake, leaving the listener open for more
   * (the `serve` daemon); rejects once the listener is closed. */
  async acceptNext(): Promise<QuicSession> {
    const c = await Promise.race([call(this.native.accept()), this.closer.promise]);
    if (!c) throw new FfsyncError('ECLOSED', ExitCode.SOCKET_IO, 'listener closed');
    return new QuicSession(c, `${c.remoteAddress}:${c.remotePort}`);
  }

  /** Close the UDP socket (end sessions first: this ends any still on it). */
  close(): void {
    this.closer.close();
    this.native.close();
  }
}
