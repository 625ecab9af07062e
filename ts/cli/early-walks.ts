// A local `sync` of a tree starts walking both trees before the program is loaded.
//
// The executable (./main.ts) runs this before it loads the CLI's bundle: for the plain cases of a
// local tree sync, read from argv alone, the addon is loaded and the source's walk and the
// target's are started on the pool, where they run while the bundle loads (~15 ms of a 10,000-file
// no-op's ~80). The program takes them when it asks for the same walks (ts/native/early-walks.ts
// compares root and options in full), so a wrong guess here costs a walk, never a wrong result.
// Anything this reader does not know — any other option, a remote side, a file — starts nothing:
// options that change a walk (excludes, filters, -x, -L, -c, --files-from, …) are exactly the ones
// left out. Decisions §101.
import fs from 'node:fs';
import path from 'node:path';
import type * as Binding from '../../binding/index.js';
import { offerEarlyWalk } from '../native/early-walks.js';
import { loadNative } from '../native/loader.js';
import { baseName, type Location, parseLocation, treeTarget } from '../utils/location.js';
import { resolveStateDir } from '../utils/state-dir.js';

/** Short options that change neither walk (`-a`, `-r` and `-l` are read for what they do; `-P`,
 * like `--partial`, only while RSYNC_PARTIAL_DIR is unset). */
const SHORT = new Set('arlvqztpogDhinuWSP');
/** Long options without a value that change neither walk. */
const LONG = new Set([
  '--archive',
  '--recursive',
  '--links',
  '--verbose',
  '--quiet',
  '--times',
  '--perms',
  '--owner',
  '--group',
  '--compress',
  '--sparse',
  '--whole-file',
  '--no-whole-file',
  '--update',
  '--human-readable',
  '--itemize-changes',
  '--dry-run',
  '--stats',
  '--json',
  '--progress',
  '--partial',
  '--delete',
  '--delete-after',
  '--delete-delay',
  '--delete-before',
  '--delete-during',
  '--fsync',
  '--no-fsync',
]);
/** Long options with a value: the state directory (read), the timeout (changes no walk). */
const LONG_VALUE = new Set(['--state-dir', '--timeout']);

export interface EarlyWalk {
  root: string;
  options: Binding.WalkTreeOptions;
}

function isDir(p: string): boolean {
  return fs.statSync(p, { throwIfNoEntry: false })?.isDirectory() ?? false;
}

/**
 * The walks a local tree sync with these arguments will make, as the program will ask for them
 * (ts/api/sync.ts `syncLocally`: the source's, and the target's when it is a directory already),
 * or none when the arguments hold anything this reader does not know.
 */
export function planEarlyWalks(argv: readonly string[], platform: NodeJS.Platform = process.platform): EarlyWalk[] {
  if (argv[2] !== 'sync') return [];
  const paths: string[] = [];
  const seen = new Set<string>();
  let stateDir: string | undefined;
  for (let i = 3; i < argv.length; i++) {
    const a = argv[i]!;
    if (a.startsWith('--')) {
      const eq = a.indexOf('=');
      const name = eq < 0 ? a : a.slice(0, eq);
      if (LONG_VALUE.has(name)) {
        const value = eq < 0 ? argv[++i] : a.slice(eq + 1);
        if (value === undefined) return [];
        if (name === '--state-dir') stateDir = value;
      } else if (eq < 0 && LONG.has(name)) {
        seen.add(name);
      } else {
        return []; // `--` itself, and every option not listed
      }
    } else if (a.startsWith('-') && a.length > 1) {
      for (const c of a.slice(1)) {
        if (!SHORT.has(c)) return [];
        seen.add(c);
      }
    } else {
      paths.push(a);
    }
  }
  if (paths.length !== 2) return [];
  const [src, dest] = paths.map((p) => parseLocation(p, platform)) as [Location, Location];
  if (src.host !== undefined || dest.host !== undefined) return [];
  // --partial / -P with RSYNC_PARTIAL_DIR set is --partial-dir, whose rule excludes that directory
  // from both walks (ts/api/sync.ts `withPartialDirRule`).
  if ((seen.has('P') || seen.has('--partial')) && process.env.RSYNC_PARTIAL_DIR) return [];
  const explicitR = seen.has('r') || seen.has('--recursive');
  const archive = seen.has('a') || seen.has('--archive');
  if (!archive && !explicitR) return []; // a directory needs -r or -a
  const root = path.resolve(src.path);
  if (!isDir(root)) return [];
  let state: string;
  try {
    state = resolveStateDir(stateDir);
  } catch {
    return []; // no home: the program says so
  }
  const links = archive || seen.has('l') || seen.has('--links');
  const walks: EarlyWalk[] = [{ root, options: { excludes: [], stateDir: state, isSender: true, skipSymlinks: !links, filesFromRecursive: explicitR } }];
  // rsync's placement (ts/api/sync.ts syncTarget): `SRC/` (and `.`, `..`) lands in DEST, `SRC` in
  // DEST/<its name>.
  const target = path.resolve(treeTarget(dest.path, baseName(src.path), src.slash));
  if (target !== root && isDir(target)) walks.push({ root: target, options: { excludes: [], protect: [], stateDir: state, isSender: false } });
  return walks;
}

/** Start the walks `planEarlyWalks` finds, offered to the program (ts/native/early-walks.ts). Never
 * throws: whatever goes wrong here, the program does the usual and reports it. */
export function startEarlyWalks(argv: readonly string[] = process.argv): void {
  try {
    const walks = planEarlyWalks(argv);
    if (walks.length === 0) return;
    const native = loadNative<typeof Binding>(require.resolve('../../binding/index.js')).binding;
    for (const w of walks) offerEarlyWalk(w.root, w.options, (progress) => native.NativeTreeSync.walk(w.root, w.options, (n: number) => progress(n)));
  } catch {
    // No addon, or anything else: the program loads it again and says what is wrong.
  }
}
