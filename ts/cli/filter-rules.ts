// rsync's filter rules on `sync`, in command-line order (the first matching rule wins):
// --exclude / --include / --include-from (both sides), --filter RULE, -F and -C. Each rule
// is for the sender's walk, the receiver's (what travels in the FILTER frame), or both:
// `-`/`+` both, `H`/`S` (hide/show) the sender's, `P`/`R` (protect/risk) the receiver's.
// `.` merges a file of rules in place; `:` (dir-merge) names a per-directory merge file that
// the sender's walk reads in every directory (crates/ffsync_core/src/tree/dir_merge.rs).

import fs from 'node:fs';
import path from 'node:path';
import { InvalidArgumentError } from 'commander';
import { homeDir } from '../utils/state-dir.js';

export type Side = 'both' | 'sender' | 'receiver';

/** One kind of per-directory merge file (the binding's DirMergeSpec). */
export interface DirMergeSpec {
  name: string;
  inherit: boolean;
  wordSplit: boolean;
  bare?: '-' | '+';
}

export interface RuleList {
  rules: { side: Side; pattern: string }[];
  dirMerge: DirMergeSpec[];
  /** -C: rsync appends its CVS rules after all others, wherever -C was given. */
  cvs: boolean;
}

export function newRuleList(): RuleList {
  return { rules: [], dirMerge: [], cvs: false };
}

/** rsync's built-in -C list (exclude.c, default_cvsignore). */
export const CVS_IGNORE = 'RCS SCCS CVS CVS.adm RCSLOG cvslog.* tags TAGS .make.state .nse_depinfo *~ #* .#* ,* _$* *$ *.old *.bak *.BAK *.orig *.rej .del-* *.a *.olb *.o *.obj *.so *.exe *.Z *.elc *.ln core .svn/ .git/ .hg/ .bzr/';

const SHORT: Record<string, string> = { '-': 'exclude', '+': 'include', '.': 'merge', ':': 'dir-merge', H: 'hide', S: 'show', P: 'protect', R: 'risk', '!': 'clear' };
const MAX_MERGE_DEPTH = 16;

function bad(rule: string, why: string): InvalidArgumentError {
  return new InvalidArgumentError(`--filter ${JSON.stringify(rule)}: ${why}`);
}

/** Add one rule (`--filter` syntax) to `list`, reading merge files as rsync does. */
export function addFilterRule(list: RuleList, rule: string, depth = 0): void {
  const text = rule.trim();
  if (text === '') return;
  // RULE[,MODIFIERS] PATTERN, or a one-character RULE with MODIFIERS right after it.
  const m = /^([-+.:HSPR!])([^ _]*)[ _]?(.*)$/.exec(text) ?? /^([a-z-]+)(?:,([^ ]*))?(?: (.*))?$/.exec(text);
  if (!m) throw bad(rule, 'not a filter rule (e.g. "- *.o", "+ keep/", "P cache/", ": .rsync-filter")');
  const kind = SHORT[m[1]] ?? m[1];
  const mods = m[2] ?? '';
  const arg = (m[3] ?? '').trim();
  const push = (side: Side, pattern: string) => {
    if (!arg) throw bad(rule, 'a pattern is missing');
    if (mods) throw bad(rule, `modifier "${mods}" is not supported in this version`);
    list.rules.push({ side, pattern });
  };
  switch (kind) {
    case 'exclude':
      return push('both', arg);
    case 'include':
      return push('both', `!${arg}`);
    case 'hide':
      return push('sender', arg);
    case 'show':
      return push('sender', `!${arg}`);
    case 'protect':
      return push('receiver', arg);
    case 'risk':
      return push('receiver', `!${arg}`);
    case 'clear':
      list.rules.length = 0;
      list.dirMerge.length = 0;
      return;
    case 'merge': {
      if (!arg) throw bad(rule, 'a file name is missing');
      if (depth >= MAX_MERGE_DEPTH) throw bad(rule, 'merge files nest too deeply');
      const bare = mods.includes('-') ? '-' : mods.includes('+') ? '+' : undefined;
      for (const c of mods) if (!'-+w'.includes(c)) throw bad(rule, `modifier "${c}" is not supported in this version`);
      for (const line of readRulesFile(arg, rule)) {
        const words = mods.includes('w') ? line.split(/\s+/).filter(Boolean) : [line];
        for (const w of words) addFilterRule(list, bare ? `${bare} ${w}` : w, depth + 1);
      }
      return;
    }
    case 'dir-merge': {
      const cvs = mods.includes('C');
      const name = (arg || (cvs ? '.cvsignore' : '')).replace(/^\/+/, '');
      if (!name || name.includes('/')) throw bad(rule, 'a merge file name (no directory) is needed, e.g. ".rsync-filter"');
      for (const c of mods) if (!'nw-+eC'.includes(c)) throw bad(rule, `modifier "${c}" is not supported in this version`);
      const spec: DirMergeSpec = cvs
        ? { name, inherit: false, wordSplit: true, bare: '-' }
        : { name, inherit: !mods.includes('n'), wordSplit: mods.includes('w'), bare: mods.includes('-') ? '-' : mods.includes('+') ? '+' : undefined };
      list.dirMerge.push(spec);
      if (mods.includes('e')) list.rules.push({ side: 'both', pattern: name });
      return;
    }
    default:
      throw bad(rule, `rule "${m[1]}" is not supported (supported: -, +, H, S, P, R, !, . FILE, : FILE)`);
  }
}

/** rsync's -F: the first one reads `.rsync-filter` in every directory, the second also
 * leaves those files out of the transfer. */
export function addDashF(list: RuleList, count: number): void {
  if (count === 1) addFilterRule(list, ': /.rsync-filter');
  else if (count === 2) addFilterRule(list, '- .rsync-filter');
}

function readRulesFile(file: string, rule: string): string[] {
  let text: string;
  try {
    text = file === '-' ? fs.readFileSync(0, 'utf8') : fs.readFileSync(file, 'utf8');
  } catch (e) {
    throw bad(rule, `cannot read ${file}: ${(e as NodeJS.ErrnoException).code ?? e}`);
  }
  return text
    .split(/\r?\n/)
    .map((l) => l.trim())
    .filter((l) => l !== '' && !l.startsWith('#') && !l.startsWith(';'));
}

/** The two walks' rule lists and the merge files, with -C's rules appended last. */
export function finishRules(list: RuleList, env: NodeJS.ProcessEnv = process.env): { sender: string[]; receiver: string[]; dirMerge: DirMergeSpec[] } {
  const rules = [...list.rules];
  const dirMerge = [...list.dirMerge];
  if (list.cvs) {
    const words = [CVS_IGNORE];
    // (homeDir: '' for a user with no home, where os.homedir() throws; then no ~/.cvsignore.)
    const home = env.HOME ?? homeDir();
    try {
      if (home) words.push(fs.readFileSync(path.join(home, '.cvsignore'), 'utf8'));
    } catch {
      // no ~/.cvsignore: nothing to add
    }
    if (env.CVSIGNORE) words.push(env.CVSIGNORE);
    for (const w of words.join(' ').split(/\s+/).filter(Boolean)) rules.push({ side: 'both', pattern: w });
    dirMerge.push({ name: '.cvsignore', inherit: false, wordSplit: true, bare: '-' });
  }
  return {
    sender: rules.filter((r) => r.side !== 'receiver').map((r) => r.pattern),
    receiver: rules.filter((r) => r.side !== 'sender').map((r) => r.pattern),
    dirMerge,
  };
}
