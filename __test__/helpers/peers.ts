// Runs real ffsync-native processes (the compiled CLI) over loopback and collects their
// exit codes, JSON events and output.
import assert from 'node:assert/strict';
import { type ChildProcess, execFileSync, spawnSync, type SpawnSyncReturns } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { sha256 } from './data';
import { ChildRun } from './process';

/** The CLI under test: this build's, or FFSYNC_TEST_CLI (another build's main.js, to show that a
 * new test fails there). */
export const CLI = process.env.FFSYNC_TEST_CLI ?? path.join(__dirname, '..', '..', 'dist', 'cli', 'main.js');

export interface PeerResult {
  code: number | null;
  signal: NodeJS.Signals | null;
  events: Record<string, any>[];
  stdout: string;
  stderr: string;
  summary: Record<string, any> | undefined;
}

export interface Peer {
  child: ChildProcess;
  done: Promise<PeerResult>;
  /** JSON events so far (live). */
  events: Record<string, any>[];
  /** Resolves on the first JSON event satisfying `pred`. */
  waitFor(pred: (e: Record<string, any>) => boolean): Promise<Record<string, any>>;
}

/** Run the CLI (`cli`: this build's, or another build's main.js to compare against). */
export function run(args: string[], env: NodeJS.ProcessEnv = {}, cli = CLI): Peer {
  const p = new ChildRun('ffsync-native', [process.execPath, cli, ...args], { env: { ...process.env, ...env } });
  const done = p.exited.then(({ code, signal }) => ({ code, signal, events: p.events, stdout: p.stdout, stderr: p.stderr, summary: p.events.find((e) => e.event === 'summary') }));
  return { child: p.child, done, events: p.events, waitFor: (pred) => p.waitForEvent(pred) };
}

export async function startReceiver(target: string, args: string[] = [], env: NodeJS.ProcessEnv = {}): Promise<{ peer: Peer; port: number }> {
  const peer = run(['receive', target, '0', '--plaintext', '--json', '--timeout', '20', ...args], env);
  const ev = await peer.waitFor((e) => e.event === 'listening');
  return { peer, port: ev.port };
}

export function sender(source: string, port: number, args: string[] = [], env: NodeJS.ProcessEnv = {}): Peer {
  return run(['send', source, `127.0.0.1:${port}`, '--plaintext', '--json', '--timeout', '20', ...args], env);
}

/** One complete sync; both peers' results. */
export async function sync(
  source: string,
  target: string,
  o: { stateS: string; stateR: string; sendArgs?: string[]; recvArgs?: string[]; recvEnv?: NodeJS.ProcessEnv },
): Promise<{ send: PeerResult; recv: PeerResult }> {
  const { peer, port } = await startReceiver(target, ['--state-dir', o.stateR, ...(o.recvArgs ?? [])], o.recvEnv);
  const s = await sender(source, port, ['--state-dir', o.stateS, ...(o.sendArgs ?? [])]).done;
  const r = await peer.done;
  return { send: s, recv: r };
}

/** Every directory tmpdir() made in this process, removed when it exits (a full `npm test`
 * otherwise leaves ~4 GB of fixtures behind; CI disks can be small). FFSYNC_KEEP_TMP=1 keeps them. */
const madeDirs: string[] = [];
process.once('exit', () => {
  if (process.env.FFSYNC_KEEP_TMP) return;
  for (const d of madeDirs) {
    try {
      fs.rmSync(d, { recursive: true, force: true });
    } catch {
      // e.g. a file a failed test left immutable: it stays, as it would have anyway
    }
  }
});

/** A loopback port nobody listens on (it was free a moment ago). */
export async function unusedPort(): Promise<number> {
  const srv = net.createServer();
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  const port = (srv.address() as net.AddressInfo).port;
  await new Promise<void>((r) => srv.close(() => r()));
  return port;
}

export function tmpdir(prefix = 'ffsync-test-'): string {
  const d = fs.mkdtempSync(path.join(os.tmpdir(), prefix));
  madeDirs.push(d);
  return d;
}

/** A copy of the CLI under test in `root` (`dist/cli/` as built; with `addon`, `binding/` too),
 * every directory readable by other users: another install of the same build (a new path, inode
 * and time), or one a process of another uid can run. Returns its main.js. */
export function copyOfCli(root: string, o: { addon?: boolean } = {}): string {
  const cli = path.join(root, 'dist', 'cli');
  fs.mkdirSync(cli, { recursive: true });
  for (const d of [root, path.join(root, 'dist'), cli]) fs.chmodSync(d, 0o755);
  for (const f of ['main.js', 'entry.js', 'import-esm.js']) fs.copyFileSync(path.join(path.dirname(CLI), f), path.join(cli, f));
  if (o.addon) {
    fs.cpSync(path.join(path.dirname(CLI), '..', '..', 'binding'), path.join(root, 'binding'), { recursive: true });
    fs.chmodSync(path.join(root, 'binding'), 0o755);
  }
  return path.join(cli, 'main.js');
}

/** Deterministic pseudo-random bytes (AES-128-CTR keystream of the seed). */
export function seeded(len: number, seed: number): Buffer {
  const key = crypto.createHash('sha256').update(`seed:${seed}`).digest().subarray(0, 16);
  const c = crypto.createCipheriv('aes-128-ctr', key, Buffer.alloc(16));
  return Buffer.concat([c.update(Buffer.alloc(len)), c.final()]);
}

/** A tree of `n` files of 2 MiB whose older versions the target holds (4 KiB at `editAt`
 * changed in each, the old copies an older mtime: delta conversations, multiplexed in a
 * version 2 session), and a small file only the source has. */
export function olderVersionsTree(n: number, seed: number, editAt: number): { dir: string; src: string; dst: string } {
  const dir = tmpdir();
  const src = path.join(dir, 'src');
  const dst = path.join(dir, 'dst');
  fs.mkdirSync(src);
  fs.mkdirSync(dst);
  for (let i = 0; i < n; i++) {
    const old = seeded(2 * 1024 * 1024, seed + i);
    fs.writeFileSync(path.join(dst, `f${i}.bin`), old);
    // An older mtime: same size and same (coarse) mtime would pass rsync's quick check.
    fs.utimesSync(path.join(dst, `f${i}.bin`), 1_600_000_000, 1_600_000_000);
    const now = Buffer.from(old);
    now.fill(i + 1, editAt, editAt + 4096);
    fs.writeFileSync(path.join(src, `f${i}.bin`), now);
  }
  fs.writeFileSync(path.join(src, 'small.txt'), 'small\n');
  return { dir, src, dst };
}

/** Scattered 64 KiB overwrites, 4 KiB insertions, 8 KiB deletions at seeded positions. */
export function modify(old: Buffer, seed: number, edits = { overwrites: 6, inserts: 2, deletes: 2 }): Buffer {
  let b = Buffer.from(old);
  const rnd = seeded(4 * 64, seed);
  let k = 0;
  const pos = (limit: number) => rnd.readUInt32LE((k++ % 64) * 4) % Math.max(1, limit);
  for (let i = 0; i < edits.overwrites; i++) seeded(65536, seed * 100 + i).copy(b, pos(b.length - 65536));
  for (let i = 0; i < edits.inserts; i++) {
    const at = pos(b.length);
    b = Buffer.concat([b.subarray(0, at), seeded(4096, seed * 200 + i), b.subarray(at)]);
  }
  for (let i = 0; i < edits.deletes; i++) {
    const at = pos(b.length - 8192);
    b = Buffer.concat([b.subarray(0, at), b.subarray(at + 8192)]);
  }
  return b;
}

export { sha256 } from './data';

/** Every file under `dir` with its size and hash: a before/after snapshot. */
export function snapshot(dir: string): Record<string, string> {
  const out: Record<string, string> = {};
  const walk = (d: string) => {
    for (const e of fs.readdirSync(d, { withFileTypes: true })) {
      const p = path.join(d, e.name);
      if (e.isDirectory()) walk(p);
      else out[path.relative(dir, p)] = e.isFile() ? sha256(p) : 'special';
    }
  };
  walk(dir);
  return out;
}

/** The one `ffsync-native: error:` line a failed run prints (asserts there is exactly one). */
export function oneErrorLine(stderr: string): string {
  const lines = stderr.trim().split('\n').filter((l) => l.startsWith('ffsync-native: error:'));
  assert.equal(lines.length, 1, `expected one error line, got: ${stderr}`);
  return lines[0]!;
}

export function canMount(): boolean {
  return process.platform === 'linux' && process.getuid?.() === 0;
}

export interface TreeEntry {
  kind: 'file' | 'dir' | 'symlink' | 'other';
  /** sha256 of a file's content. */
  sha256?: string;
  size?: number;
  /** Permission bits (files and directories). */
  mode?: number;
  /** Modification time in ns (files and directories), as a decimal string. */
  mtimeNs?: string;
  /** A symlink's target. */
  link?: string;
}

/** Shows a path given as bytes: UTF-8 as is, other bytes escaped as `\xNN`. */
export function showBytesPath(b: Buffer): string {
  const s = b.toString('utf8');
  if (Buffer.from(s, 'utf8').equals(b)) return s;
  return [...b].map((c) => (c >= 0x20 && c < 0x7f && c !== 0x5c ? String.fromCharCode(c) : `\\x${c.toString(16).padStart(2, '0')}`)).join('');
}

/**
 * Every entry under `dir` (not following symlinks; names read as bytes, so non-UTF-8
 * names work), keyed by relative path ('.' is `dir` itself): kind, content hash, mode,
 * mtime (ns) and symlink target. Two trees are equal iff their snapshots are deepEqual.
 */
export function snapshotTree(dir: string, o: { root?: boolean } = {}): Record<string, TreeEntry> {
  const out: Record<string, TreeEntry> = {};
  const sep = Buffer.from(path.sep);
  const base = Buffer.from(dir);
  const entry = (abs: Buffer): TreeEntry => {
    const st = fs.lstatSync(abs, { bigint: true });
    const mode = Number(st.mode & 0o7777n);
    if (st.isSymbolicLink()) return { kind: 'symlink', link: showBytesPath(fs.readlinkSync(abs, { encoding: 'buffer' })) };
    if (st.isDirectory()) return { kind: 'dir', mode, mtimeNs: String(st.mtimeNs) };
    if (st.isFile()) {
      const sha = crypto.createHash('sha256').update(fs.readFileSync(abs)).digest('hex');
      return { kind: 'file', sha256: sha, size: Number(st.size), mode, mtimeNs: String(st.mtimeNs) };
    }
    return { kind: 'other', mode };
  };
  const walk = (abs: Buffer, rel: Buffer | null) => {
    for (const name of fs.readdirSync(abs, { encoding: 'buffer' })) {
      const a = Buffer.concat([abs, sep, name]);
      const r = rel ? Buffer.concat([rel, Buffer.from('/'), name]) : name;
      const e = entry(a);
      out[showBytesPath(r)] = e;
      if (e.kind === 'dir') walk(a, r);
    }
  };
  if (o.root !== false) out['.'] = entry(base);
  walk(base, null);
  return out;
}


/** Seconds since the epoch with a sub-second part, in the past (fixture mtimes). */
export const T0 = 1_700_000_000.25;

/** Write `data` at `root/rel` (creating parents), optionally with a mode and an mtime (s). */
export function writeAt(root: string, rel: string, data: string | Buffer, mode?: number, mtime?: number | Date): void {
  const p = path.join(root, rel);
  fs.mkdirSync(path.dirname(p), { recursive: true });
  fs.writeFileSync(p, data);
  if (mode !== undefined) fs.chmodSync(p, mode);
  if (mtime !== undefined) fs.utimesSync(p, mtime, mtime);
}

/** The two trees are equal: same entries, kinds, contents, modes, mtimes (files and
 * directories, the root included) and symlink targets. */
export function assertSameTree(actual: string, expected: string, msg = 'trees differ'): void {
  assert.deepEqual(snapshotTree(actual), snapshotTree(expected), msg);
}

/** The `.ffsync-part` files under `dir`. */
export function partials(dir: string): string[] {
  const out: string[] = [];
  const walk = (d: string) => {
    // A session may be running: a directory (a --partial-dir) can go between the listing
    // that named it and this read.
    let entries: fs.Dirent[];
    try {
      entries = fs.readdirSync(d, { withFileTypes: true });
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === 'ENOENT') return;
      throw e;
    }
    for (const e of entries) {
      const p = path.join(d, e.name);
      if (e.isDirectory()) walk(p);
      else if (e.name.endsWith('.ffsync-part')) out.push(p);
    }
  };
  if (fs.existsSync(dir)) walk(dir);
  return out;
}

/** The most MiB blocks of `data` any partial under `dir` holds now. Polls while a session
 *  runs, so a partial found by the listing may already be renamed into place (a small
 *  file's): it counts as none, never as an error, and which partial comes first says nothing. */
export function mostBlocksInPartials(dir: string, data: Buffer): number {
  let most = 0;
  for (const p of partials(dir)) most = Math.max(most, blocksPresent(p, data));
  return most;
}

/** How many 1 MiB blocks of `data` are already in `part` (each block's last 4 KiB compared;
 * the part file is pre-sized, so its size says nothing about progress). */
export function blocksPresent(part: string, data: Buffer): number {
  let fd: number;
  try {
    fd = fs.openSync(part, 'r');
  } catch {
    return 0;
  }
  try {
    const buf = Buffer.alloc(4 * 1024);
    let n = 0;
    for (let end = 1 << 20; end <= data.length; end += 1 << 20) {
      const got = fs.readSync(fd, buf, 0, buf.length, end - buf.length);
      if (got === buf.length && buf.equals(data.subarray(end - buf.length, end))) n++;
    }
    return n;
  } finally {
    fs.closeSync(fd);
  }
}

/** `chattr +i`: not even root can then write `p` (or create files in it, for a directory).
 * False where that is unavailable (not root, a filesystem without inode flags). */
export function makeImmutable(p: string): boolean {
  try {
    execFileSync('chattr', ['+i', p], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}

export function undoImmutable(p: string): void {
  execFileSync('chattr', ['-i', p]);
}

/** Directories a hostile peer must not touch, beside a test's target under `base`:
 * `outside/victim.txt` (where a planted link points) and `sibling/keep.txt`. */
export function bystanders(base: string): { outside: string; sibling: string } {
  const outside = path.join(base, 'outside');
  const sibling = path.join(base, 'sibling');
  fs.mkdirSync(outside);
  fs.mkdirSync(sibling);
  fs.writeFileSync(path.join(outside, 'victim.txt'), 'precious');
  fs.writeFileSync(path.join(sibling, 'keep.txt'), 'sibling');
  return { outside, sibling };
}

/** What rsync-oracle tests compare: relative paths under `root` in order, directories with
 * '/', links as `l -> target`, files with their content (text up to 4 KiB, else size and
 * SHA-256). Empty when `root` does not exist. */
export function listing(root: string): string[] {
  const out: string[] = [];
  const walk = (rel: string) => {
    for (const name of fs.readdirSync(path.join(root, rel)).sort()) {
      const r = rel ? `${rel}/${name}` : name;
      const st = fs.lstatSync(path.join(root, r));
      if (st.isSymbolicLink()) out.push(`${r} -> ${fs.readlinkSync(path.join(root, r))}`);
      else if (st.isDirectory()) {
        out.push(`${r}/`);
        walk(r);
      } else out.push(`${r}: ${st.size <= 4096 ? fs.readFileSync(path.join(root, r), 'utf8') : `${st.size} bytes ${sha256(path.join(root, r))}`}`);
    }
  };
  if (fs.existsSync(root)) walk('');
  return out;
}

/** rsync as the oracle: `ffsync-native sync ARGS` ('ours', with state dirs under `dir`) or
 * `rsync ARGS` ('theirs'), run the same way. With `remote`, a SRC or DEST written `host:path`
 * goes through a stand-in for ssh that runs the remote side here (HOST is ignored), and ours
 * runs this CLI there with a state dir of its own. */
export function syncLikeRsync(dir: string, tool: 'ours' | 'theirs', args: string[], o: { remote?: boolean; env?: NodeJS.ProcessEnv } = {}): SpawnSyncReturns<string> {
  const opts = { encoding: 'utf8' as const, env: o.env };
  if (tool === 'theirs') return spawnSync('rsync', [...(o.remote ? ['-e', fakeSsh(dir)] : []), ...args], opts);
  return spawnSync(process.execPath, [CLI, 'sync', '--state-dir', path.join(dir, 'state'), ...(o.remote ? remoteArgs(dir) : []), ...args], opts);
}

/** A stand-in for ssh under `dir` that runs the remote command here (HOST is ignored). */
export function fakeSsh(dir: string): string {
  const rsh = path.join(dir, 'fake-ssh.sh');
  fs.writeFileSync(rsh, '#!/bin/sh\nshift\nexec /bin/sh -c "$*"\n', { mode: 0o755 });
  return rsh;
}

/** `sync`'s arguments for a `host:path` side through `fakeSsh`, the remote end with a state dir of its own. */
export function remoteArgs(dir: string): string[] {
  return ['-e', fakeSsh(dir), '--remote-cmd', `env FFSYNC_STATE_DIR=${path.join(dir, 'remote-state')} ${process.execPath} ${CLI}`];
}
