// Which native addon to load, and the one error to show when there is none. The generated loader
// (binding/index.js, written by `napi build`, never edited by hand) tries a local build in binding/
// first and the prebuilt package second; we want the opposite for an installed package, so this
// module resolves the prebuilt package itself and hands it to the generated loader through the
// override that loader honours (`NAPI_RS_NATIVE_LIBRARY_PATH`). Pure decisions are exported for
// __test__/loader.test.ts; loadNative() is the only part with side effects.
import fs from 'node:fs';
import path from 'node:path';

/** What the decision depends on (injected in tests). */
export interface Host {
  platform: NodeJS.Platform;
  arch: string;
  /** Linux only: true on musl libc (Alpine), false on glibc. */
  musl: boolean;
}

/** One way of loading the addon, in the order they are tried. */
export type Candidate =
  /** The user's own `NAPI_RS_NATIVE_LIBRARY_PATH`: the only candidate when set. */
  | { kind: 'override'; path: string }
  /** The installed prebuilt package `ffsync-native-<target>` (its resolved .node file). */
  | { kind: 'package'; name: string; path: string }
  /** The generated loader as it is: a local build in binding/, then the package. */
  | { kind: 'local' };

/** The napi target triple suffix of the package names (npm/<target>/package.json). */
export function nativeTarget(host: Host): string | undefined {
  const { platform, arch } = host;
  if (platform === 'linux' && (arch === 'x64' || arch === 'arm64')) return `linux-${arch}-${host.musl ? 'musl' : 'gnu'}`;
  if (platform === 'darwin' && (arch === 'x64' || arch === 'arm64')) return `darwin-${arch}`;
  if (platform === 'win32' && arch === 'x64') return 'win32-x64-msvc';
  return undefined;
}

export function platformPackage(target: string): string {
  return `ffsync-native-${target}`;
}

/** How the host is named in messages: `linux x64 (musl)`, `darwin arm64`. */
export function describeHost(host: Host): string {
  return `${host.platform} ${host.arch}${host.platform === 'linux' ? ` (${host.musl ? 'musl' : 'glibc'})` : ''}`;
}

/** The order to try: an explicit override alone; else the prebuilt package (if it resolves), then the local build. */
export function planLoad(host: Host, env: NodeJS.ProcessEnv, resolvePackage: (name: string) => string | undefined): Candidate[] {
  const override = env.NAPI_RS_NATIVE_LIBRARY_PATH;
  if (override) return [{ kind: 'override', path: override }];
  const target = nativeTarget(host);
  const plan: Candidate[] = [];
  if (target) {
    const name = platformPackage(target);
    const resolved = resolvePackage(name);
    if (resolved) plan.push({ kind: 'package', name, path: resolved });
  }
  plan.push({ kind: 'local' });
  return plan;
}

/** The one message shown when no candidate loaded. */
export function loadFailureMessage(host: Host, plan: Candidate[], errors: unknown[]): string {
  const target = nativeTarget(host);
  const first = (e: unknown) => (rootCause(e) instanceof Error ? (rootCause(e) as Error).message : String(e)).split('\n')[0];
  const tried = plan
    .map((c, i) => {
      const why = errors[i] === undefined ? '' : `: ${first(errors[i])}`;
      if (c.kind === 'override') return `NAPI_RS_NATIVE_LIBRARY_PATH=${c.path}${why}`;
      if (c.kind === 'package') return `${c.name} (${c.path})${why}`;
      return `a local build in binding/${why}`;
    })
    .join('; ');
  const build =
    'build from source: install a Rust toolchain (https://rustup.rs), clone the ffsync-native repository and run `npm install` in it ' +
    '(it runs `napi build` into binding/ and compiles the TypeScript), then run that clone (`npx ffsync-native` inside it, or `npm install -g <clone>`)';
  if (plan[0]?.kind === 'override') {
    return `ffsync-native: could not load the native addon for ${describeHost(host)} from NAPI_RS_NATIVE_LIBRARY_PATH (${tried}); unset it to use the prebuilt package ${target ? platformPackage(target) : '(none for this platform)'} or a local build.`;
  }
  if (!target) {
    return `ffsync-native: no prebuilt native addon exists for ${describeHost(host)} (prebuilt: linux x64/arm64 glibc and musl, darwin x64/arm64, win32 x64); ${build}. Tried: ${tried}.`;
  }
  return (
    `ffsync-native: could not load the native addon for ${describeHost(host)}. ` +
    `Install the prebuilt package: \`npm install ${platformPackage(target)}\` next to ffsync-native (npm installs it as an optional ` +
    `dependency unless optional dependencies are omitted), or ${build}. Tried: ${tried}.`
  );
}

/** The generated loader chains its attempts through `cause`, last attempt outermost: the first attempt says most. */
function rootCause(e: unknown): unknown {
  let cur = e;
  for (let i = 0; i < 16 && cur instanceof Error && cur.cause !== undefined && cur.cause !== null; i++) cur = cur.cause;
  return cur;
}

/** musl or glibc, as the generated loader decides it: /usr/bin/ldd first, then the process report. */
export function detectMusl(platform: NodeJS.Platform = process.platform): boolean {
  if (platform !== 'linux') return false;
  try {
    return fs.readFileSync('/usr/bin/ldd', 'utf8').includes('musl');
  } catch {
    /* no ldd: ask the process report */
  }
  const report = process.report?.getReport() as { header?: { glibcVersionRuntime?: string }; sharedObjects?: string[] } | undefined;
  if (!report) return false;
  if (report.header?.glibcVersionRuntime) return false;
  return (report.sharedObjects ?? []).some((f) => f.includes('libc.musl-') || f.includes('ld-musl-'));
}

/**
 * Load the addon through the generated loader at `loaderPath`, trying the plan's candidates in order.
 * Returns the binding and the .node file it came from.
 */
export function loadNative<T>(loaderPath: string, req: NodeJS.Require = require): { binding: T; origin: string } {
  // Loaded already in this process (the executable's early walks, ts/cli/early-walks.ts): the same
  // module, and its origin is where it was loaded from, not the first candidate of a new plan.
  const cached = req.cache[loaderPath];
  if (cached?.loaded) return { binding: cached.exports as T, origin: loadedAddonPath(req) ?? path.dirname(loaderPath) };
  const host: Host = { platform: process.platform, arch: process.arch, musl: detectMusl() };
  const plan = planLoad(host, process.env, (name) => {
    try {
      return req.resolve(name);
    } catch {
      return undefined;
    }
  });
  const errors: unknown[] = [];
  for (const c of plan) {
    const saved = process.env.NAPI_RS_NATIVE_LIBRARY_PATH;
    try {
      if (c.kind === 'package') process.env.NAPI_RS_NATIVE_LIBRARY_PATH = c.path;
      const binding = req(loaderPath) as T;
      return { binding, origin: c.kind === 'local' ? loadedAddonPath(req) ?? path.dirname(loaderPath) : c.path };
    } catch (e) {
      // A module that throws while loading leaves the require cache, so the next candidate re-runs it.
      errors.push(e);
    } finally {
      if (c.kind === 'package') {
        if (saved === undefined) delete process.env.NAPI_RS_NATIVE_LIBRARY_PATH;
        else process.env.NAPI_RS_NATIVE_LIBRARY_PATH = saved;
      }
    }
  }
  const err = new Error(loadFailureMessage(host, plan, errors));
  (err as Error & { code?: string }).code = 'ENATIVELOAD';
  err.cause = errors[errors.length - 1];
  throw err;
}

/** The ffsync-native .node file in the require cache (what the generated loader picked). */
function loadedAddonPath(req: NodeJS.Require): string | undefined {
  return Object.keys(req.cache).find((k) => /^ffsync-native\.[\w-]+\.node$/.test(path.basename(k)));
}
