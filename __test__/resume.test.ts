// A transfer killed mid-stream resumes: the rerun sends only what the receiver still lacks.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { it } from 'node:test';
import { seeded, sender, sha256, startReceiver, sync, tmpdir } from './helpers/peers';

const MiB = 1024 * 1024;

it('sender killed mid-stream: partial kept, target untouched, rerun sends only the rest', async () => {
  const dir = tmpdir();
  const src = path.join(dir, 'big.bin');
  const dst = path.join(dir, 'target.bin');
  const data = seeded(48 * MiB, 11);
  fs.writeFileSync(src, data);
  fs.writeFileSync(dst, 'old version');
  const states = { stateS: path.join(dir, 's'), stateR: path.join(dir, 'r') };

  const { peer: recv, port } = await startReceiver(dst, ['--state-dir', states.stateR]);
  // 16 MiB/s: the transfer takes ~3 s; kill the sender once a third has arrived.
  const s = sender(src, port, ['--state-dir', states.stateS, '--bwlimit', String(16 * 1024)]);
  await recv.waitFor((e) => e.event === 'progress' && e.phase === 'receiving' && e.doneBytes >= 12 * MiB);
  s.child.kill('SIGKILL');
  const r1 = await recv.done;
  // A killed peer closes its socket with FIN (exit 12, "closed by peer"), or with RST when our
  // last delivery reports (§4.16) sat unread in its buffer (exit 10, "connection reset"): the
  // two documented codes of a lost connection. Either way the partial is kept.
  assert.ok(r1.code === 12 || r1.code === 10, `receiver exit ${r1.code}: ${r1.stderr}`);
  assert.match(r1.stderr, /partial file kept/);
  assert.equal(fs.readFileSync(dst, 'utf8'), 'old version', 'target must be untouched');
  const partials = fs.readdirSync(dir).filter((n) => n.endsWith('.ffsync-part'));
  assert.equal(partials.length, 1, `partials: ${partials}`);
  const firstRun = r1.summary!.bytesOnWire.received as number;
  assert.ok(firstRun >= 12 * MiB && firstRun < data.length);

  const res = await sync(src, dst, states);
  assert.equal(res.recv.code, 0, res.recv.stderr);
  assert.equal(sha256(dst), sha256(src));
  const second = res.recv.summary!.literalBytes as number;
  // Only what the first run did not deliver (allowing for the batch in flight when killed).
  assert.ok(second <= data.length - firstRun + 8 * MiB, `second run sent ${second}, first delivered ${firstRun}`);
  assert.ok(second < data.length - 8 * MiB);
  assert.deepEqual(fs.readdirSync(dir).filter((n) => n.endsWith('.ffsync-part')), [], 'partial cleaned up');
});

it('receiver interrupted by SIGTERM keeps its partial and exits 20', async () => {
  const dir = tmpdir();
  const src = path.join(dir, 'big.bin');
  const dst = path.join(dir, 'target.bin');
  fs.writeFileSync(src, seeded(32 * MiB, 12));
  const { peer: recv, port } = await startReceiver(dst, ['--state-dir', path.join(dir, 'r')]);
  const s = sender(src, port, ['--state-dir', path.join(dir, 's'), '--bwlimit', String(8 * 1024)]);
  await recv.waitFor((e) => e.event === 'progress' && e.phase === 'receiving' && e.doneBytes > 0);
  recv.child.kill('SIGTERM');
  const r = await recv.done;
  assert.equal(r.code, 20, r.stderr);
  assert.match(r.stderr, /^ffsync-native: error: interrupted \(SIGTERM\)$/m, 'the interrupted side says so in words');
  assert.equal(fs.existsSync(dst), false);
  const sres = await s.done;
  // The peer is told (an ERROR frame, exit 20), not left with a closed connection.
  assert.equal(sres.code, 20, sres.stderr);
  assert.match(sres.stderr, /^ffsync-native: error: peer: interrupted$/m);
  assert.equal(sres.stderr.trimEnd().split('\n').filter((l) => l.startsWith('ffsync-native: error:')).length, 1, 'one error line');
  assert.equal(fs.readdirSync(dir).filter((n) => n.endsWith('.ffsync-part')).length, 1);
});

it('sender interrupted by SIGINT (Ctrl-C): both sides say "interrupted" and exit 20, the receiver keeps its partial and the old file', async () => {
  const dir = tmpdir();
  const src = path.join(dir, 'big.bin');
  const dst = path.join(dir, 'target.bin');
  fs.writeFileSync(src, seeded(32 * MiB, 13));
  fs.writeFileSync(dst, 'old version');
  const { peer: recv, port } = await startReceiver(dst, ['--state-dir', path.join(dir, 'r')]);
  const s = sender(src, port, ['--state-dir', path.join(dir, 's'), '--bwlimit', String(8 * 1024)]);
  await recv.waitFor((e) => e.event === 'progress' && e.phase === 'receiving' && e.doneBytes > 0);
  s.child.kill('SIGINT');
  const [sres, r] = await Promise.all([s.done, recv.done]);
  assert.equal(sres.code, 20, sres.stderr);
  assert.match(sres.stderr, /^ffsync-native: error: interrupted \(SIGINT\)$/m);
  assert.equal(r.code, 20, r.stderr);
  assert.match(r.stderr, /^ffsync-native: error: peer: interrupted; partial file kept, rerun the same command to resume$/m);
  assert.doesNotMatch(r.stderr + sres.stderr, /closed by peer|frame/, 'no connection or frame talk');
  assert.equal(fs.readFileSync(dst, 'utf8'), 'old version', 'the old file is untouched');
  assert.equal(fs.readdirSync(dir).filter((n) => n.endsWith('.ffsync-part')).length, 1, 'the partial is kept for a resume');
});
