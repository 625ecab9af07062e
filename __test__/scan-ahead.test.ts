// Hashing ahead of the conversations (decisions §95). A sender without a warm index used to
// hash its changed files only once triage had named them, after the handshakes and the
// receiver's manifest had crossed the network with its cores idle; a receiver hashed each
// delta's old version only when the file's FILE_BEGIN arrived. The relays below hold the frames
// the old order waited for until the hashing they would have waited on is done: a peer that
// hashes only on demand never gets past them (the relay lets go after HOLD_MS, and the test
// says so).
import assert from 'node:assert/strict';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { describe, it } from 'node:test';
import { FrameType } from '../ts/protocol/frames';
import { ScanAhead } from '../ts/api/scan-ahead';
import { scansAhead } from '../ts/api/send';
import { waitingScanOf } from '../ts/api/receive';
import { scanFile, walkTree, type LargeTransferInfo } from '../ts/native/binding';
import { assertSameTree, CLI, run, seeded, startReceiver, sync, tmpdir } from './helpers/peers';
import { relayFrames } from './helpers/frame-relay';
import { startSshd, sshdUnavailable } from './helpers/sshd';
import { earlyTreeTarget } from '../ts/api/sync';
import { ChildRun } from './helpers/process';

const KiB = 1024;
/** Longer than an honest session of this size takes on loopback, short enough for CI. */
const HOLD_MS = 8000;
/** Large enough to be a conversation of its own (over the 64 KiB small-file limit). */
const FILE = 300 * KiB;
const FILES = 6;

/** A remote command's stdin gate (plain Node, run by sshd's shell): `gate.cjs STATE WANT HOLD_MS
 * REPORT -- CMD...` runs CMD and holds the bytes the local side sends it until STATE's index
 * holds WANT entries or HOLD_MS passed, writing which to REPORT. */
const STDIN_GATE = `
const { spawn } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');
const [state, want, holdMs, report] = process.argv.slice(2, 6);
const cmd = process.argv.slice(process.argv.indexOf('--') + 1);
const child = spawn(cmd[0], cmd.slice(1), { stdio: ['pipe', 'inherit', 'inherit'] });
const queue = [];
let open = false;
let ended = false;
const indexed = () => { try { return fs.readdirSync(path.join(state, 'index')).filter((n) => n.endsWith('.idx')).length; } catch { return 0; } };
const started = Date.now();
const poll = setInterval(() => {
  const why = indexed() >= Number(want) ? 'hashed' : Date.now() - started > Number(holdMs) ? 'timeout' : undefined;
  if (!why) return;
  clearInterval(poll);
  fs.writeFileSync(report, why);
  open = true;
  for (const b of queue.splice(0)) child.stdin.write(b);
  if (ended) child.stdin.end();
}, 10);
process.stdin.on('data', (b) => (open ? child.stdin.write(b) : queue.push(b)));
process.stdin.on('end', () => { ended = true; if (open) child.stdin.end(); });
child.stdin.on('error', () => undefined);
child.on('exit', (code) => process.exit(code ?? 1));
`;

/** Index entries (one per file hashed) in a state directory. */
function indexed(stateDir: string): number {
  try {
    return fs.readdirSync(path.join(stateDir, 'index')).filter((n) => n.endsWith('.idx')).length;
  } catch {
    return 0;
  }
}

/** `p`, with the event loop held open meanwhile: a scan ahead does not hold it (its completion
 * is reported through a weak callback, so a pending one never keeps a process alive). */
async function alive<T>(p: Promise<T>): Promise<T> {
  const hold = setInterval(() => undefined, 1000);
  try {
    return await p;
  } finally {
    clearInterval(hold);
  }
}

interface Gate {
  port: number;
  /** Frames held back. */
  held: number;
  /** What let them go: the hashing the test waits for, or the timer. */
  releasedBy: 'hashed' | 'timeout' | undefined;
  close(): void;
}

/**
 * A plaintext relay. Frames going `heldDirection` whose type `holds` picks wait, in order with
 * everything behind them in that direction, until `ready()` (polled) or HOLD_MS; the other
 * direction always flows.
 */
async function gate(targetPort: number, heldDirection: 'toSender' | 'toReceiver', holds: (type: number) => boolean, ready: () => boolean): Promise<Gate> {
  const state: Gate = { port: 0, held: 0, releasedBy: undefined, close: () => undefined };
  const server = net.createServer((down) => {
    const up = net.connect(targetPort, '127.0.0.1');
    const [from, to] = heldDirection === 'toSender' ? [up, down] : [down, up];
    const [back, forth] = heldDirection === 'toSender' ? [down, up] : [up, down];
    back.pipe(forth);
    back.on('error', () => forth.destroy());
    forth.on('error', () => back.destroy());
    const queue: Buffer[] = [];
    let holding = false;
    const flush = () => {
      for (const f of queue.splice(0)) to.write(f);
    };
    const started = Date.now();
    const poll = setInterval(() => {
      const why = ready() ? 'hashed' : Date.now() - started > HOLD_MS ? 'timeout' : undefined;
      if (!why || !holding) return;
      state.releasedBy = why;
      holding = false;
      clearInterval(poll);
      flush();
    }, 10);
    relayFrames(
      from,
      to,
      (frame) => {
        if (!holding && state.releasedBy === undefined && holds(frame[4]!)) holding = true;
        if (holding) {
          state.held++;
          queue.push(frame);
        }
        return !holding;
      },
      () => {
        clearInterval(poll);
        flush();
      },
    );
  });
  await new Promise<void>((res) => server.listen(0, '127.0.0.1', res));
  state.port = (server.address() as net.AddressInfo).port;
  state.close = () => server.close();
  return state;
}

/** FILES files of FILE bytes; the receiver holds the previous version of each (one 4 KiB
 * overwrite apart, an older mtime), so every file is a delta conversation. */
function fixture(dir: string): { src: string; dst: string; stateS: string; stateR: string } {
  const src = path.join(dir, 'src');
  const dst = path.join(dir, 'dst');
  for (let i = 0; i < FILES; i++) {
    const old = seeded(FILE, 700 + i);
    const now = Buffer.from(old);
    now.fill(i + 1, 100 * KiB, 104 * KiB);
    for (const [root, data] of [
      [dst, old],
      [src, now],
    ] as const) {
      fs.mkdirSync(path.join(root, `d${i % 2}`), { recursive: true });
      fs.writeFileSync(path.join(root, `d${i % 2}`, `f${i}.bin`), data);
    }
    fs.utimesSync(path.join(dst, `d${i % 2}`, `f${i}.bin`), 1_600_000_000, 1_600_000_000);
  }
  return { src, dst, stateS: path.join(dir, 'state-s'), stateR: path.join(dir, 'state-r') };
}

async function throughGate(f: ReturnType<typeof fixture>, makeGate: (port: number) => Promise<Gate>, sendArgs: string[] = []) {
  const { peer, port } = await startReceiver(f.dst, ['--state-dir', f.stateR]);
  const relay = await makeGate(port);
  try {
    const sending = run(['send', f.src, `127.0.0.1:${relay.port}`, '--plaintext', '--json', '--timeout', '30', '--state-dir', f.stateS, ...sendArgs]).done;
    const [send, recv] = await Promise.all([sending, peer.done]);
    return { send, recv, relay, both: `sender exit ${send.code}: ${send.stderr}\nreceiver exit ${recv.code}: ${recv.stderr}` };
  } finally {
    relay.close();
  }
}

/** A session through a gate that `who`'s hashing ahead must open (its index holding every file);
 * it then converges as any other. */
async function hashedAheadPast(who: 'sender' | 'receiver', direction: 'toSender' | 'toReceiver', holds: (type: number) => boolean, what: string): Promise<void> {
  const dir = tmpdir();
  try {
    const f = fixture(dir);
    const state = who === 'sender' ? f.stateS : f.stateR;
    const { send, recv, relay, both } = await throughGate(f, (port) => gate(port, direction, holds, () => indexed(state) >= FILES));
    assert.equal(relay.releasedBy, 'hashed', `the ${who} had not hashed ${what}: the relay let its ${relay.held} frames go after ${HOLD_MS} ms`);
    assert.equal(send.code, 0, both);
    assert.equal(recv.code, 0, both);
    assert.equal(recv.summary?.tree?.written, FILES, both);
    assertSameTree(f.dst, f.src);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

describe('hashing ahead of the conversations', () => {
  it('a sender with a cold index hashes its changed files while the receiver manifest is on its way', async () => {
    // The receiver's manifest (and everything after it) reaches the sender only once the
    // sender's index holds every file: only a sender that hashes before triage gets there.
    await hashedAheadPast('sender', 'toSender', (t) => t === FrameType.TREE_MANIFEST, 'its changed files before triage');
  });

  it("a receiver hashes its deltas' old versions before their conversations reach it", async () => {
    // Everything on the session's streams (the files' conversations) waits until the
    // receiver's index holds each old version: only a receiver that hashes ahead gets there.
    await hashedAheadPast('receiver', 'toReceiver', (t) => t === FrameType.MUX, 'its old versions before their conversations');
  });

  it('a receiver waiting for its sender hashes the files a delta would start from (decisions §96)', async () => {
    // `receive` of a directory walks its target at once and then waits for a sender, its cores
    // idle: it hashes its unindexed files meanwhile, so no sender needs to be there for its index
    // to fill. With --no-overlap it waits idle, and conversations hash what they need.
    const dir = tmpdir();
    try {
      const f = fixture(dir);
      const { peer, port } = await startReceiver(f.dst, ['--state-dir', f.stateR]);
      const started = Date.now();
      while (indexed(f.stateR) < FILES && Date.now() - started < HOLD_MS) await new Promise((r) => setTimeout(r, 20));
      assert.equal(indexed(f.stateR), FILES, `the receiver had hashed ${indexed(f.stateR)} of its ${FILES} files after ${HOLD_MS} ms without a sender`);
      const send = await run(['send', f.src, `127.0.0.1:${port}`, '--plaintext', '--json', '--timeout', '30', '--state-dir', f.stateS]).done;
      const recv = await peer.done;
      const both = `sender exit ${send.code}: ${send.stderr}\nreceiver exit ${recv.code}: ${recv.stderr}`;
      assert.equal(send.code, 0, both);
      assert.equal(recv.code, 0, both);
      assert.equal(recv.summary?.tree?.written, FILES, both);
      assert.ok(send.summary!.literalBytes < FILES * 64 * KiB, `deltas from the hashed old versions, not whole files (${send.summary!.literalBytes} literal bytes)`);
      assertSameTree(f.dst, f.src);

      const g = fixture(path.join(dir, 'off'));
      const off = await startReceiver(g.dst, ['--state-dir', g.stateR, '--no-overlap']);
      await new Promise((r) => setTimeout(r, 1500));
      assert.equal(indexed(g.stateR), 0, '--no-overlap: nothing hashed while waiting');
      const send2 = await run(['send', g.src, `127.0.0.1:${off.port}`, '--plaintext', '--json', '--timeout', '30', '--state-dir', g.stateS]).done;
      const recv2 = await off.peer.done;
      assert.equal(send2.code, 0, send2.stderr);
      assert.equal(recv2.code, 0, recv2.stderr);
      assertSameTree(g.dst, g.src);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  it('the remote end of a sync push walks and hashes its target while the handshake crosses (decisions §97)', { skip: sshdUnavailable() || false }, async () => {
    // The remote program runs behind a gate that holds everything the local side sends it
    // (HELLO, OFFER, the manifest) until the remote state's index holds the six old versions:
    // only a remote end that starts on its target before the offer names it gets past it.
    const sshd = await startSshd();
    const dir = tmpdir();
    try {
      const f = fixture(dir);
      const gateJs = path.join(dir, 'gate.cjs');
      const report = path.join(dir, 'gate-report');
      fs.writeFileSync(gateJs, STDIN_GATE);
      const remoteCmd = `env FFSYNC_STATE_DIR=${f.stateR} ${process.execPath} ${gateJs} ${f.stateR} ${FILES} ${HOLD_MS} ${report} -- ${process.execPath} ${CLI}`;
      const r = await run(['sync', '-a', '--json', '--state-dir', f.stateS, '-e', sshd.rsh, '--remote-cmd', remoteCmd, `${f.src}/`, `127.0.0.1:${f.dst}/`]).done;
      assert.equal(fs.readFileSync(report, 'utf8'), 'hashed', `the remote end had not hashed its old versions before the session reached it: the gate let go after ${HOLD_MS} ms`);
      assert.equal(r.code, 0, r.stderr);
      assertSameTree(f.dst, f.src);
    } finally {
      await sshd.stop();
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  it("a single file's sender hashes it while the receiver's DECISION is on its way", async () => {
    const dir = tmpdir();
    try {
      const old = seeded(2 << 20, 41);
      const now = Buffer.from(old);
      now.fill(7, 1 << 20, (1 << 20) + 4 * KiB);
      const f = { src: path.join(dir, 'new.bin'), dst: path.join(dir, 'old.bin'), stateS: path.join(dir, 'state-s'), stateR: path.join(dir, 'state-r') };
      fs.writeFileSync(f.src, now);
      fs.writeFileSync(f.dst, old);
      for (const p of [f.src, f.dst]) fs.utimesSync(p, 1_600_000_000, 1_600_000_000 + (p === f.src ? 60 : 0));
      const { send, recv, relay, both } = await throughGate(f, (port) => gate(port, 'toSender', (t) => t === FrameType.DECISION, () => indexed(f.stateS) >= 1));
      assert.equal(relay.releasedBy, 'hashed', `the sender had not hashed its file before the DECISION came: the relay let its ${relay.held} frames go after ${HOLD_MS} ms`);
      assert.equal(send.code, 0, both);
      assert.equal(recv.code, 0, both);
      assert.ok(fs.readFileSync(f.dst).equals(now), 'the file arrived whole');
      assert.ok(send.summary!.literalBytes < 1 << 20, `a delta, not the whole file (${send.summary!.literalBytes} literal bytes)`);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  it("what a single file's OFFER says does not depend on how far its scan ahead got", async () => {
    // The index is asked before the file is hashed ahead, and the OFFER carries the root it knew
    // then: the session goes as it would have without the scan ahead. Here the receiver indexed
    // its copy at the last sync, and the sender comes with a fresh state (a CI runner) and the
    // same content under a new mtime: no root goes, the receiver asks for the manifest, and the
    // sender's scan (an index hit by then) shows it up to date ('scan-root'). The relay holds
    // the receiver's HELLO (which the sender awaits before its OFFER over plaintext) until the
    // scan ahead has finished: an OFFER built from the index as it is by then would carry a root,
    // and the receiver would decide by it alone ('index-root'), a round trip earlier or not
    // depending on a race.
    const dir = tmpdir();
    try {
      const f = { src: path.join(dir, 'new.bin'), dst: path.join(dir, 'old.bin'), stateS: path.join(dir, 'state-s2'), stateR: path.join(dir, 'state-r') };
      fs.writeFileSync(f.src, seeded(2 << 20, 43));
      fs.utimesSync(f.src, 1_600_000_000, 1_600_000_000);
      const first = await sync(f.src, f.dst, { stateS: path.join(dir, 'state-s1'), stateR: f.stateR });
      assert.equal(first.recv.code, 0, first.recv.stderr);
      fs.utimesSync(f.src, 1_600_000_060, 1_600_000_060); // the same content, touched
      const { send, recv, relay, both } = await throughGate(f, (port) => gate(port, 'toSender', (t) => t === FrameType.HELLO, () => indexed(f.stateS) >= 1));
      assert.equal(relay.releasedBy, 'hashed', both);
      assert.equal(send.code, 0, both);
      assert.equal(recv.code, 0, both);
      assert.equal(recv.summary!.upToDate, true, both);
      assert.equal(recv.summary!.decidedBy, 'scan-root', `decided as without a scan ahead\n${both}`);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  it('hashes ahead only what a conversation would hash, within its budget, and nothing it was told not to', async () => {
    const dir = tmpdir();
    try {
      const root = path.join(dir, 'tree');
      const state = path.join(dir, 'state');
      const write = (rel: string, len: number, seed: number) => {
        fs.mkdirSync(path.dirname(path.join(root, rel)), { recursive: true });
        fs.writeFileSync(path.join(root, rel), seeded(len, seed));
        // Older than the index's racy window (an entry hashed within it of a change is not trusted).
        fs.utimesSync(path.join(root, rel), 1_600_000_000, 1_600_000_000);
      };
      write('a/big1.bin', 200 * KiB, 1);
      write('a/big2.bin', 200 * KiB, 2);
      write('a/small.bin', 64 * KiB, 3); // at the small-file limit: batches hash it
      write('b/big3.bin', 200 * KiB, 4);
      write('b/big4.bin', 200 * KiB, 5);
      // Whether a conversation's scan of `rel` would find its manifest in the index (each
      // asked once: the scan indexes what it hashed).
      const fromIndex = async (rel: string) => (await scanFile(path.join(root, rel), { stateDir: state })).fromIndex;
      // Sender: the walk's candidates, the first 400 KiB of them, one claimed by a conversation
      // before the walk ended.
      const walking = walkTree(root, { excludes: [], stateDir: state, isSender: true });
      const sender = ScanAhead.sender(walking, root, state, 400 * KiB);
      sender.claim(Buffer.from('a/big2.bin'));
      await alive(sender.idle);
      assert.equal(sender.started, 1, 'big1 only: big2 was claimed, and the budget ended the list at it');
      assert.equal(sender.hashed, 1);
      assert.deepEqual(await Promise.all(['a/big1.bin', 'a/big2.bin', 'a/small.bin', 'b/big3.bin'].map(fromIndex)), [true, false, false, false]);
      // Stopped before its walk ended: nothing starts.
      const stopped = ScanAhead.sender(walkTree(root, { excludes: [], stateDir: path.join(dir, 'state2'), isSender: true }), root, path.join(dir, 'state2'));
      stopped.stop();
      await alive(stopped.idle);
      assert.equal(stopped.started, 0);
      assert.equal(indexed(path.join(dir, 'state2')), 0);
      // Receiver: the deltas of the plan only (a new file has no old version to hash).
      const lt = (rel: string, delta: boolean): LargeTransferInfo => ({ action: 0, path: Buffer.from(rel), size: 200 * KiB, delta });
      const rstate = path.join(dir, 'state-r');
      const receiver = ScanAhead.receiver([lt('b/big3.bin', false), lt('b/big4.bin', true), lt('a/big1.bin', true)], root, rstate, 300 * KiB);
      await alive(receiver.idle);
      assert.equal(receiver.started, 2, 'big4, then big1 (which reached the budget)');
      assert.equal(indexed(rstate), 2);
      // Receiver waiting for its sender: its prewalk's candidates, as a sender's (big1 and big2
      // within 400 KiB); then the plan's scan ahead leaves the files it began to it.
      const wstate = path.join(dir, 'state-w');
      const waiting = ScanAhead.waiting(walkTree(root, { excludes: [], stateDir: wstate, isSender: false }), root, wstate, 400 * KiB);
      await alive(waiting.idle);
      assert.equal(waiting.started, 2);
      assert.ok(waiting.began(Buffer.from('a/big1.bin')) && waiting.began(Buffer.from('a/big2.bin')) && !waiting.began(Buffer.from('b/big3.bin')));
      const after = ScanAhead.receiver([lt('a/big1.bin', true), lt('a/big2.bin', true), lt('b/big3.bin', true)], root, wstate, undefined, waiting);
      await alive(after.idle);
      assert.equal(after.started, 1, 'big3 only: the scan while waiting began big1 and big2');
      assert.deepEqual(await Promise.all(['a/big1.bin', 'a/big2.bin', 'b/big3.bin', 'b/big4.bin'].map(async (rel) => (await scanFile(path.join(root, rel), { stateDir: wstate })).fromIndex)), [true, true, true, false]);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  it('a scan ahead still pending never keeps the process alive', { skip: process.platform !== 'linux' && 'needs taskset (Linux)' }, async () => {
    // A core kept busy at normal priority starves the idle-priority pool: a 48 MiB scan then
    // takes many seconds. A process whose own work is done must exit anyway (a library user's
    // script, the end of a session); one that waited for the pending scan hung that long.
    const dir = tmpdir();
    const hog = new ChildRun('hog', ['taskset', '-c', '0', process.execPath, '-e', 'for (;;) {}']);
    try {
      const tree = path.join(dir, 'tree');
      fs.mkdirSync(tree);
      fs.writeFileSync(path.join(tree, 'big.bin'), seeded(48 << 20, 9));
      fs.utimesSync(path.join(tree, 'big.bin'), 1_600_000_000, 1_600_000_000);
      const root = process.env.SCAN_AHEAD_BUILD ?? path.join(__dirname, '..');
      const script = `
        const { ScanAhead } = require(${JSON.stringify(path.join(root, 'dist/api/scan-ahead.js'))});
        const { walkTree } = require(${JSON.stringify(path.join(root, 'dist/native/binding.js'))});
        const [tree, state] = [${JSON.stringify(tree)}, ${JSON.stringify(path.join(dir, 'state'))}];
        const ahead = ScanAhead.sender(walkTree(tree, { excludes: [], stateDir: state, isSender: true }), tree, state);
        const t = setInterval(() => {
          if (ahead.started === 0) return;
          clearInterval(t);
          ahead.stop();
          console.log('stopped ' + ahead.hashed);
        }, 1);`;
      const child = new ChildRun('scan-ahead', ['taskset', '-c', '0', process.execPath, '-e', script]);
      const stopped = await child.waitForLine((l) => l.startsWith('stopped'), 60_000);
      const exit = await Promise.race([child.exited, new Promise<undefined>((res) => setTimeout(res, 5000))]);
      if (!exit) child.child.kill('SIGKILL');
      assert.ok(exit, `the process was still running 5 s after its scan ahead stopped (${stopped}), waiting for the pending scan`);
      assert.equal(exit.code, 0, child.stderr);
      assert.equal(stopped, 'stopped 0', 'the scan was still pending when the work ended (the setup did not starve it)');
    } finally {
      hog.child.kill('SIGKILL');
      await hog.exited;
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  it('is off where nothing would read the index or the phases must not overlap', () => {
    const base = { path: '.', host: 'h', port: 1 };
    assert.equal(scansAhead(base), true);
    assert.equal(scansAhead({ ...base, checksum: true }), false, '-c');
    assert.equal(scansAhead({ ...base, wholeFile: true }), false, '-W');
    assert.equal(scansAhead({ ...base, overlap: false }), false, '--no-overlap, and a local sync');
    assert.equal(scansAhead({ ...base, tree: { dryRun: true } }), false, '--dry-run');
    // `receive`: hashing while waiting needs a directory target's prewalk, and is off with -c
    // and --no-overlap (triage stops it, tree-receive.ts, where the session shows it of no use).
    const prewalk = { root: '.', tree: new Promise<never>(() => undefined), doneAt: 0 };
    const waiting = waitingScanOf({}, prewalk, '.');
    assert.ok(waiting);
    waiting.stop();
    assert.equal(waitingScanOf({}, undefined, '.'), undefined, 'a file target: no prewalk');
    assert.equal(waitingScanOf({ checksum: true }, prewalk, '.'), undefined, '-c');
    assert.equal(waitingScanOf({ overlap: false }, prewalk, '.'), undefined, '--no-overlap');
    assert.equal(waitingScanOf({ dryRun: true }, prewalk, '.'), undefined, "a dry run the remote end's arguments name");
  });

  it("the remote end of a push knows a tree's target before the offer (rsync's rules), when it is a directory", async () => {
    const dir = tmpdir();
    try {
      fs.mkdirSync(path.join(dir, 'dest', 'site'), { recursive: true });
      fs.writeFileSync(path.join(dir, 'dest', 'file'), 'x');
      fs.symlinkSync(path.join(dir, 'dest', 'site'), path.join(dir, 'dest', 'link'));
      const dest = path.join(dir, 'dest');
      assert.equal(await earlyTreeTarget({ path: dest, srcSlash: true }), dest, 'SRC/ lands in DEST itself');
      assert.equal(await earlyTreeTarget({ path: dest, name: 'site' }), path.join(dest, 'site'), 'SRC lands in DEST/SRC');
      assert.equal(await earlyTreeTarget({ path: `${dest}/`, name: 'site' }), path.join(dest, 'site'));
      assert.equal(await earlyTreeTarget({ path: dest, name: 'new' }), undefined, 'not there yet: nothing to walk');
      assert.equal(await earlyTreeTarget({ path: dest, name: 'file' }), undefined, 'a file: the session refuses a tree there');
      assert.equal(await earlyTreeTarget({ path: dest, name: 'link' }), undefined, 'a link to a directory: refused too');
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});
