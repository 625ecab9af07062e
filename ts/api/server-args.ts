// The remote end of `sync` over ssh runs `<remote-cmd> server ARGS` (docs/protocol.md §10): the
// rsync options that side applies travel as these arguments, never in frames. One table
// defines them: `serverArgs` writes them on the local side and `parseServerArgs` reads them on
// the remote one, so the two cannot drift apart.

import type { DirMergeSpec } from '../native/binding.js';
import { ExitCode, FfsyncError } from '../utils/errors.js';

/** rsync's choices that travel as one comma-separated list each. */
export const FLAG_SETS = { omit: ['links', 'times', 'perms'], choices: ['sizeOnly', 'ignoreExisting', 'existingOnly'] } as const;
type FlagSet<N extends keyof typeof FLAG_SETS> = Partial<Record<(typeof FLAG_SETS)[N][number], boolean>>;

/** What the remote side of a `sync` is told. */
export interface ServerArgs {
  role: 'sender' | 'receiver';
  path: string;
  /** The receiver's name for what it receives (SRC's last component). */
  name?: string;
  srcSlash?: boolean;
  destSlash?: boolean;
  checksum?: boolean;
  dryRun?: boolean;
  update?: boolean;
  wholeFile?: boolean;
  oneFileSystem?: boolean;
  compressLevel?: number;
  bwlimitKiBps?: number;
  excludes?: string[];
  filesFrom?: string[];
  filesFromRecursive?: boolean;
  /** The receiver's filter rules when they differ from the walk's, and the per-directory merge files to read. */
  rules?: { wire?: string[]; dirMerge?: DirMergeSpec[] };
  quic?: boolean;
  inplace?: boolean;
  /** `false`: `--no-fsync`. */
  fsync?: boolean;
  jobs?: number;
  maxSize?: number;
  minSize?: number;
  attrs?: number;
  omit?: FlagSet<'omit'>;
  choices?: FlagSet<'choices'>;
  mkpath?: boolean;
  deleteExcluded?: boolean;
  chmod?: string;
  pruneEmptyDirs?: boolean;
  removeSourceFiles?: boolean;
  copyLinks?: boolean;
  chown?: string;
  maxDelete?: number;
  backup?: boolean;
  suffix?: string;
  backupDir?: string;
  partialDir?: string;
  stateDir?: string;
}

type Key = Exclude<keyof ServerArgs, 'role' | 'path'>;
type Spec =
  | { flag: string; alias?: string; key: Key; kind: 'bool' | 'string' | 'list' | 'json' }
  /** `--no-x`: the key is false when present, and written only when false. */
  | { flag: string; key: Key; kind: 'off' }
  | { flag: string; key: Key; kind: 'int'; min: number; max: number }
  | { flag: string; key: 'omit' | 'choices'; kind: 'set' };

/** Every argument but `--sender PATH` / `--receiver PATH`, in the order they are written. The
 * short letters are rsync's and what older builds wrote; the long names are accepted too. */
const SPECS: Spec[] = [
  { flag: '--name', key: 'name', kind: 'string' },
  { flag: '--src-slash', key: 'srcSlash', kind: 'bool' },
  { flag: '--dest-slash', key: 'destSlash', kind: 'bool' },
  { flag: '--mkpath', key: 'mkpath', kind: 'bool' },
  { flag: '-c', alias: '--checksum', key: 'checksum', kind: 'bool' },
  { flag: '-n', alias: '--dry-run', key: 'dryRun', kind: 'bool' },
  { flag: '-u', alias: '--update', key: 'update', kind: 'bool' },
  { flag: '-W', alias: '--whole-file', key: 'wholeFile', kind: 'bool' },
  { flag: '-x', alias: '--one-file-system', key: 'oneFileSystem', kind: 'bool' },
  { flag: '--compress-level', key: 'compressLevel', kind: 'int', min: 0, max: 19 },
  { flag: '--bwlimit', key: 'bwlimitKiBps', kind: 'int', min: 1, max: 2 ** 31 },
  { flag: '--exclude', key: 'excludes', kind: 'list' },
  { flag: '--files-from-json', key: 'filesFrom', kind: 'json' },
  { flag: '--files-from-recursive', key: 'filesFromRecursive', kind: 'bool' },
  { flag: '--rules-json', key: 'rules', kind: 'json' },
  { flag: '--delete-excluded', key: 'deleteExcluded', kind: 'bool' },
  { flag: '--chmod', key: 'chmod', kind: 'string' },
  { flag: '--prune-empty-dirs', key: 'pruneEmptyDirs', kind: 'bool' },
  { flag: '--remove-source-files', key: 'removeSourceFiles', kind: 'bool' },
  { flag: '--copy-links', key: 'copyLinks', kind: 'bool' },
  { flag: '--quic', key: 'quic', kind: 'bool' },
  { flag: '--jobs', key: 'jobs', kind: 'int', min: 1, max: 16 },
  { flag: '--inplace', key: 'inplace', kind: 'bool' },
  { flag: '--no-fsync', key: 'fsync', kind: 'off' },
  { flag: '--max-delete', key: 'maxDelete', kind: 'int', min: 0, max: 2 ** 31 - 1 },
  { flag: '--chown', key: 'chown', kind: 'string' },
  { flag: '--backup', key: 'backup', kind: 'bool' },
  { flag: '--suffix', key: 'suffix', kind: 'string' },
  { flag: '--backup-dir', key: 'backupDir', kind: 'string' },
  { flag: '--partial-dir', key: 'partialDir', kind: 'string' },
  { flag: '--max-size', key: 'maxSize', kind: 'int', min: 0, max: Number.MAX_SAFE_INTEGER },
  { flag: '--min-size', key: 'minSize', kind: 'int', min: 0, max: Number.MAX_SAFE_INTEGER },
  { flag: '--attrs', key: 'attrs', kind: 'int', min: 0, max: 15 },
  { flag: '--omit', key: 'omit', kind: 'set' },
  { flag: '--choices', key: 'choices', kind: 'set' },
  { flag: '--state-dir', key: 'stateDir', kind: 'string' },
];

/** The arguments after `server` for `o` (what is unset or off is left out). */
export function serverArgs(o: ServerArgs): string[] {
  const out = [o.role === 'sender' ? '--sender' : '--receiver', o.path];
  const v = o as unknown as Record<Key, unknown>;
  for (const s of SPECS) {
    const value = v[s.key];
    if (value === undefined) continue;
    switch (s.kind) {
      case 'bool':
        if (value) out.push(s.flag);
        break;
      case 'off':
        if (value === false) out.push(s.flag);
        break;
      case 'string':
      case 'int':
        out.push(s.flag, String(value));
        break;
      case 'list':
        for (const item of value as string[]) out.push(s.flag, item);
        break;
      case 'json':
        out.push(s.flag, JSON.stringify(value));
        break;
      case 'set': {
        const on = (FLAG_SETS[s.key] as readonly string[]).filter((k) => (value as Record<string, boolean>)[k]);
        if (on.length) out.push(s.flag, on.join(','));
        break;
      }
    }
  }
  return out;
}

const usage = (message: string) => new FfsyncError('EUSAGE', ExitCode.USAGE, `server: ${message}`);

/** The remote side's reading of `serverArgs`' output (`--flag value` or `--flag=value`). */
export function parseServerArgs(argv: string[]): ServerArgs {
  const o: Partial<ServerArgs> = {};
  const v = o as Record<string, unknown>;
  for (let i = 0; i < argv.length; i++) {
    const token = argv[i];
    const eq = token.startsWith('--') ? token.indexOf('=') : -1;
    const name = eq > 0 ? token.slice(0, eq) : token;
    const inline = eq > 0 ? token.slice(eq + 1) : undefined;
    const value = (): string => {
      if (inline !== undefined) return inline;
      if (i + 1 >= argv.length) throw usage(`${name} needs a value`);
      return argv[++i];
    };
    if (name === '--sender' || name === '--receiver') {
      if (o.role) throw usage('give exactly one of --sender PATH or --receiver PATH');
      o.role = name === '--sender' ? 'sender' : 'receiver';
      o.path = value();
      continue;
    }
    const s = SPECS.find((x) => x.flag === name || ('alias' in x && x.alias === name));
    if (!s) throw usage(`unknown option ${name}`);
    switch (s.kind) {
      case 'bool':
        v[s.key] = true;
        break;
      case 'off':
        v[s.key] = false;
        break;
      case 'string':
        v[s.key] = value();
        break;
      case 'int': {
        const raw = value();
        const n = Number(raw);
        if (!/^\d+$/.test(raw) || n < s.min || n > s.max) throw usage(`${name} takes an integer from ${s.min} to ${s.max}, not ${JSON.stringify(raw)}`);
        v[s.key] = n;
        break;
      }
      case 'list':
        ((v[s.key] as string[] | undefined) ?? (v[s.key] = [] as string[]) as string[]).push(value());
        break;
      case 'json':
        try {
          v[s.key] = JSON.parse(value());
        } catch {
          throw usage(`${name} takes JSON`);
        }
        break;
      case 'set': {
        const known: readonly string[] = FLAG_SETS[s.key];
        v[s.key] = Object.fromEntries(
          value()
            .split(',')
            .filter((k) => known.includes(k))
            .map((k) => [k, true]),
        );
        break;
      }
    }
  }
  if (!o.role || o.path === undefined) throw usage('give exactly one of --sender PATH or --receiver PATH');
  return o as ServerArgs;
}
