// The CLI's program, bundled into one file (`npm run bundle:cli`: dist/cli/entry.js) and run by
// the executable, ./main.ts, which keeps V8's compiled code of it between runs (./code-cache.ts).
// The program (./program.ts) loads the native addon only in the commands that use it (`--version`
// and `--help` never do) and reports a missing one for this platform (ts/native/loader.ts) as one
// `ffsync-native: error:` line with the exit code of a usage problem; the same holds here for
// anything that loads it while the program loads.
import { watchStdio } from './stdio.js';

// `sync -v | head`: a reader that closes stdout early must not crash the run with a stack
// trace (EPIPE). The listing is lost, the sync goes on, and the exit code still tells. The
// handler goes on stdout when something first uses it (./stdio.ts: a quiet run never makes it).
watchStdio((stdout) =>
  stdout.on('error', (e: NodeJS.ErrnoException) => {
    if (e.code !== 'EPIPE' && e.code !== 'ERR_STREAM_DESTROYED') throw e;
  }),
);

let program: typeof import('./program.js');
try {
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  program = require('./program.js');
} catch (e) {
  const err = e as Error & { code?: string };
  if (err.code !== 'ENATIVELOAD') throw e;
  process.stderr.write(`ffsync-native: error: ${err.message.replace(/^ffsync-native: /, '')}\n`);
  process.exit(1);
}
void program.main();
