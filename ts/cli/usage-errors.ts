// Usage errors as rsync users expect them: one `ffsync-native: error:` line, then at most one
// hint line (commander's "did you mean", or where the command's help is), exit 1. Never the
// whole help text: a wall of options hides the one word that was wrong.
import type { Command } from 'commander';

/** Commander's error text (`error: unknown option '--frm'\n(Did you mean --from?)`) for the
 * command `commandPath` (e.g. `sync`; empty for the program itself) → our two lines. */
export function usageErrorText(text: string, commandPath: string): string {
  const lines = text.trim().split('\n');
  const what = (lines[0] ?? 'usage error').replace(/^error: /, '');
  const suggestion = lines
    .slice(1)
    .map((l) => /^\(Did you mean (.+)\?\)$/.exec(l.trim()))
    .find((m) => m !== null);
  const help = `ffsync-native${commandPath ? ` ${commandPath}` : ''} --help`;
  const hint = suggestion ? `did you mean ${suggestion[1]}? (see '${help}')` : `see '${help}'`;
  return `ffsync-native: error: ${what}\n${hint}\n`;
}

/** Route every command's (and subcommand's) usage errors through `usageErrorText`. */
export function oneLineUsageErrors(cmd: Command, commandPath = ''): void {
  cmd.configureOutput({ outputError: (text, write) => write(usageErrorText(text, commandPath)) });
  for (const sub of cmd.commands) oneLineUsageErrors(sub, commandPath ? `${commandPath} ${sub.name()}` : sub.name());
}
