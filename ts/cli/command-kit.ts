// What every command of the program shares: the lazy loader, the option parsers, the options
// common to the peer commands, and `run`, which turns a session into reported events, one
// error line and the documented exit code. (See program.ts on why modules load lazily.)
/* eslint-disable @typescript-eslint/no-require-imports -- the lazy loads program.ts describes */

import { type Command, InvalidArgumentError, Option } from 'commander';
import type { SyncSummary } from '../api/events.js';
import { ExitCode, FfsyncError } from '../utils/errors.js';
import type { Reporter } from './reporter.js';
import { flushStdio } from './stdio.js';

/**
 * Load what a command needs, when it needs it. A module that cannot load the native addon
 * throws ENATIVELOAD: that becomes one `ffsync-native: error:` line and exit 1 (a usage
 * problem: install the prebuilt package or build from source), never a stack trace.
 */
export function need<T>(load: () => T): T {
  try {
    return load();
  } catch (e) {
    const err = e as Error & { code?: string };
    if (err.code === 'ENATIVELOAD') throw new FfsyncError('ENATIVELOAD', ExitCode.USAGE, err.message.replace(/^ffsync-native: /, ''), { cause: e });
    throw e;
  }
}

export const excludeRules = () => need(() => require('./excludes.js') as typeof import('./excludes.js'));
export const fingerprints = () => need(() => require('../security/fingerprint.js') as typeof import('../security/fingerprint.js'));
export const stateDirs = () => require('../utils/state-dir.js') as typeof import('../utils/state-dir.js');
export const tcp = () => require('../transport/tcp.js') as typeof import('../transport/tcp.js');
export const pins = () => need(() => require('../security/pins.js') as typeof import('../security/pins.js'));

export interface CommonOptions {
  trust?: string;
  json?: boolean;
  quiet?: boolean;
  progress?: boolean;
  progressInterval?: number;
  stats?: boolean;
  verbose?: boolean;
  stateDir?: string;
  plaintext?: boolean;
  quic?: boolean;
  checksum?: boolean;
  timeout: number;
}

export interface TreeCli {
  exclude: string[];
  excludeFrom?: string;
  delete?: boolean;
}

export function collect(v: string, prev: string[]): string[] {
  return [...prev, v];
}

/** rsync's SIZE: a number with an optional suffix: K, M, G, T (or KiB, MiB, …) are powers
 * of 1024, KB, MB, GB, TB powers of 1000, B bytes; fractions allowed ("1.5M"). */
export function sizeArg(v: string): number {
  const m = /^(\d+(?:\.\d+)?)\s*(?:([KMGTP])(i?B)?|(B))?$/i.exec(v.trim());
  if (!m) throw new InvalidArgumentError('expected a size such as 500K, 10M, 1.5G or 1000000');
  const power = m[2] ? 'KMGTP'.indexOf(m[2].toUpperCase()) + 1 : 0;
  const base = m[3] && m[3].toUpperCase() === 'B' ? 1000 : 1024;
  const n = Math.floor(Number(m[1]) * base ** power);
  if (!Number.isSafeInteger(n)) throw new InvalidArgumentError('size too large');
  return n;
}

export function intArg(min: number, max: number) {
  return (v: string) => {
    const n = Number(v);
    if (!Number.isInteger(n) || n < min || n > max) throw new InvalidArgumentError(`expected an integer from ${min} to ${max}`);
    return n;
  };
}

export function common(cmd: Command): Command {
  return cmd
    .option('--json', 'newline-delimited JSON events on stdout (human text goes to stderr)')
    .option('-q, --quiet', 'print errors only')
    .option('--state-dir <dir>', 'state directory (identity, pins, indexes); default $FFSYNC_STATE_DIR or the per-user state dir')
    .option('--plaintext', 'plain TCP without TLS (must be given on both sides; trusted networks only)')
    .option('--quic', 'QUIC over UDP instead of TCP (TLS 1.3 built in, same identities and pins; both sides)')
    .option('--trust <fingerprint>', 'accept exactly this peer fingerprint (and pin it); needed without a TTY for a new peer')
    .option('-c, --checksum', 'ignore indexes and the size/mtime quick check; hash everything')
    .addOption(new Option('--timeout <seconds>', 'give up when the peer is silent this long (exit 30)').argParser(intArg(1, 86400)).default(60))
    .option('--progress', 'show progress: in place on a terminal (the default there), else a plain line every --progress-interval seconds')
    .option('--no-progress', 'no progress display, even on a terminal')
    .addOption(new Option('--progress-interval <seconds>', 'plain progress lines (no terminal) this often').argParser(intArg(1, 3600)).default(5))
    .option('--stats', "print rsync's transfer statistics at the end");
}

/** How long a signalled session may take to end by itself before the process ends anyway. */
const SIGNAL_GRACE_MS = 10_000;

export type RunOptions = CommonOptions & { style?: 'sync' | 'peer'; listHeader?: string; dryRun?: boolean; humanReadable?: number; itemize?: boolean };

/** Runs a command's session: reports its events, its summary (and --stats), or its error as
 * one line, and exits with the documented code. */
export async function run(o: RunOptions, body: (r: Reporter, signal: AbortSignal) => Promise<SyncSummary>): Promise<never> {
  const { createReporter, rsyncStats } = require('./reporter.js') as typeof import('./reporter.js');
  const reporter = await createReporter({
    json: Boolean(o.json),
    quiet: Boolean(o.quiet),
    style: o.style,
    progress: o.progress,
    progressIntervalMs: (o.progressInterval ?? 5) * 1000,
    verbose: o.verbose,
    stats: o.stats,
    listHeader: o.listHeader,
    dryRun: o.dryRun,
    itemize: o.itemize,
  });
  // --stats: rsync's totals on stdout after the summary (not with --json: the summary event has them).
  const after = o.stats && !o.json && !o.quiet ? (s: SyncSummary) => process.stdout.write(rsyncStats(s, o.humanReadable ?? 0, Boolean(o.dryRun))) : undefined;
  // If the event loop ever drains with the session unfinished, that is a bug: never
  // let it look like success.
  process.exitCode = ExitCode.PROTOCOL_STREAM;
  process.once('beforeExit', () => reporter.error('internal error: the session stalled with nothing left to wait for', ExitCode.PROTOCOL_STREAM));
  const signals = new SignalGuard(reporter);
  try {
    const summary = await body(reporter, signals.signal);
    reporter.summary(summary);
    after?.(summary);
    return exit(ExitCode.OK);
  } catch (e) {
    const err = e instanceof FfsyncError ? e : new FfsyncError('EINTERNAL', ExitCode.FILE_IO, String((e as Error)?.stack ?? e));
    const code = signals.signalled ? ExitCode.SIGNAL : err.exitCode;
    if (signals.forcedOut) return exit(code); // already said
    signals.forcedOut = true;
    reporter.error(signals.signalled ? `interrupted (${signals.signalled})` : err.message, code, err.summary as SyncSummary | undefined);
    return exit(code);
  } finally {
    reporter.stop();
  }
}

/** SIGINT and SIGTERM abort the session, which then ends with its documented exit code (20).
 * Should the session not end by itself (a native call that does not return), the process
 * still does after SIGNAL_GRACE_MS, or at a second signal: a signal always ends it. */
class SignalGuard {
  private readonly ac = new AbortController();
  readonly signal = this.ac.signal;
  /** The first signal's name, once one came. */
  signalled: string | undefined;
  /** The process is ending and has said why: nothing more is reported. */
  forcedOut = false;

  constructor(private readonly reporter: Reporter) {
    const onSignal = (name: NodeJS.Signals) => this.onSignal(name);
    process.on('SIGINT', onSignal);
    process.on('SIGTERM', onSignal);
  }

  private onSignal(name: NodeJS.Signals): void {
    if (this.signalled) return this.forced(name);
    this.signalled = name;
    setTimeout(() => this.forced(name), SIGNAL_GRACE_MS).unref();
    this.ac.abort();
  }

  private forced(name: NodeJS.Signals): void {
    if (this.forcedOut) return;
    this.forcedOut = true;
    this.reporter.error(`interrupted (${name})`, ExitCode.SIGNAL);
    this.reporter.stop();
    exit(ExitCode.SIGNAL);
  }
}

export function exit(code: number): never {
  // Flush stdout/stderr before exiting (pipes are async in Node); a stream never made has
  // nothing to flush, and is not made for it (./stdio.ts).
  process.exitCode = code;
  flushStdio(() => process.exit(code));
  return undefined as never;
}

/** Small synchronous commands: one error line and the documented exit code. */
export function admin(body: () => void): void {
  try {
    body();
  } catch (e) {
    const err = e instanceof FfsyncError ? e : new FfsyncError('EINTERNAL', ExitCode.FILE_IO, String((e as Error)?.message ?? e));
    process.stderr.write(`ffsync-native: error: ${err.message}\n`);
    process.exit(err.exitCode);
  }
}
