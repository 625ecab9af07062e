#!/usr/bin/env node
// The `ffsync-native` executable. It loads the program (./program.ts) itself so that a missing
// native addon for this platform (ts/native/loader.ts) is one `ffsync-native: error:` line with
// the exit code of a usage problem, not a stack trace.

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
