// Errors in one line, with the fix (issue 19): what went wrong in words, naming the address or
// path, with what to do, and the documented exit code; never OpenSSL's or Node's raw text.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { describe, it } from 'node:test';
import { run, tmpdir } from './helpers/peers';

/** The one stderr line of a failed run (exactly one `ffsync-native: error:` line, nothing
 * from OpenSSL or Node's error text). */
function errorLine(stderr: string): string {
  const lines = stderr.split('\n').filter((l) => l.startsWith('ffsync-native: error:'));
  assert.equal(lines.length, 1, `one error line:\n${stderr}`);
  assert.doesNotMatch(stderr, /SSL routines|ssl3_|openssl|\bat [\w.]+ \(|getaddrinfo|connect ECONN/i, `no raw library text:\n${stderr}`);
  return lines[0]!;
}

/** A TCP server that greets every connection with `banner` (an ssh server, say) and holds it open. */
async function greeter(banner: string): Promise<{ port: number; close(): void }> {
  const sockets = new Set<net.Socket>();
  const server = net.createServer((s) => {
    sockets.add(s);
    s.on('error', () => undefined);
    s.write(banner);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  return {
    port: (server.address() as net.AddressInfo).port,
    close: () => {
      for (const s of sockets) s.destroy();
      server.close();
    },
  };
}

describe('errors name the address or path and say what to do', () => {
  it('connection refused: exit 10, the address, and what to check', async () => {
    const dir = tmpdir();
    fs.writeFileSync(path.join(dir, 'a'), 'x');
    // A port nothing listens on: bind one, close it.
    const probe = net.createServer();
    await new Promise<void>((r) => probe.listen(0, '127.0.0.1', () => r()));
    const port = (probe.address() as net.AddressInfo).port;
    await new Promise<void>((r) => probe.close(() => r()));
    const r = await run(['send', path.join(dir, 'a'), `127.0.0.1:${port}`, '--state-dir', path.join(dir, 's')]).done;
    assert.equal(r.code, 10, r.stderr);
    assert.equal(errorLine(r.stderr), `ffsync-native: error: connecting to 127.0.0.1:${port}: connection refused (nothing listens there: is the receiver running, on this port?)`);
  });

  it('unknown host: exit 10, the name, and what to check', async () => {
    const dir = tmpdir();
    fs.writeFileSync(path.join(dir, 'a'), 'x');
    const r = await run(['send', path.join(dir, 'a'), 'no-such-host.invalid:7788', '--state-dir', path.join(dir, 's')]).done;
    assert.equal(r.code, 10, r.stderr);
    // ENOTFOUND, or EAI_AGAIN where the machine has no DNS at all.
    assert.match(errorLine(r.stderr), /^ffsync-native: error: connecting to no-such-host\.invalid:7788: host (not found \(check the name|name lookup failed for now)/);
  });

  it('TLS to something that is not an ffsync-native peer: exit 2, no OpenSSL text, both possibilities named', async () => {
    const dir = tmpdir();
    fs.writeFileSync(path.join(dir, 'a'), 'x');
    const g = await greeter('SSH-2.0-OpenSSH_9.2\r\n');
    try {
      const r = await run(['send', path.join(dir, 'a'), `127.0.0.1:${g.port}`, '--state-dir', path.join(dir, 's')]).done;
      assert.equal(r.code, 2, r.stderr);
      assert.match(errorLine(r.stderr), new RegExp(`^ffsync-native: error: connecting to 127\\.0\\.0\\.1:${g.port}: the far end does not speak TLS: it is not an ffsync-native peer, or one started with --plaintext`));
    } finally {
      g.close();
    }
  });

  it('plain TCP to an ssh server: exit 2, quoting what it said and pointing at sync over ssh', async () => {
    const dir = tmpdir();
    fs.writeFileSync(path.join(dir, 'a'), 'x');
    const g = await greeter('SSH-2.0-OpenSSH_9.2\r\n');
    try {
      const r = await run(['send', path.join(dir, 'a'), `127.0.0.1:${g.port}`, '--plaintext', '--state-dir', path.join(dir, 's')]).done;
      assert.equal(r.code, 2, r.stderr);
      assert.equal(
        errorLine(r.stderr),
        `ffsync-native: error: 127.0.0.1:${g.port}: the far end is not an ffsync-native peer: it said "SSH-2.0-OpenSSH_9.2" (an ssh server: for ssh use \`ffsync-native sync SRC host:path\`)`,
      );
    } finally {
      g.close();
    }
  });

  it('a target under a file: exit 11, the path, "not a directory" in words', async () => {
    const dir = tmpdir();
    fs.writeFileSync(path.join(dir, 'file'), 'x');
    const r = await run(['receive', path.join(dir, 'file', 'sub'), '0', '--plaintext', '--state-dir', path.join(dir, 's')]).done;
    assert.equal(r.code, 11, r.stderr);
    assert.match(errorLine(r.stderr), new RegExp(`${path.join(dir, 'file', 'sub').replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}: a part of the path is not a directory$`));
  });
});
