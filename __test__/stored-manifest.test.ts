// A tree manifest goes compressed (zstd level 1), except between the two peers of a local sync,
// which run in one process: there it is stored in its zstd frame uncompressed (raw blocks,
// protocol §9.3, decisions §101), and the receiver reads it as it reads any zstd frame. A user's
// `--no-compress` or `--compress-level 0` concerns data and leaves the manifest compressed.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { it } from 'node:test';
import { hashTree } from './helpers/data';
import { run, sync, tmpdir } from './helpers/peers';

/** 3,000 empty files under long, alike names: a manifest of ~280 KB that compresses ~10x. */
function alikeNames(src: string): number {
  const deep = path.join(src, 'a-rather-long-directory-name', 'and-another-one-below-it');
  fs.mkdirSync(deep, { recursive: true });
  for (let i = 0; i < 3000; i++) fs.writeFileSync(path.join(deep, `generated-artifact-file-${String(i).padStart(6, '0')}.js`), '');
  return 3000 * (24 + 'a-rather-long-directory-name/and-another-one-below-it/generated-artifact-file-000000.js'.length);
}

it('a local sync stores its manifests: the pipe carries the raw manifest, and the tree arrives whole', async () => {
  const dir = tmpdir();
  const src = path.join(dir, 'src');
  const rawManifest = alikeNames(src);
  const dst = path.join(dir, 'dst');
  const r = await run(['sync', '-a', `${src}/`, `${dst}/`, '--state-dir', path.join(dir, 'state'), '--json']).done;
  assert.equal(r.code, 0, r.stderr);
  assert.deepEqual(hashTree(dst), hashTree(src));
  // Compressed, the manifest and the 3,000 files' records were ~150 KB (the build before).
  const sent = r.summary!.bytesOnWire.sent as number;
  assert.ok(sent > rawManifest, `sent ${sent} B, raw manifest ~${rawManifest} B`);
});

it('--no-compress over a connection still compresses the manifest', async () => {
  const dir = tmpdir();
  const src = path.join(dir, 'src');
  const rawManifest = alikeNames(src);
  const dst = path.join(dir, 'dst');
  const r = await sync(`${src}/`, dst, { stateS: path.join(dir, 's'), stateR: path.join(dir, 'r'), sendArgs: ['--no-compress'] });
  assert.equal(r.send.code, 0, r.send.stderr);
  assert.equal(r.recv.code, 0, r.recv.stderr);
  assert.deepEqual(hashTree(dst), hashTree(src));
  const sent = r.send.summary!.bytesOnWire.sent as number;
  assert.ok(sent < rawManifest, `sent ${sent} B, raw manifest ~${rawManifest} B`);
});
