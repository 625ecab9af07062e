// Start-up cost (issue 18, "small fixed costs"): a command loads only what it needs. Each CLI
// run here carries a --require hook that records, at exit, every CommonJS module it loaded,
// the Node built-ins it loaded, and whether Node's ESM loader ever imported anything (ora,
// the spinner library, is ESM-only: no ESM import means no ora). The CLI is one bundle
// (`npm run bundle:cli`) whose modules run when first required, so what ran shows in the
// built-ins they load: TLS loads `tls`, QUIC `dns/promises`; the addon is its own file.
// Against an unbundled build (FFSYNC_TEST_CLI) the dist/ files are checked as well.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { it } from 'node:test';
import { run, seeded, tmpdir } from './helpers/peers';

interface Loaded {
  files: string[];
  builtins: string[];
  esmImported: boolean;
}

const HOOK = `
const fs = require('node:fs');
process.once('exit', () => {
  fs.writeFileSync(process.env.FFSYNC_TEST_LOADED, JSON.stringify({
    files: Object.keys(require.cache),
    builtins: process.moduleLoadList.filter((m) => m.startsWith('NativeModule ')).map((m) => m.slice(13)),
    esmImported: process.moduleLoadList.includes('NativeModule internal/modules/esm/translators'),
  }));
});
`;

async function loadedBy(args: string[], dir: string): Promise<{ loaded: Loaded; code: number | null; stdout: string; stderr: string }> {
  const hook = path.join(dir, 'hook.cjs');
  fs.writeFileSync(hook, HOOK);
  const out = path.join(dir, `loaded-${args[0]}.json`);
  const r = await run(args, { NODE_OPTIONS: `--require ${hook}`, FFSYNC_TEST_LOADED: out }).done;
  return { loaded: JSON.parse(fs.readFileSync(out, 'utf8')) as Loaded, code: r.code, stdout: r.stdout, stderr: r.stderr };
}

const addon = (l: Loaded) => l.files.filter((f) => f.endsWith('.node') || /[\\/]binding[\\/]index\.js$/.test(f));
const ours = (l: Loaded, ...names: string[]) => l.files.filter((f) => names.some((n) => f.endsWith(path.join('dist', n))));

it('--version and --help load neither the native addon, nor ora, nor TLS, QUIC or the serve daemon', async () => {
  const dir = tmpdir();
  for (const args of [['--version'], ['--help']]) {
    const { loaded, code, stdout } = await loadedBy(args, dir);
    assert.equal(code, 0);
    assert.ok(stdout.length > 0);
    // The hook saw the CLI itself (so an empty list cannot pass for a clean one).
    assert.equal(ours(loaded, 'cli/main.js').length, 1, JSON.stringify(loaded.files));
    assert.deepEqual(addon(loaded), [], `${args[0]} loaded the native addon`);
    assert.equal(loaded.esmImported, false, `${args[0]} imported an ES module (ora is one)`);
    assert.deepEqual(loaded.files.filter((f) => /[\\/]node_modules[\\/]ora[\\/]/.test(f)), []);
    assert.deepEqual(ours(loaded, 'transport/tls.js', 'transport/quic.js', 'serve/daemon.js', 'api/sync.js', 'api/send.js', 'api/receive.js'), []);
    assert.ok(!loaded.builtins.includes('tls') && !loaded.builtins.includes('dns/promises'), loaded.builtins.join(' '));
    // commander's child_process (and the dgram it requires) waits for a use that never comes.
    // (net comes with stdout when it is a pipe, as here.)
    assert.deepEqual(loaded.builtins.filter((b) => ['child_process', 'dgram', 'perf_hooks'].includes(b)), [], `${args[0]}: ${loaded.builtins.join(' ')}`);
  }
});

it('a local sync loads the addon but no TLS, QUIC, serve daemon or spinner', async () => {
  const dir = tmpdir();
  const src = path.join(dir, 'src');
  fs.mkdirSync(path.join(src, 'd'), { recursive: true });
  fs.writeFileSync(path.join(src, 'd', 'a.bin'), seeded(10_000, 1));
  // Two large files: the second one goes over an in-memory lane, which joins with a token.
  for (const n of [2, 3]) fs.writeFileSync(path.join(src, `l${n}.bin`), seeded(1536 * 1024, n));
  const { loaded, code, stderr, stdout } = await loadedBy(['sync', '-a', '--json', `${src}/`, `${path.join(dir, 'dst')}/`, '--state-dir', path.join(dir, 'state')], dir);
  assert.equal(code, 0, stderr);
  assert.deepEqual(fs.readFileSync(path.join(dir, 'dst', 'd', 'a.bin')), seeded(10_000, 1));
  for (const n of [2, 3]) assert.deepEqual(fs.readFileSync(path.join(dir, 'dst', `l${n}.bin`)), seeded(1536 * 1024, n));
  const summary = stdout.split('\n').filter(Boolean).map((l) => JSON.parse(l) as { event: string; tree?: { lanes: number } }).find((e) => e.event === 'summary');
  assert.ok((summary?.tree?.lanes ?? 0) >= 2, `a lane joined: ${JSON.stringify(summary?.tree)}`);
  assert.equal(addon(loaded).length > 0, true, 'the sync ran without the addon?');
  assert.equal(loaded.esmImported, false);
  assert.deepEqual(ours(loaded, 'transport/tls.js', 'transport/quic.js', 'serve/daemon.js', 'api/over-quic.js', 'security/identity.js', 'api/pull.js'), []);
  assert.ok(!loaded.builtins.includes('tls') && !loaded.builtins.includes('dns/promises'), loaded.builtins.join(' '));
  // No child process and no perf_hooks: their modules are loaded at first use (decisions §100).
  // No OpenSSL either: a local sync draws no lane token and checks no certificate (§107).
  assert.deepEqual(loaded.builtins.filter((b) => ['child_process', 'dgram', 'perf_hooks', 'crypto'].includes(b)), [], loaded.builtins.join(' '));
});

it('a quiet local sync makes neither stdout nor stderr (a pipe here): no net, no tty, no child process', async () => {
  const dir = tmpdir();
  const src = path.join(dir, 'src');
  fs.mkdirSync(src);
  fs.writeFileSync(path.join(src, 'a.bin'), seeded(10_000, 3));
  const { loaded, code, stdout, stderr } = await loadedBy(['sync', '-aq', `${src}/`, `${path.join(dir, 'dst')}/`, '--state-dir', path.join(dir, 'state')], dir);
  assert.equal(code, 0, stderr);
  assert.equal(stdout + stderr, '');
  assert.deepEqual(fs.readFileSync(path.join(dir, 'dst', 'a.bin')), seeded(10_000, 3));
  assert.equal(addon(loaded).length > 0, true, 'the sync ran without the addon?');
  assert.deepEqual(loaded.builtins.filter((b) => ['net', 'tty', 'child_process', 'dgram', 'perf_hooks'].includes(b)), [], loaded.builtins.join(' '));
  // A failing quiet run still says why, on the stderr it then makes, and exits with its code.
  const failed = await loadedBy(['sync', '-aq', `${path.join(dir, 'none')}/`, `${path.join(dir, 'dst')}/`, '--state-dir', path.join(dir, 'state')], dir);
  assert.equal(failed.code, 3);
  assert.match(failed.stderr, /ffsync-native: error: .*does not exist/);
});

it('a plain send loads no QUIC and no serve daemon', async () => {
  const dir = tmpdir();
  const file = path.join(dir, 'a.bin');
  fs.writeFileSync(file, seeded(1000, 2));
  // Nobody listens on port 1: the send fails at connect (exit 10), after loading what it needs.
  const { loaded, code } = await loadedBy(['send', file, '127.0.0.1:1', '--plaintext', '--state-dir', path.join(dir, 'state')], dir);
  assert.equal(code, 10);
  assert.equal(addon(loaded).length > 0, true);
  assert.deepEqual(ours(loaded, 'transport/quic.js', 'serve/daemon.js', 'api/over-quic.js', 'api/pull.js'), []);
  assert.ok(!loaded.builtins.includes('dns/promises'), loaded.builtins.join(' '));
});
