// A tree sent to a receiver this sender remembers (what it said in its HELLO at the last
// session, per pinned fingerprint: utils/remembered-hello.ts) is offered behind the sender's
// own HELLO: OFFER, FILTER, TREE_OPTIONS and the tree manifest go before the receiver's HELLO
// comes, saving the round trip the sender used to wait for it (decisions §93). The receiver's
// real HELLO is checked before anything of its is read: one that changed in a way the offer
// depends on fails that session (exit 2) with nothing written, and is remembered as it is now.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { describe, it } from 'node:test';
import { send } from '../ts/api/send';
import { FrameType } from '../ts/protocol/frames';
import { Capability } from '../ts/protocol/messages';
import { CLI, assertSameTree, run, snapshot, tmpdir, type PeerResult } from './helpers/peers';

/** One-way delay the relay adds to what the receiver sends: long against scheduling noise. */
const DELAY_MS = 400;

interface Relay {
  port: number;
  /** What the sender sent, by when (ms after the sender connected). */
  fromSender: { t: number; n: number }[];
  /** Plaintext sessions: the sender's frames by type, as they completed (`len u32 | type u8 | …`). */
  senderFrames: { t: number; type: number }[];
  /** When each batch of the receiver's bytes was passed on to the sender (same clock). */
  toSender: number[];
  close(): void;
}

/** Passes the sender's bytes at once and the receiver's DELAY_MS late (in batches): the receiver's TLS
 * flight reaches the sender at DELAY_MS, its HELLO at about 2 x DELAY_MS. A sender that waits
 * for that HELLO sends only its TLS Finished and HELLO before then; one that offers early sends
 * its offer and manifest too. */
async function relay(target: number): Promise<Relay> {
  const fromSender: Relay['fromSender'] = [];
  const senderFrames: Relay['senderFrames'] = [];
  const toSender: number[] = [];
  const sockets = new Set<net.Socket>();
  const server = net.createServer((a) => {
    const t0 = performance.now();
    const b = net.connect(target, '127.0.0.1');
    sockets.add(a).add(b);
    let pending = Buffer.alloc(0);
    a.on('data', (d) => {
      const t = performance.now() - t0;
      fromSender.push({ t, n: d.length });
      pending = Buffer.concat([pending, d]);
      while (pending.length >= 5 && pending.length >= 4 + pending.readUInt32LE(0)) {
        senderFrames.push({ t, type: pending[4]! });
        pending = pending.subarray(4 + pending.readUInt32LE(0));
      }
      b.write(d);
    });
    // The receiver's bytes in batches: whatever it sent within DELAY_MS of a batch's first byte
    // arrives at once (its HELLO and an ERROR right behind it reach the sender together).
    let batch: Buffer[] | undefined;
    b.on('data', (d) => {
      if (batch) return void batch.push(d);
      batch = [d];
      setTimeout(() => {
        const all = Buffer.concat(batch!);
        batch = undefined;
        toSender.push(performance.now() - t0);
        if (!a.destroyed) a.write(all);
      }, DELAY_MS);
    });
    a.on('end', () => setTimeout(() => b.end(), 0));
    b.on('end', () => setTimeout(() => a.end(), DELAY_MS));
    for (const s of [a, b]) s.on('error', () => (a.destroy(), b.destroy()));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    port: (server.address() as net.AddressInfo).port,
    fromSender,
    senderFrames,
    toSender,
    close: () => {
      for (const s of sockets) s.destroy();
      server.close();
    },
  };
}

function fingerprint(state: string): string {
  return spawnSync(process.execPath, [CLI, 'id', '--state-dir', state], { encoding: 'utf8' }).stdout.trim();
}

interface Pair {
  root: string;
  src: string;
  stateS: string;
  stateR: string;
  fpS: string;
  fpR: string;
  /** The sender's memory of the receiver's HELLO. */
  remembered: string;
}

function pair(files = 300): Pair {
  const root = tmpdir('ffsync-early-offer-');
  const src = path.join(root, 'src');
  fs.mkdirSync(src);
  // Long names: the manifest is tens of KiB, far more than a TLS Finished and a HELLO.
  for (let i = 0; i < files; i++) fs.writeFileSync(path.join(src, `a-file-with-a-rather-long-name-to-fill-the-manifest-${i}.txt`), `content ${i}\n`);
  const stateS = path.join(root, 'ss');
  const stateR = path.join(root, 'sr');
  const fpS = fingerprint(stateS);
  const fpR = fingerprint(stateR);
  return { root, src, stateS, stateR, fpS, fpR, remembered: path.join(stateS, 'hellos', fpR) };
}

/** One TLS session (both sides pinned) into `dst`, through a relay when asked. */
async function session(p: Pair, dst: string, o: { relay?: boolean; recvEnv?: NodeJS.ProcessEnv } = {}): Promise<{ send: PeerResult; recv: PeerResult; relay?: Relay }> {
  const recv = run(['receive', dst, '0', '--bind', '127.0.0.1', '--json', '--timeout', '20', '--state-dir', p.stateR, '--trust', p.fpS], o.recvEnv);
  const port = (await recv.waitFor((e) => e.event === 'listening')).port as number;
  const r = o.relay ? await relay(port) : undefined;
  try {
    const send = await run(['send', p.src, `127.0.0.1:${r?.port ?? port}`, '--json', '--timeout', '20', '--state-dir', p.stateS, '--trust', p.fpR]).done;
    return { send, recv: await recv.done, relay: r };
  } finally {
    r?.close();
  }
}

/** Bytes the sender sent after the receiver's TLS flight reached it (the relay's first batch to
 * the sender) and before the receiver's HELLO did (its second): measured against when the relay
 * passed them on, not against fixed times, which a slow start on a loaded machine would shift. */
function sentBeforeReceiverHello(r: Relay): number {
  assert.ok(r.toSender.length >= 2, `the relay passed ${r.toSender.length} batches of the receiver's to the sender (its TLS flight, then its HELLO)`);
  const [flight, hello] = r.toSender as [number, number];
  return r.fromSender.filter((x) => x.t >= flight && x.t < hello).reduce((a, x) => a + x.n, 0);
}

function rememberedJson(p: Pair): Record<string, number | string> {
  return JSON.parse(fs.readFileSync(p.remembered, 'utf8'));
}

describe('a tree offered before the receiver’s HELLO', () => {
  it('goes behind our HELLO to a remembered receiver, not a round trip later', async () => {
    const p = pair();
    const first = await session(p, path.join(p.root, 'd1'), { relay: true });
    assert.equal(first.send.code, 0, first.send.stderr);
    assertSameTree(path.join(p.root, 'd1'), p.src);
    const waited = sentBeforeReceiverHello(first.relay!);
    assert.ok(waited < 2048, `first contact: the sender waits for the receiver's HELLO (it sent ${waited} bytes before it)`);
    const hello = rememberedJson(p);
    assert.equal(hello.role, 2, 'the receiver is remembered as a receiver');
    assert.ok((hello.capabilities as number) & Capability.SIZE_LIMITS);

    const again = await session(p, path.join(p.root, 'd2'), { relay: true });
    assert.equal(again.send.code, 0, again.send.stderr);
    assert.equal(again.recv.code, 0, again.recv.stderr);
    assertSameTree(path.join(p.root, 'd2'), p.src);
    const early = sentBeforeReceiverHello(again.relay!);
    assert.ok(early > 8 * 1024, `a remembered receiver: the offer and manifest go before its HELLO comes (${early} bytes did)`);
  });

  it('fails a session (exit 2, nothing written) when the receiver is not what was remembered, and the next one works', async () => {
    const p = pair(20);
    const first = await session(p, path.join(p.root, 'd1'));
    assert.equal(first.send.code, 0, first.send.stderr);
    // Remembered without SIZE_LIMITS: the early offer has no TREE_OPTIONS, which this receiver waits for.
    const hello = rememberedJson(p);
    fs.writeFileSync(p.remembered, JSON.stringify({ ...hello, capabilities: (hello.capabilities as number) & ~Capability.SIZE_LIMITS, software: 'ffsync-native/0.0.1-old' }));
    const dst = path.join(p.root, 'd2');
    fs.mkdirSync(dst);
    fs.writeFileSync(path.join(dst, 'keep.txt'), 'untouched');
    // Through the relay: the receiver's complaint about the early frames may reach the sender with
    // its HELLO; the sender reports the cause (the changed receiver), not the complaint.
    const changed = await session(p, dst, { relay: true });
    assert.equal(changed.send.code, 2, changed.send.stderr);
    assert.match(changed.send.stderr, /is not the build it was at the last session \(it was ffsync-native\/0\.0\.1-old\).*run again/);
    assert.notEqual(changed.recv.code, 0, 'the receiver could not read the offer either');
    assert.deepEqual(Object.keys(snapshot(dst)), ['keep.txt'], 'nothing was written');
    assert.ok((rememberedJson(p).capabilities as number) & Capability.SIZE_LIMITS, 'the receiver is remembered as it is now');
    const next = await session(p, dst);
    assert.equal(next.send.code, 0, next.send.stderr);
    assert.ok(fs.existsSync(path.join(dst, 'a-file-with-a-rather-long-name-to-fill-the-manifest-19.txt')));
  });

  it('still works with a receiver that speaks a lower version or has other capabilities than remembered', async () => {
    const p = pair(20);
    assert.equal((await session(p, path.join(p.root, 'd1'))).send.code, 0);
    const hello = rememberedJson(p);
    // Remembered with fewer capabilities than it has (an upgrade since): unrelated to the offer.
    fs.writeFileSync(p.remembered, JSON.stringify({ ...hello, capabilities: (hello.capabilities as number) & ~(Capability.REFINE | Capability.DELIVERY) }));
    const upgraded = await session(p, path.join(p.root, 'd2'));
    assert.equal(upgraded.send.code, 0, upgraded.send.stderr);
    assertSameTree(path.join(p.root, 'd2'), p.src);
    assert.equal(rememberedJson(p).capabilities, hello.capabilities, 'remembered as it is now');
    // A receiver that speaks protocol version 1 only (the offer is the same in both versions).
    const v1 = await session(p, path.join(p.root, 'd3'), { recvEnv: { FFSYNC_PROTOCOL_MAX: '1' } });
    assert.equal(v1.send.code, 0, v1.send.stderr);
    assertSameTree(path.join(p.root, 'd3'), p.src);
    assert.equal(rememberedJson(p).maxVersion, 1);
  });

  it('waits for the HELLO when the remembered receiver could not take the options, and ignores a damaged memory', async () => {
    const p = pair();
    assert.equal((await session(p, path.join(p.root, 'd1'))).send.code, 0);
    const hello = rememberedJson(p);
    // Remembered without TRIAGE_CHOICES, asked for rsync's --size-only (the library's tree
    // choices; `send` has no such option): the receiver may have it now, so the sender asks.
    fs.writeFileSync(p.remembered, JSON.stringify({ ...hello, capabilities: (hello.capabilities as number) & ~Capability.TRIAGE_CHOICES }));
    const dst = path.join(p.root, 'd2');
    const recv = run(['receive', dst, '0', '--bind', '127.0.0.1', '--json', '--timeout', '20', '--state-dir', p.stateR, '--trust', p.fpS]);
    const r = await relay((await recv.waitFor((e) => e.event === 'listening')).port as number);
    try {
      const summary = await send({ path: p.src, host: '127.0.0.1', port: r.port, stateDir: p.stateS, trust: p.fpR, timeoutMs: 20_000, tree: { choices: { sizeOnly: true } } });
      assert.equal(summary.ok, true);
    } finally {
      r.close();
    }
    assert.equal((await recv.done).code, 0);
    assertSameTree(dst, p.src);
    const waited = sentBeforeReceiverHello(r);
    assert.ok(waited < 2048, `the offer waited for the receiver's HELLO (${waited} bytes went before it)`);
    fs.writeFileSync(p.remembered, '{"minVersion": "one"');
    const damaged = await session(p, path.join(p.root, 'd3'));
    assert.equal(damaged.send.code, 0, damaged.send.stderr);
    assert.equal(rememberedJson(p).capabilities, hello.capabilities, 'rewritten from the HELLO that came');
  });

  it("sends a single file's OFFER behind our HELLO without any memory of the receiver (TLS)", async () => {
    // At first contact both a tree and a file session send their TLS Finished and HELLO before the
    // receiver's HELLO can come; the file's OFFER goes with them (a tree's waits: nothing is
    // remembered yet). The TLS records are the same sizes in both sessions but for the OFFER's.
    const p = pair(1);
    const file = path.join(p.root, 'file.bin');
    fs.writeFileSync(file, 'a file of a few bytes\n');
    const before: Record<string, number> = {};
    for (const [what, source] of [
      ['tree', p.src],
      ['file', file],
    ] as const) {
      fs.rmSync(path.join(p.stateS, 'hellos'), { recursive: true, force: true });
      const s = await session({ ...p, src: source }, path.join(p.root, `dst-${what}`), { relay: true });
      assert.equal(s.send.code, 0, s.send.stderr);
      before[what] = sentBeforeReceiverHello(s.relay!);
    }
    assert.ok(before.file! >= before.tree! + 30, `the file's OFFER went before the receiver's HELLO came (file ${before.file} bytes, tree ${before.tree})`);
  });

  it('offers nothing before the receiver’s HELLO over plaintext TCP (no certificate; a receiver expecting TLS would reset)', async () => {
    const root = tmpdir('ffsync-early-offer-');
    const file = path.join(root, 'file.bin');
    fs.writeFileSync(file, 'a file of a few bytes\n');
    const tree = path.join(root, 'tree');
    fs.mkdirSync(tree);
    fs.writeFileSync(path.join(tree, 'a.txt'), 'a\n');
    for (const source of [file, tree, tree]) {
      const dst = path.join(root, `dst-${path.basename(source)}`);
      const args = ['--plaintext', '--json', '--timeout', '20', '--state-dir'];
      const recv = run(['receive', dst, '0', '--bind', '127.0.0.1', ...args, path.join(root, 'sr')]);
      const r = await relay((await recv.waitFor((e) => e.event === 'listening')).port as number);
      try {
        const s = await run(['send', source, `127.0.0.1:${r.port}`, ...args, path.join(root, 'ss')]).done;
        assert.equal(s.code, 0, s.stderr);
        assert.equal((await recv.done).code, 0);
      } finally {
        r.close();
      }
      // The receiver's HELLO reaches the sender DELAY_MS after the sender connected, at the earliest.
      const offer = r.senderFrames.find((f) => f.type === FrameType.OFFER);
      assert.ok(offer, 'the relay saw the OFFER');
      assert.ok(offer.t >= DELAY_MS, `${path.basename(source)}: offered ${offer.t.toFixed(0)} ms after connecting, before the receiver's HELLO came`);
    }
    assert.ok(!fs.existsSync(path.join(root, 'ss', 'hellos')), 'no receiver remembered by address');
  });

  it("reports a remembered receiver's refusal of the early offer in its words, not as a reset connection", async () => {
    // The receiver fails on the OFFER with the sender's manifest unread behind it: closing a socket
    // with unread bytes resets it, which could hide the receiver's ERROR from the sender.
    const p = pair();
    assert.equal((await session(p, path.join(p.root, 'd1'))).send.code, 0);
    const file = path.join(p.root, 'a-file');
    fs.writeFileSync(file, 'not a directory\n');
    for (let i = 0; i < 3; i++) {
      const r = await session(p, file);
      assert.equal(r.recv.code, 11, r.recv.stderr);
      assert.equal(r.send.code, 11, r.send.stderr);
      assert.match(r.send.stderr, /peer: target .* exists and is not a directory/);
      assert.equal(fs.readFileSync(file, 'utf8'), 'not a directory\n');
    }
  });

  it('is forgotten with the pin (untrust)', async () => {
    const p = pair(5);
    assert.equal((await session(p, path.join(p.root, 'd1'))).send.code, 0);
    assert.ok(fs.existsSync(p.remembered));
    const r = spawnSync(process.execPath, [CLI, 'untrust', p.fpR, '--state-dir', p.stateS], { encoding: 'utf8' });
    assert.equal(r.status, 0, r.stderr);
    assert.ok(!fs.existsSync(p.remembered));
  });
});
