// The sending side of a directory tree sync (docs/protocol.md, "Tree sessions"):
// OFFER(tree) FILTER TREE_MANIFEST* -> peer TREE_MANIFEST* -> ROOTS <-> ROOTS -> both
// triage identically -> FILE_BATCH* (small files, streamed) -> per large file FILE_BEGIN
// + the single-file conversation -> TREE_END -> peer TREE_RESULT.

import { nowMs } from '../utils/clock.js';
import fs from 'node:fs/promises';
import type { BigIntStats } from 'node:fs';
import { FramedConnection } from '../transport/connection.js';
import { FrameType } from '../protocol/frames.js';
import {
  Capability,
  decodeLanes,
  encodeTreeOptions,
  hasRsyncChoices,
  hasTriageChoices,
  type TreeOptions,
  decodeTreeResult,
  encodeFileBegin,
  encodeFilter,
  encodeOffer,
  encodeTreeEnd,
  FileBeginStatus,
  MAX_LANES,
  OfferFlag,
  OfferKind,
} from '../protocol/messages.js';
import { call, type DirMergeSpec, type LargeTransferInfo, type NativeTreeSync, type PlanCounts, type SmallBatch, validateExcludes, walkTree } from '../native/binding.js';
import type { Duplex } from 'node:stream';
import { openLanes } from './lanes.js';
import { ExitCode, FfsyncError } from '../utils/errors.js';
import { BufferPool } from '../utils/buffer-pool.js';
import { joinTreePath, showTreePath } from '../utils/tree-path.js';
import { countLaneBytes, expect, reportError } from './session.js';
import type { Negotiated } from './session.js';
import { inPhase, reportChange, type SyncSummary } from './events.js';
import type { SendOptions } from './send.js';
import { deliveryMeter, LevelGovernor, startLevel } from './compress-level.js';
import { afterPrior, BATCH_BUFFER, batchBuffer, type ContentResult, identityChanged, PriorFailed, SEND_BUFFERS, sendFileContent, sessionBatchBytes } from './content-send.js';
import { rateLimiter } from '../utils/rate-limit.js';
import { exchangeManifestsAndRoots, HASHING_AT_ONCE, listingLines, logListing, sendManifest, sendParts, treeSummary } from './tree-common.js';
import { Multiplexer, muxFrameData } from '../transport/mux.js';
import { NOTHING_REMOVED, removeSourceTree } from './remove-sources.js';
import { BatchRamp } from '../utils/batch-ramp.js';
import { ConnectionShare, type DataTurn, SharedUnits, WorkLimit } from '../utils/data-turns.js';
import { type FileProgress, TreeTransferProgress } from './tree-progress.js';
import type { ScanAhead } from './scan-ahead.js';

/** Large files whose conversations run at once in a multiplexed (version 2) session: enough
 * to hide ~3 round trips per file behind the data of the others (64 files in flight cover
 * a 30 ms RTT at ~700 files/s); each waiting file costs only its manifest and an open file. */
export const MUX_WINDOW = 64;
/** Batch buffers (2 MiB each) the files sending DATA at once on one connection may hold in
 * all: one big file's read-ahead (SEND_BUFFERS), or up to four small deltas (one each). A file
 * holds its buffers only while it sends, so memory does not grow with the window. Two big files
 * at once on one connection only held twice the batches in both peers, the wire or the
 * receiver's disk no faster (decisions §78). */
export const DATA_BUFFERS = SEND_BUFFERS;

/** The batch buffers a session's sender holds at most: DATA_BUFFERS on one connection; twice that
 * with lanes, whose files send at once, each connection in its own turns (decisions §81), and
 * share these buffers (a file waits for one when they are all in use). */
export function dataBuffers(connections: number): number {
  return connections > 1 ? 2 * DATA_BUFFERS : DATA_BUFFERS;
}

/** Lanes a `--quic` tree session asks for unless --parallel says otherwise. */
export const QUIC_LANES = 16;

export interface TreeSendOptions {
  /** Exclude patterns (rsync-like; see docs/cli.md, "Excludes"): the walk's. They travel to the receiver
   * unless `wireExcludes` says otherwise. */
  excludes?: string[];
  /** The receiver's rules when they differ from the walk's (rsync's H/S/P/R). */
  wireExcludes?: string[];
  /** Per-directory merge files the walk reads (rsync's -F, -C, `: NAME`); their rules
   * follow in FILTER, so the FILTER frame waits for the walk. */
  dirMerge?: DirMergeSpec[];
  /** rsync's --files-from: only these paths (and the directories on the way); with
   * `filesFromRecursive`, also what is below a listed directory. */
  filesFrom?: string[];
  filesFromRecursive?: boolean;
  /** Keep files only the receiver has. */
  noDelete?: boolean;
  /** Report what would change on both sides; write nothing. */
  dryRun?: boolean;
  /** Spread large-file conversations over this many connections, or QUIC streams (1..16;
   * default 1 over TCP, QUIC_LANES over QUIC where a stream costs no handshake). */
  parallel?: number;
  /** List each change as it is planned (rsync's -v). */
  verbose?: boolean;
  /** `sync`: list changes as rsync does (-v names, -i itemized lines); see tree-common.ts. */
  listing?: import('./tree-common.js').Listing;
  /** Do not enter directories on other filesystems (rsync's -x). */
  oneFileSystem?: boolean;
  /** rsync's -o / -g / -X (AttrFlag bits): owners, groups, xattrs travel in TREE_ATTRS. */
  attrs?: number;
  /** `sync` without -l / -t / -p (rsync): symlinks left out (each noted), times and
   * permissions not kept (see TreeOptions). Defaults keep all three. */
  omit?: { links?: boolean; times?: boolean; perms?: boolean };
  /** rsync's -m/--prune-empty-dirs: directories with no file below them are not sent. */
  pruneEmptyDirs?: boolean;
  /** rsync's -L/--copy-links: symlinks are sent as what they point to (files, directories). */
  copyLinks?: boolean;
  /** rsync's --delete-excluded: paths our excludes hide are deleted on the receiver too
   * (with deletion on: it implies --delete, as in rsync). */
  deleteExcluded?: boolean;
  /** rsync's --size-only, --ignore-existing, --existing (see TreeOptions). */
  choices?: { sizeOnly?: boolean; ignoreExisting?: boolean; existingOnly?: boolean; wholeSmall?: boolean };
  /** rsync's --max-size / --min-size (bytes): files outside are left alone on both sides. */
  maxSize?: number;
  minSize?: number;
}

interface Context extends SendOptions {
  stateDir: string;
  negotiated: Negotiated;
  summary: SyncSummary;
  st: BigIntStats;
  /** Opens one more connection or stream to the receiver for a lane. */
  dialLane?: () => Promise<Duplex>;
  /** Lanes are network connections of their own (see SenderContext). */
  lanesOwnConnections?: boolean;
  /** The walk, started before connecting (`startWalk`). */
  walking: Promise<NativeTreeSync>;
  /** Set when the receiver's HELLO has not come yet: `negotiated` is then what it said at the
   * last session (utils/remembered-hello.ts), and this is what it says now. The offer and our
   * manifest go before it comes, when they would be the same for both (decisions §93). */
  hello?: Promise<Negotiated>;
  /** Hashing the likely files ahead until triage (decisions §95). */
  scanAhead?: ScanAhead;
}

/** Walk the source tree (in parallel, natively); progress counts entries. */
export function startWalk(root: string, o: SendOptions, stateDir: string): Promise<NativeTreeSync> {
  const excludes = o.tree?.excludes ?? [];
  return inPhase(o.events, 'scanning', 0, (progress) => walkTree(root, { excludes, stateDir, ignoreIndex: o.checksum, isSender: true, oneFileSystem: o.tree?.oneFileSystem, skipSymlinks: o.tree?.omit?.links, copyLinks: o.tree?.copyLinks, dirMerge: o.tree?.dirMerge, filesFrom: o.tree?.filesFrom, filesFromRecursive: o.tree?.filesFromRecursive, chmod: o.chmod, pruneEmptyDirs: o.tree?.pruneEmptyDirs }, progress));
}

export async function sendTree(conn: FramedConnection, o: Context): Promise<void> {
  const t = o.tree ?? {};
  const lanesWanted = t.dryRun ? 1 : Math.max(1, Math.min(MAX_LANES, t.parallel ?? (o.quic ? QUIC_LANES : 1)));
  const offer = await offerTree(conn, o, lanesWanted);
  const { options, early } = offer;
  const tree = await conn.keepAlive(o.walking);
  const stats = tree.stats();
  for (const p of stats.problems) o.events?.info?.(`warning: ${p}`);
  // Each a method call: a handler may be a class's method, which needs its `this`.
  for (const n of stats.notices) {
    if (o.events?.notice) o.events.notice(n);
    else o.events?.info?.(n);
  }
  // Sent before the receiver's HELLO came, our manifest goes now too; nothing of the receiver's
  // is read before its HELLO has been checked against what the offer assumed.
  // Stored, not compressed, only for a receiver in this process (a local sync).
  const compressManifest = o.compressManifest !== false;
  const manifestSent = early ? sendManifest(conn, tree, compressManifest) : undefined;
  if (early) o.negotiated = await confirmEarlyOffer(o, offer);
  const lanes = lanesWanted > 1 ? decodeLanes((await expect(conn, FrameType.LANES)).payload) : undefined;
  await exchangeManifestsAndRoots(conn, tree, Boolean(o.checksum), o.events, manifestSent ?? sendManifest(conn, tree, compressManifest));
  const triaged = call(tree.triage(Boolean(o.checksum), !t.noDelete, Boolean(o.update), Boolean(o.wholeFile), t.maxSize, t.minSize, options.omitTimes, options.omitPerms, options.sizeOnly, options.ignoreExisting, options.existingOnly, options.wholeSmall));
  // The plan is known: each conversation hashes what it needs from here (ahead of it, the
  // scans started by now finish).
  const counts = await triaged.finally(() => o.scanAhead?.stop());
  o.summary.size = counts.sourceBytes;
  o.summary.tree = treeSummary(stats, counts);
  const listing = () => listingLines(tree, t.listing);
  logListing(tree, t.listing);
  if (t.dryRun) {
    for (const line of listing()) reportChange(o.events, line, true);
    await conn.send(FrameType.TREE_END, encodeTreeEnd({ smallFiles: 0, largeFiles: 0, senderProblems: stats.problems.length }));
  } else {
    if (t.verbose || t.listing?.itemize) for (const line of listing()) reportChange(o.events, line, false);
    await sendFiles(conn, o, { tree, lanes, attrs: options.attrs, problems: { n: stats.problems.length + counts.skipped } });
  }
  await settleTreeResult(conn, o, tree, counts);
}

/** OFFER, FILTER and TREE_OPTIONS: what the receiver needs to walk its side and triage as we
 * do. Options this receiver cannot honour fail here, before anything moves (exit 2). `early`:
 * they went before the receiver's HELLO came (Context.hello), which is still to be checked. */
async function offerTree(conn: FramedConnection, o: Context, lanesWanted: number): Promise<OfferSent> {
  const t = o.tree ?? {};
  const attrs = t.dryRun ? 0 : (t.attrs ?? 0);
  const options: TreeOptions = { maxSize: t.maxSize, minSize: t.minSize, attrs, omitTimes: t.omit?.times, omitPerms: t.omit?.perms, ...t.choices };
  let shape = offerShape(options, o.negotiated);
  // What the remembered receiver could not take waits for what the receiver says now.
  const early = o.hello !== undefined && !(shape instanceof FfsyncError);
  if (o.hello && !early) shape = offerShape(options, (o.negotiated = await o.hello));
  if (shape instanceof FfsyncError) throw shape;
  const flags =
    (o.checksum ? OfferFlag.CHECKSUM : 0) | (t.noDelete ? OfferFlag.NO_DELETE : 0) | (t.dryRun ? OfferFlag.DRY_RUN : 0) | (lanesWanted > 1 ? OfferFlag.PARALLEL : 0) |
    (o.update ? OfferFlag.UPDATE : 0) |
    (o.wholeFile ? OfferFlag.WHOLE_FILE : 0) |
    (t.oneFileSystem ? OfferFlag.ONE_FILE_SYSTEM : 0);
  const size = lanesWanted > 1 ? BigInt(lanesWanted) : 0n;
  await conn.send(FrameType.OFFER, encodeOffer({ kind: OfferKind.TREE, size, mtimeNs: o.st.mtimeNs, mode: Number(o.st.mode & 0o7777n), flags }));
  // --delete-excluded: the receiver walks without our excludes, so what they hide on its
  // side is not on our list and goes as extraneous (our own walk still leaves it out).
  // Rules from per-directory merge files are known once the walk has read them.
  const merged = t.dirMerge?.length && !t.deleteExcluded ? (await conn.keepAlive(o.walking)).mergedRules() : [];
  const wire = t.deleteExcluded ? [] : [...(t.wireExcludes ?? t.excludes ?? []), ...merged];
  if (merged.length) validateExcludes(wire);
  await conn.send(FrameType.FILTER, encodeFilter(wire));
  if (shape.treeOptions) await conn.send(FrameType.TREE_OPTIONS, encodeTreeOptions(options));
  return { options, treeOptions: shape.treeOptions, early };
}

/** What offerTree sent: the options, whether TREE_OPTIONS went, and whether all of it went
 * before the receiver's HELLO came (then still to be checked against it). */
interface OfferSent {
  options: TreeOptions;
  treeOptions: boolean;
  early: boolean;
}

/** What the offer of `options` is to a receiver with `n`'s capabilities: whether TREE_OPTIONS
 * goes (capability SIZE_LIMITS), or why these options cannot go to it at all (exit 2). */
function offerShape(options: TreeOptions, n: Negotiated): { treeOptions: boolean } | FfsyncError {
  const peer = n.peerSoftware;
  if (hasRsyncChoices(options) && !(n.capabilities & Capability.TRIAGE_CHOICES)) {
    return new FfsyncError('EPROTOCAP', ExitCode.PROTOCOL_INCOMPATIBLE, `the receiver (${peer}) does not support --size-only / --ignore-existing / --existing: upgrade it`);
  }
  // Set by a local sync only, whose receiver is this build (so never refused in practice).
  if (options.wholeSmall && !(n.capabilities & Capability.WHOLE_SMALL && n.capabilities & Capability.TRIAGE_CHOICES)) {
    return new FfsyncError('EPROTOCAP', ExitCode.PROTOCOL_INCOMPATIBLE, `the receiver (${peer}) cannot take changed files whole in batches: give --no-whole-file, or upgrade it`);
  }
  if ((options.omitTimes || options.omitPerms) && !(n.capabilities & Capability.OMIT_ATTRS)) {
    return new FfsyncError('EPROTOCAP', ExitCode.PROTOCOL_INCOMPATIBLE, `the receiver (${peer}) always keeps times and permissions: give -t and -p (or -a), or upgrade it`);
  }
  if (n.capabilities & Capability.SIZE_LIMITS) return { treeOptions: true };
  // Without SIZE_LIMITS no TREE_OPTIONS goes: options only it carries cannot apply, and this
  // side's triage must not use what the receiver's will not (its choices byte included).
  if (options.maxSize !== undefined || options.minSize !== undefined || options.attrs || hasTriageChoices(options)) {
    const asked = ['--max-size / --min-size / -o / -g / -X', ...(hasRsyncChoices(options) ? ['--size-only / --ignore-existing / --existing'] : []), ...(options.wholeSmall ? ['whole copies of changed files'] : [])];
    return new FfsyncError('EPROTOCAP', ExitCode.PROTOCOL_INCOMPATIBLE, `the receiver (${peer}) does not support ${asked.join(' / ')}`);
  }
  return { treeOptions: false };
}

/** The receiver's HELLO, after an offer that went before it: the offer must be what this
 * receiver takes (a receiver changed since the last session in a way that matters fails this
 * session, exit 2, and is remembered as it is now for the next). */
async function confirmEarlyOffer(o: Context, sent: OfferSent): Promise<Negotiated> {
  const actual = await o.hello!;
  const shape = offerShape(sent.options, actual);
  if (shape instanceof FfsyncError) throw shape;
  if (shape.treeOptions !== sent.treeOptions) {
    throw new FfsyncError(
      'EPROTOCHANGED',
      ExitCode.PROTOCOL_INCOMPATIBLE,
      `the receiver (${actual.peerSoftware}) is not the build it was at the last session (it was ${o.negotiated.peerSoftware}), and the tree was offered as that one takes it; it is remembered as it is now: run again`,
    );
  }
  return actual;
}

/** What sending the files of a triaged tree shares. */
interface TreeSending {
  tree: NativeTreeSync;
  /** The receiver's LANES grant, when we asked for lanes. */
  lanes: ReturnType<typeof decodeLanes> | undefined;
  attrs: number;
  /** Source paths that could not be read, counted into TREE_END as files fail. */
  problems: { n: number };
}

/** Small files in batches and large files in conversations, on lanes when granted; then the
 * attribute table and TREE_END. */
async function sendFiles(conn: FramedConnection, o: Context, s: TreeSending): Promise<void> {
  const { tree, lanes, problems } = s;
  const level = o.negotiated.capabilities & Capability.ZSTD ? (o.compressLevel ?? 1) : 0;
  // Version 2: large files' conversations run many at once on multiplexed streams, beside
  // the small-file batches; version 1: small files first, then one large file at a time
  // per connection.
  const multiplexed = o.negotiated.version >= 2;
  // One --bwlimit for the session, however many files send at once.
  const limiter = o.bwlimitKiBps ? rateLimiter(o.bwlimitKiBps * 1024) : undefined;
  // One governor for the session: what it learned about the link carries over to each file.
  const link = deliveryMeter(conn, o.negotiated);
  const gov = new LevelGovernor(level, o.compressLevel === undefined, startLevel(level, o.handshakeMs), { link });
  // One phase for every file the tree moves, small and large, on every connection.
  const transfer = new TreeTransferProgress(o.events, 'sending');
  transfer.start(o.summary.tree!.transferBytes);
  const smallSent = multiplexed ? sendSmallFiles(conn, tree, gov, o, transfer, limiter) : Promise.resolve(await sendSmallFiles(conn, tree, gov, o, transfer, limiter));
  smallSent.catch(() => undefined);
  const large = tree.largeTransfers();
  // The turns bound how many buffers are in use at once; these are recycled across files.
  // Lanes only pay off with more than one large file to spread.
  const extra = lanes && o.dialLane ? Math.min(lanes.granted, large.length) - 1 : 0;
  const connections = 1 + Math.max(0, extra);
  const budget = dataBuffers(connections);
  // On many lanes, smaller batches: the receiver assembles a frame on each lane at once (§120).
  const batchBytes = sessionBatchBytes(connections);
  const buffers = new BufferPool(batchBuffer(batchBytes), multiplexed ? budget : SEND_BUFFERS * Math.max(1, lanes?.granted ?? 1));
  // One ramp of first batches for the session: its first chunk-level DATA starts small.
  const ramp = new BatchRamp();
  const shared: LargeSending = { tree, gov, problems, o, queue: [...large], limiter, buffers, batchBytes, transfer, ramp };
  // Files start on the first connection at once; each lane takes its share of the streams
  // (or, in version 1, its turn at the queue) as soon as it has joined.
  const streamsEach = Math.ceil(MUX_WINDOW / connections);
  const streams = multiplexed ? streamSender(shared, budget, extra > 0 && o.lanesOwnConnections === true) : undefined;
  // A lane's work ends with its last RESULT (its LANE_END follows, on its own connection).
  const worker = async (c: FramedConnection, lanesJoining?: Promise<void>) => {
    if (streams) return streams(c, streamsEach, lanesJoining).settled;
    for (let lt = shared.queue.shift(); lt; lt = shared.queue.shift()) await (await sendLarge(c, tree, lt, gov, problems, o, { limiter, buffers, batchBytes, transfer, ramp })).rest;
  };
  // The first connection's streams: TREE_END waits only until every file on them is sent; their
  // last RESULTs are read after it (decisions §91).
  let results: Promise<void> | undefined;
  const firstConnection = async (lanesJoining?: Promise<void>): Promise<void> => {
    if (!streams) return worker(conn, lanesJoining);
    const work = streams(conn, streamsEach, lanesJoining);
    results = work.settled;
    results.catch(() => undefined);
    return work.sent;
  };
  // Set once the session's work has ended (done or failed): a lane joining after that starts
  // nothing; it is only closed.
  let ended = false;
  const opening =
    extra > 0
      ? openLanes(extra, { dial: o.dialLane!, label: `${o.host}:${o.port}`, peerFingerprint: o.summary.peerFingerprint, token: lanes!.token, timeoutMs: o.timeoutMs ?? 60_000 }, async (lane) => {
          if (ended) return;
          link?.add(lane);
          await worker(lane);
          await lane.send(FrameType.LANE_END);
        })
      : undefined;
  try {
    // The first connection works too, and keeps the session alive while lanes finish.
    await conn.keepAlive(Promise.all([...(multiplexed ? [smallSent] : []), firstConnection(opening?.settled), opening?.work]));
  } finally {
    ended = true;
    await opening?.settled;
    const laneConns = opening?.lanes ?? [];
    o.summary.tree!.lanes = 1 + laneConns.length;
    if (laneConns.length) o.summary.tree!.laneBytesSent = [conn.bytesSent, ...laneConns.map((l) => l.bytesSent)];
    for (const l of laneConns) {
      countLaneBytes(o.summary, l);
      await l.close();
    }
  }
  transfer.end();
  // Owners, groups, xattrs: after every file, so the receiver applies them to the result.
  if (s.attrs) await sendParts(conn, FrameType.TREE_ATTRS, await call(tree.collectAttrs(s.attrs)));
  await conn.send(FrameType.TREE_END, encodeTreeEnd({ smallFiles: await smallSent, largeFiles: large.length, senderProblems: problems.n }));
  // The receiver answers TREE_END once its streams have ended (their files written), so the
  // RESULTs still to come arrive before its TREE_RESULT; they are read (and their roots
  // claimed for our index) first.
  if (results) await conn.keepAlive(results);
}

/** What every large file's conversation in a session shares. */
interface LargeSending {
  tree: NativeTreeSync;
  gov: LevelGovernor;
  problems: { n: number };
  o: Context;
  /** Large files not yet started, in plan order. */
  queue: LargeTransferInfo[];
  limiter: ((n: number) => Promise<void>) | undefined;
  buffers: BufferPool;
  /** Raw bytes per DATA batch (`buffers` fit them), and the MUX frames' cut to match. */
  batchBytes: number;
  transfer: TreeTransferProgress;
  ramp: BatchRamp;
}

/** Version 2: large files on up to MUX_WINDOW streams spread over the connections (lanes add
 * bandwidth; the window of streams is what hides the round trips). Each stream pipelines its
 * files: the next starts while the previous waits for its RESULT. The result adds a
 * connection, with its number of streams, whenever it joins; files are taken from one queue
 * in plan order by whichever connection's stream is free.
 *
 * `perConnection` (TCP lanes, each a network path of its own): each connection has its own
 * DATA turns (DATA_BUFFERS, one big file at a time) drawing on the session's `budget`, and takes
 * files only a little ahead of what it sends (ConnectionShare.hasRoom), so the files go to the
 * connections as they have room, and two big files send at once on two connections (decisions
 * §81). Otherwise (one connection; QUIC lanes, which share one connection's bandwidth; in-process
 * lanes) one set of DATA turns with the `budget` serves the session. */
function streamSender(s: LargeSending, budget: number, perConnection: boolean): (conn: FramedConnection, streams: number, lanesJoining?: Promise<void>) => StreamsWork {
  const hashing = new WorkLimit(HASHING_AT_ONCE);
  const units = perConnection ? new SharedUnits(budget) : undefined;
  const sessionShare = perConnection ? undefined : new ConnectionShare(budget);
  const run = async (mux: Multiplexer, take: () => Promise<Taken | undefined>, putBack: (item: Taken) => void, sent: () => void) => {
    let c = mux.open();
    // The previous file on this stream: its RESULT is still to come (pipelined).
    let prior: Promise<boolean> = Promise.resolve(false);
    try {
      for (let item = await take(); item; item = await take()) {
        try {
          prior = (await sendLarge(c, s.tree, item.lt, s.gov, s.problems, s.o, { limiter: s.limiter, turn: item.turn, stream: true, prior, hashing, buffers: s.buffers, batchBytes: s.batchBytes, transfer: s.transfer, ramp: s.ramp })).rest;
        } catch (e) {
          if (!(e instanceof PriorFailed)) throw e;
          if (e.fatal) throw e.cause;
          // The previous file's conversation ended with an ERROR on its stream (it changed
          // on our side): the stream is spent, this file goes again on a fresh one.
          putBack(item);
          c.destroy();
          c = mux.open();
          prior = Promise.resolve(false);
        }
      }
      // Every file on this stream is sent: LANE_END goes now, not after the last RESULT, so
      // TREE_END need not wait a round trip for it (decisions §91). A stream that failed under
      // us may refuse the frame, and a receiver that dropped its side drops it: `prior` says
      // how the stream ended either way.
      await endStream(c).catch(() => undefined);
      sent();
      if (await prior) {
        c.destroy(); // spent by the last file: the receiver dropped its side
        return;
      }
      await c.close();
    } catch (e) {
      c.destroy();
      throw e;
    }
  };
  return (conn, streams, lanesJoining) => {
    const share = sessionShare ?? new ConnectionShare(DATA_BUFFERS, units);
    // The first connection: one file ahead until every lane has joined (or failed to), so the
    // lanes find files to take (a tree of two big files would otherwise be its alone).
    if (!sessionShare && lanesJoining) {
      share.holdOne(true);
      void lanesJoining.then(() => share.holdOne(false));
    }
    // Files are taken in plan order, each with its DATA turn on this connection; a file put
    // back (its stream was spent under it before it read anything) goes first, turn and all.
    const again: Taken[] = [];
    const take = async (): Promise<Taken | undefined> => {
      for (;;) {
        if (again.length) return again.shift();
        if (!s.queue.length) return undefined;
        if (share.hasRoom()) {
          const lt = s.queue.shift()!;
          return { lt, turn: share.turn(lt.size) };
        }
        await share.changed();
      }
    };
    const mux = new Multiplexer(conn, { opener: true, frameData: muxFrameData(batchBuffer(s.batchBytes)) });
    const runs = Array.from({ length: Math.min(streams, s.queue.length) }, () => {
      let sent!: () => void;
      const allSent = new Promise<void>((resolve) => (sent = resolve));
      const settled = run(mux, take, (item) => again.unshift(item), sent);
      // A stream that fails before its files are sent fails `sent` too.
      return { sent: Promise.race([allSent, settled]), settled };
    });
    const settled = Promise.all(runs.map((r) => r.settled)).then(() => undefined);
    const sent = Promise.all(runs.map((r) => r.sent)).then(() => undefined);
    sent.catch(() => undefined);
    return { sent, settled };
  };
}

/** LANE_END on stream `c`, resolved once it has been handed to the stream's connection: the
 * stream's frames are written in order, so a frame sent on the connection after this (TREE_END)
 * cannot overtake any of them (a stream's writes are buffered: `send` resolves before, and
 * TREE_END was seen ahead of a stream's DATA_END). */
function endStream(c: FramedConnection): Promise<void> {
  return c.orFailure(new Promise<void>((resolve, reject) => c.send(FrameType.LANE_END, Buffer.alloc(0), resolve).catch(reject)));
}

/** A connection's streams: `sent` once each has sent its files and LANE_END, `settled` once
 * their last RESULTs are read too (either rejects with a stream's failure). */
interface StreamsWork {
  sent: Promise<void>;
  settled: Promise<void>;
}

/** A large file taken by a stream, with its DATA turn. */
interface Taken {
  lt: LargeTransferInfo;
  turn: DataTurn;
}

/** The receiver's TREE_RESULT: the summary's counts, the session's exit code, and
 * --remove-source-files once the receiver has everything. */
async function settleTreeResult(conn: FramedConnection, o: Context, tree: NativeTreeSync, counts: PlanCounts): Promise<void> {
  const t = o.tree ?? {};
  const result = decodeTreeResult((await expect(conn, FrameType.TREE_RESULT)).payload);
  await call(tree.finishSender());
  const s = o.summary.tree!;
  s.deleted = Number(result.deleted);
  s.written = Number(result.filesWritten);
  o.summary.literalBytes = Number(result.literalBytes);
  o.summary.matchedBytes = Number(result.matchedBytes);
  o.summary.upToDate = result.filesWritten === 0n && result.deleted === 0n && counts.attrsOnly === 0;
  // --max-delete left deletions undone (exit 25): every file was still synced.
  const limited = result.exitCode === ExitCode.DELETE_LIMIT;
  if (result.exitCode !== 0 && !limited) {
    conn.errorSent = true; // the receiver reported it; nothing to tell it
    if (o.removeSourceFiles && !t.dryRun) o.events?.info?.(NOTHING_REMOVED);
    const what = result.exitCode === ExitCode.VANISHED ? 'some source files vanished' : `${result.errorCount} path(s) could not be synced`;
    throw new FfsyncError(result.exitCode === ExitCode.VANISHED ? 'EVANISHED' : 'EPARTIAL', result.exitCode as ExitCode, `partial transfer: ${what}\n${result.message}`.trimEnd());
  }
  if (o.removeSourceFiles && !t.dryRun) {
    conn.errorSent = true; // the session is over on the receiver's side: a failure here is ours alone
    await removeSourceTree(tree, o.events);
    conn.errorSent = false;
  }
  if (limited) {
    conn.errorSent = true;
    throw new FfsyncError('EMAXDELETE', ExitCode.DELETE_LIMIT, result.message || 'Deletions stopped due to --max-delete limit');
  }
}

interface LargeOptions {
  limiter?: (n: number) => Promise<void>;
  /** Multiplexed: this file's DATA turn. */
  turn?: DataTurn;
  /** `c` is a multiplexed stream: a file that changed under us ends its stream with an ERROR
   * (exit 24 for that file only) and the session goes on; and conversations are pipelined:
   * `prior` is the previous file's on this stream, still waiting for its RESULT. */
  stream?: boolean;
  prior?: Promise<boolean>;
  hashing?: WorkLimit;
  /** The session's batch buffers (see SendContentOptions.buffers), of `batchBytes` batches. */
  buffers?: BufferPool;
  batchBytes?: number;
  /** The tree's sending phase, which counts this file's progress. */
  transfer: TreeTransferProgress;
  /** The session's ramp of first batches (see SendContentOptions.ramp). */
  ramp?: BatchRamp;
}

/** One large file's conversation on connection `c` (FILE_BEGIN, then the single-file
 * exchange); a file that vanished or cannot be read is announced and skipped. Resolves once
 * this file's DATA is out (on a stream) or its conversation ended, to the rest of it: a
 * promise of whether the file ended its stream (see LargeOptions.stream). Throws PriorFailed
 * (turn kept) when the previous file on the stream did not end cleanly. */
async function sendLarge(c: FramedConnection, tree: NativeTreeSync, lt: LargeTransferInfo, gov: LevelGovernor, problems: { n: number }, o: Context, lo: LargeOptions): Promise<{ rest: Promise<boolean> }> {
  const progress = lo.transfer.file();
  try {
    const rest = await sendLargeFile(c, tree, lt, gov, problems, o, lo, progress);
    lo.turn?.done();
    return rest;
  } catch (e) {
    if (!(e instanceof PriorFailed)) lo.turn?.done();
    throw e;
  } finally {
    progress.end(0); // (a file that went has ended already, with its size)
  }
}

async function sendLargeFile(c: FramedConnection, tree: NativeTreeSync, lt: LargeTransferInfo, gov: LevelGovernor, problems: { n: number }, o: Context, lo: LargeOptions, progress: FileProgress): Promise<{ rest: Promise<boolean> }> {
  const abs = joinTreePath(o.path, lt.path);
  // -L: the walk listed what the link points to; that is what is checked and read.
  const statOf = (p: string | Buffer) => (o.tree?.copyLinks ? fs.stat(p, { bigint: true }) : fs.lstat(p, { bigint: true }));
  const st = await statOf(abs).catch(() => undefined);
  const unsendable = await whyUnsendable(abs, lt, st);
  if (!st || unsendable !== undefined) {
    // (Not before the previous file on the stream ended: a spent stream would lose it.)
    await afterPrior(lo.prior);
    const status = unsendable ?? FileBeginStatus.VANISHED;
    if (status === FileBeginStatus.UNREADABLE) problems.n++;
    const shown = showTreePath(lt.path);
    o.events?.info?.(status === FileBeginStatus.UNREADABLE ? `warning: cannot read ${shown} (permission denied); skipped` : `warning: ${shown} vanished or changed before it was sent`);
    await c.send(FrameType.FILE_BEGIN, encodeFileBegin(lt.action, status));
    return { rest: Promise.resolve(false) };
  }
  const failed: FailedFile = { c, lt, o, stream: lo.stream, stillAsScanned: async () => !identityChanged(await statOf(abs).catch(() => undefined), st) };
  await c.send(FrameType.FILE_BEGIN, encodeFileBegin(lt.action, FileBeginStatus.SENDING));
  // Hashed ahead, its manifest is in the index; none is started for it from now on.
  o.scanAhead?.claim(lt.path);
  let r: ContentResult;
  try {
    const caps = o.negotiated.capabilities;
    r = await sendFileContent(c, {
      path: abs,
      st,
      scan: null,
      stateDir: o.stateDir,
      checksum: o.checksum,
      level: gov.level,
      governor: gov,
      batchStream: Boolean(caps & Capability.BATCH_STREAM),
      batchPrefix: Boolean(caps & Capability.BATCH_PREFIX),
      bwlimitKiBps: o.bwlimitKiBps,
      events: progress.events,
      label: showTreePath(lt.path),
      refine: Boolean(caps & Capability.REFINE),
      sparse: Boolean(caps & Capability.SPARSE),
      commitRefusal: Boolean(caps & Capability.COMMIT_REFUSAL),
      stream: Boolean(caps & Capability.STREAM),
      overlap: o.overlap,
      dataTurn: lo.turn,
      buffers: lo.buffers,
      batchBytes: lo.batchBytes,
      limiter: lo.limiter,
      prior: lo.prior,
      resultLater: lo.stream,
      hashing: lo.hashing,
      ramp: lo.ramp,
    });
  } catch (e) {
    if (e instanceof PriorFailed) throw e;
    return { rest: Promise.resolve(await failedAlone(e, failed)) };
  }
  // Its data is out (or it was up to date): the whole file counts as sent.
  progress.end(lt.size);
  const ended = async (res: ContentResult): Promise<boolean> => {
    if (res.refused) return false; // the receiver reports it (TREE_RESULT)
    if (await failed.stillAsScanned()) tree.claimRoot(lt.action, res.root);
    return false;
  };
  const rest = (r.settled ?? Promise.resolve(r)).then(ended, (e: unknown) => failedAlone(e, failed));
  rest.catch(() => undefined); // the caller handles it (the next file on the stream waits for it)
  return { rest };
}

/** Why a large file cannot be sent as the plan has it: it is gone or no longer the walk's
 * version (VANISHED), or we may not read it (UNREADABLE); undefined: it can be sent. */
async function whyUnsendable(abs: string | Buffer, lt: LargeTransferInfo, st: BigIntStats | undefined): Promise<(typeof FileBeginStatus)['VANISHED' | 'UNREADABLE'] | undefined> {
  if (!st?.isFile() || st.size !== BigInt(lt.size) || st.mtimeNs !== lt.mtimeNs) return FileBeginStatus.VANISHED;
  const readable = await fs.access(abs, fs.constants.R_OK).then(
    () => true,
    () => false,
  );
  return readable ? undefined : FileBeginStatus.UNREADABLE;
}

/** A large file whose conversation failed, and what failedAlone needs to judge it. */
interface FailedFile {
  c: FramedConnection;
  lt: LargeTransferInfo;
  o: Context;
  stream?: boolean;
  /** The source is still the version that was hashed. */
  stillAsScanned: () => Promise<boolean>;
}

/** The file failed alone (true), after a chunk the receiver rejected because the file changed
 * after it was hashed, or a change we saw ourselves on a stream; anything else is rethrown. */
async function failedAlone(e: unknown, f: FailedFile): Promise<boolean> {
  const err = e as FfsyncError;
  let changed: FfsyncError | undefined;
  // Our own read failing (the file gone between our check and its open, or while it was read)
  // is the source vanishing when the file is no longer the version the walk listed (exit 24,
  // "rerun"), not an I/O error (exit 11); one that fails on an unchanged file is.
  const ownRead = err.origin !== 'peer' && err.exitCode === ExitCode.FILE_IO;
  if ((err.code === 'ECHUNK' || ownRead) && !(await f.stillAsScanned())) {
    changed = new FfsyncError('EVANISHED', ExitCode.VANISHED, `source ${showTreePath(f.lt.path)} changed or vanished during the sync; rerun to send the new version`, { cause: e });
  } else if (f.stream && err.code === 'EVANISHED' && err.origin !== 'peer') changed = err;
  if (!changed) throw e;
  // Say so on the connection that carried the file (exit 24, "rerun"): the receiver waits
  // there for this verdict (a lane's too; the session's own report on the first connection
  // follows, once). On a stream, that file alone fails: the receiver reports it as vanished
  // and the session goes on.
  await reportError(f.c, changed);
  if (!f.stream) throw changed;
  f.o.events?.info?.(`warning: ${changed.message}`);
  return true;
}

/** Stream every small file in FILE_BATCH frames: the next batch is read (in parallel,
 * natively) while the previous one is being written to the socket. Returns the count. */
async function sendSmallFiles(conn: FramedConnection, tree: NativeTreeSync, gov: LevelGovernor, o: Context, transfer: TreeTransferProgress, limiter?: (n: number) => Promise<void>): Promise<number> {
  const counts = o.summary.tree!;
  if (counts.smallTransfers === 0) return 0;
  const pool = new BufferPool(BATCH_BUFFER, 3);
  const shared = Boolean(o.negotiated.capabilities & Capability.BATCH_STREAM);
  const read = async (cursor: number): Promise<{ buf: Buffer; res: SmallBatch }> => {
    const buf = await pool.acquire();
    return { buf, res: await call(tree.readSmall(cursor, buf, gov.level, shared)) };
  };
  let next: Promise<{ buf: Buffer; res: SmallBatch }> | undefined = read(0);
  while (next) {
    const t0 = nowMs();
    const got: { buf: Buffer; res: SmallBatch } = await next;
    const t1 = nowMs();
    const { buf, res } = got;
    next = res.next >= 0 ? read(res.next) : undefined;
    next?.catch(() => undefined);
    if (res.length > 0) {
      await conn.send(FrameType.FILE_BATCH, buf.subarray(0, res.length), () => pool.release(buf));
      if (limiter) await conn.orFailure(limiter(res.length));
      gov.observe(t1 - t0, nowMs() - t1, res.length);
    } else pool.release(buf);
    transfer.add(res.rawBytes);
  }
  return counts.smallTransfers;
}
