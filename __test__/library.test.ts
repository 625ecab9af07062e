// The library is a product too (issue 19): README's library example runs as written against the
// package entry (dist/api/index.js, what `require('ffsync-native')` loads), and the published type
// declarations (dist/**/*.d.ts, binding/index.d.ts) check in a strict consumer project without
// skipLibCheck.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { it } from 'node:test';
import { pathToFileURL } from 'node:url';
import { tmpdir } from './helpers/peers';

const REPO = path.join(__dirname, '..');

/** The ```ts block under a README heading. */
function readmeBlock(heading: string): string {
  const readme = fs.readFileSync(path.join(REPO, 'README.md'), 'utf8');
  const at = readme.indexOf(`\n${heading}\n`);
  assert.ok(at >= 0, `README has "${heading}"`);
  const m = /```ts\n([\s\S]*?)```/.exec(readme.slice(at));
  assert.ok(m, `a ts block under "${heading}"`);
  return m[1]!;
}

it('README’s library example runs as written against the package entry', () => {
  const dir = tmpdir();
  // An ES module (top-level await), importing the package by name from a node_modules link.
  fs.mkdirSync(path.join(dir, 'node_modules'));
  fs.symlinkSync(REPO, path.join(dir, 'node_modules', 'ffsync-native'), 'dir');
  fs.writeFileSync(path.join(dir, 'example.mts'), readmeBlock('## Library API'));
  // tsx from this repository (the example's directory has only the package).
  const tsx = pathToFileURL(path.join(REPO, 'node_modules', 'tsx', 'dist', 'loader.mjs')).href;
  const r = spawnSync(process.execPath, ['--import', tsx, 'example.mts'], { cwd: dir, encoding: 'utf8', timeout: 60_000, env: { ...process.env, FFSYNC_STATE_DIR: '' } });
  assert.equal(r.status, 0, `${r.stdout}\n${r.stderr}`);
  assert.equal(r.stdout, '23 hello from the library\n\n');
  assert.equal(fs.readFileSync(path.join(dir, 'out.txt'), 'utf8'), 'hello from the library\n');
});

it('the type declarations check in a strict consumer project without skipLibCheck', () => {
  const dir = tmpdir();
  fs.mkdirSync(path.join(dir, 'node_modules'));
  fs.symlinkSync(REPO, path.join(dir, 'node_modules', 'ffsync-native'), 'dir');
  fs.writeFileSync(
    path.join(dir, 'tsconfig.json'),
    JSON.stringify({
      compilerOptions: { strict: true, skipLibCheck: false, esModuleInterop: false, module: 'commonjs', target: 'es2022', noEmit: true, types: ['node'], typeRoots: [path.join(REPO, 'node_modules', '@types')] },
      files: ['index.ts'],
    }),
  );
  fs.writeFileSync(
    path.join(dir, 'index.ts'),
    [
      "import { send, receive, sync, pull, id, trust, untrust, fingerprints, scanFile, beginReconstruction, FfsyncError, ExitCode, type SyncSummary, type SendOptions } from 'ffsync-native';",
      'const options: SendOptions = { path: "a", host: "h", port: 1, signal: new AbortController().signal };',
      'const literal = (s: SyncSummary): number => s.literalBytes + s.bytesOnWire.sent;',
      'const code: number = ExitCode.SIGNAL;',
      'void [send, receive, sync, pull, id, trust, untrust, fingerprints, scanFile, beginReconstruction, FfsyncError, options, literal, code];',
      '',
    ].join('\n'),
  );
  const r = spawnSync(process.execPath, [path.join(REPO, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', 'tsconfig.json'], { cwd: dir, encoding: 'utf8', timeout: 120_000 });
  assert.equal(r.status, 0, `${r.stdout}\n${r.stderr}`);
});

it('aborting through an AbortSignal rejects with a distinct abort error (ESIGNAL, exit 20) on both sides, not "connection closed"', async () => {
  const { send, receive, FfsyncError, ExitCode } = await import('../ts/api/index.js');
  const dir = tmpdir();
  const src = path.join(dir, 'big.bin');
  fs.writeFileSync(src, Buffer.alloc(24 << 20, 7));
  const state = path.join(dir, 'state');
  let listening: (port: number) => void = () => undefined;
  const bound = new Promise<number>((resolve) => (listening = resolve));
  const receiving = receive({ path: path.join(dir, 'out.bin'), port: 0, plaintext: true, stateDir: state, events: { listening: (_h: string, p: number) => listening(p) } });
  receiving.catch(() => undefined);
  const port = await bound;
  const ac = new AbortController();
  const sending = send({ path: src, host: '127.0.0.1', port, plaintext: true, stateDir: state, bwlimitKiBps: 2048, compressLevel: 0, signal: ac.signal });
  setTimeout(() => ac.abort(), 700);
  const [s, r] = await Promise.allSettled([sending, receiving]);
  assert.equal(s.status, 'rejected');
  assert.equal(r.status, 'rejected');
  const se = (s as PromiseRejectedResult).reason;
  const re = (r as PromiseRejectedResult).reason;
  assert.ok(se instanceof FfsyncError && re instanceof FfsyncError);
  assert.deepEqual([se.code, se.exitCode, se.message], ['ESIGNAL', ExitCode.SIGNAL, 'interrupted']);
  assert.equal(re.exitCode, ExitCode.SIGNAL, re.message);
  assert.match(re.message, /peer: interrupted/);
});
