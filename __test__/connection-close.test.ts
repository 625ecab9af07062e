// A connection's close is a session's last step: it waits for the stream to close, or for a grace
// period, and that wait holds the process (decisions §112). With an unreferenced grace timer, a
// stream that never said 'close' let the event loop drain with the session unfinished: a TLS
// `send` whose early connection was reset right after its handshake (the TLS socket ended
// without closing) exited 12 with "the session stalled" instead of reporting the reset. Each case
// runs in a child process with nothing else alive, where a drained loop shows as a process that
// exits without having said what the close did.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import type net from 'node:net';
import path from 'node:path';
import { describe, it } from 'node:test';
import tls from 'node:tls';
import { loadOrCreateIdentity } from '../ts/security/identity';
import { run, tmpdir, writeAt } from './helpers/peers';

const ROOT = path.resolve(__dirname, '..');

/** Run `body` (an async function's body; `FramedConnection` and `Duplex` in scope) in a child
 * process with nothing else to keep it alive; what it prints. */
function child(body: string): string {
  const script = `
    const { FramedConnection } = require(${JSON.stringify(path.join(ROOT, 'ts/transport/connection.ts'))});
    const { Duplex } = require('node:stream');
    (async () => { ${body} })().catch((e) => { console.log('failed: ' + e.message); });
    process.on('exit', () => console.log('exit'));
  `;
  return execFileSync(process.execPath, ['--import', 'tsx', '-e', script], { cwd: ROOT, encoding: 'utf8', timeout: 20_000 });
}

/** A stream that takes writes and never closes; `ended` pushes the peer's end first. */
const STUCK = (ended: boolean) => `
  const stream = new Duplex({ read() {}, write(_c, _e, cb) { cb(); }, final(cb) { /* our end never completes */ } });
  const conn = new FramedConnection(stream, 0);
  ${ended ? 'stream.push(null); await new Promise((r) => setImmediate(r));' : ''}
`;

describe('closing a connection', () => {
  it('a pinned TLS peer that closes before its HELLO: the connection was lost (exit 10, one line), reported at once', async () => {
    // The far end completes TLS with the certificate the sender pins, then goes away without a
    // word, as the reset of §112 left it: neither a --plaintext mismatch nor another version.
    const id = loadOrCreateIdentity(tmpdir());
    const server = tls.createServer({ key: id.keyPem, cert: id.certPem, minVersion: 'TLSv1.3' }, (s) => {
      s.on('error', () => undefined);
      s.end();
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    try {
      const dir = tmpdir();
      writeAt(dir, 'f.bin', 'some bytes\n');
      const t0 = Date.now();
      const r = await run(['send', path.join(dir, 'f.bin'), `127.0.0.1:${(server.address() as net.AddressInfo).port}`, '--trust', id.fingerprint, '--state-dir', path.join(dir, 'state')]).done;
      const lines = r.stderr.split('\n').filter((l) => l.startsWith('ffsync-native: error:'));
      assert.equal(r.code, 10, r.stderr);
      assert.deepEqual(lines, ["ffsync-native: error: connection closed before the peer's HELLO: the connection was lost, or the peer stopped (see its output)"]);
      assert.ok(Date.now() - t0 < 2000, `${Date.now() - t0} ms`);
    } finally {
      server.close();
    }
  });

  it('a stream that never closes: close() resolves after its grace, and the process waits for it', () => {
    const out = child(`${STUCK(false)}
      const t0 = Date.now();
      await conn.close(400);
      console.log('closed after ' + (Date.now() - t0) + ' ms, destroyed ' + stream.destroyed);`);
    const m = /closed after (\d+) ms, destroyed true\nexit/.exec(out);
    assert.ok(m, `the process ended before close() resolved: ${JSON.stringify(out)}`);
    assert.ok(Number(m[1]) >= 350, out);
  });

  it('the peer ended its side already: only our end is left to flush, so the grace is short', () => {
    const out = child(`${STUCK(true)}
      const t0 = Date.now();
      await conn.close(5000);
      console.log('closed after ' + (Date.now() - t0) + ' ms');`);
    const m = /closed after (\d+) ms\nexit/.exec(out);
    assert.ok(m, `the process ended before close() resolved: ${JSON.stringify(out)}`);
    assert.ok(Number(m[1]) < 1000, out);
  });
});
