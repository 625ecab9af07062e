// rsync's --chown USER:GROUP, against rsync itself on the same tree in the same run: every
// entry gets that owner and/or group (it implies -o / -g), by name or by id, locally and on a
// push; an unknown name is refused in one line before anything moves. Owners change only as
// root (as in rsync), so the comparison runs as root.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import { CLI, syncLikeRsync, tmpdir } from './helpers/peers';

const haveRsync = spawnSync('rsync', ['--version']).status === 0;
const root = process.getuid?.() === 0;
const skip = (!haveRsync && 'rsync is not installed') || (!root && 'owners change only as root') || (process.platform === 'win32' && 'POSIX owners');

function source(src: string): void {
  fs.mkdirSync(path.join(src, 'd', 'e'), { recursive: true });
  fs.writeFileSync(path.join(src, 'a.txt'), 'a\n');
  fs.writeFileSync(path.join(src, 'd', 'e', 'b.bin'), Buffer.alloc(200_000, 2));
  fs.symlinkSync('a.txt', path.join(src, 'link'));
}

/** Every entry with its owner and group ids. */
function owners(dir: string): string[] {
  const out: string[] = [];
  const walk = (rel: string) => {
    for (const name of fs.readdirSync(path.join(dir, rel)).sort()) {
      const r = rel ? `${rel}/${name}` : name;
      const st = fs.lstatSync(path.join(dir, r));
      out.push(`${r} ${st.uid}:${st.gid}`);
      if (st.isDirectory()) walk(r);
    }
  };
  walk('');
  return out;
}

describe('--chown (against rsync)', { skip }, () => {
  for (const [flags, mode] of [
    [['-a', '--chown=nobody:nogroup'], 'local'],
    [['-r', '--chown=65534'], 'local'],
    [['-rl', '--chown=:65534'], 'local'],
    [['-a', '--chown=65534:65534'], 'push'],
  ] as const) {
    it(`sync ${flags.join(' ')} (${mode}): the owners rsync gives`, () => {
      const dir = tmpdir('ffsync-chown-');
      const result = (tool: 'ours' | 'theirs') => {
        const base = path.join(dir, tool);
        source(path.join(base, 'src'));
        const args = [...flags, `${base}/src/`, `${mode === 'push' ? 'host:' : ''}${base}/dst/`];
        const r = syncLikeRsync(dir, tool, args, { remote: mode === 'push' });
        assert.equal(r.status, 0, `${tool} ${args.join(' ')}: ${r.stderr}`);
        return owners(path.join(base, 'dst'));
      };
      const ours = result('ours');
      assert.deepEqual(ours, result('theirs'));
      assert.ok(ours.some((l) => l.includes('65534')), 'the owners changed');
    });
  }

  it('an unknown user or group: one line, exit 1, nothing written; a single file: refused', () => {
    const dir = tmpdir('ffsync-chown-bad-');
    source(path.join(dir, 'src'));
    for (const [spec, msg] of [
      ['no-such-user-here:', /^ffsync-native: error: --chown: unknown user "no-such-user-here"$/m],
      [':no-such-group-here', /^ffsync-native: error: --chown: unknown group "no-such-group-here"$/m],
    ] as const) {
      const r = spawnSync(process.execPath, [CLI, 'sync', '-a', `--chown=${spec}`, '--state-dir', path.join(dir, 'state'), path.join(dir, 'src') + '/', path.join(dir, 'dst')], { encoding: 'utf8' });
      assert.equal(r.status, 1, r.stderr);
      assert.match(r.stderr, msg);
      assert.ok(!fs.existsSync(path.join(dir, 'dst')));
    }
    const f = spawnSync(process.execPath, [CLI, 'sync', '-a', '--chown=0:0', '--state-dir', path.join(dir, 'state'), path.join(dir, 'src', 'a.txt'), path.join(dir, 'out') + '/'], { encoding: 'utf8' });
    assert.equal(f.status, 1);
    assert.match(f.stderr, /--chown applies to directory trees in this version/);
  });
});
