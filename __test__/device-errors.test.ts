// Writeback errors: the device under the filesystem fails writes the filesystem had accepted.
// The filesystem (ext4 on a loop device) has room, so every write() succeeds into the page
// cache; its backing file lives on a tmpfs that is full, so the device fails the data when the
// kernel writes it back, and only fsync reports it (as ENOSPC: a thin-provisioned volume that ran
// out). The class this catches: an error the kernel reports late. The verified temp must be made
// durable before it is renamed, so such an error leaves the old file in place, removes the temp,
// exits 11 with one line, and a rerun once the device has room completes. (`bad-input.test.ts`
// covers the filesystem refusing the write itself.)
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { after, describe, it } from 'node:test';
import { assertSameTree, canMount, oneErrorLine, run, seeded, snapshot, startReceiver, tmpdir, writeAt } from './helpers/peers';

const MiB = 1024 * 1024;

/** Why this machine cannot build the device, or undefined. */
function unavailable(): string | undefined {
  if (!canMount()) return 'needs root on Linux to mount a tmpfs and a loop device';
  if (spawnSync('mkfs.ext4', ['-V']).error || spawnSync('e2fsck', ['-V']).error) return 'e2fsprogs (mkfs.ext4, e2fsck) is not installed';
  return undefined;
}

const mounts: string[] = [];
after(() => {
  // Innermost first: the loop-mounted filesystem, then the tmpfs holding its image.
  for (const m of mounts.reverse()) spawnSync('umount', ['-l', m]);
});

interface Device {
  /** The mounted filesystem (ext4 on a loop device, 128 MiB, nearly empty). */
  mnt: string;
  /** Fill the tmpfs under the image: from now on the device fails writes to blocks not yet backed. */
  fill(): void;
  /** Give the device room again, and repair and remount the filesystem (ext4 aborts its journal
   * when the device fails a journal write, and stays read-only until checked): what is on the
   * device is then what a machine that lost power at the failure would find. */
  recover(): void;
}

/** ext4 on a loop device whose sparse 128 MiB image lives on a 40 MiB tmpfs. */
function device(dir: string): Device {
  const backing = path.join(dir, 'backing');
  const mnt = path.join(dir, 'mnt');
  fs.mkdirSync(backing);
  fs.mkdirSync(mnt);
  execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=40m', 'tmpfs', backing]);
  mounts.push(backing);
  const img = path.join(backing, 'img');
  fs.writeFileSync(img, '');
  fs.truncateSync(img, 128 * MiB);
  execFileSync('mkfs.ext4', ['-q', '-F', img]);
  execFileSync('mount', ['-o', 'loop', img, mnt]);
  mounts.push(mnt);
  const filler = path.join(backing, 'filler');
  return {
    mnt,
    fill() {
      // To the last page: a page left free would back a small file's block.
      const fd = fs.openSync(filler, 'w');
      try {
        for (const size of [MiB, 4096]) {
          const block = Buffer.alloc(size, 1);
          try {
            for (;;) fs.writeSync(fd, block);
          } catch (e) {
            if ((e as NodeJS.ErrnoException).code !== 'ENOSPC') throw e;
          }
        }
      } finally {
        fs.closeSync(fd);
      }
    },
    recover() {
      fs.rmSync(filler, { force: true });
      execFileSync('umount', [mnt]);
      // 0: clean, 1: errors corrected.
      const fsck = spawnSync('e2fsck', ['-f', '-y', img]);
      assert.ok(fsck.status === 0 || fsck.status === 1, `e2fsck exit ${fsck.status}: ${fsck.stdout}${fsck.stderr}`);
      execFileSync('mount', ['-o', 'loop', img, mnt]);
    },
  };
}

/** Files under `dir` that look like our temps (`.name.<root>.ffsync-part`). */
function temps(dir: string): string[] {
  return Object.keys(snapshot(dir)).filter((p) => p.endsWith('.ffsync-part'));
}

describe('writeback errors from the device', { skip: unavailable() }, () => {
  it('local sync -a: exit 11 with one line, every old file on the device; the rerun completes and leaves no temp', async () => {
    const dir = tmpdir();
    const dev = device(dir);
    const src = path.join(dir, 'src');
    const dst = path.join(dev.mnt, 'dst');
    // The receiver holds the previous release: a big file (chunk conversation) and small ones.
    writeAt(dst, 'big.bin', seeded(6 * MiB, 1));
    for (let i = 0; i < 5; i++) writeAt(dst, `small/f${i}.txt`, seeded(3000 + i, 10 + i));
    execFileSync('sync');
    const before = snapshot(dst);
    writeAt(src, 'big.bin', seeded(16 * MiB, 2));
    for (let i = 0; i < 5; i++) writeAt(src, `small/f${i}.txt`, seeded(3000 + i, 20 + i));
    dev.fill();

    const r = await run(['sync', '-a', `${src}/`, `${dst}/`, '--state-dir', path.join(dir, 'st')]).done;
    assert.equal(r.code, 11, r.stderr);
    // ENOSPC from the device; EIO, or EROFS, once ext4 has aborted its journal over a failed
    // journal write and gone read-only.
    const line = oneErrorLine(r.stderr);
    assert.match(line, /no space left on device|input\/output error|read-only file system/i);
    assert.ok(line.includes(dst), line);
    // What the device holds once repaired: every old file, the small ones too (decisions §85:
    // written whole, they are flushed as a batch before any is renamed; renamed on the
    // filesystem's ordering alone, they were zeros here). Temps may remain where the filesystem
    // went read-only before they could be removed; the rerun clears them.
    dev.recover();
    const durable = Object.fromEntries(Object.entries(snapshot(dst)).filter(([p]) => !p.endsWith('.ffsync-part')));
    assert.deepEqual(durable, before, 'an old file was replaced by data the device did not keep');

    const again = await run(['sync', '-a', `${src}/`, `${dst}/`, '--state-dir', path.join(dir, 'st')]).done;
    assert.equal(again.code, 0, again.stderr);
    assertSameTree(dst, src);
    assert.deepEqual(temps(dst), [], 'temp files left behind after the rerun');
  });

  it('send/receive: both exit 11, the old file intact, no temp left', async () => {
    const dir = tmpdir();
    const dev = device(dir);
    const target = path.join(dev.mnt, 'target.bin');
    fs.writeFileSync(target, seeded(4 * MiB, 3));
    execFileSync('sync');
    const before = snapshot(dev.mnt);
    const src = path.join(dir, 'src.bin');
    fs.writeFileSync(src, seeded(16 * MiB, 4));
    dev.fill();

    const { peer, port } = await startReceiver(target, ['--state-dir', path.join(dir, 'r')]);
    const s = await run(['send', src, `127.0.0.1:${port}`, '--plaintext', '--json', '--timeout', '20', '--state-dir', path.join(dir, 's')]).done;
    const r = await peer.done;
    assert.equal(r.code, 11, r.stderr);
    assert.match(oneErrorLine(r.stderr), /no space left on device|input\/output error|read-only file system/i);
    assert.equal(s.code, 11, `the sender reports the receiver's error: ${s.stderr}`);
    assert.deepEqual(temps(dev.mnt), [], 'temp file left behind');
    // The image's own lost+found aside, nothing changed.
    assert.deepEqual(snapshot(dev.mnt), before);
  });
});
