// The sender's half of one file's content conversation, shared by single-file and tree
// sessions (docs/protocol.md §3.2, §4.4–§4.9):
//   MANIFEST* [HOLES] -> (receiver) NEED* REFINE* NEED_END -> DATA* DATA_END -> (receiver) RESULT
// HOLES (capability SPARSE) lists the sender's holes: the receiver requests nothing inside
// them (crates/ffsync_core/src/sparse.rs). REFINE (capability REFINE) carries signatures of
// the receiver's old bytes for each run of missing chunks; a chunk then goes as a delta
// against them when that is smaller (crates/ffsync_core/src/refine.rs). MANIFEST_STREAM
// (capability STREAM, overlapped phases): a sender scanning a large file sends each window's
// entries as soon as they are hashed, then the manifest's header alone in MANIFEST, and to an
// empty basis each window's chunks as early DATA. The receiver's half is content-receive.ts.

import { nowMs } from '../utils/clock.js';
import type { LevelGovernor } from './compress-level.js';
import type { BigIntStats } from 'node:fs';
import { FramedConnection, workMeter } from '../transport/connection.js';
import { FrameType, protocolError } from '../protocol/frames.js';
import {
  decodeBasis,
  decodeNeedEnd,
  decodeResult,
  encodeDataEnd,
  manifestFrames,
  manifestStreamFrames,
  STREAM_WINDOW,
  MAX_REFINE_TABLE,
  NeedCollector,
  ResultStatus,
} from '../protocol/messages.js';
import {
  call,
  fileHoles,
  type NativeChunkSource,
  openChunkSource,
  openScanStream,
  scanFile,
  type ScanResult,
} from '../native/binding.js';
import { batchByBytes, MANIFEST_ENTRY, MANIFEST_HEADER, manifestChunkCount, manifestChunkLength } from '../utils/manifest.js';
import { ExitCode, FfsyncError } from '../utils/errors.js';
import { BufferPool } from '../utils/buffer-pool.js';
import type { DataTurn, WorkLimit } from '../utils/data-turns.js';
import { type BatchRamp, RAMP_FIRST_BYTES } from '../utils/batch-ramp.js';
import { expect } from './session.js';
import { inPhase, type SyncEvents } from './events.js';
import { rateLimiter } from '../utils/rate-limit.js';

/** Raw bytes per DATA frame: large enough to amortize framing, small enough to pipeline and
 * to keep both peers' resident memory low (recycled buffers, see BufferPool). */
export const BATCH_BYTES = 2 * 1024 * 1024;
/** Room for a batch plus its record headers. */
export const BATCH_BUFFER = batchBuffer(BATCH_BYTES);
/** Raw bytes per DATA frame when a session's large files go on more than FULL_BATCH_LANES
 * connections: the receiver assembles a frame on every lane at once (each lane carries a share
 * of the link, so each frame takes that much longer to arrive), and eight lanes of 2 MiB frames
 * held 16 MiB of its memory where four held 8 (decisions §120). The receiver's frame pool has
 * buffers of this size (frames.ts, FRAME_POOL_SMALL_BUFFER). */
export const LANE_BATCH_BYTES = 1024 * 1024;
/** Connections a session may send full batches on. */
export const FULL_BATCH_LANES = 4;

/** The DATA batch size of a session whose large files go on `connections` connections. */
export function sessionBatchBytes(connections: number): number {
  return connections > FULL_BATCH_LANES ? LANE_BATCH_BYTES : BATCH_BYTES;
}

/** Batches encoded ahead of the socket when each holds `batchBytes`: READ_AHEAD full batches'
 * worth of bytes whatever the size. With 1 MiB batches and two ahead, the encoder ran dry twice
 * as often behind a socket that took what it had, and the level governor read those waits as
 * compression being the bottleneck: the eight-lane artifact went 5% larger (decisions §120). */
export function readAheadFor(batchBytes: number): number {
  return Math.max(READ_AHEAD, Math.floor((READ_AHEAD * BATCH_BYTES) / batchBytes));
}

/** Room for a batch of `batchBytes` raw bytes plus its record headers. */
export function batchBuffer(batchBytes: number): number {
  return batchBytes + 64 * 1024;
}
/** Batches being read/compressed natively ahead of the socket. */
export const READ_AHEAD = 2;
/** Batch buffers one file's DATA phase uses at most (read ahead, and being written), with full
 * batches; `readAheadFor(batchBytes) + 2` with smaller ones, from the session's buffers when it
 * has them (decisions §120). */
export const SEND_BUFFERS = READ_AHEAD + 2;
/** Batch buffers one file's early DATA uses at most (streamManifest's pool). */
const EARLY_BUFFERS = 4;

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
  /** The session's batch buffers, shared by its files (else this file allocates its own).
   * Fresh 2 MiB buffers per file cost page faults and collections: about a millisecond of
   * the JS thread per file of a tree (decisions §67). */
  buffers?: BufferPool;
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
  /** Capability BATCH_PREFIX was negotiated (with BATCH_STREAM): a batch's stream may start
   * with the previous batch's chunks as history. */
  batchPrefix?: boolean;
  /** Adapts the level batch by batch (shared by the session's files); else `level` stays. */
  governor?: LevelGovernor;
  /** The session's ramp of first batches (shared by its files): the first DATA goes in small
   * batches that grow. Without it every batch is `batchBytes`. */
  ramp?: BatchRamp;
  /** Raw bytes per DATA batch (default BATCH_BYTES; `sessionBatchBytes`). `buffers`, when
   * given, hold `batchBuffer(batchBytes)` bytes each. */
  batchBytes?: number;
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

/** Early DATA's totals so far (chunks, raw bytes), counted into DATA_END. */
interface EarlyTotals {
  chunks: number;
  raw: number;
}

async function sendContent(conn: FramedConnection, o: SendContentOptions, holder: { source?: NativeChunkSource }, turn: DataTurn): Promise<ContentResult> {
  const basisExchanged = Boolean(o.stream) && o.st.size > BigInt(STREAM_WINDOW);
  if (basisExchanged) await afterPrior(o.prior);
  const emptyBasis = basisExchanged && decodeBasis((await expect(conn, FrameType.BASIS)).payload).empty;
  const streamed = !o.scan && basisExchanged && o.overlap !== false;
  const limiter = o.limiter ?? (o.bwlimitKiBps ? rateLimiter(o.bwlimitKiBps * 1024) : undefined);
  const early: EarlyTotals = { chunks: 0, raw: 0 };
  // Early DATA (to an empty basis) is data: it waits for its turn like the DATA phase does,
  // holding the buffers it may use (EARLY_BUFFERS).
  if (streamed && emptyBasis) await turn.take(EARLY_BUFFERS);
  // To an empty basis every chunk moves, most of them while the file is still being hashed
  // (early DATA): the sending phase starts now, over the whole file, and runs beside hashing,
  // so progress shows the bytes actually moving instead of a frozen hash and "sending 0 B".
  const sendingEarly = streamed && emptyBasis ? { t0: Date.now() } : undefined;
  if (sendingEarly) o.events?.phaseStart?.('sending', Number(o.st.size));
  const scan = await offerManifest(conn, o, streamed, (progress) => streamManifest(conn, o, progress, emptyBasis, early, limiter));
  if (!basisExchanged) await afterPrior(o.prior);
  const asked = await readNeeds(conn, o, scan);
  if (asked.refused) return { root: scan.root, upToDate: false, literalBytes: 0, matchedBytes: 0, refused: 'refused by the receiver' };
  const { needed, refinement } = asked;
  // The DATA turn comes before the source is checked again: a file that changed while it
  // waited is caught here. It holds one unit per batch buffer this file will use. The session's
  // first DATA goes in small batches that grow, so the idle link need not wait for a whole batch
  // to be encoded (BatchRamp): planned before the turn (its units cover them), kept only by the
  // file whose turn comes first; one that finds the ramp taken sends full batches.
  const batchBytes = o.batchBytes ?? BATCH_BYTES;
  const full = () => batchByBytes(scan.manifest, needed, batchBytes);
  const ramped = o.ramp?.pending && needed.length > 0 ? batchByBytes(scan.manifest, needed, batchBytes, RAMP_FIRST_BYTES) : undefined;
  let batches = ramped ?? full();
  const total = needed.reduce((a, i) => a + manifestChunkLength(scan.manifest, i), 0);
  if (needed.length > 0) await turn.take(Math.min(batches.length, SEND_BUFFERS), total);
  else turn.done();
  if (ramped && !o.ramp!.claim()) batches = full();
  // The chunk source must read the version that was scanned: the file it opens is checked
  // against the identity it had before the scan (a change during or after it is exit 24), in
  // the same native step as the open (one trip to the thread pool per file, not two).
  const { size, mtimeNs, ctimeNs, ino, dev } = o.st;
  const src = await openChunkSource(o.path, scan.manifest, o.governor?.level ?? o.level, o.batchStream, { size, mtimeNs, ctimeNs, ino, dev }).catch((e: unknown) => {
    if ((e as FfsyncError).code !== 'ECHANGED') throw e;
    throw new FfsyncError('EVANISHED', ExitCode.VANISHED, `source ${o.label} changed or vanished during the sync; rerun to send the new version`, { cause: e });
  });
  holder.source = src;
  // Released as soon as the data is out: a long-lived process (serve) must not keep the
  // file open until the object is collected (`unchanged()` still answers afterwards).
  try {
    if (refinement) await conn.keepAlive(call(src.setRefinement(refinement)));
    // The phase started with the early DATA continues (its count includes it), else one starts.
    let raw = 0;
    const sendingPhase = (run: (progress: (n: number) => void) => Promise<void>): Promise<void> =>
      sendingEarly
        ? run((n) => o.events?.progress?.('sending', early.raw + n)).then(() => o.events?.phaseEnd?.('sending', early.raw + raw, Date.now() - sendingEarly.t0))
        : inPhase(o.events, 'sending', total, run);
    await sendingPhase(async (progress) => {
      raw = await sendBatches(conn, o, src, batches, limiter, progress);
    });
    // Early DATA counts too: DATA_END totals every chunk this transfer sent.
    await conn.send(FrameType.DATA_END, encodeDataEnd({ chunks: needed.length + early.chunks, rawBytes: BigInt(raw + early.raw) }));
    // The next file's DATA may go now (not when RESULT comes, a round trip later).
    turn.done();
  } finally {
    src.release();
  }
  if (!o.resultLater) return settleResult(conn, o, scan.root);
  const settled = settleResult(conn, o, scan.root);
  settled.catch(() => undefined); // the caller handles it (after this returns)
  return { root: scan.root, upToDate: false, literalBytes: 0, matchedBytes: 0, settled };
}

/** The file's manifest, sent: its scan (given, hashed now, or streamed with `stream`, whose
 * entries went ahead), then MANIFEST (the header alone after a stream) and HOLES. */
async function offerManifest(conn: FramedConnection, o: SendContentOptions, streamed: boolean, stream: (progress: (n: number) => void) => Promise<ScanResult>): Promise<ScanResult> {
  let scan = o.scan;
  if (!scan) {
    // KEEPALIVEs carry the bytes hashed: the receiver counts them as progress (§4.11).
    const hashed = workMeter();
    scan = await conn.keepAlive(
      inPhase(o.events, 'hashing', Number(o.st.size), (p, progress = hashed.tap(p)) =>
        streamed ? stream(progress) : hashWithin(o.hashing, () => scanFile(o.path, { stateDir: o.stateDir, ignoreIndex: o.checksum, onProgress: progress })),
      ),
      hashed,
    );
  }
  if (BigInt(scan.size) !== o.st.size) {
    throw new FfsyncError('EVANISHED', ExitCode.VANISHED, `source ${o.label} changed size while it was being scanned; rerun to send the new version`);
  }
  const manifestOut = streamed ? scan.manifest.subarray(0, MANIFEST_HEADER) : scan.manifest;
  for (const part of manifestFrames(manifestOut)) await conn.send(FrameType.MANIFEST, part);
  // A file that cannot be asked for its holes has none to tell (a file that vanished is
  // reported by the identity check, as exit 24); nor has one whose blocks hold all its bytes,
  // which is not asked (most files: one trip to the thread pool fewer per file).
  if (o.sparse) await conn.send(FrameType.HOLES, mayHaveHoles(o.st) ? await fileHoles(o.path).catch(() => noHoles()) : noHoles());
  return scan;
}

/** The HOLES payload of a file without holes (a count of 0). */
function noHoles(): Buffer {
  return Buffer.alloc(4);
}

/** False when the file's allocated blocks cover its size: it has no hole the filesystem could
 * report (a platform or filesystem that reports no blocks, or fewer than the bytes written so
 * far, is asked). Saying "no holes" of a file that has some (blocks allocated past its end can
 * hide them) is never wrong, only less sparse: the receiver writes the zeros. */
export function mayHaveHoles(st: BigIntStats): boolean {
  return st.blocks * 512n < st.size;
}

/** The receiver's answer: NEED bitmaps and (with REFINE) its old bytes' signatures, until
 * NEED_END, which may refuse the file. */
async function readNeeds(conn: FramedConnection, o: SendContentOptions, scan: ScanResult): Promise<{ refused: true } | { refused: false; needed: Uint32Array; refinement?: Buffer }> {
  const needs = new NeedCollector(manifestChunkCount(scan.manifest));
  const refineParts: Buffer[] = [];
  let refineBytes = 0;
  for (;;) {
    const f = o.refine ? await expect(conn, FrameType.NEED, FrameType.REFINE, FrameType.NEED_END) : await expect(conn, FrameType.NEED, FrameType.NEED_END);
    if (f.type === FrameType.NEED) needs.push(f.payload);
    else if (f.type === FrameType.REFINE) {
      refineBytes += f.payload.length;
      if (refineBytes > MAX_REFINE_TABLE) throw protocolError(`refinement table of ${o.label} is over ${MAX_REFINE_TABLE} bytes`);
      refineParts.push(Buffer.from(f.payload));
      f.release?.();
    } else {
      const end = decodeNeedEnd(f.payload);
      if (end.refused) return { refused: true };
      return { refused: false, needed: needs.finish(end.wireChunks), refinement: refineParts.length ? Buffer.concat(refineParts) : undefined };
    }
  }
}

/** The DATA frames: batches encoded natively into recycled buffers, `readAheadFor` at a time,
 * while earlier ones are written to the socket; the level governor watches both waits.
 * Returns the raw bytes sent. */
async function sendBatches(conn: FramedConnection, o: SendContentOptions, src: NativeChunkSource, batches: Uint32Array[], limiter: ((n: number) => Promise<void>) | undefined, progress: (n: number) => void): Promise<number> {
  const gov = o.governor;
  const batchBytes = o.batchBytes ?? BATCH_BYTES;
  const readAhead = readAheadFor(batchBytes);
  const pool = o.buffers ?? new BufferPool(batchBuffer(batchBytes), readAhead + SEND_BUFFERS - READ_AHEAD);
  if (pool.size < batchBuffer(batchBytes)) throw new Error(`internal: batch buffers of ${pool.size} bytes for batches of ${batchBytes}`);
  const read = async (k: number) => {
    const buf = await pool.acquire();
    // A buffer comes back once an earlier batch (this file's or another's) reached its socket:
    // time spent waiting for one is the link's, not the encoder's (below).
    const acquiredAt = nowMs();
    if (gov) src.setLevel(gov.level);
    // The receiver holds the batch before this one once it is written: from level 8 (the
    // core decides) the batch compresses against it too (§4.7, encodings 8 and 9).
    const previous = o.batchStream && o.batchPrefix && k > 0 ? batches[k - 1] : undefined;
    const res = await call(src.readBatch(batches[k], buf, previous));
    return { buf, res, acquiredAt };
  };
  const ahead: Promise<{ buf: Buffer; res: { length: number; rawBytes: number }; acquiredAt: number }>[] = [];
  for (let k = 0; k < Math.min(readAhead, batches.length); k++) ahead.push(read(k));
  ahead.forEach((p) => p.catch(() => undefined));
  gov?.restartWindow();
  let raw = 0;
  for (let k = 0; k < batches.length; k++) {
    const t0 = nowMs();
    const { buf, res, acquiredAt } = await ahead[k];
    const t1 = nowMs();
    // Two files sending at once share the session's buffers: a batch that waited for one after
    // this wait began waited that long for the sockets, and only the rest for its encoding
    // (decisions §120: the governor must not read a full pipe as a slow encoder).
    const forBuffer = Math.max(0, acquiredAt - t0);
    if (k + readAhead < batches.length) {
      const p = read(k + readAhead);
      p.catch(() => undefined);
      ahead.push(p);
    }
    await conn.send(FrameType.DATA, buf.subarray(0, res.length), () => pool.release(buf));
    raw += res.rawBytes;
    progress(raw);
    if (limiter) await conn.orFailure(limiter(res.length));
    gov?.observe(t1 - t0 - forBuffer, nowMs() - t1 + forBuffer, res.length);
  }
  return raw;
}

/** The receiver's RESULT for the file. */
async function settleResult(conn: FramedConnection, o: SendContentOptions, root: string): Promise<ContentResult> {
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
  const batchBytes = o.batchBytes ?? BATCH_BYTES;
  const earlyData = emptyBasis ? { level: gov?.level ?? o.level, batchBytes, stream: o.batchStream } : undefined;
  const stream = await openScanStream(o.path, STREAM_WINDOW, { stateDir: o.stateDir, ignoreIndex: o.checksum, onProgress: progress }, earlyData);
  try {
    // One `next` is always in flight while the previous step is being sent (never two: the
    // steps must arrive in order). Early DATA lands in recycled buffers, released once sent.
    const pool = emptyBasis ? new BufferPool(batchBuffer(batchBytes), EARLY_BUFFERS) : undefined;
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
      const t0 = nowMs();
      const { step, buf } = await pending;
      const t1 = nowMs();
      if (step.result) {
        if (buf) pool!.release(buf);
        return step.result;
      }
      pending = nextStep();
      pending.catch(() => undefined);
      if (step.batchLen !== undefined && step.batchLen !== null) {
        if (step.batch) {
          // It did not fit the recycled buffer (never for batches of `batchBytes`): sent as is.
          if (buf) pool!.release(buf);
          await conn.send(FrameType.DATA, step.batch);
        } else {
          await conn.send(FrameType.DATA, buf!.subarray(0, step.batchLen), () => pool!.release(buf!));
        }
        early.chunks += step.batchChunks!;
        early.raw += step.batchRaw!;
        o.events?.progress?.('sending', early.raw);
        if (limiter) await conn.orFailure(limiter(step.batchLen));
        gov?.observe(t1 - t0, nowMs() - t1, step.batchLen);
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
