// Transport stress (issue §0: `sync` local to local failed at random on a real tree, the
// in-memory pipe delivering frames whose bytes changed after they were sent). Real data:
// two consecutive releases of npm packages with native binaries and big JS bundles
// (helpers/npm-fixtures.ts), synced again and again over every transport: cold into an
// empty directory, then to the other release and back (deltas). Every run must succeed,
// leave no `.ffsync-part` and produce exactly the source tree. The ownership rule each
// transport must honour is unit-tested in stream-ownership.test.ts.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, it, type TestContext } from 'node:test';
import { CLI, partials, type PeerResult, run, sha256, snapshotTree, type TreeEntry, tmpdir } from './helpers/peers';
import { releaseTrees, type ReleaseTrees } from './helpers/npm-fixtures';
import { type Sshd, startSshd, sshdUnavailable } from './helpers/sshd';

/** Runs per transport. Local syncs are cheap and were where the bug showed, so they get
 * more runs and steps. */
const REPS = { local: 8, localTar: 3, other: 2, otherTar: 1 };
const STEPS = { local: ['a', 'b', 'a', 'b'], other: ['a', 'b', 'a'] } as const;
const TIMEOUT = ['--timeout', '60'];

let trees: ReleaseTrees;
let expected: { a: Record<string, TreeEntry>; b: Record<string, TreeEntry> };
let expectedTar: { a: string; b: string };
let work: string;

before(() => {
  work = tmpdir('ffsync-stress-');
  trees = releaseTrees(path.join(work, 'fixtures'));
  if (trees.fallback) {
    const line = '!'.repeat(100);
    console.warn(`${line}\n!! transport-stress: NOT RUNNING ON REAL RELEASE DATA (${trees.fallback});\n!! using generated stand-ins instead\n${line}`);
  }
  expected = { a: snapshotTree(trees.a), b: snapshotTree(trees.b) };
  expectedTar = { a: sha256(trees.tarA), b: sha256(trees.tarB) };
});

function note(t: TestContext): void {
  t.diagnostic(trees.describe);
  if (trees.fallback) t.diagnostic(`FALLBACK DATA (${trees.fallback})`);
}

/** Paths whose entries differ, for a readable failure. */
function treeDiff(got: Record<string, TreeEntry>, want: Record<string, TreeEntry>): string[] {
  const out: string[] = [];
  for (const k of new Set([...Object.keys(got), ...Object.keys(want)])) {
    if (!(k in got)) out.push(`missing ${k}`);
    else if (!(k in want)) out.push(`extra ${k}`);
    else if (JSON.stringify(got[k]) !== JSON.stringify(want[k])) out.push(`differs ${k}: ${JSON.stringify(got[k])} != ${JSON.stringify(want[k])}`);
  }
  return out;
}

function ok(r: PeerResult, what: string): void {
  assert.equal(r.code, 0, `${what}: exit ${r.code} (signal ${r.signal}): ${r.stderr.trim().split('\n').slice(-5).join('\n')}`);
}

/** Moves `src` to `dst` (both plain paths; `tree`: directories) and returns every peer's result. */
type SyncOnce = (src: string, dst: string, o: { rep: number; state: string; tree: boolean }) => Promise<PeerResult[]>;

/**
 * One transport: `reps` runs of the release trees, then `tarReps` runs of the releases as
 * one tar file each, every run into a fresh directory with fresh state: cold release A,
 * then the other release and back (`steps`). Each sync must exit 0 on every peer, leave no
 * `.ffsync-part` and produce exactly the source.
 */
async function stress(t: TestContext, label: string, reps: { trees: number; tars: number; steps?: readonly ('a' | 'b')[] }, syncOnce: SyncOnce): Promise<void> {
  note(t);
  const runs = [...Array<boolean>(reps.trees).fill(true), ...Array<boolean>(reps.tars).fill(false)];
  for (const [rep, tree] of runs.entries()) {
    const dir = fs.mkdtempSync(path.join(work, `${label.replace(/\W+/g, '-')}-`));
    const dstDir = path.join(dir, 'dst');
    const dst = tree ? dstDir : path.join(dstDir, 'release.tar');
    if (!tree) fs.mkdirSync(dstDir);
    const steps = tree ? (reps.steps ?? STEPS.other) : STEPS.other;
    for (const [step, which] of steps.entries()) {
      const what = `${label} run ${rep + 1}/${runs.length} (${tree ? 'tree' : 'one tar file'}), ${step === 0 ? 'cold' : 'delta'} → release ${which.toUpperCase()}`;
      const t0 = Date.now();
      const src = tree ? (which === 'a' ? trees.a : trees.b) : which === 'a' ? trees.tarA : trees.tarB;
      const results = await syncOnce(src, dst, { rep, state: dir, tree });
      results.forEach((r, k) => ok(r, `${what} (peer ${k + 1})`));
      assert.deepEqual(partials(dstDir), [], `${what}: .ffsync-part files left`);
      if (tree) {
        const diff = treeDiff(snapshotTree(dst), expected[which]);
        assert.deepEqual(diff.slice(0, 10), [], `${what}: ${diff.length} entries differ from the source`);
      } else {
        assert.equal(sha256(dst), expectedTar[which], `${what}: content differs from the source`);
      }
      t.diagnostic(`${what}: ok in ${Date.now() - t0} ms`);
    }
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

async function fingerprint(state: string): Promise<string> {
  const r = await run(['id', '--state-dir', state]).done;
  ok(r, 'id');
  return r.stdout.trim();
}

/** `receive` then `send` over loopback (TLS with pinned identities unless `--plaintext`). */
async function sendReceive(src: string, dst: string, state: string, args: { both: string[]; send?: string[] }): Promise<PeerResult[]> {
  const [stS, stR] = [path.join(state, 'state-s'), path.join(state, 'state-r')];
  const pins: [string[], string[]] = [[], []];
  if (!args.both.includes('--plaintext')) {
    const [fpS, fpR] = [await fingerprint(stS), await fingerprint(stR)];
    pins[0] = ['--trust', fpR];
    pins[1] = ['--trust', fpS];
  }
  const recv = run(['receive', dst, '0', '--bind', '127.0.0.1', '--json', ...TIMEOUT, '--state-dir', stR, ...pins[1], ...args.both]);
  const l = await recv.waitFor((e) => e.event === 'listening');
  const send = await run(['send', src, `127.0.0.1:${l.port}`, '--json', ...TIMEOUT, '--state-dir', stS, ...pins[0], ...args.both, ...(args.send ?? [])]).done;
  // A sender that failed early must not leave the receiver waiting.
  const stop = setTimeout(() => recv.child.kill(), 30_000);
  try {
    return [send, await recv.done];
  } finally {
    clearTimeout(stop);
  }
}

/** `sync -a` through `rsh`, pushing on even runs and pulling on odd ones. */
async function syncRemote(rsh: string, src: string, dst: string, o: { rep: number; state: string; tree: boolean }): Promise<PeerResult[]> {
  const remote = `env FFSYNC_STATE_DIR=${path.join(o.state, 'remote-state')} ${process.execPath} ${CLI}`;
  const slash = o.tree ? '/' : '';
  const [from, to] = o.rep % 2 === 0 ? [`${src}${slash}`, `127.0.0.1:${dst}${slash}`] : [`127.0.0.1:${src}${slash}`, `${dst}${slash}`];
  return [await run(['sync', '-a', '--json', ...TIMEOUT, '--state-dir', path.join(o.state, 'state'), '-e', rsh, '--remote-cmd', remote, from, to]).done];
}

describe('transport stress: release-to-release syncs of real npm artifacts, every run must succeed', () => {
  it('local sync -a (in-process pipe; lanes: --jobs 1, default, --jobs 8)', async (t) => {
    // --jobs 1 showed the old bug most often among the tree runs (one lane pipe carries
    // every large file); the tar runs, most often of all (one long DATA stream).
    const jobs = [['--jobs', '1'], [], ['--jobs', '1'], ['--jobs', '8']];
    await stress(t, 'local', { trees: REPS.local, tars: REPS.localTar, steps: STEPS.local }, async (src, dst, o) => {
      const slash = o.tree ? '/' : '';
      return [await run(['sync', '-a', '--json', ...TIMEOUT, '--state-dir', path.join(o.state, 'state'), ...jobs[o.rep % jobs.length], `${src}${slash}`, `${dst}${slash}`]).done];
    });
  });

  const other = { trees: REPS.other, tars: REPS.otherTar };
  it('send/receive over plain TCP (--plaintext)', async (t) => {
    await stress(t, 'tcp', other, (src, dst, o) => sendReceive(src, dst, o.state, { both: ['--plaintext'] }));
  });

  it('send/receive over TLS (the default)', async (t) => {
    await stress(t, 'tls', other, (src, dst, o) => sendReceive(src, dst, o.state, { both: [] }));
  });

  it('send/receive over TLS with --parallel 4 (lanes are more TLS connections)', async (t) => {
    await stress(t, 'tls-parallel', { trees: REPS.other, tars: 0 }, (src, dst, o) => sendReceive(src, dst, o.state, { both: [], send: ['--parallel', '4'] }));
  });

  it('send/receive over QUIC (--quic; lanes are streams)', async (t) => {
    await stress(t, 'quic', other, (src, dst, o) => sendReceive(src, dst, o.state, { both: ['--quic'] }));
  });

  it('sync -a over stdio pipes to a remote command (ssh stand-in: `sh -c`; push, then pull)', async (t) => {
    // The remote-shell path without sshd: both stdio ends (our child's pipes, the remote
    // side's process.stdin/stdout) are the same code as over ssh.
    const fake = path.join(work, 'fake-ssh.sh');
    fs.writeFileSync(fake, '#!/bin/sh\n# fake-ssh HOST COMMAND: run COMMAND here\nexec /bin/sh -c "$2"\n', { mode: 0o755 });
    await stress(t, 'stdio', other, (src, dst, o) => syncRemote(`/bin/sh ${fake}`, src, dst, o));
  });

  const noSshd = sshdUnavailable();
  describe('over ssh', { skip: noSshd ? `sync over ssh skipped: ${noSshd}` : false }, () => {
    let sshd: Sshd;
    before(async () => {
      sshd = await startSshd();
    });
    after(async () => {
      await sshd?.stop();
    });
    it('sync -a over ssh (push, then pull)', async (t) => {
      await stress(t, 'ssh', other, (src, dst, o) => syncRemote(sshd.rsh, src, dst, o));
    });
  });
});
