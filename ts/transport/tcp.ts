// Plain TCP transport (`--plaintext`). TLS (the default, with pinning) wraps the same
// sockets in its own module.

import { nowMs } from '../utils/clock.js';
import type * as net from 'node:net';
import { netModule } from './net-module.js';
import type { SecureStream } from './peer-identity.js';
import type { Duplex } from 'node:stream';
import { ExitCode, FfsyncError, fromSystemError } from '../utils/errors.js';
import { noteHandshake } from './handshake-time.js';

export interface Listener {
  host: string;
  port: number;
  /** Resolves with the next connection, in arrival order. The first one is the session;
   * later ones are only taken for a tree session's extra lanes (`--parallel`). */
  accept(): Promise<SecureStream>;
  /** Stop accepting; connections not taken yet are closed. */
  close(): void;
  /** Only this process can connect (a local sync's in-memory lanes): a lane's token guards
   * nothing there, so it is not drawn from the system's random source (decisions §107). */
  inProcess?: boolean;
}

/** Hands out sockets in arrival order to whoever asks; drops the rest on close. */
export class SocketQueue<S extends Duplex> {
  private readonly ready: S[] = [];
  private readonly waiters: { resolve: (s: S) => void; reject: (e: Error) => void }[] = [];
  private closedWith?: Error;

  /** `backlog`: connections kept waiting for accept() before more are dropped. */
  constructor(private readonly backlog = 16) {}

  push(s: S): void {
    const w = this.waiters.shift();
    if (w) w.resolve(s);
    else if (this.closedWith || this.ready.length >= this.backlog) s.destroy();
    else this.ready.push(s);
  }

  fail(e: Error): void {
    const w = this.waiters.shift();
    if (w) w.reject(e);
    else this.closedWith ??= e;
  }

  next(): Promise<S> {
    const s = this.ready.shift();
    if (s) return Promise.resolve(s);
    if (this.closedWith) return Promise.reject(this.closedWith);
    return new Promise((resolve, reject) => this.waiters.push({ resolve, reject }));
  }

  close(): void {
    this.closedWith ??= new FfsyncError('ECLOSED', ExitCode.SOCKET_IO, 'listener closed');
    for (const s of this.ready.splice(0)) s.destroy();
    for (const w of this.waiters.splice(0)) w.reject(this.closedWith);
  }
}

export async function listenOnce(host: string, port: number): Promise<Listener> {
  const server = netModule().createServer({ pauseOnConnect: true });
  const queue = new SocketQueue<net.Socket>();
  server.on('connection', (sock) => queue.push(sock));
  const addr = await bind(server, host, port);
  return {
    host: addr.address,
    port: addr.port,
    accept: async () => tune(await queue.next()),
    close: () => {
      server.close();
      queue.close();
    },
  };
}

/** Listen on host:port (0 = any free port); EADDRINUSE and the like are exit 10. */
export async function bind(server: net.Server, host: string, port: number): Promise<net.AddressInfo> {
  await new Promise<void>((resolve, reject) => {
    server.once('error', (e) => reject(fromSystemError(e, `cannot listen on ${host}:${port}`)));
    server.listen({ host, port, exclusive: true }, () => resolve());
  });
  return server.address() as net.AddressInfo;
}

export function connect(host: string, port: number, timeoutMs = 15000): Promise<net.Socket> {
  const started = nowMs();
  return connected(netModule().connect({ host, port }), host, port, timeoutMs).then((s) => {
    noteHandshake(s, nowMs() - started);
    return tune(s);
  });
}

/** `sock` once its TCP handshake is done: at once if it is (an early connection,
 * ts/transport/early-connect.ts, taken by tls.ts), else when it completes; a timeout (from now)
 * or an error rejects, as a refused or unreachable connect is reported. */
export function connected(sock: net.Socket, host: string, port: number, timeoutMs: number): Promise<net.Socket> {
  if (!sock.connecting) return Promise.resolve(sock);
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      sock.destroy();
      reject(new FfsyncError('ETIMEDOUT', ExitCode.TIMEOUT, `connecting to ${host}:${port} timed out`));
    }, timeoutMs);
    sock.once('connect', () => {
      clearTimeout(timer);
      sock.removeAllListeners('error');
      resolve(sock);
    });
    sock.once('error', (e) => {
      clearTimeout(timer);
      reject(fromSystemError(e, `cannot connect to ${host}:${port}`));
    });
  });
}

/** The kernel's round trip of a connected early socket, in ms: its TCP handshake ran while the
 * program loaded, when no timer of ours could see it complete (decisions §110). Undefined where
 * the platform does not say (the early connection is only made where it does). */
export function kernelRttMs(sock: net.Socket): number | undefined {
  const fd = (sock as unknown as { _handle?: { fd?: number } })._handle?.fd;
  if (typeof fd !== 'number' || fd < 0) return undefined;
  const { tcpRttMicros } = require('../native/binding.js') as typeof import('../native/binding.js'); // eslint-disable-line @typescript-eslint/no-require-imports
  const us = tcpRttMicros(fd);
  return us === null || us === undefined ? undefined : us / 1000;
}

function tune(s: net.Socket): net.Socket {
  s.setNoDelay(true);
  return s;
}

/** Parse `host:port` (IPv6 as `[::1]:port`). */
/** `host:port` or `host:port/some/path` (a path under a `serve` daemon's root; `host:port/`
 * is its root). IPv6 hosts in brackets: `[::1]:7788/x`. */
export function parseRemote(spec: string): { host: string; port: number; path?: string } {
  const m = /^(\[[^\]]+\]:\d+|[^:/]+:\d+)(\/.*)?$/.exec(spec);
  if (!m) throw new FfsyncError('EUSAGE', ExitCode.USAGE, `expected host:port or host:port/path, got '${spec}'`);
  return { ...parseHostPort(m[1]), path: m[2] === undefined ? undefined : m[2].slice(1) };
}

export function parseHostPort(spec: string): { host: string; port: number } {
  const m = /^\[([^\]]+)\]:(\d+)$/.exec(spec) ?? /^([^:]+):(\d+)$/.exec(spec);
  const port = m ? Number(m[2]) : NaN;
  if (!m || !Number.isInteger(port) || port < 1 || port > 65535) {
    throw new FfsyncError('EUSAGE', ExitCode.USAGE, `expected host:port, got '${spec}'`);
  }
  return { host: m[1], port };
}
