// rsync's --remove-source-files, against rsync itself on the same trees in the same run:
// the sender removes the files and symlinks the receiver now holds (sent, or already the
// same there), keeps directories and whatever the options left alone (--max-size, -u,
// --ignore-existing, --existing), locally, on a push and on a pull (the remote side is the
// sender). A partial session removes nothing; a dry run removes nothing; a single file goes
// too.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import { CLI, listing, makeImmutable, syncLikeRsync, tmpdir, undoImmutable, writeAt } from './helpers/peers';

const haveRsync = spawnSync('rsync', ['--version']).status === 0;
const skip = (!haveRsync && 'rsync is not installed') || (process.platform === 'win32' && 'POSIX symlinks and a shell stand-in for ssh');
const OLD = new Date('2020-01-01T00:00:00Z');
const NEWER = new Date('2024-01-01T00:00:00Z');

/** A file with its mtime stamped (rsync compares whole seconds). */
const put = (root: string, rel: string, body: string | Buffer, time = OLD) => writeAt(root, rel, body, undefined, time);

/** A source with every case: a file to send, one already the same on the receiver, one the
 * receiver has newer (-u), one above --max-size, one only the receiver lacks (--existing),
 * a symlink, nested and empty directories. */
function source(root: string): void {
  put(root, 'sent.txt', 'new\n');
  put(root, 'same.txt', 'same\n');
  put(root, 'newer-there.txt', 'old version\n');
  put(root, 'd/e/big.bin', Buffer.alloc(300_000, 7));
  put(root, 'd/nested.txt', 'nested\n');
  put(root, 'only-here.txt', 'not on the receiver\n');
  fs.symlinkSync('sent.txt', path.join(root, 'link'));
  fs.mkdirSync(path.join(root, 'empty'));
}

function target(root: string): void {
  put(root, 'same.txt', 'same\n');
  put(root, 'sent.txt', 'older\n');
  put(root, 'newer-there.txt', 'newer version!\n', NEWER);
  put(root, 'd/nested.txt', 'older\n');
  put(root, 'd/e/big.bin', Buffer.alloc(10, 1));
}

interface Case {
  flags: string[];
  /** How SRC and DEST are given: local, a push (DEST remote) or a pull (SRC remote). */
  mode?: 'local' | 'push' | 'pull';
}

/** rsync and ffsync-native on copies of the same trees; both source and target listings. */
function compare(c: Case): { ours: { src: string[]; dst: string[] }; theirs: { src: string[]; dst: string[] }; stderr: string } {
  const dir = tmpdir('ffsync-rsf-');
  const result = { ours: { src: [] as string[], dst: [] as string[] }, theirs: { src: [] as string[], dst: [] as string[] }, stderr: '' };
  for (const tool of ['ours', 'theirs'] as const) {
    const src = path.join(dir, tool, 'src');
    const dst = path.join(dir, tool, 'dst');
    source(src);
    target(dst);
    const remote = (p: string, side: 'push' | 'pull') => (c.mode === side ? `host:${p}` : p);
    const args = [...c.flags, `${remote(src, 'pull')}/`, `${remote(dst, 'push')}/`];
    const r = syncLikeRsync(dir, tool, args, { remote: Boolean(c.mode && c.mode !== 'local') });
    assert.equal(r.status, 0, `${tool} ${args.join(' ')}: ${r.stderr}`);
    if (tool === 'ours') result.stderr = r.stderr;
    result[tool] = { src: listing(src), dst: listing(dst) };
  }
  return result;
}

describe('--remove-source-files (against rsync)', { skip }, () => {
  for (const c of [
    { flags: ['-a', '--remove-source-files'] },
    { flags: ['-a', '--remove-source-files', '--max-size=100k', '-u'] },
    { flags: ['-a', '--remove-source-files', '--ignore-existing'] },
    { flags: ['-a', '--remove-source-files', '--existing'] },
    { flags: ['-a', '--remove-source-files', '-n'] },
    { flags: ['-a', '--remove-source-files', '-u'], mode: 'push' as const },
    { flags: ['-a', '--remove-source-files', '--max-size=100k'], mode: 'pull' as const },
  ]) {
    it(`sync ${c.flags.join(' ')}${c.mode ? ` (${c.mode})` : ''}: both trees as rsync leaves them`, () => {
      const r = compare(c);
      assert.deepEqual(r.ours.src, r.theirs.src, 'the source after the sync');
      assert.deepEqual(r.ours.dst, r.theirs.dst, 'the destination after the sync');
      // (-n writes nothing; --ignore-existing leaves sent.txt, which the receiver has.)
      if (!c.flags.includes('-n') && !c.flags.includes('--ignore-existing')) assert.ok(!r.ours.src.includes('sent.txt: new\n'), 'a sent file is removed');
      else assert.ok(r.ours.src.includes('sent.txt: new\n'), 'not synced, so kept');
      assert.ok(r.ours.src.includes('d/') && r.ours.src.includes('empty/'), 'directories stay');
    });
  }

  it('a single file is removed once it is on the receiver; one the receiver keeps (-u) is not', () => {
    const dir = tmpdir('ffsync-rsf-file-');
    put(dir, 'a.bin', Buffer.alloc(200_000, 3));
    put(dir, 'b.txt', 'older here\n');
    put(dir, 'out/b.txt', 'newer there\n', NEWER);
    const cli = (args: string[]) => spawnSync(process.execPath, [CLI, 'sync', '--state-dir', path.join(dir, 'state'), ...args], { encoding: 'utf8' });
    let r = cli(['-a', '--remove-source-files', path.join(dir, 'a.bin'), path.join(dir, 'out') + '/']);
    assert.equal(r.status, 0, r.stderr);
    assert.ok(!fs.existsSync(path.join(dir, 'a.bin')), 'sent, then removed');
    assert.deepEqual(fs.readFileSync(path.join(dir, 'out', 'a.bin')), Buffer.alloc(200_000, 3));
    r = cli(['-a', '-u', '--remove-source-files', path.join(dir, 'b.txt'), path.join(dir, 'out') + '/']);
    assert.equal(r.status, 0, r.stderr);
    assert.ok(fs.existsSync(path.join(dir, 'b.txt')), 'the receiver kept its newer copy: the source stays');
  });

  it('a partial session removes nothing, and says so in one line', (t) => {
    const dir = tmpdir('ffsync-rsf-partial-');
    const src = path.join(dir, 'src');
    put(src, 'ok.txt', 'fine\n');
    put(src, 'blocked/x.txt', 'cannot land\n');
    put(src, 'z.txt', 'fine too\n');
    // The receiver's `blocked` cannot take new entries: chmod for a user, an inode flag
    // for root (whom modes do not stop).
    const dst = path.join(dir, 'dst');
    const blocked = path.join(dst, 'blocked');
    fs.mkdirSync(blocked, { recursive: true });
    const asRoot = process.getuid?.() === 0;
    if (asRoot && !makeImmutable(blocked)) return t.skip('root without chattr: no way to make a directory unwritable');
    if (!asRoot) fs.chmodSync(blocked, 0o500);
    try {
      const r = spawnSync(process.execPath, [CLI, 'sync', '-a', '--remove-source-files', '--state-dir', path.join(dir, 'state'), `${src}/`, `${dst}/`], { encoding: 'utf8' });
      assert.equal(r.status, 23, r.stderr);
      assert.match(r.stderr, /^--remove-source-files: nothing removed, the transfer was partial \(rerun to finish it\)$/m);
      assert.deepEqual(listing(src), ['blocked/', 'blocked/x.txt: cannot land\n', 'ok.txt: fine\n', 'z.txt: fine too\n']);
    } finally {
      if (asRoot) undoImmutable(blocked);
      else fs.chmodSync(blocked, 0o700);
    }
  });
});
