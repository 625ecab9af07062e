// TLS cost against --plaintext on a fresh single-file transfer over loopback.
//   node --import tsx bench/tls-overhead.ts [--size-mib 1024] [--repeat 3]
// Alternates plaintext and TLS runs (same file, receiver emptied before each run), verifies
// every result by SHA-256, and writes bench/RESULTS-tls.md. Target (issue #3): TLS wall
// time at most 15% above plaintext.
import { spawn, spawnSync } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { CLI, REPO, runMain } from './common.js';
import { sha256 } from '../__test__/helpers/data';
const arg = (name: string, def: number) => {
  const i = process.argv.indexOf(name);
  return i > 0 ? Number(process.argv[i + 1]) : def;
};
const sizeMiB = arg('--size-mib', 1024);
const repeat = arg('--repeat', 3);

function cli(args: string[]): string {
  const r = spawnSync(process.execPath, [CLI, ...args], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`${args.join(' ')}: ${r.stderr}`);
  return r.stdout.trim();
}

async function once(src: string, dst: string, extraR: string[], extraS: string[], sr: string, ss: string): Promise<number> {
  fs.rmSync(dst, { force: true });
  spawnSync('sync');
  const t0 = performance.now();
  const recv = spawn(process.execPath, [CLI, 'receive', dst, '0', '--bind', '127.0.0.1', '--json', '--state-dir', sr, ...extraR], { stdio: ['ignore', 'pipe', 'inherit'] });
  const port = await new Promise<number>((resolve) => recv.stdout.once('data', (d) => resolve(JSON.parse(String(d).split('\n')[0]).port)));
  const send = spawn(process.execPath, [CLI, 'send', src, `127.0.0.1:${port}`, '--state-dir', ss, '-q', ...extraS], { stdio: 'inherit' });
  const codes = await Promise.all([new Promise((r) => send.on('close', r)), new Promise((r) => recv.on('close', r))]);
  const ms = performance.now() - t0;
  if (codes.some((c) => c !== 0)) throw new Error(`run failed: exit codes ${codes}`);
  return ms;
}

async function main() {
  const dir = fs.mkdtempSync(path.join(REPO, 'bench', 'work-tls-'));
  try {
    const src = path.join(dir, 'src.bin');
    const fd = fs.openSync(src, 'w');
    const key = crypto.createHash('sha256').update('tls-overhead').digest().subarray(0, 16);
    const c = crypto.createCipheriv('aes-128-ctr', key, Buffer.alloc(16));
    const zero = Buffer.alloc(1 << 20);
    for (let i = 0; i < sizeMiB; i++) fs.writeSync(fd, c.update(zero));
    fs.closeSync(fd);
    const want = sha256(src);
    const dst = path.join(dir, 'dst.bin');
    const [sr, ss] = [path.join(dir, 'state-r'), path.join(dir, 'state-s')];
    const fr = cli(['id', '--state-dir', sr]);
    const fsnd = cli(['id', '--state-dir', ss]);
    const plain: number[] = [];
    const tls: number[] = [];
    await once(src, dst, ['--plaintext'], ['--plaintext'], sr, ss); // warm-up: sender index, page cache
    for (let i = 0; i < repeat; i++) {
      plain.push(await once(src, dst, ['--plaintext'], ['--plaintext'], sr, ss));
      if (sha256(dst) !== want) throw new Error('plaintext result mismatch');
      // The receiver is emptied before each run, so every run is a full transfer; from the
      // second run on the sender's index skips its scan, equally for both modes.
      tls.push(await once(src, dst, ['--trust', fsnd], ['--trust', fr], sr, ss));
      if (sha256(dst) !== want) throw new Error('TLS result mismatch');
    }
    const med = (a: number[]) => [...a].sort((x, y) => x - y)[Math.floor(a.length / 2)];
    const overhead = med(tls) / med(plain) - 1;
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
      `| --plaintext | ${plain.map((x) => (x / 1000).toFixed(2)).join(', ')} | ${(med(plain) / 1000).toFixed(2)} |`,
      `| TLS 1.3 (pinned) | ${tls.map((x) => (x / 1000).toFixed(2)).join(', ')} | ${(med(tls) / 1000).toFixed(2)} |`,
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
