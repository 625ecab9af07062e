// Loopback connections for transport tests: the connecting side's socket and the side a server
// accepted (where a receiver's data arrives).
import net from 'node:net';
import tls from 'node:tls';

export async function tcpPair(): Promise<[net.Socket, net.Socket]> {
  const server = net.createServer();
  const accepted = new Promise<net.Socket>((r) => server.once('connection', r));
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  const client = net.connect((server.address() as net.AddressInfo).port, '127.0.0.1');
  await new Promise<void>((r, j) => client.once('connect', () => r()).once('error', j));
  const b = await accepted;
  server.close();
  return [client, b];
}

/** A TLS 1.3 connection over loopback with `id` as the server's certificate. */
export async function tlsPair(id: { keyPem: string; certPem: string }): Promise<[tls.TLSSocket, tls.TLSSocket]> {
  const server = tls.createServer({ key: id.keyPem, cert: id.certPem, minVersion: 'TLSv1.3' });
  const accepted = new Promise<tls.TLSSocket>((r) => server.once('secureConnection', r));
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  const client = tls.connect({ port: (server.address() as net.AddressInfo).port, host: '127.0.0.1', rejectUnauthorized: false, minVersion: 'TLSv1.3' });
  await new Promise<void>((r, j) => client.once('secureConnect', () => r()).once('error', j));
  const b = await accepted;
  server.close();
  return [client, b];
}
