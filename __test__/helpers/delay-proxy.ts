// Loopback proxies that add a fixed one-way delay (so RTT = 2 x delay) and can drop
// everything on demand ("blackhole": a path that silently stops carrying packets).
// UDP for QUIC, TCP for TLS/plain connections. Used by the QUIC tests and by
// bench/sync.ts and bench/net.ts (30 ms RTT).
import dgram from 'node:dgram';
import net from 'node:net';

export interface DelayProxy {
  port: number;
  /** While on, every datagram / byte is dropped (connections stay open). */
  blackhole(on: boolean): void;
  close(): Promise<void>;
}

/** FIFO with one timer: items leave `delayMs` after they arrived, in order. */
function delayLine<T>(delayMs: number, deliver: (item: T) => void): (item: T) => void {
  const queue: { due: number; item: T }[] = [];
  let timer: NodeJS.Timeout | undefined;
  const drain = () => {
    timer = undefined;
    const now = performance.now();
    while (queue.length && queue[0].due <= now + 0.5) deliver(queue.shift()!.item);
    if (queue.length) timer = setTimeout(drain, Math.max(0, queue[0].due - performance.now()));
  };
  return (item) => {
    if (delayMs <= 0) return deliver(item);
    queue.push({ due: performance.now() + delayMs, item });
    if (!timer) timer = setTimeout(drain, delayMs);
  };
}

/** UDP: the first peer to send becomes "the client"; everything goes to 127.0.0.1:targetPort. */
export async function udpDelayProxy(targetPort: number, oneWayMs: number): Promise<DelayProxy> {
  const front = dgram.createSocket({ type: 'udp4', recvBufferSize: 8 << 20, sendBufferSize: 8 << 20 });
  const back = dgram.createSocket({ type: 'udp4', recvBufferSize: 8 << 20, sendBufferSize: 8 << 20 });
  let client: { address: string; port: number } | undefined;
  let dropping = false;
  const toTarget = delayLine<Buffer>(oneWayMs, (b) => back.send(b, targetPort, '127.0.0.1'));
  const toClient = delayLine<Buffer>(oneWayMs, (b) => client && front.send(b, client.port, client.address));
  front.on('message', (b, rinfo) => {
    client ??= { address: rinfo.address, port: rinfo.port };
    if (!dropping) toTarget(b);
  });
  back.on('message', (b) => {
    if (!dropping) toClient(b);
  });
  await new Promise<void>((r) => back.bind(0, '127.0.0.1', () => r()));
  await new Promise<void>((r) => front.bind(0, '127.0.0.1', () => r()));
  return {
    port: front.address().port,
    blackhole: (on) => (dropping = on),
    close: async () => {
      front.close();
      back.close();
    },
  };
}

/** TCP: each connection is relayed to targetHost:targetPort (default 127.0.0.1) with the delay
 * both ways; it listens on 127.0.0.1 (bench/net.ts runs it inside the sending namespace and
 * points it across a shaped veth link). */
export async function tcpDelayProxy(targetPort: number, oneWayMs: number, opts: { targetHost?: string; maxQueuedBytes?: number } = {}): Promise<DelayProxy> {
  const targetHost = opts.targetHost ?? '127.0.0.1';
  const maxQueued = opts.maxQueuedBytes ?? 8 << 20;
  let dropping = false;
  const sockets = new Set<net.Socket>();
  // Like a TCP path, not a TCP endpoint: a half-close travels behind the data in its direction (the
  // other direction keeps flowing), and a normal close never cuts data off — a relay that ended or
  // destroyed the far side early would make a peer see its connection closed before the last frames.
  const relay = (from: net.Socket, to: net.Socket) => {
    let queued = 0; // bytes inside the delay line
    let paused = false;
    // Bounded buffering (the delay line plus the far socket's queue). The default is well above
    // one-way bandwidth x delay for 1 Gbit/s at 15 ms (1.9 MB), so the relay itself never caps
    // throughput; bench/net.ts, which knows its link's rate, bounds it at twice the link's
    // bandwidth x delay, as a path's queues are: a relay that buffered 8 MiB in front of a
    // 100 Mbit/s link would be 0.7 s of bufferbloat that no real path has, hiding the link's
    // rate from a sender's backpressure.
    const check = () => {
      const over = queued + to.writableLength > maxQueued;
      if (over !== paused) {
        paused = over;
        if (over) from.pause();
        else from.resume();
      }
    };
    const line = delayLine<Buffer | null>(oneWayMs, (b) => {
      if (to.destroyed) return;
      if (b === null) return void to.end();
      queued -= b.length;
      to.write(b);
      check();
    });
    to.on('drain', check);
    from.on('data', (b) => {
      if (dropping) return;
      queued += b.length;
      line(b);
      check();
    });
    from.on('end', () => line(null));
    from.on('error', () => to.destroy());
    from.on('close', (hadError) => {
      if (hadError) to.destroy();
    });
  };
  const server = net.createServer({ noDelay: true, allowHalfOpen: true }, (inbound) => {
    const outbound = net.connect({ port: targetPort, host: targetHost, noDelay: true, allowHalfOpen: true });
    sockets.add(inbound).add(outbound);
    relay(inbound, outbound);
    relay(outbound, inbound);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  return {
    port: (server.address() as net.AddressInfo).port,
    blackhole: (on) => (dropping = on),
    close: async () => {
      for (const s of sockets) s.destroy();
      await new Promise<void>((r) => server.close(() => r()));
    },
  };
}
