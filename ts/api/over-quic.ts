// Running one side of a session over a QUIC connection (`--quic`): the session's
// framed conversation rides the connection's first stream, which the dialling side
// opens; the summary reports what QUIC put on the wire; the connection ends with the
// session (after its streams ended, so nothing unacknowledged is dropped).

import { FramedConnection } from '../transport/connection.js';
import type { QuicSession, QuicStreamDuplex } from '../transport/quic.js';
import type { FfsyncError } from '../utils/errors.js';
import type { SyncSummary } from './events.js';

export async function overQuic(
  session: QuicSession,
  first: 'open' | 'accept',
  timeoutMs: number,
  body: (conn: FramedConnection, stream: QuicStreamDuplex) => Promise<SyncSummary>,
): Promise<SyncSummary> {
  let summary: SyncSummary | undefined;
  try {
    const stream = first === 'open' ? await session.openStream() : await session.acceptStream();
    summary = await body(new FramedConnection(stream, timeoutMs), stream);
    return summary;
  } catch (e) {
    summary = (e as FfsyncError).summary as SyncSummary | undefined;
    throw e;
  } finally {
    // UDP payloads: QUIC headers, ACKs and retransmissions included.
    if (summary) summary.bytesOnWire = session.wireBytes();
    await session.close(Boolean(summary?.ok));
  }
}
