// V8's compiled code of the CLI's bundle, kept on disk between runs.
//
// Every run of the CLI parses and compiles the 600 KB bundle (./entry.ts) again: V8 compiles a
// function when it is first called, so a session pays it throughout, ~40 ms of CPU per process
// on the VMs we measure on (decisions §98). V8 can serialize the bytecode of every function a run
// compiled and take it back in the next run instead of compiling (a code cache); `vm.Script`'s
// `cachedData` and `createCachedData()` give it on every Node we support. (Node >= 22.1 has a
// module compile cache of its own; this one serves Node 20 too, and keeps a cache per command.)
//
// What is kept: per command (`send`, `receive`, `sync`, …: each compiles different functions) and
// per install and build of the bundle (its path; its size, time and inode: V8's own check
// compares only the length), one file made at the exit of the command's first successful run, and
// made again once by a run that lasted ≥ 1 s if the one kept came from a shorter run (a no-op
// compiles less than a transfer).
// Never on other runs: serializing costs ~5 ms. Where: a directory of the user's own (XDG cache,
// ~/Library/Caches, %LOCALAPPDATA%), or under NODE_COMPILE_CACHE; NODE_DISABLE_COMPILE_CACHE turns
// it off — the variables Node reads for its own compile cache. A code cache is code this process
// runs, so it is read only from a directory this user owns that nobody else can write to (POSIX),
// and it is written whole under a temporary name, then renamed. Any failure here means compiling
// as usual; it never fails a command.
import fs from 'node:fs';
import Module from 'node:module';
import path from 'node:path';
import vm from 'node:vm';
import { homeDir } from '../utils/state-dir.js';
import { lazyRequire } from './lazy-builtins.js';

/** A run at least this long replaces a cache made by a shorter one (once). */
export const LONG_RUN_MS = 1000;

const MAGIC = 'FFC1';
const HEADER_BYTES = 8;
const FLAG_LONG = 1;

/** The directory for this Node's code caches, or undefined when caching is off. */
export function codeCacheDir(env: NodeJS.ProcessEnv = process.env, platform: NodeJS.Platform = process.platform, home: string = homeDir()): string | undefined {
  if (env.NODE_DISABLE_COMPILE_CACHE) return undefined;
  let root: string;
  if (env.NODE_COMPILE_CACHE) {
    root = path.resolve(env.NODE_COMPILE_CACHE);
  } else {
    if (!home) return undefined;
    switch (platform) {
      case 'win32':
        root = path.join(env.LOCALAPPDATA ?? path.join(home, 'AppData', 'Local'), 'ffsync-native', 'Cache');
        break;
      case 'darwin':
        root = path.join(home, 'Library', 'Caches', 'ffsync-native');
        break;
      default:
        root = path.join(env.XDG_CACHE_HOME && path.isAbsolute(env.XDG_CACHE_HOME) ? env.XDG_CACHE_HOME : path.join(home, '.cache'), 'ffsync-native');
    }
  }
  // V8 rejects another version's cache; a directory per version and architecture keeps two
  // Node installs taking turns from rewriting each other's.
  return path.join(root, `v8-${process.versions.v8}-${process.arch}`);
}

/** The cache's name for a command: `argv[2]` when it is a plain word, else `main`. */
export function commandKey(argv: readonly string[]): string {
  const c = argv[2];
  return c !== undefined && /^[a-z][a-z-]{0,31}$/.test(c) ? c : 'main';
}

/** Only this user may have written `dir` (POSIX: a directory, not a link, ours, not writable by
 * group or others). Windows: the per-user profile's directory, as Node's own cache trusts it. */
function privateDir(dir: string): boolean {
  const st = fs.lstatSync(dir);
  if (!st.isDirectory()) return false;
  if (process.platform === 'win32' || typeof process.getuid !== 'function') return true;
  return st.uid === process.getuid() && (st.mode & 0o022) === 0;
}

export interface Kept {
  v8: Buffer;
  long: boolean;
}

/** The kept cache of `file`, if one is there and its directory is private. */
export function readKept(dir: string, file: string): Kept | undefined {
  try {
    if (!privateDir(dir)) return undefined;
    const b = fs.readFileSync(file);
    if (b.length <= HEADER_BYTES || b.toString('latin1', 0, 4) !== MAGIC) return undefined;
    return { v8: b.subarray(HEADER_BYTES), long: (b[4]! & FLAG_LONG) !== 0 };
  } catch {
    return undefined;
  }
}

/** The nearest part of `dir` that exists is this user's, or a shared sticky directory such as
 * /tmp (POSIX): `sudo` keeps HOME on some systems, and root must not leave root-owned
 * directories in another user's cache. */
function ownAncestor(dir: string): boolean {
  if (process.platform === 'win32' || typeof process.getuid !== 'function') return true;
  for (let d = dir; ; d = path.dirname(d)) {
    const st = fs.lstatSync(d, { throwIfNoEntry: false });
    if (st) return st.uid === process.getuid() || (st.isDirectory() && (st.mode & 0o1000) !== 0);
    if (path.dirname(d) === d) return false;
  }
}

/** Write `data()` as `file`, whole (a temporary name, then a rename), and remove this command's
 * caches of other bundles (an upgraded CLI's old ones). `data` is called only once the directory
 * is there and private: a place that cannot hold a cache costs no serializing. */
export function writeKept(dir: string, file: string, data: () => Buffer, long: boolean): void {
  try {
    if (!ownAncestor(dir)) return;
    fs.mkdirSync(dir, { recursive: true, mode: 0o700 });
    if (!privateDir(dir)) return;
    const header = Buffer.alloc(HEADER_BYTES);
    header.write(MAGIC, 0, 'latin1');
    header[4] = long ? FLAG_LONG : 0;
    const tmp = `${file}.${process.pid}.tmp`;
    fs.writeFileSync(tmp, Buffer.concat([header, data()]), { mode: 0o600, flag: 'wx' });
    fs.renameSync(tmp, file);
    // `<command>-<where>.<build>.v8` (see runWithCodeCache): this install's other builds go, so
    // an upgrade in place leaves nothing behind, and another install's stay (a global and a
    // project's CLI used in turn would otherwise evict each other). A temporary file a crashed
    // run left goes too; one another run is writing just now fails its rename, which it ignores.
    const base = path.basename(file);
    const prefix = base.slice(0, base.indexOf('.', base.lastIndexOf('-')) + 1);
    for (const other of fs.readdirSync(dir)) {
      if (other !== base && other.startsWith(prefix)) fs.rmSync(path.join(dir, other), { force: true });
    }
  } catch {
    // A cache that cannot be written (read-only home, full disk): the next run compiles.
  }
}

/** The bundle's bytes, and a name for this build of it: its size, modification time and inode,
 * read from the descriptor it is read through. (A hash of its bytes would load OpenSSL or zlib:
 * +2 MiB resident and 1–3 ms in every run, measured; V8's own check is the length.) */
function readEntry(entry: string): { bytes: Buffer; key: string } {
  const fd = fs.openSync(entry, 'r');
  try {
    const st = fs.fstatSync(fd, { bigint: true });
    const bytes = Buffer.allocUnsafe(Number(st.size));
    let at = 0;
    while (at < bytes.length) {
      const n = fs.readSync(fd, bytes, at, bytes.length - at, at);
      if (n === 0) break;
      at += n;
    }
    return { bytes: bytes.subarray(0, at), key: `${st.size.toString(36)}.${st.mtimeNs.toString(36)}.${st.ino.toString(36)}` };
  } finally {
    fs.closeSync(fd);
  }
}

/** FNV-1a (32 bits) of a path, in base 36: a short name for an install's place. */
export function pathHash(p: string): string {
  let h = 0x811c9dc5;
  for (let i = 0; i < p.length; i++) h = Math.imul(h ^ p.charCodeAt(i), 0x01000193);
  return (h >>> 0).toString(36);
}

/** Run the CommonJS file `entry` as this process's program, with V8's code cache of it for
 * `command` from `dir` (none when `dir` is undefined). */
export function runWithCodeCache(entry: string, dir: string | undefined, command: string): void {
  const { bytes, key } = readEntry(entry);
  // Where the bundle is installed (a hash of its path) and which build it is (`key`).
  const file = dir && path.join(dir, `${command}-${pathHash(entry)}.${key}.v8`);
  const kept = dir && file ? readKept(dir, file) : undefined;
  // The bundle is one function expression (`npm run bundle:cli` wraps it as Node wraps a
  // CommonJS module) and its code is ASCII (esbuild escapes the rest; only comments hold other
  // bytes): read as Latin-1, it is V8's one-byte string, half the memory of UTF-16, no copy.
  const script = new vm.Script(bytes.toString('latin1'), {
    filename: entry,
    cachedData: kept?.v8,
    // No import callback: Node 20 loses it from a script compiled with cached data, so the
    // bundle has no import() (ES modules come through ./import-esm.ts, outside it).
  });
  const usable = kept !== undefined && !script.cachedDataRejected;
  if (dir && file && !(usable && kept.long)) {
    const started = Date.now();
    process.once('exit', (code) => {
      // Only what a successful run compiled; a short run never replaces a cache that works.
      const long = Date.now() - started >= LONG_RUN_MS;
      if (code !== 0 || (usable && !long)) return;
      writeKept(dir, file, () => script.createCachedData(), long);
    });
  }
  const m = new Module(entry, module);
  m.filename = entry;
  const run = script.runInThisContext() as (e: unknown, r: NodeJS.Require, m: Module, f: string, d: string) => void;
  run.call(m.exports, m.exports, lazyRequire(Module.createRequire(entry)), m, entry, path.dirname(entry));
}

/** Start the CLI's program (see the head of this file). */
export function startProgram(entry: string, argv: readonly string[] = process.argv): void {
  runWithCodeCache(entry, codeCacheDir(), commandKey(argv));
}
