// `node:net`, loaded at its first use. A local sync, `--version` and `--help` never open a
// socket, and loading net (with its stream and handle internals) costs a few ms of every start
// (decisions §100): the transport modules that a local sync loads for their other exports (a
// socket queue, a connection's reads) take net from here when they make or test a socket.
import type * as Net from 'node:net';

let net: typeof Net | undefined;

export function netModule(): typeof Net {
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  return (net ??= require('node:net') as typeof Net);
}
