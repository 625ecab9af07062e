// The CLI run under strace, and the system calls it logged: tests observe what a real process
// asked of the kernel (fsync before rename, one writer at a time per file).
import { execFileSync, spawn } from 'node:child_process';
import fs from 'node:fs';
import { CLI, type PeerResult } from './peers';

/** A reason to skip when strace is missing (.ci/run installs it), else false. */
export function straceMissing(): string | false {
  try {
    execFileSync('strace', ['-V'], { stdio: 'ignore' });
    return false;
  } catch {
    return 'strace is not installed (.ci/run installs it)';
  }
}

/** The CLI under strace (-f: every thread; -y: descriptors shown with their paths), tracing
 * the comma-separated system calls `trace` into `log`. */
export function traced(log: string, trace: string, args: string[], env: NodeJS.ProcessEnv = {}): { done: Promise<PeerResult>; listening: Promise<number> } {
  const child = spawn('strace', ['-f', '-y', '-qq', '-e', `trace=${trace}`, '-o', log, process.execPath, CLI, ...args], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, ...env },
  });
  let stdout = '';
  let stderr = '';
  let onPort!: (p: number) => void;
  const listening = new Promise<number>((resolve) => (onPort = resolve));
  child.stdout.on('data', (d: Buffer) => {
    stdout += d;
    const m = /"event":"listening"[^\n]*"port":(\d+)/.exec(stdout);
    if (m) onPort(Number(m[1]));
  });
  child.stderr.on('data', (d: Buffer) => (stderr += d));
  const done = new Promise<PeerResult>((resolve) =>
    child.on('close', (code, signal) => {
      const events = stdout.split('\n').flatMap((l) => {
        try {
          return [JSON.parse(l) as Record<string, any>];
        } catch {
          return [];
        }
      });
      resolve({ code, signal, events, stdout, stderr, summary: events.find((e) => e.event === 'summary') });
    }),
  );
  return { done, listening };
}

export interface Call {
  pid: string;
  name: string;
  line: string;
}

/** The calls strace logged, in order (an interrupted call counts where it started). A call that
 * another thread's interrupted (`… <unfinished ...>`, later `PID <... name resumed>…`) is one
 * call whose line has both halves: its arguments may be split between them. */
export function calls(log: string): Call[] {
  const out: Call[] = [];
  const open = new Map<string, Call>();
  for (const line of fs.readFileSync(log, 'utf8').split('\n')) {
    const resumed = /^(\d+)\s+<\.\.\. (\w+) resumed>(.*)$/.exec(line);
    if (resumed) {
      const c = open.get(resumed[1]!);
      if (c && c.name === resumed[2]) {
        c.line = c.line.replace(/\s*<unfinished \.\.\.>$/, '') + resumed[3];
        open.delete(resumed[1]!);
      }
      continue;
    }
    const m = /^(\d+)\s+(\w+)\(/.exec(line);
    if (!m) continue;
    const c = { pid: m[1]!, name: m[2]!, line };
    out.push(c);
    if (line.endsWith('<unfinished ...>')) open.set(c.pid, c);
  }
  return out;
}
