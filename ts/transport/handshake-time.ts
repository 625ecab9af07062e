// How long a connection took to come up (TCP connect, TLS or QUIC handshake). Every one of
// those waits for at least one round trip across the link, so this is an upper bound on
// the link's RTT: tiny on loopback or a LAN, tens of milliseconds across regions. The
// sender picks its first compression level from it (compress-level.ts), before the
// socket's backpressure can say anything about the link.

const measured = new WeakMap<object, number>();

/** Record that `stream` took `ms` to connect and finish its handshake. */
export function noteHandshake(stream: object, ms: number): void {
  measured.set(stream, ms);
}

/** Milliseconds `stream` took to come up, if it was measured. */
export function handshakeMs(stream: object): number | undefined {
  return measured.get(stream);
}
