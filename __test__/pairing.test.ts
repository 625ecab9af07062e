// First contact by a one-time pairing code (docs/security.md "Pairing"): the receiver
// prints the code and the exact line for the sender; the code authenticates that one
// connection (SPAKE2 bound to the TLS exporter and both certificates) and both sides pin.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import tls from 'node:tls';
import { after, describe, it } from 'node:test';
import { run, seeded, sha256, tmpdir } from './helpers/peers';

function setup() {
  const dir = tmpdir('ffsync-pair-');
  const src = path.join(dir, 'src.bin');
  fs.writeFileSync(src, seeded(1 << 20, 11));
  const out = path.join(dir, 'out');
  fs.mkdirSync(out);
  return { dir, src, out, dst: path.join(out, 'dst.bin'), stateS: path.join(dir, 'ss'), stateR: path.join(dir, 'sr') };
}

async function id(stateDir: string): Promise<string> {
  const r = await run(['id', '--state-dir', stateDir]).done;
  assert.equal(r.code, 0, r.stderr);
  return r.stdout.trim();
}

function pins(stateDir: string): string {
  try {
    return fs.readFileSync(path.join(stateDir, 'pins.conf'), 'utf8');
  } catch {
    return '';
  }
}

// Receivers wait for a connection without limit: a failed assertion must not leave one behind.
const receivers: ReturnType<typeof run>[] = [];
after(() => receivers.forEach((r) => r.child.kill('SIGKILL')));

function receiver(t: ReturnType<typeof setup>, extra: string[] = []) {
  return track(run(['receive', t.dst, '0', '--json', '--bind', '127.0.0.1', '--timeout', '10', '--state-dir', t.stateR, ...extra]));
}

/** A TLS identity of our own making (an attacker's), as PEM files for node:tls. */
async function identityFiles(stateDir: string): Promise<{ key: Buffer; cert: Buffer }> {
  await id(stateDir);
  return { key: fs.readFileSync(path.join(stateDir, 'identity', 'key.pem')), cert: fs.readFileSync(path.join(stateDir, 'identity', 'cert.pem')) };
}

/** A JSON receiver, its listening event and its first pairing code. */
async function offeringReceiver(t: ReturnType<typeof setup>, extra: string[] = []) {
  const recv = receiver(t, extra);
  const l = await recv.waitFor((e) => e.event === 'listening');
  const p = await recv.waitFor((e) => e.event === 'pairing');
  return { recv, l, p };
}

function track(r: ReturnType<typeof run>): ReturnType<typeof run> {
  receivers.push(r);
  return r;
}

function send(t: ReturnType<typeof setup>, port: number, extra: string[]) {
  return run(['send', t.src, `127.0.0.1:${port}`, '--timeout', '10', '--state-dir', t.stateS, ...extra]).done;
}

describe('pairing code', () => {
  it('a receiver without pins prints a code inside the exact send line; that line pairs, pins both sides, and the next run needs nothing', async () => {
    const t = setup();
    // Human output: the address, then the code in the line to paste (stdout).
    const recv = track(run(['receive', t.dst, '0', '--bind', '127.0.0.1', '--timeout', '10', '--state-dir', t.stateR]));
    const line = await new Promise<string>((resolve, reject) => {
      let out = '';
      recv.child.stdout!.on('data', (d: Buffer) => {
        out += d;
        const m = /^\s*(ffsync-native send .*--pair \S+)$/m.exec(out);
        if (m) resolve(m[1]);
      });
      void recv.done.then((r) => reject(new Error(`receiver exited: ${r.stderr}`)));
    });
    assert.match(line, /^ffsync-native send \.\/dst\.bin 127\.0\.0\.1:\d+ --pair \d{1,3}-[a-z]+-[a-z]+$/);
    const words = line.split(' ');
    const [, , , addr, , code] = words;
    const s = await run(['send', t.src, addr, '--timeout', '10', '--state-dir', t.stateS, '--pair', code]).done;
    assert.equal(s.code, 0, s.stderr);
    assert.match(s.stderr, /paired with 127\.0\.0\.1:\d+: its fingerprint [0-9A-F-]{79} is pinned/);
    const r = await recv.done;
    assert.equal(r.code, 0, r.stderr);
    assert.ok(r.stdout.startsWith('listening on 127.0.0.1:'), 'the address stays the first line');
    assert.equal(sha256(t.dst), sha256(t.src));
    const [fs_, fr] = [await id(t.stateS), await id(t.stateR)];
    assert.match(pins(t.stateR), new RegExp(`^${fs_} paired `, 'm'));
    assert.match(pins(t.stateS), new RegExp(`^${fr} paired `, 'm'));

    // Later runs: no code offered (the receiver has a pin), none needed.
    fs.writeFileSync(t.src, seeded(1 << 20, 12));
    const again = receiver(t);
    const l = await again.waitFor((e) => e.event === 'listening');
    const s2 = await send(t, l.port, []);
    assert.equal(s2.code, 0, s2.stderr);
    const r2 = await again.done;
    assert.equal(r2.code, 0, r2.stderr);
    assert.equal(r2.events.filter((e) => e.event === 'pairing').length, 0);
    assert.equal(sha256(t.dst), sha256(t.src));
  });

  it('--json: the code is an event after listening; a wrong code is refused on both sides (exit 5), is spent, and the receiver offers a new one and keeps waiting', async () => {
    const t = setup();
    const { recv, l, p: p1 } = await offeringReceiver(t);
    assert.equal(recv.events[0].event, 'listening');
    assert.match(p1.command, new RegExp(`--pair ${p1.code}$`));
    // A code of valid words that is not this one.
    const wrong = p1.code.replace(/^\d+/, (n: string) => String((Number(n) % 999) + 1));
    const bad = await send(t, l.port, ['--pair', wrong]);
    assert.equal(bad.code, 5, bad.stderr);
    assert.match(bad.stderr, /^ffsync-native: error: peer: pairing failed: the code did not match/m);
    assert.equal(bad.stderr.split('\n').filter((x) => /error/.test(x)).length, 1, bad.stderr);
    const p2 = await recv.waitFor((e) => e.event === 'pairing' && e.code !== p1.code);
    assert.equal(pins(t.stateR), '');
    assert.equal(pins(t.stateS), '');
    assert.equal(fs.existsSync(t.dst), false);
    // The spent code no longer works, even typed right.
    const spent = await send(t, l.port, ['--pair', p1.code]);
    assert.equal(spent.code, 5, spent.stderr);
    const p3 = await recv.waitFor((e) => e.event === 'pairing' && e.code !== p2.code && e.code !== p1.code);
    const ok = await send(t, l.port, ['--pair', p3.code]);
    assert.equal(ok.code, 0, ok.stderr);
    assert.equal((await recv.done).code, 0);
    assert.equal(sha256(t.dst), sha256(t.src));
  });

  it('a typo is a usage error before any connection (the code is not spent); --pair with --plaintext, --quic or --trust is refused', async () => {
    const t = setup();
    const { recv, l, p } = await offeringReceiver(t);
    const typo = p.code.replace(/-([a-z]+)$/, '-zzzq');
    const bad = await send(t, l.port, ['--pair', typo]);
    assert.equal(bad.code, 1);
    assert.match(bad.stderr, /^ffsync-native: error: pairing code '.*': 'zzzq' is not one of the pairing words/);
    for (const extra of [['--plaintext'], ['--quic'], ['--trust', await id(t.stateR)]]) {
      const r = await send(t, l.port, ['--pair', p.code, ...extra]);
      assert.equal(r.code, 1, `${extra}: ${r.stderr}`);
    }
    // Case and separators are forgiven.
    const ok = await send(t, l.port, ['--pair', p.code.toUpperCase().replace(/-/g, ' ')]);
    assert.equal(ok.code, 0, ok.stderr);
    assert.equal((await recv.done).code, 0);
    assert.equal(recv.events.filter((e) => e.event === 'pairing').length, 1, 'no code was spent by the refused attempts');
  });

  it('a relay that terminates TLS on both sides and passes the exchange through unchanged fails on both sides: nothing pinned, nothing written', async () => {
    const t = setup();
    const { key, cert } = await identityFiles(path.join(t.dir, 'mitm'));
    const { recv, l, p } = await offeringReceiver(t);
    let relayed = 0;
    const mitm = tls.createServer({ key, cert, requestCert: true, rejectUnauthorized: false, minVersion: 'TLSv1.3' }, (down) => {
      const up = tls.connect({ host: '127.0.0.1', port: l.port, key, cert, rejectUnauthorized: false, checkServerIdentity: () => undefined });
      down.on('data', (d) => ((relayed += d.length), up.write(d)));
      up.on('data', (d) => ((relayed += d.length), down.write(d)));
      const end = () => (down.destroy(), up.destroy());
      down.on('close', end).on('error', end);
      up.on('close', end).on('error', end);
    });
    await new Promise<void>((resolve) => mitm.listen(0, '127.0.0.1', resolve));
    const port = (mitm.address() as net.AddressInfo).port;
    // The victim typed the right code into a connection that goes through the relay.
    const s = await send(t, port, ['--pair', p.code]);
    mitm.close();
    assert.equal(s.code, 5, s.stderr);
    assert.ok(relayed > 66, 'the PAKE messages went through the relay');
    await recv.waitFor((e) => e.event === 'pairing' && e.code !== p.code);
    assert.equal(pins(t.stateR), '');
    assert.equal(pins(t.stateS), '');
    assert.equal(fs.existsSync(t.dst), false);
    recv.child.kill('SIGTERM');
    assert.equal((await recv.done).code, 20);
  });

  it('an unauthenticated peer that sends a malformed PAIR or hangs up mid-exchange is a refused connection: the receiver keeps waiting, and a malformed frame spends no code', async () => {
    const t = setup();
    const { key, cert } = await identityFiles(path.join(t.dir, 'stranger'));
    const { recv, l, p } = await offeringReceiver(t);
    const frame = (type: number, payload: Buffer) => {
      const h = Buffer.alloc(5);
      h.writeUInt32LE(payload.length + 1, 0);
      h[4] = type;
      return Buffer.concat([h, payload]);
    };
    const raw = async (bytes: Buffer) => {
      const sock = tls.connect({ host: '127.0.0.1', port: l.port, key, cert, rejectUnauthorized: false, checkServerIdentity: () => undefined });
      await new Promise<void>((resolve, reject) => sock.once('secureConnect', resolve).once('error', reject));
      sock.write(bytes);
      sock.on('error', () => undefined);
      await new Promise<void>((resolve) => sock.once('close', () => resolve()).resume());
    };
    const refusals = () => recv.events.filter((e) => e.event === 'info' && /refused a connection: pairing failed/.test(e.message));
    await raw(frame(0x20, Buffer.from([1, 2, 3])));
    await recv.waitFor(() => refusals().length === 1);
    assert.match(refusals()[0].message, /malformed PAIR frame/);
    // A well-formed first step, then silence and a hang-up: that attempt spent the code.
    await raw(frame(0x20, Buffer.concat([Buffer.from([1]), Buffer.from('A'), Buffer.alloc(32, 7)])));
    await recv.waitFor(() => refusals().length === 2);
    const next = await recv.waitFor((e) => e.event === 'pairing' && e.code !== p.code);
    const ok = await send(t, l.port, ['--pair', next.code]);
    assert.equal(ok.code, 0, ok.stderr);
    assert.equal((await recv.done).code, 0);
    assert.equal(recv.events.filter((e) => e.event === 'pairing').length, 2, 'the malformed frame spent no code');
    assert.equal(sha256(t.dst), sha256(t.src));
  });

  it('pins present: no code unless receive --pair; --no-pair never; a spent run stops offering after five failed attempts', async () => {
    const t = setup();
    const other = await id(path.join(t.dir, 'someone'));
    assert.equal((await run(['trust', other, '--state-dir', t.stateR]).done).code, 0);
    const quiet = receiver(t, ['--no-progress']);
    const l = await quiet.waitFor((e) => e.event === 'listening');
    // A sender that asks to pair with a receiver offering no code: refused in words.
    const asked = await send(t, l.port, ['--pair', '7-amber-orbit']);
    assert.equal(asked.code, 5, asked.stderr);
    quiet.child.kill('SIGTERM');
    const q = await quiet.done;
    assert.equal(q.events.filter((e) => e.event === 'pairing').length, 0);

    const offering = receiver(t, ['--pair']);
    const l2 = await offering.waitFor((e) => e.event === 'listening');
    let p = await offering.waitFor((e) => e.event === 'pairing');
    for (let i = 0; i < 5; i++) {
      const wrong = p.code.replace(/^\d+/, (n: string) => String((Number(n) % 999) + 1));
      assert.equal((await send(t, l2.port, ['--pair', wrong])).code, 5);
      if (i < 4) {
        const prev = p.code;
        p = await offering.waitFor((e) => e.event === 'pairing' && e.code !== prev);
      }
    }
    await offering.waitFor((e) => e.event === 'info' && /pairing is off for this run/.test(e.message));
    assert.equal(offering.events.filter((e) => e.event === 'pairing').length, 5);
    offering.child.kill('SIGTERM');
    await offering.done;

    const none = receiver(t, ['--no-pair']);
    await none.waitFor((e) => e.event === 'listening');
    none.child.kill('SIGTERM');
    assert.equal((await none.done).events.filter((e) => e.event === 'pairing').length, 0);
  });
});
