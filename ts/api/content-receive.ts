// The receiver's half of one file's content conversation (the sender's is content-send.ts):
// it answers the manifest with NEED (and REFINE), places what arrives and what it already
// has, and rebuilds the file out of place; the result is verified against the sender's root
// and only then renamed over the target (crates/ffsync_core/src/restore/restorer.rs). Chunks it
// already has are placed while the manifest still streams in (early-placement.ts).

import { FramedConnection, PeerClosedError, workMeter } from '../transport/connection.js';
import { FrameType, protocolError } from '../protocol/frames.js';
import { refersToPrevious } from '../protocol/chunk-records.js';
import {
  decodeDataEnd,
  encodeBasis,
  encodeNeedEnd,
  encodeResult,
  ManifestAssembler,
  STREAM_WINDOW,
  REFINE_PART,
  maxManifestLength,
  needFrames,
  ResultStatus,
} from '../protocol/messages.js';
import {
  type BackupOptions,
  beginReconstruction,
  call,
  decodeManifest,
  hasPartial,
  type ManifestInfo,
  markUpToDate,
  movePartials,
  type NativeReconstruction,
  scanFile,
  type ScanResult,
} from '../native/binding.js';
import { MANIFEST_ENTRY, MANIFEST_HEADER, manifestParamsKey } from '../utils/manifest.js';
import { ExitCode, FfsyncError } from '../utils/errors.js';
import { expect, expectUnless } from './session.js';
import { inPhase, type SyncEvents } from './events.js';
import { type ContentResult } from './content-send.js';
import { EarlyPlacement, WRITES_IN_FLIGHT } from './early-placement.js';
import { takeWithSlot, writeSlots } from './write-slots.js';
import type { SharedUnits } from '../utils/data-turns.js';

export { WRITES_IN_FLIGHT };

export interface ReceiveContentOptions {
  /** The file to build; with `beneath`, a relative path under that directory. */
  target: string | Buffer;
  /** A tree's root: `target` is resolved beneath it without following any link. */
  beneath?: string;
  /** A local sync (both peers in this process): the sender's own file, under its root when
   * `beneath` is given. The chunks this side would ask for are copied from it on the disk and
   * proven by their hashes; any that do not match still cross (decisions §111). */
  peerCopy?: { path: string | Buffer; beneath?: string; mtimeNs?: bigint };
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
  /** rsync's --partial-dir (crates/ffsync_core/src/restore/partial_dir.rs): partials of this file
   * kept by an earlier attempt are taken from there first, and one this attempt keeps goes there. */
  partialDir?: string;
  /** The session's write slots (write-slots.ts), shared by its files; a file alone has its own. */
  writeSlots?: SharedUnits;
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
    emptyBasis = o.localPaths.length === 0 && !o.inplace && !(await hasPartial(o.target, o.beneath));
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
    if (keep && e instanceof FfsyncError) throw e.withMessage(`${e.message}; partial file kept, rerun the same command to resume`);
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

/** The session ended without anything being wrong with the data: the connection dropped or
 * went silent, or one side was interrupted (its own signal, or the peer's ERROR saying so).
 * The verified partial is then kept for a rerun to resume from. */
function connectionLost(e: unknown): boolean {
  const err = e instanceof FfsyncError ? e : undefined;
  return e instanceof PeerClosedError || err?.exitCode === ExitCode.SOCKET_IO || err?.exitCode === ExitCode.TIMEOUT || err?.exitCode === ExitCode.SIGNAL;
}

/** Manifest, plan, data, verification, commit: the conversation once BASIS (if any) is out. */
async function receiveWithPlacement(conn: FramedConnection, o: ReceiveContentOptions, assembler: ManifestAssembler, maxLength: number, early: EarlyPlacement): Promise<ContentResult> {
  const manifest = await readManifest(conn, o, assembler, maxLength, early);
  const holes = o.sparse ? Buffer.from((await expect(conn, FrameType.HOLES)).payload) : undefined;
  const info = await decodeManifest(manifest);
  if (BigInt(info.size) !== o.size) throw protocolError(`manifest describes ${info.size} bytes, offer said ${o.size}`);
  const scanned = await localManifests(conn, o, manifest, info.size);
  if (o.targetReusable && scanned[0]?.root === info.root) return keepIdentical(conn, o, manifest, info, early);
  // Chunks placed while the manifest streamed in are adopted by the plan (if they match it).
  const prefill = await conn.keepAlive(early.done());
  return rebuild(conn, o, { manifest, info, scanned, holes, prefill, early });
}

/** The sender's manifest: MANIFEST parts, or with STREAM its entries in MANIFEST_STREAM frames
 * (placed early as they arrive) and early DATA between them, then the header in MANIFEST. */
async function readManifest(conn: FramedConnection, o: ReceiveContentOptions, assembler: ManifestAssembler, maxLength: number, early: EarlyPlacement): Promise<Buffer> {
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
  if (!streamed.length) return manifest;
  if (manifest.length !== MANIFEST_HEADER) throw protocolError('after MANIFEST_STREAM frames, MANIFEST must carry the header alone');
  return Buffer.concat([manifest, ...streamed]);
}

/** Our local files' manifests. A file that crossed the 16 MiB parameter threshold between
 * versions is chunked differently on each side: such a copy is rechunked with the sender's
 * parameters. */
async function localManifests(conn: FramedConnection, o: ReceiveContentOptions, manifest: Buffer, size: number): Promise<ScanResult[]> {
  const scanned = await o.locals;
  for (let i = 0; i < scanned.length; i++) {
    if (scanned[i].size > 0 && manifestParamsKey(scanned[i].manifest) !== manifestParamsKey(manifest)) {
      const hashed = workMeter();
      scanned[i] = await conn.keepAlive(
        inPhase(o.events, 'hashing', scanned[i].size, (p) => scanFile(o.localPaths[i], { paramsForSize: size, onProgress: hashed.tap(p) })),
        hashed,
      );
    }
  }
  return scanned;
}

/** The target already holds the sender's content: no data, the sender's times and mode once
 * its end of the session checked out. */
async function keepIdentical(conn: FramedConnection, o: ReceiveContentOptions, manifest: Buffer, info: ManifestInfo, early: EarlyPlacement): Promise<ContentResult> {
  // Reported, so that a copy made for nothing (the hold-back failing) would show.
  await early.stop();
  await conn.send(FrameType.NEED_END, encodeNeedEnd({ wireChunks: 0, identical: true }));
  decodeDataEnd((await expect(conn, FrameType.DATA_END)).payload);
  // Only now: a sender that goes on with DATA instead (refused, exit 12) must leave the
  // target untouched.
  await markUpToDate(o.target, manifest, o.mtimeNs, o.mode, o.stateDir, o.beneath);
  await conn.send(FrameType.RESULT, encodeResult({ status: ResultStatus.UP_TO_DATE, matchedBytes: o.size, literalBytes: 0n }));
  return { root: info.root, upToDate: true, literalBytes: 0, matchedBytes: Number(o.size), placedEarly: early.copied };
}

interface Rebuild {
  manifest: Buffer;
  info: ManifestInfo;
  scanned: ScanResult[];
  holes: Buffer | undefined;
  prefill: Awaited<ReturnType<EarlyPlacement['done']>>;
  early: EarlyPlacement;
}

/** Plan, request what is missing, rebuild, verify, replace. */
async function rebuild(conn: FramedConnection, o: ReceiveContentOptions, b: Rebuild): Promise<ContentResult> {
  let rec: NativeReconstruction | undefined;
  try {
    const begun = await begin(conn, o, b);
    if (typeof begun === 'string') {
      await conn.send(FrameType.NEED_END, encodeNeedEnd({ wireChunks: 0, identical: false, refused: true }));
      return { root: b.info.root, upToDate: false, literalBytes: 0, matchedBytes: 0, refused: begun };
    }
    const r = (rec = begun);
    const plan = r.summary();
    const wireChunks = await requestData(conn, o, r, b.info);
    const copying = call(r.copyLocal());
    copying.catch(() => undefined);
    await receiveData(conn, o, r, plan.wireBytes, wireChunks, b.early);
    await conn.keepAlive(copying);
    o.beforeCommit?.();
    const refused = await commit(conn, o, r, b.info);
    rec = undefined;
    if (refused !== undefined) {
      r.abort(false);
      await conn.send(FrameType.RESULT, encodeResult({ status: ResultStatus.NOT_WRITTEN, matchedBytes: 0n, literalBytes: 0n }));
      return { root: b.info.root, upToDate: false, literalBytes: 0, matchedBytes: 0, refused };
    }
    // Literal = bytes that crossed as data; a refined chunk's copies from our old bytes count as matched.
    const literal = r.literalBytes();
    await conn.send(FrameType.RESULT, encodeResult({ status: ResultStatus.SYNCED, matchedBytes: BigInt(b.info.size - literal), literalBytes: BigInt(literal) }));
    // Close its files now (not when the object is collected: serve runs for weeks) — after
    // RESULT: dropping the last handle on a replaced large target frees its blocks, which
    // can take the kernel most of a second that the sender need not wait for.
    r.release();
    return { root: b.info.root, upToDate: false, literalBytes: literal, matchedBytes: b.info.size - literal, placedEarly: plan.placedBytes };
  } catch (e) {
    if (rec) {
      const err = e instanceof FfsyncError ? e : undefined;
      const lost = connectionLost(e);
      // A dropped connection keeps the verified-so-far partial for the next run;
      // anything else (bad data, full disk, failed verification) removes it.
      rec.abort(lost);
      rec.release();
      if (lost && err) {
        throw err.withMessage(`${err.message}; partial file kept, rerun the same command to resume`);
      }
    }
    throw e;
  }
}

/** The plan: a reconstruction of the target from the manifest, our local files and what was
 * placed early. A tree's file that cannot be started (permission, a name the filesystem cannot
 * hold) is refused, with why, instead of failing the session. */
async function begin(conn: FramedConnection, o: ReceiveContentOptions, b: Rebuild): Promise<NativeReconstruction | string> {
  try {
    return await conn.keepAlive(
      inPhase(o.events, 'diffing', b.info.size, () =>
        beginReconstruction(
          o.target,
          b.manifest,
          o.localPaths.map((p, i) => ({ path: p, manifest: b.scanned[i].manifest })),
          (n) => o.events?.progress?.('receiving', n),
          b.holes,
          o.inplace,
          b.prefill,
          o.beneath,
          o.fsync,
          o.backup,
          o.peerCopy,
        ),
      ),
    );
  } catch (e) {
    const err = e instanceof FfsyncError ? e : undefined;
    if (!o.refusable || err?.exitCode !== ExitCode.FILE_IO || err.code === 'ENOSPC') throw e;
    return err.message;
  }
}

/** NEED for the chunks that must cross, REFINE (our old bytes' signatures) when negotiated,
 * NEED_END. Returns how many chunks were asked for. */
async function requestData(conn: FramedConnection, o: ReceiveContentOptions, r: NativeReconstruction, info: ManifestInfo): Promise<number> {
  const needed = r.needed();
  for (const part of needFrames(needed, info.chunks)) await conn.send(FrameType.NEED, part);
  if (o.refine && needed.length > 0 && o.localPaths.length > 0) {
    const table = await conn.keepAlive(call(r.refinement()));
    for (let at = 0; at < table.length; at += REFINE_PART) await conn.send(FrameType.REFINE, table.subarray(at, at + REFINE_PART));
  }
  await conn.send(FrameType.NEED_END, encodeNeedEnd({ wireChunks: needed.length, identical: false }));
  return needed.length;
}

/** DATA until DATA_END, each batch verified and written natively, WRITES_IN_FLIGHT at once;
 * DATA_END's totals must match what arrived, early DATA included. */
async function receiveData(conn: FramedConnection, o: ReceiveContentOptions, r: NativeReconstruction, wireBytes: number, wireChunks: number, early: EarlyPlacement): Promise<void> {
  let received = 0;
  const slots = o.writeSlots ?? writeSlots();
  await inPhase(o.events, 'receiving', wireBytes, async (progress) => {
    const inflight = new Set<Promise<number>>();
    // A batch that fails (a chunk failing its hash, a full disk) ends the loop at once, not
    // when the next frame arrives (seconds later under --bwlimit): the sender stops sooner,
    // and its verdict on a bad chunk (§7.2) comes while it is still listening.
    let writeFailed!: (e: unknown) => void;
    const failed = new Promise<never>((_, reject) => (writeFailed = reject));
    failed.catch(() => undefined);
    for (;;) {
      // With one of the session's write slots (write-slots.ts): its files' batches, all at once.
      const { frame: f, done } = await takeWithSlot(conn, () => expectUnless(conn, failed, FrameType.DATA, FrameType.DATA_END), slots);
      if (f.type === FrameType.DATA_END) {
        const end = decodeDataEnd(f.payload);
        await Promise.all(inflight);
        // Early DATA is part of the totals (DATA_END counts every chunk this transfer sent).
        const chunks = wireChunks + early.received.chunks;
        const raw = received + early.received.raw;
        if (end.chunks !== chunks) throw protocolError(`sender ended after ${end.chunks} of ${chunks} chunks`);
        if (end.rawBytes !== BigInt(raw)) throw protocolError(`sender claims ${end.rawBytes} bytes, ${raw} arrived`);
        return;
      }
      // A batch compressed against the one before it (§4.7, encodings 8 and 9) is decoded
      // with that one's bytes, read back from the file: every earlier write must be done
      // (such batches come only on a slow link, where the wait costs nothing the link does
      // not). The wait is here, not inside the write, so frames still take their places (the
      // core's tickets) in the order they arrived; the slot goes back if an earlier write failed.
      if (refersToPrevious(f.payload)) {
        try {
          await Promise.all(inflight);
        } catch (e) {
          done();
          throw e;
        }
      }
      // The slot goes back however the write ends (a synchronous throw included).
      const w = (async () => call(r.writeBatch(f.payload)))().finally(done).then((n) => {
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
}

/** Verify the result against the sender's root and put it in place. A file that cannot be
 * written (immutable, a read-only mount) is that file's failure, returned as its reason when
 * COMMIT_REFUSAL was negotiated (exit 23 with the rest synced); a full disk still fails the
 * session (every later file would fail too), and so does a failed verification. */
async function commit(conn: FramedConnection, o: ReceiveContentOptions, r: NativeReconstruction, info: ManifestInfo): Promise<string | undefined> {
  try {
    await conn.keepAlive(inPhase(o.events, 'verifying', info.size, () => call(r.finish(o.mtimeNs, o.mode, o.stateDir))));
    return undefined;
  } catch (e) {
    const err = e instanceof FfsyncError ? e : undefined;
    if (!o.refusable || !o.commitRefusal || err?.exitCode !== ExitCode.FILE_IO || err.code === 'ENOSPC') throw e;
    return err.message;
  }
}
