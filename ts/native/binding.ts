// The only module that touches the generated loader (binding/index.js, written by
// `napi build`; never edited by hand). Everything else imports from here.
import type * as Binding from '../../binding/index.js';
import { normalizeNativeError } from '../utils/errors.js';
import { takeEarlyWalk } from './early-walks.js';
import { loadNative } from './loader.js';

// The prebuilt package ffsync-native-<platform> if installed, else the local build in binding/
// (ts/native/loader.ts); one clear error naming the platform when neither loads.
const loaded = loadNative<typeof Binding>(require.resolve('../../binding/index.js'));
const native: typeof Binding = loaded.binding;
/** The .node file the addon was loaded from (diagnostics; the packaging test checks it). */
export const nativeOrigin: string = loaded.origin;

export type { ScanResult, PlanSummary, EncodedBatch, ManifestInfo } from '../../binding/index.js';
export type NativeReconstruction = Binding.NativeReconstruction;
export type NativeChunkSource = Binding.NativeChunkSource;
export type NativeTreeSync = Binding.NativeTreeSync;
export type NativeQuicListener = Binding.NativeQuicListener;
export type NativeQuicConnection = Binding.NativeQuicConnection;
export type NativeQuicStream = Binding.NativeQuicStream;
export type NativeScanStream = Binding.NativeScanStream;
export type NativePrefill = Binding.NativePrefill;
export type { BackupOptions, DirMergeSpec, PlanCounts, LargeTransferInfo, SmallBatch, StepOutcome, TreeStats, WalkTreeOptions } from '../../binding/index.js';

/** Await a native promise, turning `CODE: message` errors into FfsyncErrors. */
export async function call<T>(p: Promise<T> | (() => T)): Promise<T> {
  try {
    return typeof p === 'function' ? p() : await p;
  } catch (e) {
    throw normalizeNativeError(e);
  }
}

export interface ScanOptions {
  stateDir?: string;
  ignoreIndex?: boolean;
  /** Chunk with the parameters of a file of this size (no index read or written). */
  paramsForSize?: number;
  onProgress?: (bytesDone: number) => void;
}

/** Chunk + hash a file on every core (or take its manifest from the index). */
export function scanFile(path: string | Buffer, opts: ScanOptions = {}): Promise<Binding.ScanResult> {
  return call(native.scanFileNative(path, { stateDir: opts.stateDir, ignoreIndex: opts.ignoreIndex, paramsForSize: opts.paramsForSize }, progressCallback(opts.onProgress)));
}

/** Hash a file into the index at the system's idle priority, off libuv's pool (a scan ahead of
 * the conversations, decisions §95). Resolves to whether it was hashed; never rejects. A scan
 * still pending does not keep the process alive: the promise of one the process left behind
 * never settles. */
export function scanFileBackground(path: string | Buffer, stateDir: string): Promise<boolean> {
  return new Promise((resolve) => {
    try {
      native.scanFileBackground(path, stateDir, resolve);
    } catch {
      resolve(false); // a guess not made; the conversation hashes the file
    }
  });
}

/** Scan in windows of `window` bytes, handing out each window's manifest entries while the
 * rest is still being hashed (overlapped phases, docs/protocol.md §4.15). */
export function openScanStream(path: string | Buffer, window: number, opts: ScanOptions = {}, early?: Binding.EarlyData): Promise<Binding.NativeScanStream> {
  return call(() => native.NativeScanStream.open(path, window, { stateDir: opts.stateDir, ignoreIndex: opts.ignoreIndex }, progressCallback(opts.onProgress), early));
}

/** The wire and error constants the shell mirrors, from their one definition in the core. */
export function nativeConstants(): Binding.NativeConstants {
  return native.nativeConstants();
}

/** A partial of an earlier attempt at `target` exists (a resume would use it). One readdir.
 * With `beneath`, `target` is a relative path under that directory (resolved without
 * following links, crates/ffsync_core/src/beneath.rs), as for every call below that takes it. */
export function hasPartial(target: string | Buffer, beneath?: string): Promise<boolean> {
  return call(native.hasPartial(target, beneath));
}

/** rsync's --partial-dir (crates/ffsync_core/src/restore/partial_dir.rs): with `restore`, `target`'s
 * partials waiting in `dir` move back beside it, where a resume looks; otherwise its kept
 * partials move from beside it into `dir`. Resolves to how many moved. */
export function movePartials(target: string | Buffer, beneath: string | undefined, dir: string, restore: boolean): Promise<number> {
  return call(native.movePartials(target, beneath, dir, restore));
}

/** `rel` under `root` is a real directory (created with `create`); a link on the way is an error. */
export function ensureDirBeneath(root: string, rel: string | Buffer, create: boolean): Promise<void> {
  return call(native.ensureDirBeneath(root, rel, create));
}

/** Early placement of a streamed manifest's chunks (crates/ffsync_core/src/restore/prefill.rs). */
export function beginPrefill(target: string | Buffer, size: number, locals: { path: string | Buffer; manifest: Buffer }[], beneath?: string, fsync?: boolean): Promise<Binding.NativePrefill> {
  return call(native.NativePrefill.begin(target, size, locals, beneath, fsync));
}

export function decodeManifest(buf: Buffer): Promise<Binding.ManifestInfo> {
  return call(() => native.decodeManifest(buf));
}

/** With `scanned` (the source's stat when it was scanned), the file opened must still be that
 * version, checked on the open file: else the promise rejects with code ECHANGED. */
export function openChunkSource(path: string | Buffer, manifest: Buffer, compressLevel: number, batchStream?: boolean, scanned?: Binding.ScannedIdentity): Promise<Binding.NativeChunkSource> {
  return call(native.NativeChunkSource.open(path, manifest, compressLevel, batchStream, scanned));
}

export function beginReconstruction(
  target: string | Buffer,
  manifest: Buffer,
  locals: { path: string | Buffer; manifest: Buffer }[],
  onProgress?: (bytesDone: number) => void,
  /** The sender's hole list (HOLES payload), if it sent one. */
  holes?: Buffer,
  /** Write changed ranges into the target itself through a redo journal (`--inplace`). */
  inplace?: boolean,
  /** Chunks placed while the manifest streamed in (adopted if they match it). */
  prefill?: Binding.NativePrefill,
  beneath?: string,
  /** Make the result durable before renaming it into place (default true; false: `--no-fsync`). */
  fsync?: boolean,
  /** rsync's -b: the replaced file is moved to its backup name first. */
  backup?: Binding.BackupOptions,
  /** A local sync: the sender's own file, whose chunks are copied (and proven) before any is asked for. */
  peerCopy?: Binding.PeerCopyFile,
): Promise<Binding.NativeReconstruction> {
  return call(native.NativeReconstruction.begin(target, manifest, locals, progressCallback(onProgress), holes, inplace, prefill, beneath, fsync, backup, peerCopy));
}

/** Complete an interrupted `--inplace` commit of `target`, if any (message when one was). */
export function recoverInplace(target: string | Buffer, beneath?: string): Promise<string | null> {
  return call(native.recoverInplace(target, beneath));
}

/** The holes of a file (SEEK_HOLE / SEEK_DATA) as a HOLES payload. */
export function fileHoles(path: string | Buffer): Promise<Buffer> {
  return call(native.fileHoles(path));
}

export function markUpToDate(target: string | Buffer, manifest: Buffer, mtimeNs: bigint | undefined, mode: number | undefined, stateDir?: string, beneath?: string): Promise<void> {
  let task: Promise<void>;
  try {
    task = native.markUpToDate(target, manifest, mtimeNs, mode, stateDir, beneath);
  } catch (e) {
    return Promise.reject(normalizeNativeError(e)); // a time outside the i64 range
  }
  return call(task);
}

/** Walk a directory tree on every core (entries counted through `onProgress`). The same walk
 * started before the program loaded (ts/cli/early-walks.ts) is taken instead, if there is one. */
export async function walkTree(root: string, options: Binding.WalkTreeOptions, onProgress?: (entries: number) => void): Promise<Binding.NativeTreeSync> {
  const tree = await call(takeEarlyWalk(root, options, onProgress) ?? native.NativeTreeSync.walk(root, options, progressCallback(onProgress)));
  // The ticker's last value may reach us after the walk resolved: report the total here.
  onProgress?.(tree.entryCount());
  return tree;
}

/** Throws a usage error when --chown names a user or group unknown here. */
export function validateChown(spec: string): void {
  try {
    native.validateChown(spec);
  } catch (e) {
    throw normalizeNativeError(e);
  }
}

/** rsync's added filter rule for a relative --partial-dir (`DIR/`), or null for an absolute
 * one; a usage error for a --partial-dir this version cannot use. */
export function partialDirRule(dir: string): string | null {
  try {
    return native.partialDirRule(dir);
  } catch (e) {
    throw normalizeNativeError(e);
  }
}

/** Throws a usage error naming the first invalid exclude pattern. */
export function validateExcludes(patterns: string[]): void {
  try {
    native.validateExcludes(patterns);
  } catch (e) {
    throw normalizeNativeError(e);
  }
}

/** Patterns of an --exclude-from file (blank lines and # comments skipped). */
export function excludesFromText(text: string): string[] {
  return native.excludesFromText(text);
}

function progressCallback(fn?: (n: number) => void): ((n: number) => void) | undefined {
  // napi passes (err, value) for callee-handled functions; ours is not callee-handled.
  return fn ? (n: number) => fn(n) : undefined;
}

/** Manifest from the index if the file is unchanged since it was indexed; never scans. */
export function loadIndex(path: string, stateDir: string): Promise<Binding.ScanResult | null> {
  return call(native.loadIndex(path, stateDir));
}

/** A fresh self-signed identity (rcgen, ECDSA P-256). Fast; runs on the JS thread. */
export function generateIdentity(label: string): { certPem: string; keyPem: string } {
  try {
    return native.generateIdentity(label);
  } catch (e) {
    throw normalizeNativeError(e);
  }
}

/** The kernel's smoothed round trip of the connected TCP socket `fd`, in microseconds; null where
 * the platform does not say. One getsockopt, on the JS thread. */
export function tcpRttMicros(fd: number): number | null {
  return native.tcpRttMicros(fd);
}

/** rsync's --chmod applied to one mode; a one-line usage error (exit 1) for a bad rule. */
export function applyChmod(rules: string, mode: number, isDir: boolean): number {
  try {
    return native.applyChmod(rules, mode, isDir);
  } catch (e) {
    throw normalizeNativeError(e);
  }
}

/** A fresh one-time pairing code, e.g. `7-amber-orbit` (ffsync_core::pairing). */
export function pairingCode(): string {
  try {
    return native.pairingCode();
  } catch (e) {
    throw normalizeNativeError(e);
  }
}

/** The canonical form of a typed pairing code; a one-line usage error (exit 1) naming what is wrong. */
export function normalizePairingCode(code: string): string {
  try {
    return native.normalizePairingCode(code);
  } catch (e) {
    throw normalizeNativeError(e);
  }
}

/** One side of the PAKE exchange (see ts/security/pairing.ts); throws FfsyncErrors. */
export function startPairing(role: 'sender' | 'receiver', code: string, exporter: Buffer, senderFingerprint: Buffer, receiverFingerprint: Buffer): Binding.NativePairing {
  try {
    return new native.NativePairing(role, code, exporter, senderFingerprint, receiverFingerprint);
  } catch (e) {
    throw normalizeNativeError(e);
  }
}
export type NativePairing = Binding.NativePairing;

/** Listen for QUIC on an IP address (errors stay native: ts/transport/quic.ts words them). */
export function quicListenNative(ip: string, port: number, certPem: string, keyPem: string, idleMs: number): Promise<Binding.NativeQuicListener> {
  return native.quicListen(ip, port, certPem, keyPem, idleMs);
}

/** Connect over QUIC to an IP address; the handshake must finish within `timeoutMs`. */
export function quicConnectNative(ip: string, port: number, certPem: string, keyPem: string, timeoutMs: number, idleMs: number): Promise<Binding.NativeQuicConnection> {
  return native.quicConnect(ip, port, certPem, keyPem, timeoutMs, idleMs);
}
