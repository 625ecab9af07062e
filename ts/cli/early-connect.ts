// A plain `send` opens its TCP connection before the program is loaded.
//
// The executable (./main.ts) runs this before it loads the CLI's bundle: for the plain cases of
// `send PATH HOST:PORT`, read from argv alone, it starts the TCP connection, whose handshake then
// crosses the network while the bundle and the addon load (~30 ms after Node's start), instead of
// after them. The program's first connect to the same host and port takes it
// (ts/transport/early-connect.ts) and starts TLS on it. Decisions §110.
//
// Only over TLS (the default): a `receive` takes its first connection as its session, and while a
// TLS receiver ignores a connection that closes before its first byte (ts/transport/tls.ts
// `tlsListenOnce`), a plaintext one would take it for its session and fail. And only where the
// program is bound to connect: every option here is one the program takes without a check that
// could fail before it connects (values checked the way it checks them), the source exists and is
// readable, and the platform tells the connection's round trip (Linux: the start level of
// compression is picked from it). Anything else — --plaintext, --pair, --quic, --exclude-from,
// any other option or command — starts nothing.
import fs from 'node:fs';
import path from 'node:path';
import { fingerprintHex } from '../security/fingerprint-text.js';

/** Short options of `send` that only change what the session does once connected. */
const SHORT = new Set('qcnv');
/** Long options without a value, likewise. */
const LONG = new Set(['--json', '--quiet', '--checksum', '--progress', '--no-progress', '--stats', '--no-compress', '--no-delete', '--dry-run', '--verbose', '--no-overlap']);
/** Long options with a value, and the values the program accepts without an error. */
const LONG_VALUE: Record<string, (v: string) => boolean> = {
  '--state-dir': (v) => v.length > 0,
  '--trust': (v) => fingerprintHex(v) !== undefined,
  '--timeout': (v) => isInt(v, 1, 86400),
  '--progress-interval': (v) => isInt(v, 1, 3600),
  '--compress-level': (v) => isInt(v, 1, 19),
  '--bwlimit': (v) => isInt(v, 1, 2 ** 31),
  '--parallel': (v) => isInt(v, 1, 16),
};

function isInt(v: string, min: number, max: number): boolean {
  if (!/^\d+$/.test(v)) return false;
  const n = Number(v);
  return n >= min && n <= max;
}

/** `HOST:PORT` or `HOST:PORT/path` (a serve daemon's), read as the program reads it
 * (ts/transport/tcp.ts parseRemote, loaded only for a `send`); undefined where it refuses it. */
function remoteOf(spec: string): { host: string; port: number } | undefined {
  const { parseRemote } = require('../transport/tcp.js') as typeof import('../transport/tcp.js'); // eslint-disable-line @typescript-eslint/no-require-imports
  try {
    const { host, port } = parseRemote(spec);
    return { host, port };
  } catch {
    return undefined;
  }
}

/** The address a `send` with these arguments will connect to first, or none when the arguments
 * hold anything this reader does not know (see the top of this file). */
export function planEarlyConnect(argv: readonly string[], platform: NodeJS.Platform = process.platform): { host: string; port: number } | undefined {
  if (argv[2] !== 'send' || platform !== 'linux') return undefined;
  const positional: string[] = [];
  for (let i = 3; i < argv.length; i++) {
    const a = argv[i]!;
    if (a.startsWith('--')) {
      const eq = a.indexOf('=');
      const name = eq < 0 ? a : a.slice(0, eq);
      const valid = LONG_VALUE[name];
      if (valid) {
        const value = eq < 0 ? argv[++i] : a.slice(eq + 1);
        if (value === undefined || !valid(value)) return undefined;
      } else if (eq >= 0 || !LONG.has(name)) {
        return undefined; // `--` itself, and every option not listed
      }
    } else if (a.startsWith('-') && a.length > 1) {
      for (const c of a.slice(1)) if (!SHORT.has(c)) return undefined;
    } else {
      positional.push(a);
    }
  }
  if (positional.length !== 2) return undefined;
  const remote = remoteOf(positional[1]!);
  if (!remote) return undefined;
  try {
    fs.accessSync(path.resolve(positional[0]!), fs.constants.R_OK);
  } catch {
    return undefined; // the program reports it, and never connects
  }
  return remote;
}

/** Start the connection `planEarlyConnect` finds, offered to the program; true if one was. Node
 * makes the connect call itself on the next tick (an IP address) or once the name is looked up:
 * the caller loads the program after that tick, not before it. Never throws: whatever goes wrong
 * here, the program connects as usual and reports what it finds. */
export function startEarlyConnect(argv: readonly string[] = process.argv): boolean {
  try {
    const remote = planEarlyConnect(argv);
    if (!remote) return false;
    /* eslint-disable @typescript-eslint/no-require-imports */
    const net = require('node:net') as typeof import('node:net');
    const { offerEarlyConnection } = require('../transport/early-connect.js') as typeof import('../transport/early-connect.js');
    /* eslint-enable @typescript-eslint/no-require-imports */
    offerEarlyConnection(remote.host, remote.port, net.connect({ host: remote.host, port: remote.port }));
    return true;
  } catch {
    return false; // the program connects as usual
  }
}
