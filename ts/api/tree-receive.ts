// The receiving side of a directory tree sync (see tree-send.ts for the frame sequence).
// Everything is rebuilt out of place and verified before it replaces anything; deletions
// wait until every transfer succeeded and are skipped (as rsync does) after any error.

import crypto from 'node:crypto';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { FramedConnection } from '../transport/connection.js';
import { FrameType, protocolError } from '../protocol/frames.js';
import {
  Capability,
  decodeFileBegin,
  decodeFilter,
  decodeTreeOptions,
  ManifestAssembler,
  MAX_ATTR_TABLE_BYTES,
  type TreeOptions,
  decodeTreeEnd,
  encodeLanes,
  encodeTreeResult,
  FileBeginStatus,
  MAX_LANES,
  type Offer,
  OfferFlag,
} from '../protocol/messages.js';
import { call, type LargeTransferInfo, type NativeTreeSync, type PlanCounts, scanFile, type StepOutcome, walkTree } from '../native/binding.js';
import { ExitCode, FfsyncError, fromSystemError } from '../utils/errors.js';
import { joinTreePath, showTreePath } from '../utils/tree-path.js';
import { countLaneBytes, expect, expectUnless, type Negotiated, reportError, senderVerdict } from './session.js';
import type { Listener } from '../transport/tcp.js';
import { acceptLanes, LANE_TOKEN_BYTES } from './lanes.js';
import { inPhase, reportChange, type SyncEvents, type SyncSummary } from './events.js';
import { TreeTransferProgress } from './tree-progress.js';
import type { ReceiveOptions } from './receive.js';
import { hashWithin } from './content-send.js';
import { receiveFileContent, WRITES_IN_FLIGHT } from './content-receive.js';
import { WorkLimit } from '../utils/data-turns.js';
import { exchangeManifestsAndRoots, HASHING_AT_ONCE, listingLines, logListing, sendManifest, treeSummary } from './tree-common.js';
import { ScanAhead } from './scan-ahead.js';
import { laneWindow, Multiplexer, SessionWindow } from '../transport/mux.js';
import { writeSlots } from './write-slots.js';

export interface TreeReceiveOptions {
  /** The receiver's own patterns: matching paths are never deleted. */
  protect?: string[];
  /** Keep files only the receiver has, whatever the sender asks. */
  noDelete?: boolean;
  /** rsync's --max-delete: at most this many deletions; the rest are left (exit 25). */
  maxDelete?: number;
  /** rsync's --chown USER:GROUP: every entry gets this owner and/or group (with the
   * sender's -o/-g table, which --chown implies; owners only as root). */
  chown?: string;
  /** A pull lists its changes here, where the user is (rsync's -v names or -i lines). */
  listing?: import('./tree-common.js').Listing;
}

interface Context extends ReceiveOptions {
  target: string;
  stateDir: string;
  offer: Offer;
  summary: SyncSummary;
  /** Still accepting: extra lanes of a parallel session join through it (absent over
   * ssh or in-process: then one lane is granted, i.e. none extra). */
  listener?: Listener;
  peerFingerprint?: string;
  prewalk?: Prewalk;
  /** `receive`'s hashing of the prewalk's files while it waited (receive.ts). */
  waitingScan?: ScanAhead;
  negotiated: Negotiated;
}

/** A walk of the target made while waiting for the sender (no excludes, index used). */
export interface Prewalk {
  /** The directory walked: a session whose target turns out to be another ignores it. */
  root: string;
  tree: Promise<NativeTreeSync>;
  /** When it finished (0 while running). */
  doneAt: number;
}

/** How old a finished prewalk may be when the sender's FILTER arrives: older, the tree
 * is walked again (it may have changed while we waited; a walk is cheap next to waiting). */
const PREWALK_FRESH_MS = 2000;

export function startPrewalk(target: string, o: ReceiveOptions, stateDir: string): Prewalk {
  const p: Prewalk = { root: target, tree: Promise.resolve(undefined as unknown as NativeTreeSync), doneAt: 0 };
  p.tree = walkTree(target, { excludes: [], protect: o.tree?.protect, stateDir, ignoreIndex: o.checksum, isSender: false }).then((t) => {
    p.doneAt = Date.now();
    return t;
  });
  p.tree.catch(() => undefined);
  return p;
}

/** A multiplexed stream whose file failed alone (it changed on the sender): the stream ends,
 * the session goes on. */
class StreamSpent extends Error {}

/** How long a failed session waits for its lanes' and streams' clean-up. */
const SETTLE_MS = 5000;

/** Problems listed in TREE_RESULT (the full list is in the receiver's own output). */
const MAX_REPORTED = 20;

export async function receiveTree(conn: FramedConnection, o: Context): Promise<void> {
  await new TreeReceiver(conn, o).run();
}

/** What the session knows once both peers have triaged: large files arrive against it. */
interface Plan {
  tree: NativeTreeSync;
  root: string;
  /** Outstanding large transfers by action; `done` holds those whose FILE_BEGIN came. */
  large: Map<number, LargeTransferInfo>;
  done: Set<number>;
  summary: NonNullable<SyncSummary['tree']>;
  counts: PlanCounts;
}

/**
 * One tree session on the receiving side. The main connection carries small-file batches,
 * large files in turn (version 1) and the tree's end; lanes (`--parallel`) and multiplexed
 * streams (version 2) each carry large files' conversations at the same time, so the outcome
 * (errors, counts) is this object's, shared by all of them.
 */
class TreeReceiver {
  private readonly errors: string[] = [];
  private readonly vanished: string[] = [];
  private written = 0;
  private literal = 0;
  private matched = 0;
  private smallDone = 0;
  /** The tree's receiving phase: small files' batches and large files' data, every connection. */
  private readonly receiving: TreeTransferProgress;

  private readonly checksum: boolean;
  private readonly dryRun: boolean;
  /** Version 2: the sender runs large files' conversations on streams multiplexed on each
   * connection (transport/mux.ts); each stream is served like a lane. Streams are not lanes
   * for byte counts (their bytes are counted on the connection carrying them). */
  private readonly multiplexed: boolean;
  /** Basis files hashed at once while many conversations run (see HASHING_AT_ONCE). */
  private readonly hashing: WorkLimit | undefined;

  private readonly lanes: FramedConnection[] = [];
  private readonly streams: FramedConnection[] = [];
  private readonly muxes: Multiplexer[] = [];
  /** The unread stream bytes of all the session's connections, bounded together (decisions §82). */
  private readonly receiveWindow = new SessionWindow();
  /** The DATA batches the session's files write at once (decisions §82). */
  private readonly writeSlots = writeSlots();
  private readonly laneWork: Promise<void>[] = [];
  private laneFailure: FfsyncError | undefined;
  private failLanes: (e: FfsyncError) => void = () => undefined;
  /** Rejects with the first lane's or stream's failure: the main loop stops on it. */
  private readonly laneFailed: Promise<never>;
  private accepting: Promise<void> | undefined;
  /** The read-ahead is the session's: with lanes, each connection gets its share. */
  private connections = 1;
  /** From triage on: the deltas' old versions hashed ahead of their conversations. */
  private scanAhead: ScanAhead | undefined;
  /** Absent until triage: lanes and streams that join before it wait for it. */
  private plan: Plan | undefined;

  constructor(
    private readonly conn: FramedConnection,
    private readonly o: Context,
  ) {
    this.checksum = Boolean(o.checksum) || (o.offer.flags & OfferFlag.CHECKSUM) !== 0;
    this.dryRun = (o.offer.flags & OfferFlag.DRY_RUN) !== 0;
    this.multiplexed = o.negotiated.version >= 2;
    this.hashing = this.multiplexed ? new WorkLimit(HASHING_AT_ONCE) : undefined;
    this.receiving = new TreeTransferProgress(o.events, 'receiving');
    this.laneFailed = new Promise<never>((_, reject) => (this.failLanes = reject));
    this.laneFailed.catch(() => undefined);
  }

  async run(): Promise<void> {
    const { conn, o } = this;
    // Hashing while waiting (receive.ts, decisions §96) serves only a session whose
    // conversations read the index and start when their files' turns come.
    if (!this.hashesAhead()) o.waitingScan?.stop();
    this.carryStreams(conn);
    await this.grantLanes();
    const excludes = decodeFilter((await expect(conn, FrameType.FILTER)).payload);
    const limits: TreeOptions = o.negotiated.capabilities & Capability.SIZE_LIMITS ? decodeTreeOptions((await expect(conn, FrameType.TREE_OPTIONS)).payload) : { attrs: 0 };
    // Whole copies replace a file (a new inode, its hard links cut) where --inplace updates it:
    // this receiver's --inplace is not dropped silently, and ignoring the option instead would
    // leave the peers with different plans (decisions §107).
    if (limits.wholeSmall && o.inplace) throw new FfsyncError('EPROTOCAP', ExitCode.PROTOCOL_INCOMPATIBLE, 'the sender sends changed files up to 1 MiB whole, which this --inplace receiver would replace instead of updating: run the sender with --no-whole-file');
    const { root, scratch, existed } = await prepareRoot(o, this.dryRun);
    let opened: NativeTreeSync | undefined;
    try {
      const tree = await openTargetTree(conn, o, { root, scratch, excludes, checksum: this.checksum });
      // Held before the session's settings apply (a --backup-dir that cannot be made, a bad
      // --chown throw): the `finally` must release the tree's handles whatever fails next.
      opened = tree;
      applyTreeSettings(tree, o, this.dryRun);
      const plan = await this.triage(tree, root, limits);
      // The old versions the deltas start from are known now: hashed ahead, in plan order
      // (decisions §95), but none the scan while waiting began. Not where the index is not
      // read (-c).
      o.waitingScan?.stop();
      if (this.hashesAhead()) this.scanAhead = ScanAhead.receiver(plan.large.values(), root, o.stateDir, undefined, o.waitingScan);
      // Only this side knows whether it made the root (a pull's listing is printed here).
      const here = o.tree?.listing && { ...o.tree.listing, rootCreated: !existed };
      logListing(tree, here);
      if (this.dryRun) return await this.answerDryRun(plan, listingLines(tree, here));
      if (o.tree?.listing?.show) for (const line of listingLines(tree, here)) reportChange(o.events, line, false);
      await this.transfer(plan, limits);
    } catch (e) {
      await this.abandon(e);
      throw e;
    } finally {
      this.scanAhead?.stop();
      opened?.releaseHandles();
      o.listener?.close();
      for (const s of this.streams) s.destroy();
      for (const l of this.lanes) {
        countLaneBytes(o.summary, l);
        l.destroy();
      }
      if (scratch) await fs.rm(scratch, { recursive: true, force: true });
    }
  }

  /** Whether this session hashes its deltas' old versions ahead of their conversations:
   * multiplexed (version 2), reading the index (not -c), writing (not a dry run), and not
   * `--no-overlap`. */
  private hashesAhead(): boolean {
    return this.multiplexed && !this.checksum && !this.dryRun && this.o.overlap !== false;
  }

  /** Both manifests and the roots either side asked for cross; then both peers derive the
   * same plan from them. */
  private async triage(tree: NativeTreeSync, root: string, limits: TreeOptions): Promise<Plan> {
    const { o } = this;
    const stats = tree.stats();
    await exchangeManifestsAndRoots(this.conn, tree, this.checksum, o.events, sendManifest(this.conn, tree, o.compressManifest !== false));
    const deleteExtraneous = (o.offer.flags & OfferFlag.NO_DELETE) === 0 && !o.tree?.noDelete;
    const counts = await call(tree.triage(this.checksum, deleteExtraneous, (o.offer.flags & OfferFlag.UPDATE) !== 0, (o.offer.flags & OfferFlag.WHOLE_FILE) !== 0, limits.maxSize, limits.minSize, limits.omitTimes, limits.omitPerms, limits.sizeOnly, limits.ignoreExisting, limits.existingOnly, limits.wholeSmall));
    const summary = treeSummary(stats, counts);
    o.summary.tree = summary;
    o.summary.size = counts.sourceBytes;
    return { tree, root, large: new Map(tree.largeTransfers().map((l) => [l.action, l])), done: new Set(), summary, counts };
  }

  /** A dry run lists what it would do, and answers the sender's TREE_END with nothing done. */
  private async answerDryRun(plan: Plan, lines: string[]): Promise<void> {
    const { conn, o } = this;
    for (const line of lines) reportChange(o.events, line, true);
    decodeTreeEnd((await expect(conn, FrameType.TREE_END)).payload);
    await conn.send(FrameType.TREE_RESULT, encodeTreeResult({ exitCode: 0, filesWritten: 0n, literalBytes: 0n, matchedBytes: 0n, deleted: 0n, errorCount: 0, message: '' }));
    const c = plan.counts;
    o.summary.upToDate = c.smallTransfers + c.largeTransfers + c.localCopies + c.deletes + c.mkdirs + c.symlinks + c.attrsOnly === 0;
  }

  /** Local work first (directories, renames), then everything the sender sends, then the
   * attribute table, deletions and TREE_RESULT. */
  private async transfer(plan: Plan, limits: TreeOptions): Promise<void> {
    const { conn, o, errors, vanished } = this;
    const prep = await conn.keepAlive(call(plan.tree.prepare()));
    errors.push(...prep.errors);
    // Local copies (renames) count as written files with matched bytes.
    this.matched += prep.bytes;
    this.plan = plan;
    for (const c of [...this.lanes, ...this.streams]) this.serveLane(c); // those that came before the plan existed
    // -o / -g / -X: the sender's table arrives (TREE_ATTRS parts) just before TREE_END.
    const attrs = limits.attrs ? await this.receiveFrames(plan, new ManifestAssembler(MAX_ATTR_TABLE_BYTES, 1)) : await this.receiveFrames(plan);
    if (attrs) {
      const applied = await conn.keepAlive(call(plan.tree.applyAttrs(attrs)));
      errors.push(...applied.errors);
      for (const w of applied.warnings) o.events?.info?.(`warning: ${w}`);
    }
    // Deletions wait for every transfer, and are skipped (as rsync does) after any error.
    const deleteOk = errors.length === 0 && vanished.length === 0;
    const { counts, summary } = plan;
    if (!deleteOk && counts.deletes > 0) o.events?.info?.(`warning: ${counts.deletes} deletion(s) skipped because of the errors above (as rsync does after an I/O error)`);
    const fin = await conn.keepAlive(call(plan.tree.finishReceiver(deleteOk)));
    await reportTree(conn, o, { summary, counts, fin, deleteOk, errors, vanished, written: this.written + prep.files, lanes: 1 + this.lanes.length, literal: this.literal, matched: this.matched });
  }

  /** The main connection's frames until TREE_END: small-file batches (written a few at a
   * time), large files in turn, and the attribute table (returned) when `attrTable`. */
  private async receiveFrames(plan: Plan, attrTable?: ManifestAssembler): Promise<Buffer | undefined> {
    const { conn } = this;
    let attrBytes: Buffer | undefined;
    this.receiving.start(plan.counts.transferBytes);
    const inflight = new Set<Promise<void>>();
    for (;;) {
      const f = await expectUnless(conn, this.laneFailed, FrameType.FILE_BATCH, FrameType.FILE_BEGIN, FrameType.TREE_END, ...(attrTable && !attrBytes ? [FrameType.TREE_ATTRS] : []));
      if (f.type === FrameType.TREE_ATTRS) {
        attrBytes = attrTable!.push(f.payload);
        continue;
      }
      if (f.type === FrameType.FILE_BATCH) {
        const w = this.writeSmall(plan.tree, f.payload, f.release);
        inflight.add(w);
        w.then(() => inflight.delete(w), () => undefined);
        if (inflight.size >= WRITES_IN_FLIGHT) await Promise.race(inflight);
        continue;
      }
      await Promise.all(inflight);
      if (f.type === FrameType.TREE_END) {
        await this.endOfTree(plan, f.payload, Boolean(attrTable && !attrBytes));
        this.receiving.end();
        return attrBytes;
      }
      await this.receiveLarge(plan, conn, f.payload);
    }
  }

  /** One FILE_BATCH of small files, written by the core off the JS thread. */
  private async writeSmall(tree: NativeTreeSync, payload: Buffer, release: (() => void) | undefined): Promise<void> {
    const r = await call(tree.writeSmall(payload));
    release?.();
    this.errors.push(...r.errors);
    this.vanished.push(...r.vanished);
    this.written += r.files;
    this.smallDone += r.files + r.errors.length + r.vanished.length;
    this.literal += r.bytes;
    this.receiving.add(r.bytes);
  }

  /** TREE_END: every lane has finished, and the sender sent everything the plan holds. */
  private async endOfTree(plan: Plan, payload: Buffer, attrsMissing: boolean): Promise<void> {
    const end = decodeTreeEnd(payload);
    // Every lane has sent LANE_END by now; no more may join.
    this.o.listener?.close();
    await this.accepting;
    await Promise.race([Promise.all(this.laneWork), this.laneFailed]);
    const { large, done, summary } = plan;
    if (end.largeFiles !== large.size || done.size !== large.size) throw protocolError(`sender ended after ${done.size} of ${large.size} large files`);
    if (this.smallDone !== summary.smallTransfers || end.smallFiles !== summary.smallTransfers) throw protocolError(`sender ended after ${this.smallDone} of ${summary.smallTransfers} small files`);
    if (end.senderProblems > 0) this.errors.push(`${end.senderProblems} source path(s) could not be read on the sender (see its output)`);
    if (attrsMissing) throw protocolError('sender ended without the attribute table it announced');
  }

  /** Multiplexed streams on connection `c` (version 2), each served like a lane. */
  private carryStreams(c: FramedConnection): void {
    if (!this.multiplexed) return;
    const mux = new Multiplexer(c, {
      opener: false,
      window: laneWindow(this.connections),
      session: this.receiveWindow,
      onStream: (s) => {
        this.streams.push(s);
        this.serveLane(s);
      },
    });
    this.muxes.push(mux);
  }

  /** Parallel sessions: grant lanes and start accepting them right away (they join once the
   * sender has triaged, by which time the plan exists). */
  private async grantLanes(): Promise<void> {
    const { conn, o } = this;
    if (!(o.offer.flags & OfferFlag.PARALLEL)) return;
    const granted = o.listener ? Math.min(Number(o.offer.size), MAX_LANES) : 1;
    this.connections = granted;
    for (const m of this.muxes) m.setWindow(laneWindow(granted));
    // The token admits lanes to a listening port. Without one (an ssh session: no lane can
    // join) or with one only this process reaches (a local sync's lanes), it guards nothing:
    // zeros, and no OpenSSL set up for them (decisions §107).
    const token = o.listener && !o.listener.inProcess ? crypto.randomBytes(LANE_TOKEN_BYTES) : Buffer.alloc(LANE_TOKEN_BYTES);
    await conn.send(FrameType.LANES, encodeLanes(granted, token));
    if (!o.listener) return;
    this.accepting = acceptLanes(o.listener, {
      token,
      peerFingerprint: o.peerFingerprint,
      timeoutMs: o.timeoutMs ?? 60_000,
      maxLanes: granted - 1,
      multiplexed: this.multiplexed,
      onLane: (c) => {
        this.lanes.push(c);
        this.carryStreams(c);
        this.serveLane(c);
      },
      onRefused: (why) => o.events?.info?.(`warning: refused a lane: ${why}`),
    });
  }

  /** Large files, one after another, on a lane or stream until its LANE_END. Its failure
   * fails the session (laneFailed), except a stream whose file changed on the sender. */
  private serveLane(c: FramedConnection): void {
    const plan = this.plan;
    if (!plan) return; // started by transfer() once the plan exists
    const w = (async () => {
      for (;;) {
        const f = await expect(c, FrameType.FILE_BEGIN, FrameType.LANE_END);
        if (f.type === FrameType.LANE_END) {
          // End our side too, so the sender's close completes at once over any transport
          // (an in-process pipe does not end itself as a TCP socket does).
          void c.close();
          return;
        }
        try {
          await this.receiveLarge(plan, c, f.payload);
        } catch (e) {
          if (!(e instanceof StreamSpent)) throw e;
          c.destroy();
          return;
        }
      }
    })();
    w.catch(async (e) => {
      let err = e instanceof FfsyncError ? e : fromSystemError(e, 'lane failed');
      if (err.code === 'ECHUNK') {
        // The sender's verdict on this lane's bad chunk (its file may have changed, §7.2).
        await reportError(c, err);
        err = await senderVerdict(c, err);
      }
      this.laneFailure ??= err;
      this.failLanes(this.laneFailure);
    });
    this.laneWork.push(w);
  }

  /** One large file's conversation on connection `c`, after its FILE_BEGIN. */
  private async receiveLarge(plan: Plan, c: FramedConnection, payload: Buffer): Promise<void> {
    const begin = decodeFileBegin(payload);
    const lt = plan.large.get(begin.action);
    if (!lt || plan.done.has(begin.action)) throw protocolError(`FILE_BEGIN for action ${begin.action}, which is not an outstanding large transfer`);
    plan.done.add(begin.action);
    const rel = showTreePath(lt.path);
    if (begin.status === FileBeginStatus.VANISHED) {
      this.vanished.push(`${rel} vanished or changed on the sender`);
      return;
    }
    if (begin.status === FileBeginStatus.UNREADABLE) {
      this.errors.push(`${rel}: the sender could not read it`);
      return;
    }
    const progress = this.receiving.file();
    try {
      const r = await receiveFileContent(c, this.contentOptions(plan, c, lt, progress.events)).catch((e: unknown) => this.streamFailure(c, e, rel));
      if (r.refused) {
        this.errors.push(`cannot write ${rel}: ${r.refused}`);
        return;
      }
      plan.tree.claimRoot(lt.action, r.root);
      this.written++;
      this.literal += r.literalBytes;
      this.matched += r.matchedBytes;
      progress.end(r.literalBytes + r.matchedBytes);
    } finally {
      progress.end(0); // (one that arrived has ended already, with its size)
    }
  }

  /** How a large file is received: beneath the root handle, against its old version when the
   * plan says delta, with what the peer's capabilities allow. */
  private contentOptions(plan: Plan, c: FramedConnection, lt: LargeTransferInfo, events: SyncEvents): Parameters<typeof receiveFileContent>[1] {
    const { o } = this;
    const caps = o.negotiated.capabilities;
    const abs = joinTreePath(plan.root, lt.path);
    const basis = lt.delta ? [abs] : [];
    // Hashed ahead, its manifest is in the index; none is started for it from now on.
    if (basis.length) this.scanAhead?.claim(lt.path);
    const locals = basis.length ? c.keepAlive(hashWithin(this.hashing, () => scanFile(abs, { stateDir: o.stateDir, ignoreIndex: this.checksum }))).then((r) => [r]) : Promise.resolve([]);
    locals.catch(() => undefined);
    return {
      // Resolved beneath the root handle in the core: a link planted on the way (even one the
      // walk never saw) fails this file; nothing is written through it.
      target: lt.path,
      beneath: plan.root,
      size: BigInt(lt.size),
      mtimeNs: lt.mtimeNs,
      mode: lt.mode,
      localPaths: basis,
      locals,
      peerCopy: o.localSender === undefined ? undefined : { path: lt.path, beneath: o.localSender, mtimeNs: lt.mtimeNs },
      targetReusable: lt.delta,
      stateDir: o.stateDir,
      events,
      beforeCommit: () => plan.tree.clearFor(lt.action),
      refusable: true,
      refine: o.refine !== false && Boolean(caps & Capability.REFINE),
      sparse: Boolean(caps & Capability.SPARSE),
      commitRefusal: Boolean(caps & Capability.COMMIT_REFUSAL),
      inplace: o.inplace,
      stream: Boolean(caps & Capability.STREAM),
      fsync: o.fsync,
      backup: o.backup,
      partialDir: o.partialDir,
      writeSlots: this.writeSlots,
    };
  }

  /** On a multiplexed stream, a file that changed on the sender fails alone: the sender says
   * so in an ERROR on that stream (exit 24), or answers our report of a chunk that failed its
   * hash with it (§7.2). The stream is spent (StreamSpent); the session goes on. Anything
   * else, or on a lane or the main connection, fails the session. */
  private async streamFailure(c: FramedConnection, e: unknown, rel: string): Promise<never> {
    if (!this.streams.includes(c) || !(e instanceof FfsyncError)) throw e;
    let err = e;
    if (err.code === 'ECHUNK') {
      await reportError(c, err);
      err = await senderVerdict(c, err);
    }
    if (err.exitCode !== ExitCode.VANISHED || err.origin !== 'peer') throw err;
    this.vanished.push(`${rel} changed or vanished on the sender during the sync`);
    throw new StreamSpent();
  }

  /** Conversations still running on lanes and streams end with the session's error (not as
   * "peer closed", which would keep their partial files for a resume that a protocol error
   * does not deserve), and their clean-up finishes before the session's error is thrown. */
  private async abandon(e: unknown): Promise<void> {
    const why = e instanceof Error ? e : new Error(String(e));
    for (const c of [...this.streams, ...this.lanes]) c.failWith(why);
    await Promise.race([Promise.allSettled(this.laneWork), new Promise((r) => setTimeout(r, SETTLE_MS).unref())]);
  }
}

/** The tree's root: a directory, created if missing (its parent was checked at start). A dry
 * run into a missing root walks an empty scratch directory instead, and creates nothing. */
async function prepareRoot(o: Context, dryRun: boolean): Promise<{ root: string; scratch?: string; existed: boolean }> {
  const st = await fs.lstat(o.target).catch((e: NodeJS.ErrnoException) => {
    if (e.code === 'ENOENT') return undefined;
    throw fromSystemError(e, `cannot inspect target ${o.target}`);
  });
  if (st && !st.isDirectory()) {
    throw new FfsyncError('ENOTDIR', ExitCode.FILE_IO, `target ${o.target} exists and is not a directory, but the sender offers a directory tree; nothing written`);
  }
  if (st) return { root: o.target, existed: true };
  if (dryRun) {
    const scratch = await fs.mkdtemp(path.join(os.tmpdir(), 'ffsync-dry-'));
    return { root: scratch, scratch, existed: false };
  }
  await fs.mkdir(o.target).catch((e) => {
    throw fromSystemError(e, `cannot create target directory ${o.target}`);
  });
  return { root: o.target, existed: false };
}

/** Our side of the tree: the prewalk if it still fits, else a walk now with the sender's
 * excludes. */
async function openTargetTree(conn: FramedConnection, o: Context, w: { root: string; scratch?: string; excludes: string[]; checksum: boolean }): Promise<NativeTreeSync> {
  // The prewalk fits if it walked this very directory (its target was guessed before the
  // offer came), the sender excludes nothing, it did not ask for --checksum (the prewalk used
  // the index), and it finished moments ago (or is still running).
  const pre = o.prewalk;
  const oneFileSystem = (o.offer.flags & OfferFlag.ONE_FILE_SYSTEM) !== 0;
  const usable = pre && pre.root === w.root && !w.scratch && !oneFileSystem && w.excludes.length === 0 && (!w.checksum || o.checksum) && (pre.doneAt === 0 || Date.now() - pre.doneAt < PREWALK_FRESH_MS);
  const tree = await conn.keepAlive(
    usable
      ? pre.tree
      : inPhase(o.events, 'scanning', 0, (progress) =>
          walkTree(w.root, { excludes: w.excludes, protect: o.tree?.protect, stateDir: w.scratch ? undefined : o.stateDir, ignoreIndex: w.checksum, isSender: false, oneFileSystem }, progress),
        ),
  );
  return tree;
}

/** The session's settings for writing into our tree: durability, --max-delete, -b, --chown,
 * --partial-dir (whose partials of a file a batch replaced whole go). */
function applyTreeSettings(tree: NativeTreeSync, o: Context, dryRun: boolean): void {
  tree.setFsync(o.fsync !== false);
  tree.setMaxDelete(o.tree?.maxDelete ?? null);
  if (!dryRun) tree.setBackup(o.backup ?? null);
  if (!dryRun && o.partialDir !== undefined) tree.setPartialDir(o.partialDir);
  if (o.tree?.chown) tree.setChown(o.tree.chown);
}

interface TreeOutcome {
  summary: NonNullable<SyncSummary['tree']>;
  counts: PlanCounts;
  fin: StepOutcome;
  deleteOk: boolean;
  errors: string[];
  vanished: string[];
  written: number;
  lanes: number;
  literal: number;
  matched: number;
}

/** TREE_RESULT, the summary, and the session's exit code: rsync's precedence, a partial
 * transfer (23), then vanished files (24), then the --max-delete limit (25). */
async function reportTree(conn: FramedConnection, o: Context, t: TreeOutcome): Promise<void> {
  const { summary, counts, fin, errors, vanished } = t;
  errors.push(...fin.errors);
  for (const w of fin.warnings) o.events?.info?.(`warning: ${w}`);
  const deleted = t.deleteOk ? counts.deletes - fin.errors.filter((e) => e.startsWith('cannot delete')).length - fin.deletesSkipped : 0;
  for (const e of [...errors, ...vanished]) o.events?.info?.(`error: ${e}`);
  const limited = fin.deletesSkipped > 0 ? `Deletions stopped due to --max-delete limit (${fin.deletesSkipped} skipped)` : undefined;
  const exitCode = errors.length > 0 ? ExitCode.PARTIAL : vanished.length > 0 ? ExitCode.VANISHED : limited ? ExitCode.DELETE_LIMIT : ExitCode.OK;
  summary.written = t.written;
  summary.lanes = t.lanes;
  summary.deleted = deleted;
  summary.errors = [...errors, ...vanished];
  o.summary.literalBytes = t.literal;
  o.summary.matchedBytes = t.matched;
  o.summary.upToDate = summary.written === 0 && deleted === 0 && counts.attrsOnly === 0 && counts.mkdirs === 0 && counts.symlinks === 0;
  const message = exitCode === ExitCode.DELETE_LIMIT ? limited! : summary.errors.slice(0, MAX_REPORTED).join('\n') + (summary.errors.length > MAX_REPORTED ? `\n… and ${summary.errors.length - MAX_REPORTED} more` : '');
  await conn.send(
    FrameType.TREE_RESULT,
    encodeTreeResult({
      // A sender without DELETE_LIMIT knows no exit 25: to it the session succeeded (it
      // did, file by file); the limit is reported here, where a pull's user is.
      exitCode: exitCode === ExitCode.DELETE_LIMIT && !(o.negotiated.capabilities & Capability.DELETE_LIMIT) ? ExitCode.OK : exitCode,
      filesWritten: BigInt(summary.written),
      literalBytes: BigInt(t.literal),
      matchedBytes: BigInt(t.matched),
      deleted: BigInt(deleted),
      errorCount: summary.errors.length,
      message,
    }),
  );
  if (exitCode === ExitCode.DELETE_LIMIT) {
    conn.errorSent = true;
    throw new FfsyncError('EMAXDELETE', exitCode, message);
  }
  if (exitCode !== ExitCode.OK) {
    conn.errorSent = true;
    // The one error line names what the exit code means: 24 is "vanished", not 23's
    // "partial transfer"; the paths follow on later lines.
    const what = exitCode === ExitCode.VANISHED ? 'source files vanished during the run' : 'partial transfer';
    throw new FfsyncError(exitCode === ExitCode.VANISHED ? 'EVANISHED' : 'EPARTIAL', exitCode, `${what}: ${summary.errors.length} path(s) not synced\n${message}`);
  }
}
