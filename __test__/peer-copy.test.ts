// A local `sync` has both peers in one process: the receiver takes each file's chunks from the
// sender's own file on the disk (in-kernel copies, each chunk proven by its hash where it
// landed) before asking for any, so the in-memory pipe carries conversations, not file data
// (decisions §111). The pipe's byte count says which way the data went; the literal count
// stays rsync's (the sender's data, however it moved); `--bwlimit` keeps the data on the pipe,
// where it is paced; every run leaves the target equal to the source. (A chunk that changed
// after the sender hashed it is asked for instead: `cargo test --test peer_copy`.)
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import { assertSameTree, run, seeded, T0, tmpdir, writeAt } from './helpers/peers';

const KiB = 1024;
const MiB = 1024 * KiB;

interface Summary {
  literalBytes: number;
  matchedBytes: number;
  bytesOnWire: { sent: number; received: number };
  tree?: { largeTransfers: number };
}

async function localSync(dir: string, args: string[]): Promise<Summary> {
  const r = await run(['sync', '--json', '--state-dir', path.join(dir, 'state'), ...args]).done;
  assert.equal(r.code, 0, r.stderr);
  return r.summary as unknown as Summary;
}

describe('a local sync copies file data from the sender’s files, not through the pipe', () => {
  it('a tree: new and changed large files cross as conversations only; the literal count is the sender’s data', async () => {
    const dir = tmpdir('ffsync-peercopy-');
    const src = path.join(dir, 'src');
    const dst = path.join(dir, 'dst');
    // A new 3 MiB file, and a 2 MiB one whose old version differs in its second half.
    const fresh = seeded(3 * MiB, 71);
    const changed = seeded(2 * MiB, 72);
    writeAt(src, 'fresh.bin', fresh, 0o644, T0 + 60);
    writeAt(src, 'sub/changed.bin', changed, 0o644, T0 + 60);
    const old = Buffer.from(changed);
    seeded(MiB, 73).copy(old, MiB);
    writeAt(dst, 'sub/changed.bin', old, 0o644, T0);
    const s = await localSync(dir, ['-a', `${src}/`, `${dst}/`]);
    assertSameTree(dst, src);
    assert.equal(s.tree?.largeTransfers, 2, JSON.stringify(s.tree));
    // 5 MiB moved; the pipe carried manifests and verdicts only.
    assert.ok(s.bytesOnWire.sent < 128 * KiB, `the pipe carried ${s.bytesOnWire.sent} bytes`);
    // The changed file's first half matched its old version; everything else is the sender's.
    assert.ok(s.matchedBytes >= MiB - 256 * KiB && s.matchedBytes <= MiB + 256 * KiB, `matched ${s.matchedBytes}`);
    assert.equal(s.literalBytes + s.matchedBytes, 5 * MiB);
  });

  it('a single file: the same, and a file that exists already is replaced whole from the sender’s copy', async () => {
    const dir = tmpdir('ffsync-peercopy-');
    const data = seeded(4 * MiB + 123, 74);
    writeAt(dir, 'src.bin', data, 0o644, T0 + 60);
    const to = path.join(dir, 'out.bin');
    const first = await localSync(dir, [path.join(dir, 'src.bin'), to]);
    assert.ok(fs.readFileSync(to).equals(data));
    assert.equal(first.literalBytes, data.length);
    assert.ok(first.bytesOnWire.sent < 64 * KiB, `the pipe carried ${first.bytesOnWire.sent} bytes`);
    // Another version over it: what it shares is matched, the rest copied from the source.
    const next = Buffer.from(data);
    seeded(MiB, 75).copy(next, 2 * MiB);
    writeAt(dir, 'src.bin', next, 0o644, T0 + 120);
    const second = await localSync(dir, [path.join(dir, 'src.bin'), to]);
    assert.ok(fs.readFileSync(to).equals(next));
    assert.ok(second.literalBytes >= MiB && second.literalBytes < 2 * MiB, `literal ${second.literalBytes}`);
    assert.ok(second.bytesOnWire.sent < 64 * KiB, `the pipe carried ${second.bytesOnWire.sent} bytes`);
  });

  it('--bwlimit: the data crosses the pipe, where it is paced', async () => {
    const dir = tmpdir('ffsync-peercopy-');
    const src = path.join(dir, 'src');
    const dst = path.join(dir, 'dst');
    writeAt(src, 'fresh.bin', seeded(3 * MiB, 76), 0o644, T0 + 60);
    const s = await localSync(dir, ['-a', '--bwlimit', String(1024 * 1024), `${src}/`, `${dst}/`]);
    assertSameTree(dst, src);
    assert.ok(s.bytesOnWire.sent > 3 * MiB, `the pipe carried ${s.bytesOnWire.sent} bytes`);
    assert.equal(s.literalBytes, 3 * MiB);
  });
});
