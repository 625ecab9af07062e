// The sender reads a source only as the version it scanned: NativeChunkSource.open compares the
// identity Node's `fs.stat(path, { bigint: true })` gave at the scan with the handle it opened
// (decisions §106), where the JS `identityChanged` compared two Node stats before. Node's bigint
// stats come from a signed 64-bit array, so an inode or device number with its top bit set
// (NFS, FUSE, overlayfs, a macOS device) arrives negative, and a time past 2262 is wider than
// 64 bits: the comparison takes the same 64 bits the core holds, and fails only on a change.
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { describe, it } from 'node:test';
import { openChunkSource, scanFile } from '../ts/native/binding';
import { seeded, tmpdir } from './helpers/peers';

const WRAP = 2n ** 64n;

describe('a source opens only as the version that was scanned', () => {
  it('the scanned identity opens it, in any BigInt spelling of the same 64 bits; a different inode, a rewrite or a removal is ECHANGED', async () => {
    const dir = tmpdir('ffsync-ident-');
    const file = path.join(dir, 'src.bin');
    fs.writeFileSync(file, seeded(300_000, 3));
    const { manifest } = await scanFile(file);
    const st = fs.statSync(file, { bigint: true });
    const scanned = { size: st.size, mtimeNs: st.mtimeNs, ctimeNs: st.ctimeNs, ino: st.ino, dev: st.dev };

    const open = (id: typeof scanned) => openChunkSource(file, manifest, 0, false, id);
    const opens = async (id: typeof scanned, why: string) => {
      const src = await open(id).catch((e: Error) => assert.fail(`${why}: ${e.message}`));
      assert.ok(src.unchanged(), `${why}: the source it opened is the scanned version`);
      src.release();
    };
    await opens(scanned, 'as scanned');
    // The same 64 bits, as Node would spell an inode or device with the top bit set (negative),
    // and a time wider than 64 bits.
    await opens({ ...scanned, ino: st.ino - WRAP, dev: st.dev - WRAP }, 'negative inode and device, same bits');
    await opens({ ...scanned, mtimeNs: st.mtimeNs + WRAP, ctimeNs: st.ctimeNs - WRAP }, 'times wider than 64 bits, same low bits');

    const changed = async (id: typeof scanned, why: string) => {
      await assert.rejects(open(id), (e: NodeJS.ErrnoException) => e.code === 'ECHANGED', why);
    };
    await changed({ ...scanned, ino: st.ino + 1n }, 'another inode');
    await changed({ ...scanned, size: st.size + 1n }, 'another size');
    // Rewritten in place, same size: its ctime (and mtime) moved.
    await new Promise((r) => setTimeout(r, 20));
    const fd = fs.openSync(file, 'r+');
    fs.writeSync(fd, Buffer.alloc(10, 7), 0, 10, 1000);
    fs.closeSync(fd);
    await changed(scanned, 'rewritten');
    fs.rmSync(file);
    await changed(scanned, 'removed');
  });
});
