// rsync's --remove-source-files, on the sending side: once the receiver has reported that
// every file was synced, the source files and symlinks it now holds (sent, or found the same
// there) are removed; directories stay. Each is removed only if it is still the version that
// was listed, so a file written during the sync is kept (rsync's "Skipping sender remove for
// changed file"). A partial session removes nothing: a rerun finishes the transfer first.
// Trees are resolved natively beneath the source root (tree/remove_sources.rs).

import fs from 'node:fs/promises';
import type { BigIntStats } from 'node:fs';
import { call, type NativeTreeSync } from '../native/binding.js';
import { ExitCode, FfsyncError } from '../utils/errors.js';
import type { SyncEvents } from './events.js';

/** The one line a partial session prints instead of removing anything. */
export const NOTHING_REMOVED = '--remove-source-files: nothing removed, the transfer was partial (rerun to finish it)';

function failed(errors: string[]): FfsyncError {
  return new FfsyncError('EPARTIAL', ExitCode.PARTIAL, `partial transfer: ${errors.length} source file(s) could not be removed\n${errors.join('\n')}`);
}

/** A tree: every synced non-directory on the sender's list. Throws EPARTIAL (exit 23) if a
 * removal failed. */
export async function removeSourceTree(tree: NativeTreeSync, events?: SyncEvents): Promise<number> {
  const out = await call(tree.removeSources());
  for (const w of out.warnings) events?.info?.(w);
  if (out.errors.length) throw failed(out.errors);
  return out.files;
}

/** A single file, if it is still the one that was offered (same size, mtime and inode). */
export async function removeSourceFile(p: string, offered: BigIntStats, events?: SyncEvents): Promise<number> {
  const now = await fs.lstat(p, { bigint: true }).catch(() => undefined);
  if (!now) return 0;
  if (!now.isFile() || now.size !== offered.size || now.mtimeNs !== offered.mtimeNs || now.ino !== offered.ino) {
    events?.info?.(`Skipping sender remove for changed file: ${p}`);
    return 0;
  }
  try {
    await fs.unlink(p);
  } catch (e) {
    throw failed([`cannot remove source ${p}: ${(e as Error).message}`]);
  }
  return 1;
}
