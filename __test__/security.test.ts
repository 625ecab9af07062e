// TLS by default with mutual fingerprint pinning; identity and pin management commands.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import { execFileSync } from 'node:child_process';
import { CLI, run, seeded, sha256, snapshot, tmpdir } from './helpers/peers';

async function id(stateDir: string, ...extra: string[]): Promise<string> {
  const r = await run(['id', '--state-dir', stateDir, ...extra]).done;
  assert.equal(r.code, 0, r.stderr);
  return r.stdout.trim();
}

/** A TLS sync (no --plaintext) with per-side extra arguments. */
async function tlsSync(src: string, dst: string, stateS: string, stateR: string, recvArgs: string[] = [], sendArgs: string[] = []) {
  const recv = run(['receive', dst, '0', '--json', '--bind', '127.0.0.1', '--timeout', '10', '--state-dir', stateR, ...recvArgs]);
  const l = await recv.waitFor((e) => e.event === 'listening');
  const send = await run(['send', src, `127.0.0.1:${l.port}`, '--json', '--timeout', '10', '--state-dir', stateS, ...sendArgs]).done;
  return { send, recv: await recv.done };
}

describe('identity and pins', () => {
  it('id creates a private key readable only by its owner and prints a stable fingerprint', async () => {
    const st = tmpdir();
    const fp = await id(st);
    assert.match(fp, /^([0-9A-F]{4}-){15}[0-9A-F]{4}$/);
    assert.equal(await id(st), fp);
    assert.equal(fs.statSync(path.join(st, 'identity', 'key.pem')).mode & 0o777, 0o600);
    const rotated = await id(st, '--rotate');
    assert.notEqual(rotated, fp);
    assert.equal(await id(st), rotated);
  });

  it('trust, fingerprints, untrust', async () => {
    const st = tmpdir();
    const fp = await id(tmpdir());
    const lower = fp.toLowerCase().replace(/-/g, ':');
    assert.equal((await run(['trust', lower, 'build', 'host', '--state-dir', st]).done).code, 0);
    const list = await run(['fingerprints', '--state-dir', st]).done;
    assert.equal(list.stdout.trim(), `${fp}  build host`);
    assert.equal((await run(['untrust', fp, '--state-dir', st]).done).code, 0);
    assert.equal((await run(['fingerprints', '--state-dir', st]).done).stdout, '');
    assert.equal((await run(['untrust', fp, '--state-dir', st]).done).code, 1);
    assert.equal((await run(['trust', 'not-a-fingerprint', '--state-dir', st]).done).code, 1);
  });
});

describe('TLS sessions', () => {
  function setup() {
    const dir = tmpdir();
    const src = path.join(dir, 'src.bin');
    fs.writeFileSync(src, seeded(3 << 20, 4));
    const out = path.join(dir, 'out');
    fs.mkdirSync(out);
    return { dir, src, out, dst: path.join(out, 'dst.bin'), stateS: path.join(dir, 'ss'), stateR: path.join(dir, 'sr') };
  }

  it('--trust on both sides: TLS sync succeeds and pins each other; the next sync needs no flag', async () => {
    const t = setup();
    const fs_ = await id(t.stateS);
    const fr = await id(t.stateR);
    const first = await tlsSync(t.src, t.dst, t.stateS, t.stateR, ['--trust', fs_], ['--trust', fr]);
    assert.equal(first.send.code, 0, first.send.stderr);
    assert.equal(first.recv.code, 0, first.recv.stderr);
    assert.equal(sha256(t.dst), sha256(t.src));
    assert.equal(first.send.summary!.peerFingerprint, fr);
    assert.equal(first.recv.summary!.peerFingerprint, fs_);
    const peerEvent = first.recv.events.find((e) => e.event === 'peer');
    assert.equal(peerEvent?.fingerprint, fs_);
    fs.rmSync(t.dst);
    const again = await tlsSync(t.src, t.dst, t.stateS, t.stateR);
    assert.equal(again.send.code, 0, again.send.stderr);
    assert.equal(again.recv.code, 0, again.recv.stderr);
    assert.equal(sha256(t.dst), sha256(t.src));
  });

  /** The command a hint tells the user to run (`... run 'ffsync-native trust FP --state-dir DIR' ...`), run as written. */
  async function runHint(stderr: string): Promise<void> {
    const m = /run 'ffsync-native (trust [^']+)'/.exec(stderr);
    assert.ok(m, `a hint naming the command: ${stderr}`);
    const args = m[1]!.split(' ');
    const r = await run(args).done;
    assert.equal(r.code, 0, `'ffsync-native ${m[1]}' as the hint says: ${r.stderr}`);
  }

  it('an unpinned peer without a TTY is refused (exit 5), nothing is written, and the receiver keeps waiting: following both hints literally, the retry succeeds', async () => {
    const t = setup();
    const before = snapshot(t.out);
    const recv = run(['receive', t.dst, '0', '--json', '--bind', '127.0.0.1', '--timeout', '10', '--state-dir', t.stateR]);
    const l = await recv.waitFor((e) => e.event === 'listening');
    const refusedBySender = await run(['send', t.src, `127.0.0.1:${l.port}`, '--timeout', '10', '--state-dir', t.stateS]).done;
    assert.equal(refusedBySender.code, 5, refusedBySender.stderr);
    const refusal = await recv.waitFor((e) => e.event === 'info' && /refused a connection/.test(e.message));
    const fsender = await id(t.stateS);
    assert.match(refusal.message, new RegExp(`unknown peer .*${fsender}.*still waiting for a trusted sender`));
    assert.deepEqual(snapshot(t.out), before);
    // The hints include the options that make them work here (--state-dir: not the default).
    assert.match(refusal.message, new RegExp(`run 'ffsync-native trust ${fsender} --state-dir ${t.stateR}'`));
    await runHint(refusal.message);
    await runHint(refusedBySender.stderr);
    // The same receiver, never restarted, now takes the retry.
    const retry = await run(['send', t.src, `127.0.0.1:${l.port}`, '--timeout', '10', '--state-dir', t.stateS]).done;
    assert.equal(retry.code, 0, retry.stderr);
    const r = await recv.done;
    assert.equal(r.code, 0, r.stderr);
    assert.equal(sha256(t.dst), sha256(t.src));
  });

  it('a pinned fingerprint presented by a different key is a loud mismatch (exit 5); the receiver refuses it and waits for the real sender', async () => {
    const t = setup();
    const impostorState = path.join(t.dir, 'impostor');
    const realSender = await id(t.stateS);
    await id(impostorState); // a different key
    const fr = await id(t.stateR);
    const recv = run(['receive', t.dst, '0', '--json', '--bind', '127.0.0.1', '--timeout', '10', '--state-dir', t.stateR, '--trust', realSender]);
    const l = await recv.waitFor((e) => e.event === 'listening');
    const impostor = await run(['send', t.src, `127.0.0.1:${l.port}`, '--timeout', '10', '--state-dir', impostorState, '--trust', fr]).done;
    assert.notEqual(impostor.code, 0);
    const refusal = await recv.waitFor((e) => e.event === 'info' && /refused a connection/.test(e.message));
    assert.match(refusal.message, /FINGERPRINT MISMATCH/);
    assert.equal(fs.existsSync(t.dst), false);
    const real = await run(['send', t.src, `127.0.0.1:${l.port}`, '--timeout', '10', '--state-dir', t.stateS, '--trust', fr]).done;
    assert.equal(real.code, 0, real.stderr);
    assert.equal((await recv.done).code, 0);
    assert.equal(sha256(t.dst), sha256(t.src));
  });

  it('--plaintext on one side only: a clear error on both sides, never a hang', async () => {
    const t = setup();
    for (const [recvArgs, sendArgs] of [
      [['--plaintext'], []],
      [[], ['--plaintext']],
    ]) {
      const started = Date.now();
      const r = await tlsSync(t.src, t.dst, t.stateS, t.stateR, recvArgs, sendArgs);
      assert.ok(Date.now() - started < 8000, 'must not wait for the idle timeout');
      assert.equal(r.recv.code, 2, `receiver ${recvArgs}: ${r.recv.stderr}`);
      assert.equal(r.send.code, 2, `sender ${sendArgs}: ${r.send.stderr}`);
      assert.match(r.recv.stderr + r.send.stderr, /--plaintext/);
      assert.equal(fs.existsSync(t.dst), false);
    }
  });
});

describe('interactive first contact', () => {
  const tmux = (() => {
    try {
      execFileSync('tmux', ['-V'], { stdio: 'ignore' });
      return true;
    } catch {
      return false;
    }
  })();

  it('on a terminal, an unknown peer is shown and pinned after "y"', { skip: !tmux && 'tmux is not installed' }, async () => {
    const dir = tmpdir();
    const src = path.join(dir, 'src.bin');
    fs.writeFileSync(src, seeded(50_000, 8));
    const [sr, ss] = [path.join(dir, 'sr'), path.join(dir, 'ss')];
    const recvFp = await id(sr);
    const sendFp = await id(ss);
    const session = `ffsync-test-${process.pid}`;
    const portFile = path.join(dir, 'port');
    // The receiver runs in a real terminal (tmux); its --json listening event goes to a file.
    execFileSync('tmux', [
      'new-session', '-d', '-s', session, '-x', '200', '-y', '40',
      `${process.execPath} ${CLI} receive ${path.join(dir, 'dst.bin')} 0 --bind 127.0.0.1 --json --state-dir ${sr} > ${portFile}; sleep 3`,
    ]);
    try {
      let port = 0;
      for (let i = 0; i < 100 && !port; i++) {
        await new Promise((r) => setTimeout(r, 100));
        const line = fs.existsSync(portFile) ? fs.readFileSync(portFile, 'utf8').split('\n')[0] : '';
        if (line) port = JSON.parse(line).port;
      }
      const send = run(['send', src, `127.0.0.1:${port}`, '--state-dir', ss, '--trust', recvFp]);
      let screen = '';
      for (let i = 0; i < 100 && !screen.includes('trust this peer? [y/N]'); i++) {
        await new Promise((r) => setTimeout(r, 100));
        screen = execFileSync('tmux', ['capture-pane', '-p', '-t', session], { encoding: 'utf8' });
      }
      assert.match(screen, new RegExp(`fingerprint ${sendFp}`));
      assert.match(screen, /trust this peer\? \[y\/N\]/);
      execFileSync('tmux', ['send-keys', '-t', session, 'y', 'Enter']);
      const s = await send.done;
      assert.equal(s.code, 0, s.stderr);
      assert.equal(sha256(path.join(dir, 'dst.bin')), sha256(src));
      const pins = await run(['fingerprints', '--state-dir', sr]).done;
      assert.match(pins.stdout, new RegExp(sendFp));
    } finally {
      try {
        execFileSync('tmux', ['kill-session', '-t', session], { stdio: 'ignore' });
      } catch {
        // already gone
      }
    }
  });
});

describe('parallel lanes over TLS', () => {
  it('--parallel 4: every lane is authenticated like the first; the tree converges', async () => {
    const dir = tmpdir();
    const src = path.join(dir, 'src');
    fs.mkdirSync(src);
    for (let i = 0; i < 6; i++) fs.writeFileSync(path.join(src, `big${i}.bin`), seeded(3 * 1024 * 1024, 300 + i));
    fs.writeFileSync(path.join(src, 'small.txt'), 'small\n');
    const stateS = path.join(dir, 's');
    const stateR = path.join(dir, 'r');
    const [fs_, fr] = [await id(stateS), await id(stateR)];
    const dst = path.join(dir, 'dst');
    const r = await tlsSync(src, dst, stateS, stateR, ['--trust', fs_], ['--trust', fr, '--parallel', '4']);
    assert.equal(r.send.code, 0, r.send.stderr);
    assert.equal(r.recv.code, 0, r.recv.stderr);
    assert.equal(r.send.summary!.tree.lanes, 4, 'four connections carried large files');
    for (const n of fs.readdirSync(src)) assert.equal(sha256(path.join(dst, n)), sha256(path.join(src, n)), n);
    // Lane bytes count on both sides.
    assert.ok(r.recv.summary!.bytesOnWire.received > 18 * 1024 * 1024);
  });
});
