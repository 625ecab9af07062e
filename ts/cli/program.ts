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

import { Argument, Command, CommanderError, Option } from 'commander';
import { ExitCode, FfsyncError } from '../utils/errors.js';
import { VERSION } from '../utils/version.js';
import { admin, collect, common, type CommonOptions, excludeRules, fingerprints, intArg, need, pins, run, sizeArg, stateDirs, tcp, type TreeCli } from './command-kit.js';
import { serveCommand } from './serve.js';
import { addSync } from './sync-command.js';
import { oneLineUsageErrors } from './usage-errors.js';

export function buildProgram(): Command {
  const program = new Command('ffsync-native')
    .description('File sync that moves the difference, not the file.')
    .version(VERSION, '-V, --version')
    .exitOverride();

  addReceive(program);
  addSend(program);
  addPull(program);
  serveCommand(program);
  addSync(program);
  addServer(program);
  addIdentityCommands(program);
  addCompletion(program);

  oneLineUsageErrors(program);
  return program;
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
    .option('--no-overlap', 'trees: hash the target\'s files only when the sender\'s files reach them (default: while waiting for the sender, and ahead of the files\' conversations, at idle priority)')
    .action(async (target: string, port: number, o: CommonOptions & TreeCli & { bind: string; from?: string[]; inplace?: boolean; fsync: boolean; pair?: boolean; overlap: boolean }) => {
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
          overlap: o.overlap,
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
    .option('--no-overlap', 'scan a large file completely before sending its manifest, and a tree\'s files only once triage named them (default: stream the manifest while hashing, and hash ahead while the session is set up)')
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
