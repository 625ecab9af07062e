// `ffsync-native serve <root> <port>`: a long-lived daemon taking many concurrent sessions.
// Each connection is TLS (or QUIC with --quic) with a client certificate; after HELLO the
// client addresses a path under the root with REQUEST (push or pull, docs/protocol.md
// §4.14); the daemon authorizes it against serve-clients.conf (./authorization.ts), takes
// the path's lock (./path-locks.ts: writers exclusive, readers shared) and then runs the
// same receiver or sender the one-session commands run. One JSON line per session is
// logged (./session-log.ts).

import fs from 'node:fs/promises';
import type net from 'node:net';
import path from 'node:path';
import v8 from 'node:v8';
import vm from 'node:vm';
import { FramedConnection, PeerClosedError } from '../transport/connection.js';
import { FrameType } from '../protocol/frames.js';
import { decodeRequest, encodeError, RequestOp, Role } from '../protocol/messages.js';
import { daemonHandshake, expect, reportError } from '../api/session.js';
import { checkTarget, runReceiver } from '../api/receive.js';
import { ensureDirBeneath } from '../native/binding.js';
import { runSender, statSource } from '../api/send.js';
import type { SyncSummary } from '../api/events.js';
import { peerFingerprint, type SecureStream } from '../transport/peer-identity.js';
import { tlsListen } from '../transport/tls.js';
import { QuicListener } from '../transport/quic.js';
import { overQuic } from '../api/over-quic.js';
import { loadOrCreateIdentity } from '../security/identity.js';
import { ExitCode, FfsyncError, fromSystemError } from '../utils/errors.js';
import { resolveStateDir } from '../utils/state-dir.js';
import { type Access, authorize, type AuthorizationConfig, configPath, loadConfig, normalizeRequestPath } from './authorization.js';
import { PathLocks } from './path-locks.js';
import { type SessionLog, sessionLog } from './session-log.js';
import { handshakeMs, noteHandshake } from '../transport/handshake-time.js';

export interface ServeOptions {
  root: string;
  host?: string;
  port: number;
  stateDir?: string;
  /** The authorization config (default <state>/serve-clients.conf). */
  configFile?: string;
  /** Idle timeout per session (exit 30 for that session). Default 60 s. */
  timeoutMs?: number;
  /** More concurrent sessions than this are refused ("busy"). Default 64. A slot is taken
   * only once the client is authenticated and its REQUEST authorized. */
  maxSessions?: number;
  /** Connections that have not completed TLS + HELLO + REQUEST + authorization yet, at most
   * (the oldest unauthenticated one is dropped for a newcomer). Default 128. */
  maxHandshakes?: number;
  /** … of which from one source address. Default 64 (a fleet behind one NAT connects at once). */
  maxHandshakesPerAddress?: number;
  /** New connections per second from one address (after a burst of maxHandshakesPerAddress);
   * faster ones are dropped before TLS. Default 8. */
  handshakeRatePerAddress?: number;
  /** Deadline for all of it, from the TCP accept (exit 30 for that connection). Default 5 s. */
  handshakeTimeoutMs?: number;
  /** Memory budget of the daemon (bytes): a session is refused ("busy") when the resident set
   * is over it, or when the sessions admitted would reserve more. Default 1 GiB. */
  maxMemoryBytes?: number;
  /** Also accept QUIC on the same port number (UDP). */
  quic?: boolean;
  /** zstd level for pulls (0 = raw). Default 1. */
  compressLevel?: number;
  /** `false` (`--no-fsync`): pushed files are renamed into place without being made
   * durable first. Default true. */
  fsync?: boolean;
  events?: {
    listening?(host: string, port: number, quicPort?: number): void;
    info?(message: string): void;
    /** One entry per session, when it ends (accepted or refused). */
    session?(entry: SessionLog): void;
  };
}

/** What one admitted session may cost the daemon, for the memory budget: a receive queue
 * (4 MiB + 1,024 frames), a frame being assembled (≤ 2 MiB pooled + the reads holding it), two
 * batches verifying, native buffers. Measured ≈ 6-12 MiB under floods (bench/hostile.ts). */
export const SESSION_MEMORY_ESTIMATE = 16 * 1024 * 1024;

/**
 * The pre-authentication budget: every TCP connection is admitted here before its TLS
 * handshake and leaves once its REQUEST is authorized (or it is gone). At most `max` at
 * once and `perAddress` from one address; a newcomer over either limit pushes out the
 * oldest connection that has not yet authenticated (presented a configured client
 * certificate) of its own address, or else of the address with the most connections
 * pending — so a flood of idle connections cannot hold the door shut, and a source flooding
 * the budget pushes out its own connections, not a real client's (whose handshake takes
 * milliseconds). A connection still here at the deadline is dropped.
 */
export class HandshakeBudget {
  private readonly pending = new Map<string, Ticket>();
  private readonly perAddr = new Map<string, number>();
  /** New connections per source address: a token bucket (burst perAddress, refilled at
   * `ratePerAddress` per second); a connection over it is dropped before its TLS handshake,
   * which is what costs the daemon CPU. */
  private readonly buckets = new Map<string, { tokens: number; at: number }>();
  /** Connections dropped to make room or at the deadline (for logs and tests). */
  evicted = 0;
  /** Connections dropped for arriving too fast from their address. */
  throttled = 0;

  constructor(
    private readonly max: number,
    private readonly perAddress: number,
    readonly deadlineMs: number,
    private readonly ratePerAddress = 8,
  ) {}

  private rateOk(addr: string, now: number): boolean {
    const burst = this.perAddress;
    let b = this.buckets.get(addr);
    if (!b) {
      if (this.buckets.size >= 4096) {
        for (const [a, x] of this.buckets) if (x.tokens + ((now - x.at) * this.ratePerAddress) / 1000 >= burst) this.buckets.delete(a);
      }
      b = { tokens: burst, at: now };
      this.buckets.set(addr, b);
    }
    b.tokens = Math.min(burst, b.tokens + ((now - b.at) * this.ratePerAddress) / 1000);
    b.at = now;
    if (b.tokens < 1) return false;
    b.tokens--;
    return true;
  }

  get size(): number {
    return this.pending.size;
  }

  admit(raw: net.Socket): void {
    const addr = raw.remoteAddress ?? '?';
    const key = `${addr}:${raw.remotePort}`;
    if (!this.rateOk(addr, Date.now())) {
      this.throttled++;
      return void raw.destroy();
    }
    if ((this.perAddr.get(addr) ?? 0) >= this.perAddress && !this.evictOldest(addr)) return void raw.destroy();
    if (this.pending.size >= this.max && !this.evictOldest()) return void raw.destroy();
    const t: Ticket = { key, addr, t0: Date.now(), raw, authenticated: false, timer: undefined as unknown as NodeJS.Timeout };
    // Backstop: whatever stage it is in, a connection is gone a second after its deadline.
    t.timer = setTimeout(() => {
      this.evicted++;
      this.drop(t);
    }, this.deadlineMs + 1000);
    t.timer.unref();
    this.pending.set(key, t);
    this.perAddr.set(addr, (this.perAddr.get(addr) ?? 0) + 1);
    raw.once('close', () => this.leave(t));
  }

  /** The ticket of a connection that completed TLS (undefined: it was already dropped). */
  claim(sock: { remoteAddress?: string; remotePort?: number }): Ticket | undefined {
    return this.pending.get(`${sock.remoteAddress}:${sock.remotePort}`);
  }

  leave(t: Ticket): void {
    if (this.pending.get(t.key) !== t) return;
    clearTimeout(t.timer);
    this.pending.delete(t.key);
    const n = (this.perAddr.get(t.addr) ?? 1) - 1;
    if (n > 0) this.perAddr.set(t.addr, n);
    else this.perAddr.delete(t.addr);
  }

  /** Drops the oldest unauthenticated connection of `addr`, or else of the address with the
   * most connections pending (so one source flooding the budget pushes out its own). O(budget). */
  private evictOldest(addr?: string): boolean {
    let heaviest = addr;
    if (heaviest === undefined) {
      let most = 0;
      for (const t of this.pending.values()) {
        if (t.authenticated) continue;
        const n = this.perAddr.get(t.addr) ?? 0;
        if (n > most) [most, heaviest] = [n, t.addr];
      }
    }
    for (const t of this.pending.values()) {
      if (t.authenticated || t.addr !== heaviest) continue;
      this.evicted++;
      this.drop(t);
      return true;
    }
    return false;
  }

  private drop(t: Ticket): void {
    this.leave(t);
    t.sock?.destroy();
    t.raw.destroy();
  }
}

interface Ticket {
  key: string;
  addr: string;
  t0: number;
  raw: net.Socket;
  /** The TLS socket, once the handshake completed. */
  sock?: { destroy(): void };
  /** It presented the certificate of a configured (not revoked) client: never pushed out. */
  authenticated: boolean;
  timer: NodeJS.Timeout;
}

let gc: ((o?: { type?: 'major' | 'minor' }) => void) | undefined | null = null;
/** The second idle collection: after FramedConnection's close grace (2 s) has passed. */
const IDLE_GC_AGAIN_MS = 2500;
/** A full GC once the daemon goes idle, so a burst of sessions' memory is given back. */
function collectGarbage(): void {
  if (gc === null) {
    try {
      v8.setFlagsFromString('--expose-gc');
      gc = vm.runInNewContext('gc') as typeof gc;
    } catch {
      gc = undefined;
    }
  }
  // Plain gc(): a full, synchronous collection (measured: gc({ type: 'major' }) through this
  // handle left 200 MiB of dead Buffers resident on Node 20).
  gc?.();
}

interface Running {
  entry: SessionLog;
  /** Ends the session now: tells the client why (best effort) and drops the connection. */
  abort(reason: string): void;
  done: Promise<void>;
}

/** Fail before listening on a root that can never be served. */
export async function checkServeRoot(root: string): Promise<string> {
  let st;
  try {
    st = await fs.stat(root);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') throw new FfsyncError('ENOENT', ExitCode.FILE_IO, `serve root ${root} does not exist`);
    throw fromSystemError(e, `cannot use serve root ${root}`);
  }
  if (!st.isDirectory()) throw new FfsyncError('ENOTDIR', ExitCode.FILE_IO, `serve root ${root} is not a directory`);
  try {
    await fs.access(root, fs.constants.W_OK | fs.constants.R_OK | fs.constants.X_OK);
  } catch (e) {
    throw new FfsyncError('EACCES', ExitCode.FILE_IO, `serve root ${root} is not writable (${(e as NodeJS.ErrnoException).code})`);
  }
  // Paths are resolved under the real root: a root given through a symlink is fine, links
  // below it are never followed (see resolveUnderRoot).
  return fs.realpath(root);
}

export class ServeDaemon {
  private config: AuthorizationConfig;
  private readonly locks = new PathLocks();
  private readonly running = new Set<Running>();
  /** Sessions past authorization (they hold a --max-sessions slot). */
  private active = 0;
  private handshakes: HandshakeBudget;
  private idleGc: NodeJS.Timeout | undefined;
  private stopping = false;
  private nextId = 1;
  private closeListeners: (() => void)[] = [];
  private acceptLoops: Promise<void>[] = [];

  private constructor(
    private readonly o: ServeOptions & { root: string; stateDir: string; configFile: string },
    config: AuthorizationConfig,
  ) {
    this.config = config;
    this.handshakes = new HandshakeBudget(o.maxHandshakes ?? 128, o.maxHandshakesPerAddress ?? 64, o.handshakeTimeoutMs ?? 5000, o.handshakeRatePerAddress ?? 8);
  }

  /** Connections in the pre-authentication stage now, and how many were dropped so far. */
  get handshaking(): { pending: number; evicted: number; throttled: number } {
    return { pending: this.handshakes.size, evicted: this.handshakes.evicted, throttled: this.handshakes.throttled };
  }

  /** Validate root and config, then listen. Errors here are start-up errors. */
  static async start(o: ServeOptions): Promise<ServeDaemon> {
    const stateDir = resolveStateDir(o.stateDir);
    const root = await checkServeRoot(path.resolve(o.root));
    const configFile = path.resolve(o.configFile ?? configPath(stateDir));
    const config = loadConfig(configFile);
    const d = new ServeDaemon({ ...o, root, stateDir, configFile }, config);
    if (config.clients.size === 0) o.events?.info?.(`warning: ${configFile} authorizes no client yet: every session will be refused`);
    await d.listen();
    return d;
  }

  /** Sessions running now. */
  get sessions(): number {
    return this.running.size;
  }

  /** SIGHUP: re-read the config; a bad file keeps the previous one (and says why). */
  reload(): { ok: boolean; message: string } {
    try {
      this.config = loadConfig(this.o.configFile);
      return { ok: true, message: `reloaded ${this.o.configFile}: ${this.config.clients.size} clients, ${this.config.revoked.size} revoked` };
    } catch (e) {
      return { ok: false, message: `${(e as Error).message}; keeping the previous configuration` };
    }
  }

  /**
   * SIGTERM: stop accepting, let running sessions finish for `graceMs`, then end the rest
   * (a push in progress keeps its verified partial for a resume; nothing half-written
   * replaces a file, and a tree's deletions only ever run after every transfer succeeded).
   */
  async shutdown(graceMs: number): Promise<{ finished: number; aborted: number }> {
    this.stopping = true;
    for (const close of this.closeListeners.splice(0)) close();
    await Promise.allSettled(this.acceptLoops);
    const all = [...this.running];
    let timer: NodeJS.Timeout | undefined;
    const graceOver = new Promise<'grace'>((r) => (timer = setTimeout(() => r('grace'), graceMs)));
    await Promise.race([Promise.allSettled(all.map((s) => s.done)), graceOver]);
    clearTimeout(timer);
    const left = [...this.running];
    for (const s of left) s.abort(`the server is shutting down (its ${Math.round(graceMs / 1000)} s grace period ended); rerun to resume`);
    await Promise.allSettled(left.map((s) => s.done));
    return { finished: all.length - left.length, aborted: left.length };
  }

  private async listen(): Promise<void> {
    const { host = '0.0.0.0', port } = this.o;
    const id = loadOrCreateIdentity(this.o.stateDir);
    const tls = await tlsListen(host, port, id, this.tlsFailureNotices(), {
      handshakeTimeoutMs: this.handshakes.deadlineMs,
      onConnection: (raw) => (this.stopping ? raw.destroy() : this.handshakes.admit(raw)),
    });
    this.closeListeners.push(() => tls.close());
    let quic: QuicListener | undefined;
    if (this.o.quic) {
      quic = await QuicListener.bind(host, tls.port, id, { idleMs: this.o.timeoutMs ?? 60_000 });
      this.closeListeners.push(() => quic!.close());
    }
    this.o.events?.listening?.(tls.host, tls.port, quic?.port);
    const timeoutMs = this.o.timeoutMs ?? 60_000;
    this.acceptLoop(
      () => tls.accept(),
      (sock) => `${sock.remoteAddress}:${sock.remotePort}`,
      (sock, entry, register) => this.acceptTls(sock, entry, register, timeoutMs),
    );
    if (quic) {
      const q = quic;
      this.acceptLoop(
        () => q.acceptNext(),
        (s) => s.label,
        (s, entry, register) =>
          // The session rides the connection's first stream, as in a one-session receive.
          overQuic(s, 'accept', timeoutMs, (conn, stream) => {
            register(conn);
            return this.session(conn, stream, entry);
          }),
      );
    }
  }

  /** Reports failed TLS handshakes: a flood of them must not become a flood of notices, so
   * the first 10, then one per 1,000. */
  private tlsFailureNotices(): (e: Error, remote: string) => void {
    let failures = 0;
    let reported = 0;
    return (e, remote) => {
      failures++;
      if (failures <= 10 || failures - reported >= 1000) {
        reported = failures;
        this.o.events?.info?.(`TLS handshake with ${remote} failed: ${e.message}${failures > 10 ? ` (${failures} so far)` : ''}`);
      }
    };
  }

  /** A TLS connection whose handshake finished: its pre-authentication ticket says whether the
   * client's certificate is one of ours, and the session starts. */
  private acceptTls(sock: SecureStream, entry: SessionLog, register: (conn: FramedConnection) => void, timeoutMs: number): Promise<unknown> {
    const ticket = this.handshakes.claim(sock);
    if (!ticket) {
      // Pushed out of the pre-authentication budget while its TLS handshake finished.
      sock.destroy();
      entry.ok = false;
      entry.exitCode = ExitCode.SOCKET_IO;
      entry.error = 'dropped: too many connections were handshaking';
      return Promise.reject(new FfsyncError('EBUSY', ExitCode.SOCKET_IO, entry.error));
    }
    ticket.sock = sock;
    noteHandshake(sock, Date.now() - ticket.t0);
    let fp: string | undefined;
    try {
      fp = peerFingerprint(sock);
    } catch {
      fp = undefined;
    }
    ticket.authenticated = fp !== undefined && this.config.clients.has(fp) && !this.config.revoked.has(fp);
    const conn = new FramedConnection(sock, timeoutMs);
    register(conn);
    return this.session(conn, sock, entry, ticket);
  }

  /** Takes connections until the listener closes; each becomes a tracked session. */
  private acceptLoop<C>(next: () => Promise<C>, label: (c: C) => string, run: (c: C, entry: SessionLog, register: (conn: FramedConnection) => void) => Promise<unknown>): void {
    this.acceptLoops.push(
      (async () => {
        for (;;) {
          let c: C;
          try {
            c = await next();
          } catch {
            return; // closed
          }
          this.track(label(c), (entry, register) => run(c, entry, register));
        }
      })(),
    );
  }

  /** Runs one session with its log entry; `register` hands over the connection to abort. */
  private track(remote: string, body: (entry: SessionLog, register: (c: FramedConnection) => void) => Promise<unknown>): void {
    const entry = sessionLog(this.nextId++, remote);
    let conn: FramedConnection | undefined;
    let abortReason: string | undefined;
    const running: Running = {
      entry,
      abort: (reason) => {
        abortReason = reason;
        if (conn) void dropWithReason(conn, reason);
      },
      done: Promise.resolve(),
    };
    running.done = (async () => {
      try {
        await body(entry, (c) => {
          conn = c;
          if (abortReason) void dropWithReason(c, abortReason);
        });
      } catch {
        // recorded in the entry by session()
      } finally {
        if (abortReason && !entry.ok) entry.error = entry.error ? `${abortReason} (${entry.error})` : abortReason;
        entry.durationMs = Date.now() - entry.startedAt;
        this.running.delete(running);
        this.o.events?.session?.(entry);
        if (this.running.size === 0) {
          // Idle again: give a burst's memory back (V8 otherwise keeps the heap it grew).
          // Twice: at 1 s, and again once the connections' close grace (2 s) let go of the
          // last sockets and their buffers.
          clearTimeout(this.idleGc);
          const collect = (then?: number) => {
            this.idleGc = setTimeout(() => {
              if (this.running.size > 0) return;
              collectGarbage();
              if (then) collect();
            }, then ?? IDLE_GC_AGAIN_MS);
            this.idleGc.unref();
          };
          collect(1000);
        }
      }
    })();
    this.running.add(running);
  }

  private async session(conn: FramedConnection, sock: SecureStream, entry: SessionLog, ticket?: Ticket): Promise<SyncSummary> {
    let release: (() => void) | undefined;
    let handedOver = false;
    let slot = false;
    const t0 = ticket?.t0 ?? Date.now();
    const deadlineMs = this.handshakes.deadlineMs;
    let deadline: NodeJS.Timeout | undefined;
    try {
      entry.client = peerFingerprint(sock);
      // Until the REQUEST is authorized the client has `deadlineMs` from its TCP connect, TLS
      // included; KEEPALIVE does not extend it (and before HELLO it is a protocol error).
      const overdue = new Promise<never>((_, reject) => {
        deadline = setTimeout(
          () => reject(new FfsyncError('ETIMEDOUT', ExitCode.TIMEOUT, `handshake not completed within ${deadlineMs / 1000} s of connecting (HELLO, REQUEST)`)),
          Math.max(0, t0 + deadlineMs - Date.now()),
        );
      });
      overdue.catch(() => undefined);
      const { negotiated, op, rel, verdict } = await Promise.race([this.preAuth(conn, entry), overdue]);
      clearTimeout(deadline);
      if (ticket) this.handshakes.leave(ticket);
      entry.clientNote = verdict.client.note || undefined;
      // Only now, authenticated and authorized, does the client take a session slot.
      this.takeSlot();
      slot = true;
      const abs = await resolveUnderRoot(this.o.root, rel, op);
      release = await this.lockPath(conn, rel, op, entry);
      if (this.stopping) throw new FfsyncError('ESHUTDOWN', ExitCode.SOCKET_IO, 'the server is shutting down; rerun to sync');
      await conn.send(FrameType.ACCEPT);
      handedOver = true;
      return await this.serveRequest(conn, sock, entry, negotiated, op, rel, abs);
    } catch (e) {
      throw await this.sessionFailed(conn, entry, e, handedOver);
    } finally {
      clearTimeout(deadline);
      if (ticket) this.handshakes.leave(ticket);
      release?.();
      if (slot) this.active--;
      conn.destroy();
    }
  }

  /** A session slot for an authorized client, or EBUSY: too many sessions, or the memory
   * budget taken. */
  private takeSlot(): void {
    const max = this.o.maxSessions ?? 64;
    if (this.active >= max) throw new FfsyncError('EBUSY', ExitCode.UNTRUSTED, `server busy: ${max} sessions are running; retry later`);
    const budget = this.o.maxMemoryBytes ?? 1024 * 1024 * 1024;
    const rss = process.memoryUsage.rss();
    if ((this.active + 1) * SESSION_MEMORY_ESTIMATE > budget || rss > budget) {
      throw new FfsyncError('EBUSY', ExitCode.UNTRUSTED, `server busy: its memory budget (${Math.round(budget / 1048576)} MiB) is taken by ${this.active} sessions; retry later`);
    }
    this.active++;
  }

  /** Waits for conflicting sessions to leave the path (KEEPALIVEs keep the client from timing
   * out meanwhile) and returns the lock's release. A client that leaves while waiting withdraws
   * its request at once: it would otherwise keep its slot, and its place in the queue, until
   * its turn came. */
  private async lockPath(conn: FramedConnection, rel: string, op: 'push' | 'pull', entry: SessionLog): Promise<() => void> {
    const waitFrom = Date.now();
    const withdraw = new AbortController();
    const acquiring = this.locks.acquire(rel, op === 'push' ? 'write' : 'read', withdraw.signal);
    acquiring.catch(() => undefined);
    await conn.keepAlive(conn.orFailure(acquiring.then(() => undefined)));
    const release = await Promise.race([acquiring, Promise.resolve(undefined)]);
    if (!release) withdraw.abort();
    if (!release || conn.isClosed || conn.failedWith) {
      release?.();
      throw conn.failedWith ?? new PeerClosedError('while it waited for the lock on its path');
    }
    entry.lockWaitMs = Date.now() - waitFrom;
    return release;
  }

  /** Logs why a session failed and returns the error to throw; before ACCEPT nothing else
   * speaks for us, so it also tells the client why and hangs up. */
  private async sessionFailed(conn: FramedConnection, entry: SessionLog, e: unknown, handedOver: boolean): Promise<FfsyncError> {
    const err = e instanceof FfsyncError ? e : fromSystemError(e, 'session failed');
    entry.ok = false;
    entry.exitCode = err.exitCode;
    entry.error = err.message;
    const s = err.summary as SyncSummary | undefined;
    if (s) fill(entry, s);
    if (!handedOver) {
      if (!(e instanceof PeerClosedError)) await reportError(conn, err);
      entry.bytesOnWire = { sent: conn.bytesSent, received: conn.bytesReceived };
      await conn.close(500).catch(() => undefined);
    }
    return err;
  }

  /** HELLO, REQUEST and authorization: everything before a session slot is taken. */
  private async preAuth(conn: FramedConnection, entry: SessionLog) {
    const negotiated = await daemonHandshake(conn);
    const f = await expect(conn, FrameType.REQUEST, FrameType.OFFER);
    if (f.type === FrameType.OFFER) {
      throw new FfsyncError('EUSAGE', ExitCode.USAGE, 'this is a serve daemon: address a path under its root, e.g. host:port/some/path');
    }
    const req = decodeRequest(f.payload);
    const op: Access = req.op === RequestOp.PUSH ? 'push' : 'pull';
    entry.op = op;
    entry.path = req.path;
    if ((op === 'push') !== (negotiated.role === Role.RECEIVER)) throw new FfsyncError('EPROTOROLE', ExitCode.PROTOCOL_STREAM, `a ${op} REQUEST from a client whose HELLO said otherwise`);
    const rel = normalizeRequestPath(req.path);
    entry.path = rel;
    // The config in force when the request arrives decides (a reload affects later sessions).
    const verdict = authorize(this.config, entry.client!, op, rel);
    if (!verdict.ok) throw new FfsyncError(verdict.code, ExitCode.UNTRUSTED, `refused: ${verdict.reason}`);
    return { negotiated, op, rel, verdict };
  }

  private async serveRequest(
    conn: FramedConnection,
    sock: SecureStream,
    entry: SessionLog,
    negotiated: Awaited<ReturnType<typeof daemonHandshake>>,
    op: Access,
    rel: string,
    abs: string,
  ): Promise<SyncSummary> {
    const t0 = Date.now();
    let summary: SyncSummary;
    if (op === 'push') {
      summary = await runReceiver(conn, {
        path: abs,
        target: abs,
        port: 0,
        stateDir: this.o.stateDir,
        timeoutMs: this.o.timeoutMs,
        negotiated,
        tree: {},
        fsync: this.o.fsync,
        resolveTarget: (kind) => prepareTarget(this.o.root, rel, abs, kind),
      });
      entry.bytesWritten = summary.tree ? summary.tree.transferBytes : summary.upToDate ? 0 : summary.size;
    } else {
      const st = await statSource(abs);
      summary = await runSender(conn, {
        path: abs,
        host: sock.remoteAddress ?? 'client',
        port: sock.remotePort ?? 0,
        stateDir: this.o.stateDir,
        timeoutMs: this.o.timeoutMs,
        compressLevel: this.o.compressLevel,
        negotiated,
        st,
        t0,
        handshakeMs: handshakeMs(sock),
      });
      entry.bytesRead = summary.literalBytes;
    }
    fill(entry, summary);
    entry.ok = true;
    return summary;
  }
}

function fill(entry: SessionLog, s: SyncSummary): void {
  entry.bytesOnWire = { ...s.bytesOnWire };
  entry.kind = s.tree ? 'tree' : 'file';
  entry.size = s.tree ? s.tree.bytes : s.size;
  entry.literalBytes = s.literalBytes;
  if (s.tree) {
    entry.files = s.tree.files;
    entry.written = s.tree.written;
    entry.deleted = s.tree.deleted;
  }
}

/** Best effort: an ERROR frame naming why, then the connection is dropped. */
async function dropWithReason(conn: FramedConnection, reason: string): Promise<void> {
  if (!conn.isClosed && !conn.errorSent) {
    conn.errorSent = true;
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([conn.send(FrameType.ERROR, encodeError(ExitCode.SOCKET_IO, 'ESHUTDOWN', reason)).catch(() => undefined), new Promise((r) => (timer = setTimeout(r, 500)))]);
    clearTimeout(timer);
  }
  conn.destroy();
}

/**
 * The absolute path of `rel` under the root, refusing any existing component that is a
 * symbolic link (a link could point outside the root; the daemon never follows one, for
 * reading or writing). Pulls need the path to exist.
 */
export async function resolveUnderRoot(root: string, rel: string, op: Access): Promise<string> {
  const segs = rel ? rel.split('/') : [];
  let at = root;
  for (let i = 0; i < segs.length; i++) {
    at = path.join(at, segs[i]);
    const st = await fs.lstat(at).catch((e: NodeJS.ErrnoException) => {
      if (e.code === 'ENOENT' || e.code === 'ENOTDIR') return undefined;
      throw fromSystemError(e, `cannot inspect ${rel}`);
    });
    if (!st) {
      if (op === 'pull') throw new FfsyncError('ENOENT', ExitCode.FILE_SELECTION, `'${rel}' does not exist on the server`);
      break; // a push creates the rest
    }
    if (st.isSymbolicLink()) throw new FfsyncError('ESYMLINK', ExitCode.FILE_SELECTION, `'${segs.slice(0, i + 1).join('/')}' is a symbolic link on the server; serve never follows links under its root`);
    if (i < segs.length - 1 && !st.isDirectory()) throw new FfsyncError('ENOTDIR', ExitCode.FILE_SELECTION, `'${segs.slice(0, i + 1).join('/')}' is not a directory on the server`);
  }
  return path.join(root, ...segs);
}

/** A push's target, once the offer says file or tree: its missing parents are created
 * (inside the root, links refused again now that we are about to write). */
async function prepareTarget(root: string, rel: string, abs: string, kind: 'file' | 'tree'): Promise<string> {
  if (kind === 'file' && rel === '') throw new FfsyncError('EISDIR', ExitCode.FILE_SELECTION, 'a single file cannot replace the server root: address a file path under it');
  await resolveUnderRoot(root, rel, 'push');
  const segs = rel ? rel.split('/') : [];
  // Created from a handle of the root, component by component, never through a link
  // (crates/ffsync_core/src/beneath.rs): a link planted since the check above is refused.
  try {
    await ensureDirBeneath(root, segs.slice(0, -1).join('/'), true);
  } catch (e) {
    throw new FfsyncError('ENOTDIR', ExitCode.FILE_SELECTION, `cannot create '${rel}' on the server: ${(e as Error).message}`);
  }
  if (kind === 'file') await checkTarget(abs);
  else {
    const st = await fs.lstat(abs).catch(() => undefined);
    if (st && !st.isDirectory()) throw new FfsyncError('ENOTDIR', ExitCode.FILE_SELECTION, `'${rel}' exists on the server and is not a directory`);
  }
  return abs;
}
