// rsync's --files-from FILE (`-` for stdin), with -0/--from0 for NUL-separated names: the
// list is read here, before anything connects, and goes to the sender's walk as lines
// (crates/ffsync_core/src/tree/selection.rs keeps the listed paths and the directories on
// the way to them).

import fs from 'node:fs';
import { ExitCode, FfsyncError } from '../utils/errors.js';

export function readFilesFrom(file: string, from0: boolean): string[] {
  let text: string;
  try {
    text = fs.readFileSync(file === '-' ? 0 : file, 'utf8');
  } catch (e) {
    throw new FfsyncError('EUSAGE', ExitCode.USAGE, `cannot read --files-from ${file}: ${(e as NodeJS.ErrnoException).code ?? e}`);
  }
  return from0 ? text.split('\0').filter(Boolean) : text.split(/\r?\n/);
}
