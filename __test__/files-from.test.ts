// rsync's --files-from (and -0/--from0), against rsync itself on the same tree in the same
// run: only the listed paths and the directories on the way to them; -a does not imply -r,
// an explicit -r sends what is below a listed directory; excludes still apply; the list from
// a file, from stdin, NUL-separated; locally, on a push and on a pull. A listed path that does
// not exist is exit 23 with rsync's link_stat line; --delete with it is refused in one line.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import { CLI, listing, syncLikeRsync, tmpdir } from './helpers/peers';

const haveRsync = spawnSync('rsync', ['--version']).status === 0;
const skip = (!haveRsync && 'rsync is not installed') || (process.platform === 'win32' && 'a shell stand-in for ssh');

function source(src: string): void {
  for (const f of ['a/b/c.txt', 'a/other.txt', 'd/x.txt', 'd/e/y.txt', 'z/q.txt', 'top.txt']) {
    fs.mkdirSync(path.dirname(path.join(src, f)), { recursive: true });
    fs.writeFileSync(path.join(src, f), `${f}\n`);
  }
}

describe('--files-from (against rsync)', { skip }, () => {
  const LIST = 'a/b/c.txt\n./d/\n/top.txt\n';
  for (const c of [
    { flags: ['-a'] },
    { flags: ['-ar'] },
    { flags: ['-ar', '--exclude', 'y.txt'] },
    { flags: ['-a', '--from0'], list: 'a/b/c.txt\0d\0top.txt\0' },
    { flags: ['-ar'], mode: 'push' as const },
    { flags: ['-ar'], mode: 'pull' as const },
  ]) {
    it(`sync ${c.flags.join(' ')} --files-from${c.mode ? ` (${c.mode})` : ''}: the paths rsync sends`, () => {
      const dir = tmpdir('ffsync-filesfrom-');
      const list = path.join(dir, 'list');
      fs.writeFileSync(list, c.list ?? LIST);
      const result = (tool: 'ours' | 'theirs') => {
        const base = path.join(dir, tool);
        source(path.join(base, 'src'));
        const args = [...c.flags, `--files-from=${list}`, `${c.mode === 'pull' ? 'host:' : ''}${base}/src`, `${c.mode === 'push' ? 'host:' : ''}${base}/dst/`];
        const r = syncLikeRsync(dir, tool, args, { remote: Boolean(c.mode) });
        assert.equal(r.status, 0, `${tool} ${args.join(' ')}: ${r.stderr}`);
        return listing(path.join(base, 'dst'));
      };
      const ours = result('ours');
      assert.deepEqual(ours, result('theirs'));
      assert.ok(ours.includes('a/b/c.txt: a/b/c.txt\n') && !ours.some((l) => l.startsWith('z')), 'only what is listed');
    });
  }

  it('the list on stdin (`-`)', () => {
    const dir = tmpdir('ffsync-filesfrom-stdin-');
    source(path.join(dir, 'src'));
    const r = spawnSync(process.execPath, [CLI, 'sync', '-a', '--files-from=-', '--state-dir', path.join(dir, 'state'), path.join(dir, 'src'), path.join(dir, 'dst') + '/'], { input: 'top.txt\nd/x.txt\n', encoding: 'utf8' });
    assert.equal(r.status, 0, r.stderr);
    assert.deepEqual(listing(path.join(dir, 'dst')), ['d/', 'd/x.txt: d/x.txt\n', 'top.txt: top.txt\n']);
  });

  it("a listed path that does not exist: rsync's link_stat line and exit 23, the rest synced; --delete refused", () => {
    const dir = tmpdir('ffsync-filesfrom-missing-');
    source(path.join(dir, 'src'));
    const list = path.join(dir, 'list');
    fs.writeFileSync(list, 'top.txt\nmissing.txt\n');
    const r = spawnSync(process.execPath, [CLI, 'sync', '-a', `--files-from=${list}`, '--state-dir', path.join(dir, 'state'), path.join(dir, 'src'), path.join(dir, 'dst') + '/'], { encoding: 'utf8' });
    assert.equal(r.status, 23, r.stderr);
    assert.match(r.stderr, /link_stat "missing\.txt" failed: No such file or directory/);
    assert.deepEqual(listing(path.join(dir, 'dst')), ['top.txt: top.txt\n']);
    const d = spawnSync(process.execPath, [CLI, 'sync', '-a', '--delete', `--files-from=${list}`, '--state-dir', path.join(dir, 'state'), path.join(dir, 'src'), path.join(dir, 'dst2') + '/'], { encoding: 'utf8' });
    assert.equal(d.status, 1);
    assert.match(d.stderr, /^ffsync-native: error: --delete with --files-from is not supported in this version$/m);
  });
});
