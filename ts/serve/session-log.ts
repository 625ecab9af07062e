// The daemon's log: one JSON object per session, written as one line when the session
// ends (accepted or refused), so fleets can grep and aggregate it. Fields are documented
// in docs/cli.md ("Serving many clients").

export interface SessionLog {
  event: 'session';
  id: number;
  /** When the connection arrived (ms since the epoch; logged as ISO `start`). */
  startedAt: number;
  remote: string;
  /** Client certificate fingerprint (absent if the TLS handshake gave none). */
  client?: string;
  /** The note of the client's line in serve-clients.conf. */
  clientNote?: string;
  op?: 'push' | 'pull';
  /** Path under the root, normalized. */
  path?: string;
  kind?: 'file' | 'tree';
  /** Bytes of the file or tree synced. */
  size?: number;
  /** Push: bytes of the files the session rewrote. */
  bytesWritten: number;
  /** Pull: bytes of file content read and sent as data. */
  bytesRead: number;
  /** Content bytes that crossed as data (the rest was reused). */
  literalBytes: number;
  bytesOnWire: { sent: number; received: number };
  /** Time spent waiting for a conflicting session on the same path to end. */
  lockWaitMs: number;
  files?: number;
  written?: number;
  deleted?: number;
  durationMs: number;
  ok: boolean;
  exitCode: number;
  error?: string;
}

export function sessionLog(id: number, remote: string): SessionLog {
  const now = Date.now();
  return {
    event: 'session',
    id,
    startedAt: now,
    remote,
    // Placeholders keep the logged field order stable (undefined ones are not printed).
    client: undefined,
    clientNote: undefined,
    op: undefined,
    path: undefined,
    ok: false,
    exitCode: 0,
    error: undefined,
    kind: undefined,
    size: undefined,
    bytesWritten: 0,
    bytesRead: 0,
    literalBytes: 0,
    bytesOnWire: { sent: 0, received: 0 },
    lockWaitMs: 0,
    durationMs: 0,
  };
}

/** The line as logged: `startedAt` appears as the ISO time `start`. */
export function formatSessionLog(e: SessionLog): string {
  const { event, id, startedAt, ...rest } = e;
  return JSON.stringify({ event, id, start: new Date(startedAt).toISOString(), ...rest });
}
