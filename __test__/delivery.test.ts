// Delivery reports (DELIVERED, docs/protocol.md §4.16) between two real FramedConnections:
// the data-receiving side reports what it read, the sending side's meter turns the reports
// into the link's rate and the queue in front of it. The same paced sender is measured over a
// link that keeps pace (loopback) and over a slow relay with a buffer in front, which is what
// the compression governor must tell apart (bench/RESULTS-net.md, "the compression level's
// blind spot"). The governor's use of the sample is in compress-level.test.ts; a lying or
// flooding reporter is in hostile-flood.test.ts.
import assert from 'node:assert/strict';
import net from 'node:net';
import { it } from 'node:test';
import { DELIVERY_REPORT_STEP, FramedConnection } from '../ts/transport/connection';
import { DeliveryMeter, linkSample, type LinkSample } from '../ts/transport/delivery';
import { FrameType } from '../ts/protocol/frames';
import { LINK_QUEUE_MS } from '../ts/api/compress-level';

it('linkSample: no verdict before 100 ms of reports; rate over the reports; a small flight is no queue', () => {
  assert.equal(linkSample([0], [1e6], 0, 2e6, 1e6), undefined, 'one report');
  assert.equal(linkSample([0, 50], [1e6, 2e6], 0, 3e6, 2e6), undefined, '50 ms of reports');
  const s = linkSample([0, 100, 200], [0, 1e6, 2e6], 0, 2e6 + 5e6, 2e6)!;
  assert.equal(s.rate, 10e6, '2 MB over 200 ms');
  assert.equal(s.queueMs, 500, '5 MB in flight at 10 MB/s');
  assert.equal(s.spanMs, 200);
  assert.equal(linkSample([0, 100, 200], [0, 1e6, 2e6], 0, 2e6 + 100_000, 2e6)!.queueMs, 0, '100 kB in flight');
  assert.equal(linkSample([0, 100, 200], [0, 1e6, 2e6], 1, 3e6, 2e6)!.rate, 10e6, 'from `head` on');
});

it('DeliveryMeter keeps about a second of reports, in bounded memory', () => {
  const meter = new DeliveryMeter();
  for (let t = 0; t <= 60_000; t += 10) meter.record(100_000, t); // 10 MB/s for a minute
  const s = meter.sample()!;
  assert.ok(Math.abs(s.rate - 10e6) < 1, `rate ${s.rate}`);
  assert.ok(s.spanMs >= 1000 && s.spanMs <= 1010, `span ${s.spanMs}`);
  const internal = meter as unknown as { times: number[] };
  assert.ok(internal.times.length < 700, `kept ${internal.times.length} reports`);
});

/** A receiver (reporting, as after a HELLO that negotiated DELIVERY) and a sender whose meter
 * counts its reports, joined through `relay` (or straight). The receiver takes every frame. */
async function pair(relay?: (upstreamPort: number) => Promise<{ port: number; close(): void }>) {
  const server = net.createServer();
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const target = (server.address() as net.AddressInfo).port;
  const hop = relay ? await relay(target) : undefined;
  const accepted = new Promise<net.Socket>((r) => server.once('connection', r));
  const client = net.connect({ host: '127.0.0.1', port: hop ? hop.port : target });
  await new Promise((r) => client.once('connect', r));
  const receiver = new FramedConnection(await accepted, 0);
  const sender = new FramedConnection(client, 0);
  // Both "said HELLO": reports are only accepted from a peer that spoke.
  await receiver.send(FrameType.HELLO, Buffer.from('r'));
  await sender.send(FrameType.HELLO, Buffer.from('s'));
  await sender.recv();
  await receiver.recv();
  receiver.startDeliveryReports();
  const meter = new DeliveryMeter();
  meter.add(sender);
  let read = 0;
  void (async () => {
    for (;;) {
      const f = await receiver.recv().catch(() => undefined);
      if (!f) return;
      read += f.payload.length;
      f.release?.();
    }
  })();
  return {
    sender,
    meter,
    read: () => read,
    close() {
      sender.destroy();
      receiver.destroy();
      hop?.close();
      server.close();
    },
  };
}

/** A link of `bytesPerSec` with `queueBytes` of buffer in front of it (the path's queue; the
 * kernel's socket buffers add theirs), one direction shaped, the other straight through. */
function slowRelay(bytesPerSec: number, queueBytes: number) {
  return async (upstreamPort: number) => {
    const srv = net.createServer((down) => {
      const up = net.connect({ host: '127.0.0.1', port: upstreamPort });
      const queue: Buffer[] = [];
      let queued = 0;
      down.on('data', (b: Buffer) => {
        queue.push(b);
        queued += b.length;
        if (queued > queueBytes) down.pause();
      });
      const tick = 10;
      const pump = setInterval(() => {
        let budget = (bytesPerSec * tick) / 1000;
        while (budget > 0 && queue.length) {
          const b = queue[0];
          const n = Math.min(b.length, Math.floor(budget));
          up.write(b.subarray(0, n));
          if (n === b.length) queue.shift();
          else queue[0] = b.subarray(n);
          queued -= n;
          budget -= n;
        }
        if (queued <= queueBytes / 2 && down.isPaused()) down.resume();
      }, tick);
      up.on('data', (b) => down.write(b));
      const end = () => {
        clearInterval(pump);
        up.destroy();
        down.destroy();
      };
      up.on('error', end);
      down.on('error', end);
      up.on('close', end);
      down.on('close', end);
    });
    await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
    return { port: (srv.address() as net.AddressInfo).port, close: () => srv.close() };
  };
}

/** Send 256 KiB frames at `bytesPerSec` (or as fast as the socket takes them) for `ms`;
 * sample the meter on the way. */
async function paced(p: Awaited<ReturnType<typeof pair>>, bytesPerSec: number, ms: number): Promise<LinkSample[]> {
  const frame = Buffer.alloc(256 * 1024, 7);
  const samples: LinkSample[] = [];
  const t0 = Date.now();
  let sent = 0;
  while (Date.now() - t0 < ms) {
    await p.sender.send(FrameType.DATA, frame);
    sent += frame.length;
    const ahead = (sent / bytesPerSec) * 1000 - (Date.now() - t0);
    if (ahead > 0) await new Promise((r) => setTimeout(r, ahead));
    const s = p.meter.sample();
    if (s && Date.now() - t0 > 400) samples.push(s);
  }
  return samples;
}

it('a paced sender over a link that keeps pace: the reports show its rate and no queue', { timeout: 30_000 }, async () => {
  const p = await pair();
  try {
    const samples = await paced(p, 12e6, 1500);
    assert.ok(samples.length > 5, `${samples.length} samples`);
    const last = samples.at(-1)!;
    assert.ok(last.rate > 6e6 && last.rate < 20e6, `rate ${(last.rate / 1e6).toFixed(1)} MB/s for a 12 MB/s sender`);
    const queued = samples.filter((s) => s.queueMs > LINK_QUEUE_MS);
    assert.ok(queued.length <= samples.length / 10, `queue over ${LINK_QUEUE_MS} ms in ${queued.length} of ${samples.length} samples: ${samples.map((s) => s.queueMs.toFixed(0)).join(' ')}`);
    assert.ok(p.sender.delivered > 0 && p.sender.delivered <= p.sender.bytesSent);
    assert.ok(p.sender.bytesSent - p.sender.delivered < 2 * DELIVERY_REPORT_STEP + 12e6 * 0.2, 'the reports trail by a report or two');
  } finally {
    p.close();
  }
});

it('the same sender over a 3 MB/s link with buffers in front: the reports show the link’s rate and a growing queue', { timeout: 30_000 }, async () => {
  const p = await pair(slowRelay(3e6, 1 << 20));
  try {
    const samples = await paced(p, 12e6, 2000);
    assert.ok(samples.length > 5, `${samples.length} samples`);
    const last = samples.at(-1)!;
    assert.ok(last.rate > 1.5e6 && last.rate < 4.5e6, `rate ${(last.rate / 1e6).toFixed(2)} MB/s over a 3 MB/s link`);
    assert.ok(last.queueMs > LINK_QUEUE_MS, `queue ${last.queueMs.toFixed(0)} ms`);
    // What the sender's own waits saw: the socket took far more than the link carried.
    assert.ok(p.sender.bytesSent - p.read() > 1 << 20, `sent ${p.sender.bytesSent}, read ${p.read()}`);
  } finally {
    p.close();
  }
});
