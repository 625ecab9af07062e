// `ffsync-native pull host:port/some/path <local>`: fetch a file or tree from a `serve`
// daemon with the same delta machinery as a push, in the other direction (the daemon is
// the sender, we are the receiver: out-of-place rebuilds, verified before they replace).

import path from 'node:path';
import { FramedConnection } from '../transport/connection.js';
import { tlsConnect } from '../transport/tls.js';
import { QuicSession } from '../transport/quic.js';
import { loadOrCreateIdentity } from '../security/identity.js';
import { ExitCode, FfsyncError } from '../utils/errors.js';
import { resolveStateDir } from '../utils/state-dir.js';
import type { SyncEvents, SyncSummary } from './events.js';
import { overQuic } from './over-quic.js';
import { type ReceiverContext, runReceiver } from './receive.js';
import { syncTarget } from './sync.js';
import type { TreeReceiveOptions } from './tree-receive.js';

export interface PullOptions {
  host: string;
  port: number;
  /** Path under the daemon's root. */
  remotePath: string;
  /** Where it lands: a file path, an existing directory (a file goes inside it, by its
   * name), or the directory a tree becomes. */
  local: string;
  stateDir?: string;
  checksum?: boolean;
  timeoutMs?: number;
  events?: SyncEvents;
  signal?: AbortSignal;
  trust?: string;
  interactive?: boolean;
  quic?: boolean;
  tree?: TreeReceiveOptions;
  /** `false` (`--no-fsync`): received files are renamed into place without being made durable first. */
  fsync?: boolean;
}

export async function pull(o: PullOptions): Promise<SyncSummary> {
  const stateDir = resolveStateDir(o.stateDir);
  const timeoutMs = o.timeoutMs ?? 60_000;
  const identity = loadOrCreateIdentity(stateDir);
  const name = path.posix.basename(o.remotePath.replace(/\/+$/, ''));
  const localSlash = /[/\\]$/.test(o.local);
  const ctx: ReceiverContext = {
    path: o.local,
    port: 0,
    target: path.resolve(o.local),
    stateDir,
    checksum: o.checksum,
    timeoutMs,
    events: o.events,
    signal: o.signal,
    trust: o.trust,
    interactive: o.interactive,
    tree: o.tree ?? {},
    fsync: o.fsync,
    remotePath: o.remotePath,
    peerLabel: `${o.host}:${o.port}`,
    resolveTarget: (kind) => {
      if (kind === 'file' && !name) throw new FfsyncError('EISDIR', ExitCode.FILE_SELECTION, 'the server root is a directory');
      // A tree becomes `local` itself; a file goes inside `local` if that is a directory.
      return syncTarget(o.local, localSlash, name, kind, true);
    },
  };
  if (o.quic) {
    const session = await QuicSession.connect(o.host, o.port, identity, { timeoutMs: Math.min(timeoutMs, 10_000), idleMs: timeoutMs });
    return overQuic(session, 'open', timeoutMs, (conn, stream) => runReceiver(conn, { ...ctx, secure: stream }));
  }
  const sock = await tlsConnect(o.host, o.port, identity);
  return runReceiver(new FramedConnection(sock, timeoutMs), { ...ctx, secure: sock });
}
