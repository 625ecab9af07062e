// rsync's --partial-dir DIR on `sync` (crates/ffsync_core/src/restore/partial_dir.rs): a partial that an
// interrupted attempt keeps waits in DIR (beside its file for a relative DIR, in DIR itself for
// an absolute one) instead of beside the file; the next attempt takes it back and resumes from
// it; a relative DIR left empty goes, and a relative DIR is neither sent nor deleted, as the
// rule rsync adds (`-p DIR/`) makes it. rsync is the oracle for the rule, on the same trees in
// the same run, locally and through an ssh stand-in.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import { blocksPresent, CLI, listing, mostBlocksInPartials, partials, remoteArgs, seeded, sha256, syncLikeRsync, T0, tmpdir, writeAt } from './helpers/peers';

const MiB = 1024 * 1024;
const hasRsync = (() => {
  try {
    return syncLikeRsync(tmpdir(), 'theirs', ['--version']).status === 0;
  } catch {
    return false;
  }
})();

/** Until `pred` holds (polled), or fail after `ms`. */
async function until(pred: () => boolean, ms: number, what: string): Promise<void> {
  const t0 = Date.now();
  while (!pred()) {
    if (Date.now() - t0 > ms) assert.fail(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** Start `sync ARGS` (ours), optionally through the ssh stand-in; resolves with its exit. */
function startSync(dir: string, args: string[], remote = false) {
  const child = spawn(process.execPath, [CLI, 'sync', '--state-dir', path.join(dir, 'state'), ...(remote ? remoteArgs(dir) : []), ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stderr = '';
  child.stderr!.on('data', (d: Buffer) => (stderr += d));
  const done = new Promise<{ code: number | null; stderr: string }>((resolve) => child.on('close', (code) => resolve({ code, stderr })));
  return { child, done };
}

/** The `.ffsync-part` files directly in `dir` (not below it). */
const partsIn = (dir: string) => (fs.existsSync(dir) ? fs.readdirSync(dir).filter((n) => n.endsWith('.ffsync-part')) : []);

describe('--partial-dir: where an interrupted attempt keeps its partial, and the resume', { timeout: 120_000 }, () => {
  for (const remote of [false, true]) {
    it(`${remote ? 'push through ssh' : 'local'}: the kept partial waits in DEST/sub/.rsync-partial, the rerun resumes from it, and the emptied directory goes`, async () => {
      const dir = tmpdir();
      const src = path.join(dir, 'src');
      const dst = path.join(dir, 'dst');
      const data = seeded(24 * MiB, 41);
      writeAt(src, 'sub/big.bin', data, 0o644, T0);
      writeAt(src, 'small.txt', 'small', 0o644, T0);
      fs.mkdirSync(dst);
      const to = remote ? `host:${dst}/` : `${dst}/`;
      // 6 MiB/s: ~4 s for the file; interrupted once a few MiB are in its partial.
      const first = startSync(dir, ['-a', '--partial-dir=.rsync-partial', '--bwlimit', String(6 * 1024), `${src}/`, to], remote);
      await until(() => mostBlocksInPartials(dst, data) >= 3, 30_000, 'a partial with 3 MiB in it');
      first.child.kill(remote ? 'SIGKILL' : 'SIGTERM');
      const r1 = await first.done;
      if (!remote) assert.equal(r1.code, 20, r1.stderr);
      const pdir = path.join(dst, 'sub', '.rsync-partial');
      // Through ssh the remote receiver notices the dropped channel on its own, then moves it.
      await until(() => partsIn(pdir).length === 1, 15_000, `the partial in ${pdir}`);
      assert.deepEqual(partsIn(path.join(dst, 'sub')), [], 'nothing kept beside the file');
      assert.equal(fs.existsSync(path.join(dst, 'sub', 'big.bin')), false, 'no half file under its name');
      assert.equal(fs.statSync(pdir).mode & 0o777, 0o700, 'created private');
      const kept = blocksPresent(path.join(pdir, partsIn(pdir)[0]), data);
      assert.ok(kept >= 3, `the partial holds ${kept} MiB`);

      const second = startSync(dir, ['-a', '--partial-dir=.rsync-partial', '--stats', `${src}/`, to], remote);
      let out = '';
      second.child.stdout!.on('data', (d: Buffer) => (out += d));
      const r2 = await second.done;
      assert.equal(r2.code, 0, r2.stderr);
      assert.equal(sha256(path.join(dst, 'sub', 'big.bin')), sha256(path.join(src, 'sub', 'big.bin')));
      assert.equal(fs.existsSync(pdir), false, 'the emptied partial directory is removed');
      assert.deepEqual(partials(dst), [], 'no partial left anywhere');
      // The resume: the kept MiB were not sent again (`--stats`, rsync's fields).
      const literal = Number(/Literal data: ([\d,]+) bytes/.exec(out)?.[1].replace(/,/g, ''));
      assert.ok(literal <= data.length - (kept - 1) * MiB, `second run sent ${literal} literal bytes with ${kept} MiB kept:\n${out}`);
    });
  }

  it('local: a file that now goes whole in a batch (600 KiB, decisions §107) takes its kept partial with it, and the emptied directory goes', async () => {
    // rsync removes a file's partial from --partial-dir once the file is done, however it was
    // done. The build before left it there for good: nothing resumes a file that travels whole.
    const dir = tmpdir();
    const src = path.join(dir, 'src');
    const dst = path.join(dir, 'dst');
    const data = seeded(24 * MiB, 44);
    writeAt(src, 'sub/big.bin', data, 0o644, T0);
    fs.mkdirSync(dst);
    const first = startSync(dir, ['-a', '--partial-dir=.rsync-partial', '--bwlimit', String(6 * 1024), `${src}/`, `${dst}/`]);
    await until(() => mostBlocksInPartials(dst, data) >= 3, 30_000, 'a partial with 3 MiB in it');
    first.child.kill('SIGTERM');
    assert.equal((await first.done).code, 20);
    const pdir = path.join(dst, 'sub', '.rsync-partial');
    assert.equal(partsIn(pdir).length, 1, 'kept in DEST/sub/.rsync-partial');
    // The next version is small enough to travel whole between local paths.
    writeAt(src, 'sub/big.bin', seeded(600 * 1024, 45), 0o644, T0 + 60);
    const second = await startSync(dir, ['-a', '--partial-dir=.rsync-partial', `${src}/`, `${dst}/`]).done;
    assert.equal(second.code, 0, second.stderr);
    assert.equal(sha256(path.join(dst, 'sub', 'big.bin')), sha256(path.join(src, 'sub', 'big.bin')));
    assert.deepEqual(partials(dst), [], 'no partial left anywhere');
    assert.equal(fs.existsSync(pdir), false, 'the emptied partial directory is removed');
  });

  it('an absolute --partial-dir holds the partial of a single file and stays; a link planted at a relative one is refused, not followed', async () => {
    const dir = tmpdir();
    const data = seeded(24 * MiB, 42);
    const src = path.join(dir, 'big.bin');
    fs.writeFileSync(src, data);
    const dst = path.join(dir, 'dst');
    fs.mkdirSync(dst);
    const abs = path.join(dir, 'partials');
    const first = startSync(dir, ['-a', `--partial-dir=${abs}`, '--bwlimit', String(6 * 1024), src, `${dst}/`]);
    await until(() => mostBlocksInPartials(dst, data) >= 3, 30_000, 'a partial with 3 MiB in it');
    first.child.kill('SIGTERM');
    assert.equal((await first.done).code, 20);
    assert.equal(partsIn(abs).length, 1, 'kept in the absolute directory');
    assert.deepEqual(partsIn(dst), []);
    const second = await startSync(dir, ['-a', `--partial-dir=${abs}`, src, `${dst}/`]).done;
    assert.equal(second.code, 0, second.stderr);
    assert.equal(sha256(path.join(dst, 'big.bin')), sha256(src));
    assert.ok(fs.existsSync(abs) && partsIn(abs).length === 0, 'an absolute directory stays, empty');

    // A link where the relative directory would go: the partial stays beside its file.
    const outside = path.join(dir, 'outside');
    fs.mkdirSync(outside);
    fs.symlinkSync(outside, path.join(dst, '.p'));
    fs.writeFileSync(src, seeded(24 * MiB, 43));
    const third = startSync(dir, ['-a', '--partial-dir=.p', '--bwlimit', String(6 * 1024), src, `${dst}/`]);
    await until(() => partials(dst).some((p) => (fs.statSync(p, { throwIfNoEntry: false })?.size ?? 0) > 0), 30_000, 'a partial');
    await new Promise((r) => setTimeout(r, 600));
    third.child.kill('SIGTERM');
    const r3 = await third.done;
    assert.equal(r3.code, 20, r3.stderr);
    assert.deepEqual(fs.readdirSync(outside), [], 'nothing written through the planted link');
    assert.equal(partsIn(dst).length, 1, 'kept beside the file instead');
  });

  it('usage: a relative --partial-dir of more than one name is refused in one line (exit 1), before anything is written', async () => {
    const dir = tmpdir();
    writeAt(dir, 'src/a.txt', 'a');
    for (const bad of ['a/b', '..']) {
      const r = syncLikeRsync(dir, 'ours', ['-a', `--partial-dir=${bad}`, `${path.join(dir, 'src')}/`, path.join(dir, 'out')]);
      assert.equal(r.status, 1, r.stderr);
      assert.match(r.stderr, /^ffsync-native: error: .*--partial-dir .*one directory name.*\n$/);
      assert.equal(fs.existsSync(path.join(dir, 'out')), false);
    }
  });
});

describe('--partial-dir with --inplace, as rsync has it', { skip: !hasRsync && 'rsync is not installed' }, () => {
  it('an explicit --partial-dir with --inplace is refused in rsync\'s words (exit 1, nothing written); RSYNC_PARTIAL_DIR with -P --inplace is not used', () => {
    for (const tool of ['ours', 'theirs'] as const) {
      const dir = tmpdir();
      const src = path.join(dir, 'src');
      writeAt(src, 'a.bin', seeded(100 * 1024, 46), 0o644, T0);
      const out = path.join(dir, 'out');
      const refused = syncLikeRsync(dir, tool, ['-a', '--inplace', '--partial-dir=.p', `${src}/`, out]);
      assert.equal(refused.status, 1, `${tool}: ${refused.stderr}`);
      assert.match(refused.stderr, /--inplace cannot be used with --partial-dir/, tool);
      if (tool === 'ours') assert.match(refused.stderr, /^ffsync-native: error: --inplace cannot be used with --partial-dir\n$/);
      assert.equal(fs.existsSync(out), false, `${tool}: nothing written`);
      const env = { ...process.env, RSYNC_PARTIAL_DIR: '.p' };
      const ran = syncLikeRsync(dir, tool, ['-a', '-P', '--inplace', `${src}/`, out], { env });
      assert.equal(ran.status, 0, `${tool}: ${ran.stderr}`);
      assert.equal(sha256(path.join(out, 'a.bin')), sha256(path.join(src, 'a.bin')), tool);
      assert.equal(fs.existsSync(path.join(out, '.p')), false, tool);
    }
  });
});

describe('--partial-dir against rsync: a relative one is neither sent nor deleted', { skip: !hasRsync && 'rsync is not installed' }, () => {
  for (const remote of [false, true]) {
    it(`${remote ? 'push and pull through ssh' : 'local'}: same tree as rsync -a --delete --partial-dir=.rsync-partial`, () => {
      const runs = remote ? (['push', 'pull'] as const) : (['local'] as const);
      for (const how of runs) {
        const results: Record<string, string[]> = {};
        for (const tool of ['ours', 'theirs'] as const) {
          const dir = tmpdir();
          const src = path.join(dir, 'src');
          const dst = path.join(dir, 'dst');
          writeAt(src, 'a.txt', 'a', 0o644, T0);
          writeAt(src, 'sub/b.txt', 'b', 0o644, T0);
          writeAt(src, '.rsync-partial/junk', 'the sender’s own partials are not sent', 0o644, T0);
          writeAt(src, 'sub/.rsync-partial/x', 'nor these', 0o644, T0);
          writeAt(dst, 'gone.txt', 'deleted by --delete', 0o644, T0);
          writeAt(dst, '.rsync-partial/keep.bin', 'a kept partial survives --delete', 0o644, T0);
          writeAt(dst, 'sub/.rsync-partial/old', 'here too', 0o644, T0);
          const from = how === 'pull' ? `host:${src}/` : `${src}/`;
          const to = how === 'push' ? `host:${dst}/` : `${dst}/`;
          const r = syncLikeRsync(dir, tool, ['-a', '--delete', '--partial-dir=.rsync-partial', from, to], { remote });
          assert.equal(r.status, 0, `${tool} ${how}: ${r.stderr}`);
          results[tool] = listing(dst);
        }
        assert.deepEqual(results.ours, results.theirs, how);
        assert.ok(results.ours.includes('.rsync-partial/keep.bin: a kept partial survives --delete'), how);
        assert.ok(!results.ours.some((l) => l.startsWith('gone.txt')), how);
      }
    });
  }
});
