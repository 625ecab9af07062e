// rsync's --max-delete, against rsync itself on the same trees in the same run: at most N
// deletions, the rest left in place, rsync's line `Deletions stopped due to --max-delete limit
// (N skipped)` and exit 25 (a directory left non-empty is not counted, as rsync counts); 0
// deletes nothing; a limit above the count changes nothing.
// Locally, on a push and on a pull (the receiving side applies it either way).
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import { listing, syncLikeRsync, tmpdir } from './helpers/peers';

const haveRsync = spawnSync('rsync', ['--version']).status === 0;
const skip = (!haveRsync && 'rsync is not installed') || (process.platform === 'win32' && 'a shell stand-in for ssh');

function trees(src: string, dst: string): void {
  fs.mkdirSync(src, { recursive: true });
  fs.writeFileSync(path.join(src, 'keep.txt'), 'new\n');
  fs.mkdirSync(path.join(dst, 'olddir'), { recursive: true });
  for (let i = 0; i < 5; i++) fs.writeFileSync(path.join(dst, `old${i}.txt`), 'x\n');
  fs.writeFileSync(path.join(dst, 'olddir', 'a'), 'a\n');
  fs.writeFileSync(path.join(dst, 'olddir', 'b'), 'b\n');
}

describe('--max-delete (against rsync)', { skip }, () => {
  for (const [limit, mode] of [
    [3, 'local'],
    [0, 'local'],
    [100, 'local'],
    [2, 'push'],
    [4, 'pull'],
  ] as const) {
    it(`sync -a --delete --max-delete=${limit} (${mode}): the tree, the line and the exit code rsync gives`, () => {
      const dir = tmpdir('ffsync-maxdel-');
      const results = (['ours', 'theirs'] as const).map((tool) => {
        const src = path.join(dir, tool, 'src');
        const dst = path.join(dir, tool, 'dst');
        trees(src, dst);
        const args = ['-a', '--delete', `--max-delete=${limit}`, '-i', `${mode === 'pull' ? 'host:' : ''}${src}/`, `${mode === 'push' ? 'host:' : ''}${dst}/`];
        const r = syncLikeRsync(dir, tool, args, { remote: mode !== 'local' });
        const stopped = /Deletions stopped due to --max-delete limit \((\d+) skipped\)/.exec(r.stderr + r.stdout);
        return { code: r.status, tree: listing(dst), skipped: stopped ? Number(stopped[1]) : 0, deleting: r.stdout.split('\n').filter((l) => l.startsWith('*deleting')).sort(), stderr: r.stderr };
      });
      const [ours, theirs] = results;
      assert.equal(ours.code, theirs.code, `exit code (rsync ${theirs.code}): ${ours.stderr}`);
      assert.equal(ours.code, limit < 8 ? 25 : 0);
      assert.deepEqual(ours.tree, theirs.tree, 'the destination after the sync');
      assert.equal(ours.skipped, theirs.skipped, 'the skipped count in the line');
      assert.equal(ours.skipped > 0, limit < 8, 'a line exactly when deletions were left');
      if (mode !== 'push') assert.deepEqual(ours.deleting, theirs.deleting, 'the deletions listed (-i)');
      assert.ok(ours.tree.includes('keep.txt: new\n'), 'the transfer itself is not limited');
    });
  }
});
