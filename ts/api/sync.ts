// `ffsync-native sync SRC DEST`: the rsync-style front door. SRC and DEST are local paths
// or [user@]host:path. Local to local runs both peers in this process over an in-memory
// pipe; push and pull start the remote peer with the system's ssh (so ~/.ssh/config, the
// agent and ControlMaster apply) and speak the same protocol over its stdin/stdout — the
// ssh channel is the security boundary, no TLS inside it. With --quic, ssh is only the
// front door: the peers trade certificate fingerprints over it, then move the data over
// one QUIC connection (see quicOverSsh).

/* eslint-disable @typescript-eslint/no-require-imports -- lazy loads, see below */
import type { ChildProcess } from 'node:child_process';
import type { BigIntStats } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import { FramedConnection } from '../transport/connection.js';
import { joinStreams, pipePair } from '../transport/stream-pair.js';
import { localLanes } from './lanes.js';
import { ExitCode, FfsyncError, fromSystemError } from '../utils/errors.js';
import { decodeQuicOffer, decodeQuicReady, encodeQuicOffer, encodeQuicReady, Role } from '../protocol/messages.js';
import { FrameType } from '../protocol/frames.js';
import { abortable, expect, handshake, reportError } from './session.js';
import type { QuicListener, QuicSession } from '../transport/quic.js';
import { netModule } from '../transport/net-module.js';
import { baseName, isOneComponent, type Location, namesContents, parseLocation, treeTarget } from '../utils/location.js';
import { resolveStateDir } from '../utils/state-dir.js';
import { runReceiver, checkTarget, type ReceiverContext, waitingScanOf } from './receive.js';
import { indexedFile, runSender, scanAheadOf, statSource, type SendOptions } from './send.js';
import type { SyncEvents, SyncSummary } from './events.js';
import { startWalk, type TreeSendOptions } from './tree-send.js';
import { startPrewalk } from './tree-receive.js';
import type { Listing } from './tree-common.js';
import { type BackupOptions, type DirMergeSpec, partialDirRule, validateChown } from '../native/binding.js';
import { type ServerArgs, serverArgs } from './server-args.js';

// What only push, pull or --quic use is loaded when they run (start-up of a local sync,
// bench/startup.ts): ssh's child_process, QUIC, and the identity (TLS certificates).
const quic = () => require('../transport/quic.js') as typeof import('../transport/quic.js');
const overQuic: typeof import('./over-quic.js').overQuic = (...a) => (require('./over-quic.js') as typeof import('./over-quic.js')).overQuic(...a);
const loadOrCreateIdentity: typeof import('../security/identity.js').loadOrCreateIdentity = (...a) =>
  (require('../security/identity.js') as typeof import('../security/identity.js')).loadOrCreateIdentity(...a);

export { type Location, parseLocation };

export interface SyncOptions {
  src: string;
  dest: string;
  /** Directories need -r (or -a), as in rsync. */
  recursive?: boolean;
  /** Delete receiver-only files (rsync's --delete; off by default here, as in rsync). */
  delete?: boolean;
  /** The sender's rules (our pattern syntax; `!` re-includes). */
  excludes?: string[];
  /** The receiver's, when they differ (rsync's H/S/P/R rules): what FILTER carries. */
  wireExcludes?: string[];
  /** Per-directory merge files the sender reads (rsync's -F, -C, `: NAME`). */
  dirMerge?: DirMergeSpec[];
  /** rsync's --files-from: only these paths (lines, relative to SRC), placed as with `SRC/`;
   * `filesFromRecursive` (an explicit -r) also sends what is below a listed directory. */
  filesFrom?: string[];
  filesFromRecursive?: boolean;
  dryRun?: boolean;
  checksum?: boolean;
  compressLevel?: number;
  bwlimitKiBps?: number;
  verbose?: boolean;
  /** rsync's -i: list changes as itemized lines (`>f.st...... name`). */
  itemize?: boolean;
  /** rsync without -l / -t / -p (each is part of -a): symlinks left out with a notice,
   * times not kept, permissions kept only on new entries (minus the umask). */
  omit?: { links?: boolean; times?: boolean; perms?: boolean };
  /** rsync's --size-only (a matching size means the same file), --ignore-existing (leave
   * what DEST has), --existing (create nothing new). */
  choices?: { sizeOnly?: boolean; ignoreExisting?: boolean; existingOnly?: boolean };
  /** rsync's --log-file: receives each itemized change of a tree (`>f+++++++++ name`). */
  logLine?: (text: string) => void;
  /** rsync's -m/--prune-empty-dirs. */
  pruneEmptyDirs?: boolean;
  /** rsync's -L/--copy-links: the sending side sends what symlinks point to. */
  copyLinks?: boolean;
  /** rsync's --chmod (comma-separated rules, e.g. `Du=rwx,Dgo=rx,Fu=rw,Fgo=r`). */
  chmod?: string;
  /** rsync's --delete-excluded: excluded paths are deleted on DEST too (set `delete` with it). */
  deleteExcluded?: boolean;
  /** rsync's --remove-source-files: once every file is synced, the sending side removes the
   * files and symlinks DEST now holds (directories stay). */
  removeSourceFiles?: boolean;
  /** rsync's -b/--backup, --suffix, --backup-dir (which implies -b): the receiving side
   * moves what a file replaces, or a deletion removes, to its backup name first. */
  backup?: boolean;
  suffix?: string;
  backupDir?: string;
  /** rsync's --partial-dir: a partial kept for a resume waits in this directory on the
   * receiving side (one name: beside each file, and excluded from the transfer and from
   * deletions as rsync's added rule does; absolute: one directory for all). */
  partialDir?: string;
  /** rsync's --chown USER:GROUP (trees): the receiving side gives every entry this owner
   * and/or group; set `attrs` OWNER / GROUP with it (rsync's --chown implies -o / -g). */
  chown?: string;
  /** rsync's --max-delete: the receiving side deletes at most this many paths (with
   * `delete`); the rest stay and the sync exits 25. */
  maxDelete?: number;
  /** rsync's --mkpath: create DEST's missing path components. */
  mkpath?: boolean;
  /** rsync's -4 / -6 (passed to ssh) and --contimeout (ssh's ConnectTimeout, in seconds). */
  ipFamily?: 4 | 6;
  contimeoutS?: number;
  /** rsync's -u, -W (true) and --no-whole-file (false), -x. Unset: a local tree sync sends
   * changed files up to 1 MiB whole and larger ones as deltas (decisions §107); a sync over
   * ssh sends deltas. */
  update?: boolean;
  wholeFile?: boolean;
  oneFileSystem?: boolean;
  /** ssh command (`-e`), split on whitespace; default `ssh`. */
  rsh?: string;
  /** The program to run on the remote side; default `ffsync-native`. */
  remoteCmd?: string;
  stateDir?: string;
  timeoutMs?: number;
  events?: SyncEvents;
  signal?: AbortSignal;
  /** ssh as the front door, QUIC as the data path (push and pull only). */
  quic?: boolean;
  /** Trees: large-file lanes (QUIC streams); default 16 with --quic, else 1. */
  jobs?: number;
  /** rsync's --inplace: the receiving side updates files in place (redo journal). */
  inplace?: boolean;
  /** `--no-fsync` when false: the receiving side (local or remote) renames verified files
   * into place without making them durable first (rsync's default). */
  fsync?: boolean;
  /** rsync's --max-size / --min-size, in bytes. */
  maxSize?: number;
  minSize?: number;
  /** -o / -g / -X / --numeric-ids as AttrFlag bits (trees). */
  attrs?: number;
}

/** The receiving side's backup options (rsync's -b, --suffix, --backup-dir), if any. */
export function backupOf(o: { backup?: boolean; suffix?: string; backupDir?: string; inplace?: boolean }): BackupOptions | undefined {
  if (!o.backup && o.backupDir === undefined) return undefined;
  if (o.inplace) throw new FfsyncError('EUSAGE', ExitCode.USAGE, '-b/--backup cannot be combined with --inplace in this version');
  if (o.backupDir === undefined && o.suffix === '') throw new FfsyncError('EUSAGE', ExitCode.USAGE, '--suffix cannot be empty without --backup-dir');
  return { dir: o.backupDir, suffix: o.suffix };
}

/** What the receiving side must never delete because of -b, as rsync protects it (with
 * --delete): older backups beside their files (`*~`), and a backup directory inside DEST. */
export function backupProtect(b: BackupOptions | undefined): string[] {
  if (!b) return [];
  const inside = b.dir !== undefined && !path.isAbsolute(b.dir) && !b.dir.split(/[/\\]/).includes('..');
  return [...(b.dir === undefined ? [`*${b.suffix ?? '~'}`] : []), ...(inside ? [`/${b.dir!.replace(/^\.\/+|\/+$/g, '')}/`] : [])];
}

function limitsOf(o: { maxSize?: number; minSize?: number }): { maxSize?: number; minSize?: number } {
  return { maxSize: o.maxSize, minSize: o.minSize };
}

/** What the receiving side applies of rsync's options: --max-delete, --chown, -b and the
 * protect rules -b implies. Computed (and -b checked) once, before anything is written. */
function receivingOptions(o: { maxDelete?: number; chown?: string; backup?: boolean; suffix?: string; backupDir?: string; inplace?: boolean; partialDir?: string }): {
  backup?: BackupOptions;
  partialDir?: string;
  tree: { maxDelete?: number; chown?: string; protect: string[] };
} {
  const backup = backupOf(o);
  // rsync's own refusal, word for word: --inplace writes into the target, where no partial is kept.
  if (o.inplace && o.partialDir !== undefined) throw new FfsyncError('EUSAGE', ExitCode.USAGE, '--inplace cannot be used with --partial-dir');
  if (o.partialDir !== undefined) partialDirRule(o.partialDir);
  return { backup, partialDir: o.partialDir, tree: { maxDelete: o.maxDelete, chown: o.chown, protect: backupProtect(backup) } };
}

/** rsync adds `-p DIR/` after the user's rules for a relative --partial-dir: the partial
 * directories are neither sent nor deleted (both rule lists). */
function withPartialDirRule<T extends { partialDir?: string; excludes?: string[]; wireExcludes?: string[] }>(o: T): T {
  const rule = o.partialDir === undefined ? null : partialDirRule(o.partialDir);
  if (!rule) return o;
  return { ...o, excludes: [...(o.excludes ?? []), rule], wireExcludes: o.wireExcludes && [...o.wireExcludes, rule] };
}

/** Where a transfer lands, by rsync's rules: a tree written `src/` fills DEST, `src` goes
 * to DEST/src; a file goes into DEST when DEST is a directory or written `dest/`. */
export async function syncTarget(dest: string, destSlash: boolean, srcName: string, kind: 'file' | 'tree', srcSlash: boolean, dryRun = false, mkpath = false): Promise<string> {
  // The name becomes the target's last component: one component, and a tree named `.` or `..` is
  // its contents (ts/utils/location.ts reads such a SRC so; a server's arguments come from a peer,
  // whose version may not, and `..` as a name would place the tree in DEST's parent).
  if (!isOneComponent(srcName)) {
    throw new FfsyncError('EUSAGE', ExitCode.USAGE, `the source's name ${JSON.stringify(srcName)} is not one path component`);
  }
  if (namesContents(srcName)) {
    if (kind === 'file') throw new FfsyncError('EUSAGE', ExitCode.USAGE, `a file cannot be named ${JSON.stringify(srcName)}`);
    srcSlash = true; // treeTarget and --mkpath: DEST itself
  }
  // rsync's --mkpath: the missing components of DEST's path are created first (DEST itself
  // too when it names a directory: written `dest/`, or receiving a tree's contents).
  if (mkpath && !dryRun) {
    const dir = destSlash || (kind === 'tree' && srcSlash) ? dest : path.dirname(path.resolve(dest));
    await fs.mkdir(dir, { recursive: true }).catch((e: NodeJS.ErrnoException) => {
      throw new FfsyncError(e.code ?? 'EIO', ExitCode.FILE_IO, `--mkpath: cannot create ${dir}: ${e.message}`);
    });
  }
  const destDir = await fs.stat(dest).then((s) => s.isDirectory(), () => false);
  let target: string;
  if (kind === 'tree') target = treeTarget(dest, srcName, srcSlash);
  else target = destSlash || destDir ? path.join(dest, srcName) : dest;
  // rsync creates DEST itself (not its parents) when the source goes inside it.
  if (target !== dest && !destDir && !dryRun) {
    await fs.mkdir(dest).catch((e: NodeJS.ErrnoException) => {
      if (e.code === 'ENOENT') throw new FfsyncError('ENOENT', ExitCode.FILE_SELECTION, `destination's parent ${path.dirname(path.resolve(dest))} does not exist`);
      if (e.code !== 'EEXIST') throw new FfsyncError(e.code ?? 'EIO', ExitCode.FILE_IO, `cannot create ${dest}: ${e.message}`);
    });
  }
  if (dryRun && !destDir && target !== dest) return path.resolve(target); // nothing is created in a dry run
  const parent = await fs.stat(path.dirname(path.resolve(target))).catch(() => undefined);
  if (!parent?.isDirectory()) throw new FfsyncError('ENOENT', ExitCode.FILE_SELECTION, `destination's parent ${path.dirname(path.resolve(target))} does not exist`);
  if (kind === 'file') await checkTarget(path.resolve(target));
  else await checkTreeTarget(path.resolve(target));
  return path.resolve(target);
}

/** A receiver's early walk (the prewalk) has no exclude rules: it is the walk the session
 * makes only when the sender sends none either, reads no merge files and does not stop at
 * filesystem boundaries (-x). */
function prewalkFits(r: { excludes?: string[]; wire?: string[]; dirMerge?: unknown[]; oneFileSystem?: boolean }): boolean {
  return !r.excludes?.length && !r.wire?.length && !r.dirMerge?.length && !r.oneFileSystem;
}

function exists(p: string): Promise<boolean> {
  return fs.lstat(p).then(
    () => true,
    () => false,
  );
}

async function checkTreeTarget(target: string): Promise<void> {
  const st = await fs.lstat(target).catch(() => undefined);
  if (st && !st.isDirectory()) throw new FfsyncError('ENOTDIR', ExitCode.FILE_IO, `${target} exists and is not a directory`);
  if (!st) {
    const parent = await fs.stat(path.dirname(target)).catch(() => undefined);
    if (!parent?.isDirectory()) throw new FfsyncError('ENOENT', ExitCode.FILE_SELECTION, `destination's parent ${path.dirname(target)} does not exist`);
  }
}

function dryRunFile(): FfsyncError {
  return new FfsyncError('EUSAGE', ExitCode.USAGE, '-n/--dry-run applies to directory trees in this version, not to a single file');
}

/** Options this version applies to trees only: a single file is refused in one line. */
function treeOnly(o: SyncOptions): FfsyncError | undefined {
  if (o.dryRun) return dryRunFile();
  const c = o.choices ?? {};
  const named = [c.sizeOnly && '--size-only', c.ignoreExisting && '--ignore-existing', c.existingOnly && '--existing', o.chown !== undefined && '--chown'].filter(Boolean);
  return named.length ? new FfsyncError('EUSAGE', ExitCode.USAGE, `${named.join(', ')} ${named.length > 1 ? 'apply' : 'applies'} to directory trees in this version, not to a single file`) : undefined;
}

function engineOptions(
  o: SyncOptions,
): Pick<SendOptions, 'checksum' | 'compressLevel' | 'bwlimitKiBps' | 'stateDir' | 'timeoutMs' | 'events' | 'signal' | 'update' | 'wholeFile' | 'chmod' | 'removeSourceFiles'> & { tree: TreeSendOptions } {
  return {
    checksum: o.checksum,
    removeSourceFiles: o.removeSourceFiles,
    chmod: o.chmod,
    update: o.update,
    wholeFile: o.wholeFile,
    compressLevel: o.compressLevel,
    bwlimitKiBps: o.bwlimitKiBps,
    stateDir: o.stateDir,
    timeoutMs: o.timeoutMs ?? 60_000,
    events: o.events,
    signal: o.signal,
    tree: { excludes: o.excludes ?? [], wireExcludes: o.wireExcludes, dirMerge: o.dirMerge, filesFrom: o.filesFrom, filesFromRecursive: o.filesFromRecursive, deleteExcluded: o.deleteExcluded, pruneEmptyDirs: o.pruneEmptyDirs, copyLinks: o.copyLinks, noDelete: !o.delete, dryRun: o.dryRun, verbose: o.verbose, oneFileSystem: o.oneFileSystem, parallel: o.jobs, maxSize: o.maxSize, minSize: o.minSize, attrs: o.attrs, omit: o.omit, choices: o.choices },
  };
}

/** How this side lists the tree's changes (-v, -i), as rsync names them: under `src/` when
 * the source had no trailing slash. `push`: files go to a remote receiver (`<`); else they
 * land here (`>`). `destExisted`: undefined where this side cannot know (a remote DEST). */
function listingOf(o: SyncOptions, src: Location, dest: Location, push: boolean, destExisted?: boolean, rootExisted?: boolean): Listing | undefined {
  if (!o.verbose && !o.itemize && !o.logLine) return undefined;
  return {
    show: Boolean(o.verbose || o.itemize),
    log: o.logLine ? { line: o.logLine, direction: push ? 'sent' : 'received' } : undefined,
    itemize: o.itemize ? (push ? 'sent' : 'received') : undefined,
    prefix: src.slash ? undefined : `${baseName(src.path)}/`,
    rootCreated: rootExisted === false,
    createdDir: destExisted === false ? dest.path.replace(/[/\\]+$/, '') : undefined,
    maxDelete: o.maxDelete,
  };
}

/** Large-file lanes of a local tree sync unless --jobs says otherwise. */
export const LOCAL_LANES = 4;

/** What every direction of a sync starts from: both locations parsed, the options checked and
 * completed, the receiving side's settings and the engine's options derived from them. */
interface SyncContext {
  o: SyncOptions;
  src: Location;
  dest: Location;
  receiverSide: ReturnType<typeof receivingOptions>;
  stateDir: string;
  eng: ReturnType<typeof engineOptions>;
  t0: number;
}

export async function sync(options: SyncOptions): Promise<SyncSummary> {
  const c = syncContext(options);
  const { o, src, dest } = c;
  if (src.host) return pull(c);
  const st = await statSource(src.path);
  if (st.isDirectory() && !o.recursive) throw new FfsyncError('EISDIR', ExitCode.FILE_SELECTION, `${src.path} is a directory: use -r or -a`);
  if (o.filesFrom && !st.isDirectory()) throw new FfsyncError('EUSAGE', ExitCode.USAGE, `--files-from needs SRC to be a directory (${src.path} is a file)`);
  const srcName = baseName(src.path);
  const kind = st.isDirectory() ? 'tree' : 'file';
  if (kind === 'file' && treeOnly(o)) throw treeOnly(o);
  return dest.host ? push(c, st, srcName) : syncLocally(c, st, srcName, kind);
}

function syncContext(options: SyncOptions): SyncContext {
  let o = options;
  const src = parseLocation(o.src);
  if (o.filesFrom) {
    // rsync: the listed paths are relative to SRC and land under DEST as listed (SRC's own
    // name is not added), whatever slash SRC was written with.
    src.slash = true;
    if (o.delete) throw new FfsyncError('EUSAGE', ExitCode.USAGE, '--delete with --files-from is not supported in this version');
    o = { ...o, recursive: true };
  }
  const dest = parseLocation(o.dest);
  if (src.host && dest.host) throw new FfsyncError('EUSAGE', ExitCode.USAGE, 'SRC and DEST are both remote; one side must be local');
  // Names are resolved where the files land: checked here before anything moves when that is here.
  if (o.chown !== undefined && !dest.host) validateChown(o.chown);
  const receiverSide = receivingOptions(o);
  o = withPartialDirRule(o);
  const stateDir = resolveStateDir(o.stateDir);
  const eng = engineOptions(o);
  const t0 = Date.now();
  if (o.jobs && (src.host || dest.host) && !o.quic) {
    throw new FfsyncError('EUSAGE', ExitCode.USAGE, '--jobs over ssh needs --quic: one ssh channel carries one conversation at a time');
  }
  return { o, src, dest, receiverSide, stateDir, eng, t0 };
}

/** Local to local: both peers in this process, over a pipe. */
async function syncLocally(c: SyncContext, st: BigIntStats, srcName: string, kind: 'file' | 'tree'): Promise<SyncSummary> {
  const { o, src, dest, receiverSide, stateDir, eng, t0 } = c;
  if (o.quic) throw new FfsyncError('EUSAGE', ExitCode.USAGE, '--quic needs a remote side ([user@]host:path); a local sync uses no network');
  // Local to local: both peers here, over a pipe.
  const destExisted = await exists(dest.path);
  const rootExisted = src.slash ? destExisted : destExisted && (await exists(path.join(dest.path, srcName)));
  const target = await syncTarget(dest.path, dest.slash, srcName, kind, src.slash, o.dryRun, o.mkpath);
  if (path.resolve(src.path) === target) throw new FfsyncError('EUSAGE', ExitCode.USAGE, `SRC and DEST are the same path (${target})`);
  const [a, b] = pipePair();
  const recvConn = new FramedConnection(b, eng.timeoutMs!);
  const sendConn = new FramedConnection(a, eng.timeoutMs!);
  const lanes = localLanes();
  // rsync copies whole between local paths (its -W is the default there): with no link to
  // save, a delta of a mid-size file costs more than it spares (its conversation, hashing the
  // old version). Changed files up to 1 MiB go whole in batches, as new ones do; larger ones
  // keep their deltas, whose local copies of unchanged chunks cost no more than a whole copy
  // (decisions §107). -W sends every file whole, --no-whole-file every one as a delta; and
  // --inplace keeps its deltas, which update a file inside the target (its inode, its hard
  // links) where a whole copy replaces it.
  const wholeSmall = o.wholeFile === undefined && !o.inplace;
  // The receiver takes each file's chunks from the sender's own file on the disk (in-kernel
  // copies, each chunk proven by its hash) before asking for any over the pipe: between two
  // local paths the pipe only copies bytes the kernel can copy itself (decisions §111). Not
  // with --bwlimit, whose point locally is to pace the transfer's reads and writes.
  const sending = { ...eng, compressLevel: 0, compressManifest: false, overlap: false, tree: { ...eng.tree, choices: { ...eng.tree.choices, wholeSmall }, parallel: o.jobs ?? LOCAL_LANES, listing: listingOf(o, src, dest, false, destExisted, rootExisted) }, path: src.path, host: 'local', port: 0, stateDir, st, t0, dialLane: lanes.dial };
  const receiverOptions = { localSender: o.bwlimitKiBps ? undefined : path.resolve(src.path), path: target, port: 0, target, stateDir, checksum: o.checksum, timeoutMs: eng.timeoutMs, signal: o.signal, tree: { noDelete: !o.delete, ...receiverSide.tree }, backup: receiverSide.backup, partialDir: receiverSide.partialDir, listener: lanes.listener, sizeLimits: limitsOf(o), refine: false, compressManifest: false, inplace: o.inplace, fsync: o.fsync };
  // Both trees are walked from the start, neither waiting on the handshake or the other
  // side's frames. The receiver's early walk has no exclude rules, so it is started only
  // when the sender has none either (and no -x): then it is the walk the session makes.
  const walking = kind === 'tree' ? startWalk(path.resolve(src.path), sending, stateDir) : undefined;
  walking?.catch(() => undefined);
  const targetIsDir = kind === 'tree' && (await fs.stat(target).then((s) => s.isDirectory(), () => false));
  const prewalk = targetIsDir && prewalkFits({ excludes: o.excludes, wire: o.wireExcludes, dirMerge: o.dirMerge, oneFileSystem: o.oneFileSystem }) ? startPrewalk(target, receiverOptions, stateDir) : undefined;
  const receiving = runReceiver(recvConn, { ...receiverOptions, prewalk });
  receiving.catch(() => undefined);
  try {
    // Nothing crosses a wire: compressing would only burn CPU.
    // No overlapped phases: both peers share this process's cores, where hashing on one
    // side and writing on the other only compete (bench/RESULTS.md, "Overlapped phases").
    return await runSender(sendConn, { ...sending, walking });
  } finally {
    await receiving.catch(() => undefined);
  }
}

/** Push: the remote side receives. */
function push(c: SyncContext, st: BigIntStats, srcName: string): Promise<SyncSummary> {
  const { o, src, dest, receiverSide, stateDir, eng, t0 } = c;
  const remote = startRemote(
    o,
    dest.host!,
    serverArgs({
      role: 'receiver',
      path: dest.path,
      name: srcName,
      srcSlash: src.slash,
      destSlash: dest.slash,
      mkpath: o.mkpath,
      checksum: o.checksum,
      dryRun: o.dryRun,
      quic: o.quic,
      inplace: o.inplace,
      fsync: o.fsync,
      maxDelete: o.maxDelete,
      chown: o.chown,
      backup: receiverSide.backup !== undefined,
      suffix: receiverSide.backup?.suffix,
      backupDir: receiverSide.backup?.dir,
      partialDir: receiverSide.partialDir,
      maxSize: o.maxSize,
      minSize: o.minSize,
    }),
  );
  const sending = { ...eng, tree: { ...eng.tree, listing: listingOf(o, src, dest, true) }, path: src.path, host: dest.host!, port: 0, stateDir, st, t0 };
  // A tree is walked, and its files (or the file) hashed ahead (decisions §95), while ssh
  // connects and the remote side starts: several round trips and a process start.
  const walking = st.isDirectory() ? startWalk(path.resolve(src.path), sending, stateDir) : undefined;
  walking?.catch(() => undefined);
  const fileIndex = indexedFile(sending, st, stateDir);
  const scanAhead = scanAheadOf(sending, st, walking, stateDir, fileIndex);
  const pushed = o.quic
    ? remote.run((conn) =>
        quicOverSsh(conn, dest.host!, o, stateDir, (session, peer) =>
          overQuic(session, 'open', eng.timeoutMs!, (qconn, stream) => runSender(qconn, { ...sending, walking, scanAhead, fileIndex, quic: true, secure: stream, expectFingerprint: peer, dialLane: () => session.openStream() })),
        ),
      )
    : remote.run((conn) => runSender(conn, { ...sending, walking, scanAhead, fileIndex }));
  return pushed.finally(() => scanAhead?.stop());
}

/** Pull: the remote side sends; we receive by rsync's placement rules. */
async function pull(c: SyncContext): Promise<SyncSummary> {
  const { o, src, dest, receiverSide, stateDir, eng } = c;
  const senderArgs = remoteSenderArgs(o, src.path);
  const destExisted = await exists(dest.path);
  const remote = startRemote(o, src.host!, senderArgs);
  const srcName = baseName(src.path);
  const receiving = {
    path: dest.path,
    port: 0,
    target: path.resolve(dest.path),
    stateDir,
    checksum: o.checksum,
    timeoutMs: eng.timeoutMs,
    signal: o.signal,
    events: o.events,
    tree: { noDelete: !o.delete, ...receiverSide.tree, listing: listingOf(o, src, dest, false, destExisted) },
    backup: receiverSide.backup,
    partialDir: receiverSide.partialDir,
    sizeLimits: limitsOf(o),
    inplace: o.inplace,
    fsync: o.fsync,
    resolveTarget: (kind: 'file' | 'tree') => {
      if (kind === 'tree' && !o.recursive) throw new FfsyncError('EISDIR', ExitCode.FILE_SELECTION, `${o.src} is a directory: use -r or -a`);
      if (kind === 'file' && treeOnly(o)) throw treeOnly(o);
      return syncTarget(dest.path, dest.slash, srcName, kind, src.slash, o.dryRun, o.mkpath);
    },
  };
  if (o.quic) {
    return remote.run((conn) =>
      quicOverSsh(conn, src.host!, o, stateDir, (session, peer) =>
        overQuic(session, 'open', eng.timeoutMs!, (qconn, stream) => runReceiver(qconn, { ...receiving, secure: stream, expectFingerprint: peer, listener: session.lanes() })),
      ),
    );
  }
  return remote.run((conn) => runReceiver(conn, receiving));
}

/** The remote sender's arguments: what it sends, and how. */
function remoteSenderArgs(o: SyncOptions, srcPath: string): string[] {
  return serverArgs({
    role: 'sender',
    path: srcPath,
    checksum: o.checksum,
    dryRun: o.dryRun,
    update: o.update,
    wholeFile: o.wholeFile,
    oneFileSystem: o.oneFileSystem,
    compressLevel: o.compressLevel,
    bwlimitKiBps: o.bwlimitKiBps || undefined,
    excludes: o.excludes,
    filesFrom: o.filesFrom,
    filesFromRecursive: o.filesFrom ? o.filesFromRecursive : undefined,
    rules: o.wireExcludes || o.dirMerge ? { wire: o.wireExcludes, dirMerge: o.dirMerge } : undefined,
    deleteExcluded: o.deleteExcluded,
    chmod: o.chmod,
    pruneEmptyDirs: o.pruneEmptyDirs,
    removeSourceFiles: o.removeSourceFiles,
    copyLinks: o.copyLinks,
    quic: o.quic,
    jobs: o.jobs || undefined,
    maxSize: o.maxSize,
    minSize: o.minSize,
    attrs: o.attrs || undefined,
    omit: o.omit,
    choices: o.choices,
  });
}

/**
 * `sync --quic`, local side: over the ssh channel (already authenticated both ways) send
 * our certificate fingerprint and learn the remote peer's UDP port and fingerprint, then
 * connect over QUIC. Neither side prompts or pins: each expects exactly the fingerprint
 * the other announced over ssh. KEEPALIVE frames keep the idle ssh channel alive.
 */
async function quicOverSsh(
  conn: FramedConnection,
  sshHost: string,
  o: SyncOptions,
  stateDir: string,
  body: (session: QuicSession, peerFingerprint: string) => Promise<SyncSummary>,
): Promise<SyncSummary> {
  const id = loadOrCreateIdentity(stateDir);
  const timeoutMs = o.timeoutMs ?? 60_000;
  try {
    await conn.send(FrameType.QUIC_OFFER, encodeQuicOffer(id.fingerprint));
    const ready = decodeQuicReady((await expect(conn, FrameType.QUIC_READY)).payload);
    const host = await quicAddress(sshHost, ready.address);
    const session = await quic().QuicSession.connect(host, ready.port, id, { timeoutMs: Math.min(timeoutMs, 10_000), idleMs: timeoutMs });
    return await conn.keepAlive(body(session, ready.fingerprint));
  } finally {
    await conn.close(1000);
  }
}

/** Where the remote peer's UDP port is: the ssh host name if it resolves here, else the
 * address the ssh connection reached on the remote side (an ~/.ssh/config alias). */
async function quicAddress(sshHost: string, sshServerAddress: string): Promise<string> {
  const host = sshHost.replace(/^.*@/, '').replace(/^\[(.*)\]$/, '$1');
  try {
    return await quic().resolveHost(host);
  } catch (e) {
    if (sshServerAddress && netModule().isIP(sshServerAddress)) return sshServerAddress;
    throw new FfsyncError('ENOTFOUND', ExitCode.SOCKET_IO, `--quic: ${(e as Error).message} (needed for the QUIC connection)`);
  }
}

/** The remote peer over ssh: `ssh HOST REMOTE_CMD server …` on stdin/stdout. */
function startRemote(o: SyncOptions, host: string, serverArgs: string[]): { run: (body: (conn: FramedConnection) => Promise<SyncSummary>) => Promise<SyncSummary> } {
  const rsh = (o.rsh ?? 'ssh').trim().split(/\s+/);
  // -4 / -6 and --contimeout reach the connection through ssh itself (rsync passes -4/-6 to
  // ssh too); another remote shell (-e) gets them only if it is ssh.
  if (path.basename(rsh[0]) === 'ssh') {
    rsh.splice(1, 0, ...(o.ipFamily ? [`-${o.ipFamily}`] : []), ...(o.contimeoutS ? ['-o', `ConnectTimeout=${o.contimeoutS}`] : []));
  }
  const remoteCmd = o.remoteCmd ?? 'ffsync-native';
  // The remote command line goes through the remote shell: quote every argument.
  const quote = (a: string) => `'${a.replace(/'/g, `'\\''`)}'`;
  const remoteLine = [remoteCmd, 'server', ...serverArgs.map(quote)].join(' ');
  return {
    async run(body) {
      let child: ChildProcess;
      try {
        const { spawn } = require('node:child_process') as typeof import('node:child_process');
        child = spawn(rsh[0], [...rsh.slice(1), host, remoteLine], { stdio: ['pipe', 'pipe', 'inherit'] });
      } catch (e) {
        throw new FfsyncError('ESSH', ExitCode.SSH, `cannot start ${rsh[0]}: ${(e as Error).message}`);
      }
      const exited = new Promise<{ code: number | null; error?: Error }>((resolve) => {
        child.once('exit', (code) => resolve({ code }));
        child.once('error', (error) => resolve({ code: null, error }));
      });
      const conn = new FramedConnection(joinStreams(child.stdout!, child.stdin!), o.timeoutMs ?? 60_000);
      try {
        return await body(conn);
      } catch (e) {
        // Did ssh or the remote command fail to start? Their own message is already on
        // our stderr (inherited); give the exit code rsync users expect.
        const ex = await Promise.race([exited, new Promise<undefined>((r) => setTimeout(r, 1500))]);
        if (ex?.error) throw new FfsyncError('ESSH', ExitCode.SSH, `cannot run ${rsh[0]}: ${ex.error.message}`);
        if (ex?.code === 255) throw new FfsyncError('ESSH', ExitCode.SSH, `ssh to ${host} failed (see ssh's message above)`);
        if (ex?.code === 127) {
          throw new FfsyncError('EREMOTECMD', ExitCode.REMOTE_COMMAND_MISSING, `'${remoteCmd}' was not found on ${host}'s PATH; install it there or name it with --remote-cmd`);
        }
        throw e;
      } finally {
        // The remote peer ends when its stdin closes; make sure ssh does not outlive us.
        child.stdin?.end();
        const done = await Promise.race([exited, new Promise<undefined>((r) => setTimeout(r, 3000))]);
        if (!done) child.kill('SIGTERM');
      }
    },
  };
}

/**
 * The remote end (`ffsync-native server`, started by `sync` through ssh): one session on
 * stdin/stdout. Human messages go to stderr, which ssh carries back.
 */
export async function serveStdio(o: ServerArgs & { timeoutMs?: number; events?: SyncEvents }): Promise<SyncSummary> {
  const stateDir = resolveStateDir(o.stateDir);
  const conn = new FramedConnection(joinStreams(process.stdin, process.stdout), o.timeoutMs ?? 60_000);
  if (o.quic) return serveQuic(conn, o, stateDir);
  return serveRole(conn, o, stateDir);
}

/** One role of the remote end, over `conn` (the ssh channel, or a QUIC stream). */
async function serveRole(conn: FramedConnection, o: Parameters<typeof serveStdio>[0], stateDir: string, extra: Partial<SendOptions & ReceiverContext> = {}): Promise<SyncSummary> {
  if (o.role === 'sender') {
    const st = await statSource(o.path).catch(async (e) => {
      // Tell the local side why, in the protocol (it is waiting for our HELLO and OFFER).
      const err = e instanceof FfsyncError ? e : fromSystemError(e, `cannot read ${o.path}`);
      await handshake(conn, Role.SENDER).catch(() => undefined);
      await reportError(conn, err);
      await conn.close(500);
      throw err;
    });
    return runSender(conn, {
      ...extra,
      quic: o.quic,
      path: o.path,
      host: 'ssh',
      port: 0,
      stateDir,
      st,
      t0: Date.now(),
      checksum: o.checksum,
      chmod: o.chmod,
      update: o.update,
      wholeFile: o.wholeFile,
      removeSourceFiles: o.removeSourceFiles,
      compressLevel: o.compressLevel,
      bwlimitKiBps: o.bwlimitKiBps,
      events: o.events,
      tree: { excludes: o.excludes ?? [], wireExcludes: o.rules?.wire, dirMerge: o.rules?.dirMerge, filesFrom: o.filesFrom, filesFromRecursive: o.filesFromRecursive, deleteExcluded: o.deleteExcluded, pruneEmptyDirs: o.pruneEmptyDirs, copyLinks: o.copyLinks, dryRun: o.dryRun, oneFileSystem: o.oneFileSystem, parallel: o.jobs, maxSize: o.maxSize, minSize: o.minSize, attrs: o.attrs, omit: o.omit, choices: o.choices },
    });
  }
  const receiving = {
    ...extra,
    path: o.path,
    port: 0,
    target: path.resolve(o.path),
    stateDir,
    checksum: o.checksum,
    events: o.events,
    ...receivingOptions(o),
    sizeLimits: limitsOf(o),
    inplace: o.inplace,
    fsync: o.fsync,
  };
  // Where a tree will land is known before the offer says it is one (rsync's rules): an
  // existing directory there is walked, and what a delta would start from hashed, while the
  // handshake and the sender's manifest cross the ssh channel (decisions §97). The session
  // uses both only if the offer turns out to be a tree for that very directory.
  const early = await earlyTreeTarget(o);
  const prewalk = early && prewalkFits({ excludes: o.excludes, wire: o.rules?.wire, dirMerge: o.rules?.dirMerge, oneFileSystem: o.oneFileSystem }) ? startPrewalk(early, receiving, stateDir) : undefined;
  const waitingScan = waitingScanOf(o, prewalk, stateDir);
  try {
    return await runReceiver(conn, {
      ...receiving,
      prewalk,
      waitingScan,
      resolveTarget: (kind) => syncTarget(o.path, Boolean(o.destSlash), o.name ?? baseName(o.path), kind, Boolean(o.srcSlash), o.dryRun, o.mkpath),
    });
  } finally {
    waitingScan?.stop();
  }
}

/** The directory a tree pushed to this remote end lands in (`syncTarget`'s rule for a tree:
 * DEST for `SRC/`, DEST/name for `SRC`), when it exists already as a directory (not a link to
 * one: `syncTarget` refuses that); undefined otherwise. Reads only. */
export async function earlyTreeTarget(o: Pick<ServerArgs, 'path' | 'srcSlash' | 'name'>): Promise<string | undefined> {
  if (o.name !== undefined && !isOneComponent(o.name)) return undefined; // syncTarget refuses it
  const target = path.resolve(treeTarget(o.path, o.name ?? baseName(o.path), Boolean(o.srcSlash)));
  const st = await fs.lstat(target).catch(() => undefined);
  return st?.isDirectory() ? target : undefined;
}

/**
 * `server --quic` (the remote end of `sync --quic`): answer the local side's QUIC_OFFER
 * over the ssh channel with our UDP port and fingerprint, take the one QUIC connection
 * presenting the announced fingerprint, and run the session over it. The session ends
 * if the ssh channel does (the local side is gone).
 */
async function serveQuic(conn: FramedConnection, o: Parameters<typeof serveStdio>[0], stateDir: string): Promise<SyncSummary> {
  const timeoutMs = o.timeoutMs ?? 60_000;
  const ac = new AbortController();
  let listener: QuicListener | undefined;
  try {
    const offer = decodeQuicOffer((await expect(conn, FrameType.QUIC_OFFER)).payload);
    const id = loadOrCreateIdentity(stateDir);
    // Dual-stack where the host has IPv6, IPv4 otherwise.
    const { QuicListener } = quic();
    listener = await QuicListener.bind('::', 0, id, { idleMs: timeoutMs }).catch(() => QuicListener.bind('0.0.0.0', 0, id, { idleMs: timeoutMs }));
    const sshServerAddress = (process.env.SSH_CONNECTION ?? '').split(' ')[2] ?? '';
    await conn.send(FrameType.QUIC_READY, encodeQuicReady(listener.port, id.fingerprint, sshServerAddress));
    // The ssh channel now only carries KEEPALIVEs; its end (or silence) ends the session.
    conn.recv().then(
      () => ac.abort(),
      () => ac.abort(),
    );
    const l = listener;
    const session = await abortable(l.acceptSession(), ac.signal, () => l.close());
    return await overQuic(session, 'accept', timeoutMs, (qconn, stream) =>
      serveRole(qconn, o, stateDir, {
        secure: stream,
        expectFingerprint: offer.fingerprint,
        signal: ac.signal,
        ...(o.role === 'sender' ? { dialLane: () => session.openStream() } : { listener: session.lanes() }),
      }),
    );
  } catch (e) {
    const err = e instanceof FfsyncError ? e : fromSystemError(e, 'QUIC session failed');
    await reportError(conn, err);
    throw err;
  } finally {
    listener?.close();
    await conn.close(500);
  }
}
