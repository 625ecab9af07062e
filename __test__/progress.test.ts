// What a person or a CI log sees (issue 19): `sync` is as quiet as rsync unless asked (-v lists
// changes on stdout in rsync's format and ends with rsync's two lines; -n alone lists nothing);
// --progress without a terminal prints plain lines at an interval, with percent, rate and ETA,
// never escape codes; a pseudo-terminal with 0 columns gets the plain format too, while one with
// columns gets the spinner, and SIGTERM ends a session under a terminal with exit 20.
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import { CLI, run, seeded, startReceiver, tmpdir } from './helpers/peers';
import { canDraw, noColor, progressLine, rsyncListLine } from '../ts/cli/reporter';

function tree(dir: string): string {
  const src = path.join(dir, 'src');
  fs.mkdirSync(path.join(src, 'd1'), { recursive: true });
  fs.writeFileSync(path.join(src, 'a'), 'hello\n');
  fs.writeFileSync(path.join(src, 'd1', 'b'), Buffer.alloc(10_000, 1));
  fs.symlinkSync('a', path.join(src, 'l'));
  return src;
}

describe('sync output: as quiet as rsync unless asked', () => {
  it('-a prints nothing; -av lists the changes on stdout and ends with rsync’s two lines', async () => {
    const dir = tmpdir();
    const src = tree(dir);
    const dest = path.join(dir, 'out');
    const state = ['--state-dir', path.join(dir, 'state')];
    const quiet = await run(['sync', '-a', ...state, src + '/', dest]).done;
    assert.equal(quiet.code, 0, quiet.stderr);
    assert.equal(quiet.stdout, '', 'no summary without -v or --stats');
    assert.equal(quiet.stderr, '', 'no phase lines without --progress');

    fs.appendFileSync(path.join(src, 'a'), 'more\n');
    fs.writeFileSync(path.join(dest, 'extra'), 'only here');
    const v = await run(['sync', '-av', '--delete', ...state, src + '/', dest]).done;
    assert.equal(v.code, 0, v.stderr);
    assert.equal(v.stderr, '');
    const lines = v.stdout.split('\n');
    assert.equal(lines[0], 'sending incremental file list');
    assert.ok(lines.includes('a'), `the changed file is listed by name: ${v.stdout}`);
    assert.ok(lines.includes('deleting extra'), `a deletion as rsync says it: ${v.stdout}`);
    assert.ok(!lines.includes('d1/b'), 'an unchanged file is not listed');
    assert.match(v.stdout, /\n\nsent [\d,]+ bytes {2}received [\d,]+ bytes {2}[\d,]+\.\d\d bytes\/sec\ntotal size is [\d,]+ {2}speedup is \d+\.\d\d\n$/);
  });

  it('-n alone lists nothing and writes nothing; -nv lists what would change and says (DRY RUN)', async () => {
    const dir = tmpdir();
    const src = tree(dir);
    const dest = path.join(dir, 'out');
    const n = await run(['sync', '-an', '--state-dir', path.join(dir, 's1'), src + '/', dest]).done;
    assert.equal(n.code, 0, n.stderr);
    assert.equal(n.stdout + n.stderr, '');
    assert.equal(fs.existsSync(dest), false);
    const nv = await run(['sync', '-anv', '--state-dir', path.join(dir, 's2'), src + '/', dest]).done;
    assert.equal(nv.code, 0, nv.stderr);
    const lines = nv.stdout.split('\n');
    for (const want of ['d1/', 'a', 'd1/b', 'l -> a']) assert.ok(lines.includes(want), `lists ${want}: ${nv.stdout}`);
    assert.match(nv.stdout, /speedup is \d+\.\d\d \(DRY RUN\)\n$/);
    assert.equal(fs.existsSync(dest), false);
  });

  it('--progress without a terminal: plain lines every --progress-interval seconds, with percent, rate and ETA, no escape codes', async () => {
    const dir = tmpdir();
    const src = path.join(dir, 'big.bin');
    fs.writeFileSync(src, seeded(3 << 20, 5));
    // 1 MiB/s: about three seconds, so a 1 s interval prints lines while the data moves.
    const r = await run(['sync', '--progress', '--progress-interval', '1', '--bwlimit', '1024', '--state-dir', path.join(dir, 's'), src, path.join(dir, 'out.bin')]).done;
    assert.equal(r.code, 0, r.stderr);
    const sending = r.stderr.split('\n').filter((l) => l.startsWith('sending'));
    const during = sending.filter((l) => /%/.test(l));
    assert.ok(during.length >= 1, `progress lines while sending: ${r.stderr}`);
    for (const l of during) assert.match(l, /^sending +[\d.]+ \w+ \/ 3\.00 MiB {2}\d+% {2}[\d.]+ \w+\/s {2}[\d.]+ s {2}ETA \d+:\d\d$/);
    assert.ok(sending.length >= 2, `and a final line for the phase: ${r.stderr}`);
    // eslint-disable-next-line no-control-regex
    assert.doesNotMatch(r.stderr, /\x1b\[|\r/);
  });
});

const haveScript = spawnSync('script', ['--version']).status === 0;

/** Runs the CLI under a pseudo-terminal of `cols` columns (util-linux `script`); resolves with
 * everything the terminal received and the exit code. `onStart` gets the child (to signal it). */
function underPty(args: string[], cols: number, onStart?: (kill: (sig: NodeJS.Signals) => void) => void): Promise<{ out: string; code: number | null }> {
  const quoted = [process.execPath, CLI, ...args].map((a) => `'${a.replace(/'/g, `'\\''`)}'`).join(' ');
  // `exec` so that signalling the shell's pid signals the CLI itself.
  // A terminal as a person has it: ora (like most tools) draws nothing animated when CI is
  // set or TERM is dumb, which CI runners do.
  const env: NodeJS.ProcessEnv = { ...process.env, TERM: 'xterm-256color' };
  delete env.CI;
  const child = spawn('script', ['-q', '-e', '-c', `stty cols ${cols} rows 24; exec ${quoted}`, '/dev/null'], { stdio: ['pipe', 'pipe', 'pipe'], env });
  let out = '';
  child.stdout.on('data', (d: Buffer) => (out += d.toString('latin1')));
  onStart?.((sig) => {
    // The CLI is the grandchild: script -> sh (exec'd into node).
    const pids = spawnSync('pgrep', ['-P', String(child.pid)], { encoding: 'utf8' }).stdout.trim().split('\n').filter(Boolean);
    for (const p of pids) process.kill(Number(p), sig);
  });
  return new Promise((resolve) => child.on('close', (code) => resolve({ out, code })));
}

describe('terminals', { skip: !haveScript && 'util-linux script is not installed' }, () => {
  it('a pseudo-terminal with 0 columns gets plain lines, no escape codes; one with 80 columns gets the spinner', async () => {
    const dir = tmpdir();
    const src = path.join(dir, 'big.bin');
    // Progress advances a batch (up to 2 MiB) at a time: 6 MiB at 2 MiB/s gives lines in between.
    fs.writeFileSync(src, seeded(6 << 20, 6));
    const zero = await underPty(['sync', '--progress', '--progress-interval', '1', '--bwlimit', '2048', '--state-dir', path.join(dir, 's0'), src, path.join(dir, 'zero.bin')], 0);
    assert.equal(zero.code, 0, zero.out);
    assert.ok(zero.out.length < 4096, `a few plain lines, not a flood (${zero.out.length} bytes)`);
    // eslint-disable-next-line no-control-regex
    assert.doesNotMatch(zero.out, /\x1b\[/, 'no escape codes for a terminal that cannot draw');
    assert.match(zero.out, /sending .*%/);
    const wide = await underPty(['sync', '--progress', '--bwlimit', '8192', '--state-dir', path.join(dir, 's80'), src, path.join(dir, 'wide.bin')], 80);
    assert.equal(wide.code, 0, wide.out);
    // eslint-disable-next-line no-control-regex
    assert.match(wide.out, /\x1b\[/, 'a terminal with columns gets the spinner');
  });

  it('SIGTERM under a terminal ends the session with exit 20 and says so', async () => {
    const dir = tmpdir();
    const src = path.join(dir, 'big.bin');
    fs.writeFileSync(src, seeded(16 << 20, 7));
    const { peer: recv, port } = await startReceiver(path.join(dir, 'out.bin'), ['--state-dir', path.join(dir, 'r')]);
    let kill!: (sig: NodeJS.Signals) => void;
    const sent = underPty(['send', src, `127.0.0.1:${port}`, '--plaintext', '--bwlimit', '1024', '--state-dir', path.join(dir, 's')], 0, (k) => (kill = k));
    await recv.waitFor((e) => e.event === 'progress' && e.phase === 'receiving' && e.doneBytes > 0);
    kill('SIGTERM');
    const s = await sent;
    assert.equal(s.code, 20, s.out);
    assert.match(s.out, /ffsync-native: error: interrupted \(SIGTERM\)/);
    const r = await recv.done;
    assert.equal(r.code, 20, r.stderr);
  });
});

describe('progress that is true', () => {
  it('a large file sent to an empty target: "sending" counts the early DATA while the file is still hashed, and ends at its size, not 0 B', async () => {
    const dir = tmpdir();
    const src = path.join(dir, 'big.bin');
    // Over the 64 MiB streaming window, so the manifest streams and the chunks go early.
    fs.writeFileSync(src, seeded(80 << 20, 8));
    const { peer: recv, port } = await startReceiver(path.join(dir, 'out.bin'), ['--state-dir', path.join(dir, 'r')]);
    // 32 MiB/s: about 2.5 s, so 1 s lines show the transfer moving.
    const s = await run(['send', src, `127.0.0.1:${port}`, '--plaintext', '--progress', '--progress-interval', '1', '--bwlimit', String(32 * 1024), '--state-dir', path.join(dir, 's')]).done;
    assert.equal(s.code, 0, s.stderr);
    assert.equal((await recv.done).code, 0);
    const lines = s.stderr.split('\n');
    const hashingEnd = lines.findIndex((l) => l.startsWith('hashing'));
    const moving = lines.findIndex((l) => /^sending +[\d.]+ MiB \/ 80\.0 MiB +\d+%/.test(l));
    assert.ok(moving >= 0 && moving < hashingEnd, `sending progress while hashing:\n${s.stderr}`);
    assert.match(lines.filter((l) => l.startsWith('sending')).at(-1)!, /^sending +80\.0 MiB /, 'the phase ends at the bytes that moved');
  });
});

describe('reporter pieces', () => {
  it('progress lines: percent and ETA while running, the total when done; singular and plural', () => {
    assert.equal(progressLine('sending', 1 << 20, 4 << 20, 1000), 'sending   1.00 MiB / 4.00 MiB  25%  1.00 MiB/s  1.00 s  ETA 0:03');
    assert.equal(progressLine('sending', 4 << 20, 4 << 20, 4000, true), 'sending   4.00 MiB  1.00 MiB/s  4.00 s');
    assert.equal(progressLine('scanning', 1, 0, 10), 'scanning  1 entry  0.01 s');
    assert.equal(progressLine('scanning', 2, 0, 10), 'scanning  2 entries  0.01 s');
    assert.match(progressLine('sending', 1 << 20, 7200 * 2 ** 20, 1000), /ETA 1:59:59$/);
  });

  it('plan lines become rsync -v lines', () => {
    assert.equal(rsyncListLine('mkdir   d1/'), 'd1/');
    assert.equal(rsyncListLine('send    d1/b (10000 bytes)'), 'd1/b');
    assert.equal(rsyncListLine('send    big (9 bytes, delta)'), 'big');
    assert.equal(rsyncListLine('copy    x (from y, no data sent)'), 'x');
    assert.equal(rsyncListLine('link    l -> a'), 'l -> a');
    assert.equal(rsyncListLine('attrs   f'), 'f');
    assert.equal(rsyncListLine('delete  old/'), 'deleting old/');
  });

  it('a terminal with 0 columns cannot draw; NO_COLOR is honored when set and not empty', () => {
    assert.equal(canDraw({ isTTY: true, columns: 0 } as NodeJS.WriteStream), false);
    assert.equal(canDraw({ isTTY: true, columns: 80 } as NodeJS.WriteStream), true);
    assert.equal(canDraw({ isTTY: false, columns: 80 } as unknown as NodeJS.WriteStream), false);
    assert.equal(noColor({ NO_COLOR: '1' }), true);
    assert.equal(noColor({ NO_COLOR: '' }), false);
    assert.equal(noColor({}), false);
  });
});
