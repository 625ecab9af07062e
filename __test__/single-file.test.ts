// End-to-end single-file scenarios with two real processes over loopback.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import { modify, seeded, sha256, sync, tmpdir } from './helpers/peers';

const MiB = 1024 * 1024;

function setup(size = 24 * MiB) {
  const dir = tmpdir();
  const old = seeded(size, 1);
  return {
    dir,
    old,
    src: path.join(dir, 'source.bin'),
    dst: path.join(dir, 'out', 'target.bin'),
    stateS: path.join(dir, 'state-s'),
    stateR: path.join(dir, 'state-r'),
  };
}

function assertOk(res: Awaited<ReturnType<typeof sync>>) {
  assert.equal(res.send.code, 0, `sender failed: ${res.send.stderr}`);
  assert.equal(res.recv.code, 0, `receiver failed: ${res.recv.stderr}`);
  assert.equal(res.send.summary?.ok, true);
  assert.equal(res.recv.summary?.ok, true);
}

describe('single file sync', () => {
  it('fresh: receiver has nothing; result is byte-identical and adopts mtime and mode', async () => {
    const t = setup();
    fs.mkdirSync(path.dirname(t.dst));
    fs.writeFileSync(t.src, t.old);
    fs.chmodSync(t.src, 0o640);
    fs.utimesSync(t.src, new Date('2024-01-02T03:04:05Z'), new Date('2024-01-02T03:04:05.123Z'));
    const res = await sync(t.src, t.dst, t);
    assertOk(res);
    assert.equal(sha256(t.dst), sha256(t.src));
    assert.equal(res.recv.summary!.literalBytes, t.old.length);
    const st = fs.statSync(t.dst);
    assert.equal(st.mtimeMs, fs.statSync(t.src).mtimeMs);
    assert.equal(st.mode & 0o777, 0o640);
    assert.ok(res.send.summary!.bytesOnWire.sent >= t.old.length, 'random data crosses the wire uncompressed');
    assert.deepEqual(fs.readdirSync(path.dirname(t.dst)), ['target.bin'], 'no temp files left beside the target');
  });

  it('identical content with another mtime and no index: nothing but the manifest crosses the wire', async () => {
    const t = setup();
    fs.mkdirSync(path.dirname(t.dst));
    fs.writeFileSync(t.src, t.old);
    fs.writeFileSync(t.dst, t.old);
    fs.utimesSync(t.dst, new Date('2020-01-01'), new Date('2020-01-01'));
    const res = await sync(t.src, t.dst, t);
    assertOk(res);
    assert.equal(res.recv.summary!.upToDate, true);
    assert.equal(res.recv.summary!.decidedBy, 'scan-root');
    assert.equal(res.recv.summary!.literalBytes, 0);
    assert.ok(res.send.summary!.bytesOnWire.sent < 64 * 1024, `sent ${res.send.summary!.bytesOnWire.sent}`);
    assert.equal(fs.statSync(t.dst).mtimeMs, fs.statSync(t.src).mtimeMs, 'mtime adopted');
  });

  it('modified: scattered overwrites, insertions and deletions send only changed chunks', async () => {
    const t = setup();
    fs.mkdirSync(path.dirname(t.dst));
    fs.writeFileSync(t.dst, t.old);
    const changed = modify(t.old, 7);
    fs.writeFileSync(t.src, changed);
    const res = await sync(t.src, t.dst, t);
    assertOk(res);
    assert.equal(sha256(t.dst), sha256(t.src));
    const literal = res.recv.summary!.literalBytes;
    assert.ok(literal > 0 && literal < changed.length / 3, `literal ${literal} of ${changed.length}`);
    assert.ok(res.send.summary!.bytesOnWire.sent < changed.length / 3);
    assert.equal(res.recv.summary!.matchedBytes + literal, changed.length);
  });

  it('appended: only the tail crosses the wire', async () => {
    const t = setup();
    fs.mkdirSync(path.dirname(t.dst));
    fs.writeFileSync(t.dst, t.old);
    fs.writeFileSync(t.src, Buffer.concat([t.old, seeded(2 * MiB, 9)]));
    const res = await sync(t.src, t.dst, t);
    assertOk(res);
    assert.equal(sha256(t.dst), sha256(t.src));
    assert.ok(res.recv.summary!.literalBytes < 4 * MiB, `literal ${res.recv.summary!.literalBytes}`);
  });

  it('warm: with both indexes, an unchanged file is decided by content roots for the cost of a stat', async () => {
    const t = setup();
    fs.mkdirSync(path.dirname(t.dst));
    fs.writeFileSync(t.src, t.old);
    const old = new Date(Date.now() - 3600_000);
    fs.utimesSync(t.src, old, old);
    assertOk(await sync(t.src, t.dst, t));
    const again = await sync(t.src, t.dst, t);
    assertOk(again);
    assert.equal(again.recv.summary!.decidedBy, 'index-root');
    assert.ok(!again.send.events.some((e) => e.event === 'phase' && e.phase === 'hashing'), 'the sender must not rescan');
    assert.ok(!again.recv.events.some((e) => e.event === 'phase' && e.phase === 'hashing'), 'the receiver must not rescan');
  });

  it('warm modified: the receiver reuses its index and the result is exact', async () => {
    const t = setup();
    fs.mkdirSync(path.dirname(t.dst));
    fs.writeFileSync(t.src, t.old);
    assertOk(await sync(t.src, t.dst, t));
    fs.writeFileSync(t.src, modify(t.old, 3));
    const res = await sync(t.src, t.dst, t);
    assertOk(res);
    assert.equal(sha256(t.dst), sha256(t.src));
    const recvHash = res.recv.events.find((e) => e.event === 'phase' && e.phase === 'hashing' && e.state === 'end');
    assert.ok(recvHash, 'receiver reports its hashing phase');
    assert.ok(res.recv.summary!.literalBytes < 8 * MiB);
  });

  it('same size and mtime but different content: receiver index catches it; --checksum always does', async () => {
    const t = setup(4 * MiB);
    fs.mkdirSync(path.dirname(t.dst));
    const stamp = new Date('2023-05-05T00:00:00Z');
    fs.writeFileSync(t.src, t.old);
    fs.utimesSync(t.src, stamp, stamp);
    assertOk(await sync(t.src, t.dst, t)); // both sides now hold indexes
    const changed = Buffer.from(t.old);
    changed[1000] ^= 0xff; // same size
    fs.writeFileSync(t.src, changed);
    fs.utimesSync(t.src, stamp, stamp); // same mtime, like npm tarballs
    const res = await sync(t.src, t.dst, t);
    assertOk(res);
    assert.equal(sha256(t.dst), sha256(t.src), 'stale content survived a sync');

    // Without any index (fresh state dirs) size+mtime would say "unchanged"; --checksum must not.
    changed[2000] ^= 0xff;
    fs.writeFileSync(t.src, changed);
    fs.utimesSync(t.src, stamp, stamp);
    const fresh = { stateS: path.join(t.dir, 's2'), stateR: path.join(t.dir, 'r2') };
    const quick = await sync(t.src, t.dst, fresh);
    assertOk(quick);
    assert.equal(quick.recv.summary!.decidedBy, 'size-mtime', 'documented quick-check behaviour without indexes');
    const forced = await sync(t.src, t.dst, { ...fresh, sendArgs: ['--checksum'] });
    assertOk(forced);
    assert.equal(sha256(t.dst), sha256(t.src));
  });

  it('--from reuses chunks of another local file', async () => {
    const t = setup();
    fs.mkdirSync(path.dirname(t.dst));
    const seedFile = path.join(t.dir, 'previous-release.bin');
    fs.writeFileSync(seedFile, t.old);
    fs.writeFileSync(t.src, modify(t.old, 5));
    const res = await sync(t.src, t.dst, { ...t, recvArgs: ['--from', seedFile] });
    assertOk(res);
    assert.equal(sha256(t.dst), sha256(t.src));
    assert.ok(res.recv.summary!.literalBytes < 8 * MiB);
  });

  it('empty file', async () => {
    const t = setup();
    fs.mkdirSync(path.dirname(t.dst));
    fs.writeFileSync(t.src, '');
    fs.writeFileSync(t.dst, 'something old');
    const res = await sync(t.src, t.dst, t);
    assertOk(res);
    assert.equal(fs.readFileSync(t.dst).length, 0);
  });

  it('compressible data is sent compressed', async () => {
    const t = setup();
    fs.mkdirSync(path.dirname(t.dst));
    fs.writeFileSync(t.src, Buffer.alloc(8 * MiB, 'abcdefgh'));
    const res = await sync(t.src, t.dst, t);
    assertOk(res);
    assert.equal(sha256(t.dst), sha256(t.src));
    assert.ok(res.send.summary!.bytesOnWire.sent < MiB, `sent ${res.send.summary!.bytesOnWire.sent}`);
  });
});

describe('chunk parameter threshold', () => {
  it('a file that grows across 16 MiB still reuses its unchanged prefix', async () => {
    const t = setup(12 * MiB);
    fs.mkdirSync(path.dirname(t.dst));
    fs.writeFileSync(t.dst, t.old);
    fs.writeFileSync(t.src, Buffer.concat([t.old, seeded(8 * MiB, 21)]));
    const res = await sync(t.src, t.dst, t);
    assertOk(res);
    assert.equal(sha256(t.dst), sha256(t.src));
    assert.ok(res.recv.summary!.literalBytes < 10 * MiB, `literal ${res.recv.summary!.literalBytes}`);
  });
});
