// Typed payload codecs for each frame (layouts in docs/protocol.md). Decoders treat
// input as hostile: exact lengths, bounded strings, and every field range-checked.

import { ExitCode, FfsyncError } from '../utils/errors.js';
import { FrameType, protocolError } from './frames.js';
import { MANIFEST_ENTRY, MANIFEST_HEADER } from '../utils/manifest.js';

export const PROTOCOL_MAGIC = Buffer.from('FFSYNC', 'latin1');
/** Versions this build speaks. A peer whose range does not overlap is refused (exit 2). */
export const PROTOCOL_MIN = 1;
export const PROTOCOL_MAX = 2;
/**
 * The highest version this process offers: PROTOCOL_MAX, or lower when FFSYNC_PROTOCOL_MAX
 * says so (rsync's --protocol: to work around a peer's bug, and how the tests play an older
 * peer). Version 2 = multiplexed tree sessions (docs/protocol.md §9.9).
 */
export function offeredProtocolMax(): number {
  const v = process.env.FFSYNC_PROTOCOL_MAX;
  if (v === undefined || v === '') return PROTOCOL_MAX;
  const n = Number(v);
  if (!Number.isInteger(n) || n < PROTOCOL_MIN || n > PROTOCOL_MAX) {
    throw new FfsyncError('EUSAGE', ExitCode.USAGE, `FFSYNC_PROTOCOL_MAX=${v}: this build speaks protocol versions ${PROTOCOL_MIN}..${PROTOCOL_MAX}`);
  }
  return n;
}
/** Capability bits (negotiated as the AND of both peers' sets). */
export const Capability = {
  /** The peer can decode zstd-compressed chunk records. */
  ZSTD: 1 << 0,
  /** Tree sessions carry TREE_OPTIONS (--max-size / --min-size, -o/-g/-X) after FILTER,
   * and TREE_ATTRS when asked; a DECISION may give reason SIZE_LIMIT. (Bit 1 is
   * reserved: older builds set it.) */
  SIZE_LIMITS: 1 << 2,
  /** Sub-chunk refinement: the receiver may send REFINE frames (signatures of its old
   * bytes) before NEED_END, and the sender may answer with delta records (§4.12). */
  REFINE: 1 << 3,
  /** Sparse files: the sender sends one HOLES frame (its file's holes) after the manifest;
   * the receiver skips chunks inside them and punches the holes into the result (§4.13). */
  SPARSE: 1 << 4,
  /** Set only by a `serve` daemon: the client must address a path with REQUEST right after
   * HELLO (and waits for ACCEPT) before the usual OFFER (§4.14). Never part of the AND. */
  SERVE: 1 << 5,
  /** Tree sessions: a large file whose data arrived but whose commit failed (the target
   * cannot be replaced: an immutable file, a read-only bind mount) is answered with
   * RESULT status 2 = NOT_WRITTEN and reported, instead of failing the session (§4.9). */
  COMMIT_REFUSAL: 1 << 6,
  /** Overlapped phases, for files larger than STREAM_WINDOW: the receiver first says in
   * BASIS whether it has anything to build from; a sender still scanning streams its
   * manifest entries in MANIFEST_STREAM frames (and, to an empty basis, each window's
   * chunks as early DATA), then sends the manifest's header alone in MANIFEST; the
   * receiver places what it has while the rest is hashed (§4.15). */
  STREAM: 1 << 7,
  /** Tree sessions: FILE_BATCH records may use encodings 2 and 3, consecutive files of a
   * batch sharing one zstd stream (§9.6). */
  BATCH_STREAM: 1 << 10,
  /** Tree sessions: TREE_OPTIONS may carry OMIT_TIMES / OMIT_PERMS (`sync` without -t / -p,
   * §9.2): both peers' triage then ignores those differences and the receiver keeps them. */
  OMIT_ATTRS: 1 << 11,
  /** Tree sessions: TREE_OPTIONS may have an 18th byte of triage choices (rsync's
   * --size-only, --ignore-existing, --existing, §9.2) that both peers' triage applies. */
  TRIAGE_CHOICES: 1 << 12,
  /** Tree sessions: TREE_RESULT may carry exit 25 (rsync's --max-delete left deletions undone). */
  DELETE_LIMIT: 1 << 13,
  /** The data-receiving peer reports, in DELIVERED frames, how many bytes it has read off the
   * connection (§4.16): the sender's compression governor sees the link through the socket
   * buffers that otherwise take the first megabytes at memory speed. */
  DELIVERY: 1 << 14,
  /** DATA records may use encodings 8 and 9: a zstd stream that starts with the raw bytes of
   * the file's previous DATA frame as history (§4.7), so on a slow link a batch compresses
   * against the one before it too; the receiver reads that history back from what it wrote. */
  BATCH_PREFIX: 1 << 15,
  /** Tree sessions: TREE_OPTIONS' 18th byte may carry WHOLE_SMALL (8): a changed file up to
   * 1 MiB travels whole in a batch, not as a delta (a local sync's default, §9.2). */
  WHOLE_SMALL: 1 << 16,
} as const;
export const OUR_CAPABILITIES = Capability.ZSTD | Capability.SIZE_LIMITS | Capability.REFINE | Capability.SPARSE | Capability.COMMIT_REFUSAL | Capability.STREAM | Capability.BATCH_STREAM | Capability.OMIT_ATTRS | Capability.TRIAGE_CHOICES | Capability.DELETE_LIMIT | Capability.DELIVERY | Capability.BATCH_PREFIX | Capability.WHOLE_SMALL;
/** Most REFINE bytes one file transfer may carry (the core's refine::MAX_TABLE_BYTES;
 * __test__/native-constants.test.ts checks they agree). */
export const MAX_REFINE_TABLE = 64 * 1024 * 1024;
/** REFINE payloads are cut at this size. */
export const REFINE_PART = 1024 * 1024;

export const Role = { SENDER: 1, RECEIVER: 2 } as const;

/** REQUEST operations: PUSH = the client sends into the daemon's root, PULL = it fetches. */
export const RequestOp = { PUSH: 1, PULL: 2 } as const;
/** Longest path a REQUEST may name (bytes); the daemon's authorization checks the same bound. */
export const MAX_REQUEST_PATH = 4096;

export interface Request {
  op: number;
  /** '/'-separated, relative to the daemon's root (normalized by the daemon). */
  path: string;
}

export function encodeRequest(r: Request): Buffer {
  const p = Buffer.from(r.path, 'utf8');
  if (p.length > MAX_REQUEST_PATH) throw new FfsyncError('EUSAGE', ExitCode.USAGE, `remote path is longer than ${MAX_REQUEST_PATH} bytes`);
  const b = Buffer.alloc(4 + p.length);
  b.writeUInt8(r.op, 0);
  b.writeUInt8(0, 1);
  b.writeUInt16LE(p.length, 2);
  p.copy(b, 4);
  return b;
}

export function decodeRequest(p: Buffer): Request {
  if (p.length < 4) throw protocolError('REQUEST is too short');
  const op = p.readUInt8(0);
  if (op !== RequestOp.PUSH && op !== RequestOp.PULL) throw protocolError(`REQUEST with unknown operation ${op}`);
  if (p.readUInt8(1) !== 0) throw protocolError('REQUEST with unknown flags');
  const len = p.readUInt16LE(2);
  if (len > MAX_REQUEST_PATH || p.length !== 4 + len) throw protocolError('REQUEST has a bad length');
  const path = p.subarray(4).toString('utf8');
  if (Buffer.byteLength(path, 'utf8') !== len) throw protocolError('REQUEST path is not UTF-8');
  return { op, path };
}

export interface Hello {
  minVersion: number;
  maxVersion: number;
  capabilities: number;
  role: number;
  software: string;
}

export function encodeHello(h: Hello): Buffer {
  const sw = Buffer.from(h.software, 'utf8').subarray(0, 64);
  const b = Buffer.alloc(6 + 2 + 2 + 4 + 1 + 1 + sw.length);
  PROTOCOL_MAGIC.copy(b, 0);
  b.writeUInt16LE(h.minVersion, 6);
  b.writeUInt16LE(h.maxVersion, 8);
  b.writeUInt32LE(h.capabilities >>> 0, 10);
  b.writeUInt8(h.role, 14);
  b.writeUInt8(sw.length, 15);
  sw.copy(b, 16);
  return b;
}

export function decodeHello(p: Buffer): Hello {
  if (p.length < 16 || !p.subarray(0, 6).equals(PROTOCOL_MAGIC)) {
    throw new FfsyncError('EPROTOVERSION', ExitCode.PROTOCOL_INCOMPATIBLE, 'peer is not speaking the ffsync-native protocol');
  }
  const swLen = p.readUInt8(15);
  if (p.length !== 16 + swLen) throw protocolError('HELLO has a bad length');
  const role = p.readUInt8(14);
  if (role !== Role.SENDER && role !== Role.RECEIVER) throw protocolError(`HELLO with unknown role ${role}`);
  return {
    minVersion: p.readUInt16LE(6),
    maxVersion: p.readUInt16LE(8),
    capabilities: p.readUInt32LE(10),
    role,
    software: p.subarray(16).toString('utf8'),
  };
}

/** Highest version both ranges contain, or a clear refusal naming both ranges. */
export function negotiateVersion(ours: { min: number; max: number }, peer: Hello): number {
  const v = Math.min(ours.max, peer.maxVersion);
  if (v < ours.min || v < peer.minVersion || peer.minVersion > peer.maxVersion) {
    throw new FfsyncError(
      'EPROTOVERSION',
      ExitCode.PROTOCOL_INCOMPATIBLE,
      `protocol version mismatch: we speak ${ours.min}..${ours.max}, peer (${peer.software || 'unknown'}) speaks ${peer.minVersion}..${peer.maxVersion}; upgrade the older side`,
    );
  }
  return v;
}

export const OfferKind = { FILE: 1, TREE: 2 } as const;
/** For tree offers with PARALLEL, the OFFER's size field carries the lanes wanted (2..16). */
export const OfferFlag = {
  CHECKSUM: 1 << 0,
  HAS_ROOT: 1 << 1,
  NO_DELETE: 1 << 2,
  DRY_RUN: 1 << 3,
  PARALLEL: 1 << 4,
  /** rsync's -u: leave files whose receiver copy is newer. */
  UPDATE: 1 << 5,
  /** rsync's -W: no delta against the receiver's old version. */
  WHOLE_FILE: 1 << 6,
  /** rsync's -x (trees): do not enter directories on other filesystems. */
  ONE_FILE_SYSTEM: 1 << 7,
} as const;
const KNOWN_OFFER_FLAGS = 0xff;
export const MAX_LANES = 16;

export interface Offer {
  kind: number;
  size: bigint;
  mtimeNs: bigint;
  mode: number;
  flags: number;
  /** Present when the sender's index already knows its content root. */
  root?: Buffer;
}

export function encodeOffer(o: Offer): Buffer {
  const b = Buffer.alloc(1 + 8 + 8 + 4 + 1 + 32);
  b.writeUInt8(o.kind, 0);
  b.writeBigUInt64LE(o.size, 1);
  b.writeBigInt64LE(o.mtimeNs, 9);
  b.writeUInt32LE(o.mode >>> 0, 17);
  b.writeUInt8(o.flags | (o.root ? OfferFlag.HAS_ROOT : 0), 21);
  if (o.root) o.root.copy(b, 22);
  return b;
}

export function decodeOffer(p: Buffer): Offer {
  if (p.length !== 54) throw protocolError('OFFER has a bad length');
  const flags = p.readUInt8(21);
  if (flags & ~KNOWN_OFFER_FLAGS) throw protocolError(`OFFER with unknown flags 0x${flags.toString(16)}`);
  const kind = p.readUInt8(0);
  if (kind !== OfferKind.FILE && kind !== OfferKind.TREE) throw protocolError(`OFFER of unknown kind ${kind}`);
  if (kind === OfferKind.TREE && flags & OfferFlag.HAS_ROOT) throw protocolError('tree OFFER with a root');
  if (kind === OfferKind.FILE && flags & (OfferFlag.NO_DELETE | OfferFlag.DRY_RUN | OfferFlag.PARALLEL | OfferFlag.ONE_FILE_SYSTEM)) throw protocolError('file OFFER with tree flags');
  const size = p.readBigUInt64LE(1);
  if (kind === OfferKind.TREE && (flags & OfferFlag.PARALLEL ? size < 2n || size > BigInt(MAX_LANES) : size !== 0n)) throw protocolError(`tree OFFER with a bad lane count ${size}`);
  return {
    kind,
    size: p.readBigUInt64LE(1),
    mtimeNs: p.readBigInt64LE(9),
    mode: p.readUInt32LE(17),
    flags,
    root: flags & OfferFlag.HAS_ROOT ? Buffer.from(p.subarray(22, 54)) : undefined,
  };
}

export const Decision = { UP_TO_DATE: 0, SEND_MANIFEST: 1 } as const;
/** Why the receiver decided: lets both sides report the same `decidedBy`. */
/** SIZE_LIMIT: the file is outside the receiver's --max-size / --min-size and is left alone. */
export const DecisionReason = { NONE: 0, SIZE_MTIME: 1, INDEX_ROOT: 2, RECEIVER_NEWER: 3, SIZE_LIMIT: 4 } as const;

export function encodeDecision(d: number, reason: number = DecisionReason.NONE): Buffer {
  return Buffer.from([d, reason]);
}

export function decodeDecision(p: Buffer): { decision: number; reason: number } {
  if (p.length !== 2 || p[0] > Decision.SEND_MANIFEST || p[1] > DecisionReason.SIZE_LIMIT) throw protocolError('bad DECISION');
  if ((p[0] === Decision.UP_TO_DATE) !== (p[1] !== DecisionReason.NONE)) throw protocolError('DECISION reason does not fit the decision');
  return { decision: p[0], reason: p[1] };
}

/** MANIFEST frames: `total length u32 | part`; parts concatenate to the packed manifest. */
export const MANIFEST_PART = 1024 * 1024;

export function* manifestFrames(manifest: Buffer): Generator<Buffer> {
  for (let at = 0; at < manifest.length || at === 0; at += MANIFEST_PART) {
    const part = manifest.subarray(at, at + MANIFEST_PART);
    const b = Buffer.allocUnsafe(4 + part.length);
    b.writeUInt32LE(manifest.length, 0);
    part.copy(b, 4);
    yield b;
    if (manifest.length === 0) break;
  }
}

/** Files larger than this are scanned in windows of this size and their manifest streamed
 * (when STREAM is negotiated): big enough that per-window costs vanish (≈ 256 entries,
 * 9 KiB a window), small enough that the receiver starts within a fraction of the scan. */
export const STREAM_WINDOW = 64 * 1024 * 1024;

/** MANIFEST_STREAM frames: whole manifest entries, `len u32 | blake3 [32]` each. */
export function* manifestStreamFrames(entries: Buffer): Generator<Buffer> {
  const per = Math.floor(MANIFEST_PART / MANIFEST_ENTRY) * MANIFEST_ENTRY;
  for (let at = 0; at < entries.length; at += per) yield entries.subarray(at, at + per);
}

/**
 * Hard cap on a manifest, whatever size the peer offers: 128 MiB is 3.7 M chunks, a file
 * of at least 230 GiB even if every chunk had the minimum length (≈ 1 TiB typically).
 */
export const MAX_MANIFEST_BYTES = 128 * 1024 * 1024;

/** Largest packed manifest a file of `size` bytes can have (every chunk >= min), capped. */
export function maxManifestLength(size: bigint): number {
  const minChunk = size >= 16n * 1024n * 1024n ? 65536n : 16384n;
  const chunks = size === 0n ? 0n : size / minChunk + 1n;
  const len = BigInt(MANIFEST_HEADER) + chunks * BigInt(MANIFEST_ENTRY);
  return len > BigInt(MAX_MANIFEST_BYTES) ? MAX_MANIFEST_BYTES : Number(len);
}

/**
 * Reassembles MANIFEST frames, refusing anything larger than the offer allows. Memory
 * grows only with bytes actually received, never with the length a peer claims.
 */
export class ManifestAssembler {
  private readonly parts: Buffer[] = [];
  private total = -1;
  private filled = 0;
  constructor(
    private readonly maxLength: number,
    private readonly minLength: number = MANIFEST_HEADER,
  ) {}

  /** Returns the whole manifest once complete. */
  push(p: Buffer): Buffer | undefined {
    if (p.length < 4) throw protocolError('MANIFEST frame too short');
    const total = p.readUInt32LE(0);
    if (total < this.minLength || total > this.maxLength) throw protocolError(`manifest length ${total} impossible for the offered file`);
    if (this.total < 0) this.total = total;
    else if (this.total !== total) throw protocolError('MANIFEST frames disagree on the total length');
    const part = p.subarray(4);
    if (this.filled + part.length > total) throw protocolError('MANIFEST frames exceed the total length');
    if (part.length === 0) throw protocolError('empty MANIFEST part');
    this.parts.push(Buffer.from(part));
    this.filled += part.length;
    return this.filled === total ? Buffer.concat(this.parts, total) : undefined;
  }
}

/** NEED frames: `first chunk index u32 | bitmap` (bit i of byte j => chunk first+8j+i). */
export const NEED_BITMAP_PART = 64 * 1024;

export function* needFrames(needed: Uint32Array, chunkCount: number): Generator<Buffer> {
  const bitmap = Buffer.alloc(Math.ceil(chunkCount / 8));
  for (const i of needed) bitmap[i >> 3] |= 1 << (i & 7);
  for (let byte = 0; byte < bitmap.length; byte += NEED_BITMAP_PART) {
    const part = bitmap.subarray(byte, byte + NEED_BITMAP_PART);
    if (part.every((v) => v === 0)) continue;
    const b = Buffer.allocUnsafe(4 + part.length);
    b.writeUInt32LE(byte * 8, 0);
    part.copy(b, 4);
    yield b;
  }
}

/** Collects NEED frames into a sorted list of chunk indices. */
export class NeedCollector {
  private readonly marks: Uint8Array;
  constructor(private readonly chunkCount: number) {
    this.marks = new Uint8Array(chunkCount);
  }

  push(p: Buffer): void {
    if (p.length < 5) throw protocolError('NEED frame too short');
    const first = p.readUInt32LE(0);
    const bits = (p.length - 4) * 8;
    if (first >= this.chunkCount || first % 8 !== 0 || bits > NEED_BITMAP_PART * 8) {
      throw protocolError('NEED frame out of range');
    }
    for (let k = 0; k < bits; k++) {
      if (p[4 + (k >> 3)] & (1 << (k & 7))) {
        if (first + k >= this.chunkCount) throw protocolError('NEED names a chunk beyond the manifest');
        this.marks[first + k] = 1;
      }
    }
  }

  finish(expected: number): Uint32Array {
    const out: number[] = [];
    for (let i = 0; i < this.chunkCount; i++) if (this.marks[i]) out.push(i);
    if (out.length !== expected) throw protocolError(`NEED_END announced ${expected} chunks, NEED frames named ${out.length}`);
    return Uint32Array.from(out);
  }
}

export interface NeedEnd {
  wireChunks: number;
  identical: boolean;
  /** Tree sessions: the receiver cannot write this file (reported, exit 23); no DATA follows. */
  refused?: boolean;
}

/** BASIS (capability STREAM, files larger than STREAM_WINDOW): the receiver's first word
 * on a file's content. `empty`: it has nothing to build from (no old file, no --from file,
 * no partial), so every chunk is proven missing and the sender may send each window's
 * chunks as early DATA while it is still hashing (§4.15). */
export function encodeBasis(b: { empty: boolean }): Buffer {
  return Buffer.from([b.empty ? 1 : 0]);
}

export function decodeBasis(p: Buffer): { empty: boolean } {
  if (p.length !== 1 || p[0] > 1) throw protocolError('bad BASIS');
  return { empty: p[0] === 1 };
}

export function encodeNeedEnd(n: NeedEnd): Buffer {
  const b = Buffer.alloc(5);
  b.writeUInt32LE(n.wireChunks, 0);
  b.writeUInt8(n.identical ? 1 : n.refused ? 2 : 0, 4);
  return b;
}

export function decodeNeedEnd(p: Buffer): NeedEnd {
  if (p.length !== 5 || p[4] > 2) throw protocolError('bad NEED_END');
  const n = { wireChunks: p.readUInt32LE(0), identical: p[4] === 1, refused: p[4] === 2 };
  if ((n.identical || n.refused) && n.wireChunks !== 0) throw protocolError('NEED_END says identical or refused but asks for chunks');
  return n;
}

export interface DataEnd {
  chunks: number;
  rawBytes: bigint;
}

export function encodeDataEnd(d: DataEnd): Buffer {
  const b = Buffer.alloc(12);
  b.writeUInt32LE(d.chunks, 0);
  b.writeBigUInt64LE(d.rawBytes, 4);
  return b;
}

export function decodeDataEnd(p: Buffer): DataEnd {
  if (p.length !== 12) throw protocolError('bad DATA_END');
  return { chunks: p.readUInt32LE(0), rawBytes: p.readBigUInt64LE(4) };
}

/** NOT_WRITTEN only in tree sessions that negotiated COMMIT_REFUSAL (callers check). */
export const ResultStatus = { SYNCED: 0, UP_TO_DATE: 1, NOT_WRITTEN: 2 } as const;

export interface SyncResult {
  status: number;
  /** Bytes reused from local files (old target, --from, resumed partial). */
  matchedBytes: bigint;
  /** Bytes received from the wire (uncompressed). */
  literalBytes: bigint;
}

export function encodeResult(r: SyncResult): Buffer {
  const b = Buffer.alloc(17);
  b.writeUInt8(r.status, 0);
  b.writeBigUInt64LE(r.matchedBytes, 1);
  b.writeBigUInt64LE(r.literalBytes, 9);
  return b;
}

export function decodeResult(p: Buffer): SyncResult {
  if (p.length !== 17 || p[0] > ResultStatus.NOT_WRITTEN) throw protocolError('bad RESULT');
  return { status: p[0], matchedBytes: p.readBigUInt64LE(1), literalBytes: p.readBigUInt64LE(9) };
}

// ---- Directory trees (docs/protocol.md, "Tree sessions") ----

/** Compressed tree manifests and ROOTS travel in MANIFEST-style parts; caps per peer. */
export const MAX_TREE_WIRE_BYTES = 1024 * 1024 * 1024;
/** TREE_ATTRS: the compressed owner/group/xattr table, at most this long. */
export const MAX_ATTR_TABLE_BYTES = 64 * 1024 * 1024;

/** FILTER: the sender's exclude patterns, UTF-8, one per line (empty = none). */
export function encodeFilter(patterns: string[]): Buffer {
  return Buffer.from(patterns.join('\n'), 'utf8');
}

export function decodeFilter(p: Buffer): string[] {
  if (p.length > 64 * 1024) throw protocolError('FILTER larger than 64 KiB');
  const text = p.toString('utf8');
  if (!Buffer.from(text, 'utf8').equals(p)) throw protocolError('FILTER is not UTF-8');
  return text.length === 0 ? [] : text.split('\n');
}

/** FILE_BEGIN: a large file's conversation follows (status 0), or it is skipped. */
export const FileBeginStatus = { SENDING: 0, VANISHED: 1, UNREADABLE: 2 } as const;

export function encodeFileBegin(action: number, status: number): Buffer {
  const b = Buffer.alloc(5);
  b.writeUInt32LE(action, 0);
  b.writeUInt8(status, 4);
  return b;
}

export function decodeFileBegin(p: Buffer): { action: number; status: number } {
  if (p.length !== 5 || p[4] > FileBeginStatus.UNREADABLE) throw protocolError('bad FILE_BEGIN');
  return { action: p.readUInt32LE(0), status: p[4] };
}

export interface TreeEnd {
  smallFiles: number;
  largeFiles: number;
  /** Entries the sender could not read (unreadable directories, files): exit 23, no deletes. */
  senderProblems: number;
}

export function encodeTreeEnd(e: TreeEnd): Buffer {
  const b = Buffer.alloc(12);
  b.writeUInt32LE(e.smallFiles, 0);
  b.writeUInt32LE(e.largeFiles, 4);
  b.writeUInt32LE(e.senderProblems, 8);
  return b;
}

export function decodeTreeEnd(p: Buffer): TreeEnd {
  if (p.length !== 12) throw protocolError('bad TREE_END');
  return { smallFiles: p.readUInt32LE(0), largeFiles: p.readUInt32LE(4), senderProblems: p.readUInt32LE(8) };
}

export interface TreeResult {
  /** 0, 23 (some paths failed) or 24 (some vanished on the sender). */
  exitCode: number;
  filesWritten: bigint;
  literalBytes: bigint;
  matchedBytes: bigint;
  deleted: bigint;
  errorCount: number;
  /** The first problems, one per line (bounded). */
  message: string;
}

export function encodeTreeResult(r: TreeResult): Buffer {
  const m = Buffer.from(r.message, 'utf8').subarray(0, MAX_ERROR_MESSAGE);
  const b = Buffer.alloc(37 + m.length);
  b.writeUInt8(r.exitCode, 0);
  b.writeBigUInt64LE(r.filesWritten, 1);
  b.writeBigUInt64LE(r.literalBytes, 9);
  b.writeBigUInt64LE(r.matchedBytes, 17);
  b.writeBigUInt64LE(r.deleted, 25);
  b.writeUInt32LE(r.errorCount, 33);
  m.copy(b, 37);
  return b;
}

export function decodeTreeResult(p: Buffer): TreeResult {
  if (p.length < 37 || p.length > 37 + MAX_ERROR_MESSAGE || ![0, 23, 24, 25].includes(p[0])) throw protocolError('bad TREE_RESULT');
  return {
    exitCode: p[0],
    filesWritten: p.readBigUInt64LE(1),
    literalBytes: p.readBigUInt64LE(9),
    matchedBytes: p.readBigUInt64LE(17),
    deleted: p.readBigUInt64LE(25),
    errorCount: p.readUInt32LE(33),
    message: p.subarray(37).toString('utf8'),
  };
}

/** LANES (receiver, parallel tree sessions): lanes granted u8 + a 16-byte join token. */
export function encodeLanes(granted: number, token: Buffer): Buffer {
  return Buffer.concat([Buffer.from([granted]), token]);
}

export function decodeLanes(p: Buffer): { granted: number; token: Buffer } {
  if (p.length !== 17 || p[0] < 1 || p[0] > MAX_LANES) throw protocolError('bad LANES');
  return { granted: p[0], token: Buffer.from(p.subarray(1)) };
}

// `sync --quic`: the ssh channel vouches for both QUIC identities (docs/protocol.md §10).
const FINGERPRINT_BYTES = 32;

function fingerprintBytes(fp: string): Buffer {
  return Buffer.from(fp.replace(/-/g, ''), 'hex');
}

function fingerprintText(b: Buffer): string {
  return b.toString('hex').toUpperCase().match(/.{4}/g)!.join('-');
}

/** QUIC_OFFER: the local peer's certificate fingerprint. */
export function encodeQuicOffer(fingerprint: string): Buffer {
  return fingerprintBytes(fingerprint);
}

export function decodeQuicOffer(p: Buffer): { fingerprint: string } {
  if (p.length !== FINGERPRINT_BYTES) throw protocolError('bad QUIC_OFFER');
  return { fingerprint: fingerprintText(p) };
}

/** QUIC_READY: u16 UDP port | 32-byte fingerprint | address the ssh connection reached (UTF-8, may be empty). */
export function encodeQuicReady(port: number, fingerprint: string, address: string): Buffer {
  const a = Buffer.from(address, 'utf8').subarray(0, 64);
  const b = Buffer.alloc(2 + FINGERPRINT_BYTES + a.length);
  b.writeUInt16LE(port, 0);
  fingerprintBytes(fingerprint).copy(b, 2);
  a.copy(b, 2 + FINGERPRINT_BYTES);
  return b;
}

export function decodeQuicReady(p: Buffer): { port: number; fingerprint: string; address: string } {
  if (p.length < 2 + FINGERPRINT_BYTES || p.length > 2 + FINGERPRINT_BYTES + 64) throw protocolError('bad QUIC_READY');
  const port = p.readUInt16LE(0);
  if (port === 0) throw protocolError('bad QUIC_READY: port 0');
  return { port, fingerprint: fingerprintText(p.subarray(2, 2 + FINGERPRINT_BYTES)), address: p.subarray(2 + FINGERPRINT_BYTES).toString('utf8') };
}

/** TREE_OPTIONS: `max u64 (2^64-1 = none), min u64 (0 = none), attrs u8`: source files
 * outside [min, max] are left alone; `attrs` (AttrFlag) asks for the TREE_ATTRS table. */
export interface SizeLimits {
  maxSize?: number;
  minSize?: number;
}

/** Which attributes travel in TREE_ATTRS (crates/ffsync_core/src/tree/attrs.rs). */
export const AttrFlag = { OWNER: 1, GROUP: 2, XATTRS: 4, NUMERIC_IDS: 8 } as const;

export interface TreeOptions extends SizeLimits {
  attrs: number;
  /** rsync without -t: times are not kept (capability OMIT_ATTRS; bit 16 of the attrs byte). */
  omitTimes?: boolean;
  /** rsync without -p: existing entries keep their modes, new ones get the sender's minus
   * the receiver's umask (capability OMIT_ATTRS; bit 32 of the attrs byte). */
  omitPerms?: boolean;
  /** rsync's --size-only, --ignore-existing, --existing (capability TRIAGE_CHOICES; the
   * 18th byte, bits 1, 2, 4). */
  sizeOnly?: boolean;
  ignoreExisting?: boolean;
  existingOnly?: boolean;
  /** A changed file up to 1 MiB travels whole in a batch, not as a delta against the
   * receiver's old version: a local sync's default, as rsync's -W is for local copies
   * (capability WHOLE_SMALL; bit 8 of the 18th byte; decisions §107). */
  wholeSmall?: boolean;
}

const OMIT_TIMES = 16;
const OMIT_PERMS = 32;
const SIZE_ONLY = 1;
const IGNORE_EXISTING = 2;
const EXISTING_ONLY = 4;
const WHOLE_SMALL = 8;

/** Whether these options need the 18th byte (only sent to a peer with TRIAGE_CHOICES, and
 * `wholeSmall` only to one with WHOLE_SMALL too). */
export function hasTriageChoices(l: TreeOptions): boolean {
  return hasRsyncChoices(l) || Boolean(l.wholeSmall);
}

/** Whether these options carry one of rsync's triage choices (--size-only, --ignore-existing,
 * --existing), which a user asked for. */
export function hasRsyncChoices(l: TreeOptions): boolean {
  return Boolean(l.sizeOnly || l.ignoreExisting || l.existingOnly);
}

const NO_MAX = 0xffff_ffff_ffff_ffffn;

export function encodeTreeOptions(l: TreeOptions): Buffer {
  const b = Buffer.alloc(hasTriageChoices(l) ? 18 : 17);
  if (b.length === 18) b.writeUInt8((l.sizeOnly ? SIZE_ONLY : 0) | (l.ignoreExisting ? IGNORE_EXISTING : 0) | (l.existingOnly ? EXISTING_ONLY : 0) | (l.wholeSmall ? WHOLE_SMALL : 0), 17);
  b.writeBigUInt64LE(l.maxSize === undefined ? NO_MAX : BigInt(l.maxSize), 0);
  b.writeBigUInt64LE(BigInt(l.minSize ?? 0), 8);
  b.writeUInt8(l.attrs | (l.omitTimes ? OMIT_TIMES : 0) | (l.omitPerms ? OMIT_PERMS : 0), 16);
  return b;
}

export function decodeTreeOptions(p: Buffer): TreeOptions {
  if ((p.length !== 17 && p.length !== 18) || p[16] > 63 || (p.length === 18 && (p[17] === 0 || p[17] > 15))) throw protocolError('bad TREE_OPTIONS');
  const choices = p.length === 18 ? p[17] : 0;
  const max = p.readBigUInt64LE(0);
  const min = p.readBigUInt64LE(8);
  if (max > BigInt(Number.MAX_SAFE_INTEGER) && max !== NO_MAX) throw protocolError('bad TREE_OPTIONS: max too large');
  if (min > BigInt(Number.MAX_SAFE_INTEGER)) throw protocolError('bad TREE_OPTIONS: min too large');
  return { maxSize: max === NO_MAX ? undefined : Number(max), minSize: min === 0n ? undefined : Number(min), attrs: p[16] & 15, omitTimes: (p[16] & OMIT_TIMES) !== 0, omitPerms: (p[16] & OMIT_PERMS) !== 0, sizeOnly: (choices & SIZE_ONLY) !== 0, ignoreExisting: (choices & IGNORE_EXISTING) !== 0, existingOnly: (choices & EXISTING_ONLY) !== 0, wholeSmall: (choices & WHOLE_SMALL) !== 0 };
}

export const MAX_ERROR_MESSAGE = 4096;

export function encodeError(exitCode: number, code: string, message: string): Buffer {
  const c = Buffer.from(code, 'utf8').subarray(0, 32);
  const m = Buffer.from(message, 'utf8').subarray(0, MAX_ERROR_MESSAGE);
  const b = Buffer.alloc(2 + 1 + c.length + m.length);
  b.writeUInt16LE(exitCode, 0);
  b.writeUInt8(c.length, 2);
  c.copy(b, 3);
  m.copy(b, 3 + c.length);
  return b;
}

/** An ERROR frame from the peer, surfaced with the peer's exit code and message. */
export function decodeError(p: Buffer): FfsyncError {
  if (p.length < 3 || p.length > 3 + 32 + MAX_ERROR_MESSAGE) return protocolError('malformed ERROR frame');
  const exit = p.readUInt16LE(0);
  const cl = p.readUInt8(2);
  if (cl > 32 || 3 + cl > p.length) return protocolError('malformed ERROR frame');
  const code = p.subarray(3, 3 + cl).toString('utf8');
  const message = p.subarray(3 + cl).toString('utf8');
  // A failure is never success: exit 0 or an unknown code from the peer becomes 12.
  const known = (Object.values(ExitCode) as number[]).filter((c) => c !== ExitCode.OK);
  return new FfsyncError(code || 'EPEER', (known.includes(exit) ? exit : ExitCode.PROTOCOL_STREAM) as ExitCode, `peer: ${message}`, { origin: 'peer' });
}

export function expectType(got: number, ...want: FrameType[]): void {
  if (!want.includes(got as FrameType)) {
    throw protocolError(`unexpected frame 0x${got.toString(16)} (expected ${want.map((w) => '0x' + w.toString(16)).join(' or ')})`);
  }
}

export { FrameType };
