// Validation of relative paths named by a peer (tree mode names files inside the target;
// single-file mode names none). A path is accepted only if it is portable and stays inside
// the target on every OS: the same rules apply on Linux, macOS and Windows, so a tree that
// syncs on one cannot be turned into an escape on another.
import fs from 'node:fs';
import path from 'node:path';
import { ExitCode, FfsyncError } from '../utils/errors.js';

const RESERVED = /^(con|prn|aux|nul|com[0-9¹²³]|lpt[0-9¹²³])(\..*)?$/i;
export const MAX_PATH_BYTES = 4096;
export const MAX_SEGMENT_BYTES = 255;

function reject(p: string, why: string): never {
  throw new FfsyncError('EPATH', ExitCode.PROTOCOL_STREAM, `refusing peer path ${JSON.stringify(p)}: ${why}`);
}

/** Returns the path's segments, or throws a protocol error (exit 12) naming the rule broken. */
export function validateRelativePath(p: string): string[] {
  if (p.length === 0) reject(p, 'empty');
  if (Buffer.byteLength(p) > MAX_PATH_BYTES) reject(p, 'too long');
  if (p.includes('\0')) reject(p, 'contains NUL');
  if (/[\x00-\x1f]/.test(p)) reject(p, 'contains a control character');
  if (p.includes('\\')) reject(p, 'contains a backslash (a separator on Windows)');
  if (p.startsWith('/')) reject(p, 'absolute');
  if (/^[a-zA-Z]:/.test(p)) reject(p, 'has a drive letter');
  const segs = p.split('/');
  for (const s of segs) {
    if (s === '') reject(p, 'empty segment (// or a trailing /)');
    if (s === '.' || s === '..') reject(p, `'${s}' segment`);
    if (Buffer.byteLength(s) > MAX_SEGMENT_BYTES) reject(p, 'segment too long');
    if (RESERVED.test(s)) reject(p, `'${s}' is a reserved name on Windows`);
    if (/[<>:"|?*]/.test(s)) reject(p, `'${s}' has a character Windows forbids`);
    if (/[. ]$/.test(s)) reject(p, `'${s}' ends with a dot or space (Windows strips them)`);
  }
  return segs;
}

/**
 * Resolve a validated peer path under `root` for writing, refusing any existing
 * intermediate component that is a symlink or not a directory: nothing outside `root`
 * can be reached through the tree. The final component is never followed either (writes
 * go to a temp file that is renamed over it).
 */
export function resolveInside(root: string, p: string): string {
  const segs = validateRelativePath(p);
  let cur = path.resolve(root);
  for (let i = 0; i < segs.length - 1; i++) {
    cur = path.join(cur, segs[i]);
    let st: fs.Stats;
    try {
      st = fs.lstatSync(cur);
    } catch {
      continue; // not there yet: will be created as a directory
    }
    if (st.isSymbolicLink()) reject(p, `'${segs.slice(0, i + 1).join('/')}' is a symlink`);
    if (!st.isDirectory()) reject(p, `'${segs.slice(0, i + 1).join('/')}' is not a directory`);
  }
  return path.join(cur, segs[segs.length - 1]);
}
