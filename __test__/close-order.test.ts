// The sender ends a session first (docs/protocol.md §7.2, decisions §113). Through a path that
// turns one side's FIN into a close of both directions (a relay or NAT without half-close), a
// receiver that ended its side right after its verdict let the sender's last writes (its streams'
// ends, written after their last RESULTs) meet a closed connection: the write was reset and the
// sender exited 10, "connection error: write EPIPE", though every file had arrived (about one
// session in fifteen through the hostile-mux tests' relay, which collapses a FIN the same way).
// Here the relay collapses every FIN at once; before the fix nearly every multiplexed session
// failed through it.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { describe, it } from 'node:test';
import { olderVersionsTree, seeded, sender, sha256, startReceiver, tmpdir } from './helpers/peers';

const MiB = 1024 * 1024;

/** A relay in front of a receiver; `collapsed`: how many ends it turned into closes. */
interface Relay {
  port: number;
  close: () => void;
  collapsed?: () => number;
}

/** A TCP relay in front of `port` without half-close: the first FIN from either side ends the
 * other side too, and once that end is flushed both connections are closed. What the receiver
 * sends is passed on in bursts every 20 ms (a sender then reads several streams' last RESULTs,
 * the TREE_RESULT and the end at once: the moment the old order lost). */
async function collapsingRelay(port: number): Promise<Relay> {
  let collapsed = 0;
  const server = net.createServer((client) => {
    const upstream = net.connect(port, '127.0.0.1');
    const collapse = (to: net.Socket) => {
      collapsed++;
      to.end(() => {
        client.destroy();
        upstream.destroy();
      });
    };
    client.on('data', (d: Buffer) => upstream.write(d));
    client.on('end', () => collapse(upstream));
    let held: Buffer[] = [];
    let ended = false;
    const flush = setInterval(() => {
      if (held.length) client.write(Buffer.concat(held));
      held = [];
      if (ended) {
        clearInterval(flush);
        collapse(client);
      }
    }, 20);
    upstream.on('data', (d: Buffer) => held.push(d));
    upstream.on('end', () => (ended = true));
    for (const [a, b] of [
      [client, upstream],
      [upstream, client],
    ] as const) {
      a.on('error', () => b.destroy());
      a.on('close', () => {
        clearInterval(flush);
        b.destroy();
      });
    }
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return { port: (server.address() as net.AddressInfo).port, close: () => server.close(), collapsed: () => collapsed };
}

/** A relay that never passes the sender's end on (the receiver's side stays open until the
 * receiver closes it): a sender whose end is lost on the way. */
async function endSwallowingRelay(port: number): Promise<Relay> {
  const server = net.createServer({ allowHalfOpen: true }, (client) => {
    const upstream = net.connect({ port, host: '127.0.0.1', allowHalfOpen: true });
    client.on('data', (d: Buffer) => upstream.write(d));
    upstream.on('data', (d: Buffer) => client.write(d));
    upstream.on('end', () => client.end());
    for (const [a, b] of [
      [client, upstream],
      [upstream, client],
    ] as const) {
      a.on('error', () => b.destroy());
    }
    upstream.on('close', () => client.destroy());
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return { port: (server.address() as net.AddressInfo).port, close: () => server.close() };
}

async function through(relayed: (port: number) => Promise<Relay>, src: string, dst: string, state: string) {
  const { peer, port } = await startReceiver(dst, ['--state-dir', path.join(state, 'r')]);
  const relay = await relayed(port);
  try {
    const [sr, rr] = await Promise.all([sender(src, relay.port, ['--state-dir', path.join(state, 's')]).done, peer.done]);
    return { sr, rr, collapsed: relay.collapsed?.() ?? 0 };
  } finally {
    relay.close();
  }
}

describe('the sender ends a session first', () => {
  it('multiplexed tree sessions through a relay without half-close: both peers exit 0, every file right', async () => {
    for (let round = 0; round < 4; round++) {
      const s = olderVersionsTree(6, 300, 900_000);
      const { sr, rr, collapsed } = await through(collapsingRelay, s.src, s.dst, path.join(s.dir, 'state'));
      const both = `round ${round}: sender exit ${sr.code}: ${sr.stderr}\nreceiver exit ${rr.code}: ${rr.stderr}`;
      assert.equal(sr.code, 0, both);
      assert.equal(rr.code, 0, both);
      assert.ok(collapsed >= 1, 'the relay collapsed the end');
      for (const n of fs.readdirSync(s.src)) assert.equal(sha256(path.join(s.dst, n)), sha256(path.join(s.src, n)), n);
      fs.rmSync(s.dir, { recursive: true, force: true });
    }
  });

  it('a single file through the same relay: both peers exit 0', async () => {
    const dir = tmpdir();
    const src = path.join(dir, 'new.bin');
    const dst = path.join(dir, 'old.bin');
    const old = seeded(3 * MiB, 7);
    fs.writeFileSync(dst, old);
    fs.utimesSync(dst, 1_600_000_000, 1_600_000_000);
    const now = Buffer.from(old);
    now.fill(9, 1_000_000, 1_004_096);
    fs.writeFileSync(src, now);
    const { sr, rr } = await through(collapsingRelay, src, dst, path.join(dir, 'state'));
    assert.equal(sr.code, 0, sr.stderr);
    assert.equal(rr.code, 0, rr.stderr);
    assert.equal(sha256(dst), sha256(src));
  });

  it("a sender whose end never arrives holds the receiver no longer than the close's grace", async () => {
    const dir = tmpdir();
    const src = path.join(dir, 'new.bin');
    const dst = path.join(dir, 'old.bin');
    fs.writeFileSync(src, seeded(1 * MiB, 11));
    const t0 = Date.now();
    const { sr, rr } = await through(endSwallowingRelay, src, dst, path.join(dir, 'state'));
    const took = Date.now() - t0;
    assert.equal(sr.code, 0, sr.stderr);
    assert.equal(rr.code, 0, rr.stderr);
    assert.equal(sha256(dst), sha256(src));
    // The receiver waits up to 2 s for the sender's end, then ends and closes (0.5 s more at
    // most, not a second full grace: 4 s in the first version).
    assert.ok(took >= 1900, `the receiver waited for the sender's end (${took} ms)`);
    assert.ok(took < 3800, `the receiver's wait is bounded (${took} ms)`);
  });
});
