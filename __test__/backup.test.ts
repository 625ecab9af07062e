// rsync's -b/--backup, --suffix and --backup-dir, against rsync itself on the same trees in
// the same run: what a file replaces (small files, a large file rebuilt from chunks, a
// symlink) and what --delete removes is kept under its backup name, beside it or under the
// backup directory; older backups are protected from --delete; a single file too; locally,
// on a push and on a pull.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import { CLI, listing, seeded, syncLikeRsync, tmpdir, writeAt } from './helpers/peers';

const haveRsync = spawnSync('rsync', ['--version']).status === 0;
const skip = (!haveRsync && 'rsync is not installed') || (process.platform === 'win32' && 'POSIX symlinks and a shell stand-in for ssh');
const OLD = new Date('2020-01-01T00:00:00Z');
const NEW = new Date('2021-01-01T00:00:00Z');

/** A file with its mtime stamped (rsync compares whole seconds). */
const put = (root: string, rel: string, body: string | Buffer, time: Date) => writeAt(root, rel, body, undefined, time);

function trees(src: string, dst: string): void {
  put(src, 'a.txt', 'new\n', NEW);
  put(src, 'd/b.txt', 'new two\n', NEW);
  put(src, 'same.txt', 'same\n', OLD);
  const big = seeded(300_000, 7);
  const changed = Buffer.from(big);
  changed.fill(1, 100_000, 104_096);
  put(src, 'big.bin', changed, NEW);
  fs.symlinkSync('a.txt', path.join(src, 'link'));
  put(dst, 'a.txt', 'old\n', OLD);
  put(dst, 'd/b.txt', 'old two\n', OLD);
  put(dst, 'same.txt', 'same\n', OLD);
  put(dst, 'big.bin', big, OLD);
  fs.symlinkSync('elsewhere', path.join(dst, 'link'));
  put(dst, 'extra.txt', 'only here\n', OLD);
  put(dst, 'gone/f', 'in a directory only here\n', OLD);
  put(dst, 'older~', 'an older backup\n', OLD);
}

describe('-b / --suffix / --backup-dir (against rsync)', { skip }, () => {
  for (const [flags, mode] of [
    [['-b'], 'local'],
    [['-b', '--delete'], 'local'],
    [['-b', '--suffix=.bak', '--delete'], 'local'],
    [['--backup-dir=../bak', '--delete'], 'local'],
    [['-b', '--backup-dir=bak', '--suffix=.v1', '--delete'], 'local'],
    [['-b', '--delete'], 'push'],
    [['--backup-dir=../bak', '--delete'], 'pull'],
  ] as const) {
    it(`sync -a ${flags.join(' ')} (${mode}): the destination and its backups as rsync leaves them`, () => {
      const dir = tmpdir('ffsync-backup-');
      const result = (tool: 'ours' | 'theirs') => {
        const base = path.join(dir, tool);
        trees(path.join(base, 'src'), path.join(base, 'dst'));
        const args = ['-a', ...flags, `${mode === 'pull' ? 'host:' : ''}${base}/src/`, `${mode === 'push' ? 'host:' : ''}${base}/dst/`];
        const r = syncLikeRsync(dir, tool, args, { remote: mode !== 'local' });
        assert.equal(r.status, 0, `${tool} ${args.join(' ')}: ${r.stderr}`);
        return listing(base);
      };
      const ours = result('ours');
      assert.deepEqual(ours, result('theirs'));
      // The oracle agreeing is the point; these say the case is not vacuous.
      const bak = flags.some((f) => f.startsWith('--backup-dir'));
      assert.ok(ours.some((l) => /big\.bin(~|\.bak|\.v1)?: 300000 bytes/.test(l) && (bak ? l.includes('bak/') : /^dst\/big\.bin(~|\.bak)/.test(l))), 'the rebuilt large file has a backup');
      assert.ok(ours.includes('dst/a.txt: new\n'), 'the new version is in place');
    });
  }

  it('a single file: the one it replaces is kept as name~', () => {
    const dir = tmpdir('ffsync-backup-file-');
    put(dir, 'f.bin', seeded(200_000, 3), NEW);
    put(dir, 'out/f.bin', seeded(200_000, 4), OLD);
    const r = spawnSync(process.execPath, [CLI, 'sync', '-a', '-b', '--state-dir', path.join(dir, 'state'), path.join(dir, 'f.bin'), path.join(dir, 'out') + '/'], { encoding: 'utf8' });
    assert.equal(r.status, 0, r.stderr);
    assert.deepEqual(fs.readFileSync(path.join(dir, 'out', 'f.bin')), seeded(200_000, 3));
    assert.deepEqual(fs.readFileSync(path.join(dir, 'out', 'f.bin~')), seeded(200_000, 4));
  });

  it('refused in one line: -b with --inplace, an empty --suffix without --backup-dir', () => {
    const dir = tmpdir('ffsync-backup-usage-');
    put(dir, 'src/a', 'a', NEW);
    for (const [flags, msg] of [
      [['-b', '--inplace'], /^ffsync-native: error: -b\/--backup cannot be combined with --inplace in this version$/m],
      [['-b', '--suffix='], /^ffsync-native: error: --suffix cannot be empty without --backup-dir$/m],
    ] as const) {
      const r = spawnSync(process.execPath, [CLI, 'sync', '-a', ...flags, '--state-dir', path.join(dir, 'state'), path.join(dir, 'src') + '/', path.join(dir, 'dst')], { encoding: 'utf8' });
      assert.equal(r.status, 1, r.stderr);
      assert.match(r.stderr, msg);
      assert.ok(!fs.existsSync(path.join(dir, 'dst')), 'nothing written');
    }
  });
});
