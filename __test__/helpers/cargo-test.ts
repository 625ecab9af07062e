// `npm run test:rust`: `cargo test --release --workspace` for the host's target triple, named
// explicitly. `napi build --platform` builds the addon with `--target <host triple>`, which puts
// its artifacts under target/<triple>/release; a plain `cargo test` builds under
// target/release instead and compiled every dependency a second time (89 crates, about 3 of
// CI's 30 minutes). Naming the same triple lets the tests reuse the addon build's dependencies.
// Extra arguments go to cargo (e.g. `npm run test:rust -- -p ffsync_core io::`).
import { execFileSync, spawnSync } from 'node:child_process';

const host = /^host: (\S+)$/m.exec(execFileSync('rustc', ['-vV'], { encoding: 'utf8' }))?.[1];
if (!host) throw new Error('rustc -vV printed no host triple');
const r = spawnSync('cargo', ['test', '--release', '--workspace', '--target', host, ...process.argv.slice(2)], { stdio: 'inherit' });
process.exit(r.status ?? 1);
