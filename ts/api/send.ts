// The sending side of a single-file sync.

import { nowMs } from '../utils/clock.js';
import { deliveryMeter, LevelGovernor, startLevel } from './compress-level.js';
import fs from 'node:fs/promises';
import { FramedConnection } from '../transport/connection.js';
import { connect } from '../transport/tcp.js';
import { handshakeMs } from '../transport/handshake-time.js';
import { FrameType } from '../protocol/frames.js';
import { Capability, Decision, DecisionReason, decodeDecision, decodeError, encodeOffer, OfferFlag, OfferKind, RequestOp, Role } from '../protocol/messages.js';
import { applyChmod, loadIndex, type NativeChunkSource, type NativeTreeSync, type ScanResult } from '../native/binding.js';
import { ExitCode, FfsyncError, fromSystemError } from '../utils/errors.js';
import { resolveStateDir } from '../utils/state-dir.js';
import { authenticatePeer, closeOnAbort, endSession, expect, handshake, interruptedError, type Negotiated, negotiate, reportError, requestPath } from './session.js';
import { rememberedHello, rememberHello } from '../utils/remembered-hello.js';
import type { Duplex } from 'node:stream';
import type { SecureStream } from '../transport/peer-identity.js';
import { newSummary, type SyncEvents, type SyncSummary } from './events.js';
import { identityChanged, sendFileContent } from './content-send.js';
import { sendTree, startWalk, type TreeSendOptions } from './tree-send.js';
import { ScanAhead } from './scan-ahead.js';
import { BatchRamp } from '../utils/batch-ramp.js';
import { removeSourceFile } from './remove-sources.js';
import path from 'node:path';

export interface SendOptions {
  path: string;
  host: string;
  port: number;
  /** Ignore indexes and the size/mtime fast path; hash everything. */
  checksum?: boolean;
  /** zstd level for chunk data; 0 disables compression. Default 1. */
  compressLevel?: number;
  /** A tree's manifest goes zstd-compressed (default), or with `false` stored uncompressed in its
   * zstd frame: a local sync, whose receiver is in this process (decisions §101). */
  compressManifest?: boolean;
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
  /** Directory trees (ignored for a single file). */
  tree?: TreeSendOptions;
  /** rsync's -u: leave files whose receiver copy is newer. */
  update?: boolean;
  /** rsync's -W: send changed files whole, no delta against the receiver's old version. */
  wholeFile?: boolean;
  /** One QUIC connection (UDP) instead of TCP/TLS; a tree's lanes become its streams. */
  quic?: boolean;
  /** QUIC: give up on the handshake after this long (default: min(timeout, 10 s)). */
  connectTimeoutMs?: number;
  /** `host:port/some/path`: the path under a `serve` daemon's root to push to. */
  remotePath?: string;
  /** Overlapped phases (default on, when the peer supports them): stream a large file's
   * manifest while it is being hashed. `--no-overlap` turns it off. */
  overlap?: boolean;
  /** rsync's --chmod: the modes offered are these rules applied to the real ones. */
  chmod?: string;
  /** rsync's --remove-source-files: after a session in which every file was synced, remove
   * the source files and symlinks the receiver now holds, each only if it is still the
   * version that was listed (remove-sources.ts). */
  removeSourceFiles?: boolean;
  /** `--pair CODE`: first contact by the receiver's one-time code (TLS only); both sides
   * pin each other on success. */
  pair?: string;
  /** How long the connection took to come up (transport/handshake-time.ts); picks the first
   * compression level on a long link. Undefined: not measured (ssh, in-process). */
  handshakeMs?: number;
}

export async function statSource(p: string): Promise<import('node:fs').BigIntStats> {
  let st;
  try {
    st = await fs.stat(p, { bigint: true });
  } catch (e) {
    const err = e as NodeJS.ErrnoException;
    if (err.code === 'ENOENT') throw new FfsyncError('ENOENT', ExitCode.FILE_SELECTION, `source ${p} does not exist`);
    throw fromSystemError(e, `cannot read source ${p}`);
  }
  if (!st.isFile() && !st.isDirectory()) throw new FfsyncError('ENOTFILE', ExitCode.FILE_SELECTION, `source ${p} is neither a regular file nor a directory`);
  return st;
}

export async function send(o: SendOptions): Promise<SyncSummary> {
  const t0 = Date.now();
  const stateDir = resolveStateDir(o.stateDir);
  const st = await statSource(o.path);
  // A tree is walked while we connect and shake hands.
  const walking = st.isDirectory() ? startWalk(path.resolve(o.path), o, stateDir) : undefined;
  walking?.catch(() => undefined);
  const fileIndex = indexedFile(o, st, stateDir);
  // ... and its files are hashed ahead (decisions §95), from the walk's end until triage; a
  // single file while the handshakes and the receiver's DECISION cross.
  const scanAhead = scanAheadOf(o, st, walking, stateDir, fileIndex);
  try {
    return await connectAndSend(o, { stateDir, st, walking, scanAhead, fileIndex, t0 });
  } finally {
    scanAhead?.stop();
  }
}

/** Whether a tree's sender hashes ahead while the session is set up (decisions §95): an
 * overlapped phase, so not with --no-overlap or in a local sync (both peers share the cores
 * there, `overlap: false`), nor where nothing would read the index (-c, -W, a dry run). */
export function scansAhead(o: SendOptions): boolean {
  return o.overlap !== false && !o.checksum && !o.wholeFile && !o.tree?.dryRun;
}

/** What the index says of a single file (`st`) before anything hashed it ahead: the root its
 * OFFER carries. Taken first, so what the receiver decides from it does not depend on how far a
 * scan ahead got by the time the OFFER went (decisions §95). */
export function indexedFile(o: SendOptions, st: import('node:fs').BigIntStats, stateDir: string): Promise<ScanResult | null> | undefined {
  if (!st.isFile()) return undefined;
  const indexed = o.checksum ? Promise.resolve(null) : loadIndex(path.resolve(o.path), stateDir);
  indexed.catch(() => undefined); // sendFile reports it
  return indexed;
}

/** The scan ahead a sender of `st` starts, if any (see scansAhead); a single file's, once
 * `fileIndex` said the index does not have it. */
export function scanAheadOf(o: SendOptions, st: import('node:fs').BigIntStats, walking: Promise<NativeTreeSync> | undefined, stateDir: string, fileIndex?: Promise<ScanResult | null>): ScanAhead | undefined {
  if (!scansAhead(o)) return undefined;
  if (walking) return ScanAhead.sender(walking, path.resolve(o.path), stateDir);
  return fileIndex && ScanAhead.file(path.resolve(o.path), st.size, stateDir, fileIndex);
}

async function connectAndSend(o: SendOptions, c: Pick<SenderContext, 'stateDir' | 'st' | 'walking' | 'scanAhead' | 'fileIndex' | 't0'>): Promise<SyncSummary> {
  const { stateDir, st, walking, scanAhead, fileIndex, t0 } = c;
  const timeoutMs = o.timeoutMs ?? 60_000;
  if (o.pair !== undefined) {
    if (o.plaintext || o.quic) throw new FfsyncError('EUSAGE', ExitCode.USAGE, `--pair runs over TLS: drop --${o.plaintext ? 'plaintext' : 'quic'} for the first session (after pairing, --quic works without a code)`);
    if (o.trust) throw new FfsyncError('EUSAGE', ExitCode.USAGE, '--pair and --trust both decide whom to trust: give one');
    // A typo is caught here, before it spends the receiver's code.
    const { normalizePairingCode } = require('../security/pairing.js') as typeof import('../security/pairing.js'); // eslint-disable-line @typescript-eslint/no-require-imports
    o = { ...o, pair: normalizePairingCode(o.pair) };
  }
  if (o.quic) {
    if (o.plaintext) throw new FfsyncError('EUSAGE', ExitCode.USAGE, '--quic is always encrypted (QUIC has TLS 1.3 built in); drop --plaintext');
    // Loaded when used: a local `sync` (which runs runSender) needs neither TLS nor QUIC.
    /* eslint-disable @typescript-eslint/no-require-imports */
    const { QuicSession } = require('../transport/quic.js') as typeof import('../transport/quic.js');
    const { overQuic } = require('./over-quic.js') as typeof import('./over-quic.js');
    const { loadOrCreateIdentity } = require('../security/identity.js') as typeof import('../security/identity.js');
    /* eslint-enable @typescript-eslint/no-require-imports */
    const dialed = nowMs();
    const quic = await QuicSession.connect(o.host, o.port, loadOrCreateIdentity(stateDir), { timeoutMs: o.connectTimeoutMs ?? Math.min(timeoutMs, 10_000), idleMs: timeoutMs });
    const quicHandshakeMs = nowMs() - dialed;
    return overQuic(quic, 'open', timeoutMs, (conn, stream) => runSender(conn, { ...o, stateDir, st, walking, scanAhead, fileIndex, t0, secure: stream, dialLane: () => quic.openStream(), handshakeMs: quicHandshakeMs }));
  }
  /* eslint-disable @typescript-eslint/no-require-imports */
  const identity = o.plaintext ? undefined : (require('../security/identity.js') as typeof import('../security/identity.js')).loadOrCreateIdentity(stateDir);
  const tls = identity ? (require('../transport/tls.js') as typeof import('../transport/tls.js')) : undefined;
  /* eslint-enable @typescript-eslint/no-require-imports */
  const dial = (): Promise<Duplex> => (identity ? tls!.tlsConnect(o.host, o.port, identity) : connect(o.host, o.port));
  const sock = await dial();
  const conn = new FramedConnection(sock, timeoutMs);
  return runSender(conn, { ...o, stateDir, st, walking, scanAhead, fileIndex, secure: identity ? sock : undefined, dialLane: dial, lanesOwnConnections: true, t0, handshakeMs: handshakeMs(sock) });
}

/** What runSender needs besides the user's options. */
export interface SenderContext extends SendOptions {
  stateDir: string;
  st: import('node:fs').BigIntStats;
  walking?: Promise<NativeTreeSync>;
  /** The tree's files (or the file) hashed ahead, started with the walk (runSender starts it otherwise). */
  scanAhead?: ScanAhead;
  /** A single file: the index's answer taken before anything hashed it ahead (indexedFile). */
  fileIndex?: Promise<ScanResult | null>;
  /** The stream whose peer certificate must be trusted (TLS, QUIC); absent: none to check. */
  secure?: SecureStream;
  /** Vouched-for peer fingerprint (`sync --quic`, learnt over ssh). */
  expectFingerprint?: string;
  dialLane?: () => Promise<Duplex>;
  /** Each lane `dialLane` opens is a network connection of its own (TCP, TLS), with its own
   * congestion window: files are spread over them (decisions §81). QUIC streams share one
   * connection's, and in-process lanes no network at all. */
  lanesOwnConnections?: boolean;
  t0: number;
  /** `serve` daemon answering a pull: the client is authenticated and HELLO is done. */
  negotiated?: Negotiated;
}

/** Everything after the transport is up: over TCP/TLS (`send`), an ssh channel or an
 * in-process pipe (`sync`). Closes `conn` at the end. */
export async function runSender(conn: FramedConnection, o: SenderContext): Promise<SyncSummary> {
  const { stateDir, st, t0 } = o;
  // A tree is walked while the HELLOs cross (`send` and `sync` started it before connecting).
  const walking = st.isDirectory() ? (o.walking ?? startWalk(path.resolve(o.path), o, stateDir)) : undefined;
  walking?.catch(() => undefined);
  const fileIndex = o.fileIndex ?? indexedFile(o, st, stateDir);
  // ... and its files are hashed ahead until triage (a single file until its conversation).
  const scanAhead = o.scanAhead ?? scanAheadOf(o, st, walking, stateDir, fileIndex);
  const stopWatching = closeOnAbort(conn, o.signal);
  const summary = newSummary('sender', o.path, st.isDirectory() ? 0 : Number(st.size));
  // The file being sent, once its conversation started: whether it changed under us decides
  // what a failure means.
  const holder: { source?: NativeChunkSource } = {};
  let helloFailure: unknown;
  try {
    if (o.secure) {
      summary.peerFingerprint = await authenticatePeer(conn, o.secure, { stateDir, trust: o.trust, expect: o.expectFingerprint, interactive: o.interactive, peerLabel: `${o.host}:${o.port}`, events: o.events, pair: o.pair ? { code: o.pair } : undefined });
    }
    const fingerprint = summary.peerFingerprint;
    const shaken = async (n: Negotiated): Promise<Negotiated> => {
      if (fingerprint) rememberHello(stateDir, fingerprint, n.peerHello);
      await requestPath(conn, n, RequestOp.PUSH, o.remotePath, `${o.host}:${o.port}`);
      return n;
    };
    // Our HELLO goes now; what follows waits for the receiver's only where it depends on it
    // (decisions §93).
    const hello = o.negotiated ? Promise.resolve(o.negotiated) : handshake(conn, Role.SENDER, Boolean(o.secure)).then(shaken);
    hello.catch((e: unknown) => (helloFailure = e));
    if (st.isDirectory()) {
      // A tree is offered before the HELLO comes to a receiver we remember.
      const remembered = o.negotiated ? undefined : rememberedReceiver(stateDir, fingerprint, o.remotePath);
      const negotiated = remembered ?? (await hello);
      await sendTree(conn, { ...o, path: path.resolve(o.path), stateDir, negotiated, hello: remembered && hello, summary, st, walking: walking!, scanAhead });
    } else {
      // A file's OFFER depends on nothing the receiver says: it goes behind our HELLO, unless a
      // daemon is to be asked for a path first, or over plaintext TCP: a receiver expecting TLS
      // resets a connection with bytes it did not read, and the sender would report that reset
      // instead of the `--plaintext` mismatch it reads from the answer to its HELLO alone.
      if (o.remotePath !== undefined || o.plaintext) await hello;
      await sendFile(conn, { ...o, fileIndex }, hello, summary, holder);
    }
    summary.ok = true;
    return summary;
  } catch (e) {
    // The receiver's HELLO, read while the offer went, may say why the rest failed (a refusal).
    const err = await senderFailure(conn, o, helloFailure ?? e, holder.source);
    await reportError(conn, err);
    err.summary = summary;
    throw err;
  } finally {
    scanAhead?.stop();
    stopWatching();
    await endSession(conn, summary, t0, 'sender');
  }
}

/** What the receiver with this certificate said at the last session, as this build would
 * negotiate with it: a tree may be offered before its HELLO comes (decisions §93). Not for a
 * peer known by no certificate, a `serve` daemon (it is asked for a path first), or one this
 * build cannot speak with. */
function rememberedReceiver(stateDir: string, fingerprint: string | undefined, remotePath: string | undefined): Negotiated | undefined {
  if (!fingerprint || remotePath !== undefined) return undefined;
  const hello = rememberedHello(stateDir, fingerprint);
  if (!hello || hello.role !== Role.RECEIVER || hello.capabilities & Capability.SERVE) return undefined;
  try {
    return negotiate(hello);
  } catch {
    return undefined;
  }
}

/** A single file: OFFER (with our index's root), the receiver's DECISION, and the content
 * conversation unless it is up to date; then --remove-source-files. */
async function sendFile(conn: FramedConnection, o: SenderContext, hello: Promise<Negotiated>, summary: SyncSummary, holder: { source?: NativeChunkSource }): Promise<void> {
  const { st, stateDir } = o;
  // A valid index lets the receiver compare content roots for the price of a stat.
  // (Taken before the file was hashed ahead: the same whether that scan has ended or not.)
  const scan: ScanResult | null = (await o.fileIndex) ?? null;
  await conn.send(
    FrameType.OFFER,
    encodeOffer({
      kind: OfferKind.FILE,
      size: st.size,
      mtimeNs: st.mtimeNs,
      mode: o.chmod ? applyChmod(o.chmod, Number(st.mode & 0o7777n), false) : Number(st.mode & 0o7777n),
      flags: (o.checksum ? OfferFlag.CHECKSUM : 0) | (o.update ? OfferFlag.UPDATE : 0) | (o.wholeFile ? OfferFlag.WHOLE_FILE : 0),
      root: scan ? Buffer.from(scan.root, 'hex') : undefined,
    }),
  );
  // The receiver's HELLO comes before its DECISION (the OFFER may have gone before it came).
  const negotiated = await hello;
  const { decision, reason } = decodeDecision((await expect(conn, FrameType.DECISION)).payload);
  if (decision === Decision.UP_TO_DATE) {
    summary.upToDate = true;
    summary.decidedBy = reason === DecisionReason.INDEX_ROOT ? 'index-root' : reason === DecisionReason.RECEIVER_NEWER ? 'receiver-newer' : reason === DecisionReason.SIZE_LIMIT ? 'size-limit' : 'size-mtime';
    summary.matchedBytes = summary.size;
    summary.root = scan?.root;
  } else {
    const caps = negotiated.capabilities;
    // Compress only for a peer that said it can decode zstd.
    const level = caps & Capability.ZSTD ? (o.compressLevel ?? 1) : 0;
    const governor = new LevelGovernor(level, o.compressLevel === undefined, startLevel(level, o.handshakeMs), { link: deliveryMeter(conn, negotiated) });
    const r = await sendFileContent(
      conn,
      { path: o.path, st, scan, stateDir, checksum: o.checksum, level, bwlimitKiBps: o.bwlimitKiBps, events: o.events, label: o.path, refine: Boolean(caps & Capability.REFINE), sparse: Boolean(caps & Capability.SPARSE), stream: Boolean(caps & Capability.STREAM), overlap: o.overlap, batchStream: Boolean(caps & Capability.BATCH_STREAM), batchPrefix: Boolean(caps & Capability.BATCH_PREFIX), governor, ramp: new BatchRamp() },
      holder,
    );
    summary.root = r.root;
    summary.upToDate = r.upToDate;
    summary.decidedBy = r.upToDate ? 'scan-root' : 'transfer';
    summary.literalBytes = r.literalBytes;
    summary.matchedBytes = r.matchedBytes;
  }
  if (holder.source && !holder.source.unchanged()) {
    o.events?.info?.(`warning: ${o.path} changed while it was being sent; the receiver has the version that was scanned`);
  }
  // (Not a file the receiver kept as it was on purpose: -u, --max-size / --min-size.)
  if (o.removeSourceFiles && summary.decidedBy !== 'receiver-newer' && summary.decidedBy !== 'size-limit') {
    conn.errorSent = true; // the session is over on the receiver's side: a failure here is ours alone
    await removeSourceFile(o.path, st, o.events);
    conn.errorSent = false;
  }
}

/** What a failed send reports: the receiver's explanation when it gave one first, and "source
 * changed" (24) when the source did. */
async function senderFailure(conn: FramedConnection, o: SenderContext, e: unknown, source: NativeChunkSource | undefined): Promise<FfsyncError> {
  const { st } = o;
  let err = e instanceof FfsyncError ? e : fromSystemError(e, 'send failed');
  // The receiver may have explained its failure before our write failed: prefer that.
  const peerError = conn.takePeerError();
  // (Not over our own "source changed" verdict: that is what the receiver waits for; nor over
  // an offer this receiver cannot take, found when its HELLO came: its complaint about the
  // frames that went early is the consequence, decisions §93.)
  const ours = err.exitCode === ExitCode.VANISHED || err.code === 'EPROTOCHANGED' || err.code === 'EPROTOCAP';
  if (peerError && err.origin !== 'peer' && !ours) err = decodeError(peerError.payload);
  // Interrupted here: whatever the closed connection made of it, that is the error.
  if (o.signal?.aborted) err = interruptedError(err);
  // Something other than an ffsync-native peer answered: name the address we dialed.
  if (err.code === 'ENOTPEER' || err.code === 'ETLSPEER') err = err.withMessage(`${o.host}:${o.port}: ${err.message}`);
  // Our own reason, or the peer's when it is one a changed source explains.
  const detail = err.origin === 'peer' ? '' : ` (${err.message})`;
  if (source && !source.unchanged()) {
    return new FfsyncError('EVANISHED', ExitCode.VANISHED, `source ${o.path} changed during the sync${detail}; rerun to send the new version`, { cause: err });
  }
  if (!st.isDirectory() && (err.code === 'ECHUNK' || (err.exitCode === ExitCode.FILE_IO && err.origin !== 'peer')) && identityChanged(await fs.stat(o.path, { bigint: true }).catch(() => undefined), st)) {
    // A source removed after the first stat (a file I/O error here) or rewritten between a
    // window's hashing and its early DATA (a failed chunk on the receiver) is the documented
    // "source changed" (24), not exit 11 or 12. The receiver waits for this verdict
    // (senderVerdict).
    return new FfsyncError('EVANISHED', ExitCode.VANISHED, `source ${o.path} vanished or changed during the sync${detail}; rerun to send the new version`, { cause: err });
  }
  return err;
}
