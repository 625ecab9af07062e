// `npm test` runs end-to-end tests against dist/ and binding/*.node while in-process tests
// import ts/ directly: a build older than its sources would test two different programs at
// once. `test:ts` rebuilds dist/ first (seconds); the native addon takes a minute, so a stale
// one is refused here in one line instead (exit 1), naming the source that is newer.
import fs from 'node:fs';
import path from 'node:path';

const repo = path.join(__dirname, '..', '..');

/** The newest file under `dir` whose name passes `want` and whose path `keep` accepts (build
 * output directories skipped). */
function newest(dir: string, want: (name: string) => boolean, keep: (p: string) => boolean = () => true): { file: string; mtimeMs: number } | undefined {
  let best: { file: string; mtimeMs: number } | undefined;
  const walk = (d: string) => {
    for (const e of fs.readdirSync(d, { withFileTypes: true })) {
      if (e.name === 'target' || e.name === 'node_modules' || e.name.startsWith('.')) continue;
      const p = path.join(d, e.name);
      if (!keep(p)) continue;
      if (e.isDirectory()) walk(p);
      else if (want(e.name)) {
        const m = fs.statSync(p).mtimeMs;
        if (!best || m > best.mtimeMs) best = { file: p, mtimeMs: m };
      }
    }
  };
  walk(dir);
  return best;
}

const addons = fs.readdirSync(path.join(repo, 'binding')).filter((n) => n.endsWith('.node'));
if (process.env.NAPI_RS_NATIVE_LIBRARY_PATH) process.exit(0); // the user chose an addon: theirs to keep fresh
if (addons.length === 0) {
  process.stderr.write("ffsync-native: no native addon in binding/: run 'npm run build:native' (or 'npm install') first\n");
  process.exit(1);
}
const built = Math.min(...addons.map((n) => fs.statSync(path.join(repo, 'binding', n)).mtimeMs));
// What the addon is built from: the crates' sources (not their tests, benches or fuzz
// targets, which the addon does not contain), their manifests, and the workspace's lock file.
const builtFrom = (p: string) => !/[/\\](tests|benches|fuzz)[/\\]/.test(path.relative(repo, p));
const crateSource = newest(path.join(repo, 'crates'), (n) => n.endsWith('.rs') || n === 'Cargo.toml', builtFrom);
const lock = ['Cargo.lock', 'Cargo.toml'].map((n) => path.join(repo, n)).filter((p) => fs.existsSync(p)).map((file) => ({ file, mtimeMs: fs.statSync(file).mtimeMs }));
const source = [crateSource, ...lock].filter((s) => s !== undefined).sort((a, b) => b.mtimeMs - a.mtimeMs)[0];
if (source && source.mtimeMs > built + 1000) {
  process.stderr.write(`ffsync-native: the native addon in binding/ is older than ${path.relative(repo, source.file)}: run 'npm run build:native' first\n`);
  process.exit(1);
}
