// A local tree sync starts walking both trees before the program loads (ts/cli/early-walks.ts,
// decisions §101), and the program takes those walks only when it asks for the very same ones
// (ts/native/early-walks.ts). What can go wrong is silent: a guess from argv that stops matching
// what the program asks for costs the speed-up without any other sign, and a wrong match would
// walk the wrong thing. So the CLI runs here with a --require hook that reports, at exit, how many
// early walks were offered and taken, for each argument form the reader accepts.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import { planEarlyWalks } from '../ts/cli/early-walks';
import { call } from '../ts/native/binding';
import { earlyWalkCounts, offerEarlyWalk, takeEarlyWalk, walkKey } from '../ts/native/early-walks';
import { hashTree } from './helpers/data';
import { run, tmpdir } from './helpers/peers';

const HOOK = `
const fs = require('node:fs');
process.once('exit', () => {
  const r = process[Symbol.for('ffsync-native.early-walks')];
  fs.writeFileSync(process.env.FFSYNC_TEST_EARLY, JSON.stringify(r ? { taken: r.taken, left: r.walks.size } : null));
});
`;

function tree(dir: string): string {
  fs.mkdirSync(path.join(dir, 'sub', 'deep'), { recursive: true });
  for (let i = 0; i < 20; i++) fs.writeFileSync(path.join(dir, i % 2 ? 'sub' : 'sub/deep', `f${i}.txt`), `file ${i}\n`.repeat(i + 1));
  fs.symlinkSync('sub/f1.txt', path.join(dir, 'link'));
  return dir;
}

async function syncWithHook(args: string[], dir: string, env: NodeJS.ProcessEnv = {}) {
  const hook = path.join(dir, 'hook.cjs');
  fs.writeFileSync(hook, HOOK);
  const out = path.join(dir, 'early.json');
  fs.rmSync(out, { force: true });
  const r = await run(['sync', ...args], { NODE_OPTIONS: `--require ${hook}`, FFSYNC_TEST_EARLY: out, ...env }).done;
  return { ...r, early: JSON.parse(fs.readFileSync(out, 'utf8')) as { taken: number; left: number } | null };
}

describe('early walks of a local tree sync', () => {
  it('the program takes every walk started from argv, for each argument form read', async () => {
    const dir = tmpdir();
    const src = tree(path.join(dir, 'src'));
    const state = path.join(dir, 'state');
    const dst = path.join(dir, 'dst');
    // [arguments, walks expected: the source's, and the target's once it is a directory]
    const forms: [string[], number][] = [
      [['-a', `${src}/`, `${dst}/`, '--state-dir', state], 1], // the target does not exist yet
      [['-a', `${src}/`, `${dst}/`, '--state-dir', state, '-q'], 2],
      [['-av', '--delete', `${src}/`, `${dst}/`, `--state-dir=${state}`], 2],
      [['-rlpt', `${src}/`, dst, '--state-dir', state, '--no-fsync', '--timeout', '30'], 2],
      [['-r', `${src}/`, dst, '--state-dir', state, '-q'], 2], // no -l: symlinks skipped by both walks' options
      [['--archive', '--itemize-changes', '--stats', src, dst, '--state-dir', state], 1], // lands in dst/src: new
      [['--archive', '-q', src, dst, '--state-dir', state], 2],
      [['-aq', `${src}/`, `${dst}/`], 2], // the state directory from FFSYNC_STATE_DIR
    ];
    for (const [args, walks] of forms) {
      const r = await syncWithHook(args, dir, { FFSYNC_STATE_DIR: path.join(dir, 'env-state') });
      assert.equal(r.code, 0, `${args.join(' ')}: ${r.stderr}`);
      assert.deepEqual(r.early, { taken: walks, left: 0 }, `${args.join(' ')}: every early walk taken`);
    }
    const want = hashTree(src);
    want.delete('link'); // the last -r run (no -l) leaves the link -a made: compare files only
    const got = hashTree(path.join(dst, 'src'));
    for (const [p, h] of want) assert.equal(got.get(p), h, p);
  });

  it('argument forms it does not read start nothing, and the sync is as before', async () => {
    const dir = tmpdir();
    const src = tree(path.join(dir, 'src'));
    const state = path.join(dir, 'state');
    const dst = path.join(dir, 'dst');
    fs.mkdirSync(dst);
    for (const args of [
      ['-a', '--exclude', '*.txt', `${src}/`, `${dst}/`, '--state-dir', state],
      ['-ax', `${src}/`, `${dst}/`, '--state-dir', state],
      ['-ac', `${src}/`, `${dst}/`, '--state-dir', state],
      ['-a', '--', `${src}/`, `${dst}/`, '--state-dir', state],
      ['-lpt', `${src}/`, `${dst}/`, '--state-dir', state], // no -r: refused by the program
    ]) {
      const r = await syncWithHook(args, dir);
      assert.equal(r.early, null, `${args.join(' ')}: nothing started`);
      if (args[1] === '--exclude') {
        assert.equal(r.code, 0, r.stderr);
        assert.equal(fs.existsSync(path.join(dst, 'sub', 'f1.txt')), false, 'the --exclude run excluded *.txt');
        assert.ok(fs.lstatSync(path.join(dst, 'link')).isSymbolicLink());
      }
    }
  });

  it('a walk nobody takes fails nothing: the program reports its own error, and exits', async () => {
    const dir = tmpdir();
    const src = tree(path.join(dir, 'src'));
    // SRC and DEST the same: the program refuses (exit 1) after the source's walk was started.
    const r = await syncWithHook(['-a', `${src}/`, `${src}/`, '--state-dir', path.join(dir, 'state')], dir);
    assert.equal(r.code, 1, r.stderr);
    assert.match(r.stderr, /same path/);
    assert.doesNotMatch(r.stderr, /nhandled|Error: \w+:/);
    assert.deepEqual(r.early, { taken: 0, left: 1 });
  });
});

describe('planEarlyWalks', () => {
  const dir = tmpdir();
  const src = tree(path.join(dir, 'src'));
  const dst = path.join(dir, 'dst');
  fs.mkdirSync(dst);
  const state = path.join(dir, 'state');
  const argv = (...a: string[]) => ['node', 'main.js', ...a];

  it('names the two walks the program makes, with the options it makes them with', () => {
    assert.deepEqual(planEarlyWalks(argv('sync', '-a', `${src}/`, `${dst}/`, '--state-dir', state)), [
      { root: src, options: { excludes: [], stateDir: state, isSender: true, skipSymlinks: false, filesFromRecursive: false } },
      { root: dst, options: { excludes: [], protect: [], stateDir: state, isSender: false } },
    ]);
    // -r without -l: symlinks left out; an explicit -r also recurses into --files-from's directories.
    const [s] = planEarlyWalks(argv('sync', '-r', src, dst, '--state-dir', state));
    assert.deepEqual(s!.options, { excludes: [], stateDir: state, isSender: true, skipSymlinks: true, filesFromRecursive: true });
  });

  it('starts nothing for other commands, remote sides, files, unknown options or a missing -r', () => {
    const none: string[][] = [
      argv('send', `${src}/`, 'host:1'),
      argv('sync', '-a', `${src}/`, `host:${dst}/`, '--state-dir', state),
      argv('sync', '-a', `host:${src}/`, `${dst}/`, '--state-dir', state),
      argv('sync', '-a', path.join(src, 'sub', 'f1.txt'), `${dst}/`, '--state-dir', state),
      argv('sync', '-a', '-e', 'ssh', `${src}/`, `${dst}/`),
      argv('sync', '-a', '--files-from', 'list', `${src}/`, `${dst}/`),
      argv('sync', '-a', '--filter', '- x', `${src}/`, `${dst}/`),
      argv('sync', '-a', '-F', `${src}/`, `${dst}/`),
      argv('sync', '-a', '-L', `${src}/`, `${dst}/`),
      argv('sync', '-a', `--timeout`),
      argv('sync', '-lpt', `${src}/`, `${dst}/`),
      argv('sync', '-a', `${src}/`),
      argv('sync', '-a', `${path.join(dir, 'none')}/`, `${dst}/`),
    ];
    for (const a of none) assert.deepEqual(planEarlyWalks(a), [], a.slice(2).join(' '));
  });

  it("`SRC/..` and `SRC/.` name their directory's contents: the target is DEST itself", () => {
    const walks = planEarlyWalks(argv('sync', '-a', `${src}/sub/..`, dst, '--state-dir', state));
    assert.deepEqual(walks.map((w) => w.root), [src, dst]);
    assert.deepEqual(planEarlyWalks(argv('sync', '-a', `${src}/.`, dst, '--state-dir', state)).map((w) => w.root), [src, dst]);
  });

  it('C:/x is a host, except on Windows; -P and --partial start nothing when RSYNC_PARTIAL_DIR makes them --partial-dir', () => {
    assert.deepEqual(planEarlyWalks(argv('sync', '-a', 'C:/x/', `${dst}/`), 'linux'), []);
    assert.equal(planEarlyWalks(argv('sync', '-aP', `${src}/`, `${dst}/`, '--state-dir', state)).length, 2);
    process.env.RSYNC_PARTIAL_DIR = '.partial';
    try {
      assert.deepEqual(planEarlyWalks(argv('sync', '-aP', `${src}/`, `${dst}/`, '--state-dir', state)), []);
      assert.deepEqual(planEarlyWalks(argv('sync', '-a', '--partial', `${src}/`, `${dst}/`, '--state-dir', state)), []);
    } finally {
      delete process.env.RSYNC_PARTIAL_DIR;
    }
  });
});

describe('the hand-over', () => {
  it('keys ignore the order of options and absent ones, and a walk goes to one exact request', async () => {
    const a = { excludes: [], stateDir: '/s', isSender: true, skipSymlinks: false };
    const b = { skipSymlinks: false, isSender: true, stateDir: '/s', excludes: [], copyLinks: undefined };
    assert.equal(walkKey('/r', a), walkKey('/r', b));
    assert.notEqual(walkKey('/r', a), walkKey('/r', { ...a, skipSymlinks: true }));
    assert.notEqual(walkKey('/r', a), walkKey('/other', a));
    const before = earlyWalkCounts().taken;
    const walk = Promise.reject(Object.assign(new Error('ENOENT: no such directory /r'), { code: 'GenericFailure' }));
    offerEarlyWalk('/r', a, () => walk as never);
    await new Promise((r) => setImmediate(r)); // an offered walk that fails is no unhandled rejection
    assert.equal(takeEarlyWalk('/r', { ...a, skipSymlinks: true }), undefined, 'other options: not this walk');
    const taken = takeEarlyWalk('/r', b);
    assert.equal(taken, walk);
    assert.equal(takeEarlyWalk('/r', b), undefined, 'taken once');
    assert.equal(earlyWalkCounts().taken, before + 1);
    // Its error reaches whoever took it as the program's own walk's would.
    await assert.rejects(call(taken!), (e: Error & { code?: string }) => e.code === 'ENOENT' && /no such directory/.test(e.message));
  });

  it("the walk's progress goes to whoever takes it: what was listed so far at once, then as it comes", () => {
    let tick: (n: number) => void = () => undefined;
    const options = { excludes: [], stateDir: '/s', isSender: true };
    offerEarlyWalk('/p', options, (progress) => {
      tick = progress;
      return new Promise(() => undefined);
    });
    tick(100); // listed before anyone took it
    const seen: number[] = [];
    assert.ok(takeEarlyWalk('/p', options, (n) => seen.push(n)));
    tick(250);
    assert.deepEqual(seen, [100, 250]);
  });
});
