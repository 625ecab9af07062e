// `import()` of an ES module (ora, ESM-only) from a file Node loads itself. The CLI's bundle may
// run from V8's code cache (./code-cache.ts), and on Node 20 a script compiled with cached data
// cannot import(): Node loses the script's import callback (ERR_VM_DYNAMIC_IMPORT_CALLBACK_MISSING,
// measured on 20.20). So this file stays outside the bundle (`npm run bundle:cli`: external).
export function importEsm(specifier: string): Promise<unknown> {
  return import(specifier);
}
