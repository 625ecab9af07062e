// TLS cost against --plaintext on a fresh single-file transfer over loopback.
//   node --import tsx bench/tls-overhead.ts [--size-mib 1024] [--repeat 3]
// Alternates plaintext and TLS runs (same file, receiver emptied before each run), verifies
// every result by SHA-256, and writes bench/RESULTS-tls.md. Target (issue #3): TLS wall
// time at most 15% above plaintext.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import { CLI, REPO, benchArgs, intOption, median, orUsage, runMain, sh } from './common.js';
import { runFfsyncPair } from './runners';
import { sha256, writeSeededFile } from '../__test__/helpers/data';

const HELP = `Usage: node --import tsx bench/tls-overhead.ts [--size-mib 1024] [--repeat 3]
Writes bench/RESULTS-tls.md; what it measures: the comment at the top of bench/tls-overhead.ts.
`;
const values = benchArgs(process.argv.slice(2), { 'size-mib': { type: 'string' }, repeat: { type: 'string' } }, HELP);
const sizeMiB = orUsage(HELP, () => intOption('size-mib', values['size-mib'], 1024, 1, 1 << 20));
const repeat = orUsage(HELP, () => intOption('repeat', values.repeat, 3, 1, 100));

async function main() {
  const dir = fs.mkdtempSync(path.join(REPO, 'bench', 'work-tls-'));
  try {
    const src = path.join(dir, 'src.bin');
    writeSeededFile(src, sizeMiB * 2 ** 20, 3);
    const want = sha256(src);
    const dst = path.join(dir, 'dst.bin');
    const [stateR, stateS] = [path.join(dir, 'state-r'), path.join(dir, 'state-s')];
    const fingerprint = (state: string) => sh(process.execPath, [CLI, 'id', '--state-dir', state]) || (() => { throw new Error(`ffsync-native id --state-dir ${state} failed`); })();
    const tls = { receiverFingerprint: fingerprint(stateR), senderFingerprint: fingerprint(stateS) };
    /** One fresh transfer (the receiver emptied first), verified; its wall time in ms. */
    const once = async (label: string, secure: boolean): Promise<number> => {
      fs.rmSync(dst, { force: true });
      spawnSync('sync');
      const r = await runFfsyncPair({ label, src, dst, stateR, stateS, tls: secure ? tls : undefined });
      if (sha256(dst) !== want) throw new Error(`${label}: result mismatch`);
      return r.wallMs;
    };
    const plain: number[] = [];
    const secure: number[] = [];
    await once('warm-up', false); // the sender's index and the page cache, equally for both modes
    for (let i = 0; i < repeat; i++) {
      plain.push(await once(`plaintext #${i + 1}`, false));
      secure.push(await once(`TLS #${i + 1}`, true));
    }
    const overhead = median(secure)! / median(plain)! - 1;
    const secs = (xs: number[]) => xs.map((x) => (x / 1000).toFixed(2)).join(', ');
    const lines = [
      '# TLS overhead — fresh single-file transfer over loopback',
      '',
      `Command: \`node --import tsx bench/tls-overhead.ts --size-mib ${sizeMiB} --repeat ${repeat}\``,
      '',
      `- date: ${new Date().toISOString()}; ${os.cpus().length} CPUs (${os.cpus()[0]?.model}); node ${process.version}`,
      `- file: ${sizeMiB} MiB of incompressible data; every result verified by SHA-256; runs alternate plaintext / TLS`,
      '',
      '| mode | runs (s) | median (s) |',
      '|---|---|---:|',
      `| --plaintext | ${secs(plain)} | ${(median(plain)! / 1000).toFixed(2)} |`,
      `| TLS 1.3 (pinned) | ${secs(secure)} | ${(median(secure)! / 1000).toFixed(2)} |`,
      '',
      `TLS overhead (median): **${(overhead * 100).toFixed(1)}%** (target: at most 15%).`,
      '',
    ];
    fs.writeFileSync(path.join(REPO, 'bench', 'RESULTS-tls.md'), lines.join('\n'));
    process.stdout.write(lines.join('\n'));
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

runMain('bench/tls-overhead.ts', main);
