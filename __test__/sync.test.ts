// `ffsync-native sync SRC DEST`, the rsync-style front door: real processes, local to
// local (both peers in one process) and push/pull through a throwaway OpenSSH server on a
// loopback port. Results are compared entry by entry with snapshotTree (kinds, contents,
// modes, mtimes, link targets).
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { CLI, type PeerResult, run, seeded, sha256, snapshotTree, tmpdir, T0, assertSameTree, writeAt, partials, mostBlocksInPartials } from './helpers/peers';
import { type Sshd, startSshd, sshdUnavailable } from './helpers/sshd';

const KiB = 1024;
const MiB = 1024 * KiB;
/** One `ffsync-native …` run to completion. */
function cli(args: string[]): Promise<PeerResult> {
  return run(args).done;
}

/** `sync ARGS` with its own state dir; JSON events on stdout unless `human`. */
function syncCmd(state: string, args: string[], o: { human?: boolean } = {}): Promise<PeerResult> {
  return cli(['sync', '--state-dir', state, ...(o.human ? [] : ['--json']), ...args]);
}

function assertOk(r: PeerResult, what: string) {
  assert.equal(r.code, 0, `${what}: exit ${r.code} (signal ${r.signal}): ${r.stderr}`);
  if (r.summary) assert.equal(r.summary.ok, true, `${what}: summary not ok`);
}

const write = writeAt;

/** Nested dirs, an empty dir, an empty file, a symlink to a file, a dangling symlink,
 * modes 0600/0755/0750/0700, explicit mtimes everywhere (directories last). */
function buildTree(src: string) {
  fs.mkdirSync(src, { recursive: true });
  write(src, 'a/b/c/deep.txt', 'deep inside\n', 0o644, T0 + 1);
  write(src, 'a/secret.txt', 'private\n', 0o600, T0 + 2);
  write(src, 'bin/run.sh', '#!/bin/sh\necho hi\n', 0o755, T0 + 3);
  write(src, 'empty.txt', '', 0o644, T0 + 4);
  write(src, 'a/b/data.bin', seeded(200 * KiB, 7), 0o640, T0 + 5);
  fs.mkdirSync(path.join(src, 'emptydir'));
  fs.symlinkSync('a/secret.txt', path.join(src, 'link-file'));
  fs.symlinkSync('does/not/exist', path.join(src, 'dangling'));
  fs.chmodSync(path.join(src, 'a/b'), 0o750);
  fs.chmodSync(path.join(src, 'emptydir'), 0o700);
  ['a/b/c', 'a/b', 'a', 'bin', 'emptydir', '.'].forEach((d, i) => fs.utimesSync(path.join(src, d), T0 + 100 + i, T0 + 100 + i));
}

/** A tree for the filter tests: .log files at several depths, one of them keep.log. */
function buildLogTree(src: string) {
  write(src, 'c.txt', 'text\n', 0o644, T0);
  write(src, 'a.log', 'log a\n', 0o644, T0);
  write(src, 'keep.log', 'keep me\n', 0o644, T0);
  write(src, 'sub/b.log', 'log b\n', 0o644, T0);
  write(src, 'sub/keep.log', 'keep me too\n', 0o644, T0);
  write(src, 'sub/d.txt', 'text d\n', 0o644, T0);
}

/** Relative paths of the regular files and symlinks under `dir`, sorted. */
function files(dir: string): string[] {
  return Object.entries(snapshotTree(dir, { root: false }))
    .filter(([, e]) => e.kind !== 'dir')
    .map(([p]) => p)
    .sort();
}

function mtimeNs(p: string): bigint {
  return fs.lstatSync(p, { bigint: true }).mtimeNs;
}

const POSIX_ONLY = process.platform === 'win32' && 'POSIX modes and symlinks: tree semantics are tested on Linux and macOS (the engine builds on Windows)';

describe('sync: local to local', { skip: POSIX_ONLY }, () => {
  it('`src/` fills DEST, `src` lands in DEST/src, a file goes into `dir/`; a rerun is a no-op', async () => {
    const dir = tmpdir();
    const state = path.join(dir, 'state');
    const src = path.join(dir, 'src');
    buildTree(src);

    const dst = path.join(dir, 'dst');
    const r1 = await syncCmd(state, ['-a', src + '/', dst]);
    assertOk(r1, 'sync -a src/ dst');
    assertSameTree(dst, src, '`sync -a src/ dst` must reproduce the tree in dst');
    assert.equal(fs.readlinkSync(path.join(dst, 'dangling')), 'does/not/exist');
    assert.equal(r1.summary!.tree.written, 5, 'five regular files written');

    const dst2 = path.join(dir, 'dst2');
    assertOk(await syncCmd(state, ['-a', src, dst2]), 'sync -a src dst2');
    assert.deepEqual(fs.readdirSync(dst2), ['src'], 'dst2 holds only the directory src');
    assertSameTree(path.join(dst2, 'src'), src, '`sync -a src dst2` must give dst2/src');

    const file = path.join(src, 'a/b/data.bin');
    const into = path.join(dir, 'into');
    assertOk(await syncCmd(state, [file, into + '/']), 'sync file into/');
    assert.deepEqual(fs.readdirSync(into), ['data.bin'], 'the file lands inside into/');
    assert.equal(sha256(path.join(into, 'data.bin')), sha256(file));
    // An existing directory without the trailing slash: same rule.
    assertOk(await syncCmd(state, [path.join(src, 'bin/run.sh'), into]), 'sync file existing-dir');
    assert.deepEqual(fs.readdirSync(into).sort(), ['data.bin', 'run.sh']);

    const before = snapshotTree(dst);
    const again = await syncCmd(state, ['-a', src + '/', dst]);
    assertOk(again, 'resync');
    assert.equal(again.summary!.tree.written, 0, `no-op resync wrote files: ${JSON.stringify(again.summary!.tree)}`);
    assert.equal(again.summary!.tree.deleted, 0);
    assert.equal(again.summary!.literalBytes, 0);
    assert.deepEqual(snapshotTree(dst), before, 'nothing in dst changed');
  });

  it('file<->directory and symlink->file swaps converge on resync', async () => {
    const dir = tmpdir();
    const state = path.join(dir, 'state');
    const src = path.join(dir, 'src');
    const dst = path.join(dir, 'dst');
    write(src, 'was-dir/inner.txt', 'inner\n', 0o644, T0);
    write(src, 'was-file', 'a file\n', 0o644, T0 + 1);
    write(src, 'target.txt', 'target\n', 0o644, T0 + 2);
    fs.symlinkSync('target.txt', path.join(src, 'was-link'));
    assertOk(await syncCmd(state, ['-a', src + '/', dst]), 'first sync');
    assertSameTree(dst, src);

    // Swap kinds: directory -> file, file -> directory, symlink -> file.
    fs.rmSync(path.join(src, 'was-dir'), { recursive: true });
    fs.rmSync(path.join(src, 'was-file'));
    fs.rmSync(path.join(src, 'was-link'));
    write(src, 'was-dir', 'now a file\n', 0o600, T0 + 3);
    write(src, 'was-file/now-inside.txt', 'now a directory\n', 0o644, T0 + 4);
    write(src, 'was-link', 'now a regular file\n', 0o644, T0 + 5);
    fs.utimesSync(src, T0 + 50, T0 + 50);

    // Without --delete a non-empty directory in the way is not removed (rsync without
    // --force: "cannot delete non-empty directory", exit 23); the other swaps happen.
    const keep = await syncCmd(state, ['-a', src + '/', dst]);
    assert.equal(keep.code, 23, `swap without --delete: exit ${keep.code}: ${keep.stderr}`);
    assert.match(keep.stderr, /was-dir/);
    assert.ok(fs.statSync(path.join(dst, 'was-dir')).isDirectory());
    assert.equal(fs.readFileSync(path.join(dst, 'was-link'), 'utf8'), 'now a regular file\n');
    assert.ok(fs.lstatSync(path.join(dst, 'was-link')).isFile(), 'symlink replaced by a file');
    assert.equal(fs.readFileSync(path.join(dst, 'was-file/now-inside.txt'), 'utf8'), 'now a directory\n');

    assertOk(await syncCmd(state, ['-a', '--delete', src + '/', dst]), 'swap resync with --delete');
    assertSameTree(dst, src, 'swapped kinds converge');

    // And back: file -> directory, directory -> file, file -> symlink.
    fs.rmSync(path.join(src, 'was-dir'));
    fs.rmSync(path.join(src, 'was-file'), { recursive: true });
    fs.rmSync(path.join(src, 'was-link'));
    write(src, 'was-dir/inner.txt', 'inner again\n', 0o644, T0 + 6);
    write(src, 'was-file', 'a file again\n', 0o644, T0 + 7);
    fs.symlinkSync('target.txt', path.join(src, 'was-link'));
    fs.utimesSync(src, T0 + 60, T0 + 60);
    assertOk(await syncCmd(state, ['-a', '--delete', src + '/', dst]), 'swap back');
    assertSameTree(dst, src, 'swapped back kinds converge');
  });

  it('--delete removes receiver-only files; without it they are kept', async () => {
    const dir = tmpdir();
    const state = path.join(dir, 'state');
    const src = path.join(dir, 'src');
    const dst = path.join(dir, 'dst');
    buildTree(src);
    assertOk(await syncCmd(state, ['-a', src + '/', dst]), 'first sync');
    write(dst, 'only-here.txt', 'receiver only\n');
    write(dst, 'only-dir/x/y.txt', 'receiver only, nested\n');
    write(dst, 'a/b/extra.bin', seeded(3 * KiB, 9));

    const keep = await syncCmd(state, ['-a', src + '/', dst]);
    assertOk(keep, 'sync without --delete');
    assert.equal(keep.summary!.tree.deleted, 0);
    for (const p of ['only-here.txt', 'only-dir/x/y.txt', 'a/b/extra.bin']) assert.ok(fs.existsSync(path.join(dst, p)), `${p} must be kept without --delete`);

    const del = await syncCmd(state, ['-a', '--delete', src + '/', dst]);
    assertOk(del, 'sync --delete');
    for (const p of ['only-here.txt', 'only-dir', 'a/b/extra.bin']) assert.ok(!fs.existsSync(path.join(dst, p)), `${p} must be deleted with --delete`);
    assert.ok(del.summary!.tree.deleted >= 3, `deleted ${del.summary!.tree.deleted}`);
    assertSameTree(dst, src);
  });

  it('--include/--exclude: ordered, first matching rule wins', async () => {
    const dir = tmpdir();
    const state = path.join(dir, 'state');
    const src = path.join(dir, 'src');
    buildLogTree(src);

    const d1 = path.join(dir, 'include-first');
    assertOk(await syncCmd(state, ['-a', '--include', 'keep.log', '--exclude', '*.log', src + '/', d1]), 'include first');
    assert.deepEqual(files(d1), ['c.txt', 'keep.log', 'sub/d.txt', 'sub/keep.log'], '--include keep.log before --exclude *.log keeps keep.log');

    const d2 = path.join(dir, 'exclude-first');
    assertOk(await syncCmd(state, ['-a', '--exclude', '*.log', '--include', 'keep.log', src + '/', d2]), 'exclude first');
    assert.deepEqual(files(d2), ['c.txt', 'sub/d.txt'], '--exclude *.log first matches keep.log too: the later --include never applies');

    // --exclude-from: same rules from a file.
    const rules = path.join(dir, 'rules.txt');
    fs.writeFileSync(rules, '# comment\nsub/\n');
    const d3 = path.join(dir, 'exclude-from');
    assertOk(await syncCmd(state, ['-a', '--exclude-from', rules, src + '/', d3]), 'exclude-from');
    assert.deepEqual(files(d3), ['a.log', 'c.txt', 'keep.log']);
  });

  it('-n writes nothing (new and existing DEST, with --delete too)', async () => {
    const dir = tmpdir();
    const state = path.join(dir, 'state');
    const src = path.join(dir, 'src');
    buildTree(src);

    const fresh = path.join(dir, 'fresh');
    const r1 = await syncCmd(state, ['-a', '-n', src + '/', fresh]);
    assertOk(r1, 'dry run to a new DEST');
    assert.ok(!fs.existsSync(fresh), 'a dry run must not create DEST');
    const inner = path.join(dir, 'inner');
    assertOk(await syncCmd(state, ['-a', '-n', src, inner]), 'dry run of `src` (no slash)');
    assert.ok(!fs.existsSync(inner), 'a dry run must not create DEST (nor DEST/src)');

    const dst = path.join(dir, 'dst');
    write(dst, 'a/secret.txt', 'stale content\n', 0o644, T0 - 1000);
    write(dst, 'only-here.txt', 'receiver only\n', 0o644, T0 - 1000);
    fs.utimesSync(dst, T0 - 500, T0 - 500);
    const before = snapshotTree(dst);
    assertOk(await syncCmd(state, ['-a', '-n', '--delete', src + '/', dst]), 'dry run to an existing DEST');
    assert.deepEqual(snapshotTree(dst), before, 'a dry run must leave DEST exactly as it was');
  });

  it('large files are copied in parallel over in-process lanes (--jobs, default 4)', async () => {
    const dir = tmpdir();
    const src = path.join(dir, 'src');
    for (let i = 0; i < 6; i++) write(src, `big/b${i}.bin`, seeded(2 * MiB, 40 + i), 0o644, T0 + i);
    write(src, 'small.txt', 'small\n', 0o644, T0);
    const state = path.join(dir, 'state');
    const four = await syncCmd(state, ['-a', src + '/', path.join(dir, 'dst4')]);
    assertOk(four, 'default jobs');
    assert.equal(four.summary!.tree.lanes, 4, 'four lanes by default');
    assertSameTree(path.join(dir, 'dst4'), src, 'default jobs');
    const one = await syncCmd(state, ['-a', '--jobs', '1', src + '/', path.join(dir, 'dst1')]);
    assertOk(one, '--jobs 1');
    assert.equal(one.summary!.tree.lanes, 1);
    assertSameTree(path.join(dir, 'dst1'), src, '--jobs 1');
  });

  it('3,000 small files and six large ones in one local sync (regression: the in-process pipe shared batch buffers with the reader)', async () => {
    // The sender reuses a batch buffer once its write completes; an in-memory pipe handed
    // the very buffer to the receiver, which could still be writing from it (a stall or a
    // failed verification, depending on timing). The pipe now copies, as a socket does.
    const dir = tmpdir();
    const src = path.join(dir, 'src');
    for (let i = 0; i < 3000; i++) write(src, `s/d${i % 30}/f${i}.bin`, seeded(4 * KiB, 1000 + i), 0o644, T0);
    for (let i = 0; i < 6; i++) write(src, `big/b${i}.bin`, seeded(MiB, 90 + i), 0o644, T0);
    const r = await syncCmd(path.join(dir, 'state'), ['-a', src + '/', path.join(dir, 'dst')]);
    assertOk(r, 'many small files');
    assertSameTree(path.join(dir, 'dst'), src, 'many small files');
    fs.rmSync(dir, { recursive: true, force: true });
  });

  it('--max-size / --min-size: files outside are neither sent, replaced nor deleted; a single file is skipped', async () => {
    const dir = tmpdir();
    const src = path.join(dir, 'src');
    write(src, 'tiny.txt', 'x', 0o644, T0);
    write(src, 'mid.bin', seeded(20 * KiB, 1), 0o644, T0);
    write(src, 'big.bin', seeded(3 * MiB, 2), 0o644, T0);
    const dst = path.join(dir, 'dst');
    write(dst, 'big.bin', 'old, small, stays\n', 0o644, T0);
    const state = path.join(dir, 'state');
    const r = await syncCmd(state, ['-a', '--delete', '--max-size', '1M', '--min-size', '2', src + '/', dst]);
    assertOk(r, '--max-size');
    assert.equal(r.summary!.tree.sizeSkipped, 2, 'tiny.txt and big.bin left alone');
    assert.deepEqual(files(dst), ['big.bin', 'mid.bin']);
    assert.equal(fs.readFileSync(path.join(dst, 'big.bin'), 'utf8'), 'old, small, stays\n');
    assert.equal(sha256(path.join(dst, 'mid.bin')), sha256(path.join(src, 'mid.bin')));
    // rsync's suffixes: 1.5M = 1.5 * 1024^2, 3MB = 3,000,000 (big.bin is 3 MiB = 3,145,728).
    const again = await syncCmd(state, ['-a', '--max-size', '3MB', src + '/', dst]);
    assertOk(again, '--max-size 3MB');
    assert.equal(again.summary!.tree.sizeSkipped, 1);
    const all = await syncCmd(state, ['-a', '--max-size', '3.5M', src + '/', dst]);
    assertOk(all, '--max-size 3.5M');
    assert.equal(sha256(path.join(dst, 'big.bin')), sha256(path.join(src, 'big.bin')));
    // A single file above the limit: skipped, exit 0.
    const one = await syncCmd(state, ['-a', '--max-size', '100K', path.join(src, 'big.bin'), path.join(dir, 'one.bin')]);
    assertOk(one, 'single file');
    assert.equal(one.summary!.decidedBy, 'size-limit');
    assert.ok(!fs.existsSync(path.join(dir, 'one.bin')));
    const bad = await syncCmd(state, ['-a', '--max-size', '12Q', src + '/', dst]);
    assert.equal(bad.code, 1, bad.stderr);
  });

  it('-a carries owner and group (as root); --numeric-ids; -r leaves owners alone (xattrs: crates/ffsync_core/tests/tree_sync.rs)', { skip: process.getuid?.() !== 0 && 'needs root to chown' }, async () => {
    const dir = tmpdir();
    const src = path.join(dir, 'src');
    write(src, 'a.txt', 'a\n', 0o644, T0);
    write(src, 'd/b.bin', seeded(200 * KiB, 3), 0o644, T0);
    fs.chownSync(path.join(src, 'a.txt'), 65534, 65534);
    fs.chownSync(path.join(src, 'd'), 1, 1);
    fs.utimesSync(path.join(src, 'd'), T0, T0);
    const dst = path.join(dir, 'dst');
    const state = path.join(dir, 'state');
    assertOk(await syncCmd(state, ['-a', src + '/', dst]), '-a');
    const own = (p: string) => { const s = fs.lstatSync(path.join(dst, p)); return [s.uid, s.gid]; };
    assert.deepEqual(own('a.txt'), [65534, 65534], 'file owner and group');
    assert.deepEqual(own('d'), [1, 1], 'directory owner and group');
    assert.deepEqual(own('d/b.bin'), [0, 0]);
    assertSameTree(dst, src, 'content, modes and times still exact');
    // An owner change alone is applied on the next run (content unchanged).
    fs.chownSync(path.join(src, 'd/b.bin'), 2, 2);
    assertOk(await syncCmd(state, ['-a', '--numeric-ids', src + '/', dst]), 'owner change');
    assert.deepEqual(own('d/b.bin'), [2, 2]);
    // -r without -o/-g leaves owners alone.
    fs.chownSync(path.join(src, 'a.txt'), 3, 3);
    assertOk(await syncCmd(state, ['-r', src + '/', dst]), '-r');
    assert.deepEqual(own('a.txt'), [65534, 65534]);
  });

  it('--stats prints rsync-style totals', async () => {
    const dir = tmpdir();
    const src = path.join(dir, 'src');
    buildTree(src);
    const r = await syncCmd(path.join(dir, 'state'), ['-a', '--stats', src + '/', path.join(dir, 'dst')], { human: true });
    assertOk(r, 'sync --stats');
    assert.match(r.stdout, /^Number of files: [\d,]+ \(reg: 5, dir: \d+, link: \d+\)$/m, r.stdout);
    assert.match(r.stdout, /^Total bytes sent: [\d,]+$/m, r.stdout);
    assertSameTree(path.join(dir, 'dst'), src);
  });
});

describe('sync: -u, -W, -x', { skip: POSIX_ONLY }, () => {
  it('-u leaves files that are newer on the receiver; without it they are replaced', async () => {
    const dir = tmpdir();
    const src = path.join(dir, 'src');
    const dst = path.join(dir, 'dst');
    write(src, 'a.txt', 'sender version\n', 0o644, T0);
    write(src, 'b.txt', 'sender b\n', 0o644, T0 + 100);
    write(dst, 'a.txt', 'receiver edited later\n', 0o644, T0 + 1000);
    write(dst, 'b.txt', 'old receiver b\n', 0o644, T0);
    const st = path.join(dir, 'state');
    assertOk(await syncCmd(st, ['-a', '-u', src + '/', dst]), 'sync -u');
    assert.equal(fs.readFileSync(path.join(dst, 'a.txt'), 'utf8'), 'receiver edited later\n', 'newer receiver file kept');
    assert.equal(fs.readFileSync(path.join(dst, 'b.txt'), 'utf8'), 'sender b\n', 'older receiver file replaced');
    assertOk(await syncCmd(st, ['-a', src + '/', dst]), 'sync');
    assert.equal(fs.readFileSync(path.join(dst, 'a.txt'), 'utf8'), 'sender version\n');
  });

  it('-W sends a changed large file whole; the result is the same', async () => {
    const dir = tmpdir();
    const src = path.join(dir, 'src');
    const dst = path.join(dir, 'dst');
    const data = seeded(4 * MiB, 5);
    write(src, 'big.bin', data);
    const st = path.join(dir, 'state');
    assertOk(await syncCmd(st, ['-a', src + '/', dst]), 'first');
    data[100] ^= 1;
    write(src, 'big.bin', data, 0o644, T0 + 5);
    const delta = await syncCmd(st, ['-a', '--checksum', src + '/', dst]);
    assertOk(delta, 'delta');
    assert.ok(delta.summary!.literalBytes < 1 * MiB, `delta literal ${delta.summary!.literalBytes}`);
    data[200] ^= 1;
    write(src, 'big.bin', data, 0o644, T0 + 6);
    const whole = await syncCmd(st, ['-a', '-W', src + '/', dst]);
    assertOk(whole, 'whole');
    assert.equal(whole.summary!.literalBytes, 4 * MiB, 'with -W the whole file travels');
    assertSameTree(dst, src);
  });

  it('-x does not enter a filesystem mounted inside the source', { skip: !(process.platform === 'linux' && process.getuid?.() === 0) && 'needs root to mount a tmpfs' }, async () => {
    const dir = tmpdir();
    const src = path.join(dir, 'src');
    const dst = path.join(dir, 'dst');
    write(src, 'top.txt', 'top\n');
    fs.mkdirSync(path.join(src, 'mnt'));
    execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=1m', 'tmpfs', path.join(src, 'mnt')]);
    try {
      write(src, 'mnt/inside.txt', 'on another filesystem\n');
      assertOk(await syncCmd(path.join(dir, 'state'), ['-a', '-x', src + '/', dst]), 'sync -x');
      assert.equal(fs.readFileSync(path.join(dst, 'top.txt'), 'utf8'), 'top\n');
      assert.ok(fs.statSync(path.join(dst, 'mnt')).isDirectory(), 'the mount point itself is listed');
      assert.deepEqual(fs.readdirSync(path.join(dst, 'mnt')), [], 'its contents are not');
    } finally {
      execFileSync('umount', [path.join(src, 'mnt')]);
    }
  });
});

describe('sync: bad input', () => {
  /** Runs `sync ARGS` and checks the exit code (and stderr against `re`, when given). */
  async function refused(args: string[], code: number, re?: RegExp, cwd?: string): Promise<PeerResult> {
    const r = await cli(['sync', ...args]);
    assert.equal(r.code, code, `sync ${args.join(' ')}: expected exit ${code}, got ${r.code}: ${r.stderr}`);
    if (re) assert.match(r.stderr, re, `sync ${args.join(' ')}`);
    if (cwd) assert.deepEqual(fs.readdirSync(cwd).sort(), ['d', 'file.txt', 'state'], 'nothing written');
    return r;
  }

  function fixture() {
    const dir = tmpdir();
    write(dir, 'd/x.txt', 'x\n');
    write(dir, 'file.txt', 'f\n');
    const state = path.join(dir, 'state');
    fs.mkdirSync(state);
    return { dir, state, d: path.join(dir, 'd'), file: path.join(dir, 'file.txt') };
  }

  it('usage (exit 1): both remote, same path, unknown option', async () => {
    const { dir, state, d } = fixture();
    await refused(['-a', '--state-dir', state, 'hostA:/x', 'hostB:/y'], 1, /both remote/, dir);
    await refused(['-a', '--state-dir', state, d + '/', d], 1, /same path/, dir);
    await refused(['-a', '--state-dir', state, '--frobnicate', d + '/', path.join(dir, 'out')], 1, /unknown option/, dir);
  });

  it('file selection (exit 3): SRC missing, DEST parent missing (tree), a directory without -r', async () => {
    const { dir, state, d } = fixture();
    await refused(['-a', '--state-dir', state, path.join(dir, 'missing'), path.join(dir, 'out')], 3, /does not exist/, dir);
    await refused(['-a', '--state-dir', state, d + '/', path.join(dir, 'no/such/parent/out')], 3, /parent/, dir);
    await refused(['-a', '--state-dir', state, d, path.join(dir, 'no/such/parent/out')], 3, /parent/, dir);
    await refused(['--state-dir', state, d, path.join(dir, 'out')], 3, /-r/, dir);
    await refused(['--state-dir', state, d + '/', path.join(dir, 'out')], 3, /-r/, dir);
  });

  it('file selection (exit 3): DEST parent missing for a single file', async () => {
    const { dir, state, file } = fixture();
    await refused(['--state-dir', state, file, path.join(dir, 'no/such/parent/out')], 3, /does not exist/, dir);
  });

  it('unsupported rsync options are refused with exit 1 and "not supported"', async () => {
    const { dir, state, d } = fixture();
    for (const opt of [['-H'], ['-A']]) {
      await refused(['-a', '--state-dir', state, ...opt, d + '/', path.join(dir, 'out')], 1, /not supported/, dir);
    }
  });

  it('--quic on a local sync, and --jobs over ssh without --quic: usage errors (exit 1)', async () => {
    const { dir, state, d } = fixture();
    await refused(['-a', '--state-dir', state, '--quic', d + '/', path.join(dir, 'out')], 1, /--quic needs a remote side/, dir);
    await refused(['-a', '--state-dir', state, '--jobs', '2', d + '/', `127.0.0.1:${path.join(dir, 'out')}`], 1, /--jobs over ssh needs --quic/, dir);
  });
});

/** Processes (pid and command line) whose command line contains every one of `needles`. */
function processesMatching(...needles: string[]): string[] {
  const out: string[] = [];
  for (const pid of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(pid) || Number(pid) === process.pid) continue;
    let cmd: string;
    try {
      cmd = fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').join(' ');
    } catch {
      continue;
    }
    if (needles.every((n) => cmd.includes(n))) out.push(`${pid}: ${cmd}`);
  }
  return out;
}


const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

const noSshd = sshdUnavailable();

describe('sync over ssh', { skip: noSshd || false }, () => {
  let sshd: Sshd;
  before(async () => {
    sshd = await startSshd();
  });
  after(async () => {
    await sshd?.stop();
  });

  /** `sync` through the test sshd; the remote side runs this CLI with its own state dir. */
  function sshSync(dir: string, args: string[], o: { human?: boolean } = {}): Promise<PeerResult> {
    const remoteState = path.join(dir, 'remote-state');
    return syncCmd(path.join(dir, 'state'), ['-e', sshd.rsh, '--remote-cmd', `env FFSYNC_STATE_DIR=${remoteState} ${process.execPath} ${CLI}`, ...args], o);
  }
  const R = (p: string) => `127.0.0.1:${p}`;

  it('push and pull of a single file: content, mtime and mode equal', async () => {
    const dir = tmpdir();
    const src = path.join(dir, 'one.bin');
    write(dir, 'one.bin', seeded(300 * KiB, 21), 0o640, T0 + 0.123456);
    const expect = snapshotTree(dir, { root: false })['one.bin'];

    const pushed = path.join(dir, 'pushed.bin');
    assertOk(await sshSync(dir, ['-a', src, R(pushed)]), 'push file');
    assert.deepEqual(snapshotTree(dir, { root: false })['pushed.bin'], expect, 'pushed file');

    const pulled = path.join(dir, 'pulled.bin');
    assertOk(await sshSync(dir, ['-a', R(src), pulled]), 'pull file');
    assert.deepEqual(snapshotTree(dir, { root: false })['pulled.bin'], expect, 'pulled file');

    // Into a directory: `dir/` (created) and an existing directory without the slash.
    const pushDir = path.join(dir, 'push-into');
    assertOk(await sshSync(dir, ['-a', src, R(pushDir + '/')]), 'push file into dir/');
    const pullDir = path.join(dir, 'pull-into');
    fs.mkdirSync(pullDir);
    assertOk(await sshSync(dir, ['-a', R(src), pullDir]), 'pull file into existing dir');
    for (const d of [pushDir, pullDir]) {
      assert.deepEqual(fs.readdirSync(d), ['one.bin']);
      assert.equal(sha256(path.join(d, 'one.bin')), sha256(src));
      assert.equal(mtimeNs(path.join(d, 'one.bin')), mtimeNs(src));
    }
  });

  it('push and pull of a tree, `src/` and `src` forms', async () => {
    const dir = tmpdir();
    const src = path.join(dir, 'src');
    buildTree(src);

    const pushC = path.join(dir, 'push-contents');
    assertOk(await sshSync(dir, ['-a', src + '/', R(pushC)]), 'push src/');
    assertSameTree(pushC, src, 'push src/ host:dst');
    const pushD = path.join(dir, 'push-dir');
    assertOk(await sshSync(dir, ['-a', src, R(pushD)]), 'push src');
    assert.deepEqual(fs.readdirSync(pushD), ['src']);
    assertSameTree(path.join(pushD, 'src'), src, 'push src host:dst gives dst/src');

    const pullC = path.join(dir, 'pull-contents');
    assertOk(await sshSync(dir, ['-a', R(src + '/'), pullC]), 'pull src/');
    assertSameTree(pullC, src, 'pull host:src/ dst');
    const pullD = path.join(dir, 'pull-dir');
    assertOk(await sshSync(dir, ['-a', R(src), pullD]), 'pull src');
    assert.deepEqual(fs.readdirSync(pullD), ['src']);
    assertSameTree(path.join(pullD, 'src'), src, 'pull host:src dst gives dst/src');

    // Reruns in both directions are no-ops.
    const again = await sshSync(dir, ['-a', src + '/', R(pushC)]);
    assertOk(again, 'push rerun');
    assert.equal(again.summary!.tree.written, 0);
    const againPull = await sshSync(dir, ['-a', R(src + '/'), pullC]);
    assertOk(againPull, 'pull rerun');
    assert.equal(againPull.summary!.tree.written, 0);
  });

  it('--delete over ssh (push and pull); without it receiver-only files stay', async () => {
    const dir = tmpdir();
    const src = path.join(dir, 'src');
    buildTree(src);
    const push = path.join(dir, 'push');
    const pull = path.join(dir, 'pull');
    for (const d of [push, pull]) {
      write(d, 'only-here.txt', 'receiver only\n');
      write(d, 'only-dir/y.txt', 'receiver only, nested\n');
    }
    assertOk(await sshSync(dir, ['-a', src + '/', R(push)]), 'push without --delete');
    assertOk(await sshSync(dir, ['-a', R(src + '/'), pull]), 'pull without --delete');
    for (const d of [push, pull]) {
      assert.ok(fs.existsSync(path.join(d, 'only-here.txt')) && fs.existsSync(path.join(d, 'only-dir/y.txt')), `${d}: kept without --delete`);
    }
    assertOk(await sshSync(dir, ['-a', '--delete', src + '/', R(push)]), 'push --delete');
    assertOk(await sshSync(dir, ['-a', '--delete', R(src + '/'), pull]), 'pull --delete');
    assertSameTree(push, src, 'push --delete converges');
    assertSameTree(pull, src, 'pull --delete converges');
  });

  it('--include/--exclude over ssh: push filters locally, pull passes them to the remote sender', async () => {
    const dir = tmpdir();
    const src = path.join(dir, 'src');
    buildLogTree(src);
    const filters = ['--include', 'keep.log', '--exclude', '*.log'];
    const push = path.join(dir, 'push');
    const pull = path.join(dir, 'pull');
    assertOk(await sshSync(dir, ['-a', ...filters, src + '/', R(push)]), 'push with filters');
    assertOk(await sshSync(dir, ['-a', ...filters, R(src + '/'), pull]), 'pull with filters');
    for (const d of [push, pull]) assert.deepEqual(files(d), ['c.txt', 'keep.log', 'sub/d.txt', 'sub/keep.log'], d);

    // Excluded paths are protected from --delete on the receiving side, as in rsync.
    for (const d of [push, pull]) write(d, 'receiver-only.log', 'mine\n');
    assertOk(await sshSync(dir, ['-a', '--delete', '--exclude', '*.log', src + '/', R(push)]), 'push --delete --exclude');
    assertOk(await sshSync(dir, ['-a', '--delete', '--exclude', '*.log', R(src + '/'), pull]), 'pull --delete --exclude');
    for (const d of [push, pull]) assert.ok(fs.existsSync(path.join(d, 'receiver-only.log')), `${d}: excluded receiver-only file protected`);
  });

  it('push killed mid-transfer: remote peer exits, partial kept, rerun resumes', async () => {
    const dir = tmpdir();
    const src = path.join(dir, 'src');
    const dst = path.join(dir, 'remote-dst');
    const data = seeded(48 * MiB, 33);
    write(src, 'sub/big.bin', data, 0o644, T0 + 1);
    write(src, 'small.txt', 'small\n', 0o644, T0 + 2);
    fs.utimesSync(path.join(src, 'sub'), T0 + 3, T0 + 3);
    fs.utimesSync(src, T0 + 4, T0 + 4);

    const remoteState = path.join(dir, 'remote-state');
    const peer = run([
      'sync', '--state-dir', path.join(dir, 'state'), '--json', '-a', '--bwlimit', '8192',
      '-e', sshd.rsh, '--remote-cmd', `env FFSYNC_STATE_DIR=${remoteState} ${process.execPath} ${CLI}`,
      src + '/', R(dst),
    ]);
    // Poll the remote side's target: a .ffsync-part holding >= 8 MiB of the source's data
    // (it is pre-sized, so size alone says nothing; small.txt's partial comes and goes).
    let present = 0;
    const deadline = Date.now() + 30_000;
    while (Date.now() < deadline && peer.child.exitCode === null) {
      if ((present = mostBlocksInPartials(dst, data)) >= 8) break;
      await sleep(50);
    }
    assert.ok(present >= 8, `no .ffsync-part with 8 MiB of data appeared (sync exited ${peer.child.exitCode})`);
    peer.child.kill('SIGKILL');
    const killed = await peer.done;
    assert.equal(killed.signal, 'SIGKILL');

    // ssh dies with its parent's pipes; the remote server must notice and exit, and the ssh
    // client then (it exits once sshd reports the remote command gone): wait for both.
    let left: string[] = [];
    let ssh: string[] = [];
    for (let i = 0; i < 50; i++) {
      left = processesMatching('main.js', 'server', dst);
      ssh = processesMatching('ssh', dst);
      if (left.length === 0 && ssh.length === 0) break;
      await sleep(100);
    }
    assert.deepEqual(left, [], 'remote `ffsync-native server` still running after the local sync was killed');
    assert.deepEqual(ssh, [], 'ssh client still running after the local sync was killed');
    assert.equal(partials(dst).length, 1, 'the partial file is kept for resuming');
    assert.ok(!fs.existsSync(path.join(dst, 'sub/big.bin')), 'the target file is not in place yet');

    const res = await sshSync(dir, ['-a', src + '/', R(dst)]);
    assertOk(res, 'rerun');
    assertSameTree(dst, src, 'rerun converges');
    assert.deepEqual(partials(dst), [], 'partial cleaned up');
    const literal = res.summary!.literalBytes as number;
    assert.ok(literal < 48 * MiB - 4 * MiB, `rerun sent ${literal} literal bytes of 48 MiB; ${present} MiB were already there`);
    assert.ok(res.summary!.matchedBytes >= 4 * MiB, `rerun reused only ${res.summary!.matchedBytes} bytes`);
    fs.rmSync(dir, { recursive: true, force: true }); // ~100 MiB
  });

  it('--quic: ssh vouches for both identities, data over QUIC; push and pull of a tree and a file, nothing pinned', async () => {
    const dir = tmpdir();
    const src = path.join(dir, 'src');
    buildTree(src);
    for (let i = 0; i < 3; i++) write(src, `big/b${i}.bin`, seeded(2 * MiB, 60 + i), 0o644, T0 + 20 + i);
    fs.utimesSync(path.join(src, 'big'), T0 + 30, T0 + 30);
    fs.utimesSync(src, T0 + 31, T0 + 31);

    const pushed = path.join(dir, 'pushed');
    const push = await sshSync(dir, ['-a', '--quic', src + '/', R(pushed)]);
    assertOk(push, 'push --quic');
    assertSameTree(pushed, src, 'push --quic');
    assert.equal(push.summary!.tree.lanes, 3, 'three large files over three QUIC streams');
    assert.ok(push.summary!.bytesOnWire.sent > 6 * MiB, 'QUIC wire bytes are counted');

    const pulled = path.join(dir, 'pulled');
    const pull = await sshSync(dir, ['-a', '--quic', '--jobs', '2', R(src + '/'), pulled]);
    assertOk(pull, 'pull --quic');
    assertSameTree(pulled, src, 'pull --quic');
    assert.equal(pull.summary!.tree.lanes, 2, '--jobs 2 on pull: the remote sender opens two streams');

    const file = path.join(dir, 'one.bin');
    assertOk(await sshSync(dir, ['-a', '--quic', path.join(src, 'big/b1.bin'), R(file)]), 'push file --quic');
    assert.equal(sha256(file), sha256(path.join(src, 'big/b1.bin')));

    // Rerun: no-op, and still no trust prompt or pin on either side (ssh vouched).
    const again = await sshSync(dir, ['-a', '--quic', src + '/', R(pushed)]);
    assertOk(again, 'push --quic rerun');
    assert.equal(again.summary!.tree.written, 0);
    for (const st of [path.join(dir, 'state'), path.join(dir, 'remote-state')]) {
      const pins = path.join(st, 'pins.conf');
      assert.ok(!fs.existsSync(pins) || fs.readFileSync(pins, 'utf8').trim() === '', `${st}: nothing pinned`);
    }
    assert.deepEqual(processesMatching('main.js', 'server', '--quic'), [], 'the remote peer exited with the session');
  });

  it('--max-size over ssh: pull passes it to the remote sender, push to the remote receiver (single file)', async () => {
    const dir = tmpdir();
    const src = path.join(dir, 'src');
    write(src, 'small.txt', 'small\n', 0o644, T0);
    write(src, 'big.bin', seeded(2 * MiB, 5), 0o644, T0);
    const pulled = path.join(dir, 'pulled');
    const pull = await sshSync(dir, ['-a', '--max-size', '1M', R(src + '/'), pulled]);
    assertOk(pull, 'pull --max-size');
    assert.deepEqual(files(pulled), ['small.txt']);
    const pushedFile = path.join(dir, 'pushed.bin');
    const push = await sshSync(dir, ['-a', '--max-size', '1M', path.join(src, 'big.bin'), R(pushedFile)]);
    assertOk(push, 'push file --max-size');
    assert.equal(push.summary!.decidedBy, 'size-limit');
    assert.ok(!fs.existsSync(pushedFile));
  });

  it('--quic pull of a missing remote SRC: exit 3 and the remote\'s message', async () => {
    const dir = tmpdir();
    const r = await sshSync(dir, ['-a', '--quic', R(path.join(dir, 'missing')), path.join(dir, 'out')], { human: true });
    assert.match(r.stderr, /does not exist/);
    assert.equal(r.code, 3, `exit ${r.code}: ${r.stderr}`);
  });

  it('ssh itself failing: exit 255 with ssh\'s own message', async () => {
    const dir = tmpdir();
    write(dir, 'src/x.txt', 'x\n');
    const rsh = 'ssh -p 1 -o BatchMode=yes -o ConnectTimeout=3';
    for (const [s, d] of [[path.join(dir, 'src') + '/', R(path.join(dir, 'out'))], [R(path.join(dir, 'src') + '/'), path.join(dir, 'out2')]]) {
      const r = await syncCmd(path.join(dir, 'state'), ['-a', '-e', rsh, s, d], { human: true });
      assert.equal(r.code, 255, `sync ${s} ${d}: exit ${r.code}: ${r.stderr}`);
      assert.match(r.stderr, /^ssh: connect to host 127\.0\.0\.1 port 1: Connection refused$/m);
    }
    assert.ok(!fs.existsSync(path.join(dir, 'out2')));
  });

  it('remote program missing: exit 127 and a hint about --remote-cmd', async () => {
    const dir = tmpdir();
    write(dir, 'src/x.txt', 'x\n');
    for (const [s, d] of [[path.join(dir, 'src') + '/', R(path.join(dir, 'out'))], [R(path.join(dir, 'src') + '/'), path.join(dir, 'out2')]]) {
      const r = await syncCmd(path.join(dir, 'state'), ['-a', '-e', sshd.rsh, '--remote-cmd', 'definitely-not-installed', s, d], { human: true });
      assert.equal(r.code, 127, `sync ${s} ${d}: exit ${r.code}: ${r.stderr}`);
      assert.match(r.stderr, /--remote-cmd/);
      assert.match(r.stderr, /definitely-not-installed/);
    }
    assert.ok(!fs.existsSync(path.join(dir, 'out')) && !fs.existsSync(path.join(dir, 'out2')));
  });

  it('pull of a missing remote SRC: exit 3 and the remote\'s message', async () => {
    const dir = tmpdir();
    const r = await sshSync(dir, ['-a', R(path.join(dir, 'missing')), path.join(dir, 'out')], { human: true });
    assert.match(r.stderr, /does not exist/);
    assert.doesNotMatch(r.stderr, /handshake|plaintext/, 'misleading handshake/--plaintext hint');
    assert.equal(r.code, 3, `exit ${r.code}: ${r.stderr}`);
  });
});
