// `sync -i/--itemize-changes`: rsync's 11-character codes, compared line for line with
// rsync itself on the same trees in the same run (rsync is the oracle for the format).
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import { CLI, tmpdir } from './helpers/peers';

const haveRsync = spawnSync('rsync', ['--version']).status === 0;
const POSIX = process.platform !== 'win32';

const T = (iso: string) => new Date(iso);

function write(root: string, rel: string, body: string, when = '2020-01-01T00:00:00Z', mode?: number) {
  const p = path.join(root, rel);
  fs.mkdirSync(path.dirname(p), { recursive: true });
  fs.writeFileSync(p, body);
  if (mode !== undefined) fs.chmodSync(p, mode);
  fs.utimesSync(p, T(when), T(when));
}

function link(root: string, rel: string, target: string, when = '2020-01-01T00:00:00Z') {
  const p = path.join(root, rel);
  fs.rmSync(p, { force: true, recursive: true });
  fs.symlinkSync(target, p);
  // Whole seconds, set explicitly: two links made in the same second compare equal in time.
  fs.lutimesSync(p, T(when), T(when));
}

function stampDir(root: string, rel: string, when = '2020-01-01T00:00:00Z') {
  fs.utimesSync(path.join(root, rel), T(when), T(when));
}

/** Both tools' -i lines, sorted (rsync interleaves deletions by directory), DEST names blanked. */
function both(args: string[], src: string, theirs: string, ours: string, state: string, sorted = true): { rsync: string[]; ours: string[] } {
  const r = spawnSync('rsync', [...args, src, theirs], { encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  const o = spawnSync(process.execPath, [CLI, 'sync', ...args, '--state-dir', state, src, ours], { encoding: 'utf8' });
  assert.equal(o.status, 0, o.stderr);
  const norm = (out: string, dest: string) =>
    out
      .split('\n')
      .filter(Boolean)
      .map((l) => l.replace(`created directory ${dest.replace(/\/$/, '')}`, 'created directory DEST'))
      .sort(sorted ? undefined : () => 0);
  return { rsync: norm(r.stdout, theirs), ours: norm(o.stdout, ours) };
}

describe('sync -i: rsync itemized changes', { skip: (!haveRsync && 'rsync is not installed') || (!POSIX && 'POSIX modes and symlinks') }, () => {
  function fixture() {
    const dir = tmpdir('ffsync-itemize-');
    const src = path.join(dir, 'src');
    write(src, 'a', 'hello\n');
    write(src, 'b', 'world\n');
    write(src, 'c', 'same\n', undefined, 0o644);
    write(src, 'e/f', 'x\n');
    fs.mkdirSync(path.join(src, 'd'));
    link(src, 'd/l', '../a');
    link(src, 'm', 'old-target');
    for (const d of ['d', 'e', '.']) stampDir(src, d);
    return { dir, src, state: path.join(dir, 'state') };
  }

  it('first sync into a missing DEST, with and without the trailing slash on SRC: the same lines as rsync', () => {
    const { dir, src, state } = fixture();
    for (const [s, name] of [[src + '/', 'contents'], [src, 'named']]) {
      const got = both(['-ai'], s, path.join(dir, `r-${name}`), path.join(dir, `o-${name}`), state);
      assert.deepEqual(got.ours, got.rsync, `${s}`);
      assert.ok(got.ours.includes('created directory DEST'));
      assert.ok(got.ours.includes(name === 'contents' ? 'cd+++++++++ ./' : 'cd+++++++++ src/'), got.ours.join('\n'));
    }
  });

  it('changes of every kind rsync itemizes: size and time, time, permissions, a retargeted symlink, new and deleted entries, a file that became a directory', () => {
    const { dir, src, state } = fixture();
    const theirs = path.join(dir, 'theirs');
    const ours = path.join(dir, 'ours');
    both(['-a'], src + '/', theirs, ours, state);
    write(src, 'a', 'hello, longer\n', '2021-01-01T00:00:00Z'); // size and time
    write(src, 'b', 'WORLD\n', '2021-06-01T00:00:00Z'); // same size, new time
    fs.chmodSync(path.join(src, 'c'), 0o600); // permissions only
    link(src, 'm', 'new-target', '2021-01-01T00:00:00Z'); // symlink retargeted (and a new time)
    write(src, 'nd/z', 'z\n'); // new directory with a file
    fs.rmSync(path.join(src, 'e'), { recursive: true }); // a directory goes
    fs.rmSync(path.join(src, 'b'));
    write(src, 'b/inner', 'now a dir\n'); // file -> directory
    stampDir(src, 'd', '2019-01-01T00:00:00Z'); // a directory's own time
    for (const d of ['nd', 'b', '.']) stampDir(src, d);
    const got = both(['-ai', '--delete'], src + '/', theirs, ours, state);
    assert.deepEqual(got.ours, got.rsync);
    for (const want of ['>f.st...... a', '.f...p..... c', 'cLc.t...... m -> new-target', 'cd+++++++++ nd/', '*deleting   e/', '.d..t...... d/']) {
      assert.ok(got.ours.includes(want), `missing ${want}:\n${got.ours.join('\n')}`);
    }
    // Nothing left to do: neither lists anything.
    const again = both(['-ai', '--delete'], src + '/', theirs, ours, state);
    assert.deepEqual(again, { rsync: [], ours: [] });
  });

  it('-n -i lists the same lines and writes nothing; -vi adds rsync\'s header and closing lines around them', () => {
    const { dir, src, state } = fixture();
    const theirs = path.join(dir, 'theirs');
    const ours = path.join(dir, 'ours');
    both(['-a'], src + '/', theirs, ours, state);
    write(src, 'a', 'changed\n', '2022-01-01T00:00:00Z');
    stampDir(src, '.');
    const dry = both(['-ain'], src + '/', theirs, ours, state);
    assert.deepEqual(dry.ours, dry.rsync);
    assert.equal(fs.readFileSync(path.join(ours, 'a'), 'utf8'), 'hello\n');
    const o = spawnSync(process.execPath, [CLI, 'sync', '-avi', '--state-dir', state, src + '/', ours], { encoding: 'utf8' });
    const lines = o.stdout.split('\n');
    assert.equal(lines[0], 'sending incremental file list');
    assert.ok(lines.includes('>f.st...... a'), o.stdout);
    assert.match(o.stdout, /\nsent [\d,]+ bytes {2}received [\d,]+ bytes {2}[\d,.]+ bytes\/sec\ntotal size is [\d,]+ {2}speedup is [\d.]+\n$/);
  });

  it('content that changed under the same size and time: rsync leaves it stale and lists nothing; ours lists it as a checksum change and fixes it', () => {
    const { dir, src, state } = fixture();
    const theirs = path.join(dir, 'theirs');
    const ours = path.join(dir, 'ours');
    both(['-a'], src + '/', theirs, ours, state);
    // Our receiver's index needs one sync to cover the tree (see docs/cli.md "Unchanged is decided by content where it can be").
    both(['-a'], src + '/', theirs, ours, state);
    write(src, 'a', 'HELLO\n'); // same size, same time
    const got = both(['-ai'], src + '/', theirs, ours, state);
    assert.deepEqual(got.rsync, []);
    assert.deepEqual(got.ours, ['>fc........ a']);
    assert.equal(fs.readFileSync(path.join(theirs, 'a'), 'utf8'), 'hello\n', 'rsync left the stale copy');
    assert.equal(fs.readFileSync(path.join(ours, 'a'), 'utf8'), 'HELLO\n');
  });

  it('lines come in rsync\'s order (a directory, then what is in it); deletions last, as they happen here', () => {
    const { dir, src, state } = fixture();
    const theirs = path.join(dir, 'theirs');
    const ours = path.join(dir, 'ours');
    const first = both(['-ai'], src + '/', theirs, ours, state, false);
    assert.deepEqual(first.ours, first.rsync);
    write(src, 'e/g', 'new\n');
    write(src, 'a', 'grown, and newer\n', '2023-01-01T00:00:00Z');
    fs.rmSync(path.join(src, 'b'));
    for (const d of ['e', '.']) stampDir(src, d);
    const got = both(['-ai', '--delete'], src + '/', theirs, ours, state, false);
    const kept = (l: string[]) => l.filter((x) => !x.startsWith('*deleting'));
    assert.deepEqual(kept(got.ours), kept(got.rsync));
    assert.deepEqual(got.ours.slice(-1), ['*deleting   b']);
  });

  it('--log-file: rsync\'s stamped lines (building file list, the itemized changes, the totals), appended', () => {
    const { dir, src, state } = fixture();
    const logs = { ours: path.join(dir, 'ours.log'), theirs: path.join(dir, 'theirs.log') };
    const r = spawnSync('rsync', ['-a', `--log-file=${logs.theirs}`, src + '/', path.join(dir, 'theirs')], { encoding: 'utf8' });
    assert.equal(r.status, 0, r.stderr);
    for (let i = 0; i < 2; i++) {
      const o = spawnSync(process.execPath, [CLI, 'sync', '-a', `--log-file=${logs.ours}`, '--state-dir', state, src + '/', path.join(dir, 'ours')], { encoding: 'utf8' });
      assert.equal(o.status, 0, o.stderr);
      assert.equal(o.stdout, '', 'the log is not printed');
    }
    const stamp = /^\d{4}\/\d\d\/\d\d \d\d:\d\d:\d\d \[\d+\] /;
    const ours = fs.readFileSync(logs.ours, 'utf8').trim().split('\n');
    const theirs = fs.readFileSync(logs.theirs, 'utf8').trim().split('\n');
    for (const l of [...ours, ...theirs]) assert.match(l, stamp);
    const body = (l: string[]) => l.map((x) => x.replace(stamp, '')).map((x) => x.replace(/^sent [\d,]+ bytes {2}received [\d,]+ bytes {2}total size [\d,]+$/, 'TOTALS'));
    const firstRun = body(ours).slice(0, theirs.length);
    assert.deepEqual(firstRun, body(theirs));
    assert.deepEqual(body(ours).slice(theirs.length), ['building file list', 'TOTALS'], 'the second run appends, with nothing to do');
  });

  it('a reader that closes stdout early (| head) does not crash the sync: it finishes and exits 0', () => {
    const { dir, src, state } = fixture();
    for (let i = 0; i < 300; i++) write(src, `many/f${i}`, `${i}\n`);
    const out = path.join(dir, 'piped');
    const r = spawnSync('bash', ['-c', `node ${JSON.stringify(CLI)} sync -ai --state-dir ${JSON.stringify(state)} ${JSON.stringify(src + '/')} ${JSON.stringify(out)} | head -1; echo "rc=\${PIPESTATUS[0]}"`], { encoding: 'utf8' });
    assert.match(r.stdout, /^created directory .*\nrc=0\n$/);
    assert.doesNotMatch(r.stderr, /EPIPE|at /);
    assert.equal(fs.readdirSync(path.join(out, 'many')).length, 300);
  });
});
