// Tree walks started before the program is loaded, handed to the walk that asks for the same thing.
//
// A local `sync` of a tree spends its first ~15 ms (after Node's own start) loading the CLI's
// bundle, and only then walks both trees (~20 ms for 10,000 files on two cores). The executable
// (ts/cli/main.ts) recognises the plain cases from argv alone and starts the two walks on the
// pool first (ts/cli/early-walks.ts); the program then takes them here instead of walking again
// (decisions §101). This module is in both bundles (main.js and entry.js): what they share lives
// on `process` under a registered symbol, not in module state, which each bundle has its own copy of.
//
// Correctness never depends on the guess made from argv: a walk is taken only by a request with the
// same root and the same options, compared in full. One that nobody asks for is left alone (its
// error, if any, is swallowed: the program's own walk reports what it finds).

import type * as Binding from '../../binding/index.js';

type Tree = Binding.NativeTreeSync;

interface Offered {
  walk: Promise<Tree>;
  /** Entries listed so far, from the walk's ticker, and where they go once the walk is taken. */
  listed: number;
  progress?: (entries: number) => void;
}

interface Registry {
  /** Walks offered and not yet taken, by `walkKey`. */
  walks: Map<string, Offered>;
  /** How many were taken (tests read it at exit). */
  taken: number;
}

const KEY = Symbol.for('ffsync-native.early-walks');

function registry(create: boolean): Registry | undefined {
  const holder = process as unknown as Record<symbol, Registry | undefined>;
  if (!holder[KEY] && create) holder[KEY] = { walks: new Map(), taken: 0 };
  return holder[KEY];
}

/** The walk's identity: its root and every option it was given (absent and `undefined` alike;
 * keys in sorted order, so two objects built in different orders compare equal). */
export function walkKey(root: string, options: Binding.WalkTreeOptions): string {
  const o = options as unknown as Record<string, unknown>;
  const fields = Object.keys(o)
    .filter((k) => o[k] !== undefined)
    .sort()
    .map((k) => [k, o[k]]);
  return JSON.stringify([root, fields]);
}

/** Start a walk of `root` with `options` (`start` gets the progress callback to give the native
 * walk) and offer it: its progress goes to whoever takes it, from then on. */
export function offerEarlyWalk(root: string, options: Binding.WalkTreeOptions, start: (onProgress: (entries: number) => void) => Promise<Tree>): void {
  const entry: Offered = { walk: undefined as unknown as Promise<Tree>, listed: 0 };
  entry.walk = start((n) => {
    entry.listed = n;
    entry.progress?.(n);
  });
  entry.walk.catch(() => undefined); // nobody may take it; the program's own walk reports errors
  registry(true)!.walks.set(walkKey(root, options), entry);
}

/** The walk offered for exactly this root and these options, once (undefined if none); its
 * progress goes to `onProgress` from now on. */
export function takeEarlyWalk(root: string, options: Binding.WalkTreeOptions, onProgress?: (entries: number) => void): Promise<Tree> | undefined {
  const r = registry(false);
  if (!r || r.walks.size === 0) return undefined;
  const key = walkKey(root, options);
  const entry = r.walks.get(key);
  if (!entry) return undefined;
  r.walks.delete(key);
  r.taken++;
  entry.progress = onProgress;
  if (entry.listed > 0) onProgress?.(entry.listed);
  return entry.walk;
}

/** Walks offered and taken so far, and those left (tests). */
export function earlyWalkCounts(): { taken: number; left: number } {
  const r = registry(false);
  return { taken: r?.taken ?? 0, left: r?.walks.size ?? 0 };
}
