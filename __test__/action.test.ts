// The GitHub Action (action.yml) is a product too (issue 19). Its shell steps run here as a
// runner would run them: inputs into `env:`, `if:` conditions, GITHUB_ENV carried between steps,
// GITHUB_OUTPUT and GITHUB_STEP_SUMMARY written; only setup-node and the npm install are replaced
// (FFSYNC_CLI points at this build). Modes: send (TLS to a receiver), ssh (a real sshd), pull is
// the same step with `pull`; plus the job summary script and the pinned default version.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import { CLI, run, seeded, tmpdir } from './helpers/peers';
import { startSshd, sshdUnavailable } from './helpers/sshd';

// js-yaml: the parser the napi-rs CLI and eslint already bring; a devDependency of this package.
// eslint-disable-next-line @typescript-eslint/no-require-imports
const yaml = require('js-yaml') as { load(s: string): unknown };

const REPO = path.join(__dirname, '..');

interface Step {
  name?: string;
  uses?: string;
  if?: string;
  env?: Record<string, string>;
  run?: string;
}

const action = yaml.load(fs.readFileSync(path.join(REPO, 'action.yml'), 'utf8')) as {
  inputs: Record<string, { default?: string; required?: boolean }>;
  runs: { steps: Step[] };
};

/** `${{ inputs.x }}` in a string. */
function expand(text: string, inputs: Record<string, string>): string {
  return text.replace(/\$\{\{\s*inputs\.([\w-]+)\s*\}\}/g, (_, k: string) => inputs[k] ?? '');
}

/** The `if:` forms action.yml uses: always(), inputs.x == 'v', inputs.x != 'v'. */
function condition(expr: string | undefined, inputs: Record<string, string>): boolean {
  if (!expr) return true;
  if (expr.trim() === 'always()') return true;
  const m = /^inputs\.([\w-]+)\s*(==|!=)\s*'([^']*)'$/.exec(expr.trim());
  assert.ok(m, `an if: this runner understands: ${expr}`);
  return (inputs[m[1]!] === m[3]) === (m[2] === '==');
}

/** Runs the action's steps with `given` inputs; returns the outputs, the summary and the log. */
function runAction(given: Record<string, string>): { code: number; outputs: Record<string, string>; summary: string; log: string } {
  const inputs: Record<string, string> = {};
  for (const [k, v] of Object.entries(action.inputs)) inputs[k] = v.default ?? '';
  Object.assign(inputs, given);
  const temp = tmpdir('ffsync-action-');
  const files = { env: path.join(temp, 'github_env'), output: path.join(temp, 'github_output'), summary: path.join(temp, 'step_summary') };
  for (const f of Object.values(files)) fs.writeFileSync(f, '');
  const carried: Record<string, string> = {};
  let log = '';
  let failed = 0;
  for (const step of action.runs.steps) {
    if (step.uses || step.name === 'install ffsync-native') continue; // setup-node, npm install
    if (failed && step.if?.trim() !== 'always()') continue;
    if (!condition(step.if, inputs)) continue;
    const env: NodeJS.ProcessEnv = {
      ...process.env,
      RUNNER_TEMP: temp,
      GITHUB_RUN_ID: '1',
      GITHUB_RUN_ATTEMPT: '1',
      GITHUB_ENV: files.env,
      GITHUB_OUTPUT: files.output,
      GITHUB_STEP_SUMMARY: files.summary,
      GITHUB_ACTION_PATH: REPO,
      FFSYNC_CLI: CLI,
      ...carried,
    };
    for (const [k, v] of Object.entries(step.env ?? {})) env[k] = expand(String(v), inputs);
    const r = spawnSync('bash', ['--noprofile', '--norc', '-eo', 'pipefail', '-c', step.run!], { env, encoding: 'utf8', timeout: 120_000 });
    log += `## ${expand(step.name ?? '', inputs)}\n${r.stdout}${r.stderr}`;
    for (const line of fs.readFileSync(files.env, 'utf8').split('\n')) {
      const i = line.indexOf('=');
      if (i > 0) carried[line.slice(0, i)] = line.slice(i + 1);
    }
    if (r.status !== 0 && !failed) failed = r.status ?? 1;
  }
  const outputs: Record<string, string> = {};
  for (const line of fs.readFileSync(files.output, 'utf8').split('\n')) {
    const i = line.indexOf('=');
    if (i > 0) outputs[line.slice(0, i)] = line.slice(i + 1);
  }
  return { code: failed, outputs, summary: fs.readFileSync(files.summary, 'utf8'), log };
}

/** An identity made the way docs/cli.md ("Use in GitHub Actions") tells users to, as the `identity` input (cert.pem then key.pem). */
async function runnerIdentity(dir: string): Promise<{ pem: string; fingerprint: string }> {
  const state = path.join(dir, 'ci-identity');
  const r = await run(['id', '--state-dir', state]).done;
  assert.equal(r.code, 0, r.stderr);
  const pem = ['cert.pem', 'key.pem'].map((f) => fs.readFileSync(path.join(state, 'identity', f), 'utf8')).join('');
  return { pem, fingerprint: r.stdout.trim() };
}

describe('the GitHub Action', () => {
  it('the default version is the package’s own: a pinned action runs a pinned tool', () => {
    const pkg = JSON.parse(fs.readFileSync(path.join(REPO, 'package.json'), 'utf8')) as { version: string };
    assert.equal(action.inputs.version!.default, pkg.version);
  });

  it('mode send: pushes over TLS with both fingerprints pinned; outputs, progress lines in the log, a job summary table', async () => {
    const dir = tmpdir();
    const src = path.join(dir, 'dist');
    fs.mkdirSync(src);
    fs.writeFileSync(path.join(src, 'app.js'), seeded(3 << 20, 21));
    fs.writeFileSync(path.join(src, 'README'), 'hello\n');
    const runner = await runnerIdentity(dir);
    const recvState = path.join(dir, 'recv-state');
    const receiverFp = (await run(['id', '--state-dir', recvState]).done).stdout.trim();
    const peer = run(['receive', path.join(dir, 'target'), '0', '--json', '--bind', '127.0.0.1', '--timeout', '20', '--state-dir', recvState, '--trust', runner.fingerprint]);
    const { port } = await peer.waitFor((e) => e.event === 'listening');
    const r = runAction({ source: src, destination: `127.0.0.1:${port}`, fingerprint: receiverFp, identity: runner.pem });
    assert.equal(r.code, 0, r.log);
    assert.equal((await peer.done).code, 0);
    assert.deepEqual(fs.readFileSync(path.join(dir, 'target', 'app.js')), fs.readFileSync(path.join(src, 'app.js')));
    assert.equal(r.outputs['exit-code'], '0');
    assert.ok(Number(r.outputs['bytes-sent']) > 0);
    assert.match(r.log, /^sending /m, 'progress lines in the job log');
    assert.match(r.summary, /^### ffsync-native send$/m);
    assert.match(r.summary, /^\| result \| ok \|$/m);
    assert.match(r.summary, /^\| files \| 2 \(2 written, 0 unchanged, 0 deleted\) \|$/m);
    assert.match(r.summary, /^\| vs a whole copy \| [\d.]+% of the bytes/m);
    assert.equal(fs.readdirSync(dir).filter((n) => n.startsWith('ffsync-state')).length, 0);
  });

  it('mode ssh: sync -a over ssh with a deploy key and a strictly checked host key', { skip: sshdUnavailable() || undefined }, async () => {
    const sshd = await startSshd();
    try {
      const dir = tmpdir();
      const src = path.join(dir, 'dist');
      fs.mkdirSync(path.join(src, 'sub'), { recursive: true });
      fs.writeFileSync(path.join(src, 'sub', 'a.bin'), seeded(1 << 20, 22));
      const hostKey = fs.readFileSync(path.join(sshd.dir, 'host_ed25519.pub'), 'utf8').trim().split(' ').slice(0, 2).join(' ');
      const inputs = {
        mode: 'ssh',
        source: `${src}/`,
        destination: `${sshd.host}:${path.join(dir, 'deployed')}`,
        'ssh-key': fs.readFileSync(path.join(sshd.dir, 'client_ed25519'), 'utf8'),
        'ssh-known-hosts': `[${sshd.host}]:${sshd.port} ${hostKey}`,
        'ssh-port': String(sshd.port),
        'remote-cmd': `env FFSYNC_STATE_DIR=${path.join(dir, 'remote-state')} ${process.execPath} ${CLI}`,
      };
      const r = runAction(inputs);
      assert.equal(r.code, 0, r.log);
      assert.deepEqual(fs.readFileSync(path.join(dir, 'deployed', 'sub', 'a.bin')), fs.readFileSync(path.join(src, 'sub', 'a.bin')));
      assert.equal(r.outputs['exit-code'], '0');
      assert.match(r.summary, /^### ffsync-native ssh$/m);
      // A host key that is not the one given: refused, never a prompt or a blind accept.
      const wrong = runAction({ ...inputs, 'ssh-known-hosts': `[${sshd.host}]:${sshd.port} ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl` });
      assert.equal(wrong.code, 255, wrong.log);
      assert.match(wrong.summary, /result \| failed/);
    } finally {
      await sshd.stop();
    }
  });

  it('a mode without its inputs, or an unknown mode, fails with an ::error:: line', () => {
    const noIdentity = runAction({ source: '/x', destination: '127.0.0.1:1', fingerprint: 'AB' });
    assert.equal(noIdentity.code, 1);
    assert.match(noIdentity.log, /::error::mode send needs the fingerprint and identity inputs/);
    const bad = runAction({ mode: 'ftp', source: '/x', destination: 'y' });
    assert.equal(bad.code, 1);
    assert.match(bad.log, /::error::mode must be send, ssh or pull/);
  });

  it('the job summary script: outputs and table from the events, and a run that never summarized', () => {
    const dir = tmpdir();
    const events = path.join(dir, 'events.ndjson');
    const summary = { event: 'summary', ok: true, exitCode: 0, size: 1000, literalBytes: 100, matchedBytes: 900, bytesOnWire: { sent: 150, received: 50 }, durationMs: 1500, tree: { files: 3, written: 1, unchanged: 2, deleted: 0 } };
    fs.writeFileSync(events, `{"event":"listening"}\nnot json\n${JSON.stringify(summary)}\n`);
    const out = path.join(dir, 'summary.md');
    fs.writeFileSync(out, '');
    const r = spawnSync(process.execPath, [path.join(REPO, 'action', 'summary.js'), events, '0', 'send'], { encoding: 'utf8', env: { ...process.env, GITHUB_STEP_SUMMARY: out } });
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stdout, /^exit-code=0\nbytes-sent=150\nbytes-received=50\nduration-ms=1500\nsummary=\{/);
    const table = fs.readFileSync(out, 'utf8');
    assert.match(table, /\| vs a whole copy \| 20\.0% of the bytes \(1000 B for a whole copy\) \|/);
    assert.match(table, /\| time \| 1\.50 s \|/);
    const none = spawnSync(process.execPath, [path.join(REPO, 'action', 'summary.js'), path.join(dir, 'missing'), '10', 'pull'], { encoding: 'utf8', env: { ...process.env, GITHUB_STEP_SUMMARY: out } });
    assert.equal(none.stdout, 'exit-code=10\n');
    assert.match(fs.readFileSync(out, 'utf8'), /### ffsync-native pull\n\n\| \| \|\n\|---\|---\|\n\| result \| failed before a summary \(exit 10\) \|/);
  });
});
