// Plain TCP transport (`--plaintext`). TLS (the default, with pinning) wraps the same
// sockets in its own module.

import net from 'node:net';
import { ExitCode, FfsyncError, fromSystemError } from '../utils/errors.js';

export interface Listener {
  host: string;
  port: number;
  /** Resolves with the first connection; the listener then stops accepting. */
  accept(): Promise<net.Socket>;
  close(): void;
}

export async function listenOnce(host: string, port: number): Promise<Listener> {
  const server = net.createServer({ pauseOnConnect: true });
  let pending: net.Socket | undefined;
  let waiter: ((s: net.Socket) => void) | undefined;
  server.on('connection', (sock) => {
    if (pending || !waiter) {
      if (!pending) pending = sock;
      else sock.destroy();
      return;
    }
    waiter(sock);
    waiter = undefined;
    pending = sock;
  });
  const addr = await bind(server, host, port);
  return {
    host: addr.address,
    port: addr.port,
    accept: () =>
      new Promise((resolve) => {
        if (pending) {
          server.close();
          resolve(tune(pending));
          return;
        }
        waiter = (s) => {
          server.close();
          resolve(tune(s));
        };
      }),
    close: () => server.close(),
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
  return new Promise((resolve, reject) => {
    const sock = net.connect({ host, port });
    const timer = setTimeout(() => {
      sock.destroy();
      reject(new FfsyncError('ETIMEDOUT', ExitCode.TIMEOUT, `connecting to ${host}:${port} timed out`));
    }, timeoutMs);
    sock.once('connect', () => {
      clearTimeout(timer);
      sock.removeAllListeners('error');
      resolve(tune(sock));
    });
    sock.once('error', (e) => {
      clearTimeout(timer);
      reject(fromSystemError(e, `cannot connect to ${host}:${port}`));
    });
  });
}

function tune(s: net.Socket): net.Socket {
  s.setNoDelay(true);
  return s;
}

/** Parse `host:port` (IPv6 as `[::1]:port`). */
export function parseHostPort(spec: string): { host: string; port: number } {
  const m = /^\[([^\]]+)\]:(\d+)$/.exec(spec) ?? /^([^:]+):(\d+)$/.exec(spec);
  const port = m ? Number(m[2]) : NaN;
  if (!m || !Number.isInteger(port) || port < 1 || port > 65535) {
    throw new FfsyncError('EUSAGE', ExitCode.USAGE, `expected host:port, got '${spec}'`);
  }
  return { host: m[1], port };
}
