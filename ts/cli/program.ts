// ffsync-native command line (loaded by ./main.ts): parses options, wires a reporter, calls the library API,
// and maps errors to the exit codes documented in docs/cli.md ("Exit codes").
//
// Start-up: this module loads only commander and a few small modules. Everything a command
// needs (the native addon, TLS, QUIC, the serve daemon, ssh, the reporter) is required by
// that command's action, so `--version` and `--help` load none of it and a local `sync`
// loads no TLS, QUIC or serve code (bench/startup.ts measures it; __test__/startup.test.ts
// checks what `--version` and `--help` load). Lazy `require`, not `import()`: in this
// CommonJS build `import()` boots Node's ESM loader first (about 7 ms on Node 20). The build
// bundles dist/cli/main.js into one file (`npm run bundle:cli`, esbuild), which saves the
// per-file cost of ~40 modules; a bundled module still runs only when first required.
/* eslint-disable @typescript-eslint/no-require-imports -- the lazy loads described above */

import { Argument, Command, CommanderError, InvalidArgumentError, Option } from 'commander';
import type { SyncSummary } from '../api/events.js';
import { ExitCode, FfsyncError } from '../utils/errors.js';
import { VERSION } from '../utils/version.js';
import type { Reporter } from './reporter.js';
import { serveCommand } from './serve.js';
import { oneLineUsageErrors } from './usage-errors.js';

/**
 * Load what a command needs, when it needs it. A module that cannot load the native addon
 * throws ENATIVELOAD: that becomes one `ffsync-native: error:` line and exit 1 (a usage
 * problem: install the prebuilt package or build from source), never a stack trace.
 */
function need<T>(load: () => T): T {
  try {
    return load();
  } catch (e) {
    const err = e as Error & { code?: string };
    if (err.code === 'ENATIVELOAD') throw new FfsyncError('ENATIVELOAD', ExitCode.USAGE, err.message.replace(/^ffsync-native: /, ''), { cause: e });
    throw e;
  }
}

const excludeRules = () => need(() => require('./excludes.js') as typeof import('./excludes.js'));
const fingerprints = () => need(() => require('../security/fingerprint.js') as typeof import('../security/fingerprint.js'));
const stateDirs = () => require('../utils/state-dir.js') as typeof import('../utils/state-dir.js');
const tcp = () => require('../transport/tcp.js') as typeof import('../transport/tcp.js');
const pins = () => need(() => require('../security/pins.js') as typeof import('../security/pins.js'));

interface CommonOptions {
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

interface TreeCli {
  exclude: string[];
  excludeFrom?: string;
  delete?: boolean;
}

function collect(v: string, prev: string[]): string[] {
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

async function run(
  reporterOpts: CommonOptions & { style?: 'sync' | 'peer'; listHeader?: string; dryRun?: boolean; humanReadable?: number; itemize?: boolean },
  body: (r: Reporter, signal: AbortSignal) => Promise<SyncSummary>,
): Promise<never> {
  const { createReporter, rsyncStats } = require('./reporter.js') as typeof import('./reporter.js');
  const o = reporterOpts;
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
  const ac = new AbortController();
  let signalled: string | undefined;
  // A signal aborts the session, which then ends with its documented exit code (20). Should
  // the session not end by itself (a native call that does not return), the process still
  // does after SIGNAL_GRACE_MS, or at a second signal: a signal always ends it.
  let forcedOut = false;
  const forced = (name: NodeJS.Signals) => {
    if (forcedOut) return;
    forcedOut = true;
    reporter.error(`interrupted (${name})`, ExitCode.SIGNAL);
    reporter.stop();
    exit(ExitCode.SIGNAL);
  };
  const onSignal = (name: NodeJS.Signals) => {
    if (signalled) return forced(name);
    signalled = name;
    setTimeout(() => forced(name), SIGNAL_GRACE_MS).unref();
    ac.abort();
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);
  try {
    const summary = await body(reporter, ac.signal);
    reporter.summary(summary);
    after?.(summary);
    return exit(ExitCode.OK);
  } catch (e) {
    const err = e instanceof FfsyncError ? e : new FfsyncError('EINTERNAL', ExitCode.FILE_IO, String((e as Error)?.stack ?? e));
    const code = signalled ? ExitCode.SIGNAL : err.exitCode;
    if (forcedOut) return exit(code); // already said
    forcedOut = true;
    reporter.error(signalled ? `interrupted (${signalled})` : err.message, code, err.summary as SyncSummary | undefined);
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
    .exitOverride();

  addReceive(program);
  addSend(program);
  addPull(program);
  serveCommand(program, intArg, need);
  addSync(program);
  addServer(program);
  addIdentityCommands(program);
  addCompletion(program);

  oneLineUsageErrors(program);
  return program;
}

/** Whether rsync's --chown USER:GROUP names a user (part 0) or a group (part 1). */
function chownPart(spec: string | undefined, part: 0 | 1): boolean {
  if (spec === undefined) return false;
  const [user, group = ''] = spec.split(':');
  return (part === 0 ? user : group) !== '';
}

/** A pattern file as rsync reads one for --include-from: one pattern per line; blank lines and
 * lines starting with '#' or ';' are skipped. Read when the option is parsed, so its patterns
 * take their place among the other rules. */
function patternFile(file: string): string[] {
  let text: string;
  try {
    text = require('node:fs').readFileSync(file, 'utf8') as string;
  } catch (e) {
    throw new InvalidArgumentError(`cannot read ${file}: ${(e as NodeJS.ErrnoException).code ?? e}`);
  }
  return text
    .split(/\r?\n/)
    .map((l) => l.trim())
    .filter((l) => l !== '' && !l.startsWith('#') && !l.startsWith(';'));
}

/** `sync`'s options as commander hands them over (attribute names of the flags above). */
interface SyncFlags {
  archive?: boolean;
  owner?: boolean;
  group?: boolean;
  xattrs?: boolean;
  numericIds?: boolean;
  recursive?: boolean;
  copyLinks?: boolean;
  links?: boolean;
  perms?: boolean;
  times?: boolean;
  verbose?: boolean;
  mkpath?: boolean;
  logFile?: string;
  pruneEmptyDirs?: boolean;
  deleteExcluded?: boolean;
  maxDelete?: number;
  backup?: boolean;
  suffix?: string;
  backupDir?: string;
  partialDir?: string;
  removeSourceFiles?: boolean;
  chmod?: string;
  ipv4?: boolean;
  ipv6?: boolean;
  contimeout?: number;
  sizeOnly?: boolean;
  ignoreExisting?: boolean;
  existing?: boolean;
  itemizeChanges?: boolean;
  /** -h given this many times. */
  humanReadable: number;
  quiet?: boolean;
  dryRun?: boolean;
  inplace?: boolean;
  /** False with --no-fsync. */
  fsync: boolean;
  compressLevel?: number;
  checksum?: boolean;
  update?: boolean;
  wholeFile?: boolean;
  oneFileSystem?: boolean;
  delete?: boolean;
  deleteAfter?: boolean;
  deleteDelay?: boolean;
  deleteBefore?: boolean;
  deleteDuring?: boolean;
  chown?: string;
  filesFrom?: string;
  from0?: boolean;
  excludeFrom?: string;
  bwlimit?: number;
  progress?: boolean;
  progressInterval: number;
  info?: Set<string>;
  partial?: boolean;
  P?: boolean;
  stats?: boolean;
  rsh?: string;
  remoteCmd?: string;
  quic?: boolean;
  maxSize?: number;
  minSize?: number;
  jobs?: number;
  json?: boolean;
  stateDir?: string;
  timeout: number;
}

/** rsync's --info flags this tool understands (`progress2`, `stats2`…; comma-separated, as
 * rsync takes them); anything else is refused by name. */
function infoArg(v: string, prev?: Set<string>): Set<string> {
  const out = new Set(prev);
  for (const flag of v.split(',').filter(Boolean)) {
    const m = /^(progress|stats)([0-3]?)$/i.exec(flag);
    if (!m) throw new InvalidArgumentError(`--info=${flag} is not supported (supported: progress2, stats)`);
    if (m[2] !== '0') out.add(m[1]!.toLowerCase());
  }
  return out;
}

/** Small synchronous commands: one error line and the documented exit code. */
function admin(body: () => void): void {
  try {
    body();
  } catch (e) {
    const err = e instanceof FfsyncError ? e : new FfsyncError('EINTERNAL', ExitCode.FILE_IO, String((e as Error)?.message ?? e));
    process.stderr.write(`ffsync-native: error: ${err.message}\n`);
    process.exit(err.exitCode);
  }
}

export async function main(): Promise<void> {
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


/** `receive <path> <port>`: one session, then exit. */
function addReceive(program: Command): void {
  common(
    program
      .command('receive')
      .description('receive a file or a directory tree into <path> (one session, then exit); port 0 picks a free port')
      .argument('<path>', 'file or directory to converge toward the sender\'s')
      .argument('<port>', 'TCP port to listen on', intArg(0, 65535)),
  )
    .option('--bind <address>', 'address to listen on', '0.0.0.0')
    .option('--from <file...>', 'also reuse chunks of these local files')
    .option('--exclude <pattern>', 'trees: protect matching paths from deletion (repeatable)', collect, [])
    .option('--exclude-from <file>', 'trees: read protect patterns from a file (one per line, # comments)')
    .option('--no-delete', 'trees: keep files only this side has, whatever the sender asks')
    .option('--inplace', 'update files in place: write only changed ranges into the target (crash-safe redo journal; see docs/cli.md)')
    .option('--no-fsync', 'do not fsync received files before renaming them into place (rsync\'s default: no waiting for the disk, but a crash soon after may lose or truncate them; every file is still verified)')
    .option('--pair', 'offer a one-time pairing code for a new sender even though peers are pinned (without pins, one is offered anyway)')
    .option('--no-pair', 'offer no pairing code (only pinned or --trust senders get in)')
    .action(async (target: string, port: number, o: CommonOptions & TreeCli & { bind: string; from?: string[]; inplace?: boolean; fsync: boolean; pair?: boolean }) => {
      await run(o, async (events, signal) => {
        const { receive } = need(() => require('../api/receive.js') as typeof import('../api/receive.js'));
        if (o.trust) fingerprints().parseFingerprint(o.trust);
        const protect = await excludeRules().loadExcludes(o.exclude, o.excludeFrom);
        return receive({
          path: target,
          host: o.bind,
          port,
          from: o.from,
          inplace: o.inplace,
          fsync: o.fsync,
          tree: { protect, noDelete: o.delete === false },
          checksum: o.checksum,
          stateDir: o.stateDir,
          timeoutMs: o.timeout * 1000,
          plaintext: o.plaintext,
          quic: o.quic,
          trust: o.trust,
          pair: o.pair,
          interactive: true,
          events,
          signal,
        });
      });
    });
}

/** `send <path> <host:port>`: push to a receiver or a serve daemon. */
function addSend(program: Command): void {
  common(
    program
      .command('send')
      .description('push the file or directory tree at <path> to a receiver (`dir` and `dir/` mean the same)')
      .argument('<path>', 'file or directory to send')
      .argument('<host:port>', 'receiver address; host:port/some/path for a path under a serve daemon\'s root'),
  )
    .addOption(new Option('--compress-level <n>', 'zstd level for chunk data (default: adapted to the link, from 1)').argParser(intArg(1, 19)))
    .option('--no-compress', 'send chunk data uncompressed')
    .addOption(new Option('--bwlimit <KiBps>', 'limit chunk data to this many KiB per second').argParser(intArg(1, 2 ** 31)))
    .option('--exclude <pattern>', 'trees: skip matching paths on both sides (repeatable; rules in docs/cli.md)', collect, [])
    .option('--exclude-from <file>', 'trees: read exclude patterns from a file (one per line, # comments)')
    .option('--no-delete', 'trees: keep files only the receiver has')
    .option('-n, --dry-run', 'trees: both sides report what would change; nothing is written')
    .option('-v, --verbose', 'trees: list what changes')
    .addOption(new Option('--parallel <K>', 'trees: spread large files over K connections (QUIC: K streams, default 16)').argParser(intArg(1, 16)))
    .addOption(new Option('--max-size <SIZE>', "trees: leave files larger than SIZE alone (rsync's rules; e.g. 100M)").argParser(sizeArg))
    .addOption(new Option('--min-size <SIZE>', 'trees: leave files smaller than SIZE alone').argParser(sizeArg))
    .option('--no-overlap', 'scan a large file completely before sending its manifest (default: stream it while hashing, so the receiver starts early)')
    .option('--pair <code>', 'first contact: the one-time code the receiver printed (e.g. 7-amber-orbit); both sides pin each other')
    .action(async (source: string, addr: string, o: CommonOptions & TreeCli & { compressLevel: number; compress: boolean; bwlimit?: number; dryRun?: boolean; parallel?: number; maxSize?: number; minSize?: number; overlap: boolean; pair?: string }) => {
      await run(o, async (events, signal) => {
        const { send } = need(() => require('../api/send.js') as typeof import('../api/send.js'));
        const { host, port, path: remotePath } = tcp().parseRemote(addr);
        if (o.trust) fingerprints().parseFingerprint(o.trust);
        const excludes = await excludeRules().loadExcludes(o.exclude, o.excludeFrom);
        return send({
          path: source,
          host,
          port,
          remotePath,
          checksum: o.checksum,
          compressLevel: o.compress ? o.compressLevel : 0,
          stateDir: o.stateDir,
          timeoutMs: o.timeout * 1000,
          bwlimitKiBps: o.bwlimit,
          tree: { excludes, noDelete: o.delete === false, dryRun: o.dryRun, verbose: o.verbose, parallel: o.parallel, maxSize: o.maxSize, minSize: o.minSize },
          plaintext: o.plaintext,
          quic: o.quic,
          trust: o.trust,
          interactive: true,
          events,
          signal,
          overlap: o.overlap,
          pair: o.pair,
        });
      });
    });
}

/** `pull <host:port/path> <local>`: fetch from a serve daemon. */
function addPull(program: Command): void {
  common(
    program
      .command('pull')
      .description("fetch a file or directory tree from a serve daemon into <local> (a file lands inside <local> if that is a directory)")
      .argument('<host:port/path>', 'daemon address and the path under its root')
      .argument('<local>', 'where it lands'),
  )
    .option('--exclude <pattern>', 'trees: protect matching local paths from deletion (repeatable)', collect, [])
    .option('--exclude-from <file>', 'trees: read protect patterns from a file (one per line, # comments)')
    .option('--no-delete', 'trees: keep files only this side has')
    .option('--no-fsync', 'do not fsync received files before renaming them into place (rsync\'s default: no waiting for the disk, but a crash soon after may lose or truncate them; every file is still verified)')
    .action(async (addr: string, local: string, o: CommonOptions & TreeCli & { fsync: boolean }) => {
      await run(o, async (events, signal) => {
        const { pull } = need(() => require('../api/pull.js') as typeof import('../api/pull.js'));
        const { host, port, path: remotePath } = tcp().parseRemote(addr);
        if (remotePath === undefined) throw new FfsyncError('EUSAGE', ExitCode.USAGE, `pull needs a path under the daemon's root: ${addr}/some/path`);
        if (o.plaintext) throw new FfsyncError('EUSAGE', ExitCode.USAGE, 'serve daemons authorize clients by certificate: pull has no --plaintext');
        if (o.trust) fingerprints().parseFingerprint(o.trust);
        const protect = await excludeRules().loadExcludes(o.exclude, o.excludeFrom);
        return pull({
          host,
          port,
          remotePath,
          local,
          checksum: o.checksum,
          stateDir: o.stateDir,
          timeoutMs: o.timeout * 1000,
          quic: o.quic,
          trust: o.trust,
          interactive: true,
          tree: { protect, noDelete: o.delete === false },
          fsync: o.fsync,
          events,
          signal,
        });
      });
    });
}

/** `sync [rsync-style options] SRC DEST`: rsync's front door, local or over ssh. */
function addSync(program: Command): void {
  // rsync's front door. Options rsync users type that we do not implement are refused
  // loudly (exit 1), never silently accepted.
  // One ordered list for --exclude, --include, --include-from, --filter, -F (and -C, last).
  const filterRules = () => require('./filter-rules.js') as typeof import('./filter-rules.js');
  const ruleList: import('./filter-rules.js').RuleList = { rules: [], dirMerge: [], cvs: false };
  const both = (pattern: string) => (ruleList.rules.push({ side: 'both', pattern }), ruleList);
  let dashF = 0;
  // rsync options people reach for that this version does not implement yet: each is refused
  // by name (exit 1) rather than reported as unknown, or worse, ignored. Keys are commander's
  // attribute names.
  const notSupported: [string, string][] = [
    ['-H, --hard-links', 'hardLinks'],
    ['-A, --acls', 'acls'],
  ];
  const syncCmd = program
    .command('sync')
    .description('rsync-style: SRC and DEST are local paths or [user@]host:path (ssh); `src/` copies the contents, `src` the directory itself')
    .argument('<SRC>')
    .argument('<DEST>')
    .option('-a, --archive', 'archive mode: recursive, symlinks, permissions, times, group, owner (-rlptgo)')
    .option('-o, --owner', 'preserve owner (takes effect when the receiving side runs as root)')
    .option('-g, --group', 'preserve group')
    .option('-X, --xattrs', 'preserve extended attributes (user.*; trusted.* as root)')
    .option('--numeric-ids', "don't map uid/gid values by user/group name")
    .option('-r, --recursive', 'recurse into directories')
    // The letters of -a besides -r, -g, -o: each one's absence means what it means in rsync.
    .option('-L, --copy-links', 'transform symlinks into what they point to (files and directories; a dangling one is an error, exit 23)')
    .option('-l, --links', 'copy symlinks as symlinks (without it, as in rsync, they are skipped with a notice)')
    .option('-p, --perms', 'preserve permissions (without it, existing files keep theirs and new ones get the source\'s minus the umask)')
    .option('-t, --times', 'preserve modification times (without it, files get the time they were written)')
    .option('-D', 'same as --devices --specials: device and special files are skipped with a notice, as with -a')
    .option('--devices', 'device files: skipped with a notice, as with -a')
    .option('--specials', 'special files (sockets, FIFOs): skipped with a notice, as with -a')
    .option('-v, --verbose', 'list what changes')
    .option('--mkpath', "create the destination's missing path components")
    .option('--log-file <FILE>', "append what happened to FILE, as rsync's --log-file does (itemized changes of a tree, then the totals)")
    .option('-m, --prune-empty-dirs', 'leave directories with no file below them (after the excludes) off the list')
    .option('--delete-excluded', 'also delete excluded files on the receiving side (implies --delete)')
    .addOption(new Option('--max-delete <NUM>', "don't delete more than NUM files and directories (with --delete; the rest stay, exit 25)").argParser(intArg(0, 2 ** 31 - 1)))
    .option('-b, --backup', "the receiving side keeps what a file replaces or a deletion removes, as name~ (see --suffix, --backup-dir)")
    .option('--suffix <SUFFIX>', 'backup suffix (default ~, or none with --backup-dir)')
    .option('--backup-dir <DIR>', 'keep backups under DIR (relative to DEST unless absolute), same relative paths; implies -b')
    .option('--partial-dir <DIR>', 'a partial file kept for a resume waits in DIR (one name: beside each file, excluded from the transfer; absolute: one for all)')
    .option('--remove-source-files', 'sender removes the files (not directories) that are now on the receiving side, once every file is synced')
    .option('--chmod <CHMOD>', "change the modes sent, as rsync does (e.g. Du=rwx,Dgo=rx,Fu=rw,Fgo=r; repeatable)", (v: string, prev?: string) => (prev ? `${prev},${v}` : v))
    .option('-4, --ipv4', 'prefer IPv4 (passed to ssh)')
    .option('-6, --ipv6', 'prefer IPv6 (passed to ssh)')
    .addOption(new Option('--contimeout <SECONDS>', "give up connecting after this long (ssh's ConnectTimeout)").argParser(intArg(1, 86400)))
    .option('--size-only', 'skip files that match in size (their content is not compared)')
    .option('--ignore-existing', 'skip updating files that exist on the receiving side')
    .option('--existing', 'skip creating new files on the receiving side (only update what is there)')
    .option('-i, --itemize-changes', "list changes in rsync's itemized format (YXcstpoguax, e.g. >f.st...... name)")
    .option('-h, --human-readable', 'numbers in --stats in units (K, M, G of 1000; -hh: of 1024), as rsync\'s -h', (_: unknown, level: number) => level + 1, 0)
    .option('-q, --quiet', 'print errors only')
    .option('-n, --dry-run', 'show what would change; write nothing')
    .option('-z, --compress', 'compress data (always on: zstd where it pays)')
    .option('-S, --sparse', "keep holes (always on: the sender's holes, found with SEEK_HOLE/SEEK_DATA, are recreated)")
    .option('--inplace', 'update files in place: write only changed ranges into the target (crash-safe redo journal; see docs/cli.md)')
    .option('--no-fsync', 'do not fsync received files before renaming them into place (rsync\'s default: no waiting for the disk, but a crash soon after may lose or truncate them; every file is still verified)')
    .option('--fsync', 'fsync each received file before its rename (the default; accepted as rsync spells it)')
    .addOption(new Option('--compress-level <n>', 'zstd level for data').argParser(intArg(0, 19)))
    .option('-c, --checksum', 'compare content, not size and mtime')
    .option('-u, --update', 'skip files that are newer on the receiver')
    .option('-W, --whole-file', 'send changed files whole (no delta against the old version)')
    .option('-x, --one-file-system', "don't cross filesystem boundaries")
    .option('--delete', 'delete files only DEST has')
    .option('--delete-after', 'the same as --delete: deletions always happen after every transfer succeeded')
    .option('--delete-delay', 'the same as --delete-after')
    .option('--delete-before', 'the same as --delete-after (the final tree is the same; deleting last is what keeps a failed run from losing files)')
    .option('--delete-during', 'the same as --delete-after (idem)')
    .option('--exclude <pattern>', 'exclude matching paths (repeatable; rules in docs/cli.md)', (v: string) => both(v))
    .option('--include <pattern>', 're-include matching paths (first matching rule wins)', (v: string) => both(`!${v}`))
    .option('--chown <USER:GROUP>', 'trees: give every entry this owner and/or group on the receiving side (implies -o and/or -g; an owner only as root)')
    .option('--files-from <FILE>', "sync only the paths listed in FILE (`-`: stdin), relative to SRC, with the directories on the way; -a does not imply -r here, as in rsync")
    .option('-0, --from0', '--files-from names are separated by NUL bytes, not lines')
    .option('-f, --filter <RULE>', "rsync's filter rules: - + (both sides), H S (sender), P R (receiver), ! (clear), . FILE (merge), : NAME (per-directory merge file)", (v: string) => (filterRules().addFilterRule(ruleList, v), ruleList))
    .option('-F', "same as --filter=': /.rsync-filter'; given twice, also --filter='- .rsync-filter'", () => (filterRules().addDashF(ruleList, ++dashF), dashF))
    .option('-C, --cvs-exclude', "ignore files as CVS does (rsync's list, ~/.cvsignore, $CVSIGNORE, each directory's .cvsignore)", () => ((ruleList.cvs = true), true))
    .option('--exclude-from <file>', 'read exclude patterns from a file')
    .option('--include-from <file>', 're-include the patterns of a file (one per line, # comments), in the rules\' order', (f: string) => (patternFile(f).forEach((p) => both(`!${p}`)), ruleList))
    .addOption(new Option('--bwlimit <KiBps>', 'limit data to this many KiB per second').argParser(intArg(1, 2 ** 31)))
    .option('--progress', 'show progress: in place on a terminal, else a plain line every --progress-interval seconds')
    .addOption(new Option('--progress-interval <seconds>', 'plain progress lines (no terminal) this often').argParser(intArg(1, 3600)).default(5))
    .addOption(new Option('--info <FLAGS>', "rsync's --info: progress2 (or progress1) shows progress, stats (stats1..3) prints the totals; other flags are refused").argParser(infoArg))
    .option('--partial', 'keep partially transferred files (always on: a rerun resumes them)')
    .option('-P', 'same as --partial --progress')
    .option('--stats', "print rsync's transfer statistics at the end")
    .option('-e, --rsh <command>', 'remote shell to use (default ssh)')
    .option('--remote-cmd <command>', 'program to run on the remote side (default ffsync-native on its PATH)')
    .option('--quic', 'push/pull: ssh starts the remote peer and vouches for both identities; the data moves over QUIC (UDP)')
    .addOption(new Option('--max-size <SIZE>', "don't transfer files larger than SIZE (K, M, G = 1024-based; KB, MB, GB = 1000)").argParser(sizeArg))
    .addOption(new Option('--min-size <SIZE>', "don't transfer files smaller than SIZE").argParser(sizeArg))
    .addOption(new Option('--jobs <n>', 'trees: large files in flight at once (local default 4; --quic streams, default 16)').argParser(intArg(1, 16)))
    .option('--json', 'newline-delimited JSON events on stdout')
    .option('--state-dir <dir>', 'state directory (indexes)')
    .addOption(new Option('--timeout <seconds>', 'give up when the peer is silent this long (exit 30)').argParser(intArg(1, 86400)).default(60));
  // Refused when given, but not advertised: --help and the completion scripts list what works.
  for (const [flags] of notSupported) syncCmd.addOption(new Option(flags, 'not supported (refused with exit 1)').hideHelp());
  // -h is rsync's --human-readable here, as rsync users type it (`-avh`); help is --help only.
  syncCmd.helpOption('--help', 'display help for command');
  syncCmd.action(async (src: string, dest: string, o: SyncFlags) => {
    for (const [flags, key] of notSupported) {
      if ((o as unknown as Record<string, unknown>)[key] !== undefined) {
        process.stderr.write(`ffsync-native: error: ${flags.split(' <')[0]} is not supported by this version of ffsync-native\n`);
        process.exit(ExitCode.USAGE);
      }
    }
    const { parseLocation } = need(() => require('../api/sync.js') as typeof import('../api/sync.js'));
    const info = o.info ?? new Set<string>();
    await run(
      {
        json: o.json,
        quiet: o.quiet,
        timeout: o.timeout,
        style: 'sync',
        verbose: o.verbose,
        stats: Boolean(o.stats || info.has('stats')),
        progress: o.progress || o.P || info.has('progress') ? true : undefined,
        progressInterval: o.progressInterval,
        humanReadable: o.humanReadable,
        dryRun: o.dryRun,
        itemize: o.itemizeChanges,
        listHeader: parseLocation(src).host ? 'receiving incremental file list' : 'sending incremental file list',
      },
      async (events, signal) => {
        const { sync } = need(() => require('../api/sync.js') as typeof import('../api/sync.js'));
        const { AttrFlag } = require('../protocol/messages.js') as typeof import('../protocol/messages.js');
        const lists = filterRules().finishRules(ruleList);
        const excludes = await excludeRules().loadExcludes(lists.sender, o.excludeFrom);
        // --exclude-from's patterns (read once) close both lists.
        const wireExcludes = await excludeRules().loadExcludes([...lists.receiver, ...excludes.slice(lists.sender.length)]);
        const log = o.logFile ? (require('./log-file.js') as typeof import('./log-file.js')).openLogFile(o.logFile) : undefined;
        const running = sync({
          logLine: log?.line,
          src,
          dest,
          recursive: Boolean(o.archive || o.recursive),
          delete: Boolean(o.delete || o.deleteAfter || o.deleteDelay || o.deleteBefore || o.deleteDuring || o.deleteExcluded),
          deleteExcluded: o.deleteExcluded,
          chmod: o.chmod,
          pruneEmptyDirs: o.pruneEmptyDirs,
          removeSourceFiles: o.removeSourceFiles,
          copyLinks: o.copyLinks,
          maxDelete: o.maxDelete,
          backup: o.backup,
          suffix: o.suffix,
          backupDir: o.backupDir,
          // rsync: RSYNC_PARTIAL_DIR is the partial directory of --partial (and -P) unless --partial-dir names one.
          partialDir: o.partialDir ?? ((o.partial || o.P) && process.env.RSYNC_PARTIAL_DIR ? process.env.RSYNC_PARTIAL_DIR : undefined),
          excludes,
          wireExcludes: wireExcludes.join('\n') === excludes.join('\n') ? undefined : wireExcludes,
          dirMerge: lists.dirMerge.length ? lists.dirMerge : undefined,
          filesFrom: o.filesFrom !== undefined ? (require('./files-from.js') as typeof import('./files-from.js')).readFilesFrom(o.filesFrom, Boolean(o.from0)) : undefined,
          filesFromRecursive: Boolean(o.recursive),
          dryRun: o.dryRun,
          checksum: o.checksum,
          compressLevel: o.compressLevel,
          bwlimitKiBps: o.bwlimit,
          verbose: o.verbose,
          itemize: o.itemizeChanges,
          update: o.update,
          wholeFile: o.wholeFile,
          oneFileSystem: o.oneFileSystem,
          rsh: o.rsh,
          remoteCmd: o.remoteCmd,
          quic: o.quic,
          jobs: o.jobs,
          maxSize: o.maxSize,
          minSize: o.minSize,
          inplace: o.inplace,
          fsync: o.fsync,
          omit: { links: !(o.archive || o.links), times: !(o.archive || o.times), perms: !(o.archive || o.perms) },
          choices: { sizeOnly: o.sizeOnly, ignoreExisting: o.ignoreExisting, existingOnly: o.existing },
          mkpath: o.mkpath,
          ipFamily: o.ipv6 ? 6 : o.ipv4 ? 4 : undefined,
          contimeoutS: o.contimeout,
          chown: o.chown,
          // --chown implies -o for its user part and -g for its group part, as in rsync.
          attrs: (o.archive || o.owner || chownPart(o.chown, 0) ? AttrFlag.OWNER : 0) | (o.archive || o.group || chownPart(o.chown, 1) ? AttrFlag.GROUP : 0) | (o.xattrs ? AttrFlag.XATTRS : 0) | (o.numericIds ? AttrFlag.NUMERIC_IDS : 0),
          stateDir: o.stateDir,
          timeoutMs: o.timeout * 1000,
          events,
          signal,
        });
        try {
          const summary = await running;
          log?.end(summary, Boolean(o.verbose));
          return summary;
        } catch (e) {
          log?.end((e as FfsyncError).summary as SyncSummary | undefined, Boolean(o.verbose), (e as Error).message);
          throw e;
        }
      },
    );
  });
}

/** `server`, hidden: the remote end of `sync` over ssh. */
function addServer(program: Command): void {
  // The remote end of `sync` over ssh (not for direct use): one session on stdin/stdout. Its
  // arguments are read by the same table that writes them (ts/api/server-args.ts).
  program
    .command('server', { hidden: true })
    .helpOption(false)
    .allowUnknownOption()
    .allowExcessArguments()
    .argument('[args...]')
    .action(async (args: string[]) => {
      await run({ quiet: true, timeout: 60 } as CommonOptions, async (events) => {
        const { parseServerArgs } = need(() => require('../api/server-args.js') as typeof import('../api/server-args.js'));
        const o = parseServerArgs(args);
        const { serveStdio } = need(() => require('../api/sync.js') as typeof import('../api/sync.js'));
        return serveStdio({ ...o, events });
      });
    });
}

/** `id`, `trust`, `untrust`, `fingerprints`: this peer's identity and its pins. */
function addIdentityCommands(program: Command): void {
  program
    .command('id')
    .description("print this peer's certificate fingerprint (creates the identity on first use)")
    .option('--state-dir <dir>', 'state directory')
    .option('--rotate', 'replace the identity with a new one (peers must pin the new fingerprint)')
    .action((o: { stateDir?: string; rotate?: boolean }) =>
      admin(() => {
        const { loadOrCreateIdentity } = need(() => require('../security/identity.js') as typeof import('../security/identity.js'));
        const id = loadOrCreateIdentity(stateDirs().resolveStateDir(o.stateDir), { rotate: o.rotate });
        process.stdout.write(`${id.fingerprint}\n`);
      }),
    );

  program
    .command('trust')
    .description('pin a peer fingerprint (as printed by `ffsync-native id` on the peer)')
    .argument('<fingerprint>')
    .argument('[note...]', 'free text kept next to the pin, e.g. the peer\'s name')
    .option('--state-dir <dir>', 'state directory')
    .action((fp: string, note: string[], o: { stateDir?: string }) =>
      admin(() => {
        const f = fingerprints().parseFingerprint(fp);
        const added = pins().addPin(stateDirs().resolveStateDir(o.stateDir), f, note.join(' '));
        process.stdout.write(`${added ? 'pinned' : 'already pinned'} ${f}\n`);
      }),
    );

  program
    .command('untrust')
    .description('remove a pinned fingerprint')
    .argument('<fingerprint>')
    .option('--state-dir <dir>', 'state directory')
    .action((fp: string, o: { stateDir?: string }) =>
      admin(() => {
        const f = fingerprints().parseFingerprint(fp);
        if (!pins().removePin(stateDirs().resolveStateDir(o.stateDir), f)) throw new FfsyncError('ENOTPINNED', ExitCode.USAGE, `${f} is not pinned`);
        process.stdout.write(`removed ${f}\n`);
      }),
    );

  program
    .command('fingerprints')
    .description('list pinned peer fingerprints')
    .option('--state-dir <dir>', 'state directory')
    .action((o: { stateDir?: string }) =>
      admin(() => {
        for (const p of pins().readPins(stateDirs().resolveStateDir(o.stateDir))) process.stdout.write(`${p.fingerprint}${p.note ? '  ' + p.note : ''}\n`);
      }),
    );
}

/** `completion <shell>`: a completion script generated from the program itself. */
function addCompletion(program: Command): void {
  program
    .command('completion')
    .description('print a shell completion script (bash, zsh or fish)')
    .addArgument(new Argument('<shell>', 'bash, zsh or fish').choices(['bash', 'zsh', 'fish']))
    .action((shell: 'bash' | 'zsh' | 'fish') =>
      admin(() => {
        const { completionScript } = require('./completion.js') as typeof import('./completion.js');
        process.stdout.write(completionScript(program, shell));
      }),
    );
}
