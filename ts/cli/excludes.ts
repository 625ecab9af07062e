// --exclude / --exclude-from: gathered in order (first match wins) and checked by the
// same native rule parser the walk uses, so a bad pattern is a usage error (exit 1)
// before any connection is made.

import fs from 'node:fs/promises';
import { excludesFromText, validateExcludes } from '../native/binding.js';
import { ExitCode, FfsyncError } from '../utils/errors.js';

export async function loadExcludes(patterns: string[] = [], fromFile?: string): Promise<string[]> {
  const all = [...patterns];
  if (fromFile) {
    let text: string;
    try {
      text = await fs.readFile(fromFile, 'utf8');
    } catch (e) {
      throw new FfsyncError('ENOENT', ExitCode.USAGE, `cannot read --exclude-from ${fromFile}: ${(e as Error).message}`);
    }
    all.push(...excludesFromText(text));
  }
  validateExcludes(all);
  return all;
}
