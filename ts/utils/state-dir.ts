import os from 'node:os';
import path from 'node:path';
import { ExitCode, FfsyncError } from './errors.js';

/** The user's home directory, or '' where there is none: without HOME, `os.homedir()` asks the
 * user database, and throws for a user it does not list (a container run as an arbitrary uid).
 * (The state directory's default and the CLI's code cache, ts/cli/code-cache.ts, live there.) */
export function homeDir(): string {
  try {
    return os.homedir();
  } catch {
    return '';
  }
}

/** `--state-dir`, else FFSYNC_STATE_DIR, else the platform's per-user state directory. */
export function resolveStateDir(explicit?: string): string {
  if (explicit) return path.resolve(explicit);
  if (process.env.FFSYNC_STATE_DIR) return path.resolve(process.env.FFSYNC_STATE_DIR);
  const home = homeDir();
  // One line that says what to do, not a stack trace.
  if (!home) throw new FfsyncError('EUSAGE', ExitCode.USAGE, 'no home directory to keep state in (HOME is unset and the user database has no entry for this user): set FFSYNC_STATE_DIR or pass --state-dir');
  switch (process.platform) {
    case 'win32':
      return path.join(process.env.LOCALAPPDATA ?? path.join(home, 'AppData', 'Local'), 'ffsync-native');
    case 'darwin':
      return path.join(home, 'Library', 'Application Support', 'ffsync-native');
    default:
      return path.join(process.env.XDG_STATE_HOME ?? path.join(home, '.local', 'state'), 'ffsync-native');
  }
}

/** ` --state-dir DIR` when `stateDir` is not what a command run without the option would use
 * (so a hint such as "run 'ffsync-native trust FP'" works when pasted), else ''. The path is
 * quoted for a POSIX shell when it needs to be. */
export function stateDirOption(stateDir: string): string {
  if (path.resolve(stateDir) === resolveStateDir()) return '';
  const quoted = /^[\w@%+=:,./-]+$/.test(stateDir) ? stateDir : `'${stateDir.replace(/'/g, `'\\''`)}'`;
  return ` --state-dir ${quoted}`;
}
