// Load test of `serve` (issue: server mode for fleets). Loopback only, bounded:
// 32 concurrent senders each push a tree of 200 files plus 4 senders push a 256 MiB file,
// three rounds with changes between rounds (~5% of each tree's files rewritten, one added,
// one removed; 8 x 64 KiB overwrites per big file). After every round every tree and file
// is compared with its source; the daemon's peak RSS and open descriptors are recorded.
//
//   npm run bench:serve                       # = node --import tsx bench/serve-load.ts
//   npx tsx bench/serve-load.ts --trees 8 --files 50 --big 1 --big-mib 32 --rounds 2
//
// Writes its section of docs/reliability.md between <!-- serve-load:begin --> and
// <!-- serve-load:end --> (the short version runs in npm test: __test__/serve.test.ts).

import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { runServeLoad } from './serve-load-runner.js';

const { values } = parseArgs({
  options: {
    trees: { type: 'string', default: '32' },
    files: { type: 'string', default: '200' },
    big: { type: 'string', default: '4' },
    'big-mib': { type: 'string', default: '256' },
    rounds: { type: 'string', default: '3' },
    seed: { type: 'string', default: '2026' },
    'no-write': { type: 'boolean', default: false },
  },
});

async function main(): Promise<void> {
  const p = {
    treeSenders: Number(values.trees),
    filesPerTree: Number(values.files),
    bigSenders: Number(values.big),
    bigBytes: Number(values['big-mib']) * 2 ** 20,
    rounds: Number(values.rounds),
    seed: Number(values.seed),
    log: (l: string) => console.log(l),
  };
  const f = await runServeLoad(p);
  const failed = f.rounds.some((r) => r.failures.length || r.mismatched.length) || f.daemonFdsAfter !== f.daemonFdsBaseline || f.daemonExitCode !== 0;
  const mib = (n: number) => (n / 2 ** 20).toFixed(1);
  const cmd = `npx tsx bench/serve-load.ts --trees ${p.treeSenders} --files ${p.filesPerTree} --big ${p.bigSenders} --big-mib ${values['big-mib']} --rounds ${p.rounds} --seed ${p.seed}`;
  const lines = [
    '<!-- serve-load:begin -->',
    '## Load test of `serve`',
    '',
    `Measured ${new Date().toISOString().slice(0, 10)} on ${os.cpus().length} cores (${os.cpus()[0]?.model ?? 'unknown CPU'}), loopback, TLS. Reproduce with \`${cmd}\` (\`npm run bench:serve\` runs the defaults).`,
    '',
    `${p.treeSenders} concurrent senders each push a tree of ${p.filesPerTree} files (0.5–16.5 KiB) and ${p.bigSenders} push a ${values['big-mib']} MiB file, all at once, ${p.rounds} rounds; between rounds ~5% of each tree's files are rewritten, one added and one removed, and each big file gets 8 × 64 KiB overwrites. Clients share 4 identities, each authorized for \`load/\` in serve-clients.conf.`,
    '',
    '| round | sessions | wall time | failed sessions | verified byte-identical | data sent by clients | literal bytes | daemon RSS after the round |',
    '|---|---|---|---|---|---|---|---|',
    ...f.rounds.map((r) => `| ${r.round} | ${r.sessions} | ${r.seconds.toFixed(1)} s | ${r.failures.length} | ${r.verified} / ${r.sessions} | ${mib(r.wireBytesSent)} MiB | ${mib(r.literalBytes)} MiB | ${(r.daemonRssAfterKiB / 1024).toFixed(0)} MiB |`),
    '',
    `- Daemon peak RSS (sampled every 100 ms and VmHWM): **${(f.daemonPeakRssKiB / 1024).toFixed(0)} MiB** with ${p.treeSenders + p.bigSenders} concurrent sessions.`,
    `- Daemon open file descriptors: ${f.daemonFdsBaseline} before the first session, ${f.daemonFdsAfter} after the last${f.daemonFdsExtra.length ? ` (extra: ${f.daemonFdsExtra.join(', ')})` : ' (back to the baseline)'}.`,
    `- Session log lines: ${f.sessionLines} (${f.sessionLinesOk} ok); the daemon exited ${f.daemonExitCode} on SIGTERM.`,
    `- Result: ${failed ? '**FAILED** (see above)' : 'every tree and file byte-identical to its source after every round'}.`,
    '<!-- serve-load:end -->',
  ];
  const section = lines.join('\n');
  console.log(section);
  if (!values['no-write']) {
    const file = path.join(__dirname, '..', 'docs', 'reliability.md');
    const old = fs.existsSync(file) ? fs.readFileSync(file, 'utf8') : '# Reliability\n';
    const i = old.indexOf('<!-- serve-load:begin -->');
    const j = i >= 0 ? old.indexOf('<!-- serve-load:end -->', i) : -1;
    fs.writeFileSync(file, i >= 0 && j > i ? old.slice(0, i) + section + old.slice(j + '<!-- serve-load:end -->'.length) : `${old.trimEnd()}\n\n${section}\n`);
    console.log(`wrote ${file}`);
  }
  if (failed) process.exitCode = 1;
}

void main();
