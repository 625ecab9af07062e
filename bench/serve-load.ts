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

import os from 'node:os';
import path from 'node:path';
import { REPO, benchArgs, intOption, orUsage, writeResultsSection } from './common.js';
import { runServeLoad } from './serve-load-runner.js';

const HELP = `Usage: node --import tsx bench/serve-load.ts [--trees 32] [--files 200] [--big 4] [--big-mib 256]
         [--rounds 3] [--seed 2026] [--no-write]
What it measures: the comment at the top of bench/serve-load.ts.
`;
const values = benchArgs(
  process.argv.slice(2),
  {
    trees: { type: 'string' },
    files: { type: 'string' },
    big: { type: 'string' },
    'big-mib': { type: 'string' },
    rounds: { type: 'string' },
    seed: { type: 'string' },
    'no-write': { type: 'boolean' },
  },
  HELP,
);
const bigMiB = orUsage(HELP, () => intOption('big-mib', values['big-mib'], 256, 1, 1 << 20));

async function main(): Promise<void> {
  const p = {
    treeSenders: orUsage(HELP, () => intOption('trees', values.trees, 32, 0, 10_000)),
    filesPerTree: orUsage(HELP, () => intOption('files', values.files, 200, 1, 1_000_000)),
    bigSenders: orUsage(HELP, () => intOption('big', values.big, 4, 0, 10_000)),
    bigBytes: bigMiB * 2 ** 20,
    rounds: orUsage(HELP, () => intOption('rounds', values.rounds, 3, 1, 1000)),
    seed: orUsage(HELP, () => intOption('seed', values.seed, 2026, 0, 0xffffffff)),
    log: (l: string) => console.log(l),
  };
  const f = await runServeLoad(p);
  const failed = f.rounds.some((r) => r.failures.length || r.mismatched.length) || f.daemonFdsAfter !== f.daemonFdsBaseline || f.daemonExitCode !== 0;
  const mib = (n: number) => (n / 2 ** 20).toFixed(1);
  const cmd = `npx tsx bench/serve-load.ts --trees ${p.treeSenders} --files ${p.filesPerTree} --big ${p.bigSenders} --big-mib ${bigMiB} --rounds ${p.rounds} --seed ${p.seed}`;
  const lines = [
    '<!-- serve-load:begin -->',
    '## Load test of `serve`',
    '',
    `Measured ${new Date().toISOString().slice(0, 10)} on ${os.cpus().length} cores (${os.cpus()[0]?.model ?? 'unknown CPU'}), loopback, TLS. Reproduce with \`${cmd}\` (\`npm run bench:serve\` runs the defaults).`,
    '',
    `${p.treeSenders} concurrent senders each push a tree of ${p.filesPerTree} files (0.5–16.5 KiB) and ${p.bigSenders} push a ${bigMiB} MiB file, all at once, ${p.rounds} rounds; between rounds ~5% of each tree's files are rewritten, one added and one removed, and each big file gets 8 × 64 KiB overwrites. Clients share 4 identities, each authorized for \`load/\` in serve-clients.conf.`,
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
    const file = writeResultsSection('<!-- serve-load:begin -->', '<!-- serve-load:end -->', section, path.join(REPO, 'docs', 'reliability.md'));
    console.log(`wrote ${file}`);
  }
  if (failed) process.exitCode = 1;
}

void main();
