// rsync's filter rules on `sync` (--filter with - + H S P R ! . :, -F, -FF, -C), against
// rsync itself on the same trees in the same run: the destination after the sync, --delete
// included (what a rule hides or protects is not deleted; what a sender-only rule hides
// is), locally, on a push and on a pull.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import { CLI, listing, syncLikeRsync, tmpdir, writeAt } from './helpers/peers';

const haveRsync = spawnSync('rsync', ['--version']).status === 0;
const skip = (!haveRsync && 'rsync is not installed') || (process.platform === 'win32' && 'a shell stand-in for ssh');
const OLD = new Date('2020-01-01T00:00:00Z');

/** A file with its mtime stamped (rsync compares whole seconds). */
const put = (root: string, rel: string, body: string | Buffer, time = OLD) => writeAt(root, rel, body, undefined, time);

/** A source with build outputs, CVS leftovers, merge files at two depths, and a target
 * that holds files of every kind the rules must protect, hide or delete (`cache/` only on
 * the receiver: a protect rule on a directory the sender also has protects that directory,
 * not its contents, in rsync; here everything below it, see docs/cli.md). */
function trees(base: string): void {
  const src = path.join(base, 'src');
  const dst = path.join(base, 'dst');
  for (const f of ['main.c', 'main.o', 'keep.o', 'core', 'notes~', 'secret', 'lib/a.c', 'lib/a.o', 'lib/gen/x.c', 'lib/gen/x.tmp', 'lib/sub/y.tmp', 'docs/readme', '.git/HEAD']) put(src, f, `${f}\n`);
  put(src, '.rsync-filter', '- *.o\n+ keep/\n');
  put(src, 'lib/.rsync-filter', '- /gen/\n- *.tmp\n');
  put(src, 'lib/.cvsignore', '*.tmp  *.c\n');
  put(src, 'rules.txt', '# merged rules\n- docs/\n+ *.c\n');
  for (const f of ['old.o', 'lib/old.o', 'lib/gen/stale.c', 'cache/local', 'secret', 'docs/stale', 'gone.txt']) put(dst, f, `${f} (receiver)\n`);
}

const CASES: { flags: string[]; mode?: 'push' | 'pull' }[] = [
  { flags: ['-f', '+ keep.o', '-f', '- *.o'] },
  { flags: ['-F', '--delete-after'] },
  { flags: ['-FF', '--delete-after'] },
  { flags: ['-C', '--delete'] },
  { flags: ['-f', 'P cache/', '-f', 'H secret', '--delete'] },
  { flags: ['-f', 'protect cache/', '-f', 'exclude *.tmp', '-f', 'include lib/', '--delete'] },
  { flags: ['-f', '. RULES', '--delete'] },
  { flags: ['-f', ':n- .cvsignore', '--delete'] },
  { flags: ['-f', '- *.o', '-f', '!', '-f', '- *.c'] },
  { flags: ['-F', '--delete-after'], mode: 'push' },
  { flags: ['-F', '-f', 'P cache/', '--delete-after'], mode: 'pull' },
];

describe('filter rules (against rsync)', { skip }, () => {
  for (const c of CASES) {
    it(`sync -a ${c.flags.join(' ')}${c.mode ? ` (${c.mode})` : ''}: the destination rsync leaves`, () => {
      const dir = tmpdir('ffsync-filter-');
      const result = (tool: 'ours' | 'theirs') => {
        const base = path.join(dir, tool);
        trees(base);
        const flags = c.flags.map((f) => f.replace('RULES', path.join(base, 'src', 'rules.txt')));
        const args = ['-a', ...flags, `${c.mode === 'pull' ? 'host:' : ''}${base}/src/`, `${c.mode === 'push' ? 'host:' : ''}${base}/dst/`];
        const env = { ...process.env, HOME: dir, CVSIGNORE: '' };
        const r = syncLikeRsync(dir, tool, args, { remote: Boolean(c.mode), env });
        assert.equal(r.status, 0, `${tool} ${args.join(' ')}: ${r.stderr}`);
        return listing(path.join(base, 'dst'));
      };
      assert.deepEqual(result('ours'), result('theirs'));
    });
  }

  it('refused in one line: an unknown rule, a modifier this version lacks, a merge file that is not there', () => {
    const dir = tmpdir('ffsync-filter-usage-');
    put(dir, 'src/a', 'a');
    for (const [rule, msg] of [
      ['x foo', /--filter "x foo": rule "x" is not supported/],
      ['-s foo', /--filter "-s foo": modifier "s" is not supported in this version/],
      ['. /nonexistent/rules', /--filter "\. \/nonexistent\/rules": cannot read \/nonexistent\/rules/],
    ] as const) {
      const r = spawnSync(process.execPath, [CLI, 'sync', '-a', '-f', rule, '--state-dir', path.join(dir, 'state'), path.join(dir, 'src') + '/', path.join(dir, 'dst')], { encoding: 'utf8' });
      assert.equal(r.status, 1, r.stderr);
      assert.match(r.stderr, msg);
      assert.ok(!fs.existsSync(path.join(dir, 'dst')));
    }
  });
});
