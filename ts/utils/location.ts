// Where a `sync` argument points: rsync's `[user@]host:path` or a local path, and whether it names
// a directory's contents. Its own module so that the executable's early walks
// (ts/cli/early-walks.ts) read arguments, and place a tree, as the program does without loading it.
import path from 'node:path';

export interface Location {
  /** `[user@]host` for a remote location. */
  host?: string;
  path: string;
  /** "The contents of": written with a trailing '/', or ending in a `.` or `..` component. */
  slash: boolean;
}

/** A last component of `.` or `..` (`.`, `..`, `dir/.`, `../..`): rsync sends what is in that
 * directory, as for a trailing slash; the directory's own name is never a target name (`..`
 * as one would place the tree in DEST's parent). */
function dotEnd(p: string, seps: RegExp): boolean {
  const last = p.split(seps).pop();
  return last === '.' || last === '..';
}

/** rsync's rule: `host:path` when a ':' comes before any '/'; `C:\\…` stays local on Windows. */
export function parseLocation(spec: string, platform: NodeJS.Platform = process.platform): Location {
  const colon = spec.indexOf(':');
  const slash = spec.indexOf('/');
  const drive = platform === 'win32' && /^[a-zA-Z]:[\\/]/.test(spec);
  if (colon > 0 && (slash < 0 || colon < slash) && !drive) {
    const p = spec.slice(colon + 1) || '.';
    return { host: spec.slice(0, colon), path: p, slash: p.endsWith('/') || dotEnd(p, /\//) };
  }
  const seps = platform === 'win32' ? /[\\/]/ : /\//;
  return { path: spec, slash: spec.endsWith('/') || (platform === 'win32' && spec.endsWith('\\')) || dotEnd(spec, seps) };
}

/** The last component of a path as written (`a/b/` -> `b`). */
export function baseName(p: string): string {
  return path.basename(p.replace(/[/\\]+$/, '')) || p;
}

/** A SRC name is one path component (on Windows `\\` separates too): a name from a peer that is
 * not would place the tree elsewhere than in DEST. */
export function isOneComponent(name: string, platform: NodeJS.Platform = process.platform): boolean {
  return !name.includes('/') && !(platform === 'win32' && name.includes('\\'));
}

/** A SRC name that means "the contents of" (`.`, `..`, or none): the tree lands in DEST itself. */
export function namesContents(srcName: string): boolean {
  return srcName === '' || srcName === '.' || srcName === '..';
}

/** rsync's rule for where a tree lands: DEST itself for `SRC/` (and a SRC named `.` or `..`),
 * DEST/name for `SRC`. */
export function treeTarget(dest: string, srcName: string, srcSlash: boolean): string {
  return srcSlash || namesContents(srcName) ? dest : path.join(dest, srcName);
}
