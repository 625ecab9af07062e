// Steps both peers of a tree session run the same way: exchange manifests, supply the
// content roots the other side's index calls for, and count the plan for the summary.

import os from 'node:os';
import { FramedConnection, workMeter } from '../transport/connection.js';
import { dropIdleFrameBuffers, FrameType, protocolError } from '../protocol/frames.js';
import { collectGarbage } from '../utils/gc.js';
import { ManifestAssembler, manifestFrames, MAX_TREE_WIRE_BYTES } from '../protocol/messages.js';
import { call, type NativeTreeSync, type PlanCounts, type TreeStats } from '../native/binding.js';
import { expect } from './session.js';
import { inPhase, type SyncEvents, type TreeSummary } from './events.js';

/** A buffer as parts framed like MANIFEST (`total u32 | part`). */
export async function sendParts(conn: FramedConnection, type: FrameType, buf: Buffer): Promise<void> {
  for (const part of manifestFrames(buf)) await conn.send(type, part);
}

async function recvParts(conn: FramedConnection, type: FrameType, minLength: number): Promise<Buffer> {
  const asm = new ManifestAssembler(MAX_TREE_WIRE_BYTES, minLength);
  for (;;) {
    const whole = asm.push((await expect(conn, type)).payload);
    if (whole) return whole;
  }
}

/** The peer's TREE_MANIFEST parts go straight into the native decoder as they arrive
 * (framed like MANIFEST: `total u32 | part`), never assembled here. Returns the bytes received. */
async function recvManifest(conn: FramedConnection, tree: NativeTreeSync): Promise<number> {
  let total = -1;
  let filled = 0;
  for (;;) {
    const f = await expect(conn, FrameType.TREE_MANIFEST);
    const p = f.payload;
    if (p.length < 5) throw protocolError('TREE_MANIFEST frame too short');
    const t = p.readUInt32LE(0);
    if (total < 0) total = t;
    if (t !== total || total < 12 || total > MAX_TREE_WIRE_BYTES) throw protocolError(`TREE_MANIFEST total ${t} impossible or inconsistent`);
    if (filled + p.length - 4 > total) throw protocolError('TREE_MANIFEST frames exceed the total length');
    await call(() => tree.pushPeerManifestPart(p.subarray(4)));
    filled += p.length - 4;
    f.release?.();
    if (filled === total) {
      await call(() => tree.finishPeerManifest());
      return total;
    }
  }
}

/** Bytes of manifests and roots, both ways, from which a tree's exchange lets its buffers go:
 * ~50,000 files. Below it they are a few pool buffers at most, kept for the DATA to come. */
const EXCHANGE_RELIEF = 4 * 1024 * 1024;

/** Our tree manifest, in TREE_MANIFEST frames; resolves to its size in bytes once sent.
 * `compress` false: stored uncompressed in its zstd frame (a peer in this process). */
export function sendManifest(conn: FramedConnection, tree: NativeTreeSync, compress = true): Promise<number> {
  const sent = call(tree.manifest(compress)).then(async (m) => {
    await sendParts(conn, FrameType.TREE_MANIFEST, m);
    return m.length;
  });
  sent.catch(() => undefined); // awaited by the exchange, after the peer's manifest
  return sent;
}

/**
 * Both peers send their manifest without waiting for the other's, then each hashes the
 * files triage needs a root for (same-size files the other side's index covers, rename
 * candidates) and sends those roots. After this both can triage identically.
 * `manifestSent`: ours, going or gone (sendManifest).
 */
export async function exchangeManifestsAndRoots(conn: FramedConnection, tree: NativeTreeSync, checksum: boolean, events: SyncEvents | undefined, manifestSent: Promise<number>): Promise<void> {
  const received = await conn.keepAlive(recvManifest(conn, tree));
  let moved = received + (await manifestSent);
  const mine = tree.rootsToSupply(checksum);
  const hashed = workMeter();
  const hash = (p: (n: number) => void) => call(tree.hashEntries(mine, hashed.tap(p)));
  // A phase only when there is something to hash (most syncs decide by size and mtime alone).
  const roots = await conn.keepAlive(mine.length > 0 ? inPhase(events, 'hashing', 0, hash) : hash(() => undefined), hashed);
  const rootsSent = sendParts(conn, FrameType.ROOTS, roots);
  rootsSent.catch(() => undefined);
  const theirs = await conn.keepAlive(recvParts(conn, FrameType.ROOTS, 4));
  await rootsSent;
  await call(() => tree.setPeerRoots(theirs));
  moved += roots.length + theirs.length;
  if (moved >= EXCHANGE_RELIEF) {
    // The exchange's buffers, the frame pool's among them, are all garbage now, and a session
    // that sends few large frames from here on would keep them resident to its end (a
    // 100,000-file tree: ~14 MiB; decisions §87). Frames that need buffers later make them.
    dropIdleFrameBuffers();
    collectGarbage();
  }
}

export function treeSummary(stats: TreeStats, c: PlanCounts): TreeSummary {
  return {
    entries: stats.entries,
    files: c.sourceFiles,
    bytes: c.sourceBytes,
    dirs: stats.dirs,
    symlinks: stats.symlinks,
    indexedFiles: stats.indexedFiles,
    unchanged: c.unchangedFiles,
    decidedByRoot: c.decidedByRoot,
    smallTransfers: c.smallTransfers,
    largeTransfers: c.largeTransfers,
    transferBytes: c.transferBytes,
    localCopies: c.localCopies,
    symlinksToCreate: c.symlinks,
    attrsOnly: c.attrsOnly,
    mkdirs: c.mkdirs,
    toDelete: c.deletes,
    keptExtraneous: c.keptExtraneous,
    keptNewer: c.keptNewer,
    sizeSkipped: c.sizeSkipped,
    skipped: c.skipped,
    created: { files: c.createdFiles, dirs: c.createdDirs, symlinks: c.createdSymlinks },
    lanes: 1,
    written: 0,
    deleted: 0,
    errors: [],
  };
}

/** Files hashed at once in a multiplexed session, on each side: the cores are the limit, and a
 * file being hashed is mapped, which counts as resident memory (64 files of 8 MiB hashed at
 * once cost ~30 MB more than one at a time). */
export const HASHING_AT_ONCE = Math.max(1, Math.min(4, os.availableParallelism()));

/** How `sync` lists a tree's changes, as rsync does with -v (names) or -i (itemized lines). */
export interface Listing {
  /** rsync's -i: files marked `<` when sent to a remote receiver, `>` when they land here. */
  itemize?: 'sent' | 'received';
  /** Names are shown under this prefix: `src/` for `sync src dest`, where rsync's transfer
   * root is DEST and the tree is the directory `src` inside it. */
  prefix?: string;
  /** The tree's root did not exist before this session (rsync: `cd+++++++++`). */
  rootCreated?: boolean;
  /** rsync's `created directory DEST` line: DEST as the user wrote it, created by this run. */
  createdDir?: string;
  /** The changes are printed (-v or -i); without it the listing only feeds the log. */
  show?: boolean;
  /** --log-file: every change as an itemized line (whatever -v / -i print), `<` or `>` as for -i. */
  log?: { line: (text: string) => void; direction: 'sent' | 'received' };
  /** rsync's --max-delete: the receiver deletes only the first this many of the plan's
   * deletions (in the listed order), so only those are listed. */
  maxDelete?: number;
}

/** Write the plan's itemized lines to the log, if there is one (rsync logs `cd+++++++++ ./`
 * for a created root, and no `created directory` line). */
export function logListing(tree: NativeTreeSync, listing: Listing | undefined): void {
  if (!listing?.log) return;
  for (const l of listingLines(tree, { ...listing, itemize: listing.log.direction, createdDir: undefined })) listing.log.line(l);
}

/** The plan's lines for `listing` (rsync's order: the created directory first). */
export function listingLines(tree: NativeTreeSync, listing: Listing | undefined): string[] {
  const raw = (listing?.itemize ? tree.itemize(listing.itemize, Boolean(listing.rootCreated)) : tree.describe()).split('\n').filter(Boolean);
  // The name starts at a fixed column: after the 11 itemize characters and a space, or
  // after describe()'s verb padded to 8.
  const col = listing?.itemize ? 12 : 8;
  const prefix = listing?.prefix ?? '';
  let lines = prefix ? raw.map((l) => l.slice(0, col) + (l.slice(col) === './' ? prefix : prefix + l.slice(col))) : raw;
  if (listing?.maxDelete !== undefined) {
    let left = listing.maxDelete;
    lines = lines.filter((l) => !/^\*?deleting /.test(l) || left-- > 0);
  }
  return listing?.createdDir ? [`created directory ${listing.createdDir}`, ...lines] : lines;
}
