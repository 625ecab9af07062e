// `ffsync-native serve <root> <port>`: the daemon's command line. stdout carries one JSON
// line per session (and the listening line first: plain `listening on host:port`, or a
// JSON event with --json); human notices go to stderr. SIGHUP reloads the authorization
// config; SIGTERM/SIGINT stop accepting, give running sessions --grace seconds, end the
// rest, and exit 0 (a second signal ends them at once).

import fs from 'node:fs';
import { type Command, Option } from 'commander';
import type { ServeDaemon } from '../serve/daemon.js';
import { ExitCode, FfsyncError } from '../utils/errors.js';
import { intArg, need } from './command-kit.js';

interface ServeCli {
  bind: string;
  stateDir?: string;
  config?: string;
  json?: boolean;
  quiet?: boolean;
  quic?: boolean;
  plaintext?: boolean;
  timeout: number;
  grace: number;
  maxSessions: number;
  maxHandshakes: number;
  maxHandshakesPerAddress: number;
  handshakeRate: number;
  handshakeTimeout: number;
  maxMemory: number;
  compressLevel: number;
  compress: boolean;
  fsync: boolean;
  logFile?: string;
}

/** The daemon's code (and the native addon) load when the command runs, not when the program
 * is built. */
export function serveCommand(program: Command): void {
  const cmd = program
    .command('serve')
    .description('long-lived daemon: many concurrent pushes and pulls under <root>, each client authorized by fingerprint for path prefixes (<state>/serve-clients.conf)')
    .argument('<root>', 'directory whose subpaths clients push to and pull from')
    .argument('<port>', 'TCP port to listen on (0 picks a free port)', intArg(0, 65535))
    .option('--bind <address>', 'address to listen on', '0.0.0.0')
    .option('--state-dir <dir>', 'state directory (identity, indexes, serve-clients.conf)')
    .option('--config <file>', 'authorization config (default <state-dir>/serve-clients.conf)')
    .option('--json', 'the listening line and notices as JSON events on stdout too')
    .option('-q, --quiet', 'no notices on stderr (session lines still go to stdout)')
    .option('--quic', 'also accept QUIC (UDP) on the same port number')
    .option('--plaintext', 'refused: clients are authorized by their certificates')
    .option('--log-file <file>', 'also append the session lines to this file')
    .addOption(new Option('--timeout <seconds>', 'end a session whose client is silent this long').argParser(intArg(1, 86400)).default(60))
    .addOption(new Option('--grace <seconds>', 'on SIGTERM, how long running sessions may take to finish').argParser(intArg(0, 86400)).default(30));
  limitOptions(cmd);
  cmd.action((root: string, port: number, o: ServeCli) => new ServeCommand(o).run(root, port));
}

/** What one daemon admits at once, and how it writes. */
function limitOptions(cmd: Command): void {
  cmd
    .addOption(new Option('--max-sessions <n>', 'refuse more concurrent sessions than this (counted once a client is authorized)').argParser(intArg(1, 4096)).default(64))
    .addOption(
      new Option('--max-handshakes <n>', 'connections not yet authorized (TLS, HELLO, REQUEST) at once; a newcomer pushes out the oldest unauthenticated one').argParser(intArg(1, 4096)).default(128),
    )
    .addOption(new Option('--max-handshakes-per-address <n>', '… of which from one source address').argParser(intArg(1, 4096)).default(64))
    .addOption(new Option('--handshake-rate <n>', 'new connections per second from one address, after a burst of --max-handshakes-per-address; faster ones are dropped before TLS').argParser(intArg(1, 100000)).default(8))
    .addOption(new Option('--handshake-timeout <seconds>', 'a connection must be authorized this soon after connecting, TLS included').argParser(intArg(1, 600)).default(5))
    .addOption(new Option('--max-memory <MiB>', 'memory budget: refuse sessions beyond it (16 MiB reserved per session, or the resident set over it)').argParser(intArg(64, 1048576)).default(1024))
    .addOption(new Option('--compress-level <n>', 'zstd level for pulled data').argParser(intArg(1, 19)).default(1))
    .option('--no-compress', 'send pulled data uncompressed')
    .option('--no-fsync', "do not fsync pushed files before renaming them into place (rsync's default: no waiting for the disk, but a crash soon after may lose or truncate them; every file is still verified)");
}

/** One run of `serve`: starts the daemon, reloads on SIGHUP, stops on SIGTERM or SIGINT. */
class ServeCommand {
  private readonly log: number | undefined;
  private stopping = false;

  constructor(private readonly o: ServeCli) {
    this.log = o.logFile ? fs.openSync(o.logFile, 'a', 0o600) : undefined;
  }

  async run(root: string, port: number): Promise<void> {
    let daemon: ServeDaemon;
    try {
      daemon = await this.start(root, port);
    } catch (e) {
      const err = e instanceof FfsyncError ? e : new FfsyncError('EINTERNAL', ExitCode.FILE_IO, String((e as Error)?.message ?? e));
      process.stderr.write(`ffsync-native: error: ${err.message}\n`);
      if (this.o.json) process.stdout.write(JSON.stringify({ event: 'error', code: err.code, exitCode: err.exitCode, message: err.message }) + '\n');
      process.exitCode = err.exitCode;
      return;
    }
    process.on('SIGHUP', () => {
      const r = daemon.reload();
      this.notice(r.message, { reload: r.ok });
    });
    process.on('SIGTERM', () => void this.stop(daemon, 'SIGTERM'));
    process.on('SIGINT', () => void this.stop(daemon, 'SIGINT'));
  }

  private start(root: string, port: number): Promise<ServeDaemon> {
    const { o } = this;
    if (o.plaintext) throw new FfsyncError('EUSAGE', ExitCode.USAGE, 'serve authorizes clients by their certificate fingerprints: --plaintext is not available');
    // eslint-disable-next-line @typescript-eslint/no-require-imports
    const { ServeDaemon } = need(() => require('../serve/daemon.js') as typeof import('../serve/daemon.js'));
    // eslint-disable-next-line @typescript-eslint/no-require-imports
    const { formatSessionLog } = require('../serve/session-log.js') as typeof import('../serve/session-log.js');
    return ServeDaemon.start({
      root,
      host: o.bind,
      port,
      stateDir: o.stateDir,
      configFile: o.config,
      timeoutMs: o.timeout * 1000,
      maxSessions: o.maxSessions,
      maxHandshakes: o.maxHandshakes,
      maxHandshakesPerAddress: o.maxHandshakesPerAddress,
      handshakeRatePerAddress: o.handshakeRate,
      handshakeTimeoutMs: o.handshakeTimeout * 1000,
      maxMemoryBytes: o.maxMemory * 1024 * 1024,
      quic: o.quic,
      compressLevel: o.compress ? o.compressLevel : 0,
      fsync: o.fsync,
      events: {
        listening(host, p, quicPort) {
          if (o.json) process.stdout.write(JSON.stringify({ event: 'listening', host, port: p, ...(quicPort ? { quicPort } : {}) }) + '\n');
          else process.stdout.write(`listening on ${host}:${p}\n`);
        },
        info: (m) => this.notice(m),
        session: (entry) => {
          const line = formatSessionLog(entry) + '\n';
          process.stdout.write(line);
          if (this.log !== undefined) fs.writeSync(this.log, line);
        },
      },
    });
  }

  /** The first signal gives running sessions --grace seconds; a second ends them at once. */
  private async stop(daemon: ServeDaemon, signal: string): Promise<void> {
    if (this.stopping) {
      this.notice(`${signal} again: ending the running sessions now`);
      void daemon.shutdown(0);
      return;
    }
    this.stopping = true;
    this.notice(`${signal}: no new sessions; ${daemon.sessions} running, ${this.o.grace} s to finish`);
    const r = await daemon.shutdown(this.o.grace * 1000);
    this.notice(`stopped: ${r.finished} sessions finished, ${r.aborted} ended by the shutdown`, { stopped: true, finished: r.finished, aborted: r.aborted });
    if (this.log !== undefined) fs.closeSync(this.log);
    process.stdout.write('', () => process.exit(0));
  }

  private notice(message: string, extra: Record<string, unknown> = {}): void {
    if (this.o.json) process.stdout.write(JSON.stringify({ event: 'notice', message, ...extra }) + '\n');
    if (!this.o.quiet) process.stderr.write(`ffsync-native serve: ${message}\n`);
  }
}
