// rsync's -L/--copy-links, against rsync itself on the same tree in the same run: a symlink
// is sent as what it points to (a small or large file, a directory that is entered, a file
// outside the tree); a dangling one is rsync's "symlink has no referent" (exit 23, the rest
// synced); a link back to an ancestor does not loop. Locally, on a push and on a pull.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import { CLI, listing, seeded, syncLikeRsync, tmpdir, writeAt } from './helpers/peers';

const haveRsync = spawnSync('rsync', ['--version']).status === 0;
const skip = (!haveRsync && 'rsync is not installed') || (process.platform === 'win32' && 'POSIX symlinks and a shell stand-in for ssh');
const OLD = new Date('2020-01-01T00:00:00Z');

/** A file with its mtime stamped (rsync compares whole seconds). */
const put = (root: string, rel: string, body: string | Buffer, time = OLD) => writeAt(root, rel, body, undefined, time);

/** A tree whose links point at a small file, a large one, a directory, and a file outside. */
function source(base: string): string {
  const src = path.join(base, 'src');
  put(src, 'real/small.txt', 'small\n');
  put(src, 'real/big.bin', seeded(300_000, 5));
  put(src, 'real/sub/deep.txt', 'deep\n');
  put(base, 'outside.txt', 'from outside the tree\n');
  fs.symlinkSync('real/small.txt', path.join(src, 'to-small'));
  fs.symlinkSync('real/big.bin', path.join(src, 'to-big'));
  fs.symlinkSync('real', path.join(src, 'to-dir'));
  fs.symlinkSync('../outside.txt', path.join(src, 'to-outside'));
  return src;
}

describe('-L / --copy-links (against rsync)', { skip }, () => {
  for (const mode of ['local', 'push', 'pull'] as const) {
    it(`sync -aL (${mode}): links become what they point to, as rsync makes them`, () => {
      const dir = tmpdir('ffsync-copylinks-');
      const result = (tool: 'ours' | 'theirs') => {
        const base = path.join(dir, tool);
        const src = source(base);
        const dst = path.join(base, 'dst');
        const args = ['-aL', `${mode === 'pull' ? 'host:' : ''}${src}/`, `${mode === 'push' ? 'host:' : ''}${dst}/`];
        const r = syncLikeRsync(dir, tool, args, { remote: mode !== 'local' });
        assert.equal(r.status, 0, `${tool} ${args.join(' ')}: ${r.stderr}`);
        return listing(dst);
      };
      const ours = result('ours');
      assert.deepEqual(ours, result('theirs'));
      assert.ok(ours.includes('to-dir/sub/deep.txt: deep\n'), 'a linked directory is entered');
      assert.ok(ours.includes('to-outside: from outside the tree\n'), 'a file outside the tree comes as a file');
      assert.ok(!ours.some((l) => l.includes(' -> ')), 'no symlink is left');
    });
  }

  it('a dangling link: rsync\'s "symlink has no referent", exit 23, the rest synced', () => {
    const dir = tmpdir('ffsync-copylinks-dangling-');
    const src = source(dir);
    fs.symlinkSync('nowhere', path.join(src, 'dangling'));
    const run = (tool: 'ours' | 'theirs') => syncLikeRsync(dir, tool, ['-aL', `${src}/`, path.join(dir, tool) + '/']);
    const [ours, theirs] = [run('ours'), run('theirs')];
    assert.equal(ours.status, 23, ours.stderr);
    assert.equal(theirs.status, 23, theirs.stderr);
    for (const r of [ours, theirs]) assert.match(r.stderr, /symlink has no referent: "[^"]*dangling"/);
    assert.deepEqual(listing(path.join(dir, 'ours')), listing(path.join(dir, 'theirs')), 'the rest synced, as rsync syncs it');
  });

  it('a link back to an ancestor is not followed around: exit 23, the rest synced, no hang', () => {
    const dir = tmpdir('ffsync-copylinks-loop-');
    const src = source(dir);
    fs.symlinkSync('..', path.join(src, 'real', 'sub', 'up'));
    const r = spawnSync(process.execPath, [CLI, 'sync', '-aL', '--state-dir', path.join(dir, 'state'), `${src}/`, path.join(dir, 'out') + '/'], { encoding: 'utf8', timeout: 60_000 });
    assert.equal(r.status, 23, r.stderr);
    assert.match(r.stderr, /loop/);
    const got = listing(path.join(dir, 'out'));
    assert.ok(got.includes('real/sub/deep.txt: deep\n') && got.includes('to-dir/sub/deep.txt: deep\n'), got.join('\n'));
  });
});
