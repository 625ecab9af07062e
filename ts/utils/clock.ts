// A monotonic clock in milliseconds, as `performance.now()` gives, without it: the global
// `performance` loads perf_hooks and ten of its internal modules at first use, ~1 ms of a
// start that a local sync pays for a few timestamps (decisions §100).
export function nowMs(): number {
  return Number(process.hrtime.bigint()) / 1e6;
}
