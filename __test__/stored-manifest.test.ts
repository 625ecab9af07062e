// A tree manifest goes compressed (zstd level 1) unless the sender compresses no data (`send
// --no-compress`, `sync --compress-level 0`): then, as between the two peers of a local sync, it
// is stored in its zstd frame uncompressed (raw blocks, protocol §9.3, decisions §101), and the
// receiver reads it as it reads any zstd frame.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { it } from 'node:test';
import { hashTree } from './helpers/data';
import { sync, tmpdir } from './helpers/peers';

it('--no-compress stores the manifest: more bytes on the wire, the same tree received', async () => {
  const dir = tmpdir();
  const src = path.join(dir, 'src');
  // 3,000 one-byte files under long, alike names: a manifest of ~200 KB that compresses ~10x.
  const deep = path.join(src, 'a-rather-long-directory-name', 'and-another-one-below-it');
  fs.mkdirSync(deep, { recursive: true });
  for (let i = 0; i < 3000; i++) fs.writeFileSync(path.join(deep, `generated-artifact-file-${String(i).padStart(6, '0')}.js`), 'x');
  const rawManifest = 3000 * (24 + 'a-rather-long-directory-name/and-another-one-below-it/generated-artifact-file-000000.js'.length);
  const sent: number[] = [];
  for (const level of [[], ['--no-compress']]) {
    const dst = path.join(dir, `dst${sent.length}`);
    const r = await sync(`${src}/`, dst, { stateS: path.join(dir, `s${sent.length}`), stateR: path.join(dir, `r${sent.length}`), sendArgs: level });
    assert.equal(r.send.code, 0, r.send.stderr);
    assert.equal(r.recv.code, 0, r.recv.stderr);
    assert.deepEqual(hashTree(dst), hashTree(src));
    sent.push(r.send.summary!.bytesOnWire.sent);
  }
  const [compressed, stored] = sent as [number, number];
  assert.ok(stored - compressed > rawManifest / 2, `stored ${stored} B against compressed ${compressed} B (raw manifest ~${rawManifest} B)`);
});
