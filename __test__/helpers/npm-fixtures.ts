// Real release-to-release artifact trees for the transport stress test: two consecutive
// releases each of a few npm packages with native binaries and big JS bundles, fetched
// once with `npm pack` into node_modules/.cache/ffsync-fixtures/ (git-ignored, kept
// between local runs; CI fetches them once per job). Without the registry, the committed
// semver tarballs plus generated files stand in, and `fallback` says why.
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { modify, seeded, T0, writeAt } from './peers';

export const FIXTURE_CACHE = path.join(__dirname, '..', '..', 'node_modules', '.cache', 'ffsync-fixtures');
const COMMITTED = path.join(__dirname, '..', 'fixtures', 'npm');

/** Consecutive releases: [package, release A, release B]. Per tree ≈ 67 MB in ~200 files:
 * ~130 of them ≤ 64 KiB (FILE_BATCH frames), JS bundles of 100 KiB – 9 MiB and native
 * binaries of 10 and 28 MB (each its own chunk-level conversation, on lanes). */
export const RELEASES: [string, string, string][] = [
  ['@esbuild/linux-x64', '0.24.0', '0.24.2'], // one 9.8 MB Go binary
  ['typescript', '5.6.2', '5.6.3'], // 121 files: lib/*.d.ts, 3–9 MB JS bundles
  ['prettier', '3.3.2', '3.3.3'], // 53 files: plugin bundles of 100 KiB – 1 MiB
  ['@biomejs/cli-linux-x64', '1.9.3', '1.9.4'], // one 28 MB Rust binary
];

/** The file `npm pack` writes for a spec: `@scope/name` → `scope-name-VERSION.tgz`. */
export function packFileName(name: string, version: string): string {
  return `${name.replace(/^@/, '').replace('/', '-')}-${version}.tgz`;
}

export interface ReleaseTrees {
  /** Release A and release B, one directory per package in each. */
  a: string;
  b: string;
  /** Each release as one uncompressed tar (a release artifact of its own: one large file,
   * its DATA on the session's connection instead of lanes). */
  tarA: string;
  tarB: string;
  /** Why the registry's packages are not in them ('' when they are). */
  fallback: string;
  /** What the trees hold, for the test's output. */
  describe: string;
}

/** Fetch the tarballs not cached yet (one `npm pack` call); '' or why it failed. */
function fetchMissing(): string {
  const missing = RELEASES.flatMap(([name, ...versions]) => versions.filter((v) => !fs.existsSync(path.join(FIXTURE_CACHE, packFileName(name, v)))).map((v) => `${name}@${v}`));
  if (missing.length === 0) return '';
  fs.mkdirSync(FIXTURE_CACHE, { recursive: true });
  try {
    execFileSync('npm', ['pack', ...missing, '--pack-destination', FIXTURE_CACHE, '--silent'], { stdio: ['ignore', 'ignore', 'pipe'], timeout: 180_000 });
  } catch (e) {
    const err = e as { stderr?: Buffer; message: string };
    return `npm pack ${missing.join(' ')} failed: ${(err.stderr?.toString().trim() || err.message).split('\n').slice(-3).join(' ')}`;
  }
  const still = RELEASES.flatMap(([name, ...versions]) => versions.filter((v) => !fs.existsSync(path.join(FIXTURE_CACHE, packFileName(name, v)))));
  return still.length ? `npm pack did not produce ${still.join(', ')}` : '';
}

/** Extract an npm tarball (every entry under `package/`) into `dest`. */
function extract(tgz: string, dest: string): void {
  fs.mkdirSync(dest, { recursive: true });
  execFileSync('tar', ['-xzf', tgz, '-C', dest, '--strip-components=1', '--no-same-owner']);
}

function countFiles(dir: string): { files: number; bytes: number } {
  let files = 0;
  let bytes = 0;
  for (const e of fs.readdirSync(dir, { withFileTypes: true, recursive: true })) {
    if (!e.isFile()) continue;
    files++;
    bytes += fs.statSync(path.join(e.parentPath ?? (e as unknown as { path: string }).path, e.name)).size;
  }
  return { files, bytes };
}

/** Generated stand-ins for the registry's packages: large "binaries" edited in place,
 * medium bundles, many small files (some changed with the same size and mtime). */
function generate(a: string, b: string): void {
  const MiB = 1024 * 1024;
  for (let i = 0; i < 3; i++) {
    const old = seeded(8 * MiB + i * 4099, 9100 + i);
    writeAt(a, `gen/bin/tool${i}`, old, 0o755, T0);
    writeAt(b, `gen/bin/tool${i}`, modify(old, 9200 + i), 0o755, T0 + 60);
  }
  for (let i = 0; i < 24; i++) {
    const old = seeded(100 * 1024 + i * 37_000, 9300 + i);
    writeAt(a, `gen/dist/chunk${i}.js`, old, 0o644, T0);
    writeAt(b, `gen/dist/chunk${i}.js`, i % 2 ? old : modify(old, 9400 + i, { overwrites: 1, inserts: 1, deletes: 0 }), 0o644, T0 + (i % 2 ? 0 : 60));
  }
  for (let i = 0; i < 400; i++) {
    const old = seeded(200 + ((i * 7919) % 16_000), 9500 + i);
    const changed = i % 5 === 0 ? Buffer.from(old.map((x, k) => (k === 7 ? x ^ 0xff : x))) : old; // same size, same mtime
    if (i % 50 !== 1) writeAt(a, `gen/lib/m${i % 20}/f${i}.d.ts`, old, 0o644, T0);
    if (i % 50 !== 2) writeAt(b, `gen/lib/m${i % 20}/f${i}.d.ts`, changed, 0o644, T0);
  }
}

/** Build release trees A and B under `dir` (fetching from the registry if needed). */
export function releaseTrees(dir: string): ReleaseTrees {
  const a = path.join(dir, 'release-a');
  const b = path.join(dir, 'release-b');
  fs.mkdirSync(a, { recursive: true });
  fs.mkdirSync(b, { recursive: true });
  // Small files that change with the same size and mtime (committed: no registry needed).
  extract(path.join(COMMITTED, 'semver-7.7.3.tgz'), path.join(a, 'semver'));
  extract(path.join(COMMITTED, 'semver-7.7.4.tgz'), path.join(b, 'semver'));
  const fallback = process.env.FFSYNC_STRESS_OFFLINE ? 'FFSYNC_STRESS_OFFLINE is set' : fetchMissing();
  if (fallback) {
    generate(a, b);
  } else {
    for (const [name, va, vb] of RELEASES) {
      const sub = name.replace(/^@/, '').replace('/', '-');
      extract(path.join(FIXTURE_CACHE, packFileName(name, va)), path.join(a, sub));
      extract(path.join(FIXTURE_CACHE, packFileName(name, vb)), path.join(b, sub));
    }
  }
  const [tarA, tarB] = [`${a}.tar`, `${b}.tar`];
  for (const [tree, tar] of [[a, tarA], [b, tarB]]) execFileSync('tar', ['-cf', tar, '--sort=name', '-C', tree, '.']);
  const [ca, cb] = [countFiles(a), countFiles(b)];
  const mb = (n: number) => (n / 1e6).toFixed(1);
  const what = fallback ? 'semver 7.7.3/7.7.4 + generated files' : `${RELEASES.map(([n, va, vb]) => `${n} ${va}/${vb}`).join(', ')}, semver 7.7.3/7.7.4`;
  return { a, b, tarA, tarB, fallback, describe: `${what}: A ${ca.files} files ${mb(ca.bytes)} MB, B ${cb.files} files ${mb(cb.bytes)} MB; as tars ${mb(fs.statSync(tarA).size)} and ${mb(fs.statSync(tarB).size)} MB` };
}
