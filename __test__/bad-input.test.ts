// Bad input: each case ends with one clear error line, the documented exit code, and
// nothing written (before/after snapshots of the target directory).
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { after, describe, it } from 'node:test';
import { canMount, oneErrorLine, run, seeded, sender, snapshot, startReceiver, sync, tmpdir } from './helpers/peers';
import { encodeFrame, FrameType } from '../ts/protocol/frames';
import { encodeHello, Role } from '../ts/protocol/messages';

const MiB = 1024 * 1024;

/** Connect to a receiver and play a scripted (hostile) sender. */
async function fakeSender(port: number, script: (sock: net.Socket) => void): Promise<void> {
  const sock = net.connect({ host: '127.0.0.1', port });
  await new Promise((r) => sock.once('connect', r));
  sock.on('error', () => undefined);
  sock.resume();
  script(sock);
  await new Promise((r) => sock.once('close', r));
}

const mounts: string[] = [];
after(() => {
  for (const m of mounts) {
    try {
      execFileSync('umount', [m]);
    } catch {
      // already gone
    }
  }
});

describe('sender-side bad input', () => {
  it('missing source: exit 3, nothing sent', async () => {
    const dir = tmpdir();
    const r = await run(['send', path.join(dir, 'nope.bin'), '127.0.0.1:9', '--plaintext']).done;
    assert.equal(r.code, 3);
    assert.match(oneErrorLine(r.stderr), /does not exist/);
  });

  it('a source that is neither a file nor a directory (a fifo): exit 3', async () => {
    const fifo = path.join(tmpdir(), 'fifo');
    execFileSync('mkfifo', [fifo]);
    const r = await run(['send', fifo, '127.0.0.1:9', '--plaintext']).done;
    assert.equal(r.code, 3);
    assert.match(oneErrorLine(r.stderr), /neither a regular file nor a directory/);
  });

  it('nobody listening: exit 10', async () => {
    const dir = tmpdir();
    fs.writeFileSync(path.join(dir, 'a'), 'x');
    const srv = net.createServer();
    await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
    const port = (srv.address() as net.AddressInfo).port;
    await new Promise((r) => srv.close(r));
    const r = await run(['send', path.join(dir, 'a'), `127.0.0.1:${port}`, '--plaintext', '--state-dir', path.join(dir, 's')]).done;
    assert.equal(r.code, 10);
    assert.match(oneErrorLine(r.stderr), /cannot connect/);
  });

  it('a web server that answers in text: exit 2 (not an ffsync-native peer), quoting what it said', async () => {
    const dir = tmpdir();
    fs.writeFileSync(path.join(dir, 'a'), 'x');
    const srv = net.createServer((s) => s.end(Buffer.from('HTTP/1.1 400 Bad Request\r\n\r\n')));
    await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
    const port = (srv.address() as net.AddressInfo).port;
    const r = await run(['send', path.join(dir, 'a'), `127.0.0.1:${port}`, '--plaintext', '--state-dir', path.join(dir, 's')]).done;
    srv.close();
    assert.equal(r.code, 2);
    assert.match(oneErrorLine(r.stderr), /127\.0\.0\.1:\d+: the far end is not an ffsync-native peer: it said "HTTP\/1\.1 400 Bad Request" \(a web server\)/);
  });

  it('a peer that answers with binary garbage: exit 12', async () => {
    const dir = tmpdir();
    fs.writeFileSync(path.join(dir, 'a'), 'x');
    const srv = net.createServer((s) => s.end(Buffer.from([0xff, 0xff, 0xff, 0x7f, 0x01, 0x00, 0x80])));
    await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
    const port = (srv.address() as net.AddressInfo).port;
    const r = await run(['send', path.join(dir, 'a'), `127.0.0.1:${port}`, '--plaintext', '--state-dir', path.join(dir, 's')]).done;
    srv.close();
    assert.equal(r.code, 12);
    assert.match(oneErrorLine(r.stderr), /out of bounds/);
  });

  it('usage errors exit 1: bad address, malformed fingerprint, unknown option, bad port', async () => {
    const dir = tmpdir();
    fs.writeFileSync(path.join(dir, 'a'), 'x');
    for (const args of [
      ['send', path.join(dir, 'a'), 'nohostport', '--plaintext'],
      ['send', path.join(dir, 'a'), '127.0.0.1:9', '--trust', 'ABCD'],
      ['send', path.join(dir, 'a'), '127.0.0.1:9', '--plaintext', '--frobnicate'],
      ['receive', path.join(dir, 'b'), '99999', '--plaintext'],
    ]) {
      const r = await run(args).done;
      assert.equal(r.code, 1, `${args.join(' ')} -> ${r.code}: ${r.stderr}`);
    }
  });
});

describe('receiver-side bad input', () => {
  it('target is a directory but the sender offers a single file: exit 11, nothing written', async () => {
    const dir = tmpdir();
    const target = path.join(dir, 'target');
    fs.mkdirSync(target);
    fs.writeFileSync(path.join(target, 'keep'), 'x');
    const src = path.join(dir, 'file.bin');
    fs.writeFileSync(src, 'payload');
    const before = snapshot(target);
    const { peer, port } = await startReceiver(target);
    const s = await sender(src, port).done;
    const r = await peer.done;
    assert.equal(r.code, 11);
    assert.match(oneErrorLine(r.stderr), /is a directory, but the sender offers a single file/);
    assert.equal(s.code, 11);
    assert.deepEqual(snapshot(target), before);
  });

  it('target directory missing: exit 11', async () => {
    const r = await run(['receive', path.join(tmpdir(), 'no', 'such', 'file'), '0', '--plaintext']).done;
    assert.equal(r.code, 11);
    assert.match(oneErrorLine(r.stderr), /does not exist/);
  });

  it('port in use: exit 10', async () => {
    const srv = net.createServer();
    await new Promise<void>((r) => srv.listen(0, '0.0.0.0', r));
    const port = (srv.address() as net.AddressInfo).port;
    const r = await run(['receive', path.join(tmpdir(), 'f'), String(port), '--plaintext']).done;
    srv.close();
    assert.equal(r.code, 10);
    assert.match(oneErrorLine(r.stderr), /EADDRINUSE|address already in use/i);
  });

  it('peer closes right after HELLO: exit 12, target untouched', async () => {
    const dir = tmpdir();
    const target = path.join(dir, 't.bin');
    fs.writeFileSync(target, 'keep me');
    const before = snapshot(dir);
    const { peer, port } = await startReceiver(target);
    await fakeSender(port, (s) => s.end(encodeFrame(FrameType.HELLO, encodeHello({ minVersion: 1, maxVersion: 1, capabilities: 0, role: Role.SENDER, software: 'fake' }))));
    const r = await peer.done;
    assert.equal(r.code, 12, r.stderr);
    oneErrorLine(r.stderr);
    assert.deepEqual(snapshot(dir), before);
  });

  it('garbage instead of frames: exit 12, target untouched', async () => {
    const dir = tmpdir();
    const target = path.join(dir, 't.bin');
    fs.writeFileSync(target, 'keep me');
    const before = snapshot(dir);
    const { peer, port } = await startReceiver(target);
    await fakeSender(port, (s) => s.end(seeded(4096, 3)));
    const r = await peer.done;
    assert.equal(r.code, 12, r.stderr);
    oneErrorLine(r.stderr);
    assert.deepEqual(snapshot(dir), before);
  });

  it('an oversized frame length is refused before allocating: exit 12', async () => {
    const { peer, port } = await startReceiver(path.join(tmpdir(), 't'));
    const huge = Buffer.alloc(5);
    huge.writeUInt32LE(0xfffffff0, 0);
    huge.writeUInt8(FrameType.DATA, 4);
    await fakeSender(port, (s) => s.end(huge));
    const r = await peer.done;
    assert.equal(r.code, 12);
    assert.match(oneErrorLine(r.stderr), /out of bounds/);
  });

  it('unknown protocol version: exit 2 with both ranges named', async () => {
    const { peer, port } = await startReceiver(path.join(tmpdir(), 't'));
    await fakeSender(port, (s) => s.end(encodeFrame(FrameType.HELLO, encodeHello({ minVersion: 7, maxVersion: 9, capabilities: 0, role: Role.SENDER, software: 'ffsync-native/9.0.0' }))));
    const r = await peer.done;
    assert.equal(r.code, 2);
    assert.match(oneErrorLine(r.stderr), /we speak 1\.\.2, peer .* speaks 7\.\.9/);
  });

  it('a silent peer times out: exit 30', async () => {
    const { peer, port } = await startReceiver(path.join(tmpdir(), 't'), ['--timeout', '1']);
    const sock = net.connect({ host: '127.0.0.1', port });
    sock.on('error', () => undefined);
    const r = await peer.done;
    sock.destroy();
    assert.equal(r.code, 30);
    assert.match(oneErrorLine(r.stderr), /sent nothing/);
  });

  it('a peer that trickles a frame byte by byte times out: exit 30', async () => {
    const { peer, port } = await startReceiver(path.join(tmpdir(), 't'), ['--timeout', '1']);
    const sock = net.connect({ host: '127.0.0.1', port });
    sock.on('error', () => undefined);
    const frame = encodeFrame(FrameType.HELLO, encodeHello({ minVersion: 1, maxVersion: 1, capabilities: 0, role: Role.SENDER, software: 'slow' }));
    let i = 0;
    const drip = setInterval(() => {
      if (i < frame.length - 1) sock.write(frame.subarray(i, ++i));
    }, 150);
    const r = await peer.done;
    clearInterval(drip);
    sock.destroy();
    assert.equal(r.code, 30, r.stderr);
    assert.match(oneErrorLine(r.stderr), /trickles/);
  });

  it('disk fills during reconstruction: exit 11, temp removed, old target intact', { skip: !canMount() && 'needs root to mount a small tmpfs' }, async () => {
    const dir = tmpdir();
    const mnt = path.join(dir, 'small');
    fs.mkdirSync(mnt);
    execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=4m', 'tmpfs', mnt]);
    mounts.push(mnt);
    const target = path.join(mnt, 'target.bin');
    fs.writeFileSync(target, seeded(1 * MiB, 1));
    const before = snapshot(mnt);
    const src = path.join(dir, 'src.bin');
    fs.writeFileSync(src, seeded(6 * MiB, 2));
    const res = await sync(src, target, { stateS: path.join(dir, 's'), stateR: path.join(dir, 'r') });
    assert.equal(res.recv.code, 11, res.recv.stderr);
    assert.match(oneErrorLine(res.recv.stderr), /no space left/i);
    assert.equal(res.send.code, 11, 'the sender reports the receiver\'s error');
    assert.deepEqual(snapshot(mnt), before, 'no temp file left, target unchanged');
  });

  it('target directory not writable: exit 11', { skip: !canMount() && 'needs root to mount a read-only tmpfs' }, async () => {
    const dir = tmpdir();
    const mnt = path.join(dir, 'ro');
    fs.mkdirSync(mnt);
    execFileSync('mount', ['-t', 'tmpfs', '-o', 'ro,size=1m', 'tmpfs', mnt]);
    mounts.push(mnt);
    const r = await run(['receive', path.join(mnt, 'f'), '0', '--plaintext']).done;
    assert.equal(r.code, 11);
    assert.match(oneErrorLine(r.stderr), /not writable/);
  });

  it('sender sees the receiver refuse a directory target mid-session: both exit 11', async () => {
    const dir = tmpdir();
    const target = path.join(dir, 't');
    const src = path.join(dir, 'src');
    fs.writeFileSync(src, 'x');
    const { peer, port } = await startReceiver(target);
    fs.mkdirSync(target); // becomes a directory after the receiver started
    const s = await sender(src, port, ['--state-dir', path.join(dir, 's')]).done;
    const r = await peer.done;
    assert.equal(r.code, 11, r.stderr);
    assert.equal(s.code, 11, s.stderr);
    assert.match(oneErrorLine(s.stderr), /peer: .*directory/);
  });
});
