// A user with no home directory: no HOME, and no entry in the user database (a container run as
// an arbitrary uid, as OpenShift does): `os.homedir()` throws there. The CLI runs without its code
// cache (ts/cli/code-cache.ts), and a command that keeps state says in one line what to set.
// Run as root (to start the CLI as uid 54321), from a copy that user can read.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { it } from 'node:test';
import { copyOfCli, tmpdir } from './helpers/peers';

it('a user with no home (no HOME, not in the user database: a container run as an arbitrary uid) runs without one', { skip: process.getuid?.() !== 0 && 'needs root (to run as another uid)' }, () => {
  const env = { ...process.env };
  for (const v of ['HOME', 'XDG_CACHE_HOME', 'NODE_COMPILE_CACHE', 'NODE_DISABLE_COMPILE_CACHE']) delete env[v];
  // A copy that user can read (the checkout may be under root's 0700 home); uid 54321 is in
  // no passwd.
  const r = spawnSync(process.execPath, [copyOfCli(tmpdir()), '--version'], { uid: 54321, gid: 54321, env, encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stdout, /^\d+\.\d+\.\d+/);
});

it('a user with no home: commands that keep state say to set FFSYNC_STATE_DIR, in one line (exit 1)', { skip: process.getuid?.() !== 0 && 'needs root (to run as another uid)' }, () => {
  const env = { ...process.env };
  for (const v of ['HOME', 'XDG_STATE_HOME', 'FFSYNC_STATE_DIR', 'XDG_CACHE_HOME', 'NODE_COMPILE_CACHE']) delete env[v];
  // A copy of the build that uid 54321 (in no passwd) can read: the CLI and the addon.
  const r = spawnSync(process.execPath, [copyOfCli(tmpdir(), { addon: true }), 'id'], { uid: 54321, gid: 54321, env, encoding: 'utf8' });
  assert.equal(r.status, 1, r.stderr);
  assert.match(r.stderr, /^ffsync-native: error: no home directory to keep state in .*set FFSYNC_STATE_DIR or pass --state-dir\n$/);
});

it('a user with no home: `sync -C` (rsync\'s CVS rules, which read ~/.cvsignore) runs, with the built-in rules', { skip: process.getuid?.() !== 0 && 'needs root (to run as another uid)' }, () => {
  const env = { ...process.env };
  for (const v of ['HOME', 'XDG_STATE_HOME', 'FFSYNC_STATE_DIR', 'XDG_CACHE_HOME', 'NODE_COMPILE_CACHE']) delete env[v];
  const root = tmpdir();
  const cli = copyOfCli(path.join(root, 'cli'), { addon: true });
  // Where that user may read and write.
  const work = path.join(root, 'work');
  fs.mkdirSync(path.join(work, 'src'), { recursive: true });
  fs.writeFileSync(path.join(work, 'src', 'keep.txt'), 'kept\n');
  fs.writeFileSync(path.join(work, 'src', 'x.o'), 'object\n');
  fs.chmodSync(root, 0o755);
  fs.chownSync(work, 54321, 54321);
  fs.chownSync(path.join(work, 'src'), 54321, 54321);
  const r = spawnSync(process.execPath, [cli, 'sync', '-aC', '--state-dir', path.join(work, 'state'), `${path.join(work, 'src')}/`, `${path.join(work, 'dst')}/`], { uid: 54321, gid: 54321, env, encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  assert.deepEqual(fs.readdirSync(path.join(work, 'dst')), ['keep.txt'], 'the CVS rules left out x.o');
});
