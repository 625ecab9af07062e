// The CLI keeps V8's compiled code of its bundle between runs (ts/cli/code-cache.ts, decisions
// §98): where it is kept, when it is written (a command's first successful run; once more by a
// run of ≥ 1 s), that a cache V8 refuses or a directory others could write is never trusted, and
// that nothing of it can fail a command.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import { codeCacheDir, commandKey, pathHash, readKept, writeKept } from '../ts/cli/code-cache';
import { CLI, copyOfCli, run, seeded, tmpdir } from './helpers/peers';

/** This Node's directory under `root` (codeCacheDir's last step). */
const versionDir = (root: string) => path.join(root, `v8-${process.versions.v8}-${process.arch}`);

/** The cache files of `command` in `dir`. */
function cachesOf(dir: string, command: string): string[] {
  return fs.existsSync(dir) ? fs.readdirSync(dir).filter((f) => f.startsWith(`${command}-`)) : [];
}

/** The one cache of `command`: its path, inode (a rewrite renames a new file over it) and flag. */
function theCache(dir: string, command: string): { file: string; ino: number; long: boolean; bytes: number } {
  const names = cachesOf(dir, command);
  assert.equal(names.length, 1, `one cache of ${command}: ${names.join(' ')}`);
  const file = path.join(dir, names[0]!);
  const b = fs.readFileSync(file);
  assert.equal(b.toString('latin1', 0, 4), 'FFC1');
  return { file, ino: fs.statSync(file).ino, long: (b[4]! & 1) === 1, bytes: b.length };
}

async function ok(args: string[], env: NodeJS.ProcessEnv): Promise<string> {
  const r = await run(args, env).done;
  assert.equal(r.code, 0, `${args.join(' ')}: ${r.stderr}`);
  return r.stdout;
}

describe('where the code cache lives', () => {
  it('per platform, under NODE_COMPILE_CACHE when set, nowhere with NODE_DISABLE_COMPILE_CACHE', () => {
    const v = (root: string) => versionDir(root);
    assert.equal(codeCacheDir({}, 'linux', '/home/u'), v('/home/u/.cache/ffsync-native'));
    assert.equal(codeCacheDir({ XDG_CACHE_HOME: '/x/cache' }, 'linux', '/home/u'), v('/x/cache/ffsync-native'));
    // The XDG spec: a relative path is invalid and ignored.
    assert.equal(codeCacheDir({ XDG_CACHE_HOME: 'rel' }, 'linux', '/home/u'), v('/home/u/.cache/ffsync-native'));
    assert.equal(codeCacheDir({}, 'darwin', '/Users/u'), v('/Users/u/Library/Caches/ffsync-native'));
    assert.equal(codeCacheDir({ LOCALAPPDATA: '/l' }, 'win32', '/h'), v(path.join('/l', 'ffsync-native', 'Cache')));
    assert.equal(codeCacheDir({ NODE_COMPILE_CACHE: '/c', XDG_CACHE_HOME: '/x' }, 'linux', '/home/u'), v(path.resolve('/c')));
    assert.equal(codeCacheDir({ NODE_DISABLE_COMPILE_CACHE: '1', NODE_COMPILE_CACHE: '/c' }, 'linux', '/home/u'), undefined);
    assert.equal(codeCacheDir({}, 'linux', ''), undefined);
  });

  it('one cache per command word; anything else (an option, a path) is `main`', () => {
    assert.equal(commandKey(['node', 'main.js', 'send', 'x']), 'send');
    assert.equal(commandKey(['node', 'main.js', '--version']), 'main');
    assert.equal(commandKey(['node', 'main.js']), 'main');
    assert.equal(commandKey(['node', 'main.js', '../../etc/x']), 'main');
    assert.equal(commandKey(['node', 'main.js', 'Send']), 'main');
  });

  it('is read only from a directory this user owns that nobody else can write', { skip: process.platform === 'win32' }, () => {
    const root = tmpdir();
    const dir = path.join(root, 'cache');
    const file = path.join(dir, 'send-k.v8');
    fs.writeFileSync(path.join(root, 'file'), '');
    writeKept(dir, file, () => Buffer.from('v8 bytes'), true);
    assert.equal((fs.statSync(dir).mode & 0o777).toString(8), '700');
    assert.equal((fs.statSync(file).mode & 0o777).toString(8), '600');
    assert.deepEqual(readKept(dir, file), { v8: Buffer.from('v8 bytes'), long: true });
    fs.chmodSync(dir, 0o770);
    assert.equal(readKept(dir, file), undefined, 'a group-writable directory is not trusted');
    fs.chmodSync(dir, 0o700);
    // Nor a link to a directory, even one of ours.
    const link = path.join(path.dirname(dir), 'link');
    fs.symlinkSync(dir, link);
    assert.equal(readKept(link, path.join(link, 'send-k.v8')), undefined);
    // Nor a file that is not ours in format.
    fs.writeFileSync(path.join(dir, 'sync-k.v8'), 'garbage!garbage');
    assert.equal(readKept(dir, path.join(dir, 'sync-k.v8')), undefined);
    // A group-writable directory is not written to either.
    fs.chmodSync(dir, 0o777);
    let serialized = 0;
    writeKept(dir, path.join(dir, 'recv-k.v8'), () => (serialized++, Buffer.from('x')), false);
    assert.equal(fs.existsSync(path.join(dir, 'recv-k.v8')), false);
    // Nor is anything serialized for it (5 ms in a real run), nor where no directory can be made.
    writeKept(path.join(root, 'file', 'sub'), path.join(root, 'file', 'sub', 'x.v8'), () => (serialized++, Buffer.from('x')), false);
    assert.equal(serialized, 0);
  });

  it("is not made in another user's directory (root under a HOME that sudo kept), but may be under a sticky one", { skip: process.getuid?.() !== 0 && 'needs root (chown)' }, () => {
    const root = tmpdir();
    const theirs = path.join(root, 'home-of-1000', '.cache');
    fs.mkdirSync(theirs, { recursive: true });
    fs.chownSync(theirs, 1000, 1000);
    const dir = path.join(theirs, 'ffsync-native', 'v8-x');
    writeKept(dir, path.join(dir, 'send-k.v8'), () => Buffer.from('x'), false);
    assert.equal(fs.existsSync(path.join(theirs, 'ffsync-native')), false, 'nothing made under their directory');
    // A shared sticky directory (as /tmp) owned by someone else: ours is made in it.
    const shared = path.join(root, 'shared');
    fs.mkdirSync(shared);
    fs.chmodSync(shared, 0o1777);
    fs.chownSync(shared, 1000, 1000);
    const ours = path.join(shared, 'v8-x');
    writeKept(ours, path.join(ours, 'send-k.v8'), () => Buffer.from('x'), false);
    assert.deepEqual(readKept(ours, path.join(ours, 'send-k.v8')), { v8: Buffer.from('x'), long: false });
  });
});

describe('the CLI with its code cache', () => {
  it("a command's first successful run keeps it; later runs use it without writing; a failed run keeps nothing", async () => {
    const root = tmpdir();
    const env = { NODE_COMPILE_CACHE: root };
    const dir = versionDir(root);
    assert.match(await ok(['--version'], env), /^\d+\.\d+\.\d+/);
    const first = theCache(dir, 'main');
    assert.equal(first.long, false);
    assert.ok(first.bytes > 10_000, `${first.bytes} bytes of compiled code`);
    // The second run took it (a cache V8 refused would be written again: a new file).
    assert.match(await ok(['--version'], env), /^\d+\.\d+\.\d+/);
    assert.equal(theCache(dir, 'main').ino, first.ino);
    // A send that fails (nobody listens on port 1: exit 10) keeps no cache of `send`.
    const file = path.join(root, 'a.bin');
    fs.writeFileSync(file, seeded(1000, 1));
    const failed = await run(['send', file, '127.0.0.1:1', '--plaintext', '--state-dir', path.join(root, 'state')], env).done;
    assert.equal(failed.code, 10);
    assert.deepEqual(cachesOf(dir, 'send'), []);
  });

  it('a cache V8 refuses is replaced, and the command runs as without one', async () => {
    const root = tmpdir();
    const env = { NODE_COMPILE_CACHE: root };
    const dir = versionDir(root);
    await ok(['--help'], env);
    const kept = theCache(dir, 'main');
    // Our header intact, V8's damaged (its magic number): V8 refuses it.
    const b = fs.readFileSync(kept.file);
    for (let i = 8; i < 12; i++) b[i] ^= 0x5a;
    fs.writeFileSync(kept.file, b);
    const help = await ok(['--help'], env);
    assert.match(help, /Usage: ffsync-native/);
    const again = theCache(dir, 'main');
    assert.notEqual(again.ino, kept.ino, 'the refused cache was written again');
    assert.notDeepEqual(fs.readFileSync(again.file), b);
  });

  it('a run of ≥ 1 s replaces a cache a shorter run made, once; a new build replaces its install\'s old cache, not another install\'s', async () => {
    const root = tmpdir();
    const env = { NODE_COMPILE_CACHE: root };
    const dir = versionDir(root);
    const src = path.join(root, 'src');
    fs.mkdirSync(src);
    fs.writeFileSync(path.join(src, 'a.bin'), seeded(300_000, 2));
    const state = path.join(root, 'state');
    const syncTo = (dst: string, ...more: string[]) => ok(['sync', '-a', '--state-dir', state, ...more, `${src}/`, `${dst}/`], env);
    // The short runs skip the final syncfs (--no-fsync): on a busy CI machine flushing the
    // whole filesystem could take a second and make them long runs.
    const timed = async (dst: string) => {
      const t = Date.now();
      await syncTo(dst, '--no-fsync');
      return Date.now() - t;
    };
    const first = await timed(path.join(root, 'd1'));
    const short = theCache(dir, 'sync');
    assert.equal(short.long, false, `a short run (${first} ms)`);
    // Another short run: the cache works, nothing is written.
    const second = await timed(path.join(root, 'd2'));
    assert.equal(theCache(dir, 'sync').ino, short.ino, `a second short run (${second} ms) wrote nothing`);
    // 300 KB at 150 KiB/s: a run of ~2 s (the rate limiter's code compiled besides).
    const t0 = Date.now();
    await syncTo(path.join(root, 'd3'), '--bwlimit', '150');
    assert.ok(Date.now() - t0 >= 1000, 'the slow run lasted a second');
    const long = theCache(dir, 'sync');
    assert.notEqual(long.ino, short.ino);
    assert.equal(long.long, true);
    await syncTo(path.join(root, 'd4'), '--bwlimit', '150');
    assert.equal(theCache(dir, 'sync').ino, long.ino, 'a cache made by a long run is kept');
    assert.deepEqual(fs.readFileSync(path.join(root, 'd4', 'a.bin')), seeded(300_000, 2));

    // Another install (a copy of the CLI elsewhere): its own cache beside this build's, both kept
    // (two installs used in turn must not evict each other's).
    const copyMain = copyOfCli(path.join(root, 'install'));
    const copy = path.dirname(copyMain);
    const copyRun = async () => {
      const r = await run(['--version'], env, copyMain).done;
      assert.equal(r.code, 0, r.stderr);
    };
    await copyRun();
    await ok(['--version'], env);
    const both = cachesOf(dir, 'main');
    assert.equal(both.length, 2, both.join(' '));
    // That install upgraded in place (a new time: another build): its new cache replaces its
    // old one, this build's stays; and a temporary file a crashed run left behind goes too.
    const before = new Set(both);
    const [oldOfCopy] = both.filter((f) => f.startsWith(`main-${pathHash(path.join(copy, 'entry.js'))}.`));
    assert.ok(oldOfCopy, both.join(' '));
    fs.writeFileSync(path.join(dir, `${oldOfCopy}.99999.tmp`), 'half');
    fs.utimesSync(path.join(copy, 'entry.js'), new Date(), new Date(Date.now() + 5000));
    await copyRun();
    const after = cachesOf(dir, 'main');
    assert.equal(after.length, 2, after.join(' '));
    assert.ok(!after.includes(oldOfCopy), 'the old build of that install was removed');
    assert.equal(after.filter((f) => before.has(f)).length, 1, 'this build\'s cache stayed');
  });

  it('with NODE_DISABLE_COMPILE_CACHE nothing is kept; an unwritable cache directory fails nothing', async () => {
    const root = tmpdir();
    assert.match(await ok(['--version'], { NODE_COMPILE_CACHE: root, NODE_DISABLE_COMPILE_CACHE: '1' }), /^\d+\.\d+\.\d+/);
    assert.deepEqual(fs.readdirSync(root), []);
    // A file where the directory would be.
    const blocked = path.join(root, 'blocked');
    fs.writeFileSync(blocked, '');
    assert.match(await ok(['--version'], { NODE_COMPILE_CACHE: blocked }), /^\d+\.\d+\.\d+/);
    // The default place, under a home of its own (POSIX: HOME is the home; Windows keeps it in
    // LOCALAPPDATA, the runner's own).
    if (process.platform !== 'win32') {
      const home = path.join(root, 'home');
      fs.mkdirSync(home);
      await ok(['--version'], { HOME: home, XDG_CACHE_HOME: '', NODE_COMPILE_CACHE: '' });
      const expected = codeCacheDir({}, process.platform, home)!;
      assert.ok(expected.startsWith(home + path.sep), expected);
      theCache(expected, 'main');
    }
  });
});

it('the bundle as the loader reads it: one function expression, ASCII code, no import()', () => {
  const bundle = fs.readFileSync(path.join(path.dirname(CLI), 'entry.js'), 'utf8');
  assert.ok(bundle.length > 100_000);
  assert.ok(bundle.startsWith('(function (exports, require, module, __filename, __dirname) {\n'), bundle.slice(0, 80));
  // Read as Latin-1 (a one-byte string): other bytes only in comments, where they change nothing.
  const nonAscii = bundle.split('\n').filter((l) => /[\u0080-\uffff]/.test(l) && !/^\s*(\*|\/\/|\/\*)/.test(l));
  assert.deepEqual(nonAscii, []);
  // A script compiled from a code cache cannot import() on Node 20; ora comes through the file
  // outside the bundle, which Node loads itself.
  assert.doesNotMatch(bundle, /\bimport\s*\(/);
  assert.match(bundle, /require\("\.\/import-esm"\)/);
});
