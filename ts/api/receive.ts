// The receiving side of a single-file sync: decides what is needed, rebuilds the file
// out of place through the native restorer, verifies, and only then replaces the target.

import fs from 'node:fs/promises';
import path from 'node:path';
import { FramedConnection, workMeter } from '../transport/connection.js';
import { listenOnce } from '../transport/tcp.js';
import { FrameType } from '../protocol/frames.js';
import { Capability, Decision, DecisionReason, decodeOffer, encodeDecision, type Offer, OfferFlag, OfferKind, RequestOp, Role } from '../protocol/messages.js';
import { loadIndex, markUpToDate, scanFile, type ScanResult, recoverInplace } from '../native/binding.js';
import { ExitCode, FfsyncError, fromSystemError } from '../utils/errors.js';
import { resolveStateDir } from '../utils/state-dir.js';
import { abortable, authenticatePeer, closeOnAbort, endSession, expect, handshake, interruptedError, type Negotiated, reportError, requestPath, senderVerdict } from './session.js';
import type { SecureStream } from '../transport/peer-identity.js';
import { inPhase, newSummary, type SyncEvents, type SyncSummary } from './events.js';
import { identityChanged } from './content-send.js';
import { receiveFileContent } from './content-receive.js';
import { type Prewalk, receiveTree, startPrewalk, type TreeReceiveOptions } from './tree-receive.js';
import { ScanAhead } from './scan-ahead.js';
import type { Listener } from '../transport/tcp.js';

export interface ReceiveOptions {
  /** The file to converge toward the sender's. */
  path: string;
  host?: string;
  /** 0 picks a free port (reported through `events.listening`). */
  port: number;
  /** Extra local files whose chunks may be reused (`--from`). */
  from?: string[];
  /** Set by a local sync only (both peers in this process): the sender's source, a tree's root
   * or a single file. Its files are the sender's own, readable here, so each file's chunks are
   * copied from them on the disk instead of crossing the pipe (decisions §111). */
  localSender?: string;
  checksum?: boolean;
  stateDir?: string;
  timeoutMs?: number;
  events?: SyncEvents;
  /** Aborting closes the connection; a partial is kept for resuming. */
  signal?: AbortSignal;
  /** Plain TCP instead of TLS (the peer must agree). */
  plaintext?: boolean;
  /** Accept exactly this peer fingerprint (and pin it). */
  trust?: string;
  /** Ask on the terminal about an unknown peer. */
  interactive?: boolean;
  /** Directory trees (when the sender offers one). */
  tree?: TreeReceiveOptions;
  /** Listen for one QUIC connection (UDP) instead of TCP/TLS. */
  quic?: boolean;
  /** A single file outside these bounds is left alone (`sync --max-size / --min-size`;
   * trees get the sender's limits in TREE_LIMITS). */
  sizeLimits?: import('../protocol/messages.js').SizeLimits;
  /** `--inplace`: files are updated in place (changed ranges only, through a redo journal
   * that the next run completes if this one is interrupted) instead of replaced. */
  inplace?: boolean;
  /** Sub-chunk refinement (REFINE frames) when the sender supports it; default on. Local
   * syncs turn it off: nothing crosses a wire, so signatures and deltas would only cost CPU. */
  refine?: boolean;
  /** A tree's manifest goes zstd-compressed (default), or with `false` stored uncompressed in its
   * zstd frame: local syncs, where the peer is in this process (decisions §101). */
  compressManifest?: boolean;
  /** First contact by a one-time code (TLS only): `true` offers a code even when peers are
   * pinned, `false` never; undefined offers one when no peer is pinned and no `trust` is
   * given. Codes are announced through `events.pairing`. */
  pair?: boolean;
  /** Make each file durable before it replaces the target (default true). `false`
   * (`--no-fsync`): verified files are renamed into place from the page cache, as rsync
   * does by default: every file is still verified before the rename, but a crash soon
   * after may leave a file empty or incomplete under its name. */
  fsync?: boolean;
  /** rsync's -b / --suffix / --backup-dir: what a file replaces, and (trees) what a
   * deletion removes, is first moved to its backup name. `dir` is relative to the
   * destination root (a tree's root, a single file's directory) unless absolute. */
  backup?: import('../native/binding.js').BackupOptions;
  /** rsync's --partial-dir: a partial kept for a resume waits in this directory (one name:
   * beside each file; absolute: one for all) instead of beside its file. */
  partialDir?: string;
  /** `false` (`--no-overlap`): a tree's files are hashed only when their conversations need
   * them. Default: while this side waits for its sender, and from triage on ahead of the
   * conversations, at idle priority (ts/api/scan-ahead.ts; decisions §95, §96). */
  overlap?: boolean;
}

/** Fail before listening if the target can never be written. */
export async function checkTarget(target: string): Promise<import('node:fs').BigIntStats | undefined> {
  let dst: import('node:fs').BigIntStats | undefined;
  try {
    dst = await fs.stat(target, { bigint: true });
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'ENOENT') throw fromSystemError(e, `cannot inspect target ${target}`);
  }
  if (dst && !dst.isFile() && !dst.isDirectory()) throw new FfsyncError('ENOTFILE', ExitCode.FILE_IO, `target ${target} is neither a regular file nor a directory`);
  // A file is replaced by a rename in its directory; a tree is written inside itself.
  const dir = dst?.isDirectory() ? target : path.dirname(target);
  try {
    const d = await fs.stat(dir);
    if (!d.isDirectory()) throw new FfsyncError('ENOTDIR', ExitCode.FILE_IO, `${dir} is not a directory`);
    await fs.access(dir, fs.constants.W_OK);
  } catch (e) {
    if (e instanceof FfsyncError) throw e;
    const code = (e as NodeJS.ErrnoException).code;
    if (code === 'ENOENT') throw new FfsyncError('ENOENT', ExitCode.FILE_IO, `target directory ${dir} does not exist`);
    if (code === 'EACCES' || code === 'EPERM' || code === 'EROFS') throw new FfsyncError('EACCES', ExitCode.FILE_IO, `target directory ${dir} is not writable (${code})`);
    throw fromSystemError(e, `cannot use target directory ${dir}`);
  }
  return dst;
}

export async function receive(o: ReceiveOptions): Promise<SyncSummary> {
  const target = path.resolve(o.path);
  const stateDir = resolveStateDir(o.stateDir);
  const initial = await checkTarget(target);
  // What we know about the target before any peer talks to us. The decision below uses
  // only this (so it never depends on how far a background scan got); if no index covers
  // the target we scan it now, while we wait for the sender — it is needed for the diff
  // unless the quick check settles the question, and while we wait it costs no time.
  const initialIndex = initial?.isFile() && !o.checksum ? await loadIndex(target, stateDir) : null;
  for (const f of o.from ?? []) {
    const st = await fs.stat(f).catch(() => undefined);
    if (!st?.isFile()) throw new FfsyncError('ENOENT', ExitCode.FILE_SELECTION, `--from ${f} is not a readable regular file`);
  }
  if (o.quic && o.plaintext) throw new FfsyncError('EUSAGE', ExitCode.USAGE, '--quic is always encrypted (QUIC has TLS 1.3 built in); drop --plaintext');
  // Loaded when used: a local `sync` (which runs runReceiver) needs neither TLS nor QUIC.
  /* eslint-disable @typescript-eslint/no-require-imports */
  const identity = o.plaintext ? undefined : (require('../security/identity.js') as typeof import('../security/identity.js')).loadOrCreateIdentity(stateDir);
  const host = o.host ?? '127.0.0.1';
  const timeoutMs = o.timeoutMs ?? 60_000;
  const quic = o.quic ? await (require('../transport/quic.js') as typeof import('../transport/quic.js')).QuicListener.bind(host, o.port, identity!, { idleMs: timeoutMs }) : undefined;
  const listener = quic ? undefined : identity ? await (require('../transport/tls.js') as typeof import('../transport/tls.js')).tlsListenOnce(host, o.port, identity) : await listenOnce(host, o.port);
  const { overQuic } = quic ? (require('./over-quic.js') as typeof import('./over-quic.js')) : { overQuic: undefined };
  /* eslint-enable @typescript-eslint/no-require-imports */
  const bound = (quic ?? listener)!;
  // The listening event is always the first one (scripts read the port from it).
  o.events?.listening?.(bound.host, bound.port);
  const offer = listener && identity ? pairingOffer(o, stateDir, target, bound.host, bound.port) : undefined;
  const prescan =
    initial?.isFile() && !initialIndex
      ? inPhase(o.events, 'hashing', Number(initial.size), (progress) => scanFile(target, { stateDir, ignoreIndex: o.checksum, onProgress: progress }))
      : undefined;
  prescan?.catch(() => undefined);
  // A tree target is walked while we wait (used if the sender asks for no excludes and
  // arrives soon after; otherwise the session walks again, see tree-receive.ts).
  const prewalk = initial?.isDirectory() ? startPrewalk(target, o, stateDir) : undefined;
  // And the files a delta would start from are hashed meanwhile (decisions §96).
  const waitingScan = waitingScanOf(o, prewalk, stateDir);
  const context = { ...o, target, stateDir, initial, initialIndex, prescan, prewalk, waitingScan };
  try {
    if (quic) {
      const session = await abortable(quic.acceptSession(), o.signal, () => quic.close());
      return await overQuic!(session, 'accept', timeoutMs, (conn, stream) => runReceiver(conn, { ...context, listener: session.lanes(), secure: stream }));
    }
    // A sender we do not trust (yet) is refused, and we keep waiting: the user may pin it
    // (`trust`, in another terminal) and the sender retry, without restarting this side.
    for (;;) {
      const sock = await abortable(listener!.accept(), o.signal, () => listener!.close());
      try {
        return await runReceiver(new FramedConnection(sock, timeoutMs), { ...context, listener, secure: identity ? sock : undefined, pairing: offer });
      } catch (e) {
        if (!(e instanceof FfsyncError) || !refusedPeer(e) || o.signal?.aborted) throw e;
        o.events?.info?.(`refused a connection: ${e.message}; still waiting for a trusted sender`);
        // An attempt spent the code, whatever its outcome: offer the next one.
        offer?.replaceSpent();
      }
    }
  } finally {
    waitingScan?.stop();
    bound.close();
  }
}

/** The scan while a receiver waits for its sender (`receive`, `sync`'s remote end): over the
 * prewalk of a directory target, not with `-c` (which reads no index), `--no-overlap` or a dry
 * run known beforehand (the remote end's). */
export function waitingScanOf(o: Pick<ReceiveOptions, 'checksum' | 'overlap'> & { dryRun?: boolean }, prewalk: Prewalk | undefined, stateDir: string): ScanAhead | undefined {
  if (!prewalk || o.checksum || o.overlap === false || o.dryRun) return undefined;
  return ScanAhead.waiting(prewalk.tree, prewalk.root, stateDir);
}

/** This side refused the peer's certificate (unknown, or not the --trust one): nothing of the
 * session happened, so a one-session receiver may wait for the next connection. */
function refusedPeer(e: FfsyncError): boolean {
  return e.exitCode === ExitCode.UNTRUSTED && (e.code === 'EUNTRUSTED' || e.code === 'EFINGERPRINT' || e.code === 'EPAIR') && e.origin !== 'peer';
}

/** The one-time code this receive offers, if it offers one (see ReceiveOptions.pair). */
function pairingOffer(o: ReceiveOptions, stateDir: string, target: string, host: string, port: number): import('../security/pairing.js').PairingOffer | undefined {
  if (o.pair === false || o.trust) return undefined;
  /* eslint-disable @typescript-eslint/no-require-imports */
  const { readPins } = require('../security/pins.js') as typeof import('../security/pins.js');
  if (o.pair === undefined && readPins(stateDir).length > 0) return undefined;
  const { PairingOffer, pairCommand, MAX_CODES_PER_RUN } = require('../security/pairing.js') as typeof import('../security/pairing.js');
  /* eslint-enable @typescript-eslint/no-require-imports */
  const offer = new PairingOffer(
    (code) => o.events?.pairing?.(code, pairCommand(code, host, port, target)),
    () => o.events?.info?.(`pairing is off for this run: ${MAX_CODES_PER_RUN} codes were spent on failed attempts; pin the sender with 'trust', or restart receive for a new code`),
  );
  offer.issue();
  return offer;
}

export interface ReceiverContext extends ReceiveOptions {
  target: string;
  stateDir: string;
  /** What the target was before the session (decisions use only this; see receive()). */
  initial?: import('node:fs').BigIntStats;
  initialIndex?: ScanResult | null;
  prescan?: Promise<ScanResult>;
  prewalk?: Prewalk;
  /** Hashing the prewalk's files while waiting for the sender: stopped once the session shows
   * it is of no use, or at triage, where the plan's scan ahead takes over. */
  waitingScan?: ScanAhead;
  /** Lanes of a parallel tree session join through it; absent: no lanes (ssh, local). */
  listener?: Listener;
  /** The stream whose peer certificate must be trusted (TLS, QUIC); absent: none to check. */
  secure?: SecureStream;
  /** Vouched-for peer fingerprint (`sync --quic`, learnt over ssh). */
  expectFingerprint?: string;
  /** The one-time code `receive` offers to a sender that asks to pair. */
  pairing?: import('../security/pairing.js').PairingOffer;
  /** Where the sender's offer lands, once its kind is known (`sync`'s rsync rules). */
  resolveTarget?: (kind: 'file' | 'tree') => Promise<string>;
  /** `serve` daemon taking a push: the client is authenticated and HELLO is done. */
  negotiated?: Negotiated;
  /** `pull host:port/path`: the path under the daemon's root to fetch, and how to name the daemon. */
  remotePath?: string;
  peerLabel?: string;
}

/** Everything after the transport is up: over TCP/TLS (`receive`), an ssh channel or an
 * in-process pipe (`sync`). Closes `conn` at the end. */
export async function runReceiver(conn: FramedConnection, o: ReceiverContext): Promise<SyncSummary> {
  const { stateDir, prewalk, listener } = o;
  let target = o.target;
  const stopWatching = closeOnAbort(conn, o.signal);
  const t0 = Date.now();
  const summary = newSummary('receiver', o.path, 0);
  try {
    if (o.secure) {
      const peerLabel = `${o.secure.remoteAddress}:${o.secure.remotePort}`;
      const pair = o.pairing?.code ? { offer: o.pairing } : undefined;
      summary.peerFingerprint = await authenticatePeer(conn, o.secure, { stateDir, trust: o.trust, expect: o.expectFingerprint, interactive: o.interactive, peerLabel, events: o.events, pair });
    }
    const negotiated = o.negotiated ?? (await handshake(conn, Role.RECEIVER, Boolean(o.secure)));
    if (!o.negotiated) await requestPath(conn, negotiated, RequestOp.PULL, o.remotePath, o.peerLabel ?? 'the sender');
    const offer = decodeOffer((await expect(conn, FrameType.OFFER)).payload);
    if (offer.kind !== OfferKind.TREE || !(offer.flags & OfferFlag.PARALLEL)) listener?.close();
    // A file sent into a directory needs none of its files hashed.
    if (offer.kind !== OfferKind.TREE) o.waitingScan?.stop();
    if (o.resolveTarget) {
      target = await o.resolveTarget(offer.kind === OfferKind.TREE ? 'tree' : 'file');
      summary.path = target;
    }
    // A walk made before the offer said where the tree goes (`sync`'s remote end) serves only
    // if it was of that directory; so does what was hashed of it, by paths relative to it.
    const early = prewalk && path.resolve(prewalk.root) === path.resolve(target) ? prewalk : undefined;
    if (!early) o.waitingScan?.stop();
    if (offer.kind === OfferKind.TREE) {
      await receiveTree(conn, { ...o, target, stateDir, offer, summary, listener, peerFingerprint: summary.peerFingerprint, prewalk: early, waitingScan: early && o.waitingScan, negotiated });
    } else {
      await receiveFile(conn, o, { target, offer, negotiated, summary });
    }
    summary.ok = true;
    return summary;
  } catch (e) {
    let err = e instanceof FfsyncError ? e : fromSystemError(e, 'receive failed');
    // Interrupted here: whatever the closed connection made of it, that is the error.
    if (o.signal?.aborted) err = interruptedError(err);
    await reportError(conn, err);
    err = await senderVerdict(conn, err);
    err.summary = summary;
    throw err;
  } finally {
    stopWatching();
    await endSession(conn, summary, t0, 'receiver');
  }
}

/** A single file's session once its OFFER has arrived. */
interface FileSession {
  target: string;
  offer: Offer;
  negotiated: Negotiated;
  summary: SyncSummary;
}

/** What we know of the target before deciding (see decideUpToDate). */
interface TargetState {
  dst: import('node:fs').BigIntStats | undefined;
  /** A symlink at the target is replaced by a regular file (never written through), so it is
   * never "up to date" in place: times and mode would land on the link's target. */
  isLink: boolean;
  unchangedSinceStart: boolean;
  /** Our index of the target, when it covers it (not under --checksum). */
  local: ScanResult | null | undefined;
  checksum: boolean;
}

/** A single file: the decision, then (unless it is up to date) the content conversation. */
async function receiveFile(conn: FramedConnection, o: ReceiverContext, f: FileSession): Promise<void> {
  const { target, offer, negotiated, summary } = f;
  summary.size = Number(offer.size);
  // Before anything looks at the target: finish an --inplace commit a crash interrupted.
  const recovered = await recoverInplace(target);
  if (recovered) o.events?.info?.(recovered);
  const checksum = Boolean(o.checksum) || (offer.flags & OfferFlag.CHECKSUM) !== 0;
  const dst = await checkTarget(target);
  if (dst?.isDirectory()) {
    throw new FfsyncError('EISDIR', ExitCode.FILE_IO, `target ${target} is a directory, but the sender offers a single file`);
  }
  const unchangedSinceStart = Boolean(dst && !identityChanged(o.initial, dst));
  const state: TargetState = {
    dst,
    isLink: Boolean((await fs.lstat(target).catch(() => undefined))?.isSymbolicLink()),
    unchangedSinceStart,
    local: !checksum && dst ? (unchangedSinceStart ? o.initialIndex : await loadIndex(target, o.stateDir)) : null,
    checksum,
  };
  const decidedBy = await decideUpToDate(conn, o, f, state);
  if (decidedBy) return upToDate(summary, decidedBy);
  await conn.send(FrameType.DECISION, encodeDecision(Decision.SEND_MANIFEST));
  // -W: no delta, so no local basis (a resumed partial of this version still counts).
  const wholeFile = (offer.flags & OfferFlag.WHOLE_FILE) !== 0;
  const localPaths = wholeFile ? [] : [...(dst ? [target] : []), ...(o.from ?? [])];
  const localTotal = (dst ? Number(dst.size) : 0) + (await Promise.all((o.from ?? []).map((p) => fs.stat(p)))).reduce((a, st) => a + st.size, 0);
  const r = await receiveFileContent(conn, {
    target,
    size: offer.size,
    mtimeNs: offer.mtimeNs,
    mode: offer.mode & 0o7777,
    localPaths,
    locals: hashLocals(conn, o, { target, localPaths, localTotal }, state),
    targetReusable: !state.isLink && Boolean(dst),
    stateDir: o.stateDir,
    events: o.events,
    refine: o.refine !== false && Boolean(negotiated.capabilities & Capability.REFINE),
    sparse: Boolean(negotiated.capabilities & Capability.SPARSE),
    inplace: o.inplace,
    backup: o.backup,
    partialDir: o.partialDir,
    stream: Boolean(negotiated.capabilities & Capability.STREAM),
    fsync: o.fsync,
    peerCopy: o.localSender === undefined ? undefined : { path: o.localSender, mtimeNs: offer.mtimeNs },
  });
  summary.root = r.root;
  if (r.placedEarly !== undefined) summary.placedEarlyBytes = r.placedEarly;
  if (r.upToDate) return upToDate(summary, 'scan-root');
  summary.literalBytes = r.literalBytes;
  summary.matchedBytes = r.matchedBytes;
}

/**
 * Deciding "unchanged" (docs/protocol.md, "Decision"), and saying so in DECISION:
 * 1. Our index covers the target: content roots decide. The sender's root comes with the
 *    offer when its index covers the source; otherwise it must scan (and send its manifest),
 *    because size and mtime can match while content differs.
 * 2. No index: size + mtime, rsync's quick check. 3. --checksum: always compare content.
 * Returns what decided it, or undefined when the content must be compared.
 */
async function decideUpToDate(conn: FramedConnection, o: ReceiverContext, f: FileSession, s: TargetState): Promise<SyncSummary['decidedBy'] | undefined> {
  const { target, offer, negotiated, summary } = f;
  const { dst, isLink, local } = s;
  const mode = offer.mode & 0o7777;
  const lim = o.sizeLimits;
  if (lim && ((lim.maxSize !== undefined && offer.size > BigInt(lim.maxSize)) || (lim.minSize !== undefined && offer.size < BigInt(lim.minSize)))) {
    if (!(negotiated.capabilities & Capability.SIZE_LIMITS)) {
      throw new FfsyncError('EPROTOCAP', ExitCode.PROTOCOL_INCOMPATIBLE, `the sender (${negotiated.peerSoftware}) does not support --max-size / --min-size`);
    }
    await conn.send(FrameType.DECISION, encodeDecision(Decision.UP_TO_DATE, DecisionReason.SIZE_LIMIT));
    o.events?.info?.(`skipping ${target}: ${offer.size} bytes is outside --max-size / --min-size`);
    return 'size-limit';
  }
  if (offer.flags & OfferFlag.UPDATE && dst && !isLink && dst.mtimeNs > offer.mtimeNs) {
    await conn.send(FrameType.DECISION, encodeDecision(Decision.UP_TO_DATE, DecisionReason.RECEIVER_NEWER));
    return 'receiver-newer';
  }
  if (!isLink && local && offer.root && local.root === offer.root.toString('hex')) {
    await markUpToDate(target, local.manifest, offer.mtimeNs, mode, o.stateDir);
    await conn.send(FrameType.DECISION, encodeDecision(Decision.UP_TO_DATE, DecisionReason.INDEX_ROOT));
    summary.root = local.root;
    return 'index-root';
  }
  if (!isLink && !local && !s.checksum && dst && dst.size === offer.size && dst.mtimeNs === offer.mtimeNs) {
    if (Number(dst.mode & 0o1777n) !== (mode & 0o1777)) await chmodNoFollow(target, mode & 0o1777);
    await conn.send(FrameType.DECISION, encodeDecision(Decision.UP_TO_DATE, DecisionReason.SIZE_MTIME));
    return 'size-mtime';
  }
  return undefined;
}

/** Scan what we have while the sender scans and streams its manifest. The prescan is used
 * when the target did not change since and, under --checksum, it did not come from the index. */
function hashLocals(conn: FramedConnection, o: ReceiverContext, w: { target: string; localPaths: string[]; localTotal: number }, s: TargetState): Promise<ScanResult[]> {
  const hashed = workMeter(); // KEEPALIVEs carry the bytes hashed (§4.11)
  const scanned = inPhase(o.events, 'hashing', w.localTotal, async (phase, progress = hashed.tap(phase)) => {
    const out: ScanResult[] = [];
    let base = 0;
    for (const p of w.localPaths) {
      const early = p === w.target && s.unchangedSinceStart ? (s.local ?? (await o.prescan?.catch(() => undefined))) : undefined;
      const r = early && !(s.checksum && early.fromIndex) ? early : await scanFile(p, { stateDir: o.stateDir, ignoreIndex: s.checksum, onProgress: (n) => progress(base + n) });
      base += r.size;
      out.push(r);
    }
    return out;
  });
  const locals = conn.keepAlive(scanned, hashed);
  locals.catch(() => undefined);
  return locals;
}

function upToDate(summary: SyncSummary, decidedBy: SyncSummary['decidedBy']): void {
  summary.upToDate = true;
  summary.decidedBy = decidedBy;
  summary.matchedBytes = summary.size;
}

/** chmod through a descriptor opened without following a link: a link swapped in at the
 * target since it was examined fails (ELOOP) instead of changing the file it points to. */
async function chmodNoFollow(target: string, mode: number): Promise<void> {
  const flags = fs.constants.O_RDONLY | (fs.constants.O_NOFOLLOW ?? 0) | (fs.constants.O_NONBLOCK ?? 0);
  const fh = await fs.open(target, flags).catch((e: NodeJS.ErrnoException) => {
    throw fromSystemError(e, `cannot set the mode of ${target}`);
  });
  try {
    await fh.chmod(mode);
  } finally {
    await fh.close();
  }
}
