// What a sync reports while it runs. The CLI turns these into ora spinners, plain lines
// or JSON events; library users pass their own handlers.

export type Phase = 'scanning' | 'hashing' | 'diffing' | 'sending' | 'receiving' | 'verifying';

export interface SyncEvents {
  listening?(host: string, port: number): void;
  /** TLS: the peer's certificate fingerprint, and whether it was already pinned. */
  peer?(label: string, fingerprint: string, pinned: boolean): void;
  /** `receive` offers a one-time pairing code: `command` is the line to run on the sender. */
  pairing?(code: string, command: string): void;
  phaseStart?(phase: Phase, totalBytes: number): void;
  /** Throttled (native ticker, ~10 Hz). */
  progress?(phase: Phase, doneBytes: number): void;
  phaseEnd?(phase: Phase, doneBytes: number, ms: number): void;
  info?(message: string): void;
  /** Something left out on purpose, in rsync's words (`skipping non-regular file "d/fifo"`):
   * not a failure. `sync` prints it on stdout as rsync does; without a handler it goes to `info`. */
  notice?(message: string): void;
  /** One change of a tree's plan, as listed for `-v` and `--dry-run` (`mkdir   d/`,
   * `send    f (12 bytes)`, `link    l -> t`, `delete  x`…); `dryRun`: it will not happen.
   * Without a handler the line goes to `info` (prefixed `would ` on a dry run). */
  change?(line: string, dryRun: boolean): void;
}

/** Report a plan line through `change`, or `info` when the caller has no change handler. */
export function reportChange(events: SyncEvents | undefined, line: string, dryRun: boolean): void {
  if (events?.change) events.change(line, dryRun);
  else events?.info?.(dryRun ? `would ${line}` : line);
}

export interface SyncSummary {
  ok: boolean;
  role: 'sender' | 'receiver';
  path: string;
  size: number;
  /** The target already had this content (nothing was rewritten). */
  upToDate: boolean;
  /** How the receiver decided: size+mtime, content root, or a full transfer. */
  decidedBy: 'size-mtime' | 'index-root' | 'scan-root' | 'transfer' | 'receiver-newer' | 'size-limit';
  /** Uncompressed bytes that crossed the wire as chunk data. */
  literalBytes: number;
  /** Bytes reused from files the receiver already had. */
  matchedBytes: number;
  /** Receiver, single file: of `matchedBytes`, those copied into place while the sender was
   * still hashing (overlapped phases; 0 when the manifest was not streamed). */
  placedEarlyBytes?: number;
  bytesOnWire: { sent: number; received: number };
  durationMs: number;
  /** Content root (BLAKE3) of the synced file, hex, when known. */
  root?: string;
  /** TLS: the fingerprint of the peer's certificate. */
  peerFingerprint?: string;
  /** Directory trees: what the walk found and what the plan did. */
  tree?: TreeSummary;
}

export interface TreeSummary {
  /** Entries of this peer's walk. */
  entries: number;
  /** Files and bytes of the sender's tree (after excludes). */
  files: number;
  bytes: number;
  dirs: number;
  symlinks: number;
  /** Files whose content root came from this peer's tree index. */
  indexedFiles: number;
  /** The shared plan. */
  unchanged: number;
  decidedByRoot: number;
  smallTransfers: number;
  largeTransfers: number;
  transferBytes: number;
  localCopies: number;
  symlinksToCreate: number;
  attrsOnly: number;
  mkdirs: number;
  toDelete: number;
  keptExtraneous: number;
  /** Files left alone because the receiver's copy is newer (-u). */
  keptNewer: number;
  /** Source files left alone by --max-size / --min-size. */
  sizeSkipped: number;
  skipped: number;
  /** What the plan creates that the receiver lacked (the root included when the target did not
   * exist): rsync's "Number of created files". */
  created: { files: number; dirs: number; symlinks: number };
  /** Connections or streams that carried large files (1 + the extra lanes that joined). */
  lanes: number;
  /** Sender with lanes: bytes sent on each connection by the time the large files were out, the
   * first connection first (it also carried the small files and the file list). */
  laneBytesSent?: number[];
  /** What happened (receiver's count). */
  written: number;
  deleted: number;
  errors: string[];
}

/** Runs a phase and reports start, native progress and end. */
export async function inPhase<T>(events: SyncEvents | undefined, phase: Phase, total: number, run: (progress: (n: number) => void) => Promise<T>): Promise<T> {
  const t0 = Date.now();
  let last = 0;
  events?.phaseStart?.(phase, total);
  const result = await run((n) => {
    last = n;
    events?.progress?.(phase, n);
  });
  events?.phaseEnd?.(phase, total > 0 ? total : last, Date.now() - t0);
  return result;
}

/** A summary for a session that has not succeeded (yet); the roles fill in the rest. */
export function newSummary(role: SyncSummary['role'], path: string, size: number): SyncSummary {
  return {
    ok: false,
    role,
    path,
    size,
    upToDate: false,
    decidedBy: 'transfer',
    literalBytes: 0,
    matchedBytes: 0,
    bytesOnWire: { sent: 0, received: 0 },
    durationMs: 0,
  };
}
