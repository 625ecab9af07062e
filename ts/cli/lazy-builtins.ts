// The `require` the program's bundle runs with (./code-cache.ts): the same as Node's, but the
// built-ins in LAZY are handed over as stand-ins that load the module at their first use.
//
// Why: commander requires `node:child_process` when it loads (for executable subcommands, which
// this CLI has none of), and child_process requires `net`, `dgram` and their internals: 3–8 ms
// of every start, `--version` and a local sync included, for a module only ssh's spawn uses
// (decisions §100). The bundle's own code already loads what a command needs lazily
// (./program.ts); this covers the dependency we do not write, and `node:crypto`, which modules
// every session loads import for one call each on paths a local sync never takes (a lane's
// token, a certificate's fingerprint, pairing): loading it initializes OpenSSL, ~5 ms of every
// start (decisions §107).
/** Built-ins whose first `require` may be deferred to their first use. */
export const LAZY = new Set(['node:child_process', 'child_process', 'node:crypto', 'crypto']);

/** An object that stands for `load()`'s module: any use of it loads the module (once) and acts
 * on it. `__esModule` answers undefined without loading, so TypeScript's `__importDefault`,
 * which asks only that at the require, wraps the stand-in instead of loading the module; helpers
 * that list the module's keys at the require (`__importStar`, esbuild's `__toESM`) load it then:
 * correct, only not deferred. */
export function standIn(load: () => object): object {
  let real: object | undefined;
  const m = (): object => (real ??= load());
  return new Proxy(Object.create(null) as object, {
    get: (_t, k) => (k === '__esModule' ? undefined : Reflect.get(m(), k)),
    has: (_t, k) => Reflect.has(m(), k),
    ownKeys: () => Reflect.ownKeys(m()),
    getOwnPropertyDescriptor: (_t, k) => {
      const d = Reflect.getOwnPropertyDescriptor(m(), k);
      // The stand-in's own (empty, extensible) target has none: a proxy may report a property
      // only as configurable.
      return d && { ...d, configurable: true };
    },
    set: (_t, k, v) => Reflect.set(m(), k, v),
  });
}

/** `req` with LAZY's built-ins deferred; its properties (`resolve`, `cache`, …) kept. */
export function lazyRequire(req: NodeJS.Require): NodeJS.Require {
  const stands = new Map<string, object>();
  const wrapped = ((id: string) => {
    if (!LAZY.has(id)) return req(id);
    let s = stands.get(id);
    if (!s) stands.set(id, (s = standIn(() => req(id) as object)));
    return s;
  }) as NodeJS.Require;
  return Object.assign(wrapped, req);
}
