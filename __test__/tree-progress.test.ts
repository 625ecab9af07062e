// A tree session reports the tree's phases, not each file's (api/tree-progress.ts). Each large
// file's conversation has phases of its own (hashing, diffing, sending or receiving, verifying);
// printed inside a tree they made two to three unnamed lines per file per peer (100 files: 200
// lines on the sender's log, 300 on the receiver's), and their progress events restarted from 0
// at every file under the tree's own phase name. Now: one transfer phase per peer, whose count
// grows across every file, small and large, and ends at the plan's transfer size.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import type { Phase, SyncEvents } from '../ts/api/events';
import { TreeTransferProgress } from '../ts/api/tree-progress';
import { CLI, assertSameTree, modify, seeded, sync, tmpdir } from './helpers/peers';
import { ChildRun } from './helpers/process';

const KiB = 1024;
const MiB = 1024 * KiB;
const LARGE = 12;

type Recorded = { kind: 'start' | 'progress' | 'end'; phase: Phase; n: number } | { kind: 'info'; message: string };

function recorder(): { events: SyncEvents; seen: Recorded[] } {
  const seen: Recorded[] = [];
  return {
    seen,
    events: {
      phaseStart: (phase, n) => seen.push({ kind: 'start', phase, n }),
      progress: (phase, n) => seen.push({ kind: 'progress', phase, n }),
      phaseEnd: (phase, n) => seen.push({ kind: 'end', phase, n }),
      info: (message) => seen.push({ kind: 'info', message }),
    },
  };
}

describe('TreeTransferProgress', () => {
  it("folds each file's progress into the tree's phase and keeps the file's own phases to itself", () => {
    const { events, seen } = recorder();
    const t = new TreeTransferProgress(events, 'receiving');
    t.start(1000);
    t.add(100); // a batch of small files
    const a = t.file();
    const b = t.file();
    a.events.phaseStart?.('diffing', 400);
    a.events.phaseEnd?.('diffing', 400, 1);
    a.events.progress?.('receiving', 50);
    b.events.progress?.('receiving', 30);
    a.events.progress?.('receiving', 20); // a second phase of the same file starting over: no step back
    a.events.progress?.('verifying', 400); // not the tree's phase
    a.events.info?.('warning: something');
    a.end(400); // arrived: its size counts in place of what it reported
    a.events.progress?.('receiving', 999); // late: ignored
    b.end(0); // failed: what it reported still counts (the tree's count never goes back)
    b.end(300); // once only
    t.end();
    const progress = seen.filter((e) => e.kind === 'progress').map((e) => (e as { n: number }).n);
    assert.deepEqual(progress, [100, 150, 180, 530]);
    assert.deepEqual(
      seen.filter((e) => e.kind !== 'progress'),
      [
        { kind: 'start', phase: 'receiving', n: 1000 },
        { kind: 'info', message: 'warning: something' },
        { kind: 'end', phase: 'receiving', n: 1000 },
      ],
    );
  });
});

/** A tree with LARGE modified large files (each its own conversation), new large ones, and
 * small files in batches; the target holds the old versions, older by mtime. */
function fixture(): { src: string; dst: string; root: string } {
  const root = tmpdir('ffsync-tree-progress-');
  const src = path.join(root, 'src');
  const dst = path.join(root, 'dst');
  fs.mkdirSync(src);
  fs.mkdirSync(dst);
  const old = new Date('2024-01-01T00:00:00Z');
  for (let i = 0; i < LARGE; i++) {
    const before = seeded(MiB + 64 * KiB * i, 100 + i);
    fs.writeFileSync(path.join(dst, `big${i}.bin`), before);
    fs.utimesSync(path.join(dst, `big${i}.bin`), old, old);
    fs.writeFileSync(path.join(src, `big${i}.bin`), modify(before, 200 + i));
  }
  for (let i = 0; i < 3; i++) fs.writeFileSync(path.join(src, `new${i}.bin`), seeded(2 * MiB, 300 + i));
  for (let i = 0; i < 40; i++) fs.writeFileSync(path.join(src, `small${i}.txt`), seeded(3 * KiB, 400 + i));
  return { src, dst, root };
}

describe('tree session progress', () => {
  it('reports one transfer phase per peer, growing across every file to the plan’s transfer size (--json)', async () => {
    const { src, dst, root } = fixture();
    const r = await sync(src, dst, { stateS: path.join(root, 'ss'), stateR: path.join(root, 'sr') });
    assert.equal(r.send.code, 0, r.send.stderr);
    assert.equal(r.recv.code, 0, r.recv.stderr);
    assertSameTree(dst, src);
    const tree = r.recv.summary!.tree;
    assert.equal(tree.largeTransfers, LARGE + 3, 'every large file had its own conversation');
    for (const [peer, phase] of [
      [r.send, 'sending'],
      [r.recv, 'receiving'],
    ] as const) {
      const phases = peer.events.filter((e) => e.event === 'phase');
      const starts = phases.filter((e) => e.state === 'start').map((e) => e.phase);
      assert.equal(new Set(starts).size, starts.length, `${phase}: no phase starts twice (${starts.join(', ')})`);
      for (const p of ['diffing', 'verifying']) assert.ok(!starts.includes(p), `${phase}: a file's ${p} is not a phase of the tree`);
      const start = phases.find((e) => e.phase === phase && e.state === 'start')!;
      const end = phases.find((e) => e.phase === phase && e.state === 'end')!;
      assert.equal(start.totalBytes, tree.transferBytes, `${phase}: the phase is over the plan's transfer size`);
      assert.equal(end.doneBytes, tree.transferBytes);
      const counts = peer.events.filter((e) => e.event === 'progress' && e.phase === phase).map((e) => e.doneBytes as number);
      for (let i = 1; i < counts.length; i++) assert.ok(counts[i]! >= counts[i - 1]!, `${phase}: progress went back: ${counts.join(', ')}`);
      for (const n of counts) assert.ok(n <= tree.transferBytes, `${phase}: progress ${n} beyond the total ${tree.transferBytes}`);
    }
  });

  it('prints a line per phase, not per file, without --json', async () => {
    const { src, dst, root } = fixture();
    const env = { ...process.env, NO_COLOR: '1' };
    const recv = new ChildRun('receiver', [process.execPath, CLI, 'receive', dst, '0', '--plaintext', '--timeout', '20', '--state-dir', path.join(root, 'sr')], { env });
    const listening = await recv.waitForLine((l) => l.startsWith('listening on '), 20_000);
    const port = listening.slice(listening.lastIndexOf(':') + 1);
    const send = new ChildRun('sender', [process.execPath, CLI, 'send', src, `127.0.0.1:${port}`, '--plaintext', '--timeout', '20', '--state-dir', path.join(root, 'ss')], { env });
    const [s, r] = [await send.exited, await recv.exited];
    assert.equal(s.code, 0, send.stderr);
    assert.equal(r.code, 0, recv.stderr);
    assertSameTree(dst, src);
    for (const [peer, phase] of [
      [send, 'sending'],
      [recv, 'receiving'],
    ] as const) {
      const lines = peer.stderr.split('\n').filter(Boolean);
      // scanning, perhaps hashing (roots), and the transfer: whatever the number of files.
      assert.ok(lines.length <= 3, `${peer.label} printed ${lines.length} lines for ${LARGE + 3} large files:\n${peer.stderr}`);
      assert.equal(lines.filter((l) => l.startsWith(phase)).length, 1, peer.stderr);
      assert.match(lines.find((l) => l.startsWith(phase))!, new RegExp(`^${phase}\\s+\\d+\\.\\d+ MiB`));
    }
  });
});
