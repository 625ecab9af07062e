// The native loader's decisions (ts/native/loader.ts): prebuilt package first, then the local
// build, an explicit NAPI_RS_NATIVE_LIBRARY_PATH alone; one message naming the platform otherwise.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { it } from 'node:test';
import { describeHost, loadFailureMessage, nativeTarget, planLoad, platformPackage, type Host } from '../ts/native/loader';

const linuxGnu: Host = { platform: 'linux', arch: 'x64', musl: false };
const linuxMusl: Host = { platform: 'linux', arch: 'arm64', musl: true };
const resolveAll = (name: string) => `/prefix/node_modules/${name}/${name}.node`;
const resolveNone = () => undefined;

it('targets match the npm/<platform> package directories and package names', () => {
  const hosts: Host[] = [
    { platform: 'linux', arch: 'x64', musl: false },
    { platform: 'linux', arch: 'x64', musl: true },
    { platform: 'linux', arch: 'arm64', musl: false },
    { platform: 'linux', arch: 'arm64', musl: true },
    { platform: 'darwin', arch: 'x64', musl: false },
    { platform: 'darwin', arch: 'arm64', musl: false },
    { platform: 'win32', arch: 'x64', musl: false },
  ];
  const targets = hosts.map((h) => nativeTarget(h)!);
  const dirs = fs.readdirSync(path.join(__dirname, '..', 'npm')).sort();
  assert.deepEqual([...targets].sort(), dirs);
  for (const t of targets) {
    const pkg = JSON.parse(fs.readFileSync(path.join(__dirname, '..', 'npm', t, 'package.json'), 'utf8'));
    assert.equal(pkg.name, platformPackage(t));
    // The generated loader requires this very name in its package branch.
    assert.ok(fs.readFileSync(path.join(__dirname, '..', 'binding', 'index.js'), 'utf8').includes(`require('${pkg.name}')`), pkg.name);
  }
  assert.equal(nativeTarget({ platform: 'freebsd', arch: 'x64', musl: false }), undefined);
  assert.equal(nativeTarget({ platform: 'win32', arch: 'arm64', musl: false }), undefined);
});

it('prefers the installed prebuilt package, then the local build', () => {
  assert.deepEqual(planLoad(linuxGnu, {}, resolveAll), [
    { kind: 'package', name: 'ffsync-native-linux-x64-gnu', path: '/prefix/node_modules/ffsync-native-linux-x64-gnu/ffsync-native-linux-x64-gnu.node' },
    { kind: 'local' },
  ]);
  assert.deepEqual(planLoad(linuxMusl, {}, resolveAll)[0], {
    kind: 'package',
    name: 'ffsync-native-linux-arm64-musl',
    path: '/prefix/node_modules/ffsync-native-linux-arm64-musl/ffsync-native-linux-arm64-musl.node',
  });
  assert.deepEqual(planLoad(linuxGnu, {}, resolveNone), [{ kind: 'local' }]);
  // An unsupported platform still tries a local build (someone built it from source there).
  assert.deepEqual(planLoad({ platform: 'freebsd', arch: 'x64', musl: false }, {}, resolveAll), [{ kind: 'local' }]);
});

it('an explicit NAPI_RS_NATIVE_LIBRARY_PATH is the only candidate', () => {
  assert.deepEqual(planLoad(linuxGnu, { NAPI_RS_NATIVE_LIBRARY_PATH: '/x/a.node' }, resolveAll), [{ kind: 'override', path: '/x/a.node' }]);
  const msg = loadFailureMessage(linuxGnu, [{ kind: 'override', path: '/x/a.node' }], [new Error('Cannot find module')]);
  assert.match(msg, /NAPI_RS_NATIVE_LIBRARY_PATH/);
  assert.match(msg, /unset it/);
});

it('one message naming the platform, the package and how to build from source', () => {
  const chained = Object.assign(new Error('Cannot find native binding. npm has a bug'), { cause: new Error("Cannot find module './ffsync-native.linux-x64-musl.node'") });
  const msg = loadFailureMessage({ platform: 'linux', arch: 'x64', musl: true }, [{ kind: 'local' }], [chained]);
  assert.equal(msg.split('\n').length, 1);
  assert.match(msg, /linux x64 \(musl\)/);
  assert.match(msg, /npm install ffsync-native-linux-x64-musl/);
  assert.match(msg, /Rust toolchain/);
  assert.match(msg, /npm install/);
  // The root cause of the generated loader's chain, not its generic first line.
  assert.match(msg, /Cannot find module '\.\/ffsync-native\.linux-x64-musl\.node'/);
  const none = loadFailureMessage({ platform: 'freebsd', arch: 'x64', musl: false }, [{ kind: 'local' }], [new Error('nope')]);
  assert.match(none, /no prebuilt native addon exists for freebsd x64/);
  assert.equal(describeHost({ platform: 'darwin', arch: 'arm64', musl: false }), 'darwin arm64');
});

it('this process loaded the addon from a known origin', async () => {
  const { nativeOrigin } = await import('../ts/native/binding.js');
  assert.match(path.basename(nativeOrigin), /^ffsync-native[.-].*\.node$/);
  assert.ok(fs.existsSync(nativeOrigin), nativeOrigin);
});

it('the CLI reports a missing addon as one error line and exit 1, not a stack trace', async () => {
  const { spawnSync } = await import('node:child_process');
  const cli = path.join(__dirname, '..', 'dist', 'cli', 'main.js');
  const r = spawnSync(process.execPath, [cli, 'id'], { env: { ...process.env, NAPI_RS_NATIVE_LIBRARY_PATH: '/nonexistent/ffsync.node' }, encoding: 'utf8' });
  assert.equal(r.status, 1);
  assert.equal(r.stderr.trim().split('\n').length, 1, r.stderr);
  assert.match(r.stderr, /^ffsync-native: error: could not load the native addon for linux|^ffsync-native: error: could not load the native addon/);
});
