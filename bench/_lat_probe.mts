// temporary probe (not committed): one 30 ms-RTT modified send, timeline of the sender's JSON events
import fs from 'node:fs'; import path from 'node:path'; import { spawn, execFileSync } from 'node:child_process';
import { tcpDelayProxy } from '../__test__/helpers/delay-proxy.ts';
const W = '/tmp/lat', CLI = process.env.CLI ?? '/work/main/dist/cli/main.js', MiB = 1 << 20;
const src = `${W}/src`, old = `${W}/old`, dst = `${W}/dst`;
if (!fs.existsSync(old)) {
  let x = 12345;
  for (let i = 0; i < 100; i++) {
    const b = Buffer.alloc(MiB); for (let j = 0; j < MiB; j += 4) { x ^= x << 13; x ^= x >>> 17; x ^= x << 5; b.writeInt32LE(x | 0, j); }
    const d = `d${Math.floor(i / 25)}`; fs.mkdirSync(`${old}/${d}`, { recursive: true }); fs.mkdirSync(`${src}/${d}`, { recursive: true });
    fs.writeFileSync(`${old}/${d}/f${i}.bin`, b); b.fill(i & 0xff, 300_000, 300_000 + 4096); fs.writeFileSync(`${src}/${d}/f${i}.bin`, b);
  }
  for (const s of ['s', 'r']) execFileSync(process.execPath, [CLI, 'id', '--state-dir', `${W}/st${s}`]);
}
const fp = (s: string) => execFileSync(process.execPath, [CLI, 'id', '--state-dir', `${W}/st${s}`]).toString().trim();
const extra = (process.env.SARGS ?? '').split(' ').filter(Boolean), rextra = (process.env.RARGS ?? '').split(' ').filter(Boolean);
const nodeS = (process.env.NODES ?? '').split(' ').filter(Boolean), nodeR = (process.env.NODER ?? '').split(' ').filter(Boolean);
for (let round = 0; round < Number(process.env.N ?? 3); round++) {
  fs.rmSync(dst, { recursive: true, force: true });
  for (const s of ['s', 'r']) for (const n of fs.readdirSync(`${W}/st${s}`)) if (n !== 'identity' && n !== 'pins.conf') fs.rmSync(`${W}/st${s}/${n}`, { recursive: true, force: true });
  execFileSync('cp', [process.env.CPA ?? '-a', old, dst]);
  execFileSync('sync');
  const r = spawn(process.env.WRAP ? '/tmp/lat/t.sh' : process.execPath, [...(process.env.WRAP ? ['r'] : []), ...nodeR, CLI, 'receive', dst, '0', '--bind', '127.0.0.1', '--json', '--state-dir', `${W}/str`, '--trust', fp('s'), ...rextra]);
  const port = await new Promise<number>((res) => { let acc = ''; r.stdout.on('data', (c) => { acc += c; const m = /"port":(\d+)/.exec(acc); if (m) res(Number(m[1])); }); });
  const proxy = await tcpDelayProxy(port, 15);
  const t0 = performance.now(); const rev: string[] = []; let racc = ''; r.stdout.on('data', (c) => { racc += c; let i; while ((i = racc.indexOf('\n')) >= 0) { const l = racc.slice(0, i); racc = racc.slice(i + 1); const e = /"event":"(\w+)"/.exec(l)?.[1]; if (e && e !== 'progress') rev.push(`${(performance.now() - t0).toFixed(0)} ${l.slice(0, 110)}`); } });
  const ev: string[] = [];
  const s = spawn(process.env.WRAP ? '/tmp/lat/t.sh' : process.execPath, [...(process.env.WRAP ? ['s'] : []), ...nodeS, CLI, 'send', src, `127.0.0.1:${proxy.port}`, '--json', '--state-dir', `${W}/sts`, '--trust', fp('r'), ...extra]);
  let acc = ''; s.stdout.on('data', (c) => { acc += c; let i; while ((i = acc.indexOf('\n')) >= 0) { const l = acc.slice(0, i); acc = acc.slice(i + 1); const e = /"event":"(\w+)"/.exec(l)?.[1]; if (e && e !== "progress") ev.push(`${(performance.now() - t0).toFixed(0)} ${l.slice(0, 90)}`); } });
  let serr = ''; s.stderr.on('data', (c) => (serr += c));
  const code = await new Promise((res) => s.on('exit', res)); const ts = performance.now() - t0;
  await new Promise((res) => r.on('exit', res)); const tr = performance.now() - t0;
  await proxy.close();
  console.log(`round ${round}: send exit ${code} ${ts.toFixed(0)} ms, receiver done ${tr.toFixed(0)} ms; events: ${process.env.EV ? ev.join('\n  ') : ''}${process.env.REV ? '\nRECEIVER\n  ' + rev.join('\n  ') : ''}${serr && code ? ' ERR ' + serr.slice(-300) : ''}`);
}
