#!/usr/bin/env node
// ffsync-native command line: parses options, wires a reporter, calls the library API,
// and maps errors to the exit codes documented in README.md.

import { Command, CommanderError, InvalidArgumentError, Option } from 'commander';
import { receive } from '../api/receive.js';
import { send } from '../api/send.js';
import type { SyncSummary } from '../api/events.js';
import { parseHostPort } from '../transport/tcp.js';
import { ExitCode, FfsyncError } from '../utils/errors.js';
import { VERSION } from '../utils/version.js';
import { createReporter, type Reporter } from './reporter.js';

interface CommonOptions {
  json?: boolean;
  quiet?: boolean;
  stateDir?: string;
  plaintext?: boolean;
  checksum?: boolean;
  timeout: number;
}

function intArg(min: number, max: number) {
  return (v: string) => {
    const n = Number(v);
    if (!Number.isInteger(n) || n < min || n > max) throw new InvalidArgumentError(`expected an integer from ${min} to ${max}`);
    return n;
  };
}

function common(cmd: Command): Command {
  return cmd
    .option('--json', 'newline-delimited JSON events on stdout (human text goes to stderr)')
    .option('-q, --quiet', 'print errors only')
    .option('--state-dir <dir>', 'state directory (identity, pins, indexes); default $FFSYNC_STATE_DIR or the per-user state dir')
    .option('--plaintext', 'plain TCP without TLS (must be given on both sides)')
    .option('-c, --checksum', 'ignore indexes and the size/mtime quick check; hash everything')
    .addOption(new Option('--timeout <seconds>', 'give up when the peer is silent this long (exit 30)').argParser(intArg(1, 86400)).default(60));
}

/** TLS with fingerprint pinning is the default transport; until it lands, refuse clearly. */
function requirePlaintext(o: CommonOptions): void {
  if (!o.plaintext) {
    throw new FfsyncError(
      'ENOTLS',
      ExitCode.USAGE,
      'TLS transport is not available in this build yet; pass --plaintext on both sides (trusted networks only)',
    );
  }
}

async function run(reporterOpts: CommonOptions, body: (r: Reporter, signal: AbortSignal) => Promise<SyncSummary>): Promise<never> {
  const reporter = await createReporter({ json: Boolean(reporterOpts.json), quiet: Boolean(reporterOpts.quiet) });
  // If the event loop ever drains with the session unfinished, that is a bug: never
  // let it look like success.
  process.exitCode = ExitCode.PROTOCOL_STREAM;
  process.once('beforeExit', () => reporter.error('internal error: the session stalled with nothing left to wait for', ExitCode.PROTOCOL_STREAM));
  const ac = new AbortController();
  let signalled = false;
  const onSignal = () => {
    signalled = true;
    ac.abort();
  };
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  try {
    const summary = await body(reporter, ac.signal);
    reporter.summary(summary);
    return exit(ExitCode.OK);
  } catch (e) {
    const err = e instanceof FfsyncError ? e : new FfsyncError('EINTERNAL', ExitCode.FILE_IO, String((e as Error)?.stack ?? e));
    const code = signalled ? ExitCode.SIGNAL : err.exitCode;
    reporter.error(signalled ? `interrupted by signal (${err.message})` : err.message, code, err.summary as SyncSummary | undefined);
    return exit(code);
  } finally {
    reporter.stop();
  }
}

function exit(code: number): never {
  // Flush stdout/stderr before exiting (pipes are async in Node).
  process.exitCode = code;
  process.stdout.write('', () => process.stderr.write('', () => process.exit(code)));
  return undefined as never;
}

export function buildProgram(): Command {
  const program = new Command('ffsync-native')
    .description('File sync that moves the difference, not the file.')
    .version(VERSION, '-V, --version')
    .showHelpAfterError()
    .exitOverride();

  common(
    program
      .command('receive')
      .description('receive one file into <path> (one session, then exit); port 0 picks a free port')
      .argument('<path>', 'file to converge toward the sender\'s')
      .argument('<port>', 'TCP port to listen on', intArg(0, 65535)),
  )
    .option('--bind <address>', 'address to listen on', '0.0.0.0')
    .option('--from <file...>', 'also reuse chunks of these local files')
    .action(async (target: string, port: number, o: CommonOptions & { bind: string; from?: string[] }) => {
      await run(o, async (events, signal) => {
        requirePlaintext(o);
        return receive({ path: target, host: o.bind, port, from: o.from, checksum: o.checksum, stateDir: o.stateDir, timeoutMs: o.timeout * 1000, events, signal });
      });
    });

  common(
    program
      .command('send')
      .description('push the file at <path> to a receiver')
      .argument('<path>', 'file to send')
      .argument('<host:port>', 'receiver address'),
  )
    .addOption(new Option('--compress-level <n>', 'zstd level for chunk data').argParser(intArg(1, 19)).default(1))
    .option('--no-compress', 'send chunk data uncompressed')
    .addOption(new Option('--bwlimit <KiBps>', 'limit chunk data to this many KiB per second').argParser(intArg(1, 2 ** 31)))
    .action(async (source: string, addr: string, o: CommonOptions & { compressLevel: number; compress: boolean; bwlimit?: number }) => {
      await run(o, async (events, signal) => {
        const { host, port } = parseHostPort(addr);
        requirePlaintext(o);
        return send({
          path: source,
          host,
          port,
          checksum: o.checksum,
          compressLevel: o.compress ? o.compressLevel : 0,
          stateDir: o.stateDir,
          timeoutMs: o.timeout * 1000,
          bwlimitKiBps: o.bwlimit,
          events,
          signal,
        });
      });
    });
  return program;
}

async function main(): Promise<void> {
  const program = buildProgram();
  try {
    await program.parseAsync(process.argv);
  } catch (e) {
    if (e instanceof CommanderError) {
      // --help / --version exit 0; every usage error exits 1 (rsync's "syntax or usage").
      process.exit(e.exitCode === 0 ? 0 : ExitCode.USAGE);
    }
    throw e;
  }
}

void main();
