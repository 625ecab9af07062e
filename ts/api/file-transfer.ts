// One file's content conversation, shared by single-file and tree sessions:
//   sender: MANIFEST* [HOLES] -> (receiver) NEED* REFINE* NEED_END -> DATA* DATA_END -> (receiver) RESULT
// HOLES (capability SPARSE) lists the sender's holes: the receiver requests nothing inside
// them and punches them into the result (crates/ffsync_core/src/sparse.rs).
// REFINE (capability REFINE) carries signatures of the receiver's old bytes for each run of
// missing chunks; the sender then sends a chunk as a delta against them when that is smaller
// (crates/ffsync_core/src/refine.rs).
// MANIFEST_STREAM (capability STREAM, overlapped phases): a sender scanning a large file
// sends each window's manifest entries as soon as they are hashed, then the manifest's
// header alone in MANIFEST; meanwhile the receiver copies the chunks it already has into
// place (crates/ffsync_core/src/prefill.rs), so its rebuild overlaps the sender's scan.
// The receiver rebuilds the file out of place, verifies it against the sender's root and
// only then renames it over the target (crates/ffsync_core/src/reconstruct.rs).

import type { LevelGovernor } from './compress-level.js';
import fs from 'node:fs/promises';
import type { BigIntStats } from 'node:fs';
import { FramedConnection, PeerClosedError, workMeter } from '../transport/connection.js';
import { FrameType, protocolError } from '../protocol/frames.js';
import {
  decodeBasis,
  decodeDataEnd,
  decodeNeedEnd,
  encodeBasis,
  decodeResult,
  encodeDataEnd,
  encodeNeedEnd,
  encodeResult,
  ManifestAssembler,
  manifestFrames,
  manifestStreamFrames,
  STREAM_WINDOW,
  MAX_REFINE_TABLE,
  REFINE_PART,
  maxManifestLength,
  NeedCollector,
  needFrames,
  ResultStatus,
} from '../protocol/messages.js';
import {
  type BackupOptions,
  beginPrefill,
  beginReconstruction,
  call,
  decodeManifest,
  fileHoles,
  hasPartial,
  markUpToDate,
  movePartials,
  type NativeChunkSource,
  type NativePrefill,
  type NativeReconstruction,
  openChunkSource,
  openScanStream,
  scanFile,
  type ScanResult,
} from '../native/binding.js';
import { batchByBytes, MANIFEST_ENTRY, MANIFEST_HEADER, manifestChunkCount, manifestChunkLength, manifestParamsKey } from '../utils/manifest.js';
import { ExitCode, FfsyncError } from '../utils/errors.js';
import { BufferPool } from '../utils/buffer-pool.js';
import type { DataTurn, WorkLimit } from '../utils/data-turns.js';
import { expect, expectUnless } from './session.js';
import { inPhase, type SyncEvents } from './events.js';

/** Raw bytes per DATA frame: large enough to amortize framing, small enough to pipeline and
 * to keep both peers' resident memory low (recycled buffers, see BufferPool). */
export const BATCH_BYTES = 2 * 1024 * 1024;
/** Room for a batch plus its record headers. */
export const BATCH_BUFFER = BATCH_BYTES + 64 * 1024;
/** Batches being read/compressed natively ahead of the socket. */
export const READ_AHEAD = 2;
/** Batch buffers one file's DATA phase uses at most (read ahead, and being written). */
export const SEND_BUFFERS = READ_AHEAD + 2;
/** Batch buffers one file's early DATA uses at most (streamManifest's pool). */
const EARLY_BUFFERS = 4;
/** At most this many DATA batches are being verified/written natively at once. */
export const WRITES_IN_FLIGHT = 2;

export interface SendContentOptions {
  path: string | Buffer;
  /** What the file was when the session looked at it (a change later is exit 24). */
  st: BigIntStats;
  /** The manifest, if already known (index); otherwise the file is scanned now. */
  scan: ScanResult | null;
  stateDir?: string;
  checksum?: boolean;
  /** zstd level (0 = raw). */
  level: number;
  bwlimitKiBps?: number;
  events?: SyncEvents;
  /** How to name the file in messages. */
  label: string;
  /** Capability REFINE was negotiated: accept REFINE frames and send deltas. */
  refine?: boolean;
  /** Capability SPARSE was negotiated: send a HOLES frame after the manifest. */
  sparse?: boolean;
  /** Tree session with COMMIT_REFUSAL negotiated: RESULT may say NOT_WRITTEN. */
  commitRefusal?: boolean;
  /** Capability STREAM was negotiated: a file larger than STREAM_WINDOW starts with the
   * receiver's BASIS frame, and (unless `overlap` is false) its manifest is streamed while it
   * is hashed, with early DATA to a receiver that has nothing. */
  stream?: boolean;
  /** Overlapped phases on (default); `send --no-overlap` turns them off. */
  overlap?: boolean;
  /** A multiplexed tree session runs many files' conversations at once: a file sends DATA
   * only in its turn (its read-ahead buffers exist only then), so memory stays flat however
   * many files are in flight. The caller ends the turn if this returns early. */
  dataTurn?: DataTurn;
  /** The session's --bwlimit, shared by every file in flight (else one per file). */
  limiter?: (n: number) => Promise<void>;
  /** Multiplexed: the session's limit on files being hashed at once. */
  hashing?: WorkLimit;
  /** Pipelined on a multiplexed stream: the previous file's conversation on `conn`, which
   * still has its RESULT to read. This file's FILE_BEGIN and manifest go out at once; its
   * first read waits for that. Resolving true (that file spent the stream) or rejecting ends
   * this file with PriorFailed before it read anything. */
  prior?: Promise<boolean>;
  /** Return once DATA_END is out, with the RESULT still to read in `settled`: the next file
   * on the same connection starts meanwhile (results are acknowledged asynchronously). */
  resultLater?: boolean;
  /** Capability BATCH_STREAM was negotiated: chunks of a batch may share zstd streams. */
  batchStream?: boolean;
  /** Adapts the level batch by batch (shared by the session's files); else `level` stays. */
  governor?: LevelGovernor;
}

/** The conversation before this one on the same stream failed (`fatal`: with `cause`) or
 * spent the stream: this file read nothing and may run again on another stream. */
export class PriorFailed extends Error {
  constructor(
    readonly fatal: boolean,
    options?: { cause?: unknown },
  ) {
    super('the previous conversation on this stream did not end cleanly', options);
  }
}

export interface ContentResult {
  root: string;
  upToDate: boolean;
  literalBytes: number;
  matchedBytes: number;
  /** Tree sessions: the receiver could not write this file (its reason, receiver side). */
  refused?: string;
  /** Receiver: bytes copied into place early, while the sender's manifest streamed in. */
  placedEarly?: number;
  /** Sender with `resultLater`: the rest of the conversation (the RESULT); the fields above
   * are placeholders until it settles. */
  settled?: Promise<ContentResult>;
}

/** True unless `a` is the same file in the same state as `b` (size, mtime, ctime, inode, device). */
export function identityChanged(a: BigIntStats | undefined, b: BigIntStats): boolean {
  return !a || a.size !== b.size || a.mtimeNs !== b.mtimeNs || a.ctimeNs !== b.ctimeNs || a.ino !== b.ino || a.dev !== b.dev;
}

/** Sender half. `holder.source` is set once the chunk source is open (callers check
 * `unchanged()` on it to tell a file that changed mid-send). */
export async function sendFileContent(conn: FramedConnection, o: SendContentOptions, holder: { source?: NativeChunkSource } = {}): Promise<ContentResult> {
  try {
    const r = await sendContent(conn, o, holder, o.dataTurn ?? { take: async () => undefined, done: () => undefined });
    o.dataTurn?.done();
    return r;
  } catch (e) {
    // A file that read nothing keeps its turn: it runs again on another stream.
    if (!(e instanceof PriorFailed)) o.dataTurn?.done();
    throw e;
  }
}

/** `work` within the session's hashing limit, if it has one. */
export function hashWithin<T>(limit: WorkLimit | undefined, work: () => Promise<T>): Promise<T> {
  return limit ? limit.run(work) : work();
}

/** The previous conversation on the stream (see `prior`) ended: go on, or stop with PriorFailed. */
export async function afterPrior(prior: Promise<boolean> | undefined): Promise<void> {
  if (!prior) return;
  let spent: boolean;
  try {
    spent = await prior;
  } catch (e) {
    throw new PriorFailed(true, { cause: e });
  }
  if (spent) throw new PriorFailed(false);
}

async function sendContent(conn: FramedConnection, o: SendContentOptions, holder: { source?: NativeChunkSource }, turn: DataTurn): Promise<ContentResult> {
  let scan = o.scan;
  const basisExchanged = Boolean(o.stream) && o.st.size > BigInt(STREAM_WINDOW);
  if (basisExchanged) await afterPrior(o.prior);
  const emptyBasis = basisExchanged && decodeBasis((await expect(conn, FrameType.BASIS)).payload).empty;
  const streamed = !scan && basisExchanged && o.overlap !== false;
  const limiter = o.limiter ?? (o.bwlimitKiBps ? rateLimiter(o.bwlimitKiBps * 1024) : undefined);
  const early = { chunks: 0, raw: 0 };
  // Early DATA (to an empty basis) is data: it waits for its turn like the DATA phase does,
  // holding the buffers it may use (EARLY_BUFFERS).
  if (streamed && emptyBasis) await turn.take(EARLY_BUFFERS);
  // To an empty basis every chunk moves, most of them while the file is still being hashed
  // (early DATA): the sending phase starts now, over the whole file, and runs beside hashing,
  // so progress shows the bytes actually moving instead of a frozen hash and "sending 0 B".
  const sendingEarly = streamed && emptyBasis ? { t0: Date.now() } : undefined;
  if (sendingEarly) o.events?.phaseStart?.('sending', Number(o.st.size));
  if (!scan) {
    // KEEPALIVEs carry the bytes hashed: the receiver counts them as progress (§4.11).
    const hashed = workMeter();
    scan = await conn.keepAlive(
      inPhase(o.events, 'hashing', Number(o.st.size), (p, progress = hashed.tap(p)) =>
        streamed
          ? streamManifest(conn, o, progress, emptyBasis, early, limiter)
          : hashWithin(o.hashing, () => scanFile(o.path, { stateDir: o.stateDir, ignoreIndex: o.checksum, onProgress: progress })),
      ),
      hashed,
    );
  }
  if (BigInt(scan.size) !== o.st.size) {
    throw new FfsyncError('EVANISHED', ExitCode.VANISHED, `source ${o.label} changed size while it was being scanned; rerun to send the new version`);
  }
  // Streamed: the entries went ahead; the header (size, parameters, count, root) closes them.
  const manifestOut = streamed ? scan.manifest.subarray(0, MANIFEST_HEADER) : scan.manifest;
  for (const part of manifestFrames(manifestOut)) await conn.send(FrameType.MANIFEST, part);
  // A file that cannot be asked for its holes has none to tell (a file that vanished is
  // reported below, by the identity check, as exit 24).
  if (o.sparse) await conn.send(FrameType.HOLES, await fileHoles(o.path).catch(() => Buffer.alloc(4)));

  if (!basisExchanged) await afterPrior(o.prior);
  const needs = new NeedCollector(manifestChunkCount(scan.manifest));
  const refineParts: Buffer[] = [];
  let refineBytes = 0;
  let end;
  for (;;) {
    const f = o.refine ? await expect(conn, FrameType.NEED, FrameType.REFINE, FrameType.NEED_END) : await expect(conn, FrameType.NEED, FrameType.NEED_END);
    if (f.type === FrameType.NEED) needs.push(f.payload);
    else if (f.type === FrameType.REFINE) {
      refineBytes += f.payload.length;
      if (refineBytes > MAX_REFINE_TABLE) throw protocolError(`refinement table of ${o.label} is over ${MAX_REFINE_TABLE} bytes`);
      refineParts.push(Buffer.from(f.payload));
      f.release?.();
    } else {
      end = decodeNeedEnd(f.payload);
      break;
    }
  }
  if (end.refused) return { root: scan.root, upToDate: false, literalBytes: 0, matchedBytes: 0, refused: 'refused by the receiver' };
  const needed = needs.finish(end.wireChunks);
  // The DATA turn comes before the source is checked again: a file that changed while it
  // waited is caught here. It holds one unit per batch buffer this file will use.
  const batches = batchByBytes(scan.manifest, needed, BATCH_BYTES);
  if (needed.length > 0) await turn.take(Math.min(batches.length, SEND_BUFFERS));
  else turn.done();
  // The chunk source must read the version that was scanned: the file is re-checked
  // against the identity it had before the scan (a change during or after it is exit 24).
  const now = await fs.stat(o.path, { bigint: true }).catch(() => undefined);
  if (identityChanged(now, o.st)) {
    throw new FfsyncError('EVANISHED', ExitCode.VANISHED, `source ${o.label} changed or vanished during the sync; rerun to send the new version`);
  }
  const src = await openChunkSource(o.path, scan.manifest, o.governor?.level ?? o.level, o.batchStream);
  const gov = o.governor;
  holder.source = src;
  // Released as soon as the data is out: a long-lived process (serve) must not keep the
  // file open until the object is collected (`unchanged()` still answers afterwards).
  try {
    if (refineParts.length) await conn.keepAlive(call(src.setRefinement(Buffer.concat(refineParts))));
    const total = needed.reduce((a, i) => a + manifestChunkLength(scan!.manifest, i), 0);
    let raw = 0;
    const limit = limiter ?? (async () => undefined);
    // The phase started with the early DATA continues (its count includes it), else one starts.
    const sendingPhase = (run: (progress: (n: number) => void) => Promise<void>): Promise<void> =>
      sendingEarly
        ? run((n) => o.events?.progress?.('sending', early.raw + n)).then(() => o.events?.phaseEnd?.('sending', early.raw + raw, Date.now() - sendingEarly.t0))
        : inPhase(o.events, 'sending', total, run);
    await sendingPhase(async (progress) => {
      // Batches are encoded natively into recycled buffers, READ_AHEAD at a time, while
      // earlier ones are being written to the socket.
      const pool = new BufferPool(BATCH_BUFFER, SEND_BUFFERS);
      const read = async (k: number) => {
        const buf = await pool.acquire();
        if (gov) src.setLevel(gov.level);
        const res = await call(src.readBatch(batches[k], buf));
        return { buf, res };
      };
      const ahead: Promise<{ buf: Buffer; res: { length: number; rawBytes: number } }>[] = [];
      for (let k = 0; k < Math.min(READ_AHEAD, batches.length); k++) ahead.push(read(k));
      ahead.forEach((p) => p.catch(() => undefined));
      gov?.restartWindow();
      for (let k = 0; k < batches.length; k++) {
        const t0 = performance.now();
        const { buf, res } = await ahead[k];
        const t1 = performance.now();
        if (k + READ_AHEAD < batches.length) {
          const p = read(k + READ_AHEAD);
          p.catch(() => undefined);
          ahead.push(p);
        }
        await conn.send(FrameType.DATA, buf.subarray(0, res.length), () => pool.release(buf));
        raw += res.rawBytes;
        progress(raw);
        if (o.bwlimitKiBps) await conn.orFailure(limit(res.length));
        gov?.observe(t1 - t0, performance.now() - t1, res.length);
      }
    });
    // Early DATA counts too: DATA_END totals every chunk this transfer sent.
    await conn.send(FrameType.DATA_END, encodeDataEnd({ chunks: needed.length + early.chunks, rawBytes: BigInt(raw + early.raw) }));
    // The next file's DATA may go now (not when RESULT comes, a round trip later).
    turn.done();
  } finally {
    src.release();
  }
  const root = scan.root;
  const settle = async (): Promise<ContentResult> => {
    const result = decodeResult((await expect(conn, FrameType.RESULT)).payload);
    if (result.status === ResultStatus.NOT_WRITTEN) {
      if (!o.commitRefusal) throw protocolError('bad RESULT: NOT_WRITTEN outside a tree session with COMMIT_REFUSAL');
      return { root, upToDate: false, literalBytes: 0, matchedBytes: 0, refused: 'could not be written on the receiver' };
    }
    return {
      root,
      upToDate: result.status === ResultStatus.UP_TO_DATE,
      literalBytes: Number(result.literalBytes),
      matchedBytes: Number(result.matchedBytes),
    };
  };
  if (!o.resultLater) return settle();
  const settled = settle();
  settled.catch(() => undefined); // the caller handles it (after this returns)
  return { root, upToDate: false, literalBytes: 0, matchedBytes: 0, settled };
}

/** Scan in windows, sending each window's entries (MANIFEST_STREAM) as soon as it is hashed
 * and, to a receiver with an empty basis, the window's chunks as early DATA (every chunk is
 * proven missing there; batches are encoded natively, a few windows ahead at most). */
async function streamManifest(
  conn: FramedConnection,
  o: SendContentOptions,
  progress: (n: number) => void,
  emptyBasis: boolean,
  early: { chunks: number; raw: number },
  limiter?: (n: number) => Promise<void>,
): Promise<ScanResult> {
  const gov = o.governor;
  const earlyData = emptyBasis ? { level: gov?.level ?? o.level, batchBytes: BATCH_BYTES, stream: o.batchStream } : undefined;
  const stream = await openScanStream(o.path, STREAM_WINDOW, { stateDir: o.stateDir, ignoreIndex: o.checksum, onProgress: progress }, earlyData);
  try {
    // One `next` is always in flight while the previous step is being sent (never two: the
    // steps must arrive in order). Early DATA lands in recycled buffers, released once sent.
    const pool = emptyBasis ? new BufferPool(BATCH_BUFFER, EARLY_BUFFERS) : undefined;
    const nextStep = async () => {
      const buf = pool && (await pool.acquire());
      if (gov) stream.setLevel(gov.level);
      const step = await call(stream.next(buf));
      return { step, buf };
    };
    let pending = nextStep();
    const offered = Number(o.st.size);
    let described = 0;
    gov?.restartWindow();
    for (;;) {
      const t0 = performance.now();
      const { step, buf } = await pending;
      const t1 = performance.now();
      if (step.result) {
        if (buf) pool!.release(buf);
        return step.result;
      }
      pending = nextStep();
      pending.catch(() => undefined);
      if (step.batchLen !== undefined && step.batchLen !== null) {
        if (step.batch) {
          // It did not fit the recycled buffer (never for batches of BATCH_BYTES): sent as is.
          if (buf) pool!.release(buf);
          await conn.send(FrameType.DATA, step.batch);
        } else {
          await conn.send(FrameType.DATA, buf!.subarray(0, step.batchLen), () => pool!.release(buf!));
        }
        early.chunks += step.batchChunks!;
        early.raw += step.batchRaw!;
        o.events?.progress?.('sending', early.raw);
        if (limiter) await conn.orFailure(limiter(step.batchLen));
        gov?.observe(t1 - t0, performance.now() - t1, step.batchLen);
        continue;
      }
      if (buf) pool!.release(buf);
      const part = step.part!;
      for (let at = 0; at < part.length; at += MANIFEST_ENTRY) described += part.readUInt32LE(at);
      // Entries past the offered size would be the receiver's protocol error (exit 12); the
      // file grew between the offer and the scan: that is ours to report, as exit 24.
      if (described > offered) throw new FfsyncError('EVANISHED', ExitCode.VANISHED, `source ${o.label} grew while it was being scanned; rerun to send the new version`);
      for (const f of manifestStreamFrames(part)) await conn.send(FrameType.MANIFEST_STREAM, f);
    }
  } finally {
    stream.release();
  }
}

/** Sleeps as needed so the average rate since the first call stays under `bytesPerSec`. */
export function rateLimiter(bytesPerSec: number): (n: number) => Promise<void> {
  const t0 = Date.now();
  let sent = 0;
  return async (n) => {
    sent += n;
    const ahead = (sent / bytesPerSec) * 1000 - (Date.now() - t0);
    if (ahead > 0) await new Promise((r) => setTimeout(r, ahead));
  };
}

export interface ReceiveContentOptions {
  /** The file to build; with `beneath`, a relative path under that directory. */
  target: string | Buffer;
  /** A tree's root: `target` is resolved beneath it without following any link. */
  beneath?: string;
  size: bigint;
  /** Set on commit; undefined leaves it (a tree synced without -t / -p). */
  mtimeNs: bigint | undefined;
  mode: number | undefined;
  /** Local files whose chunks may be reused (the old target first, if any). */
  localPaths: (string | Buffer)[];
  /** Their manifests, being computed while the sender streams its own. */
  locals: Promise<ScanResult[]>;
  /** The old target is a regular file (not a link): "identical" can be kept in place. */
  targetReusable: boolean;
  stateDir?: string;
  events?: SyncEvents;
  /** Runs right before the rebuilt file is renamed over the target. */
  beforeCommit?: () => void;
  /** Tree sessions: a file we cannot start writing (permission, a name the filesystem
   * cannot hold) is refused in NEED_END and reported, instead of failing the session. */
  refusable?: boolean;
  /** Capability REFINE was negotiated: describe our old bytes in REFINE frames. */
  refine?: boolean;
  /** With `refusable`, COMMIT_REFUSAL was negotiated: a commit that fails for a file I/O
   * reason is answered with RESULT NOT_WRITTEN and reported, not fatal to the session. */
  commitRefusal?: boolean;
  /** Capability SPARSE was negotiated: a HOLES frame follows the manifest. */
  sparse?: boolean;
  /** `--inplace`: write changed ranges into the target through a redo journal. */
  inplace?: boolean;
  /** Capability STREAM was negotiated: the manifest may arrive as MANIFEST_STREAM frames. */
  stream?: boolean;
  /** `false` (`--no-fsync`): rename the verified file without making it durable first. */
  fsync?: boolean;
  /** rsync's -b / --suffix / --backup-dir: the file this one replaces is kept under its
   * backup name (crates/ffsync_core/src/backup.rs). */
  backup?: BackupOptions;
  /** rsync's --partial-dir (crates/ffsync_core/src/partial_dir.rs): partials of this file
   * kept by an earlier attempt are taken from there first, and one this attempt keeps goes there. */
  partialDir?: string;
}

/** Early placement while MANIFEST_STREAM frames (and early DATA) arrive: one chain of
 * native calls, in order. While the entries so far are exactly the old target's, nothing is
 * placed: a file whose content is unchanged (only its mtime differs) must not cost a copy
 * that is thrown away. */
class EarlyPlacement {
  private prefill?: NativePrefill;
  private chain: Promise<void> = Promise.resolve();
  /** Fatal: a malformed stream or early DATA (exit 12), or early DATA we could not store. */
  private failure?: Error;
  private rejectFailed!: (e: Error) => void;
  /** Rejects with the failure the moment it happens: the frame loop races it, so a bad batch
   * ends the session now, not when the next frame arrives. */
  readonly failed = new Promise<never>((_, reject) => (this.rejectFailed = reject));
  private off = false;
  /** The session failed or ended: a drain still waiting for the receiver's own scan must not
   * start placing (a copy that would only be thrown away). */
  private stopped = false;
  /** At least one MANIFEST_STREAM frame came (early DATA may only follow entries). */
  private sawEntries = false;
  /** Entries held back while they equal the old target's, and where they end in its list. */
  private held: Buffer[] = [];
  private heldBytes = 0;
  private sameAsTarget: boolean;
  /** Early DATA is counted, not placed (a tree file that will be refused). */
  private discarding = false;
  /** Early DATA taken so far (for DATA_END's totals). */
  readonly received = { chunks: 0, raw: 0 };
  /** Bytes copied into place from local files so far. */
  copied = 0;
  private pending = 0;
  constructor(
    private readonly o: ReceiveContentOptions,
    /** We told the sender (BASIS) that we have nothing: early DATA will come. */
    private readonly expectData: boolean,
  ) {
    this.failed.catch(() => undefined); // reported through `failure` when nobody races it
    // Nothing local to place from and no early DATA, or --inplace (never a whole copy).
    this.off = o.inplace === true || (o.localPaths.length === 0 && !expectData);
    // localPaths[0] is the old target whenever it is reusable and there is a basis at all
    // (`-W` keeps the target but builds from nothing).
    this.sameAsTarget = o.targetReusable && o.localPaths.length > 0;
  }

  /** Entries waiting for the chain: taken all at once, so a backlog (the receiver's own scan
   * finished after several windows arrived) becomes one parallel placement, not many. */
  private queued: Buffer[] = [];

  add(part: Buffer): void {
    this.sawEntries = true;
    if (this.off) return;
    this.queued.push(part);
    if (this.queued.length > 1) return; // a drain is already scheduled
    this.chain = this.chain.then(async () => {
      if (this.off || this.failure || this.stopped) return;
      try {
        const scanned = await this.o.locals;
        if (this.stopped) return;
        const entries = this.queued.length === 1 ? this.queued[0] : Buffer.concat(this.queued);
        this.queued = [];
        if (this.sameAsTarget) {
          const old = scanned[0].manifest;
          const at = MANIFEST_HEADER + this.heldBytes;
          if (old.length >= at + entries.length && old.subarray(at, at + entries.length).equals(entries)) {
            this.held.push(entries);
            this.heldBytes += entries.length;
            return;
          }
          this.sameAsTarget = false;
          if (this.heldBytes) await this.place(scanned, Buffer.concat(this.held));
          this.held = [];
        }
        await this.place(scanned, entries);
      } catch (e) {
        // Entries that cannot belong to the offered file are the sender's fault (exit 12);
        // anything else (a local scan that failed, no room for the temp file) only ends
        // early placement: the normal plan reports it, if it matters, with its own error.
        const code = (e as FfsyncError).code;
        if (code === 'EMALFORMED') this.fail(protocolError(`bad MANIFEST_STREAM: ${(e as Error).message}`));
        // A tree file we cannot write (permission, a name the filesystem refuses) is
        // refused after the manifest like any other; its early DATA is counted and dropped.
        else if (this.expectData && this.o.refusable && code !== 'ENOSPC') this.discarding = true;
        else if (this.expectData) this.fail(e as Error);
        this.off = true;
        this.prefill?.release();
        this.prefill = undefined;
      }
    });
  }

  /** Early DATA (only after BASIS said "empty"): verified and written in place natively.
   * Resolves when at most one more batch is queued (the socket waits meanwhile). */
  async addBatch(batch: Buffer, release?: () => void): Promise<void> {
    if (!this.expectData) {
      release?.();
      throw protocolError('DATA before the manifest is complete, but the receiver did not ask for early DATA');
    }
    if (!this.sawEntries) {
      release?.();
      throw protocolError('bad early DATA: it came before any MANIFEST_STREAM entry');
    }
    this.pending++;
    const p = (this.chain = this.chain.then(async () => {
      try {
        if (this.failure) return;
        if (this.discarding) {
          const n = countRecords(batch);
          this.received.chunks += n.chunks;
          this.received.raw += n.raw;
          return;
        }
        if (this.off || !this.prefill) throw new FfsyncError('EIO', ExitCode.FILE_IO, 'early DATA arrived but could not be placed');
        const r = await call(this.prefill.addBatch(batch));
        this.received.chunks += r.chunks;
        this.received.raw += r.rawBytes;
        this.o.events?.progress?.('receiving', this.received.raw);
      } catch (e) {
        const code = (e as FfsyncError).code;
        // A chunk that fails its hash keeps its code: the sender may say its source changed.
        if (code === 'ECHUNK') this.fail(new FfsyncError('ECHUNK', ExitCode.PROTOCOL_STREAM, `bad early DATA: ${(e as Error).message}`));
        else this.fail(code === 'EMALFORMED' ? protocolError(`bad early DATA: ${(e as Error).message}`) : (e as Error));
      } finally {
        release?.();
        this.pending--;
      }
    }));
    if (this.pending > WRITES_IN_FLIGHT) await p;
    if (this.failure) throw this.failure;
  }

  private async place(scanned: ScanResult[], entries: Buffer): Promise<void> {
    if (!this.prefill) {
      this.prefill = await beginPrefill(
        this.o.target,
        Number(this.o.size),
        this.o.localPaths.map((p, i) => ({ path: p, manifest: scanned[i].manifest })),
        this.o.beneath,
        this.o.fsync,
      );
    }
    if (!this.prefill.active) {
      this.off = true;
      return;
    }
    this.copied += await call(this.prefill.addEntries(entries));
  }

  private fail(e: Error): void {
    if (this.failure) return;
    this.failure = e;
    this.rejectFailed(e);
  }

  /** The reason placement failed, if it did, else `e`: a sender whose early DATA was bad
   * and who then hung up is reported for its data, not for hanging up. */
  async failureOr(e: unknown): Promise<unknown> {
    await this.chain.catch(() => undefined);
    return this.failure ?? e;
  }

  /** Waits for placement to finish; the prefill to adopt, if any. */
  async done(): Promise<NativePrefill | undefined> {
    await this.chain;
    if (this.failure) throw this.failure;
    return this.prefill;
  }

  /** Error paths: no new placement starts; resolves once the native calls in flight ended. */
  async stop(): Promise<void> {
    this.stopped = true;
    await this.chain.catch(() => undefined);
  }

  /** Placement is still running (not yet handed to the reconstruction). Only after `stop` or
   * `done`: `active` waits for a native placement call in progress. */
  get placing(): boolean {
    return this.prefill?.active === true;
  }

  /** Ends placement (after `done`, or on an error path): removes an unadopted file, or keeps
   * it for a resume after a dropped connection. */
  async release(keep = false): Promise<void> {
    await this.stop();
    this.prefill?.release(keep);
  }
}

/** Receiver half. A dropped connection keeps the verified partial for a resume. */
export async function receiveFileContent(conn: FramedConnection, o: ReceiveContentOptions): Promise<ContentResult> {
  // What an earlier attempt kept in --partial-dir goes back beside the target, where the
  // checks below (BASIS, early placement, the resume) look for it.
  if (o.partialDir) await movePartials(o.target, o.beneath, o.partialDir, true);
  const maxLength = maxManifestLength(o.size);
  const assembler = new ManifestAssembler(maxLength);
  // Large files with STREAM: tell the sender first whether we have anything to build from
  // (old file, --from files, a partial to resume); with nothing, it sends DATA early.
  let emptyBasis = false;
  if (o.stream && o.size > BigInt(STREAM_WINDOW)) {
    emptyBasis = o.localPaths.length === 0 && !o.inplace && !hasPartial(o.target, o.beneath);
    await conn.send(FrameType.BASIS, encodeBasis({ empty: emptyBasis }));
  }
  const early = new EarlyPlacement(o, emptyBasis);
  let keep = false;
  let failed = false;
  try {
    return await receiveWithPlacement(conn, o, assembler, maxLength, early);
  } catch (e) {
    failed = true;
    // A connection lost while the manifest was still streaming keeps what was placed (a
    // fresh transfer's early DATA is most of it) for the rerun to resume from.
    await early.stop();
    keep = connectionLost(e) && early.placing;
    if (keep && e instanceof FfsyncError) throw new FfsyncError(e.code, e.exitCode, `${e.message}; partial file kept, rerun the same command to resume`, { cause: e });
    throw e;
  } finally {
    await early.release(keep);
    // Whatever this attempt kept (a partial, early placement's file) waits in --partial-dir.
    if (failed && o.partialDir) await stashPartials(o, o.partialDir);
  }
}

/** --partial-dir after a failed attempt: the partials it kept move there. One that cannot
 * (a link planted at the directory's name, another filesystem) stays beside its file, where
 * the next attempt finds it too; that is said on stderr, since the attempt's own error is
 * what the session reports. */
async function stashPartials(o: ReceiveContentOptions, dir: string): Promise<void> {
  try {
    await movePartials(o.target, o.beneath, dir, false);
  } catch (e) {
    o.events?.info?.(`warning: the partial file stays beside its target: --partial-dir ${dir}: ${(e as Error).message}`);
  }
}

/** A chunk record's header (§4.7): index u32 | encoding u8 | raw length u32 | payload length u32. */
const RECORD_HEADER = 13;

/** Chunks and raw bytes in a chunk batch, from its record headers alone (§4.7). */
function countRecords(batch: Buffer): { chunks: number; raw: number } {
  let chunks = 0;
  let raw = 0;
  for (let at = 0; at < batch.length; chunks++) {
    if (batch.length - at < RECORD_HEADER) throw protocolError('bad early DATA: truncated record header');
    raw += batch.readUInt32LE(at + 5);
    at += RECORD_HEADER + batch.readUInt32LE(at + 9);
    if (at > batch.length) throw protocolError('bad early DATA: a record runs past the frame');
  }
  return { chunks, raw };
}

/** The session ended without anything being wrong with the data: the connection dropped or
 * went silent, or one side was interrupted (its own signal, or the peer's ERROR saying so).
 * The verified partial is then kept for a rerun to resume from. */
function connectionLost(e: unknown): boolean {
  const err = e instanceof FfsyncError ? e : undefined;
  return e instanceof PeerClosedError || err?.exitCode === ExitCode.SOCKET_IO || err?.exitCode === ExitCode.TIMEOUT || err?.exitCode === ExitCode.SIGNAL;
}

async function receiveWithPlacement(conn: FramedConnection, o: ReceiveContentOptions, assembler: ManifestAssembler, maxLength: number, early: EarlyPlacement): Promise<ContentResult> {
  let manifest: Buffer | undefined;
  const streamed: Buffer[] = [];
  let streamedBytes = 0;
  let streamedSize = 0;
  const size = Number(o.size);
  while (!manifest) {
    let f;
    try {
      f = o.stream ? await expectUnless(conn, early.failed, FrameType.MANIFEST_STREAM, FrameType.MANIFEST, FrameType.DATA) : await expect(conn, FrameType.MANIFEST);
    } catch (e) {
      throw await early.failureOr(e);
    }
    if (f.type === FrameType.MANIFEST) {
      manifest = assembler.push(f.payload);
      continue;
    }
    if (f.type === FrameType.DATA) {
      await early.addBatch(f.payload, f.release);
      continue;
    }
    const entries = Buffer.from(f.payload);
    f.release?.();
    if (entries.length === 0 || entries.length % MANIFEST_ENTRY !== 0) throw protocolError(`MANIFEST_STREAM of ${entries.length} bytes is not whole entries`);
    streamedBytes += entries.length;
    if (MANIFEST_HEADER + streamedBytes > maxLength) throw protocolError('MANIFEST_STREAM entries exceed what the offered file can have');
    for (let at = 0; at < entries.length; at += MANIFEST_ENTRY) {
      const len = entries.readUInt32LE(at);
      streamedSize += len;
      if (len === 0 || streamedSize > size) throw protocolError('MANIFEST_STREAM entries describe more than the offered file');
    }
    streamed.push(entries);
    early.add(entries);
  }
  if (streamed.length) {
    if (manifest.length !== MANIFEST_HEADER) throw protocolError('after MANIFEST_STREAM frames, MANIFEST must carry the header alone');
    manifest = Buffer.concat([manifest, ...streamed]);
  }
  const holes = o.sparse ? Buffer.from((await expect(conn, FrameType.HOLES)).payload) : undefined;
  const info = await decodeManifest(manifest);
  if (BigInt(info.size) !== o.size) throw protocolError(`manifest describes ${info.size} bytes, offer said ${o.size}`);
  const scanned = await o.locals;
  // A file that crossed the 16 MiB parameter threshold between versions is chunked
  // differently on each side: rechunk our copies with the sender's parameters.
  for (let i = 0; i < scanned.length; i++) {
    if (scanned[i].size > 0 && manifestParamsKey(scanned[i].manifest) !== manifestParamsKey(manifest)) {
      const hashed = workMeter();
      scanned[i] = await conn.keepAlive(
        inPhase(o.events, 'hashing', scanned[i].size, (p) => scanFile(o.localPaths[i], { paramsForSize: info.size, onProgress: hashed.tap(p) })),
        hashed,
      );
    }
  }

  if (o.targetReusable && scanned[0]?.root === info.root) {
    // Reported, so that a copy made for nothing (the hold-back failing) would show.
    await early.stop();
    await conn.send(FrameType.NEED_END, encodeNeedEnd({ wireChunks: 0, identical: true }));
    decodeDataEnd((await expect(conn, FrameType.DATA_END)).payload);
    // The sender's mtime and mode only once its end of the session checked out: a sender
    // that goes on with DATA instead (refused, exit 12) must leave the target untouched.
    await markUpToDate(o.target, manifest, o.mtimeNs, o.mode, o.stateDir, o.beneath);
    await conn.send(FrameType.RESULT, encodeResult({ status: ResultStatus.UP_TO_DATE, matchedBytes: o.size, literalBytes: 0n }));
    return { root: info.root, upToDate: true, literalBytes: 0, matchedBytes: Number(o.size), placedEarly: early.copied };
  }

  // Chunks placed while the manifest streamed in are adopted by the plan (if they match it).
  const prefill = await conn.keepAlive(early.done());
  // Plan, request what is missing, rebuild, verify, replace.
  let rec: NativeReconstruction | undefined;
  try {
    let r: NativeReconstruction;
    try {
      r = await conn.keepAlive(
        inPhase(o.events, 'diffing', info.size, () =>
          beginReconstruction(
            o.target,
            manifest!,
            o.localPaths.map((p, i) => ({ path: p, manifest: scanned[i].manifest })),
            (n) => o.events?.progress?.('receiving', n),
            holes,
            o.inplace,
            prefill,
            o.beneath,
            o.fsync,
            o.backup,
          ),
        ),
      );
    } catch (e) {
      const err = e instanceof FfsyncError ? e : undefined;
      if (!o.refusable || err?.exitCode !== ExitCode.FILE_IO || err.code === 'ENOSPC') throw e;
      await conn.send(FrameType.NEED_END, encodeNeedEnd({ wireChunks: 0, identical: false, refused: true }));
      return { root: info.root, upToDate: false, literalBytes: 0, matchedBytes: 0, refused: err.message };
    }
    rec = r;
    const plan = r.summary();
    const needed = r.needed();
    for (const part of needFrames(needed, info.chunks)) await conn.send(FrameType.NEED, part);
    if (o.refine && needed.length > 0 && o.localPaths.length > 0) {
      const table = await conn.keepAlive(call(r.refinement()));
      for (let at = 0; at < table.length; at += REFINE_PART) await conn.send(FrameType.REFINE, table.subarray(at, at + REFINE_PART));
    }
    await conn.send(FrameType.NEED_END, encodeNeedEnd({ wireChunks: needed.length, identical: false }));

    const copying = call(r.copyLocal());
    copying.catch(() => undefined);
    let received = 0;
    await inPhase(o.events, 'receiving', plan.wireBytes, async (progress) => {
      const inflight = new Set<Promise<number>>();
      // A batch that fails (a chunk failing its hash, a full disk) ends the loop at once, not
      // when the next frame arrives (seconds later under --bwlimit): the sender stops sooner,
      // and its verdict on a bad chunk (§7.2) comes while it is still listening.
      let writeFailed!: (e: unknown) => void;
      const failed = new Promise<never>((_, reject) => (writeFailed = reject));
      failed.catch(() => undefined);
      for (;;) {
        const f = await expectUnless(conn, failed, FrameType.DATA, FrameType.DATA_END);
        if (f.type === FrameType.DATA_END) {
          const end = decodeDataEnd(f.payload);
          await Promise.all(inflight);
          // Early DATA is part of the totals (DATA_END counts every chunk this transfer sent).
          const chunks = needed.length + early.received.chunks;
          const raw = received + early.received.raw;
          if (end.chunks !== chunks) throw protocolError(`sender ended after ${end.chunks} of ${chunks} chunks`);
          if (end.rawBytes !== BigInt(raw)) throw protocolError(`sender claims ${end.rawBytes} bytes, ${raw} arrived`);
          break;
        }
        const w = call(r.writeBatch(f.payload)).then((n) => {
          f.release?.();
          received += n;
          progress(received);
          return n;
        });
        inflight.add(w);
        w.then(
          () => inflight.delete(w),
          (e: unknown) => writeFailed(e),
        );
        if (inflight.size >= WRITES_IN_FLIGHT) await Promise.race(inflight);
      }
    });
    await conn.keepAlive(copying);
    o.beforeCommit?.();
    try {
      await conn.keepAlive(inPhase(o.events, 'verifying', info.size, () => call(r.finish(o.mtimeNs, o.mode, o.stateDir))));
    } catch (e) {
      // The fault suite found one immutable large file failing a whole tree session with
      // exit 11 (the files after it never synced) where a file that cannot be written is
      // documented as exit 23, the rest synced. A full disk still fails the session (every
      // later file would fail too), and so does a failed verification (exit 23 or 12).
      const err = e instanceof FfsyncError ? e : undefined;
      if (!o.refusable || !o.commitRefusal || err?.exitCode !== ExitCode.FILE_IO || err.code === 'ENOSPC') throw e;
      rec = undefined;
      r.abort(false);
      await conn.send(FrameType.RESULT, encodeResult({ status: ResultStatus.NOT_WRITTEN, matchedBytes: 0n, literalBytes: 0n }));
      return { root: info.root, upToDate: false, literalBytes: 0, matchedBytes: 0, refused: err.message };
    }
    rec = undefined;
    // Literal = bytes that crossed as data; a refined chunk's copies from our old bytes count as matched.
    const literal = r.literalBytes();
    await conn.send(FrameType.RESULT, encodeResult({ status: ResultStatus.SYNCED, matchedBytes: BigInt(info.size - literal), literalBytes: BigInt(literal) }));
    // Close its files now (not when the object is collected: serve runs for weeks) — after
    // RESULT: dropping the last handle on a replaced large target frees its blocks, which
    // can take the kernel most of a second that the sender need not wait for.
    r.release();
    return { root: info.root, upToDate: false, literalBytes: literal, matchedBytes: info.size - literal, placedEarly: plan.placedBytes };
  } catch (e) {
    if (rec) {
      const err = e instanceof FfsyncError ? e : undefined;
      const lost = connectionLost(e);
      // A dropped connection keeps the verified-so-far partial for the next run;
      // anything else (bad data, full disk, failed verification) removes it.
      rec.abort(lost);
      rec.release();
      if (lost && err) {
        throw new FfsyncError(err.code, err.exitCode, `${err.message}; partial file kept, rerun the same command to resume`, { cause: err });
      }
    }
    throw e;
  }
}
