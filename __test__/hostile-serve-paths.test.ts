// Writes never escape the target through a link the receiver did not look at, on `serve`
// pushes and on `pull` (issue 17 §1). A TLS man in the middle — trusted by the client,
// authorized by the daemon, as a hostile client or a hostile daemon would be — adds `link`
// to the sender's FILTER, so the receiver's walk never sees its own `link -> <outside>`
// while the sender still lists files under `link/`. Nothing outside the receiving tree may
// change; the paths under the link fail on their own (exit 23).
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import tls from 'node:tls';
import { describe, it } from 'node:test';
import { bystanders, CLI, run, seeded, snapshotTree, tmpdir } from './helpers/peers';
import { relayAddingExcludes } from './helpers/raw-peer';

function id(state: string): string {
  const r = spawnSync(process.execPath, [CLI, 'id', '--state-dir', state], { encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  return r.stdout.trim();
}


/** A TLS proxy with its own identity in front of the daemon on `port`; `toDaemon` /
 * `toClient` name which direction's FILTER gets `link` added. */
async function mitm(port: number, state: string, rewrite: 'toDaemon' | 'toClient') {
  const key = fs.readFileSync(path.join(state, 'identity', 'key.pem'));
  const cert = fs.readFileSync(path.join(state, 'identity', 'cert.pem'));
  const tlsOpts = { key, cert, minVersion: 'TLSv1.3' as const, rejectUnauthorized: false };
  const server = tls.createServer({ ...tlsOpts, requestCert: true }, (client) => {
    const daemon = tls.connect({ ...tlsOpts, host: '127.0.0.1', port, checkServerIdentity: () => undefined });
    client.on('error', () => daemon.destroy());
    daemon.on('error', () => client.destroy());
    client.on('close', () => daemon.destroy());
    daemon.on('close', () => client.destroy());
    relayAddingExcludes(client, daemon, rewrite === 'toDaemon' ? ['link'] : undefined);
    relayAddingExcludes(daemon, client, rewrite === 'toClient' ? ['link'] : undefined);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return { port: (server.address() as { port: number }).port, close: () => server.close() };
}

/** `outside/` with a file, `sibling/` beside it, and a sender tree with `link/…` in it. */
function scene() {
  const base = tmpdir();
  const { outside, sibling } = bystanders(base);
  const tree = path.join(base, 'tree');
  fs.mkdirSync(path.join(tree, 'link', 'sub'), { recursive: true });
  fs.writeFileSync(path.join(tree, 'ok.txt'), 'fine');
  fs.writeFileSync(path.join(tree, 'link', 'victim.txt'), 'overwritten!');
  fs.writeFileSync(path.join(tree, 'link', 'sub', 'deep.txt'), 'deeper');
  fs.writeFileSync(path.join(tree, 'link', 'big.bin'), seeded(3 << 20, 17));
  return { base, outside, sibling, tree, before: () => ({ outside: snapshotTree(outside), sibling: snapshotTree(sibling) }) };
}

async function daemonWith(root: string, state: string, proxyFp: string) {
  const fp = id(state);
  fs.writeFileSync(path.join(state, 'serve-clients.conf'), `${proxyFp} push,pull a\n`);
  const peer = run(['serve', root, '0', '--bind', '127.0.0.1', '--state-dir', state, '--json', '--quiet', '--timeout', '20']);
  const ev = await peer.waitFor((e) => e.event === 'listening');
  return { peer, port: ev.port as number, fp };
}

describe('serve and pull: no write through a link hidden by the FILTER', () => {
  it('a push into a/ whose root holds a/link -> outside: nothing outside the daemon root changed', async () => {
    const s = scene();
    const root = path.join(s.base, 'root');
    fs.mkdirSync(path.join(root, 'a'), { recursive: true });
    fs.symlinkSync(s.outside, path.join(root, 'a', 'link'));
    const proxyState = path.join(s.base, 'proxy');
    const proxyFp = id(proxyState);
    const d = await daemonWith(root, path.join(s.base, 'daemon'), proxyFp);
    const proxy = await mitm(d.port, proxyState, 'toDaemon');
    const before = s.before();
    const client = run(['send', s.tree, `127.0.0.1:${proxy.port}/a`, '--state-dir', path.join(s.base, 'client'), '--trust', proxyFp, '--json', '--timeout', '20']);
    const r = await client.done;
    proxy.close();
    d.peer.child.kill('SIGTERM');
    await d.peer.done;
    assert.deepEqual(s.before(), before, 'nothing outside the daemon root changed');
    assert.equal(r.code, 23, r.stderr);
    assert.match(r.stderr, /link/);
    assert.equal(fs.readFileSync(path.join(root, 'a', 'ok.txt'), 'utf8'), 'fine', 'the rest of the push landed');
    assert.ok(fs.lstatSync(path.join(root, 'a', 'link')).isSymbolicLink());
  });

  it('a pull into a local directory holding link -> outside: nothing outside it changed', async () => {
    const s = scene();
    const root = path.join(s.base, 'root');
    fs.mkdirSync(root);
    fs.renameSync(s.tree, path.join(root, 'a'));
    const local = path.join(s.base, 'local');
    fs.mkdirSync(local);
    fs.symlinkSync(s.outside, path.join(local, 'link'));
    const proxyState = path.join(s.base, 'proxy');
    const proxyFp = id(proxyState);
    const d = await daemonWith(root, path.join(s.base, 'daemon'), proxyFp);
    const proxy = await mitm(d.port, proxyState, 'toClient');
    const before = s.before();
    const client = run(['pull', `127.0.0.1:${proxy.port}/a`, local, '--state-dir', path.join(s.base, 'client'), '--trust', proxyFp, '--json', '--timeout', '20']);
    const r = await client.done;
    proxy.close();
    d.peer.child.kill('SIGTERM');
    await d.peer.done;
    assert.deepEqual(s.before(), before, 'nothing outside the local directory changed');
    assert.equal(r.code, 23, r.stderr);
    assert.equal(fs.readFileSync(path.join(local, 'ok.txt'), 'utf8'), 'fine', 'the rest of the pull landed');
    assert.ok(fs.lstatSync(path.join(local, 'link')).isSymbolicLink());
  });
});
