// The published shape works, not only the repository: `npm pack` the root package and the host's
// platform package (npm/<platform>/ with the built .node placed in it, as the release workflow
// does), install both tarballs into an empty directory, and from there run `npx ffsync-native
// --version` and a real loopback sync over TLS with pinned fingerprints. The installed package must
// load the platform package's addon, never the repository's build.
import assert from 'node:assert/strict';
import { spawn, spawnSync, type SpawnSyncReturns } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { it } from 'node:test';
import { detectMusl, nativeTarget, platformPackage } from '../ts/native/loader';

const REPO = path.join(__dirname, '..');
const target = nativeTarget({ platform: process.platform, arch: process.arch, musl: detectMusl() });
const platformDir = target ? path.join(REPO, 'npm', target) : undefined;
const skip = !platformDir || !fs.existsSync(platformDir) ? `no npm/<platform> package for ${process.platform} ${process.arch}` : false;
const win = process.platform === 'win32';

function spawnIn(cmd: string, args: string[], cwd: string, timeout = 120_000): SpawnSyncReturns<string> {
  // npm and npx are .cmd scripts on Windows: they (and only they) need a shell there.
  const shell = win && (cmd === 'npm' || cmd === 'npx');
  return spawnSync(cmd, args, { cwd, encoding: 'utf8', timeout, shell, env: { ...process.env, npm_config_update_notifier: 'false' } });
}

function sh(cmd: string, args: string[], cwd: string, timeout = 120_000): SpawnSyncReturns<string> {
  const r = spawnIn(cmd, args, cwd, timeout);
  assert.equal(r.status, 0, `${cmd} ${args.join(' ')} (in ${cwd}) failed: ${r.error ?? ''}\n${r.stdout}\n${r.stderr}`);
  return r;
}

/** `npm pack` of `dir` into `dest` without lifecycle scripts; returns the tarball's path and its file list. */
function pack(dir: string, dest: string): { tarball: string; files: string[] } {
  const out = sh('npm', ['pack', '--ignore-scripts', '--json', '--pack-destination', dest], dir).stdout;
  const info = JSON.parse(out.slice(out.indexOf('['))) as { filename: string; files: { path: string }[] }[];
  return { tarball: path.join(dest, info[0]!.filename), files: info[0]!.files.map((f) => f.path) };
}

it('npm pack + install into an empty directory: npx --version and a loopback sync load the platform package', { skip, timeout: 120_000 }, async (t) => {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'ffsync-pack-'));
  try {
    const built = path.join(REPO, 'binding', `ffsync-native.${target}.node`);
    assert.ok(fs.existsSync(built), `${built} missing: run npm install (or npm run build:native) first`);
    const tarballs = path.join(tmp, 'tarballs');
    fs.mkdirSync(tarballs);

    // The root package: dist/ and the generated loader, no addon (that is the platform package's job).
    const root = pack(REPO, tarballs);
    assert.ok(root.files.includes('binding/index.js'), root.files.join(', '));
    assert.ok(root.files.includes('dist/cli/main.js'));
    assert.deepEqual(root.files.filter((f) => f.endsWith('.node')), [], 'the root tarball must not carry an addon');

    // The platform package, assembled as `napi artifacts` does in the release workflow.
    const plat = path.join(tmp, 'platform');
    fs.cpSync(platformDir!, plat, { recursive: true });
    const main = (JSON.parse(fs.readFileSync(path.join(plat, 'package.json'), 'utf8')) as { main: string }).main;
    fs.copyFileSync(built, path.join(plat, main));
    const platPack = pack(plat, tarballs);
    assert.deepEqual(platPack.files.filter((f) => f.endsWith('.node')), [main]);

    // An empty project installs both tarballs (commander and ora come from the registry or npm's cache).
    const app = path.join(tmp, 'app');
    fs.mkdirSync(app);
    fs.writeFileSync(path.join(app, 'package.json'), JSON.stringify({ name: 'pack-test-app', version: '1.0.0', private: true }));
    const install = spawnIn('npm', ['install', '--no-audit', '--no-fund', '--prefer-offline', '--ignore-scripts', root.tarball, platPack.tarball], app);
    const offline = /\b(ENOTFOUND|EAI_AGAIN|ECONNREFUSED|ECONNRESET|ETIMEDOUT|ENETUNREACH)\b/;
    if (install.status !== 0 && offline.test(install.stderr)) {
      // Offline machine: commander and ora are neither in npm's cache nor reachable. Say so; do not pass.
      t.skip(`the npm registry is unreachable and npm's cache lacks the dependencies (${install.stderr.split('\n').find((l) => offline.test(l))?.trim()})`);
      return;
    }
    assert.equal(install.status, 0, `npm install of the tarballs failed: ${install.error ?? ''}\n${install.stdout}\n${install.stderr}`);

    const version = (JSON.parse(fs.readFileSync(path.join(REPO, 'package.json'), 'utf8')) as { version: string }).version;
    assert.equal(sh('npx', ['--no-install', 'ffsync-native', '--version'], app).stdout.trim(), version);

    // Which addon the installed package loads: the platform package's, not the repository's.
    const originOut = sh(process.execPath, ['-e', "process.stdout.write(require('ffsync-native/dist/native/binding.js').nativeOrigin)"], app).stdout;
    const origin = fs.realpathSync(originOut);
    assert.equal(origin, fs.realpathSync(path.join(app, 'node_modules', platformPackage(target!), main)));
    assert.ok(!origin.startsWith(fs.realpathSync(REPO) + path.sep), origin);

    // A real loopback sync over TLS with the installed CLI, each peer pinning the other's fingerprint.
    const cli = path.join(app, 'node_modules', 'ffsync-native', 'dist', 'cli', 'main.js');
    const stR = path.join(tmp, 'state-r');
    const stS = path.join(tmp, 'state-s');
    const fpR = sh(process.execPath, [cli, 'id', '--state-dir', stR], app).stdout.trim();
    const fpS = sh(process.execPath, [cli, 'id', '--state-dir', stS], app).stdout.trim();
    const src = path.join(tmp, 'src.bin');
    fs.writeFileSync(src, crypto.randomBytes(3 << 20));
    const dst = path.join(tmp, 'dst.bin');
    const recv = spawn(process.execPath, [cli, 'receive', dst, '0', '--bind', '127.0.0.1', '--json', '--timeout', '30', '--trust', fpS, '--state-dir', stR], {
      cwd: app,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let rOut = '';
    let rErr = '';
    recv.stderr.on('data', (d: Buffer) => (rErr += d));
    const recvDone = new Promise<number | null>((resolve) => recv.on('close', resolve));
    try {
      const port = await new Promise<number>((resolve, reject) => {
        recv.stdout.on('data', (d: Buffer) => {
          rOut += d;
          const m = /"event":"listening"[^\n]*"port":(\d+)/.exec(rOut);
          if (m) resolve(Number(m[1]));
        });
        void recvDone.then((code) => reject(new Error(`receiver exited (${code}) before listening: ${rErr}`)));
      });
      const s = sh(process.execPath, [cli, 'send', src, `127.0.0.1:${port}`, '--json', '--timeout', '30', '--trust', fpR, '--state-dir', stS], app);
      const summary = JSON.parse(s.stdout.trim().split('\n').pop()!) as { event: string; ok: boolean };
      assert.equal(summary.event, 'summary');
      assert.equal(summary.ok, true);
      assert.equal(await recvDone, 0, rErr);
    } finally {
      recv.kill();
    }
    assert.ok(fs.readFileSync(dst).equals(fs.readFileSync(src)), 'the received file differs from the source');
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
});
