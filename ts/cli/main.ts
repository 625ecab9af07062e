#!/usr/bin/env node
// The `ffsync-native` executable. The program (./program.ts) loads the native addon only in the
// commands that use it (`--version` and `--help` never do) and reports a missing one for this
// platform (ts/native/loader.ts) as one `ffsync-native: error:` line with the exit code of a
// usage problem; the same holds here for anything that loads it while the program loads.

// Node >= 22.1 keeps V8's compiled code of our modules on disk between runs when asked (the
// module compile cache Node documents for command-line tools; NODE_COMPILE_CACHE picks the
// directory, NODE_DISABLE_COMPILE_CACHE turns it off). Node 20 has no such API: nothing happens.
// eslint-disable-next-line @typescript-eslint/no-require-imports
(require('node:module') as { enableCompileCache?: () => unknown }).enableCompileCache?.();

// `sync -v | head`: a reader that closes stdout early must not crash the run with a stack
// trace (EPIPE). The listing is lost, the sync goes on, and the exit code still tells.
process.stdout.on('error', (e: NodeJS.ErrnoException) => {
  if (e.code !== 'EPIPE' && e.code !== 'ERR_STREAM_DESTROYED') throw e;
});

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
