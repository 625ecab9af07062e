// Steps both peers of a tree session run the same way: exchange manifests, supply the
// content roots the other side's index calls for, and count the plan for the summary.

import { FramedConnection } from '../transport/connection.js';
import { FrameType } from '../protocol/frames.js';
import { ManifestAssembler, manifestFrames, MAX_TREE_WIRE_BYTES } from '../protocol/messages.js';
import { call, type NativeTreeSync, type PlanCounts, type TreeStats } from '../native/binding.js';
import { expect } from './session.js';
import { inPhase, type SyncEvents, type TreeSummary } from './events.js';

async function sendParts(conn: FramedConnection, type: FrameType, buf: Buffer): Promise<void> {
  for (const part of manifestFrames(buf)) await conn.send(type, part);
}

async function recvParts(conn: FramedConnection, type: FrameType, minLength: number): Promise<Buffer> {
  const asm = new ManifestAssembler(MAX_TREE_WIRE_BYTES, minLength);
  for (;;) {
    const whole = asm.push((await expect(conn, type)).payload);
    if (whole) return whole;
  }
}

/**
 * Both peers send their manifest without waiting for the other's, then each hashes the
 * files triage needs a root for (same-size files the other side's index covers, rename
 * candidates) and sends those roots. After this both can triage identically.
 */
export async function exchangeManifestsAndRoots(conn: FramedConnection, tree: NativeTreeSync, checksum: boolean, events?: SyncEvents): Promise<void> {
  const sent = sendParts(conn, FrameType.TREE_MANIFEST, tree.manifest());
  sent.catch(() => undefined);
  const peer = await conn.keepAlive(recvParts(conn, FrameType.TREE_MANIFEST, 8));
  await sent;
  await call(() => tree.setPeerManifest(peer));
  const mine = tree.rootsToSupply(checksum);
  const roots = await conn.keepAlive(inPhase(events, 'hashing', 0, (progress) => call(tree.hashEntries(mine, progress))));
  const rootsSent = sendParts(conn, FrameType.ROOTS, roots);
  rootsSent.catch(() => undefined);
  const theirs = await conn.keepAlive(recvParts(conn, FrameType.ROOTS, 4));
  await rootsSent;
  await call(() => tree.setPeerRoots(theirs));
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
    skipped: c.skipped,
    lanes: 1,
    written: 0,
    deleted: 0,
    errors: [],
  };
}
