// The command-line contract of ../shared/README.md: first output line, JSON events,
// plain progress without escape codes when not on a TTY, --version/--help.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { it } from 'node:test';
import { run, seeded, tmpdir } from './helpers/peers';
import { ExitCode, FfsyncError, receive, send } from '../ts/api/index';

it('--version prints the package version; --help lists send and receive', async () => {
  const v = await run(['--version']).done;
  assert.equal(v.code, 0);
  assert.equal(v.stdout.trim(), JSON.parse(fs.readFileSync(path.join(__dirname, '..', 'package.json'), 'utf8')).version);
  const h = await run(['--help']).done;
  assert.equal(h.code, 0);
  assert.match(h.stdout, /receive/);
  assert.match(h.stdout, /send/);
});

it('human mode: the receiver\'s first line is its address; progress lines carry no escape codes', async () => {
  const dir = tmpdir();
  const src = path.join(dir, 'a.bin');
  fs.writeFileSync(src, seeded(3 << 20, 1));
  const recv = run(['receive', path.join(dir, 'b.bin'), '0', '--plaintext', '--bind', '127.0.0.1', '--state-dir', path.join(dir, 'r')]);
  const port = await new Promise<number>((resolve, reject) => {
    recv.child.stdout!.once('data', (d: Buffer) => {
      const m = /^listening on 127\.0\.0\.1:(\d+)\n/.exec(d.toString());
      if (m) resolve(Number(m[1]));
      else reject(new Error(`first line was ${JSON.stringify(d.toString())}`));
    });
  });
  const s = await run(['send', src, `127.0.0.1:${port}`, '--plaintext', '--state-dir', path.join(dir, 's')]).done;
  const r = await recv.done;
  assert.equal(s.code, 0, s.stderr);
  assert.equal(r.code, 0, r.stderr);
  assert.match(s.stderr, /^hashing .*\nsending /m);
  assert.match(r.stderr, /receiving .*\n(.*\n)*verifying /);
  // eslint-disable-next-line no-control-regex
  assert.doesNotMatch(s.stderr + r.stderr, /\x1b\[/);
  assert.match(s.stdout, /^sent .*a\.bin: 3\.00 MiB/m);
});

it('--json: listening event first (even when the receiver has a file to prescan), summary last', async () => {
  const dir = tmpdir();
  const src = path.join(dir, 'a.bin');
  fs.writeFileSync(src, seeded(2 << 20, 2));
  fs.writeFileSync(path.join(dir, 'b.bin'), seeded(2 << 20, 3));
  const recv = run(['receive', path.join(dir, 'b.bin'), '0', '--plaintext', '--json', '--state-dir', path.join(dir, 'r')]);
  const l = await recv.waitFor((e) => e.event === 'listening');
  const s = await run(['send', src, `127.0.0.1:${l.port}`, '--plaintext', '--json', '--state-dir', path.join(dir, 's')]).done;
  const r = await recv.done;
  for (const p of [s, r]) {
    const lines = p.stdout.trim().split('\n').map((x) => JSON.parse(x));
    assert.ok(lines.every((e) => typeof e.event === 'string'));
    const last = lines[lines.length - 1];
    assert.equal(last.event, 'summary');
    assert.equal(last.ok, true);
    assert.equal(last.exitCode, 0);
    assert.equal(typeof last.bytesOnWire.sent, 'number');
    assert.equal(typeof last.bytesOnWire.received, 'number');
    assert.equal(typeof last.durationMs, 'number');
  }
  assert.deepEqual(Object.keys(r.events[0]).sort(), ['event', 'host', 'port']);
  assert.ok(r.events.some((e) => e.event === 'phase' && e.phase === 'hashing'), 'the prescan reported its phase');
  assert.equal(s.summary!.bytesOnWire.sent, r.summary!.bytesOnWire.received);
});

it('--json failure: summary with ok=false and the exit code', async () => {
  const r = await run(['send', '/nonexistent/file', '127.0.0.1:9', '--plaintext', '--json']).done;
  assert.equal(r.code, 3);
  assert.equal(r.summary!.ok, false);
  assert.equal(r.summary!.exitCode, 3);
});

it('library API: send/receive in-process without a shell', async () => {
  const dir = tmpdir();
  const src = path.join(dir, 'lib.bin');
  fs.writeFileSync(src, seeded(5 << 20, 3));
  let port = 0;
  let listening!: () => void;
  const ready = new Promise<void>((r) => (listening = r));
  const received = receive({ path: path.join(dir, 'out.bin'), port: 0, plaintext: true, stateDir: path.join(dir, 'r'), events: { listening: (_h, p) => ((port = p), listening()) } });
  await ready;
  const [sum, rsum] = await Promise.all([send({ path: src, host: '127.0.0.1', port, plaintext: true, stateDir: path.join(dir, 's') }), received]);
  assert.equal(sum.ok, true);
  assert.equal(rsum.ok, true);
  assert.equal(sum.literalBytes, 5 << 20);
  assert.equal(rsum.literalBytes, 5 << 20);
  assert.deepEqual(fs.readFileSync(path.join(dir, 'out.bin')), fs.readFileSync(src));
});

it('library API: aborting a send through its AbortSignal rejects both sides with an "interrupted" error (exit 20)', async () => {
  const dir = tmpdir();
  const src = path.join(dir, 'lib.bin');
  fs.writeFileSync(src, seeded(32 << 20, 4));
  const out = path.join(dir, 'out.bin');
  fs.writeFileSync(out, 'old');
  let port = 0;
  let listening!: () => void;
  const ready = new Promise<void>((r) => (listening = r));
  let receivedBytes = 0;
  let started!: () => void;
  const flowing = new Promise<void>((r) => (started = r));
  const received = receive({
    path: out,
    port: 0,
    plaintext: true,
    stateDir: path.join(dir, 'r'),
    events: {
      listening: (_h, p) => ((port = p), listening()),
      progress: (phase, done) => {
        if (phase === 'receiving' && done > 0 && receivedBytes === 0) started();
        receivedBytes = done;
      },
    },
  });
  received.catch(() => undefined);
  await ready;
  const ac = new AbortController();
  const sent = send({ path: src, host: '127.0.0.1', port, plaintext: true, stateDir: path.join(dir, 's'), bwlimitKiBps: 8 * 1024, signal: ac.signal });
  sent.catch(() => undefined);
  await flowing;
  ac.abort();
  await assert.rejects(sent, (e: unknown) => e instanceof FfsyncError && e.exitCode === ExitCode.SIGNAL && e.code === 'ESIGNAL' && e.message === 'interrupted');
  await assert.rejects(received, (e: unknown) => e instanceof FfsyncError && e.exitCode === ExitCode.SIGNAL && /^peer: interrupted/.test(e.message));
  assert.equal(fs.readFileSync(out, 'utf8'), 'old', 'the old file is untouched');
});
