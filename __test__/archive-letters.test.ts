// The letters of -a one by one, and what each one's absence means, against rsync itself on
// the same trees in the same run: without -l symlinks are skipped with rsync's notice,
// without -t times are not kept, without -p existing entries keep their modes and new ones
// get the source's minus the umask.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import { CLI, tmpdir } from './helpers/peers';

const haveRsync = spawnSync('rsync', ['--version']).status === 0;
const skip = (!haveRsync && 'rsync is not installed') || (process.platform === 'win32' && 'POSIX modes and symlinks');
const OLD = new Date('2020-01-01T00:00:00Z');

function source(dir: string): string {
  const src = path.join(dir, 'src');
  const file = (rel: string, body: string, mode: number) => {
    fs.writeFileSync(path.join(src, rel), body);
    fs.chmodSync(path.join(src, rel), mode);
    fs.utimesSync(path.join(src, rel), OLD, OLD);
  };
  fs.mkdirSync(path.join(src, 'private', 'deep'), { recursive: true });
  fs.mkdirSync(path.join(src, 'pub'));
  file('a.txt', 'a\n', 0o640);
  file('run.sh', '#!/bin/sh\n', 0o755);
  file('private/secret', 's\n', 0o600);
  file('private/deep/c.txt', 'c\n', 0o644);
  file('pub/shared', 'shared, changed\n', 0o664);
  fs.symlinkSync('a.txt', path.join(src, 'link'));
  fs.symlinkSync('../a.txt', path.join(src, 'pub', 'up'));
  fs.chmodSync(path.join(src, 'private'), 0o700);
  for (const d of ['private/deep', 'private', 'pub', '.']) fs.utimesSync(path.join(src, d), OLD, OLD);
  return src;
}

/** What the flags decide, entry by entry: kind, content or target, mode, and whether the
 * source's time was kept (the other case is "the time of the write", which differs per tool). */
function snapshot(root: string, src: string): string[] {
  const out: string[] = [];
  const walk = (rel: string) => {
    for (const name of fs.readdirSync(path.join(root, rel)).sort()) {
      const r = rel ? `${rel}/${name}` : name;
      const st = fs.lstatSync(path.join(root, r));
      const kept = (() => {
        const s = fs.lstatSync(path.join(src, r), { throwIfNoEntry: false });
        return s ? String(s.mtimeMs === st.mtimeMs) : 'new';
      })();
      if (st.isSymbolicLink()) out.push(`${r} -> ${fs.readlinkSync(path.join(root, r))}`);
      else if (st.isDirectory()) {
        out.push(`${r}/ mode ${(st.mode & 0o7777).toString(8)} time kept ${kept}`);
        walk(r);
      } else out.push(`${r}: ${JSON.stringify(fs.readFileSync(path.join(root, r), 'utf8'))} mode ${(st.mode & 0o7777).toString(8)} time kept ${kept}`);
    }
  };
  walk('');
  return out;
}

/** An older copy already at the destination: other modes, other content, other times. */
function existing(target: string) {
  fs.mkdirSync(path.join(target, 'private'), { recursive: true });
  fs.mkdirSync(path.join(target, 'pub'));
  fs.writeFileSync(path.join(target, 'a.txt'), 'a\n');
  fs.chmodSync(path.join(target, 'a.txt'), 0o604);
  fs.writeFileSync(path.join(target, 'pub', 'shared'), 'shared, old\n');
  fs.chmodSync(path.join(target, 'pub', 'shared'), 0o600);
  fs.chmodSync(path.join(target, 'pub'), 0o750);
}

function compare(flags: string[], prepare?: (target: string) => void, alter?: (src: string) => void) {
  const dir = tmpdir('ffsync-letters-');
  const src = source(dir);
  alter?.(src);
  const ours = path.join(dir, 'ours');
  const theirs = path.join(dir, 'theirs');
  prepare?.(ours);
  prepare?.(theirs);
  const r = spawnSync(process.execPath, [CLI, 'sync', ...flags, '--state-dir', path.join(dir, 'state'), src + '/', ours], { encoding: 'utf8' });
  assert.equal(r.status, 0, `sync ${flags.join(' ')}: ${r.stderr}`);
  const rs = spawnSync('rsync', [...flags, src + '/', theirs], { encoding: 'utf8' });
  assert.equal(rs.status, 0, `rsync ${flags.join(' ')}: ${rs.stderr}`);
  assert.deepEqual(snapshot(ours, src), snapshot(theirs, src), `sync ${flags.join(' ')} vs rsync ${flags.join(' ')}`);
  // rsync's notices (skipped symlinks) on stdout, the same lines.
  assert.deepEqual(r.stdout.split('\n').filter(Boolean).sort(), rs.stdout.split('\n').filter(Boolean).sort(), `stdout of ${flags.join(' ')}`);
  return { ours: snapshot(ours, src), stdout: r.stdout };
}

const LETTERS = [['-r'], ['-rl'], ['-rt'], ['-rp'], ['-rlt'], ['-rlp'], ['-rpt'], ['-rlpt'], ['-rlptD'], ['-a']];

describe('the letters of -a, and their absence, as rsync', { skip }, () => {
  it('into an empty destination', () => {
    for (const flags of LETTERS) compare(flags);
    const bare = compare(['-r']);
    assert.match(bare.stdout, /^skipping non-regular file "link"$/m);
    assert.ok(!bare.ours.some((l) => l.includes(' -> ')), 'no symlink without -l');
    assert.ok(bare.ours.some((l) => l.startsWith('private/ mode 700')), 'a new directory: the source mode minus the umask');
    assert.ok(bare.ours.every((l) => !l.includes('time kept true')), 'no time kept without -t');
  });

  it('over an older copy with other modes: without -p existing entries keep theirs', () => {
    for (const flags of LETTERS) compare(flags, existing);
    const bare = compare(['-rt'], existing);
    assert.ok(bare.ours.includes('pub/shared: "shared, changed\\n" mode 600 time kept true'), bare.ours.join('\n'));
    assert.ok(bare.ours.includes('pub/ mode 750 time kept true'), bare.ours.join('\n'));
  });

  it('a second run with nothing changed writes nothing and says nothing, whatever the letters', () => {
    const dir = tmpdir('ffsync-letters-');
    const src = source(dir);
    const ours = path.join(dir, 'ours');
    for (const flags of [['-r'], ['-rl'], ['-rp']]) {
      const args = [CLI, 'sync', ...flags, '-i', '--state-dir', path.join(dir, 'state'), src + '/', ours];
      assert.equal(spawnSync(process.execPath, args, { encoding: 'utf8' }).status, 0);
      const before = snapshot(ours, src);
      const again = spawnSync(process.execPath, args, { encoding: 'utf8' });
      assert.equal(again.status, 0, again.stderr);
      assert.deepEqual(again.stdout.split('\n').filter((l) => l && !l.startsWith('skipping non-regular file')), [], `${flags}: ${again.stdout}`);
      assert.deepEqual(snapshot(ours, src), before);
      fs.rmSync(ours, { recursive: true });
    }
  });

  it('special files are skipped with rsync\'s notice and exit 0, as rsync does without -D', () => {
    const dir = tmpdir('ffsync-letters-');
    const src = source(dir);
    const made = spawnSync('mkfifo', [path.join(src, 'pub', 'pipe')]);
    assert.equal(made.status, 0, 'mkfifo');
    const r = spawnSync(process.execPath, [CLI, 'sync', '-rlpt', '--state-dir', path.join(dir, 'state'), src + '/', path.join(dir, 'o2')], { encoding: 'utf8' });
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stdout, /^skipping non-regular file "pub\/pipe"$/m);
    const rs = spawnSync('rsync', ['-rlpt', src + '/', path.join(dir, 't2')], { encoding: 'utf8' });
    assert.equal(rs.status, 0);
    assert.match(rs.stdout, /^skipping non-regular file "pub\/pipe"$/m);
  });
});

describe('--size-only, --ignore-existing, --existing as rsync', { skip }, () => {
  /** An older copy: one file of the same size with other bytes, one with another size, other modes and times. */
  function older(target: string) {
    existing(target);
    fs.writeFileSync(path.join(target, 'run.sh'), '#!/bin/zz\n'); // same size as the source's, other bytes
    fs.chmodSync(path.join(target, 'run.sh'), 0o700);
    fs.utimesSync(path.join(target, 'run.sh'), OLD, OLD);
  }

  it('each one, with -a and -i: the same tree and the same itemized lines as rsync', () => {
    for (const choice of ['--size-only', '--ignore-existing', '--existing']) {
      const got = compare(['-ai', choice], older);
      const file = (p: string) => got.ours.find((l) => l.startsWith(`${p}:`)) ?? `${p}: absent`;
      if (choice === '--size-only') assert.match(file('run.sh'), /"#!\/bin\/zz\\n" mode 755/, 'same size: bytes kept, attributes brought over');
      if (choice === '--ignore-existing') {
        assert.match(file('pub/shared'), /"shared, old\\n" mode 600/, 'an existing file stays as it was');
        assert.match(file('private/secret'), /"s\\n"/, 'a new file is created');
      }
      if (choice === '--existing') {
        assert.match(file('pub/shared'), /"shared, changed\\n"/, 'an existing file is updated');
        assert.equal(file('private/secret'), 'private/secret: absent', 'nothing new is created');
      }
    }
  });

  it('--delete-excluded (which implies --delete): what the excludes hide on DEST goes too, the same lines as rsync', () => {
    const extra = (target: string) => {
      older(target);
      for (const rel of ['notes.log', 'private/old.log', 'stale']) {
        fs.mkdirSync(path.dirname(path.join(target, rel)), { recursive: true });
        fs.writeFileSync(path.join(target, rel), 'x\n');
      }
      for (const d of ['private', 'pub', '.']) fs.utimesSync(path.join(target, d), OLD, OLD);
    };
    const got = compare(['-ai', '--delete-excluded', '--exclude', '*.log'], extra);
    assert.ok(!got.ours.some((l) => /\.log|stale/.test(l)), got.ours.join('\n'));
    assert.match(got.stdout, /^\*deleting {3}private\/old\.log$/m);
  });

  it('--chmod rules change the modes sent exactly as rsync applies them, into an empty DEST and over an older copy', () => {
    for (const rule of ['Du=rwx,Dgo=rx,Fu=rw,Fgo=r', 'u+x,u-w', 'g-w,o=', 'F644,D755', 'a+X', 'ug=rwX,Do+t']) {
      compare(['-a', '--chmod', rule]);
      compare(['-ai', '--chmod', rule], older);
    }
    const dir = tmpdir('ffsync-letters-');
    const src = source(dir);
    const r = spawnSync(process.execPath, [CLI, 'sync', '-a', '--chmod', 'u+q', '--state-dir', path.join(dir, 'state'), src + '/', path.join(dir, 'out')], { encoding: 'utf8' });
    assert.equal(r.status, 1);
    assert.match(r.stderr, /^ffsync-native: error: --chmod: cannot parse 'u\+q'/);
  });

  it('-m prunes directories with no file below them (after the excludes), and with --delete their DEST copies go', () => {
    const empties = (src: string) => {
      for (const d of ['empty/chain/deep', 'logs-only', 'pub/nothing']) fs.mkdirSync(path.join(src, d), { recursive: true });
      fs.writeFileSync(path.join(src, 'logs-only', 'x.log'), 'x\n');
      for (const d of ['empty/chain/deep', 'empty/chain', 'empty', 'logs-only', 'pub/nothing', 'pub', '.']) fs.utimesSync(path.join(src, d), OLD, OLD);
    };
    const stale = (target: string) => {
      older(target);
      fs.mkdirSync(path.join(target, 'empty', 'chain'), { recursive: true });
      for (const d of ['empty/chain', 'empty', 'pub', '.']) fs.utimesSync(path.join(target, d), OLD, OLD);
    };
    const got = compare(['-ai', '-m', '--delete', '--exclude', '*.log'], stale, empties);
    assert.ok(!got.ours.some((l) => /^(empty|logs-only|pub\/nothing)/.test(l)), got.ours.join('\n'));
    assert.match(got.stdout, /^\*deleting {3}empty\/$/m);
    compare(['-a', '--prune-empty-dirs'], undefined, empties);
  });

  it('on a single file they are refused in one line (exit 1), like -n', () => {
    const dir = tmpdir('ffsync-letters-');
    const src = source(dir);
    for (const choice of ['--size-only', '--ignore-existing', '--existing']) {
      const r = spawnSync(process.execPath, [CLI, 'sync', '-a', choice, '--state-dir', path.join(dir, 'state'), path.join(src, 'a.txt'), path.join(dir, 'one.txt')], { encoding: 'utf8' });
      assert.equal(r.status, 1, r.stderr);
      assert.match(r.stderr, new RegExp(`^ffsync-native: error: ${choice} applies to directory trees in this version`));
    }
  });
});
