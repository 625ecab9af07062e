// stdout and stderr, made when first used. Node makes `process.stdout`/`process.stderr` at the
// first read of the property; for a pipe or a terminal that loads `net` and `tty` (3–5 ms). A
// quiet run that prints nothing (`sync -q` in a script) need not pay it (decisions §100), so
// nothing here reads them early: the EPIPE handler goes on stdout when something first uses it,
// and the flush before exit covers only the streams that were made (one never made holds
// nothing to flush).
type Name = 'stdout' | 'stderr';

/** Whether each stream was made; `undefined`: not known (the property could not be watched). */
const made: Record<Name, boolean | undefined> = { stdout: false, stderr: false };

/** Watch both streams' first use; `onStdout` runs with stdout when it is made. */
export function watchStdio(onStdout: (stdout: NodeJS.WriteStream) => void): void {
  for (const name of ['stdout', 'stderr'] as const) {
    const d = Object.getOwnPropertyDescriptor(process, name);
    const get = d?.get;
    if (!d || !get || !d.configurable) {
      made[name] = undefined;
      if (name === 'stdout') onStdout(process.stdout);
      continue;
    }
    // Node's getter makes the stream once and keeps it; ours runs once, then puts it back.
    Object.defineProperty(process, name, {
      configurable: true,
      enumerable: d.enumerable,
      get() {
        Object.defineProperty(process, name, d);
        made[name] = true;
        const stream = get.call(process) as NodeJS.WriteStream;
        if (name === 'stdout') onStdout(stream);
        return stream;
      },
    });
  }
}

/** Run `then` once what was written to stdout and stderr has been handed over (pipes are
 * asynchronous in Node): an empty write to each stream that was made calls back after it. */
export function flushStdio(then: () => void): void {
  const streams = (['stdout', 'stderr'] as const).filter((n) => made[n] !== false).map((n) => process[n]);
  const next = (i: number): void => {
    if (i === streams.length) return then();
    streams[i]!.write('', () => next(i + 1));
  };
  next(0);
}
