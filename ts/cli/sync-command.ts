// `ffsync-native sync [rsync-style options] SRC DEST`: rsync's front door, local or over ssh.
// The options are rsync's, declared in groups in the order --help lists them; options rsync
// users type that this version does not implement are refused by name (exit 1), never
// silently accepted. `syncOptions` turns what commander parsed into the library's options.
/* eslint-disable @typescript-eslint/no-require-imports -- lazy loads, as program.ts explains */

import { type Command, InvalidArgumentError, Option } from 'commander';
import type { SyncSummary } from '../api/events.js';
import type { SyncOptions } from '../api/sync.js';
import { ExitCode, type FfsyncError } from '../utils/errors.js';
import { excludeRules, intArg, need, run, type RunOptions, sizeArg } from './command-kit.js';
import type { RuleList } from './filter-rules.js';
import type { Reporter } from './reporter.js';

const filterRules = () => require('./filter-rules.js') as typeof import('./filter-rules.js');
const syncApi = () => need(() => require('../api/sync.js') as typeof import('../api/sync.js'));

/** rsync options people reach for that this version does not implement yet: each is refused
 * by name (exit 1) rather than reported as unknown, or worse, ignored. Keys are commander's
 * attribute names. */
const NOT_SUPPORTED: [string, string][] = [
  ['-H, --hard-links', 'hardLinks'],
  ['-A, --acls', 'acls'],
];

/** The filter rules in the order the options give them: one list for --exclude, --include,
 * --include-from, --filter and -F (and -C, which goes last). */
class SyncRules {
  readonly list: RuleList = { rules: [], dirMerge: [], cvs: false };
  /** How many times -F was given. */
  dashF = 0;

  /** A rule for both sides; commander keeps the returned list as the option's value. */
  both(pattern: string): RuleList {
    this.list.rules.push({ side: 'both', pattern });
    return this.list;
  }
}

export function addSync(program: Command): void {
  const rules = new SyncRules();
  const cmd = program
    .command('sync')
    .description('rsync-style: SRC and DEST are local paths or [user@]host:path (ssh); `src/` copies the contents, `src` the directory itself')
    .argument('<SRC>')
    .argument('<DEST>');
  attributeOptions(cmd);
  listingAndBackupOptions(cmd);
  connectionAndChoiceOptions(cmd);
  dataOptions(cmd);
  deletionOptions(cmd);
  filterOptions(cmd, rules);
  sessionOptions(cmd);
  // Refused when given, but not advertised: --help and the completion scripts list what works.
  for (const [flags] of NOT_SUPPORTED) cmd.addOption(new Option(flags, 'not supported (refused with exit 1)').hideHelp());
  // -h is rsync's --human-readable here, as rsync users type it (`-avh`); help is --help only.
  cmd.helpOption('--help', 'display help for command');
  cmd.action(async (src: string, dest: string, o: SyncFlags) => {
    refuseUnsupported(o);
    await run(reporterOptions(o, Boolean(syncApi().parseLocation(src).host)), (events, signal) => runSync(src, dest, o, rules.list, events, signal));
  });
}

/** -a and the attributes it stands for. */
function attributeOptions(cmd: Command): void {
  cmd
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
  .option('--specials', 'special files (sockets, FIFOs): skipped with a notice, as with -a');
}

/** What is listed and logged, what is kept (backups, partial files), what the sender removes. */
function listingAndBackupOptions(cmd: Command): void {
  cmd
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
  .option('--chmod <CHMOD>', "change the modes sent, as rsync does (e.g. Du=rwx,Dgo=rx,Fu=rw,Fgo=r; repeatable)", (v: string, prev?: string) => (prev ? `${prev},${v}` : v));
}

/** How ssh connects, which files are skipped, and how the run reports. */
function connectionAndChoiceOptions(cmd: Command): void {
  cmd
  .option('-4, --ipv4', 'prefer IPv4 (passed to ssh)')
  .option('-6, --ipv6', 'prefer IPv6 (passed to ssh)')
  .addOption(new Option('--contimeout <SECONDS>', "give up connecting after this long (ssh's ConnectTimeout)").argParser(intArg(1, 86400)))
  .option('--size-only', 'skip files that match in size (their content is not compared)')
  .option('--ignore-existing', 'skip updating files that exist on the receiving side')
  .option('--existing', 'skip creating new files on the receiving side (only update what is there)')
  .option('-i, --itemize-changes', "list changes in rsync's itemized format (YXcstpoguax, e.g. >f.st...... name)")
  .option('-h, --human-readable', 'numbers in --stats in units (K, M, G of 1000; -hh: of 1024), as rsync\'s -h', (_: unknown, level: number) => level + 1, 0)
  .option('-q, --quiet', 'print errors only')
  .option('-n, --dry-run', 'show what would change; write nothing');
}

/** How file data is compared, compressed and written. */
function dataOptions(cmd: Command): void {
  cmd
  .option('-z, --compress', 'compress data (always on: zstd where it pays)')
  .option('-S, --sparse', "keep holes (always on: the sender's holes, found with SEEK_HOLE/SEEK_DATA, are recreated)")
  .option('--inplace', 'update files in place: write only changed ranges into the target (crash-safe redo journal; see docs/cli.md)')
  .option('--no-fsync', 'do not fsync received files before renaming them into place (rsync\'s default: no waiting for the disk, but a crash soon after may lose or truncate them; every file is still verified)')
  .option('--fsync', 'fsync each received file before its rename (the default; accepted as rsync spells it)')
  .addOption(new Option('--compress-level <n>', 'zstd level for data').argParser(intArg(0, 19)))
  .option('-c, --checksum', 'compare content, not size and mtime')
  .option('-u, --update', 'skip files that are newer on the receiver')
  .option('-W, --whole-file', 'send changed files whole (no delta against the old version)')
  .option('--no-whole-file', 'send changed files over 64 KiB as deltas even between local paths (default there: whole up to 1 MiB, deltas above)')
  .option('-x, --one-file-system', "don't cross filesystem boundaries");
}

/** --delete and rsync's timings of it, which all mean the same here. */
function deletionOptions(cmd: Command): void {
  cmd
  .option('--delete', 'delete files only DEST has')
  .option('--delete-after', 'the same as --delete: deletions always happen after every transfer succeeded')
  .option('--delete-delay', 'the same as --delete-after')
  .option('--delete-before', 'the same as --delete-after (the final tree is the same; deleting last is what keeps a failed run from losing files)')
  .option('--delete-during', 'the same as --delete-after (idem)');
}

/** Which paths take part: filter rules (in the order given), --files-from, --chown. */
function filterOptions(cmd: Command, rules: SyncRules): void {
  cmd
  .option('--exclude <pattern>', 'exclude matching paths (repeatable; rules in docs/cli.md)', (v: string) => rules.both(v))
  .option('--include <pattern>', 're-include matching paths (first matching rule wins)', (v: string) => rules.both(`!${v}`))
  .option('--chown <USER:GROUP>', 'trees: give every entry this owner and/or group on the receiving side (implies -o and/or -g; an owner only as root)')
  .option('--files-from <FILE>', "sync only the paths listed in FILE (`-`: stdin), relative to SRC, with the directories on the way; -a does not imply -r here, as in rsync")
  .option('-0, --from0', '--files-from names are separated by NUL bytes, not lines')
  .option('-f, --filter <RULE>', "rsync's filter rules: - + (both sides), H S (sender), P R (receiver), ! (clear), . FILE (merge), : NAME (per-directory merge file)", (v: string) => (filterRules().addFilterRule(rules.list, v), rules.list))
  .option('-F', "same as --filter=': /.rsync-filter'; given twice, also --filter='- .rsync-filter'", () => (filterRules().addDashF(rules.list, ++rules.dashF), rules.dashF))
  .option('-C, --cvs-exclude', "ignore files as CVS does (rsync's list, ~/.cvsignore, $CVSIGNORE, each directory's .cvsignore)", () => ((rules.list.cvs = true), true))
  .option('--exclude-from <file>', 'read exclude patterns from a file')
  .option('--include-from <file>', 're-include the patterns of a file (one per line, # comments), in the rules\' order', (f: string) => (patternFile(f).forEach((p) => rules.both(`!${p}`)), rules.list));
}

/** Bandwidth, progress and statistics, the remote side, size limits, state and timeout. */
function sessionOptions(cmd: Command): void {
  cmd
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
  .addOption(new Option('--timeout <seconds>', 'give up when the peer is silent this long (exit 30)').argParser(intArg(1, 86400)).default(60));;
}

function refuseUnsupported(o: SyncFlags): void {
  for (const [flags, key] of NOT_SUPPORTED) {
    if ((o as unknown as Record<string, unknown>)[key] !== undefined) {
      process.stderr.write(`ffsync-native: error: ${flags.split(' <')[0]} is not supported by this version of ffsync-native\n`);
      process.exit(ExitCode.USAGE);
    }
  }
}

/** What the reporter needs: rsync's output options, and whether this run pulls (`pulling`:
 * SRC is remote), which names -v's first line. */
function reporterOptions(o: SyncFlags, pulling: boolean): RunOptions {
  const info = o.info ?? new Set<string>();
  return {
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
    listHeader: pulling ? 'receiving incremental file list' : 'sending incremental file list',
  };
}

/** Runs the sync, and with --log-file logs what happened, failed or not. */
async function runSync(src: string, dest: string, o: SyncFlags, ruleList: RuleList, events: Reporter, signal: AbortSignal): Promise<SyncSummary> {
  const lists = filterRules().finishRules(ruleList);
  const excludes = await excludeRules().loadExcludes(lists.sender, o.excludeFrom);
  // --exclude-from's patterns (read once) close both lists.
  const wireExcludes = await excludeRules().loadExcludes([...lists.receiver, ...excludes.slice(lists.sender.length)]);
  const log = o.logFile ? (require('./log-file.js') as typeof import('./log-file.js')).openLogFile(o.logFile) : undefined;
  const running = syncApi().sync({
    ...syncOptions(o),
    src,
    dest,
    logLine: log?.line,
    excludes,
    wireExcludes: wireExcludes.join('\n') === excludes.join('\n') ? undefined : wireExcludes,
    dirMerge: lists.dirMerge.length ? lists.dirMerge : undefined,
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
}

type FlagOptions = Omit<SyncOptions, 'src' | 'dest' | 'logLine' | 'excludes' | 'wireExcludes' | 'dirMerge' | 'events' | 'signal'>;

/** The library's options for the flags given (rsync's implications applied: -a's letters,
 * --delete's variants, --chown's -o and -g). */
function syncOptions(o: SyncFlags): FlagOptions {
  return {
    ...deletionAndBackup(o),
    ...attributes(o),
    recursive: Boolean(o.archive || o.recursive),
    pruneEmptyDirs: o.pruneEmptyDirs,
    removeSourceFiles: o.removeSourceFiles,
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
    choices: { sizeOnly: o.sizeOnly, ignoreExisting: o.ignoreExisting, existingOnly: o.existing },
    mkpath: o.mkpath,
    ipFamily: o.ipv6 ? 6 : o.ipv4 ? 4 : undefined,
    contimeoutS: o.contimeout,
    stateDir: o.stateDir,
    timeoutMs: o.timeout * 1000,
  };
}

/** --delete in all its spellings, --max-delete, backups and the partial directory. */
function deletionAndBackup(o: SyncFlags): Pick<SyncOptions, 'delete' | 'deleteExcluded' | 'maxDelete' | 'backup' | 'suffix' | 'backupDir' | 'partialDir'> {
  return {
    delete: Boolean(o.delete || o.deleteAfter || o.deleteDelay || o.deleteBefore || o.deleteDuring || o.deleteExcluded),
    deleteExcluded: o.deleteExcluded,
    maxDelete: o.maxDelete,
    backup: o.backup,
    suffix: o.suffix,
    backupDir: o.backupDir,
    // rsync: RSYNC_PARTIAL_DIR is the partial directory of --partial (and -P) unless --partial-dir names one,
    // and not with --inplace, which keeps no partial (an explicit --partial-dir with it is refused).
    partialDir: o.partialDir ?? ((o.partial || o.P) && !o.inplace && process.env.RSYNC_PARTIAL_DIR ? process.env.RSYNC_PARTIAL_DIR : undefined),
  };
}

/** What is kept of each entry: -a's letters (each one's absence means what it means in
 * rsync), owner, group, xattrs, --chmod and --chown. */
function attributes(o: SyncFlags): Pick<SyncOptions, 'omit' | 'attrs' | 'chmod' | 'chown' | 'copyLinks'> {
  const { AttrFlag } = require('../protocol/messages.js') as typeof import('../protocol/messages.js');
  // --chown implies -o for its user part and -g for its group part, as in rsync.
  const owner = o.archive || o.owner || chownPart(o.chown, 0);
  const group = o.archive || o.group || chownPart(o.chown, 1);
  return {
    omit: { links: !(o.archive || o.links), times: !(o.archive || o.times), perms: !(o.archive || o.perms) },
    attrs: (owner ? AttrFlag.OWNER : 0) | (group ? AttrFlag.GROUP : 0) | (o.xattrs ? AttrFlag.XATTRS : 0) | (o.numericIds ? AttrFlag.NUMERIC_IDS : 0),
    chmod: o.chmod,
    chown: o.chown,
    copyLinks: o.copyLinks,
  };
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

/** `sync`'s options as commander hands them over (commander's attribute names of the flags declared below). */
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
