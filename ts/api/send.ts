// The sending side of a single-file sync.

import fs from 'node:fs/promises';
import { FramedConnection } from '../transport/connection.js';
import { connect } from '../transport/tcp.js';
import { FrameType } from '../protocol/frames.js';
import {
  Capability,
  Decision,
  DecisionReason,
  decodeDecision,
  decodeError,
  decodeNeedEnd,
  decodeResult,
  encodeDataEnd,
  encodeOffer,
  manifestFrames,
  NeedCollector,
  OfferFlag,
  OfferKind,
  ResultStatus,
  Role,
} from '../protocol/messages.js';
import { call, loadIndex, openChunkSource, scanFile, type ScanResult } from '../native/binding.js';
import { batchByBytes, manifestChunkCount, manifestChunkLength } from '../utils/manifest.js';
import { ExitCode, FfsyncError, fromSystemError } from '../utils/errors.js';
import { BufferPool } from '../utils/buffer-pool.js';
import { resolveStateDir } from '../utils/state-dir.js';
import { authenticatePeer, endSession, expect, handshake, reportError } from './session.js';
import type { TLSSocket } from 'node:tls';
import { tlsConnect } from '../transport/tls.js';
import { loadOrCreateIdentity } from '../security/identity.js';
import { inPhase, newSummary, type SyncEvents, type SyncSummary } from './events.js';

export interface SendOptions {
  path: string;
  host: string;
  port: number;
  /** Ignore indexes and the size/mtime fast path; hash everything. */
  checksum?: boolean;
  /** zstd level for chunk data; 0 disables compression. Default 1. */
  compressLevel?: number;
  stateDir?: string;
  /** Abort when the peer sends nothing for this long (exit 30). Default 60 s. */
  timeoutMs?: number;
  events?: SyncEvents;
  /** Aborting closes the connection (the receiver keeps its partial for a resume). */
  signal?: AbortSignal;
  /** Cap chunk data at this many KiB per second (rsync's --bwlimit). */
  bwlimitKiBps?: number;
  /** Plain TCP instead of TLS (the peer must agree). */
  plaintext?: boolean;
  /** Accept exactly this peer fingerprint (and pin it). */
  trust?: string;
  /** Ask on the terminal about an unknown peer. */
  interactive?: boolean;
}

/** Raw bytes per DATA frame: large enough to amortize framing, small enough to pipeline and
 * to keep both peers' resident memory low (recycled buffers, see BufferPool). */
const BATCH_BYTES = 2 * 1024 * 1024;
/** Room for a batch plus its record headers. */
const BATCH_BUFFER = BATCH_BYTES + 64 * 1024;
/** Batches being read/compressed natively ahead of the socket. */
const READ_AHEAD = 2;

export async function statSource(p: string): Promise<import('node:fs').BigIntStats> {
  let st;
  try {
    st = await fs.stat(p, { bigint: true });
  } catch (e) {
    const err = e as NodeJS.ErrnoException;
    if (err.code === 'ENOENT') throw new FfsyncError('ENOENT', ExitCode.FILE_SELECTION, `source ${p} does not exist`);
    throw fromSystemError(e, `cannot read source ${p}`);
  }
  if (st.isDirectory()) {
    throw new FfsyncError('EISDIR', ExitCode.FILE_SELECTION, `source ${p} is a directory; this version syncs single files (directory trees are tracked in issue #4)`);
  }
  if (!st.isFile()) throw new FfsyncError('ENOTFILE', ExitCode.FILE_SELECTION, `source ${p} is not a regular file`);
  return st;
}

export async function send(o: SendOptions): Promise<SyncSummary> {
  const t0 = Date.now();
  const stateDir = resolveStateDir(o.stateDir);
  const st = await statSource(o.path);
  const identity = o.plaintext ? undefined : loadOrCreateIdentity(stateDir);
  const sock = identity ? await tlsConnect(o.host, o.port, identity) : await connect(o.host, o.port);
  const conn = new FramedConnection(sock, o.timeoutMs ?? 60_000);
  const onAbort = () => conn.destroy();
  o.signal?.addEventListener('abort', onAbort, { once: true });
  const summary = newSummary('sender', o.path, Number(st.size));
  let source: Awaited<ReturnType<typeof openChunkSource>> | undefined;
  try {
    if (identity) {
      summary.peerFingerprint = await authenticatePeer(conn, sock as TLSSocket, { stateDir, trust: o.trust, interactive: o.interactive, peerLabel: `${o.host}:${o.port}`, events: o.events });
    }
    const negotiated = await handshake(conn, Role.SENDER);
    // A valid index lets the receiver compare content roots for the price of a stat.
    let scan: ScanResult | null = o.checksum ? null : await loadIndex(o.path, stateDir);
    await conn.send(
      FrameType.OFFER,
      encodeOffer({
        kind: OfferKind.FILE,
        size: st.size,
        mtimeNs: st.mtimeNs,
        mode: Number(st.mode & 0o7777n),
        flags: o.checksum ? OfferFlag.CHECKSUM : 0,
        root: scan ? Buffer.from(scan.root, 'hex') : undefined,
      }),
    );
    const { decision, reason } = decodeDecision((await expect(conn, FrameType.DECISION)).payload);
    if (decision === Decision.UP_TO_DATE) {
      summary.upToDate = true;
      summary.decidedBy = reason === DecisionReason.INDEX_ROOT ? 'index-root' : 'size-mtime';
      summary.matchedBytes = summary.size;
      summary.root = scan?.root;
    } else {
      if (!scan) {
        scan = await conn.keepAlive(
          inPhase(o.events, 'hashing', summary.size, (progress) => scanFile(o.path, { stateDir, ignoreIndex: o.checksum, onProgress: progress })),
        );
      }
      if (BigInt(scan.size) !== st.size) {
        throw new FfsyncError('EVANISHED', ExitCode.VANISHED, `source ${o.path} changed size while it was being scanned; rerun to send the new version`);
      }
      summary.root = scan.root;
      for (const part of manifestFrames(scan.manifest)) await conn.send(FrameType.MANIFEST, part);

      const chunkCount = manifestChunkCount(scan.manifest);
      const needs = new NeedCollector(chunkCount);
      let end;
      for (;;) {
        const f = await expect(conn, FrameType.NEED, FrameType.NEED_END);
        if (f.type === FrameType.NEED) needs.push(f.payload);
        else {
          end = decodeNeedEnd(f.payload);
          break;
        }
      }
      const needed = needs.finish(end.wireChunks);
      // The chunk source must read the version that was scanned: the file is re-checked
      // against the identity it had before the scan (a change during or after it is exit 24).
      const now = await fs.stat(o.path, { bigint: true }).catch(() => undefined);
      if (!now || now.size !== st.size || now.mtimeNs !== st.mtimeNs || now.ctimeNs !== st.ctimeNs || now.ino !== st.ino) {
        throw new FfsyncError('EVANISHED', ExitCode.VANISHED, `source ${o.path} changed or vanished during the sync; rerun to send the new version`);
      }
      // Compress only for a peer that said it can decode zstd.
      const level = negotiated.capabilities & Capability.ZSTD ? (o.compressLevel ?? 1) : 0;
      source = await openChunkSource(o.path, scan.manifest, level);
      const src = source;
      const batches = batchByBytes(scan.manifest, needed, BATCH_BYTES);
      const total = needed.reduce((a, i) => a + manifestChunkLength(scan!.manifest, i), 0);
      let raw = 0;
      await inPhase(o.events, 'sending', total, async (progress) => {
        // Batches are encoded natively into recycled buffers, READ_AHEAD at a time, while
        // earlier ones are being written to the socket.
        const pool = new BufferPool(BATCH_BUFFER, READ_AHEAD + 2);
        const limiter = o.bwlimitKiBps ? rateLimiter(o.bwlimitKiBps * 1024) : async () => undefined;
        const read = async (k: number) => {
          const buf = await pool.acquire();
          const res = await call(src.readBatch(batches[k], buf));
          return { buf, res };
        };
        const ahead: Promise<{ buf: Buffer; res: { length: number; rawBytes: number } }>[] = [];
        for (let k = 0; k < Math.min(READ_AHEAD, batches.length); k++) ahead.push(read(k));
        ahead.forEach((p) => p.catch(() => undefined));
        for (let k = 0; k < batches.length; k++) {
          const { buf, res } = await ahead[k];
          if (k + READ_AHEAD < batches.length) {
            const p = read(k + READ_AHEAD);
            p.catch(() => undefined);
            ahead.push(p);
          }
          await conn.send(FrameType.DATA, buf.subarray(0, res.length), () => pool.release(buf));
          raw += res.rawBytes;
          progress(raw);
          if (o.bwlimitKiBps) await limiter(res.length);
        }
      });
      await conn.send(FrameType.DATA_END, encodeDataEnd({ chunks: needed.length, rawBytes: BigInt(raw) }));
      const result = decodeResult((await expect(conn, FrameType.RESULT)).payload);
      summary.upToDate = result.status === ResultStatus.UP_TO_DATE;
      summary.decidedBy = summary.upToDate ? 'scan-root' : 'transfer';
      summary.literalBytes = Number(result.literalBytes);
      summary.matchedBytes = Number(result.matchedBytes);
    }
    summary.ok = true;
    if (source && !source.unchanged()) {
      o.events?.info?.(`warning: ${o.path} changed while it was being sent; the receiver has the version that was scanned`);
    }
    return summary;
  } catch (e) {
    let err = e instanceof FfsyncError ? e : fromSystemError(e, 'send failed');
    // The receiver may have explained its failure before our write failed: prefer that.
    const peerError = conn.takePeerError();
    if (peerError && !err.message.startsWith('peer: ')) err = decodeError(peerError.payload);
    if (source && !source.unchanged()) {
      err = new FfsyncError('EVANISHED', ExitCode.VANISHED, `source ${o.path} changed during the sync (${err.message}); rerun to send the new version`, { cause: err });
    }
    await reportError(conn, err);
    err.summary = summary;
    throw err;
  } finally {
    o.signal?.removeEventListener('abort', onAbort);
    await endSession(conn, summary, t0);
  }
}

/** Sleeps as needed so the average rate since the first call stays under `bytesPerSec`. */
function rateLimiter(bytesPerSec: number): (n: number) => Promise<void> {
  const t0 = Date.now();
  let sent = 0;
  return async (n) => {
    sent += n;
    const ahead = (sent / bytesPerSec) * 1000 - (Date.now() - t0);
    if (ahead > 0) await new Promise((r) => setTimeout(r, ahead));
  };
}
