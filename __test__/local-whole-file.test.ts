// A local `sync` sends a changed file up to 1 MiB whole, as rsync copies whole between local
// paths, and keeps deltas for larger ones (decisions §107): `-W` sends every file whole,
// `--no-whole-file` every one over 64 KiB as a delta, and so does `--inplace` (its files keep
// their inodes). The plan's counts (small transfers, large
// ones) and the bytes matched against the old versions say which way each file went; every
// run leaves the target equal to the source. And the option's wire form: TREE_OPTIONS' 18th
// byte (capability WHOLE_SMALL).
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import { send } from '../ts/api/send';
import { Capability, decodeTreeOptions, encodeTreeOptions, OUR_CAPABILITIES } from '../ts/protocol/messages';
import { assertSameTree, run, seeded, snapshotTree, T0, tmpdir, writeAt } from './helpers/peers';

const KiB = 1024;
const MiB = 1024 * KiB;

/** Old versions at the target, new ones (one byte changed in the middle, a later mtime) at the
 * source: 200 KiB and exactly 1 MiB (whole by default), 1 MiB + 1 and 3 MiB (deltas). */
const FILES: [string, number][] = [
  ['mid.bin', 200 * KiB],
  ['sub/mib.bin', MiB],
  ['over.bin', MiB + 1],
  ['big.bin', 3 * MiB],
];

function fixture(dir: string): { src: string; old: string } {
  const src = path.join(dir, 'src');
  const old = path.join(dir, 'old');
  FILES.forEach(([name, len], i) => {
    const data = seeded(len, 40 + i);
    writeAt(old, name, data, 0o644, T0);
    const changed = Buffer.from(data);
    changed[len >> 1] ^= 0xff;
    writeAt(src, name, changed, 0o644, T0 + 60);
  });
  return { src, old };
}

interface TreeSummary {
  matchedBytes: number;
  literalBytes: number;
  tree: { smallTransfers: number; largeTransfers: number };
}

async function syncInto(dir: string, src: string, old: string, name: string, flags: string[]): Promise<TreeSummary & { inodesKept: number }> {
  const dst = path.join(dir, name);
  fs.cpSync(old, dst, { recursive: true, preserveTimestamps: true });
  const inodes = FILES.map(([f]) => fs.statSync(path.join(dst, f)).ino);
  const r = await run(['sync', '-a', '--json', '--state-dir', path.join(dir, `state-${name}`), ...flags, `${src}/`, `${dst}/`]).done;
  assert.equal(r.code, 0, r.stderr);
  assertSameTree(dst, src);
  const inodesKept = FILES.filter(([f], i) => fs.statSync(path.join(dst, f)).ino === inodes[i]).length;
  return { ...(r.summary as unknown as TreeSummary), inodesKept };
}

describe('a local sync sends changed files up to 1 MiB whole', () => {
  it('by default: 200 KiB and 1 MiB whole in batches, larger files as deltas against their old versions', async () => {
    const dir = tmpdir('ffsync-whole-');
    const { src, old } = fixture(dir);
    const s = await syncInto(dir, src, old, 'default', []);
    assert.equal(s.tree.smallTransfers, 2, JSON.stringify(s.tree));
    assert.equal(s.tree.largeTransfers, 2, JSON.stringify(s.tree));
    // The two large files' unchanged chunks come from their old versions: all but the chunk
    // holding the changed byte (at most 256 KiB each with these sizes' chunk parameters).
    const large = MiB + 1 + 3 * MiB;
    assert.ok(s.matchedBytes >= large - 2 * 256 * KiB, `matched ${s.matchedBytes}`);
    // What went whole went in full.
    assert.ok(s.literalBytes >= 200 * KiB + MiB, `literal ${s.literalBytes}`);
    // The receiver's index learned the whole copies too: a second sync finds all four unchanged
    // by content, and a same-size, same-mtime change to one of them is still found.
    const dst = path.join(dir, 'default');
    const again = async () => (await run(['sync', '-a', '--json', '--state-dir', path.join(dir, 'state-default'), `${src}/`, `${dst}/`]).done).summary as unknown as TreeSummary & { tree: { unchanged: number } };
    const second = await again();
    assert.deepEqual([second.tree.smallTransfers, second.tree.largeTransfers, second.tree.unchanged], [0, 0, FILES.length]);
    const mid = path.join(dst, 'mid.bin');
    const st = fs.statSync(mid);
    const bytes = fs.readFileSync(mid);
    bytes[7] ^= 1;
    fs.writeFileSync(mid, bytes);
    fs.utimesSync(mid, st.atime, st.mtime);
    const third = await again();
    assert.equal(third.tree.smallTransfers, 1, JSON.stringify(third.tree));
    assertSameTree(dst, src);
  });

  it('--no-whole-file and --inplace: every changed file over 64 KiB is a delta; -W: every file whole', async () => {
    const dir = tmpdir('ffsync-whole-');
    const { src, old } = fixture(dir);
    const deltas = await syncInto(dir, src, old, 'deltas', ['--no-whole-file']);
    assert.equal(deltas.tree.smallTransfers, 0, JSON.stringify(deltas.tree));
    assert.equal(deltas.tree.largeTransfers, 4, JSON.stringify(deltas.tree));
    const total = FILES.reduce((n, [, len]) => n + len, 0);
    // The 200 KiB and 1 MiB files matched too: more than the default's large files alone.
    assert.ok(deltas.matchedBytes > MiB + 1 + 3 * MiB, `matched ${deltas.matchedBytes}`);
    assert.ok(deltas.literalBytes < total / 2, `literal ${deltas.literalBytes}`);
    const whole = await syncInto(dir, src, old, 'whole', ['-W']);
    assert.equal(whole.matchedBytes, 0);
    assert.equal(whole.literalBytes, total);
    assert.equal(whole.tree.smallTransfers, 2, JSON.stringify(whole.tree));
    // --inplace: every file a delta, updated inside its target (the same inode).
    const inplace = await syncInto(dir, src, old, 'inplace', ['--inplace']);
    assert.equal(inplace.tree.smallTransfers, 0, JSON.stringify(inplace.tree));
    assert.equal(inplace.tree.largeTransfers, 4, JSON.stringify(inplace.tree));
    assert.equal(inplace.inodesKept, FILES.length);
  });

  it('a receiver applies the option from the wire, and one running with --inplace refuses it (exit 2, nothing written)', async () => {
    // Only a local sync sets it; the library's tree choices can send it to any receiver.
    const dir = tmpdir('ffsync-whole-');
    const { src, old } = fixture(dir);
    for (const inplace of [false, true]) {
      const dst = path.join(dir, inplace ? 'inplace' : 'plain');
      fs.cpSync(old, dst, { recursive: true, preserveTimestamps: true });
      const before = snapshotTree(dst);
      const recv = run(['receive', dst, '0', '--bind', '127.0.0.1', '--plaintext', '--json', '--timeout', '20', '--state-dir', path.join(dir, `r-${inplace}`), ...(inplace ? ['--inplace'] : [])]);
      const port = (await recv.waitFor((e) => e.event === 'listening')).port as number;
      const sending = send({ path: src, host: '127.0.0.1', port, plaintext: true, stateDir: path.join(dir, `s-${inplace}`), timeoutMs: 20_000, tree: { choices: { wholeSmall: true } } });
      if (inplace) {
        // The sender is told why, with the receiver's exit code.
        await assert.rejects(sending, (e: Error & { exitCode?: number }) => e.exitCode === 2 && /this --inplace receiver would replace/.test(e.message));
        const r = await recv.done;
        assert.equal(r.code, 2, r.stderr);
        assert.match(r.stderr, /this --inplace receiver would replace/);
        assert.deepEqual(snapshotTree(dst), before, 'nothing written');
      } else {
        const summary = (await sending) as unknown as TreeSummary & { ok: boolean };
        assert.equal(summary.ok, true);
        assert.equal(summary.tree.smallTransfers, 2, JSON.stringify(summary.tree));
        assert.equal((await recv.done).code, 0);
        assertSameTree(dst, src);
      }
    }
  });

  it('TREE_OPTIONS carries it as bit 8 of the 18th byte, which this build accepts and advertises', () => {
    assert.ok(OUR_CAPABILITIES & Capability.WHOLE_SMALL);
    const alone = encodeTreeOptions({ attrs: 0, wholeSmall: true });
    assert.equal(alone.length, 18);
    assert.equal(alone[17], 8);
    assert.equal(decodeTreeOptions(alone).wholeSmall, true);
    const all = encodeTreeOptions({ attrs: 0, sizeOnly: true, ignoreExisting: true, existingOnly: true, wholeSmall: true });
    assert.equal(all[17], 15);
    assert.deepEqual(
      [decodeTreeOptions(all).sizeOnly, decodeTreeOptions(all).ignoreExisting, decodeTreeOptions(all).existingOnly, decodeTreeOptions(all).wholeSmall],
      [true, true, true, true],
    );
    assert.equal(encodeTreeOptions({ attrs: 0 }).length, 17, 'no choices, no 18th byte');
    assert.equal(decodeTreeOptions(encodeTreeOptions({ attrs: 0, sizeOnly: true })).wholeSmall, false);
    const unknown = Buffer.from(all);
    unknown[17] = 16;
    assert.throws(() => decodeTreeOptions(unknown), /bad TREE_OPTIONS/);
  });
});
