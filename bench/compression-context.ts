// Issue 18, item 4 (compression in the context of data both peers hold): measure before building.
// Writes, for every file of release B of the npm fixture trees (__test__/helpers/npm-fixtures.ts),
// its chunks as this build cuts them (offset, length) and whether release A's file at the same
// path holds each one (by BLAKE3): what a receiver with A would NEED. compression-context.py then compresses
// the needed bytes with and without context. Run from the repository root:
//   node --import tsx bench/compression-context.ts /tmp/ctx
//   pip install zstandard && python3 bench/compression-context.py /tmp/ctx
import fs from 'node:fs';
import path from 'node:path';
import { scanFile } from '../ts/native/binding';
import { releaseTrees } from '../__test__/helpers/npm-fixtures';
import { MANIFEST_ENTRY, MANIFEST_HEADER } from '../ts/utils/manifest';
import { runMain } from './common.js';

function files(root: string, rel = ''): string[] {
  return fs
    .readdirSync(path.join(root, rel), { withFileTypes: true })
    .flatMap((e) => (e.isDirectory() ? files(root, path.join(rel, e.name)) : e.isFile() ? [path.join(rel, e.name)] : []));
}

runMain('bench/compression-context.ts', async () => {
  const out = process.argv[2];
  if (!out) throw new Error('usage: dump-chunks.ts OUT_DIR');
  fs.mkdirSync(out, { recursive: true });
  const t = releaseTrees(path.join(out, 'fixtures'));
  const lines: string[] = [];
  for (const rel of files(t.b)) {
    const b = await scanFile(path.join(t.b, rel), {});
    const held = new Set<string>();
    if (fs.existsSync(path.join(t.a, rel))) {
      // Chunked with B's parameters, as the receiver rechunks a basis whose size class differs.
      const a = await scanFile(path.join(t.a, rel), { paramsForSize: b.size });
      for (let at = MANIFEST_HEADER; at < a.manifest.length; at += MANIFEST_ENTRY) held.add(a.manifest.subarray(at + 4, at + MANIFEST_ENTRY).toString('hex'));
    }
    const chunks: [number, number, number][] = [];
    let offset = 0;
    for (let at = MANIFEST_HEADER; at < b.manifest.length; at += MANIFEST_ENTRY) {
      const len = b.manifest.readUInt32LE(at);
      chunks.push([offset, len, held.has(b.manifest.subarray(at + 4, at + MANIFEST_ENTRY).toString('hex')) ? 1 : 0]);
      offset += len;
    }
    lines.push(JSON.stringify({ path: rel, size: b.size, chunks }));
  }
  fs.writeFileSync(path.join(out, 'chunks.jsonl'), lines.join('\n') + '\n');
  fs.writeFileSync(path.join(out, 'release-b'), t.b);
  process.stderr.write(`${lines.length} files of ${t.describe}\n`);
});
